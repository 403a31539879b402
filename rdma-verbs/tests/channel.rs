//! Completion channels on the device: wake-ups, time-outs, non-blocking reads, many events
//! across re-arms (the batched acknowledgement), and solicited-only notification.

use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use rdma_test_support::verbs::*;
use rdma_verbs::{channel::*, cq::*, mr::*, owned::*, wr::*, *};

const LOCAL: AccessFlags = AccessFlags::LOCAL_WRITE;
const TARGET: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);

#[test]
fn channel_wakes_a_waiting_thread() {
    let Some(f) = fixture() else { return };
    let ch = f.context.create_comp_channel().unwrap();
    let mut cq = f
        .context
        .cq_builder(16)
        .channel(&ch)
        .build()
        .expect("CQ on a channel");
    let cq_b = f.cq(16);
    let (mut a, _b) = f.rc_pair(
        f.pd.qp_builder(&cq, &cq),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::REMOTE_WRITE,
    );
    let mut src = f.pd.register(128, LOCAL).unwrap();
    src.as_mut_slice()
        .unwrap()
        .copy_from_slice(&pattern(128, 3));
    let src = Arc::new(src);
    let target = f.pd.register(128, TARGET).unwrap();

    cq.req_notify(false).unwrap();
    let (tx, rx) = mpsc::channel();
    let (tid_tx, tid_rx) = mpsc::channel();
    {
        let ch = ch.clone();
        std::thread::spawn(move || {
            tid_tx.send(thread_id()).unwrap();
            let _ = tx.send(ch.wait(WAIT));
        });
    }
    // The thread blocks: it is asleep in the kernel, and has not returned, with nothing pending.
    wait_until_asleep(tid_rx.recv_timeout(WAIT).expect("the waiter started"));
    assert!(
        matches!(rx.try_recv(), Err(mpsc::TryRecvError::Empty)),
        "the waiter returned with nothing pending"
    );
    write_range(&mut a, 1, &src, target.remote(..).unwrap());
    let event = match rx.recv_timeout(WAIT) {
        Ok(outcome) => outcome.expect("a completion event"),
        Err(e) => panic!("the waiter did not wake: {e}"),
    };
    assert!(event.is_for(&cq), "{event:?}");
    assert!(!event.is_for(&cq_b));
    assert_done(&reap(&mut cq, 1)[0], 1, WcOpcode::RdmaWrite);
    let mut got = [0u8; 128];
    target.read_at(0, &mut got).unwrap();
    assert_eq!(&got[..], &pattern(128, 3)[..]);

    // Not re-armed: the next completion raises no event. Its event would have been raised
    // when the completion polled here was written: QUIET covers only the delivery.
    write_range(&mut a, 2, &src, target.remote(..).unwrap());
    assert_done(&reap(&mut cq, 1)[0], 2, WcOpcode::RdmaWrite);
    match ch.wait(QUIET) {
        Err(Error::Timeout(_)) => {}
        other => panic!("an unarmed CQ raised an event: {other:?}"),
    }

    // A blocking get_event on another thread sleeps until the next event.
    cq.req_notify(false).unwrap();
    let (tx, rx) = mpsc::channel();
    let (tid_tx, tid_rx) = mpsc::channel();
    {
        let ch = ch.clone();
        std::thread::spawn(move || {
            tid_tx.send(thread_id()).unwrap();
            let _ = tx.send(ch.get_event());
        });
    }
    wait_until_asleep(tid_rx.recv_timeout(WAIT).expect("the reader started"));
    assert!(
        matches!(rx.try_recv(), Err(mpsc::TryRecvError::Empty)),
        "a blocking get_event returned with nothing pending"
    );
    write_range(&mut a, 3, &src, target.remote(..).unwrap());
    match rx.recv_timeout(WAIT) {
        Ok(Ok(Some(event))) => assert!(event.is_for(&cq)),
        other => panic!("blocking get_event: {other:?}"),
    }
    assert_done(&reap(&mut cq, 1)[0], 3, WcOpcode::RdmaWrite);
}

