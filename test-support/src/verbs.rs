//! Helpers shared by `rdma-verbs`' device tests (feature `verbs`): a context on the test
//! device, connected queue pairs of each transport on it (loopback through the device), and
//! bounded completion waits. `use crate::verbs::*` brings them in, with
//! [`note`] and [`pattern`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::TestDevice;
pub use crate::{note, pattern};
use rdma_verbs::{
    ah::*, cq::*, device::*, mr::*, mw::*, owned::*, qp::*, scope::*, slot::*, wr::*, *,
};

/// How long a test waits for a completion before failing: rxe under emulation is slow.
pub const WAIT: Duration = Duration::from_secs(10);

/// The test device, a context on it and a protection domain: what every test starts from.
#[allow(missing_debug_implementations)]
pub struct Fixture {
    /// The test device ([`device`](crate::device)).
    pub device: TestDevice,
    /// A context on it.
    pub context: Context,
    /// A protection domain of the context.
    pub pd: ProtectionDomain,
}

/// The test device's context and a protection domain, or `None` (skipped visibly).
pub fn fixture() -> Option<Fixture> {
    let device = crate::device()?;
    let context = Context::open(&device.name).expect("open the test device");
    let pd = context.alloc_pd().expect("ibv_alloc_pd");
    Some(Fixture {
        device,
        context,
        pd,
    })
}

impl Fixture {
    /// A completion queue of `n` entries.
    pub fn cq(&self, n: u32) -> CompletionQueue {
        self.context.create_cq(n).expect("ibv_create_cq")
    }

    /// The path to this device's own port (loopback through the device).
    pub fn av(&self) -> AddressVector {
        let av = AddressVector::new(self.device.port).dlid(self.device.lid);
        if self.device.is_ethernet {
            av.grh(Gid(self.device.gid), self.device.gid_index as u8)
        } else {
            av
        }
    }

    /// Two connected queue pairs of transport `T`, each with `access` for the peer. `a` sends
    /// from PSN `psn.0` and `b` from `psn.1`; `rtr(av, peer, peer_psn)` and `rts(own_psn)` make
    /// the transition attributes.
    pub fn connect_pair<T: Transport<InitAttr = ConnectedInitAttr>>(
        &self,
        (a, b): (QpBuilder<'_, T>, QpBuilder<'_, T>),
        access: AccessFlags,
        psn: (u32, u32),
        rtr: impl Fn(AddressVector, u32, u32) -> T::RtrAttr,
        rts: impl Fn(u32) -> T::RtsAttr,
    ) -> (QueuePair<T, Rts>, QueuePair<T, Rts>) {
        let a = a.build().expect("create QP a");
        let b = b.build().expect("create QP b");
        let init = ConnectedInitAttr::new(self.device.port).access(access);
        let a = a.into_init(&init).expect("a INIT");
        let b = b.into_init(&init).expect("b INIT");
        let (a_num, b_num) = (a.qp_num(), b.qp_num());
        let a = a
            .into_rtr(&rtr(self.av(), b_num, psn.1))
            .expect("a RTR")
            .into_rts(&rts(psn.0))
            .expect("a RTS");
        let b = b
            .into_rtr(&rtr(self.av(), a_num, psn.0))
            .expect("b RTR")
            .into_rts(&rts(psn.1))
            .expect("b RTS");
        (a, b)
    }

    /// Connects RC queue pairs `a` and `b` again after `b` was reset (`a` is reset here):
    /// both back in RTS with no access for the peer, `a` sending from PSN `psn.0` and `b`
    /// from `psn.1`.
    pub fn reconnect_rc(
        &self,
        a: QueuePair<Rc, Rts>,
        b: QueuePair<Rc, Reset>,
        psn: (u32, u32),
    ) -> (QueuePair<Rc, Rts>, QueuePair<Rc, Rts>) {
        let (a_num, b_num) = (a.qp_num(), b.qp_num());
        let init = ConnectedInitAttr::new(self.device.port);
        let b = b
            .into_init(&init)
            .expect("b INIT")
            .into_rtr(&RcRtrAttr::new(self.av(), a_num, psn.0))
            .expect("b RTR")
            .into_rts(&RcRtsAttr::new(psn.1))
            .expect("b RTS");
        let a = a
            .into_reset()
            .expect("a RESET")
            .into_init(&init)
            .expect("a INIT")
            .into_rtr(&RcRtrAttr::new(self.av(), b_num, psn.1))
            .expect("a RTR")
            .into_rts(&RcRtsAttr::new(psn.0))
            .expect("a RTS");
        (a, b)
    }

