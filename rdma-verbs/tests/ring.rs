//! Receive and send rings on the device: slots posted and completed in ring order, every byte
//! checked; rings of several queue pairs sharing completion queues (each completion to its own
//! ring, others' ignored); unsignaled sends freed by a later signaled one, and the posts that
//! must be signaled; RDMA WRITE (with immediate data into a receive ring), READ and both
//! atomics; what a ring refuses, and the slot it leaves free; the error state's flushes;
//! completions handed over out of order; a ring larger than the send queue; `reclaim` after a
//! reset; UD receives (the GRH first); the extended send path, and a SEND of no bytes; a ring
//! dropped with receives posted, one dropped with none, one whose queue pair was destroyed;
//! receive rings filled in batches (`fill_recv_ring`), up to a full receive queue; inline sends
//! on both send paths.

use rdma_test_support::verbs::*;
use rdma_verbs::*;

const SIZE: usize = 256;

fn message(round: u64) -> Vec<u8> {
    pattern(SIZE, round as u8)
}

/// Writes `data` into the ring's next slot and posts it as a SEND (signaled unless
/// `unsignaled`).
fn send(qp: &mut QueuePair<Rc, Rts>, ring: &mut SendRing, data: &[u8], unsignaled: bool) {
    let slot = ring.next_mut().expect("a free send slot");
    slot[..data.len()].copy_from_slice(data);
    let request = RingSend::send(data.len());
    let request = if unsignaled {
        request.unsignaled()
    } else {
        request
    };
    qp.post_send_ring(ring, request)
        .expect("post from the ring");
}

fn invalid<T: std::fmt::Debug>(result: Result<T>, what: &str) {
    assert!(
        matches!(&result, Err(Error::InvalidArgument(why)) if why.contains(what)),
        "{what}: {result:?}"
    );
}

/// A receive ring of 8 slots and a send ring of 3 across 200 rounds: each receive completion
/// lends exactly the bytes sent, in order, and its slot is posted again at once; each send
/// completion lends the bytes the request carried; a copy of a completion given again matches
/// nothing; the counts of free and posted slots follow.
#[test]
fn ring_receive_and_send_across_rounds() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(32), f.cq(32));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let mut tx = a.send_ring(3, SIZE).unwrap();
    let mut rx = b.recv_ring(8, SIZE).unwrap();
    assert!(tx.is_for(&a) && !tx.is_for(&b) && rx.is_for(&b) && !rx.is_for(&a));
    assert_eq!((rx.slot_count(), rx.slot_size(), rx.free()), (8, SIZE, 8));
    while rx.free() > 0 {
        b.post_recv_ring(&mut rx).unwrap();
    }
    assert_eq!(rx.posted(), 8);
    for round in 0..200u64 {
        let data = &message(round)[..SIZE - (round as usize % 7)];
        send(&mut a, &mut tx, data, false);
        assert_eq!((tx.posted(), tx.free()), (1, 2));
        let sent = wait_for(&mut cq_a, 1);
        assert_ok(&sent[0], sent[0].wr_id(), WcOpcode::Send);
        assert_eq!(
            tx.complete(&sent[0]),
            Some(data),
            "the bytes the send carried"
        );
        assert_eq!(tx.complete(&sent[0]), None, "the same completion again");
        assert_eq!(tx.posted(), 0);

        let got = wait_for(&mut cq_b, 1);
        assert_ok(&got[0], got[0].wr_id(), WcOpcode::Recv);
        assert_eq!(got[0].qp_num(), b.qp_num());
        assert_eq!(rx.complete(&got[0]), Some(data), "round {round}");
        assert_eq!(rx.complete(&got[0]), None, "a copy matches nothing");
        assert_eq!(rx.free(), 1);
        b.post_recv_ring(&mut rx).unwrap();
    }
    assert_no_completion(&mut cq_b, QUIET);
}

/// `fill_recv_ring`: a ring of 40 slots (more than the 32 one call hands over) filled at once,
/// then refilled after each batch of completions with exactly the slots they freed, across 120
/// messages whose every byte is checked; a ring of another queue pair refused with nothing
/// posted; a ring larger than a receive queue of 8 filled only up to what the queue takes,
/// without an error, the queue then really full (a single post is refused), the slots it could
/// not post free, and its receives (and those posted after the partial fill) completing in
/// ring order with the bytes sent.
#[test]
fn ring_fill_posts_every_free_slot_in_batches() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(128), f.cq(128));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a).max_send_wr(64),
        f.pd.qp_builder(&cq_b, &cq_b).max_recv_wr(64),
        AccessFlags::empty(),
    );
    let mut rx = b.recv_ring(40, SIZE).unwrap();
    invalid(a.fill_recv_ring(&mut rx), "another queue pair");
    assert_eq!(rx.posted(), 0);
    assert_eq!(b.fill_recv_ring(&mut rx).unwrap(), 40);
    assert_eq!((rx.posted(), rx.free()), (40, 0));
    assert_eq!(b.fill_recv_ring(&mut rx).unwrap(), 0, "no slot free");
    let mut tx = a.send_ring(8, SIZE).unwrap();
    let mut batch = 0;
    for round in 0..120u64 {
        let data = &message(round)[..SIZE - (round as usize % 5)];
        send(&mut a, &mut tx, data, false);
        let sent = wait_for(&mut cq_a, 1);
        assert_eq!(tx.complete(&sent[0]), Some(data));
        let got = wait_for(&mut cq_b, 1);
        assert_ok(&got[0], got[0].wr_id(), WcOpcode::Recv);
        assert_eq!(rx.complete(&got[0]), Some(data), "round {round}");
        batch += 1;
        if round % 9 == 8 || round % 31 == 30 {
            assert_eq!(rx.free(), batch);
            assert_eq!(b.fill_recv_ring(&mut rx).unwrap(), batch, "round {round}");
            assert_eq!(rx.posted(), 40);
            batch = 0;
        }
    }
    assert_no_completion(&mut cq_b, QUIET);

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
    let mut big = d.recv_ring(48, SIZE).unwrap();
    let filled = d.fill_recv_ring(&mut big).unwrap();
    assert!(
        filled + 1 >= capacity && filled < 31,
        "{filled} for {capacity}"
    );
    assert_eq!((big.posted(), big.free()), (filled, 48 - filled));
    let full = d.post_recv_ring(&mut big).unwrap_err();
    assert!(matches!(full, Error::QueueFull { .. }), "{full}");
    assert_eq!(d.fill_recv_ring(&mut big).unwrap(), 0, "the queue is full");
    assert_eq!(big.posted(), filled, "nothing more posted");
    let mut tx_c = c.send_ring(4, SIZE).unwrap();
    for round in 0..3 * u64::from(filled) {
        let data = message(round + 1000);
        send(&mut c, &mut tx_c, &data, false);
        let sent = wait_for(&mut cq_c, 1);
        assert_eq!(tx_c.complete(&sent[0]), Some(&data[..]));
        let got = wait_for(&mut cq_d, 1);
        assert_eq!(big.complete(&got[0]), Some(&data[..]), "round {round}");
        // One slot freed, one posted: the queue takes exactly one more.
        assert_eq!(d.fill_recv_ring(&mut big).unwrap(), 1, "round {round}");
        assert_eq!(big.posted(), filled);
    }
}

