//! The owned-buffer data path on the device: buffers move into the queue pair when posted and
//! come back with their completion (`poll_each`), with every byte checked; a receive ring that
//! stays posted across rounds; many queue pairs on one completion queue; unsignaled sends
//! released by a later signaled one; RDMA WRITE, READ and atomics; UD sends that keep their
//! address handle alive; SRQ receives completing in two queue pairs' queues; what a reset and a
//! drop release; stale completions that match nothing; and what the path refuses.

use std::sync::Arc;
use std::time::Instant;

use rdma_test_support::verbs::*;
use rdma_verbs::{ah::*, cq::*, device::*, mr::*, owned::*, scope::*, wr::*, *};

const SIZE: usize = 256;

fn message(round: u64) -> Vec<u8> {
    pattern(SIZE, round as u8)
}

/// A receive ring of 8 buffers stays posted across 200 rounds: each completion hands the
/// buffer back with the bytes received, and it is posted again at once. The sender's buffers
/// come back with their send completions.
#[test]
fn owned_receive_ring_across_rounds() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(32), f.cq(32));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let tx = BufferPool::new(&f.pd, 4, SIZE).unwrap();
    let rx = BufferPool::new(&f.pd, 8, SIZE).unwrap();
    for slot in 0..8 {
        b.post_recv_buf(rx.take().unwrap(), slot).unwrap();
    }
    assert_eq!((rx.available(), b.owned_in_flight()), (0, 8));
    for round in 0..200u64 {
        let mut buf = tx.take().unwrap();
        buf.fill_from(&message(round)).unwrap();
        a.post_send_owned(SendRequest::send(buf).tag(1000 + round))
            .unwrap();
        let mut sent = reap(&mut cq_a, 1);
        assert_eq!(sent[0].tag(), Some(1000 + round));
        assert_eq!(
            (sent[0].status(), sent[0].wc().opcode()),
            (WcStatus::Success, WcOpcode::Send)
        );
        assert_eq!(sent[0].take_buf().unwrap().len(), SIZE);
        let mut got = reap(&mut cq_b, 1);
        // Receives complete in order: round r fills ring slot r % 8.
        assert_eq!(got[0].tag(), Some(round % 8), "{got:?}");
        assert_eq!(got[0].wc().opcode(), WcOpcode::Recv);
        assert_eq!(got[0].wc().qp_num(), b.qp_num());
        let buf = got[0].take_buf().unwrap();
        assert_eq!(buf.len(), SIZE, "the length is what arrived");
        assert_eq!(&buf[..], &message(round)[..], "round {round}");
        b.post_recv_buf(buf, round % 8).unwrap();
    }
    assert_eq!(tx.available(), 4);
    assert_eq!(b.owned_in_flight(), 8);
    // Dropping the queue pair releases the ring: every buffer is back.
    drop(b);
    assert_eq!(rx.available(), 8);
}

/// `poll_each_for` is bounded: on an empty queue it hands nothing over and returns 0 once the
/// time is up; with completions waiting it hands over exactly `min` (the rest stay queued for
/// the next call), each with its buffer and the bytes received.
#[test]
fn owned_poll_each_for_hands_over_min_or_gives_up() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let pool = BufferPool::new(&f.pd, 6, SIZE).unwrap();
    let quiet = std::time::Duration::from_millis(50);
    let none = cq_b.poll_each_for(1, quiet, |c| panic!("nothing was posted: {c:?}"));
    assert_eq!(none.unwrap(), 0, "an empty queue times out with nothing");
    for tag in 0..3 {
        b.post_recv_buf(pool.take().unwrap(), tag).unwrap();
    }
    for round in 0..3u64 {
        let mut buf = pool.take().unwrap();
        buf.fill_from(&message(round)).unwrap();
        a.post_send_owned(SendRequest::send(buf).tag(100 + round))
            .unwrap();
    }
    // The senders' three completions: two, then the third.
    let mut sent = Vec::new();
    assert_eq!(cq_a.poll_each_for(2, WAIT, |c| sent.push(c)).unwrap(), 2);
    assert_eq!(cq_a.poll_each_for(1, WAIT, |c| sent.push(c)).unwrap(), 1);
    for (round, done) in sent.iter_mut().enumerate() {
        assert_done(done, 100 + round as u64, WcOpcode::Send);
        assert_eq!(done.take_buf().unwrap().len(), SIZE);
    }
    // The receives, all three at once, in order, every byte checked.
    let mut got = Vec::new();
    assert_eq!(cq_b.poll_each_for(3, WAIT, |c| got.push(c)).unwrap(), 3);
    for (round, done) in got.iter_mut().enumerate() {
        assert_done(done, round as u64, WcOpcode::Recv);
        assert_eq!(&done.take_buf().unwrap()[..], &message(round as u64)[..]);
    }
    assert_eq!(
        cq_b.poll_each_for(0, WAIT, |c| panic!("min 0: {c:?}"))
            .unwrap(),
        0
    );
    drop(got);
    drop(sent);
    assert_eq!(pool.available(), 6, "every buffer came back");
}

