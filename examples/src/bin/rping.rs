//! `rping`: rdma-core's ping over the connection manager, in safe code, interoperable with
//! the C `rping` in both directions.
//!
//! Per ping, the client fills its start buffer with `rdma-ping-N: ` and a rotating run of
//! letters, and SENDs its address, key and size (`struct rping_rdma_info`: big-endian 64-bit
//! address, 32-bit rkey, 32-bit size); the server RDMA READs it, answers with a 16-byte "go
//! ahead" SEND; the client SENDs the description of its sink buffer; the server RDMA WRITEs
//! what it read (the string and its NUL) there and SENDs "go ahead" again. With `-V` the
//! client compares the two buffers; with `-v` both print the data. After `-C` pings the client
//! disconnects.
//!
//! Both sides post from slot rings: the 16-byte messages from a ring of receives (every free
//! slot posted) and a ring of sends; the server READs into, and WRITEs from, the one slot of a
//! third ring. The client's start and sink buffers are plain registered regions, which only
//! the server's device reads and writes.
//!
//! ```text
//! rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port] [-P]
//! rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]
//! ```

#![forbid(unsafe_code)] // the examples show the safe API: no `unsafe` anywhere

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use clap::Parser;
use rdma_cm::rdma_verbs::{
    CompletionQueue, QueuePair,
    cq::WorkCompletion,
    mr::{AccessFlags, RemoteMemory},
    qp::{QpStateKind, Rc, Rts},
    slot::{Slot, SlotRing},
    wr::SendRequest,
};
use rdma_cm::{CmId, ConnParam, EventChannel, EventKind, PortSpace};
use rdma_examples::connect::next_wc;
use rdma_examples::pingpong;

const PROGRAM: &str = "rping";
/// `struct rping_rdma_info`: address, rkey, size.
const INFO: usize = 16;
/// The smallest buffer the C program accepts: the size of the text of `INT_MAX` plus that of
/// the `rdma-ping-%d: ` format, each with its NUL.
const MIN_SIZE: usize = 26;
const MAX_SIZE: usize = 65535;

/// RDMA ping over the connection manager.
#[derive(Parser, Debug)]
#[command(name = PROGRAM, args_override_self = true)]
struct Args {
    /// Run as the server.
    #[arg(short = 's', conflicts_with = "client")]
    server: bool,
    /// Run as the client.
    #[arg(short = 'c')]
    client: bool,
    /// Address: the server binds to it, the client connects to it.
    #[arg(short = 'a', long = "addr")]
    addr: Option<IpAddr>,
    /// The client's source address.
    #[arg(short = 'I')]
    source: Option<IpAddr>,
    /// Port.
    #[arg(short = 'p', long = "port", default_value_t = 7174)]
    port: u16,
    /// Pings (0: until interrupted).
    #[arg(short = 'C', long = "count", default_value_t = 0)]
    count: u64,
    /// Buffer size.
    #[arg(short = 'S', long = "size", default_value_t = 64)]
    size: usize,
    /// Print the ping data.
    #[arg(short = 'v')]
    verbose: bool,
    /// Validate the ping data (client).
    #[arg(short = 'V')]
    validate: bool,
    /// Debug output.
    #[arg(short = 'd')]
    debug: bool,
    /// Persistent server: serve clients one after another.
    #[arg(short = 'P')]
    persistent: bool,
    /// Bound of every wait, in seconds.
    #[arg(long = "timeout", default_value_t = 30)]
    timeout: u64,
}

fn main() {
    let args = Args::parse();
    let result = if args.server {
        server(&args)
    } else if args.client {
        client(&args)
    } else {
        Err("give -s (server) or -c (client)".to_string())
    };
    if let Err(message) = result {
        pingpong::fail(PROGRAM, message);
    }
}

/// The start buffer of ping `ping`: `rdma-ping-N: `, then letters from `start` rotating
/// through `A`..=`z`, and a NUL at the end.
fn ping_data(ping: u64, start: u8, size: usize) -> Vec<u8> {
    let mut data = format!("rdma-ping-{ping}: ").into_bytes();
    data.truncate(size);
    let mut c = start;
    while data.len() < size {
        data.push(c);
        c = if c >= b'z' { b'A' } else { c + 1 };
    }
    data[size - 1] = 0;
    data
}

fn encode(remote: RemoteMemory) -> [u8; INFO] {
    let mut info = [0u8; INFO];
    info[..8].copy_from_slice(&remote.addr.to_be_bytes());
    info[8..12].copy_from_slice(&remote.rkey.to_be_bytes());
    info[12..].copy_from_slice(&remote.len.to_be_bytes());
    info
}

