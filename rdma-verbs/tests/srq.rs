//! Shared receive queues on the device: one pool of receives feeding two queue pairs, and the
//! SRQ limit event; SRQ slot rings (receives completed in any order, refusals, a full SRQ, a
//! ring dropped with receives posted, batched fills, two rings and owned receives on one SRQ,
//! an SRQ destroyed under a ring's posted receives).

use rdma_test_support::verbs::*;
use rdma_verbs::{async_event::*, cq::*, mr::*, owned::*, qp::*, slot::*, srq::*, wr::*, *};

const LOCAL: AccessFlags = AccessFlags::LOCAL_WRITE;
const SLOT: usize = 256;

#[test]
fn srq_shared_by_two_queue_pairs() {
    let Some(f) = fixture() else { return };
    let mut srq = f.pd.create_srq(16, 1).expect("ibv_create_srq");
    assert!(srq.capacity() >= 16, "{srq:?}");
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let [(mut a1, mut b1), (mut a2, mut b2)] = pairs_behind(&f, &srq, &cq_a, &cq_b);

    let dst = f.pd.register(4 * SLOT, LOCAL).unwrap();
    let mut recvs = RecvList::with_capacity(4);
    for i in 0..4 {
        recvs
            .push(RecvRequest::new(dst.slice(i * SLOT..(i + 1) * SLOT).unwrap()).tag(i as u64))
            .unwrap();
    }
    // SAFETY: `dst` outlives the polled completions and is read only after them.
    unsafe { srq.post_recv(&mut recvs).unwrap() };

    // Receives cannot go to a queue pair that takes them from an SRQ.
    // SAFETY: refused before anything reaches the device.
    let direct = unsafe { b1.post_recv_one(&RecvRequest::new(dst.slice(..SLOT).unwrap()).tag(9)) };
    assert!(
        matches!(direct, Err(Error::InvalidArgument(_))),
        "{direct:?}"
    );
    let mut list = RecvList::with_capacity(1);
    list.push(RecvRequest::new(dst.slice(..SLOT).unwrap()).tag(9))
        .unwrap();
    // SAFETY: as above.
    let direct = unsafe { b2.post_recv(&mut list) };
    assert!(
        matches!(direct, Err(Error::InvalidArgument(_))),
        "{direct:?}"
    );

    let mut src = f.pd.register(2 * SLOT, LOCAL).unwrap();
    let (one, two) = (pattern(100, 1), pattern(200, 2));
    src.as_mut_slice().unwrap()[..100].copy_from_slice(&one);
    src.as_mut_slice().unwrap()[SLOT..SLOT + 200].copy_from_slice(&two);
    // SAFETY: `src` outlives the polled completions.
    unsafe {
        a1.post_send_one(&SendRequest::send(src.slice(..100).unwrap()).tag(101))
            .unwrap();
    }
    // One at a time, so that the first receive goes to b1's message.
    assert_ok(&wait_for(&mut cq_a, 1)[0], 101, WcOpcode::Send);
    // SAFETY: as above.
    unsafe {
        a2.post_send_one(&SendRequest::send(src.slice(SLOT..SLOT + 200).unwrap()).tag(102))
            .unwrap();
    }
    assert_ok(&wait_for(&mut cq_a, 1)[0], 102, WcOpcode::Send);

    let received = wait_for(&mut cq_b, 2);
    // The SRQ hands out its receives in order, whichever queue pair takes them.
    assert_ok(&received[0], 0, WcOpcode::Recv);
    assert_ok(&received[1], 1, WcOpcode::Recv);
    assert_eq!(received[0].qp_num(), b1.qp_num(), "{:?}", received[0]);
    assert_eq!(received[1].qp_num(), b2.qp_num(), "{:?}", received[1]);
    assert_eq!(received[0].byte_len(), 100);
    assert_eq!(received[1].byte_len(), 200);
    let got = dst.as_slice().unwrap();
    assert_eq!(&got[..100], &one[..]);
    assert_eq!(&got[SLOT..SLOT + 200], &two[..]);
    assert!(
        got[2 * SLOT..].iter().all(|&x| x == 0),
        "slots 2 and 3 unused"
    );

    // Both peers at once now: two more receives left in the pool, one message each.
    // SAFETY: as above.
    unsafe {
        a2.post_send_one(&SendRequest::send(src.slice(SLOT..SLOT + 200).unwrap()).tag(103))
            .unwrap();
        a1.post_send_one(&SendRequest::send(src.slice(..100).unwrap()).tag(104))
            .unwrap();
    }
    assert_eq!(wait_for(&mut cq_a, 2).len(), 2);
    let received = wait_for(&mut cq_b, 2);
    let mut by_qp: Vec<(u32, u64, u32)> = received
        .iter()
        .map(|wc| {
            assert!(wc.is_success(), "{wc:?}");
            (wc.qp_num(), wc.wr_id(), wc.byte_len())
        })
        .collect();
    by_qp.sort();
    let mut expected = vec![b1.qp_num(), b2.qp_num()];
    expected.sort();
    assert_eq!(
        by_qp.iter().map(|x| x.0).collect::<Vec<_>>(),
        expected,
        "{received:?}"
    );
    let got = dst.as_slice().unwrap();
    for (qp_num, wr_id, len) in by_qp {
        assert!(wr_id == 2 || wr_id == 3, "{wr_id}");
        let slot = &got[wr_id as usize * SLOT..][..len as usize];
        if qp_num == b1.qp_num() {
            assert_eq!(slot, &one[..]);
        } else {
            assert_eq!(slot, &two[..]);
        }
    }
}

