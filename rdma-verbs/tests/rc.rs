//! Reliable-connection data path on the device: every operation, checked by data and completion.

use rdma_test_support::verbs::*;
use rdma_verbs::ah::StaticRate;
use rdma_verbs::{ah::*, async_event::*, cq::*, device::*, mr::*, qp::*, wr::*, *};

const LOCAL: AccessFlags = AccessFlags::LOCAL_WRITE;

#[test]
fn send_and_receive() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let mut src = f.pd.register(4096, LOCAL).unwrap();
    let dst = f.pd.register(4096, LOCAL).unwrap();
    let data = pattern(1000, 7);
    src.as_mut_slice().unwrap()[..1000].copy_from_slice(&data);

    // SAFETY: the buffers live until the completions are polled below and are not touched.
    unsafe {
        b.post_recv_one(&RecvRequest::new(dst.slice(..).unwrap()).tag(11))
            .unwrap();
        a.post_send_one(&SendRequest::send(src.slice(..1000).unwrap()).tag(22))
            .unwrap();
    }
    let sent = wait_for(&mut cq_a, 1);
    assert_ok(&sent[0], 22, WcOpcode::Send);
    let received = wait_for(&mut cq_b, 1);
    assert_ok(&received[0], 11, WcOpcode::Recv);
    assert_eq!(received[0].byte_len(), 1000);
    assert_eq!(received[0].qp_num(), b.qp_num());
    assert_eq!(received[0].imm_data(), None);
    assert_eq!(&dst.as_slice().unwrap()[..1000], &data[..]);
    assert!(dst.as_slice().unwrap()[1000..].iter().all(|&x| x == 0));
}

#[test]
fn send_with_immediate_and_inline() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a).max_inline_data(64),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    assert!(a.caps().max_inline_data >= 64, "{:?}", a.caps());
    let dst = f.pd.register(256, LOCAL).unwrap();
    // Inline data need not be registered, and may be dropped right after the post.
    let message = b"inline bytes, never registered".to_vec();
    // SAFETY: `dst` lives until its completion is polled; inline data is copied by the post.
    unsafe {
        b.post_recv_one(&RecvRequest::new(dst.slice(..).unwrap()).tag(1))
            .unwrap();
        a.post_send_one(
            &SendRequest::send(Payload::Inline(&message))
                .tag(2)
                .with_imm(0xdead_beef),
        )
        .unwrap();
    }
    drop(message);
    assert_ok(&wait_for(&mut cq_a, 1)[0], 2, WcOpcode::Send);
    let wc = wait_for(&mut cq_b, 1)[0];
    assert_ok(&wc, 1, WcOpcode::Recv);
    assert_eq!(wc.imm_data(), Some(0xdead_beef));
    assert!(wc.flags().contains(WcFlags::WITH_IMM));
    assert_eq!(
        &dst.as_slice().unwrap()[..30],
        b"inline bytes, never registered"
    );
}