/// Inline ring sends (`RingSend::inline`) on both send paths: SENDs of 0, 1, half and all of
/// the granted `max_inline_data` bytes and a WRITE with immediate data arrive byte for byte,
/// each completion lending the bytes sent; one byte over the limit is refused by the provider
/// and its slot is free again.
#[test]
fn ring_inline_sends_on_both_send_paths() {
    let Some(f) = fixture() else { return };
    for path in [SendPath::Classic, SendPath::Extended] {
        let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
        let (mut a, mut b) = f.rc_pair(
            f.pd.qp_builder(&cq_a, &cq_a)
                .max_inline_data(64)
                .send_path(path),
            f.pd.qp_builder(&cq_b, &cq_b),
            AccessFlags::REMOTE_WRITE,
        );
        assert_eq!(a.uses_extended_post(), path == SendPath::Extended);
        let limit = a.caps().max_inline_data as usize;
        assert!(limit >= 64, "{limit} bytes inline");
        let mut tx = a.send_ring(2, limit + 8).unwrap();
        let mut rx = b.recv_ring(4, limit + 8).unwrap();
        b.fill_recv_ring(&mut rx).unwrap();
        for len in [0, 1, limit / 2, limit] {
            let data = pattern(len, len as u8 ^ 0x3c);
            tx.next_mut().expect("a free slot")[..len].copy_from_slice(&data);
            a.post_send_ring(&mut tx, RingSend::send(len).inline())
                .unwrap();
            let sent = wait_for(&mut cq_a, 1);
            assert_ok(&sent[0], sent[0].wr_id(), WcOpcode::Send);
            assert_eq!(tx.complete(&sent[0]), Some(&data[..]), "{path:?}, {len}");
            let got = wait_for(&mut cq_b, 1);
            assert_ok(&got[0], got[0].wr_id(), WcOpcode::Recv);
            assert_eq!(rx.complete(&got[0]), Some(&data[..]), "{path:?}, {len}");
            assert_eq!(b.fill_recv_ring(&mut rx).unwrap(), 1);
        }
        // A WRITE with immediate data, inline, into b's region: the immediate comes with a
        // receive completion of b's ring (which lends no bytes), the bytes land in the region.
        let target =
            f.pd.register(limit, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
                .unwrap();
        let data = pattern(limit, 0x5e);
        tx.next_mut().expect("a free slot")[..limit].copy_from_slice(&data);
        let request = RingSend::write(limit, target.remote(..).unwrap())
            .with_imm(0x1234)
            .inline();
        a.post_send_ring(&mut tx, request).unwrap();
        let sent = wait_for(&mut cq_a, 1);
        assert_ok(&sent[0], sent[0].wr_id(), WcOpcode::RdmaWrite);
        assert_eq!(tx.complete(&sent[0]), Some(&data[..]));
        let got = wait_for(&mut cq_b, 1);
        assert_eq!(got[0].imm_data(), Some(0x1234));
        assert_eq!(rx.complete(&got[0]), Some(&[][..]));
        let mut landed = vec![0; limit];
        target.read_at(0, &mut landed).unwrap();
        assert_eq!(landed, data);
        // One byte over the limit: the provider refuses it; the slot is free again.
        let free = tx.free();
        tx.next_mut().expect("a free slot")[..=limit].fill(7);
        let refused = a.post_send_ring(&mut tx, RingSend::send(limit + 1).inline());
        assert!(
            matches!(refused, Err(Error::Post { .. })),
            "{path:?}: {refused:?}"
        );
        assert_eq!((tx.free(), tx.posted()), (free, 0));
        assert_no_completion(&mut cq_a, QUIET);
        assert_no_completion(&mut cq_b, QUIET);
    }
}

/// A UD send ring: each request names its destination (`RingSend::to`; refused without one,
/// and on RC with one), 30 rounds of an unsignaled and a signaled datagram arrive byte for
/// byte after the GRH; the ring keeps the address handle while a send is posted (closing it is
/// refused with `EBUSY`) and lets it go once the completion is handed over (the unsignaled
/// send's with it), after `reclaim` on a reset queue pair, and, for a ring dropped with a
/// send posted, once the queue pair is destroyed.
#[test]
fn ring_ud_sends_keep_their_address_handles() {
    const QKEY: u32 = 0x1111_2222;
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let mut a = f.ud_qp(f.pd.qp_builder(&cq_a, &cq_a), QKEY);
    let mut b = f.ud_qp(f.pd.qp_builder(&cq_b, &cq_b), QKEY);
    let mut tx = a.send_ring(4, SIZE).unwrap();
    let mut rx = b.recv_ring(8, GRH_LEN + SIZE).unwrap();
    assert_eq!(b.fill_recv_ring(&mut rx).unwrap(), 8);
    let mut ah = f.pd.create_ah(&f.av()).unwrap();
    invalid(
        a.post_send_ring(&mut tx, RingSend::send(8)),
        "needs a destination",
    );
    // An address handle of another protection domain, and one of another device: refused
    // before the provider sees them, nothing posted or kept (the rounds below find no
    // completion of theirs).
    let pd2 = f.context.alloc_pd().unwrap();
    let foreign = pd2.create_ah(&f.av()).unwrap();
    invalid(
        a.post_send_ring(&mut tx, RingSend::send(8).to(&foreign, b.qp_num(), QKEY)),
        "another protection domain",
    );
    foreign.close().expect("a refused request keeps nothing");
    let name = rdma_test_support::second_device().expect("the harness's second device");
    let context2 = Context::open(&name).unwrap();
    let pd3 = context2.alloc_pd().unwrap();
    let gid2 = context2.routable_gid(1).unwrap();
    let av2 = AddressVector::new(1).grh(Gid(f.device.gid), gid2.index as u8);
    let other_device = pd3.create_ah(&av2).unwrap();
    invalid(
        a.post_send_ring(
            &mut tx,
            RingSend::send(8).to(&other_device, b.qp_num(), QKEY),
        ),
        "another protection domain",
    );
    other_device
        .close()
        .expect("a refused request keeps nothing");
    assert_eq!(tx.free(), 4);
    let busy = |ah: AddressHandle| -> AddressHandle {
        let (ah, error) = ah.close().expect_err("a send ring keeps the handle");
        assert_eq!(error.errno(), Some(Errno::BUSY), "{error}");
        ah
    };
    for round in 0..30u64 {
        let len = SIZE - round as usize;
        for k in 0..2 {
            let data = &message(2 * round + k)[..len];
            tx.next_mut().expect("a free slot")[..len].copy_from_slice(data);
            let request = RingSend::send(len).to(&ah, b.qp_num(), QKEY);
            let request = if k == 0 {
                request.unsignaled()
            } else {
                request
            };
            a.post_send_ring(&mut tx, request).unwrap();
        }
        ah = busy(ah);
        let sent = wait_for(&mut cq_a, 1);
        assert_ok(&sent[0], sent[0].wr_id(), WcOpcode::Send);
        let carried = &message(2 * round + 1)[..len];
        assert_eq!(tx.complete(&sent[0]), Some(carried), "round {round}");
        assert_eq!(tx.posted(), 0);
        let got = wait_for(&mut cq_b, 2);
        for (k, wc) in got.iter().enumerate() {
            assert_eq!(wc.src_qp(), a.qp_num());
            let bytes = rx.complete(wc).expect("a receive of the ring");
            assert_eq!(&bytes[GRH_LEN..], &message(2 * round + k as u64)[..len]);
        }
        assert_eq!(b.fill_recv_ring(&mut rx).unwrap(), 2);
    }
    ah.close()
        .expect("no send of the ring holds the handle any more");

    // A send the provider refuses (inline, one byte over the limit) keeps no handle.
    let cq_g = f.cq(16);
    let mut g = f.ud_qp(f.pd.qp_builder(&cq_g, &cq_g).max_inline_data(64), QKEY);
    let limit = g.caps().max_inline_data as usize;
    let mut tx_g = g.send_ring(2, limit + 8).unwrap();
    let ah = f.pd.create_ah(&f.av()).unwrap();
    tx_g.next_mut().expect("a free slot")[..=limit].fill(3);
    let refused = g.post_send_ring(
        &mut tx_g,
        RingSend::send(limit + 1).inline().to(&ah, b.qp_num(), QKEY),
    );
    assert!(matches!(refused, Err(Error::Post { .. })), "{refused:?}");
    assert_eq!(tx_g.posted(), 0);
    ah.close()
        .expect("the refused send's slot let the handle go");

    // `reclaim` after a reset lets the handle go.
    let ah = f.pd.create_ah(&f.av()).unwrap();
    tx.next_mut().expect("a free slot")[..8].fill(1);
    a.post_send_ring(&mut tx, RingSend::send(8).to(&ah, b.qp_num(), QKEY))
        .unwrap();
    let sent = wait_for(&mut cq_a, 1);
    let ah = busy(ah);
    let a = a.into_reset().unwrap();
    tx.reclaim(&a).unwrap();
    assert_eq!(tx.posted(), 0);
    assert_eq!(
        tx.complete(&sent[0]),
        None,
        "reclaimed before it was handed over"
    );
    ah.close()
        .expect("reclaimed: the ring holds the handle no more");

    // A ring dropped with a send posted: the queue pair keeps the handle until destroyed.
    let cq_c = f.cq(16);
    let mut c = f.ud_qp(f.pd.qp_builder(&cq_c, &cq_c), QKEY);
    let mut tx_c = c.send_ring(2, SIZE).unwrap();
    let ah = f.pd.create_ah(&f.av()).unwrap();
    tx_c.next_mut().expect("a free slot")[..8].fill(2);
    c.post_send_ring(&mut tx_c, RingSend::send(8).to(&ah, b.qp_num(), QKEY))
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
    let mut tx_d = d.send_ring(2, SIZE).unwrap();
    let ah = f.pd.create_ah(&f.av()).unwrap();
    invalid(
        d.post_send_ring(&mut tx_d, RingSend::send(8).to(&ah, 1, QKEY)),
        "datagram destinations are for UD",
    );
    assert_eq!(tx_d.posted(), 0);
    ah.close().expect("a refused request keeps nothing");
}

/// Two pairs share one completion queue per side: each ring takes only its own completions,
/// and a completion of the other pair's ring changes nothing. Unsignaled sends are freed
/// together by the signaled one after them.
#[test]
fn rings_share_completion_queues_and_unsignaled_sends_are_freed() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(64), f.cq(64));
    let (mut a1, mut b1) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let (mut a2, mut b2) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let (mut tx1, mut tx2) = (
        a1.send_ring(8, SIZE).unwrap(),
        a2.send_ring(8, SIZE).unwrap(),
    );
    let (mut rx1, mut rx2) = (
        b1.recv_ring(8, SIZE).unwrap(),
        b2.recv_ring(8, SIZE).unwrap(),
    );
    for _ in 0..4 {
        b1.post_recv_ring(&mut rx1).unwrap();
        b2.post_recv_ring(&mut rx2).unwrap();
    }
    for n in 0..4u64 {
        send(&mut a1, &mut tx1, &message(n), n < 3);
        send(&mut a2, &mut tx2, &message(10 + n), n < 3);
    }
    assert_eq!((tx1.posted(), tx2.posted()), (4, 4));
    let sent = wait_for(&mut cq_a, 2);
    assert_no_completion(&mut cq_a, QUIET);
    for wc in &sent {
        assert_ok(wc, wc.wr_id(), WcOpcode::Send);
        let (mine, other) = if wc.qp_num() == a1.qp_num() {
            (&mut tx1, &mut tx2)
        } else {
            (&mut tx2, &mut tx1)
        };
        let before = other.posted();
        assert_eq!(other.complete(wc), None, "the other pair's completion");
        assert_eq!(other.posted(), before, "unchanged");
        let last = if mine.is_for(&a1) { 3 } else { 13 };
        assert_eq!(mine.complete(wc), Some(&message(last)[..]));
        assert_eq!(
            mine.posted(),
            0,
            "the three unsignaled sends before it are free too"
        );
    }
    let got = wait_for(&mut cq_b, 8);
    let (mut n1, mut n2) = (0u64, 0u64);
    for wc in &got {
        assert_ok(wc, wc.wr_id(), WcOpcode::Recv);
        if wc.qp_num() == b1.qp_num() {
            assert_eq!(rx2.complete(wc), None);
            assert_eq!(rx1.complete(wc), Some(&message(n1)[..]));
            n1 += 1;
        } else {
            assert_eq!(rx1.complete(wc), None);
            assert_eq!(rx2.complete(wc), Some(&message(10 + n2)[..]));
            n2 += 1;
        }
    }
    assert_eq!((n1, n2, rx1.posted(), rx2.posted()), (4, 4, 0, 0));
}