#[test]
fn srq_limit_event() {
    let Some(f) = fixture() else { return };
    let mut srq = f.pd.create_srq(16, 1).expect("ibv_create_srq");
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, _b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b).srq(&srq),
        AccessFlags::empty(),
    );
    assert_eq!(srq.limit().unwrap(), 0, "a new SRQ is not armed");
    let dst = f.pd.register(4 * 64, LOCAL).unwrap();
    for i in 0..4usize {
        // SAFETY: `dst` outlives the completions polled below.
        unsafe {
            srq.post_recv_one(
                &RecvRequest::new(dst.slice(i * 64..(i + 1) * 64).unwrap()).tag(i as u64),
            )
            .unwrap();
        }
    }
    srq.arm_limit(2).expect("arm the SRQ limit");
    assert_eq!(srq.limit().unwrap(), 2);
    assert!(
        f.context.get_async_event().unwrap().is_none(),
        "no event yet"
    );

    let src = f.pd.register(64, LOCAL).unwrap();
    let mut send = |wr_id: u64| {
        // SAFETY: `src` outlives the polled completion.
        unsafe {
            a.post_send_one(&SendRequest::send(src.slice(..).unwrap()).tag(wr_id))
                .unwrap();
        }
        assert_ok(&wait_for(&mut cq_a, 1)[0], wr_id, WcOpcode::Send);
    };
    // Four posted, limit 2: two consumed leaves two, not below the limit.
    send(10);
    send(11);
    assert_eq!(wait_for(&mut cq_b, 2).len(), 2);
    // The event and the disarming happen together, when a receive is taken (before its
    // completion): still armed means no event, with no time window to guess.
    assert_eq!(srq.limit().unwrap(), 2, "still armed");
    assert!(
        f.context.get_async_event().unwrap().is_none(),
        "no event expected at the limit"
    );

    // The third leaves one: below the limit.
    send(12);
    let wc = wait_for(&mut cq_b, 1)[0];
    assert_ok(&wc, 2, WcOpcode::Recv);
    let event = f
        .context
        .wait_async_event(WAIT)
        .expect("the SRQ limit event");
    assert_eq!(
        event,
        AsyncEvent::SrqLimitReached {
            srq_handle: srq.handle()
        }
    );
    assert_eq!(event.type_name(), "IBV_EVENT_SRQ_LIMIT_REACHED");
    // The event disarms the limit.
    assert_eq!(srq.limit().unwrap(), 0);

    // Disarmed: the last receive goes without another event.
    send(13);
    assert_ok(&wait_for(&mut cq_b, 1)[0], 3, WcOpcode::Recv);
    // A second event would have been raised when that receive was taken, before its
    // completion: QUIET covers only its delivery.
    match f.context.wait_async_event(QUIET) {
        Err(Error::Timeout(_)) => {}
        other => panic!("the limit fired twice: {other:?}"),
    }
}

