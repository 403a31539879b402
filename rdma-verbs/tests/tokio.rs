//! The `tokio` feature on the device: awaiting completions (and proving the wait sleeps rather
//! than blocking the runtime's one thread), cancelled waits, many events through the async path
//! (the batched acknowledgement), and the context's asynchronous events.
//!
//! The tests of `poll_async` post with the `unsafe` calls: `poll_async` is that path's await
//! (it fills work completions, which hand back no buffers). The owned path's await,
//! `poll_each_async`, is tested at the end, and slot rings awaited through `poll_async` last.

#![cfg(feature = "tokio")]

use std::future::poll_fn;
use std::thread;
use std::time::{Duration, Instant};

use rdma_test_support::verbs::*;
use rdma_verbs::{async_event::*, cq::*, mr::*, owned::*, qp::*, slot::*, wr::*, *};
use tokio::time::{sleep, timeout};

const LOCAL: AccessFlags = AccessFlags::LOCAL_WRITE;

/// How long a sending thread waits before sending, so that an await sleeps for at least that
/// long. Tests only assert lower bounds with it (taking the start time before the thread
/// starts), which hold however slow the machine is.
const DELAY: Duration = Duration::from_millis(300);

fn assert_send<T: Send>(_: &T) {}

/// An RC pair whose `b` takes its receive completions on `recv_cq`, a queue on `channel`
/// (registered with the runtime); `a` uses `cq_a` for both queues, `b` sends on `send_cq_b`.
struct AsyncPair {
    channel: AsyncCompletionChannel,
    recv_cq: CompletionQueue,
    cq_a: CompletionQueue,
    send_cq_b: CompletionQueue,
    a: QueuePair<Rc, Rts>,
    b: QueuePair<Rc, Rts>,
}

fn async_pair(f: &Fixture) -> AsyncPair {
    let channel = f.context.create_comp_channel().unwrap();
    let recv_cq = f.context.cq_builder(16).channel(&channel).build().unwrap();
    let (cq_a, send_cq_b) = (f.cq(16), f.cq(16));
    let (a, b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&send_cq_b, &recv_cq),
        AccessFlags::empty(),
    );
    let channel = AsyncCompletionChannel::new(channel).expect("register the channel");
    AsyncPair {
        channel,
        recv_cq,
        cq_a,
        send_cq_b,
        a,
        b,
    }
}

/// Posts a signaled send of all of `src`.
fn send(qp: &mut QueuePair<Rc, Rts>, wr_id: u64, src: &MemoryRegion) {
    // SAFETY: callers keep `src` alive and untouched until the completion is polled.
    unsafe {
        qp.post_send_one(&SendRequest::send(src.slice(..).unwrap()).tag(wr_id))
            .unwrap();
    }
}

/// Posts a receive into all of `dst`.
fn recv(qp: &mut QueuePair<Rc, Rts>, wr_id: u64, dst: &MemoryRegion) {
    // SAFETY: callers keep `dst` alive and do not read it until the completion is polled.
    unsafe {
        qp.post_recv_one(&RecvRequest::new(dst.slice(..).unwrap()).tag(wr_id))
            .unwrap();
    }
}