#[test]
fn channel_wait_times_out_and_nonblocking_get_event() {
    let Some(f) = fixture() else { return };
    let ch = f.context.create_comp_channel().unwrap();
    let mut cq = f.context.cq_builder(16).channel(&ch).build().unwrap();
    let cq_b = f.cq(16);
    let (mut a, _b) = f.rc_pair(
        f.pd.qp_builder(&cq, &cq),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::REMOTE_WRITE,
    );
    let src = Arc::new(f.pd.register(64, LOCAL).unwrap());
    let target = f.pd.register(64, TARGET).unwrap();

    // Armed, nothing happens: the wait ends at its bound with Timeout.
    cq.req_notify(false).unwrap();
    let bound = Duration::from_millis(300);
    let started = Instant::now();
    let outcome = ch.wait(bound);
    let took = started.elapsed();
    assert!(
        matches!(outcome, Err(Error::Timeout(d)) if d == bound),
        "{outcome:?}"
    );
    // Never early (the clock is monotonic, however slow the machine). The upper bound only
    // catches a wait that ignores its bound: the emulated machine may stall for seconds.
    assert!(took >= bound, "returned early: {took:?}");
    assert!(took < bound + WAIT, "overran: {took:?}");

    // Non-blocking: nothing pending is Ok(None). (A blocking read could only return with an
    // event, so getting None at all shows that it did not block.)
    ch.set_nonblocking(true).unwrap();
    assert!(ch.get_event().unwrap().is_none());

    // Still armed from above: a completion makes get_event return it.
    write_range(&mut a, 7, &src, target.remote(..).unwrap());
    let deadline = Instant::now() + WAIT;
    let event = loop {
        if let Some(event) = ch.get_event().unwrap() {
            break event;
        }
        assert!(Instant::now() < deadline, "no event within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert!(event.is_for(&cq));
    assert_done(&reap(&mut cq, 1)[0], 7, WcOpcode::RdmaWrite);
    assert!(ch.get_event().unwrap().is_none(), "one event per arm");

    // wait() works on a non-blocking channel and leaves it non-blocking.
    cq.req_notify(false).unwrap();
    write_range(&mut a, 8, &src, target.remote(..).unwrap());
    assert!(ch.wait(WAIT).unwrap().is_for(&cq));
    assert_done(&reap(&mut cq, 1)[0], 8, WcOpcode::RdmaWrite);
    assert!(ch.get_event().unwrap().is_none());

    // Blocking again: wait() still times out, and still returns an event.
    ch.set_nonblocking(false).unwrap();
    cq.req_notify(false).unwrap();
    assert!(matches!(
        ch.wait(Duration::from_millis(100)),
        Err(Error::Timeout(_))
    ));
    write_range(&mut a, 9, &src, target.remote(..).unwrap());
    assert!(ch.wait(WAIT).unwrap().is_for(&cq));
    assert_done(&reap(&mut cq, 1)[0], 9, WcOpcode::RdmaWrite);
}

#[test]
fn channel_many_events_then_drop_without_hanging() {
    let Some(f) = fixture() else { return };
    let ch = f.context.create_comp_channel().unwrap();
    // Two CQs on one channel: events carry which one they are for, and each keeps its own
    // count of events to acknowledge.
    let mut cq = f.context.cq_builder(16).channel(&ch).build().unwrap();
    let mut other = f.context.cq_builder(16).channel(&ch).build().unwrap();
    let cq_b = f.cq(16);
    let (mut a, b) = f.rc_pair(
        f.pd.qp_builder(&cq, &cq),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::REMOTE_WRITE,
    );
    let (mut c, d) = f.rc_pair(
        f.pd.qp_builder(&other, &other),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::REMOTE_WRITE,
    );
    let src = Arc::new(f.pd.register(64, LOCAL).unwrap());
    let target = f.pd.register(64, TARGET).unwrap();
    let remote = target.remote(..).unwrap();

    // 150 events on `cq` (two acknowledgement batches of 64 and 22 left over), 70 on `other`
    // (one batch and 6 left over).
    let (mut on_cq, mut on_other) = (0u32, 0u32);
    for i in 0..150u64 {
        cq.req_notify(false).unwrap();
        write_range(&mut a, i, &src, remote);
        let event = ch.wait(WAIT).unwrap_or_else(|e| panic!("event {i}: {e}"));
        assert!(event.is_for(&cq), "event {i}: {event:?}");
        on_cq += 1;
        assert_done(&reap(&mut cq, 1)[0], i, WcOpcode::RdmaWrite);
        if i < 70 {
            other.req_notify(false).unwrap();
            write_range(&mut c, 1000 + i, &src, remote);
            let event = ch.wait(WAIT).unwrap_or_else(|e| panic!("event {i}: {e}"));
            assert!(event.is_for(&other), "event {i}: {event:?}");
            on_other += 1;
            assert_done(&reap(&mut other, 1)[0], 1000 + i, WcOpcode::RdmaWrite);
        }
    }
    assert_eq!((on_cq, on_other), (150, 70));

    // ibv_destroy_cq blocks until every event it delivered is acknowledged: a miscount in the
    // batches hangs here. Destroy on another thread and bound the wait.
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        drop((a, b, cq));
        done.send("cq").unwrap();
        drop((c, d, other));
        done.send("other").unwrap();
        drop(ch);
        done.send("channel").unwrap();
    });
    for what in ["cq", "other", "channel"] {
        assert_eq!(
            finished.recv_timeout(WAIT),
            Ok(what),
            "destroying {what} hung"
        );
    }
}

