//! Extended completion queues on the device: poll sessions read the fields asked for at
//! creation (checked against the bytes and the classic completion's values), read several
//! completions in one session and none twice, end on every way out (a panic included) and
//! refuse to destroy or reset a queue pair of the queue from inside; the fields and calls
//! Soft-RoCE lacks are refused with its exact error.

use rdma_test_support::verbs::*;
use rdma_verbs::{ah::*, cq::*, mr::*, qp::*, wr::*, *};

const LOCAL: AccessFlags = AccessFlags::LOCAL_WRITE;

/// What a session read of one completion.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    wr_id: u64,
    status: WcStatus,
    opcode: WcOpcode,
    byte_len: Option<u32>,
    imm: Option<u32>,
    qp_num: Option<u32>,
}

/// Reads completions in sessions until `want` arrived (`poll_extended_for`, 10 s at most),
/// checking that the accessors answer for the queue's fields only.
fn drain(cq: &mut CompletionQueue, want: usize) -> Vec<Seen> {
    let reports_slid = cq.fields().is_some_and(|f| f.contains(WcFields::SLID));
    let mut seen = Vec::new();
    let read = cq
        .poll_extended_for(want, WAIT, |c| {
            assert_eq!(c.slid().is_some(), reports_slid, "only if asked for");
            seen.push(Seen {
                wr_id: c.wr_id(),
                status: c.status(),
                opcode: c.opcode(),
                byte_len: c.byte_len(),
                imm: c.imm_data(),
                qp_num: c.qp_num(),
            });
        })
        .expect("ibv_start_poll");
    assert_eq!(read, want, "only {seen:?} of {want}");
    assert_eq!(seen.len(), want);
    seen
}

/// A SEND with immediate and two plain ones between RC queue pairs whose queues are extended:
/// the receiver's session reads the byte counts, immediate data and queue pair number, the
/// sender's reads its three completions in one session, and nothing is read twice: a later
/// completion is the next one read, and the classic poll finds the queue empty.
#[test]
fn an_extended_queue_reads_the_fields_asked_for_once_each() {
    let Some(f) = fixture() else { return };
    let fields = WcFields::BYTE_LEN | WcFields::IMM | WcFields::QP_NUM;
    let mut cq_a = f.context.cq_builder(16).extended(fields).build().unwrap();
    let mut cq_b = f.context.cq_builder(16).extended(fields).build().unwrap();
    assert_eq!(cq_a.fields(), Some(fields));
    assert_eq!(f.cq(4).fields(), None);
    let (mut a, mut b) = f.rc_pair(
        f.pd.qp_builder(&cq_a, &cq_a),
        f.pd.qp_builder(&cq_b, &cq_b),
        AccessFlags::empty(),
    );
    let mut src = f.pd.register(4096, LOCAL).unwrap();
    let dst = f.pd.register(3 * 1024, LOCAL).unwrap();
    let data = pattern(3 * 1024, 9);
    src.as_mut_slice().unwrap()[..3 * 1024].copy_from_slice(&data);
    let lens = [1000u32, 24, 1024];
    // SAFETY: the buffers live until the completions are read below and are not touched.
    unsafe {
        for (i, _) in lens.iter().enumerate() {
            let at = i * 1024;
            b.post_recv_one(
                &RecvRequest::new(dst.slice(at..at + 1024).unwrap()).tag(10 + i as u64),
            )
            .unwrap();
        }
        for (i, &len) in lens.iter().enumerate() {
            let at = i * 1024;
            let send =
                SendRequest::send(src.slice(at..at + len as usize).unwrap()).tag(20 + i as u64);
            let send = if i == 0 {
                send.with_imm(0x1234_5678)
            } else {
                send
            };
            a.post_send_one(&send).unwrap();
        }
    }
    let sent = drain(&mut cq_a, 3);
    // (A send completion's byte count and flags, so its immediate data, are not defined:
    // Soft-RoCE reports the SEND with immediate's flag on the sender too. Not compared.)
    let want_sent: Vec<Seen> = (0..3)
        .map(|i| Seen {
            wr_id: 20 + i,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: sent[i as usize].byte_len,
            imm: sent[i as usize].imm,
            qp_num: Some(a.qp_num()),
        })
        .collect();
    assert_eq!(sent, want_sent);
    let received = drain(&mut cq_b, 3);
    let want_received: Vec<Seen> = lens
        .iter()
        .enumerate()
        .map(|(i, &len)| Seen {
            wr_id: 10 + i as u64,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: Some(len),
            imm: (i == 0).then_some(0x1234_5678),
            qp_num: Some(b.qp_num()),
        })
        .collect();
    assert_eq!(received, want_received);
    for (i, &len) in lens.iter().enumerate() {
        let at = i * 1024;
        let got = &dst.as_slice().unwrap()[at..at + len as usize];
        assert_eq!(got, &data[at..at + len as usize], "message {i}");
    }
    let mut wcs = [WorkCompletion::default(); 4];
    assert!(
        cq_a.poll(&mut wcs).unwrap().is_empty(),
        "nothing read twice"
    );
    assert!(
        cq_b.poll(&mut wcs).unwrap().is_empty(),
        "nothing read twice"
    );

    // A completion after the sessions is the next one read, by either kind of poll.
    // SAFETY: as above.
    unsafe {
        b.post_recv_one(&RecvRequest::new(dst.slice(..8).unwrap()).tag(31))
            .unwrap();
        b.post_recv_one(&RecvRequest::new(dst.slice(8..16).unwrap()).tag(33))
            .unwrap();
        a.post_send_one(&SendRequest::send(src.slice(..8).unwrap()).tag(30))
            .unwrap();
        a.post_send_one(&SendRequest::send(src.slice(..8).unwrap()).tag(32))
            .unwrap();
    }
    let next = drain(&mut cq_a, 2);
    assert_eq!(
        next.iter().map(|s| s.wr_id).collect::<Vec<_>>(),
        [30, 32],
        "{next:?}"
    );
    let classic = wait_for(&mut cq_b, 2);
    assert_ok(&classic[0], 31, WcOpcode::Recv);
    assert_ok(&classic[1], 33, WcOpcode::Recv);
    assert_eq!((classic[0].byte_len(), classic[1].byte_len()), (8, 8));
}