fn decode(bytes: &[u8]) -> Result<RemoteMemory, String> {
    if bytes.len() != INFO {
        return Err(format!("received bogus data, size {}", bytes.len()));
    }
    let word =
        |range: std::ops::Range<usize>| -> [u8; 4] { bytes[range].try_into().unwrap_or_default() };
    Ok(RemoteMemory {
        addr: u64::from_be_bytes(bytes[..8].try_into().unwrap_or_default()),
        rkey: u32::from_be_bytes(word(8..12)),
        len: u32::from_be_bytes(word(12..16)),
    })
}

fn check_size(size: usize) -> Result<(), String> {
    if (MIN_SIZE..=MAX_SIZE).contains(&size) {
        Ok(())
    } else {
        Err(format!(
            "invalid size {size} (min {MIN_SIZE} max {MAX_SIZE})"
        ))
    }
}

/// The slot rings of one side's 16-byte messages: receives (every free slot posted) and
/// sends.
struct Messages {
    rx: SlotRing,
    tx: SlotRing,
}

impl Messages {
    /// Both rings, with the receives posted (the C program keeps one posted; two here).
    fn new(qp: &mut QueuePair<Rc, Rts>) -> Result<Self, String> {
        let mut rx = qp.slot_ring(2, INFO).map_err(|e| e.to_string())?;
        let tx = qp.slot_ring(4, INFO).map_err(|e| e.to_string())?;
        qp.fill_slot_ring(&mut rx)
            .map_err(|e| format!("ibv_post_recv failed: {e}"))?;
        Ok(Self { rx, tx })
    }

    /// SENDs `info`: the 16-byte description of a buffer, or zeros for a bare "go ahead".
    fn send(&mut self, qp: &mut QueuePair<Rc, Rts>, info: [u8; INFO]) -> Result<(), String> {
        let mut slot = self.tx.take().ok_or("no send buffer free")?;
        self.tx.fill(&mut slot, &info).map_err(|e| e.to_string())?;
        qp.post_send_slot(&mut self.tx, SendRequest::send(slot))
            .map_err(|e| format!("post send error: {e}"))
    }

    /// Takes the successful completion `wc` back into its ring: a send's slot is free again
    /// (`None`); a receive's bytes are returned (exactly [`INFO`] of them, as the C program
    /// insists) and its slot is posted again. Fails for a completion of neither ring.
    fn complete(
        &mut self,
        qp: &mut QueuePair<Rc, Rts>,
        wc: &WorkCompletion,
    ) -> Result<Option<[u8; INFO]>, String> {
        if let Some(slot) = self.rx.complete(wc) {
            let bytes = self.rx.bytes(&slot).map_err(|e| e.to_string())?;
            let message = <[u8; INFO]>::try_from(bytes)
                .map_err(|_| format!("received bogus data, size {}", bytes.len()));
            self.rx.put(slot).map_err(|e| e.to_string())?;
            qp.fill_slot_ring(&mut self.rx)
                .map_err(|e| format!("ibv_post_recv failed: {e}"))?;
            return message.map(Some);
        }
        match self.tx.complete(wc) {
            Some(slot) => self.tx.put(slot).map(|()| None).map_err(|e| e.to_string()),
            None => Err(format!("unexpected completion {wc:?}")),
        }
    }

    /// Waits for the peer's next message, taking back the slots of this side's sends.
    fn next(
        &mut self,
        cq: &mut CompletionQueue,
        qp: &mut QueuePair<Rc, Rts>,
        timeout: Duration,
        what: &str,
    ) -> Result<[u8; INFO], String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let wc = next_wc(cq, left).map_err(|e| format!("{what}: {e}"))?;
            if let Some(message) = self.complete(qp, &wc)? {
                return Ok(message);
            }
        }
    }
}

