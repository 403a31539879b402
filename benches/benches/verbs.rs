//! Criterion benches of rdma-verbs on a device: round-trip latency of SEND/RECV, RDMA WRITE
//! (each side polling the last byte of its region, as `ib_write_lat` does), RDMA READ and
//! fetch-and-add at 2, 64, 1024 and 4096 bytes (8 for the atomic), inline up to 64 bytes; the
//! 64-byte send message rate posted one by one and in doorbell-batched lists of 8 and 32 with
//! one signaled request per batch; and the post+poll round of the instruction counts. Each
//! runs on the `unsafe` calls and on the owned-buffer (safe) path; the send latency also on
//! slot rings (safe).
//!
//! All run in one process on two RC queue pairs connected to each other (`loopback`), so one
//! iteration is a whole round trip (perftest's latency tables print half of it for send and
//! write). Every request's completion is polled inside its iteration, its status and opcode
//! checked; after each bench the bytes that crossed the wire are compared with what was sent,
//! and the atomic's counter with the number of adds made. A failure ends the program with
//! status 1 and one line saying why.
//!
//! `cargo bench -p rdma-benches` runs them on the host's device; on a host without one,
//! `cargo xtask bench` runs them in the Soft-RoCE VM (see `docs/benchmarks.md`).

use std::time::Instant;

use criterion::measurement::WallTime;
use criterion::{
    BenchmarkGroup, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main,
};
use rdma_benches::loopback::{self, Loopback, Patience, Shape, spin};
use rdma_verbs::{
    CompletionQueue, MemoryRegion, QueuePair,
    cq::{WcOpcode, WorkCompletion},
    mr::AccessFlags,
    owned::{Buf, BufferPool, Completion, OwnedRecvList, OwnedSendList},
    qp::{Rc, Rts},
    slot::{Slot, SlotRing},
    wr::{Payload, RecvList, RecvRequest, SendList, SendRequest},
};

/// Message sizes of the latency benches.
const SIZES: [usize; 4] = [2, 64, 1024, 4096];
/// Requests up to this size go inline.
const INLINE: usize = 64;
/// Messages per iteration of the message-rate bench.
const BATCH: usize = 32;
/// Post-list lengths of the message-rate bench.
const POST_LISTS: [usize; 3] = [1, 8, 32];
/// Each region: what `a` sends in its first half, what comes back lands in its second half.
const REGION: usize = 2 * 4096;
/// Where the bytes coming back to `a` land.
const BACK: usize = REGION / 2;

fn die(what: &str) -> ! {
    eprintln!("verbs bench: {what}");
    std::process::exit(1)
}

fn ok<T, E: std::fmt::Display>(result: Result<T, E>) -> T {
    result.unwrap_or_else(|e| die(&e.to_string()))
}

/// Runs one benchmark of `group`, `routine` being one iteration. Returns whether criterion
/// ran it: it does not when listing or when a filter leaves the benchmark out, and the data
/// checks after a benchmark apply only if it did.
fn run(
    group: &mut BenchmarkGroup<'_, WallTime>,
    id: BenchmarkId,
    mut routine: impl FnMut(),
) -> bool {
    let mut ran = false;
    group.bench_function(id, |iter| {
        ran = true;
        iter.iter(&mut routine);
    });
    ran
}

/// A free buffer of `pool`; a bench whose pool runs dry is a broken bench.
fn take(pool: &BufferPool) -> Buf {
    pool.take()
        .unwrap_or_else(|| die("the buffer pool is empty"))
}

/// The bytes `a` sends: never 0, so that they differ from the zeroed places they go to.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8 + 1).collect()
}

/// A connected pair with a region per side: `a`'s first half holds [`pattern`], everything
/// else is zero. Every request a bench posts completes within its iteration, except receives
/// kept posted between iterations, which [`finish`](Self::finish) ends; so the `unsafe` posts'
/// contract holds when Rust writes `a`'s source bytes between iterations (the write bench) and
/// reads the regions after `finish`.
struct Bench {
    lb: Loopback,
    mr_a: MemoryRegion,
    mr_b: MemoryRegion,
    wcs: [WorkCompletion; 16],
}

