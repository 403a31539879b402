//! `ud_loopback`: unreliable datagrams between two queue pairs of one process, through the
//! device, in safe code only (slot rings, the default data path of `rdma-verbs`), and what the
//! Q_Key does.
//!
//! The receiver's queue pair has Q_Key `--qkey`. The sender sends `-n` datagrams carrying that
//! key, each received with the 40-byte GRH in front and checked byte for byte, then one
//! datagram with another key, which the receiver's queue pair drops: the send completes, and
//! no receive does. Both queue pairs are on the first port of the device; the address handle
//! is the path to that port.
//!
//! ```text
//! ud_loopback [-d dev] [-i port] [-g gid-index] [-s size] [-n count] [--qkey key]
//! ```

#![forbid(unsafe_code)] // the examples show the safe API: no `unsafe` anywhere

use std::time::{Duration, Instant};

use clap::Parser;
use rdma_examples::connect;
use rdma_examples::pingpong::{self, Options};
use rdma_verbs::{
    QueuePair,
    ah::{AddressVector, GRH_LEN},
    cq::WorkCompletion,
    qp::{SqPsnRtsAttr, Ud, UdInitAttr, UdRtrAttr},
    wr::{RecvRequest, SendRequest},
};

const PROGRAM: &str = "ud_loopback";

/// UD datagrams through the device between two queue pairs of this process.
#[derive(Parser, Debug)]
#[command(name = PROGRAM, args_override_self = true)]
struct Args {
    /// Use IB device (default: the first device found).
    #[arg(short = 'd', long = "ib-dev")]
    ib_dev: Option<String>,
    /// Use port of IB device.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// Local port GID index (needed on RoCE).
    #[arg(short = 'g', long = "gid-idx")]
    gid_idx: Option<u32>,
    /// Datagram size (at most the port's MTU).
    #[arg(short = 's', long = "size", default_value_t = 1024)]
    size: usize,
    /// Datagrams with the right Q_Key.
    #[arg(short = 'n', long = "iters", default_value_t = 100)]
    iters: u64,
    /// The receiver's Q_Key (decimal, or hex with 0x).
    #[arg(long = "qkey", default_value = "0x11111111", value_parser = parse_qkey)]
    qkey: u32,
    /// How long to wait for a completion, in seconds.
    #[arg(long = "timeout", default_value_t = 30)]
    timeout: u64,
}

fn parse_qkey(text: &str) -> Result<u32, String> {
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.map_err(|e| format!("invalid Q_Key {text:?}: {e}"))
}

fn main() {
    let args = Args::parse();
    if let Err(message) = run(&args) {
        pingpong::fail(PROGRAM, message);
    }
}

fn byte(round: u64, i: usize) -> u8 {
    (i as u64).wrapping_mul(31).wrapping_add(round) as u8
}