#[test]
fn rdma_write_and_write_with_immediate() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let remote_rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::REMOTE_WRITE,
    );
    let mut src = f.pd.register(8192, LOCAL).unwrap();
    let target = f.pd.register(8192, remote_rights).unwrap();
    // A remotely writable region hands out no references.
    assert!(matches!(target.as_slice(), Err(Error::RemotelyWritable)));
    let data = pattern(8192, 3);
    src.as_mut_slice().unwrap().copy_from_slice(&data);
    let remote = target.remote(..).unwrap();

    // SAFETY: buffers outlive the polled completions.
    unsafe {
        a.post_send_one(
            &SendRequest::write(
                src.slice(..4096).unwrap(),
                remote.slice(4096, 4096).unwrap(),
            )
            .tag(1),
        )
        .unwrap();
    }
    assert_ok(&wait_for(&mut cq_a, 1)[0], 1, WcOpcode::RdmaWrite);
    let mut got = vec![0; 8192];
    target.read_at(0, &mut got).unwrap();
    assert!(
        got[..4096].iter().all(|&x| x == 0),
        "write landed at the wrong place"
    );
    assert_eq!(&got[4096..], &data[..4096]);
    // A plain write consumes no receive and makes no completion at the target: the first
    // completion there must be the write with immediate's, below.
    assert_cq_empty(&mut cq_b);

    // Write with immediate: consumes a receive (no buffer needed) and reports the immediate.
    // SAFETY: as above.
    unsafe {
        b.post_recv_one(&RecvRequest::empty().tag(5)).unwrap();
        a.post_send_one(
            &SendRequest::write(
                src.slice(4096..4196).unwrap(),
                remote.slice(0, 100).unwrap(),
            )
            .tag(2)
            .with_imm(42),
        )
        .unwrap();
    }
    assert_ok(&wait_for(&mut cq_a, 1)[0], 2, WcOpcode::RdmaWrite);
    let wc = wait_for(&mut cq_b, 1)[0];
    assert_ok(&wc, 5, WcOpcode::RecvRdmaWithImm);
    assert_eq!(wc.imm_data(), Some(42));
    assert_eq!(wc.byte_len(), 100);
    target.read_at(0, &mut got[..100]).unwrap();
    assert_eq!(&got[..100], &data[4096..4196]);
}

#[test]
fn rdma_read() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, cq_b) = (f.cq(16), f.cq(16));
    let (mut a, _b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::REMOTE_READ,
    );
    let mut source =
        f.pd.register(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
            .unwrap();
    let data = pattern(4096, 99);
    // Remote read only: the peer cannot change it, so references are fine.
    source.as_mut_slice().unwrap().copy_from_slice(&data);
    let sink = f.pd.register(4096, LOCAL).unwrap();
    // SAFETY: buffers outlive the polled completion.
    unsafe {
        a.post_send_one(
            &SendRequest::read(
                sink.slice(..2048).unwrap(),
                source.remote(1024..3072).unwrap(),
            )
            .tag(3),
        )
        .unwrap();
    }
    let wc = wait_for(&mut cq_a, 1)[0];
    assert_ok(&wc, 3, WcOpcode::RdmaRead);
    assert_eq!(wc.byte_len(), 2048);
    assert_eq!(&sink.as_slice().unwrap()[..2048], &data[1024..3072]);
}

#[test]
fn atomics_return_the_old_value() {
    let Some(f) = fixture() else { return };
    let attr = f.context.query_device().unwrap();
    assert_ne!(
        attr.atomic_cap,
        AtomicCap::None,
        "the device reports no atomics"
    );
    let (mut cq_a, cq_b) = (f.cq(16), f.cq(16));
    let (mut a, _b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::REMOTE_ATOMIC,
    );
    let mut word =
        f.pd.register(8, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC)
            .unwrap();
    word.write_at(0, &100u64.to_ne_bytes()).unwrap();
    let old = f.pd.register(8, LOCAL).unwrap();
    let remote = word.remote(..).unwrap();
    let mut op = |request: SendRequest<'_, AtomicOp>, wr_id: u64, opcode: WcOpcode| -> u64 {
        // SAFETY: `old` and `word` outlive the polled completion.
        unsafe { a.post_send_one(&request).unwrap() };
        assert_ok(&wait_for(&mut cq_a, 1)[0], wr_id, opcode);
        old.load_u64(0).unwrap()
    };

    let slice = old.slice(..).unwrap();
    assert_eq!(
        op(
            SendRequest::fetch_add(slice, remote, 5).tag(1),
            1,
            WcOpcode::FetchAdd
        ),
        100
    );
    assert_eq!(word.load_u64(0).unwrap(), 105);
    // A matching compare swaps.
    assert_eq!(
        op(
            SendRequest::compare_swap(slice, remote, 105, 7).tag(2),
            2,
            WcOpcode::CompSwap
        ),
        105
    );
    assert_eq!(word.load_u64(0).unwrap(), 7);
    // A failing compare leaves the word and still returns the old value.
    assert_eq!(
        op(
            SendRequest::compare_swap(slice, remote, 1, 9).tag(3),
            3,
            WcOpcode::CompSwap
        ),
        7
    );
    assert_eq!(word.load_u64(0).unwrap(), 7);
}

