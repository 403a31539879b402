//! Unreliable datagram on the device: sends through address handles, the GRH in front of every
//! received datagram, replies through an address handle made from a completion, and what a UD
//! queue pair refuses or drops.

use rdma_test_support::verbs::*;
use rdma_verbs::ah::StaticRate;
use rdma_verbs::{ah::*, cq::*, device::*, mr::*, wr::*, *};

const LOCAL: AccessFlags = AccessFlags::LOCAL_WRITE;
const QKEY: u32 = 0x1111_1111;
const SIZE: usize = 512;

#[test]
fn ud_send_with_grh_and_reply_through_ah_from_wc() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let mut a = f.ud_qp(f.pd.qp_builder(&cq_a, &cq_a), QKEY);
    let mut b = f.ud_qp(f.pd.qp_builder(&cq_b, &cq_b), QKEY);
    let ah = f.pd.create_ah(&f.av()).expect("ibv_create_ah");

    let mut src = f.pd.register(SIZE, LOCAL).unwrap();
    let data = pattern(SIZE, 5);
    src.as_mut_slice().unwrap().copy_from_slice(&data);
    let dst = f.pd.register(SIZE + GRH_LEN, LOCAL).unwrap();
    // SAFETY: both buffers live until the completions are polled below and are not touched.
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
    assert_ok(&wait_for(&mut cq_a, 1)[0], 2, WcOpcode::Send);
    let wc = wait_for(&mut cq_b, 1)[0];
    assert_ok(&wc, 1, WcOpcode::Recv);
    assert!(wc.flags().contains(WcFlags::GRH), "{wc:?} {:?}", wc.flags());
    assert_eq!(wc.byte_len() as usize, SIZE + GRH_LEN, "{wc:?}");
    assert_eq!(wc.src_qp(), a.qp_num(), "{wc:?}");
    assert_eq!(wc.qp_num(), b.qp_num(), "{wc:?}");
    let received = dst.as_slice().unwrap();
    assert_eq!(&received[GRH_LEN..], &data[..], "payload after the GRH");
    let grh: [u8; GRH_LEN] = received[..GRH_LEN].try_into().unwrap();
    assert_grh(&grh, Gid(f.device.gid));

    // The path back, as a vector: the sender's GID (this port's own, looped back) from the
    // local GID entry that matches the datagram's destination, on this port.
    let path = AddressVector::from_completion(&f.context, f.device.port, &wc, &grh)
        .expect("ibv_init_ah_from_wc");
    assert_eq!(path.port, f.device.port, "{path:?}");
    assert_eq!(path.static_rate, StaticRate::PORT, "{path:?}");
    if f.device.is_ethernet {
        let route = path.grh.expect("a RoCE path is global");
        assert_eq!(route.dgid, Gid(f.device.gid), "{path:?}");
        assert_eq!(u32::from(route.sgid_index), f.device.gid_index, "{path:?}");
    }
    // What has no path back is refused with libibverbs' errno: a multicast destination
    // (IPv4 class D, or an IPv6-style GID starting 0xff), and a header of no IP version.
    if f.device.is_ethernet {
        let mut multicast = grh;
        match Gid(f.device.gid).ipv4() {
            Some(_) => multicast[36] = 224,
            None => multicast[24] = 0xff,
        }
        let refused = |grh: &[u8; GRH_LEN]| {
            AddressVector::from_completion(&f.context, f.device.port, &wc, grh).map(|_| ())
        };
        let refusal = |result: Result<()>| match result {
            Err(Error::Verb { verb, errno }) => (verb, errno.raw()),
            other => panic!("{other:?}"),
        };
        let verb = "ibv_init_ah_from_wc";
        assert_eq!(refusal(refused(&multicast)), (verb, libc::EINVAL));
        assert_eq!(
            refusal(refused(&[0; GRH_LEN])),
            (verb, libc::EPROTONOSUPPORT)
        );
    }

    // Reply to whoever sent that, knowing nothing but the completion and the GRH.
    let back =
        f.pd.create_ah_from_wc(f.device.port, &wc, &grh)
            .expect("ibv_create_ah_from_wc");
    let mut reply = f.pd.register(64, LOCAL).unwrap();
    let reply_data = pattern(64, 200);
    reply.as_mut_slice().unwrap().copy_from_slice(&reply_data);
    let answer = f.pd.register(64 + GRH_LEN, LOCAL).unwrap();
    // SAFETY: as above.
    unsafe {
        a.post_recv_one(&RecvRequest::new(answer.slice(..).unwrap()).tag(3))
            .unwrap();
        b.post_send_one(
            &SendRequest::send(reply.slice(..).unwrap())
                .tag(4)
                .with_imm(0x0bad_cafe)
                .to(&back, wc.src_qp(), QKEY),
        )
        .unwrap();
    }
    assert_ok(&wait_for(&mut cq_b, 1)[0], 4, WcOpcode::Send);
    let wc = wait_for(&mut cq_a, 1)[0];
    assert_ok(&wc, 3, WcOpcode::Recv);
    assert!(wc.flags().contains(WcFlags::GRH), "{wc:?}");
    assert_eq!(wc.src_qp(), b.qp_num(), "{wc:?}");
    assert_eq!(wc.imm_data(), Some(0x0bad_cafe), "{wc:?}");
    assert_eq!(wc.byte_len() as usize, 64 + GRH_LEN, "{wc:?}");
    let received = answer.as_slice().unwrap();
    assert_eq!(&received[GRH_LEN..], &reply_data[..]);
    assert_grh(&received[..GRH_LEN].try_into().unwrap(), Gid(f.device.gid));
}