/// The signal rules, each alone: the send that takes a ring's last free slot is signaled
/// whatever it asked; and after `signal_every - 1` unsignaled sends of the queue pair in a
/// row, counted across its rings (and its slot and owned sends), the next is.
#[test]
fn ring_sends_are_signaled_when_they_must_be() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(64), f.cq(64));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a).max_send_wr(32),
        f.pd.qp_builder(&cq_b, &cq_b).max_recv_wr(64),
        AccessFlags::empty(),
    );
    let mut rx = b.recv_ring(64, SIZE).unwrap();
    while rx.free() > 0 {
        b.post_recv_ring(&mut rx).unwrap();
    }
    // The last free slot: a ring of 3 (signal_every 3), a signaled send and two unsignaled
    // ones, a run of two: the third takes the last free slot and is signaled.
    let mut three = a.send_ring(3, SIZE).unwrap();
    send(&mut a, &mut three, &message(1), false);
    send(&mut a, &mut three, &message(2), true);
    send(&mut a, &mut three, &message(3), true);
    let sent = wait_for(&mut cq_a, 2);
    assert_eq!(three.complete(&sent[0]), Some(&message(1)[..]));
    assert_eq!(three.complete(&sent[1]), Some(&message(3)[..]));
    assert_eq!(three.free(), 3);

    // The run: two rings of 8 (more than the run, so the last-slot rule stays out of it);
    // signal_every is 8 (the slot count, below the send queue's capacity).
    assert!(a.caps().max_send_wr >= 8);
    let mut one = a.send_ring(8, SIZE).unwrap();
    let mut other = a.send_ring(8, SIZE).unwrap();
    for n in 0..4 {
        send(&mut a, &mut one, &message(n), true);
    }
    for n in 0..3 {
        send(&mut a, &mut other, &message(n), true);
    }
    assert_no_completion(&mut cq_a, QUIET);
    send(&mut a, &mut one, &message(4), true);
    let sent = wait_for(&mut cq_a, 1);
    assert_eq!(
        one.complete(&sent[0]),
        Some(&message(4)[..]),
        "the eighth in a row"
    );
    assert_eq!((one.posted(), other.posted()), (0, 3));
    send(&mut a, &mut other, &message(3), false);
    let sent = wait_for(&mut cq_a, 1);
    assert_eq!(other.complete(&sent[0]), Some(&message(3)[..]));
    assert_eq!(other.posted(), 0);
    let got = wait_for(&mut cq_b, 12);
    assert!(got.iter().all(|wc| rx.complete(wc).is_some()));
    assert_no_completion(&mut cq_a, QUIET);
}

