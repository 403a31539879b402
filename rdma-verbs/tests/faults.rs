//! Failures on the device: a peer that vanishes, a completion queue that overflows, a receiver
//! that is not ready. Each must end in a definite completion status or event, in bounded time;
//! on the owned path, with every buffer handed back.

mod common;

use std::time::{Duration, Instant};

use common::*;
use rdma_verbs::*;

const LOCAL: AccessFlags = AccessFlags::LOCAL_WRITE;

/// Ack timeout code 8 (about 1 ms) and two retries: a lost peer is noticed quickly.
fn quick_retries() -> RcRtsAttr {
    let mut rts = RcRtsAttr::new(0);
    (rts.timeout, rts.retry_cnt) = (8, 2);
    rts
}

#[test]
fn fault_peer_destroyed_mid_traffic_is_retry_exceeded() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b, mut a, mut b) =
        f.rc_pair_own_cqs(AccessFlags::empty(), quick_retries());
    let mut src = f.pd.register(256, LOCAL).unwrap();
    src.as_mut_slice()
        .unwrap()
        .copy_from_slice(&pattern(256, 9));
    let dst = f.pd.register(256, LOCAL).unwrap();

    // Traffic flows first.
    // SAFETY: buffers outlive the polled completions.
    unsafe {
        b.post_recv_one(&RecvRequest::new(1, dst.slice(..).unwrap()))
            .unwrap();
        a.post_send_one(&SendRequest::send(2, src.slice(..).unwrap()).signaled())
            .unwrap();
    }
    assert_ok(&wait_for(&mut cq_a, 1)[0], 2, WcOpcode::Send);
    assert_ok(&wait_for(&mut cq_b, 1)[0], 1, WcOpcode::Recv);
    assert_eq!(dst.as_slice().unwrap(), &pattern(256, 9)[..]);

    // The peer goes away; the next send has nobody to acknowledge it.
    drop(b);
    let started = Instant::now();
    // SAFETY: `src` outlives the polled completion.
    unsafe {
        a.post_send_one(&SendRequest::send(3, src.slice(..).unwrap()).signaled())
            .unwrap();
    }
    let wc = wait_for(&mut cq_a, 1)[0];
    let took = started.elapsed();
    assert_eq!(wc.wr_id(), 3);
    assert_eq!(wc.status(), WcStatus::RetryExcErr, "{wc:?} after {took:?}");
    assert!(took < WAIT, "took {took:?}");
    assert_eq!(a.query_state().unwrap(), QpStateKind::Error);
    eprintln!("retry exceeded after {took:?}");
}

#[test]
fn fault_receiver_not_ready_without_rnr_retry() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let mut rts = RcRtsAttr::new(0);
    rts.rnr_retry = 0;
    let (mut a, mut b) = f.rc_pair_with(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
        rts,
    );
    let src = f.pd.register(64, LOCAL).unwrap();
    // The peer has posted no receive.
    // SAFETY: `src` outlives the polled completion.
    unsafe {
        a.post_send_one(&SendRequest::send(5, src.slice(..).unwrap()).signaled())
            .unwrap();
    }
    let wc = wait_for(&mut cq_a, 1)[0];
    assert_eq!(wc.wr_id(), 5);
    assert_eq!(wc.status(), WcStatus::RnrRetryExcErr, "{wc:?}");
    assert_eq!(a.query_state().unwrap(), QpStateKind::Error);
    // The receiver saw nothing and is unharmed: a receive posted now is still there when it is
    // flushed, and is the only completion its CQ ever gets.
    assert_eq!(b.query_state().unwrap(), QpStateKind::Rts);
    let dst = f.pd.register(64, LOCAL).unwrap();
    // SAFETY: `dst` outlives the flush completion polled below.
    unsafe {
        b.post_recv_one(&RecvRequest::new(6, dst.slice(..).unwrap()))
            .unwrap();
    }
    assert_only_flushes(b, &mut cq_b, &[6]);
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
    let src = f.pd.register(64 * n, LOCAL).unwrap();
    let dst = f.pd.register(64 * n, LOCAL).unwrap();
    // One signaled send more than the tiny CQ holds, none polled.
    // SAFETY: buffers outlive the completions polled below.
    unsafe {
        for i in 0..n {
            b.post_recv_one(&RecvRequest::new(
                i as u64,
                dst.slice(i * 64..(i + 1) * 64).unwrap(),
            ))
            .unwrap();
        }
        for i in 0..n {
            a.post_send_one(
                &SendRequest::send(100 + i as u64, src.slice(i * 64..(i + 1) * 64).unwrap())
                    .signaled(),
            )
            .unwrap();
        }
    }
    // The messages themselves arrive.
    let received = wait_for(&mut cq_b, n);
    assert!(
        received.iter().all(WorkCompletion::is_success),
        "{received:?}"
    );

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
    let mut buf = [WorkCompletion::default(); 8];
    let kept = tiny.poll(&mut buf).unwrap().to_vec();
    assert_eq!(kept.len(), capacity as usize, "{kept:?}");
    for (i, wc) in kept.iter().enumerate() {
        assert_ok(wc, 100 + i as u64, WcOpcode::Send);
    }
    // The completion that did not fit was the last one (the event came with it): nothing can
    // come after it.
    assert_cq_empty(&mut tiny);
    eprintln!(
        "CQ of capacity {capacity}: {n} completions gave {}; requester now {}",
        event.type_name(),
        a.query_state().unwrap()
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
    let src = f.pd.register(64, LOCAL).unwrap();
    let dst = f.pd.register(64, LOCAL).unwrap();
    // SAFETY: buffers outlive the queue pairs, which are destroyed at the end of the test.
    unsafe {
        for i in 0..n {
            b.post_recv_one(&RecvRequest::new(i as u64, dst.slice(..).unwrap()))
                .unwrap();
            a.post_send_one(&SendRequest::send(i as u64, src.slice(..).unwrap()).signaled())
                .unwrap();
        }
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
    a.post_send_owned(OwnedSend::send(filled(9)).tag(2))
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
    a.post_send_owned(OwnedSend::send(filled(3)).tag(3))
        .unwrap();
    a.post_send_owned(OwnedSend::send(filled(4)).tag(4))
        .unwrap();
    assert_eq!((a.owned_in_flight(), pool.available()), (3, 3));
    let mut done = reap(&mut cq_a, 3);
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
    a.post_send_owned(OwnedSend::send(buf).tag(5)).unwrap();
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
