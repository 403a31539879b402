//! The extended send path on the device: queue pairs created by `ibv_create_qp_ex` whose sends
//! go through the `ibv_wr_*` builders ([`SendPath`]), checked by data and completions like the
//! classic path in `rc.rs` and `ud.rs`, plus the full queue, the lists that fall back to
//! `ibv_post_send`, and the memory-window operations.
//!
//! Soft-RoCE (rxe) has `create_qp_ex` and the builders, so every extended queue pair here must
//! really be extended there.

use rdma_test_support::verbs::*;
use rdma_verbs::{ah::*, cq::*, device::*, mr::*, mw::*, qp::*, wr::*, *};

const LOCAL: AccessFlags = AccessFlags::LOCAL_WRITE;
const QKEY: u32 = 0x1111_1111;

/// Whether the device is Soft-RoCE (rxe reports vendor ID 0xffffff).
fn is_rxe(f: &Fixture) -> bool {
    f.context
        .query_device()
        .expect("ibv_query_device")
        .vendor_id
        == 0xff_ffff
}

/// An RC pair whose `a` side posts through the extended API and `b` side through the classic
/// one; `a` gets `a_caps` applied to its builder.
fn mixed_rc_pair<'a>(
    f: &'a Fixture,
    cq_a: &'a CompletionQueue,
    cq_b: &'a CompletionQueue,
    a: impl FnOnce(QpBuilder<'a, Rc>) -> QpBuilder<'a, Rc>,
    b: impl FnOnce(QpBuilder<'a, Rc>) -> QpBuilder<'a, Rc>,
    access: AccessFlags,
) -> (QueuePair<Rc, Rts>, QueuePair<Rc, Rts>) {
    let (a, b) = f.rc_pair(
        a(f.pd.qp_builder(cq_a, cq_a).send_path(SendPath::Extended)),
        b(f.pd.qp_builder(cq_b, cq_b)),
        access,
    );
    assert!(a.uses_extended_post(), "the sender is extended");
    assert!(!b.uses_extended_post(), "the receiver is classic");
    (a, b)
}

#[test]
fn extended_path_is_chosen_when_the_queue_pair_is_created() {
    let Some(f) = fixture() else { return };
    let cq = f.cq(16);
    let classic = f.pd.qp_builder::<Rc>(&cq, &cq).build().unwrap();
    assert!(!classic.uses_extended_post(), "classic is the default");
    let explicit = f.pd.qp_builder::<Rc>(&cq, &cq).send_path(SendPath::Classic);
    assert!(!explicit.build().unwrap().uses_extended_post());

    let auto = f.pd.qp_builder::<Rc>(&cq, &cq).send_path(SendPath::Auto);
    let auto = auto.build().unwrap();
    let required =
        f.pd.qp_builder::<Rc>(&cq, &cq)
            .send_path(SendPath::Extended);
    match required.build() {
        Ok(qp) => {
            assert!(qp.uses_extended_post());
            assert!(auto.uses_extended_post(), "Auto takes what Extended gets");
        }
        Err(error) => {
            assert!(!is_rxe(&f), "rxe has the extended API: {error}");
            assert!(!auto.uses_extended_post());
        }
    }
    if is_rxe(&f) {
        // Every transport, including UC, where rxe refuses LOCAL_INV and the queue pair is made
        // without the memory-window operations.
        let uc =
            f.pd.qp_builder::<Uc>(&cq, &cq)
                .send_path(SendPath::Extended);
        assert!(uc.build().unwrap().uses_extended_post());
        let ud =
            f.pd.qp_builder::<Ud>(&cq, &cq)
                .send_path(SendPath::Extended);
        assert!(ud.build().unwrap().uses_extended_post());
    }
    // The capacities are granted as for the classic path.
    let caps =
        f.pd.qp_builder::<Rc>(&cq, &cq)
            .max_send_wr(8)
            .max_inline_data(32);
    let caps = caps.send_path(SendPath::Auto).build().unwrap().caps();
    assert!(
        caps.max_send_wr >= 8 && caps.max_inline_data >= 32,
        "{caps:?}"
    );
}

#[test]
fn extended_send_and_receive() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = mixed_rc_pair(&f, &cq_a, &cq_b, |a| a, |b| b, AccessFlags::empty());
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
    assert_ok(&wait_for(&mut cq_a, 1)[0], 22, WcOpcode::Send);
    let received = wait_for(&mut cq_b, 1)[0];
    assert_ok(&received, 11, WcOpcode::Recv);
    assert_eq!(received.byte_len(), 1000);
    assert_eq!(received.imm_data(), None);
    assert_eq!(&dst.as_slice().unwrap()[..1000], &data[..]);
    assert!(dst.as_slice().unwrap()[1000..].iter().all(|&x| x == 0));

    // With immediate data, and a two-entry scatter/gather list (`ibv_wr_set_sge_list`).
    let (mut a2, mut b2) = mixed_rc_pair(
        &f,
        &cq_a,
        &cq_b,
        |a| a.max_send_sge(2),
        |b| b,
        AccessFlags::empty(),
    );
    let parts = [
        Sge::from(src.slice(..100).unwrap()),
        Sge::from(src.slice(500..600).unwrap()),
    ];
    // SAFETY: as above.
    unsafe {
        b2.post_recv_one(&RecvRequest::new(dst.slice(..).unwrap()).tag(12))
            .unwrap();
        a2.post_send_one(&SendRequest::send(&parts[..]).tag(23).with_imm(0xfeed_f00d))
            .unwrap();
    }
    assert_ok(&wait_for(&mut cq_a, 1)[0], 23, WcOpcode::Send);
    let wc = wait_for(&mut cq_b, 1)[0];
    assert_ok(&wc, 12, WcOpcode::Recv);
    assert_eq!(wc.imm_data(), Some(0xfeed_f00d));
    assert_eq!(wc.byte_len(), 200);
    let got = &dst.as_slice().unwrap()[..200];
    assert_eq!(&got[..100], &data[..100]);
    assert_eq!(&got[100..], &data[500..600]);
    drop((a, b));
}

