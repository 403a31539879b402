//! `instructions`: the user-space instructions of one post+poll round, counted by callgrind, on
//! the `unsafe` post calls and on the safe paths (owned buffers, slot rings).
//!
//! `instructions <unsafe|owned|reuse|slot|srq-unsafe|srq-slot|cq-ex|shared-unsafe|shared-slot> <rounds>` runs `rounds` rounds on an RC queue pair connected
//! to another on the same device (loopback): post a receive, post a 64-byte send, wait for both
//! completions, poll each. Only the functions named `measured_*` are meant to be counted: run
//! it as
//!
//! ```text
//! valgrind --tool=callgrind --toggle-collect='measured_*' instructions owned 2000
//! ```
//!
//! and divide the collected instructions by the rounds (`cargo xtask instructions` does that on
//! the device; the benches' device test `tests/instructions.rs` runs every mode without
//! callgrind). The waits between post and poll
//! happen outside the measured functions, on a completion channel, so that every measured poll
//! finds its completion and no empty poll is counted.
//!
//! `instructions device` prints the device's name, port and GID index, the arguments of the
//! same round written in C (`benches/c/post_poll.c`), which `cargo xtask instructions` counts
//! as the reference.
//!
//! The owned path's measured functions include what it does that the `unsafe` path leaves to
//! the caller: taking a buffer from its pool and returning it (the `unsafe` path reuses one
//! region). The bytes are written into the buffer outside them in both modes. Mode `reuse` is
//! the owned path used as the `unsafe` one is: two buffers taken once, each re-posted when its
//! completion hands it back, so the measured calls are the posts and polls alone. Mode `slot`
//! does the same with a slot ring per queue pair. Modes
//! `srq-unsafe` and `srq-slot` post the receives to a shared receive queue that the receiving
//! queue pair takes them from: with the `unsafe` call, and into an SRQ slot ring (the sends
//! as in `unsafe` and `slot`). Mode `cq-ex` is `unsafe` with extended completion queues
//! (reporting the byte count), polled in sessions (`poll_extended`) that read the status,
//! opcode and byte count inside the measured call, as that API requires.
//!
//! Modes `shared-unsafe` and `shared-slot` put both queue pairs on one completion queue and
//! route each completion in the measured poll: `shared-slot` makes the data-path calls of
//! `docs/start-here.md`'s program (`SlotRing::take`, `post_send_slot` with a tag, a bounded
//! `poll_for`, each completion offered to the receive ring first, then to the send ring, whose
//! slot is put back, and the received slot posted again; the program's copies of the bytes in
//! and out are left out, as in every mode), and `shared-unsafe` the same round with the
//! `unsafe` calls, completions told apart by request id. One poll finds both completions: the measured calls run after the queue signalled and a
//! pause; a round that still needs a second poll is finished outside them and counted, and
//! more than one such round in fifty fails the count.

use std::process::ExitCode;

use rdma_benches::loopback::{Loopback, Shape};
use rdma_verbs::{
    CompletionQueue, MemoryRegion, QueuePair, SharedReceiveQueue,
    cq::{WcFields, WcOpcode, WcStatus, WorkCompletion},
    mr::{AccessFlags, MrSlice},
    owned::{Buf, BufferPool, Completion},
    qp::{Rc, Rts},
    slot::{Slot, SlotRing, SrqSlotRing},
    wr::{RecvRequest, SendRequest},
};

const SIZE: usize = 64;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, rounds) = match args.as_slice() {
        [device] if device == "device" => {
            return match rdma_test_support::device() {
                Some(d) => {
                    println!("{} {} {}", d.name, d.port, d.gid_index);
                    ExitCode::SUCCESS
                }
                None => fail("no RDMA device"),
            };
        }
        [mode, rounds] => match rounds.parse::<u32>() {
            Ok(rounds) => (mode.clone(), rounds),
            Err(_) => return fail("the rounds must be a number"),
        },
        _ => {
            return fail(
                "usage: instructions <unsafe|owned|reuse|slot|srq-unsafe|srq-slot|cq-ex|\
                 shared-unsafe|shared-slot> <rounds> | instructions device",
            );
        }
    };
    match run(&mode, rounds) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => fail(&message),
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("instructions: {message}");
    ExitCode::FAILURE
}