/// The construction shape: `create_*` makes the object with defaults, `*_builder` takes
/// options. An SRQ built with a limit has it armed (`ibv_create_srq` ignores one, so the
/// builder sets it with `ibv_modify_srq`); a limit above the capacity is refused. A queue pair
/// from `create_qp` has the default capacities (at least what was asked) and starts in RESET.
#[test]
fn create_and_builder_shapes_for_srq_and_qp() {
    let Some(f) = fixture() else { return };
    let srq = f.pd.create_srq(16, 1).unwrap();
    assert_eq!(
        srq.limit().unwrap(),
        0,
        "create_srq leaves the limit disarmed"
    );
    assert!(srq.capacity() >= 16 && srq.max_sge() >= 1, "{srq:?}");
    let armed =
        f.pd.srq_builder(32)
            .max_sge(2)
            .srq_limit(5)
            .build()
            .unwrap();
    assert_eq!(armed.limit().unwrap(), 5);
    assert!(armed.capacity() >= 32 && armed.max_sge() >= 2, "{armed:?}");
    match f.pd.srq_builder(8).srq_limit(1 << 20).build() {
        Err(Error::Verb { verb, .. }) => assert_eq!(verb, "ibv_modify_srq"),
        other => panic!("a limit above the capacity: {other:?}"),
    }

    let cq = f.cq(16);
    let qp = f.pd.create_qp::<Rc>(&cq, &cq).unwrap();
    assert_eq!(qp.query_state().unwrap(), QpStateKind::Reset);
    let (caps, asked) = (qp.caps(), QpCaps::default());
    assert!(
        caps.max_send_wr >= asked.max_send_wr && caps.max_recv_wr >= asked.max_recv_wr,
        "{caps:?}"
    );
    assert!(!qp.uses_extended_post());
}

/// Two RC pairs on one device, `[(a1, b1), (a2, b2)]`: each `a` on `cq_a`, each `b` on `cq_b`
/// taking its receives from `srq`.
fn pairs_behind(
    f: &Fixture,
    srq: &SharedReceiveQueue,
    cq_a: &CompletionQueue,
    cq_b: &CompletionQueue,
) -> [(QueuePair<Rc, Rts>, QueuePair<Rc, Rts>); 2] {
    [(); 2].map(|()| {
        f.rc_pair(
            f.pd.qp_builder(cq_a, cq_a),
            f.pd.qp_builder(cq_b, cq_b).srq(srq),
            AccessFlags::empty(),
        )
    })
}

/// A message of `len` bytes from sender `sender` in `round`: no two of the test alike.
fn srq_message(sender: u8, round: u64, len: usize) -> Vec<u8> {
    pattern(len, (round as u8).wrapping_mul(2).wrapping_add(sender))
}