#[test]
fn post_list_of_32_completes_in_order() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(64), f.cq(64));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a).max_send_wr(32),
        f.pd.qp_builder(&cq_b, &cq_b).max_recv_wr(32),
        AccessFlags::empty(),
    );
    let mut src = f.pd.register(32 * 64, LOCAL).unwrap();
    for (i, chunk) in src.as_mut_slice().unwrap().chunks_mut(64).enumerate() {
        chunk.fill(i as u8);
    }
    let dst = f.pd.register(32 * 64, LOCAL).unwrap();
    let mut recvs = RecvList::with_capacity(32);
    let mut sends = SendList::with_capacity(32);
    for i in 0..32usize {
        recvs
            .push(RecvRequest::new(dst.slice(i * 64..(i + 1) * 64).unwrap()).tag(i as u64))
            .unwrap();
        sends
            .push(SendRequest::send(src.slice(i * 64..(i + 1) * 64).unwrap()).tag(100 + i as u64))
            .unwrap();
    }
    assert!(
        sends.push(SendRequest::send(Payload::None)).is_err(),
        "the list is full"
    );
    // SAFETY: buffers outlive the polled completions.
    unsafe {
        b.post_recv(&mut recvs).unwrap();
        a.post_send(&mut sends).unwrap();
    }
    let sent = wait_for(&mut cq_a, 32);
    // `poll_for` gathers the 32 across as many polls as it takes; room for more, but it
    // stops at 32.
    let mut room = [WorkCompletion::default(); 40];
    let received = cq_b.poll_for(&mut room, 32, WAIT).unwrap();
    assert_eq!(received.len(), 32, "{received:?}");
    let received = received.to_vec();
    // Nothing more comes: a bounded wait returns empty-handed.
    let mut more = [WorkCompletion::default(); 1];
    assert!(cq_b.poll_for(&mut more, 1, QUIET).unwrap().is_empty());
    for i in 0..32 {
        assert_ok(&sent[i], 100 + i as u64, WcOpcode::Send);
        assert_ok(&received[i], i as u64, WcOpcode::Recv);
        assert_eq!(received[i].byte_len(), 64);
    }
    for (i, chunk) in dst.as_slice().unwrap().chunks(64).enumerate() {
        assert!(chunk.iter().all(|&x| x == i as u8), "message {i} corrupted");
    }
    // The same storage serves the next batch, borrowing again.
    let mut sends = sends.reuse::<SendRequest<'_>>();
    assert!(sends.is_empty());
    assert_eq!(sends.capacity(), 32);
    sends
        .push(SendRequest::send(src.slice(..1).unwrap()).tag(1))
        .unwrap();
    assert_eq!(sends.len(), 1);
}

#[test]
fn unsignaled_sends_with_a_periodic_signaled_one() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(64), f.cq(64));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a).max_send_wr(16),
        f.pd.qp_builder(&cq_b, &cq_b).max_recv_wr(16),
        AccessFlags::empty(),
    );
    let src = f.pd.register(64, LOCAL).unwrap();
    let dst = f.pd.register(16 * 64, LOCAL).unwrap();
    let mut sends = SendList::with_capacity(16);
    let mut recvs = RecvList::with_capacity(16);
    for i in 0..16u64 {
        let request = SendRequest::send(src.slice(..).unwrap()).tag(i);
        sends
            .push(if i % 4 == 3 {
                request
            } else {
                request.unsignaled()
            })
            .unwrap();
        let at = i as usize * 64;
        recvs
            .push(RecvRequest::new(dst.slice(at..at + 64).unwrap()).tag(i))
            .unwrap();
    }
    // SAFETY: buffers outlive the polled completions.
    unsafe {
        b.post_recv(&mut recvs).unwrap();
        a.post_send(&mut sends).unwrap();
    }
    assert_eq!(wait_for(&mut cq_b, 16).len(), 16);
    let signaled: Vec<u64> = wait_for(&mut cq_a, 4).iter().map(|wc| wc.wr_id()).collect();
    assert_eq!(signaled, vec![3, 7, 11, 15]);
    // A send queue completes in order: a completion for an unsignaled request would have come
    // before 15's.
    assert_cq_empty(&mut cq_a);
}

