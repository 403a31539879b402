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
use rdma_cm::rdma_verbs::ah::GRH_LEN;
use rdma_cm::{CmId, ConnParam, Event, EventChannel, EventKind, PortSpace};
use rdma_examples::cmtool::{self, lookup, parse_u8, parse_u32};
use rdma_examples::udnode::UdNode;

const PROGRAM: &str = "udaddy";

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
    cmtool::check_udp_port_space(args.port_space)?;
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

/// Whether to move on after `event`: the kinds that end a connection attempt are errors.
fn failed(event: &Event) -> Option<String> {
    match event.kind() {
        EventKind::AddrError
        | EventKind::RouteError
        | EventKind::ConnectError
        | EventKind::Unreachable
        | EventKind::Rejected => Some(format!(
            "event: {}, error: {}",
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
    let (channel, ids) = cmtool::ids_on_one_channel(args.connections, PortSpace::Udp)?;
    println!("{PROGRAM}: connecting");
    let resolve = cmtool::RESOLVE;
    for id in &ids {
        id.resolve_addr(src, dst, resolve)
            .map_err(|e| format!("failure getting addr: {e}"))?;
    }
    let mut nodes: Vec<Option<UdNode>> = (0..args.connections).map(|_| None).collect();
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
                let node = UdNode::new(id.clone(), args.count, args.size)?;
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
                    .qp
                    .pd()
                    .create_ah(&peer.av)
                    .map_err(|e| format!("failure creating address handle: {e}"))?;
                node.peer = Some((ah, peer.qp_num, peer.qkey));
                connected += 1;
            }
            _ => {}
        }
    }
    let mut nodes: Vec<UdNode> = nodes.into_iter().flatten().collect();
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
            for (m, reply) in replies.iter().enumerate() {
                if reply.bytes[GRH_LEN..] != payload(c, m, args.size)[..] {
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
        let node = match UdNode::new(id.clone(), args.count, args.size) {
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
        let grh: [u8; GRH_LEN] = first
            .bytes
            .get(..GRH_LEN)
            .and_then(|grh| grh.try_into().ok())
            .ok_or("a receive without its GRH")?;
        let client_qpn = first.wc.src_qp();
        let ah = node
            .qp
            .pd()
            .create_ah_from_wc(node.id.port_num(), &first.wc, &grh)
            .map_err(|e| format!("failure creating address handle: {e}"))?;
        let qkey = node.id.qkey().map_err(|e| e.to_string())?;
        node.peer = Some((ah, client_qpn, qkey));
        // The payload of each datagram back to its sender (the C server sends its buffer).
        let payloads: Vec<Vec<u8>> = datagrams
            .iter()
            .map(|datagram| datagram.bytes[GRH_LEN..].to_vec())
            .collect();
        node.send_all(&payloads, timeout)?;
    }
    println!("data transfers complete");
    Ok(())
}