/// An SRQ slot ring of 6 slots feeds two queue pairs for 40 rounds, each peer sending one
/// message of a length that varies per round. The receive completions are handed to the ring
/// in the reverse of the order they were polled, and every fourth round one is held back two
/// rounds (its slot stays out of the SRQ meanwhile): each slot comes back with exactly the
/// bytes its sender sent, whichever queue pair consumed it, and is posted again. A copy of a
/// completion, a send completion and a slot of another ring match nothing or are refused.
#[test]
fn srq_slot_ring_feeds_two_queue_pairs_in_any_order() {
    let Some(f) = fixture() else { return };
    let mut srq = f.pd.create_srq(16, 1).expect("ibv_create_srq");
    let (mut cq_a, mut cq_b) = (f.cq(32), f.cq(32));
    let [(mut a1, b1), (mut a2, b2)] = pairs_behind(&f, &srq, &cq_a, &cq_b);
    let mut rx = srq.slot_ring(6, SLOT).unwrap();
    assert!(rx.is_for(&srq));
    assert_eq!((rx.slot_count(), rx.slot_size()), (6, SLOT));
    // Each receive is tagged with a number of its own, which its slot must come back with,
    // whatever order the completions come in.
    let mut tags = ([0u64; 6], 1u64);
    fn post(
        srq: &mut SharedReceiveQueue,
        rx: &mut SrqSlotRing,
        slot: Slot,
        (tags, next): &mut ([u64; 6], u64),
    ) {
        tags[slot.index() as usize] = *next;
        srq.post_recv_slot(rx, RecvRequest::new(slot).tag(*next))
            .unwrap();
        *next += 1;
    }
    let tag_of = |tags: &([u64; 6], u64), slot: &Slot| tags.0[slot.index() as usize];
    while let Some(slot) = rx.take() {
        post(&mut srq, &mut rx, slot, &mut tags);
    }
    assert_eq!(rx.posted(), 6);
    let (mut tx1, mut tx2) = (
        a1.slot_ring(1, SLOT).unwrap(),
        a2.slot_ring(1, SLOT).unwrap(),
    );
    let mut held: Option<(WorkCompletion, Vec<u8>, u64)> = None;
    for round in 0..40u64 {
        let len = 1 + (round as usize * 37) % SLOT;
        let (m1, m2) = (
            srq_message(1, round, len),
            srq_message(2, round, SLOT - len + 1),
        );
        send_from_slot(&mut a1, &mut tx1, &mut cq_a, &m1);
        send_from_slot(&mut a2, &mut tx2, &mut cq_a, &m2);
        let mut got = wait_for(&mut cq_b, 2);
        got.reverse();
        for (n, wc) in got.iter().enumerate() {
            assert_eq!(
                (wc.status(), wc.opcode()),
                (WcStatus::Success, WcOpcode::Recv),
                "round {round}: {wc:?}"
            );
            let want = if wc.qp_num() == b1.qp_num() {
                &m1
            } else {
                assert_eq!(wc.qp_num(), b2.qp_num(), "round {round}: {wc:?}");
                &m2
            };
            if round % 4 == 0 && n == 0 {
                held = Some((*wc, want.clone(), round));
                continue;
            }
            let slot = rx.complete(wc).expect("a receive of the ring");
            assert_eq!(slot.len(), want.len());
            assert_eq!(
                slot.tag(),
                tag_of(&tags, &slot),
                "round {round}: its receive's tag"
            );
            assert_eq!(rx.bytes(&slot).unwrap(), &want[..], "round {round}");
            assert!(rx.complete(wc).is_none(), "a copy of the completion");
            post(&mut srq, &mut rx, slot, &mut tags);
        }
        if round % 4 == 2 {
            let (wc, want, from) = held.take().expect("a held completion");
            assert!(rx.posted() == 6, "the held slot is still the ring's");
            let slot = rx.complete(&wc).expect("a completion held two rounds");
            assert_eq!(
                rx.bytes(&slot).unwrap(),
                &want[..],
                "held from round {from}"
            );
            assert_eq!(slot.tag(), tag_of(&tags, &slot), "held from round {from}");
            post(&mut srq, &mut rx, slot, &mut tags);
        }
    }
    assert_eq!(rx.posted(), 6);
    // A send completion, and a default one (`wr_id` 0), match nothing.
    let mut out = tx1.take().unwrap();
    tx1.fill(&mut out, &[7; 8]).unwrap();
    a1.post_send_slot(&mut tx1, SendRequest::send(out)).unwrap();
    let sent = wait_for(&mut cq_a, 1);
    let got = wait_for(&mut cq_b, 1);
    assert!(rx.complete(&sent[0]).is_none(), "a send completion");
    assert!(
        tx1.complete(&got[0]).is_none(),
        "the SRQ ring's receive, to a send ring"
    );
    let back = tx1.complete(&sent[0]).expect("the send's slot");
    tx1.put(back).unwrap();
    assert!(rx.complete(&WorkCompletion::default()).is_none());
    let slot = rx.complete(&got[0]).expect("the last receive");
    assert_eq!(rx.bytes(&slot).unwrap(), &[7; 8]);
    // Slots of one ring are refused by the others, and come back.
    let refused = a1
        .post_recv_slot(&mut tx1, RecvRequest::new(slot))
        .unwrap_err();
    assert!(
        matches!(refused.error(), Error::InvalidArgument(_)),
        "{refused:?}"
    );
    let slot = refused.into_slot().expect("given back");
    let foreign = tx1.take().unwrap();
    let refused = srq
        .post_recv_slot(&mut rx, RecvRequest::new(foreign))
        .unwrap_err();
    assert!(
        matches!(refused.error(), Error::InvalidArgument(why) if why.contains("another ring")),
        "{refused:?}"
    );
    tx1.put(refused.into_slot().unwrap()).unwrap();
    rx.put(slot).unwrap();
    assert_eq!(rx.posted(), 5);
}