impl Bench {
    fn open() -> Self {
        let lb = ok(Loopback::open(Shape {
            depth: 2 * BATCH as u32,
            max_inline_data: INLINE as u32,
            ..Shape::default()
        }));
        let pd = lb.a.pd().clone();
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let (mut mr_a, mut mr_b) = (
            ok(pd.register(REGION, access)),
            ok(pd.register(REGION, access)),
        );
        ok(mr_a.write_at(0, &pattern(BACK)));
        ok(mr_a.write_at(BACK, &[0; REGION - BACK]));
        ok(mr_b.write_at(0, &[0; REGION]));
        Self {
            lb,
            mr_a,
            mr_b,
            wcs: [WorkCompletion::default(); 16],
        }
    }

    /// Destroys the queue pairs, which ends every request still posted, and returns the
    /// regions (`a`'s, `b`'s) for the checks.
    fn finish(self) -> (MemoryRegion, MemoryRegion) {
        drop(self.lb);
        (self.mr_a, self.mr_b)
    }
}

/// Fails unless `mr` holds `want` at `at` (when the benchmark `ran`).
fn check(ran: bool, mr: &MemoryRegion, at: usize, want: &[u8], what: &str) {
    if !ran {
        return;
    }
    let mut got = vec![0u8; want.len()];
    ok(mr.read_at(at, &mut got));
    if got != want {
        die(&format!("{what}: the bytes differ from those sent"));
    }
}

