//! Slot rings on the device: a queue pair's own registered slots, posted and handed back by the
//! completions the caller polls, with every byte checked; a receive ring across rounds; queue
//! pairs sharing completion queues (each completion to its own ring, others' ignored);
//! unsignaled sends released by a later signaled one, and the post that must be signaled;
//! RDMA WRITE, READ and both atomics; what a ring refuses, giving the slot back; a ring
//! dropped with receives posted, and one dropped with none; a reset that discarded receives;
//! the error state's flushes; completions handed over out of order; slot and owned requests
//! on one queue pair and completion queue; a ring whose queue pair was destroyed; `reclaim`
//! after a reset; inline sends; receives posted in batches (`fill_slot_ring`), up to a full
//! receive queue; UD both ways, the address handles kept while their sends are posted; the
//! extended send path.

use rdma_test_support::verbs::*;
use rdma_verbs::{ah::*, cq::*, device::*, mr::*, owned::*, qp::*, scope::*, slot::*, wr::*, *};

const SIZE: usize = 256;

fn message(round: u64) -> Vec<u8> {
    pattern(SIZE, round as u8)
}

/// Hands each completion of `wcs` to `ring`, which must hand back a slot for every one.
fn complete_all(ring: &mut SlotRing, wcs: &[WorkCompletion]) -> Vec<Slot> {
    wcs.iter()
        .map(|wc| {
            ring.complete(wc)
                .unwrap_or_else(|| panic!("a completion of this ring matched nothing: {wc:?}"))
        })
        .collect()
}

/// A receive ring of 8 slots stays posted across 200 rounds: each completion hands its slot
/// back with the bytes received and its receive's tag, in posting order, and it is posted
/// again at once. The send slot comes back with its send completion and the request's tag; a
/// copy of a completion given again matches nothing.
#[test]
fn slot_receive_ring_across_rounds() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(32), f.cq(32));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let mut tx = a.slot_ring(2, SIZE).unwrap();
    let mut rx = b.slot_ring(8, SIZE).unwrap();
    assert!(tx.is_for(&a) && !tx.is_for(&b) && rx.is_for(&b));
    // Each receive is tagged with the round it will take.
    for round in 0..8u64 {
        let slot = rx.take().expect("a free slot");
        b.post_recv_slot(&mut rx, RecvRequest::new(slot).tag(round | 0x100))
            .unwrap();
    }
    assert!(rx.take().is_none());
    assert_eq!(rx.posted(), 8);
    for round in 0..200u64 {
        let mut slot = tx.take().expect("a send slot");
        tx.fill(&mut slot, &message(round)).unwrap();
        a.post_send_slot(&mut tx, SendRequest::send(slot).tag(round << 8 | 0xab))
            .unwrap();
        let sent = wait_for(&mut cq_a, 1);
        assert_eq!(
            (sent[0].status(), sent[0].opcode()),
            (WcStatus::Success, WcOpcode::Send)
        );
        let back = complete_all(&mut tx, &sent).remove(0);
        assert_eq!(back.len(), SIZE, "a send slot comes back as posted");
        assert_eq!(back.tag(), round << 8 | 0xab, "with its request's tag");
        assert!(tx.complete(&sent[0]).is_none(), "the same completion again");
        tx.put(back).unwrap();

        let got = wait_for(&mut cq_b, 1);
        assert_eq!(got[0].opcode(), WcOpcode::Recv);
        assert_eq!(got[0].qp_num(), b.qp_num());
        let slot = complete_all(&mut rx, &got).remove(0);
        assert_eq!(
            slot.index(),
            (round % 8) as u32,
            "receives complete in order"
        );
        assert_eq!(slot.len(), SIZE, "the length is what arrived");
        assert_eq!(slot.tag(), round | 0x100, "with its receive's tag");
        assert_eq!(
            rx.bytes(&slot).unwrap(),
            &message(round)[..],
            "round {round}"
        );
        assert!(rx.complete(&got[0]).is_none(), "a copy matches nothing");
        assert!(tx.complete(&got[0]).is_none(), "another ring's completion");
        b.post_recv_slot(&mut rx, RecvRequest::new(slot).tag((round + 8) | 0x100))
            .unwrap();
    }
    assert_eq!((rx.posted(), tx.posted()), (8, 0));
    assert_no_completion(&mut cq_a, QUIET);
}

/// Three pairs: their senders share one completion queue and their receivers another. Each
/// sender posts three unsignaled sends and a signaled one; every receive completion is handed
/// to every receive ring, and only its own takes it; the one send completion per pair frees
/// the three unsignaled slots of its ring.
#[test]
fn slot_rings_share_completion_queues_and_unsignaled_sends_return() {
    let Some(f) = fixture() else { return };
    let (mut send_cq, mut recv_cq) = (f.cq(64), f.cq(64));
    let mut pairs = Vec::new();
    for _ in 0..3 {
        let (a, b) = f.rc_pair(
            f.pd.qp_builder(&send_cq, &send_cq).max_send_wr(8),
            f.pd.qp_builder(&recv_cq, &recv_cq).max_recv_wr(8),
            AccessFlags::empty(),
        );
        let (tx, rx) = (a.slot_ring(4, SIZE).unwrap(), b.slot_ring(4, SIZE).unwrap());
        pairs.push((a, b, tx, rx));
    }
    for (p, (a, b, tx, rx)) in pairs.iter_mut().enumerate() {
        while let Some(slot) = rx.take() {
            b.post_recv_slot(rx, RecvRequest::new(slot)).unwrap();
        }
        for m in 0..4u64 {
            let mut slot = tx.take().unwrap();
            tx.fill(&mut slot, &message((p as u64) << 4 | m)).unwrap();
            let request = SendRequest::send(slot);
            let request = if m < 3 { request.unsignaled() } else { request };
            a.post_send_slot(tx, request).unwrap();
        }
        assert_eq!(tx.posted(), 4);
    }
    let received = wait_for(&mut recv_cq, 12);
    let mut seen = std::collections::BTreeSet::new();
    for wc in &received {
        assert!(wc.is_success(), "{wc:?}");
        let mut owners = Vec::new();
        for (p, (_, b, _, rx)) in pairs.iter_mut().enumerate() {
            if let Some(slot) = rx.complete(wc) {
                assert_eq!(wc.qp_num(), b.qp_num(), "only its own ring takes it");
                let m = u64::from(slot.index());
                assert_eq!(
                    rx.bytes(&slot).unwrap(),
                    &message((p as u64) << 4 | m)[..],
                    "pair {p} message {m}"
                );
                assert!(seen.insert((p, m)));
                rx.put(slot).unwrap();
                owners.push(p);
            }
        }
        assert_eq!(owners.len(), 1, "{wc:?} taken by {owners:?}");
    }
    assert_eq!(seen.len(), 12);
    let sent = wait_for(&mut send_cq, 3);
    assert_no_completion(&mut send_cq, QUIET);
    for wc in &sent {
        assert!(wc.is_success(), "{wc:?}");
        let mut taken = 0;
        for (_, _, tx, _) in pairs.iter_mut() {
            if let Some(slot) = tx.complete(wc) {
                taken += 1;
                assert_eq!(slot.index(), 3, "the signaled send's slot");
                assert_eq!(tx.posted(), 0, "the unsignaled ones were freed with it");
                tx.put(slot).unwrap();
            }
        }
        assert_eq!(taken, 1, "{wc:?}");
    }
    for (_, _, tx, rx) in pairs.iter_mut() {
        let free = std::iter::from_fn(|| tx.take()).count();
        assert_eq!((free, tx.posted(), rx.posted()), (4, 0, 0));
    }
}

/// The send that leaves no slot of the ring free is signaled whatever it asked, even where the
/// run of unsignaled sends is still short: its completion comes, and frees the unsignaled
/// ones (and the signaled one before them, whose completion is handed over late).
#[test]
fn slot_the_post_that_takes_the_last_free_slot_is_signaled() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    assert!(a.caps().max_send_wr >= 4, "{:?}", a.caps());
    let mut tx = a.slot_ring(4, 16).unwrap();
    let mut rx = b.slot_ring(4, 16).unwrap();
    while let Some(slot) = rx.take() {
        b.post_recv_slot(&mut rx, RecvRequest::new(slot)).unwrap();
    }
    // A signaled send first: the run of unsignaled ones starts after it.
    let slot = tx.take().unwrap();
    a.post_send_slot(&mut tx, SendRequest::send(slot)).unwrap();
    let first = wait_for(&mut cq_a, 1);
    // Three unsignaled sends, each taken just before it is posted: the third takes the last
    // free slot (the first's is still posted, its completion not handed over), with a run of
    // three, short of the ring's four.
    for n in 0..3 {
        let slot = tx.take().unwrap();
        a.post_send_slot(&mut tx, SendRequest::send(slot).unsignaled())
            .unwrap();
        if n == 1 {
            assert_no_completion(&mut cq_a, QUIET);
        }
    }
    let last = wait_for(&mut cq_a, 1);
    assert_ok(&last[0], last[0].wr_id(), WcOpcode::Send);
    assert_no_completion(&mut cq_a, QUIET);
    let slot = complete_all(&mut tx, &last).remove(0);
    assert_eq!(slot.index(), 3, "the last one posted");
    assert!(tx.complete(&first[0]).is_none(), "freed with the last");
    assert_eq!(tx.posted(), 0);
    assert_eq!(std::iter::from_fn(|| tx.take()).count(), 3);
    tx.put(slot).unwrap();
}

