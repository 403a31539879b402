//! Memory windows on the device: type 1 (bound with `ibv_bind_mw`) and type 2 (bound and
//! invalidated by work requests), checked by what a peer's RDMA writes through them do.
//!
//! Soft-RoCE (rxe) deviates from the specification twice here, and the tests say so: its
//! responder checks accesses through a window against the bounds of the region, not of the
//! window, and it reports a SEND_WITH_INV receive with the kernel's `IB_WC_WITH_INVALIDATE` bit,
//! which is `IBV_WC_IP_CSUM_OK` in libibverbs (so `invalidated_rkey()` is `None`). On rxe each
//! test accepts the deviation (and says so on stderr) but still requires the specified outcome
//! everywhere else; on any other device it requires the specified outcome.

use std::sync::Arc;

use rdma_test_support::verbs::*;
use rdma_verbs::{cq::*, mr::*, mw::*, owned::*, qp::*, scope::*, wr::*, *};

const LOCAL: AccessFlags = AccessFlags::LOCAL_WRITE;
/// The rights of a region windows are bound to: remotely writable, so the region hands out no
/// references, and bindable.
const BINDABLE: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::MW_BIND);

/// The fixture, or `None` after recording that the device lacks windows of type `kind`.
fn fixture_with(kind: MwType) -> Option<Fixture> {
    let f = fixture()?;
    f.has_windows(kind).then_some(f)
}

/// Two connected RC queue pairs that accept the peer's RDMA writes, each with its own CQ.
struct Pair {
    cq_a: CompletionQueue,
    cq_b: CompletionQueue,
    a: QueuePair<Rc, Rts>,
    b: QueuePair<Rc, Rts>,
}

fn pair(f: &Fixture) -> Pair {
    pair_with(f, |b| b)
}

