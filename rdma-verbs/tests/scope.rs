//! The safe scoped post path on the device: data and completions through `QueuePair::scope`,
//! and what happens to requests still outstanding when a scope ends or panics.

mod common;

use std::time::Duration;

use common::*;
use rdma_verbs::*;

const LOCAL: AccessFlags = AccessFlags::LOCAL_WRITE;

/// Polls the scope until nothing is outstanding; fails the test after [`WAIT`].
fn reap_all<T: Transport>(s: &mut PostScope<'_, '_, T>) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut buf = [WorkCompletion::default(); 8];
    let deadline = std::time::Instant::now() + WAIT;
    while s.outstanding() > 0 {
        out.extend_from_slice(s.poll(&mut buf).expect("poll"));
        assert!(
            std::time::Instant::now() < deadline,
            "completions never came: {out:?}"
        );
    }
    out
}

#[test]
fn scope_send_receive_read_and_atomics() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let rights = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let (mut a, mut b) = f.rc_pair(
        f.pd.create_qp(&cq_a, &cq_a),
        f.pd.create_qp(&cq_b, &cq_b),
        rights,
    );
    let mut src = f.pd.register(256, LOCAL).unwrap();
    src.as_mut_slice()
        .unwrap()
        .copy_from_slice(&pattern(256, 5));
    let mut inbox = f.pd.register(256, LOCAL).unwrap();
    let mut remote_mr =
        f.pd.register(64, AccessFlags::LOCAL_WRITE | rights)
            .unwrap();
    remote_mr.write_at(0, &pattern(64, 9)).unwrap();
    remote_mr.write_at(0, &10u64.to_ne_bytes()).unwrap();
    let remote = remote_mr.remote(..).unwrap();
    let mut results = f.pd.register(64, LOCAL).unwrap();

    {
        let target = inbox.slice_mut(..).unwrap();
        let (read_into, old_value) = {
            let mut chunks = results.chunks_mut(32).unwrap();
            let second = chunks.pop().unwrap();
            (chunks.pop().unwrap(), second)
        };
        b.scope(ScopeCqs::shared(&mut cq_b), |sb| {
            sb.recv(1, &target).unwrap();
            a.scope(ScopeCqs::shared(&mut cq_a), |sa| {
                sa.send(SendRequest::send(2, src.slice(..200).unwrap()))
                    .unwrap();
                sa.read(3, &read_into, remote.slice(8, 24).unwrap())
                    .unwrap();
                sa.fetch_add(4, &old_value, remote.slice(0, 8).unwrap(), 5)
                    .unwrap();
                // Reads and atomics through `send` would let the device write shared memory.
                let refused = sa.send(SendRequest::read(5, src.slice(..8).unwrap(), remote));
                assert!(
                    matches!(refused, Err(Error::InvalidArgument(_))),
                    "{refused:?}"
                );
                let done = reap_all(sa);
                assert_eq!(done.len(), 3);
                assert!(done.iter().all(|wc| wc.is_success()), "{done:?}");
            })
            .unwrap();
            let got = reap_all(sb);
            assert_ok(&got[0], 1, WcOpcode::Recv);
            assert_eq!(got[0].byte_len(), 200);
        })
        .unwrap();
    }
    // The scopes are over: the memory is Rust's again.
    assert_eq!(&inbox.as_slice().unwrap()[..200], &pattern(256, 5)[..200]);
    let results = results.as_slice().unwrap();
    assert_eq!(&results[..24], &pattern(64, 9)[8..32]);
    assert_eq!(u64::from_ne_bytes(results[32..40].try_into().unwrap()), 10);
    assert_eq!(remote_mr.load_u64(0).unwrap(), 15);
}

#[test]
fn scope_that_ends_with_outstanding_requests_flushes_them() {
    let Some(f) = fixture() else { return };
    let (cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (_a, mut b) = f.rc_pair(
        f.pd.create_qp(&cq_a, &cq_a),
        f.pd.create_qp(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let mut inbox = f.pd.register(64, LOCAL).unwrap();
    let target = inbox.slice_mut(..).unwrap();
    let started = std::time::Instant::now();
    // Nobody sends: the receives never complete on their own.
    let result = b.scope(ScopeCqs::shared(&mut cq_b), |s| {
        s.set_drain_timeout(Duration::from_millis(200));
        s.recv(1, &target).unwrap();
        s.recv(2, &target).unwrap();
        assert_eq!(s.outstanding(), 2);
    });
    assert!(
        matches!(
            result,
            Err(Error::Incomplete {
                pending: 2,
                state: QpStateKind::Error
            })
        ),
        "{result:?}"
    );
    assert!(started.elapsed() < WAIT, "the drain is bounded");
    assert_eq!(b.query_state().unwrap(), QpStateKind::Error);
    // `target`'s borrow ends here: the region is Rust's again.
    assert!(inbox.as_mut_slice().is_ok());
}

#[test]
fn scope_that_panics_still_drains_before_unwinding() {
    let Some(f) = fixture() else { return };
    let (cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let (_a, mut b) = f.rc_pair(
        f.pd.create_qp(&cq_a, &cq_a),
        f.pd.create_qp(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let mut inbox = f.pd.register(64, LOCAL).unwrap();
    let target = inbox.slice_mut(..).unwrap();
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = b.scope(ScopeCqs::shared(&mut cq_b), |s| {
            s.set_drain_timeout(Duration::from_millis(100));
            s.recv(7, &target).unwrap();
            panic!("the closure failed with a receive outstanding");
        });
    }));
    assert!(unwound.is_err());
    // The scope flushed the receive before letting the panic through.
    assert_eq!(b.query_state().unwrap(), QpStateKind::Error);
    assert_no_completion(&mut cq_b, Duration::from_millis(50));
}

#[test]
fn scope_refuses_a_queue_pair_on_an_srq() {
    let Some(f) = fixture() else { return };
    let mut cq = f.cq(16);
    let srq = f.pd.create_srq(8, 1).unwrap();
    let qp = f.pd.create_qp::<Rc>(&cq, &cq).srq(&srq).build().unwrap();
    // Connected to itself: only the state matters here.
    let qp = qp
        .into_init(&ConnectedInitAttr::new(f.device.port))
        .unwrap();
    let num = qp.qp_num();
    let mut qp = qp
        .into_rtr(&RcRtrAttr::new(f.av(), num, 0))
        .unwrap()
        .into_rts(&RcRtsAttr::new(0))
        .unwrap();
    let ran = qp.scope(ScopeCqs::shared(&mut cq), |_| ());
    assert!(matches!(ran, Err(Error::InvalidArgument(_))), "{ran:?}");
}