/// Four queue pairs receive into one completion queue: `poll_each` routes each completion to
/// its queue pair's table. The senders post three unsignaled sends and a signaled one: one
/// completion each, which also returns the unsignaled ones' buffers to their pool.
#[test]
fn owned_queue_pairs_share_a_completion_queue_and_unsignaled_sends_return() {
    let Some(f) = fixture() else { return };
    let mut shared = f.cq(64);
    let mut send_cq = f.cq(64);
    let tx = BufferPool::new(&f.pd, 16, SIZE).unwrap();
    let rx = BufferPool::new(&f.pd, 16, SIZE).unwrap();
    let mut pairs = Vec::new();
    for _ in 0..4 {
        let (a, b) = f.rc_pair(
            f.pd.qp_builder(&send_cq, &send_cq).max_send_wr(8),
            f.pd.qp_builder(&shared, &shared).max_recv_wr(8),
            AccessFlags::empty(),
        );
        pairs.push((a, b));
    }
    for (p, (a, b)) in pairs.iter_mut().enumerate() {
        for m in 0..4u64 {
            b.post_recv_buf(rx.take().unwrap(), (p as u64) << 8 | m)
                .unwrap();
        }
        for m in 0..4u64 {
            let mut buf = tx.take().unwrap();
            buf.fill_from(&message((p as u64) << 4 | m)).unwrap();
            let request = SendRequest::send(buf).tag((p as u64) << 8 | m);
            let request = if m < 3 { request.unsignaled() } else { request };
            a.post_send_owned(request).unwrap();
        }
    }
    let received = reap(&mut shared, 16);
    let mut seen = std::collections::BTreeSet::new();
    for mut c in received {
        assert!(c.is_success(), "{c:?}");
        let tag = c.tag().expect("an owned receive");
        let (p, m) = ((tag >> 8) as usize, tag & 0xff);
        assert_eq!(c.wc().qp_num(), pairs[p].1.qp_num(), "routed by number");
        let buf = c.take_buf().unwrap();
        assert_eq!(
            &buf[..],
            &message((p as u64) << 4 | m)[..],
            "pair {p} message {m}"
        );
        assert!(seen.insert(tag));
    }
    assert_eq!(seen.len(), 16);
    // One send completion per pair (the signaled one), tagged 3.
    let sent = reap(&mut send_cq, 4);
    for c in &sent {
        assert_eq!(c.tag().map(|t| t & 0xff), Some(3), "{c:?}");
        assert!(c.is_success());
    }
    assert_no_completion_each(&mut send_cq);
    drop(sent);
    // Every send buffer is back: the signaled ones with their completions (dropped above),
    // the unsignaled ones released by them.
    assert_eq!(tx.available(), 16);
    assert_eq!(rx.available(), 16);
    for (a, b) in &pairs {
        assert_eq!((a.owned_in_flight(), b.owned_in_flight()), (0, 0));
    }
}

