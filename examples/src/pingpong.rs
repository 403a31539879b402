//! What rdma-core's `ibv_rc_pingpong`, `ibv_uc_pingpong` and `ibv_ud_pingpong` share: the
//! command line, device and port set-up, and the ping-pong loop.
//!
//! The loop is the C programs': the client posts the first send; each side keeps up to
//! `rx_depth` receives posted, and sends its next message once both its last send and a
//! receive have completed. Each message echoes the last one received, as in the C programs;
//! here it goes back from the slot it arrived in ([`Pingpong`], on a [`SlotRing`]).
//!
//! Three differences, all invisible to a C peer:
//!
//! - After the loop, and before its queue pair leaves RTS, each side runs an end handshake over
//!   the exchange's TCP connection ([`exchange::Link::finish`]): leaving RTS as soon as the last
//!   completion arrives can make rxe drop the ACK of the last message, and the peer would then
//!   wait for it forever. A C peer has closed that connection after the exchange; the Rust side
//!   then waits [`C_PEER_LINGER`] instead.
//! - `-c` checks every byte of every message received, on both sides, and fails the program
//!   (exit 1, one line, after the result lines) on a mismatch; the C programs check one byte
//!   per page of the last message, on the server, and only print what differs. See
//!   [`check_message`].
//! - The receive queue is topped up after every receive and whenever a send gives its slot
//!   back, where the C programs post `rx_depth - 1` receives at once when only one is left.

use std::io::Write;
use std::time::{Duration, Instant};

use clap::Parser;
use rdma_verbs::ah::AddressVector;
use rdma_verbs::cq::WorkCompletion;
use rdma_verbs::device::{Gid, Mtu, PortAttr, PortState};
use rdma_verbs::qp::{
    ConnectedInitAttr, Init, Rc, RcRtrAttr, RcRtsAttr, Rts, SendPath, SqPsnRtsAttr, Transport, Uc,
    UcRtrAttr,
};
use rdma_verbs::slot::{Slot, SlotRing};
use rdma_verbs::wr::SendRequest;
use rdma_verbs::{
    AddressHandle, CompletionChannel, CompletionQueue, Context, Error, ProtectionDomain, QueuePair,
    ffi,
};

use crate::exchange::{self, Dest, Link, PeerEnd};

/// The Q_Key of the UD programs.
pub const UD_QKEY: u32 = 0x1111_1111;
/// The C programs' `wr_id` of a receive: the loop's bit for "a receive is awaited".
pub const RECV_ID: u64 = 1;
/// The C programs' `wr_id` of a send (the tag of each send here): the loop's bit for "a send
/// is awaited".
pub const SEND_ID: u64 = 2;

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
    /// The C defaults for device `ib_dev` (the first one if `None`), port `ib_port` and GID
    /// index `gid_idx`: what [`setup`] needs, for programs that are not pingpongs.
    pub fn for_device(ib_dev: Option<String>, ib_port: u8, gid_idx: Option<u32>) -> Self {
        Self {
            port: 18515,
            ib_dev,
            ib_port,
            size: None,
            mtu: 1024,
            rx_depth: 1,
            iters: 1,
            sl: 0,
            events: false,
            gid_idx,
            chk: false,
            timeout: 30,
            servername: None,
        }
    }

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

/// The device, protection domain and completion queue of one pingpong process.
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

/// The byte rc, uc and ud pingpong fill their message with, as the C programs fill their buffer (srq_pingpong's
/// C program fills with 0: see [`client_message`]).
pub const FILL: u8 = 0x7b;

/// How long a side waits before leaving RTS when the peer closed the connection instead of
/// answering the end handshake (a C peer: see [`exchange::Link::finish`]).
///
/// Nothing tells when a C peer is done. rxe's responder sends the ACK of a message right after
/// it writes the receive completion, in the same piece of kernel work; leaving RTS in between
/// drops that ACK and leaves the sender retrying. This pause leaves that work ample time to
/// end. It is a margin, not a proof: the C programs themselves destroy their queue pair right
/// after their last completion.
pub const C_PEER_LINGER: Duration = Duration::from_millis(100);

