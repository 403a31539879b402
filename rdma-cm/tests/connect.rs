//! The connection manager on the device: connect, exchange, disconnect; reject with private
//! data; enhanced connection establishment options both ways and their reject; nothing
//! listening; an address that does not resolve; migrating an identifier; drop
//! orders. The server and the client run in two threads of one process, each with its own
//! event channel, connecting through the test device's address (`RDMA_TEST_ADDR`, from its
//! GID otherwise).

use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use rdma_cm::rdma_verbs::qp::Ece;
use rdma_cm::rdma_verbs::{
    CompletionQueue, QueuePair,
    cq::{WcOpcode, WcStatus},
    owned::BufferPool,
    qp::{QpStateKind, Rc, Rts},
};
use rdma_cm::{CmId, ConnParam, Error, Event, EventChannel, EventKind, PortSpace};
use rdma_test_support::cm::*;

/// A listener on the device's address, on a free port.
fn listener(addr: IpAddr) -> (EventChannel, CmId, SocketAddr) {
    let channel = EventChannel::new().expect("rdma_create_event_channel");
    let id = CmId::new(&channel, PortSpace::Tcp).expect("rdma_create_id");
    id.bind_addr(SocketAddr::new(addr, 0))
        .expect("rdma_bind_addr");
    id.listen(4).expect("rdma_listen");
    let local = id.local_addr().expect("a bound address");
    assert_eq!(local.ip(), addr);
    assert_ne!(local.port(), 0, "a port was assigned");
    assert_eq!(id.local_port(), Some(local.port()));
    assert_eq!(id.peer_port(), None, "a listener has no peer");
    (channel, id, local)
}

/// Waits on the server's listener for the next connect request.
fn next_request(listener: &CmId) -> Event {
    let event = listener
        .wait_event(EventKind::ConnectRequest, WAIT)
        .expect("a connect request");
    assert!(event.is_for(listener));
    assert!(event.listener().expect("a listener").same_as(listener));
    event
}

/// A client connecting to `server` with `hello`; returns its identifier, queue pair, queue,
/// pool and the accept's private data (or the error).
type Connected = (
    CmId,
    QueuePair<Rc, Rts>,
    CompletionQueue,
    BufferPool,
    Vec<u8>,
);

fn client(server: SocketAddr, hello: &[u8]) -> Result<Connected, Error> {
    let channel = EventChannel::new()?;
    let id = CmId::new(&channel, PortSpace::Tcp)?;
    id.resolve(server, WAIT)?;
    assert_eq!(id.peer_addr(), Some(server));
    assert_eq!(id.peer_port(), Some(server.port()));
    let local = id.local_addr().expect("a resolved identifier is bound");
    assert_eq!(id.local_port(), Some(local.port()));
    assert_ne!(local.port(), 0);
    let (qp, cq, pool) = endpoint(&id);
    let (qp, accepted) = id.connect_qp(qp, &ConnParam::new().private_data(hello)?, WAIT)?;
    Ok((id, qp, cq, pool, accepted))
}

/// Connect with private data both ways, a SEND each way with every byte checked, then the
/// client disconnects and both sides see `Disconnected`; afterwards the kernel holds no
/// identifier of this process.
#[test]
fn connect_exchange_and_disconnect() {
    let Some(addr) = device_addr() else { return };
    let before = kernel_cm_ids();
    let (_channel, listen_id, local) = listener(addr);
    let (tx, rx) = mpsc::channel();
    let server = thread::spawn(move || {
        let mut request = next_request(&listen_id);
        assert_private(
            request.private_data(),
            b"hello from the client",
            "connect request",
        );
        assert_eq!(
            request.private_data().len(),
            56,
            "a REQ's private data field"
        );
        let peer = request.peer_param().expect("connection parameters");
        assert_ne!(peer.qp_num, 0, "the client's queue pair number");
        let id = request.take_id().expect("the new identifier");
        assert!(request.take_id().is_none(), "taken once");
        drop(request);
        assert_eq!(id.local_addr(), Some(local));
        assert_eq!(id.local_port(), Some(local.port()));
        let client = id.peer_addr().expect("the client's address");
        assert_eq!(id.peer_port(), Some(client.port()));
        assert_ne!(client.port(), 0);
        let (qp, mut cq, pool) = endpoint(&id);
        let mut qp = id
            .accept_qp(
                qp,
                &ConnParam::new().private_data(b"welcome").unwrap(),
                WAIT,
            )
            .expect("accept");
        // The client's SEND may come first: RNR retries (7, infinite) cover it.
        qp.post_recv_buf(pool.take().unwrap(), 1).unwrap();
        assert_eq!(qp.query_state().unwrap(), QpStateKind::Rts);
        tx.send(peer.qp_num).unwrap();
        received(&mut cq, 7, "server: the client's SEND");
        send(&mut qp, &pool, 9);
        sent(&mut cq, "server: its SEND");
        let gone = id
            .wait_event(EventKind::Disconnected, WAIT)
            .expect("the client's disconnect");
        assert_eq!(gone.status(), 0);
    });
    let (id, mut qp, mut cq, pool, accepted) =
        client(local, b"hello from the client").expect("connect");
    assert_private(&accepted, b"welcome", "accept");
    assert_eq!(
        rx.recv_timeout(WAIT).expect("the server accepted"),
        qp.qp_num(),
        "the server saw this queue pair's number"
    );
    qp.post_recv_buf(pool.take().unwrap(), 2).unwrap();
    send(&mut qp, &pool, 7);
    sent_and_received(&mut cq, 9, "client: its SEND and the server's");
    id.disconnect().expect("rdma_disconnect");
    drop(
        id.wait_event(EventKind::Disconnected, WAIT)
            .expect("its own Disconnected"),
    );
    server.join().expect("the server thread");
    drop((qp, cq, pool, id));
    assert_cm_ids(before, "after both sides are gone");
}

