//! The data path allocates nothing: a counting global allocator watches 10,000 rounds of
//! reusing post lists, posting a receive and a send, and polling both completions.
//!
//! Only allocations made through Rust's global allocator on the test's own thread are counted
//! (libtest's other threads allocate at any time); memory libibverbs and its provider take with
//! `malloc` is not seen here.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use rdma_test_support::verbs::*;
use rdma_verbs::{ah::*, cq::*, mr::*, owned::*, qp::*, wr::*};

/// The system allocator, counting the allocations of threads that asked to be counted.
struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    // Const-initialised and without a destructor: reading it never allocates, so the allocator
    // may use it.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn record() {
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so `System`'s
// guarantees hold; counting touches no allocated memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record();
        // SAFETY: forwarded caller contract (`layout` has a non-zero size).
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        record();
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        record();
        // SAFETY: forwarded caller contract: `ptr` came from this allocator (that is, from
        // `System`) with `layout`, and `new_size` is valid for it.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded caller contract: `ptr` came from `System` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Counts the allocations `f` makes on this thread.
fn count_allocations<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    COUNTING.with(|c| c.set(true));
    let result = f();
    COUNTING.with(|c| c.set(false));
    (result, ALLOCATIONS.load(Ordering::Relaxed) - before)
}

const ROUNDS: u64 = 10_000;
const LEN: usize = 64;

#[test]
fn no_alloc_post_and_poll_round_trips() {
    // The counter sees this thread's allocations (else a zero below would prove nothing).
    let (boxed, allocations) = count_allocations(|| std::hint::black_box(Box::new(7u64)));
    assert_eq!((*boxed, allocations), (7, 1));

    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let mut src = f.pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = f.pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let data = pattern(LEN, 5);
    src.as_mut_slice().unwrap()[..LEN].copy_from_slice(&data);
    let src_slice = src.slice(..LEN).unwrap();
    let dst_slice = dst.slice(..LEN).unwrap();
    let mut sends = SendList::with_capacity(4);
    let mut recvs = RecvList::with_capacity(4);
    let mut completions = [WorkCompletion::default(); 4];

    let ((), allocations) = count_allocations(|| {
        for round in 0..ROUNDS {
            // Alternate the two ways of emptying a list; neither may allocate.
            if round % 2 == 0 {
                sends.clear();
                recvs.clear();
            } else {
                sends = sends.reuse();
                recvs = recvs.reuse();
            }
            recvs.push(RecvRequest::new(dst_slice).tag(round)).unwrap();
            // SAFETY: `dst` lives until after the loop, which polls this receive's completion
            // before the next round, and is not touched meanwhile.
            unsafe { b.post_recv(&mut recvs) }.unwrap();
            sends.push(SendRequest::send(src_slice).tag(round)).unwrap();
            // SAFETY: `src` lives until after the loop and is only read; the send's completion
            // is polled before the next round.
            unsafe { a.post_send(&mut sends) }.unwrap();

            let (mut sent, mut received) = (false, false);
            let deadline = Instant::now() + WAIT;
            while !(sent && received) {
                for wc in cq_a.poll(&mut completions).unwrap() {
                    assert!(wc.is_success(), "round {round}: {wc:?}");
                    assert_eq!((wc.wr_id(), wc.opcode()), (round, WcOpcode::Send), "{wc:?}");
                    sent = true;
                }
                for wc in cq_b.poll(&mut completions).unwrap() {
                    assert!(wc.is_success(), "round {round}: {wc:?}");
                    assert_eq!(
                        (wc.wr_id(), wc.opcode(), wc.byte_len()),
                        (round, WcOpcode::Recv, LEN as u32),
                        "{wc:?}"
                    );
                    received = true;
                }
                assert!(
                    Instant::now() < deadline,
                    "round {round}: timed out (sent: {sent}, received: {received})"
                );
            }
        }
    });

    assert_eq!(
        allocations, 0,
        "{allocations} allocations in {ROUNDS} post/poll rounds"
    );
    assert_eq!(&dst.as_slice().unwrap()[..LEN], &data[..]);
}