/// RDMA WRITE from a slot, READ into one, and both atomics with their old values, against a
/// remotely writable region of the peer; a fenced READ after an unsignaled fetch-and-add
/// reads the sum, and its completion frees the atomic's slot. Each slot comes back with its
/// request's tag.
#[test]
fn slot_write_read_and_atomics() {
    let Some(f) = fixture() else { return };
    let rights = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let (mut cq_a, cq_b) = (f.cq(16), f.cq(16));
    let (mut a, _b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        rights,
    );
    let mut target =
        f.pd.register(2 * SIZE, AccessFlags::LOCAL_WRITE | rights)
            .unwrap();
    target.write_at(SIZE, &message(77)).unwrap();
    // Slots of 12 bytes: atomics still land 8-byte aligned.
    let mut small = a.slot_ring(3, 12).unwrap();
    let mut ring = a.slot_ring(4, SIZE).unwrap();

    let mut slot = ring.take().unwrap();
    ring.fill(&mut slot, &message(5)).unwrap();
    a.post_send_slot(
        &mut ring,
        SendRequest::write(slot, target.remote(..SIZE).unwrap()).tag(11),
    )
    .unwrap();
    let read = ring.take().unwrap();
    a.post_send_slot(
        &mut ring,
        SendRequest::read(read, target.remote(SIZE..).unwrap()).tag(12),
    )
    .unwrap();
    let done = wait_for(&mut cq_a, 2);
    assert_eq!(
        (done[0].opcode(), done[1].opcode()),
        (WcOpcode::RdmaWrite, WcOpcode::RdmaRead)
    );
    let mut copy = vec![0u8; SIZE];
    target.read_at(0, &mut copy).unwrap();
    assert_eq!(copy, message(5), "the write landed");
    let mut back = complete_all(&mut ring, &done);
    assert_eq!((back[0].tag(), back[1].tag()), (11, 12));
    let read = back.pop().unwrap();
    assert_eq!(ring.bytes(&read).unwrap(), &message(77)[..], "the read");
    ring.put(read).unwrap();
    ring.put(back.pop().unwrap()).unwrap();

    let word = target.remote(..8).unwrap();
    target.write_at(0, &40u64.to_ne_bytes()).unwrap();
    let mut slots: Vec<Slot> = std::iter::from_fn(|| small.take()).collect();
    a.post_send_slot(
        &mut small,
        SendRequest::fetch_add(slots.pop().unwrap(), word, 2).tag(13),
    )
    .unwrap();
    let added = wait_for(&mut cq_a, 1);
    assert_eq!(added[0].opcode(), WcOpcode::FetchAdd);
    let old = complete_all(&mut small, &added).remove(0);
    assert_eq!((old.len(), old.tag()), (8, 13));
    let bytes = small.bytes(&old).unwrap();
    assert_eq!(u64::from_ne_bytes(bytes.try_into().unwrap()), 40);
    a.post_send_slot(
        &mut small,
        SendRequest::compare_swap(old, word, 42, 7).tag(14),
    )
    .unwrap();
    let swapped = wait_for(&mut cq_a, 1);
    assert_eq!(swapped[0].opcode(), WcOpcode::CompSwap);
    let old = complete_all(&mut small, &swapped).remove(0);
    assert_eq!(old.tag(), 14);
    let bytes = small.bytes(&old).unwrap();
    assert_eq!(u64::from_ne_bytes(bytes.try_into().unwrap()), 42);
    assert_eq!(target.load_u64(0).unwrap(), 7);

    let result = slots.pop().unwrap();
    // A slot left free, so that the ring does not signal the fetch-and-add below whatever it
    // asks (it signals every send while none is free).
    small.put(slots.pop().unwrap()).unwrap();
    a.post_send_slot(
        &mut small,
        SendRequest::fetch_add(old, word, 5).unsignaled(),
    )
    .unwrap();
    let mut result = result;
    result.set_len(8);
    a.post_send_slot(&mut small, SendRequest::read(result, word).fenced().tag(15))
        .unwrap();
    let fenced = wait_for(&mut cq_a, 1);
    assert_ok(&fenced[0], fenced[0].wr_id(), WcOpcode::RdmaRead);
    let sum = complete_all(&mut small, &fenced).remove(0);
    assert_eq!(sum.tag(), 15);
    assert_eq!(
        u64::from_ne_bytes(small.bytes(&sum).unwrap().try_into().unwrap()),
        12
    );
    assert_eq!(small.posted(), 0, "the atomic's slot was freed");
    assert_eq!(target.load_u64(0).unwrap(), 12);
    assert_no_completion(&mut cq_a, QUIET);
}

/// What a ring refuses, each time giving the slot back and leaving nothing posted: a ring of
/// another queue pair, a slot of another ring (posting it, reading it, giving it back), a
/// length over the slot size, a READ or WRITE longer than its remote memory, an atomic into a
/// slot of fewer than 8 bytes, a send on UD, a UD receive with no room for the GRH, a full
/// receive queue; and a scope on a queue pair with a ring.
#[test]
fn slot_refusals_give_the_slot_back() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b).max_recv_wr(2),
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
    );
    let mut ring_a = a.slot_ring(8, 16).unwrap();
    let mut ring_b = b.slot_ring(64, 16).unwrap();
    let invalid = |refused: &SlotRefused, what: &str| {
        assert!(
            matches!(refused.error(), Error::InvalidArgument(why) if why.contains(what)),
            "{refused}"
        );
    };

    let slot = ring_a.take().unwrap();
    let refused = b
        .post_recv_slot(&mut ring_a, RecvRequest::new(slot))
        .unwrap_err();
    invalid(&refused, "another queue pair");
    let slot = refused.into_slot().unwrap();
    let refused = b
        .post_recv_slot(&mut ring_b, RecvRequest::new(slot))
        .unwrap_err();
    invalid(&refused, "another ring");
    let mut slot = refused.into_slot().unwrap();
    assert!(matches!(
        ring_b.bytes(&slot),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        ring_b.bytes_mut(&mut slot),
        Err(Error::InvalidArgument(_))
    ));
    let refused = ring_b.put(slot).unwrap_err();
    invalid(&refused, "another ring");
    let mut slot = refused.into_slot().unwrap();

    slot.set_len(17);
    assert!(matches!(
        ring_a.bytes(&slot),
        Err(Error::InvalidArgument(_))
    ));
    let refused = a
        .post_send_slot(&mut ring_a, SendRequest::send(slot))
        .unwrap_err();
    invalid(&refused, "exceeds the slot size");
    let mut slot = refused.into_slot().unwrap();
    assert_eq!(slot.len(), 17);
    slot.set_len(16);
    let remote =
        f.pd.register(8, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
    let refused = a
        .post_send_slot(
            &mut ring_a,
            SendRequest::write(slot, remote.remote(..).unwrap()),
        )
        .unwrap_err();
    invalid(&refused, "remote memory");
    let refused = a
        .post_send_slot(
            &mut ring_a,
            SendRequest::read(refused.into_slot().unwrap(), remote.remote(..).unwrap()),
        )
        .unwrap_err();
    invalid(&refused, "remote memory");
    ring_a.put(refused.into_slot().unwrap()).unwrap();

    let mut tiny = a.slot_ring(1, 4).unwrap();
    let slot = tiny.take().unwrap();
    let refused = a
        .post_send_slot(
            &mut tiny,
            SendRequest::fetch_add(slot, remote.remote(..).unwrap(), 1),
        )
        .unwrap_err();
    invalid(&refused, "exceeds the slot size");
    tiny.put(refused.into_slot().unwrap()).unwrap();

    // UD: no slot sends (the address handle would need keeping), and receives need room for
    // the GRH.
    let ud_cq = f.cq(4);
    let mut ud = f.ud_qp(f.pd.qp_builder(&ud_cq, &ud_cq), 0x1234);
    let mut ud_ring = ud.slot_ring(1, GRH_LEN - 1).unwrap();
    let slot = ud_ring.take().unwrap();
    let refused = ud
        .post_send_slot(&mut ud_ring, SendRequest::send(slot))
        .unwrap_err();
    invalid(&refused, "UD");
    let refused = ud
        .post_recv_slot(&mut ud_ring, RecvRequest::new(refused.into_slot().unwrap()))
        .unwrap_err();
    invalid(&refused, "GRH");
    ud_ring.put(refused.into_slot().unwrap()).unwrap();
    assert_eq!(ud_ring.posted(), 0);

    // A full receive queue: the provider refuses the receive past its capacity (at least the
    // granted one; providers round it up), which comes back; a send then fills the oldest
    // receive, and the ring hands that slot back.
    let capacity = b.caps().max_recv_wr;
    let mut full = None;
    while let Some(slot) = ring_b.take() {
        if let Err(refused) = b.post_recv_slot(&mut ring_b, RecvRequest::new(slot)) {
            full = Some(refused);
            break;
        }
    }
    let full = full.expect("a receive queue that never fills");
    assert!(matches!(full.error(), Error::QueueFull { .. }), "{full}");
    let posted = ring_b.posted();
    assert!(posted >= capacity, "{posted} of {capacity} posted");
    let slot = full.into_slot().expect("the refused slot");
    assert_eq!(slot.index(), posted, "the one past the last posted");
    ring_b.put(slot).unwrap();
    let mut slot = ring_a.take().unwrap();
    ring_a.fill(&mut slot, b"sixteen bytes!!!").unwrap();
    a.post_send_slot(&mut ring_a, SendRequest::send(slot))
        .unwrap();
    let done = wait_for(&mut cq_a, 1);
    assert_ok(&done[0], done[0].wr_id(), WcOpcode::Send);
    let back = complete_all(&mut ring_a, &done).remove(0);
    ring_a.put(back).unwrap();
    let got = wait_for(&mut cq_b, 1);
    let slot = complete_all(&mut ring_b, &got).remove(0);
    assert_eq!(
        (slot.index(), ring_b.bytes(&slot).unwrap()),
        (0, &b"sixteen bytes!!!"[..])
    );
    assert_eq!(ring_b.posted(), posted - 1);

    // A scope would count the ring's completions as its own.
    let mut ran = false;
    let scoped = b.scope(ScopeCqs::shared(&mut cq_b), |_| ran = true);
    assert!(
        matches!(scoped, Err(Error::InvalidArgument(why)) if why.contains("slot ring")) && !ran
    );
}