#[tokio::test]
async fn tokio_await_a_receive_while_the_runtime_runs_other_tasks() {
    let Some(f) = fixture() else { return };
    let AsyncPair {
        channel,
        mut recv_cq,
        mut cq_a,
        send_cq_b,
        mut a,
        mut b,
    } = async_pair(&f);
    let dst = f.pd.register(4096, LOCAL).unwrap();
    let mut src = f.pd.register(1000, LOCAL).unwrap();
    src.as_mut_slice()
        .unwrap()
        .copy_from_slice(&pattern(1000, 5));
    recv(&mut b, 21, &dst);

    // poll_async: the queue is empty, so it arms it and sleeps; the send comes later, from a
    // thread, once the ticker has run. The runtime has one thread: the ticker runs only if the
    // pending receive does not block it (join! polls the receive first). If it never runs, the
    // thread sends after WAIT anyway, so that a blocking wait returns, and the test fails.
    let (go, went) = std::sync::mpsc::channel::<()>();
    let sender = thread::spawn(move || {
        let ticked_first = went.recv_timeout(WAIT).is_ok();
        send(&mut a, 12, &src);
        assert_ok(&wait_for(&mut cq_a, 1)[0], 12, WcOpcode::Send);
        (a, src, cq_a, ticked_first)
    });
    let mut completions = [WorkCompletion::default(); 4];
    let receive = async {
        let future = recv_cq.poll_async(&channel, &mut completions);
        assert_send(&future);
        let got = timeout(WAIT, future)
            .await
            .expect("no receive completion in time")
            .expect("poll_async")
            .to_vec();
        (got, Instant::now())
    };
    let ticker = async {
        for _ in 0..3 {
            sleep(Duration::from_millis(30)).await;
        }
        let ticked_at = Instant::now();
        let _ = go.send(());
        ticked_at
    };
    let ((got, received_at), ticked_at) = tokio::join!(receive, ticker);
    assert!(
        ticked_at < received_at,
        "the ticker did not run while the receive was awaited"
    );
    assert_eq!(got.len(), 1, "{got:?}");
    assert_ok(&got[0], 21, WcOpcode::Recv);
    assert_eq!(got[0].byte_len(), 1000);
    assert_eq!(got[0].qp_num(), b.qp_num());
    assert_eq!(&dst.as_slice().unwrap()[..1000], &pattern(1000, 5)[..]);
    let (mut a, src, mut cq_a, ticked_first) = sender.join().expect("the sending thread");
    assert!(
        ticked_first,
        "the ticker did not run while the receive was awaited"
    );

    // wait() itself: arm by hand, the event names the receive CQ, the completion is there.
    recv(&mut b, 22, &dst);
    recv_cq.req_notify(false).unwrap();
    let started = Instant::now();
    let sender = thread::spawn(move || {
        thread::sleep(DELAY);
        send(&mut a, 13, &src);
        assert_ok(&wait_for(&mut cq_a, 1)[0], 13, WcOpcode::Send);
        (a, src, cq_a)
    });
    let wait = channel.wait();
    assert_send(&wait);
    let event = timeout(WAIT, wait)
        .await
        .expect("no completion event in time")
        .expect("wait");
    // The event came from the send, which the thread made DELAY after `started` at the
    // earliest: the wait slept until then.
    assert!(started.elapsed() >= DELAY, "{:?}", started.elapsed());
    assert!(event.is_for(&recv_cq), "{event:?}");
    assert!(!event.is_for(&send_cq_b));
    assert_ok(&wait_for(&mut recv_cq, 1)[0], 22, WcOpcode::Recv);
    let _keep = sender.join().expect("the sending thread");
}

