//! Shared receive queues on the device: one pool of receives feeding two queue pairs, and the
//! SRQ limit event.

mod common;

use common::*;
use rdma_verbs::*;

const LOCAL: AccessFlags = AccessFlags::LOCAL_WRITE;
const SLOT: usize = 256;

#[test]
fn srq_shared_by_two_queue_pairs() {
    let Some(f) = fixture() else { return };
    let mut srq = f.pd.create_srq(16, 1).expect("ibv_create_srq");
    assert!(srq.capacity() >= 16, "{srq:?}");
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a1, mut b1) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b).srq(&srq),
        AccessFlags::empty(),
    );
    let (mut a2, mut b2) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b).srq(&srq),
        AccessFlags::empty(),
    );

    let dst = f.pd.register(4 * SLOT, LOCAL).unwrap();
    let mut recvs = RecvList::with_capacity(4);
    for i in 0..4 {
        recvs
            .push(RecvRequest::new(
                i as u64,
                dst.slice(i * SLOT..(i + 1) * SLOT).unwrap(),
            ))
            .unwrap();
    }
    // SAFETY: `dst` outlives the polled completions and is read only after them.
    unsafe { srq.post_recv(&mut recvs).unwrap() };

    // Receives cannot go to a queue pair that takes them from an SRQ.
    // SAFETY: refused before anything reaches the device.
    let direct = unsafe { b1.post_recv_one(&RecvRequest::new(9, dst.slice(..SLOT).unwrap())) };
    assert!(
        matches!(direct, Err(Error::InvalidArgument(_))),
        "{direct:?}"
    );
    let mut list = RecvList::with_capacity(1);
    list.push(RecvRequest::new(9, dst.slice(..SLOT).unwrap()))
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
        a1.post_send_one(&SendRequest::send(101, src.slice(..100).unwrap()).signaled())
            .unwrap();
    }
    // One at a time, so that the first receive goes to b1's message.
    assert_ok(&wait_for(&mut cq_a, 1)[0], 101, WcOpcode::Send);
    // SAFETY: as above.
    unsafe {
        a2.post_send_one(&SendRequest::send(102, src.slice(SLOT..SLOT + 200).unwrap()).signaled())
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
        a2.post_send_one(&SendRequest::send(103, src.slice(SLOT..SLOT + 200).unwrap()).signaled())
            .unwrap();
        a1.post_send_one(&SendRequest::send(104, src.slice(..100).unwrap()).signaled())
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
            srq.post_recv_one(&RecvRequest::new(
                i as u64,
                dst.slice(i * 64..(i + 1) * 64).unwrap(),
            ))
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
            a.post_send_one(&SendRequest::send(wr_id, src.slice(..).unwrap()).signaled())
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
