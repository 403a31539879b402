//! Sizes and counts at the edges, on the device, through the owned path: zero-length SENDs,
//! messages of many packets (64 KiB and 1 MiB, every byte checked) from pool buffers and into
//! ranges of the caller's regions, and 256 connected queue pairs at once on two shared
//! completion queues.

use std::sync::Arc;

use rdma_test_support::verbs::*;
use rdma_verbs::{cq::*, mr::*, owned::*, qp::*, wr::*};

const LOCAL: AccessFlags = AccessFlags::LOCAL_WRITE;
/// What the bytes around a message are set to, to see that nothing was written outside it.
const GUARD: u8 = 0xee;
/// Guard bytes after each message.
const TAIL: usize = 4096;

/// Byte `i` of message `seed`: a function of the whole index, so a packet landing at the wrong
/// offset, dropped or repeated shows (unlike a pattern that repeats every 256 bytes).
fn byte_at(i: usize, seed: u32) -> u8 {
    let x = (i as u32 ^ seed.rotate_left(16)).wrapping_mul(0x9e37_79b1);
    (x >> 24) as u8 ^ (i >> 10) as u8
}

fn message(len: usize, seed: u32) -> Vec<u8> {
    (0..len).map(|i| byte_at(i, seed)).collect()
}

/// Checks every byte of `got` against message `seed`, naming the first wrong offset.
#[track_caller]
fn assert_message(got: &[u8], seed: u32) {
    if let Some(i) = (0..got.len()).find(|&i| got[i] != byte_at(i, seed)) {
        panic!(
            "byte {i} of {} is {:#04x}, expected {:#04x}",
            got.len(),
            got[i],
            byte_at(i, seed)
        );
    }
}

#[test]
fn volume_zero_length_send() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b, mut a, mut b) =
        f.rc_pair_own_cqs(AccessFlags::empty(), RcRtsAttr::new(0));
    let pool = BufferPool::new(&f.pd, 1, 64).unwrap();
    let mut dst = pool.take().unwrap();
    dst.fill_from(&[GUARD; 64]).unwrap();
    b.post_recv_buf(dst, 1).unwrap();
    // A receive with no memory at all, for the send with immediate data.
    b.post_recv_owned(RecvRequest::empty().tag(3)).unwrap();
    a.post_send_owned(SendRequest::send(b"").tag(2)).unwrap();
    a.post_send_owned(SendRequest::send(b"").with_imm(0x0bad_cafe).tag(4))
        .unwrap();
    let sent = reap(&mut cq_a, 2);
    assert_done(&sent[0], 2, WcOpcode::Send);
    assert_done(&sent[1], 4, WcOpcode::Send);
    let mut received = reap(&mut cq_b, 2);
    assert_done(&received[0], 1, WcOpcode::Recv);
    assert_eq!(received[0].wc().byte_len(), 0);
    assert_eq!(received[0].wc().imm_data(), None);
    assert_done(&received[1], 3, WcOpcode::Recv);
    assert_eq!(received[1].wc().byte_len(), 0);
    assert_eq!(received[1].wc().imm_data(), Some(0x0bad_cafe));
    assert!(
        received[1].buf().is_none(),
        "an empty receive has no buffer"
    );
    let mut dst = received[0].take_buf().unwrap();
    assert_eq!(dst.len(), 0, "the length is what arrived");
    dst.set_len(64).unwrap();
    assert!(
        dst.iter().all(|&x| x == GUARD),
        "a zero-length SEND wrote into the receive buffer"
    );
    assert_eq!(a.query_state().unwrap(), QpStateKind::Rts);
    assert_eq!(b.query_state().unwrap(), QpStateKind::Rts);
    assert_eq!((a.owned_in_flight(), b.owned_in_flight()), (0, 0));
}