/// The same rounds through the extended API (`ibv_wr_*`): a list with a send from registered
/// memory, and a single inline send, each translated into builder calls without allocating.
#[test]
fn extended_no_alloc_post_and_poll_round_trips() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a)
            .send_path(SendPath::Extended)
            .max_inline_data(LEN as u32),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    assert!(a.uses_extended_post());
    let mut src = f.pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = f.pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let data = pattern(LEN, 9);
    src.as_mut_slice().unwrap()[..LEN].copy_from_slice(&data);
    let src_slice = src.slice(..LEN).unwrap();
    let dst_slice = dst.slice(..LEN).unwrap();
    let inline = pattern(LEN, 9);
    let mut sends = SendList::with_capacity(4);
    let mut completions = [WorkCompletion::default(); 4];

    let ((), allocations) = count_allocations(|| {
        for round in 0..ROUNDS {
            // SAFETY: `dst` lives until after the loop, which polls this receive's completion
            // before the next round, and is not touched meanwhile.
            unsafe { b.post_recv_one(&RecvRequest::new(dst_slice).tag(round)) }.unwrap();
            if round % 2 == 0 {
                sends.clear();
                sends.push(SendRequest::send(src_slice).tag(round)).unwrap();
                // SAFETY: `src` lives until after the loop and is only read; the send's
                // completion is polled before the next round.
                unsafe { a.post_send(&mut sends) }.unwrap();
            } else {
                let request = SendRequest::send(Payload::Inline(&inline)).tag(round);
                // SAFETY: inline data is copied by the post.
                unsafe { a.post_send_one(&request) }.unwrap();
            }

            let (mut sent, mut received) = (false, false);
            let deadline = Instant::now() + WAIT;
            while !(sent && received) {
                for wc in cq_a.poll(&mut completions).unwrap() {
                    assert!(wc.is_success(), "round {round}: {wc:?}");
                    assert_eq!((wc.wr_id(), wc.opcode()), (round, WcOpcode::Send), "{wc:?}");
                    sent = true;
                }
                for wc in cq_b.poll(&mut completions).unwrap() {
                    assert!(wc.is_success(), "round {round}: {wc:?}");
                    assert_eq!(
                        (wc.wr_id(), wc.opcode(), wc.byte_len()),
                        (round, WcOpcode::Recv, LEN as u32),
                        "{wc:?}"
                    );
                    received = true;
                }
                assert!(
                    Instant::now() < deadline,
                    "round {round}: timed out (sent: {sent}, received: {received})"
                );
            }
        }
    });

    assert_eq!(
        allocations, 0,
        "{allocations} allocations in {ROUNDS} extended post/poll rounds"
    );
    assert_eq!(&dst.as_slice().unwrap()[..LEN], &data[..]);
}

/// The owned-buffer path: 10,000 rounds of an owned receive and an owned send (with an
/// unsignaled one before it every other round), reaped with `poll_each`, the buffers going
/// round between the pools and the queue pairs.
#[test]
fn owned_no_alloc_post_and_poll_round_trips() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let tx = BufferPool::new(&f.pd, 4, LEN).unwrap();
    let rx = BufferPool::new(&f.pd, 4, LEN).unwrap();
    let data = pattern(LEN, 9);

    let ((), allocations) = count_allocations(|| {
        for round in 0..ROUNDS {
            b.post_recv_buf(rx.take().unwrap(), round).unwrap();
            if round % 2 == 1 {
                let mut early = tx.take().unwrap();
                early.fill_from(&data).unwrap();
                // It needs a receive of its own; its buffer returns to the pool when the
                // signaled send after it completes.
                b.post_recv_buf(rx.take().unwrap(), u64::MAX).unwrap();
                a.post_send_owned(SendRequest::send(early).unsignaled())
                    .unwrap();
            }
            let mut buf = tx.take().unwrap();
            buf.fill_from(&data).unwrap();
            a.post_send_owned(SendRequest::send(buf).tag(round))
                .unwrap();

            let (mut sent, mut received) = (0, 0);
            let want = if round % 2 == 1 { 2 } else { 1 };
            let deadline = Instant::now() + WAIT;
            while sent < 1 || received < want {
                cq_a.poll_each(4, |mut c| {
                    assert!(c.is_success(), "round {round}: {c:?}");
                    assert_eq!(c.tag(), Some(round));
                    drop(c.take_buf().expect("the send's buffer comes back"));
                    sent += 1;
                })
                .unwrap();
                cq_b.poll_each(4, |mut c| {
                    assert!(c.is_success(), "round {round}: {c:?}");
                    let buf = c.take_buf().expect("the receive's buffer comes back");
                    assert_eq!(&buf[..], &data[..], "round {round}");
                    received += 1;
                })
                .unwrap();
                assert!(
                    Instant::now() < deadline,
                    "round {round}: timed out (sent: {sent}, received: {received})"
                );
            }
            // Every buffer is back in its pool: nothing leaks from round to round.
            assert_eq!((tx.available(), rx.available()), (4, 4), "round {round}");
        }
    });
    assert_eq!(
        allocations, 0,
        "{allocations} allocations in {ROUNDS} owned post/poll rounds"
    );
}