fn send_latency(c: &mut Criterion) {
    let mut group = c.benchmark_group("latency/send");
    for size in SIZES {
        let mut bench = Bench::open();
        let inline_bytes = pattern(size);
        let Bench {
            lb,
            mr_a,
            mr_b,
            wcs,
        } = &mut bench;
        let Loopback {
            a, b, cq_a, cq_b, ..
        } = lb;
        let payload = if size <= INLINE {
            Payload::Inline(&inline_bytes)
        } else {
            ok(mr_a.slice(..size)).into()
        };
        let into_a = ok(mr_a.slice(BACK..BACK + size));
        let at_b = ok(mr_b.slice(..size));
        // SAFETY: see `Bench` (for every post of this bench); `b` posts its next receive only
        // after its answer, which reads the same bytes, completed.
        ok(unsafe { b.post_recv_one(&RecvRequest::new(at_b).tag(1)) });
        // SAFETY: as above.
        ok(unsafe { a.post_recv_one(&RecvRequest::new(into_a).tag(2)) });
        let ran = run(&mut group, BenchmarkId::new("unsafe", size), || {
            // SAFETY: as above.
            ok(unsafe { a.post_send_one(&SendRequest::send(payload).tag(3)) });
            ok(spin(cq_b, 1, &[WcOpcode::Recv], wcs));
            // `b` answers with what it received.
            // SAFETY: as above.
            ok(unsafe { b.post_send_one(&SendRequest::send(at_b).tag(4)) });
            ok(spin(cq_a, 2, &[WcOpcode::Send, WcOpcode::Recv], wcs));
            // SAFETY: as above.
            ok(unsafe { a.post_recv_one(&RecvRequest::new(into_a).tag(2)) });
            ok(spin(cq_b, 1, &[WcOpcode::Send], wcs));
            // SAFETY: as above.
            ok(unsafe { b.post_recv_one(&RecvRequest::new(at_b).tag(1)) });
        });
        let (mr_a, mr_b) = bench.finish();
        let what = format!("latency/send/unsafe/{size}");
        check(ran, &mr_b, 0, &pattern(size), &what);
        check(ran, &mr_a, BACK, &pattern(size), &what);
    }
    for size in SIZES {
        let mut lb = ok(Loopback::open(Shape {
            depth: 4,
            max_inline_data: INLINE as u32,
            ..Shape::default()
        }));
        let pd = lb.a.pd().clone();
        let pool = ok(BufferPool::new(&pd, 8, size));
        let message = pattern(size);
        let Loopback {
            a, b, cq_a, cq_b, ..
        } = &mut lb;
        ok(b.post_recv_buf(take(&pool), 1));
        ok(a.post_recv_buf(take(&pool), 2));
        // The last buffer `a` received back, kept for the check (the one before goes back to
        // the pool when this one replaces it).
        let mut echoed = None;
        let ran = run(&mut group, BenchmarkId::new("owned", size), || {
            if size <= INLINE {
                ok(a.post_send_owned(SendRequest::send(&message).tag(3)));
            } else {
                let mut out = take(&pool);
                ok(out.fill_from(&message));
                ok(a.post_send_owned(SendRequest::send(out).tag(3)));
            }
            let mut received = None;
            ok(spin_owned(cq_b, 1, SEND_RECV, |op, buf| {
                if op == WcOpcode::Recv {
                    received = Some(buf);
                }
            }));
            ok(b.post_recv_buf(take(&pool), 1));
            // `b` answers with the buffer it received.
            let back = received.unwrap_or_else(|| die("no buffer received"));
            ok(b.post_send_owned(SendRequest::send(back).tag(4)));
            ok(spin_owned(cq_a, 2, SEND_RECV, |op, buf| {
                if op == WcOpcode::Recv {
                    echoed = Some(buf);
                }
            }));
            ok(a.post_recv_buf(take(&pool), 2));
            ok(spin_owned(cq_b, 1, SEND_RECV, |_, _| {}));
        });
        if ran && echoed.as_deref() != Some(&message[..]) {
            die(&format!(
                "latency/send/owned/{size}: the bytes echoed differ from those sent"
            ));
        }
    }
    for size in SIZES {
        let mut lb = ok(Loopback::open(Shape {
            depth: 4,
            max_inline_data: INLINE as u32,
            ..Shape::default()
        }));
        let message = pattern(size);
        let Loopback {
            a, b, cq_a, cq_b, ..
        } = &mut lb;
        let (mut ring_a, mut ring_b) = (ok(a.slot_ring(4, size)), ok(b.slot_ring(4, size)));
        let mut wcs = [WorkCompletion::default(); 4];
        post_recv_next(b, &mut ring_b);
        post_recv_next(a, &mut ring_a);
        // The last slot `a` received back, kept for the check.
        let mut echoed: Option<Slot> = None;
        let ran = run(&mut group, BenchmarkId::new("slot", size), || {
            let mut out = take_slot(&mut ring_a);
            ok(ring_a.fill(&mut out, &message));
            ok(a.post_send_slot(&mut ring_a, SendRequest::send(out)));
            let mut received = None;
            ok(spin_slot(
                cq_b,
                &mut ring_b,
                1,
                &mut wcs,
                |ring, op, slot| {
                    if op == WcOpcode::Recv {
                        received = Some(slot);
                    } else {
                        ok(ring.put(slot));
                    }
                },
            ));
            post_recv_next(b, &mut ring_b);
            // `b` answers with the slot it received.
            let back = received.unwrap_or_else(|| die("no slot received"));
            ok(b.post_send_slot(&mut ring_b, SendRequest::send(back)));
            ok(spin_slot(
                cq_a,
                &mut ring_a,
                2,
                &mut wcs,
                |ring, op, slot| {
                    if op == WcOpcode::Recv {
                        if let Some(old) = echoed.replace(slot) {
                            ok(ring.put(old));
                        }
                    } else {
                        ok(ring.put(slot));
                    }
                },
            ));
            post_recv_next(a, &mut ring_a);
            ok(spin_slot(
                cq_b,
                &mut ring_b,
                1,
                &mut wcs,
                |ring, _, slot| {
                    ok(ring.put(slot));
                },
            ));
        });
        let echoed = echoed.as_ref().map(|slot| ok(ring_a.bytes(slot)));
        if ran && echoed != Some(&message[..]) {
            die(&format!(
                "latency/send/slot/{size}: the bytes echoed differ from those sent"
            ));
        }
    }
    group.finish();
}