#[test]
fn channel_solicited_only_notification() {
    let Some(f) = fixture() else { return };
    let ch = f.context.create_comp_channel().unwrap();
    let mut cq_a = f.cq(16);
    // The receiver's CQ is the one on the channel: the solicited bit travels with the message.
    let mut cq_b = f.context.cq_builder(16).channel(&ch).build().unwrap();
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::REMOTE_WRITE,
    );
    let tx = BufferPool::new(&f.pd, 2, 64).unwrap();
    let rx = BufferPool::new(&f.pd, 2, 64).unwrap();
    let filled = |seed: u8| {
        let mut buf = tx.take().unwrap();
        buf.fill_from(&pattern(64, seed)).unwrap();
        buf
    };
    b.post_recv_buf(rx.take().unwrap(), 1).unwrap();
    b.post_recv_buf(rx.take().unwrap(), 2).unwrap();
    cq_b.req_notify(true).unwrap();

    // A plain send completes at the receiver without an event.
    a.post_send_owned(SendRequest::send(filled(11)).tag(10))
        .unwrap();
    // RC: the acknowledgement comes after the receiver's completion is written, and an event
    // for it would have been raised then: QUIET covers only its delivery.
    assert_done(&reap(&mut cq_a, 1)[0], 10, WcOpcode::Send);
    match ch.wait(QUIET) {
        Err(Error::Timeout(_)) => {}
        other => panic!("a plain send woke a solicited-only CQ: {other:?}"),
    }
    let mut first = reap(&mut cq_b, 1).remove(0);
    assert_done(&first, 1, WcOpcode::Recv);
    assert_eq!(&first.take_buf().unwrap()[..], &pattern(64, 11)[..]);

    // A solicited send wakes it.
    a.post_send_owned(SendRequest::send(filled(12)).solicited().tag(11))
        .unwrap();
    let event = ch.wait(WAIT).expect("the solicited event");
    assert!(event.is_for(&cq_b), "{event:?}");
    let mut second = reap(&mut cq_b, 1).remove(0);
    assert_done(&second, 2, WcOpcode::Recv);
    assert_eq!(&second.take_buf().unwrap()[..], &pattern(64, 12)[..]);
    assert_done(&reap(&mut cq_a, 1)[0], 11, WcOpcode::Send);

    // So does an RDMA WRITE with immediate data and the flag, into an empty receive; without
    // the flag it does not.
    let target = Arc::new(f.pd.register(64, TARGET).unwrap());
    b.post_recv_owned(RecvRequest::empty().tag(3)).unwrap();
    b.post_recv_owned(RecvRequest::empty().tag(4)).unwrap();
    cq_b.req_notify(true).unwrap();
    let remote = target.remote(..).unwrap();
    a.post_send_owned(SendRequest::write(filled(13), remote).with_imm(7).tag(12))
        .unwrap();
    assert_done(&reap(&mut cq_a, 1)[0], 12, WcOpcode::RdmaWrite);
    match ch.wait(QUIET) {
        Err(Error::Timeout(_)) => {}
        other => panic!("an unsolicited write woke a solicited-only CQ: {other:?}"),
    }
    assert_done(&reap(&mut cq_b, 1)[0], 3, WcOpcode::RecvRdmaWithImm);
    a.post_send_owned(
        SendRequest::write(filled(14), remote)
            .with_imm(8)
            .solicited()
            .tag(13),
    )
    .unwrap();
    let event = ch.wait(WAIT).expect("the solicited write's event");
    assert!(event.is_for(&cq_b), "{event:?}");
    let third = reap(&mut cq_b, 1).remove(0);
    assert_done(&third, 4, WcOpcode::RecvRdmaWithImm);
    assert_eq!(third.wc().imm_data(), Some(8));
    assert_done(&reap(&mut cq_a, 1)[0], 13, WcOpcode::RdmaWrite);
    let mut got = [0u8; 64];
    target.read_at(0, &mut got).unwrap();
    assert_eq!(&got[..], &pattern(64, 14)[..]);
}