/// A ring dropped while its receives are posted: the queue pair keeps the region, so the
/// peer's sends still land and complete; a ring whose queue pair was dropped still reads the
/// slots it holds.
#[test]
fn slot_ring_dropped_with_receives_posted() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let mut rx = b.slot_ring(2, SIZE).unwrap();
    while let Some(slot) = rx.take() {
        b.post_recv_slot(&mut rx, RecvRequest::new(slot)).unwrap();
    }
    drop(rx);
    let mut tx = a.slot_ring(2, SIZE).unwrap();
    let mut kept = tx.take().unwrap();
    tx.fill(&mut kept, &message(9)).unwrap();
    let mut slot = tx.take().unwrap();
    tx.fill(&mut slot, &message(3)).unwrap();
    a.post_send_slot(&mut tx, SendRequest::send(slot)).unwrap();
    let sent = wait_for(&mut cq_a, 1);
    assert_ok(&sent[0], sent[0].wr_id(), WcOpcode::Send);
    let got = wait_for(&mut cq_b, 1);
    assert_ok(&got[0], got[0].wr_id(), WcOpcode::Recv);
    assert_eq!(got[0].byte_len() as usize, SIZE);
    drop((a, b));
    assert_eq!(tx.bytes(&kept).unwrap(), &message(9)[..]);
    let back = tx
        .complete(&sent[0])
        .expect("a completion polled before the drop");
    tx.put(back).unwrap();
    tx.put(kept).unwrap();
}

/// A reset discards the posted receives without completions; after reconnecting, the first
/// completion of a new receive frees them too, and carries the new bytes.
#[test]
fn slot_reset_then_a_new_receive_frees_the_discarded_ones() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (a, b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let mut b = b;
    let mut rx = b.slot_ring(4, SIZE).unwrap();
    for _ in 0..3 {
        let slot = rx.take().unwrap();
        b.post_recv_slot(&mut rx, RecvRequest::new(slot)).unwrap();
    }
    let b = b.into_reset().unwrap();
    let (mut a, mut b) = f.reconnect_rc(a, b, (100, 200));
    // Nothing was received before the reset: the queue holds no completion of it.
    assert_no_completion(&mut cq_b, QUIET);
    let slot = rx.take().unwrap();
    let index = slot.index();
    b.post_recv_slot(&mut rx, RecvRequest::new(slot)).unwrap();
    assert_eq!(rx.posted(), 4, "the discarded three and the new one");
    let mut tx = a.slot_ring(1, SIZE).unwrap();
    send_from_slot(&mut a, &mut tx, &mut cq_a, &message(2));
    let got = wait_for(&mut cq_b, 1);
    let slot = complete_all(&mut rx, &got).remove(0);
    assert_eq!(slot.index(), index);
    assert_eq!(rx.bytes(&slot).unwrap(), &message(2)[..]);
    assert_eq!(rx.posted(), 0, "the discarded receives were freed");
    assert_eq!(std::iter::from_fn(|| rx.take()).count(), 3);
}

/// `reclaim` after a reset frees every slot still posted to either queue (receives, one of
/// them received but its completion not yet handed over; a send that could not complete), and
/// leaves a slot the caller holds out alone; refused for another queue pair in RESET, nothing
/// freed. After reconnecting, the completion made before the reset matches nothing and a new
/// receive brings the new bytes.
#[test]
fn slot_reclaim_after_a_reset() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b, mut a, mut b) =
        f.rc_pair_own_cqs(AccessFlags::empty(), RcRtsAttr::new(0));
    let mut ring = b.slot_ring(6, SIZE).unwrap();
    for _ in 0..4 {
        let slot = ring.take().unwrap();
        b.post_recv_slot(&mut ring, RecvRequest::new(slot)).unwrap();
    }
    let mut tx = a.slot_ring(1, SIZE).unwrap();
    send_from_slot(&mut a, &mut tx, &mut cq_a, &message(1));
    // Received, but the completion is never handed over: its slot stays posted.
    let early = wait_for(&mut cq_b, 1);
    // A send of b's that cannot complete: `a` has no receive posted (the peer retries).
    let mut stuck = ring.take().unwrap();
    ring.fill(&mut stuck, b"stuck").unwrap();
    b.post_send_slot(&mut ring, SendRequest::send(stuck).unsignaled())
        .unwrap();
    let mut kept = ring.take().unwrap();
    ring.fill(&mut kept, b"kept out").unwrap();
    assert!(ring.take().is_none());
    assert_eq!(ring.posted(), 5);
    let b = b.into_reset().unwrap();
    let other = f.pd.qp_builder::<Rc>(&cq_b, &cq_b).build().unwrap();
    let refused = ring.reclaim(&other);
    assert!(
        matches!(&refused, Err(Error::InvalidArgument(why)) if why.contains("another queue pair")),
        "{refused:?}"
    );
    assert_eq!(ring.posted(), 5, "nothing freed");
    ring.reclaim(&b).unwrap();
    assert_eq!(ring.posted(), 0);
    assert_eq!(
        ring.bytes(&kept).unwrap(),
        b"kept out",
        "the slot held out is untouched"
    );
    let free: Vec<Slot> = std::iter::from_fn(|| ring.take()).collect();
    assert_eq!(free.len(), 5, "every posted slot is free again");
    for slot in free {
        ring.put(slot).unwrap();
    }
    ring.put(kept).unwrap();
    let (mut a, mut b) = f.reconnect_rc(a, b, (100, 200));
    assert_no_completion(&mut cq_b, QUIET);
    let slot = ring.take().unwrap();
    let index = slot.index();
    b.post_recv_slot(&mut ring, RecvRequest::new(slot)).unwrap();
    assert!(ring.complete(&early[0]).is_none(), "made before the reset");
    assert_eq!(ring.posted(), 1, "the new receive stays posted");
    send_from_slot(&mut a, &mut tx, &mut cq_a, &message(2));
    let got = wait_for(&mut cq_b, 1);
    let slot = complete_all(&mut ring, &got).remove(0);
    assert_eq!(slot.index(), index);
    assert_eq!(ring.bytes(&slot).unwrap(), &message(2)[..]);
    ring.put(slot).unwrap();
}

/// Inline slot sends (`SendRequest::inline`): SENDs of 1 byte and of all the granted
/// `max_inline_data` bytes arrive byte for byte and hand their slots back; one byte over the
/// limit is refused by the provider, which gives the slot back.
#[test]
fn slot_inline_sends() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a).max_inline_data(64),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let limit = a.caps().max_inline_data as usize;
    assert!(limit >= 64, "{limit} bytes inline");
    let mut tx = a.slot_ring(2, limit + 8).unwrap();
    let mut rx = b.slot_ring(2, limit + 8).unwrap();
    for len in [1, limit] {
        let slot = rx.take().unwrap();
        b.post_recv_slot(&mut rx, RecvRequest::new(slot)).unwrap();
        let data = pattern(len, 0x42);
        let mut slot = tx.take().unwrap();
        tx.fill(&mut slot, &data).unwrap();
        a.post_send_slot(&mut tx, SendRequest::send(slot).inline())
            .unwrap();
        let sent = wait_for(&mut cq_a, 1);
        assert_ok(&sent[0], sent[0].wr_id(), WcOpcode::Send);
        let back = complete_all(&mut tx, &sent).remove(0);
        tx.put(back).unwrap();
        let got = wait_for(&mut cq_b, 1);
        let slot = complete_all(&mut rx, &got).remove(0);
        assert_eq!(rx.bytes(&slot).unwrap(), &data[..], "{len} bytes");
        rx.put(slot).unwrap();
    }
    let mut slot = tx.take().unwrap();
    tx.fill(&mut slot, &vec![9; limit + 1]).unwrap();
    let refused = a
        .post_send_slot(&mut tx, SendRequest::send(slot).inline())
        .unwrap_err();
    assert!(matches!(refused.error(), Error::Post { .. }), "{refused}");
    let slot = refused.into_slot().expect("the slot comes back");
    assert_eq!(tx.bytes(&slot).unwrap(), &vec![9; limit + 1][..]);
    assert_eq!(tx.posted(), 0);
    tx.put(slot).unwrap();
    assert_no_completion(&mut cq_a, QUIET);
}