/// Posts a free slot of `ring` as a receive of `qp`.
fn post_recv_next(qp: &mut QueuePair<Rc, Rts>, ring: &mut SlotRing) {
    let slot = take_slot(ring);
    ok(qp.post_recv_slot(ring, RecvRequest::new(slot)));
}

/// A free slot of `ring` (every bench gives each slot back before it needs another).
fn take_slot(ring: &mut SlotRing) -> Slot {
    ring.take().unwrap_or_else(|| die("the slot ring is empty"))
}

/// Polls `cq` until `want` completions arrived, each successful, one of a SEND and a receive,
/// and a request of `ring`, handing each one's slot to `keep` with its opcode; busy, and
/// bounded as [`spin`].
fn spin_slot(
    cq: &mut CompletionQueue,
    ring: &mut SlotRing,
    want: usize,
    wcs: &mut [WorkCompletion],
    mut keep: impl FnMut(&mut SlotRing, WcOpcode, Slot),
) -> Result<(), String> {
    let mut got = 0;
    let mut patience = Patience::default();
    while got < want {
        let polled = cq.poll(&mut wcs[..want - got]).map_err(|e| e.to_string())?;
        for wc in polled.iter() {
            let op = wc.opcode();
            if !wc.is_success() || !SEND_RECV.contains(&op) {
                return Err(format!("completion {}: {:?} {op:?}", got + 1, wc.status()));
            }
            let slot = ring
                .complete(wc)
                .ok_or_else(|| format!("completion {} is none of the ring's", got + 1))?;
            keep(ring, op, slot);
            got += 1;
        }
        patience.after_poll(polled.len(), got, want)?;
    }
    Ok(())
}

/// The opcodes of a send-and-receive exchange.
const SEND_RECV: &[WcOpcode] = &[WcOpcode::Send, WcOpcode::Recv];

/// Polls owned completions of `cq` until `want` arrived, each successful and one of
/// `opcodes`, handing each one's buffer to `keep` with its opcode (a buffer `keep` drops goes
/// back to its pool); busy, and bounded as [`spin`].
fn spin_owned(
    cq: &mut CompletionQueue,
    want: usize,
    opcodes: &[WcOpcode],
    mut keep: impl FnMut(WcOpcode, Buf),
) -> Result<(), String> {
    let mut got = 0;
    let mut failed = None;
    let mut patience = Patience::default();
    while got < want {
        let polled = cq
            .poll_each(want - got, |mut completion: Completion| {
                let op = completion.wc().opcode();
                if !completion.is_success() || !opcodes.contains(&op) {
                    failed = Some(format!("{:?} {op:?}", completion.status()));
                }
                if let Some(buf) = completion.take_buf() {
                    keep(op, buf);
                }
            })
            .map_err(|e| e.to_string())?;
        if let Some(failed) = failed.take() {
            return Err(format!("completion {} of {want}: {failed}", got + 1));
        }
        got += polled;
        patience.after_poll(polled, got, want)?;
    }
    Ok(())
}