/// A ring larger than the send queue: after as many unsignaled sends in a row as the queue
/// holds less one, the next is signaled, although the ring has free slots left.
#[test]
fn ring_larger_than_the_send_queue_signals_within_it() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(64), f.cq(64));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a).max_send_wr(4),
        f.pd.qp_builder(&cq_b, &cq_b).max_recv_wr(64),
        AccessFlags::empty(),
    );
    let granted = a.caps().max_send_wr as usize;
    let slots = 2 * granted + 2;
    let mut rx = b.recv_ring(64, SIZE).unwrap();
    while rx.free() > 0 {
        b.post_recv_ring(&mut rx).unwrap();
    }
    let mut tx = a.send_ring(slots as u32, SIZE).unwrap();
    for n in 0..granted - 1 {
        send(&mut a, &mut tx, &message(n as u64), true);
    }
    assert_no_completion(&mut cq_a, QUIET);
    send(&mut a, &mut tx, &message(99), true);
    let sent = wait_for(&mut cq_a, 1);
    assert_eq!(
        tx.complete(&sent[0]),
        Some(&message(99)[..]),
        "the one that had to be signaled"
    );
    assert_eq!(tx.free() as usize, slots);
    let got = wait_for(&mut cq_b, granted);
    assert!(got.iter().all(|wc| rx.complete(wc).is_some()));
}

