//! `atomic_counter`: a counter and a lock in another process's memory, driven with RDMA atomics
//! in safe code only (slot rings, the default data path of `rdma-verbs`).
//!
//! The server registers two 8-byte words that its peer may update atomically: a counter
//! (starting at `--start`) and a lock (0, free). The client takes the lock with a
//! compare-and-swap (0 → 1), adds 1 to the counter `-n` times with fetch-and-add, checking that
//! each returns the value before its own addition, shows that a second compare-and-swap on the
//! taken lock fails (it returns 1 and swaps nothing), and releases the lock (1 → 0). After the
//! end handshake the server checks the counter (`--start` + `-n`) and the lock (free).
//!
//! The old value an atomic returns is written by the device in its own byte order; rxe and most
//! NICs write host order, which is what this example reads.
//!
//! ```text
//! atomic_counter [-d dev] [-i port] [-g gid-index] [-p tcp-port] [--start N]          # server
//! atomic_counter [-d dev] [-i port] [-g gid-index] [-p tcp-port] [-n N] <server>      # client
//! ```

#![forbid(unsafe_code)] // the examples show the safe API: no `unsafe` anywhere

use clap::Parser;
use rdma_examples::connect::{self, PairArgs};
use rdma_examples::exchange::PeerEnd;
use rdma_examples::pingpong;
use rdma_verbs::{
    QueuePair,
    mr::{AccessFlags, RemoteMemory},
    qp::{Rc, Rts},
    slot::{Slot, SlotRing},
    wr::{AtomicOp, SendRequest},
};

const PROGRAM: &str = "atomic_counter";

/// A counter and a lock in the server's memory, driven with RDMA atomics.
#[derive(Parser, Debug)]
#[command(name = PROGRAM, args_override_self = true)]
struct Args {
    #[command(flatten)]
    pair: PairArgs,
    /// Client: how many times to add 1 to the counter.
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    iters: u64,
    /// Server: the counter's first value; client: the value it expects to find.
    #[arg(long = "start", default_value_t = 0)]
    start: u64,
}

fn main() {
    let args = Args::parse();
    if let Err(message) = run(&args) {
        pingpong::fail(PROGRAM, message);
    }
}

/// Offsets of the two words in the server's region.
const COUNTER: u32 = 0;
const LOCK: u32 = 8;

fn run(args: &Args) -> Result<(), String> {
    let timeout = args.pair.timeout();
    match &args.pair.servername {
        Some(_) => {
            let mut pair = connect::connect(&args.pair, AccessFlags::empty(), 2)?;
            let words = pair.link.recv_remote()?;
            let counter = words.slice(COUNTER, 8).map_err(|e| e.to_string())?;
            let lock = words.slice(LOCK, 8).map_err(|e| e.to_string())?;
            // The queue pair's own 8-byte slots, into which each atomic's old value lands.
            let mut ring = pair
                .qp
                .slot_ring(2, 8)
                .map_err(|e| format!("couldn't register the result slots: {e}"))?;
            let mut atomic = |make: &dyn Fn(Slot) -> SendRequest<'static, AtomicOp, Slot>| {
                one_atomic(&mut pair.qp, &mut ring, &mut pair.setup.cq, make, timeout)
            };

            let old = atomic(&|slot| SendRequest::compare_swap(slot, lock, 0, 1))?;
            if old != 0 {
                return Err(format!("the lock was taken (it holds {old})"));
            }
            for i in 0..args.iters {
                let old = atomic(&|slot| SendRequest::fetch_add(slot, counter, 1))?;
                let expected = args.start.wrapping_add(i);
                if old != expected {
                    return Err(format!(
                        "FETCH_AND_ADD {} returned {old}, expected {expected}",
                        i + 1
                    ));
                }
            }
            // The lock is ours: a second taker's compare fails, and the word stays 1.
            let old = atomic(&|slot| SendRequest::compare_swap(slot, lock, 0, 2))?;
            if old != 1 {
                return Err(format!(
                    "a second CMP_AND_SWP on the taken lock returned {old}"
                ));
            }
            let old = atomic(&|slot| SendRequest::compare_swap(slot, lock, 1, 0))?;
            if old != 1 {
                return Err(format!("releasing the lock found {old}, expected 1"));
            }
            println!(
                "lock taken, counter {} -> {}, lock released",
                args.start,
                args.start.wrapping_add(args.iters)
            );
            if pair.link.finish(timeout)? == PeerEnd::Closed {
                return Err("the server closed the connection before the end".into());
            }
            Ok(())
        }
        None => {
            let pair = connect::connect(&args.pair, AccessFlags::REMOTE_ATOMIC, 1)?;
            // Atomics need a writable region; it is remotely writable, so it is only ever
            // read and written by copying (`load_u64`, `write_at`).
            let mut words = pair
                .setup
                .pd
                .register(16, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC)
                .map_err(|e| format!("couldn't register the words: {e}"))?;
            words
                .write_at(COUNTER as usize, &args.start.to_ne_bytes())
                .map_err(|e| e.to_string())?;
            let remote: RemoteMemory = words.remote(..).map_err(|e| e.to_string())?;
            let mut link = pair.link;
            link.send_remote(&remote)?;
            if link.finish(timeout)? == PeerEnd::Closed {
                return Err("the client closed the connection before the end".into());
            }
            let counter = words
                .load_u64(COUNTER as usize)
                .map_err(|e| e.to_string())?;
            let lock = words.load_u64(LOCK as usize).map_err(|e| e.to_string())?;
            println!("counter {counter}, lock {lock}");
            if lock != 0 {
                return Err(format!("the lock was left taken ({lock})"));
            }
            Ok(())
        }
    }
}

/// Posts the atomic `make` builds on a free slot of `ring` and returns the old value it found,
/// from the slot its completion hands back (which goes back to the ring).
fn one_atomic(
    qp: &mut QueuePair<Rc, Rts>,
    ring: &mut SlotRing,
    cq: &mut rdma_verbs::CompletionQueue,
    make: &dyn Fn(Slot) -> SendRequest<'static, AtomicOp, Slot>,
    timeout: std::time::Duration,
) -> Result<u64, String> {
    let slot = ring.take().ok_or("no result slot free")?;
    qp.post_send_slot(ring, make(slot))
        .map_err(|e| format!("couldn't post the atomic: {e}"))?;
    let done = connect::next_wc(cq, timeout)?;
    let result = ring
        .complete(&done)
        .ok_or("the result slot did not come back")?;
    let bytes: [u8; 8] = ring
        .bytes(&result)
        .map_err(|e| e.to_string())?
        .try_into()
        .map_err(|_| "a short result".to_string())?;
    ring.put(result).map_err(|e| e.to_string())?;
    Ok(u64::from_ne_bytes(bytes))
}