fn write_latency(c: &mut Criterion) {
    let mut group = c.benchmark_group("latency/write");
    for size in SIZES {
        let mut bench = Bench::open();
        let Bench {
            lb,
            mr_a,
            mr_b,
            wcs,
        } = &mut bench;
        let Loopback {
            a, b, cq_a, cq_b, ..
        } = lb;
        let to_b = ok(ok(mr_b.remote(..)).slice(0, size as u32));
        let to_a = ok(ok(mr_a.remote(..)).slice(BACK as u32, size as u32));
        let mut bytes = pattern(size);
        let mut seq = 0u8;
        let ran = run(&mut group, BenchmarkId::new("unsafe", size), || {
            // Never 0, and never the previous value: each side waits for a new last byte.
            seq = seq % 250 + 1;
            bytes[size - 1] = seq;
            let payload = if size <= INLINE {
                Payload::Inline(&bytes)
            } else {
                // No request reads these bytes now (see `Bench`).
                ok(mr_a.write_at(size - 1, &[seq]));
                ok(mr_a.slice(..size)).into()
            };
            // SAFETY: see `Bench`.
            ok(unsafe { a.post_send_one(&SendRequest::write(payload, to_b).tag(1)) });
            wait_byte(mr_b, size - 1, seq);
            let back = ok(mr_b.slice(..size));
            // SAFETY: see `Bench`; `a` writes these bytes again only in the next
            // iteration, after this write completed.
            ok(unsafe { b.post_send_one(&SendRequest::write(back, to_a).tag(2)) });
            wait_byte(mr_a, BACK + size - 1, seq);
            ok(spin(cq_a, 1, &[WcOpcode::RdmaWrite], wcs));
            ok(spin(cq_b, 1, &[WcOpcode::RdmaWrite], wcs));
        });
        let (mr_a, _) = bench.finish();
        let mut want = pattern(size);
        want[size - 1] = seq;
        check(
            ran,
            &mr_a,
            BACK,
            &want,
            &format!("latency/write/unsafe/{size}"),
        );
    }
    for size in SIZES {
        let mut bench = Bench::open();
        let pd = bench.lb.a.pd().clone();
        let pool = ok(BufferPool::new(&pd, 4, size));
        let Bench {
            lb,
            mr_a,
            mr_b,
            wcs: _,
        } = &mut bench;
        let Loopback {
            a, b, cq_a, cq_b, ..
        } = lb;
        let to_b = ok(ok(mr_b.remote(..)).slice(0, size as u32));
        let to_a = ok(ok(mr_a.remote(..)).slice(BACK as u32, size as u32));
        let mut bytes = pattern(size);
        let mut seq = 0u8;
        let ran = run(&mut group, BenchmarkId::new("owned", size), || {
            seq = seq % 250 + 1;
            bytes[size - 1] = seq;
            let write = if size <= INLINE {
                SendRequest::write(&bytes, to_b)
            } else {
                let mut out = take(&pool);
                ok(out.fill_from(&bytes));
                SendRequest::write(out, to_b)
            };
            ok(a.post_send_owned(write.tag(1)));
            wait_byte(mr_b, size - 1, seq);
            // `b` answers with the bytes that arrived, copied out of its region into a
            // buffer (its region is not a pool's: an owned post cannot send from it).
            let mut back = take(&pool);
            ok(mr_b.read_at(0, &mut back));
            ok(b.post_send_owned(SendRequest::write(back, to_a).tag(2)));
            wait_byte(mr_a, BACK + size - 1, seq);
            ok(spin_owned(cq_a, 1, &[WcOpcode::RdmaWrite], |_, _| {}));
            ok(spin_owned(cq_b, 1, &[WcOpcode::RdmaWrite], |_, _| {}));
        });
        let (mr_a, _) = bench.finish();
        let mut want = pattern(size);
        want[size - 1] = seq;
        check(
            ran,
            &mr_a,
            BACK,
            &want,
            &format!("latency/write/owned/{size}"),
        );
    }
    group.finish();
}

/// Spins until byte `at` of `mr` (which the other queue pair writes) is `value`; bounded as
/// [`spin`].
fn wait_byte(mr: &MemoryRegion, at: usize, value: u8) {
    let mut byte = [0u8];
    let mut spins = 0u32;
    let mut since: Option<Instant> = None;
    loop {
        ok(mr.read_at(at, &mut byte));
        if byte[0] == value {
            return;
        }
        spins = spins.wrapping_add(1);
        if spins % 4096 == 0 && since.get_or_insert_with(Instant::now).elapsed() > loopback::WAIT {
            die(&format!("byte {at} never became {value}"));
        }
    }
}