/// A reset discards what the rings had posted, without completions: `reclaim` with the queue
/// pair in RESET frees their slots (and refuses another queue pair's ring); the rings then
/// serve the reconnected queue pair, and a completion made before the reset matches nothing.
#[test]
fn ring_reclaim_after_a_reset() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let mut rx = b.recv_ring(4, SIZE).unwrap();
    while rx.free() > 0 {
        b.post_recv_ring(&mut rx).unwrap();
    }
    let mut tx = a.send_ring(4, SIZE).unwrap();
    send(&mut a, &mut tx, &message(1), false);
    let sent = wait_for(&mut cq_a, 1);
    assert!(tx.complete(&sent[0]).is_some());
    // Received, but the completion is never handed over: the slot stays posted.
    let early = wait_for(&mut cq_b, 1);
    // A send of b's that cannot complete: `a` has no receive posted (the peer retries).
    let mut tx_b = b.send_ring(2, SIZE).unwrap();
    b.post_send_ring(&mut tx_b, RingSend::send(8).unsignaled())
        .unwrap();
    assert_eq!((rx.posted(), tx_b.posted()), (4, 1));
    let b = b.into_reset().unwrap();
    // Another queue pair in RESET (a new one is made in it): refused, nothing freed.
    let other = f.pd.qp_builder::<Rc>(&cq_b, &cq_b).build().unwrap();
    invalid(rx.reclaim(&other), "another queue pair");
    invalid(tx_b.reclaim(&other), "another queue pair");
    assert_eq!((rx.posted(), tx_b.posted()), (4, 1));
    rx.reclaim(&b).unwrap();
    tx_b.reclaim(&b).unwrap();
    assert_eq!(
        (rx.posted(), rx.free(), tx_b.posted(), tx_b.free()),
        (0, 4, 0, 2)
    );
    let (mut a, mut b) = f.reconnect_rc(a, b, (100, 200));
    assert_no_completion(&mut cq_b, QUIET);
    b.post_recv_ring(&mut rx).unwrap();
    assert_eq!(rx.complete(&early[0]), None, "made before the reset");
    assert_eq!(rx.posted(), 1, "the new receive stays posted");
    send(&mut a, &mut tx, &message(2), false);
    let sent = wait_for(&mut cq_a, 1);
    assert_eq!(tx.complete(&sent[0]), Some(&message(2)[..]));
    let got = wait_for(&mut cq_b, 1);
    assert_eq!(rx.complete(&got[0]), Some(&message(2)[..]));
}

/// A send ring on the extended send path (`ibv_wr_*`): a SEND of no bytes (no scatter/gather
/// entry; the receive ring lends no bytes), a SEND, a WRITE with immediate data, READ, and both
/// atomics with their old values.
#[test]
fn ring_sends_on_the_extended_path() {
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
    let mut tx = a.send_ring(4, SIZE).unwrap();
    let mut rx = b.recv_ring(4, SIZE).unwrap();
    while rx.free() > 0 {
        b.post_recv_ring(&mut rx).unwrap();
    }
    a.post_send_ring(&mut tx, RingSend::send(0)).unwrap();
    send(&mut a, &mut tx, &message(3), false);
    let sent = wait_for(&mut cq_a, 2);
    assert_eq!(tx.complete(&sent[0]), Some(&[][..]));
    assert_eq!(tx.complete(&sent[1]), Some(&message(3)[..]));
    let got = wait_for(&mut cq_b, 2);
    assert_eq!(got[0].byte_len(), 0);
    assert_eq!(rx.complete(&got[0]), Some(&[][..]), "a SEND of no bytes");
    assert_eq!(rx.complete(&got[1]), Some(&message(3)[..]));

    tx.next_mut().unwrap()[..4].copy_from_slice(b"ext!");
    a.post_send_ring(
        &mut tx,
        RingSend::write(4, target.remote(16..20).unwrap()).with_imm(7),
    )
    .unwrap();
    let word = target.remote(..8).unwrap();
    a.post_send_ring(&mut tx, RingSend::fetch_add(word, 10))
        .unwrap();
    a.post_send_ring(&mut tx, RingSend::compare_swap(word, 15, 1))
        .unwrap();
    let done = wait_for(&mut cq_a, 3);
    assert_eq!(
        (done[0].opcode(), done[1].opcode(), done[2].opcode()),
        (WcOpcode::RdmaWrite, WcOpcode::FetchAdd, WcOpcode::CompSwap)
    );
    assert_eq!(tx.complete(&done[0]), Some(&b"ext!"[..]));
    let old = tx.complete(&done[1]).unwrap();
    assert_eq!(u64::from_ne_bytes(old.try_into().unwrap()), 5);
    let old = tx.complete(&done[2]).unwrap();
    assert_eq!(u64::from_ne_bytes(old.try_into().unwrap()), 15);
    a.post_send_ring(&mut tx, RingSend::read(8, word)).unwrap();
    let read = wait_for(&mut cq_a, 1);
    let now = tx.complete(&read[0]).unwrap();
    assert_eq!(u64::from_ne_bytes(now.try_into().unwrap()), 1);
    let got = wait_for(&mut cq_b, 1);
    assert_eq!(got[0].imm_data(), Some(7));
    assert_eq!(rx.complete(&got[0]), Some(&[][..]));
    let mut four = [0u8; 4];
    target.read_at(16, &mut four).unwrap();
    assert_eq!(&four, b"ext!");
}

