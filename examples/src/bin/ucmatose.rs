//! `ucmatose`: rdma-core's connection-manager stress test (`cmatose.c`), in safe code,
//! interoperable with the C `ucmatose` in both directions.
//!
//! The client opens `-c` RC connections to the server, each with `-C` receives posted before
//! it connects. Once all are established the server sends `-C` messages of `-S` bytes on each
//! and reaps them, then reaps as many replies; the client receives and replies. The server
//! then disconnects every connection (after moving them all to a new event channel with
//! `-m`) and waits for each to end; the client answers each `Disconnected` with its own
//! disconnect. Every completion is checked (status, opcode, length); between two Rust programs
//! `-V` makes both sides compare every byte. Each connection posts from two slot rings, one
//! for its receives and one for its sends.
//!
//! ```text
//! ucmatose [-b bind_address] [-p port] [-c connections] [-C count] [-S size] [-t tos] [-m]
//! ucmatose -s server_address [-b bind_address] [-p port] [-c ...] [-C ...] [-S ...] [-m]
//! ```

#![forbid(unsafe_code)] // the examples show the safe API: no `unsafe` anywhere

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use clap::Parser;
use rdma_cm::rdma_verbs::{
    CompletionQueue, QueuePair,
    cq::{WcOpcode, WcStatus, WorkCompletion},
    qp::{CanPostRecv, Rc, Reset, Rts},
    slot::SlotRing,
    wr::{RecvRequest, SendRequest},
};
use rdma_cm::{CmId, ConnParam, EventChannel, EventKind, PortSpace};
use rdma_examples::cmtool::{self, lookup, parse_u8};

const PROGRAM: &str = "cmatose";
/// The C program's address and route resolution timeout.
const RESOLVE: Duration = Duration::from_millis(2000);

/// Many RC connections over the connection manager, with a message exchange on each.
#[derive(Parser, Debug)]
#[command(name = "ucmatose", args_override_self = true)]
struct Args {
    /// The server's address: run as the client (the server otherwise).
    #[arg(short = 's')]
    server: Option<String>,
    /// The local address to bind to.
    #[arg(short = 'b')]
    bind: Option<String>,
    /// Port.
    #[arg(short = 'p', default_value_t = 7471)]
    port: u16,
    /// Connections.
    #[arg(short = 'c', default_value_t = 1)]
    connections: usize,
    /// Messages each way on each connection.
    #[arg(short = 'C', default_value_t = 10)]
    count: usize,
    /// Bytes per message.
    #[arg(short = 'S', default_value_t = 100)]
    size: usize,
    /// Type of service (the IP traffic class on RoCE).
    #[arg(short = 't', value_parser = parse_u8)]
    tos: Option<u8>,
    /// Move every connection to a new event channel before disconnecting.
    #[arg(short = 'm')]
    migrate: bool,
    /// Port space: only `tcp`.
    #[arg(short = 'P')]
    port_space: Option<String>,
    /// Address format: `ip` or `name`.
    #[arg(short = 'f')]
    format: Option<String>,
    /// Compare every received byte (both sides Rust: the C program sends its buffer as it
    /// happens to be).
    #[arg(short = 'V')]
    validate: bool,
    /// Bound of every wait, in seconds.
    #[arg(long = "timeout", default_value_t = 30)]
    timeout: u64,
}

fn main() {
    let args = Args::parse();
    let result = check_args(&args).and_then(|()| {
        if args.server.is_some() {
            client(&args)
        } else {
            server(&args)
        }
    });
    cmtool::finish(PROGRAM, result);
}

fn check_args(args: &Args) -> Result<(), String> {
    if let Some(ps) = &args.port_space {
        if !ps.to_ascii_lowercase().starts_with("tcp") {
            return Err(format!("port space {ps:?}: only tcp is supported"));
        }
    }
    cmtool::check_format_and_count(args.format.as_deref(), args.connections)
}

/// Message `message` of connection `connection` from the server (`reply` false) or the
/// client.
fn payload(connection: usize, message: usize, reply: bool, size: usize) -> Vec<u8> {
    let seed = (connection as u8).wrapping_mul(37) ^ (message as u8) ^ if reply { 0x80 } else { 0 };
    (0..size)
        .map(|i| (i as u8).wrapping_mul(11).wrapping_add(seed))
        .collect()
}

