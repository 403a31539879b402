//! `rdma_rw`: RDMA WRITE and RDMA READ between two processes, in safe code only (the
//! owned-buffer path of `rdma-verbs`).
//!
//! The server registers `-s` bytes that the client may write and read, fills their second half
//! with its pattern, and sends the region's address, length and key over the TCP connection of
//! the address exchange. The client writes its own pattern into the first half with one RDMA
//! WRITE, reads the second half with one RDMA READ, and checks every byte it read. After the
//! end handshake, which the client starts only once both of its requests have completed, the
//! server checks every byte the client wrote. Neither CPU takes part in the other's transfers.
//!
//! ```text
//! rdma_rw [-d dev] [-i port] [-g gid-index] [-p tcp-port] [-s size]           # server
//! rdma_rw [-d dev] [-i port] [-g gid-index] [-p tcp-port] [-s size] <server>  # client
//! ```

use std::time::{Duration, Instant};

use clap::Parser;
use rdma_examples::exchange::{self, Dest, PeerEnd};
use rdma_examples::pingpong::{self, Connected, Options};
use rdma_verbs::{
    AccessFlags, BufferPool, CompletionQueue, ConnectedInitAttr, MemoryRegion, OwnedSend, Rc,
    WcOpcode,
};

const PROGRAM: &str = "rdma_rw";

/// RDMA WRITE and READ between two processes.
#[derive(Parser, Debug)]
#[command(name = PROGRAM, args_override_self = true)]
struct Args {
    /// Listen on / connect to TCP port.
    #[arg(short = 'p', long = "port", default_value_t = 18516)]
    port: u16,
    /// Use IB device (default: the first device found).
    #[arg(short = 'd', long = "ib-dev")]
    ib_dev: Option<String>,
    /// Use port of IB device.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// Size of the server's region; the client writes the first half and reads the second.
    #[arg(short = 's', long = "size", default_value_t = 8192)]
    size: usize,
    /// Local port GID index (needed on RoCE).
    #[arg(short = 'g', long = "gid-idx")]
    gid_idx: Option<u32>,
    /// Path MTU (256, 512, 1024, 2048 or 4096).
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    mtu: u32,
    /// Pattern seed: both sides must use the same (the other's check fails otherwise).
    #[arg(long = "seed", default_value_t = 0)]
    seed: u8,
    /// Give up when a completion or the peer takes longer than this many seconds.
    #[arg(long = "timeout", default_value_t = 30)]
    timeout: u64,
    /// Server to connect to (without it, act as the server).
    servername: Option<String>,
}

/// The byte the client writes at offset `i` of the first half.
fn client_byte(seed: u8, i: usize) -> u8 {
    (i.wrapping_mul(7) as u8).wrapping_add(1).wrapping_add(seed)
}

/// The byte the server puts at offset `i` of the second half.
fn server_byte(seed: u8, i: usize) -> u8 {
    (i.wrapping_mul(13) as u8)
        .wrapping_add(5)
        .wrapping_add(seed)
}

/// Checks `got` against `expected(i)`; names the first wrong byte.
fn check(what: &str, got: &[u8], expected: impl Fn(usize) -> u8) -> Result<(), String> {
    let wrong = got
        .iter()
        .enumerate()
        .filter(|&(i, &b)| b != expected(i))
        .count();
    match got.iter().enumerate().find(|&(i, &b)| b != expected(i)) {
        None => Ok(()),
        Some((i, &b)) => Err(format!(
            "{what}: byte {i} is {b:#04x}, expected {:#04x} ({wrong} of {} bytes wrong)",
            expected(i),
            got.len()
        )),
    }
}

fn main() {
    let args = Args::parse();
    if let Err(message) = run(&args) {
        pingpong::fail(PROGRAM, message);
    }
}

