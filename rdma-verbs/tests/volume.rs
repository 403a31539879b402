//! Sizes and counts at the edges, on the device: zero-length SENDs, messages of many packets
//! (64 KiB and 1 MiB, every byte checked), and 256 connected queue pairs at once.

mod common;

use common::*;
use rdma_verbs::*;

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
    let mut dst = f.pd.register(64, LOCAL).unwrap();
    dst.as_mut_slice().unwrap().fill(GUARD);
    // SAFETY: `dst` outlives the completions polled below and is not touched meanwhile.
    unsafe {
        b.post_recv_one(&RecvRequest::new(1, dst.slice(..).unwrap()))
            .unwrap();
        b.post_recv_one(&RecvRequest::empty(3)).unwrap();
        a.post_send_one(&SendRequest::send(2, Payload::None).signaled())
            .unwrap();
        // With immediate data, into a receive without a buffer.
        a.post_send_one(
            &SendRequest::send(4, Payload::None)
                .with_imm(0x0bad_cafe)
                .signaled(),
        )
        .unwrap();
    }
    let sent = wait_for(&mut cq_a, 2);
    assert_ok(&sent[0], 2, WcOpcode::Send);
    assert_ok(&sent[1], 4, WcOpcode::Send);
    let received = wait_for(&mut cq_b, 2);
    assert_ok(&received[0], 1, WcOpcode::Recv);
    assert_eq!(received[0].byte_len(), 0);
    assert_eq!(received[0].imm_data(), None);
    assert_ok(&received[1], 3, WcOpcode::Recv);
    assert_eq!(received[1].byte_len(), 0);
    assert_eq!(received[1].imm_data(), Some(0x0bad_cafe));
    assert!(
        dst.as_slice().unwrap().iter().all(|&x| x == GUARD),
        "a zero-length SEND wrote into the receive buffer"
    );
    assert_eq!(a.query_state().unwrap(), QpStateKind::Rts);
    assert_eq!(b.query_state().unwrap(), QpStateKind::Rts);
}

/// One SEND of `len` bytes from `a` to `b`, every byte and the guard after it checked.
fn send_many_packets(len: usize, seed: u32) {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b, mut a, mut b) =
        f.rc_pair_own_cqs(AccessFlags::empty(), RcRtsAttr::new(0));
    let mut src = f.pd.register(len, LOCAL).unwrap();
    src.as_mut_slice()
        .unwrap()
        .copy_from_slice(&message(len, seed));
    let mut dst = f.pd.register(len + TAIL, LOCAL).unwrap();
    dst.as_mut_slice().unwrap().fill(GUARD);
    // SAFETY: the regions outlive the completions polled below and are not touched meanwhile.
    unsafe {
        b.post_recv_one(&RecvRequest::new(1, dst.slice(..).unwrap()))
            .unwrap();
        a.post_send_one(&SendRequest::send(2, src.slice(..).unwrap()).signaled())
            .unwrap();
    }
    assert_ok(&wait_for(&mut cq_a, 1)[0], 2, WcOpcode::Send);
    let wc = wait_for(&mut cq_b, 1)[0];
    assert_ok(&wc, 1, WcOpcode::Recv);
    assert_eq!(wc.byte_len() as usize, len);
    let got = dst.as_slice().unwrap();
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
    // The target is remotely writable: written and read by copying.
    let mut target = f.pd.register(len + 2 * TAIL, rights).unwrap();
    target.write_at(0, &vec![GUARD; len + 2 * TAIL]).unwrap();
    let remote = target.remote(TAIL..TAIL + len).unwrap();
    // SAFETY: the regions outlive the completion polled below.
    unsafe {
        a.post_send_one(&SendRequest::write(1, src.slice(..).unwrap(), remote).signaled())
            .unwrap();
    }
    assert_ok(&wait_for(&mut cq_a, 1)[0], 1, WcOpcode::RdmaWrite);
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

    // Read it back into a fresh region.
    let mut sink = f.pd.register(len + TAIL, LOCAL).unwrap();
    sink.as_mut_slice().unwrap().fill(GUARD);
    // SAFETY: the regions outlive the completion polled below.
    unsafe {
        a.post_send_one(&SendRequest::read(2, sink.slice(..len).unwrap(), remote).signaled())
            .unwrap();
    }
    let wc = wait_for(&mut cq_a, 1)[0];
    assert_ok(&wc, 2, WcOpcode::RdmaRead);
    assert_eq!(wc.byte_len() as usize, len);
    let got = sink.as_slice().unwrap();
    assert_message(&got[..len], 3);
    assert!(got[len..].iter().all(|&x| x == GUARD), "read past the sink");
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
    // One CQ for every sender and one for every receiver: posted with the unsafe calls, and
    // each completion is matched to its queue pair by number.
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
    let mut src = f.pd.register(N * LEN, LOCAL).unwrap();
    for (i, chunk) in src.as_mut_slice().unwrap().chunks_mut(LEN).enumerate() {
        chunk.copy_from_slice(&message(LEN, 1000 + i as u32));
    }
    let dst = f.pd.register(N * LEN, LOCAL).unwrap();
    let mut pairs = pairs;
    for (i, (a, b)) in pairs.iter_mut().enumerate() {
        let at = i * LEN..(i + 1) * LEN;
        // SAFETY: the regions outlive the completions polled below and are not touched
        // meanwhile.
        unsafe {
            b.post_recv_one(&RecvRequest::new(i as u64, dst.slice(at.clone()).unwrap()))
                .unwrap();
            a.post_send_one(&SendRequest::send((N + i) as u64, src.slice(at).unwrap()).signaled())
                .unwrap();
        }
    }
    let sent = wait_for(&mut send_cq, N);
    let received = wait_for(&mut recv_cq, N);
    let mut seen_send = vec![false; N];
    for wc in &sent {
        assert!(wc.is_success(), "{wc:?}");
        assert_eq!(wc.opcode(), WcOpcode::Send, "{wc:?}");
        let i = (wc.wr_id() as usize).wrapping_sub(N);
        assert!(i < N, "{wc:?}");
        assert!(
            !std::mem::replace(&mut seen_send[i], true),
            "two completions for send {i}"
        );
        assert_eq!(wc.qp_num(), pairs[i].0.qp_num(), "{wc:?}");
    }
    let mut seen_recv = vec![false; N];
    for wc in &received {
        assert!(wc.is_success(), "{wc:?}");
        assert_eq!(wc.opcode(), WcOpcode::Recv, "{wc:?}");
        let i = wc.wr_id() as usize;
        assert!(i < N, "{wc:?}");
        assert!(
            !std::mem::replace(&mut seen_recv[i], true),
            "two completions for receive {i}"
        );
        assert_eq!(wc.qp_num(), pairs[i].1.qp_num(), "{wc:?}");
        assert_eq!(wc.byte_len() as usize, LEN, "{wc:?}");
    }
    for (i, chunk) in dst.as_slice().unwrap().chunks(LEN).enumerate() {
        assert_message(chunk, 1000 + i as u32);
    }
    let mut buf = [WorkCompletion::default(); 4];
    assert!(send_cq.poll(&mut buf).unwrap().is_empty());
    assert!(recv_cq.poll(&mut buf).unwrap().is_empty());
    for (a, b) in &pairs {
        assert_eq!(a.query_state().unwrap(), QpStateKind::Rts);
        assert_eq!(b.query_state().unwrap(), QpStateKind::Rts);
    }
}