#[test]
fn extended_inline_send() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = mixed_rc_pair(
        &f,
        &cq_a,
        &cq_b,
        |a| a.max_inline_data(64),
        |b| b,
        AccessFlags::empty(),
    );
    assert!(a.caps().max_inline_data >= 64, "{:?}", a.caps());
    let dst = f.pd.register(256, LOCAL).unwrap();
    // Inline data need not be registered, and may be dropped right after the post.
    let message = b"inline through ibv_wr_set_inline_data".to_vec();
    let len = message.len();
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
    assert_eq!(wc.byte_len() as usize, len);
    assert_eq!(
        &dst.as_slice().unwrap()[..len],
        b"inline through ibv_wr_set_inline_data"
    );

    // An inline gather list (three entries of a region, out of order): the receiver gets the
    // entries' bytes in list order. It goes through `ibv_wr_set_inline_data_list`, except on
    // Soft-RoCE, whose provider sent such lists with length 0 before rdma-core 64 (this check
    // found it): there it takes `ibv_post_send`.
    let mut src = f.pd.register(64, LOCAL).unwrap();
    let data = pattern(64, 5);
    src.as_mut_slice().unwrap().copy_from_slice(&data);
    let entries = [
        Sge::from(src.slice(40..60).unwrap()),
        Sge::from(src.slice(0..7).unwrap()),
        Sge::from(src.slice(20..33).unwrap()),
    ];
    let dst = f.pd.register(256, LOCAL).unwrap();
    // SAFETY: `dst` lives until its completion is polled; inline data is copied by the post.
    unsafe {
        b.post_recv_one(&RecvRequest::new(dst.slice(..).unwrap()).tag(3))
            .unwrap();
        a.post_send_one(
            &SendRequest::send(Payload::List(&entries))
                .tag(4)
                .flags(SendFlags::INLINE),
        )
        .unwrap();
    }
    // The bytes are in the request: overwriting the source now changes nothing received.
    src.as_mut_slice().unwrap().fill(0);
    assert_ok(&wait_for(&mut cq_a, 1)[0], 4, WcOpcode::Send);
    let wc = wait_for(&mut cq_b, 1)[0];
    assert_ok(&wc, 3, WcOpcode::Recv);
    assert_eq!(wc.byte_len(), 40);
    let expected: Vec<u8> = [&data[40..60], &data[0..7], &data[20..33]].concat();
    assert_eq!(&dst.as_slice().unwrap()[..40], &expected[..]);
}