/// As [`pair`], with `b`'s builder passed through `b_options` (a send path, for instance).
fn pair_with(f: &Fixture, b_options: impl FnOnce(QpBuilder<'_, Rc>) -> QpBuilder<'_, Rc>) -> Pair {
    let (cq_a, cq_b) = (f.cq(16), f.cq(16));
    let (a, b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        b_options(f.pd.qp_builder(&cq_b, &cq_b)),
        AccessFlags::REMOTE_WRITE,
    );
    Pair { cq_a, cq_b, a, b }
}

impl Pair {
    /// `a` RDMA-writes the first `len` bytes of `src` to `addr` with `rkey` (an owned write
    /// of a range of `src`, tagged `tag`); the completion's status.
    fn write(
        &mut self,
        tag: u64,
        src: &Arc<MemoryRegion>,
        len: u32,
        addr: u64,
        rkey: u32,
    ) -> WcStatus {
        let remote = RemoteMemory { addr, len, rkey };
        let range = RegionRange::new(src, ..len as usize).unwrap();
        self.a
            .post_send_owned(SendRequest::write(range, remote).tag(tag))
            .unwrap();
        let done = reap(&mut self.cq_a, 1);
        assert_eq!(done[0].tag(), Some(tag), "{done:?}");
        if done[0].is_success() {
            assert_eq!(done[0].wc().opcode(), WcOpcode::RdmaWrite, "{done:?}");
        }
        done[0].status()
    }
}

/// A source region holding `pattern(len, seed)`.
fn source(f: &Fixture, len: usize, seed: u8) -> Arc<MemoryRegion> {
    let mut src = f.pd.register(len, LOCAL).unwrap();
    src.as_mut_slice()
        .unwrap()
        .copy_from_slice(&pattern(len, seed));
    Arc::new(src)
}

fn contents(mr: &MemoryRegion) -> Vec<u8> {
    let mut out = vec![0; mr.len()];
    mr.read_at(0, &mut out).unwrap();
    out
}

/// Reaps one completion from `cq` and checks that it is the successful one of the owned
/// request tagged `tag`, with `opcode`; drops it (its buffer, if any, goes back).
fn reap_success(cq: &mut CompletionQueue, tag: u64, opcode: WcOpcode) {
    let done = reap(cq, 1);
    assert_eq!(
        (done[0].tag(), done[0].status(), done[0].wc().opcode()),
        (Some(tag), WcStatus::Success, opcode)
    );
}

/// Binds type 1 window `mw` to `range` of `mr` through `qp`, waits for the bind's completion and
/// returns the new key.
fn bind_type1(
    qp: &mut QueuePair<Rc, Rts>,
    cq: &mut CompletionQueue,
    mw: &mut MemoryWindow,
    mr: &MemoryRegion,
    range: std::ops::Range<usize>,
    wr_id: u64,
) -> u32 {
    let old = mw.rkey();
    // SAFETY: `mr` outlives the bind's completion, polled below.
    let rkey = unsafe { qp.bind_mw(mw, wr_id, mr, range, AccessFlags::REMOTE_WRITE, true) }
        .expect("ibv_bind_mw");
    assert_eq!(rkey, mw.rkey());
    assert_ne!(rkey, old, "a bind gives the window a new key");
    assert_eq!(rkey >> 8, old >> 8, "only the key's tag changes");
    assert_ok(&wait_for(cq, 1)[0], wr_id, WcOpcode::BindMw);
    rkey
}

/// Binds type 2 window `mw` to `range` of `mr` with a BIND_MW request on `qp`, waits for its
/// completion and returns the new key.
fn bind_type2(
    qp: &mut QueuePair<Rc, Rts>,
    cq: &mut CompletionQueue,
    mw: &mut MemoryWindow,
    mr: &MemoryRegion,
    range: std::ops::Range<usize>,
    wr_id: u64,
) -> u32 {
    let old = mw.rkey();
    let request = SendRequest::bind_mw(mw, mr, range, AccessFlags::REMOTE_WRITE)
        .expect("bind_mw")
        .tag(wr_id);
    let rkey = request.rkey();
    // SAFETY: `mr` outlives the bind's completion, polled below.
    unsafe { qp.post_send_one(&request).expect("post BIND_MW") };
    assert_ok(&wait_for(cq, 1)[0], wr_id, WcOpcode::BindMw);
    assert_eq!(rkey, mw.rkey());
    assert_ne!(rkey, old, "a bind gives the window a new key");
    rkey
}

#[test]
fn mw_type1_write_inside_the_window_lands() {
    let Some(f) = fixture_with(MwType::Type1) else {
        return;
    };
    let mut p = pair(&f);
    let target = f.pd.register(8192, BINDABLE).unwrap();
    let src = source(&f, 2048, 5);
    let mut mw = f.pd.alloc_mw(MwType::Type1).unwrap();
    assert_eq!(mw.mw_type(), MwType::Type1);
    let rkey = bind_type1(&mut p.b, &mut p.cq_b, &mut mw, &target, 1024..3072, 1);

    // The whole window, at the window's addresses (windows here are not zero-based).
    let at = target.addr() + 1024;
    assert_eq!(p.write(2, &src, 2048, at, rkey), WcStatus::Success);
    let got = contents(&target);
    assert!(
        got[..1024].iter().all(|&x| x == 0),
        "wrote before the window"
    );
    assert_eq!(&got[1024..3072], &pattern(2048, 5)[..]);
    assert!(
        got[3072..].iter().all(|&x| x == 0),
        "wrote after the window"
    );

    // A part of it, again.
    let src2 = source(&f, 100, 77);
    assert_eq!(p.write(3, &src2, 100, at + 500, rkey), WcStatus::Success);
    let got = contents(&target);
    assert_eq!(&got[1524..1624], &pattern(100, 77)[..]);

    // Re-binding to another range gives a new key that works there.
    let rkey2 = bind_type1(&mut p.b, &mut p.cq_b, &mut mw, &target, 4096..8192, 4);
    assert_eq!(
        p.write(5, &src2, 100, target.addr() + 8092, rkey2),
        WcStatus::Success
    );
    assert_eq!(&contents(&target)[8092..], &pattern(100, 77)[..]);
    drop(mw);
}

#[test]
fn mw_type1_write_outside_the_window_is_refused() {
    let Some(f) = fixture_with(MwType::Type1) else {
        return;
    };
    let mut p = pair(&f);
    let target = f.pd.register(8192, BINDABLE).unwrap();
    let src = source(&f, 64, 9);
    let mut mw = f.pd.alloc_mw(MwType::Type1).unwrap();
    let rkey = bind_type1(&mut p.b, &mut p.cq_b, &mut mw, &target, 0..4096, 1);
    // Inside the region, outside the window.
    let status = p.write(2, &src, 64, target.addr() + 4096, rkey);
    if status == WcStatus::Success && f.is_rxe() {
        // rxe checks window accesses against the region's bounds only (Linux 6.1 rxe_resp.c
        // check_rkey): the write lands. The key still works only inside the region.
        note("rxe let an RDMA write outside the window (inside the region) through");
        assert_eq!(&contents(&target)[4096..4160], &pattern(64, 9)[..]);
        assert_eq!(
            p.write(3, &src, 64, target.addr() + 8192, rkey),
            WcStatus::RemAccessErr,
            "rxe let a write outside the region through"
        );
    } else {
        assert_eq!(status, WcStatus::RemAccessErr);
        assert!(
            contents(&target).iter().all(|&x| x == 0),
            "the refused write changed memory"
        );
    }
    drop(mw);
}

#[test]
fn mw_type1_unbind_revokes_the_key() {
    let Some(f) = fixture_with(MwType::Type1) else {
        return;
    };
    let mut p = pair(&f);
    let target = f.pd.register(4096, BINDABLE).unwrap();
    let src = source(&f, 64, 11);
    let mut mw = f.pd.alloc_mw(MwType::Type1).unwrap();
    let rkey = bind_type1(&mut p.b, &mut p.cq_b, &mut mw, &target, 0..4096, 1);
    assert_eq!(p.write(2, &src, 64, target.addr(), rkey), WcStatus::Success);
    // Binding to an empty range unbinds; the window gets yet another key.
    let unbound = bind_type1(&mut p.b, &mut p.cq_b, &mut mw, &target, 0..0, 3);
    assert_ne!(unbound, rkey);
    let before = contents(&target);
    let src2 = source(&f, 64, 12);
    assert_eq!(
        p.write(4, &src2, 64, target.addr(), rkey),
        WcStatus::RemAccessErr
    );
    assert_eq!(
        contents(&target),
        before,
        "the refused write changed memory"
    );
    drop(mw);
}

#[test]
fn mw_type2_local_invalidate_revokes_the_key() {
    let Some(f) = fixture_with(MwType::Type2) else {
        return;
    };
    let mut p = pair(&f);
    let target = f.pd.register(8192, BINDABLE).unwrap();
    let src = source(&f, 4096, 21);
    let mut mw = f.pd.alloc_mw(MwType::Type2).unwrap();
    assert_eq!(mw.mw_type(), MwType::Type2);
    let rkey = bind_type2(&mut p.b, &mut p.cq_b, &mut mw, &target, 4096..8192, 1);
    assert_eq!(
        p.write(2, &src, 4096, target.addr() + 4096, rkey),
        WcStatus::Success
    );
    let got = contents(&target);
    assert!(got[..4096].iter().all(|&x| x == 0));
    assert_eq!(&got[4096..], &pattern(4096, 21)[..]);

    // SAFETY: LOCAL_INV names no memory.
    unsafe {
        p.b.post_send_one(&SendRequest::local_invalidate(rkey).tag(3))
            .unwrap();
    }
    assert_ok(&wait_for(&mut p.cq_b, 1)[0], 3, WcOpcode::LocalInv);
    let src2 = source(&f, 64, 22);
    assert_eq!(
        p.write(4, &src2, 64, target.addr() + 4096, rkey),
        WcStatus::RemAccessErr
    );
    assert_eq!(&contents(&target)[4096..], &pattern(4096, 21)[..]);
    drop(mw);
}

#[test]
fn mw_type2_rebind_after_invalidate_gets_a_new_key() {
    let Some(f) = fixture_with(MwType::Type2) else {
        return;
    };
    let mut p = pair(&f);
    let target = f.pd.register(4096, BINDABLE).unwrap();
    let src = source(&f, 64, 31);
    let mut mw = f.pd.alloc_mw(MwType::Type2).unwrap();
    let first = bind_type2(&mut p.b, &mut p.cq_b, &mut mw, &target, 0..2048, 1);
    assert_eq!(
        p.write(2, &src, 64, target.addr(), first),
        WcStatus::Success
    );
    // Invalidated and bound again, to another range, in one post list.
    let request = SendRequest::bind_mw(&mut mw, &target, 2048..4096, AccessFlags::REMOTE_WRITE)
        .unwrap()
        .tag(4);
    let second = request.rkey();
    let mut list = SendList::with_capacity(2);
    list.push(SendRequest::local_invalidate(first).tag(3))
        .unwrap();
    list.push(request).unwrap();
    // SAFETY: `target` outlives the bind's completion.
    unsafe { p.b.post_send(&mut list).unwrap() };
    let done = wait_for(&mut p.cq_b, 2);
    assert_ok(&done[0], 3, WcOpcode::LocalInv);
    assert_ok(&done[1], 4, WcOpcode::BindMw);
    drop(list);
    assert_eq!(mw.rkey(), second);
    assert_ne!(second, first);
    assert_eq!(
        p.write(4, &src, 64, target.addr() + 4032, second),
        WcStatus::Success
    );
    assert_eq!(&contents(&target)[4032..], &pattern(64, 31)[..]);
    // The first key stays dead.
    assert_eq!(
        p.write(5, &src, 64, target.addr() + 2048, first),
        WcStatus::RemAccessErr
    );
    drop(mw);
}

#[test]
fn mw_type2_send_with_invalidate_revokes_the_key() {
    let Some(f) = fixture_with(MwType::Type2) else {
        return;
    };
    let mut p = pair(&f);
    let target = f.pd.register(4096, BINDABLE).unwrap();
    let src = source(&f, 256, 41);
    let mut mw = f.pd.alloc_mw(MwType::Type2).unwrap();
    let rkey = bind_type2(&mut p.b, &mut p.cq_b, &mut mw, &target, 0..4096, 1);
    assert_eq!(
        p.write(2, &src, 256, target.addr(), rkey),
        WcStatus::Success
    );

    // The peer's SEND_WITH_INV invalidates the window bound to the receiving queue pair.
    let inbox = f.pd.register(256, LOCAL).unwrap();
    // SAFETY: `inbox` and `src` outlive the completions polled below.
    unsafe {
        p.b.post_recv_one(&RecvRequest::new(inbox.slice(..).unwrap()).tag(3))
            .unwrap();
        p.a.post_send_one(
            &SendRequest::send_with_invalidate(src.slice(..128).unwrap(), rkey).tag(4),
        )
        .unwrap();
    }
    assert_ok(&wait_for(&mut p.cq_a, 1)[0], 4, WcOpcode::Send);
    let wc = wait_for(&mut p.cq_b, 1)[0];
    assert_ok(&wc, 3, WcOpcode::Recv);
    assert_eq!(wc.byte_len(), 128);
    assert_eq!(wc.imm_data(), None);
    if wc.invalidated_rkey().is_none() && f.is_rxe() {
        // rxe sets the kernel's IB_WC_WITH_INVALIDATE (1 << 2), libibverbs' IBV_WC_IP_CSUM_OK.
        note("rxe flagged a SEND_WITH_INV receive IP_CSUM_OK instead of WITH_INV");
        assert!(wc.flags().contains(WcFlags::IP_CSUM_OK), "{:?}", wc.flags());
    } else {
        assert_eq!(wc.invalidated_rkey(), Some(rkey), "{wc:?} {:?}", wc.flags());
    }
    assert_eq!(&inbox.as_slice().unwrap()[..128], &pattern(256, 41)[..128]);

    let src2 = source(&f, 64, 42);
    assert_eq!(
        p.write(5, &src2, 64, target.addr(), rkey),
        WcStatus::RemAccessErr
    );
    assert_eq!(&contents(&target)[..256], &pattern(256, 41)[..]);
    drop(mw);
}

#[test]
fn mw_bad_binds_are_refused_before_posting() {
    let Some(f) = fixture_with(MwType::Type1) else {
        return;
    };
    let attr = f.context.query_device().unwrap();
    let mut p = pair(&f);
    let target = f.pd.register(4096, BINDABLE).unwrap();
    let mut t1 = f.pd.alloc_mw(MwType::Type1).unwrap();
    let key1 = t1.rkey();
    let write = AccessFlags::REMOTE_WRITE;
    let invalid = |r: &Result<u32>| matches!(r, Err(Error::InvalidArgument(_)));

    // SAFETY: every bind below is refused before anything is posted.
    unsafe {
        // Outside the region, reversed.
        assert!(invalid(&p.b.bind_mw(
            &mut t1,
            1,
            &target,
            0..4097,
            write,
            true
        )));
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = 10..5;
        assert!(invalid(
            &p.b.bind_mw(&mut t1, 1, &target, reversed, write, true)
        ));
        // A region without MW_BIND.
        let plain =
            f.pd.register(4096, LOCAL | AccessFlags::REMOTE_WRITE)
                .unwrap();
        assert!(invalid(&p.b.bind_mw(&mut t1, 1, &plain, .., write, true)));
        // Remote write through a window on a region that hands out references.
        let private = f.pd.register(4096, LOCAL | AccessFlags::MW_BIND).unwrap();
        assert!(invalid(&p.b.bind_mw(&mut t1, 1, &private, .., write, true)));
        // Zero-based type 1 windows do not exist.
        assert!(invalid(&p.b.bind_mw(
            &mut t1,
            1,
            &target,
            ..,
            write | AccessFlags::ZERO_BASED,
            true
        )));
        // A region of another protection domain.
        let other_pd = f.context.alloc_pd().unwrap();
        let foreign = other_pd.register(4096, BINDABLE).unwrap();
        assert!(invalid(&p.b.bind_mw(&mut t1, 1, &foreign, .., write, true)));
    }
    // Nothing was posted: the key is unchanged, and the first completion on `b` is that of the
    // request posted next (a send queue completes in order; every refused bind was signaled).
    assert_eq!(t1.rkey(), key1);
    let marker = f.pd.register(8, LOCAL).unwrap();
    // SAFETY: `marker` and `target` outlive the completion polled below.
    unsafe {
        p.b.post_send_one(
            &SendRequest::write(marker.slice(..).unwrap(), target.remote(..8).unwrap()).tag(99),
        )
        .unwrap();
    }
    assert_ok(&wait_for(&mut p.cq_b, 1)[0], 99, WcOpcode::RdmaWrite);
    assert_cq_empty(&mut p.cq_b);

    if attr.supports_mw_type2() {
        let mut t2 = f.pd.alloc_mw(MwType::Type2).unwrap();
        let key = t2.rkey();
        // A type 2 window is not bound with ibv_bind_mw, nor a type 1 window by a request.
        // SAFETY: refused before posting.
        assert!(invalid(&unsafe {
            p.b.bind_mw(&mut t2, 1, &target, .., write, true)
        }));
        let wrong = SendRequest::bind_mw(&mut t1, &target, .., write);
        assert!(matches!(wrong, Err(Error::InvalidArgument(_))), "{wrong:?}");
        // Type 2 windows cannot be bound to nothing.
        let empty = SendRequest::bind_mw(&mut t2, &target, 0..0, write);
        assert!(matches!(empty, Err(Error::InvalidArgument(_))), "{empty:?}");
        // Refused requests leave the key alone.
        assert_eq!(t2.rkey(), key);
    }

    // UD queue pairs have neither binds nor invalidation.
    let cq = f.cq(4);
    let mut ud = f.ud_qp(f.pd.qp_builder(&cq, &cq), 0x1111);
    // SAFETY: refused before posting.
    let bound = unsafe { ud.bind_mw(&mut t1, 1, &target, .., write, true) };
    assert!(invalid(&bound), "{bound:?}");
    // SAFETY: refused before posting.
    let inv = unsafe { ud.post_send_one(&SendRequest::local_invalidate(1).tag(1)) };
    assert!(matches!(inv, Err(Error::InvalidArgument(_))), "{inv:?}");
}

/// Invalidation through the owned path: an owned LOCAL_INV (no memory, a tag) revokes a type 2
/// window's key; after a new bind, an owned SEND_WITH_INV from the peer's buffer lands in an
/// owned receive, every byte, and revokes the new key. Every buffer comes back.
#[test]
fn mw_type2_owned_invalidations_revoke_the_key() {
    let Some(f) = fixture_with(MwType::Type2) else {
        return;
    };
    let mut p = pair(&f);
    let target = f.pd.register(4096, BINDABLE).unwrap();
    let src = source(&f, 64, 51);
    let mut mw = f.pd.alloc_mw(MwType::Type2).unwrap();
    let first = bind_type2(&mut p.b, &mut p.cq_b, &mut mw, &target, 0..4096, 1);
    assert_eq!(
        p.write(2, &src, 64, target.addr(), first),
        WcStatus::Success
    );

    p.b.post_send_owned(SendRequest::local_invalidate(first).tag(77))
        .unwrap();
    reap_success(&mut p.cq_b, 77, WcOpcode::LocalInv);
    assert_eq!(
        p.write(3, &src, 64, target.addr(), first),
        WcStatus::RemAccessErr
    );

    // A failed write moves the writer to the error state: a fresh pair for the second half.
    let mut q = pair(&f);
    let second = bind_type2(&mut q.b, &mut q.cq_b, &mut mw, &target, 0..4096, 4);
    assert_ne!(second, first);
    assert_eq!(
        q.write(5, &src, 64, target.addr() + 64, second),
        WcStatus::Success
    );
    let pool = BufferPool::new(&f.pd, 2, 256).unwrap();
    q.b.post_recv_buf(pool.take().unwrap(), 88).unwrap();
    let mut message = pool.take().unwrap();
    message.fill_from(&pattern(200, 52)).unwrap();
    q.a.post_send_owned(SendRequest::send_with_invalidate(message, second).tag(99))
        .unwrap();
    reap_success(&mut q.cq_a, 99, WcOpcode::Send);
    let mut got = reap(&mut q.cq_b, 1);
    assert_eq!(
        (got[0].tag(), got[0].wc().opcode()),
        (Some(88), WcOpcode::Recv)
    );
    let buf = got[0].take_buf().unwrap();
    assert_eq!(
        &buf[..],
        &pattern(200, 52)[..],
        "every byte of the SEND_WITH_INV"
    );
    drop(buf);
    assert_eq!(
        q.write(6, &src, 64, target.addr() + 128, second),
        WcStatus::RemAccessErr
    );
    assert_eq!(pool.available(), 2);
    let landed = contents(&target);
    assert_eq!(&landed[..64], &pattern(64, 51)[..]);
    assert_eq!(&landed[64..128], &pattern(64, 51)[..]);
    assert!(
        landed[128..192].iter().all(|&x| x == 0),
        "the revoked key wrote nothing"
    );
    drop(mw);
}

/// A bind through the owned path: no `unsafe`, and the request keeps its region registered
/// until the bind has executed (the entry holds a reference, counted here before and after
/// the completion). The key it reports is the window's, and a peer's write through it lands,
/// every byte; an owned LOCAL_INV then revokes it. Binds the post refuses (a type 1 window,
/// a window of another protection domain, a UD queue pair) come back as errors, and their
/// requests release the region at once.
#[test]
fn mw_type2_owned_bind_keeps_its_region_until_it_executes() {
    let Some(f) = fixture_with(MwType::Type2) else {
        return;
    };
    let mut p = pair(&f);
    let target = Arc::new(f.pd.register(4096, BINDABLE).unwrap());
    let src = source(&f, 256, 61);
    let mut mw = f.pd.alloc_mw(MwType::Type2).unwrap();
    let old = mw.rkey();

    let bind = SendRequest::bind_mw(&mut mw, &target, 1024..2048, AccessFlags::REMOTE_WRITE)
        .unwrap()
        .tag(41);
    let rkey = bind.rkey();
    assert_ne!(rkey, old, "a bind gives the window a new key");
    p.b.post_send_owned(bind).unwrap();
    assert_eq!(mw.rkey(), rkey);
    assert_eq!(
        Arc::strong_count(&target),
        2,
        "the in-flight bind holds the region"
    );
    reap_success(&mut p.cq_b, 41, WcOpcode::BindMw);
    assert_eq!(
        Arc::strong_count(&target),
        1,
        "the completion released the region"
    );

    assert_eq!(
        p.write(2, &src, 256, target.addr() + 1024, rkey),
        WcStatus::Success
    );
    let landed = contents(&target);
    assert_eq!(&landed[1024..1280], &pattern(256, 61)[..]);
    assert!(
        landed[..1024]
            .iter()
            .chain(&landed[1280..])
            .all(|&x| x == 0)
    );

    p.b.post_send_owned(SendRequest::local_invalidate(rkey).tag(42))
        .unwrap();
    reap_success(&mut p.cq_b, 42, WcOpcode::LocalInv);

    // Refused binds.
    let invalid = |e: &Error| matches!(e, Error::InvalidArgument(_));
    let mut t1 = f.pd.alloc_mw(MwType::Type1).unwrap();
    let refused = SendRequest::bind_mw(&mut t1, &target, .., AccessFlags::REMOTE_WRITE);
    assert!(invalid(refused.as_ref().unwrap_err()), "{refused:?}");
    let other_pd = f.context.alloc_pd().unwrap();
    let mut foreign = other_pd.alloc_mw(MwType::Type2).unwrap();
    let refused = SendRequest::bind_mw(&mut foreign, &target, .., AccessFlags::REMOTE_WRITE);
    assert!(invalid(refused.as_ref().unwrap_err()), "{refused:?}");
    drop(refused);
    let foreign_target = Arc::new(other_pd.register(4096, BINDABLE).unwrap());
    let request =
        SendRequest::bind_mw(&mut foreign, &foreign_target, .., AccessFlags::REMOTE_WRITE).unwrap();
    let refused = p.b.post_send_owned(request).unwrap_err();
    assert!(invalid(refused.error()), "{refused:?}");
    assert_eq!(Arc::strong_count(&foreign_target), 1);
    let mut ud = f.ud_qp(f.pd.qp_builder(&p.cq_a, &p.cq_a), 0x1111);
    let request = SendRequest::bind_mw(&mut mw, &target, 0..64, AccessFlags::REMOTE_WRITE).unwrap();
    let refused = ud.post_send_owned(request).unwrap_err();
    assert!(invalid(refused.error()), "{refused:?}");
    assert_eq!(Arc::strong_count(&target), 1);
    assert_eq!(
        mw.rkey(),
        rkey,
        "a refused bind gives the window its key back"
    );
    // A bind in a list that is cleared before it is posted, and one in a list dropped.
    let mut list = OwnedSendList::with_capacity(1);
    list.push(SendRequest::bind_mw(&mut mw, &target, 0..64, AccessFlags::REMOTE_WRITE).unwrap())
        .unwrap();
    list.clear();
    assert!(list.is_empty());
    drop(list);
    assert_eq!(mw.rkey(), rkey);
    let mut list = OwnedSendList::with_capacity(1);
    list.push(SendRequest::bind_mw(&mut mw, &target, 0..64, AccessFlags::REMOTE_WRITE).unwrap())
        .unwrap();
    drop(list);
    assert_eq!(mw.rkey(), rkey);
    assert_no_completion_each(&mut p.cq_a);

    // So the device's next bind of the window (through a list) works, and its key lets the
    // peer write.
    let request = SendRequest::bind_mw(&mut mw, &target, 0..512, AccessFlags::REMOTE_WRITE)
        .unwrap()
        .tag(43);
    let again = request.rkey();
    assert_ne!(again, rkey);
    let mut list = OwnedSendList::with_capacity(1);
    list.push(request).unwrap();
    p.b.post_send_list(&mut list).unwrap();
    assert!(list.is_empty());
    drop(list);
    assert_eq!(mw.rkey(), again, "a posted bind keeps its key");
    reap_success(&mut p.cq_b, 43, WcOpcode::BindMw);
    assert_eq!(
        p.write(3, &src, 256, target.addr(), again),
        WcStatus::Success
    );
    assert_eq!(&contents(&target)[..256], &pattern(256, 61)[..]);
    drop(mw);
}

/// An owned bind on the extended send path (`ibv_wr_bind_mw`), unsignaled: the completion of
/// a later signaled request of the same queue pair releases the region, and the key works; a
/// second unsignaled bind still in flight when its queue pair is dropped is released by the
/// drop.
#[test]
fn mw_type2_owned_bind_extended_unsignaled_and_dropped() {
    let Some(f) = fixture_with(MwType::Type2) else {
        return;
    };
    let mut p = pair_with(&f, |b| b.send_path(SendPath::Extended));
    let target = Arc::new(f.pd.register(4096, BINDABLE).unwrap());
    let src = source(&f, 128, 71);
    let pool = BufferPool::new(&f.pd, 2, 64).unwrap();
    let mut mw = f.pd.alloc_mw(MwType::Type2).unwrap();

    let bind = SendRequest::bind_mw(&mut mw, &target, 0..4096, AccessFlags::REMOTE_WRITE)
        .unwrap()
        .unsignaled()
        .tag(1);
    let rkey = bind.rkey();
    p.b.post_send_owned(bind).unwrap();
    assert_eq!(Arc::strong_count(&target), 2);
    p.a.post_recv_buf(pool.take().unwrap(), 3).unwrap();
    p.b.post_send_owned(SendRequest::send(b"after the bind").tag(2))
        .unwrap();
    reap_success(&mut p.cq_b, 2, WcOpcode::Send);
    assert_no_completion_each(&mut p.cq_b);
    assert_eq!(
        Arc::strong_count(&target),
        1,
        "the later completion released the unsignaled bind's region"
    );
    let mut got = reap(&mut p.cq_a, 1);
    assert_eq!(
        (got[0].tag(), got[0].wc().opcode()),
        (Some(3), WcOpcode::Recv)
    );
    assert_eq!(&got[0].take_buf().unwrap()[..], b"after the bind");
    drop(got);
    assert_eq!(
        p.write(4, &src, 128, target.addr() + 256, rkey),
        WcStatus::Success
    );
    assert_eq!(&contents(&target)[256..384], &pattern(128, 71)[..]);

    p.b.post_send_owned(SendRequest::local_invalidate(rkey).tag(5))
        .unwrap();
    reap_success(&mut p.cq_b, 5, WcOpcode::LocalInv);
    let bind = SendRequest::bind_mw(&mut mw, &target, 0..64, AccessFlags::REMOTE_WRITE)
        .unwrap()
        .unsignaled();
    p.b.post_send_owned(bind).unwrap();
    assert_eq!(p.b.owned_in_flight(), 1);
    drop(p);
    assert_eq!(
        Arc::strong_count(&target),
        1,
        "dropping the queue pair released the bind in flight"
    );
    drop(mw);
    assert_eq!(pool.available(), 2);
}

/// An owned bind still in flight (unsignaled, so no completion released it) when its queue
/// pair is reset: the reset releases it (the region's count goes back to 1, nothing is in
/// flight), and the queue pair, brought back to RTS, takes and completes owned requests again.
#[test]
fn mw_type2_owned_bind_in_flight_is_released_by_a_reset() {
    let Some(f) = fixture_with(MwType::Type2) else {
        return;
    };
    let p = pair(&f);
    let target = Arc::new(f.pd.register(4096, BINDABLE).unwrap());
    let mut mw = f.pd.alloc_mw(MwType::Type2).unwrap();
    let Pair {
        mut cq_a,
        mut cq_b,
        a,
        b,
    } = p;
    let bind = SendRequest::bind_mw(&mut mw, &target, 0..4096, AccessFlags::REMOTE_WRITE)
        .unwrap()
        .unsignaled();
    let mut b = b;
    b.post_send_owned(bind).unwrap();
    assert_eq!((Arc::strong_count(&target), b.owned_in_flight()), (2, 1));
    let b = b.into_reset().unwrap();
    assert_eq!(
        (Arc::strong_count(&target), b.owned_in_flight()),
        (1, 0),
        "the reset released the bind's region"
    );
    // Back to RTS on both sides: the queue pair serves owned requests again.
    let (mut a, mut b) = f.reconnect_rc(a, b, (300, 400));
    // Whatever the reset left in the queues (a stale completion or none) matches no request.
    let until = std::time::Instant::now() + QUIET;
    while std::time::Instant::now() < until {
        cq_b.poll_each(4, |c| assert_eq!(c.tag(), None, "{c:?}"))
            .unwrap();
    }
    let pool = BufferPool::new(&f.pd, 2, 64).unwrap();
    a.post_recv_buf(pool.take().unwrap(), 7).unwrap();
    b.post_send_owned(SendRequest::send(b"after the reset").tag(8))
        .unwrap();
    reap_success(&mut cq_b, 8, WcOpcode::Send);
    let mut got = reap(&mut cq_a, 1);
    assert_eq!(&got[0].take_buf().unwrap()[..], b"after the reset");
    drop(got);
    drop((a, b));
    drop(mw);
    assert_eq!(Arc::strong_count(&target), 1);
}

/// A type 2 window left bound by an owned bind when its queue pair is closed: the close
/// deallocates the window first (on rxe a destroy otherwise waits about 50 s for the binding
/// and warns in the kernel log, which the harness fails), so it returns with every buffer of
/// the queue pair back, and the window's key is dead: the window says it is no longer
/// allocated and a bind of it is refused. A window the closed queue pair bound earlier and
/// another queue pair bound since goes with it too (a window belongs with the queue pair that
/// bound it): its key stops working on the other queue pair. A bind request of a recorded
/// window made before the close is refused when it is posted after it, before the verb.
#[test]
fn mw_type2_owned_bind_is_ended_by_closing_its_queue_pair() {
    let Some(f) = fixture_with(MwType::Type2) else {
        return;
    };
    let mut p = pair(&f);
    let target = Arc::new(f.pd.register(4096, BINDABLE).unwrap());
    let src = source(&f, 128, 81);
    let pool = BufferPool::new(&f.pd, 2, 64).unwrap();

    // `moved`: bound through `p.b`, invalidated there, then bound through `q.b`.
    let mut moved = f.pd.alloc_mw(MwType::Type2).unwrap();
    let bind = SendRequest::bind_mw(&mut moved, &target, 0..1024, AccessFlags::REMOTE_WRITE)
        .unwrap()
        .tag(1);
    let first = bind.rkey();
    p.b.post_send_owned(bind).unwrap();
    reap_success(&mut p.cq_b, 1, WcOpcode::BindMw);
    p.b.post_send_owned(SendRequest::local_invalidate(first).tag(2))
        .unwrap();
    reap_success(&mut p.cq_b, 2, WcOpcode::LocalInv);
    let mut q = pair(&f);
    let bind = SendRequest::bind_mw(&mut moved, &target, 0..1024, AccessFlags::REMOTE_WRITE)
        .unwrap()
        .tag(3);
    let second = bind.rkey();
    q.b.post_send_owned(bind).unwrap();
    reap_success(&mut q.cq_b, 3, WcOpcode::BindMw);
    assert_eq!(
        q.write(4, &src, 128, target.addr() + 512, second),
        WcStatus::Success
    );

    // `left`: bound through `p.b` and left bound; a write through it lands.
    let mut left = f.pd.alloc_mw(MwType::Type2).unwrap();
    let bind = SendRequest::bind_mw(&mut left, &target, 1024..2048, AccessFlags::REMOTE_WRITE)
        .unwrap()
        .tag(5);
    let rkey = bind.rkey();
    p.b.post_send_owned(bind).unwrap();
    reap_success(&mut p.cq_b, 5, WcOpcode::BindMw);
    assert_eq!(
        p.write(6, &src, 128, target.addr() + 1024, rkey),
        WcStatus::Success
    );
    // A receive buffer in flight on the queue pair that is closed.
    p.b.post_recv_buf(pool.take().unwrap(), 7).unwrap();
    assert_eq!(pool.available(), 1);

    // `pending` and `listed`: bound through `p.b`, invalidated, and each with a new bind
    // request made before `p.b` is closed (`listed`'s pushed to a list).
    let mut pending = f.pd.alloc_mw(MwType::Type2).unwrap();
    let mut listed = f.pd.alloc_mw(MwType::Type2).unwrap();
    let mut scoped = f.pd.alloc_mw(MwType::Type2).unwrap();
    for (mw, tag) in [(&mut pending, 8), (&mut listed, 10), (&mut scoped, 15)] {
        let bind = SendRequest::bind_mw(mw, &target, 2048..3072, AccessFlags::REMOTE_WRITE)
            .unwrap()
            .tag(tag);
        let key = bind.rkey();
        p.b.post_send_owned(bind).unwrap();
        reap_success(&mut p.cq_b, tag, WcOpcode::BindMw);
        p.b.post_send_owned(SendRequest::local_invalidate(key).tag(tag + 1))
            .unwrap();
        reap_success(&mut p.cq_b, tag + 1, WcOpcode::LocalInv);
    }
    let request =
        SendRequest::bind_mw(&mut pending, &target, 2048..3072, AccessFlags::REMOTE_WRITE)
            .unwrap()
            .tag(12);
    let mut list = OwnedSendList::with_capacity(2);
    list.push(SendRequest::send(b"never sent").tag(13)).unwrap();
    list.push(
        SendRequest::bind_mw(&mut listed, &target, 2048..3072, AccessFlags::REMOTE_WRITE)
            .unwrap()
            .tag(14),
    )
    .unwrap();
    // `scoped`: a borrowed bind request, for a scope of another queue pair.
    let scoped_bind =
        SendRequest::bind_mw(&mut scoped, &*target, 2048..3072, AccessFlags::REMOTE_WRITE)
            .unwrap()
            .tag(17);

    let Pair { a, b, cq_a, cq_b } = p;
    let started = std::time::Instant::now();
    b.close().expect("ibv_destroy_qp");
    eprintln!(
        "NOTE: closing a queue pair with a window bound through it took {:.3} s",
        started.elapsed().as_secs_f64()
    );
    assert!(!left.is_allocated(), "the close deallocated the window");
    assert_eq!(
        pool.available(),
        2,
        "the receive buffer in flight came back"
    );
    let refused = SendRequest::bind_mw(&mut left, &target, .., AccessFlags::REMOTE_WRITE);
    assert!(
        matches!(refused, Err(Error::InvalidArgument(_))),
        "{refused:?}"
    );
    drop(refused);
    assert_eq!(left.rkey(), rkey, "a refused bind takes no key");
    assert_eq!(&contents(&target)[1024..1152], &pattern(128, 81)[..]);

    // `pending` and `listed` went with `p.b`: their requests are refused at the post, before
    // the verb, and post nothing (a list: none of its requests).
    let refused = q.b.post_send_owned(request).unwrap_err();
    assert!(
        matches!(refused.error(), Error::InvalidArgument(_)),
        "{refused:?}"
    );
    drop(refused);
    let error = q.b.post_send_list(&mut list).unwrap_err();
    assert!(matches!(error, Error::InvalidArgument(_)), "{error:?}");
    assert_eq!(list.len(), 2, "the list keeps both requests");
    drop(list);
    // A scope, a safe post too, holds the window's lock across the verb as the owned path
    // does: the bind of a window deallocated since the request was made is refused before
    // the verb (which would otherwise read the freed `ibv_mw`).
    let refused =
        q.b.scope(ScopeCqs::shared(&mut q.cq_b), |s| s.send(scoped_bind))
            .unwrap();
    assert!(
        matches!(&refused, Err(Error::InvalidArgument(why)) if why.contains("deallocated")),
        "{refused:?}"
    );
    assert!(!pending.is_allocated() && !listed.is_allocated() && !scoped.is_allocated());
    assert_eq!(q.b.owned_in_flight(), 0);
    assert_no_completion_each(&mut q.cq_b);
    assert!(
        contents(&target)[2048..3072].iter().all(|&x| x == 0),
        "nothing wrote through them"
    );

    // `moved` went with `p.b`: its key no longer works through `q.b`.
    assert!(!moved.is_allocated());
    assert_eq!(
        q.write(12, &src, 64, target.addr() + 640, second),
        WcStatus::RemAccessErr
    );
    assert!(
        contents(&target)[640..704].iter().all(|&x| x == 0),
        "the dead key wrote nothing"
    );
    drop((a, cq_a, cq_b));
    drop(q);
    assert_eq!(Arc::strong_count(&target), 1);
    drop((left, moved, pending, listed));
}

/// A READ by `qp` of `remote` into a fresh buffer of `pool`, tagged `tag`: every byte it
/// brought back.
fn read_back(
    qp: &mut QueuePair<Rc, Rts>,
    cq: &mut CompletionQueue,
    pool: &BufferPool,
    remote: RemoteMemory,
    tag: u64,
) -> Vec<u8> {
    let mut buf = pool.take().unwrap();
    buf.set_len(remote.len as usize).unwrap();
    qp.post_send_owned(SendRequest::read(buf, remote).tag(tag))
        .unwrap();
    let mut done = reap(cq, 1);
    assert_eq!(
        (done[0].tag(), done[0].status(), done[0].wc().opcode()),
        (Some(tag), WcStatus::Success, WcOpcode::RdmaRead)
    );
    done[0].take_buf().unwrap().to_vec()
}

/// Remotely readable memory is not shared memory (`docs/safety.md`, "Memory regions"): a
/// region registered with `REMOTE_READ` only still hands out `&mut [u8]`, and a peer's READ
/// after each round of writes through it brings back every byte of that round. A remotely
/// writable region refuses the same call.
#[test]
fn a_peer_reads_a_region_rust_writes_through_as_mut_slice() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, cq_b) = (f.cq(16), f.cq(16));
    let (mut a, _b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::REMOTE_READ,
    );
    let mut readable =
        f.pd.register(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
            .unwrap();
    assert!(!readable.is_shared());
    let pool = BufferPool::new(&f.pd, 2, 4096).unwrap();
    for round in 0..4u8 {
        readable
            .as_mut_slice()
            .expect("a remotely readable region hands out &mut [u8]")
            .copy_from_slice(&pattern(4096, 90 + round));
        let remote = readable.remote(..).unwrap();
        let got = read_back(&mut a, &mut cq_a, &pool, remote, u64::from(round));
        assert_eq!(got, pattern(4096, 90 + round), "round {round}");
    }
    let mut writable =
        f.pd.register(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
    assert!(matches!(
        writable.as_mut_slice(),
        Err(Error::RemotelyWritable)
    ));
    assert_eq!(pool.available(), 2);
}

/// A type 2 window may grant `REMOTE_READ` over a region registered without it (the region
/// has `MW_BIND` and no remote right): the bind is accepted, a peer's READ through the window
/// brings back every byte Rust wrote through `as_mut_slice`, and the region keeps handing out
/// `&mut [u8]` while the window is bound (sound: the device only reads it). The region's own
/// key grants nothing.
#[test]
fn a_window_grants_remote_read_over_a_region_without_it() {
    let Some(f) = fixture_with(MwType::Type2) else {
        return;
    };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::REMOTE_READ,
    );
    let mut region =
        f.pd.register(4096, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)
            .unwrap();
    region
        .as_mut_slice()
        .unwrap()
        .copy_from_slice(&pattern(4096, 95));
    let region = Arc::new(region);
    let mut mw = f.pd.alloc_mw(MwType::Type2).unwrap();
    let bind = SendRequest::bind_mw(&mut mw, &region, 1024..3072, AccessFlags::REMOTE_READ)
        .unwrap()
        .tag(1);
    let rkey = bind.rkey();
    b.post_send_owned(bind).unwrap();
    reap_success(&mut cq_b, 1, WcOpcode::BindMw);
    let pool = BufferPool::new(&f.pd, 2, 4096).unwrap();
    let window = RemoteMemory {
        addr: region.addr() + 1024,
        len: 2048,
        rkey,
    };
    assert_eq!(
        read_back(&mut a, &mut cq_a, &pool, window, 2),
        pattern(4096, 95)[1024..3072].to_vec()
    );
    // Rust writes again while the window is bound; a READ after it sees the new bytes.
    let mut region = Arc::try_unwrap(region).expect("the bind's completion released it");
    region
        .as_mut_slice()
        .expect("a window's REMOTE_READ does not make the region shared")
        .copy_from_slice(&pattern(4096, 96));
    assert_eq!(
        read_back(&mut a, &mut cq_a, &pool, window, 3),
        pattern(4096, 96)[1024..3072].to_vec()
    );
    // The region's own key grants no READ: the request fails, and moves `a` to the error
    // state.
    let mut buf = pool.take().unwrap();
    buf.set_len(64).unwrap();
    let own = RemoteMemory {
        addr: region.addr(),
        len: 64,
        rkey: region.rkey(),
    };
    a.post_send_owned(SendRequest::read(buf, own).tag(4))
        .unwrap();
    let done = reap(&mut cq_a, 1);
    assert_eq!(
        (done[0].tag(), done[0].status()),
        (Some(4), WcStatus::RemAccessErr)
    );
    drop(done);
    assert_eq!(pool.available(), 2);
    drop((a, b));
    drop(mw);
}