#[test]
fn ud_send_without_destination_is_refused() {
    let Some(f) = fixture() else { return };
    let mut cq = f.cq(16);
    let mut qp = f.ud_qp(f.pd.qp_builder(&cq, &cq), QKEY);
    let ah = f.pd.create_ah(&f.av()).unwrap();
    let src = f.pd.register(64, LOCAL).unwrap();

    // SAFETY: refused before anything reaches the device.
    let one = unsafe { qp.post_send_one(&SendRequest::send(src.slice(..).unwrap()).tag(1)) };
    assert!(matches!(one, Err(Error::InvalidArgument(_))), "{one:?}");

    // In a list, one request without a destination refuses the whole list.
    let mut list = SendList::with_capacity(2);
    list.push(
        SendRequest::send(src.slice(..).unwrap())
            .tag(2)
            .to(&ah, qp.qp_num(), QKEY),
    )
    .unwrap();
    list.push(SendRequest::send(src.slice(..).unwrap()).tag(3))
        .unwrap();
    // SAFETY: as above.
    let listed = unsafe { qp.post_send(&mut list) };
    assert!(
        matches!(listed, Err(Error::InvalidArgument(_))),
        "{listed:?}"
    );
    // Nothing was posted, not even the addressed first request: the first completion is the
    // one of the request posted below (a send queue completes in order).

    // UD has no RDMA: a write is refused too (one with a destination does not compile).
    let remote = RemoteMemory {
        addr: 0,
        len: 64,
        rkey: 1,
    };
    // SAFETY: as above.
    let write =
        unsafe { qp.post_send_one(&SendRequest::write(src.slice(..).unwrap(), remote).tag(4)) };
    assert!(matches!(write, Err(Error::InvalidArgument(_))), "{write:?}");

    // The queue pair still works: the same addressed request alone goes out.
    // SAFETY: `src` outlives the polled completion.
    unsafe {
        qp.post_send_one(&SendRequest::send(src.slice(..).unwrap()).tag(5).to(
            &ah,
            qp.qp_num(),
            QKEY,
        ))
        .unwrap();
    }
    assert_ok(&wait_for(&mut cq, 1)[0], 5, WcOpcode::Send);
    assert_cq_empty(&mut cq);
}

#[test]
fn ud_wrong_qkey_is_dropped_but_the_send_succeeds() {
    let Some(f) = fixture() else { return };
    let (mut cq_a, mut cq_b) = (f.cq(16), f.cq(16));
    let mut a = f.ud_qp(f.pd.qp_builder(&cq_a, &cq_a), QKEY);
    let mut b = f.ud_qp(f.pd.qp_builder(&cq_b, &cq_b), QKEY);
    let ah = f.pd.create_ah(&f.av()).unwrap();
    let mut src = f.pd.register(128, LOCAL).unwrap();
    let dst = f.pd.register(128 + GRH_LEN, LOCAL).unwrap();
    src.as_mut_slice().unwrap()[..64].copy_from_slice(&pattern(64, 1));
    src.as_mut_slice().unwrap()[64..].copy_from_slice(&pattern(64, 2));

    // SAFETY: buffers live until the completions are polled and are not touched before.
    unsafe {
        b.post_recv_one(&RecvRequest::new(dst.slice(..).unwrap()).tag(1))
            .unwrap();
        a.post_send_one(&SendRequest::send(src.slice(..64).unwrap()).tag(2).to(
            &ah,
            b.qp_num(),
            0x2222_2222,
        ))
        .unwrap();
    }
    // Unreliable: the sender learns nothing of the drop.
    assert_ok(&wait_for(&mut cq_a, 1)[0], 2, WcOpcode::Send);
    // Nothing arrived: the receive must still be posted, and take the next datagram (checked
    // below by its data: had the dropped one been taken, the receive would hold pattern 1).

    // The receive is still posted: a datagram with the right Q_Key takes it.
    // SAFETY: as above.
    unsafe {
        a.post_send_one(&SendRequest::send(src.slice(64..).unwrap()).tag(3).to(
            &ah,
            b.qp_num(),
            QKEY,
        ))
        .unwrap();
    }
    assert_ok(&wait_for(&mut cq_a, 1)[0], 3, WcOpcode::Send);
    let wc = wait_for(&mut cq_b, 1)[0];
    assert_ok(&wc, 1, WcOpcode::Recv);
    assert_eq!(wc.byte_len() as usize, 64 + GRH_LEN);
    assert_eq!(
        &dst.as_slice().unwrap()[GRH_LEN..GRH_LEN + 64],
        &pattern(64, 2)[..],
        "the datagram with the right Q_Key"
    );
}