/// The server rejects with private data: the client's connect fails with `Rejected`, status
/// 28 (consumer defined), and carries the bytes.
#[test]
fn reject_carries_private_data_to_the_client() {
    let Some(addr) = device_addr() else { return };
    let before = kernel_cm_ids();
    let (_channel, listen_id, local) = listener(addr);
    let server = thread::spawn(move || {
        let mut request = next_request(&listen_id);
        let id = request.take_id().unwrap();
        id.reject(b"not today: 42").expect("rdma_reject");
    });
    let error = client(local, b"let me in").expect_err("the connect fails");
    match &error {
        Error::Event {
            expected,
            event,
            status,
            private_data,
        } => {
            assert_eq!(*expected, EventKind::ConnectResponse);
            assert_eq!(*event, EventKind::Rejected, "{error}");
            assert_eq!(*status, 28, "IB_CM_REJ_CONSUMER_DEFINED");
            assert_private(private_data, b"not today: 42", "reject");
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    server.join().unwrap();
    assert_cm_ids(before, "after the rejection");
    // Too much private data is refused before anything is sent.
    assert!(matches!(
        ConnParam::new().private_data(&[0; 256]),
        Err(Error::PrivateDataTooLong { len: 256 })
    ));
}

/// Enhanced connection establishment options cross the wire in the connect request and in
/// the reply (the requester's vendor, the acceptor's options); a reject for them arrives with
/// reason 35. `rdma_get_devices` lists the identifiers' device, and events name their kind as
/// librdmacm does.
#[test]
fn ece_options_cross_the_wire_and_an_ece_reject_says_why() {
    let Some(addr) = device_addr() else { return };
    let offered = Ece {
        vendor_id: 0x00_abcd,
        options: 0b1011,
    };
    let (_channel, listen_id, local) = listener(addr);
    let server = thread::spawn(move || {
        let mut request = next_request(&listen_id);
        let id = request.take_id().unwrap();
        assert_eq!(id.remote_ece().unwrap(), offered, "the request's options");
        id.set_local_ece(Ece {
            vendor_id: offered.vendor_id,
            options: 0b0011,
        })
        .unwrap();
        let (qp, cq, pool) = endpoint(&id);
        let qp = id.accept_qp(qp, &ConnParam::new(), WAIT).expect("accept");
        drop(
            id.wait_event(EventKind::Disconnected, WAIT)
                .expect("disconnect"),
        );
        // Destroying the identifier answers the client's disconnect request.
        drop((qp, cq, pool, id));
        // The second request is rejected for its options.
        let mut request = next_request(&listen_id);
        let id = request.take_id().unwrap();
        id.reject_ece(b"no such option").expect("rdma_reject_ece");
    });
    let channel = EventChannel::new().unwrap();
    let id = CmId::new(&channel, PortSpace::Tcp).unwrap();
    id.resolve(local, WAIT).unwrap();
    assert!(matches!(
        id.set_local_ece(Ece::default()),
        Err(Error::Call { call: "rdma_set_local_ece", errno }) if errno.raw() == libc::EINVAL
    ));
    id.set_local_ece(offered).unwrap();
    let context = id.context().unwrap();
    let listed = rdma_cm::devices().expect("rdma_get_devices");
    assert!(
        listed.iter().any(|c| c.as_raw() == context.as_raw()),
        "the identifier's context is one of librdmacm's"
    );
    let (qp, _cq, _pool) = endpoint(&id);
    let (qp, _) = id.connect_qp(qp, &ConnParam::new(), WAIT).expect("connect");
    assert_eq!(
        id.remote_ece().unwrap(),
        Ece {
            vendor_id: offered.vendor_id,
            options: 0b0011
        },
        "the reply's options, under the requester's vendor"
    );
    id.disconnect().unwrap();
    drop(id.wait_event(EventKind::Disconnected, WAIT).unwrap());
    drop((qp, id, channel));

    let channel = EventChannel::new().unwrap();
    let id = CmId::new(&channel, PortSpace::Tcp).unwrap();
    id.resolve(local, WAIT).unwrap();
    id.set_local_ece(offered).unwrap();
    let (qp, _cq, _pool) = endpoint(&id);
    let error = id
        .connect_qp(qp, &ConnParam::new(), WAIT)
        .expect_err("rejected");
    match &error {
        Error::Event {
            event,
            status,
            private_data,
            ..
        } => {
            assert_eq!((*event, *status), (EventKind::Rejected, 35), "{error}");
            assert_private(private_data, b"no such option", "ECE reject");
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert!(
        error
            .to_string()
            .contains("reported RDMA_CM_EVENT_REJECTED (status 35)"),
        "{error}"
    );
    server.join().unwrap();
}

/// Queue pairs the connection manager makes (`rdma_create_qp_ex`): each side's comes in INIT,
/// takes its first receive there, and the connection manager moves it to RTS while connecting
/// and accepting; a SEND each way carries every byte; a second one on the same identifier is
/// refused; the disconnect moves the client's to ERR, and `rdma_destroy_qp` ends both with
/// their identifiers.
#[test]
fn queue_pairs_the_connection_manager_makes_are_moved_by_it() {
    let Some(addr) = device_addr() else { return };
    let before = kernel_cm_ids();
    let (_channel, listen_id, local) = listener(addr);
    let server = thread::spawn(move || {
        let mut request = next_request(&listen_id);
        let id = request.take_id().unwrap();
        drop(request);
        let context = id.context().unwrap();
        let pd = context.alloc_pd().unwrap();
        let mut cq = context.create_cq(16).unwrap();
        let pool = BufferPool::new(&pd, 4, SIZE).unwrap();
        let mut qp = id
            .create_qp(pd.qp_builder(&cq, &cq))
            .expect("rdma_create_qp_ex");
        assert_eq!(qp.query_state().unwrap(), QpStateKind::Init);
        qp.post_recv_buf(pool.take().unwrap(), 1).unwrap();
        let mut qp = id
            .accept_init_qp(qp, &ConnParam::new().private_data(b"made").unwrap(), WAIT)
            .expect("accept");
        assert_eq!(qp.query_state().unwrap(), QpStateKind::Rts);
        received(&mut cq, 5, "server: the client's SEND");
        send(&mut qp, &pool, 6);
        sent(&mut cq, "server: its SEND");
        drop(
            id.wait_event(EventKind::Disconnected, WAIT)
                .expect("the client's disconnect"),
        );
        drop((qp, cq, pool, pd, id));
    });
    let channel = EventChannel::new().unwrap();
    let id = CmId::new(&channel, PortSpace::Tcp).unwrap();
    id.resolve(local, WAIT).unwrap();
    let context = id.context().unwrap();
    let pd = context.alloc_pd().unwrap();
    let mut cq = context.create_cq(16).unwrap();
    let pool = BufferPool::new(&pd, 4, SIZE).unwrap();
    let mut qp = id
        .create_qp(pd.qp_builder(&cq, &cq))
        .expect("rdma_create_qp_ex");
    match id.create_qp(pd.qp_builder(&cq, &cq)) {
        Err(Error::Verbs(rdma_cm::rdma_verbs::Error::Verb { verb, errno })) => {
            assert_eq!((verb, errno.raw()), ("rdma_create_qp_ex", libc::EINVAL));
        }
        other => panic!("a second queue pair on one identifier: {other:?}"),
    }
    // While the identifier has its own, the paths of the caller's queue pairs refuse any
    // other (librdmacm would connect its own), and another identifier refuses this one.
    let other = pd.qp_builder(&cq, &cq).build().unwrap();
    assert!(matches!(
        id.init_rc_qp(other),
        Err(Error::InvalidArgument(_))
    ));
    let second = CmId::new(&channel, PortSpace::Tcp).unwrap();
    second.resolve(local, WAIT).unwrap();
    let second_pd = second.context().unwrap().alloc_pd().unwrap();
    let second_cq = second.context().unwrap().create_cq(4).unwrap();
    let made = second
        .create_qp(second_pd.qp_builder(&second_cq, &second_cq))
        .unwrap();
    assert!(made.has_maker());
    assert!(matches!(
        id.connect_init_qp(made, &ConnParam::new(), WAIT),
        Err(Error::InvalidArgument(_))
    ));
    drop((second_cq, second_pd, second));
    qp.post_recv_buf(pool.take().unwrap(), 2).unwrap();
    let (mut qp, accepted) = id
        .connect_init_qp(qp, &ConnParam::new(), WAIT)
        .expect("connect");
    assert_private(&accepted, b"made", "the accept, through Established");
    assert_eq!(qp.query_state().unwrap(), QpStateKind::Rts);
    // The queue pair's "communication established" is news to nobody now.
    match id.notify(
        &rdma_cm::rdma_verbs::async_event::AsyncEvent::CommunicationEstablished {
            qp_num: qp.qp_num(),
        },
    ) {
        Err(Error::Call { call, errno }) => {
            assert_eq!((call, errno.raw()), ("rdma_notify", libc::EISCONN));
        }
        other => panic!("rdma_notify on an established connection: {other:?}"),
    }
    send(&mut qp, &pool, 5);
    sent_and_received(&mut cq, 6, "client: its SEND and the server's");
    id.disconnect().unwrap();
    assert_eq!(
        qp.query_state().unwrap(),
        QpStateKind::Error,
        "rdma_disconnect moves the queue pair it made to ERR"
    );
    drop(id.wait_event(EventKind::Disconnected, WAIT).unwrap());
    server.join().unwrap();
    // The identifier's context (and all made from it) holds the identifier too.
    drop((qp, cq, pool, pd, context, id, channel));
    assert_cm_ids(before, "after both sides are gone");
}

/// Endpoints (`rdma_create_ep`, synchronous): a listener, a connect request's endpoint and a
/// client connect with queue pairs the connection manager makes, a message each way; a call
/// the endpoint's state cannot answer (a request on an endpoint that does not listen, a
/// second disconnect, an accept of a connected endpoint) is refused with `EINVAL` instead of
/// waiting forever, and a request that does not come ends with `ETIMEDOUT` in time.
#[test]
fn endpoints_connect_and_refuse_what_their_state_cannot_answer() {
    let Some(addr) = device_addr() else { return };
    use rdma_cm::{AddrHints, Endpoint, getaddrinfo};
    let einval = |result: Result<(), Error>, want: &str| match result {
        Err(Error::Call { call, errno }) => {
            assert_eq!((call, errno.raw()), (want, libc::EINVAL));
        }
        other => panic!("{want}: {other:?}"),
    };
    let passive = AddrHints {
        passive: true,
        ..AddrHints::default()
    };
    let info = getaddrinfo(Some(&addr.to_string()), Some("0"), &passive).unwrap();
    let listener = Endpoint::new(&info[0]).expect("rdma_create_ep");
    einval(
        listener.get_request(Some(WAIT)).map(drop),
        "rdma_get_request",
    );
    listener.listen(4).expect("rdma_listen");
    let local = listener.local_addr().expect("a bound address");
    assert_ne!(local.port(), 0);
    match listener.get_request(Some(Duration::from_millis(200))) {
        Err(Error::Call { call, errno }) => {
            assert_eq!((call, errno.raw()), ("rdma_get_request", libc::ETIMEDOUT));
        }
        other => panic!("no client yet: {other:?}"),
    }
    einval(listener.disconnect(), "rdma_disconnect");
    let server = thread::spawn(move || {
        let ep = listener.get_request(Some(WAIT)).expect("rdma_get_request");
        assert_private(
            &ep.private_data(),
            b"endpoint",
            "the request's private data",
        );
        let context = ep.context().unwrap();
        let pd = context.alloc_pd().unwrap();
        let mut cq = context.create_cq(16).unwrap();
        let pool = BufferPool::new(&pd, 4, SIZE).unwrap();
        let mut qp = ep.create_qp(pd.qp_builder(&cq, &cq)).unwrap();
        qp.post_recv_buf(pool.take().unwrap(), 1).unwrap();
        let mut qp = ep.accept(qp, &ConnParam::new()).expect("rdma_accept");
        received(&mut cq, 3, "endpoint server: the client's SEND");
        send(&mut qp, &pool, 4);
        sent(&mut cq, "endpoint server: its SEND");
        // The client disconnects; this side's own disconnect answers.
        thread::sleep(Duration::from_millis(200));
        ep.disconnect().expect("the server's rdma_disconnect");
        drop((qp, cq, pool, pd, context, ep, listener));
    });
    let hints = AddrHints::default();
    let info = getaddrinfo(
        Some(&local.ip().to_string()),
        Some(&local.port().to_string()),
        &hints,
    )
    .unwrap();
    let ep = Endpoint::new(&info[0]).expect("rdma_create_ep, resolving");
    assert_eq!(ep.peer_addr(), Some(local));
    einval(ep.disconnect(), "rdma_disconnect");
    einval(ep.get_request(None).map(drop), "rdma_get_request");
    let context = ep.context().unwrap();
    let pd = context.alloc_pd().unwrap();
    let mut cq = context.create_cq(16).unwrap();
    let pool = BufferPool::new(&pd, 4, SIZE).unwrap();
    let mut qp = ep.create_qp(pd.qp_builder(&cq, &cq)).unwrap();
    qp.post_recv_buf(pool.take().unwrap(), 2).unwrap();
    let (mut qp, _) = ep
        .connect(qp, &ConnParam::new().private_data(b"endpoint").unwrap())
        .expect("rdma_connect");
    send(&mut qp, &pool, 3);
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let mut done = reap(&mut cq, "endpoint client");
        assert_eq!(done.status(), WcStatus::Success, "{:?}", done.wc());
        if done.wc().opcode() == WcOpcode::Recv {
            assert_eq!(&done.take_buf().unwrap()[..], &pattern(SIZE, 4)[..]);
        }
        seen.push(done.wc().opcode());
    }
    ep.disconnect().expect("rdma_disconnect");
    einval(ep.disconnect(), "rdma_disconnect");
    assert_eq!(qp.query_state().unwrap(), QpStateKind::Error);
    server.join().unwrap();
    drop((qp, cq, pool, pd, context, ep));
}

/// A connect to a port nobody listens on is refused by the peer's connection manager, within
/// the bound.
#[test]
fn connect_to_a_port_nobody_listens_on_is_rejected() {
    let Some(addr) = device_addr() else { return };
    // A port that was free a moment ago: bound and released.
    let (channel, id, local) = listener(addr);
    drop((id, channel));
    let started = Instant::now();
    let error = client(local, b"anyone?").expect_err("the connect fails");
    note(&format!(
        "nothing listening: {error} after {:?}",
        started.elapsed()
    ));
    assert_eq!(error.event(), Some(EventKind::Rejected), "{error}");
    let Error::Event { status, .. } = error else {
        unreachable!()
    };
    assert_eq!(status, 8, "IB_CM_REJ_INVALID_SERVICE_ID");
}

/// An address no interface has a route to (TEST-NET-1): `rdma_resolve_addr` itself fails with
/// `ENETUNREACH`, at once. (An address on the device's subnet would resolve here: the dummy
/// interface needs no ARP. The multi-node suite resolves a host that does not answer ARP.)
#[test]
fn an_address_without_a_route_does_not_resolve() {
    let Some(_) = device_addr() else { return };
    let channel = EventChannel::new().unwrap();
    let id = CmId::new(&channel, PortSpace::Tcp).unwrap();
    let nowhere: SocketAddr = "192.0.2.1:7174".parse().unwrap();
    match id.resolve(nowhere, Duration::from_secs(2)) {
        Err(Error::Call { call, errno }) => {
            assert_eq!(call, "rdma_resolve_addr");
            assert_eq!(errno.raw(), libc::ENETUNREACH, "{errno}");
        }
        other => panic!("expected rdma_resolve_addr to fail, got {other:?}"),
    }
    assert!(
        channel.try_get_event().unwrap().is_none(),
        "no event after a failed call"
    );
}

/// An identifier migrated to another channel reports its later events there.
#[test]
fn migrated_identifier_reports_on_its_new_channel() {
    let Some(addr) = device_addr() else { return };
    let (listen_channel, listen_id, local) = listener(addr);
    let (tx, rx) = mpsc::channel::<()>();
    let server = thread::spawn(move || {
        let mut request = next_request(&listen_id);
        let id = request.take_id().unwrap();
        drop(request);
        let (qp, _cq, _pool) = endpoint(&id);
        let qp = id.accept_qp(qp, &ConnParam::new(), WAIT).expect("accept");
        // Now move the connection's identifier to a channel of its own.
        let own = EventChannel::new().unwrap();
        id.migrate(&own).expect("rdma_migrate_id");
        assert!(id.channel().same_as(&own));
        tx.send(()).unwrap();
        let gone = own
            .get_event(Some(WAIT))
            .unwrap()
            .expect("Disconnected on the new channel");
        assert_eq!(gone.kind(), EventKind::Disconnected);
        assert!(gone.is_for(&id));
        drop(gone);
        assert!(
            listen_channel.try_get_event().unwrap().is_none(),
            "nothing on the old channel"
        );
        drop(qp);
    });
    let (id, qp, _cq, _pool, _) = client(local, b"").expect("connect");
    rx.recv_timeout(WAIT).expect("the server migrated");
    id.disconnect().unwrap();
    drop(id.wait_event(EventKind::Disconnected, WAIT).unwrap());
    server.join().unwrap();
    drop(qp);
}

/// Hostile drop orders: the listener's last handle dropped while a connect request to it is
/// held (destroying it then would wait forever); the channel handle dropped before the
/// identifiers; the identifier handle dropped before its queue pair, which still works. Each
/// ends with no identifier left in the kernel.
#[test]
fn no_drop_order_hangs_or_leaks() {
    let Some(addr) = device_addr() else { return };
    let before = kernel_cm_ids();
    let (channel, listen_id, local) = listener(addr);
    let (tx, rx) = mpsc::channel();
    let server = thread::spawn(move || {
        let mut request = next_request(&listen_id);
        // The last handles of the listener and its channel go; the held event keeps both.
        drop(listen_id);
        drop(channel);
        assert_private(request.private_data(), b"order", "still readable");
        let id = request.take_id().unwrap();
        let (qp, cq, pool) = endpoint(&id);
        // The identifier's last handle goes before its queue pair: the context keeps it.
        let qp = id.accept_qp(qp, &ConnParam::new(), WAIT).expect("accept");
        drop(request);
        tx.send(()).unwrap();
        (id, qp, cq, pool)
    });
    let (id, mut qp, mut cq, pool, _) = client(local, b"order").expect("connect");
    rx.recv_timeout(WAIT).unwrap();
    let (server_id, mut server_qp, mut server_cq, server_pool) = server.join().unwrap();
    drop(server_id);
    server_qp
        .post_recv_buf(server_pool.take().unwrap(), 1)
        .unwrap();
    drop(id);
    send(&mut qp, &pool, 3);
    sent(&mut cq, "a SEND after both identifier handles are gone");
    received(&mut server_cq, 3, "the server's receive");
    drop((qp, cq, pool));
    drop((server_qp, server_cq, server_pool));
    assert_cm_ids(before, "after every handle, event and queue pair is gone");
}

/// Calls librdmacm would run into a null device with (`rdma_resolve_route`, `rdma_connect`,
/// `rdma_accept` before the identifier is bound to one) are refused with `NoDevice`; a
/// listener is not migrated, nor an identifier with an event held; a channel whose descriptor
/// someone made blocking again through `AsFd` still waits only as long as asked.
#[test]
fn misuse_is_refused_not_crashed() {
    use std::os::fd::AsRawFd;
    let Some(addr) = device_addr() else { return };
    let channel = EventChannel::new().unwrap();
    let id = CmId::new(&channel, PortSpace::Tcp).unwrap();
    assert!(matches!(
        id.connect(&ConnParam::new()),
        Err(Error::NoDevice)
    ));
    assert!(matches!(id.accept(&ConnParam::new()), Err(Error::NoDevice)));
    assert!(matches!(id.resolve_route(WAIT), Err(Error::NoDevice)));
    assert!(matches!(id.context(), Err(Error::NoDevice)));
    assert!(id.local_addr().is_none() && id.peer_addr().is_none());
    assert_eq!((id.local_port(), id.peer_port()), (None, None));

    let (_listen_channel, listener, _) = listener(addr);
    let other = EventChannel::new().unwrap();
    assert!(matches!(
        listener.migrate(&other),
        Err(Error::InvalidArgument(_))
    ));
    assert!(listener.channel().same_as(&_listen_channel));

    // Clear O_NONBLOCK behind the crate's back (what any `AsFd` user could do).
    let fd = channel.as_raw_fd();
    // SAFETY: fcntl on a descriptor the channel keeps open.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        assert!(libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) == 0);
    }
    let started = Instant::now();
    assert!(
        channel
            .get_event(Some(Duration::from_millis(200)))
            .unwrap()
            .is_none()
    );
    assert!(channel.try_get_event().unwrap().is_none());
    assert!(started.elapsed() < WAIT, "it did not block");
    // SAFETY: as above.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    assert_ne!(flags & libc::O_NONBLOCK, 0, "set again");
    // A timeout too long to add to the clock is no timeout, not a panic.
    id.resolve_addr(None, SocketAddr::new(addr, 7174), WAIT)
        .unwrap();
    let resolved = channel
        .get_event(Some(Duration::MAX))
        .unwrap()
        .expect("an event");
    assert_eq!(resolved.kind(), EventKind::AddrResolved);
    assert!(resolved.is_for(&id));
    // While the event is held, the identifier is not migrated (librdmacm would wait for its
    // acknowledgement forever); once it is dropped, it is.
    match id.migrate(&other) {
        Err(Error::EventsHeld { count: 1, .. }) => {}
        other => panic!("migrating with an event held: {other:?}"),
    }
    drop(resolved);
    id.migrate(&other).expect("rdma_migrate_id");
    assert!(id.channel().same_as(&other));
}

/// `rdma_getaddrinfo`: a numeric address and port give that destination (and, passive, that
/// source to bind); something that is not an address and a name with a NUL byte are typed
/// errors.
#[test]
fn getaddrinfo_gives_the_addresses_to_bind_and_resolve() {
    use rdma_cm::{AddrHints, getaddrinfo};
    let Some(addr) = device_addr() else { return };
    let target = SocketAddr::new(addr, 7174);
    let text = addr.to_string();
    let active =
        getaddrinfo(Some(&text), Some("7174"), &AddrHints::default()).expect("rdma_getaddrinfo");
    assert!(
        active.iter().any(|a| a.dst == Some(target)),
        "no answer with destination {target}: {active:?}"
    );
    let passive = getaddrinfo(
        Some(&text),
        Some("7174"),
        &AddrHints {
            passive: true,
            numeric_host: true,
            ..AddrHints::default()
        },
    )
    .expect("rdma_getaddrinfo, passive");
    assert!(
        passive.iter().any(|a| a.src == Some(target)),
        "no answer with source {target}: {passive:?}"
    );
    // Not an address (numeric only: no name server is asked, so nothing waits on a network).
    let numeric = AddrHints {
        numeric_host: true,
        ..AddrHints::default()
    };
    assert!(matches!(
        getaddrinfo(Some("300.1.2.3"), Some("7174"), &numeric),
        Err(Error::AddrInfo { .. })
    ));
    assert!(matches!(
        getaddrinfo(Some("a\0b"), None, &AddrHints::default()),
        Err(Error::InvalidArgument(_))
    ));
}

/// Sixteen clients (threads) connect at once to one listener. The server takes each request
/// with `get_request` (its identifier moved to a channel of its own) and serves it in a thread
/// of its own: its queue pair to RTS and a receive posted before the accept, the client's
/// SEND checked byte for byte and echoed, the client's disconnect awaited. Every client checks
/// the private data of its accept and every echoed byte. No identifier is left.
#[test]
fn sixteen_concurrent_clients_blocking() {
    const CLIENTS: u8 = 16;
    let Some(addr) = device_addr() else { return };
    let before = kernel_cm_ids();
    let channel = EventChannel::new().expect("rdma_create_event_channel");
    let listen_id = CmId::new(&channel, PortSpace::Tcp).expect("rdma_create_id");
    listen_id
        .bind_addr(SocketAddr::new(addr, 0))
        .expect("rdma_bind_addr");
    listen_id.listen(32).expect("rdma_listen");
    let local = listen_id.local_addr().expect("a bound address");
    let listen_channel = channel.clone();
    let server = thread::spawn(move || {
        let mut served = Vec::new();
        for _ in 0..CLIENTS {
            let request = listen_id.get_request(WAIT).expect("a connect request");
            assert!(
                !request.id.channel().same_as(&listen_channel),
                "the request's identifier has a channel of its own"
            );
            served.push(thread::spawn(move || {
                let seed = request.private_data[0];
                assert_private(&request.private_data, &[seed, 0xcc], "connect request");
                assert!(request.peer.is_some(), "RC parameters");
                let id = request.id;
                let (qp, mut cq, pool) = endpoint(&id);
                let mut qp = id.ready_rc_qp(qp).expect("the queue pair to RTS");
                qp.post_recv_buf(pool.take().unwrap(), 1).unwrap();
                id.accept(
                    &ConnParam::new()
                        .private_data(&[seed, 0xaa])
                        .unwrap()
                        .qp_num(qp.qp_num()),
                )
                .expect("rdma_accept");
                drop(
                    id.wait_event(EventKind::Established, WAIT)
                        .expect("Established"),
                );
                let what = format!("server of client {seed}");
                received(&mut cq, seed, &what);
                send(&mut qp, &pool, seed);
                sent(&mut cq, &what);
                drop(
                    id.wait_event(EventKind::Disconnected, WAIT)
                        .expect("the client's disconnect"),
                );
            }));
        }
        for (i, thread) in served.into_iter().enumerate() {
            thread
                .join()
                .unwrap_or_else(|_| panic!("server thread {i}'s checks"));
        }
    });
    let clients: Vec<_> = (0..CLIENTS)
        .map(|seed| {
            thread::spawn(move || {
                let what = format!("client {seed}");
                let (id, mut qp, mut cq, pool, accepted) =
                    client(local, &[seed, 0xcc]).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_private(&accepted, &[seed, 0xaa], &what);
                qp.post_recv_buf(pool.take().unwrap(), 2).unwrap();
                send(&mut qp, &pool, seed);
                sent_and_received(&mut cq, seed, &what);
                id.disconnect().expect("rdma_disconnect");
                drop(
                    id.wait_event(EventKind::Disconnected, WAIT)
                        .expect("its own Disconnected"),
                );
            })
        })
        .collect();
    for (i, thread) in clients.into_iter().enumerate() {
        thread
            .join()
            .unwrap_or_else(|_| panic!("client {i}'s checks"));
    }
    server.join().expect("the server's checks");
    drop(channel);
    assert_cm_ids(before, "after sixteen connections");
}

/// A queue pair of another device than the identifier's is refused before anything is sent
/// (the connection manager would announce a queue pair number that does not exist where the
/// connection goes), on both sides; the server then accepts with the right one, and a second
/// accept of the same request is refused by librdmacm.
#[test]
fn another_devices_queue_pair_and_a_second_accept_are_refused() {
    let Some(addr) = device_addr() else { return };
    let Some(other) = rdma_test_support::second_device() else {
        return;
    };
    let other = rdma_cm::rdma_verbs::Context::open(&other).expect("open the second device");
    let other_pd = other.alloc_pd().unwrap();
    let other_cq = other.create_cq(4).unwrap();
    let foreign = || other_pd.qp_builder(&other_cq, &other_cq).build().unwrap();
    let before = kernel_cm_ids();
    let (_channel, listen_id, local) = listener(addr);
    let (tx, rx) = mpsc::channel();
    let server_foreign = foreign();
    let server = thread::spawn(move || {
        let request = listen_id.get_request(WAIT).expect("a connect request");
        let id = request.id;
        match id.ready_rc_qp(server_foreign) {
            Err(Error::InvalidArgument(why)) => assert!(why.contains("another device"), "{why}"),
            other => panic!("a foreign queue pair on the passive side: {other:?}"),
        }
        let (qp, _cq, _pool) = endpoint(&id);
        let qp = id.accept_qp(qp, &ConnParam::new(), WAIT).expect("accept");
        match id.accept(&ConnParam::new().qp_num(qp.qp_num())) {
            Err(Error::Call { call, errno }) => {
                note(&format!("a second accept: {call}: {errno}"));
                assert_eq!((call, errno.raw()), ("rdma_accept", libc::EINVAL));
            }
            other => panic!("a second accept: {other:?}"),
        }
        tx.send(()).unwrap();
        drop(
            id.wait_event(EventKind::Disconnected, WAIT)
                .expect("Disconnected"),
        );
        drop(qp);
    });
    let channel = EventChannel::new().unwrap();
    let id = CmId::new(&channel, PortSpace::Tcp).unwrap();
    id.resolve(local, WAIT).expect("resolve");
    match id.connect_qp(foreign(), &ConnParam::new(), WAIT) {
        Err(Error::InvalidArgument(why)) => assert!(why.contains("another device"), "{why}"),
        other => panic!("a foreign queue pair on the active side: {other:?}"),
    }
    let ud = other_pd
        .qp_builder::<rdma_cm::rdma_verbs::qp::Ud>(&other_cq, &other_cq)
        .build()
        .unwrap();
    assert!(
        matches!(id.ready_ud_qp(ud), Err(Error::InvalidArgument(_))),
        "a UD queue pair on an RC identifier"
    );
    // Nothing was sent: the identifier still connects, with its own device's queue pair.
    let (qp, cq, pool) = endpoint(&id);
    let (qp, _) = id.connect_qp(qp, &ConnParam::new(), WAIT).expect("connect");
    rx.recv_timeout(WAIT).expect("the server's checks");
    id.disconnect().unwrap();
    drop(id.wait_event(EventKind::Disconnected, WAIT).unwrap());
    server.join().expect("the server's checks");
    drop((qp, cq, pool, id, channel));
    assert_cm_ids(before, "after the refusals");
}