/// RDMA WRITE from a buffer, READ into one, and both atomics with their old values, against a
/// remotely writable region of the peer (read by copying, as such regions are).
#[test]
fn owned_write_read_and_atomics() {
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
    let pool = BufferPool::new(&f.pd, 4, SIZE).unwrap();

    let mut buf = pool.take().unwrap();
    buf.fill_from(&message(5)).unwrap();
    a.post_send_owned(SendRequest::write(buf, target.remote(..SIZE).unwrap()).tag(1))
        .unwrap();
    let mut read = pool.take().unwrap();
    read.set_len(SIZE).unwrap();
    a.post_send_owned(SendRequest::read(read, target.remote(SIZE..).unwrap()).tag(2))
        .unwrap();
    let done = reap(&mut cq_a, 2);
    let mut copy = vec![0u8; SIZE];
    target.read_at(0, &mut copy).unwrap();
    assert_eq!(copy, message(5), "the write landed");
    let mut done = done.into_iter();
    let mut write = done.next().unwrap();
    assert_eq!(
        (write.tag(), write.wc().opcode()),
        (Some(1), WcOpcode::RdmaWrite)
    );
    drop(write.take_buf());
    let mut read = done.next().unwrap();
    assert_eq!(
        (read.tag(), read.wc().opcode()),
        (Some(2), WcOpcode::RdmaRead)
    );
    assert_eq!(&read.take_buf().unwrap()[..], &message(77)[..], "the read");

    let word = target.remote(..8).unwrap();
    target.write_at(0, &40u64.to_ne_bytes()).unwrap();
    a.post_send_owned(SendRequest::fetch_add(pool.take().unwrap(), word, 2).tag(3))
        .unwrap();
    let mut added = reap(&mut cq_a, 1).remove(0);
    assert_eq!(added.wc().opcode(), WcOpcode::FetchAdd);
    let old = added.take_buf().unwrap();
    assert_eq!(old.len(), 8);
    assert_eq!(u64::from_ne_bytes(old[..8].try_into().unwrap()), 40);
    drop(old);
    a.post_send_owned(SendRequest::compare_swap(pool.take().unwrap(), word, 42, 7).tag(4))
        .unwrap();
    let mut swapped = reap(&mut cq_a, 1).remove(0);
    assert_eq!(swapped.wc().opcode(), WcOpcode::CompSwap);
    let old = swapped.take_buf().unwrap();
    assert_eq!(u64::from_ne_bytes(old[..8].try_into().unwrap()), 42);
    assert_eq!(target.load_u64(0).unwrap(), 7);
    drop(old);

    // A fetch-and-add left unsignaled, then a fenced READ of the word: the READ starts once
    // the atomic is done, so it reads the sum; its completion also returns the atomic's
    // buffer to the pool.
    let mut result = pool.take().unwrap();
    result.set_len(8).unwrap();
    a.post_send_owned(
        SendRequest::fetch_add(pool.take().unwrap(), word, 5)
            .unsignaled()
            .tag(5),
    )
    .unwrap();
    a.post_send_owned(SendRequest::read(result, word).fenced().tag(6))
        .unwrap();
    let mut fenced = reap(&mut cq_a, 1).remove(0);
    assert_eq!(
        (fenced.tag(), fenced.status(), fenced.wc().opcode()),
        (Some(6), WcStatus::Success, WcOpcode::RdmaRead)
    );
    let sum = fenced.take_buf().unwrap();
    assert_eq!(u64::from_ne_bytes(sum[..8].try_into().unwrap()), 12);
    drop((sum, fenced));
    assert_eq!((a.owned_in_flight(), pool.available()), (0, 4));
    assert_eq!(target.load_u64(0).unwrap(), 12);
}

