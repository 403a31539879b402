//! Unreliable connection on the device: SEND and RDMA WRITE, checked by data and completion,
//! and RDMA READ refused.

use std::time::Duration;

use rdma_test_support::verbs::*;
use rdma_verbs::{cq::*, mr::*, qp::*, wr::*, *};

const LOCAL: AccessFlags = AccessFlags::LOCAL_WRITE;

#[test]
fn uc_send_and_receive() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.uc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    // Two messages, the second longer than the path MTU (1024): UC segments it too.
    let mut src = f.pd.register(4096, LOCAL).unwrap();
    let data = pattern(4096, 17);
    src.as_mut_slice().unwrap().copy_from_slice(&data);
    let dst = f.pd.register(8192, LOCAL).unwrap();
    // SAFETY: the buffers live until the completions are polled below and are not touched.
    unsafe {
        b.post_recv_one(&RecvRequest::new(dst.slice(..4096).unwrap()).tag(1))
            .unwrap();
        b.post_recv_one(&RecvRequest::new(dst.slice(4096..).unwrap()).tag(2))
            .unwrap();
        a.post_send_one(&SendRequest::send(src.slice(..100).unwrap()).tag(10))
            .unwrap();
        a.post_send_one(
            &SendRequest::send(src.slice(..3000).unwrap())
                .tag(11)
                .with_imm(77),
        )
        .unwrap();
    }
    let sent = wait_for(&mut cq_a, 2);
    assert_ok(&sent[0], 10, WcOpcode::Send);
    assert_ok(&sent[1], 11, WcOpcode::Send);
    let received = wait_for(&mut cq_b, 2);
    assert_ok(&received[0], 1, WcOpcode::Recv);
    assert_eq!(received[0].byte_len(), 100);
    assert_eq!(received[0].imm_data(), None);
    assert_ok(&received[1], 2, WcOpcode::Recv);
    assert_eq!(received[1].byte_len(), 3000);
    assert_eq!(received[1].imm_data(), Some(77));
    assert!(received.iter().all(|wc| wc.qp_num() == b.qp_num()));
    let got = dst.as_slice().unwrap();
    assert_eq!(&got[..100], &data[..100]);
    assert!(got[100..4096].iter().all(|&x| x == 0));
    assert_eq!(&got[4096..4096 + 3000], &data[..3000]);
    assert!(got[4096 + 3000..].iter().all(|&x| x == 0));
}

#[test]
fn uc_rdma_write_and_write_with_immediate() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.uc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::REMOTE_WRITE,
    );
    let mut src = f.pd.register(4096, LOCAL).unwrap();
    let data = pattern(4096, 41);
    src.as_mut_slice().unwrap().copy_from_slice(&data);
    let target =
        f.pd.register(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
    let remote = target.remote(..).unwrap();

    // SAFETY: buffers outlive the polled completions.
    unsafe {
        a.post_send_one(
            &SendRequest::write(
                src.slice(..2000).unwrap(),
                remote.slice(1000, 2000).unwrap(),
            )
            .tag(1),
        )
        .unwrap();
    }
    assert_ok(&wait_for(&mut cq_a, 1)[0], 1, WcOpcode::RdmaWrite);
    // UC completes the write when it leaves, not when it lands: wait for the data.
    let mut got = vec![0u8; 4096];
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        target.read_at(0, &mut got).unwrap();
        if got[1000..3000] == data[..2000] || std::time::Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(&got[1000..3000], &data[..2000]);
    assert!(
        got[..1000].iter().all(|&x| x == 0),
        "wrote before the range"
    );
    assert!(got[3000..].iter().all(|&x| x == 0), "wrote past the range");
    // A plain write makes no completion at the target: the first completion there must be
    // the write with immediate's, below.
    assert_cq_empty(&mut cq_b);

    // Write with immediate consumes a receive and reports the immediate and the length.
    // SAFETY: as above.
    unsafe {
        b.post_recv_one(&RecvRequest::empty().tag(7)).unwrap();
        a.post_send_one(
            &SendRequest::write(
                src.slice(2000..2500).unwrap(),
                remote.slice(0, 500).unwrap(),
            )
            .tag(2)
            .with_imm(0x1234),
        )
        .unwrap();
    }
    assert_ok(&wait_for(&mut cq_a, 1)[0], 2, WcOpcode::RdmaWrite);
    let wc = wait_for(&mut cq_b, 1)[0];
    assert_ok(&wc, 7, WcOpcode::RecvRdmaWithImm);
    assert_eq!(wc.imm_data(), Some(0x1234));
    assert_eq!(wc.byte_len(), 500);
    target.read_at(0, &mut got).unwrap();
    assert_eq!(&got[..500], &data[2000..2500]);
    assert!(got[500..1000].iter().all(|&x| x == 0));
    assert_eq!(&got[1000..3000], &data[..2000]);
}

