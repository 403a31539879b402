//! `udaddy`: rdma-core's UD-over-the-connection-manager test, in safe code, interoperable with
//! the C `udaddy` in both directions.
//!
//! The client opens `-c` UD "connections" (service ID resolutions, SIDR) to the server, each
//! with its own queue pair; every `Established` event gives the server's queue pair, Q_Key
//! and path. The client then sends `-C` datagrams of `-S` bytes on each, every one carrying
//! its own queue pair number as immediate data, and waits for as many replies. The server
//! accepts `-c` requests, receives every datagram, answers the sender through an address
//! handle made from the first completion and the queue pair number in the immediate data,
//! and reports. Every completion is checked (status, opcode, immediate data equal to the
//! source queue pair, the GRH and `-S` bytes); between two Rust programs the server echoes
//! each datagram's payload and `-V` makes the client compare every byte.
//!
//! ```text
//! udaddy [-b bind_address] [-c connections] [-C message_count] [-S message_size] [-t tos]
//! udaddy -s server_address [-b bind_address] [-c ...] [-C ...] [-S ...] [-t tos] [-V]
//! ```

#![forbid(unsafe_code)] // the examples show the safe API: no `unsafe` anywhere

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use clap::Parser;
use rdma_cm::rdma_verbs::{
    AddressHandle, BufferPool, Completion, CompletionQueue, OwnedSend, QueuePair, Rts, Ud,
    WcOpcode, WcStatus,
};
use rdma_cm::{CmId, ConnParam, Event, EventChannel, EventKind, PortSpace};
use rdma_examples::cmtool::{self, lookup, parse_u8, parse_u32};

const PROGRAM: &str = "udaddy";
/// Bytes of the global routing header in front of every UD receive.
const GRH: usize = 40;
/// `RDMA_PS_UDP`, the one port space this program takes (`-p`).
const PS_UDP: u32 = 0x0111;
/// The C program's address and route resolution timeout, in milliseconds.
const RESOLVE_MS: u64 = 2000;

/// UD datagrams over the connection manager.
#[derive(Parser, Debug)]
#[command(name = PROGRAM, args_override_self = true)]
struct Args {
    /// The server's address: run as the client (the server otherwise).
    #[arg(short = 's')]
    server: Option<String>,
    /// The local address to bind to.
    #[arg(short = 'b')]
    bind: Option<String>,
    /// Connections.
    #[arg(short = 'c', default_value_t = 1)]
    connections: usize,
    /// Datagrams each way on each connection.
    #[arg(short = 'C', default_value_t = 10)]
    count: usize,
    /// Bytes per datagram (at most the port's active MTU).
    #[arg(short = 'S', default_value_t = 100)]
    size: usize,
    /// Type of service (the IP traffic class on RoCE).
    #[arg(short = 't', value_parser = parse_u8)]
    tos: Option<u8>,
    /// Port space number (only 0x111, UDP).
    #[arg(short = 'p', value_parser = parse_u32)]
    port_space: Option<u32>,
    /// Port space name (only `udp`).
    #[arg(short = 'P')]
    port_space_name: Option<String>,
    /// Address format: `ip` or `name` (`gid` is InfiniBand only).
    #[arg(short = 'f')]
    format: Option<String>,
    /// Port (an extension: the C program always uses 7174).
    #[arg(long = "port", default_value_t = 7174)]
    port: u16,
    /// Compare every byte of every reply with what was sent (client; needs a Rust server,
    /// which echoes the payload).
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
    if args.port_space.is_some_and(|ps| ps != PS_UDP) {
        return Err(format!(
            "port space {:#x}: only {PS_UDP:#x} (UDP) is supported",
            args.port_space.unwrap_or_default()
        ));
    }
    if let Some(name) = &args.port_space_name {
        if !name.to_ascii_lowercase().starts_with("udp") {
            return Err(format!("port space {name:?}: only udp is supported"));
        }
    }
    cmtool::check_format_and_count(args.format.as_deref(), args.connections)
}