/// A reset releases every owned request (the device dropped them); a receive that completed
/// before the reset and was never polled is stale afterwards: `poll_each` hands it over as a
/// completion of no owned request, and the new receive posted after reconnecting is still in
/// flight until the peer sends, then carries the new bytes.
#[test]
fn owned_reset_releases_and_stale_completions_match_nothing() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let pool = BufferPool::new(&f.pd, 8, SIZE).unwrap();
    for slot in 0..3 {
        b.post_recv_buf(pool.take().unwrap(), slot).unwrap();
    }
    let mut buf = pool.take().unwrap();
    buf.fill_from(&message(1)).unwrap();
    a.post_send_owned(SendRequest::send(buf)).unwrap();
    // Wait for the send: on rxe the receive's completion is then in b's queue, not polled.
    let mut sent = reap(&mut cq_a, 1);
    drop(sent.remove(0).take_buf());
    assert_eq!(pool.available(), 5);

    let b = b.into_reset().unwrap();
    assert_eq!(pool.available(), 8, "the reset released all three receives");
    assert_eq!(b.owned_in_flight(), 0);
    let (mut a, mut b) = f.reconnect_rc(a, b, (100, 200));
    b.post_recv_buf(pool.take().unwrap(), 9).unwrap();
    // Whatever the queue still holds from before the reset matches no owned request.
    let mut stale = 0;
    let until = Instant::now() + QUIET;
    while Instant::now() < until {
        b_poll_stale(&mut cq_b, &mut stale);
    }
    note(&format!(
        "{stale} stale completion(s) in the queue after the reset"
    ));
    assert_eq!(b.owned_in_flight(), 1, "the new receive is still in flight");

    let mut buf = pool.take().unwrap();
    buf.fill_from(&message(2)).unwrap();
    a.post_send_owned(SendRequest::send(buf)).unwrap();
    drop(reap(&mut cq_a, 1));
    let mut got = reap(&mut cq_b, 1).remove(0);
    assert_eq!(got.tag(), Some(9));
    assert_eq!(&got.take_buf().unwrap()[..], &message(2)[..]);
    drop(got);
    assert_eq!(pool.available(), 8);
}

/// Polls `cq` once; every completion must be of no owned request (stale).
fn b_poll_stale(cq: &mut CompletionQueue, stale: &mut usize) {
    cq.poll_each(4, |c| {
        assert_eq!(
            c.tag(),
            None,
            "a stale completion was taken for an owned one: {c:?}"
        );
        *stale += 1;
    })
    .unwrap();
}