fn run(mode: &str, rounds: u32) -> Result<(), String> {
    if let Some(srq_mode) = mode.strip_prefix("srq-") {
        return run_srq(srq_mode, rounds);
    }
    let shape = Shape {
        extended: (mode == "cq-ex").then_some(WcFields::BYTE_LEN),
        shared_cq: mode.starts_with("shared-"),
        ..Shape::default()
    };
    let mut pair = Loopback::open(shape)?;
    let pd = pair.a.pd().clone();
    match mode {
        "cq-ex" => {
            let mut mr = pd
                .register(2 * SIZE, AccessFlags::LOCAL_WRITE)
                .map_err(|e| e.to_string())?;
            let mut rounds_run = |pair: &mut Loopback| {
                for round in 0..rounds {
                    let data = [0x5a ^ round as u8; SIZE];
                    mr.write_at(0, &data).map_err(|e| e.to_string())?;
                    pair.arm()?;
                    measured_post_recv_unsafe(&mut pair.b, &mr).map_err(|e| e.to_string())?;
                    measured_post_send_unsafe(&mut pair.a, &mr).map_err(|e| e.to_string())?;
                    pair.wait_both()?;
                    let (mut sent, mut received): (Read, Read) = (None, None);
                    let sent_n = measured_poll_extended(&mut pair.cq_a, &mut sent);
                    let received_n = measured_poll_extended(&mut pair.cq_b, &mut received);
                    let mut got = [0u8; SIZE];
                    mr.read_at(SIZE, &mut got).map_err(|e| e.to_string())?;
                    let ok = sent_n == 1
                        && matches!(sent, Some((WcStatus::Success, WcOpcode::Send, _)))
                        && received_n == 1
                        && received == Some((WcStatus::Success, WcOpcode::Recv, Some(SIZE as u32)))
                        && got == data;
                    if !ok {
                        return Err(format!(
                            "round {round}: read {sent_n} ({sent:?}) and {received_n} \
                             ({received:?}), bytes {}",
                            if got == data { "as sent" } else { "differ" }
                        ));
                    }
                }
                Ok::<(), String>(())
            };
            let result = rounds_run(&mut pair);
            drop(pair);
            result?;
            drop(mr);
        }
        "unsafe" => {
            let mut mr = pd
                .register(2 * SIZE, AccessFlags::LOCAL_WRITE)
                .map_err(|e| e.to_string())?;
            let mut wcs = [WorkCompletion::default(); 4];
            let mut rounds_run = |pair: &mut Loopback| {
                for round in 0..rounds {
                    let data = [0x5a ^ round as u8; SIZE];
                    mr.write_at(0, &data).map_err(|e| e.to_string())?;
                    pair.arm()?;
                    measured_post_recv_unsafe(&mut pair.b, &mr).map_err(|e| e.to_string())?;
                    measured_post_send_unsafe(&mut pair.a, &mr).map_err(|e| e.to_string())?;
                    pair.wait_both()?;
                    let sent = measured_poll_unsafe(&mut pair.cq_a, &mut wcs);
                    let sent_ok =
                        sent == 1 && wcs[0].is_success() && wcs[0].opcode() == WcOpcode::Send;
                    let received = measured_poll_unsafe(&mut pair.cq_b, &mut wcs);
                    let received_ok = received == 1
                        && wcs[0].is_success()
                        && wcs[0].opcode() == WcOpcode::Recv
                        && wcs[0].byte_len() == SIZE as u32;
                    let mut got = [0u8; SIZE];
                    mr.read_at(SIZE, &mut got).map_err(|e| e.to_string())?;
                    if !(sent_ok && received_ok && got == data) {
                        return Err(format!(
                            "round {round}: polled {sent} and {received} ({:?} {:?}), bytes {}",
                            wcs[0].status(),
                            wcs[0].opcode(),
                            if got == data { "as sent" } else { "differ" }
                        ));
                    }
                }
                Ok::<(), String>(())
            };
            let result = rounds_run(&mut pair);
            // The queue pairs go before the region their requests name, whatever the rounds'
            // outcome.
            drop(pair);
            result?;
            drop(mr);
        }
        "owned" => {
            let pool = BufferPool::new(&pd, 4, SIZE).map_err(|e| e.to_string())?;
            for round in 0..rounds {
                pair.arm()?;
                let recv = measured_take(&pool).ok_or("the pool is empty")?;
                measured_post_recv_owned(&mut pair.b, recv).map_err(|e| e.to_string())?;
                let mut send = measured_take(&pool).ok_or("the pool is empty")?;
                send.fill_from(&[0x5a; SIZE]).map_err(|e| e.to_string())?;
                measured_post_send_owned(&mut pair.a, send).map_err(|e| e.to_string())?;
                pair.wait_both()?;
                let sent = measured_poll_owned(&mut pair.cq_a);
                let received = measured_poll_owned(&mut pair.cq_b);
                if (sent, received) != (1, 1) {
                    return Err(format!("round {round}: polled {sent} and {received}"));
                }
            }
        }
        "reuse" => {
            let pool = BufferPool::new(&pd, 2, SIZE).map_err(|e| e.to_string())?;
            let mut recv = pool.take();
            let mut send = pool.take();
            send.as_mut()
                .ok_or("the pool is empty")?
                .fill_from(&[0x5a; SIZE])
                .map_err(|e| e.to_string())?;
            for round in 0..rounds {
                pair.arm()?;
                let buf = recv.take().ok_or("no receive buffer came back")?;
                measured_post_recv_owned(&mut pair.b, buf).map_err(|e| e.to_string())?;
                let buf = send.take().ok_or("no send buffer came back")?;
                measured_post_send_owned(&mut pair.a, buf).map_err(|e| e.to_string())?;
                pair.wait_both()?;
                let sent = measured_poll_keep(&mut pair.cq_a, &mut send);
                let received = measured_poll_keep(&mut pair.cq_b, &mut recv);
                if (sent, received) != (1, 1) {
                    return Err(format!("round {round}: polled {sent} and {received}"));
                }
                let got = recv.as_deref().ok_or("no receive buffer came back")?;
                if got != [0x5a; SIZE] {
                    return Err(format!("round {round}: received {got:?}"));
                }
            }
        }
        "slot" => {
            let e = |e: rdma_verbs::Error| e.to_string();
            let mut send_ring = pair.a.slot_ring(1, SIZE).map_err(e)?;
            let mut recv_ring = pair.b.slot_ring(1, SIZE).map_err(e)?;
            let mut send = send_ring.take();
            let mut recv = recv_ring.take();
            let slot = send.as_mut().ok_or("the ring is empty")?;
            send_ring.fill(slot, &[0x5a; SIZE]).map_err(e)?;
            let mut wcs = [WorkCompletion::default(); 4];
            for round in 0..rounds {
                pair.arm()?;
                let slot = recv.take().ok_or("no receive slot came back")?;
                measured_post_recv_slot(&mut pair.b, &mut recv_ring, slot).map_err(e)?;
                let slot = send.take().ok_or("no send slot came back")?;
                measured_post_send_slot(&mut pair.a, &mut send_ring, slot).map_err(e)?;
                pair.wait_both()?;
                send = measured_poll_slot(&mut pair.cq_a, &mut send_ring, &mut wcs);
                let sent_ok = wcs[0].is_success() && wcs[0].opcode() == WcOpcode::Send;
                recv = measured_poll_slot(&mut pair.cq_b, &mut recv_ring, &mut wcs);
                let received_ok = wcs[0].is_success() && wcs[0].opcode() == WcOpcode::Recv;
                let got = match &recv {
                    Some(slot) => recv_ring.bytes(slot).map_err(e)?,
                    None => &[],
                };
                if !(sent_ok && received_ok && send.is_some() && got == [0x5a; SIZE]) {
                    return Err(format!("round {round}: received {got:?}"));
                }
            }
        }
        "shared-unsafe" => {
            let mut mr = pd
                .register(2 * SIZE, AccessFlags::LOCAL_WRITE)
                .map_err(|e| e.to_string())?;
            let mut wcs = [WorkCompletion::default(); 4];
            let mut misses = 0;
            let mut rounds_run = |pair: &mut Loopback| {
                for round in 0..rounds {
                    let data = [0x5a ^ round as u8; SIZE];
                    mr.write_at(0, &data).map_err(|e| e.to_string())?;
                    pair.arm()?;
                    measured_post_recv_unsafe(&mut pair.b, &mr).map_err(|e| e.to_string())?;
                    measured_post_send_unsafe(&mut pair.a, &mr).map_err(|e| e.to_string())?;
                    settle(pair)?;
                    let mut seen = Seen::default();
                    let mut found =
                        measured_poll_shared_unsafe(&mut pair.cq_a, &mut wcs, &mut seen);
                    if found < 2 {
                        misses += 1;
                        found += finish(
                            || poll_shared_unsafe(&mut pair.cq_a, &mut wcs, &mut seen),
                            found,
                        )?;
                    }
                    let mut got = [0u8; SIZE];
                    mr.read_at(SIZE, &mut got).map_err(|e| e.to_string())?;
                    if !(found == 2 && seen.sent && seen.received && got == data) {
                        return Err(format!("round {round}: found {found}, {seen:?}"));
                    }
                }
                Ok::<(), String>(())
            };
            let result = rounds_run(&mut pair);
            drop(pair);
            result?;
            drop(mr);
            report_misses(misses, rounds)?;
        }
        "shared-slot" => {
            // The round of `docs/start-here.md`'s program: a receive ring and a send ring, both
            // queue pairs on one completion queue, each completion offered to the receive ring
            // first, then to the send ring.
            let e = |e: rdma_verbs::Error| e.to_string();
            let mut tx = pair.a.slot_ring(4, SIZE).map_err(e)?;
            let mut rx = pair.b.slot_ring(16, SIZE).map_err(e)?;
            pair.b.fill_slot_ring(&mut rx).map_err(e)?;
            let mut wcs = [WorkCompletion::default(); 8];
            let mut misses = 0;
            for round in 0..rounds {
                let data = [0x5a ^ round as u8; SIZE];
                pair.arm()?;
                let mut slot = measured_take_slot(&mut tx).ok_or("no free slot to send from")?;
                tx.fill(&mut slot, &data).map_err(e)?;
                measured_post_send_slot_tagged(&mut pair.a, &mut tx, slot).map_err(e)?;
                settle(&pair)?;
                let mut routed = Routed::default();
                let mut found =
                    measured_poll_routed(&mut pair.cq_a, &mut wcs, &mut rx, &mut tx, &mut routed);
                if found < 2 {
                    misses += 1;
                    found += finish(
                        || poll_routed(&mut pair.cq_a, &mut wcs, &mut rx, &mut tx, &mut routed),
                        found,
                    )?;
                }
                if found != 2 || !routed.sent || routed.failed {
                    return Err(format!("round {round}: found {found}, {routed:?}"));
                }
                let slot = routed
                    .received
                    .ok_or_else(|| format!("round {round}: nothing received"))?;
                if rx.bytes(&slot).map_err(e)? != data {
                    return Err(format!("round {round}: the bytes differ"));
                }
                measured_post_recv_slot(&mut pair.b, &mut rx, slot).map_err(e)?;
            }
            report_misses(misses, rounds)?;
        }
        other => return Err(format!("unknown mode {other:?}")),
    }
    println!("{mode}: {rounds} rounds");
    Ok(())
}