/// Slot and owned requests on one queue pair and one completion queue each side, signaled and
/// not: `poll_each` hands each completion over, the owned ones with their buffers, the slot
/// ones with no entry, for the ring; each path frees only its own unsignaled requests.
#[test]
fn slot_and_owned_requests_share_a_queue_pair() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(32), f.cq(32));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let (mut tx, mut rx) = (a.slot_ring(4, SIZE).unwrap(), b.slot_ring(4, SIZE).unwrap());
    let pool = BufferPool::new(&f.pd, 8, SIZE).unwrap();
    // Receives alternate: slot, owned, slot, owned.
    for m in 0..4u64 {
        if m % 2 == 0 {
            let slot = rx.take().unwrap();
            b.post_recv_slot(&mut rx, RecvRequest::new(slot)).unwrap();
        } else {
            b.post_recv_buf(pool.take().unwrap(), m).unwrap();
        }
    }
    // Sends alternate too; the first two unsignaled.
    for m in 0..4u64 {
        if m % 2 == 0 {
            let mut slot = tx.take().unwrap();
            tx.fill(&mut slot, &message(m)).unwrap();
            let request = SendRequest::send(slot);
            let request = if m < 2 { request.unsignaled() } else { request };
            a.post_send_slot(&mut tx, request).unwrap();
        } else {
            let mut buf = pool.take().unwrap();
            buf.fill_from(&message(m)).unwrap();
            let request = SendRequest::send(buf).tag(m);
            let request = if m < 2 { request.unsignaled() } else { request };
            a.post_send_owned(request).unwrap();
        }
    }
    let received = reap(&mut cq_b, 4);
    for (m, mut c) in received.into_iter().enumerate() {
        let m = m as u64;
        assert!(c.is_success(), "{c:?}");
        if m % 2 == 0 {
            assert_eq!(c.tag(), None, "a slot receive has no owned entry");
            let slot = rx.complete(c.wc()).expect("the ring's receive");
            assert_eq!(rx.bytes(&slot).unwrap(), &message(m)[..], "message {m}");
            rx.put(slot).unwrap();
        } else {
            assert_eq!(c.tag(), Some(m));
            assert!(rx.complete(c.wc()).is_none(), "an owned completion");
            assert_eq!(&c.take_buf().unwrap()[..], &message(m)[..], "message {m}");
        }
    }
    let sent = reap(&mut cq_a, 2);
    assert_eq!(sent[0].tag(), None, "the signaled slot send, third");
    let slot = tx.complete(sent[0].wc()).expect("the ring's send");
    assert_eq!(slot.index(), 1);
    assert_eq!(
        tx.posted(),
        0,
        "it freed the unsignaled slot send before it"
    );
    tx.put(slot).unwrap();
    assert_eq!(sent[1].tag(), Some(3));
    assert!(tx.complete(sent[1].wc()).is_none());
    drop(sent);
    assert_eq!(
        pool.available(),
        8,
        "the owned send freed the owned one before it"
    );
    assert_eq!(
        (a.owned_in_flight(), b.owned_in_flight(), rx.posted()),
        (0, 0, 0)
    );
}

/// The error state flushes the posted receives: each completion (`WR_FLUSH_ERR`) hands its
/// slot back, with no bytes received.
#[test]
fn slot_receives_flushed_by_the_error_state_come_back() {
    let Some(f) = fixture() else { return };
    let (cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (_a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let mut rx = b.slot_ring(3, SIZE).unwrap();
    while let Some(slot) = rx.take() {
        b.post_recv_slot(&mut rx, RecvRequest::new(slot)).unwrap();
    }
    let b = b.into_error().expect("move to ERR");
    let flushed = wait_for(&mut cq_b, 3);
    for (n, wc) in flushed.iter().enumerate() {
        assert_eq!(wc.status(), WcStatus::WrFlushErr, "{wc:?}");
        assert_eq!(wc.qp_num(), b.qp_num());
        let slot = rx.complete(wc).expect("a flushed receive of the ring");
        assert_eq!((slot.index(), slot.len()), (n as u32, 0));
        rx.put(slot).unwrap();
    }
    assert_eq!(rx.posted(), 0);
    assert_no_completion(&mut cq_b, QUIET);
}

/// A completion handed over before an earlier one of its queue frees the earlier slot with
/// it; the earlier completion then matches nothing, and its slot is free again.
#[test]
fn slot_completions_handed_over_out_of_order() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let (mut tx, mut rx) = (a.slot_ring(2, SIZE).unwrap(), b.slot_ring(2, SIZE).unwrap());
    while let Some(slot) = rx.take() {
        b.post_recv_slot(&mut rx, RecvRequest::new(slot)).unwrap();
    }
    while let Some(mut slot) = tx.take() {
        let m = u64::from(slot.index());
        tx.fill(&mut slot, &message(10 + m)).unwrap();
        a.post_send_slot(&mut tx, SendRequest::send(slot)).unwrap();
    }
    let sent = wait_for(&mut cq_a, 2);
    for slot in complete_all(&mut tx, &sent) {
        tx.put(slot).unwrap();
    }
    let got = wait_for(&mut cq_b, 2);
    let second = rx.complete(&got[1]).expect("the second receive");
    assert_eq!(second.index(), 1);
    assert_eq!(rx.bytes(&second).unwrap(), &message(11)[..]);
    assert!(rx.complete(&got[0]).is_none(), "freed with the second");
    assert_eq!(rx.posted(), 0);
    let first = rx.take().expect("the first slot, free again");
    assert_eq!(first.index(), 0);
    rx.put(first).unwrap();
    rx.put(second).unwrap();
}

/// Unsignaled sends come back even when the caller asks for no signal at all: a send is
/// signaled when no slot is left free (here the caller keeps one slot out and posts the
/// others), and after fewer unsignaled ones in a row than the send queue holds.
#[test]
fn slot_unsignaled_sends_are_signaled_often_enough() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, cq_b) = (f.cq(64), f.cq(64));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a).max_send_wr(4),
        f.pd.qp_builder(&cq_b, &cq_b).max_recv_wr(32),
        AccessFlags::empty(),
    );
    let mut rx = b.slot_ring(32, 16).unwrap();
    while let Some(slot) = rx.take() {
        b.post_recv_slot(&mut rx, RecvRequest::new(slot)).unwrap();
    }
    // No slot left free: every send is signaled.
    let mut small = a.slot_ring(4, 16).unwrap();
    let slots: Vec<Slot> = std::iter::from_fn(|| small.take()).collect();
    let mut slots = slots.into_iter();
    // The caller keeps one slot out (or loses it): the ring cannot tell.
    let _kept = slots.next();
    for slot in slots {
        a.post_send_slot(&mut small, SendRequest::send(slot).unsignaled())
            .unwrap();
    }
    let done = wait_for(&mut cq_a, 3);
    assert_eq!(complete_all(&mut small, &done).len(), 3);
    assert_eq!(small.posted(), 0);
    // A ring larger than the send queue: after `every - 1` unsignaled sends the next one is
    // signaled, and its completion frees them all.
    let every = a.caps().max_send_wr.min(16) as usize;
    // Below the ring's 16 slots, so that the run rule, not the free slots, signals; and the 32
    // receives cover the sends.
    assert!(every < 15, "{:?}", a.caps());
    let mut tx = a.slot_ring(16, 16).unwrap();
    for round in 0..2 {
        for n in 0..every {
            let slot = tx.take().unwrap();
            a.post_send_slot(&mut tx, SendRequest::send(slot).unsignaled())
                .unwrap();
            if n + 2 == every {
                assert_no_completion(&mut cq_a, QUIET);
            }
        }
        let done = wait_for(&mut cq_a, 1);
        let slot = complete_all(&mut tx, &done).remove(0);
        assert_eq!(tx.posted(), 0, "round {round}: all {every} freed");
        tx.put(slot).unwrap();
    }
    assert_no_completion(&mut cq_a, QUIET);
}