/// What the owned path refuses, each time giving the buffer back: a buffer of another
/// protection domain, a full receive queue, an atomic into fewer than 8 bytes, a UD send
/// (no destination yet); and what the other paths refuse because of it: a `wr_id` with the top
/// bit (reserved for owned ids), and a scope while owned requests are in flight.
#[test]
fn owned_refusals_give_the_buffer_back() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b).max_recv_wr(2),
        AccessFlags::REMOTE_ATOMIC,
    );
    let pool = BufferPool::new(&f.pd, 64, 8).unwrap();
    let other_pd = f.context.alloc_pd().unwrap();
    let foreign = BufferPool::new(&other_pd, 1, 8).unwrap();

    let refused = b.post_recv_buf(foreign.take().unwrap(), 1).unwrap_err();
    assert!(
        matches!(refused.error(), Error::InvalidArgument(_)),
        "{refused}"
    );
    assert!(refused.into_buf().unwrap().is_from(&foreign));
    assert_eq!(foreign.available(), 1);

    let capacity = b.caps().max_recv_wr as usize;
    for slot in 0..capacity {
        b.post_recv_buf(pool.take().unwrap(), slot as u64).unwrap();
    }
    let full = b.post_recv_buf(pool.take().unwrap(), 99).unwrap_err();
    assert!(matches!(full.error(), Error::QueueFull { .. }), "{full}");
    assert!(full.into_buf().is_some());
    assert_eq!(b.owned_in_flight(), capacity);

    // A scope would count the owned receives' completions: refused while they are in flight.
    let mut ran = false;
    let scoped = b.scope(ScopeCqs::shared(&mut cq_b), |_| ran = true);
    assert!(
        matches!(scoped, Err(Error::InvalidArgument(_))) && !ran,
        "{scoped:?}"
    );

    let small = BufferPool::new(&f.pd, 1, 4).unwrap();
    let mut counter =
        f.pd.register(8, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC)
            .unwrap();
    counter.write_at(0, &5u64.to_ne_bytes()).unwrap();
    let short = a
        .post_send_owned(SendRequest::fetch_add(
            small.take().unwrap(),
            counter.remote(..).unwrap(),
            1,
        ))
        .unwrap_err();
    assert!(
        matches!(short.error(), Error::InvalidArgument(_)),
        "{short}"
    );
    assert!(short.into_buf().is_some());

    // Reserved ids: the unsafe path and the scope refuse them.
    let src = f.pd.register(8, AccessFlags::LOCAL_WRITE).unwrap();
    let reserved = SendRequest::send(src.slice(..).unwrap()).tag(1 << 63);
    // SAFETY: refused before posting.
    let posted = unsafe { a.post_send_one(&reserved) };
    assert!(
        matches!(posted, Err(Error::InvalidArgument(_))),
        "{posted:?}"
    );
    let scoped = a.scope(ScopeCqs::shared(&mut cq_a), |s| {
        s.send(SendRequest::send(src.slice(..).unwrap()).tag(u64::MAX))
    });
    assert!(
        matches!(scoped, Ok(Err(Error::InvalidArgument(_)))),
        "{scoped:?}"
    );

    // UD: a send without a destination is refused.
    let mut ud_cq = f.cq(4);
    let mut ud = f.ud_qp(f.pd.qp_builder(&ud_cq, &ud_cq), 0x1234);
    let datagram = ud
        .post_send_owned(SendRequest::send(pool.take().unwrap()))
        .unwrap_err();
    assert!(
        matches!(datagram.error(), Error::InvalidArgument(_)),
        "{datagram}"
    );
    assert!(datagram.into_buf().is_some());
    // UD: a receive with no room for the 40-byte GRH is refused, whatever it is.
    let small = BufferPool::new(&f.pd, 1, GRH_LEN - 1).unwrap();
    let refused = ud.post_recv_buf(small.take().unwrap(), 1).unwrap_err();
    assert!(
        matches!(refused.error(), Error::InvalidArgument(why) if why.contains("GRH")),
        "{refused}"
    );
    assert_eq!(refused.into_buf().map(|b| b.capacity()), Some(GRH_LEN - 1));
    let no_grh = |e: &Error| matches!(e, Error::InvalidArgument(why) if why.contains("GRH"));
    let refused = ud
        .post_recv_owned(RecvRequest::new(small.take().unwrap()))
        .unwrap_err();
    assert!(no_grh(refused.error()), "{refused}");
    assert!(refused.into_buf().is_some());
    let refused = ud.post_recv_owned(RecvRequest::empty()).unwrap_err();
    assert!(no_grh(refused.error()), "{refused}");
    // A range counts as room too: 39 bytes of a shared region are refused.
    let shared = Arc::new(
        f.pd.register(GRH_LEN * 2, AccessFlags::LOCAL_WRITE)
            .unwrap()
            .into_shared(),
    );
    let range = RegionRange::new(&shared, 0..GRH_LEN - 1).unwrap();
    let refused = ud.post_recv_owned(RecvRequest::new(range)).unwrap_err();
    assert!(no_grh(refused.error()), "{refused}");
    // A receive given two ranges is refused for that first, whatever its room.
    let twice = RecvRequest::new(RegionRange::new(&shared, 0..8).unwrap())
        .and_range(RegionRange::new(&shared, 8..16).unwrap());
    let refused = ud.post_recv_owned(twice).unwrap_err();
    assert!(
        matches!(refused.error(), Error::InvalidArgument(why) if !why.contains("GRH")),
        "{refused}"
    );
    assert_eq!(ud.owned_in_flight(), 0);
    assert_eq!(small.available(), 1);
    assert_no_completion_each(&mut ud_cq);
    assert_no_completion_each(&mut cq_a);
    drop(counter);
}

