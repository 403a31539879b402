//! The safe scoped post path on the device: data and completions through `QueuePair::scope`,
//! and what happens to requests still outstanding when a scope ends or panics.

use std::time::Duration;

use rdma_test_support::verbs::*;
use rdma_verbs::{cq::*, device::*, mr::*, qp::*, scope::*, wr::*, *};

const LOCAL: AccessFlags = AccessFlags::LOCAL_WRITE;

#[test]
fn scope_send_receive_read_and_atomics() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let rights = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        rights,
    );
    let mut src = f.pd.register(256, LOCAL).unwrap();
    src.as_mut_slice()
        .unwrap()
        .copy_from_slice(&pattern(256, 5));
    let mut inbox = f.pd.register(256, LOCAL).unwrap();
    let mut remote_mr =
        f.pd.register(64, AccessFlags::LOCAL_WRITE | rights)
            .unwrap();
    remote_mr.write_at(0, &pattern(64, 9)).unwrap();
    remote_mr.write_at(0, &10u64.to_ne_bytes()).unwrap();
    let remote = remote_mr.remote(..).unwrap();
    let mut results = f.pd.register(24, LOCAL).unwrap();
    // An atomic's result is one 8-byte word.
    let mut old = f.pd.register(8, LOCAL).unwrap();

    {
        let target = inbox.slice_mut(..).unwrap();
        let read_into = results.slice_mut(..).unwrap();
        let old_value = old.slice_mut(..).unwrap();
        b.scope(ScopeCqs::shared(&mut cq_b), |sb| {
            sb.recv(1, &target).unwrap();
            a.scope(ScopeCqs::shared(&mut cq_a), |sa| {
                sa.send(SendRequest::send(src.slice(..200).unwrap()).tag(2))
                    .unwrap();
                sa.read(3, &read_into, remote.slice(8, 24).unwrap())
                    .unwrap();
                sa.fetch_add(4, &old_value, remote.slice(0, 8).unwrap(), 5)
                    .unwrap();
                // Reads and atomics through `send` would let the device write shared memory.
                let refused = sa.send(SendRequest::read(src.slice(..8).unwrap(), remote).tag(5));
                assert!(
                    matches!(refused, Err(Error::InvalidArgument(_))),
                    "{refused:?}"
                );
                // Flags the crate does not know are refused before the post.
                let unknown = sa.send(
                    SendRequest::send(src.slice(..8).unwrap())
                        .flags(SendFlags::from_bits_retain(1 << 26)),
                );
                assert!(
                    matches!(&unknown, Err(Error::InvalidArgument(why)) if why.contains("unknown send flags")),
                    "{unknown:?}"
                );
                let done = reap_all(sa);
                assert_eq!(done.len(), 3);
                assert!(done.iter().all(|wc| wc.is_success()), "{done:?}");
            })
            .unwrap();
            let got = reap_all(sb);
            assert_ok(&got[0], 1, WcOpcode::Recv);
            assert_eq!(got[0].byte_len(), 200);
        })
        .unwrap();
    }
    // The scopes are over: the memory is Rust's again.
    assert_eq!(&inbox.as_slice().unwrap()[..200], &pattern(256, 5)[..200]);
    assert_eq!(results.as_slice().unwrap(), &pattern(64, 9)[8..32]);
    assert_eq!(old.load_u64(0).unwrap(), 10);
    assert_eq!(remote_mr.load_u64(0).unwrap(), 15);
}

/// `PostScope::poll_for` is bounded: with nothing posted it returns no completion once its
/// time is up; with a receive and the peer's SEND posted it returns each as it comes, counted
/// as done, so both scopes end without a flush and the bytes are the sender's.
#[test]
fn scope_poll_for_waits_for_min_or_gives_up() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let mut src = f.pd.register(64, LOCAL).unwrap();
    src.write_at(0, &pattern(64, 3)).unwrap();
    let mut inbox = f.pd.register(64, LOCAL).unwrap();
    {
        let target = inbox.slice_mut(..).unwrap();
        b.scope(ScopeCqs::shared(&mut cq_b), |sb| {
            let mut wcs = [WorkCompletion::default(); 4];
            let quiet = Duration::from_millis(50);
            let start = std::time::Instant::now();
            assert!(sb.poll_for(&mut wcs, 1, quiet).unwrap().is_empty());
            assert!(start.elapsed() >= quiet);
            sb.recv(1, &target).unwrap();
            a.scope(ScopeCqs::shared(&mut cq_a), |sa| {
                sa.send(SendRequest::send(src.slice(..).unwrap()).tag(2))
                    .unwrap();
                let mut sent = [WorkCompletion::default(); 4];
                let sent = sa.poll_for(&mut sent, 1, WAIT).unwrap();
                assert_eq!(sent.len(), 1);
                assert_ok(&sent[0], 2, WcOpcode::Send);
            })
            .unwrap();
            let got = sb.poll_for(&mut wcs, 1, WAIT).unwrap();
            assert_eq!(got.len(), 1);
            assert_ok(&got[0], 1, WcOpcode::Recv);
            assert_eq!(got[0].byte_len(), 64);
            assert!(sb.poll_for(&mut wcs, 0, WAIT).unwrap().is_empty());
        })
        .unwrap();
    }
    assert_eq!(inbox.as_slice().unwrap(), &pattern(64, 3)[..]);
}