#[test]
fn wrong_rkey_is_a_remote_access_error() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, cq_b) = (f.cq(16), f.cq(16));
    let (mut a, b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::REMOTE_WRITE,
    );
    let src = f.pd.register(64, LOCAL).unwrap();
    let target =
        f.pd.register(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
    let mut bad = target.remote(..).unwrap();
    bad.rkey ^= 0x5a5a_5a00;
    // SAFETY: buffers outlive the polled completion.
    unsafe {
        a.post_send_one(&SendRequest::write(src.slice(..).unwrap(), bad).tag(9))
            .unwrap();
    }
    let wc = wait_for(&mut cq_a, 1)[0];
    assert_eq!(wc.wr_id(), 9);
    assert_eq!(wc.status(), WcStatus::RemAccessErr, "{wc:?}");
    // The failure moved the requester to the error state; the type still says RTS, the device
    // says ERR, and a new post is flushed or refused, never undefined.
    assert_eq!(a.query_state().unwrap(), QpStateKind::Error);
    // SAFETY: as above.
    let posted = unsafe { a.post_send_one(&SendRequest::send(src.slice(..).unwrap()).tag(10)) };
    if posted.is_ok() {
        let wc = wait_for(&mut cq_a, 1)[0];
        assert_eq!(wc.status(), WcStatus::WrFlushErr, "{wc:?}");
    } else {
        assert!(matches!(posted, Err(Error::Post { .. })), "{posted:?}");
    }
    drop(b);
}