fn run(args: &Args) -> Result<(), String> {
    let options = Options::for_device(args.ib_dev.clone(), args.ib_port, args.gid_idx);
    let mut setup = pingpong::setup(&options, 8)?;
    let mtu = setup.port.active_mtu.bytes().unwrap_or(256) as usize;
    if args.size == 0 || args.size > mtu {
        return Err(format!(
            "size {} out of range (1 to the port's MTU, {mtu})",
            args.size
        ));
    }
    let timeout = Duration::from_secs(args.timeout);
    // The sender's completions go to a queue of their own, the receiver's to the setup's.
    let mut send_cq = setup
        .context
        .create_cq(8)
        .map_err(|e| format!("couldn't create CQ: {e}"))?;
    let ud_qp = |send: &rdma_verbs::CompletionQueue,
                 recv: &rdma_verbs::CompletionQueue,
                 qkey: u32|
     -> Result<QueuePair<Ud, rdma_verbs::qp::Rts>, String> {
        setup
            .pd
            .qp_builder::<Ud>(send, recv)
            .max_send_wr(4)
            .max_recv_wr(4)
            .build()
            .map_err(|e| format!("couldn't create QP: {e}"))?
            .into_init(&UdInitAttr::new(args.ib_port, qkey))
            .map_err(|e| format!("failed to modify QP to INIT: {e}"))?
            .into_rtr(&UdRtrAttr)
            .map_err(|e| format!("failed to modify QP to RTR: {e}"))?
            .into_rts(&SqPsnRtsAttr::new(0))
            .map_err(|e| format!("failed to modify QP to RTS: {e}"))
    };
    let mut receiver = ud_qp(&send_cq, &setup.cq, args.qkey)?;
    let mut sender = ud_qp(&send_cq, &send_cq, args.qkey)?;
    // The path to this port: its LID, and on RoCE its GID (which needs -g).
    let mut av = AddressVector::new(args.ib_port).dlid(setup.port.lid);
    if setup.port.is_ethernet() {
        let index = args.gid_idx.ok_or("RoCE needs a GID index: pass -g")?;
        av = av.grh(setup.gid, index as u8);
    }
    let ah = setup
        .pd
        .create_ah(&av)
        .map_err(|e| format!("couldn't create AH: {e}"))?;
    println!(
        "  sender QPN 0x{:06x}, receiver QPN 0x{:06x}, Q_Key 0x{:08x}",
        sender.qp_num(),
        receiver.qp_num(),
        args.qkey
    );

    // Each queue pair's own slots: the receiver's take the GRH and the datagram, the sender's
    // the datagram.
    let slots = |qp: &QueuePair<Ud, rdma_verbs::qp::Rts>, size: usize| {
        qp.slot_ring(2, size)
            .map_err(|e| format!("couldn't register the slots: {e}"))
    };
    let (mut rx, mut tx) = (
        slots(&receiver, GRH_LEN + args.size)?,
        slots(&sender, args.size)?,
    );
    let started = Instant::now();
    for round in 0..args.iters {
        let slot = rx.take().ok_or("no receive slot free")?;
        receiver
            .post_recv_slot(&mut rx, RecvRequest::new(slot).tag(round))
            .map_err(|e| format!("couldn't post receive: {e}"))?;
        let mut out = tx.take().ok_or("no send slot free")?;
        let bytes = tx.bytes_mut(&mut out).map_err(|e| e.to_string())?;
        for (i, b) in bytes[..args.size].iter_mut().enumerate() {
            *b = byte(round, i);
        }
        out.set_len(args.size);
        sender
            .post_send_slot(
                &mut tx,
                SendRequest::send(out)
                    .to(&ah, receiver.qp_num(), args.qkey)
                    .tag(round),
            )
            .map_err(|e| format!("couldn't post send: {e}"))?;
        let sent = connect::next_wc(&mut send_cq, timeout)?;
        let out = tx.complete(&sent).ok_or("a send completion of no slot")?;
        tx.put(out).map_err(|e| e.to_string())?;
        let got = connect::next_wc(&mut setup.cq, timeout)?;
        if got.src_qp() != sender.qp_num() {
            return Err(format!("datagram {round} from QPN {:#x}", got.src_qp()));
        }
        let slot = rx.complete(&got).ok_or("a receive completion of no slot")?;
        if slot.tag() != round {
            return Err(format!("datagram {round} took receive {}", slot.tag()));
        }
        let data = rx.bytes(&slot).map_err(|e| e.to_string())?;
        if data.len() != GRH_LEN + args.size {
            return Err(format!("datagram {round}: {} bytes", data.len()));
        }
        if let Some(i) = (0..args.size).find(|&i| data[GRH_LEN + i] != byte(round, i)) {
            return Err(format!(
                "datagram {round}: byte {i} is {:#04x}, expected {:#04x}",
                data[GRH_LEN + i],
                byte(round, i)
            ));
        }
        rx.put(slot).map_err(|e| e.to_string())?;
    }
    let elapsed = started.elapsed();
    println!(
        "{} datagrams of {} bytes received and checked in {:.1} ms",
        args.iters,
        args.size,
        elapsed.as_secs_f64() * 1e3
    );

    // Another Q_Key: the send completes, the receiver's queue pair drops the datagram.
    let slot = rx.take().ok_or("no receive slot free")?;
    receiver
        .post_recv_slot(&mut rx, RecvRequest::new(slot).tag(u64::MAX))
        .map_err(|e| format!("couldn't post receive: {e}"))?;
    let wrong = args.qkey ^ 0x5a5a_5a5a;
    let mut out = tx.take().ok_or("no send slot free")?;
    out.set_len(args.size);
    sender
        .post_send_slot(
            &mut tx,
            SendRequest::send(out).to(&ah, receiver.qp_num(), wrong),
        )
        .map_err(|e| format!("couldn't post send: {e}"))?;
    let sent = connect::next_wc(&mut send_cq, timeout)?;
    let out = tx.complete(&sent).ok_or("a send completion of no slot")?;
    tx.put(out).map_err(|e| e.to_string())?;
    // Give the datagram ample time to arrive if it were accepted.
    let mut wcs = [WorkCompletion::default(); 1];
    let unexpected = setup
        .cq
        .poll_for(&mut wcs, 1, Duration::from_millis(500))
        .map_err(|e| format!("poll CQ failed: {e}"))?;
    if let [wc] = unexpected {
        return Err(format!(
            "a datagram with Q_Key {wrong:#010x} was received: {wc:?}"
        ));
    }
    println!(
        "a datagram with Q_Key 0x{wrong:08x} was dropped; {} receive still posted",
        rx.posted()
    );
    Ok(())
}