/// The owned, slot and ring send paths share one run of unsignaled sends per queue pair: after
/// `max_send_wr - 1` unsignaled sends in a row, of any mix of paths, the next is signaled
/// whatever it asked (neither its own table nor its ring forces it here), and an owned list
/// carries the run from request to request and leaves it for the next send, so the send queue
/// never fills with unsignaled requests: on providers that free send-queue entries only at a completion (not rxe), that
/// would leave every path's posts refused for good. Every byte received is checked, in order.
#[test]
fn unsignaled_sends_of_every_path_share_one_run() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(64), f.cq(128));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a).max_send_wr(4),
        f.pd.qp_builder(&cq_b, &cq_b).max_recv_wr(128),
        AccessFlags::empty(),
    );
    // At least 4, so that the owned list below (three sends) does not fill the owned table;
    // at most 24, so that the 128 receives cover every send.
    let every = a.caps().max_send_wr;
    assert!((4..=24).contains(&every), "{:?}", a.caps());
    let mut rx = b.slot_ring(128, 16).unwrap();
    assert!(b.fill_slot_ring(&mut rx).unwrap() >= 5 * every + 2);
    let pool = BufferPool::new(&f.pd, every as usize, 16).unwrap();
    // Four times the send queue: the rings' own rule (their last free slot) never signals here.
    let mut tx = a.slot_ring(4 * every, 16).unwrap();
    let mut ring = a.slot_ring(4 * every, 16).unwrap();
    let mut sent: Vec<Vec<u8>> = Vec::new();
    let slot_send = |a: &mut QueuePair<Rc, Rts>, tx: &mut SlotRing, sent: &mut Vec<Vec<u8>>| {
        let m = pattern(16, sent.len() as u8);
        let mut slot = tx.take().unwrap();
        tx.fill(&mut slot, &m).unwrap();
        a.post_send_slot(tx, SendRequest::send(slot).unsignaled())
            .unwrap();
        sent.push(m);
    };
    let owned_send = |a: &mut QueuePair<Rc, Rts>, sent: &mut Vec<Vec<u8>>, signaled: bool| {
        let m = pattern(16, sent.len() as u8);
        let mut buf = pool.take().expect("a buffer");
        buf.fill_from(&m).unwrap();
        let request = SendRequest::send(buf).tag(sent.len() as u64);
        let request = if signaled {
            request
        } else {
            request.unsignaled()
        };
        a.post_send_owned(request).unwrap();
        sent.push(m);
    };

    // Slot sends, then an owned one: the owned table is empty, yet the run signals it.
    for _ in 1..every {
        slot_send(&mut a, &mut tx, &mut sent);
    }
    assert_no_completion_each(&mut cq_a);
    owned_send(&mut a, &mut sent, false);
    let done = reap(&mut cq_a, 1);
    assert_done(&done[0], u64::from(every) - 1, WcOpcode::Send);
    drop(done);
    assert_eq!((tx.posted(), a.owned_in_flight()), (every - 1, 0));

    // Owned sends, then a slot send: signaled by the run, its completion frees every slot send.
    for _ in 1..every {
        owned_send(&mut a, &mut sent, false);
    }
    assert_no_completion_each(&mut cq_a);
    slot_send(&mut a, &mut tx, &mut sent);
    let done = reap(&mut cq_a, 1);
    assert_eq!(done[0].tag(), None, "{:?}", done[0]);
    let slot = tx
        .complete(done[0].wc())
        .expect("the slot send's completion");
    assert_eq!(tx.bytes(&slot).unwrap(), &sent[sent.len() - 1][..]);
    tx.put(slot).unwrap();
    assert_eq!((tx.posted(), a.owned_in_flight()), (0, every as usize - 1));

    // Slot sends, then one of a second ring of the queue pair: it takes part in the same run.
    for _ in 1..every {
        slot_send(&mut a, &mut tx, &mut sent);
    }
    slot_send(&mut a, &mut ring, &mut sent);
    let done = wait_for(&mut cq_a, 1);
    assert!(tx.complete(&done[0]).is_none(), "the other ring's");
    let slot = ring.complete(&done[0]).expect("the second ring's send");
    assert_eq!(ring.bytes(&slot).unwrap(), &sent[sent.len() - 1][..]);
    ring.put(slot).unwrap();
    assert_eq!(ring.posted(), 0);
    assert_eq!(
        tx.posted(),
        every - 1,
        "the first ring's sends wait for a completion of its own"
    );

    // A signaled owned send frees the owned ones before it.
    owned_send(&mut a, &mut sent, true);
    let done = reap(&mut cq_a, 1);
    assert_done(&done[0], sent.len() as u64 - 1, WcOpcode::Send);
    drop(done);
    assert_eq!((a.owned_in_flight(), pool.available()), (0, every as usize));

    // Slot sends, then a list of three owned ones: the run goes on from request to request,
    // so the first stays unsignaled, the second is signaled and the third starts a new run,
    // which the slot sends after it continue: the one that reaches `every` is signaled.
    for _ in 2..every {
        slot_send(&mut a, &mut tx, &mut sent);
    }
    let mut list = OwnedSendList::with_capacity(3);
    for _ in 0..3 {
        let m = pattern(16, sent.len() as u8);
        let mut buf = pool.take().expect("a buffer");
        buf.fill_from(&m).unwrap();
        list.push(SendRequest::send(buf).tag(sent.len() as u64).unsignaled())
            .unwrap();
        sent.push(m);
    }
    a.post_send_list(&mut list).unwrap();
    let done = reap(&mut cq_a, 1);
    assert_done(&done[0], sent.len() as u64 - 2, WcOpcode::Send);
    drop(done);
    assert_no_completion_each(&mut cq_a);
    assert_eq!(a.owned_in_flight(), 1, "the third, unsignaled");
    for _ in 2..every {
        slot_send(&mut a, &mut tx, &mut sent);
    }
    assert_no_completion_each(&mut cq_a);
    let m = pattern(16, sent.len() as u8);
    let mut slot = tx.take().unwrap();
    tx.fill(&mut slot, &m).unwrap();
    a.post_send_slot(&mut tx, SendRequest::send(slot).unsignaled())
        .unwrap();
    sent.push(m);
    let done = wait_for(&mut cq_a, 1);
    let slot = tx
        .complete(&done[0])
        .expect("the slot send the run signaled");
    assert_eq!(tx.bytes(&slot).unwrap(), &sent[sent.len() - 1][..]);
    tx.put(slot).unwrap();
    assert_eq!(tx.posted(), 0, "it freed every slot send before it");
    owned_send(&mut a, &mut sent, true);
    let done = reap(&mut cq_a, 1);
    assert_done(&done[0], sent.len() as u64 - 1, WcOpcode::Send);
    drop(done);
    assert_eq!((a.owned_in_flight(), pool.available()), (0, every as usize));

    let got = wait_for(&mut cq_b, sent.len());
    for (n, wc) in got.iter().enumerate() {
        let slot = rx.complete(wc).expect("a receive of the ring");
        assert_eq!(
            rx.bytes(&slot).unwrap(),
            &sent[n][..],
            "message {n}: {wc:?}"
        );
        rx.put(slot).unwrap();
    }
    assert_no_completion(&mut cq_a, QUIET);
}

/// A ring dropped with nothing posted gives its region back (the queue pair may open a scope
/// again); one dropped with a receive posted leaves the region with the queue pair, which
/// refuses a scope; a ring whose queue pair was destroyed refuses the queue pairs made after.
#[test]
fn slot_ring_drops_and_destroyed_queue_pairs() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, cq_b) = (f.cq(16), f.cq(16));
    let (mut a, b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let mut idle = a.slot_ring(2, SIZE).unwrap();
    let slot = idle.take().unwrap();
    idle.put(slot).unwrap();
    drop(idle);
    let scoped = a.scope(ScopeCqs::shared(&mut cq_a), |_| 7);
    assert!(matches!(scoped, Ok(7)), "{scoped:?}");

    let mut kept = a.slot_ring(2, SIZE).unwrap();
    let slot = kept.take().unwrap();
    a.post_recv_slot(&mut kept, RecvRequest::new(slot)).unwrap();
    drop(kept);
    let scoped = a.scope(ScopeCqs::shared(&mut cq_a), |_| 7);
    assert!(
        matches!(scoped, Err(Error::InvalidArgument(ref why)) if why.contains("slot ring")),
        "{scoped:?}"
    );

    let mut orphan = a.slot_ring(2, SIZE).unwrap();
    drop((a, b));
    let (mut c, _d) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let slot = orphan.take().unwrap();
    let refused = c
        .post_send_slot(&mut orphan, SendRequest::send(slot))
        .unwrap_err();
    assert!(
        matches!(refused.error(), Error::InvalidArgument(why) if why.contains("another queue pair")),
        "{refused}"
    );
    let refused = c
        .post_recv_slot(&mut orphan, RecvRequest::new(refused.into_slot().unwrap()))
        .unwrap_err();
    assert!(
        matches!(refused.error(), Error::InvalidArgument(_)),
        "{refused}"
    );
    orphan.put(refused.into_slot().unwrap()).unwrap();
    assert!(!orphan.is_for(&c));
    assert_eq!(orphan.posted(), 0);
}

/// Asserts that `result` is a refusal with `Error::InvalidArgument` naming `what`, and returns
/// the slot it gave back.
fn refused_with(result: std::result::Result<(), SlotRefused>, what: &str) -> Slot {
    let refused = result.expect_err(what);
    assert!(
        matches!(refused.error(), Error::InvalidArgument(why) if why.contains(what)),
        "{what}: {refused}"
    );
    refused
        .into_slot()
        .expect("a refused post gives its slot back")
}