/// The receive of an RDMA WRITE with immediate holds no bytes (they went to the target
/// memory): its buffer comes back with length 0, whatever the write's length. A SEND of an
/// empty buffer arrives as a receive of 0 bytes.
#[test]
fn owned_receive_lengths_for_write_with_immediate_and_empty_sends() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::REMOTE_WRITE,
    );
    let target =
        f.pd.register(SIZE, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
    let pool = BufferPool::new(&f.pd, 4, SIZE).unwrap();
    b.post_recv_buf(pool.take().unwrap(), 1).unwrap();
    b.post_recv_buf(pool.take().unwrap(), 2).unwrap();
    let mut buf = pool.take().unwrap();
    buf.fill_from(&message(3)).unwrap();
    a.post_send_owned(SendRequest::write(buf, target.remote(..).unwrap()).with_imm(0xabcd))
        .unwrap();
    let mut empty = pool.take().unwrap();
    empty.set_len(0).unwrap();
    a.post_send_owned(SendRequest::send(empty)).unwrap();
    drop(reap(&mut cq_a, 2));
    let mut got = reap(&mut cq_b, 2);
    assert_eq!(got[0].wc().opcode(), WcOpcode::RecvRdmaWithImm);
    assert_eq!(got[0].wc().imm_data(), Some(0xabcd));
    assert_eq!(got[0].wc().byte_len() as usize, SIZE);
    assert_eq!(
        got[0].take_buf().unwrap().len(),
        0,
        "no bytes landed in the buffer"
    );
    assert_eq!(got[1].wc().opcode(), WcOpcode::Recv);
    assert_eq!(got[1].wc().byte_len(), 0);
    assert_eq!(got[1].take_buf().unwrap().len(), 0);
    let mut copy = vec![0u8; SIZE];
    target.read_at(0, &mut copy).unwrap();
    assert_eq!(copy, message(3));
}

/// Unsignaled sends cannot fill the send queue for good: the one that takes the last free
/// slot is made signaled, so its completion comes and releases every buffer.
#[test]
fn owned_unsignaled_sends_cannot_wedge_the_queue() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(64), f.cq(64));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a).max_send_wr(4),
        f.pd.qp_builder(&cq_b, &cq_b).max_recv_wr(64),
        AccessFlags::empty(),
    );
    let slots = a.caps().max_send_wr as usize;
    let pool = BufferPool::new(&f.pd, 2 * slots, 16).unwrap();
    for m in 0..slots as u64 {
        b.post_recv_buf(pool.take().unwrap(), m).unwrap();
    }
    for m in 0..slots as u64 {
        let mut buf = pool.take().unwrap();
        buf.fill_from(&[m as u8; 16]).unwrap();
        a.post_send_owned(SendRequest::send(buf).tag(m).unsignaled())
            .unwrap();
    }
    let sent = reap(&mut cq_a, 1);
    assert_eq!(
        sent[0].tag(),
        Some(slots as u64 - 1),
        "the last one was signaled"
    );
    drop(sent);
    assert_eq!(a.owned_in_flight(), 0);
    let received = reap(&mut cq_b, slots);
    for (m, mut c) in received.into_iter().enumerate() {
        assert_eq!(&c.take_buf().unwrap()[..], &[m as u8; 16][..]);
    }
    assert_eq!(pool.available(), 2 * slots);
}