/// UD: a receive ring's slots take the GRH and the datagram; a completion lends both, the
/// datagram's bytes after the GRH's 40 (sent with the owned path, which keeps the address
/// handle).
#[test]
fn ring_ud_receives_lend_the_grh_and_the_datagram() {
    let Some(f) = fixture() else { return };
    const QKEY: u32 = 0x0bad_cafe;
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let mut a = f.ud_qp(f.pd.qp_builder(&cq_a, &cq_a), QKEY);
    let mut b = f.ud_qp(f.pd.qp_builder(&cq_b, &cq_b), QKEY);
    let pool = BufferPool::new(&f.pd, 2, SIZE).unwrap();
    let ah = f.pd.create_ah(&f.av()).unwrap();
    let mut rx = b.recv_ring(3, GRH_LEN + SIZE).unwrap();
    while rx.free() > 0 {
        b.post_recv_ring(&mut rx).unwrap();
    }
    for round in 0..7u64 {
        let mut buf = pool.take().unwrap();
        buf.fill_from(&message(round)[..SIZE - round as usize])
            .unwrap();
        a.post_send_owned(SendRequest::send(buf).to(&ah, b.qp_num(), QKEY))
            .unwrap();
        let sent = reap(&mut cq_a, 1);
        assert!(sent[0].is_success());
        drop(sent);
        let got = wait_for(&mut cq_b, 1);
        assert_eq!(got[0].src_qp(), a.qp_num());
        let bytes = rx.complete(&got[0]).expect("a receive of the ring");
        assert_eq!(bytes.len(), GRH_LEN + SIZE - round as usize);
        assert_eq!(&bytes[GRH_LEN..], &message(round)[..SIZE - round as usize]);
        b.post_recv_ring(&mut rx).unwrap();
    }
}

/// RDMA WRITE with its bytes checked at the target, WRITE with immediate data into the peer's
/// receive ring (whose completion lends no bytes), READ into a slot, both atomics with their
/// old values, and a fenced READ after an unsignaled fetch-and-add.
#[test]
fn ring_write_read_and_atomics() {
    let Some(f) = fixture() else { return };
    let rights = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        rights,
    );
    let mut target =
        f.pd.register(2 * SIZE, AccessFlags::LOCAL_WRITE | rights)
            .unwrap();
    target.write_at(SIZE, &message(77)).unwrap();
    let mut ring = a.send_ring(4, SIZE).unwrap();
    let mut rx = b.recv_ring(2, SIZE).unwrap();
    b.post_recv_ring(&mut rx).unwrap();

    ring.next_mut().unwrap().copy_from_slice(&message(5));
    a.post_send_ring(
        &mut ring,
        RingSend::write(SIZE, target.remote(..SIZE).unwrap()),
    )
    .unwrap();
    a.post_send_ring(
        &mut ring,
        RingSend::read(SIZE, target.remote(SIZE..).unwrap()),
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
    assert_eq!(ring.complete(&done[0]), Some(&message(5)[..]));
    assert_eq!(ring.complete(&done[1]), Some(&message(77)[..]), "the read");

    ring.next_mut().unwrap()[..4].copy_from_slice(b"imm!");
    a.post_send_ring(
        &mut ring,
        RingSend::write(4, target.remote(..4).unwrap())
            .with_imm(0xfeed)
            .solicited(),
    )
    .unwrap();
    let done = wait_for(&mut cq_a, 1);
    assert_eq!(ring.complete(&done[0]), Some(&b"imm!"[..]));
    let got = wait_for(&mut cq_b, 1);
    assert_ok(&got[0], got[0].wr_id(), WcOpcode::RecvRdmaWithImm);
    assert_eq!(got[0].imm_data(), Some(0xfeed));
    assert_eq!(
        rx.complete(&got[0]),
        Some(&[][..]),
        "the bytes went to the target"
    );
    let mut four = [0u8; 4];
    target.read_at(0, &mut four).unwrap();
    assert_eq!(&four, b"imm!");

    let word = target.remote(..8).unwrap();
    target.write_at(0, &40u64.to_ne_bytes()).unwrap();
    a.post_send_ring(&mut ring, RingSend::fetch_add(word, 2))
        .unwrap();
    let added = wait_for(&mut cq_a, 1);
    assert_eq!(added[0].opcode(), WcOpcode::FetchAdd);
    let old = ring.complete(&added[0]).unwrap();
    assert_eq!(u64::from_ne_bytes(old.try_into().unwrap()), 40);
    a.post_send_ring(&mut ring, RingSend::compare_swap(word, 42, 7))
        .unwrap();
    let swapped = wait_for(&mut cq_a, 1);
    assert_eq!(swapped[0].opcode(), WcOpcode::CompSwap);
    let old = ring.complete(&swapped[0]).unwrap();
    assert_eq!(u64::from_ne_bytes(old.try_into().unwrap()), 42);
    assert_eq!(target.load_u64(0).unwrap(), 7);

    a.post_send_ring(&mut ring, RingSend::fetch_add(word, 5).unsignaled())
        .unwrap();
    a.post_send_ring(&mut ring, RingSend::read(8, word).fenced())
        .unwrap();
    let fenced = wait_for(&mut cq_a, 1);
    assert_ok(&fenced[0], fenced[0].wr_id(), WcOpcode::RdmaRead);
    let sum = ring.complete(&fenced[0]).unwrap();
    assert_eq!(u64::from_ne_bytes(sum.try_into().unwrap()), 12);
    assert_eq!(ring.posted(), 0, "the atomic's slot was freed");
    assert_eq!(target.load_u64(0).unwrap(), 12);
    assert_no_completion(&mut cq_a, QUIET);
}

