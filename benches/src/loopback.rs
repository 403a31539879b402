//! Two RC queue pairs connected to each other on one device (loopback), for the benchmarks
//! that run in one process: the instruction counts (`src/bin/instructions.rs`) and the
//! criterion benches (`benches/verbs.rs`).

use std::time::{Duration, Instant};

use rdma_verbs::{
    CompletionChannel, CompletionQueue, Context, QueuePair, SharedReceiveQueue,
    ah::AddressVector,
    cq::{WcFields, WcOpcode, WorkCompletion},
    device::Gid,
    mr::AccessFlags,
    qp::{ConnectedInitAttr, Init, Rc, RcRtrAttr, RcRtsAttr, Rts},
};

/// How long a wait for a completion or an event may take before it fails: generous, the
/// device is emulated.
pub const WAIT: Duration = Duration::from_secs(10);

/// The queues' sizes and the inline limit of a [`Loopback`].
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Send and receive queue depth of each queue pair; each completion queue holds twice as
    /// many entries (it serves both).
    pub depth: u32,
    /// `max_inline_data` asked for (the device may grant more).
    pub max_inline_data: u32,
    /// Extended completion queues reporting these fields (`CqBuilder::extended`), or classic
    /// ones.
    pub extended: Option<WcFields>,
    /// Both queue pairs on one completion queue, `cq_a` (`cq_b` is then made but unused).
    pub shared_cq: bool,
}

impl Default for Shape {
    /// Depth 16, no inline data, classic completion queues: the instruction counts' set-up.
    fn default() -> Self {
        Self {
            depth: 16,
            max_inline_data: 0,
            extended: None,
            shared_cq: false,
        }
    }
}

/// Queue pairs `a` and `b`, connected to each other, each with one completion queue for its
/// sends and receives, both queues on `channel`. Remote write, read and atomics are allowed
/// on both. Fields drop in order: queue pairs, then their queues, then the channel.
#[derive(Debug)]
pub struct Loopback {
    /// The first queue pair.
    pub a: QueuePair<Rc, Rts>,
    /// The second queue pair.
    pub b: QueuePair<Rc, Rts>,
    /// `a`'s completion queue.
    pub cq_a: CompletionQueue,
    /// `b`'s completion queue.
    pub cq_b: CompletionQueue,
    /// The channel both queues signal.
    pub channel: CompletionChannel,
}

impl Loopback {
    /// Opens the test device (as the device tests find it) and connects the two queue pairs.
    ///
    /// # Errors
    ///
    /// A line saying what failed: no device, or the verb that failed.
    pub fn open(shape: Shape) -> Result<Self, String> {
        Self::open_inner(shape, false).map(|(pair, _)| pair)
    }

