//! `rdma_rw`: RDMA WRITE and RDMA READ between two processes, in safe code only (slot rings,
//! the default data path of `rdma-verbs`).
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

#![forbid(unsafe_code)] // the examples show the safe API: no `unsafe` anywhere

use std::time::Instant;

use clap::Parser;
use rdma_examples::connect::{self, PairArgs};
use rdma_examples::exchange::PeerEnd;
use rdma_examples::pingpong;
use rdma_verbs::{MemoryRegion, cq::WcOpcode, mr::AccessFlags, wr::SendRequest};

const PROGRAM: &str = "rdma_rw";

/// RDMA WRITE and READ between two processes.
#[derive(Parser, Debug)]
#[command(name = PROGRAM, args_override_self = true)]
struct Args {
    #[command(flatten)]
    pair: PairArgs,
    /// Size of the server's region; the client writes the first half and reads the second.
    #[arg(short = 's', long = "size", default_value_t = 8192)]
    size: usize,
    /// Pattern seed: both sides must use the same (the other's check fails otherwise).
    #[arg(long = "seed", default_value_t = 0)]
    seed: u8,
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
    let half = args.size / 2;
    let timeout = args.pair.timeout();
    match &args.pair.servername {
        Some(_) => {
            // The client lets its peer access nothing.
            let mut pair = connect::connect(&args.pair, AccessFlags::empty(), 2)?;
            let region = pair.link.recv_remote()?;
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
            // Two slots of the queue pair's own: one to write from, one to read into.
            let mut ring = pair
                .qp
                .slot_ring(2, args.size - half)
                .map_err(|e| format!("couldn't register the slots: {e}"))?;
            let mut out = ring.take().ok_or("no free slot")?;
            let bytes = ring.bytes_mut(&mut out).map_err(|e| e.to_string())?;
            for (i, b) in bytes[..half].iter_mut().enumerate() {
                *b = client_byte(args.seed, i);
            }
            out.set_len(half);
            let first = region.slice(0, half as u32).map_err(|e| e.to_string())?;
            let second = region
                .slice(half as u32, (args.size - half) as u32)
                .map_err(|e| e.to_string())?;
            let started = Instant::now();
            // The send queue completes in order: the READ's completion also tells that the
            // (unsignaled) WRITE is done.
            pair.qp
                .post_send_slot(
                    &mut ring,
                    SendRequest::write(out, first).tag(1).unsignaled(),
                )
                .map_err(|e| format!("couldn't post the RDMA WRITE: {e}"))?;
            let back = ring.take().ok_or("no free slot")?;
            pair.qp
                .post_send_slot(&mut ring, SendRequest::read(back, second).tag(2))
                .map_err(|e| format!("couldn't post the RDMA READ: {e}"))?;
            let done = connect::next_wc(&mut pair.setup.cq, timeout)?;
            let elapsed = started.elapsed();
            if done.opcode() != WcOpcode::RdmaRead {
                return Err(format!("unexpected completion {done:?}"));
            }
            // The READ's slot, with what it read (the WRITE's slot is free again with it).
            let read = ring
                .complete(&done)
                .ok_or("the READ's slot did not come back")?;
            let read = ring.bytes(&read).map_err(|e| e.to_string())?;
            // Both requests are done: the server may now look at what was written (before
            // this side checks what it read, so that each side reports its own check).
            if pair.link.finish(timeout)? == PeerEnd::Closed {
                return Err("the server closed the connection before the end".into());
            }
            check("the RDMA READ", read, |i| server_byte(args.seed, i))?;
            println!(
                "{} bytes written and {} bytes read in {:.1} us",
                half,
                read.len(),
                elapsed.as_secs_f64() * 1e6
            );
            Ok(())
        }
        None => {
            let access = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
            // Registered in the connection's protection domain once connected; the client
            // waits for its description before it posts anything.
            let pair = connect::connect(&args.pair, access, 1)?;
            let mut region = pair
                .setup
                .pd
                .register(args.size, AccessFlags::LOCAL_WRITE | access)
                .map_err(|e| format!("couldn't register the region: {e}"))?;
            let pattern: Vec<u8> = (0..args.size - half)
                .map(|i| server_byte(args.seed, i))
                .collect();
            // A remotely writable region is only ever copied to and from, never borrowed.
            region.write_at(half, &pattern).map_err(|e| e.to_string())?;
            let mut link = pair.link;
            link.send_remote(&region.remote(..).map_err(|e| e.to_string())?)?;
            if link.finish(timeout)? == PeerEnd::Closed {
                return Err("the client closed the connection before the end".into());
            }
            check_written(&region, half, args.seed)?;
            println!("{half} bytes written by the client, all as expected");
            Ok(())
        }
    }
}

/// Checks the first `half` bytes of `region` against the client's pattern.
fn check_written(region: &MemoryRegion, half: usize, seed: u8) -> Result<(), String> {
    let mut written = vec![0u8; half];
    region.read_at(0, &mut written).map_err(|e| e.to_string())?;
    check("the RDMA WRITE", &written, |i| client_byte(seed, i))
}