/// What a start-here round's poll routed: the received slot, whether the send's slot came
/// back, whether a completion failed.
#[derive(Debug, Default)]
struct Routed {
    received: Option<Slot>,
    sent: bool,
    failed: bool,
}

/// What a shared-queue round's `unsafe` poll saw, by request id.
#[derive(Debug, Default)]
struct Seen {
    sent: bool,
    received: bool,
}

/// After the first completion of a round on the shared queue signalled, waits (outside the
/// measured calls) long enough for the second to have come too, so that one measured poll
/// finds both: on Soft-RoCE the send completes when the receive's ACK comes back, within
/// microseconds of the receive.
fn settle(pair: &Loopback) -> Result<(), String> {
    pair.wait_a()?;
    std::thread::sleep(std::time::Duration::from_micros(500));
    Ok(())
}

/// Polls (outside the measured calls) until the round's two completions are in, after a
/// measured poll found `found` of them: `poll` finds more.
fn finish(mut poll: impl FnMut() -> usize, found: usize) -> Result<usize, String> {
    let deadline = std::time::Instant::now() + rdma_benches::loopback::WAIT;
    let mut more = 0;
    while found + more < 2 {
        more += poll();
        if std::time::Instant::now() > deadline {
            return Err("the round's second completion never came".into());
        }
    }
    Ok(more)
}