fn read_latency(c: &mut Criterion) {
    let mut group = c.benchmark_group("latency/read");
    for size in SIZES {
        let mut bench = Bench::open();
        ok(bench.mr_b.write_at(0, &pattern(size)));
        let Bench {
            lb,
            mr_a,
            mr_b,
            wcs,
        } = &mut bench;
        let from_b = ok(ok(mr_b.remote(..)).slice(0, size as u32));
        let into_a = ok(mr_a.slice(BACK..BACK + size));
        let ran = run(&mut group, BenchmarkId::new("unsafe", size), || {
            // SAFETY: see `Bench`.
            ok(unsafe {
                lb.a.post_send_one(&SendRequest::read(into_a, from_b).tag(1))
            });
            ok(spin(&mut lb.cq_a, 1, &[WcOpcode::RdmaRead], wcs));
        });
        let (mr_a, _) = bench.finish();
        check(
            ran,
            &mr_a,
            BACK,
            &pattern(size),
            &format!("latency/read/unsafe/{size}"),
        );
    }
    for size in SIZES {
        let mut bench = Bench::open();
        ok(bench.mr_b.write_at(0, &pattern(size)));
        let pd = bench.lb.a.pd().clone();
        let pool = ok(BufferPool::new(&pd, 4, size));
        let from_b = ok(ok(bench.mr_b.remote(..)).slice(0, size as u32));
        let lb = &mut bench.lb;
        // The last buffer read into, kept for the check.
        let mut last = None;
        let ran = run(&mut group, BenchmarkId::new("owned", size), || {
            let target = take(&pool);
            ok(lb
                .a
                .post_send_owned(SendRequest::read(target, from_b).tag(1)));
            ok(spin_owned(
                &mut lb.cq_a,
                1,
                &[WcOpcode::RdmaRead],
                |_, buf| last = Some(buf),
            ));
        });
        if ran && last.as_deref() != Some(&pattern(size)[..]) {
            die(&format!(
                "latency/read/owned/{size}: the bytes read differ from the source"
            ));
        }
    }
    group.finish();
}

fn atomic_latency(c: &mut Criterion) {
    let mut group = c.benchmark_group("latency/fetch_add");
    let mut bench = Bench::open();
    let Bench {
        lb,
        mr_a,
        mr_b,
        wcs,
    } = &mut bench;
    let counter = ok(ok(mr_b.remote(..)).slice(0, 8));
    let old = ok(mr_a.slice(REGION - 8..));
    let mut adds = 0u64;
    let ran = run(&mut group, BenchmarkId::new("unsafe", 8), || {
        let add = SendRequest::fetch_add(old, counter, 1).tag(1);
        // SAFETY: see `Bench`.
        ok(unsafe { lb.a.post_send_one(&add) });
        ok(spin(&mut lb.cq_a, 1, &[WcOpcode::FetchAdd], wcs));
        adds += 1;
    });
    let (mr_a, mr_b) = bench.finish();
    let (value, last_old) = (ok(mr_b.load_u64(0)), ok(mr_a.load_u64(REGION - 8)));
    check_adds(ran, "unsafe", adds, value, last_old);

    let mut bench = Bench::open();
    let pd = bench.lb.a.pd().clone();
    let pool = ok(BufferPool::new(&pd, 4, 8));
    let counter = ok(ok(bench.mr_b.remote(..)).slice(0, 8));
    let lb = &mut bench.lb;
    let mut adds = 0u64;
    let mut last_old = None;
    let ran = run(&mut group, BenchmarkId::new("owned", 8), || {
        let result = take(&pool);
        ok(lb
            .a
            .post_send_owned(SendRequest::fetch_add(result, counter, 1).tag(1)));
        ok(spin_owned(
            &mut lb.cq_a,
            1,
            &[WcOpcode::FetchAdd],
            |_, buf| last_old = Some(buf),
        ));
        adds += 1;
    });
    group.finish();
    let (_, mr_b) = bench.finish();
    let value = ok(mr_b.load_u64(0));
    // rxe writes the old value in host byte order.
    let last_old = last_old
        .and_then(|buf| buf.get(..8).and_then(|b| b.try_into().ok()))
        .map_or(u64::MAX, u64::from_ne_bytes);
    check_adds(ran, "owned", adds, value, last_old);
}