#[test]
fn extended_rdma_write_and_read() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let (mut a, mut b) = mixed_rc_pair(
        &f,
        &cq_a,
        &cq_b,
        |a| a,
        |b| b,
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
    );
    let mut src = f.pd.register(8192, LOCAL).unwrap();
    let target = f.pd.register(8192, rights).unwrap();
    let data = pattern(8192, 3);
    src.as_mut_slice().unwrap().copy_from_slice(&data);
    let remote = target.remote(..).unwrap();

    // RDMA write to the second half of the target.
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
        "write landed elsewhere"
    );
    assert_eq!(&got[4096..], &data[..4096]);
    // No completion at the target: the first one there must be the write with immediate's.
    assert_cq_empty(&mut cq_b);

    // Write with immediate: consumes a receive and reports the immediate.
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
    assert_eq!((wc.imm_data(), wc.byte_len()), (Some(42), 100));
    target.read_at(0, &mut got[..100]).unwrap();
    assert_eq!(&got[..100], &data[4096..4196]);

    // RDMA read of what the writes left there, back into fresh memory.
    let sink = f.pd.register(8192, LOCAL).unwrap();
    // SAFETY: buffers outlive the polled completion; the target is not written meanwhile.
    unsafe {
        a.post_send_one(
            &SendRequest::read(sink.slice(..4196).unwrap(), remote.slice(0, 4196).unwrap()).tag(3),
        )
        .unwrap();
    }
    let wc = wait_for(&mut cq_a, 1)[0];
    assert_ok(&wc, 3, WcOpcode::RdmaRead);
    assert_eq!(wc.byte_len(), 4196);
    let read = &sink.as_slice().unwrap()[..4196];
    assert_eq!(&read[..100], &data[4096..4196]);
    assert!(read[100..4096].iter().all(|&x| x == 0));
    assert_eq!(&read[4096..], &data[..100]);
}

/// RDMA atomic write (`ibv_wr_atomic_write`): 8 bytes land at the remote address, nothing
/// around them changes, and the completion says `AtomicWrite`. Where the device lacks it (rxe
/// before Linux 6.2: the distribution's 6.1) the post is refused exactly and posts nothing;
/// on 6.12 (the full tier's second kernel) rxe must have it. A classic queue pair refuses it
/// everywhere: `ibv_post_send` cannot carry it.
#[test]
fn extended_atomic_write_stores_eight_bytes() {
    let Some(f) = fixture() else { return };
    let supported = f.context.query_device().unwrap().supports_atomic_write();
    if is_rxe(&f) {
        let newer = rdma_test_support::kernel_version() >= Some((6, 2));
        assert_eq!(supported, newer, "rxe has atomic write from Linux 6.2");
    }
    let rights = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    let (mut cq_a, cq_b) = (f.cq(16), f.cq(16));
    let (mut a, _b) = mixed_rc_pair(&f, &cq_a, &cq_b, |a| a, |b| b, rights);
    let target = f.pd.register(64, LOCAL | rights).unwrap();
    let value = 0x1122_3344_5566_7788u64;
    let request = SendRequest::atomic_write(target.remote(8..16).unwrap(), value).tag(7);
    // SAFETY: `target` outlives the polled completion; no local memory is involved.
    let posted = unsafe { a.post_send_one(&request) };
    let mut got = [0u8; 64];
    if supported {
        posted.unwrap();
        assert_ok(&wait_for(&mut cq_a, 1)[0], 7, WcOpcode::AtomicWrite);
        target.read_at(0, &mut got).unwrap();
        let mut expected = [0u8; 64];
        expected[8..16].copy_from_slice(&value.to_ne_bytes());
        assert_eq!(got, expected);
        assert_eq!(target.load_u64(8).unwrap(), value);
    } else {
        assert!(
            matches!(posted, Err(Error::Unsupported("ibv_wr_atomic_write"))),
            "{posted:?}"
        );
        assert_cq_empty(&mut cq_a);
        target.read_at(0, &mut got).unwrap();
        assert_eq!(got, [0u8; 64], "nothing was written");
        assert_eq!(a.query_state().unwrap(), QpStateKind::Rts);
    }

    // A classic queue pair refuses it before posting anything, alone or in a list.
    let (cq_c, cq_d) = (f.cq(4), f.cq(4));
    let (mut c, _d) = f.rc_pair(
        f.pd.qp_builder(&cq_c, &cq_c),
        f.pd.qp_builder(&cq_d, &cq_d),
        rights,
    );
    let request = SendRequest::atomic_write(target.remote(16..24).unwrap(), 1).tag(8);
    // SAFETY: as above.
    let posted = unsafe { c.post_send_one(&request) };
    assert!(
        matches!(posted, Err(Error::Unsupported("ibv_wr_atomic_write"))),
        "{posted:?}"
    );
    let mut list = SendList::with_capacity(2);
    let src = f.pd.register(8, LOCAL).unwrap();
    list.push(SendRequest::write(src.slice(..).unwrap(), target.remote(24..32).unwrap()).tag(9))
        .unwrap();
    list.push(request).unwrap();
    // SAFETY: as above; `src` outlives the call (nothing is posted).
    let posted = unsafe { c.post_send(&mut list) };
    assert!(
        matches!(posted, Err(Error::Unsupported("ibv_wr_atomic_write"))),
        "{posted:?}"
    );
    target.read_at(0, &mut got).unwrap();
    assert_eq!(&got[16..], &[0u8; 48][..], "neither list posted anything");
    assert_eq!(c.query_state().unwrap(), QpStateKind::Rts);
}