/// One connection: its identifier, queue pair, and queues.
struct Node {
    id: CmId,
    qp: QueuePair<Rc, Rts>,
    queues: Queues,
}

/// A connection's two completion queues (as the C program: sends and receives apart) and its
/// slot rings, one of receives and one of sends.
struct Queues {
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    rx: SlotRing,
    tx: SlotRing,
}

/// The queue pair (RESET), queues and slots on `id`'s device, for `count` messages each way.
fn resources(
    id: &CmId,
    count: usize,
    size: usize,
) -> Result<(QueuePair<Rc, Reset>, Queues), String> {
    let context = id.context().map_err(|e| e.to_string())?;
    let pd = context
        .alloc_pd()
        .map_err(|e| format!("unable to allocate PD: {e}"))?;
    let depth = u32::try_from(count.max(1)).map_err(|e| e.to_string())?;
    let send_cq = context
        .create_cq(depth)
        .map_err(|e| format!("unable to create CQ: {e}"))?;
    let recv_cq = context
        .create_cq(depth)
        .map_err(|e| format!("unable to create CQ: {e}"))?;
    let qp = pd
        .qp_builder(&send_cq, &recv_cq)
        .max_send_wr(depth)
        .max_recv_wr(depth)
        .build()
        .map_err(|e| format!("unable to create QP: {e}"))?;
    let ring = || {
        qp.slot_ring(depth, size.max(1))
            .map_err(|e| format!("failed message allocation: {e}"))
    };
    let (rx, tx) = (ring()?, ring()?);
    Ok((
        qp,
        Queues {
            send_cq,
            recv_cq,
            rx,
            tx,
        },
    ))
}

/// Posts `count` receives, from the slots of `rx`, each tagged with its number.
fn post_receives<S: CanPostRecv>(
    qp: &mut QueuePair<Rc, S>,
    rx: &mut SlotRing,
    count: usize,
) -> Result<(), String> {
    for i in 0..count {
        let slot = rx.take().ok_or("out of buffers")?;
        qp.post_recv_slot(rx, RecvRequest::new(slot).tag(i as u64))
            .map_err(|e| format!("failed to post receives: {}", e.error()))?;
    }
    Ok(())
}

impl Node {
    fn post_sends(&mut self, payloads: impl Iterator<Item = Vec<u8>>) -> Result<(), String> {
        let tx = &mut self.queues.tx;
        for (i, data) in payloads.enumerate() {
            let mut slot = tx.take().ok_or("out of buffers")?;
            tx.fill(&mut slot, &data).map_err(|e| e.to_string())?;
            self.qp
                .post_send_slot(tx, SendRequest::send(slot).tag(i as u64))
                .map_err(|e| format!("failed to post sends: {}", e.error()))?;
        }
        Ok(())
    }