/// Fails when more than one round in fifty (one in a run of fewer) needed a second poll (the counts would then leave
/// out part of those rounds' routing); prints how many did.
fn report_misses(misses: u32, rounds: u32) -> Result<(), String> {
    println!("{misses} of {rounds} rounds polled twice");
    if misses * 50 > rounds.max(50) {
        return Err(format!("{misses} of {rounds} rounds polled twice"));
    }
    Ok(())
}

/// The shared-queue `unsafe` round's poll: the two completions told apart by request id.
#[unsafe(no_mangle)]
#[inline(never)]
fn measured_poll_shared_unsafe(
    cq: &mut CompletionQueue,
    wcs: &mut [WorkCompletion],
    seen: &mut Seen,
) -> usize {
    poll_shared_unsafe(cq, wcs, seen)
}

#[inline(always)]
fn poll_shared_unsafe(
    cq: &mut CompletionQueue,
    wcs: &mut [WorkCompletion],
    seen: &mut Seen,
) -> usize {
    let Ok(polled) = cq.poll_for(wcs, 1, rdma_benches::loopback::WAIT) else {
        return 0;
    };
    for wc in polled.iter() {
        match wc.wr_id() {
            1 => seen.received = wc.is_success() && wc.byte_len() == SIZE as u32,
            2 => seen.sent = wc.is_success(),
            _ => {}
        }
    }
    polled.len()
}