/// What rings refuse, and what each refusal leaves: the slot free, the counts unchanged.
#[test]
fn ring_refusals() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b).max_recv_wr(2),
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
    );
    invalid(a.send_ring(0, 16), "1 to");
    invalid(a.recv_ring(4, 0), "1 to");
    invalid(a.send_ring(MAX_RING_SLOTS + 1, 8), "1 to");
    invalid(a.recv_ring(4, usize::MAX), "too large");

    let mut tx = a.send_ring(2, 16).unwrap();
    let mut rx = b.recv_ring(64, 16).unwrap();
    invalid(a.post_recv_ring(&mut rx), "another queue pair");
    invalid(
        b.post_send_ring(&mut tx, RingSend::send(1)),
        "another queue pair",
    );
    assert_eq!((rx.posted(), tx.posted()), (0, 0));
    invalid(
        a.post_send_ring(&mut tx, RingSend::send(17)),
        "exceeds the slot size",
    );
    let remote =
        f.pd.register(8, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
    invalid(
        a.post_send_ring(&mut tx, RingSend::write(16, remote.remote(..).unwrap())),
        "remote memory",
    );
    invalid(
        a.post_send_ring(&mut tx, RingSend::read(9, remote.remote(..).unwrap())),
        "remote memory",
    );
    let mut tiny = a.send_ring(1, 4).unwrap();
    invalid(
        a.post_send_ring(
            &mut tiny,
            RingSend::fetch_add(remote.remote(..).unwrap(), 1),
        ),
        "exceeds the slot size",
    );
    assert_eq!(
        (tx.free(), tiny.free()),
        (2, 1),
        "no slot taken by a refusal"
    );

    // A full ring: the send ring hands out no slot and refuses the post; the receive ring
    // refuses past its slots.
    for _ in 0..2 {
        b.post_recv_ring(&mut rx).unwrap();
    }
    for n in 0..2 {
        send(&mut a, &mut tx, &[n; 16], true);
    }
    assert!(tx.next_mut().is_none());
    invalid(a.post_send_ring(&mut tx, RingSend::send(1)), "every slot");
    let done = wait_for(&mut cq_a, 1);
    assert_eq!(
        tx.complete(&done[0]),
        Some(&[1u8; 16][..]),
        "the last was signaled"
    );
    let got = wait_for(&mut cq_b, 2);
    assert_eq!(rx.complete(&got[0]), Some(&[0u8; 16][..]));
    assert_eq!(rx.complete(&got[1]), Some(&[1u8; 16][..]));
    let mut small = b.recv_ring(1, 16).unwrap();
    b.post_recv_ring(&mut small).unwrap();
    invalid(b.post_recv_ring(&mut small), "every slot");

    // A full receive queue: the provider refuses the receive past its capacity (at least the
    // granted one); that slot stays free, and a send then fills the oldest receive.
    let capacity = b.caps().max_recv_wr;
    let mut accepted = 0;
    let full = loop {
        match b.post_recv_ring(&mut rx) {
            Ok(()) => accepted += 1,
            Err(error) => break error,
        }
        assert!(accepted < 64, "a receive queue that never fills");
    };
    assert!(matches!(full, Error::QueueFull { .. }), "{full}");
    let posted = rx.posted();
    assert_eq!(posted, accepted, "the refused receive's slot is free again");
    assert!(posted + 1 >= capacity, "{posted} of {capacity} posted");
    send(&mut a, &mut tx, b"sixteen bytes!!!", false);
    let done = wait_for(&mut cq_a, 1);
    assert_eq!(tx.complete(&done[0]), Some(&b"sixteen bytes!!!"[..]));
    let got = wait_for(&mut cq_b, 1);
    assert_eq!(small.complete(&got[0]), Some(&b"sixteen bytes!!!"[..]));
    assert_eq!(rx.posted(), posted);

    // UC carries no READ or atomics; UD only SENDs, and its receives need room for the GRH;
    // a queue pair on an SRQ has no receive ring.
    let (uc_cq_a, uc_cq_b) = (f.cq(4), f.cq(4));
    let (mut uc, _uc_b) = f.uc_pair(
        f.pd.qp_builder(&uc_cq_a, &uc_cq_a),
        f.pd.qp_builder(&uc_cq_b, &uc_cq_b),
        AccessFlags::REMOTE_WRITE,
    );
    let mut uc_ring = uc.send_ring(2, 16).unwrap();
    invalid(
        uc.post_send_ring(&mut uc_ring, RingSend::read(8, remote.remote(..).unwrap())),
        "UC",
    );
    assert_eq!(uc_ring.free(), 2);
    let ud_cq = f.cq(4);
    let mut ud = f.ud_qp(f.pd.qp_builder(&ud_cq, &ud_cq), 0x1234);
    let mut ud_ring = ud.send_ring(1, 64).unwrap();
    invalid(
        ud.post_send_ring(&mut ud_ring, RingSend::write(8, remote.remote(..).unwrap())),
        "UD",
    );
    assert_eq!(ud_ring.free(), 1);
    invalid(ud.recv_ring(1, GRH_LEN - 1), "GRH");
    let srq = f.pd.create_srq(4, 1).expect("ibv_create_srq");
    let srq_cq = f.cq(4);
    let on_srq =
        f.pd.qp_builder::<Rc>(&srq_cq, &srq_cq)
            .srq(&srq)
            .build()
            .unwrap();
    invalid(on_srq.recv_ring(1, 64), "SRQ");

    // A scope would count the rings' completions as its own.
    let mut ran = false;
    let scoped = b.scope(ScopeCqs::shared(&mut cq_b), |_| ran = true);
    assert!(matches!(scoped, Err(Error::InvalidArgument(why)) if why.contains("ring")) && !ran);
}