/// The payload of datagram `message` of connection `connection`.
fn payload(connection: usize, message: usize, size: usize) -> Vec<u8> {
    (0..size)
        .map(|j| (j as u8).wrapping_mul(7) ^ (message as u8).wrapping_add(connection as u8 * 31))
        .collect()
}

/// One connection: its identifier, UD queue pair (RTS), queues and buffers, and where the
/// peer's datagrams go once known.
struct Node {
    id: CmId,
    qp: QueuePair<Ud, Rts>,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    pool: BufferPool,
    peer: Option<(AddressHandle, u32, u32)>,
}

impl Node {
    /// The queue pair and buffers on `id`'s device, receives posted: `count` datagrams of
    /// `size` bytes fit (after checking `size` against the port's active MTU).
    fn new(id: CmId, count: usize, size: usize) -> Result<Self, String> {
        let context = id.context().map_err(|e| e.to_string())?;
        let port = context
            .query_port(id.port_num())
            .map_err(|e| e.to_string())?;
        let mtu = port.active_mtu.bytes().unwrap_or(256) as usize;
        if count > 0 && size > mtu {
            return Err(format!(
                "message_size {size} is larger than active mtu {mtu}"
            ));
        }
        let pd = context
            .alloc_pd()
            .map_err(|e| format!("unable to allocate PD: {e}"))?;
        let depth = count.max(1);
        let queue = u32::try_from(depth * 2).map_err(|e| e.to_string())?;
        let send_cq = context
            .create_cq(queue)
            .map_err(|e| format!("unable to create CQ: {e}"))?;
        let recv_cq = context
            .create_cq(queue)
            .map_err(|e| format!("unable to create CQ: {e}"))?;
        let depth_u32 = u32::try_from(depth).map_err(|e| e.to_string())?;
        let qp = pd
            .qp_builder::<Ud>(&send_cq, &recv_cq)
            .max_send_wr(depth_u32)
            .max_recv_wr(depth_u32)
            .build()
            .map_err(|e| format!("unable to create QP: {e}"))?;
        let qp = id.ready_ud_qp(qp).map_err(|e| e.to_string())?;
        let pool = BufferPool::new(&pd, depth * 2, size + GRH)
            .map_err(|e| format!("failed message allocation: {e}"))?;
        let mut node = Self {
            id,
            qp,
            send_cq,
            recv_cq,
            pool,
            peer: None,
        };
        for i in 0..count {
            let buf = node.pool.take().ok_or("out of buffers")?;
            node.qp
                .post_recv_buf(buf, i as u64)
                .map_err(|e| format!("failed to post receives: {}", e.error()))?;
        }
        Ok(node)
    }

    /// Sends `payloads` to the peer, each with this queue pair's number as immediate data,
    /// and reaps the sends.
    fn send_all(&mut self, payloads: &[Vec<u8>], timeout: Duration) -> Result<(), String> {
        let (ah, qpn, qkey) = self.peer.as_ref().ok_or("no peer")?;
        let own = self.qp.qp_num();
        for data in payloads {
            let mut buf = self.pool.take().ok_or("out of buffers")?;
            buf.fill_from(data).map_err(|e| e.to_string())?;
            self.qp
                .post_send_owned(OwnedSend::send(buf).with_imm(own).to(ah, *qpn, *qkey))
                .map_err(|e| format!("failed to post sends: {}", e.error()))?;
        }
        for _ in payloads {
            let done = next(&mut self.send_cq, timeout, "send")?;
            expect(&done, WcOpcode::Send, "send")?;
        }
        Ok(())
    }

    /// Reaps `count` receives of `size` bytes each, checked: a `Recv` whose immediate data is
    /// its source queue pair (`from`, when known). Returns the completions.
    fn receive_all(
        &mut self,
        count: usize,
        size: usize,
        from: Option<u32>,
        timeout: Duration,
    ) -> Result<Vec<Completion>, String> {
        let mut got = Vec::with_capacity(count);
        for i in 0..count {
            let done = next(&mut self.recv_cq, timeout, "receive")?;
            expect(&done, WcOpcode::Recv, "receive")?;
            let wc = done.wc();
            let src = from.unwrap_or(wc.src_qp());
            if wc.imm_data() != Some(src) || wc.src_qp() != src {
                return Err(format!(
                    "datagram {i}: immediate data {:?}, source queue pair {:#x}, expected {src:#x}",
                    wc.imm_data(),
                    wc.src_qp()
                ));
            }
            if wc.byte_len() as usize != size + GRH {
                return Err(format!(
                    "datagram {i}: {} bytes, expected {} (GRH and {size})",
                    wc.byte_len(),
                    size + GRH
                ));
            }
            got.push(done);
        }
        Ok(got)
    }
}