#[test]
fn extended_atomics_return_the_old_value() {
    let Some(f) = fixture() else { return };
    let attr = f.context.query_device().unwrap();
    assert_ne!(attr.atomic_cap, AtomicCap::None, "no atomics on the device");
    let (mut cq_a, cq_b) = (f.cq(16), f.cq(16));
    let (mut a, _b) = mixed_rc_pair(&f, &cq_a, &cq_b, |a| a, |b| b, AccessFlags::REMOTE_ATOMIC);
    let mut word =
        f.pd.register(8, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC)
            .unwrap();
    word.write_at(0, &100u64.to_ne_bytes()).unwrap();
    let old = f.pd.register(8, LOCAL).unwrap();
    let remote = word.remote(..).unwrap();
    let slice = old.slice(..).unwrap();
    let mut op = |request: SendRequest<'_, AtomicOp>, wr_id: u64, opcode: WcOpcode| -> u64 {
        // SAFETY: `old` and `word` outlive the polled completion.
        unsafe { a.post_send_one(&request).unwrap() };
        assert_ok(&wait_for(&mut cq_a, 1)[0], wr_id, opcode);
        old.load_u64(0).unwrap()
    };

    let fetched = op(
        SendRequest::fetch_add(slice, remote, 5).tag(1),
        1,
        WcOpcode::FetchAdd,
    );
    assert_eq!(fetched, 100);
    assert_eq!(word.load_u64(0).unwrap(), 105);
    // A matching compare swaps.
    let swapped = op(
        SendRequest::compare_swap(slice, remote, 105, 7).tag(2),
        2,
        WcOpcode::CompSwap,
    );
    assert_eq!(swapped, 105);
    assert_eq!(word.load_u64(0).unwrap(), 7);
    // A failing compare leaves the word and still returns the old value.
    let kept = op(
        SendRequest::compare_swap(slice, remote, 1, 9).tag(3),
        3,
        WcOpcode::CompSwap,
    );
    assert_eq!(kept, 7);
    assert_eq!(word.load_u64(0).unwrap(), 7);
}

#[test]
fn extended_post_list_of_32_completes_in_order() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(64), f.cq(64));
    let (mut a, mut b) = mixed_rc_pair(
        &f,
        &cq_a,
        &cq_b,
        |a| a.max_send_wr(32),
        |b| b.max_recv_wr(32),
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
        let range = i * 64..(i + 1) * 64;
        recvs
            .push(RecvRequest::new(dst.slice(range.clone()).unwrap()).tag(i as u64))
            .unwrap();
        let request = SendRequest::send(src.slice(range).unwrap()).tag(100 + i as u64);
        sends.push(request).unwrap();
    }
    // SAFETY: buffers outlive the polled completions.
    unsafe {
        b.post_recv(&mut recvs).unwrap();
        a.post_send(&mut sends).unwrap();
    }
    let sent = wait_for(&mut cq_a, 32);
    let received = wait_for(&mut cq_b, 32);
    for i in 0..32 {
        assert_ok(&sent[i], 100 + i as u64, WcOpcode::Send);
        assert_ok(&received[i], i as u64, WcOpcode::Recv);
        assert_eq!(received[i].byte_len(), 64);
    }
    for (i, chunk) in dst.as_slice().unwrap().chunks(64).enumerate() {
        assert!(chunk.iter().all(|&x| x == i as u8), "message {i} corrupted");
    }
}