/// Fails unless, after `adds` fetch-and-adds of 1 from 0, the counter is `adds` and the last
/// old value `adds - 1` (when the benchmark `ran`).
fn check_adds(ran: bool, path: &str, adds: u64, value: u64, last_old: u64) {
    if ran && (adds == 0 || value != adds || last_old != adds - 1) {
        die(&format!(
            "latency/fetch_add/{path}: after {adds} adds the counter is {value} and the last \
             old value {last_old}"
        ));
    }
}

fn message_rate(c: &mut Criterion) {
    let mut group = c.benchmark_group("message_rate/send_64");
    group.throughput(Throughput::Elements(BATCH as u64));
    for post_list in POST_LISTS {
        let mut bench = Bench::open();
        let Bench {
            lb,
            mr_a,
            mr_b,
            wcs,
        } = &mut bench;
        let Loopback {
            a, b, cq_a, cq_b, ..
        } = lb;
        let message = ok(mr_a.slice(..64));
        let slots: Vec<_> = (0..BATCH)
            .map(|k| ok(mr_b.slice(k * 64..(k + 1) * 64)))
            .collect();
        let mut sends = SendList::with_capacity(post_list);
        let mut recvs = RecvList::with_capacity(BATCH);
        let ran = run(&mut group, BenchmarkId::new("unsafe", post_list), || {
            recvs.clear();
            for (k, slot) in slots.iter().enumerate() {
                ok(recvs.push(RecvRequest::new(*slot).tag(k as u64)));
            }
            // SAFETY: see `Bench`: all receives are polled below.
            ok(unsafe { b.post_recv(&mut recvs) });
            for first in (0..BATCH).step_by(post_list) {
                sends.clear();
                for k in first..first + post_list {
                    let request = SendRequest::send(message).tag(k as u64);
                    // One completion per iteration: the last request's, which comes after
                    // the others' (a send queue completes in order).
                    ok(sends.push(if k == BATCH - 1 {
                        request
                    } else {
                        request.unsignaled()
                    }));
                }
                // SAFETY: see `Bench`: the last send's completion, polled below, ends
                // every send of the iteration.
                ok(unsafe { a.post_send(&mut sends) });
            }
            ok(spin(cq_a, 1, &[WcOpcode::Send], wcs));
            ok(spin(cq_b, BATCH, &[WcOpcode::Recv], wcs));
        });
        drop(slots);
        let (_, mr_b) = bench.finish();
        for k in 0..BATCH {
            check(
                ran,
                &mr_b,
                k * 64,
                &pattern(64),
                &format!("message_rate/send_64/unsafe/{post_list} slot {k}"),
            );
        }
    }
    for post_list in POST_LISTS {
        let mut lb = ok(Loopback::open(Shape {
            depth: 2 * BATCH as u32,
            max_inline_data: 0,
            ..Shape::default()
        }));
        let pd = lb.a.pd().clone();
        let (send_pool, recv_pool) = (
            ok(BufferPool::new(&pd, 2 * BATCH, 64)),
            ok(BufferPool::new(&pd, 2 * BATCH, 64)),
        );
        let message = pattern(64);
        let Loopback {
            a, b, cq_a, cq_b, ..
        } = &mut lb;
        let mut sends = OwnedSendList::with_capacity(post_list);
        let mut recvs = OwnedRecvList::with_capacity(BATCH);
        // The buffers of the last batch received, kept for the check (each replaced one goes
        // back to the pool).
        let mut received: [Option<Buf>; BATCH] = std::array::from_fn(|_| None);
        let mut count = 0usize;
        let ran = run(&mut group, BenchmarkId::new("owned", post_list), || {
            for k in 0..BATCH {
                let buf = take(&recv_pool);
                ok(recvs
                    .push(buf, k as u64)
                    .map_err(|refused| refused.into_parts().0));
            }
            ok(b.post_recv_list(&mut recvs));
            for first in (0..BATCH).step_by(post_list) {
                for k in first..first + post_list {
                    let mut out = take(&send_pool);
                    ok(out.fill_from(&message));
                    let request = SendRequest::send(out).tag(k as u64);
                    // One completion per iteration, as in the `unsafe` bench; it also
                    // returns the unsignaled requests' buffers.
                    let request = if k == BATCH - 1 {
                        request
                    } else {
                        request.unsignaled()
                    };
                    ok(sends
                        .push(request)
                        .map_err(|refused| refused.into_parts().0));
                }
                ok(a.post_send_list(&mut sends));
            }
            ok(spin_owned(cq_a, 1, &[WcOpcode::Send], |_, _| {}));
            ok(spin_owned(cq_b, BATCH, &[WcOpcode::Recv], |_, buf| {
                received[count % BATCH] = Some(buf);
                count += 1;
            }));
        });
        for (k, buf) in received.iter().enumerate() {
            if ran && buf.as_deref() != Some(&message[..]) {
                die(&format!(
                    "message_rate/send_64/owned/{post_list}: received buffer {k} \
                     differs from the message"
                ));
            }
        }
    }
    group.finish();
}

