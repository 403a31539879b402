//! UD over the connection manager on the device: a SIDR connect, the `Established` event's
//! queue pair, Q_Key and path, datagrams both ways with every byte checked; what a UD connect
//! to nobody, and the UD calls on an RC identifier, give.

use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::thread;

use rdma_cm::rdma_verbs::{device::Gid, qp::Ud};
use rdma_cm::{CmId, ConnParam, Error, EventChannel, EventKind, PortSpace};
use rdma_test_support::cm::ud::*;
use rdma_test_support::cm::*;

/// The client resolves, readies its UD queue pair, connects (SIDR) with private data; the
/// server accepts with its own; the client's `Established` names the server's queue pair, the
/// UDP port space's Q_Key and a path to the server's address. Then 8 datagrams each way (the
/// server answers through an address handle made from the first completion and the queue
/// pair number in the immediate data, as the C `udaddy` server does), every byte checked.
/// Afterwards no identifier of the process is left.
#[test]
fn ud_connect_and_datagrams_both_ways() {
    let Some(addr) = device_addr() else { return };
    let before = kernel_cm_ids();
    let channel = EventChannel::new().expect("rdma_create_event_channel");
    let listen_id = CmId::new(&channel, PortSpace::Udp).expect("rdma_create_id (UDP)");
    listen_id
        .bind_addr(SocketAddr::new(addr, 0))
        .expect("rdma_bind_addr");
    listen_id.listen(4).expect("rdma_listen");
    let server_addr = listen_id.local_addr().expect("a bound address");
    let (tx, rx) = mpsc::channel();
    let server = thread::spawn(move || {
        let mut request = listen_id
            .wait_event(EventKind::ConnectRequest, WAIT)
            .expect("a UD connect request");
        assert_private(request.private_data(), b"ud hello", "SIDR request");
        assert_eq!(request.ud_param(), None, "a request carries no UD path");
        assert_eq!(
            request.peer_param(),
            None,
            "UD events carry no RC parameters"
        );
        let id = request.take_id().expect("the request's identifier");
        drop(request);
        assert_eq!(id.port_space(), PortSpace::Udp);
        let mut side = Side::new(&id);
        assert_eq!(id.qkey().expect("the identifier's Q_Key"), UDP_QKEY);
        id.accept_ud(
            &side.qp,
            &ConnParam::new().private_data(b"ud welcome").unwrap(),
        )
        .expect("rdma_accept (UD)");
        tx.send(side.qp.qp_num()).unwrap();
        let (wc, grh) = side.receive_all(None, 0, "server");
        let client_qpn = wc.imm_data().unwrap();
        let pd = side.pool.pd().clone();
        let back = pd
            .create_ah_from_wc(id.port_num(), &wc, &grh)
            .expect("ibv_create_ah_from_wc");
        side.send_all(&back, client_qpn, UDP_QKEY, 100, "server");
        client_qpn
    });

    let client_channel = EventChannel::new().expect("rdma_create_event_channel");
    let id = CmId::new(&client_channel, PortSpace::Udp).expect("rdma_create_id (UDP)");
    id.resolve(server_addr, WAIT).expect("resolve");
    let mut side = Side::new(&id);
    let (peer, welcome) = id
        .connect_ud(
            &side.qp,
            &ConnParam::new().private_data(b"ud hello").unwrap(),
            WAIT,
        )
        .expect("UD connect");
    let server_qpn = rx.recv_timeout(WAIT).expect("the server's queue pair");
    assert_private(&welcome, b"ud welcome", "SIDR reply");
    assert_eq!((peer.qp_num, peer.qkey), (server_qpn, UDP_QKEY), "{peer:?}");
    assert_eq!(peer.av.port, id.port_num(), "{peer:?}");
    let grh = peer.av.grh.expect("a RoCE path is global");
    match addr {
        IpAddr::V4(v4) => assert_eq!(grh.dgid.ipv4(), Some(v4), "the path: {peer:?}"),
        IpAddr::V6(v6) => assert_eq!(grh.dgid, Gid(v6.octets()), "the path: {peer:?}"),
    }
    let pd = side.pool.pd().clone();
    let ah = pd
        .create_ah(&peer.av)
        .expect("ibv_create_ah from the event's path");
    side.send_all(&ah, peer.qp_num, peer.qkey, 0, "client");
    side.receive_all(Some(server_qpn), 100, "client");
    let seen = server.join().expect("the server's checks");
    assert_eq!(
        seen,
        side.qp.qp_num(),
        "the server saw the client's queue pair"
    );
    drop((side, ah, pd, id, client_channel));
    assert_cm_ids(before, "after the UD exchange");
}