/// The next completion of `cq` within `timeout`.
fn next(cq: &mut CompletionQueue, timeout: Duration, what: &str) -> Result<Completion, String> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut got = None;
        cq.poll_each(1, |c| got = Some(c))
            .map_err(|e| format!("failed polling CQ: {e}"))?;
        if let Some(done) = got {
            return Ok(done);
        }
        if Instant::now() >= deadline {
            return Err(format!("no {what} completion in {timeout:?}"));
        }
        std::thread::yield_now();
    }
}

fn expect(done: &Completion, opcode: WcOpcode, what: &str) -> Result<(), String> {
    let wc = done.wc();
    if wc.status() != WcStatus::Success || wc.opcode() != opcode {
        return Err(format!(
            "{what} completion: {:?} {:?} (vendor error {:#x})",
            wc.status(),
            wc.opcode(),
            wc.vendor_err()
        ));
    }
    Ok(())
}

/// Whether to move on after `event`: the kinds that end a connection attempt are errors.
fn failed(event: &Event) -> Option<String> {
    match event.kind() {
        EventKind::AddrError
        | EventKind::RouteError
        | EventKind::ConnectError
        | EventKind::Unreachable
        | EventKind::Rejected => Some(format!(
            "event: {:?}, error: {}",
            event.kind(),
            event.status()
        )),
        _ => None,
    }
}

fn client(args: &Args) -> Result<(), String> {
    let timeout = Duration::from_secs(args.timeout);
    println!("{PROGRAM}: starting client");
    let dst = lookup(args.server.as_deref().unwrap_or_default(), args.port)?;
    let src = args
        .bind
        .as_deref()
        .map(|host| lookup(host, 0))
        .transpose()?;
    let channel =
        EventChannel::new().map_err(|e| format!("failed to create event channel: {e}"))?;
    let mut ids = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        ids.push(CmId::new(&channel, PortSpace::Udp).map_err(|e| e.to_string())?);
    }
    println!("{PROGRAM}: connecting");
    let resolve = Duration::from_millis(RESOLVE_MS);
    for id in &ids {
        id.resolve_addr(src, dst, resolve)
            .map_err(|e| format!("failure getting addr: {e}"))?;
    }
    let mut nodes: Vec<Option<Node>> = (0..args.connections).map(|_| None).collect();
    let mut connected = 0;
    let deadline = Instant::now() + timeout;
    while connected < args.connections {
        let left = deadline.saturating_duration_since(Instant::now());
        let event = channel
            .get_event(Some(left))
            .map_err(|e| e.to_string())?
            .ok_or_else(|| {
                format!(
                    "{} of {} connected after {timeout:?}",
                    connected, args.connections
                )
            })?;
        if let Some(error) = failed(&event) {
            return Err(error);
        }
        let Some(index) = ids.iter().position(|id| event.is_for(id)) else {
            continue;
        };
        let id = &ids[index];
        match event.kind() {
            EventKind::AddrResolved => {
                drop(event);
                if let Some(tos) = args.tos {
                    id.set_tos(tos)
                        .map_err(|e| format!("set TOS option failed: {e}"))?;
                }
                id.resolve_route(resolve)
                    .map_err(|e| format!("resolve route failed: {e}"))?;
            }
            EventKind::RouteResolved => {
                drop(event);
                let node = Node::new(id.clone(), args.count, args.size)?;
                node.id
                    .connect(&ConnParam::new().qp_num(node.qp.qp_num()))
                    .map_err(|e| format!("failure connecting: {e}"))?;
                nodes[index] = Some(node);
            }
            EventKind::Established => {
                let peer = event
                    .ud_param()
                    .ok_or("an Established event without UD parameters")?;
                drop(event);
                let node = nodes[index]
                    .as_mut()
                    .ok_or("Established before the route")?;
                let ah = node
                    .pool
                    .pd()
                    .create_ah(&peer.av)
                    .map_err(|e| format!("failure creating address handle: {e}"))?;
                node.peer = Some((ah, peer.qp_num, peer.qkey));
                connected += 1;
            }
            _ => {}
        }
    }
    let mut nodes: Vec<Node> = nodes.into_iter().flatten().collect();
    if args.count == 0 || args.size == 0 {
        return Ok(());
    }
    println!("initiating data transfers");
    for (c, node) in nodes.iter_mut().enumerate() {
        let payloads: Vec<Vec<u8>> = (0..args.count).map(|m| payload(c, m, args.size)).collect();
        node.send_all(&payloads, timeout)?;
    }
    println!("receiving data transfers");
    for (c, node) in nodes.iter_mut().enumerate() {
        let server_qpn = node.peer.as_ref().map(|(_, qpn, _)| *qpn);
        let replies = node.receive_all(args.count, args.size, server_qpn, timeout)?;
        if args.validate {
            for (m, mut reply) in replies.into_iter().enumerate() {
                let buf = reply.take_buf().ok_or("a receive without its buffer")?;
                if buf[GRH..] != payload(c, m, args.size)[..] {
                    return Err(format!(
                        "connection {c}: reply {m} differs from what was sent"
                    ));
                }
            }
        }
    }
    println!("data transfers complete");
    Ok(())
}