#[test]
fn extended_unsignaled_sends_with_a_periodic_signaled_one() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(64), f.cq(64));
    let (mut a, mut b) = mixed_rc_pair(
        &f,
        &cq_a,
        &cq_b,
        |a| a.max_send_wr(16),
        |b| b.max_recv_wr(16),
        AccessFlags::empty(),
    );
    let src = f.pd.register(64, LOCAL).unwrap();
    let dst = f.pd.register(16 * 64, LOCAL).unwrap();
    let mut sends = SendList::with_capacity(16);
    let mut recvs = RecvList::with_capacity(16);
    for i in 0..16u64 {
        let request = SendRequest::send(src.slice(..).unwrap()).tag(i);
        let request = if i % 4 == 3 {
            request
        } else {
            request.unsignaled()
        };
        sends.push(request).unwrap();
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
    assert_eq!(
        signaled,
        vec![3, 7, 11, 15],
        "wr_flags carry IBV_SEND_SIGNALED"
    );
    // A send queue completes in order: a completion for an unsignaled request would have come
    // before 15's.
    assert_cq_empty(&mut cq_a);
}

#[test]
fn extended_ud_send_with_grh() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let builder = f.pd.qp_builder(&cq_a, &cq_a).send_path(SendPath::Extended);
    let mut a = f.ud_qp(builder, QKEY);
    let mut b = f.ud_qp(f.pd.qp_builder(&cq_b, &cq_b), QKEY);
    assert!(a.uses_extended_post());
    let ah = f.pd.create_ah(&f.av()).expect("ibv_create_ah");
    const SIZE: usize = 512;
    let mut src = f.pd.register(SIZE, LOCAL).unwrap();
    let data = pattern(SIZE, 5);
    src.as_mut_slice().unwrap().copy_from_slice(&data);
    let dst = f.pd.register(2 * (SIZE + GRH_LEN), LOCAL).unwrap();
    let (first, second) = (SIZE + GRH_LEN, 2 * (SIZE + GRH_LEN));
    let mut recvs = RecvList::with_capacity(2);
    recvs
        .push(RecvRequest::new(dst.slice(..first).unwrap()).tag(1))
        .unwrap();
    recvs
        .push(RecvRequest::new(dst.slice(first..second).unwrap()).tag(2))
        .unwrap();
    // Two datagrams in one batch: `ibv_wr_set_ud_addr` on each, the second with immediate.
    let mut sends = SendList::with_capacity(2);
    sends
        .push(
            SendRequest::send(src.slice(..).unwrap())
                .tag(3)
                .to(&ah, b.qp_num(), QKEY),
        )
        .unwrap();
    sends
        .push(
            SendRequest::send(src.slice(..64).unwrap())
                .tag(4)
                .with_imm(0x0bad_cafe)
                .to(&ah, b.qp_num(), QKEY),
        )
        .unwrap();
    // SAFETY: the buffers and the address handle live until the completions are polled below.
    unsafe {
        b.post_recv(&mut recvs).unwrap();
        a.post_send(&mut sends).unwrap();
    }
    let sent = wait_for(&mut cq_a, 2);
    assert_ok(&sent[0], 3, WcOpcode::Send);
    assert_ok(&sent[1], 4, WcOpcode::Send);
    let received = wait_for(&mut cq_b, 2);
    let whole = dst.as_slice().unwrap();
    for (wc, (at, len, imm)) in received
        .iter()
        .zip([(0, SIZE, None), (first, 64, Some(0x0bad_cafe))])
    {
        assert!(wc.is_success(), "{wc:?}");
        assert!(wc.flags().contains(WcFlags::GRH), "{wc:?}");
        assert_eq!(wc.byte_len() as usize, len + GRH_LEN, "{wc:?}");
        assert_eq!(wc.src_qp(), a.qp_num(), "{wc:?}");
        assert_eq!(wc.imm_data(), imm, "{wc:?}");
        let grh: &[u8; GRH_LEN] = whole[at..at + GRH_LEN].try_into().unwrap();
        assert_grh(grh, Gid(f.device.gid));
        let payload = &whole[at + GRH_LEN..at + GRH_LEN + len];
        assert_eq!(payload, &data[..len], "payload after the GRH");
    }
    assert_eq!(received[0].wr_id(), 1);
    assert_eq!(received[1].wr_id(), 2);
}