/// `fill_slot_ring` posts a receive into every free slot, 32 per doorbell: 40 slots at once,
/// then across 120 rounds the slots handed back and put back are posted again in batches of
/// the sizes the rounds leave (each receive checked byte for byte, in order). A queue pair
/// that is not the ring's, and one that receives through an SRQ, are refused with nothing
/// posted. On a receive queue of 8 the fill stops, without an error, where the queue is full,
/// and a single post then meets `QueueFull`.
#[test]
fn slot_fill_posts_every_free_slot_in_batches() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(128), f.cq(128));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a).max_send_wr(64),
        f.pd.qp_builder(&cq_b, &cq_b).max_recv_wr(64),
        AccessFlags::empty(),
    );
    let mut rx = b.slot_ring(40, SIZE).unwrap();
    let other = a.fill_slot_ring(&mut rx).unwrap_err();
    assert!(
        matches!(&other, Error::InvalidArgument(why) if why.contains("another queue pair")),
        "{other}"
    );
    assert_eq!(rx.posted(), 0);
    assert_eq!(b.fill_slot_ring(&mut rx).unwrap(), 40);
    assert_eq!(rx.posted(), 40);
    assert!(rx.take().is_none(), "every slot is posted");
    assert_eq!(b.fill_slot_ring(&mut rx).unwrap(), 0, "no slot free");
    let mut tx = a.slot_ring(8, SIZE).unwrap();
    let mut batch = 0;
    for round in 0..120u64 {
        let data = &message(round)[..SIZE - (round as usize % 5)];
        let mut slot = tx.take().expect("a free send slot");
        tx.fill(&mut slot, data).unwrap();
        a.post_send_slot(&mut tx, SendRequest::send(slot).tag(round))
            .unwrap();
        let sent = wait_for(&mut cq_a, 1);
        let slot = tx.complete(&sent[0]).expect("the send's slot");
        assert_eq!((slot.tag(), tx.bytes(&slot).unwrap()), (round, data));
        tx.put(slot).unwrap();
        let got = wait_for(&mut cq_b, 1);
        assert_ok(&got[0], got[0].wr_id(), WcOpcode::Recv);
        assert!(got[0].is_recv() && !sent[0].is_recv());
        let slot = rx.complete(&got[0]).expect("a receive of the ring");
        assert_eq!(rx.bytes(&slot).unwrap(), data, "round {round}");
        rx.put(slot).unwrap();
        batch += 1;
        if round % 9 == 8 || round % 31 == 30 {
            assert_eq!(rx.posted(), 40 - batch);
            assert_eq!(b.fill_slot_ring(&mut rx).unwrap(), batch, "round {round}");
            assert_eq!(rx.posted(), 40);
            batch = 0;
        }
    }
    assert_no_completion(&mut cq_b, QUIET);

    // A queue pair that receives through an SRQ: refused, nothing posted.
    let srq = f.pd.srq_builder(16).build().unwrap();
    let cq_s = f.cq(4);
    let on_srq =
        f.pd.qp_builder::<Rc>(&cq_s, &cq_s)
            .srq(&srq)
            .build()
            .unwrap();
    let mut on_srq = on_srq.into_init(&ConnectedInitAttr::new(1)).unwrap();
    let mut srq_ring = on_srq.slot_ring(4, SIZE).unwrap();
    let refused = on_srq.fill_slot_ring(&mut srq_ring).unwrap_err();
    assert!(
        matches!(&refused, Error::InvalidArgument(why) if why.contains("SRQ")),
        "{refused}"
    );
    assert_eq!(srq_ring.posted(), 0);

    // A receive queue of 8 (rxe takes more than it grants: a power of two, less one): the
    // fill stops where the queue is full, part way through its first call.
    let (mut cq_c, mut cq_d) = (f.cq(128), f.cq(128));
    let (mut c, mut d) = f.rc_pair(
        f.pd.qp_builder(&cq_c, &cq_c).max_send_wr(64),
        f.pd.qp_builder(&cq_d, &cq_d).max_recv_wr(8),
        AccessFlags::empty(),
    );
    let capacity = d.caps().max_recv_wr;
    assert!(capacity < 31, "a receive queue of {capacity}");
    let mut big = d.slot_ring(48, SIZE).unwrap();
    let filled = d.fill_slot_ring(&mut big).unwrap();
    assert!(
        filled + 1 >= capacity && filled < 31,
        "{filled} for {capacity}"
    );
    assert_eq!(big.posted(), filled);
    let slot = big.take().expect("a slot the fill left free");
    let full = d
        .post_recv_slot(&mut big, RecvRequest::new(slot))
        .unwrap_err();
    assert!(matches!(full.error(), Error::QueueFull { .. }), "{full}");
    big.put(full.into_slot().expect("the device never saw it"))
        .unwrap();
    assert_eq!(d.fill_slot_ring(&mut big).unwrap(), 0, "the queue is full");
    assert_eq!(big.posted(), filled, "nothing more posted");
    let mut tx_c = c.slot_ring(4, SIZE).unwrap();
    for round in 0..3 * u64::from(filled) {
        let data = message(round + 1000);
        let mut slot = tx_c.take().unwrap();
        tx_c.fill(&mut slot, &data).unwrap();
        c.post_send_slot(&mut tx_c, SendRequest::send(slot))
            .unwrap();
        let sent = wait_for(&mut cq_c, 1);
        let slot = tx_c.complete(&sent[0]).unwrap();
        tx_c.put(slot).unwrap();
        let got = wait_for(&mut cq_d, 1);
        let slot = big.complete(&got[0]).expect("a receive of the ring");
        assert_eq!(big.bytes(&slot).unwrap(), &data[..], "round {round}");
        big.put(slot).unwrap();
        // One slot back, one posted: the queue takes exactly one more.
        assert_eq!(d.fill_slot_ring(&mut big).unwrap(), 1, "round {round}");
        assert_eq!(big.posted(), filled);
    }
}

/// UD on slot rings, both ways. A receive ring filled in one call takes the GRH and the
/// datagram in each slot (a slot with no room for the GRH is refused by the fill and by a
/// single post). Sends name their destination (none is refused; one of another protection
/// domain or device too, keeping nothing), and 30 rounds of an unsignaled and a signaled
/// datagram arrive byte for byte after the GRH. The ring keeps the address handle while a
/// send is posted (closing it is refused with `EBUSY`) and lets it go once the completion is
/// handed over (the unsignaled send's with it), after a refusal by the provider, after
/// `reclaim` on a reset queue pair, and, for a ring dropped with a send posted, once the queue
/// pair is destroyed. A destination on RC is refused.
#[test]
fn slot_ud_datagrams_keep_their_address_handles() {
    const QKEY: u32 = 0x1111_2222;
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let mut a = f.ud_qp(f.pd.qp_builder(&cq_a, &cq_a), QKEY);
    let mut b = f.ud_qp(f.pd.qp_builder(&cq_b, &cq_b), QKEY);
    let mut small = b.slot_ring(2, GRH_LEN - 1).unwrap();
    let no_room = b.fill_slot_ring(&mut small).unwrap_err();
    assert!(
        matches!(&no_room, Error::InvalidArgument(why) if why.contains("GRH")),
        "{no_room}"
    );
    let slot = small.take().unwrap();
    let slot = refused_with(b.post_recv_slot(&mut small, RecvRequest::new(slot)), "GRH");
    small.put(slot).unwrap();
    assert_eq!(small.posted(), 0);
    let mut tx = a.slot_ring(4, SIZE).unwrap();
    let mut rx = b.slot_ring(8, GRH_LEN + SIZE).unwrap();
    assert_eq!(b.fill_slot_ring(&mut rx).unwrap(), 8);
    let mut ah = f.pd.create_ah(&f.av()).unwrap();
    let slot = tx.take().unwrap();
    let slot = refused_with(
        a.post_send_slot(&mut tx, SendRequest::send(slot)),
        "needs a destination",
    );
    // An address handle of another protection domain, and one of another device: refused
    // before the provider sees them, nothing posted or kept.
    let pd2 = f.context.alloc_pd().unwrap();
    let foreign = pd2.create_ah(&f.av()).unwrap();
    let slot = refused_with(
        a.post_send_slot(
            &mut tx,
            SendRequest::send(slot).to(&foreign, b.qp_num(), QKEY),
        ),
        "another protection domain",
    );
    foreign.close().expect("a refused request keeps nothing");
    let name = rdma_test_support::second_device().expect("the harness's second device");
    let context2 = Context::open(&name).unwrap();
    let pd3 = context2.alloc_pd().unwrap();
    let gid2 = context2.routable_gid(1).unwrap();
    let av2 = AddressVector::new(1).grh(Gid(f.device.gid), gid2.index as u8);
    let other_device = pd3.create_ah(&av2).unwrap();
    let slot = refused_with(
        a.post_send_slot(
            &mut tx,
            SendRequest::send(slot).to(&other_device, b.qp_num(), QKEY),
        ),
        "another protection domain",
    );
    other_device
        .close()
        .expect("a refused request keeps nothing");
    tx.put(slot).unwrap();
    assert_eq!(tx.posted(), 0);
    let busy = |ah: AddressHandle| -> AddressHandle {
        let (ah, error) = ah.close().expect_err("a slot ring keeps the handle");
        assert_eq!(error.errno(), Some(Errno::BUSY), "{error}");
        ah
    };
    for round in 0..30u64 {
        let len = SIZE - round as usize;
        for k in 0..2 {
            let mut slot = tx.take().expect("a free slot");
            tx.fill(&mut slot, &message(2 * round + k)[..len]).unwrap();
            let request = SendRequest::send(slot).to(&ah, b.qp_num(), QKEY).tag(k);
            let request = if k == 0 {
                request.unsignaled()
            } else {
                request
            };
            a.post_send_slot(&mut tx, request).unwrap();
        }
        ah = busy(ah);
        let sent = wait_for(&mut cq_a, 1);
        assert_ok(&sent[0], sent[0].wr_id(), WcOpcode::Send);
        let slot = tx.complete(&sent[0]).expect("the signaled send's slot");
        assert_eq!(slot.tag(), 1, "round {round}");
        assert_eq!(
            tx.bytes(&slot).unwrap(),
            &message(2 * round + 1)[..len],
            "round {round}"
        );
        tx.put(slot).unwrap();
        assert_eq!(tx.posted(), 0, "the unsignaled send came back with it");
        let got = wait_for(&mut cq_b, 2);
        for (k, wc) in got.iter().enumerate() {
            assert_eq!(wc.src_qp(), a.qp_num());
            let slot = rx.complete(wc).expect("a receive of the ring");
            assert_eq!(slot.len(), GRH_LEN + len);
            let bytes = rx.bytes(&slot).unwrap();
            assert_eq!(&bytes[GRH_LEN..], &message(2 * round + k as u64)[..len]);
            rx.put(slot).unwrap();
        }
        assert_eq!(b.fill_slot_ring(&mut rx).unwrap(), 2);
    }
    ah.close()
        .expect("no send of the ring holds the handle any more");

    // A send the provider refuses (inline, one byte over the limit) keeps no handle.
    let cq_g = f.cq(16);
    let mut g = f.ud_qp(f.pd.qp_builder(&cq_g, &cq_g).max_inline_data(64), QKEY);
    let limit = g.caps().max_inline_data as usize;
    let mut tx_g = g.slot_ring(2, limit + 8).unwrap();
    let ah = f.pd.create_ah(&f.av()).unwrap();
    let mut slot = tx_g.take().unwrap();
    tx_g.fill(&mut slot, &vec![3; limit + 1]).unwrap();
    let refused = g
        .post_send_slot(
            &mut tx_g,
            SendRequest::send(slot).inline().to(&ah, b.qp_num(), QKEY),
        )
        .unwrap_err();
    assert!(matches!(refused.error(), Error::Post { .. }), "{refused}");
    assert!(refused.into_slot().is_some());
    assert_eq!(tx_g.posted(), 0);
    ah.close()
        .expect("the refused send's slot let the handle go");

    // `reclaim` after a reset lets the handle go.
    let ah = f.pd.create_ah(&f.av()).unwrap();
    let mut slot = tx.take().unwrap();
    slot.set_len(8);
    a.post_send_slot(&mut tx, SendRequest::send(slot).to(&ah, b.qp_num(), QKEY))
        .unwrap();
    let sent = wait_for(&mut cq_a, 1);
    let ah = busy(ah);
    let a = a.into_reset().unwrap();
    tx.reclaim(&a).unwrap();
    assert_eq!(tx.posted(), 0);
    assert!(
        tx.complete(&sent[0]).is_none(),
        "reclaimed before it was handed over"
    );
    ah.close()
        .expect("reclaimed: the ring holds the handle no more");

    // A ring dropped with a send posted: the queue pair keeps the handle until destroyed.
    let cq_c = f.cq(16);
    let mut c = f.ud_qp(f.pd.qp_builder(&cq_c, &cq_c), QKEY);
    let mut tx_c = c.slot_ring(2, SIZE).unwrap();
    let ah = f.pd.create_ah(&f.av()).unwrap();
    let mut slot = tx_c.take().unwrap();
    slot.set_len(8);
    c.post_send_slot(&mut tx_c, SendRequest::send(slot).to(&ah, b.qp_num(), QKEY))
        .unwrap();
    drop(tx_c);
    let ah = busy(ah);
    drop(c);
    ah.close()
        .expect("the queue pair was destroyed: nothing holds the handle");

    // A destination on RC is refused.
    let (cq_d, cq_e) = (f.cq(4), f.cq(4));
    let (mut d, _e) = f.rc_pair(
        f.pd.qp_builder(&cq_d, &cq_d),
        f.pd.qp_builder(&cq_e, &cq_e),
        AccessFlags::empty(),
    );
    let mut tx_d = d.slot_ring(2, SIZE).unwrap();
    let ah = f.pd.create_ah(&f.av()).unwrap();
    let slot = tx_d.take().unwrap();
    let slot = refused_with(
        d.post_send_slot(&mut tx_d, SendRequest::send(slot).to(&ah, 1, QKEY)),
        "datagram destinations are for UD",
    );
    tx_d.put(slot).unwrap();
    assert_eq!(tx_d.posted(), 0);
    ah.close().expect("a refused request keeps nothing");
}