/// What an SRQ slot ring refuses, giving the slot back: another SRQ's post, a post beyond a
/// full SRQ (`QueueFull`, the slot not seen by the device). A ring dropped with receives
/// posted: the SRQ keeps its region, so a peer's send still lands and completes; once the SRQ
/// is destroyed nothing of the ring's is left holding the protection domain.
#[test]
fn srq_slot_ring_refusals_and_a_ring_dropped_with_receives_posted() {
    let Some(f) = fixture() else { return };
    let pd = f.context.alloc_pd().unwrap();
    let mut srq = pd.create_srq(4, 1).expect("ibv_create_srq");
    let mut other = pd.create_srq(4, 1).expect("ibv_create_srq");
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, b) = f.rc_pair(
        pd.qp_builder(&cq_a, &cq_a),
        pd.qp_builder(&cq_b, &cq_b).srq(&srq),
        AccessFlags::empty(),
    );
    let count = 4 * srq.capacity() + 8;
    let mut rx = srq.slot_ring(count, SLOT).unwrap();
    assert!(rx.is_for(&srq) && !rx.is_for(&other));
    match srq.slot_ring(MAX_SRQ_SLOTS + 1, 8) {
        Err(Error::InvalidArgument(_)) => {}
        other => panic!("a ring over MAX_SRQ_SLOTS: {other:?}"),
    }

    let slot = rx.take().unwrap();
    let refused = other
        .post_recv_slot(&mut rx, RecvRequest::new(slot))
        .unwrap_err();
    assert!(
        matches!(refused.error(), Error::InvalidArgument(why) if why.contains("another shared receive queue")),
        "{refused:?}"
    );
    rx.put(refused.into_slot().expect("given back")).unwrap();
    assert_eq!(rx.posted(), 0);

    // Fill the SRQ: the post it cannot take is refused, its slot back.
    let mut posted = 0;
    loop {
        let slot = rx.take().expect("the SRQ took every slot of the ring");
        match srq.post_recv_slot(&mut rx, RecvRequest::new(slot)) {
            Ok(()) => posted += 1,
            Err(refused) => {
                assert!(
                    matches!(refused.error(), Error::QueueFull { .. }),
                    "{refused:?}"
                );
                rx.put(refused.into_slot().expect("the device never saw it"))
                    .unwrap();
                break;
            }
        }
    }
    note(&format!(
        "an SRQ granted {} receives took {posted}",
        srq.capacity()
    ));
    assert!(posted >= srq.capacity(), "{posted} posted");
    assert_eq!(rx.posted(), posted);

    let mut tx = a.slot_ring(1, SLOT).unwrap();
    let first = pattern(SLOT, 41);
    send_from_slot(&mut a, &mut tx, &mut cq_a, &first);
    let got = wait_for(&mut cq_b, 1);
    let slot = rx.complete(&got[0]).expect("the first receive");
    assert_eq!(rx.bytes(&slot).unwrap(), &first[..]);
    rx.put(slot).unwrap();
    assert_eq!(rx.posted(), posted - 1);
    drop(rx);
    // The ring is gone, its receives posted: the SRQ keeps the region they name.
    send_from_slot(&mut a, &mut tx, &mut cq_a, &pattern(SLOT, 42));
    let got = wait_for(&mut cq_b, 1);
    assert_eq!(
        (got[0].status(), got[0].opcode(), got[0].byte_len()),
        (WcStatus::Success, WcOpcode::Recv, SLOT as u32),
        "{:?}",
        got[0]
    );
    drop((tx, a, b));
    let pd = match pd.close() {
        Err((pd, Error::Verb { .. })) => pd,
        other => panic!("the SRQs still hold the domain: {other:?}"),
    };
    srq.close().expect("ibv_destroy_srq");
    other.close().expect("ibv_destroy_srq");
    drop((cq_a, cq_b));
    pd.close()
        .expect("the ring's region went with the SRQ: nothing holds the domain");
}

