//! What rdma-core's `ibv_rc_pingpong`, `ibv_uc_pingpong` and `ibv_ud_pingpong` share: the
//! command line, device and port set-up, and the ping-pong loop.
//!
//! The loop is the C programs': the client posts the first send; each side keeps up to
//! `rx_depth` receives posted, and sends its next message once both its last send and a
//! receive have completed.

use std::io::Write;
use std::time::{Duration, Instant};

use clap::Parser;
use rdma_verbs::*;

use crate::exchange::{self, Dest};

/// The `wr_id` of receive requests.
const RECV_WRID: u64 = 1;
/// The `wr_id` of send requests.
const SEND_WRID: u64 = 2;
/// The Q_Key of the UD programs.
pub const UD_QKEY: u32 = 0x1111_1111;
/// Bytes of the global routing header in front of every UD receive.
pub const GRH_LEN: usize = 40;
/// The `wr_id` of the pingpongs' receive requests.
pub const RECV_ID: u64 = RECV_WRID;
/// The `wr_id` of the pingpongs' send requests.
pub const SEND_ID: u64 = SEND_WRID;

/// The options all pingpong programs take, with the C programs' short names and defaults. As
/// with the C programs' getopt, an option given twice takes its last value.
#[derive(Parser, Debug, Clone)]
#[command(args_override_self = true)]
pub struct Options {
    /// Listen on / connect to TCP port.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    pub port: u16,
    /// Use IB device (default: the first device found).
    #[arg(short = 'd', long = "ib-dev")]
    pub ib_dev: Option<String>,
    /// Use port of IB device.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub ib_port: u8,
    /// Size of message to exchange (default 4096; 1024 for UD).
    #[arg(short = 's', long = "size")]
    pub size: Option<usize>,
    /// Path MTU (256, 512, 1024, 2048 or 4096).
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    pub mtu: u32,
    /// Number of receives to post at a time.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    pub rx_depth: u32,
    /// Number of exchanges.
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    pub iters: u32,
    /// Service level value.
    #[arg(short = 'l', long = "sl", default_value_t = 0)]
    pub sl: u8,
    /// Sleep on CQ events (default: poll).
    #[arg(short = 'e', long = "events")]
    pub events: bool,
    /// Local port GID index.
    #[arg(short = 'g', long = "gid-idx")]
    pub gid_idx: Option<u32>,
    /// Validate received buffer.
    #[arg(short = 'c', long = "chk")]
    pub chk: bool,
    /// Give up when no completion arrives for this many seconds (the peer may be gone).
    #[arg(long = "timeout", default_value_t = 30)]
    pub timeout: u64,
    /// Server to connect to (without it, act as the server).
    pub servername: Option<String>,
}

impl Options {
    /// The message size: `-s`, or `default` (each program's C default).
    pub fn message_size(&self, default: usize) -> usize {
        self.size.unwrap_or(default)
    }
}

/// Prints `program: message` on stderr and exits with status 1: how every example reports a
/// failure.
pub fn fail(program: &str, message: impl std::fmt::Display) -> ! {
    let _ = std::io::stdout().flush();
    eprintln!("{program}: {message}");
    std::process::exit(1)
}

/// The device, protection domain, buffer and completion queue of one pingpong process.
#[derive(Debug)]
pub struct Setup {
    /// The device context.
    pub context: Context,
    /// The protection domain.
    pub pd: ProtectionDomain,
    /// The completion channel, with `-e`.
    pub channel: Option<CompletionChannel>,
    /// The completion queue, shared by sends and receives.
    pub cq: CompletionQueue,
    /// The port's attributes.
    pub port: PortAttr,
    /// The local GID (zero without `-g`).
    pub gid: Gid,
}