/// The instruction counts' round, busy-polled: post a receive, post a 64-byte signaled SEND,
/// poll both completions.
fn post_poll(c: &mut Criterion) {
    let mut group = c.benchmark_group("post_poll/send_64");
    let mut bench = Bench::open();
    let Bench {
        lb,
        mr_a,
        mr_b,
        wcs,
    } = &mut bench;
    let Loopback {
        a, b, cq_a, cq_b, ..
    } = lb;
    let ran = run(&mut group, BenchmarkId::from_parameter("unsafe"), || {
        // SAFETY: see `Bench`.
        ok(unsafe { b.post_recv_one(&RecvRequest::new(ok(mr_b.slice(..64))).tag(1)) });
        let send = SendRequest::send(ok(mr_a.slice(..64))).tag(2);
        // SAFETY: see `Bench`.
        ok(unsafe { a.post_send_one(&send) });
        ok(spin(cq_a, 1, &[WcOpcode::Send], wcs));
        ok(spin(cq_b, 1, &[WcOpcode::Recv], wcs));
    });
    let (_, mr_b) = bench.finish();
    check(ran, &mr_b, 0, &pattern(64), "post_poll/send_64/unsafe");

    let mut lb = ok(Loopback::open(Shape::default()));
    let pd = lb.a.pd().clone();
    let pool = ok(BufferPool::new(&pd, 4, 64));
    let message = pattern(64);
    let Loopback {
        a, b, cq_a, cq_b, ..
    } = &mut lb;
    let mut received = None;
    let ran = run(&mut group, BenchmarkId::from_parameter("owned"), || {
        ok(b.post_recv_buf(take(&pool), 1));
        let mut out = take(&pool);
        ok(out.fill_from(&message));
        ok(a.post_send_owned(SendRequest::send(out).tag(2)));
        ok(spin_owned(cq_a, 1, &[WcOpcode::Send], |_, _| {}));
        ok(spin_owned(cq_b, 1, &[WcOpcode::Recv], |_, buf| {
            received = Some(buf)
        }));
    });
    group.finish();
    if ran && received.as_deref() != Some(&message[..]) {
        die("post_poll/send_64/owned: the bytes received differ from those sent");
    }
}

criterion_group!(
    benches,
    send_latency,
    write_latency,
    read_latency,
    atomic_latency,
    message_rate,
    post_poll
);
criterion_main!(benches);
