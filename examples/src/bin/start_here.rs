//! `start_here`: the program `docs/start-here.md` walks through. Two RC queue pairs of one
//! device, connected to each other, both on one completion queue, send messages back and forth
//! from slot rings, the default safe data path; every byte received is checked.
//!
//! ```text
//! start_here [-d dev] [-n rounds] [-s size]
//! ```

#![forbid(unsafe_code)] // the examples show the safe API: no `unsafe` anywhere

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use rdma_verbs::{
    CompletionQueue, Context, QueuePair,
    cq::WorkCompletion,
    mr::AccessFlags,
    qp::{Rc, Rts},
    slot::SlotRing,
    wr::{RecvRequest, SendRequest},
};

/// Messages back and forth between two connected queue pairs of one device.
#[derive(Parser, Debug)]
#[command(name = "start_here")]
struct Args {
    /// The device (default: the first one found).
    #[arg(short = 'd', long = "ib-dev")]
    ib_dev: Option<String>,
    /// Messages each way.
    #[arg(short = 'n', long = "rounds", default_value_t = 10)]
    rounds: u32,
    /// Bytes per message.
    #[arg(short = 's', long = "size", default_value_t = 64)]
    size: usize,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("start_here: {error}");
            ExitCode::FAILURE
        }
    }
}

type Error = Box<dyn std::error::Error>;

fn run(args: &Args) -> Result<(), Error> {
    let name = match &args.ib_dev {
        Some(name) => name.clone(),
        None => rdma_verbs::devices()?
            .iter()
            .next()
            .ok_or("no RDMA device")?
            .name()
            .to_string(),
    };
    // From the device to two connected RC queue pairs.
    let context = Context::open(&name)?;
    let gid = context.routable_gid(1)?;
    let pd = context.alloc_pd()?;
    let mut cq = context.create_cq(64)?;
    let a = pd.qp_builder::<Rc>(&cq, &cq).build()?;
    let b = pd.qp_builder::<Rc>(&cq, &cq).build()?;
    let gid_index = u8::try_from(gid.index)?;
    let (mut a, mut b) = QueuePair::connect_loopback(a, b, 1, gid_index, AccessFlags::empty())?;

    // Each queue pair's own slots: a ring of receives, posted into every slot (32 per
    // doorbell), and a ring to send from.
    let (mut rx_a, mut tx_a) = (a.slot_ring(16, args.size)?, a.slot_ring(4, args.size)?);
    let (mut rx_b, mut tx_b) = (b.slot_ring(16, args.size)?, b.slot_ring(4, args.size)?);
    a.fill_slot_ring(&mut rx_a)?;
    b.fill_slot_ring(&mut rx_b)?;

    for round in 0..args.rounds {
        let message = pattern(round, args.size);
        // `a` sends to `b`, which sends what it received back, reversed.
        let mut echo = exchange((&mut a, &mut tx_a), (&mut b, &mut rx_b), &mut cq, &message)?;
        echo.reverse();
        let back = exchange((&mut b, &mut tx_b), (&mut a, &mut rx_a), &mut cq, &echo)?;
        if back.iter().rev().ne(message.iter()) {
            return Err(format!("round {round}: the echo differs from the message").into());
        }
        println!("round {round}: {} bytes there and back", message.len());
    }
    Ok(())
}

/// A queue pair and one of its slot rings.
type Side<'a> = (&'a mut QueuePair<Rc, Rts>, &'a mut SlotRing);

/// Sends `message` from a slot of `from`'s send ring to `to`, waits for both completions on
/// `cq` (which both queue pairs share: each ring takes only its own), and returns what `to`
/// received. The slots come back: the send's to its ring, the receive's posted again.
fn exchange(
    (from, tx): Side<'_>,
    (to, rx): Side<'_>,
    cq: &mut CompletionQueue,
    message: &[u8],
) -> Result<Vec<u8>, Error> {
    let mut slot = tx.take().ok_or("no free slot to send from")?;
    tx.fill(&mut slot, message)?;
    from.post_send_slot(tx, SendRequest::send(slot).tag(1))?;
    let (mut sent, mut received) = (false, None);
    let mut wcs = [WorkCompletion::default(); 8];
    while !sent || received.is_none() {
        let polled = cq.poll_for(&mut wcs, 1, Duration::from_secs(10))?;
        if polled.is_empty() {
            return Err("no completion in 10 s".into());
        }
        for wc in polled {
            if !wc.is_success() {
                return Err(format!("a request failed: {}", wc.status()).into());
            }
            if let Some(slot) = rx.complete(wc) {
                // The receive: its bytes, then the slot goes back to the device.
                received = Some(rx.bytes(&slot)?.to_vec());
                to.post_recv_slot(rx, RecvRequest::new(slot))?;
            } else if let Some(slot) = tx.complete(wc) {
                // The send: the slot is free again.
                sent = slot.tag() == 1;
                tx.put(slot)?;
            }
        }
    }
    received.ok_or_else(|| "nothing received".into())
}

/// The bytes of message `round`.
fn pattern(round: u32, size: usize) -> Vec<u8> {
    (0..size)
        .map(|i| (i as u32 ^ round.wrapping_mul(31)) as u8)
        .collect()
}