/// Opens the device, checks the port, and makes the PD and CQ.
pub fn setup(options: &Options, cq_size: u32) -> Result<Setup, String> {
    let devices =
        rdma_verbs::devices().map_err(|e| format!("failed to get IB devices list: {e}"))?;
    let device = match &options.ib_dev {
        Some(name) => devices
            .find(name)
            .ok_or_else(|| format!("IB device {name} not found"))?,
        None => devices.iter().next().ok_or("No IB devices found")?,
    };
    let context = device
        .open()
        .map_err(|e| format!("couldn't get context for {}: {e}", device.name()))?;
    let port = context
        .query_port(options.ib_port)
        .map_err(|e| format!("couldn't get port info for port {}: {e}", options.ib_port))?;
    if port.state != PortState::Active {
        return Err(format!(
            "port {} of {} is not active (state {:?})",
            options.ib_port,
            device.name(),
            port.state
        ));
    }
    if !port.is_ethernet() && port.lid == 0 {
        return Err("couldn't get local LID".into());
    }
    let gid = match options.gid_idx {
        Some(index) => {
            context
                .query_gid(options.ib_port, index)
                .map_err(|e| format!("can't read sgid of index {index}: {e}"))?
                .gid
        }
        None => Gid::default(),
    };
    let pd = context
        .alloc_pd()
        .map_err(|e| format!("couldn't allocate PD: {e}"))?;
    let channel = if options.events {
        Some(
            context
                .create_comp_channel()
                .map_err(|e| format!("couldn't create completion channel: {e}"))?,
        )
    } else {
        None
    };
    let mut builder = context.cq_builder(cq_size);
    if let Some(channel) = &channel {
        builder = builder.channel(channel);
    }
    let cq = builder
        .build()
        .map_err(|e| format!("couldn't create CQ: {e}"))?;
    if channel.is_some() {
        // Armed before anything is posted, as the C programs do: a completion that lands
        // before the arming would raise no event, and the loop would sleep forever.
        cq.req_notify(false)
            .map_err(|e| format!("couldn't request CQ notification: {e}"))?;
    }
    Ok(Setup {
        context,
        pd,
        channel,
        cq,
        port,
        gid,
    })
}

/// The path MTU of `-m`.
pub fn mtu(options: &Options) -> Result<Mtu, String> {
    Mtu::from_bytes(options.mtu).ok_or_else(|| format!("invalid MTU {}", options.mtu))
}

/// The address vector to a peer: GRH only when its GID's interface ID is non-zero, as the C
/// programs decide.
pub fn address_vector(
    options: &Options,
    remote: &Dest,
    hop_limit: u8,
) -> Result<AddressVector, String> {
    let mut av = AddressVector::new(options.ib_port).dlid(remote.lid);
    av.sl = options.sl;
    if remote.gid.interface_id() != 0 {
        let sgid_index = options
            .gid_idx
            .ok_or("the peer uses a GID: pass -g with a local GID index")?;
        let mut route = av.grh(remote.gid, sgid_index as u8).grh.ok_or("no route")?;
        route.hop_limit = hop_limit;
        av.grh = Some(route);
    }
    Ok(av)
}

/// Prints an address line as the C programs do (`ud` selects ud_pingpong's colon quirk).
pub fn print_address(which: &str, dest: &Dest, ud: bool) {
    let separator = if ud { ":" } else { "," };
    let pad = if which == "local" { "  " } else { " " };
    println!(
        "  {which} address:{pad}LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}{separator} GID {}",
        dest.lid, dest.qpn, dest.psn, dest.gid
    );
}

/// Prints the two result lines.
pub fn print_results(size: usize, iters: u32, elapsed: Duration) {
    let usec = elapsed.as_secs_f64() * 1_000_000.0;
    let bytes = size as u64 * u64::from(iters) * 2;
    println!(
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec / 1_000_000.0,
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{iters} iters in {:.2} seconds = {:.2} usec/iter",
        usec / 1_000_000.0,
        usec / f64::from(iters)
    );
}

/// One side of a pingpong: a queue pair in RTS, the buffer it sends from and the buffer it
/// receives into.
///
/// The C programs send from and receive into one buffer. Here they are two regions: the safe
/// post path ([`QueuePair::scope`]) lends receive buffers to the device exclusively and send
/// buffers shared, so one region cannot be both at once. Nothing of this shows on the wire.
#[derive(Debug)]
pub struct Pingpong<T: Transport> {
    qp: QueuePair<T, Rts>,
    ah: Option<AddressHandle>,
    send_buffer: MemoryRegion,
    recv_buffer: MemoryRegion,
    remote_qpn: u32,
    size: usize,
    /// Where messages start in the buffers: after the GRH for UD.
    offset: usize,
    send_flags: SendFlags,
}