#[test]
fn channel_concurrent_waiters_each_return_within_their_bound() {
    let Some(f) = fixture() else { return };
    let ch = f.context.create_comp_channel().unwrap();
    let mut cq = f.context.cq_builder(16).channel(&ch).build().unwrap();
    let cq_b = f.cq(16);
    let (mut a, _b) = f.rc_pair(
        f.pd.qp_builder(&cq, &cq),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::REMOTE_WRITE,
    );
    let src = Arc::new(f.pd.register(64, LOCAL).unwrap());
    let target = f.pd.register(64, TARGET).unwrap();
    let remote = target.remote(..).unwrap();
    const WAITERS: usize = 4;
    const ROUNDS: u64 = 100;
    let bound = Duration::from_millis(100);
    // A waiter that missed the wake-up blocks for ever; one that is merely slow (emulation,
    // four threads on two CPUs) may overrun by seconds. Only the first is a failure.
    let slack = WAIT;

    // Several threads wait on one (blocking) channel in a loop; each event wakes them all and
    // one takes it. Every wait must end within its bound: with an event or with Timeout.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (ch, tx, stop) = (ch.clone(), tx.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let started = Instant::now();
                    let outcome = ch.wait(bound);
                    let took = started.elapsed();
                    if tx.send((outcome, took)).is_err() {
                        return;
                    }
                }
            })
        })
        .collect();
    drop(tx);
    let mut events = 0u64;
    let mut slowest = Duration::ZERO;
    let check = |outcome: Result<CqEvent>,
                 took: Duration,
                 cq: &CompletionQueue,
                 events: &mut u64,
                 slowest: &mut Duration| {
        *slowest = (*slowest).max(took);
        match outcome {
            Ok(event) => {
                assert!(event.is_for(cq));
                *events += 1;
            }
            Err(Error::Timeout(_)) => {}
            Err(e) => panic!("a waiter failed: {e}"),
        }
        assert!(
            took < bound + slack,
            "wait({bound:?}) returned after {took:?}"
        );
    };
    for round in 0..ROUNDS {
        cq.req_notify(false).unwrap();
        write_range(&mut a, round, &src, remote);
        assert_done(&reap(&mut cq, 1)[0], round, WcOpcode::RdmaWrite);
        // The event must reach a waiter before the next arm.
        let deadline = Instant::now() + WAIT;
        while events <= round {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((outcome, took)) => check(outcome, took, &cq, &mut events, &mut slowest),
                Err(_) => panic!("round {round}: no waiter returned the event within {WAIT:?}"),
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let deadline = Instant::now() + WAIT;
    let mut finished = 0;
    while finished < WAITERS {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((outcome, took)) => check(outcome, took, &cq, &mut events, &mut slowest),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("a waiter is still blocked {WAIT:?} after its {bound:?} bound")
            }
        }
        finished = waiters.iter().filter(|w| w.is_finished()).count();
    }
    assert_eq!(events, ROUNDS);
    eprintln!("{ROUNDS} events, {WAITERS} waiters, slowest wait {slowest:?}");
}