/// The start-here round's poll, as `start_here` polls: a bounded `poll_for` of at least one
/// completion, each completion offered to the receive ring, then to the send ring, whose
/// slot goes back for the next send.
#[unsafe(no_mangle)]
#[inline(never)]
fn measured_poll_routed(
    cq: &mut CompletionQueue,
    wcs: &mut [WorkCompletion],
    rx: &mut SlotRing,
    tx: &mut SlotRing,
    routed: &mut Routed,
) -> usize {
    poll_routed(cq, wcs, rx, tx, routed)
}

#[inline(always)]
fn poll_routed(
    cq: &mut CompletionQueue,
    wcs: &mut [WorkCompletion],
    rx: &mut SlotRing,
    tx: &mut SlotRing,
    routed: &mut Routed,
) -> usize {
    let Ok(polled) = cq.poll_for(wcs, 1, rdma_benches::loopback::WAIT) else {
        return 0;
    };
    for wc in polled.iter() {
        if !wc.is_success() {
            routed.failed = true;
        }
        if let Some(slot) = rx.complete(wc) {
            routed.received = Some(slot);
        } else if let Some(slot) = tx.complete(wc) {
            routed.sent = tx.put(slot).is_ok();
        }
    }
    polled.len()
}

#[unsafe(no_mangle)]
#[inline(never)]
fn measured_take_slot(ring: &mut SlotRing) -> Option<Slot> {
    ring.take()
}

#[unsafe(no_mangle)]
#[inline(never)]
fn measured_post_send_slot_tagged(
    qp: &mut QueuePair<Rc, Rts>,
    ring: &mut SlotRing,
    slot: Slot,
) -> rdma_verbs::Result<()> {
    qp.post_send_slot(ring, SendRequest::send(slot).tag(1))
        .map_err(rdma_verbs::Error::from)
}