/// A UD connect to a port nobody listens on ends in an `Unreachable` event with status 1 (the
/// SIDR reply's "service ID not supported"), within the bound; a server's reject is
/// `Unreachable` with status 2 and its private data (136 bytes, the SIDR reply's field); the
/// UD calls refuse an RC identifier.
#[test]
fn ud_connect_to_nobody_and_ud_calls_on_rc() {
    let Some(addr) = device_addr() else { return };
    let channel = EventChannel::new().expect("rdma_create_event_channel");
    // A port nobody listens on: bound and released.
    let probe = CmId::new(&channel, PortSpace::Udp).unwrap();
    probe.bind_addr(SocketAddr::new(addr, 0)).unwrap();
    let free = probe.local_addr().unwrap();
    drop(probe);
    let id = CmId::new(&channel, PortSpace::Udp).unwrap();
    id.resolve(free, WAIT).expect("resolve");
    let side = Side::new(&id);
    match id.connect_ud(&side.qp, &ConnParam::new(), WAIT) {
        Err(Error::Event { event, status, .. }) => {
            note(&format!("UD connect to nobody: {event:?}, status {status}"));
            assert_eq!(
                (event, status),
                (EventKind::Unreachable, 1),
                "no server: the SIDR reply's status (1: service ID not supported)"
            );
        }
        other => panic!("UD connect to nobody: {other:?}"),
    }
    drop((side, id));

    // A server that rejects, with private data.
    let listen_id = CmId::new(&channel, PortSpace::Udp).unwrap();
    listen_id.bind_addr(SocketAddr::new(addr, 0)).unwrap();
    listen_id.listen(1).unwrap();
    let server_addr = listen_id.local_addr().unwrap();
    let server = thread::spawn(move || {
        let mut request = listen_id
            .wait_event(EventKind::ConnectRequest, WAIT)
            .expect("a UD connect request");
        let id = request.take_id().unwrap();
        drop(request);
        id.reject(b"no room").expect("rdma_reject (UD)");
    });
    let client_channel = EventChannel::new().unwrap();
    let id = CmId::new(&client_channel, PortSpace::Udp).unwrap();
    id.resolve(server_addr, WAIT).expect("resolve");
    let side = Side::new(&id);
    match id.connect_ud(&side.qp, &ConnParam::new(), WAIT) {
        Err(Error::Event {
            event,
            status,
            private_data,
            ..
        }) => {
            note(&format!(
                "UD connect rejected: {event:?}, status {status}, {} bytes of private data: {:?}",
                private_data.len(),
                &private_data[..private_data.len().min(12)]
            ));
            assert_eq!((event, status), (EventKind::Unreachable, 2), "rejected");
            assert_private(&private_data, b"no room", "SIDR reject");
            assert_eq!(private_data.len(), 136, "a SIDR reply's private data field");
        }
        other => panic!("UD connect rejected: {other:?}"),
    }
    server.join().expect("the rejecting server");
    drop((side, id));

    let rc = CmId::new(&channel, PortSpace::Tcp).unwrap();
    rc.resolve(free, WAIT).expect("resolve");
    assert!(
        matches!(rc.qkey(), Err(Error::InvalidArgument(_))),
        "qkey on an RC identifier: {:?}",
        rc.qkey()
    );
    let context = rc.context().unwrap();
    let pd = context.alloc_pd().unwrap();
    let cq = context.create_cq(4).unwrap();
    let qp = pd.qp_builder::<Ud>(&cq, &cq).build().unwrap();
    match rc.ready_ud_qp(qp) {
        Err(Error::InvalidArgument(_)) => {}
        other => panic!("ready_ud_qp on an RC identifier: {other:?}"),
    }
}
