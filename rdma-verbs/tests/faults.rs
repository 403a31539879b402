//! Failures on the device: a peer that vanishes, a completion queue that overflows, a receiver
//! that is not ready. Each must end in a definite completion status or event, in bounded time;
//! on the owned path, with every buffer handed back. (`failures.rs` takes the `unsafe` calls
//! through the error statuses.)

use std::time::{Duration, Instant};

use rdma_test_support::verbs::*;
use rdma_verbs::{async_event::*, cq::*, mr::*, owned::*, qp::*, wr::*};

/// Ack timeout code 8 (about 1 ms) and two retries: a lost peer is noticed quickly.
fn quick_retries() -> RcRtsAttr {
    let mut rts = RcRtsAttr::new(0);
    (rts.timeout, rts.retry_cnt) = (8, 2);
    rts
}

#[test]
fn fault_cq_overflow_is_an_async_event() {
    let Some(f) = fixture() else { return };
    let mut tiny = f.cq(1);
    let capacity = tiny.capacity();
    assert!(capacity >= 1, "capacity {capacity}");
    let n = capacity as usize + 1;
    let (cq_a_recv, mut cq_b) = (f.cq(16), f.cq(64));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&tiny, &cq_a_recv).max_send_wr(n as u32),
        f.pd.qp_builder(&cq_b, &cq_b).max_recv_wr(n as u32),
        AccessFlags::empty(),
    );
    assert!(
        f.context.get_async_event().unwrap().is_none(),
        "no event before the overflow"
    );
    let tx = BufferPool::new(&f.pd, n, 64).unwrap();
    let rx = BufferPool::new(&f.pd, n, 64).unwrap();
    // One signaled send more than the tiny CQ holds, none polled.
    for i in 0..n {
        b.post_recv_buf(rx.take().unwrap(), i as u64).unwrap();
    }
    for i in 0..n {
        let mut buf = tx.take().unwrap();
        buf.fill_from(&pattern(64, i as u8)).unwrap();
        a.post_send_owned(SendRequest::send(buf).tag(100 + i as u64))
            .unwrap();
    }
    // The messages themselves arrive.
    for (i, mut c) in reap(&mut cq_b, n).into_iter().enumerate() {
        assert_done(&c, i as u64, WcOpcode::Recv);
        assert_eq!(&c.take_buf().unwrap()[..], &pattern(64, i as u8)[..]);
    }
    assert_eq!(rx.available(), n);

    let event = f.context.wait_async_event(WAIT).expect("an async event");
    assert_eq!(
        event,
        AsyncEvent::CqError {
            cq_handle: tiny.handle()
        },
        "{}",
        event.type_name()
    );
    // The CQ kept what it could hold; the completion that did not fit is gone.
    let mut kept = Vec::new();
    tiny.poll_each(8, |c| kept.push(c)).unwrap();
    assert_eq!(kept.len(), capacity as usize, "{kept:?}");
    for (i, c) in kept.iter().enumerate() {
        assert_done(c, 100 + i as u64, WcOpcode::Send);
    }
    drop(kept);
    // The completion that did not fit was the last one (the event came with it): nothing can
    // come after it, and its request's buffer stays with the queue pair until it is dropped.
    assert_no_completion_each(&mut tiny);
    assert_eq!((a.owned_in_flight(), tx.available()), (1, n - 1));
    eprintln!(
        "CQ of capacity {capacity}: {n} completions gave {}; requester now {}",
        event.type_name(),
        a.query_state().unwrap()
    );
    drop(a);
    assert_eq!(
        tx.available(),
        n,
        "the queue pair's drop released the last buffer"
    );
}

#[test]
fn fault_async_event_wait_without_deadline() {
    let Some(f) = fixture() else { return };
    // Duration::MAX means "no deadline": the wait returns the event, it does not panic on the
    // deadline's arithmetic.
    let (tx, rx) = std::sync::mpsc::channel();
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    {
        let context = f.context.clone();
        std::thread::spawn(move || {
            tid_tx.send(thread_id()).unwrap();
            let _ = tx.send(context.wait_async_event(Duration::MAX));
        });
    }
    // The event comes while the waiter sleeps, not before it waits.
    wait_until_asleep(tid_rx.recv_timeout(WAIT).expect("the waiter started"));
    // Make an event: overflow a CQ of one entry with two completions.
    let tiny = f.cq(1);
    let cq_b = f.cq(16);
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&tiny, &tiny),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let n = tiny.capacity() as usize + 1;
    let pool = BufferPool::new(&f.pd, 2 * n, 64).unwrap();
    for i in 0..n as u64 {
        b.post_recv_buf(pool.take().unwrap(), i).unwrap();
        a.post_send_owned(SendRequest::send(pool.take().unwrap()).tag(i))
            .unwrap();
    }
    match rx.recv_timeout(WAIT) {
        Ok(Ok(event)) => assert_eq!(
            event,
            AsyncEvent::CqError {
                cq_handle: tiny.handle()
            }
        ),
        Ok(Err(e)) => panic!("wait_async_event(Duration::MAX) failed: {e}"),
        Err(e) => panic!("wait_async_event(Duration::MAX) gave nothing (died or hangs): {e}"),
    }
}