#[test]
fn extended_uc_send_and_write() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.uc_pair(
        f.pd.qp_builder(&cq_a, &cq_a).send_path(SendPath::Auto),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::REMOTE_WRITE,
    );
    if is_rxe(&f) {
        assert!(a.uses_extended_post());
    }
    let mut src = f.pd.register(256, LOCAL).unwrap();
    let data = pattern(256, 9);
    src.as_mut_slice().unwrap().copy_from_slice(&data);
    let inbox = f.pd.register(256, LOCAL).unwrap();
    let target =
        f.pd.register(256, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
    let mut sends = SendList::with_capacity(2);
    sends
        .push(SendRequest::send(src.slice(..128).unwrap()).tag(1))
        .unwrap();
    sends
        .push(SendRequest::write(src.slice(128..).unwrap(), target.remote(..128).unwrap()).tag(2))
        .unwrap();
    // SAFETY: buffers outlive the polled completions.
    unsafe {
        b.post_recv_one(&RecvRequest::new(inbox.slice(..).unwrap()).tag(3))
            .unwrap();
        a.post_send(&mut sends).unwrap();
    }
    let sent = wait_for(&mut cq_a, 2);
    assert_ok(&sent[0], 1, WcOpcode::Send);
    assert_ok(&sent[1], 2, WcOpcode::RdmaWrite);
    let wc = wait_for(&mut cq_b, 1)[0];
    assert_ok(&wc, 3, WcOpcode::Recv);
    assert_eq!(&inbox.as_slice().unwrap()[..128], &data[..128]);
    let mut got = vec![0; 128];
    target.read_at(0, &mut got).unwrap();
    assert_eq!(&got[..], &data[128..]);
}

#[test]
fn extended_full_send_queue_is_a_typed_error() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, cq_b) = (f.cq(64), f.cq(64));
    // The receiver never posts a receive: the first send waits in receiver-not-ready retries
    // (RNR retry 7 is infinite), so the sends behind it fill the queue.
    let (mut a, _b) = mixed_rc_pair(
        &f,
        &cq_a,
        &cq_b,
        |a| a.max_send_wr(4),
        |b| b,
        AccessFlags::empty(),
    );
    let depth = a.caps().max_send_wr as usize;
    let src = f.pd.register(64, LOCAL).unwrap();

    // A batch larger than the queue fails whole: nothing of it is posted.
    let mut big = SendList::with_capacity(depth * 4);
    for i in 0..depth * 4 {
        let request = SendRequest::send(src.slice(..).unwrap()).tag(1000 + i as u64);
        big.push(request).unwrap();
    }
    // SAFETY: `src` outlives the queue pair's flush below.
    let outcome = unsafe { a.post_send(&mut big) };
    assert!(
        matches!(
            outcome,
            Err(Error::QueueFull {
                verb: "ibv_wr_complete",
                index: 0
            })
        ),
        "{outcome:?}"
    );

    let mut posted = 0;
    let mut outcome = Ok(());
    for i in 0..depth * 4 {
        // SAFETY: as above.
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
                verb: "ibv_wr_complete",
                index: 0
            })
        ),
        "after {posted} posts: {outcome:?}"
    );
    assert!(
        posted >= depth,
        "the queue took {posted}, less than its capacity {depth}"
    );
    let _a = a.into_error().unwrap();
    let flushed = wait_for(&mut cq_a, posted);
    for (i, wc) in flushed.iter().enumerate() {
        assert_eq!(
            wc.wr_id(),
            i as u64,
            "only the single posts were queued: {wc:?}"
        );
        assert!(
            wc.status() == WcStatus::WrFlushErr || wc.is_success(),
            "{wc:?}"
        );
    }
    // Anything of the refused batch would have been queued before the single posts, and its
    // completions would have come first (checked above by their wr_ids).
    assert_cq_empty(&mut cq_a);
}