/// The message a client sends first, which every later message echoes: `fill` everywhere and,
/// with `-c`, 0 at the start of each page. These are the bytes of the C programs (`memset` of
/// the buffer to 0x7b, or to 0 in srq_pingpong; then `buf[i] = i / page_size % sizeof(char)`,
/// which is 0, at each page start).
pub fn client_message(size: usize, fill: u8, chk: bool) -> Vec<u8> {
    let mut message = vec![fill; size];
    if chk {
        for byte in message.iter_mut().step_by(page_size()) {
            *byte = 0;
        }
    }
    message
}

/// What `-c` checks: every byte of `got` (the last message received) against the message the
/// protocol says every message is ([`client_message`] with `-c`). Returns one line naming the
/// first wrong byte and how many are wrong.
pub fn check_message(got: &[u8], fill: u8) -> Result<(), String> {
    let expected = client_message(got.len(), fill, true);
    let wrong: Vec<usize> = (0..got.len()).filter(|&i| got[i] != expected[i]).collect();
    match wrong.first() {
        None => Ok(()),
        Some(&first) => Err(format!(
            "invalid data in page {}: byte {first} is 0x{:02x}, expected 0x{:02x} ({} of {} bytes \
             wrong)",
            first / page_size(),
            got[first],
            expected[first],
            wrong.len(),
            got.len()
        )),
    }
}

/// One side of a pingpong: a queue pair in RTS and one slot ring ([`SlotRing`]) that both its
/// queues use.
///
/// The ring has `rx_depth + 1` slots of one message each (UD: after the 40-byte GRH every
/// receive starts with). Every free slot is posted as a receive; a message received is sent
/// back from its own slot (UD: moved to the slot's start first), so each message echoes the
/// last one received and the client's first message comes back every time, as in the C
/// programs, where one buffer takes every receive and gives every send. When the send
/// completes, its slot is posted as a receive again. With `-c` every message received is
/// checked, every byte, as it arrives ([`check`](Self::check)).
#[derive(Debug)]
pub struct Pingpong<T: Transport> {
    qp: QueuePair<T, Rts>,
    ring: SlotRing,
    ah: Option<AddressHandle>,
    remote_qpn: u32,
    size: usize,
    /// Where messages start in a slot: after the GRH for UD.
    offset: usize,
    /// Whether sends go inline (the C programs' `IBV_SEND_INLINE` when the message fits).
    inline: bool,
    /// With `-c`: the message every message is.
    expected: Option<Vec<u8>>,
    /// The first wrong message `-c` found.
    mismatch: Option<String>,
}

impl<T: Transport> Pingpong<T> {
    /// A pingpong over `qp`, with slots of `offset + size` bytes (UD: `offset` 40, and the
    /// peer's address handle).
    pub fn new(
        options: &Options,
        qp: QueuePair<T, Rts>,
        ah: Option<AddressHandle>,
        remote_qpn: u32,
        size: usize,
        offset: usize,
    ) -> Result<Self, String> {
        let ring = qp
            .slot_ring(options.rx_depth.saturating_add(1), (offset + size).max(1))
            .map_err(|e| format!("couldn't register MR: {e}"))?;
        let inline = qp.caps().max_inline_data as usize >= size;
        Ok(Self {
            qp,
            ring,
            ah,
            remote_qpn,
            size,
            offset,
            inline,
            expected: options.chk.then(|| client_message(size, FILL, true)),
            mismatch: None,
        })
    }