#[test]
fn error_state_flushes_posted_receives() {
    let Some(f) = fixture() else { return };
    let (cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (_a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let dst = f.pd.register(4 * 64, LOCAL).unwrap();
    for i in 0..4usize {
        // SAFETY: `dst` outlives the flush completions polled below.
        unsafe {
            b.post_recv_one(
                &RecvRequest::new(dst.slice(i * 64..(i + 1) * 64).unwrap()).tag(i as u64),
            )
            .unwrap();
        }
    }
    let b = b.into_error().expect("RTS -> ERR");
    let flushed = wait_for(&mut cq_b, 4);
    for (i, wc) in flushed.iter().enumerate() {
        assert_eq!(wc.wr_id(), i as u64);
        assert_eq!(wc.status(), WcStatus::WrFlushErr, "{wc:?}");
    }
    // ERR -> RESET -> INIT works, and the queue pair is usable again.
    let b = b.into_reset().expect("ERR -> RESET");
    assert_eq!(b.query_state().unwrap(), QpStateKind::Reset);
    let b = b
        .into_init(&ConnectedInitAttr::new(f.device.port))
        .expect("RESET -> INIT");
    assert_eq!(b.query_state().unwrap(), QpStateKind::Init);
}

#[test]
fn failed_transition_returns_the_queue_pair() {
    let Some(f) = fixture() else { return };
    let cq = f.cq(4);
    let qp = f.pd.qp_builder::<Rc>(&cq, &cq).build().unwrap();
    // Port 0 does not exist.
    let error = qp.into_init(&ConnectedInitAttr::new(0)).unwrap_err();
    assert!(
        matches!(
            error.error(),
            Error::ModifyQp {
                from: QpStateKind::Reset,
                to: QpStateKind::Init,
                ..
            }
        ),
        "{error:?}"
    );
    let (qp, _) = error.into_parts();
    assert_eq!(qp.query_state().unwrap(), QpStateKind::Reset);
    let qp = qp
        .into_init(&ConnectedInitAttr::new(f.device.port))
        .unwrap();
    // A GID index the port does not have is refused at RTR, again handing the QP back.
    let mut av = f.av();
    let mut route = GlobalRoute::new(Gid(f.device.gid), 250);
    route.hop_limit = 1;
    av.grh = Some(route);
    let (qp, error) = qp
        .into_rtr(&RcRtrAttr::new(av, qp_num_of_nothing(), 0))
        .unwrap_err()
        .into_parts();
    assert!(error.errno().is_some(), "{error}");
    assert_eq!(qp.query_state().unwrap(), QpStateKind::Init);
}

fn qp_num_of_nothing() -> u32 {
    0xfffff
}

#[test]
fn full_send_queue_is_a_typed_error() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, cq_b) = (f.cq(64), f.cq(64));
    // The receiver never posts a receive: the first send waits in receiver-not-ready retries
    // (RNR retry 7 is infinite), so the sends behind it fill the queue.
    let (mut a, _b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a).max_send_wr(4),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let depth = a.caps().max_send_wr as usize;
    let src = f.pd.register(64, LOCAL).unwrap();
    let mut posted = 0;
    let mut outcome = Ok(());
    for i in 0..depth * 4 {
        // SAFETY: `src` outlives the queue pair's flush below.
        outcome =
            unsafe { a.post_send_one(&SendRequest::send(src.slice(..).unwrap()).tag(i as u64)) };
        if outcome.is_err() {
            break;
        }
        posted += 1;
    }
    assert!(
        matches!(
            outcome,
            Err(Error::QueueFull {
                verb: "ibv_post_send",
                index: 0
            })
        ),
        "after {posted} posts: {outcome:?}"
    );
    // Providers may round their rings up (rxe grants 4 but its ring holds 7).
    assert!(
        posted >= depth,
        "the queue took {posted}, less than its capacity {depth}"
    );
    let _a = a.into_error().unwrap();
    let flushed = wait_for(&mut cq_a, posted);
    assert!(
        flushed
            .iter()
            .all(|wc| wc.status() == WcStatus::WrFlushErr || wc.is_success())
    );
}

#[test]
fn operations_the_transport_lacks_are_refused_before_posting() {
    let Some(f) = fixture() else { return };
    let (cq_a, cq_b) = (f.cq(8), f.cq(8));
    let (mut a, _b) = f.uc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let mr = f.pd.register(64, LOCAL).unwrap();
    let remote = RemoteMemory {
        addr: 0,
        len: 64,
        rkey: 1,
    };
    // SAFETY: nothing is posted (refused before the post call).
    let read = unsafe { a.post_send_one(&SendRequest::read(mr.slice(..).unwrap(), remote).tag(1)) };
    assert!(matches!(read, Err(Error::InvalidArgument(_))), "{read:?}");
    // Bounds are checked when slicing.
    assert!(mr.slice(..65).is_err());
    assert!(mr.slice(60..70).is_err());
}

#[test]
fn receive_into_a_scatter_list() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b).max_recv_sge(2),
        AccessFlags::empty(),
    );
    let mut src = f.pd.register(100, LOCAL).unwrap();
    let data = pattern(100, 42);
    src.as_mut_slice().unwrap().copy_from_slice(&data);
    // The message lands in the first 30 bytes of one region, then in another region.
    let head = f.pd.register(30, LOCAL).unwrap();
    let tail = f.pd.register(4096, LOCAL).unwrap();
    let list = [
        Sge::from(head.slice(..).unwrap()),
        Sge::from(tail.slice(..).unwrap()),
    ];
    // SAFETY: the regions outlive the polled completions and are not touched meanwhile.
    unsafe {
        b.post_recv_one(&RecvRequest::new(&list[..]).tag(1))
            .unwrap();
        a.post_send_one(&SendRequest::send(src.slice(..).unwrap()).tag(2))
            .unwrap();
    }
    assert_ok(&wait_for(&mut cq_a, 1)[0], 2, WcOpcode::Send);
    let wc = wait_for(&mut cq_b, 1)[0];
    assert_ok(&wc, 1, WcOpcode::Recv);
    assert_eq!(wc.byte_len(), 100);
    assert_eq!(head.as_slice().unwrap(), &data[..30]);
    assert_eq!(&tail.as_slice().unwrap()[..70], &data[30..]);
}

