//! `close()`: every verbs object can be destroyed with the failure reported instead of
//! swallowed by `Drop`. While something still holds an object, `close` answers `EBUSY` without
//! calling the verb and hands the object back, still usable; a real provider refusal (rxe will
//! not deregister a region a window is bound to) comes back the same way; in the right order
//! everything closes, and owned buffers still posted are released.

use rdma_test_support::verbs::*;
use rdma_verbs::{cq::*, device::*, mr::*, mw::*, owned::*, qp::*, *};

fn assert_busy<T>(result: Result<(), (T, Error)>, verb: &str) -> T {
    match result {
        Err((object, Error::Verb { verb: v, errno })) if v == verb && errno == Errno::BUSY => {
            object
        }
        Err((_, other)) => panic!("{verb}: expected EBUSY, got {other}"),
        Ok(()) => panic!("{verb}: closed while still in use"),
    }
}

fn closed<T>(result: Result<(), (T, Error)>, what: &str) {
    if let Err((_, error)) = result {
        panic!("{what}: {error}");
    }
}

/// Everything in use answers `EBUSY` and stays usable; closed leaves first, everything closes.
#[test]
fn close_refuses_what_is_still_used_and_closes_in_order() {
    let Some(f) = fixture() else { return };
    let context = Context::open(&f.device.name).unwrap();
    let pd = context.alloc_pd().unwrap();
    let channel = context.create_comp_channel().unwrap();
    let mut cq = context.cq_builder(16).channel(&channel).build().unwrap();
    let srq = pd.create_srq(4, 1).unwrap();
    let qp = pd.qp_builder::<Rc>(&cq, &cq).srq(&srq).build().unwrap();
    let pool = BufferPool::new(&pd, 2, 64).unwrap();

    let context = assert_busy(context.close(), "ibv_close_device").expect("handed back, open");
    let pd = assert_busy(pd.close(), "ibv_dealloc_pd");
    let channel = assert_busy(channel.close(), "ibv_destroy_comp_channel");
    let cq2 = assert_busy(cq.close(), "ibv_destroy_cq");
    let mut srq = assert_busy(srq.close(), "ibv_destroy_srq");

    // What was handed back still works: the SRQ takes a receive, the CQ polls.
    srq.post_recv_buf(pool.take().unwrap(), 7).unwrap();
    cq = cq2;
    let mut wcs = [WorkCompletion::default(); 1];
    assert!(cq.poll(&mut wcs).unwrap().is_empty());

    closed(qp.close(), "the queue pair");
    closed(cq.close(), "the CQ, once its queue pair is gone");
    closed(channel.close(), "the channel, once its CQ is gone");
    // Closing the SRQ releases the receive still posted to it.
    assert_eq!(pool.available(), 1);
    closed(srq.close(), "the SRQ");
    assert_eq!(pool.available(), 2);
    let pd = assert_busy(pd.close(), "ibv_dealloc_pd");
    drop(pool);
    closed(pd.close(), "the PD, once its pool is gone");
    closed(context.close(), "the context, last");
}

/// A buffer pool: `EBUSY` while a buffer is out (held, or posted), then closed.
#[test]
fn close_buffer_pool_after_its_buffers() {
    let Some(f) = fixture() else { return };
    let pool = BufferPool::new(&f.pd, 2, 64).unwrap();
    let buf = pool.take().unwrap();
    let pool = assert_busy(pool.close(), "ibv_dereg_mr");
    // Still a pool: the other buffer can be taken.
    assert_eq!(pool.available(), 1);
    drop(buf);
    closed(pool.close(), "the pool, once its buffers are back");
}

/// An address handle: `EBUSY` while another clone exists, then closed.
#[test]
fn close_address_handle_after_its_clones() {
    let Some(f) = fixture() else { return };
    let ah = f.pd.create_ah(&f.av()).unwrap();
    let clone = ah.clone();
    let ah = assert_busy(ah.close(), "ibv_destroy_ah");
    drop(clone);
    closed(ah.close(), "the address handle");
}

/// A provider refusal: rxe does not deregister a region while a type 1 window is bound to it.
/// `close` reports it and hands the region back, registered: a write through its key still
/// lands. Once the window is closed, the region closes.
#[test]
fn close_region_refused_while_a_window_is_bound() {
    let Some(f) = fixture() else { return };
    if !f.context.query_device().unwrap().supports_mw_type1() {
        assert!(f.is_rxe(), "windows are expected on rxe");
        return;
    }
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::REMOTE_WRITE,
    );
    let target =
        f.pd.register(
            4096,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::MW_BIND,
        )
        .unwrap();
    let mut mw = f.pd.alloc_mw(MwType::Type1).unwrap();
    // SAFETY: `target` outlives the bind's completion, polled below.
    unsafe {
        b.bind_mw(
            &mut mw,
            1,
            &target,
            0..4096,
            AccessFlags::REMOTE_WRITE,
            true,
        )
    }
    .unwrap();
    assert_ok(&wait_for(&mut cq_b, 1)[0], 1, WcOpcode::BindMw);

    let target = match target.close() {
        Err((target, Error::Verb { verb, errno })) => {
            assert_eq!(verb, "ibv_dereg_mr");
            note(&format!("ibv_dereg_mr with a window bound: {errno}"));
            target
        }
        Err((_, other)) => panic!("unexpected error {other}"),
        Ok(()) => {
            assert!(!f.is_rxe(), "rxe deregistered a region with a bound window");
            return;
        }
    };
    // Still registered: an RDMA WRITE through the region's own key lands, byte for byte.
    let source = f.pd.register(64, AccessFlags::LOCAL_WRITE).unwrap();
    let mut source = source;
    source.write_at(0, &pattern(64, 41)).unwrap();
    write(&mut a, 2, &source, target.remote(..64).unwrap());
    assert_ok(&wait_for(&mut cq_a, 1)[0], 2, WcOpcode::RdmaWrite);
    let mut landed = vec![0; 64];
    target.read_at(0, &mut landed).unwrap();
    assert_eq!(landed, pattern(64, 41));

    closed(mw.close(), "the window");
    closed(target.close(), "the region, once the window is gone");
}
