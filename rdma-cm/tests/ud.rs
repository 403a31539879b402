//! UD over the connection manager on the device: a SIDR connect, the `Established` event's
//! queue pair, Q_Key and path, datagrams both ways with every byte checked; what a UD connect
//! to nobody, and the UD calls on an RC identifier, give.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::thread;

use common::*;
use rdma_cm::rdma_verbs::{
    AddressHandle, BufferPool, CompletionQueue, Gid, OwnedSend, QueuePair, Rts, Ud, WcOpcode,
    WcStatus, WorkCompletion,
};
use rdma_cm::{CmId, ConnParam, Error, EventChannel, EventKind, PortSpace};

/// Bytes of the global routing header in front of every UD receive.
const GRH: usize = 40;
/// The Q_Key of the UDP port space (`RDMA_UDP_QKEY`).
const UDP_QKEY: u32 = 0x0123_4567;
const MESSAGES: u8 = 8;
const PAYLOAD: usize = 512;

fn payload(seed: u8) -> Vec<u8> {
    (0..PAYLOAD)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// One side: a UD queue pair in RTS on `id`'s device, a send and a receive queue, and buffers
/// of `PAYLOAD + GRH` bytes.
struct Side {
    qp: QueuePair<Ud, Rts>,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    pool: BufferPool,
}

impl Side {
    fn new(id: &CmId) -> Self {
        let context = id.context().expect("the identifier's device");
        let pd = context.alloc_pd().expect("ibv_alloc_pd");
        let send_cq = context.create_cq(32).expect("ibv_create_cq");
        let recv_cq = context.create_cq(32).expect("ibv_create_cq");
        let qp = pd
            .qp_builder::<Ud>(&send_cq, &recv_cq)
            .build()
            .expect("ibv_create_qp (UD)");
        let qp = id.ready_ud_qp(qp).expect("UD queue pair to RTS");
        let pool = BufferPool::new(&pd, usize::from(MESSAGES) * 2, PAYLOAD + GRH).expect("buffers");
        let mut side = Self {
            qp,
            send_cq,
            recv_cq,
            pool,
        };
        for i in 0..MESSAGES {
            let buf = side.pool.take().expect("a buffer");
            side.qp
                .post_recv_buf(buf, u64::from(i))
                .expect("post a receive");
        }
        side
    }

    /// Sends `payload(seed + i)` for each of the `MESSAGES` datagrams to `qpn` behind `ah`,
    /// with this queue pair's number as immediate data, and reaps the sends.
    fn send_all(&mut self, ah: &AddressHandle, qpn: u32, qkey: u32, seed: u8, what: &str) {
        let own = self.qp.qp_num();
        for i in 0..MESSAGES {
            let mut buf = self.pool.take().expect("a buffer");
            buf.fill_from(&payload(seed.wrapping_add(i))).unwrap();
            self.qp
                .post_send_owned(OwnedSend::send(buf).with_imm(own).to(ah, qpn, qkey))
                .expect("post a datagram");
        }
        for i in 0..MESSAGES {
            let done = reap(&mut self.send_cq, what);
            assert_eq!(
                (done.status(), done.wc().opcode()),
                (WcStatus::Success, WcOpcode::Send),
                "{what}: send {i}: {:?}",
                done.wc()
            );
        }
    }

    /// Reaps the `MESSAGES` receives: each a `Recv` with immediate data and source queue
    /// pair `src_qp`, the GRH and then `payload(seed + i)` in order. Returns the first
    /// completion and its GRH.
    fn receive_all(
        &mut self,
        src_qp: Option<u32>,
        seed: u8,
        what: &str,
    ) -> (WorkCompletion, [u8; GRH]) {
        let mut first = None;
        for i in 0..MESSAGES {
            let mut done = reap(&mut self.recv_cq, what);
            let wc = *done.wc();
            let src = src_qp.unwrap_or(wc.src_qp());
            assert_eq!(
                (wc.status(), wc.opcode(), wc.imm_data(), wc.src_qp()),
                (WcStatus::Success, WcOpcode::Recv, Some(src), src),
                "{what}: datagram {i}: {wc:?}"
            );
            assert_eq!(wc.byte_len() as usize, PAYLOAD + GRH, "{what}: {wc:?}");
            let buf = done.take_buf().expect("the receive's buffer");
            assert_eq!(
                &buf[GRH..],
                &payload(seed.wrapping_add(i))[..],
                "{what}: datagram {i}'s bytes"
            );
            first.get_or_insert((wc, buf[..GRH].try_into().unwrap()));
        }
        first.unwrap()
    }
}

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