/// A session reads at most the number asked for and leaves the rest; a panic in the caller's
/// function ends the session (the completion it was on counts as read) and the next poll of
/// either kind goes on from there; destroying or resetting one of the queue's queue pairs from
/// inside a session is refused with `EBUSY` (on mlx5 it would wait forever on the queue's
/// lock), and the queue pair is still usable after.
#[test]
fn sessions_end_on_every_way_out() {
    let Some(f) = fixture() else { return };
    let mut cq = f
        .context
        .cq_builder(16)
        .extended(WcFields::STANDARD)
        .build()
        .unwrap();
    let (a, b) = f.rc_pair(
        f.pd.qp_builder(&cq, &cq),
        f.pd.qp_builder(&cq, &cq),
        AccessFlags::REMOTE_WRITE,
    );
    let (mut a, mut b) = (Some(a), Some(b));
    let src = f.pd.register(64, LOCAL).unwrap();
    let remote =
        f.pd.register(64, LOCAL | AccessFlags::REMOTE_WRITE)
            .unwrap();
    let post = |a: &mut QueuePair<Rc, Rts>, ids: std::ops::Range<u64>| {
        for id in ids {
            // SAFETY: the buffers live until the completions are read below.
            unsafe {
                a.post_send_one(
                    &SendRequest::write(src.slice(..64).unwrap(), remote.remote(..).unwrap())
                        .tag(id),
                )
                .unwrap();
            }
        }
    };
    post(a.as_mut().unwrap(), 0..4);
    let first = drain(&mut cq, 1);
    assert_eq!(first[0].wr_id, 0);
    assert_eq!(
        drain(&mut cq, 3)
            .iter()
            .map(|s| s.wr_id)
            .collect::<Vec<_>>(),
        [1, 2, 3],
        "one at a time, in order"
    );

    post(a.as_mut().unwrap(), 10..13);
    let _ = drain_classic_after_panic(&mut cq);
    let mut wcs = [WorkCompletion::default(); 4];
    let rest = cq
        .poll_for(&mut wcs, 2, std::time::Duration::from_secs(10))
        .unwrap();
    assert_eq!(
        rest.iter().map(|wc| wc.wr_id()).collect::<Vec<_>>(),
        [11, 12],
        "the completion the panic was on is read; the next ones follow"
    );

    post(a.as_mut().unwrap(), 20..21);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut refused = None;
    while refused.is_none() {
        assert!(std::time::Instant::now() < deadline, "no completion");
        cq.poll_extended(1, |_| {
            let qp = a.take().unwrap();
            refused = Some(match qp.close() {
                Err((qp, Error::Verb { verb, errno })) => {
                    a = Some(qp);
                    (verb, errno.raw())
                }
                other => panic!("{other:?}"),
            });
            let qp = b.take().unwrap();
            match qp.into_reset() {
                Err(e) => {
                    assert!(
                        matches!(e.error(), Error::ModifyQp { errno, .. } if errno.raw() == libc::EBUSY),
                        "{e}"
                    );
                    b = Some(e.into_qp());
                }
                Ok(_) => panic!("a reset inside a session"),
            }
        })
        .unwrap();
    }
    assert_eq!(refused, Some(("ibv_destroy_qp", libc::EBUSY)));
    // Outside the session both work again.
    post(a.as_mut().unwrap(), 30..31);
    assert_eq!(drain(&mut cq, 1)[0].wr_id, 30);
    a.take().unwrap().close().map_err(|(_, e)| e).unwrap();
    drop(
        b.take()
            .unwrap()
            .into_reset()
            .map_err(|e| e.into_parts().1)
            .unwrap(),
    );
}

/// Reads one completion in a session whose function panics; the panic is caught.
fn drain_classic_after_panic(cq: &mut CompletionQueue) -> u64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        assert!(std::time::Instant::now() < deadline, "no completion");
        let mut id = None;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            cq.poll_extended(4, |c| {
                id = Some(c.wr_id());
                panic!("the caller's function fails");
            })
        }));
        if let Some(id) = id {
            assert!(result.is_err(), "the panic came through");
            assert_eq!(id, 10);
            return id;
        }
    }
}