/// `fill_slot_ring` posts every free slot in chains of up to 32 and stops without an error at
/// a full SRQ, part way through a chain on rxe (which takes 63 for 48; the slots the SRQ did
/// not take stay free), having posted exactly as many as single posts to an SRQ made alike
/// could; a second fill of the full SRQ posts nothing. After 40 messages over two queue pairs,
/// each slot checked byte for byte and given back to the ring, a fill posts exactly those 40
/// again. A ring of another SRQ is refused, nothing posted.
#[test]
fn srq_slot_ring_fill_in_batches() {
    let Some(f) = fixture() else { return };
    let mut srq = f.pd.create_srq(48, 1).expect("ibv_create_srq");
    let mut other = f.pd.create_srq(4, 1).expect("ibv_create_srq");
    let (mut cq_a, mut cq_b) = (f.cq(64), f.cq(64));
    let [(mut a1, b1), (mut a2, _b2)] = pairs_behind(&f, &srq, &cq_a, &cq_b);
    let count = 4 * srq.capacity() + 40;
    let mut rx = srq.slot_ring(count, SLOT).unwrap();
    match other.fill_slot_ring(&mut rx) {
        Err(Error::InvalidArgument(why)) if why.contains("another shared receive queue") => {}
        refused => panic!("another SRQ's ring: {refused:?}"),
    }
    assert_eq!(rx.posted(), 0);
    // How many receives an SRQ made alike takes one post at a time, until one is refused.
    let takes = {
        let mut probe = f.pd.create_srq(48, 1).expect("ibv_create_srq");
        let mut ring = probe.slot_ring(count, 8).unwrap();
        loop {
            let slot = ring.take().expect("the probe SRQ took every slot");
            if let Err(refused) = probe.post_recv_slot(&mut ring, RecvRequest::new(slot)) {
                assert!(
                    matches!(refused.error(), Error::QueueFull { .. }),
                    "{refused:?}"
                );
                break ring.posted();
            }
        }
    };
    let posted = srq.fill_slot_ring(&mut rx).unwrap();
    note(&format!(
        "an SRQ granted {} receives took {posted} in one fill ({} chains of 32 and {} more)",
        srq.capacity(),
        posted / 32,
        posted % 32
    ));
    assert_eq!(posted, takes, "the fill posts what single posts could");
    assert!(
        posted >= srq.capacity() && posted < count,
        "{posted} of {count} posted"
    );
    assert_eq!(rx.posted(), posted);
    assert_eq!(srq.fill_slot_ring(&mut rx).unwrap(), 0, "the SRQ is full");
    assert_eq!(rx.posted(), posted);

    let (mut tx1, mut tx2) = (
        a1.slot_ring(1, SLOT).unwrap(),
        a2.slot_ring(1, SLOT).unwrap(),
    );
    for round in 0..40u64 {
        let m = srq_message((round % 2) as u8, round, 1 + round as usize * 5);
        if round % 2 == 0 {
            send_from_slot(&mut a1, &mut tx1, &mut cq_a, &m);
        } else {
            send_from_slot(&mut a2, &mut tx2, &mut cq_a, &m);
        }
        let got = wait_for(&mut cq_b, 1);
        assert_eq!(
            got[0].qp_num() == b1.qp_num(),
            round % 2 == 0,
            "{:?}",
            got[0]
        );
        let slot = rx.complete(&got[0]).expect("a receive of the ring");
        assert_eq!(rx.bytes(&slot).unwrap(), &m[..], "round {round}");
        rx.put(slot).unwrap();
    }
    assert_eq!(rx.posted(), posted - 40);
    assert_eq!(
        srq.fill_slot_ring(&mut rx).unwrap(),
        40,
        "exactly the room made"
    );
    assert_eq!(rx.posted(), posted);
    assert_eq!(srq.fill_slot_ring(&mut rx).unwrap(), 0);
}