/// One SEND of `len` bytes from a pool buffer of `a` into a range of `b`'s region, every byte
/// and the guard after it checked.
fn send_many_packets(len: usize, seed: u32) {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b, mut a, mut b) =
        f.rc_pair_own_cqs(AccessFlags::empty(), RcRtsAttr::new(0));
    let pool = BufferPool::new(&f.pd, 1, len).unwrap();
    let mut src = pool.take().unwrap();
    src.fill_from(&message(len, seed)).unwrap();
    // The receive lands in a range of a shared region, read back with atomic copies.
    let mut dst = f.pd.register(len + TAIL, LOCAL).unwrap().into_shared();
    dst.write_at(0, &vec![GUARD; len + TAIL]).unwrap();
    let dst = Arc::new(dst);
    b.post_recv_owned(RecvRequest::new(RegionRange::new(&dst, ..).unwrap()).tag(1))
        .unwrap();
    a.post_send_owned(SendRequest::send(src).tag(2)).unwrap();
    let mut sent = reap(&mut cq_a, 1);
    assert_done(&sent[0], 2, WcOpcode::Send);
    assert_eq!(sent[0].take_buf().unwrap().len(), len);
    let received = reap(&mut cq_b, 1);
    assert_done(&received[0], 1, WcOpcode::Recv);
    assert_eq!(received[0].wc().byte_len() as usize, len);
    assert_eq!(
        Arc::strong_count(&dst),
        2,
        "the completion holds the region until it is dropped"
    );
    drop(received);
    assert_eq!(Arc::strong_count(&dst), 1);
    let mut got = vec![0; len + TAIL];
    dst.read_at(0, &mut got).unwrap();
    assert_message(&got[..len], seed);
    assert!(
        got[len..].iter().all(|&x| x == GUARD),
        "written past the message"
    );
}

#[test]
fn volume_send_64_kib() {
    send_many_packets(64 << 10, 1);
}

#[test]
fn volume_send_1_mib() {
    send_many_packets(1 << 20, 2);
}

#[test]
fn volume_rdma_write_and_read_1_mib() {
    let Some(f) = fixture() else { return };
    let len = 1 << 20;
    let rights = LOCAL | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let (mut cq_a, _cq_b, mut a, _b) = f.rc_pair_own_cqs(
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        RcRtsAttr::new(0),
    );
    let mut src = f.pd.register(len, LOCAL).unwrap();
    src.as_mut_slice()
        .unwrap()
        .copy_from_slice(&message(len, 3));
    let src = Arc::new(src);
    // The target is remotely writable: written and read by copying.
    let mut target = f.pd.register(len + 2 * TAIL, rights).unwrap();
    target.write_at(0, &vec![GUARD; len + 2 * TAIL]).unwrap();
    let remote = target.remote(TAIL..TAIL + len).unwrap();
    a.post_send_owned(SendRequest::write(RegionRange::new(&src, ..).unwrap(), remote).tag(1))
        .unwrap();
    assert_done(&reap(&mut cq_a, 1)[0], 1, WcOpcode::RdmaWrite);
    let mut got = vec![0; len + 2 * TAIL];
    target.read_at(0, &mut got).unwrap();
    assert!(
        got[..TAIL].iter().all(|&x| x == GUARD),
        "written before the target"
    );
    assert_message(&got[TAIL..TAIL + len], 3);
    assert!(
        got[TAIL + len..].iter().all(|&x| x == GUARD),
        "written past the target"
    );

    // Read it back into a range of a fresh (shared) region.
    let mut sink = f.pd.register(len + TAIL, LOCAL).unwrap().into_shared();
    sink.write_at(0, &vec![GUARD; len + TAIL]).unwrap();
    let sink = Arc::new(sink);
    a.post_send_owned(SendRequest::read(RegionRange::new(&sink, ..len).unwrap(), remote).tag(2))
        .unwrap();
    let done = reap(&mut cq_a, 1);
    assert_done(&done[0], 2, WcOpcode::RdmaRead);
    assert_eq!(done[0].wc().byte_len() as usize, len);
    let mut got = vec![0; len + TAIL];
    sink.read_at(0, &mut got).unwrap();
    assert_message(&got[..len], 3);
    assert!(got[len..].iter().all(|&x| x == GUARD), "read past the sink");
    assert_eq!(a.owned_in_flight(), 0);
}