/// Owned requests over the caller's own memory: 10,000 rounds of a receive scattered into a
/// pool buffer and a range of a shared region, a SEND gathered from a buffer and a range, and
/// an RDMA READ into a range, the regions' references going round with the requests.
#[test]
fn owned_no_alloc_range_round_trips() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a).max_send_sge(2),
        f.pd.qp_builder(&cq_b, &cq_b).max_recv_sge(2),
        AccessFlags::REMOTE_READ,
    );
    let headers = BufferPool::new(&f.pd, 4, 16).unwrap();
    let mut src =
        f.pd.register(2 * LEN, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
            .unwrap();
    src.write_at(0, &pattern(2 * LEN, 4)).unwrap();
    let src = Arc::new(src);
    let dst = Arc::new(
        f.pd.register(2 * LEN, AccessFlags::LOCAL_WRITE)
            .unwrap()
            .into_shared(),
    );
    let remote = src.remote(LEN..).unwrap();
    let mut got = vec![0u8; LEN];
    let expected = pattern(2 * LEN, 4);

    let ((), allocations) = count_allocations(|| {
        for round in 0..ROUNDS {
            let receive = RecvRequest::new(headers.take().unwrap())
                .and_range(RegionRange::new(&dst, ..LEN).unwrap())
                .tag(round);
            b.post_recv_owned(receive).unwrap();
            let mut header = headers.take().unwrap();
            header.fill_from(&[round as u8; 16]).unwrap();
            let send = SendRequest::send(header).and_range(RegionRange::new(&src, ..LEN).unwrap());
            a.post_send_owned(send.unsignaled()).unwrap();
            let read = SendRequest::read(RegionRange::new(&dst, LEN..).unwrap(), remote);
            a.post_send_owned(read.tag(round)).unwrap();

            let (mut sent, mut received) = (0, 0);
            let deadline = Instant::now() + WAIT;
            while sent < 1 || received < 1 {
                cq_a.poll_each(4, |c| {
                    assert!(c.is_success() && c.tag() == Some(round), "{round}: {c:?}");
                    sent += 1;
                })
                .unwrap();
                cq_b.poll_each(4, |mut c| {
                    assert!(c.is_success() && c.tag() == Some(round), "{round}: {c:?}");
                    assert_eq!(&c.take_buf().unwrap()[..], &[round as u8; 16]);
                    received += 1;
                })
                .unwrap();
                assert!(Instant::now() < deadline, "round {round}: timed out");
            }
            dst.read_at(0, &mut got).unwrap();
            assert_eq!(got, expected[..LEN], "round {round}: the scatter");
            dst.read_at(LEN, &mut got).unwrap();
            assert_eq!(got, expected[LEN..], "round {round}: the read");
            assert_eq!(headers.available(), 4, "round {round}");
            assert_eq!((Arc::strong_count(&src), Arc::strong_count(&dst)), (1, 1));
        }
    });
    assert_eq!(
        allocations, 0,
        "{allocations} allocations in {ROUNDS} owned range rounds"
    );
}