/// The SRQ modes: `unsafe` (`mode` without its `srq-`) or `slot`.
fn run_srq(mode: &str, rounds: u32) -> Result<(), String> {
    let (mut pair, mut srq) = Loopback::open_with_srq(Shape::default())?;
    let e = |e: rdma_verbs::Error| e.to_string();
    let mut wcs = [WorkCompletion::default(); 4];
    // Checks a round's two completions (in `wcs[0]` after each poll, `sent` and `received`
    // polled) and, for the receive, the bytes.
    let check = |round: u32, sent_ok: bool, received_ok: bool| {
        if sent_ok && received_ok {
            Ok(())
        } else {
            Err(format!(
                "round {round}: sent {sent_ok}, received {received_ok}"
            ))
        }
    };
    match mode {
        "unsafe" => {
            let pd = pair.a.pd().clone();
            let mut mr = pd.register(2 * SIZE, AccessFlags::LOCAL_WRITE).map_err(e)?;
            let mut rounds_run = |pair: &mut Loopback, srq: &mut SharedReceiveQueue| {
                for round in 0..rounds {
                    let data = [0x5a ^ round as u8; SIZE];
                    mr.write_at(0, &data).map_err(e)?;
                    pair.arm()?;
                    measured_post_srq_recv_unsafe(srq, &mr).map_err(e)?;
                    measured_post_send_unsafe(&mut pair.a, &mr).map_err(e)?;
                    pair.wait_both()?;
                    let sent = measured_poll_unsafe(&mut pair.cq_a, &mut wcs) == 1
                        && wcs[0].is_success()
                        && wcs[0].opcode() == WcOpcode::Send;
                    let received = measured_poll_unsafe(&mut pair.cq_b, &mut wcs) == 1
                        && wcs[0].is_success()
                        && wcs[0].opcode() == WcOpcode::Recv
                        && wcs[0].byte_len() == SIZE as u32;
                    let mut got = [0u8; SIZE];
                    mr.read_at(SIZE, &mut got).map_err(e)?;
                    check(round, sent, received && got == data)?;
                }
                Ok::<(), String>(())
            };
            let result = rounds_run(&mut pair, &mut srq);
            // The queue pairs and the SRQ go before the region their requests name, whatever
            // the rounds' outcome.
            drop((pair, srq));
            result?;
        }
        "slot" => {
            let mut send_ring = pair.a.slot_ring(1, SIZE).map_err(e)?;
            let mut recv_ring = srq.slot_ring(1, SIZE).map_err(e)?;
            let mut send = send_ring.take();
            let mut recv = recv_ring.take();
            for round in 0..rounds {
                let data = [0x5a ^ round as u8; SIZE];
                let mut slot = send.take().ok_or("no send slot")?;
                send_ring.fill(&mut slot, &data).map_err(e)?;
                pair.arm()?;
                let into = recv.take().ok_or("no receive slot")?;
                measured_post_srq_recv_slot(&mut srq, &mut recv_ring, into).map_err(e)?;
                measured_post_send_slot(&mut pair.a, &mut send_ring, slot).map_err(e)?;
                pair.wait_both()?;
                send = measured_poll_slot(&mut pair.cq_a, &mut send_ring, &mut wcs);
                let sent = send.is_some() && wcs[0].opcode() == WcOpcode::Send;
                recv = measured_poll_srq_slot(&mut pair.cq_b, &mut recv_ring, &mut wcs);
                let received = match &recv {
                    Some(slot) => {
                        wcs[0].opcode() == WcOpcode::Recv
                            && recv_ring.bytes(slot).map_err(e)? == data
                    }
                    None => false,
                };
                check(round, sent, received)?;
            }
        }
        other => return Err(format!("unknown mode srq-{other}")),
    }
    println!("srq-{mode}: {rounds} rounds");
    Ok(())
}

/// The receive request of the `unsafe` path, into the second half of `mr`.
fn recv_slice(mr: &MemoryRegion) -> MrSlice<'_> {
    // In range: the region holds two messages.
    mr.slice(SIZE..2 * SIZE).unwrap_or_else(|_| unreachable!())
}

#[unsafe(no_mangle)]
#[inline(never)]
fn measured_post_recv_unsafe(
    qp: &mut QueuePair<Rc, Rts>,
    mr: &MemoryRegion,
) -> rdma_verbs::Result<()> {
    // SAFETY: `mr` outlives the queue pairs (dropped after them in `run`), and Rust does not
    // touch its bytes while requests are in flight.
    unsafe { qp.post_recv_one(&RecvRequest::new(recv_slice(mr)).tag(1)) }
}

#[unsafe(no_mangle)]
#[inline(never)]
fn measured_post_send_unsafe(
    qp: &mut QueuePair<Rc, Rts>,
    mr: &MemoryRegion,
) -> rdma_verbs::Result<()> {
    let slice = mr.slice(..SIZE)?;
    // SAFETY: as in `measured_post_recv_unsafe`.
    unsafe { qp.post_send_one(&SendRequest::send(slice).tag(2)) }
}

#[unsafe(no_mangle)]
#[inline(never)]
fn measured_post_srq_recv_unsafe(
    srq: &mut SharedReceiveQueue,
    mr: &MemoryRegion,
) -> rdma_verbs::Result<()> {
    // SAFETY: `run_srq` drops the SRQ and its queue pairs before `mr`, on every path, and
    // reads `mr` only after the receive's completion.
    unsafe { srq.post_recv_one(&RecvRequest::new(recv_slice(mr)).tag(1)) }
}

#[unsafe(no_mangle)]
#[inline(never)]
fn measured_post_srq_recv_slot(
    srq: &mut SharedReceiveQueue,
    ring: &mut SrqSlotRing,
    slot: Slot,
) -> rdma_verbs::Result<()> {
    srq.post_recv_slot(ring, RecvRequest::new(slot))
        .map_err(rdma_verbs::Error::from)
}