#[tokio::test]
async fn tokio_cancelled_waits_lose_nothing() {
    let Some(f) = fixture() else { return };
    let channel = f.context.create_comp_channel().unwrap();
    let mut cq = f.context.cq_builder(16).channel(&channel).build().unwrap();
    let (mut cq_a, send_cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&send_cq_b, &cq),
        AccessFlags::empty(),
    );
    let async_channel = AsyncCompletionChannel::new(channel.clone()).unwrap();
    let src = f.pd.register(64, LOCAL).unwrap();
    let dst = f.pd.register(64, LOCAL).unwrap();

    // One registration per channel and runtime.
    match AsyncCompletionChannel::new(channel.clone()) {
        Err(e) => assert_eq!(e.errno(), Some(Errno::from_raw(libc::EEXIST)), "{e}"),
        Ok(_) => panic!("the channel was registered twice"),
    }
    // poll_async refuses what would never wake.
    let mut none: [WorkCompletion; 0] = [];
    assert!(matches!(
        cq.poll_async(&async_channel, &mut none).await,
        Err(Error::InvalidArgument(_))
    ));
    let mut completions = [WorkCompletion::default(); 4];
    let mut plain = f.cq(4);
    assert!(matches!(
        plain.poll_async(&async_channel, &mut completions).await,
        Err(Error::InvalidArgument(_))
    ));

    // Armed, nothing pending and nothing in flight: the wait times out at its bound (never
    // earlier: tokio's timers do not fire early), and is dropped.
    cq.req_notify(false).unwrap();
    let bound = Duration::from_millis(200);
    let started = Instant::now();
    assert!(timeout(bound, async_channel.wait()).await.is_err());
    assert!(started.elapsed() >= bound);
    // The channel still works: the next completion's event arrives, through the poll function.
    recv(&mut b, 1, &dst);
    send(&mut a, 2, &src);
    let event = timeout(WAIT, poll_fn(|cx| async_channel.poll_wait(cx)))
        .await
        .expect("no event after a cancelled wait")
        .unwrap();
    assert!(event.is_for(&cq));
    assert_ok(&wait_for(&mut cq, 1)[0], 1, WcOpcode::Recv);
    assert_ok(&wait_for(&mut cq_a, 1)[0], 2, WcOpcode::Send);

    // A cancelled poll_async leaves the queue armed: the next call still gets the completion.
    assert!(
        timeout(bound, cq.poll_async(&async_channel, &mut completions))
            .await
            .is_err()
    );
    recv(&mut b, 3, &dst);
    send(&mut a, 4, &src);
    let got = timeout(WAIT, cq.poll_async(&async_channel, &mut completions))
        .await
        .expect("no completion after a cancelled poll_async")
        .unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_ok(&got[0], 3, WcOpcode::Recv);
    assert_ok(&wait_for(&mut cq_a, 1)[0], 4, WcOpcode::Send);
    // The event of the cancelled call's arm is still pending: a spurious wake-up, which
    // poll_async absorbs (it polls, arms, polls again and sleeps until the real completion).
    recv(&mut b, 5, &dst);
    let sender = thread::spawn(move || {
        thread::sleep(DELAY);
        send(&mut a, 6, &src);
        assert_ok(&wait_for(&mut cq_a, 1)[0], 6, WcOpcode::Send);
        (a, src, cq_a)
    });
    let got = timeout(WAIT, cq.poll_async(&async_channel, &mut completions))
        .await
        .expect("no completion")
        .unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_ok(&got[0], 5, WcOpcode::Recv);
    let _keep = sender.join().expect("the sending thread");

    // Deregistered, the channel can be registered again; the blocking API still works.
    let channel = async_channel.into_inner();
    let again = AsyncCompletionChannel::new(channel.clone()).expect("register again");
    assert_eq!(again.channel().as_raw(), channel.as_raw());
    // Every event was taken: none is left for the blocking wait. (Each would have been raised
    // with a completion polled above: QUIET covers only its delivery.)
    assert!(matches!(channel.wait(QUIET), Err(Error::Timeout(_))));
}

