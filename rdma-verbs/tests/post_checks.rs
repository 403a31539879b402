//! What every post path refuses before the provider sees it, beyond the address handles of
//! `unsafe_surface.rs`: a memory window of another protection domain (of the same context or
//! another), which the provider would read as one of its own structures, and an atomic whose
//! result is not one 8-byte word, which would let the device write past the borrowed range.
//! Each refusal is followed by a control: the same post with the right object works.

use rdma_test_support::verbs::*;
use rdma_verbs::{cq::*, device::*, mr::*, mw::*, scope::*, wr::*, *};

const LOCAL: AccessFlags = AccessFlags::LOCAL_WRITE;
const BINDABLE: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::MW_BIND);

/// The error a refused post must give: `InvalidArgument` naming the protection domain.
fn assert_foreign(result: Result<()>) {
    match result {
        Err(Error::InvalidArgument(reason)) => {
            assert!(reason.contains("protection domain"), "{reason}")
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn binds_refuse_a_window_of_another_domain() {
    let Some(f) = fixture() else { return };
    if !f.has_windows(MwType::Type1) || !f.has_windows(MwType::Type2) {
        return;
    }
    let (mut cq_a, cq_b) = (f.cq(16), f.cq(16));
    let (mut a, _b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::REMOTE_WRITE,
    );
    // Window and region agree with each other, but not with the queue pair.
    let context2 = Context::open(&f.device.name).expect("a second context");
    for (what, pd) in [
        ("another domain", f.context.alloc_pd().unwrap()),
        ("another context", context2.alloc_pd().unwrap()),
    ] {
        eprintln!("window of {what}");
        let region = pd.register(4096, BINDABLE).unwrap();
        let mut type1 = pd.alloc_mw(MwType::Type1).unwrap();
        // SAFETY: refused before posting.
        let bound = unsafe {
            a.bind_mw(
                &mut type1,
                1,
                &region,
                0..4096,
                AccessFlags::REMOTE_WRITE,
                true,
            )
        };
        assert_foreign(bound.map(|_| ()));
        let mut type2 = pd.alloc_mw(MwType::Type2).unwrap();
        let request =
            SendRequest::bind_mw(&mut type2, &region, 0..4096, AccessFlags::REMOTE_WRITE).unwrap();
        // SAFETY: refused before posting.
        assert_foreign(unsafe { a.post_send_one(&request) });
        a.scope(ScopeCqs::shared(&mut cq_a), |s| {
            let request =
                SendRequest::bind_mw(&mut type2, &region, 0..4096, AccessFlags::REMOTE_WRITE)
                    .unwrap();
            assert_foreign(s.send(request));
            assert_eq!(s.outstanding(), 0);
        })
        .unwrap();
    }
    assert_no_completion(&mut cq_a, QUIET);

    // The control: a window of the queue pair's own domain binds.
    let region = f.pd.register(4096, BINDABLE).unwrap();
    let mut own = f.pd.alloc_mw(MwType::Type2).unwrap();
    let old = own.rkey();
    a.scope(ScopeCqs::shared(&mut cq_a), |s| {
        let request = SendRequest::bind_mw(&mut own, &region, 0..4096, AccessFlags::REMOTE_WRITE)
            .unwrap()
            .tag(4);
        s.send(request).unwrap();
        let done = reap_all(s);
        assert_ok(&done[0], 4, WcOpcode::BindMw);
    })
    .unwrap();
    assert_ne!(own.rkey(), old, "the bind gave the window a new key");
}

#[test]
fn atomics_refuse_a_result_that_is_not_one_word() {
    let Some(f) = fixture() else { return };
    let rights = AccessFlags::REMOTE_ATOMIC;
    let (mut cq_a, cq_b) = (f.cq(16), f.cq(16));
    let (mut a, _b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        rights,
    );
    let mut counter = f.pd.register(8, LOCAL | rights).unwrap();
    counter.write_at(0, &41u64.to_ne_bytes()).unwrap();
    let remote = counter.remote(..).unwrap();
    let mut results = f.pd.register(32, LOCAL).unwrap();
    results.as_mut_slice().unwrap().fill(0xee);

    for len in [4u32, 16] {
        let short = results.slice(..len as usize).unwrap();
        let add = SendRequest::fetch_add(short, remote, 1).tag(1);
        let swap = SendRequest::compare_swap(short, remote, 41, 0).tag(2);
        for request in [add, swap] {
            // SAFETY: refused before posting.
            match unsafe { a.post_send_one(&request) } {
                Err(Error::InvalidArgument(reason)) => assert!(reason.contains("8-byte")),
                other => panic!("{len}-byte result: {other:?}"),
            }
        }
        let mut list = SendList::with_capacity(1);
        let pushed = list.push(SendRequest::fetch_add(short, remote, 1).tag(3));
        assert!(
            matches!(pushed, Err(Error::InvalidArgument(_))),
            "{pushed:?}"
        );
    }
    // A READ cannot land in inline bytes (the device writes its target): refused when
    // posted, alone or in a list.
    let inline = [0u8; 8];
    let into_inline = SendRequest::read(Payload::Inline(&inline), remote).tag(6);
    // SAFETY: refused before posting.
    let posted = unsafe { a.post_send_one(&into_inline) };
    assert!(
        matches!(posted, Err(Error::InvalidArgument(_))),
        "{posted:?}"
    );
    let mut list = SendList::with_capacity(1);
    list.push(into_inline).unwrap();
    // SAFETY: refused before posting.
    let posted = unsafe { a.post_send(&mut list) };
    assert!(
        matches!(posted, Err(Error::InvalidArgument(_))),
        "{posted:?}"
    );
    {
        let mut words = results.chunks_mut(16).unwrap();
        let (wide, _) = (words.remove(0), words);
        a.scope(ScopeCqs::shared(&mut cq_a), |s| {
            let refused = s.fetch_add(4, &wide, remote, 1);
            assert!(
                matches!(refused, Err(Error::InvalidArgument(_))),
                "{refused:?}"
            );
            assert_eq!(s.outstanding(), 0);
        })
        .unwrap();
    }
    assert_no_completion(&mut cq_a, QUIET);
    // Neither word moved: the counter and every result byte are as they were.
    assert_eq!(counter.load_u64(0).unwrap(), 41);
    assert!(results.as_slice().unwrap().iter().all(|&b| b == 0xee));

    // The control: an 8-byte result gets the old value.
    {
        let word = results.slice_mut(8..16).unwrap();
        a.scope(ScopeCqs::shared(&mut cq_a), |s| {
            s.fetch_add(5, &word, remote, 1).unwrap();
            assert_ok(&reap_all(s)[0], 5, WcOpcode::FetchAdd);
        })
        .unwrap();
    }
    let bytes = results.as_slice().unwrap();
    assert_eq!(u64::from_ne_bytes(bytes[8..16].try_into().unwrap()), 41);
    assert!(bytes[..8].iter().chain(&bytes[16..]).all(|&b| b == 0xee));
    assert_eq!(counter.load_u64(0).unwrap(), 42);
}

/// A window stays bound after its bind, and a region with a window bound cannot be
/// deregistered: memory promised by `register_raw` could then be freed by its owner while a
/// peer still writes it through the window. Binds to such regions are refused, of both types;
/// the same bind to a region that owns its memory works.
#[test]
fn binds_refuse_a_region_over_caller_memory() {
    let Some(f) = fixture() else { return };
    if !f.has_windows(MwType::Type1) || !f.has_windows(MwType::Type2) {
        return;
    }
    let (mut cq_a, cq_b) = (f.cq(16), f.cq(16));
    let (mut a, _b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::REMOTE_WRITE,
    );
    let mut memory = vec![0u8; 4096].into_boxed_slice();
    let addr = std::ptr::NonNull::new(memory.as_mut_ptr()).unwrap();
    // SAFETY: `memory` outlives the region (dropped at the end of the test, after it) and is
    // not touched through references while the region lives.
    let external = unsafe { f.pd.register_raw(addr, 4096, BINDABLE) }.unwrap();
    let refused = |result: Result<()>| match result {
        Err(Error::InvalidArgument(reason)) => assert!(reason.contains("register_raw"), "{reason}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    let mut type1 = f.pd.alloc_mw(MwType::Type1).unwrap();
    // SAFETY: refused before posting.
    refused(
        unsafe {
            a.bind_mw(
                &mut type1,
                1,
                &external,
                0..4096,
                AccessFlags::REMOTE_WRITE,
                true,
            )
        }
        .map(|_| ()),
    );
    let mut type2 = f.pd.alloc_mw(MwType::Type2).unwrap();
    refused(
        SendRequest::bind_mw(&mut type2, &external, 0..4096, AccessFlags::REMOTE_WRITE).map(|_| ()),
    );
    assert_no_completion(&mut cq_a, QUIET);

    // The control: the same type 1 bind to a region that owns its memory.
    let owned = f.pd.register(4096, BINDABLE).unwrap();
    let old = type1.rkey();
    // SAFETY: `owned` outlives the bind's completion, polled below.
    let rkey = unsafe {
        a.bind_mw(
            &mut type1,
            3,
            &owned,
            0..4096,
            AccessFlags::REMOTE_WRITE,
            true,
        )
    }
    .unwrap();
    assert_ok(&wait_for(&mut cq_a, 1)[0], 3, WcOpcode::BindMw);
    assert_ne!(rkey, old);
    drop(type1);
    drop(type2);
    drop(owned);
    drop(external);
    drop(memory);
}