/// Slot sends on the extended send path (`ibv_wr_*`): a SEND of no bytes (the receive's slot
/// comes back with length 0), a SEND, a WRITE with immediate data (its bytes checked at the
/// target, the receive's slot empty), both atomics with their old values, and a READ.
#[test]
fn slot_sends_on_the_extended_path() {
    let Some(f) = fixture() else { return };
    let rights = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a).send_path(SendPath::Extended),
        f.pd.qp_builder(&cq_b, &cq_b),
        rights,
    );
    assert!(a.uses_extended_post());
    let mut target =
        f.pd.register(SIZE, AccessFlags::LOCAL_WRITE | rights)
            .unwrap();
    target.write_at(0, &5u64.to_ne_bytes()).unwrap();
    let mut tx = a.slot_ring(4, SIZE).unwrap();
    let mut rx = b.slot_ring(4, SIZE).unwrap();
    assert_eq!(b.fill_slot_ring(&mut rx).unwrap(), 4);
    let mut empty = tx.take().unwrap();
    empty.set_len(0);
    a.post_send_slot(&mut tx, SendRequest::send(empty).tag(1))
        .unwrap();
    let mut slot = tx.take().unwrap();
    tx.fill(&mut slot, &message(3)).unwrap();
    a.post_send_slot(&mut tx, SendRequest::send(slot).tag(2))
        .unwrap();
    let sent = complete_all(&mut tx, &wait_for(&mut cq_a, 2));
    assert_eq!((sent[0].tag(), sent[0].len()), (1, 0));
    assert_eq!(
        (sent[1].tag(), tx.bytes(&sent[1]).unwrap()),
        (2, &message(3)[..])
    );
    let got = wait_for(&mut cq_b, 2);
    assert_eq!(got[0].byte_len(), 0);
    let received = complete_all(&mut rx, &got);
    assert_eq!(received[0].len(), 0, "a SEND of no bytes");
    assert_eq!(rx.bytes(&received[1]).unwrap(), &message(3)[..]);
    for slot in sent {
        tx.put(slot).unwrap();
    }
    for slot in received {
        rx.put(slot).unwrap();
    }
    assert_eq!(b.fill_slot_ring(&mut rx).unwrap(), 2);

    let mut slot = tx.take().unwrap();
    tx.fill(&mut slot, b"ext!").unwrap();
    a.post_send_slot(
        &mut tx,
        SendRequest::write(slot, target.remote(16..20).unwrap())
            .with_imm(7)
            .tag(3),
    )
    .unwrap();
    let word = target.remote(..8).unwrap();
    let slot = tx.take().unwrap();
    a.post_send_slot(&mut tx, SendRequest::fetch_add(slot, word, 10).tag(4))
        .unwrap();
    let slot = tx.take().unwrap();
    a.post_send_slot(&mut tx, SendRequest::compare_swap(slot, word, 15, 1).tag(5))
        .unwrap();
    let done = wait_for(&mut cq_a, 3);
    assert_eq!(
        (done[0].opcode(), done[1].opcode(), done[2].opcode()),
        (WcOpcode::RdmaWrite, WcOpcode::FetchAdd, WcOpcode::CompSwap)
    );
    let done = complete_all(&mut tx, &done);
    assert_eq!(
        (done[0].tag(), tx.bytes(&done[0]).unwrap()),
        (3, &b"ext!"[..])
    );
    let old = tx.bytes(&done[1]).unwrap();
    assert_eq!(
        (done[1].tag(), u64::from_ne_bytes(old.try_into().unwrap())),
        (4, 5)
    );
    let old = tx.bytes(&done[2]).unwrap();
    assert_eq!(
        (done[2].tag(), u64::from_ne_bytes(old.try_into().unwrap())),
        (5, 15)
    );
    let mut done = done.into_iter();
    let mut slot = done.next().unwrap();
    slot.set_len(8);
    a.post_send_slot(&mut tx, SendRequest::read(slot, word).tag(6))
        .unwrap();
    let read = complete_all(&mut tx, &wait_for(&mut cq_a, 1));
    let now = tx.bytes(&read[0]).unwrap();
    assert_eq!(
        (read[0].tag(), u64::from_ne_bytes(now.try_into().unwrap())),
        (6, 1)
    );
    let got = wait_for(&mut cq_b, 1);
    assert_eq!(got[0].imm_data(), Some(7));
    let slot = rx.complete(&got[0]).expect("the WRITE's receive");
    assert_eq!(
        slot.len(),
        0,
        "a WRITE with immediate data brings no bytes to the receive"
    );
    let mut four = [0u8; 4];
    target.read_at(16, &mut four).unwrap();
    assert_eq!(&four, b"ext!");
}