/// The owned path through the same failures: a peer that vanishes mid-traffic and a receiver
/// that is not ready. Every buffer comes back with its request's completion, whatever its
/// status, and a buffer that went nowhere still holds what was put in it.
#[test]
fn fault_owned_requests_hand_back_their_buffers_on_error_completions() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b, mut a, mut b) =
        f.rc_pair_own_cqs(AccessFlags::empty(), quick_retries());
    let pool = BufferPool::new(&f.pd, 6, 256).unwrap();
    let filled = |seed: u8| {
        let mut buf = pool.take().expect("a free buffer");
        buf.fill_from(&pattern(256, seed)).unwrap();
        buf
    };

    // Traffic flows first: the receive's buffer comes back with the bytes sent.
    b.post_recv_buf(pool.take().unwrap(), 1).unwrap();
    a.post_send_owned(SendRequest::send(filled(9)).tag(2))
        .unwrap();
    let mut sent = reap(&mut cq_a, 1).remove(0);
    assert_eq!(
        (sent.tag(), sent.status(), sent.wc().opcode()),
        (Some(2), WcStatus::Success, WcOpcode::Send)
    );
    assert_eq!(&sent.take_buf().unwrap()[..], &pattern(256, 9)[..]);
    let mut got = reap(&mut cq_b, 1).remove(0);
    assert_eq!(
        (got.tag(), got.status(), got.wc().opcode()),
        (Some(1), WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!(&got.take_buf().unwrap()[..], &pattern(256, 9)[..]);
    drop((sent, got));
    assert_eq!(pool.available(), 6);

    // The peer goes away with nothing in flight. A receive and two sends are posted on `a`:
    // the first send exhausts its retries, and the queue pair's error flushes the rest.
    drop(b);
    a.post_recv_buf(pool.take().unwrap(), 5).unwrap();
    a.post_send_owned(SendRequest::send(filled(3)).tag(3))
        .unwrap();
    a.post_send_owned(SendRequest::send(filled(4)).tag(4))
        .unwrap();
    assert_eq!((a.owned_in_flight(), pool.available()), (3, 3));
    let started = Instant::now();
    let mut done = reap(&mut cq_a, 3);
    let took = started.elapsed();
    done.sort_by_key(|c| c.tag());
    let statuses: Vec<_> = done.iter().map(|c| (c.tag(), c.status())).collect();
    assert_eq!(
        statuses,
        [
            (Some(3), WcStatus::RetryExcErr),
            (Some(4), WcStatus::WrFlushErr),
            (Some(5), WcStatus::WrFlushErr),
        ]
    );
    for (c, seed) in done.iter_mut().zip([Some(3), Some(4), None]) {
        let buf = c
            .take_buf()
            .expect("every failed request hands its buffer back");
        if let Some(seed) = seed {
            assert_eq!(&buf[..], &pattern(256, seed)[..], "{c:?}");
        }
    }
    drop(done);
    assert_eq!((a.owned_in_flight(), pool.available()), (0, 6));
    assert_eq!(a.query_state().unwrap(), QpStateKind::Error);
    assert_no_completion_each(&mut cq_a);
    note(&format!("retry exceeded after {took:?}"));
}

/// An owned SEND to a peer with no receive posted, with no RNR retries: it fails with
/// `RnrRetryExcErr` and hands its buffer back; the receiver, unharmed, gets a receive posted
/// now back as a flush when it is moved to ERR, and nothing else.
#[test]
fn fault_owned_receiver_not_ready_hands_back_the_buffer() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let mut rts = RcRtsAttr::new(0);
    rts.rnr_retry = 0;
    let (mut a, b) = f.rc_pair_with(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
        rts,
    );
    let pool = BufferPool::new(&f.pd, 2, 64).unwrap();
    let mut buf = pool.take().unwrap();
    buf.fill_from(&pattern(64, 7)).unwrap();
    a.post_send_owned(SendRequest::send(buf).tag(5)).unwrap();
    let mut c = reap(&mut cq_a, 1).remove(0);
    assert_eq!((c.tag(), c.status()), (Some(5), WcStatus::RnrRetryExcErr));
    assert_eq!(&c.take_buf().unwrap()[..], &pattern(64, 7)[..]);
    drop(c);
    assert_eq!(a.query_state().unwrap(), QpStateKind::Error);

    let mut b = b;
    assert_eq!(b.query_state().unwrap(), QpStateKind::Rts);
    b.post_recv_buf(pool.take().unwrap(), 6).unwrap();
    let b = b.into_error().expect("move to ERR");
    let mut c = reap(&mut cq_b, 1).remove(0);
    assert_eq!((c.tag(), c.status()), (Some(6), WcStatus::WrFlushErr));
    assert!(c.take_buf().is_some());
    drop(c);
    assert_eq!((b.owned_in_flight(), pool.available()), (0, 2));
    assert_no_completion_each(&mut cq_b);
}
