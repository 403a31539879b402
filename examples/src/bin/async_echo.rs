//! `async_echo`: a tokio server that accepts many clients at once over the connection manager
//! and echoes what each SENDs, and a client that opens many connections at once and checks
//! every echoed byte. Safe code only.
//!
//! Each client connection says its message size in the connect request's private data
//! (4 bytes, big-endian); the server makes that connection's slot ring of that size (refusing
//! sizes above 1 MiB with a reject whose private data says why), posts its receives, accepts,
//! and from then on answers each message with the same bytes until the client disconnects.
//! Every connection is a task; every wait is bounded; a peer that disconnects or dies ends
//! its connection only.
//!
//! ```text
//! async_echo -s [-a addr] [-p port] [-n connections]   (serve, 0: until killed)
//! async_echo -c -a addr [-p port] [-n connections] [-C rounds] [-S size]
//! ```

#![forbid(unsafe_code)] // the examples show the safe API: no `unsafe` anywhere

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use clap::Parser;
use rdma_cm::rdma_verbs::{
    AsyncCompletionChannel, CompletionQueue, QueuePair,
    cq::{WcStatus, WorkCompletion},
    qp::{Rc, Reset, Rts},
    slot::SlotRing,
    wr::{RecvRequest, SendRequest},
};
use rdma_cm::{
    AsyncCmId, AsyncConnectRequest, AsyncListener, CmId, ConnParam, EventKind, PortSpace,
};
use rdma_examples::pingpong;
use tokio::time::timeout;

const PROGRAM: &str = "async_echo";
/// The largest message a connection may ask for.
const MAX_SIZE: usize = 1 << 20;
/// Receives each side keeps posted.
const RECEIVES: usize = 2;

/// Echo over RDMA SEND/RECV with many concurrent connections.
#[derive(Parser, Debug)]
#[command(name = PROGRAM, args_override_self = true)]
struct Args {
    /// Run as the server.
    #[arg(short = 's', conflicts_with = "client")]
    server: bool,
    /// Run as the client.
    #[arg(short = 'c')]
    client: bool,
    /// Address: the server listens on it (all by default), the client connects to it.
    #[arg(short = 'a')]
    addr: Option<IpAddr>,
    /// Port.
    #[arg(short = 'p', default_value_t = 7471)]
    port: u16,
    /// Connections: the client opens this many at once; the server ends after serving this
    /// many (0: serves until killed).
    #[arg(short = 'n', default_value_t = 1)]
    connections: usize,
    /// Round trips per connection (client).
    #[arg(short = 'C', default_value_t = 10)]
    rounds: usize,
    /// Bytes per message (client; at most 1 MiB).
    #[arg(short = 'S', default_value_t = 4096)]
    size: usize,
    /// Bound of every wait, in seconds.
    #[arg(long = "timeout", default_value_t = 30)]
    timeout: u64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    let result = if args.server {
        server(&args).await
    } else if args.client {
        client(&args).await
    } else {
        Err("give -s (server) or -c (client)".to_string())
    };
    if let Err(message) = result {
        pingpong::fail(PROGRAM, message);
    }
}

/// One side of a connection: its queue pair (RTS), a completion queue whose events are
/// awaited, and its slots.
struct Endpoint {
    qp: QueuePair<Rc, Rts>,
    cq: CompletionQueue,
    channel: AsyncCompletionChannel,
    ring: SlotRing,
    bound: Duration,
}

/// The queue pair (RESET), completion queue and channel, and a ring of slots of `size` bytes
/// (receives and sends) on `id`'s device.
fn resources(
    id: &CmId,
    size: usize,
) -> Result<
    (
        QueuePair<Rc, Reset>,
        CompletionQueue,
        AsyncCompletionChannel,
        SlotRing,
    ),
    String,
> {
    let context = id.context().map_err(|e| e.to_string())?;
    let pd = context.alloc_pd().map_err(|e| e.to_string())?;
    let channel = context.create_comp_channel().map_err(|e| e.to_string())?;
    let cq = context
        .cq_builder(16)
        .channel(&channel)
        .build()
        .map_err(|e| e.to_string())?;
    let qp = pd.qp_builder(&cq, &cq).build().map_err(|e| e.to_string())?;
    let ring = qp
        .slot_ring(RECEIVES as u32 + 2, size)
        .map_err(|e| e.to_string())?;
    let channel = AsyncCompletionChannel::new(channel).map_err(|e| e.to_string())?;
    Ok((qp, cq, channel, ring))
}