/// The owned path on UD (a send that keeps its address handle alive) and through an SRQ (a
/// receive found by id): 10,000 rounds of each, without allocating.
#[test]
fn owned_no_alloc_ud_and_srq_round_trips() {
    let Some(f) = fixture() else { return };
    const QKEY: u32 = 0x600d;
    // UD.
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let mut a = f.ud_qp(f.pd.qp_builder(&cq_a, &cq_a), QKEY);
    let mut b = f.ud_qp(f.pd.qp_builder(&cq_b, &cq_b), QKEY);
    let ah = f.pd.create_ah(&f.av()).unwrap();
    // SRQ behind an RC pair.
    let mut srq = f.pd.create_srq(8, 1).unwrap();
    let (mut cq_c, mut cq_d) = (f.cq(16), f.cq(16));
    let (mut c, _d) = f.rc_pair(
        f.pd.qp_builder(&cq_c, &cq_c),
        f.pd.qp_builder(&cq_d, &cq_d).srq(&srq),
        AccessFlags::empty(),
    );
    let pool = BufferPool::new(&f.pd, 8, GRH_LEN + LEN).unwrap();
    let data = pattern(LEN, 3);
    let b_num = b.qp_num();

    let wait = |cq: &mut CompletionQueue, round: u64, check: &mut dyn FnMut(Completion)| {
        let deadline = Instant::now() + WAIT;
        let mut seen = 0;
        while seen == 0 {
            seen += cq.poll_each(1, &mut *check).unwrap();
            assert!(Instant::now() < deadline, "round {round}: timed out");
        }
    };
    let ((), allocations) = count_allocations(|| {
        for round in 0..ROUNDS {
            b.post_recv_buf(pool.take().unwrap(), round).unwrap();
            let mut buf = pool.take().unwrap();
            buf.fill_from(&data).unwrap();
            a.post_send_owned(SendRequest::send(buf).to(&ah, b_num, QKEY))
                .unwrap();
            srq.post_recv_buf(pool.take().unwrap(), round).unwrap();
            let mut buf = pool.take().unwrap();
            buf.fill_from(&data).unwrap();
            c.post_send_owned(SendRequest::send(buf)).unwrap();
            let mut check = |c: Completion| assert!(c.is_success(), "round {round}: {c:?}");
            wait(&mut cq_a, round, &mut check);
            wait(&mut cq_c, round, &mut check);
            let mut check_data = |mut c: Completion| {
                assert!(c.is_success(), "round {round}: {c:?}");
                let buf = c.take_buf().unwrap();
                assert_eq!(&buf[buf.len() - LEN..], &data[..], "round {round}");
            };
            wait(&mut cq_b, round, &mut check_data);
            wait(&mut cq_d, round, &mut check_data);
            assert_eq!(pool.available(), 8, "round {round}");
        }
    });
    assert_eq!(
        allocations, 0,
        "{allocations} allocations in {ROUNDS} owned UD and SRQ rounds"
    );
}

/// Doorbell-batched owned posts: 10,000 rounds of a list of four receives and a list of four
/// sends (three unsignaled, the last signaled), the lists' storage reused every round.
#[test]
fn owned_no_alloc_list_round_trips() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let tx = BufferPool::new(&f.pd, 4, LEN).unwrap();
    let rx = BufferPool::new(&f.pd, 4, LEN).unwrap();
    let mut sends = OwnedSendList::with_capacity(4);
    let mut receives = OwnedRecvList::with_capacity(4);
    let data = pattern(LEN, 5);

    let ((), allocations) = count_allocations(|| {
        for round in 0..ROUNDS {
            for m in 0..4 {
                receives.push(rx.take().unwrap(), m).unwrap();
                let mut buf = tx.take().unwrap();
                buf.fill_from(&data).unwrap();
                let request = SendRequest::send(buf).tag(round);
                sends
                    .push(if m == 3 {
                        request
                    } else {
                        request.unsignaled()
                    })
                    .unwrap();
            }
            b.post_recv_list(&mut receives).unwrap();
            a.post_send_list(&mut sends).unwrap();
            let (mut sent, mut received) = (0, 0);
            let deadline = Instant::now() + WAIT;
            while sent < 1 || received < 4 {
                sent += cq_a
                    .poll_each(4, |c| assert!(c.is_success(), "round {round}: {c:?}"))
                    .unwrap();
                cq_b.poll_each(4, |mut c| {
                    assert_eq!(c.tag(), Some(received), "round {round}");
                    assert_eq!(&c.take_buf().unwrap()[..], &data[..], "round {round}");
                    received += 1;
                })
                .unwrap();
                assert!(Instant::now() < deadline, "round {round}: timed out");
            }
            assert_eq!((tx.available(), rx.available()), (4, 4), "round {round}");
        }
    });
    assert_eq!(
        allocations, 0,
        "{allocations} allocations in {ROUNDS} owned list rounds"
    );
}