#[test]
fn extended_lists_the_batch_cannot_carry_go_to_post_send() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = mixed_rc_pair(
        &f,
        &cq_a,
        &cq_b,
        |a| a.max_inline_data(16),
        |b| b.max_recv_wr(8),
        AccessFlags::empty(),
    );
    let mut src = f.pd.register(256, LOCAL).unwrap();
    let data = pattern(256, 11);
    src.as_mut_slice().unwrap().copy_from_slice(&data);
    let dst = f.pd.register(4 * 256, LOCAL).unwrap();
    let mut recvs = RecvList::with_capacity(4);
    for i in 0..4usize {
        let slot = dst.slice(i * 256..(i + 1) * 256).unwrap();
        recvs.push(RecvRequest::new(slot).tag(i as u64)).unwrap();
    }
    // SAFETY: `dst` outlives the completions polled below.
    unsafe { b.post_recv(&mut recvs).unwrap() };

    // Inline data over the granted limit: the builders cannot carry the list, so it goes to
    // ibv_post_send, which posts request 0 and refuses request 1 as it always has.
    let too_long = vec![7u8; a.caps().max_inline_data as usize + 1];
    let mut list = SendList::with_capacity(2);
    list.push(SendRequest::send(src.slice(..100).unwrap()).tag(1))
        .unwrap();
    list.push(SendRequest::send(Payload::Inline(&too_long)).tag(2))
        .unwrap();
    // SAFETY: `src` outlives the polled completions; inline data is copied by the post.
    let outcome = unsafe { a.post_send(&mut list) };
    assert!(
        matches!(
            outcome,
            Err(Error::Post {
                verb: "ibv_post_send",
                index: 1,
                ..
            })
        ),
        "{outcome:?}"
    );
    assert_ok(&wait_for(&mut cq_a, 1)[0], 1, WcOpcode::Send);
    assert_ok(&wait_for(&mut cq_b, 1)[0], 0, WcOpcode::Recv);

    // The queue pair goes on through the builders, in order after the classic post.
    let mut list = list.reuse::<SendRequest<'_>>();
    list.push(SendRequest::send(src.slice(100..200).unwrap()).tag(3))
        .unwrap();
    list.push(SendRequest::send(Payload::Inline(&data[200..216])).tag(4))
        .unwrap();
    // SAFETY: as above.
    unsafe { a.post_send(&mut list).unwrap() };
    let sent = wait_for(&mut cq_a, 2);
    assert_ok(&sent[0], 3, WcOpcode::Send);
    assert_ok(&sent[1], 4, WcOpcode::Send);
    let received = wait_for(&mut cq_b, 2);
    assert_ok(&received[0], 1, WcOpcode::Recv);
    assert_ok(&received[1], 2, WcOpcode::Recv);
    let whole = dst.as_slice().unwrap();
    assert_eq!(&whole[..100], &data[..100]);
    assert_eq!(&whole[256..356], &data[100..200]);
    assert_eq!(&whole[512..528], &data[200..216]);
    assert_eq!(received[1].byte_len(), 16);
}