    /// Reaps `count` completions of `opcode` from the send or receive queue, in order; for
    /// receives, checks the length and (with `expect`) every byte of message `i`.
    fn reap(
        &mut self,
        receives: bool,
        count: usize,
        size: usize,
        expect: Option<&dyn Fn(usize) -> Vec<u8>>,
        bound: Duration,
    ) -> Result<(), String> {
        let Queues {
            send_cq,
            recv_cq,
            rx,
            tx,
        } = &mut self.queues;
        let (cq, ring, opcode) = if receives {
            (recv_cq, rx, WcOpcode::Recv)
        } else {
            (send_cq, tx, WcOpcode::Send)
        };
        let mut wcs = [WorkCompletion::default(); 1];
        for i in 0..count {
            let wc = match cq
                .poll_for(&mut wcs, 1, bound)
                .map_err(|e| format!("failed polling CQ: {e}"))?
            {
                [wc] => *wc,
                _ => {
                    return Err(format!(
                        "failed polling CQ: no completion within {} s",
                        bound.as_secs()
                    ));
                }
            };
            let slot = ring.complete(&wc);
            if wc.status() != WcStatus::Success || wc.opcode() != opcode {
                return Err(format!(
                    "{opcode:?} {i}: {:?} {:?} (vendor error {:#x})",
                    wc.status(),
                    wc.opcode(),
                    wc.vendor_err()
                ));
            }
            let slot = slot.ok_or("a completion of no request of this connection")?;
            if slot.tag() != i as u64 {
                return Err(format!(
                    "{opcode:?} {i}: the completion of request {}",
                    slot.tag()
                ));
            }
            if receives {
                if slot.len() != size {
                    return Err(format!(
                        "message {i}: {} bytes, expected {size}",
                        slot.len()
                    ));
                }
                if let Some(expect) = expect {
                    if ring.bytes(&slot).map_err(|e| e.to_string())? != &expect(i)[..] {
                        return Err(format!("message {i} differs from what was sent"));
                    }
                }
            }
            ring.put(slot).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// Waits, on `channel`, for a `Disconnected` event about each of `nodes`; answers each
/// with a disconnect of its own when `answer`.
fn disconnect_events(
    channel: &EventChannel,
    nodes: &[Node],
    answer: bool,
    bound: Duration,
) -> Result<(), String> {
    let mut left: Vec<bool> = vec![true; nodes.len()];
    let deadline = Instant::now() + bound;
    while left.iter().any(|&l| l) {
        let wait = deadline.saturating_duration_since(Instant::now());
        let event = channel
            .get_event(Some(wait))
            .map_err(|e| e.to_string())?
            .ok_or_else(|| {
                format!(
                    "{} connections still up after {bound:?}",
                    left.iter().filter(|&&l| l).count()
                )
            })?;
        let Some(index) = nodes.iter().position(|n| event.is_for(&n.id)) else {
            continue;
        };
        if event.kind() == EventKind::Disconnected && left[index] {
            drop(event);
            if answer {
                // The peer disconnected: complete it from this side, as the C program does
                // (an error here means it is complete already).
                let _ = nodes[index].id.disconnect();
            }
            left[index] = false;
        }
    }
    Ok(())
}

/// Moves every connection to one new event channel (`-m`) and returns it.
fn migrate(nodes: &[Node]) -> Result<EventChannel, String> {
    println!("migrating to new event channel");
    let channel =
        EventChannel::new().map_err(|e| format!("failed to create event channel: {e}"))?;
    for node in nodes {
        node.id
            .migrate(&channel)
            .map_err(|e| format!("failure migrating to channel: {e}"))?;
    }
    Ok(channel)
}

fn client(args: &Args) -> Result<(), String> {
    let bound = Duration::from_secs(args.timeout);
    println!("{PROGRAM}: starting client");
    let dst = lookup(args.server.as_deref().unwrap_or_default(), args.port)?;
    let src = args.bind.as_deref().map(|h| lookup(h, 0)).transpose()?;
    println!("{PROGRAM}: connecting");
    let mut param = ConnParam::new();
    param.retry_count = 5;
    // Each connection resolves and connects in turn on a channel of its own; the server
    // accepts them as they come.
    let mut nodes = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        let channel =
            EventChannel::new().map_err(|e| format!("failed to create event channel: {e}"))?;
        let id = CmId::new(&channel, PortSpace::Tcp).map_err(|e| e.to_string())?;
        id.resolve_addr(src, dst, RESOLVE)
            .map_err(|e| format!("failure getting addr: {e}"))?;
        drop(wait(&id, EventKind::AddrResolved, bound)?);
        if let Some(tos) = args.tos {
            id.set_tos(tos)
                .map_err(|e| format!("set TOS option failed: {e}"))?;
        }
        id.resolve_route(RESOLVE)
            .map_err(|e| format!("resolve route failed: {e}"))?;
        drop(wait(&id, EventKind::RouteResolved, bound)?);
        let (qp, mut queues) = resources(&id, args.count, args.size)?;
        // The receives go in at INIT, before the connect: the server sends as soon as every
        // connection is up.
        let mut qp = id.init_rc_qp(qp).map_err(|e| e.to_string())?;
        post_receives(&mut qp, &mut queues.rx, args.count)?;
        let (qp, _) = id
            .connect_init_qp(qp, &param, bound)
            .map_err(|e| cm_error(&e))?;
        nodes.push(Node { id, qp, queues });
    }
    if args.count > 0 && args.size > 0 {
        println!("receiving data transfers");
        receive_all(&mut nodes, false, args, bound)?;
        println!("sending replies");
        for (c, node) in nodes.iter_mut().enumerate() {
            node.post_sends((0..args.count).map(|m| payload(c, m, true, args.size)))?;
        }
        for node in &mut nodes {
            node.reap(false, args.count, args.size, None, bound)?;
        }
        println!("data transfers complete");
    }
    if args.migrate {
        let channel = migrate(&nodes)?;
        return disconnect_events(&channel, &nodes, true, bound);
    }
    for node in &nodes {
        disconnect_events(&node.id.channel(), std::slice::from_ref(node), true, bound)?;
    }
    Ok(())
}

/// Reaps `args.count` receives on every connection, comparing each message with the one
/// the peer sent (`reply`: the client's answers) when `-V` asks for it.
fn receive_all(
    nodes: &mut [Node],
    reply: bool,
    args: &Args,
    bound: Duration,
) -> Result<(), String> {
    for (c, node) in nodes.iter_mut().enumerate() {
        let expect = move |m: usize| payload(c, m, reply, args.size);
        node.reap(
            true,
            args.count,
            args.size,
            args.validate.then_some(&expect),
            bound,
        )?;
    }
    Ok(())
}

/// A connection-manager error as the C program reports a failed event.
fn cm_error(error: &rdma_cm::Error) -> String {
    match error {
        rdma_cm::Error::Event { event, status, .. } => {
            format!("event: {event:?}, error: {status}")
        }
        other => other.to_string(),
    }
}

fn wait(id: &CmId, kind: EventKind, bound: Duration) -> Result<rdma_cm::Event, String> {
    id.wait_event(kind, bound).map_err(|e| cm_error(&e))
}

fn server(args: &Args) -> Result<(), String> {
    let bound = Duration::from_secs(args.timeout);
    println!("{PROGRAM}: starting server");
    let channel =
        EventChannel::new().map_err(|e| format!("failed to create event channel: {e}"))?;
    let listener =
        CmId::new(&channel, PortSpace::Tcp).map_err(|e| format!("listen request failed: {e}"))?;
    let local = match args.bind.as_deref() {
        Some(host) => lookup(host, args.port)?,
        None => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), args.port),
    };
    listener
        .bind_addr(local)
        .map_err(|e| format!("bind address failed: {e}"))?;
    listener
        .listen(0)
        .map_err(|e| format!("failure trying to listen: {e}"))?;
    let mut nodes = Vec::with_capacity(args.connections);
    while nodes.len() < args.connections {
        let request = listener.get_request(bound).map_err(|e| {
            format!(
                "{} of {} connected: {}",
                nodes.len(),
                args.connections,
                cm_error(&e)
            )
        })?;
        let id = request.id;
        let accepted = resources(&id, args.count, args.size).and_then(|(qp, queues)| {
            let qp = id.ready_rc_qp(qp).map_err(|e| e.to_string())?;
            let mut node = Node {
                id: id.clone(),
                qp,
                queues,
            };
            post_receives(&mut node.qp, &mut node.queues.rx, args.count)?;
            node.id
                .accept(&ConnParam::new().qp_num(node.qp.qp_num()))
                .map_err(|e| format!("failure accepting: {e}"))?;
            Ok(node)
        });
        match accepted {
            Ok(node) => nodes.push(node),
            Err(error) => {
                let _ = id.reject(&[]);
                return Err(format!("failing connection request: {error}"));
            }
        }
    }
    for node in &nodes {
        drop(wait(&node.id, EventKind::Established, bound)?);
    }
    if args.count > 0 && args.size > 0 {
        println!("initiating data transfers");
        for (c, node) in nodes.iter_mut().enumerate() {
            node.post_sends((0..args.count).map(|m| payload(c, m, false, args.size)))?;
        }
        println!("completing sends");
        for node in &mut nodes {
            node.reap(false, args.count, args.size, None, bound)?;
        }
        println!("receiving data transfers");
        receive_all(&mut nodes, true, args, bound)?;
        println!("data transfers complete");
    }
    let migrated = if args.migrate {
        Some(migrate(&nodes)?)
    } else {
        None
    };
    println!("{PROGRAM}: disconnecting");
    for node in &nodes {
        node.id
            .disconnect()
            .map_err(|e| format!("rdma_disconnect: {e}"))?;
    }
    match &migrated {
        Some(channel) => disconnect_events(channel, &nodes, false, bound)?,
        None => {
            for node in &nodes {
                disconnect_events(&node.id.channel(), std::slice::from_ref(node), false, bound)?;
            }
        }
    }
    println!("disconnected");
    Ok(())
}