/// Slot rings: 10,000 rounds of a receive and a send from each queue pair's own ring (with an
/// unsignaled send before it every other round, freed by the signaled one's completion), the
/// completions polled with `poll` and handed to the rings.
#[test]
fn slot_no_alloc_post_and_poll_round_trips() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let mut tx = a.slot_ring(4, LEN).unwrap();
    let mut rx = b.slot_ring(4, LEN).unwrap();
    let data = pattern(LEN, 9);

    let ((), allocations) = count_allocations(|| {
        let mut wcs = [WorkCompletion::default(); 4];
        for round in 0..ROUNDS {
            let sends = if round % 2 == 1 { 2 } else { 1 };
            for _ in 0..sends {
                let slot = rx.take().unwrap();
                b.post_recv_slot(&mut rx, RecvRequest::new(slot)).unwrap();
            }
            for n in 0..sends {
                let mut slot = tx.take().unwrap();
                tx.fill(&mut slot, &data).unwrap();
                let request = SendRequest::send(slot);
                let request = if n + 1 < sends {
                    request.unsignaled()
                } else {
                    request
                };
                a.post_send_slot(&mut tx, request).unwrap();
            }
            let (mut sent, mut received) = (0, 0);
            let deadline = Instant::now() + WAIT;
            while sent < 1 || received < sends {
                for wc in cq_a.poll(&mut wcs).unwrap() {
                    assert!(wc.is_success(), "round {round}: {wc:?}");
                    let slot = tx.complete(wc).expect("the send's slot comes back");
                    tx.put(slot).unwrap();
                    sent += 1;
                }
                for wc in cq_b.poll(&mut wcs).unwrap() {
                    assert!(wc.is_success(), "round {round}: {wc:?}");
                    let slot = rx.complete(wc).expect("the receive's slot comes back");
                    assert_eq!(rx.bytes(&slot).unwrap(), &data[..], "round {round}");
                    rx.put(slot).unwrap();
                    received += 1;
                }
                assert!(
                    Instant::now() < deadline,
                    "round {round}: timed out (sent: {sent}, received: {received})"
                );
            }
            // Every slot is back: nothing leaks from round to round.
            assert_eq!((tx.posted(), rx.posted()), (0, 0), "round {round}");
        }
    });
    assert_eq!(
        allocations, 0,
        "{allocations} allocations in {ROUNDS} slot post/poll rounds"
    );
}

/// An SRQ slot ring behind two queue pairs: 10,000 rounds of a send from each peer's slot
/// ring, both receives completed from the SRQ's ring (found by id, in any order), checked and
/// posted again, one by one or (every other round) by `fill_slot_ring`: no allocation, every
/// slot of the SRQ's ring posted after each round.
#[test]
fn srq_slot_no_alloc_round_trips() {
    let Some(f) = fixture() else { return };
    let mut srq = f.pd.create_srq(8, 1).unwrap();
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a1, _b1) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b).srq(&srq),
        AccessFlags::empty(),
    );
    let (mut a2, _b2) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b).srq(&srq),
        AccessFlags::empty(),
    );
    let mut rx = srq.slot_ring(4, LEN).unwrap();
    assert_eq!(srq.fill_slot_ring(&mut rx).unwrap(), 4);
    let (mut tx1, mut tx2) = (a1.slot_ring(2, LEN).unwrap(), a2.slot_ring(2, LEN).unwrap());
    let data = pattern(LEN, 5);

    let ((), allocations) = count_allocations(|| {
        let mut wcs = [WorkCompletion::default(); 4];
        for round in 0..ROUNDS {
            for (qp, tx) in [(&mut a1, &mut tx1), (&mut a2, &mut tx2)] {
                let mut slot = tx.take().unwrap();
                tx.fill(&mut slot, &data).unwrap();
                qp.post_send_slot(tx, SendRequest::send(slot)).unwrap();
            }
            let (mut sent, mut received) = (0, 0);
            let deadline = Instant::now() + WAIT;
            while sent < 2 || received < 2 {
                for wc in cq_a.poll(&mut wcs).unwrap() {
                    assert!(wc.is_success(), "round {round}: {wc:?}");
                    match tx1.complete(wc) {
                        Some(slot) => tx1.put(slot).unwrap(),
                        None => {
                            let slot = tx2.complete(wc).expect("a send's slot");
                            tx2.put(slot).unwrap();
                        }
                    }
                    sent += 1;
                }
                for wc in cq_b.poll(&mut wcs).unwrap() {
                    assert!(wc.is_success(), "round {round}: {wc:?}");
                    let slot = rx.complete(wc).expect("the receive's slot comes back");
                    assert_eq!(rx.bytes(&slot).unwrap(), &data[..], "round {round}");
                    if round % 2 == 0 {
                        srq.post_recv_slot(&mut rx, RecvRequest::new(slot)).unwrap();
                    } else {
                        rx.put(slot).unwrap();
                    }
                    received += 1;
                }
                assert!(
                    Instant::now() < deadline,
                    "round {round}: timed out (sent: {sent}, received: {received})"
                );
            }
            if round % 2 == 1 {
                assert_eq!(srq.fill_slot_ring(&mut rx).unwrap(), 2, "round {round}");
            }
            assert_eq!(
                (tx1.posted(), tx2.posted(), rx.posted()),
                (0, 0, 4),
                "round {round}"
            );
        }
    });
    assert_eq!(
        allocations, 0,
        "{allocations} allocations in {ROUNDS} SRQ slot ring rounds"
    );
}

