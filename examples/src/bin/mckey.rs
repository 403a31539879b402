//! `mckey`: rdma-core's multicast test over the connection manager, in safe code,
//! interoperable with the C `mckey` in both directions.
//!
//! Each of `-c` identifiers resolves the group's address (from `-b` when given), makes a UD
//! queue pair with its receives posted, and joins the group (`-o`: as a send-only member). The
//! `MulticastJoin` event gives the group's GID, LID, queue pair number (0xFFFFFF) and Q_Key.
//! After a pause for the fabric (3 s, as the C program), the sender (`-s`) sends `-C`
//! datagrams of `-S` bytes to the group on each identifier, each carrying its queue pair
//! number as immediate data; a receiver's queue pairs, attached to the group, take `-C`
//! datagrams each, every completion checked (status, opcode, immediate data equal to the
//! source queue pair, the GRH and `-S` bytes) and, with `-V` and a Rust sender, every byte.
//! Then each identifier leaves the group.
//!
//! ```text
//! mckey -m multicast_address [-s] [-b bind_address] [-c connections] [-C message_count]
//!       [-S message_size] [-p port_space] [-o] [-V]
//! ```

#![forbid(unsafe_code)] // the examples show the safe API: no `unsafe` anywhere

use std::collections::HashMap;
use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

use clap::Parser;
use rdma_cm::rdma_verbs::ah::GRH_LEN;
use rdma_cm::{EventKind, JoinKind, PortSpace};
use rdma_examples::cmtool::{self, lookup, parse_u32};
use rdma_examples::udnode::{Datagram, UdNode};

const PROGRAM: &str = "mckey";

/// Multicast datagrams over the connection manager.
#[derive(Parser, Debug)]
#[command(name = PROGRAM, args_override_self = true)]
struct Args {
    /// The multicast group's address (or name).
    #[arg(short = 'm')]
    group: Option<String>,
    /// An unmapped (AF_IB) multicast address: InfiniBand only, refused.
    #[arg(short = 'M')]
    unmapped: Option<String>,
    /// Send to the group (receive from it otherwise).
    #[arg(short = 's')]
    sender: bool,
    /// The local address to bind to.
    #[arg(short = 'b')]
    bind: Option<String>,
    /// Identifiers (each with its own queue pair) joining the group.
    #[arg(short = 'c', default_value_t = 1)]
    connections: usize,
    /// Datagrams each identifier sends or receives.
    #[arg(short = 'C', default_value_t = 10)]
    count: usize,
    /// Bytes per datagram (at most the port's active MTU).
    #[arg(short = 'S', default_value_t = 100)]
    size: usize,
    /// Port space number (only 0x111, UDP).
    #[arg(short = 'p', value_parser = parse_u32)]
    port_space: Option<u32>,
    /// Join as a send-only full member.
    #[arg(short = 'o')]
    send_only: bool,
    /// Join without multicast loopback: needs a queue pair created with
    /// IBV_QP_CREATE_BLOCK_SELF_MCAST_LB, refused.
    #[arg(short = 'l')]
    no_loopback: bool,
    /// Compare every byte of every datagram with what a Rust sender sends (receiver).
    #[arg(short = 'V')]
    validate: bool,
    /// Seconds to wait after joining before the transfers (the C program waits 3).
    #[arg(long = "pause", default_value_t = 3)]
    pause: u64,
    /// Bound of every wait, in seconds.
    #[arg(long = "timeout", default_value_t = 30)]
    timeout: u64,
}

fn main() {
    let args = Args::parse();
    let result = check_args(&args).and_then(|()| run(&args));
    cmtool::finish(PROGRAM, result);
}

fn check_args(args: &Args) -> Result<(), String> {
    if args.unmapped.is_some() {
        return Err(
            "-M: unmapped (AF_IB) multicast addresses need InfiniBand addressing; use -m"
                .to_string(),
        );
    }
    if args.group.is_none() {
        return Err("-m: a multicast address is required".to_string());
    }
    if args.no_loopback {
        return Err(
            "-l: blocking multicast loopback (IBV_QP_CREATE_BLOCK_SELF_MCAST_LB) is not supported"
                .to_string(),
        );
    }
    cmtool::check_udp_port_space(args.port_space)?;
    cmtool::check_format_and_count(None, args.connections)
}

/// The payload of datagram `message`.
fn payload(message: usize, size: usize) -> Vec<u8> {
    (0..size)
        .map(|i| (i as u8).wrapping_mul(29) ^ (message as u8).wrapping_mul(7))
        .collect()
}

