//! The connection manager between hosts (`cargo xtask test --nodes 2`): node 0 listens on its
//! address on the segment, node 1 connects to it by IP address and port. Address and route
//! resolution go through ARP between hosts, the connection through the kernels' CM on both.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use rdma_cm::{CmId, ConnParam, Error, EventChannel, EventKind, PortSpace};
use rdma_test_support::Cluster;
use rdma_test_support::cm::*;

const SERVER: usize = 0;

fn setup() -> Option<Cluster> {
    rdma_test_support::device()?;
    rdma_test_support::cluster()
}

/// A listener on this node's address, its port published for the other node.
fn listen(c: &Cluster) -> (EventChannel, CmId) {
    let channel = EventChannel::new().unwrap();
    let id = CmId::new(&channel, PortSpace::Tcp).unwrap();
    id.bind_addr(SocketAddr::new(c.addr(c.node()), 0)).unwrap();
    id.listen(4).unwrap();
    let port = id.local_addr().expect("bound").port();
    c.publish("port", &port.to_string());
    (channel, id)
}

/// The server's address, from its published port.
fn server_addr(c: &Cluster) -> SocketAddr {
    let port: u16 = c.fetch(SERVER, "port").parse().unwrap();
    SocketAddr::new(c.addr(SERVER), port)
}

/// Connect across hosts with private data both ways, a SEND each way with every byte checked,
/// then node 1 disconnects and both see `Disconnected`.
#[test]
fn connect_across_hosts_with_private_data() {
    let Some(c) = setup() else { return };
    if c.node() == SERVER {
        let (_channel, listener) = listen(&c);
        let mut request = listener
            .wait_event(EventKind::ConnectRequest, WAIT)
            .expect("a connect request from node 1");
        assert_private(request.private_data(), b"from node 1", "connect request");
        let id = request.take_id().unwrap();
        drop(request);
        assert_eq!(
            id.peer_addr().map(|a| a.ip()),
            Some(c.addr(1)),
            "the request came from node 1's address"
        );
        let (qp, mut cq, pool) = endpoint(&id);
        let mut qp = id
            .accept_qp(
                qp,
                &ConnParam::new().private_data(b"node 0 here").unwrap(),
                WAIT,
            )
            .expect("accept");
        qp.post_recv_buf(pool.take().unwrap(), 1).unwrap();
        c.barrier("accepted");
        received(&mut cq, 21, "node 0: node 1's SEND");
        send(&mut qp, &pool, 22);
        sent(&mut cq, "node 0: its SEND");
        let gone = id
            .wait_event(EventKind::Disconnected, WAIT)
            .expect("node 1's disconnect");
        assert_eq!(gone.status(), 0);
    } else {
        let server = server_addr(&c);
        let channel = EventChannel::new().unwrap();
        let id = CmId::new(&channel, PortSpace::Tcp).unwrap();
        id.resolve(server, WAIT).expect("resolve node 0");
        assert_eq!(id.local_addr().map(|a| a.ip()), Some(c.addr(1)));
        let (qp, mut cq, pool) = endpoint(&id);
        let (mut qp, accepted) = id
            .connect_qp(
                qp,
                &ConnParam::new().private_data(b"from node 1").unwrap(),
                WAIT,
            )
            .expect("connect to node 0");
        assert_private(&accepted, b"node 0 here", "accept");
        qp.post_recv_buf(pool.take().unwrap(), 2).unwrap();
        c.barrier("accepted");
        send(&mut qp, &pool, 21);
        sent_and_received(&mut cq, 22, "node 1: its SEND and node 0's");
        id.disconnect().unwrap();
        drop(id.wait_event(EventKind::Disconnected, WAIT).unwrap());
    }
    c.barrier("done");
}

/// An address on the segment that no host answers ARP for: resolution ends in `AddrError`
/// with `-ETIMEDOUT`, bounded by the timeout given (2 s here), not a hang.
#[test]
fn resolving_a_host_that_does_not_answer_fails_in_time() {
    let Some(c) = setup() else { return };
    if c.node() != SERVER {
        let IpAddr::V4(own) = c.addr(c.node()) else {
            panic!("IPv4 segment")
        };
        let [a, b, n, _] = own.octets();
        let nobody = SocketAddr::new(IpAddr::from([a, b, n, 99]), 7174);
        let channel = EventChannel::new().unwrap();
        let id = CmId::new(&channel, PortSpace::Tcp).unwrap();
        let started = Instant::now();
        let error = id
            .resolve(nobody, Duration::from_secs(2))
            .expect_err("nobody answers for the address");
        let elapsed = started.elapsed();
        note(&format!("resolving {nobody}: {error} after {elapsed:.2?}"));
        match error {
            Error::Event { event, status, .. } => {
                assert_eq!(event, EventKind::AddrError, "{error}");
                assert_eq!(status, -libc::ETIMEDOUT, "ARP got no answer");
            }
            other => panic!("expected AddrError, got {other:?}"),
        }
        assert!(elapsed < WAIT, "bounded: {elapsed:?}");
    }
    c.barrier("done");
}

/// Node 0 destroys its side without disconnecting (its identifier and queue pair are dropped):
/// node 1 sees `Disconnected` within the bound.
#[test]
fn peer_gone_without_disconnect_is_seen() {
    let Some(c) = setup() else { return };
    if c.node() == SERVER {
        let (_channel, listener) = listen(&c);
        let mut request = listener
            .wait_event(EventKind::ConnectRequest, WAIT)
            .expect("a connect request");
        let id = request.take_id().unwrap();
        drop(request);
        let (qp, cq, pool) = endpoint(&id);
        let qp = id.accept_qp(qp, &ConnParam::new(), WAIT).expect("accept");
        c.barrier("connected");
        // Gone without rdma_disconnect.
        drop((qp, cq, pool, id));
    } else {
        let server = server_addr(&c);
        let channel = EventChannel::new().unwrap();
        let id = CmId::new(&channel, PortSpace::Tcp).unwrap();
        id.resolve(server, WAIT).unwrap();
        let (qp, _cq, _pool) = endpoint(&id);
        let (_qp, _) = id.connect_qp(qp, &ConnParam::new(), WAIT).expect("connect");
        c.barrier("connected");
        let started = Instant::now();
        let gone = id
            .wait_event(EventKind::Disconnected, WAIT)
            .expect("Disconnected after the peer went away");
        note(&format!(
            "Disconnected {:.2?} after the peer destroyed its identifier",
            started.elapsed()
        ));
        drop(gone);
    }
    c.barrier("done");
}