/// 10,000 rounds of slot rings used as the start-here page shows them: the receiving ring
/// refilled by `fill_slot_ring` (every slot its completions handed back, put back first) and by
/// single posts in turn, every other round with an unsignaled send before the signaled one:
/// no allocation, and every send slot is free again after each round, every receive slot but
/// those just received into posted.
#[test]
fn slot_fill_no_alloc_post_and_poll_round_trips() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let mut tx = a.slot_ring(4, LEN).unwrap();
    let mut rx = b.slot_ring(4, LEN).unwrap();
    let data = pattern(LEN, 11);

    let ((), allocations) = count_allocations(|| {
        let mut wcs = [WorkCompletion::default(); 4];
        let mut freed = 4;
        for round in 0..ROUNDS {
            let sends = if round % 2 == 1 { 2 } else { 1 };
            // Every receive slot posted: one at a time, or all free ones in one call.
            if round % 4 < 2 {
                while let Some(slot) = rx.take() {
                    b.post_recv_slot(&mut rx, RecvRequest::new(slot)).unwrap();
                }
            } else {
                assert_eq!(b.fill_slot_ring(&mut rx).unwrap(), freed, "round {round}");
            }
            freed = sends;
            for n in 0..sends {
                let mut slot = tx.take().unwrap();
                tx.fill(&mut slot, &data).unwrap();
                let request = SendRequest::send(slot).tag(n as u64);
                let request = if n + 1 < sends {
                    request.unsignaled()
                } else {
                    request
                };
                a.post_send_slot(&mut tx, request).unwrap();
            }
            let (mut sent, mut received) = (0, 0);
            let deadline = Instant::now() + WAIT;
            while sent < 1 || received < sends {
                for wc in cq_a.poll(&mut wcs).unwrap() {
                    assert!(wc.is_success(), "round {round}: {wc:?}");
                    let slot = tx.complete(wc).expect("a send of the ring");
                    assert_eq!(slot.tag(), sends as u64 - 1, "round {round}");
                    assert_eq!(tx.bytes(&slot).unwrap(), &data[..], "round {round}");
                    tx.put(slot).unwrap();
                    sent += 1;
                }
                for wc in cq_b.poll(&mut wcs).unwrap() {
                    assert!(wc.is_success(), "round {round}: {wc:?}");
                    let slot = rx.complete(wc).expect("a receive of the ring");
                    assert_eq!(rx.bytes(&slot).unwrap(), &data[..], "round {round}");
                    rx.put(slot).unwrap();
                    received += 1;
                }
                assert!(
                    Instant::now() < deadline,
                    "round {round}: timed out (sent: {sent}, received: {received})"
                );
            }
            assert_eq!((tx.posted(), rx.posted()), (0, 4 - sends), "round {round}");
        }
    });
    assert_eq!(
        allocations, 0,
        "{allocations} allocations in {ROUNDS} slot fill rounds"
    );
}