/// Two SRQ slot rings and owned receives (`post_recv_buf`) post to one SRQ behind two queue
/// pairs; eight messages consume all eight receives. Every completion is offered to both
/// rings and `poll_each` routes it: exactly one of the three claims it (a ring returns `None`
/// for the other ring's and for the owned ones; an owned completion carries its tag and
/// buffer), and its bytes are exactly those its sender sent. Each path gets back exactly what
/// it posted.
#[test]
fn srq_slot_rings_and_owned_receives_share_one_srq() {
    let Some(f) = fixture() else { return };
    let mut srq = f.pd.create_srq(16, 1).expect("ibv_create_srq");
    let (mut cq_a, mut cq_b) = (f.cq(32), f.cq(32));
    let [(mut a1, b1), (mut a2, b2)] = pairs_behind(&f, &srq, &cq_a, &cq_b);
    let (mut rx1, mut rx2) = (
        srq.slot_ring(3, SLOT).unwrap(),
        srq.slot_ring(3, SLOT).unwrap(),
    );
    let pool = BufferPool::new(&f.pd, 2, SLOT).unwrap();
    assert_eq!(srq.fill_slot_ring(&mut rx1).unwrap(), 3);
    for tag in [100, 101] {
        srq.post_recv_buf(pool.take().unwrap(), tag).unwrap();
    }
    assert_eq!(srq.fill_slot_ring(&mut rx2).unwrap(), 3);
    assert_eq!((srq.owned_in_flight(), pool.available()), (2, 0));

    let (mut tx1, mut tx2) = (
        a1.slot_ring(1, SLOT).unwrap(),
        a2.slot_ring(1, SLOT).unwrap(),
    );
    // Per receiving queue pair, its messages in the order sent (a queue pair's receives
    // complete in the order its peer sent).
    let (mut for_b1, mut for_b2) = (Vec::new(), Vec::new());
    for m in 0..8u64 {
        let message = srq_message((m % 2) as u8, m, 16 + m as usize * 29);
        if m % 2 == 0 {
            send_from_slot(&mut a1, &mut tx1, &mut cq_a, &message);
            for_b1.push(message);
        } else {
            send_from_slot(&mut a2, &mut tx2, &mut cq_a, &message);
            for_b2.push(message);
        }
    }
    let (mut next_b1, mut next_b2) = (for_b1.iter(), for_b2.iter());
    let mut claimed = [0u32; 3];
    for mut c in reap(&mut cq_b, 8) {
        assert_eq!(
            (c.status(), c.wc().opcode()),
            (WcStatus::Success, WcOpcode::Recv),
            "{c:?}"
        );
        let want = if c.wc().qp_num() == b1.qp_num() {
            next_b1.next()
        } else {
            assert_eq!(c.wc().qp_num(), b2.qp_num(), "{c:?}");
            next_b2.next()
        };
        let want = want.expect("no more receives than messages sent");
        let (one, two) = (rx1.complete(c.wc()), rx2.complete(c.wc()));
        match (one, two, c.tag()) {
            (Some(slot), None, None) => {
                assert_eq!(rx1.bytes(&slot).unwrap(), &want[..]);
                rx1.put(slot).unwrap();
                claimed[0] += 1;
            }
            (None, Some(slot), None) => {
                assert_eq!(rx2.bytes(&slot).unwrap(), &want[..]);
                rx2.put(slot).unwrap();
                claimed[1] += 1;
            }
            (None, None, Some(tag)) => {
                assert!(tag == 100 || tag == 101, "{c:?}");
                assert_eq!(&c.take_buf().expect("its buffer")[..], &want[..]);
                claimed[2] += 1;
            }
            (one, two, tag) => panic!(
                "claimed by ring 1: {}, ring 2: {}, owned: {tag:?}: {c:?}",
                one.is_some(),
                two.is_some()
            ),
        }
    }
    assert_eq!(claimed, [3, 3, 2], "each path got back what it posted");
    assert!(next_b1.next().is_none() && next_b2.next().is_none());
    assert_eq!((rx1.posted(), rx2.posted()), (0, 0));
    assert_eq!((srq.owned_in_flight(), pool.available()), (0, 2));
    assert_no_completion(&mut cq_b, QUIET);
}