/// A queue pair moved to the error state flushes its ring's receives: each flushed completion
/// frees its slot and lends no bytes.
#[test]
fn ring_receives_flushed_by_the_error_state() {
    let Some(f) = fixture() else { return };
    let (cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (_a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let mut rx = b.recv_ring(3, SIZE).unwrap();
    while rx.free() > 0 {
        b.post_recv_ring(&mut rx).unwrap();
    }
    let b = b.into_error().expect("move to ERR");
    let flushed = wait_for(&mut cq_b, 3);
    for (n, wc) in flushed.iter().enumerate() {
        assert_eq!(wc.status(), WcStatus::WrFlushErr, "{wc:?}");
        assert_eq!(wc.qp_num(), b.qp_num());
        assert_eq!(rx.complete(wc), Some(&[][..]), "flushed receive {n}");
        assert_eq!(rx.posted(), 2 - n as u32);
    }
    assert_no_completion(&mut cq_b, QUIET);
}

/// Completions handed over out of order: the third receive's completion first lends its bytes
/// and frees the two before it, whose completions then match nothing.
#[test]
fn ring_completions_handed_over_out_of_order() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let mut tx = a.send_ring(4, SIZE).unwrap();
    let mut rx = b.recv_ring(4, SIZE).unwrap();
    // Move the head to slot 2, so that the three posted receives wrap around the ring.
    for round in 0..2 {
        b.post_recv_ring(&mut rx).unwrap();
        send(&mut a, &mut tx, &message(round), false);
        let got = wait_for(&mut cq_b, 1);
        assert!(rx.complete(&got[0]).is_some());
        let sent = wait_for(&mut cq_a, 1);
        assert!(tx.complete(&sent[0]).is_some());
    }
    for round in 0..3 {
        b.post_recv_ring(&mut rx).unwrap();
        send(&mut a, &mut tx, &message(10 + round), round < 2);
    }
    let sent = wait_for(&mut cq_a, 1);
    assert_eq!(tx.complete(&sent[0]), Some(&message(12)[..]));
    let got = wait_for(&mut cq_b, 3);
    assert_eq!(rx.complete(&got[2]), Some(&message(12)[..]));
    assert_eq!((rx.posted(), rx.free()), (0, 4));
    assert_eq!(rx.complete(&got[0]), None);
    assert_eq!(rx.complete(&got[1]), None);
}

/// A ring dropped with receives posted leaves its region with the queue pair: the peer's send
/// still lands in it, and the queue pair refuses a scope. A ring dropped with nothing posted
/// takes its region back (the scope opens). A ring whose queue pair was destroyed refuses the
/// queue pair made next.
#[test]
fn ring_drops_and_destroyed_queue_pairs() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let idle = a.recv_ring(2, SIZE).unwrap();
    let mut sent_all = a.send_ring(2, SIZE).unwrap();
    drop(idle);
    let scoped = a.scope(ScopeCqs::shared(&mut cq_a), |_| 7);
    invalid(scoped, "ring");
    let mut rx = b.recv_ring(2, SIZE).unwrap();
    b.post_recv_ring(&mut rx).unwrap();
    drop(rx);
    send(&mut a, &mut sent_all, &message(1), false);
    let got = wait_for(&mut cq_b, 1);
    assert_ok(&got[0], got[0].wr_id(), WcOpcode::Recv);
    assert_eq!(got[0].byte_len() as usize, SIZE);
    let sent = wait_for(&mut cq_a, 1);
    assert_eq!(sent_all.complete(&sent[0]), Some(&message(1)[..]));
    drop(sent_all);
    let scoped = a.scope(ScopeCqs::shared(&mut cq_a), |_| 7);
    assert!(matches!(scoped, Ok(7)), "{scoped:?}");
    let scoped = b.scope(ScopeCqs::shared(&mut cq_b), |_| 7);
    invalid(scoped, "ring");

    let mut orphan = a.send_ring(2, SIZE).unwrap();
    let mut orphan_rx = a.recv_ring(2, SIZE).unwrap();
    drop((a, b));
    let (mut c, _d) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    invalid(
        c.post_send_ring(&mut orphan, RingSend::send(1)),
        "another queue pair",
    );
    invalid(c.post_recv_ring(&mut orphan_rx), "another queue pair");
    assert!(!orphan.is_for(&c) && orphan.next_mut().is_some());
    assert_eq!((orphan.posted(), orphan_rx.posted()), (0, 0));
}