#[test]
fn routable_gid_and_device_listing() {
    let Some(f) = fixture() else { return };
    let list = rdma_verbs::devices().unwrap();
    let device = list
        .find(&f.device.name)
        .expect("the test device is listed");
    assert_ne!(device.guid(), 0);
    assert_eq!(device.node_type(), NodeType::Ca);
    let entry = f.context.routable_gid(f.device.port).unwrap();
    // The test conventions pick the same entry: IPv4-mapped, RoCE v2 first.
    assert_eq!(entry.gid, Gid(f.device.gid));
    assert_eq!(entry.index, f.device.gid_index);
    if f.device.is_ethernet {
        assert_eq!(entry.gid_type, GidType::RoceV2);
        assert!(entry.gid.ipv4().is_some());
        assert!(entry.netdev().is_some(), "a RoCE GID names its netdev");
    }
    let table = f.context.gid_table().unwrap();
    assert!(table.contains(&entry));
    assert!(f.context.query_port(0).is_err() || f.context.query_port(99).is_err());
}

/// The P_Key table (`ibv_query_pkey`, `ibv_get_pkey_index`): the default P_Key at index 0,
/// which is what a queue pair's `pkey_index` 0 names; past the table, a P_Key it lacks and a
/// port the device lacks are `ENOENT` (libibverbs reads sysfs). And fork support: the test
/// kernel copies registered pages on fork, so the status is `Unneeded`, and `fork_init` after a
/// registration is refused as too late (`EINVAL`).
#[test]
fn the_pkey_table_and_fork_support() {
    let Some(f) = fixture() else { return };
    let port = f.device.port;
    let len = f.context.query_port(port).unwrap().pkey_tbl_len;
    assert!(len >= 1);
    assert_eq!(f.context.query_pkey(port, 0).unwrap(), 0xffff);
    assert_eq!(f.context.pkey_index(port, 0xffff).unwrap(), 0);
    let enoent = |result: Result<u16>, want: &str| match result {
        Err(Error::Verb { verb, errno }) => assert_eq!((verb, errno), (want, Errno::NOENT)),
        other => panic!("{want}: {other:?}"),
    };
    enoent(f.context.query_pkey(port, len), "ibv_query_pkey");
    enoent(f.context.pkey_index(port, 0x1234), "ibv_get_pkey_index");
    enoent(f.context.query_pkey(port + 1, 0), "ibv_query_pkey");
    assert_eq!(fork_status(), ForkStatus::Unneeded);
    // Once memory is registered (here, and in any test before this one) it is too late:
    // libibverbs refuses with EINVAL, even where the kernel makes it unneeded.
    let _region = f.pd.register(4096, AccessFlags::LOCAL_WRITE).unwrap();
    // SAFETY: the harness (the README's test command) runs this binary's tests one at a time
    // (`--test-threads=1`), so no other thread uses libibverbs during the call.
    match unsafe { fork_init() } {
        Err(Error::Verb { verb, errno }) => {
            assert_eq!((verb, errno), ("ibv_fork_init", Errno::INVAL));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(fork_status(), ForkStatus::Unneeded);
}

/// The device's kernel index is the one iproute2's `rdma dev` lists it under; its node type
/// and port state have libibverbs' names; static rates convert by libibverbs' tables.
#[test]
fn device_index_names_and_rates() {
    let Some(f) = fixture() else { return };
    let list = devices().unwrap();
    let device = list
        .find(&f.device.name)
        .expect("the test device is listed");
    let index = device
        .index()
        .expect("a kernel index (Linux 5.4 and later)");
    let listed = std::process::Command::new("rdma")
        .args(["dev", "show", &f.device.name])
        .output()
        .expect("iproute2's rdma tool");
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.starts_with(&format!("{index}: {}:", f.device.name)),
        "index {index}, rdma dev show: {listed}"
    );
    assert_eq!(device.node_type(), NodeType::Ca);
    assert_eq!(device.node_type().name(), "InfiniBand channel adapter");
    let port = f.context.query_port(f.device.port).unwrap();
    assert_eq!(
        (port.state, port.state.name()),
        (PortState::Active, "active")
    );
    assert_eq!(PortState::Unknown(77).name(), "unknown");

    // 25 Gb/s is listed by its signalling rate and is no whole multiple of 2.5 Gb/s.
    let rate = StaticRate::from_mbps(25_781).expect("a listed rate");
    assert_eq!((rate.mbps(), rate.multiplier()), (Some(25_781), None));
    let rate = StaticRate::from_multiplier(4).expect("4 x 2.5 Gb/s");
    assert_eq!((rate.mbps(), rate.multiplier()), (Some(10_000), Some(4)));
    assert_eq!(StaticRate::from_mbps(25_000), None);
    assert_eq!(StaticRate::from_multiplier(3), None);
    assert_eq!(StaticRate::from_mbps(u32::MAX), None);
    assert_eq!(
        (StaticRate::PORT.mbps(), StaticRate::PORT.multiplier()),
        (None, None)
    );
    assert_eq!(
        AsyncEvent::PortActive { port: 1 }.description(),
        "port active"
    );
}

/// Connecting in one call: each side's record (with the memory it lets the peer write) goes
/// through its byte form, `connect` takes each queue pair from RESET to RTS, and the peer
/// writes to the advertised memory and sends a message longer than the path MTU; a record of
/// another queue pair and a port the device lacks are refused with the exact error.
#[test]
fn queue_pairs_connect_from_records_exchanged_as_bytes() {
    let Some(f) = fixture() else { return };
    let (port, gid_index) = (f.device.port, f.device.gid_index as u8);
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let a = f.pd.qp_builder::<Rc>(&cq_a, &cq_a).build().unwrap();
    let b = f.pd.qp_builder::<Rc>(&cq_b, &cq_b).build().unwrap();
    let target =
        f.pd.register(8192, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
    let a_me = a
        .record(port, gid_index)
        .unwrap()
        .with_memory(target.remote(..).unwrap());
    let b_me = b.record(port, gid_index).unwrap();
    let active_mtu = f.context.query_port(port).unwrap().active_mtu;
    assert_eq!(
        (a_me.qp_num, a_me.lid, a_me.gid, a_me.mtu, a_me.port),
        (
            a.qp_num(),
            f.device.lid,
            Gid(f.device.gid),
            active_mtu,
            port
        )
    );
    assert!(a_me.psn <= 0xff_ffff && b_me.psn <= 0xff_ffff);
    // What each side reads from the wire.
    let a_peer = ConnectionRecord::from_bytes(&b_me.to_bytes()).unwrap();
    let b_peer = ConnectionRecord::from_bytes(&a_me.to_bytes()).unwrap();
    assert_eq!((a_peer, b_peer), (b_me, a_me));

    // A record of another queue pair: refused before any transition.
    let stray = f.pd.qp_builder::<Rc>(&cq_a, &cq_a).build().unwrap();
    match stray.connect(&a_me, &a_peer, AccessFlags::empty()) {
        Err(Error::InvalidArgument(message)) => assert!(
            message.starts_with(&format!("the record is of queue pair {:#x}", a.qp_num())),
            "{message}"
        ),
        other => panic!("{other:?}"),
    }
    // A port the device lacks: ibv_query_port's EINVAL.
    match b.record(port + 1, gid_index) {
        Err(Error::Verb { verb, errno }) => {
            assert_eq!((verb, errno), ("ibv_query_port", Errno::INVAL));
        }
        other => panic!("{other:?}"),
    }

    let mut a = a
        .connect(&a_me, &a_peer, AccessFlags::REMOTE_WRITE)
        .unwrap();
    let mut b = b.connect(&b_me, &b_peer, AccessFlags::empty()).unwrap();
    assert_eq!(a.query_state().unwrap(), QpStateKind::Rts);
    assert_eq!(b.query_state().unwrap(), QpStateKind::Rts);

    let mut src = f.pd.register(8192, LOCAL).unwrap();
    let data = pattern(8192, 41);
    src.as_mut_slice().unwrap().copy_from_slice(&data);
    let dst = f.pd.register(4096, LOCAL).unwrap();
    let remote = b_peer.memory.expect("a advertised its memory");
    // SAFETY: the buffers live until the completions are polled below and are not touched.
    unsafe {
        a.post_recv_one(&RecvRequest::new(dst.slice(..).unwrap()).tag(5))
            .unwrap();
        b.post_send_one(
            &SendRequest::write(src.slice(..).unwrap(), remote.slice(0, 8192).unwrap()).tag(6),
        )
        .unwrap();
        b.post_send_one(&SendRequest::send(src.slice(..4096).unwrap()).tag(7))
            .unwrap();
    }
    let sent = wait_for(&mut cq_b, 2);
    assert_ok(&sent[0], 6, WcOpcode::RdmaWrite);
    assert_ok(&sent[1], 7, WcOpcode::Send);
    let received = wait_for(&mut cq_a, 1);
    assert_ok(&received[0], 5, WcOpcode::Recv);
    assert_eq!(received[0].byte_len(), 4096);
    assert_eq!(dst.as_slice().unwrap(), &data[..4096]);
    let mut written = vec![0; 8192];
    target.read_at(0, &mut written).unwrap();
    assert_eq!(written, data);
}

/// `ibv_resize_cq`: a queue holding five completions refuses to shrink below them (`EINVAL`,
/// unchanged), grows with them kept in order, and then reports its new capacity.
#[test]
fn a_completion_queue_resizes_and_keeps_its_completions() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(8), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let before = cq_a.capacity();
    assert!(before >= 8);
    let mut src = f.pd.register(64, LOCAL).unwrap();
    src.as_mut_slice().unwrap().copy_from_slice(&pattern(64, 5));
    let dst = f.pd.register(5 * 64, LOCAL).unwrap();
    // SAFETY: the buffers live until the completions are polled below and are not touched.
    unsafe {
        for i in 0..5u64 {
            let at = i as usize * 64;
            b.post_recv_one(&RecvRequest::new(dst.slice(at..at + 64).unwrap()).tag(100 + i))
                .unwrap();
        }
        for i in 0..5u64 {
            a.post_send_one(&SendRequest::send(src.slice(..).unwrap()).tag(i))
                .unwrap();
        }
    }
    // Every receive arrived, so all five sends have completed into `cq_a`.
    let received = wait_for(&mut cq_b, 5);
    assert!(received.iter().all(|wc| wc.is_success()));
    match cq_a.resize(2) {
        Err(Error::Verb { verb, errno }) => {
            assert_eq!((verb, errno), ("ibv_resize_cq", Errno::INVAL));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(cq_a.capacity(), before);
    assert!(matches!(cq_a.resize(0), Err(Error::InvalidArgument(_))));
    cq_a.resize(100).unwrap();
    assert!(cq_a.capacity() >= 100, "{}", cq_a.capacity());
    let sent = wait_for(&mut cq_a, 5);
    for (i, wc) in sent.iter().enumerate() {
        assert_ok(wc, i as u64, WcOpcode::Send);
    }
    assert_cq_empty(&mut cq_a);
}