#[test]
fn channel_wait_without_deadline() {
    let Some(f) = fixture() else { return };
    let ch = f.context.create_comp_channel().unwrap();
    let mut cq = f.context.cq_builder(16).channel(&ch).build().unwrap();
    let cq_b = f.cq(16);
    let (mut a, _b) = f.rc_pair(
        f.pd.qp_builder(&cq, &cq),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::REMOTE_WRITE,
    );
    let src = Arc::new(f.pd.register(64, LOCAL).unwrap());
    let target = f.pd.register(64, TARGET).unwrap();

    // Duration::MAX means "no deadline": the wait returns the event, it does not panic on
    // the deadline's arithmetic.
    cq.req_notify(false).unwrap();
    let (tx, rx) = mpsc::channel();
    let (tid_tx, tid_rx) = mpsc::channel();
    {
        let ch = ch.clone();
        std::thread::spawn(move || {
            tid_tx.send(thread_id()).unwrap();
            let _ = tx.send(ch.wait(Duration::MAX));
        });
    }
    // The event comes while the waiter sleeps, not before it waits.
    wait_until_asleep(tid_rx.recv_timeout(WAIT).expect("the waiter started"));
    write_range(&mut a, 1, &src, target.remote(..).unwrap());
    match rx.recv_timeout(WAIT) {
        Ok(Ok(event)) => assert!(event.is_for(&cq)),
        Ok(Err(e)) => panic!("wait(Duration::MAX) failed: {e}"),
        Err(e) => panic!("wait(Duration::MAX) gave nothing (the waiter died or hangs): {e}"),
    }
    assert_done(&reap(&mut cq, 1)[0], 1, WcOpcode::RdmaWrite);

    // A zero timeout with an event pending returns it.
    cq.req_notify(false).unwrap();
    write_range(&mut a, 2, &src, target.remote(..).unwrap());
    assert_done(&reap(&mut cq, 1)[0], 2, WcOpcode::RdmaWrite);
    let deadline = Instant::now() + WAIT;
    let event = loop {
        match ch.wait(Duration::ZERO) {
            Ok(event) => break event,
            Err(Error::Timeout(_)) => {
                assert!(Instant::now() < deadline, "no event within {WAIT:?}");
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(event.is_for(&cq));
}

#[test]
fn channel_cq_dropped_while_another_thread_takes_its_events() {
    let Some(f) = fixture() else { return };
    let ch = f.context.create_comp_channel().unwrap();
    let src = Arc::new(f.pd.register(64, LOCAL).unwrap());
    let target = f.pd.register(64, TARGET).unwrap();
    let remote = target.remote(..).unwrap();
    // A thread keeps taking events from the channel while CQs on it are destroyed: whichever
    // side sees an event last must acknowledge it, or ibv_destroy_cq waits forever.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let taker = {
        let (ch, stop) = (ch.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut taken = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match ch.wait(Duration::from_millis(20)) {
                    Ok(_) => taken += 1,
                    Err(Error::Timeout(_)) => {}
                    Err(e) => panic!("taking events: {e}"),
                }
            }
            taken
        })
    };
    for round in 0..20u64 {
        let mut cq = f.context.cq_builder(16).channel(&ch).build().unwrap();
        let cq_b = f.cq(16);
        let (mut a, b) = f.rc_pair(
            f.pd.qp_builder(&cq, &cq),
            f.pd.qp_builder(&cq_b, &cq_b),
            AccessFlags::REMOTE_WRITE,
        );
        cq.req_notify(false).unwrap();
        write_range(&mut a, round, &src, remote);
        assert_done(&reap(&mut cq, 1)[0], round, WcOpcode::RdmaWrite);
        // The event is on its way to (or already with) the other thread: destroy now.
        let (done, finished) = mpsc::channel();
        std::thread::spawn(move || {
            drop((a, b, cq, cq_b));
            let _ = done.send(());
        });
        assert!(
            finished.recv_timeout(WAIT).is_ok(),
            "round {round}: destroying the CQ hung"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let taken = taker.join().expect("the event thread");
    eprintln!("the other thread took {taken} of 20 events");
    assert!(taken <= 20);
}