fn run(args: &Args) -> Result<(), String> {
    let timeout = Duration::from_secs(args.timeout);
    let role = if args.sender { "client" } else { "server" };
    println!("{PROGRAM}: starting {role}");
    let group = lookup(args.group.as_deref().unwrap_or_default(), 0)?;
    if !group.ip().is_multicast() {
        return Err(format!("{}: not a multicast address", group.ip()));
    }
    let src = args
        .bind
        .as_deref()
        .map(|host| lookup(host, 0))
        .transpose()?;
    let (channel, ids) = cmtool::ids_on_one_channel(args.connections, PortSpace::Udp)?;
    println!("{PROGRAM}: joining");
    for id in &ids {
        if let Some(src) = src {
            id.bind_addr(src)
                .map_err(|e| format!("addr bind failure: {e}"))?;
        }
        id.resolve_addr(src, group, cmtool::RESOLVE)
            .map_err(|e| format!("resolve addr failure: {e}"))?;
    }
    let kind = if args.send_only {
        JoinKind::SendOnly
    } else {
        JoinKind::FullMember
    };
    let mut nodes: Vec<Option<UdNode>> = (0..args.connections).map(|_| None).collect();
    let mut joined = 0;
    let deadline = Instant::now() + timeout;
    while joined < args.connections {
        let left = deadline.saturating_duration_since(Instant::now());
        let event = channel
            .get_event(Some(left))
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{joined} of {} joined after {timeout:?}", args.connections))?;
        let Some(index) = ids.iter().position(|id| event.is_for(id)) else {
            continue;
        };
        match event.kind() {
            EventKind::AddrResolved => {
                drop(event);
                let node = UdNode::new(ids[index].clone(), args.count, args.size)?;
                node.id
                    .join_multicast(group.ip(), kind)
                    .map_err(|e| format!("failure joining: {e}"))?;
                nodes[index] = Some(node);
            }
            EventKind::MulticastJoin => {
                let param = event
                    .ud_param()
                    .ok_or("a MulticastJoin event without UD parameters")?;
                drop(event);
                let node = nodes[index]
                    .as_mut()
                    .ok_or("MulticastJoin before the address")?;
                if !args.sender {
                    param
                        .attach(&mut node.qp)
                        .map_err(|e| format!("failure attaching: {e}"))?;
                }
                let dgid = param.av.grh.map(|grh| grh.dgid.0).unwrap_or_default();
                println!(
                    "{PROGRAM}: joined dgid: {} mlid {:#x} sl {}",
                    Ipv6Addr::from(dgid),
                    param.av.dlid,
                    param.av.sl
                );
                let ah = node
                    .qp
                    .pd()
                    .create_ah(&param.av)
                    .map_err(|e| format!("failure creating address handle: {e}"))?;
                node.peer = Some((ah, param.qp_num, param.qkey));
                joined += 1;
            }
            EventKind::AddrError | EventKind::RouteError | EventKind::MulticastError => {
                return Err(format!(
                    "event: {}, error: {}",
                    event.kind(),
                    event.status()
                ));
            }
            _ => {}
        }
    }
    let mut nodes: Vec<UdNode> = nodes.into_iter().flatten().collect();
    // As the C program: a pause for the fabric (the subnet manager, on InfiniBand) to set up
    // the group before datagrams are sent.
    std::thread::sleep(Duration::from_secs(args.pause));
    if args.count > 0 && args.size > 0 {
        if args.sender {
            println!("initiating data transfers");
            let payloads: Vec<Vec<u8>> = (0..args.count).map(|m| payload(m, args.size)).collect();
            for node in &mut nodes {
                node.send_all(&payloads, timeout)?;
            }
        } else {
            println!("receiving data transfers");
            for (c, node) in nodes.iter_mut().enumerate() {
                let datagrams = node.receive_all(args.count, args.size, None, timeout)?;
                if args.validate {
                    validate(c, datagrams, args.size)?;
                }
            }
        }
        println!("data transfers complete");
    }
    for node in &nodes {
        node.id
            .leave_multicast(group.ip())
            .map_err(|e| format!("failure leaving: {e}"))?;
    }
    Ok(())
}

/// Compares each datagram with what its sender sent: the `n`th from a queue pair is
/// `payload(n)`.
fn validate(connection: usize, datagrams: Vec<Datagram>, size: usize) -> Result<(), String> {
    let mut next: HashMap<u32, usize> = HashMap::new();
    for datagram in datagrams {
        let src = datagram.wc.src_qp();
        let n = next.entry(src).or_default();
        if datagram.bytes[GRH_LEN..] != payload(*n, size)[..] {
            return Err(format!(
                "connection {connection}: datagram {n} from queue pair {src:#x} differs from what was sent"
            ));
        }
        *n += 1;
    }
    Ok(())
}