    /// Runs the program: posts a receive into every slot but the client's first message,
    /// calls `ready` (the server answers the address exchange there, so that its receives are
    /// posted before the client can send), then the loop: `iters` sends and receives each, the
    /// client sending first; then the end handshake on the exchange's connection, before the
    /// queue pair goes. Returns the time from the first send to the last completion, and how
    /// the peer ended the handshake.
    pub fn run(
        &mut self,
        setup: &mut Setup,
        options: &Options,
        ready: impl FnOnce() -> Result<Link, String>,
    ) -> Result<(Duration, PeerEnd), String> {
        let idle = Duration::from_secs(options.timeout);
        let first = match options.servername {
            Some(_) => {
                let mut slot = self.ring.take().ok_or("no slot for the first message")?;
                let message = client_message(self.size, FILL, options.chk);
                let bytes = self.ring.bytes_mut(&mut slot).map_err(|e| e.to_string())?;
                bytes[self.offset..self.offset + self.size].copy_from_slice(&message);
                Some(slot)
            }
            None => None,
        };
        self.repost()?;
        let link = ready()?;
        let mut pending = RECV_ID;
        // The message the next send echoes.
        let mut held = None;
        if let Some(slot) = first {
            self.send(slot)?;
            pending |= SEND_ID;
        }
        let start = Instant::now();
        let (mut rcnt, mut scnt) = (0u32, 0u32);
        let mut completions = [WorkCompletion::default(); 4];
        while rcnt < options.iters || scnt < options.iters {
            let n = wait_until(&mut setup.cq, setup.channel.as_ref(), idle, |cq| {
                cq.poll(&mut completions).map(|found| found.len())
            })?;
            for wc in &completions[..n] {
                let slot = self.ring.complete(wc);
                if !wc.is_success() {
                    // The C programs' ids: every send is tagged SEND_ID, receives are not.
                    let wr_id = match &slot {
                        Some(slot) if slot.tag() == SEND_ID => SEND_ID,
                        Some(_) => RECV_ID,
                        None => wc.wr_id(),
                    };
                    return Err(format!("Failed status {} for wr_id {wr_id}", wc.status()));
                }
                let slot =
                    slot.ok_or_else(|| format!("completion for unknown wr_id {}", wc.wr_id()))?;
                if wc.is_recv() {
                    self.check_received(&slot)?;
                    match held.replace(slot) {
                        Some(earlier) => self.give_back(earlier)?,
                        // A free slot takes the receive's place before the echo goes.
                        None => self.repost()?,
                    }
                    rcnt += 1;
                    pending &= !RECV_ID;
                } else {
                    self.give_back(slot)?;
                    scnt += 1;
                    pending &= !SEND_ID;
                }
                if scnt < options.iters && pending == 0 {
                    let echo = held.take().ok_or("nothing received to echo")?;
                    self.send(echo)?;
                    pending = RECV_ID | SEND_ID;
                }
            }
        }
        let elapsed = start.elapsed();
        // The end handshake runs while the queue pair is still in RTS: once the peer has
        // answered, it has had every completion it waits for. The receives still posted go
        // with the queue pair, which keeps the ring's slots registered until then.
        let end = link.finish(idle)?;
        if end == PeerEnd::Closed {
            std::thread::sleep(C_PEER_LINGER);
        }
        Ok((elapsed, end))
    }

    /// Sends the message in `slot` (after the GRH for UD: moved to the slot's start), inline
    /// when it fits.
    fn send(&mut self, mut slot: Slot) -> Result<(), String> {
        if self.offset > 0 {
            let bytes = self.ring.bytes_mut(&mut slot).map_err(|e| e.to_string())?;
            bytes.copy_within(self.offset..self.offset + self.size, 0);
        }
        slot.set_len(self.size);
        let mut request = SendRequest::send(slot).tag(SEND_ID);
        if self.inline {
            request = request.inline();
        }
        let posted = match &self.ah {
            Some(ah) => self
                .qp
                .post_send_slot(&mut self.ring, request.to(ah, self.remote_qpn, UD_QKEY)),
            None => self.qp.post_send_slot(&mut self.ring, request),
        };
        posted.map_err(|e| format!("couldn't post send: {e}"))
    }

    /// Returns `slot` to the ring and posts it as a receive.
    fn give_back(&mut self, slot: Slot) -> Result<(), String> {
        self.ring.put(slot).map_err(|e| e.to_string())?;
        self.repost()
    }

    /// Posts a receive into every free slot.
    fn repost(&mut self) -> Result<(), String> {
        self.qp
            .fill_slot_ring(&mut self.ring)
            .map(drop)
            .map_err(|e| format!("couldn't post receive: {e}"))
    }

    /// With `-c`, compares the message in `slot` with the one every message is, and keeps
    /// what the first wrong one differs in.
    fn check_received(&mut self, slot: &Slot) -> Result<(), String> {
        let Some(expected) = &self.expected else {
            return Ok(());
        };
        if self.mismatch.is_some() {
            return Ok(());
        }
        let bytes = self.ring.bytes(slot).map_err(|e| e.to_string())?;
        let got = bytes.get(self.offset..).unwrap_or_default();
        if got.len() != expected.len() {
            self.mismatch = Some(format!(
                "invalid data: received {} bytes, expected {}",
                got.len(),
                expected.len()
            ));
        } else if got != &expected[..] {
            self.mismatch = check_message(got, FILL).err();
        }
        Ok(())
    }