impl<T: Transport> Pingpong<T> {
    /// A pingpong over `qp` with buffers of `offset + size` bytes (UD: `offset` 40, and the
    /// peer's address handle).
    pub fn new(
        setup: &Setup,
        options: &Options,
        qp: QueuePair<T, Rts>,
        ah: Option<AddressHandle>,
        remote_qpn: u32,
        size: usize,
        offset: usize,
    ) -> Result<Self, String> {
        let register = || {
            setup
                .pd
                .register((offset + size).max(1), AccessFlags::LOCAL_WRITE)
                .map_err(|e| format!("couldn't register MR: {e}"))
        };
        let mut send_buffer = register()?;
        let mut recv_buffer = register()?;
        fill_buffer(&mut send_buffer, options, offset, size);
        fill_buffer(&mut recv_buffer, options, offset, size);
        let mut send_flags = SendFlags::SIGNALED;
        if qp.caps().max_inline_data as usize >= size {
            send_flags |= SendFlags::INLINE;
        }
        Ok(Self {
            qp,
            ah,
            send_buffer,
            recv_buffer,
            remote_qpn,
            size,
            offset,
            send_flags,
        })
    }

    /// Runs the program: posts `rx_depth` receives, calls `ready` (the server answers the
    /// address exchange there, so that its receives are posted before the client can send),
    /// then the loop: `iters` sends and receives each, the client sending first. Returns the
    /// time from the first send to the last completion.
    pub fn run(
        &mut self,
        setup: &mut Setup,
        options: &Options,
        ready: impl FnOnce() -> Result<(), String>,
    ) -> Result<Duration, String> {
        let Self {
            qp,
            ah,
            send_buffer,
            recv_buffer,
            remote_qpn,
            size,
            offset,
            send_flags,
        } = self;
        let (size, offset) = (*size, *offset);
        let target = recv_buffer
            .slice_mut(..offset + size)
            .map_err(|e| e.to_string())?;
        let source = send_buffer
            .slice(offset..offset + size)
            .map_err(|e| e.to_string())?;
        let channel = setup.channel.as_ref();
        let cq = &mut setup.cq;
        let is_client = options.servername.is_some();
        let idle = Duration::from_secs(options.timeout);
        let outcome = qp.scope(ScopeCqs::shared(cq), |s| -> Result<Duration, String> {
            let send = SendPlan {
                source,
                flags: *send_flags,
                ah: ah.as_ref(),
                remote_qpn: *remote_qpn,
            };
            let body = || -> Result<Duration, String> {
                post_recvs(s, &target, options.rx_depth)?;
                let mut routs = options.rx_depth;
                ready()?;
                let mut pending = RECV_WRID;
                if is_client {
                    send.post(s)?;
                    pending |= SEND_WRID;
                }
                let start = Instant::now();
                let (mut rcnt, mut scnt) = (0u32, 0u32);
                let mut completions = [WorkCompletion::default(); 2];
                while rcnt < options.iters || scnt < options.iters {
                    for wc in wait(s, channel, &mut completions, idle)? {
                        if !wc.is_success() {
                            return Err(format!(
                                "Failed status {} for wr_id {}",
                                wc.status(),
                                wc.wr_id()
                            ));
                        }
                        match wc.wr_id() {
                            SEND_WRID => scnt += 1,
                            RECV_WRID => {
                                routs -= 1;
                                if routs <= 1 {
                                    post_recvs(s, &target, options.rx_depth - routs)?;
                                    routs = options.rx_depth;
                                }
                                rcnt += 1;
                            }
                            other => return Err(format!("completion for unknown wr_id {other}")),
                        }
                        pending &= !wc.wr_id();
                        if scnt < options.iters && pending == 0 {
                            send.post(s)?;
                            pending = RECV_WRID | SEND_WRID;
                        }
                    }
                }
                Ok(start.elapsed())
            };
            let result = body();
            // The C programs exit with receives still posted (and after a failure, whatever
            // else): flush them, so that the scope ends at once.
            let flushed = s.flush_outstanding();
            let elapsed = result?;
            flushed.map_err(|e| format!("couldn't flush the remaining receives: {e}"))?;
            Ok(elapsed)
        });
        outcome.map_err(|e| e.to_string())?
    }