/// The bytes of `buf` up to its first NUL, as text.
fn c_string(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn client(args: &Args) -> Result<(), String> {
    check_size(args.size)?;
    let addr = args
        .addr
        .ok_or("the client needs the server's address (-a)")?;
    let timeout = Duration::from_secs(args.timeout);
    let channel = EventChannel::new().map_err(|e| e.to_string())?;
    let id = CmId::new(&channel, PortSpace::Tcp).map_err(|e| e.to_string())?;
    if let Some(source) = args.source {
        id.bind_addr(SocketAddr::new(source, 0))
            .map_err(|e| e.to_string())?;
    }
    id.resolve(SocketAddr::new(addr, args.port), timeout)
        .map_err(|e| format!("cannot reach {addr} port {}: {e}", args.port))?;
    let context = id.context().map_err(|e| e.to_string())?;
    let pd = context.alloc_pd().map_err(|e| e.to_string())?;
    let mut cq = context.create_cq(16).map_err(|e| e.to_string())?;
    let qp = pd
        .qp_builder(&cq, &cq)
        .build()
        .map_err(|e| format!("ibv_create_qp: {e}"))?;
    let remote = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    let mut start = pd
        .register(args.size, AccessFlags::LOCAL_WRITE | remote)
        .map_err(|e| e.to_string())?;
    let mut sink = pd
        .register(args.size, AccessFlags::LOCAL_WRITE | remote)
        .map_err(|e| e.to_string())?;
    let (mut qp, _) = id
        .connect_qp(qp, &ConnParam::new(), timeout)
        .map_err(|e| format!("connect error: {e}"))?;
    if args.debug {
        eprintln!("rping: connected to {addr}, queue pair {:#x}", qp.qp_num());
    }
    let mut messages = Messages::new(&mut qp)?;
    let mut letter = b'A';
    let mut ping = 0u64;
    while args.count == 0 || ping < args.count {
        let data = ping_data(ping, letter, args.size);
        letter = if letter >= b'z' { b'A' } else { letter + 1 };
        start.write_at(0, &data).map_err(|e| e.to_string())?;
        // The start buffer: the server reads it, then says "go ahead".
        let info = encode(start.remote(..).map_err(|e| e.to_string())?);
        messages.send(&mut qp, info)?;
        messages.next(&mut cq, &mut qp, timeout, "waiting for the server's read")?;
        // The sink: the server writes what it read there, then says "go ahead".
        let info = encode(sink.remote(..).map_err(|e| e.to_string())?);
        messages.send(&mut qp, info)?;
        messages.next(&mut cq, &mut qp, timeout, "waiting for the server's write")?;
        let mut got = vec![0u8; args.size];
        sink.read_at(0, &mut got).map_err(|e| e.to_string())?;
        if args.verbose {
            println!("ping data: {}", c_string(&got));
        }
        if args.validate && got != data {
            return Err("data mismatch!".to_string());
        }
        // Cleared, so that a ping the server does not write shows.
        sink.write_at(0, &vec![0u8; args.size])
            .map_err(|e| e.to_string())?;
        ping += 1;
    }
    if args.debug {
        eprintln!("rping: {ping} pings done; disconnecting");
    }
    id.disconnect().map_err(|e| e.to_string())?;
    drop(id.wait_event(EventKind::Disconnected, timeout));
    Ok(())
}

fn server(args: &Args) -> Result<(), String> {
    check_size(args.size)?;
    let timeout = Duration::from_secs(args.timeout);
    let channel = EventChannel::new().map_err(|e| e.to_string())?;
    let listener = CmId::new(&channel, PortSpace::Tcp).map_err(|e| e.to_string())?;
    let bind = SocketAddr::new(args.addr.unwrap_or(IpAddr::from([0, 0, 0, 0])), args.port);
    listener
        .bind_addr(bind)
        .map_err(|e| format!("rdma_bind_addr {bind}: {e}"))?;
    listener.listen(3).map_err(|e| e.to_string())?;
    if args.debug {
        eprintln!("rping: listening on {bind}");
    }
    loop {
        // A client may take its time: wait for it without a bound.
        let mut request = loop {
            match channel.get_event(None).map_err(|e| e.to_string())? {
                Some(event) if event.kind() == EventKind::ConnectRequest => break event,
                Some(other) if args.debug => eprintln!("rping: ignoring {:?}", other.kind()),
                Some(_) | None => {}
            }
        };
        let id = request
            .take_id()
            .ok_or("a connect request without an identifier")?;
        drop(request);
        // Each connection reports on a channel of its own.
        let own = EventChannel::new().map_err(|e| e.to_string())?;
        id.migrate(&own).map_err(|e| e.to_string())?;
        let served = serve(args, &id, timeout);
        if let Err(message) = &served {
            if !args.persistent {
                return Err(message.clone());
            }
            eprintln!("{PROGRAM}: {message}");
        }
        if !args.persistent {
            return Ok(());
        }
    }
}

/// Serves one client: accepts, then answers pings until it disconnects.
fn serve(args: &Args, id: &CmId, timeout: Duration) -> Result<(), String> {
    let context = id.context().map_err(|e| e.to_string())?;
    let pd = context.alloc_pd().map_err(|e| e.to_string())?;
    let mut cq = context.create_cq(16).map_err(|e| e.to_string())?;
    let qp = pd
        .qp_builder(&cq, &cq)
        .build()
        .map_err(|e| format!("ibv_create_qp: {e}"))?;
    // INIT, RTR and RTS with the connection's attributes, receives posted, then accept: the
    // client's first SEND finds one.
    let attr = |state| id.init_qp_attr(state).map_err(|e| e.to_string());
    let mut qp = qp
        .into_init_with(&attr(QpStateKind::Init)?)
        .map_err(|e| e.error().to_string())?
        .into_rtr_with(&attr(QpStateKind::Rtr)?)
        .map_err(|e| e.error().to_string())?
        .into_rts_with(&attr(QpStateKind::Rts)?)
        .map_err(|e| e.error().to_string())?;
    let mut messages = Messages::new(&mut qp)?;
    // The one buffer the server READs into and WRITEs from.
    let mut rdma = qp
        .slot_ring(1, args.size.max(MAX_SIZE))
        .map_err(|e| e.to_string())?;
    id.accept(&ConnParam::new().qp_num(qp.qp_num()))
        .map_err(|e| format!("rdma_accept: {e}"))?;
    drop(
        id.wait_event(EventKind::Established, timeout)
            .map_err(|e| format!("connect error: {e}"))?,
    );
    if args.debug {
        eprintln!("rping: accepted queue pair {:#x}", qp.qp_num());
    }
    loop {
        // The client's start buffer, or its disconnect.
        let Some(info) =
            recv_or_disconnect(&mut cq, &mut qp, &mut messages, id, "waiting for a ping")?
        else {
            return Ok(());
        };
        let source = decode(&info)?;
        if source.len as usize > rdma.slot_size() {
            return Err(format!(
                "the client's buffer of {} bytes is too large",
                source.len
            ));
        }
        let mut slot = rdma.take().ok_or("the read buffer is in use")?;
        slot.set_len(source.len as usize);
        qp.post_send_slot(&mut rdma, SendRequest::read(slot, source))
            .map_err(|e| format!("post send error: {e}"))?;
        let mut slot = wait_rdma(&mut cq, &mut qp, &mut messages, &mut rdma, timeout)?;
        let text = c_string(rdma.bytes(&slot).map_err(|e| e.to_string())?);
        if args.verbose {
            println!("server ping data: {text}");
        }
        // Go ahead: the client sends its sink next.
        messages.send(&mut qp, [0; INFO])?;
        let info = messages.next(&mut cq, &mut qp, timeout, "waiting for the sink")?;
        let sink = decode(&info)?;
        // The string and its NUL, as the C server writes.
        let len = (text.len() + 1).min(slot.len()).min(sink.len as usize);
        slot.set_len(len);
        qp.post_send_slot(
            &mut rdma,
            SendRequest::write(slot, sink.slice(0, len as u32).map_err(|e| e.to_string())?),
        )
        .map_err(|e| format!("post send error: {e}"))?;
        let slot = wait_rdma(&mut cq, &mut qp, &mut messages, &mut rdma, timeout)?;
        rdma.put(slot).map_err(|e| e.to_string())?;
        messages.send(&mut qp, [0; INFO])?;
    }
}

/// Waits for the completion of the READ or WRITE of `rdma`'s slot (taking back the slots of
/// this side's sends meanwhile), and returns the slot.
fn wait_rdma(
    cq: &mut CompletionQueue,
    qp: &mut QueuePair<Rc, Rts>,
    messages: &mut Messages,
    rdma: &mut SlotRing,
    timeout: Duration,
) -> Result<Slot, String> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let wc = next_wc(cq, left).map_err(|e| format!("waiting for a completion: {e}"))?;
        if let Some(slot) = rdma.complete(&wc) {
            return Ok(slot);
        }
        if messages.complete(qp, &wc)?.is_some() {
            return Err("a message from the client before the server's transfer ended".into());
        }
    }
}

/// The next message from the client, or `None` when it disconnected (the connection's own
/// channel reports `Disconnected`). Waits for either without a bound: an idle client is
/// allowed.
fn recv_or_disconnect(
    cq: &mut CompletionQueue,
    qp: &mut QueuePair<Rc, Rts>,
    messages: &mut Messages,
    id: &CmId,
    what: &str,
) -> Result<Option<[u8; INFO]>, String> {
    let channel = id.channel();
    let mut wcs = [WorkCompletion::default(); 1];
    loop {
        let polled = cq
            .poll(&mut wcs)
            .map_err(|e| format!("poll CQ failed: {e}"))?;
        if let [wc] = polled {
            if !wc.is_success() {
                return Err(format!("{what}: completion error {}", wc.status()));
            }
            if let Some(message) = messages.complete(qp, wc)? {
                return Ok(Some(message));
            }
            continue;
        }
        if let Some(event) = channel.try_get_event().map_err(|e| e.to_string())? {
            if event.kind() == EventKind::Disconnected {
                return Ok(None);
            }
        }
        std::thread::yield_now();
    }
}