#[test]
fn uc_rdma_read_and_atomics_are_refused() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, cq_b) = (f.cq(16), f.cq(16));
    let (mut a, _b) = f.uc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::REMOTE_READ,
    );
    let sink = f.pd.register(64, LOCAL).unwrap();
    let source =
        f.pd.register(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
            .unwrap();
    let remote = source.remote(..).unwrap();
    // SAFETY: refused before the post call: nothing reaches the device.
    let read =
        unsafe { a.post_send_one(&SendRequest::read(sink.slice(..).unwrap(), remote).tag(1)) };
    assert!(matches!(read, Err(Error::InvalidArgument(_))), "{read:?}");
    // SAFETY: as above.
    let atomic = unsafe {
        a.post_send_one(&SendRequest::fetch_add(sink.slice(..8).unwrap(), remote, 1).tag(2))
    };
    assert!(
        matches!(atomic, Err(Error::InvalidArgument(_))),
        "{atomic:?}"
    );
    // A list holding one read is refused whole.
    let mut list = SendList::with_capacity(2);
    list.push(SendRequest::send(sink.slice(..).unwrap()).tag(3))
        .unwrap();
    list.push(SendRequest::read(sink.slice(..).unwrap(), remote).tag(4))
        .unwrap();
    // SAFETY: as above.
    let listed = unsafe { a.post_send(&mut list) };
    assert!(
        matches!(listed, Err(Error::InvalidArgument(_))),
        "{listed:?}"
    );
    // Nothing was posted: the next request's completion is the first one. (A send queue
    // completes in order; UC drops the SEND at the peer, which has no receive, and completes it
    // here.)
    // SAFETY: `sink` outlives the polled completion.
    unsafe {
        a.post_send_one(&SendRequest::send(sink.slice(..).unwrap()).tag(5))
            .unwrap();
    }
    assert_ok(&wait_for(&mut cq_a, 1)[0], 5, WcOpcode::Send);
    assert_cq_empty(&mut cq_a);
}

/// `connect_loopback`: two UC queue pairs of the device connected in one call, a message
/// longer than the path MTU sent across; both in RTS.
#[test]
fn uc_connect_loopback_connects_two_queue_pairs_in_one_call() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = QueuePair::<Uc, Reset>::connect_loopback(
        f.pd.qp_builder(&cq_a, &cq_a).build().unwrap(),
        f.pd.qp_builder(&cq_b, &cq_b).build().unwrap(),
        f.device.port,
        f.device.gid_index as u8,
        AccessFlags::empty(),
    )
    .unwrap();
    assert_eq!(a.query_state().unwrap(), QpStateKind::Rts);
    assert_eq!(b.query_state().unwrap(), QpStateKind::Rts);
    let mut src = f.pd.register(3000, LOCAL).unwrap();
    let data = pattern(3000, 23);
    src.as_mut_slice().unwrap().copy_from_slice(&data);
    let dst = f.pd.register(4096, LOCAL).unwrap();
    // SAFETY: the buffers live until the completions are polled below and are not touched.
    unsafe {
        b.post_recv_one(&RecvRequest::new(dst.slice(..).unwrap()).tag(1))
            .unwrap();
        a.post_send_one(&SendRequest::send(src.slice(..).unwrap()).tag(2))
            .unwrap();
    }
    assert_ok(&wait_for(&mut cq_a, 1)[0], 2, WcOpcode::Send);
    let wc = wait_for(&mut cq_b, 1)[0];
    assert_ok(&wc, 1, WcOpcode::Recv);
    assert_eq!(wc.byte_len(), 3000);
    assert_eq!(&dst.as_slice().unwrap()[..3000], &data[..]);
}