    /// Checks the pages of the receive buffer as `-c` asks (`invalid data in page N` lines).
    pub fn check(&self, options: &Options) {
        if options.chk && options.servername.is_none() {
            let page = page_size();
            let mut byte = [0u8; 1];
            let mut at = 0;
            while at < self.size {
                if self
                    .recv_buffer
                    .read_at(self.offset + at, &mut byte)
                    .is_ok()
                    && byte[0] != 0
                {
                    println!("invalid data in page {}", at / page);
                }
                at += page;
            }
        }
    }
}

/// What each send of the loop posts.
struct SendPlan<'a> {
    source: MrSlice<'a>,
    flags: SendFlags,
    ah: Option<&'a AddressHandle>,
    remote_qpn: u32,
}

impl<'a> SendPlan<'a> {
    fn post<T: Transport>(&self, s: &mut PostScope<'a, '_, T>) -> Result<(), String> {
        // With IBV_SEND_INLINE in the flags the provider copies the bytes during the post.
        let request = SendRequest::send(SEND_WRID, self.source).flags(self.flags);
        let posted = match self.ah {
            Some(ah) => s.send(request.to(ah, self.remote_qpn, UD_QKEY)),
            None => s.send(request),
        };
        posted.map_err(|e| format!("couldn't post send: {e}"))
    }
}

/// Posts `n` receives into `target`.
fn post_recvs<'a, T: Transport>(
    s: &mut PostScope<'a, '_, T>,
    target: &'a MrSliceMut<'a>,
    n: u32,
) -> Result<(), String> {
    for _ in 0..n {
        s.recv(RECV_WRID, target)
            .map_err(|e| format!("couldn't post receive: {e}"))?;
    }
    Ok(())
}

/// Prepares a buffer: 0x7b everywhere, and with `-c` on the client the page-start bytes the
/// server checks (always 0, as in the C programs).
fn fill_buffer(buffer: &mut MemoryRegion, options: &Options, offset: usize, size: usize) {
    let fill = vec![0x7bu8; buffer.len()];
    let _ = buffer.write_at(0, &fill);
    if options.chk && options.servername.is_some() {
        let page = page_size();
        let mut at = 0;
        while at < size {
            let _ = buffer.write_at(offset + at, &[0]);
            at += page;
        }
    }
}

/// Something the loop polls for completions: a [`PostScope`], or a bare completion queue
/// (srq_pingpong, whose receives go to an SRQ, posts with the `unsafe` calls).
pub trait Poller {
    /// Polls into `completions`.
    fn poll_into<'a>(
        &mut self,
        completions: &'a mut [WorkCompletion],
    ) -> rdma_verbs::Result<&'a [WorkCompletion]>;
    /// Arms the completion queue(s) for the next event.
    fn arm(&mut self) -> rdma_verbs::Result<()>;
}

impl<T: Transport> Poller for PostScope<'_, '_, T> {
    fn poll_into<'a>(
        &mut self,
        completions: &'a mut [WorkCompletion],
    ) -> rdma_verbs::Result<&'a [WorkCompletion]> {
        self.poll(completions)
    }
    fn arm(&mut self) -> rdma_verbs::Result<()> {
        self.req_notify(false)
    }
}

impl Poller for CompletionQueue {
    fn poll_into<'a>(
        &mut self,
        completions: &'a mut [WorkCompletion],
    ) -> rdma_verbs::Result<&'a [WorkCompletion]> {
        self.poll(completions)
    }
    fn arm(&mut self) -> rdma_verbs::Result<()> {
        self.req_notify(false)
    }
}

/// Waits for at least one completion: polls, or with `-e` sleeps on the channel (and re-arms
/// the CQ). Fails after `idle` without any. With `-e` the result may be empty.
pub fn wait<'a>(
    s: &mut impl Poller,
    channel: Option<&CompletionChannel>,
    completions: &'a mut [WorkCompletion],
    idle: Duration,
) -> Result<&'a [WorkCompletion], String> {
    let deadline = Instant::now() + idle;
    let stalled = || {
        format!(
            "no completion for {} s: the peer is gone or stalled",
            idle.as_secs()
        )
    };
    if let Some(channel) = channel {
        channel.wait(idle).map_err(|e| match e {
            Error::Timeout(_) => stalled(),
            e => format!("failed to get cq_event: {e}"),
        })?;
        s.arm()
            .map_err(|e| format!("couldn't request CQ notification: {e}"))?;
    }
    loop {
        let n = s
            .poll_into(completions)
            .map_err(|e| format!("poll CQ failed: {e}"))?
            .len();
        if n > 0 || channel.is_some() {
            return Ok(&completions[..n]);
        }
        if Instant::now() > deadline {
            return Err(stalled());
        }
        std::hint::spin_loop();
    }
}