/// Slot send lists (`SlotSendList`, `post_send_slot_list`): eight SENDs, seven unsignaled, go
/// with one doorbell, one completion hands back the last slot with its tag and frees the seven
/// before it, and every message arrives in order; a full list gives the slot back; a slot of
/// another ring, and a ring of another queue pair, refuse the whole list with nothing posted;
/// a WRITE with immediate data, a READ, a fetch-and-add and a SEND in one chain, each with its
/// tag, bytes and old value; a list longer than the send queue posts what fits
/// (`QueueFull` with the index; the run of unsignaled sends signals the last one that fits)
/// and keeps the rest, which a second post sends; a list that takes every slot of its ring
/// has its last request signaled whatever it asked; UD sends in a list keep their address
/// handle until their completion.
#[test]
fn slot_send_lists_post_with_one_doorbell() {
    let Some(f) = fixture() else { return };
    let rights = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let (mut cq_a, mut cq_b) = (f.cq(64), f.cq(64));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a).max_send_wr(16),
        f.pd.qp_builder(&cq_b, &cq_b).max_recv_wr(64),
        rights,
    );
    let mut tx = a.slot_ring(24, SIZE).unwrap();
    let mut rx = b.slot_ring(48, SIZE).unwrap();
    assert_eq!(b.fill_slot_ring(&mut rx).unwrap(), 48);
    let mut list = SlotSendList::with_capacity(8);
    assert_eq!((list.capacity(), list.len(), list.is_empty()), (8, 0, true));
    let data = |n: u64| message(n)[..SIZE - n as usize].to_vec();
    for n in 0..8u64 {
        let mut slot = tx.take().unwrap();
        tx.fill(&mut slot, &data(n)).unwrap();
        let request = SendRequest::send(slot).tag(n);
        list.push(if n == 7 {
            request
        } else {
            request.unsignaled()
        })
        .unwrap();
    }
    let full = list
        .push(SendRequest::send(tx.take().unwrap()))
        .unwrap_err();
    assert!(
        matches!(full.error(), Error::InvalidArgument(why) if why.contains("full")),
        "{full}"
    );
    tx.put(full.into_slot().unwrap()).unwrap();
    a.post_send_slot_list(&mut tx, &mut list).unwrap();
    assert!(list.is_empty());
    assert_eq!(tx.posted(), 8);
    let sent = wait_for(&mut cq_a, 1);
    assert_ok(&sent[0], sent[0].wr_id(), WcOpcode::Send);
    let slot = tx.complete(&sent[0]).expect("the last send's slot");
    assert_eq!((slot.tag(), tx.bytes(&slot).unwrap()), (7, &data(7)[..]));
    tx.put(slot).unwrap();
    assert_eq!(
        tx.posted(),
        0,
        "the seven unsignaled sends came back with it"
    );
    assert_no_completion(&mut cq_a, QUIET);
    let got = complete_all(&mut rx, &wait_for(&mut cq_b, 8));
    for (n, slot) in got.into_iter().enumerate() {
        assert_eq!(rx.bytes(&slot).unwrap(), &data(n as u64)[..], "message {n}");
        rx.put(slot).unwrap();
    }
    assert_eq!(b.fill_slot_ring(&mut rx).unwrap(), 8);

    // A slot of another ring at position 2, and a ring of another queue pair: refused, nothing
    // posted, every request still in the list.
    let mut other = a.slot_ring(2, SIZE).unwrap();
    list.push(SendRequest::send(tx.take().unwrap())).unwrap();
    list.push(SendRequest::send(tx.take().unwrap())).unwrap();
    list.push(SendRequest::send(other.take().unwrap())).unwrap();
    let refused = a.post_send_slot_list(&mut tx, &mut list).unwrap_err();
    assert!(
        matches!(&refused, Error::InvalidArgument(why) if why.starts_with("request 2:") && why.contains("another ring")),
        "{refused}"
    );
    assert_eq!((list.len(), tx.posted()), (3, 0));
    let refused = a.post_send_slot_list(&mut rx, &mut list).unwrap_err();
    assert!(
        matches!(&refused, Error::InvalidArgument(why) if why.contains("another queue pair")),
        "{refused}"
    );
    let mut slots: Vec<Slot> = list.take_slots().collect();
    assert!(list.is_empty());
    other.put(slots.pop().unwrap()).unwrap();
    for slot in slots {
        tx.put(slot).unwrap();
    }
    assert_no_completion(&mut cq_b, QUIET);

    // Every operation in one chain.
    let mut target =
        f.pd.register(SIZE, AccessFlags::LOCAL_WRITE | rights)
            .unwrap();
    target.write_at(0, &5u64.to_ne_bytes()).unwrap();
    target.write_at(64, b"read me!").unwrap();
    let word = target.remote(..8).unwrap();
    let mut slot = tx.take().unwrap();
    tx.fill(&mut slot, b"written").unwrap();
    list.push(
        SendRequest::write(slot, target.remote(16..23).unwrap())
            .with_imm(9)
            .tag(10),
    )
    .unwrap();
    let mut slot = tx.take().unwrap();
    slot.set_len(8);
    list.push(SendRequest::read(slot, target.remote(64..72).unwrap()).tag(11))
        .unwrap();
    list.push(SendRequest::fetch_add(tx.take().unwrap(), word, 3).tag(12))
        .unwrap();
    let mut slot = tx.take().unwrap();
    tx.fill(&mut slot, b"last").unwrap();
    list.push(SendRequest::send(slot).tag(13)).unwrap();
    a.post_send_slot_list(&mut tx, &mut list).unwrap();
    let done = wait_for(&mut cq_a, 4);
    assert_eq!(
        done.iter().map(WorkCompletion::opcode).collect::<Vec<_>>(),
        [
            WcOpcode::RdmaWrite,
            WcOpcode::RdmaRead,
            WcOpcode::FetchAdd,
            WcOpcode::Send
        ]
    );
    let done = complete_all(&mut tx, &done);
    assert_eq!(
        done.iter().map(Slot::tag).collect::<Vec<_>>(),
        [10, 11, 12, 13]
    );
    assert_eq!(tx.bytes(&done[1]).unwrap(), b"read me!");
    assert_eq!(tx.bytes(&done[2]).unwrap(), &5u64.to_ne_bytes());
    for slot in done {
        tx.put(slot).unwrap();
    }
    let got = wait_for(&mut cq_b, 2);
    assert_eq!(got[0].imm_data(), Some(9));
    let got = complete_all(&mut rx, &got);
    assert_eq!(
        got[0].len(),
        0,
        "a WRITE with immediate data brings no bytes to the receive"
    );
    assert_eq!(rx.bytes(&got[1]).unwrap(), b"last");
    for slot in got {
        rx.put(slot).unwrap();
    }
    let mut seven = [0u8; 7];
    target.read_at(16, &mut seven).unwrap();
    assert_eq!(&seven, b"written");
    let mut now = [0u8; 8];
    target.read_at(0, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 8);

    // Longer than the send queue: what fits is posted (rxe takes a little more than it
    // grants), the rest stays in the list and goes once the queue has room; the run of
    // unsignaled sends, carried across the posts, signals every `every`-th request.
    let (mut cq_c, mut cq_d) = (f.cq(64), f.cq(64));
    let (mut c, mut d) = f.rc_pair(
        f.pd.qp_builder(&cq_c, &cq_c).max_send_wr(4),
        f.pd.qp_builder(&cq_d, &cq_d).max_recv_wr(32),
        AccessFlags::empty(),
    );
    let every = c.caps().max_send_wr as u64;
    assert!(every < 8, "a send queue of {every}");
    let mut tx_c = c.slot_ring(16, SIZE).unwrap();
    let mut rx_d = d.slot_ring(16, SIZE).unwrap();
    assert_eq!(d.fill_slot_ring(&mut rx_d).unwrap(), 16);
    let mut long = SlotSendList::with_capacity(12);
    for n in 0..12u64 {
        let mut slot = tx_c.take().unwrap();
        tx_c.fill(&mut slot, &data(n)).unwrap();
        let request = SendRequest::send(slot).tag(n);
        long.push(if n == 11 {
            request
        } else {
            request.unsignaled()
        })
        .unwrap();
    }
    let mut tags = Vec::new();
    let mut wcs = [WorkCompletion::default(); 16];
    let mut reap_c = |cq: &mut CompletionQueue, tx: &mut SlotRing, tags: &mut Vec<u64>| {
        for wc in cq.poll(&mut wcs).unwrap() {
            assert_ok(wc, wc.wr_id(), WcOpcode::Send);
            let slot = tx.complete(wc).expect("a send of the ring");
            tags.push(slot.tag());
            tx.put(slot).unwrap();
        }
    };
    let deadline = std::time::Instant::now() + WAIT;
    let mut first_refusal = None;
    loop {
        match c.post_send_slot_list(&mut tx_c, &mut long) {
            Ok(()) => break,
            Err(Error::QueueFull { index, .. }) => {
                if first_refusal.is_none() {
                    assert!((every as usize..12).contains(&index), "{index}");
                    assert_eq!((long.len(), tx_c.posted() as usize), (12 - index, index));
                    first_refusal = Some(index);
                }
                reap_c(&mut cq_c, &mut tx_c, &mut tags);
                assert!(
                    std::time::Instant::now() < deadline,
                    "the queue never had room"
                );
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Err(other) => panic!("{other}"),
        }
    }
    assert!(
        first_refusal.is_some(),
        "twelve sends fit a queue of {every}"
    );
    assert!(long.is_empty());
    while tx_c.posted() > 0 {
        reap_c(&mut cq_c, &mut tx_c, &mut tags);
        assert!(
            std::time::Instant::now() < deadline,
            "sends never completed"
        );
    }
    let signaled: Vec<u64> = (0..12)
        .filter(|p| (p + 1) % every == 0 || *p == 11)
        .collect();
    assert_eq!(tags, signaled, "the sends the run signaled, and the last");
    let got = complete_all(&mut rx_d, &wait_for(&mut cq_d, 12));
    for (n, slot) in got.iter().enumerate() {
        assert_eq!(
            rx_d.bytes(slot).unwrap(),
            &data(n as u64)[..],
            "message {n}"
        );
    }

    // A list that takes every slot of its ring: the last request is signaled whatever it
    // asked, so the slots come back.
    let mut small = c.slot_ring(3, SIZE).unwrap();
    for n in 0..3u64 {
        let slot = small.take().unwrap();
        long.push(SendRequest::send(slot).tag(20 + n).unsignaled())
            .unwrap();
    }
    assert!(small.take().is_none());
    c.post_send_slot_list(&mut small, &mut long).unwrap();
    let sent = wait_for(&mut cq_c, 1);
    let slot = small.complete(&sent[0]).expect("the forced signal");
    assert_eq!(slot.tag(), 22);
    small.put(slot).unwrap();
    assert_eq!(small.posted(), 0);
    assert_eq!(
        complete_all(&mut rx_d, &wait_for(&mut cq_d, 3)).len(),
        3,
        "the three messages"
    );

    // UD: the list's sends keep their address handle until their completion.
    const QKEY: u32 = 0x0dd_ba11;
    let (mut cq_u, mut cq_v) = (f.cq(16), f.cq(16));
    let mut u = f.ud_qp(f.pd.qp_builder(&cq_u, &cq_u), QKEY);
    let mut v = f.ud_qp(f.pd.qp_builder(&cq_v, &cq_v), QKEY);
    let mut tx_u = u.slot_ring(4, SIZE).unwrap();
    let mut rx_v = v.slot_ring(4, GRH_LEN + SIZE).unwrap();
    assert_eq!(v.fill_slot_ring(&mut rx_v).unwrap(), 4);
    let ah = f.pd.create_ah(&f.av()).unwrap();
    let mut datagrams = SlotSendList::with_capacity(3);
    for n in 0..3u64 {
        let mut slot = tx_u.take().unwrap();
        tx_u.fill(&mut slot, &data(n)).unwrap();
        let request = SendRequest::send(slot).to(&ah, v.qp_num(), QKEY).tag(n);
        datagrams
            .push(if n == 2 {
                request
            } else {
                request.unsignaled()
            })
            .unwrap();
    }
    u.post_send_slot_list(&mut tx_u, &mut datagrams).unwrap();
    drop(datagrams);
    let (ah, error) = ah.close().expect_err("the ring keeps the handle");
    assert_eq!(error.errno(), Some(Errno::BUSY), "{error}");
    let sent = wait_for(&mut cq_u, 1);
    let slot = tx_u.complete(&sent[0]).expect("the last datagram's slot");
    assert_eq!(slot.tag(), 2);
    tx_u.put(slot).unwrap();
    ah.close().expect("every send of the list came back");
    for (n, slot) in complete_all(&mut rx_v, &wait_for(&mut cq_v, 3))
        .iter()
        .enumerate()
    {
        assert_eq!(&rx_v.bytes(slot).unwrap()[GRH_LEN..], &data(n as u64)[..]);
    }
}