fn run(args: &Args) -> Result<(), String> {
    if args.size < 2 || u32::try_from(args.size).is_err() {
        return Err(format!("size {} out of range (2 to 2^32 - 1)", args.size));
    }
    // The pingpongs' set-up (device, port, GID, PD, CQ) takes their options.
    let options = Options {
        port: args.port,
        ib_dev: args.ib_dev.clone(),
        ib_port: args.ib_port,
        size: Some(args.size),
        mtu: args.mtu,
        rx_depth: 1,
        iters: 1,
        sl: 0,
        events: false,
        gid_idx: args.gid_idx,
        chk: false,
        timeout: args.timeout,
        servername: args.servername.clone(),
    };
    let mtu = pingpong::mtu(&options)?;
    let mut setup = pingpong::setup(&options, 4)?;
    let qp = setup
        .pd
        .create_qp::<Rc>(&setup.cq, &setup.cq)
        .max_send_wr(2)
        .max_recv_wr(1)
        .build()
        .map_err(|e| format!("couldn't create QP: {e}"))?;
    // The server's queue pair lets its peer write and read its region; the client's, nothing.
    let access = if args.servername.is_some() {
        AccessFlags::empty()
    } else {
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ
    };
    let qp = qp
        .into_init(&ConnectedInitAttr::new(args.ib_port).access(access))
        .map_err(|e| format!("failed to modify QP to INIT: {e}"))?;
    let mine = Dest {
        lid: setup.port.lid,
        qpn: qp.qp_num(),
        psn: exchange::random_psn(),
        gid: setup.gid,
    };
    pingpong::print_address("local", &mine, false);
    let connect = |qp, remote: &Dest| {
        let av = pingpong::address_vector(&options, remote, 1)?;
        rdma_verbs::QueuePair::<Rc, _>::into_rtr(qp, &Rc::rtr(av, remote, mtu))
            .map_err(|e| format!("failed to modify QP to RTR: {e}"))?
            .into_rts(&Rc::rts(mine.psn))
            .map_err(|e| format!("failed to modify QP to RTS: {e}"))
    };
    let timeout = Duration::from_secs(args.timeout);
    let half = args.size / 2;

    match &args.servername {
        Some(host) => {
            let (remote, mut link) = exchange::client_exchange(host, args.port, &[mine])?;
            pingpong::print_address("remote", &remote[0], false);
            let mut qp = connect(qp, &remote[0])?;
            let region = link.recv_remote()?;
            println!(
                "  server region: {:#x}, {} bytes, rkey {:#x}",
                region.addr, region.len, region.rkey
            );
            if region.len as usize != args.size {
                return Err(format!(
                    "the server's region has {} bytes; this client was started with -s {}",
                    region.len, args.size
                ));
            }
            // Both buffers come from one pool registered for this purpose.
            let pool = BufferPool::new(&setup.pd, 2, args.size - half)
                .map_err(|e| format!("couldn't register the buffers: {e}"))?;
            let mut out = pool.take().ok_or("no buffer")?;
            out.set_len(half).map_err(|e| e.to_string())?;
            out.iter_mut()
                .enumerate()
                .for_each(|(i, b)| *b = client_byte(args.seed, i));
            let first = region.slice(0, half as u32).map_err(|e| e.to_string())?;
            let second = region
                .slice(half as u32, (args.size - half) as u32)
                .map_err(|e| e.to_string())?;
            let started = Instant::now();
            // The send queue completes in order: the READ completes after the WRITE.
            qp.post_send_owned(OwnedSend::write(out, first).tag(1).unsignaled())
                .map_err(|e| format!("couldn't post the RDMA WRITE: {e}"))?;
            let back = pool.take().ok_or("no buffer")?;
            qp.post_send_owned(OwnedSend::read(back, second).tag(2))
                .map_err(|e| format!("couldn't post the RDMA READ: {e}"))?;
            let read = wait_one(&mut setup.cq, timeout, WcOpcode::RdmaRead)?;
            let elapsed = started.elapsed();
            // Both requests are done: the server may now look at what was written (before
            // this side checks what it read, so that each side reports its own check).
            if link.finish(timeout)? == PeerEnd::Closed {
                return Err("the server closed the connection before the end".into());
            }
            check("the RDMA READ", &read, |i| server_byte(args.seed, i))?;
            println!(
                "{} bytes written and {} bytes read in {:.1} us",
                half,
                read.len(),
                elapsed.as_secs_f64() * 1e6
            );
            Ok(())
        }
        None => {
            let mut region = setup
                .pd
                .register(args.size, AccessFlags::LOCAL_WRITE | access)
                .map_err(|e| format!("couldn't register the region: {e}"))?;
            let pattern: Vec<u8> = (0..args.size - half)
                .map(|i| server_byte(args.seed, i))
                .collect();
            // A remotely writable region is only ever copied to and from, never borrowed.
            region.write_at(half, &pattern).map_err(|e| e.to_string())?;
            let exchange = exchange::server_accept(args.port, 1)?;
            let remote = exchange.remote[0];
            pingpong::print_address("remote", &remote, false);
            let _qp = connect(qp, &remote)?;
            let mut link = exchange.reply(&[mine])?;
            link.send_remote(&region.remote(..).map_err(|e| e.to_string())?)?;
            match link.finish(timeout)? {
                PeerEnd::Finished => {}
                PeerEnd::Closed => {
                    return Err("the client closed the connection before the end".into());
                }
            }
            check_written(&region, half, args.seed)?;
            println!("{half} bytes written by the client, all as expected");
            Ok(())
        }
    }
}

/// Reaps completions until the one of `opcode`; returns its buffer. Fails on an error
/// completion or after `timeout`.
fn wait_one(
    cq: &mut CompletionQueue,
    timeout: Duration,
    opcode: WcOpcode,
) -> Result<rdma_verbs::Buf, String> {
    let deadline = Instant::now() + timeout;
    let mut found = None;
    let mut failed = None;
    while found.is_none() {
        cq.poll_each(4, |mut completion| {
            if !completion.is_success() {
                failed = Some(format!(
                    "request {:?} failed: {}",
                    completion.tag(),
                    completion.status()
                ));
            } else if completion.wc().opcode() == opcode {
                found = completion.take_buf();
            }
        })
        .map_err(|e| format!("poll CQ failed: {e}"))?;
        if let Some(message) = failed {
            return Err(message);
        }
        if Instant::now() >= deadline {
            return Err(format!("no completion within {} s", timeout.as_secs()));
        }
    }
    found.ok_or_else(|| "no buffer".to_string())
}

/// Checks the first `half` bytes of `region` against the client's pattern.
fn check_written(region: &MemoryRegion, half: usize, seed: u8) -> Result<(), String> {
    let mut written = vec![0u8; half];
    region.read_at(0, &mut written).map_err(|e| e.to_string())?;
    check("the RDMA WRITE", &written, |i| client_byte(seed, i))
}