/// The page size `-c` validates at (the C programs ask sysconf; every Linux target this
/// workspace builds for uses 4 KiB base pages).
fn page_size() -> usize {
    4096
}

/// What differs between the RC and UC pingpongs: the RTR and RTS attributes.
pub trait Connected: Transport<InitAttr = ConnectedInitAttr> {
    /// INIT → RTR towards `remote` over `av`.
    fn rtr(av: AddressVector, remote: &Dest, mtu: Mtu) -> Self::RtrAttr;
    /// RTR → RTS starting at `psn`.
    fn rts(psn: u32) -> Self::RtsAttr;
}

impl Connected for Rc {
    fn rtr(av: AddressVector, remote: &Dest, mtu: Mtu) -> RcRtrAttr {
        // The C defaults: one outstanding read/atomic, RNR timer 12.
        let mut attr = RcRtrAttr::new(av, remote.qpn, remote.psn);
        attr.path_mtu = mtu;
        attr
    }
    fn rts(psn: u32) -> RcRtsAttr {
        // Timeout 14, retry 7, RNR retry 7, one outstanding read/atomic.
        RcRtsAttr::new(psn)
    }
}

impl Connected for Uc {
    fn rtr(av: AddressVector, remote: &Dest, mtu: Mtu) -> UcRtrAttr {
        let mut attr = UcRtrAttr::new(av, remote.qpn, remote.psn);
        attr.path_mtu = mtu;
        attr
    }
    fn rts(psn: u32) -> SqPsnRtsAttr {
        SqPsnRtsAttr::new(psn)
    }
}

/// The whole of `rc_pingpong` and `uc_pingpong`: set up, exchange addresses, connect, run.
pub fn run_connected<T: Connected>(options: &Options) -> Result<(), String> {
    let mtu = mtu(options)?;
    let size = options.message_size(4096);
    let mut setup = setup(options, options.rx_depth + 1)?;

    // One send outstanding at a time, rx_depth receives; both on the same CQ.
    let qp = setup
        .pd
        .create_qp::<T>(&setup.cq, &setup.cq)
        .max_send_wr(1)
        .max_recv_wr(options.rx_depth)
        .build()
        .map_err(|e| format!("couldn't create QP: {e}"))?;
    let qp = qp
        .into_init(&ConnectedInitAttr::new(options.ib_port))
        .map_err(|e| format!("failed to modify QP to INIT: {e}"))?;
    let mine = Dest {
        lid: setup.port.lid,
        qpn: qp.qp_num(),
        psn: exchange::random_psn(),
        gid: setup.gid,
    };
    print_address("local", &mine, false);

    let connect = |qp: QueuePair<T, Init>, remote: &Dest| {
        let av = address_vector(options, remote, 1)?;
        qp.into_rtr(&T::rtr(av, remote, mtu))
            .map_err(|e| format!("failed to modify QP to RTR: {e}"))?
            .into_rts(&T::rts(mine.psn))
            .map_err(|e| format!("failed to modify QP to RTS: {e}"))
    };
    let elapsed = match &options.servername {
        Some(host) => {
            let remote = exchange::client_exchange(host, options.port, &[mine])?[0];
            print_address("remote", &remote, false);
            let qp = connect(qp, &remote)?;
            let mut pingpong = Pingpong::new(&setup, options, qp, None, remote.qpn, size, 0)?;
            let elapsed = pingpong.run(&mut setup, options, || Ok(()))?;
            pingpong.check(options);
            elapsed
        }
        None => {
            let exchange = exchange::server_accept(options.port, 1)?;
            let remote = exchange.remote[0];
            print_address("remote", &remote, false);
            let qp = connect(qp, &remote)?;
            let mut pingpong = Pingpong::new(&setup, options, qp, None, remote.qpn, size, 0)?;
            // The server's QP is in RTS, with its receives posted, before it answers.
            let elapsed = pingpong.run(&mut setup, options, || exchange.reply(&[mine]))?;
            pingpong.check(options);
            elapsed
        }
    };
    print_results(size, options.iters, elapsed);
    Ok(())
}