#[tokio::test]
async fn tokio_hundred_round_trips_through_the_async_path() {
    const ROUNDS: u32 = 100;
    let Some(f) = fixture() else { return };
    let AsyncPair {
        channel,
        mut recv_cq,
        mut cq_a,
        mut send_cq_b,
        mut a,
        mut b,
    } = async_pair(&f);

    // The echo side, on a thread: each ping (a number) comes back as a pong (number + 1000).
    let a_recv = f.pd.register(4, LOCAL).unwrap();
    let mut a_send = f.pd.register(4, LOCAL).unwrap();
    recv(&mut a, 0, &a_recv);
    let echo = thread::spawn(move || {
        // One CQ for both directions: the send completion of pong i (made when b's ack
        // arrives) may come after ping i + 1 is received, so completions are taken in any order.
        let mut sends_done = 0u64;
        // Takes completions until receive `until_recv`, or with `None` until every send is done.
        let mut take = |cq: &mut CompletionQueue, until_recv: Option<u32>| loop {
            if until_recv.is_none() && sends_done == u64::from(ROUNDS) {
                return;
            }
            let wc = wait_for(cq, 1)[0];
            assert!(wc.is_success(), "{wc:?}");
            if wc.opcode() == WcOpcode::Send {
                assert_ok(&wc, sends_done, WcOpcode::Send);
                sends_done += 1;
            } else {
                assert_ok(
                    &wc,
                    u64::from(until_recv.expect("a receive")),
                    WcOpcode::Recv,
                );
                return;
            }
        };
        for i in 0..ROUNDS {
            take(&mut cq_a, Some(i));
            let mut ping = [0u8; 4];
            ping.copy_from_slice(a_recv.as_slice().unwrap());
            assert_eq!(u32::from_le_bytes(ping), i);
            recv(&mut a, u64::from(i + 1), &a_recv);
            a_send
                .as_mut_slice()
                .unwrap()
                .copy_from_slice(&(i + 1000).to_le_bytes());
            send(&mut a, u64::from(i), &a_send);
        }
        take(&mut cq_a, None);
        (a, a_recv, a_send, cq_a)
    });

    let b_recv = f.pd.register(4, LOCAL).unwrap();
    let mut b_send = f.pd.register(4, LOCAL).unwrap();
    let mut completions = [WorkCompletion::default(); 4];
    for i in 0..ROUNDS {
        recv(&mut b, u64::from(i), &b_recv);
        b_send
            .as_mut_slice()
            .unwrap()
            .copy_from_slice(&i.to_le_bytes());
        // Armed before the ping goes out, so the pong always raises an event: 100 events, one
        // acknowledgement batch and the rest at the CQ's drop.
        recv_cq.req_notify(false).unwrap();
        send(&mut b, u64::from(i), &b_send);
        let event = timeout(WAIT, channel.wait())
            .await
            .unwrap_or_else(|_| panic!("round {i}: no event"))
            .unwrap();
        assert!(event.is_for(&recv_cq), "round {i}: {event:?}");
        // The completion is there (poll_async returns it without sleeping).
        let got = timeout(WAIT, recv_cq.poll_async(&channel, &mut completions))
            .await
            .unwrap_or_else(|_| panic!("round {i}: no completion"))
            .unwrap();
        assert_eq!(got.len(), 1, "round {i}: {got:?}");
        assert_ok(&got[0], u64::from(i), WcOpcode::Recv);
        let mut pong = [0u8; 4];
        pong.copy_from_slice(b_recv.as_slice().unwrap());
        assert_eq!(u32::from_le_bytes(pong), i + 1000, "round {i}");
        assert_ok(
            &wait_for(&mut send_cq_b, 1)[0],
            u64::from(i),
            WcOpcode::Send,
        );
    }
    let _keep = echo.join().expect("the echo thread");
    // No event is left over (one would have been raised with a completion polled above:
    // QUIET covers only its delivery), and dropping everything (36 events unacknowledged)
    // returns.
    assert!(timeout(QUIET, channel.wait()).await.is_err());
    drop(b);
    drop(recv_cq);
    drop(channel);
}

#[tokio::test]
async fn tokio_async_events_yield_the_srq_limit_event() {
    let Some(f) = fixture() else { return };
    let mut srq = f.pd.create_srq(16, 1).expect("ibv_create_srq");
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, _b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b).srq(&srq),
        AccessFlags::empty(),
    );
    let events = AsyncContextEvents::new(f.context.clone()).expect("register the events");
    assert_eq!(events.context().as_raw(), f.context.as_raw());
    match AsyncContextEvents::new(f.context.clone()) {
        Err(e) => assert_eq!(e.errno(), Some(Errno::from_raw(libc::EEXIST)), "{e}"),
        Ok(_) => panic!("the context's events were registered twice"),
    }
    let rx = BufferPool::new(&f.pd, 4, 64).unwrap();
    for i in 0..4 {
        srq.post_recv_buf(rx.take().unwrap(), i).unwrap();
    }
    srq.arm_limit(2).expect("arm the SRQ limit");

    // Nothing yet, and nothing in flight: the wait times out (and is dropped).
    let next = events.next();
    assert_send(&next);
    assert!(timeout(Duration::from_millis(200), next).await.is_err());

    // Three sends from a thread, after a delay, leave one receive: below the limit.
    let tx = BufferPool::new(&f.pd, 3, 64).unwrap();
    let started = Instant::now();
    let sender = thread::spawn(move || {
        thread::sleep(DELAY);
        for tag in 10..13 {
            let mut buf = tx.take().unwrap();
            buf.fill_from(&pattern(64, tag as u8)).unwrap();
            a.post_send_owned(SendRequest::send(buf).tag(tag)).unwrap();
        }
        for (c, tag) in reap(&mut cq_a, 3).iter().zip(10..) {
            assert_done(c, tag, WcOpcode::Send);
        }
        assert_eq!(tx.available(), 3);
        (a, cq_a)
    });
    let event = timeout(WAIT, events.next())
        .await
        .expect("no SRQ limit event in time")
        .expect("next");
    // The sends began DELAY after `started` at the earliest: the wait slept until the event.
    assert!(started.elapsed() >= DELAY, "{:?}", started.elapsed());
    assert_eq!(
        event,
        AsyncEvent::SrqLimitReached {
            srq_handle: srq.handle()
        }
    );
    assert_eq!(srq.limit().unwrap(), 0, "the event disarms the limit");
    let _keep = sender.join().expect("the sending thread");
    for (mut c, tag) in reap(&mut cq_b, 3).into_iter().zip(0..) {
        assert_done(&c, tag, WcOpcode::Recv);
        assert_eq!(&c.take_buf().unwrap()[..], &pattern(64, 10 + tag as u8)[..]);
    }
    assert_eq!((srq.owned_in_flight(), rx.available()), (1, 3));

    // The poll function sees nothing more (the event disarmed the limit; a second one would
    // have come with a receive polled above: QUIET covers only its delivery).
    assert!(
        timeout(QUIET, poll_fn(|cx| events.poll_next(cx)))
            .await
            .is_err()
    );
}