impl Endpoint {
    fn post_receive(&mut self) -> Result<(), String> {
        let slot = self.ring.take().ok_or("no receive buffer free")?;
        self.qp
            .post_recv_slot(&mut self.ring, RecvRequest::new(slot))
            .map_err(|e| format!("post a receive: {}", e.error()))
    }

    fn send(&mut self, data: &[u8]) -> Result<(), String> {
        let mut slot = self.ring.take().ok_or("no send buffer free")?;
        self.ring.fill(&mut slot, data).map_err(|e| e.to_string())?;
        self.qp
            .post_send_slot(&mut self.ring, SendRequest::send(slot))
            .map_err(|e| format!("post a send: {}", e.error()))
    }

    /// Awaits the next completion, which must have succeeded, and takes its slot back: a
    /// receive's bytes are returned (`Some`), a send's slot is simply free again (`None`).
    /// Cancel-safe: the one await is `poll_async`'s, and nothing is taken before it returns.
    async fn next(&mut self) -> Result<Option<Vec<u8>>, String> {
        let mut wcs = [WorkCompletion::default(); 1];
        let polled = timeout(self.bound, self.cq.poll_async(&self.channel, &mut wcs))
            .await
            .map_err(|_| format!("no completion in {:?}", self.bound))?
            .map_err(|e| e.to_string())?;
        let wc = *polled.first().ok_or("poll returned nothing")?;
        let slot = self.ring.complete(&wc);
        if wc.status() != WcStatus::Success {
            return Err(format!("{:?} completion: {:?}", wc.opcode(), wc.status()));
        }
        let slot = slot.ok_or("a completion of no request of ours")?;
        let message = if wc.is_recv() {
            Some(self.ring.bytes(&slot).map_err(|e| e.to_string())?.to_vec())
        } else {
            None
        };
        self.ring.put(slot).map_err(|e| e.to_string())?;
        Ok(message)
    }
}

async fn server(args: &Args) -> Result<(), String> {
    let bound = Duration::from_secs(args.timeout);
    let ip = args.addr.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let listener = AsyncListener::bind(SocketAddr::new(ip, args.port), PortSpace::Tcp, 64)
        .map_err(|e| format!("listen on {ip}:{}: {e}", args.port))?;
    println!("{PROGRAM}: listening on {ip}:{}", args.port);
    let mut tasks = tokio::task::JoinSet::new();
    let mut accepted = 0;
    let mut served = 0;
    let mut failed = 0;
    while args.connections == 0 || served + failed < args.connections {
        tokio::select! {
            request = listener.accept(), if args.connections == 0 || accepted < args.connections => {
                let request = request.map_err(|e| format!("accept: {e}"))?;
                accepted += 1;
                tasks.spawn(serve(request, bound));
            }
            Some(result) = tasks.join_next() => {
                match result.map_err(|e| format!("a connection's task: {e}"))? {
                    Ok(line) => {
                        served += 1;
                        println!("{line}");
                    }
                    Err(line) => {
                        failed += 1;
                        println!("{line}");
                    }
                }
            }
            else => break,
        }
    }
    println!("{PROGRAM}: served {served} connections, {failed} ended early");
    Ok(())
}

/// Serves one connection; returns its report line (`Err` when it ended early).
async fn serve(request: AsyncConnectRequest, bound: Duration) -> Result<String, String> {
    let peer = request
        .id
        .id()
        .peer_addr()
        .map_or_else(|| "?".to_string(), |a| a.to_string());
    let size = request
        .private_data
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, |b| u32::from_be_bytes(b) as usize);
    if size == 0 || size > MAX_SIZE {
        let _ = request.id.id().reject(b"size out of range");
        return Err(format!("{peer}: refused, size {size}"));
    }
    let id = request.id;
    let echoed = echo(&id, size, bound)
        .await
        .map_err(|e| format!("{peer}: ended early: {e}"))?;
    Ok(format!("{peer}: echoed {echoed} messages of {size} bytes"))
}