#[test]
fn scope_that_ends_with_outstanding_requests_flushes_them() {
    let Some(f) = fixture() else { return };
    let (cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (_a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let mut inbox = f.pd.register(64, LOCAL).unwrap();
    let target = inbox.slice_mut(..).unwrap();
    let started = std::time::Instant::now();
    // Nobody sends: the receives never complete on their own.
    let result = b.scope(ScopeCqs::shared(&mut cq_b), |s| {
        assert_eq!(s.drain_timeout(), Duration::from_secs(5), "the default");
        // No wait without bound: the end of a scope also runs on panic, in `Drop`.
        s.set_drain_timeout(Duration::MAX);
        assert_eq!(s.drain_timeout(), Duration::from_secs(600));
        s.set_drain_timeout(Duration::from_millis(200));
        s.recv(1, &target).unwrap();
        s.recv(2, &target).unwrap();
        assert_eq!(s.outstanding(), 2);
    });
    assert!(
        matches!(
            result,
            Err(Error::Incomplete {
                pending: 2,
                state: QpStateKind::Error
            })
        ),
        "{result:?}"
    );
    assert!(started.elapsed() < WAIT, "the drain is bounded");
    assert_eq!(b.query_state().unwrap(), QpStateKind::Error);
    // `target`'s borrow ends here: the region is Rust's again.
    assert!(inbox.as_mut_slice().is_ok());
}

#[test]
fn scope_that_panics_still_drains_before_unwinding() {
    let Some(f) = fixture() else { return };
    let (cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (_a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let mut inbox = f.pd.register(64, LOCAL).unwrap();
    let target = inbox.slice_mut(..).unwrap();
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = b.scope(ScopeCqs::shared(&mut cq_b), |s| {
            s.set_drain_timeout(Duration::from_millis(100));
            s.recv(7, &target).unwrap();
            panic!("the closure failed with a receive outstanding");
        });
    }));
    assert!(unwound.is_err());
    // The scope flushed the receive before letting the panic through, and reaped its flush
    // completion: nothing is left in the queue.
    assert_eq!(b.query_state().unwrap(), QpStateKind::Error);
    assert_cq_empty(&mut cq_b);
    // The queue pair's type still says RTS; the next scope knows better.
    let error = refused(&mut b, ScopeCqs::shared(&mut cq_b));
    assert!(error.to_string().contains("not RTS"), "{error}");
}

/// A scope that left its queue pair in the error state (here on purpose, with
/// `flush_outstanding`) makes the next scope check the real state: refused while it is ERR,
/// accepted again once the queue pair is reset and reconnected.
#[test]
fn scope_refuses_a_queue_pair_an_earlier_scope_flushed() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (a, b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let mut b = b;
    scope_accepted(&f, &mut b, ScopeCqs::shared(&mut cq_b));
    let error = refused(&mut b, ScopeCqs::shared(&mut cq_b));
    assert!(error.to_string().contains("state ERR"), "{error}");
    let (mut a, mut b) = reconnect(&f, a, b);
    send_one_and_check(&f, (&mut a, &mut cq_a), (&mut b, &mut cq_b), 41);
}

/// Resets and reconnects an RC pair whose ends went through ERR or RESET.
fn reconnect(
    f: &Fixture,
    a: QueuePair<Rc, Rts>,
    b: QueuePair<Rc, Rts>,
) -> (QueuePair<Rc, Rts>, QueuePair<Rc, Rts>) {
    let (a_num, b_num) = (a.qp_num(), b.qp_num());
    let init = ConnectedInitAttr::new(f.device.port);
    let b = b
        .into_reset()
        .unwrap()
        .into_init(&init)
        .unwrap()
        .into_rtr(&RcRtrAttr::new(f.av(), a_num, 100))
        .unwrap()
        .into_rts(&RcRtsAttr::new(200))
        .unwrap();
    let a = a
        .into_reset()
        .unwrap()
        .into_init(&init)
        .unwrap()
        .into_rtr(&RcRtrAttr::new(f.av(), b_num, 200))
        .unwrap()
        .into_rts(&RcRtsAttr::new(100))
        .unwrap();
    (a, b)
}

/// One SEND from `a` into a receive of `b`, both through scopes: `b`'s scope counts exactly
/// its own completion, and when it ends the receive holds every byte sent.
fn send_one_and_check(
    f: &Fixture,
    (a, cq_a): (&mut QueuePair<Rc, Rts>, &mut CompletionQueue),
    (b, cq_b): (&mut QueuePair<Rc, Rts>, &mut CompletionQueue),
    seed: u8,
) {
    let mut inbox = f.pd.register(256, LOCAL).unwrap();
    let mut src = f.pd.register(256, LOCAL).unwrap();
    src.as_mut_slice()
        .unwrap()
        .copy_from_slice(&pattern(256, seed));
    {
        let target = inbox.slice_mut(..).unwrap();
        b.scope(ScopeCqs::shared(cq_b), |sb| {
            sb.recv(7, &target).unwrap();
            a.scope(ScopeCqs::shared(cq_a), |sa| {
                sa.send(SendRequest::send(src.slice(..).unwrap()).tag(8))
                    .unwrap();
                let sent = reap_all(sa);
                assert_ok(&sent[0], 8, WcOpcode::Send);
            })
            .unwrap();
            let got = reap_all(sb);
            assert_eq!(got.len(), 1, "{got:?}");
            assert_ok(&got[0], 7, WcOpcode::Recv);
            assert_eq!(got[0].byte_len(), 256);
        })
        .unwrap();
    }
    assert_eq!(inbox.as_slice().unwrap(), &pattern(256, seed)[..]);
    assert_cq_empty(cq_b);
}

/// What a queue pair number reused by the device would leave behind: a completion with this
/// queue pair's number already in its queue when a scope starts (made here by breaking the
/// `unsafe` contract on purpose: a receive completed and left unpolled). Counted, it would end
/// the scope while the scope's own receive is still posted; the scope discards it first, so
/// its receive stays outstanding until the peer really sends, and then holds the peer's bytes.
#[test]
fn scope_discards_a_completion_left_in_its_queue() {
    let Some(f) = fixture() else { return };
    // b's queue raises an event on a channel: the test learns that the stale completion is in
    // the queue without polling it.
    let channel = f.context.create_comp_channel().unwrap();
    let mut cq_a = f.cq(16);
    let mut cq_b = f.context.cq_builder(16).channel(&channel).build().unwrap();
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let stale_buf = f.pd.register(64, LOCAL).unwrap();
    let first = f.pd.register(64, LOCAL).unwrap();
    cq_b.req_notify(false).unwrap();
    // SAFETY: both regions outlive the requests: the send's completion is polled below, and
    // the receive's completion is in b's queue (the channel's event says so) before the scope
    // discards it.
    unsafe {
        b.post_recv_one(&RecvRequest::new(stale_buf.slice(..).unwrap()).tag(900))
            .unwrap();
        a.post_send_one(&SendRequest::send(first.slice(..).unwrap()).tag(901))
            .unwrap();
    }
    assert_ok(&wait_for(&mut cq_a, 1)[0], 901, WcOpcode::Send);
    let event = channel.wait(WAIT).expect("the receive completed");
    assert!(event.is_for(&cq_b));

    let mut inbox = f.pd.register(64, LOCAL).unwrap();
    let mut src = f.pd.register(64, LOCAL).unwrap();
    src.as_mut_slice()
        .unwrap()
        .copy_from_slice(&pattern(64, 77));
    {
        let target = inbox.slice_mut(..).unwrap();
        b.scope(ScopeCqs::shared(&mut cq_b), |sb| {
            sb.recv(1, &target).unwrap();
            // Nothing has been sent to this receive: it must stay outstanding.
            let mut buf = [WorkCompletion::default(); 4];
            let quiet_until = std::time::Instant::now() + QUIET;
            while std::time::Instant::now() < quiet_until {
                let got = sb.poll(&mut buf).unwrap();
                assert!(got.is_empty(), "a stale completion was reaped: {got:?}");
            }
            assert_eq!(sb.outstanding(), 1);
            a.scope(ScopeCqs::shared(&mut cq_a), |sa| {
                sa.send(SendRequest::send(src.slice(..).unwrap()).tag(2))
                    .unwrap();
                assert_ok(&reap_all(sa)[0], 2, WcOpcode::Send);
            })
            .unwrap();
            let got = reap_all(sb);
            assert_eq!(got.len(), 1, "{got:?}");
            assert_ok(&got[0], 1, WcOpcode::Recv);
        })
        .unwrap();
    }
    assert_eq!(inbox.as_slice().unwrap(), &pattern(64, 77)[..]);
    assert_cq_empty(&mut cq_b);
}

#[test]
fn scope_refuses_a_queue_pair_on_an_srq() {
    let Some(f) = fixture() else { return };
    let mut cq = f.cq(16);
    let srq = f.pd.create_srq(8, 1).unwrap();
    let qp = f.pd.qp_builder::<Rc>(&cq, &cq).srq(&srq).build().unwrap();
    // Connected to itself: only the state matters here.
    let qp = qp
        .into_init(&ConnectedInitAttr::new(f.device.port))
        .unwrap();
    let num = qp.qp_num();
    let mut qp = qp
        .into_rtr(&RcRtrAttr::new(f.av(), num, 0))
        .unwrap()
        .into_rts(&RcRtsAttr::new(0))
        .unwrap();
    let ran = qp.scope(ScopeCqs::shared(&mut cq), |_| ());
    assert!(matches!(ran, Err(Error::InvalidArgument(_))), "{ran:?}");
}

/// Runs a scope that must be refused before its closure runs; returns the error.
fn refused<T: Transport>(qp: &mut QueuePair<T, Rts>, cqs: ScopeCqs<'_>) -> Error {
    let mut ran = false;
    let result = qp.scope(cqs, |_| ran = true);
    assert!(!ran, "the closure of a refused scope ran");
    match result {
        Err(error @ Error::InvalidArgument(_)) => error,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

/// A scope on `qp` with `cqs` runs: one receive posted, then flushed and reaped.
fn scope_accepted<T: Transport>(f: &Fixture, qp: &mut QueuePair<T, Rts>, cqs: ScopeCqs<'_>) {
    let mut inbox = f.pd.register(64, LOCAL).unwrap();
    let target = inbox.slice_mut(..).unwrap();
    qp.scope(cqs, |s| {
        s.recv(1, &target).unwrap();
        assert_eq!(s.flush_outstanding().unwrap(), 1);
        assert_eq!(s.outstanding(), 0);
    })
    .unwrap();
    assert_eq!(qp.query_state().unwrap(), QpStateKind::Error);
}

/// The attack the check closes: a scope given a CQ that is not its queue pair's would count
/// nothing (the flush completion of its receive lands in the real CQ, unpolled), and a later
/// scope would count that stale completion as its own while its real receive is still posted.
#[test]
fn scope_refuses_completion_queues_that_are_not_the_queue_pairs() {
    let Some(f) = fixture() else { return };
    let (cq_a, mut cq_b, mut other) = (f.cq(16), f.cq(16), f.cq(16));
    let (_a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    // Another queue of the same device.
    refused(&mut b, ScopeCqs::shared(&mut other));
    // `split` for a queue pair with one queue, even when one of the two is the right one.
    refused(&mut b, ScopeCqs::split(&mut cq_b, &mut other));
    refused(&mut b, ScopeCqs::split(&mut other, &mut cq_b));
    // A queue of another context of the same device: another queue, with the same numbers.
    let second = Context::open(&f.device.name).expect("a second context");
    let mut foreign = second.create_cq(16).unwrap();
    refused(&mut b, ScopeCqs::shared(&mut foreign));
    // The right queue is accepted, and the queue pair still works after the refusals.
    scope_accepted(&f, &mut b, ScopeCqs::shared(&mut cq_b));
    assert_cq_empty(&mut cq_b);
}

#[test]
fn scope_refuses_swapped_or_foreign_split_queues() {
    let Some(f) = fixture() else { return };
    let (send_a, recv_a) = (f.cq(16), f.cq(16));
    let (mut send_b, mut recv_b) = (f.cq(16), f.cq(16));
    let (_a, mut b) = f.rc_pair(
        f.pd.qp_builder(&send_a, &recv_a),
        f.pd.qp_builder(&send_b, &recv_b),
        AccessFlags::empty(),
    );
    // `shared` for a queue pair with two queues.
    refused(&mut b, ScopeCqs::shared(&mut send_b));
    refused(&mut b, ScopeCqs::shared(&mut recv_b));
    // Swapped: the send queue given as receive queue.
    refused(&mut b, ScopeCqs::split(&mut recv_b, &mut send_b));
    // The right pair works.
    scope_accepted(&f, &mut b, ScopeCqs::split(&mut send_b, &mut recv_b));
}

/// A queue another queue pair uses would mix its completions into the scope's count (or the
/// scope would drop them): refused, and accepted again once the other queue pair is gone.
#[test]
fn scope_refuses_a_queue_another_queue_pair_uses() {
    let Some(f) = fixture() else { return };
    let (cq_a, mut cq_b) = (f.cq(16), f.cq(32));
    let (_a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    // A second queue pair completing into b's queue, for receives only.
    let neighbour = f.pd.qp_builder::<Rc>(&cq_a, &cq_b).build().unwrap();
    let error = refused(&mut b, ScopeCqs::shared(&mut cq_b));
    assert!(error.to_string().contains("another queue pair"), "{error}");
    drop(neighbour);
    scope_accepted(&f, &mut b, ScopeCqs::shared(&mut cq_b));
}

/// The same attack with a queue of a second device: a queue pair number exists on both
/// devices, so matching completions by number alone would accept it.
#[test]
fn scope_refuses_a_queue_of_another_device() {
    let Some(f) = fixture() else { return };
    let Some(name) = rdma_test_support::second_device() else {
        return;
    };
    assert_ne!(
        name, f.device.name,
        "the second device must be another device"
    );
    let other_device = Context::open(&name).expect("open the second device");
    let mut foreign = other_device.create_cq(16).unwrap();
    let (cq_a, cq_b) = (f.cq(16), f.cq(16));
    let (_a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    // A queue pair on the second device with b's number would complete into `foreign`;
    // whatever the numbers, the queue is not b's.
    refused(&mut b, ScopeCqs::shared(&mut foreign));
}

/// The last resort of a scope's end: the flush cannot complete (the completion queue is too
/// small for the flush completions, which rxe then drops), so the scope resets the queue pair
/// and empties its queue. After reconnecting, a new scope counts only its own completion: its
/// receive is really done, with the peer's bytes in it, when the scope ends.
#[test]
fn scope_reset_leaves_no_stale_completion_for_the_next_scope() {
    let Some(f) = fixture() else { return };
    let mut cq_a = f.cq(16);
    // Room for far fewer completions than the receives about to be flushed: the device flushes
    // them in one burst, faster than a poller can make room, so some are dropped and the flush
    // never completes them all.
    let mut cq_b = f.cq(1);
    let capacity = cq_b.capacity() as usize;
    let posted = 256;
    assert!(capacity < posted / 4, "capacity {capacity}");
    let (a, b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b).max_recv_wr(posted as u32),
        AccessFlags::empty(),
    );
    let mut b = b;
    let mut inbox = f.pd.register(256, LOCAL).unwrap();
    {
        let target = inbox.slice_mut(..).unwrap();
        let result = b.scope(ScopeCqs::shared(&mut cq_b), |s| {
            s.set_drain_timeout(Duration::from_millis(100));
            for id in 0..posted as u64 {
                s.recv(100 + id, &target).unwrap();
            }
        });
        assert!(
            matches!(
                result,
                Err(Error::Incomplete {
                    state: QpStateKind::Reset,
                    ..
                })
            ),
            "{result:?}"
        );
    }
    assert_eq!(b.query_state().unwrap(), QpStateKind::Reset);
    // The scope emptied the queue: nothing stale is left (in RESET nothing more can arrive;
    // the next scope below shows it by counting exactly its own completion).
    assert_cq_empty(&mut cq_b);

    // The type still says RTS: the next scope queries the state and refuses.
    let error = refused(&mut b, ScopeCqs::shared(&mut cq_b));
    assert!(error.to_string().contains("state RESET"), "{error}");
    // Reconnect both ends (a's peer went through RESET), then one SEND into a new receive.
    drop(inbox);
    let (mut a, mut b) = reconnect(&f, a, b);
    send_one_and_check(&f, (&mut a, &mut cq_a), (&mut b, &mut cq_b), 31);
}