#[test]
fn volume_256_queue_pairs_at_once() {
    const N: usize = 256;
    const LEN: usize = 64;
    let Some(f) = fixture() else { return };
    let attr = f.context.query_device().unwrap();
    // 256 pairs are 512 queue pairs; rxe allows 65536 (RXE_MAX_QP).
    assert!(
        attr.max_qp as usize >= 2 * N,
        "the device allows {} queue pairs, fewer than {}",
        attr.max_qp,
        2 * N
    );
    // One CQ for every sender and one for every receiver: `poll_each` routes each completion
    // to its queue pair's table among 256.
    let mut send_cq = f.cq(N as u32);
    let mut recv_cq = f.cq(N as u32);
    assert!(send_cq.capacity() as usize >= N && recv_cq.capacity() as usize >= N);
    let pairs: Vec<(QueuePair<Rc, Rts>, QueuePair<Rc, Rts>)> = (0..N)
        .map(|_| {
            f.rc_pair(
                f.pd.qp_builder(&send_cq, &send_cq)
                    .max_send_wr(1)
                    .max_recv_wr(1),
                f.pd.qp_builder(&recv_cq, &recv_cq)
                    .max_send_wr(1)
                    .max_recv_wr(1),
                AccessFlags::empty(),
            )
        })
        .collect();
    let tx = BufferPool::new(&f.pd, N, LEN).unwrap();
    let rx = BufferPool::new(&f.pd, N, LEN).unwrap();
    let mut pairs = pairs;
    for (i, (a, b)) in pairs.iter_mut().enumerate() {
        b.post_recv_buf(rx.take().unwrap(), i as u64).unwrap();
        let mut buf = tx.take().unwrap();
        buf.fill_from(&message(LEN, 1000 + i as u32)).unwrap();
        a.post_send_owned(SendRequest::send(buf).tag((N + i) as u64))
            .unwrap();
    }
    assert_eq!((tx.available(), rx.available()), (0, 0));
    let sent = reap(&mut send_cq, N);
    let received = reap(&mut recv_cq, N);
    let mut seen_send = vec![false; N];
    for c in &sent {
        let i = (c.tag().unwrap_or(0) as usize).wrapping_sub(N);
        assert!(i < N, "{c:?}");
        assert_done(c, (N + i) as u64, WcOpcode::Send);
        assert!(
            !std::mem::replace(&mut seen_send[i], true),
            "two completions for send {i}"
        );
        assert_eq!(c.wc().qp_num(), pairs[i].0.qp_num(), "{c:?}");
    }
    drop(sent);
    assert_eq!(tx.available(), N, "every send buffer came back");
    let mut seen_recv = vec![false; N];
    for mut c in received {
        let i = c.tag().unwrap_or(u64::MAX) as usize;
        assert!(i < N, "{c:?}");
        assert_done(&c, i as u64, WcOpcode::Recv);
        assert!(
            !std::mem::replace(&mut seen_recv[i], true),
            "two completions for receive {i}"
        );
        assert_eq!(c.wc().qp_num(), pairs[i].1.qp_num(), "{c:?}");
        let buf = c.take_buf().unwrap();
        assert_eq!(buf.len(), LEN, "{c:?}");
        assert_message(&buf, 1000 + i as u32);
    }
    assert_eq!(rx.available(), N, "every receive buffer came back");
    assert_no_completion_each(&mut send_cq);
    assert_no_completion_each(&mut recv_cq);
    for (a, b) in &pairs {
        assert_eq!(a.query_state().unwrap(), QpStateKind::Rts);
        assert_eq!(b.query_state().unwrap(), QpStateKind::Rts);
        assert_eq!((a.owned_in_flight(), b.owned_in_flight()), (0, 0));
    }
}