    /// Two connected RC queue pairs, each on a completion queue of its own (16 entries), with
    /// `access` for the peer and `rts`'s timeout and retry counts: `(cq_a, cq_b, a, b)`.
    pub fn rc_pair_own_cqs(
        &self,
        access: AccessFlags,
        rts: RcRtsAttr,
    ) -> (
        CompletionQueue,
        CompletionQueue,
        QueuePair<Rc, Rts>,
        QueuePair<Rc, Rts>,
    ) {
        let (cq_a, cq_b) = (self.cq(16), self.cq(16));
        let (a, b) = self.rc_pair_with(
            self.pd.qp_builder(&cq_a, &cq_a),
            self.pd.qp_builder(&cq_b, &cq_b),
            access,
            rts,
        );
        (cq_a, cq_b, a, b)
    }

    /// Two RC queue pairs connected to each other, each with `access` for the peer.
    pub fn rc_pair(
        &self,
        a: QpBuilder<'_, Rc>,
        b: QpBuilder<'_, Rc>,
        access: AccessFlags,
    ) -> (QueuePair<Rc, Rts>, QueuePair<Rc, Rts>) {
        self.rc_pair_with(a, b, access, RcRtsAttr::new(0))
    }

    /// Two UC queue pairs connected to each other.
    pub fn uc_pair(
        &self,
        a: QpBuilder<'_, Uc>,
        b: QpBuilder<'_, Uc>,
        access: AccessFlags,
    ) -> (QueuePair<Uc, Rts>, QueuePair<Uc, Rts>) {
        self.connect_pair((a, b), access, (9, 7), UcRtrAttr::new, SqPsnRtsAttr::new)
    }

    /// A UD queue pair in RTS with Q_Key `qkey`.
    pub fn ud_qp(&self, builder: QpBuilder<'_, Ud>, qkey: u32) -> QueuePair<Ud, Rts> {
        builder
            .build()
            .expect("create UD QP")
            .into_init(&UdInitAttr::new(self.device.port, qkey))
            .expect("UD INIT")
            .into_rtr(&UdRtrAttr)
            .expect("UD RTR")
            .into_rts(&SqPsnRtsAttr::new(0))
            .expect("UD RTS")
    }
}

/// Polls `cq` until `n` completions arrived or [`WAIT`] passed; fails the test on timeout.
pub fn wait_for(cq: &mut CompletionQueue, n: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::with_capacity(n);
    let mut buf = [WorkCompletion::default(); 16];
    let deadline = Instant::now() + WAIT;
    while out.len() < n {
        let want = (n - out.len()).min(buf.len());
        let got = cq.poll(&mut buf[..want]).expect("ibv_poll_cq");
        out.extend_from_slice(got);
        if got.is_empty() {
            assert!(
                Instant::now() < deadline,
                "timed out: {} of {n} completions after {WAIT:?}: {out:?}",
                out.len()
            );
            std::thread::yield_now();
        }
    }
    out
}

/// Sends `data` from a slot of `tx` (posted to `qp`, signaled), waits for the send's completion
/// on `cq`, checks it (success, SEND, the bytes the slot carried) and gives the slot back.
pub fn send_from_slot(
    qp: &mut QueuePair<Rc, Rts>,
    tx: &mut SlotRing,
    cq: &mut CompletionQueue,
    data: &[u8],
) {
    let mut slot = tx.take().expect("a free send slot");
    tx.fill(&mut slot, data).unwrap();
    qp.post_send_slot(tx, SendRequest::send(slot)).unwrap();
    let sent = wait_for(cq, 1);
    assert_ok(&sent[0], sent[0].wr_id(), WcOpcode::Send);
    let back = tx.complete(&sent[0]).expect("the send's slot comes back");
    assert_eq!(tx.bytes(&back).unwrap(), data, "the bytes the send carried");
    tx.put(back).unwrap();
}