/// The owned path awaited: `poll_each_async` hands over the receive with its buffer once the
/// peer sends. A first wait, cancelled by a time-out while nothing has arrived, loses nothing:
/// the next wait gets the completion and the buffer, with every byte.
#[tokio::test]
async fn tokio_owned_receive_awaited_and_cancel_safe() {
    let Some(f) = fixture() else { return };
    let AsyncPair {
        channel,
        mut recv_cq,
        mut cq_a,
        send_cq_b: _send_cq_b,
        mut a,
        mut b,
    } = async_pair(&f);
    let pool = BufferPool::new(&f.pd, 4, 512).unwrap();
    b.post_recv_buf(pool.take().unwrap(), 7).unwrap();

    // Nothing has been sent: the wait sleeps and the time-out drops it.
    let mut early = Vec::new();
    let cancelled = timeout(
        Duration::from_millis(200),
        recv_cq.poll_each_async(&channel, 4, |c| early.push(c)),
    )
    .await;
    assert!(
        cancelled.is_err(),
        "nothing to hand over yet: {cancelled:?}"
    );
    assert!(early.is_empty());
    assert_eq!(b.owned_in_flight(), 1);

    let mut buf = pool.take().unwrap();
    buf.fill_from(&pattern(512, 4)).unwrap();
    let sender = thread::spawn(move || {
        thread::sleep(DELAY);
        a.post_send_owned(SendRequest::send(buf).tag(1)).unwrap();
        let deadline = Instant::now() + WAIT;
        let mut sent = 0;
        while sent == 0 {
            sent = cq_a
                .poll_each(1, |c| assert!(c.is_success(), "{c:?}"))
                .unwrap();
            assert!(Instant::now() < deadline, "the send never completed");
        }
        (a, cq_a)
    });
    let mut got = Vec::new();
    let n = timeout(WAIT, recv_cq.poll_each_async(&channel, 4, |c| got.push(c)))
        .await
        .expect("no receive completion in time")
        .expect("poll_each_async");
    assert_eq!((n, got.len()), (1, 1));
    assert_eq!(got[0].tag(), Some(7));
    let received = got[0].take_buf().unwrap();
    assert_eq!(&received[..], &pattern(512, 4)[..]);
    drop((received, got));
    let _ = sender.join().expect("the sender");
    assert_eq!(pool.available(), 4);

    // A channel the queue is not on, and max 0, are refused.
    let other = AsyncCompletionChannel::new(f.context.create_comp_channel().unwrap()).unwrap();
    let wrong = recv_cq.poll_each_async(&other, 1, |_| ()).await;
    assert!(matches!(wrong, Err(Error::InvalidArgument(_))), "{wrong:?}");
    let none = recv_cq.poll_each_async(&channel, 0, |_| ()).await;
    assert!(matches!(none, Err(Error::InvalidArgument(_))), "{none:?}");
}