    /// With `-c`, the first message received that was not the protocol's (every byte of
    /// every message is checked as it arrives; the C programs check one byte per page of the
    /// last message, on the server only, and only print what differs).
    ///
    /// # Errors
    ///
    /// The first wrong message: its length, or its first wrong byte as [`check_message`]
    /// says.
    pub fn check(&self) -> Result<(), String> {
        match &self.mismatch {
            Some(error) => Err(error.clone()),
            None => Ok(()),
        }
    }
}

/// Waits for at least one completion on `cq`: calls `poll` (which returns how many it found)
/// until it finds some, or with `-e` sleeps on the channel first (and re-arms) and polls once.
/// Fails after `idle` without any. With `-e` the result may be 0.
pub fn wait_until(
    cq: &mut CompletionQueue,
    channel: Option<&CompletionChannel>,
    idle: Duration,
    mut poll: impl FnMut(&mut CompletionQueue) -> rdma_verbs::Result<usize>,
) -> Result<usize, String> {
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
        cq.req_notify(false)
            .map_err(|e| format!("couldn't request CQ notification: {e}"))?;
    }
    loop {
        let n = poll(cq).map_err(|e| format!("poll CQ failed: {e}"))?;
        if n > 0 || channel.is_some() {
            return Ok(n);
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

/// rc_pingpong's options that the other pingpongs lack, with the C program's letters.
///
/// The device features behind `-o`, `-O`, `-t` and `-j` are checked as the C program checks
/// them, with its messages, and the program fails where the device lacks them (rxe lacks all
/// four). None of them is implemented here (the messages live in slot rings of pinned, host
/// memory): on a device that has the feature, the program says so and fails. `-P` needs `-o`,
/// as in the C program.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct RcOptions {
    /// Use on demand paging.
    #[arg(short = 'o', long = "odp")]
    pub odp: bool,
    /// Use implicit on demand paging.
    #[arg(short = 'O', long = "iodp")]
    pub implicit_odp: bool,
    /// Prefetch an ODP MR.
    #[arg(short = 'P', long = "prefetch")]
    pub prefetch: bool,
    /// Get CQE with timestamp.
    #[arg(short = 't', long = "ts")]
    pub ts: bool,
    /// Use device memory.
    #[arg(short = 'j', long = "dm")]
    pub dm: bool,
    /// Use new post send WR API (`ibv_wr_*`).
    #[arg(short = 'N', long = "new_send")]
    pub new_send: bool,
}

impl RcOptions {
    /// The checks the C program makes of its options alone, before it opens the device.
    fn check_combination(&self) -> Result<(), String> {
        let odp = self.odp || self.implicit_odp;
        if odp && self.dm {
            return Err("DM memory region can't be on demand".into());
        }
        if !odp && self.prefetch {
            return Err("prefetch is valid only with on-demand memory region".into());
        }
        Ok(())
    }

    /// The checks the C program makes of the device (same order, same messages). Where the
    /// device has the feature asked for, the program says that it is not implemented here and
    /// fails.
    fn check_device(&self, context: &Context, size: usize) -> Result<(), String> {
        let odp = self.odp || self.implicit_odp;
        if !(odp || self.ts || self.dm) {
            return Ok(());
        }
        let attr = context
            .query_device()
            .map_err(|e| format!("Couldn't query device for its features: {e}"))?;
        if odp {
            let rc_caps = ffi::IBV_ODP_SUPPORT_SEND | ffi::IBV_ODP_SUPPORT_RECV;
            if attr.odp_general_caps & u64::from(ffi::IBV_ODP_SUPPORT) == 0
                || attr.rc_odp_caps & rc_caps != rc_caps
            {
                return Err(
                    "The device isn't ODP capable or does not support RC send and \
                            receive with ODP"
                        .into(),
                );
            }
            if self.implicit_odp
                && attr.odp_general_caps & u64::from(ffi::IBV_ODP_SUPPORT_IMPLICIT) == 0
            {
                return Err("The device doesn't support implicit ODP".into());
            }
            return Err(if self.implicit_odp {
                "implicit on-demand paging (-O) is not implemented by this program".into()
            } else {
                "on-demand paging (-o) is not implemented by this program (its slot rings \
                 register pinned memory)"
                    .into()
            });
        }
        if self.ts {
            if attr.completion_timestamp_mask == 0 {
                return Err("The device isn't completion timestamp capable".into());
            }
            return Err("completion timestamps (-t) are not implemented by this program".into());
        }
        if attr.max_dm_size == 0 {
            return Err("Device doesn't support dm allocation".into());
        }
        if attr.max_dm_size < size as u64 {
            return Err("Device memory is insufficient".into());
        }
        Err("device memory (-j) is not implemented by this program".into())
    }
}

/// The whole of `rc_pingpong` and `uc_pingpong`: set up, exchange addresses, connect, run.
/// `extra` holds rc_pingpong's own options (all off for uc_pingpong).
pub fn run_connected<T: Connected>(options: &Options, extra: &RcOptions) -> Result<(), String> {
    extra.check_combination()?;
    let mtu = mtu(options)?;
    let size = options.message_size(4096);
    let mut setup = setup(options, options.rx_depth + 1)?;
    extra.check_device(&setup.context, size)?;

    // One send outstanding at a time, rx_depth receives; both on the same CQ. With -N, sends
    // go through the ibv_wr_* builders of a queue pair made by ibv_create_qp_ex.
    let send_path = if extra.new_send {
        SendPath::Extended
    } else {
        SendPath::Classic
    };
    let qp = setup
        .pd
        .qp_builder::<T>(&setup.cq, &setup.cq)
        .max_send_wr(1)
        .max_recv_wr(options.rx_depth)
        .send_path(send_path)
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
    let (pingpong, elapsed) = match &options.servername {
        Some(host) => {
            let (remote, link) = exchange::client_exchange(host, options.port, &[mine])?;
            let remote = remote[0];
            print_address("remote", &remote, false);
            let qp = connect(qp, &remote)?;
            let mut pingpong = Pingpong::new(options, qp, None, remote.qpn, size, 0)?;
            let (elapsed, _) = pingpong.run(&mut setup, options, || Ok(link))?;
            (pingpong, elapsed)
        }
        None => {
            let exchange = exchange::server_accept(options.port, 1)?;
            let remote = exchange.remote[0];
            print_address("remote", &remote, false);
            let qp = connect(qp, &remote)?;
            let mut pingpong = Pingpong::new(options, qp, None, remote.qpn, size, 0)?;
            // The server's QP is in RTS, with its receives posted, before it answers.
            let (elapsed, _) = pingpong.run(&mut setup, options, || exchange.reply(&[mine]))?;
            (pingpong, elapsed)
        }
    };
    print_results(size, options.iters, elapsed);
    pingpong.check()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_message_is_the_c_programs() {
        let message = client_message(8193, FILL, true);
        for (i, &byte) in message.iter().enumerate() {
            let expected = if i % 4096 == 0 { 0 } else { 0x7b };
            assert_eq!(byte, expected, "byte {i}");
        }
        assert_eq!(client_message(5, FILL, false), vec![0x7b; 5]);
        assert_eq!(client_message(5000, 0, true), vec![0; 5000]);
        assert_eq!(check_message(&message, FILL), Ok(()));
    }

    #[test]
    fn every_wrong_byte_is_found() {
        let good = client_message(4095, FILL, true);
        for at in [0, 1, 2047, 4094] {
            let mut bad = good.clone();
            bad[at] ^= 0x01;
            let error = check_message(&bad, FILL).expect_err("a wrong byte");
            assert!(
                error.starts_with(&format!("invalid data in page 0: byte {at} is ")),
                "{error}"
            );
            assert!(error.ends_with("(1 of 4095 bytes wrong)"), "{error}");
        }
        // A message without the page markers (a peer without -c).
        let error = check_message(&vec![0x7b; 4096], FILL).expect_err("no marker");
        assert_eq!(
            error,
            "invalid data in page 0: byte 0 is 0x7b, expected 0x00 (1 of 4096 bytes wrong)"
        );
        assert!(check_message(&[0x7b; 10], 0).is_err());
    }
}