/// A READ into more bytes than the remote memory holds is refused, with the buffer back.
#[test]
fn owned_read_longer_than_the_remote_memory_is_refused() {
    let Some(f) = fixture() else { return };
    let (cq_a, cq_b) = (f.cq(16), f.cq(16));
    let (mut a, _b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::REMOTE_READ,
    );
    let source =
        f.pd.register(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
            .unwrap();
    let pool = BufferPool::new(&f.pd, 1, SIZE).unwrap();
    let refused = a
        .post_send_owned(SendRequest::read(
            pool.take().unwrap(),
            source.remote(..).unwrap(),
        ))
        .unwrap_err();
    assert!(
        matches!(refused.error(), Error::InvalidArgument(_)),
        "{refused}"
    );
    assert_eq!(refused.into_buf().unwrap().len(), SIZE);
    assert_eq!(a.owned_in_flight(), 0);
}

/// UD: an owned send keeps its address handle alive while in flight (the caller's handle is
/// dropped right after the post), and the receive's buffer comes back with the GRH and the
/// datagram.
#[test]
fn owned_ud_send_keeps_its_address_handle_alive() {
    let Some(f) = fixture() else { return };
    const QKEY: u32 = 0x0bad_cafe;
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let mut a = f.ud_qp(f.pd.qp_builder(&cq_a, &cq_a), QKEY);
    let mut b = f.ud_qp(f.pd.qp_builder(&cq_b, &cq_b), QKEY);
    let pool = BufferPool::new(&f.pd, 8, GRH_LEN + SIZE).unwrap();
    for round in 0..20u64 {
        b.post_recv_buf(pool.take().unwrap(), round).unwrap();
        let ah = f.pd.create_ah(&f.av()).unwrap();
        let mut buf = pool.take().unwrap();
        buf.fill_from(&message(round)).unwrap();
        a.post_send_owned(SendRequest::send(buf).to(&ah, b.qp_num(), QKEY).tag(round))
            .unwrap();
        // The request holds its own reference: the handle outlives this one.
        drop(ah);
        let sent = reap(&mut cq_a, 1);
        assert_eq!(
            (sent[0].tag(), sent[0].status()),
            (Some(round), WcStatus::Success)
        );
        drop(sent);
        let mut got = reap(&mut cq_b, 1);
        assert_eq!(got[0].tag(), Some(round));
        assert_eq!(got[0].wc().src_qp(), a.qp_num());
        let buf = got[0].take_buf().unwrap();
        assert_eq!(buf.len(), GRH_LEN + SIZE, "the GRH and the datagram");
        assert_eq!(&buf[GRH_LEN..], &message(round)[..], "round {round}");
    }
    assert_eq!(pool.available(), 8);
}

/// UD: a receive of exactly [`GRH_LEN`] bytes, the least a UD queue pair takes, receives a
/// datagram of no bytes (with immediate data): its buffer comes back holding the GRH alone. So
/// does a receive whose 40 bytes are split between a buffer and a range.
#[test]
fn owned_ud_receive_of_just_the_grh_takes_an_empty_datagram() {
    let Some(f) = fixture() else { return };
    const QKEY: u32 = 0x0bad_cafe;
    let (mut cq_a, mut cq_b) = (f.cq(4), f.cq(4));
    let mut a = f.ud_qp(f.pd.qp_builder(&cq_a, &cq_a), QKEY);
    // Two scatter entries for the receive split between a buffer and a range.
    let mut b = f.ud_qp(f.pd.qp_builder(&cq_b, &cq_b).max_recv_sge(2), QKEY);
    let grh_only = BufferPool::new(&f.pd, 1, GRH_LEN).unwrap();
    let mut guard = grh_only.take().unwrap();
    guard.fill_from(&[0xee; GRH_LEN]).unwrap();
    b.post_recv_buf(guard, 7).unwrap();
    let ah = f.pd.create_ah(&f.av()).unwrap();
    let pool = BufferPool::new(&f.pd, 1, 64).unwrap();
    let mut empty = pool.take().unwrap();
    empty.set_len(0).unwrap();
    a.post_send_owned(
        SendRequest::send(empty)
            .with_imm(0x5eed)
            .to(&ah, b.qp_num(), QKEY),
    )
    .unwrap();
    assert_eq!(reap(&mut cq_a, 1)[0].status(), WcStatus::Success);
    let mut got = reap(&mut cq_b, 1);
    assert_eq!(
        (got[0].tag(), got[0].status(), got[0].wc().opcode()),
        (Some(7), WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!(got[0].wc().imm_data(), Some(0x5eed));
    assert_eq!(got[0].wc().byte_len() as usize, GRH_LEN);
    let buf = got[0].take_buf().unwrap();
    assert_eq!(buf.len(), GRH_LEN, "the GRH alone");
    assert_grh(&buf[..].try_into().unwrap(), Gid(f.device.gid));

    // The room may be split: 16 bytes of a buffer and 24 of a range hold the GRH between them.
    let head = BufferPool::new(&f.pd, 1, 16).unwrap();
    let shared = Arc::new(
        f.pd.register(64, AccessFlags::LOCAL_WRITE)
            .unwrap()
            .into_shared(),
    );
    let receive = RecvRequest::new(head.take().unwrap())
        .and_range(RegionRange::new(&shared, 8..8 + GRH_LEN - 16).unwrap())
        .tag(8);
    b.post_recv_owned(receive).unwrap();
    let mut empty = pool.take().unwrap();
    empty.set_len(0).unwrap();
    a.post_send_owned(
        SendRequest::send(empty)
            .with_imm(0x5eee)
            .to(&ah, b.qp_num(), QKEY),
    )
    .unwrap();
    assert_eq!(reap(&mut cq_a, 1)[0].status(), WcStatus::Success);
    let mut got = reap(&mut cq_b, 1);
    assert_eq!(
        (got[0].tag(), got[0].status(), got[0].wc().imm_data()),
        (Some(8), WcStatus::Success, Some(0x5eee))
    );
    assert_eq!(got[0].wc().byte_len() as usize, GRH_LEN);
    let mut grh = [0u8; GRH_LEN];
    let first = got[0].take_buf().unwrap();
    assert_eq!(first.len(), 16, "the buffer is full");
    grh[..16].copy_from_slice(&first);
    shared.read_at(8, &mut grh[16..]).unwrap();
    assert_grh(&grh, Gid(f.device.gid));
}

/// Two queue pairs receive through one SRQ, each into its own completion queue: each
/// completion finds its buffer in the SRQ's table by id, whichever queue it comes from and in
/// whatever order the queues are polled; the buffers are posted again to the SRQ.
#[test]
fn owned_srq_receives_complete_through_either_queue_pair() {
    let Some(f) = fixture() else { return };
    let mut srq = f.pd.create_srq(16, 1).unwrap();
    let send_cq = f.cq(32);
    let (mut cq_1, mut cq_2) = (f.cq(32), f.cq(32));
    let (mut a1, b1) = f.rc_pair(
        f.pd.qp_builder(&send_cq, &send_cq),
        f.pd.qp_builder(&cq_1, &cq_1).srq(&srq),
        AccessFlags::empty(),
    );
    let (mut a2, b2) = f.rc_pair(
        f.pd.qp_builder(&send_cq, &send_cq),
        f.pd.qp_builder(&cq_2, &cq_2).srq(&srq),
        AccessFlags::empty(),
    );
    let mut send_cq = send_cq;
    let rx = BufferPool::new(&f.pd, 8, SIZE).unwrap();
    let tx = BufferPool::new(&f.pd, 8, SIZE).unwrap();
    for slot in 0..8 {
        srq.post_recv_buf(rx.take().unwrap(), slot).unwrap();
    }
    assert_eq!(srq.owned_in_flight(), 8);
    // A queue pair on an SRQ does not take receives of its own.
    let mut b1 = b1;
    let refused = b1.post_recv_buf(tx.take().unwrap(), 0).unwrap_err();
    assert!(
        matches!(refused.error(), Error::InvalidArgument(_)),
        "{refused}"
    );
    drop(refused);
    for round in 0..40u64 {
        // Two messages a round, one through each pair; the second queue is polled first.
        for (m, a) in [(2 * round, &mut a1), (2 * round + 1, &mut a2)] {
            let mut buf = tx.take().unwrap();
            buf.fill_from(&message(m)).unwrap();
            a.post_send_owned(SendRequest::send(buf).tag(m)).unwrap();
        }
        drop(reap(&mut send_cq, 2));
        for (m, cq, qp_num) in [
            (2 * round + 1, &mut cq_2, b2.qp_num()),
            (2 * round, &mut cq_1, b1.qp_num()),
        ] {
            let mut got = reap(cq, 1);
            assert_eq!(got[0].wc().qp_num(), qp_num);
            assert!(got[0].tag().is_some(), "an owned SRQ receive: {:?}", got[0]);
            let buf = got[0].take_buf().unwrap();
            assert_eq!(&buf[..], &message(m)[..], "message {m}");
            srq.post_recv_buf(buf, m).unwrap();
        }
    }
    assert_eq!((srq.owned_in_flight(), tx.available()), (8, 8));
    // The queue pairs go first (they hold the SRQ); dropping the SRQ then releases its ring.
    drop((a1, a2, b1, b2));
    drop(srq);
    assert_eq!(rx.available(), 8);
}