/// Polls one completion and hands it to the SRQ's slot ring, which hands its slot back.
#[unsafe(no_mangle)]
#[inline(never)]
fn measured_poll_srq_slot(
    cq: &mut CompletionQueue,
    ring: &mut SrqSlotRing,
    wcs: &mut [WorkCompletion],
) -> Option<Slot> {
    match cq.poll(wcs).ok()? {
        [one] => ring.complete(one),
        _ => None,
    }
}

#[unsafe(no_mangle)]
#[inline(never)]
fn measured_poll_unsafe(cq: &mut CompletionQueue, wcs: &mut [WorkCompletion]) -> usize {
    cq.poll(wcs).map_or(0, |done| done.len())
}

/// What mode `cq-ex` reads of a completion inside the poll session: status, opcode, bytes.
type Read = Option<(WcStatus, WcOpcode, Option<u32>)>;

#[unsafe(no_mangle)]
#[inline(never)]
fn measured_poll_extended(cq: &mut CompletionQueue, read: &mut Read) -> usize {
    cq.poll_extended(4, |c| *read = Some((c.status(), c.opcode(), c.byte_len())))
        .unwrap_or(0)
}

#[unsafe(no_mangle)]
#[inline(never)]
fn measured_take(pool: &BufferPool) -> Option<Buf> {
    pool.take()
}

#[unsafe(no_mangle)]
#[inline(never)]
fn measured_post_recv_owned(qp: &mut QueuePair<Rc, Rts>, buf: Buf) -> rdma_verbs::Result<()> {
    qp.post_recv_buf(buf, 1).map_err(rdma_verbs::Error::from)
}

#[unsafe(no_mangle)]
#[inline(never)]
fn measured_post_send_owned(qp: &mut QueuePair<Rc, Rts>, buf: Buf) -> rdma_verbs::Result<()> {
    qp.post_send_owned(SendRequest::send(buf).tag(2))
        .map_err(rdma_verbs::Error::from)
}

/// Polls one completion and keeps the buffer it hands back in `slot`, to post again.
#[unsafe(no_mangle)]
#[inline(never)]
fn measured_poll_keep(cq: &mut CompletionQueue, slot: &mut Option<Buf>) -> usize {
    cq.poll_each(4, |mut completion: Completion| {
        if completion.is_success() {
            *slot = completion.take_buf();
        }
    })
    .unwrap_or(0)
}

/// Polls one completion and drops it, which returns its buffer to the pool.
#[unsafe(no_mangle)]
#[inline(never)]
fn measured_poll_owned(cq: &mut CompletionQueue) -> usize {
    cq.poll_each(4, |completion: Completion| drop(completion))
        .unwrap_or(0)
}

#[unsafe(no_mangle)]
#[inline(never)]
fn measured_post_recv_slot(
    qp: &mut QueuePair<Rc, Rts>,
    ring: &mut SlotRing,
    slot: Slot,
) -> rdma_verbs::Result<()> {
    qp.post_recv_slot(ring, RecvRequest::new(slot))
        .map_err(rdma_verbs::Error::from)
}

#[unsafe(no_mangle)]
#[inline(never)]
fn measured_post_send_slot(
    qp: &mut QueuePair<Rc, Rts>,
    ring: &mut SlotRing,
    slot: Slot,
) -> rdma_verbs::Result<()> {
    qp.post_send_slot(ring, SendRequest::send(slot))
        .map_err(rdma_verbs::Error::from)
}

/// Polls one completion and hands it to its slot ring, which hands its slot back.
#[unsafe(no_mangle)]
#[inline(never)]
fn measured_poll_slot(
    cq: &mut CompletionQueue,
    ring: &mut SlotRing,
    wcs: &mut [WorkCompletion],
) -> Option<Slot> {
    let polled = cq.poll(wcs).ok()?;
    let (first, rest) = polled.split_first()?;
    if !rest.is_empty() {
        give_back(ring, rest);
    }
    ring.complete(first)
}

/// Hands `wcs` to `ring` and gives their slots back (one completion per poll is expected: the
/// benchmark waits for each before polling).
#[cold]
#[inline(never)]
fn give_back(ring: &mut SlotRing, wcs: &[WorkCompletion]) {
    for wc in wcs {
        if let Some(slot) = ring.complete(wc) {
            let _ = ring.put(slot);
        }
    }
}