/// Slot rings with the async path: a wait cancelled by a time-out (the queue armed, nothing
/// sent) loses nothing: the message sent after it comes with the next `poll_async` and its
/// slot comes back with its bytes. Then a receiving ring's completions awaited with
/// `poll_async` in a spawned task (the ring, queue pair and completion queue moved into it:
/// all `Send`), each slot bringing exactly the bytes sent, put back and the ring refilled with
/// `fill_slot_ring` after each batch. The sender is a thread with a ring of its own, each
/// send's slot handed back by its completion with its tag.
#[tokio::test]
async fn tokio_slot_rings_awaited_in_a_task_and_cancel_safe() {
    const SIZE: usize = 64;
    const ROUNDS: u64 = 60;
    let Some(f) = fixture() else { return };
    let AsyncPair {
        channel,
        mut recv_cq,
        mut cq_a,
        send_cq_b: _send_cq_b,
        mut a,
        mut b,
    } = async_pair(&f);
    let mut rx = b.slot_ring(4, SIZE).unwrap();
    assert_eq!(b.fill_slot_ring(&mut rx).unwrap(), 4);
    let mut wcs = [WorkCompletion::default(); 4];
    let cancelled = timeout(
        Duration::from_millis(200),
        recv_cq.poll_async(&channel, &mut wcs),
    )
    .await;
    assert!(cancelled.is_err(), "nothing was sent: {cancelled:?}");
    assert_eq!(rx.posted(), 4);
    let mut tx = a.slot_ring(2, SIZE).unwrap();
    let send = move |a: &mut QueuePair<Rc, Rts>,
                     tx: &mut SlotRing,
                     cq_a: &mut CompletionQueue,
                     round: u64| {
        let data = pattern(SIZE, round as u8);
        let mut slot = tx.take().expect("a free send slot");
        tx.fill(&mut slot, &data).unwrap();
        a.post_send_slot(tx, SendRequest::send(slot).tag(round))
            .unwrap();
        let sent = wait_for(cq_a, 1);
        let slot = tx.complete(&sent[0]).expect("the send's slot");
        assert_eq!(slot.tag(), round);
        assert_eq!(tx.bytes(&slot).unwrap(), &data[..], "round {round}");
        tx.put(slot).unwrap();
    };
    send(&mut a, &mut tx, &mut cq_a, 0);
    let polled = timeout(WAIT, recv_cq.poll_async(&channel, &mut wcs))
        .await
        .expect("the message sent after the cancelled wait")
        .unwrap();
    assert_eq!(polled.len(), 1);
    let slot = rx.complete(&polled[0]).expect("a receive of the ring");
    assert_eq!(rx.bytes(&slot).unwrap(), &pattern(SIZE, 0)[..]);
    rx.put(slot).unwrap();
    assert_eq!(b.fill_slot_ring(&mut rx).unwrap(), 1);

    let receiver = async move {
        let mut wcs = [WorkCompletion::default(); 4];
        let mut received = 1u64;
        while received < ROUNDS {
            let polled = recv_cq.poll_async(&channel, &mut wcs).await.unwrap();
            for wc in polled {
                assert_eq!(wc.opcode(), WcOpcode::Recv, "{wc:?}");
                let slot = rx.complete(wc).expect("a completion of the ring");
                let bytes = rx.bytes(&slot).unwrap();
                assert_eq!(bytes, &pattern(SIZE, received as u8)[..], "{received}");
                rx.put(slot).unwrap();
                received += 1;
            }
            b.fill_slot_ring(&mut rx).unwrap();
            assert!(rx.take().is_none(), "every slot posted again");
        }
        (received, rx.posted())
    };
    assert_send(&receiver);
    let receiver = tokio::spawn(receiver);
    let sender = thread::spawn(move || {
        for round in 1..ROUNDS {
            send(&mut a, &mut tx, &mut cq_a, round);
        }
    });
    let (received, posted) = timeout(WAIT, receiver)
        .await
        .expect("every message in time")
        .expect("the receiving task");
    assert_eq!((received, posted), (ROUNDS, 4));
    sender.join().expect("the sender");
}