fn server(args: &Args) -> Result<(), String> {
    let timeout = Duration::from_secs(args.timeout);
    println!("{PROGRAM}: starting server");
    let channel =
        EventChannel::new().map_err(|e| format!("failed to create event channel: {e}"))?;
    let listener =
        CmId::new(&channel, PortSpace::Udp).map_err(|e| format!("listen request failed: {e}"))?;
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
        let mut event = listener
            .wait_event(EventKind::ConnectRequest, timeout)
            .map_err(|e| format!("{} of {} connected: {e}", nodes.len(), args.connections))?;
        let id = event
            .take_id()
            .ok_or("a connect request without its identifier")?;
        drop(event);
        let node = match Node::new(id.clone(), args.count, args.size) {
            Ok(node) => node,
            Err(error) => {
                let _ = id.reject(&[]);
                return Err(format!("failing connection request: {error}"));
            }
        };
        node.id
            .accept_ud(&node.qp, &ConnParam::new())
            .map_err(|e| format!("failure accepting: {e}"))?;
        nodes.push(node);
    }
    if args.count == 0 || args.size == 0 {
        return Ok(());
    }
    println!("receiving data transfers");
    let mut received = Vec::with_capacity(nodes.len());
    for node in &mut nodes {
        received.push(node.receive_all(args.count, args.size, None, timeout)?);
    }
    println!("sending replies");
    for (node, datagrams) in nodes.iter_mut().zip(received) {
        let first = datagrams.first().ok_or("no datagram")?;
        let grh: [u8; GRH] = first
            .buf()
            .and_then(|buf| buf.get(..GRH))
            .and_then(|grh| grh.try_into().ok())
            .ok_or("a receive without its GRH")?;
        let client_qpn = first.wc().src_qp();
        let ah = node
            .pool
            .pd()
            .create_ah_from_wc(node.id.port_num(), first.wc(), &grh)
            .map_err(|e| format!("failure creating address handle: {e}"))?;
        let qkey = node.id.qkey().map_err(|e| e.to_string())?;
        node.peer = Some((ah, client_qpn, qkey));
        // The payload of each datagram back to its sender (the C server sends its buffer).
        let payloads: Vec<Vec<u8>> = datagrams
            .iter()
            .map(|done| {
                done.buf()
                    .map(|buf| buf[GRH..].to_vec())
                    .unwrap_or_default()
            })
            .collect();
        drop(datagrams);
        node.send_all(&payloads, timeout)?;
    }
    println!("data transfers complete");
    Ok(())
}