async fn echo(id: &AsyncCmId, size: usize, bound: Duration) -> Result<usize, String> {
    let (qp, cq, channel, ring) = resources(id.id(), size)?;
    let qp = id.id().ready_rc_qp(qp).map_err(|e| e.to_string())?;
    let mut end = Endpoint {
        qp,
        cq,
        channel,
        ring,
        bound,
    };
    for _ in 0..RECEIVES {
        end.post_receive()?;
    }
    timeout(bound, id.accept(&end.qp, &ConnParam::new()))
        .await
        .map_err(|_| "no Established in time".to_string())?
        .map_err(|e| e.to_string())?;
    let mut echoed = 0;
    loop {
        tokio::select! {
            done = end.next() => {
                if let Some(bytes) = done? {
                    end.post_receive()?;
                    end.send(&bytes)?;
                    echoed += 1;
                }
            }
            event = id.next_event() => {
                let event = event.map_err(|e| e.to_string())?;
                if event.kind() == EventKind::Disconnected {
                    return Ok(echoed);
                }
            }
        }
    }
}

async fn client(args: &Args) -> Result<(), String> {
    if args.size == 0 || args.size > MAX_SIZE {
        return Err(format!("invalid size {} (1 to {MAX_SIZE})", args.size));
    }
    let addr = args
        .addr
        .ok_or("the client needs the server's address (-a)")?;
    let server = SocketAddr::new(addr, args.port);
    let bound = Duration::from_secs(args.timeout);
    let mut tasks = tokio::task::JoinSet::new();
    for connection in 0..args.connections {
        let (rounds, size) = (args.rounds, args.size);
        tasks.spawn(async move {
            run_connection(server, connection, rounds, size, bound)
                .await
                .map_err(|e| format!("connection {connection}: {e}"))
        });
    }
    let mut first_error = None;
    while let Some(result) = tasks.join_next().await {
        match result.map_err(|e| format!("a connection's task: {e}"))? {
            Ok(line) => println!("{line}"),
            Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    if let Some(error) = first_error {
        return Err(error);
    }
    println!(
        "{PROGRAM}: {} connections, {} round trips of {} bytes verified",
        args.connections,
        args.connections * args.rounds,
        args.size
    );
    Ok(())
}

/// The bytes of round `round` of connection `connection`.
fn message(connection: usize, round: usize, size: usize) -> Vec<u8> {
    (0..size)
        .map(|i| (i as u8).wrapping_mul(29) ^ (round as u8).wrapping_add(connection as u8 * 7))
        .collect()
}

async fn run_connection(
    server: SocketAddr,
    connection: usize,
    rounds: usize,
    size: usize,
    bound: Duration,
) -> Result<String, String> {
    let id = AsyncCmId::new(PortSpace::Tcp).map_err(|e| e.to_string())?;
    id.resolve(server, Duration::from_secs(2))
        .await
        .map_err(|e| e.to_string())?;
    let (qp, cq, channel, ring) = resources(id.id(), size)?;
    let size_word = u32::try_from(size)
        .map_err(|e| e.to_string())?
        .to_be_bytes();
    let param = ConnParam::new()
        .private_data(&size_word)
        .map_err(|e| e.to_string())?;
    let (qp, _) = timeout(bound, id.connect_qp(qp, &param))
        .await
        .map_err(|_| format!("no answer in {bound:?}"))?
        .map_err(|e| e.to_string())?;
    let mut end = Endpoint {
        qp,
        cq,
        channel,
        ring,
        bound,
    };
    end.post_receive()?;
    println!("connection {connection}: connected");
    for round in 0..rounds {
        let data = message(connection, round, size);
        end.send(&data)?;
        let (mut sent, mut echo) = (false, None);
        while !sent || echo.is_none() {
            tokio::select! {
                done = end.next() => {
                    match done.map_err(|e| format!("round {round}: {e}"))? {
                        None => sent = true,
                        Some(bytes) => echo = Some(bytes),
                    }
                }
                event = id.next_event() => {
                    let event = event.map_err(|e| e.to_string())?;
                    return Err(format!("round {round}: the server's connection manager said {:?}", event.kind()));
                }
            }
        }
        end.post_receive()?;
        if echo.as_deref() != Some(&data[..]) {
            return Err(format!(
                "round {round}: the echo differs from what was sent"
            ));
        }
    }
    timeout(bound, id.disconnect())
        .await
        .map_err(|_| "no Disconnected in time".to_string())?
        .map_err(|e| e.to_string())?;
    Ok(format!(
        "connection {connection}: {rounds} round trips of {size} bytes verified"
    ))
}