/// Asserts that no completion arrives within `quiet`.
pub fn assert_no_completion(cq: &mut CompletionQueue, quiet: Duration) {
    let mut buf = [WorkCompletion::default(); 4];
    let deadline = Instant::now() + quiet;
    while Instant::now() < deadline {
        let got = cq.poll(&mut buf).expect("ibv_poll_cq");
        assert!(got.is_empty(), "unexpected completions: {got:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Asserts a successful completion with `wr_id` and `opcode`.
pub fn assert_ok(wc: &WorkCompletion, wr_id: u64, opcode: WcOpcode) {
    assert!(wc.is_success(), "completion failed: {wc:?}");
    assert_eq!(wc.wr_id(), wr_id, "{wc:?}");
    assert_eq!(wc.opcode(), opcode, "{wc:?}");
}

impl Fixture {
    /// As [`rc_pair`](Self::rc_pair), with `rts`'s timeout and retry counts (its PSN is
    /// replaced).
    pub fn rc_pair_with(
        &self,
        a: QpBuilder<'_, Rc>,
        b: QpBuilder<'_, Rc>,
        access: AccessFlags,
        rts: RcRtsAttr,
    ) -> (QueuePair<Rc, Rts>, QueuePair<Rc, Rts>) {
        self.connect_pair((a, b), access, (0x200, 0x100), RcRtrAttr::new, |sq_psn| {
            let mut attr = rts;
            attr.sq_psn = sq_psn;
            attr
        })
    }
}

/// Checks the 40 GRH bytes a UD receive starts with, for a datagram this port sent to itself: on
/// RoCE v2 over IPv4 the last 20 hold the IPv4 header (version 4, source and destination the
/// port's own address); on InfiniBand and RoCE over IPv6 it is an IPv6-style header with the
/// source and destination GIDs.
pub fn assert_grh(grh: &[u8; GRH_LEN], own: Gid) {
    match own.ipv4() {
        Some(ip) => {
            assert!(grh[..20].iter().all(|&b| b == 0), "GRH: {grh:02x?}");
            assert_eq!(grh[20], 0x45, "not an IPv4 header: {grh:02x?}");
            assert_eq!(&grh[32..36], &ip.octets(), "IPv4 source: {grh:02x?}");
            assert_eq!(&grh[36..40], &ip.octets(), "IPv4 destination: {grh:02x?}");
        }
        None => {
            assert_eq!(grh[0] >> 4, 6, "not an IPv6-style GRH: {grh:02x?}");
            assert_eq!(&grh[8..24], &own.0, "source GID: {grh:02x?}");
            assert_eq!(&grh[24..40], &own.0, "destination GID: {grh:02x?}");
        }
    }
}

impl Fixture {
    /// Whether the device is Soft-RoCE (rxe reports vendor ID 0xffffff). Tests accept a
    /// documented rxe deviation from the specification only when this is true.
    pub fn is_rxe(&self) -> bool {
        self.context
            .query_device()
            .expect("ibv_query_device")
            .vendor_id
            == 0xff_ffff
    }
}

impl Fixture {
    /// Whether the device has memory windows of `kind`; records the justified skip
    /// (`unsupported`) when it does not.
    pub fn has_windows(&self, kind: MwType) -> bool {
        let attr = self.context.query_device().expect("ibv_query_device");
        let (supported, name) = match kind {
            MwType::Type1 => (attr.supports_mw_type1(), "memory windows type 1"),
            MwType::Type2 => (attr.supports_mw_type2(), "memory windows type 2"),
        };
        if !supported {
            crate::unsupported(name);
        }
        supported
    }
}

/// Polls the scope until nothing is outstanding and returns what it reaped; fails the test
/// after [`WAIT`].
pub fn reap_all<T: Transport>(s: &mut PostScope<'_, '_, T>) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut buf = [WorkCompletion::default(); 8];
    let deadline = Instant::now() + WAIT;
    while s.outstanding() > 0 {
        out.extend_from_slice(s.poll(&mut buf).expect("poll"));
        assert!(Instant::now() < deadline, "completions never came: {out:?}");
    }
    out
}

/// Posts a signaled RDMA write of all of `src` to `remote`: one send completion, no receive
/// needed.
pub fn write(qp: &mut QueuePair<Rc, Rts>, wr_id: u64, src: &MemoryRegion, remote: RemoteMemory) {
    // SAFETY: callers keep `src` and the target registered until the completion is polled,
    // and do not write `src` meanwhile.
    unsafe {
        qp.post_send_one(&SendRequest::write(src.slice(..).unwrap(), remote).tag(wr_id))
            .unwrap();
    }
}

/// Posts a signaled owned RDMA WRITE of all of `src` (zero-copy, a range of the region) to
/// `remote`, tagged `tag`: one send completion, no receive needed.
pub fn write_range(
    qp: &mut QueuePair<Rc, Rts>,
    tag: u64,
    src: &Arc<MemoryRegion>,
    remote: RemoteMemory,
) {
    let range = RegionRange::new(src, ..).unwrap();
    qp.post_send_owned(SendRequest::write(range, remote).tag(tag))
        .unwrap();
}

/// Asserts a failed completion: its `wr_id`, `status` and queue pair. Only these (and
/// `vendor_err`) are defined for a completion in error (ibv_poll_cq(3)), so the opcode is not
/// checked.
#[track_caller]
pub fn assert_failed(wc: &WorkCompletion, wr_id: u64, status: WcStatus, qp_num: u32) {
    assert_eq!(wc.status(), status, "{wc:?}");
    assert_eq!(wc.wr_id(), wr_id, "{wc:?}");
    assert_eq!(wc.qp_num(), qp_num, "{wc:?}");
}

/// Moves `qp` to the error state and checks that `cq` then holds exactly the flush completions
/// of `flushed` (the `wr_id`s of the receives still posted, in order) and nothing else: an event
/// that shows, without a quiet window, that no other completion arrived in `cq` before.
/// `cq` must be used by `qp` alone.
#[track_caller]
pub fn assert_only_flushes<T: Transport, S: QpState>(
    qp: QueuePair<T, S>,
    cq: &mut CompletionQueue,
    flushed: &[u64],
) -> QueuePair<T, ErrorState> {
    let qp = qp.into_error().expect("move to ERR");
    let got = wait_for(cq, flushed.len());
    for (wc, &wr_id) in got.iter().zip(flushed) {
        assert_failed(wc, wr_id, WcStatus::WrFlushErr, qp.qp_num());
    }
    let mut buf = [WorkCompletion::default(); 4];
    let extra = cq.poll(&mut buf).expect("ibv_poll_cq");
    assert!(
        extra.is_empty(),
        "completions beyond the flushes: {extra:?}"
    );
    qp
}

/// How long a test watches for something that must not happen and can only be seen as an
/// absence: a completion event or an asynchronous event for work whose completion the test has
/// already polled. The device raises those when it writes the completion (rxe: in the same
/// call, or from a tasklet scheduled by it), so this only has to cover their delivery, which
/// half a second does even under emulation. Tests use it only where no later event can show
/// the absence instead; it bounds nothing that needs the device to do work.
pub const QUIET: Duration = Duration::from_millis(500);

/// Asserts that `cq` holds no completion now. Used where the order of completions proves that
/// anything unexpected would already be there (a queue completes in order, so a completion
/// polled after the suspect request's would have come behind it).
#[track_caller]
pub fn assert_cq_empty(cq: &mut CompletionQueue) {
    let mut buf = [WorkCompletion::default(); 4];
    let got = cq.poll(&mut buf).expect("ibv_poll_cq");
    assert!(got.is_empty(), "unexpected completions: {got:?}");
}

/// The calling thread's kernel thread ID, for [`wait_until_asleep`].
pub fn thread_id() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// Waits until thread `tid` of this process sleeps in the kernel (state `S` in
/// `/proc/self/task/<tid>/stat`), for [`WAIT`] at most: an event, not a guess of how long a
/// thread needs to reach a blocking call.
#[track_caller]
pub fn wait_until_asleep(tid: i32) {
    let path = format!("/proc/self/task/{tid}/stat");
    let deadline = Instant::now() + WAIT;
    loop {
        let stat = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        // "tid (comm) S ...": the state follows the last ')' (comm may hold anything).
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("{path}: {stat:?}"));
        if state == "S" {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "thread {tid} not asleep after {WAIT:?} (state {state})"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Reaps `want` completions from `cq` with `poll_each` (the owned-buffer path); fails the test
/// after [`WAIT`].
pub fn reap(cq: &mut CompletionQueue, want: usize) -> Vec<Completion> {
    reap_within(cq, want, WAIT, "reap")
}

/// Reaps `want` completions from `cq` with `poll_each`; fails the test (naming `what`) after
/// `bound`.
pub fn reap_within(
    cq: &mut CompletionQueue,
    want: usize,
    bound: Duration,
    what: &str,
) -> Vec<Completion> {
    let mut out = Vec::with_capacity(want);
    let got = cq
        .poll_each_for(want, bound, |c| out.push(c))
        .expect("ibv_poll_cq");
    assert_eq!(got, out.len(), "{what}: poll_each_for's count");
    assert!(
        got >= want,
        "{what}: {got} of {want} completions after {bound:?}: {out:?}"
    );
    out
}

/// Asserts an owned completion of the request tagged `tag`, successful, with `opcode`.
#[track_caller]
pub fn assert_done(c: &Completion, tag: u64, opcode: WcOpcode) {
    assert_eq!(
        (c.tag(), c.status(), c.wc().opcode()),
        (Some(tag), WcStatus::Success, opcode),
        "{c:?}"
    );
}

/// Nothing more arrives within [`QUIET`], polled with `poll_each`.
pub fn assert_no_completion_each(cq: &mut CompletionQueue) {
    let until = Instant::now() + QUIET;
    while Instant::now() < until {
        let n = cq
            .poll_each(4, |c| panic!("unexpected completion: {c:?}"))
            .unwrap();
        assert_eq!(n, 0);
    }
}