/// An SRQ destroyed while a slot ring of it has receives posted: `close` succeeds once no
/// queue pair uses the SRQ, and the device is done with the receives (the SRQ is gone). The
/// ring still counts them as posted (no completion came) and never hands their slots out; its
/// free slots stay usable; no completion matches. Dropping the ring afterwards releases the
/// region: nothing holds the protection domain.
#[test]
fn srq_destroyed_while_its_slot_ring_has_receives_posted() {
    let Some(f) = fixture() else { return };
    let pd = f.context.alloc_pd().unwrap();
    let mut srq = pd.create_srq(4, 1).expect("ibv_create_srq");
    let (cq_a, cq_b) = (f.cq(8), f.cq(8));
    let (a, b) = f.rc_pair(
        pd.qp_builder(&cq_a, &cq_a),
        pd.qp_builder(&cq_b, &cq_b).srq(&srq),
        AccessFlags::empty(),
    );
    let mut rx = srq.slot_ring(4, SLOT).unwrap();
    for _ in 0..2 {
        let slot = rx.take().unwrap();
        srq.post_recv_slot(&mut rx, RecvRequest::new(slot)).unwrap();
    }
    let srq = match srq.close() {
        Err((srq, Error::Verb { .. })) => srq,
        other => panic!("a queue pair still uses the SRQ: {other:?}"),
    };
    drop((a, b));
    srq.close().expect("ibv_destroy_srq with receives posted");
    assert_eq!(rx.posted(), 2, "no completion came for them");
    let mut taken = Vec::new();
    while let Some(mut slot) = rx.take() {
        rx.bytes_mut(&mut slot).unwrap().fill(0x5a);
        assert_eq!(rx.bytes(&slot).unwrap(), &[0x5a; SLOT][..]);
        taken.push(slot);
    }
    assert_eq!(taken.len(), 2, "only the free slots are handed out");
    for slot in taken {
        rx.put(slot).unwrap();
    }
    drop(rx);
    drop((cq_a, cq_b));
    pd.close()
        .expect("the SRQ and the ring are gone: nothing holds the domain");
}