    /// [`open`](Self::open), with `b` taking its receives from a shared receive queue (of
    /// `shape.depth` receives), returned with the pair.
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open), or `ibv_create_srq` failed.
    pub fn open_with_srq(shape: Shape) -> Result<(Self, SharedReceiveQueue), String> {
        let (pair, srq) = Self::open_inner(shape, true)?;
        Ok((pair, srq.ok_or("no SRQ")?))
    }

    fn open_inner(
        shape: Shape,
        with_srq: bool,
    ) -> Result<(Self, Option<SharedReceiveQueue>), String> {
        let device = rdma_test_support::device().ok_or("no RDMA device")?;
        let err = |e: rdma_verbs::Error| e.to_string();
        let context = Context::open(&device.name).map_err(err)?;
        let channel = context.create_comp_channel().map_err(err)?;
        let cq = || {
            let builder = context.cq_builder(2 * shape.depth).channel(&channel);
            match shape.extended {
                Some(fields) => builder.extended(fields),
                None => builder,
            }
            .build()
            .map_err(err)
        };
        let (cq_a, cq_b) = (cq()?, cq()?);
        let pd = context.alloc_pd().map_err(err)?;
        let mut av = AddressVector::new(device.port).dlid(device.lid);
        if device.is_ethernet {
            av = av.grh(Gid(device.gid), device.gid_index as u8);
        }
        let init = ConnectedInitAttr::new(device.port).access(
            AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
        );
        let srq = if with_srq {
            Some(pd.create_srq(shape.depth, 1).map_err(err)?)
        } else {
            None
        };
        let build = |cq: &CompletionQueue, srq: Option<&SharedReceiveQueue>| {
            let mut builder = pd
                .qp_builder::<Rc>(cq, cq)
                .max_send_wr(shape.depth)
                .max_recv_wr(shape.depth)
                .max_inline_data(shape.max_inline_data);
            if let Some(srq) = srq {
                builder = builder.srq(srq);
            }
            builder.build().map_err(err)
        };
        let a = build(&cq_a, None)?
            .into_init(&init)
            .map_err(|e| e.to_string())?;
        let b = build(if shape.shared_cq { &cq_a } else { &cq_b }, srq.as_ref())?
            .into_init(&init)
            .map_err(|e| e.to_string())?;
        let (a_num, b_num) = (a.qp_num(), b.qp_num());
        let connect = |qp: QueuePair<Rc, Init>, peer: u32| {
            qp.into_rtr(&RcRtrAttr::new(av, peer, 0))
                .map_err(|e| e.to_string())?
                .into_rts(&RcRtsAttr::new(0))
                .map_err(|e| e.to_string())
        };
        let pair = Self {
            a: connect(a, b_num)?,
            b: connect(b, a_num)?,
            cq_a,
            cq_b,
            channel,
        };
        Ok((pair, srq))
    }

    /// Arms both queues; call before posting, so that the completions raise events.
    ///
    /// # Errors
    ///
    /// `ibv_req_notify_cq` failed.
    pub fn arm(&self) -> Result<(), String> {
        self.cq_a.req_notify(false).map_err(|e| e.to_string())?;
        self.cq_b.req_notify(false).map_err(|e| e.to_string())
    }

    /// Waits for `cq_a` to signal on the channel (within [`WAIT`]): with
    /// [`Shape::shared_cq`], the first completion of a round is there.
    ///
    /// # Errors
    ///
    /// No event within [`WAIT`], or the channel failed.
    pub fn wait_a(&self) -> Result<(), String> {
        loop {
            let event = self.channel.wait(WAIT).map_err(|e| e.to_string())?;
            if event.is_for(&self.cq_a) {
                return Ok(());
            }
        }
    }

    /// Waits until both queues signalled on the channel (each within [`WAIT`]).
    ///
    /// # Errors
    ///
    /// No event within [`WAIT`], or the channel failed.
    pub fn wait_both(&self) -> Result<(), String> {
        let (mut a, mut b) = (false, false);
        while !(a && b) {
            let event = self.channel.wait(WAIT).map_err(|e| e.to_string())?;
            a |= event.is_for(&self.cq_a);
            b |= event.is_for(&self.cq_b);
        }
        Ok(())
    }
}

/// Polls `cq` until `want` completions arrived, each successful and each with an opcode of
/// `opcodes` (a queue carries both a queue pair's sends and its receives); busy, as a latency
/// benchmark polls. Gives up after [`WAIT`] (see [`Patience`]).
///
/// # Errors
///
/// A failed completion, an unexpected opcode, a poll error, or nothing within [`WAIT`].
pub fn spin(
    cq: &mut CompletionQueue,
    want: usize,
    opcodes: &[WcOpcode],
    wcs: &mut [WorkCompletion],
) -> Result<(), String> {
    let mut got = 0;
    let mut patience = Patience::default();
    while got < want {
        let room = (want - got).min(wcs.len());
        let done = cq.poll(&mut wcs[..room]).map_err(|e| e.to_string())?;
        for wc in done {
            if !wc.is_success() || !opcodes.contains(&wc.opcode()) {
                return Err(format!(
                    "completion {} of {want}: {:?} {:?}",
                    got + 1,
                    wc.status(),
                    wc.opcode()
                ));
            }
        }
        got += done.len();
        patience.after_poll(done.len(), got, want)?;
    }
    Ok(())
}

/// The bound of a busy poll: it gives up once polls found nothing for [`WAIT`], checking the
/// time once per 1024 empty polls (reading the clock on every poll would be most of a poll).
#[derive(Debug, Default)]
pub struct Patience {
    idle: u32,
    since: Option<Instant>,
}

impl Patience {
    /// Records a poll that found `found` completions, with `got` of `want` arrived so far.
    ///
    /// # Errors
    ///
    /// Nothing arrived for [`WAIT`].
    pub fn after_poll(&mut self, found: usize, got: usize, want: usize) -> Result<(), String> {
        if found > 0 {
            self.since = None;
            return Ok(());
        }
        self.idle = self.idle.wrapping_add(1);
        if self.idle % 1024 == 0 && self.since.get_or_insert_with(Instant::now).elapsed() > WAIT {
            return Err(format!(
                "{got} of {want} completions, then nothing for {} s",
                WAIT.as_secs()
            ));
        }
        Ok(())
    }
}