#[test]
fn extended_memory_window_operations() {
    let Some(f) = fixture() else { return };
    if !f.context.query_device().unwrap().supports_mw_type2() {
        rdma_test_support::unsupported("memory windows type 2");
        return;
    }
    let bindable = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::MW_BIND;
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    // Both sides extended: `b` binds and invalidates, `a` sends with invalidate.
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a).send_path(SendPath::Extended),
        f.pd.qp_builder(&cq_b, &cq_b).send_path(SendPath::Extended),
        AccessFlags::REMOTE_WRITE,
    );
    assert!(a.uses_extended_post() && b.uses_extended_post());
    let target = f.pd.register(4096, bindable).unwrap();
    let mut src = f.pd.register(256, LOCAL).unwrap();
    let data = pattern(256, 51);
    src.as_mut_slice().unwrap().copy_from_slice(&data);
    let mut mw = f.pd.alloc_mw(MwType::Type2).unwrap();

    let mut write = |a: &mut QueuePair<Rc, Rts>, wr_id: u64, rkey: u32| -> WcStatus {
        let remote = RemoteMemory {
            addr: target.addr(),
            len: 64,
            rkey,
        };
        // SAFETY: `src` outlives the polled completion.
        unsafe {
            a.post_send_one(&SendRequest::write(src.slice(..64).unwrap(), remote).tag(wr_id))
                .unwrap();
        }
        let wc = wait_for(&mut cq_a, 1)[0];
        assert_eq!(wc.wr_id(), wr_id, "{wc:?}");
        wc.status()
    };

    // Bind, then a write through the window lands.
    let bind = SendRequest::bind_mw(&mut mw, &target, 0..4096, AccessFlags::REMOTE_WRITE);
    let bind = bind.unwrap().tag(1);
    let rkey = bind.rkey();
    // SAFETY: `target` outlives the bind's completion (and the window).
    unsafe { b.post_send_one(&bind).unwrap() };
    assert_ok(&wait_for(&mut cq_b, 1)[0], 1, WcOpcode::BindMw);
    assert_eq!(mw.rkey(), rkey);
    assert_eq!(write(&mut a, 2, rkey), WcStatus::Success);
    let mut got = vec![0; 64];
    target.read_at(0, &mut got).unwrap();
    assert_eq!(&got[..], &data[..64]);

    // Local invalidate revokes the key.
    // SAFETY: LOCAL_INV names no memory.
    unsafe {
        b.post_send_one(&SendRequest::local_invalidate(rkey).tag(3))
            .unwrap();
    }
    assert_ok(&wait_for(&mut cq_b, 1)[0], 3, WcOpcode::LocalInv);
    assert_eq!(write(&mut a, 4, rkey), WcStatus::RemAccessErr);

    // The failed write moved `a` to ERR: a fresh pair for the peer's SEND_WITH_INV.
    drop((a, b));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a).send_path(SendPath::Extended),
        f.pd.qp_builder(&cq_b, &cq_b).send_path(SendPath::Extended),
        AccessFlags::REMOTE_WRITE,
    );
    while !cq_a
        .poll(&mut [WorkCompletion::default(); 4])
        .unwrap()
        .is_empty()
    {}
    let bind = SendRequest::bind_mw(&mut mw, &target, 0..4096, AccessFlags::REMOTE_WRITE);
    let bind = bind.unwrap().tag(5);
    let rkey = bind.rkey();
    let inbox = f.pd.register(256, LOCAL).unwrap();
    // SAFETY: `target`, `inbox` and `src` outlive the completions polled below.
    unsafe {
        b.post_send_one(&bind).unwrap();
        b.post_recv_one(&RecvRequest::new(inbox.slice(..).unwrap()).tag(6))
            .unwrap();
    }
    assert_ok(&wait_for(&mut cq_b, 1)[0], 5, WcOpcode::BindMw);
    // SAFETY: as above.
    unsafe {
        a.post_send_one(&SendRequest::send_with_invalidate(src.slice(..128).unwrap(), rkey).tag(7))
            .unwrap();
    }
    assert_ok(&wait_for(&mut cq_a, 1)[0], 7, WcOpcode::Send);
    let wc = wait_for(&mut cq_b, 1)[0];
    assert_ok(&wc, 6, WcOpcode::Recv);
    assert_eq!(wc.byte_len(), 128);
    assert_eq!(&inbox.as_slice().unwrap()[..128], &data[..128]);
    let remote = RemoteMemory {
        addr: target.addr(),
        len: 64,
        rkey,
    };
    // SAFETY: `src` outlives the polled completion.
    unsafe {
        a.post_send_one(&SendRequest::write(src.slice(..64).unwrap(), remote).tag(8))
            .unwrap();
    }
    let wc = wait_for(&mut cq_a, 1)[0];
    assert_eq!(
        (wc.wr_id(), wc.status()),
        (8, WcStatus::RemAccessErr),
        "the key was invalidated by the send: {wc:?}"
    );
    drop(mw);
}