/// What Soft-RoCE's extended queues cannot report is refused at creation with
/// `EOPNOTSUPP`; it has no readable clock and no moderation; a classic queue has no sessions.
#[test]
fn fields_and_calls_soft_roce_lacks_are_refused() {
    let Some(f) = fixture() else { return };
    let refused = |result: Result<()>, verb: &'static str| {
        if f.is_rxe() {
            match result {
                Err(error @ Error::Unsupported(v)) => {
                    assert_eq!(v, verb);
                    assert_eq!(error.errno(), Some(Errno::OPNOTSUPP));
                }
                other => panic!("{verb}: {other:?}"),
            }
        } else {
            note(&format!("not Soft-RoCE: {verb}: {result:?}"));
        }
    };
    for field in [
        WcFields::COMPLETION_TIMESTAMP,
        WcFields::COMPLETION_TIMESTAMP_WALLCLOCK,
        WcFields::CVLAN,
        WcFields::FLOW_TAG,
        WcFields::TM_INFO,
    ] {
        let built = f.context.cq_builder(4).extended(field).build();
        refused(built.map(drop), "ibv_create_cq_ex");
    }
    refused(f.context.raw_clock().map(drop), "ibv_query_rt_values_ex");
    let mut classic = f.cq(4);
    refused(classic.set_moderation(16, 10), "ibv_modify_cq");
    assert!(matches!(
        classic.poll_extended(1, |_| {}),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        classic.poll_extended_for(1, WAIT, |_| {}),
        Err(Error::InvalidArgument(_))
    ));
    // An empty extended queue has no session to start.
    let mut cq = f
        .context
        .cq_builder(4)
        .extended(WcFields::STANDARD)
        .build()
        .unwrap();
    assert_eq!(cq.poll_extended(8, |_| panic!("no completion")).unwrap(), 0);
    // The bounded wait gives up once its time is up, having read nothing; asked for none, it
    // returns at once.
    let quiet = std::time::Duration::from_millis(50);
    let start = std::time::Instant::now();
    let read = cq.poll_extended_for(1, quiet, |_| panic!("no completion"));
    assert_eq!(read.unwrap(), 0);
    assert!(start.elapsed() >= quiet);
    assert_eq!(
        cq.poll_extended_for(0, WAIT, |_| panic!("none asked for"))
            .unwrap(),
        0
    );
}

/// A UD receive read in a session names its sender: source queue pair, LID (the port's, 0 on
/// RoCE), service level 0, no path bits, and a GRH in front of the datagram.
#[test]
fn a_ud_receive_read_in_a_session_names_its_sender() {
    let Some(f) = fixture() else { return };
    const QKEY: u32 = 0x2222_2222;
    let mut cq = f
        .context
        .cq_builder(16)
        .extended(WcFields::STANDARD)
        .build()
        .unwrap();
    let mut a = f.ud_qp(f.pd.qp_builder(&cq, &cq), QKEY);
    let mut b = f.ud_qp(f.pd.qp_builder(&cq, &cq), QKEY);
    let ah = f.pd.create_ah(&f.av()).unwrap();
    let mut src = f.pd.register(256, LOCAL).unwrap();
    let data = pattern(256, 3);
    src.as_mut_slice().unwrap().copy_from_slice(&data);
    let dst = f.pd.register(256 + GRH_LEN, LOCAL).unwrap();
    // SAFETY: the buffers live until the completions are read below and are not touched.
    unsafe {
        b.post_recv_one(&RecvRequest::new(dst.slice(..).unwrap()).tag(1))
            .unwrap();
        a.post_send_one(&SendRequest::send(src.slice(..).unwrap()).tag(2).to(
            &ah,
            b.qp_num(),
            QKEY,
        ))
        .unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut found = Vec::new();
    while found.len() < 2 {
        assert!(std::time::Instant::now() < deadline, "only {found:?}");
        cq.poll_extended(2, |c| {
            assert_eq!(c.status(), WcStatus::Success, "{c:?}");
            if c.wr_id() == 1 {
                assert_eq!(c.opcode(), WcOpcode::Recv);
                assert_eq!(c.byte_len(), Some(256 + GRH_LEN as u32));
                assert_eq!(c.src_qp(), Some(a.qp_num()));
                assert_eq!(c.qp_num(), Some(b.qp_num()));
                assert_eq!(c.slid(), Some(u32::from(f.device.lid)));
                assert_eq!(c.sl(), Some(0));
                assert_eq!(c.dlid_path_bits(), Some(0));
                assert!(c.wc_flags().contains(WcFlags::GRH), "{c:?}");
            } else {
                assert_eq!((c.wr_id(), c.opcode()), (2, WcOpcode::Send));
            }
            found.push(c.wr_id());
        })
        .unwrap();
    }
    found.sort_unstable();
    assert_eq!(found, [1, 2]);
    assert_eq!(&dst.as_slice().unwrap()[GRH_LEN..], &data[..]);
}
