//! The `tokio` API on the device: async connect, accept, exchange and disconnect; 16 clients
//! at once on one listener, each echoed by its own task with every byte checked; waits
//! cancelled at random points losing no event and leaking no identifier.

#![cfg(feature = "tokio")]

use std::future::poll_fn;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures_core::Stream;
use rdma_cm::rdma_verbs::{
    AsyncCompletionChannel, CompletionQueue, QueuePair,
    cq::{WcOpcode, WcStatus},
    owned::{BufferPool, Completion},
    qp::{Rc, Reset, Rts},
    wr::SendRequest,
};
use rdma_cm::{AsyncCmId, AsyncListener, CmId, ConnParam, Error, EventKind, PortSpace};
use rdma_test_support::cm::*;
use tokio::time::timeout;

/// Messages each client sends (and gets back).
const ROUNDS: u8 = 4;
const CLIENTS: u8 = 16;

/// One side of a connection: a queue pair whose completions are awaited.
struct Conn {
    qp: QueuePair<Rc, Rts>,
    cq: CompletionQueue,
    channel: AsyncCompletionChannel,
    pool: BufferPool,
}

/// A queue pair (RESET) on `id`'s device with a completion queue on a channel in the reactor,
/// and `SIZE` buffers.
fn async_endpoint(
    id: &CmId,
) -> (
    QueuePair<Rc, Reset>,
    CompletionQueue,
    AsyncCompletionChannel,
    BufferPool,
) {
    let context = id.context().expect("the identifier's device");
    let pd = context.alloc_pd().expect("ibv_alloc_pd");
    let channel = context.create_comp_channel().expect("a completion channel");
    let cq = context
        .cq_builder(32)
        .channel(&channel)
        .build()
        .expect("ibv_create_cq");
    let qp = pd.qp_builder(&cq, &cq).build().expect("ibv_create_qp");
    let pool = BufferPool::new(&pd, 8, SIZE).expect("buffers");
    let channel = AsyncCompletionChannel::new(channel).expect("register the channel");
    (qp, cq, channel, pool)
}

impl Conn {
    fn post_recv(qp: &mut QueuePair<Rc, Rts>, pool: &BufferPool, tag: u64) {
        qp.post_recv_buf(pool.take().expect("a buffer"), tag)
            .expect("post a receive");
    }

    /// The next completion, awaited (bounded by `WAIT`).
    async fn next(&mut self, what: &str) -> Completion {
        let mut got = None;
        timeout(
            WAIT,
            self.cq.poll_each_async(&self.channel, 1, |c| got = Some(c)),
        )
        .await
        .unwrap_or_else(|_| panic!("{what}: no completion in {WAIT:?}"))
        .expect("poll the completion queue");
        got.expect("one completion")
    }

    /// Sends `data`, and waits for the send's completion and a receive; returns the received
    /// bytes. A receive is posted again before the send.
    async fn send_and_receive(&mut self, data: &[u8], what: &str) -> Vec<u8> {
        let mut buf = self.pool.take().expect("a buffer");
        buf.fill_from(data).unwrap();
        self.qp
            .post_send_owned(SendRequest::send(buf).tag(1))
            .expect("post a send");
        let mut received = None;
        let mut sent = false;
        while received.is_none() || !sent {
            let mut done = self.next(what).await;
            assert_eq!(done.status(), WcStatus::Success, "{what}: {:?}", done.wc());
            match done.wc().opcode() {
                WcOpcode::Send => sent = true,
                WcOpcode::Recv => {
                    received = Some(done.take_buf().expect("the buffer")[..].to_vec());
                }
                other => panic!("{what}: opcode {other:?}"),
            }
        }
        received.unwrap()
    }
}

/// The bytes client `client` sends in round `round`: its pattern, a different length each time.
fn message(client: u8, round: u8) -> Vec<u8> {
    let len = 64 + usize::from(client) * 97 + usize::from(round) * 13;
    pattern(len, client.wrapping_mul(16).wrapping_add(round))
}

/// Accepts `request` on a new queue pair with a receive posted, checks its private data, and
/// echoes `ROUNDS` messages; then waits for the client's disconnect.
async fn serve(request: rdma_cm::AsyncConnectRequest) {
    let client = request.private_data[0];
    assert_private(&request.private_data, &[client, 0xcc], "connect request");
    let id = request.id;
    let (qp, cq, channel, pool) = async_endpoint(id.id());
    // The first receive before the accept: the client may send as soon as it is connected.
    let mut qp = id.id().ready_rc_qp(qp).expect("the queue pair to RTS");
    Conn::post_recv(&mut qp, &pool, 0);
    id.accept(
        &qp,
        &ConnParam::new().private_data(&[client, 0xaa]).unwrap(),
    )
    .await
    .expect("accept");
    let mut conn = Conn {
        qp,
        cq,
        channel,
        pool,
    };
    for round in 0..ROUNDS {
        let what = format!("server of client {client}, round {round}");
        let mut done = conn.next(&what).await;
        assert_eq!(
            (done.status(), done.wc().opcode()),
            (WcStatus::Success, WcOpcode::Recv),
            "{what}"
        );
        let got = done.take_buf().expect("the buffer")[..].to_vec();
        assert_eq!(got, message(client, round), "{what}: the bytes");
        Conn::post_recv(&mut conn.qp, &conn.pool, u64::from(round) + 1);
        let mut buf = conn.pool.take().expect("a buffer");
        buf.fill_from(&got).unwrap();
        conn.qp
            .post_send_owned(SendRequest::send(buf).tag(1))
            .expect("echo");
        let sent = conn.next(&what).await;
        assert_eq!(
            (sent.status(), sent.wc().opcode()),
            (WcStatus::Success, WcOpcode::Send),
            "{what}: the echo"
        );
    }
    let disconnected = timeout(WAIT, id.wait_event(EventKind::Disconnected))
        .await
        .expect("the client's disconnect in time")
        .expect("Disconnected");
    drop(disconnected);
}

/// A client: connects to `server` with private data `[client, 0xcc]`, sends `ROUNDS`
/// messages, checks every echoed byte, disconnects.
async fn client(server: SocketAddr, client: u8) {
    let id = AsyncCmId::new(PortSpace::Tcp).expect("an identifier");
    id.resolve(server, WAIT).await.expect("resolve");
    let (qp, cq, channel, pool) = async_endpoint(id.id());
    let (mut qp, accepted) = timeout(
        WAIT,
        id.connect_qp(qp, &ConnParam::new().private_data(&[client, 0xcc]).unwrap()),
    )
    .await
    .expect("connect in time")
    .expect("connect_qp");
    assert_private(&accepted, &[client, 0xaa], "accept");
    Conn::post_recv(&mut qp, &pool, 0);
    let mut conn = Conn {
        qp,
        cq,
        channel,
        pool,
    };
    for round in 0..ROUNDS {
        let what = format!("client {client}, round {round}");
        if round > 0 {
            Conn::post_recv(&mut conn.qp, &conn.pool, u64::from(round));
        }
        let echoed = conn.send_and_receive(&message(client, round), &what).await;
        assert_eq!(echoed, message(client, round), "{what}: the echo");
    }
    timeout(WAIT, id.disconnect())
        .await
        .expect("disconnect in time")
        .expect("disconnect");
}

/// A listener on the device's address, on a free port, and that address.
fn listen(addr: std::net::IpAddr, backlog: i32) -> (AsyncListener, SocketAddr) {
    let listener =
        AsyncListener::bind(SocketAddr::new(addr, 0), PortSpace::Tcp, backlog).expect("listen");
    let local = listener.local_addr().expect("the listener's address");
    (listener, local)
}

/// The next item of `stream`, within `WAIT`.
async fn next_item<S: Stream + Unpin>(stream: &mut S, what: &str) -> S::Item {
    timeout(WAIT, poll_fn(|cx| Pin::new(&mut *stream).poll_next(cx)))
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing in {WAIT:?}"))
        .unwrap_or_else(|| panic!("{what}: the stream ended"))
}

/// One client, every step awaited: the listener's request with its private data, accept and
/// connect with private data both ways, four echoed messages, disconnect on both sides; no
/// identifier of the process left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_connect_echo_disconnect() {
    let Some(addr) = device_addr() else { return };
    let before = kernel_cm_ids();
    let (listener, server) = listen(addr, 4);
    let serving = tokio::spawn(async move {
        let request = timeout(WAIT, listener.accept())
            .await
            .expect("a request in time")
            .expect("accept");
        let peer = request.peer.expect("RC parameters");
        assert_eq!(
            (peer.responder_resources, peer.initiator_depth),
            (1, 1),
            "{peer:?}"
        );
        serve(request).await;
    });
    client(server, 7).await;
    serving.await.expect("the server's checks");
    assert_cm_ids(before, "after the async connection");
}

/// Sixteen clients connect at once to one listener; its `incoming()` stream hands each
/// request to a task of its own, which echoes four messages; every client checks every byte.
/// Afterwards no identifier of the process is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_sixteen_concurrent_clients() {
    let Some(addr) = device_addr() else { return };
    let before = kernel_cm_ids();
    let (listener, server) = listen(addr, 32);
    let serving = tokio::spawn(async move {
        let mut incoming = listener.incoming();
        let mut tasks = Vec::new();
        for _ in 0..CLIENTS {
            let request = next_item(&mut incoming, "incoming").await.expect("accept");
            tasks.push(tokio::spawn(serve(request)));
        }
        for task in tasks {
            task.await.expect("a server task's checks");
        }
    });
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| tokio::spawn(client(server, c)))
        .collect();
    for (c, task) in clients.into_iter().enumerate() {
        task.await
            .unwrap_or_else(|e| panic!("client {c}'s checks: {e}"));
    }
    serving.await.expect("the server's checks");
    assert_cm_ids(before, "after sixteen connections");
}

/// Cancelled waits lose nothing: a listener's `accept` cancelled again and again while a
/// request is on its way still gets the request; a `connect_qp` cancelled right after it sent
/// its request (its queue pair destroyed with it) leaves the answer on the identifier's
/// channel, where the next wait (here the `events()` stream) finds it: the server's reject,
/// with its private data. No identifier is leaked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_cancelled_waits_lose_no_event() {
    let Some(addr) = device_addr() else { return };
    let before = kernel_cm_ids();
    let (listener, server) = listen(addr, 4);

    // Accepts cancelled again and again (a 1 ms bound each), from before the request is sent
    // until it is taken.
    let cancellations = Arc::new(AtomicU32::new(0));
    let counter = cancellations.clone();
    let accepting = tokio::spawn(async move {
        loop {
            match timeout(Duration::from_millis(1), listener.accept()).await {
                Ok(request) => return (request.expect("accept"), listener),
                Err(_) => {
                    let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                    assert!(n < 1_000_000, "no request after {n} cancelled accepts");
                }
            }
        }
    });
    while cancellations.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let id = AsyncCmId::new(PortSpace::Tcp).expect("an identifier");
    id.resolve(server, WAIT).await.expect("resolve");
    let (qp, cq, cq_channel, pool) = async_endpoint(id.id());
    // Polled once: INIT and rdma_connect happen, then the wait for the answer is cancelled.
    let cancelled = timeout(
        Duration::ZERO,
        id.connect_qp(qp, &ConnParam::new().private_data(b"cancel me").unwrap()),
    )
    .await;
    assert!(cancelled.is_err(), "connect_qp cannot finish in one poll");

    let (request, listener) = timeout(WAIT, accepting)
        .await
        .expect("the request in time")
        .expect("the accepting task's checks");
    note(&format!(
        "accept cancelled {} times before the request came",
        cancellations.load(Ordering::SeqCst)
    ));
    assert_private(&request.private_data, b"cancel me", "the request");
    request.id.id().reject(b"later").expect("reject");

    let mut events = id.events();
    let event = next_item(&mut events, "events").await.expect("an event");
    assert_eq!(
        (event.kind(), event.status()),
        (EventKind::Rejected, 28),
        "the answer to the cancelled connect"
    );
    assert_private(event.private_data(), b"later", "the reject");
    drop(event);
    drop(events);
    drop((request, id, listener, cq, cq_channel, pool));
    assert_cm_ids(before, "after the cancelled waits");
}

/// What the async calls give on bad input: a connect to a port nobody listens on (the
/// connection manager rejects, status 8: invalid service ID), an address no route leads to.
#[tokio::test(flavor = "current_thread")]
async fn tokio_errors_are_typed() {
    let Some(addr) = device_addr() else { return };
    let before = kernel_cm_ids();
    let id = AsyncCmId::new(PortSpace::Tcp).expect("an identifier");
    let probe = AsyncListener::bind(SocketAddr::new(addr, 0), PortSpace::Tcp, 1).unwrap();
    let free = probe.local_addr().unwrap();
    drop(probe);
    id.resolve(free, WAIT).await.expect("resolve");
    let (qp, _cq, _channel, _pool) = async_endpoint(id.id());
    match timeout(WAIT, id.connect_qp(qp, &ConnParam::new())).await {
        Ok(Err(Error::Event { event, status, .. })) => {
            assert_eq!(
                (event, status),
                (EventKind::Rejected, 8),
                "nothing listening"
            )
        }
        other => panic!("connect to nothing: {other:?}"),
    }
    let lost = AsyncCmId::new(PortSpace::Tcp).expect("an identifier");
    match lost.resolve("192.0.2.1:7174".parse().unwrap(), WAIT).await {
        Err(Error::Call { call, errno }) => {
            assert_eq!(
                (call, errno.raw()),
                ("rdma_resolve_addr", libc::ENETUNREACH)
            );
        }
        other => panic!("resolve an address no route leads to: {other:?}"),
    }
    drop((id, lost, _cq, _channel, _pool));
    assert_cm_ids(before, "after the failed calls");
}

/// Multicast with the async API: `join_group` awaits the `MulticastJoin` event and gives the
/// group's queue pair number, Q_Key and GID, and refuses a group joined already; the event of
/// a join that does not wait comes as the async channel's next event and names its group;
/// leaving both works, and no identifier is left.
#[tokio::test(flavor = "current_thread")]
async fn tokio_multicast_join_and_leave() {
    use std::net::{IpAddr, Ipv4Addr};

    use rdma_cm::JoinKind;
    use rdma_cm::rdma_verbs::device::Gid;

    let Some(addr) = device_addr() else { return };
    let before = kernel_cm_ids();
    let group = Ipv4Addr::new(239, 1, 2, 5);
    let id = AsyncCmId::new(PortSpace::Udp).expect("a UDP identifier");
    id.id()
        .resolve_addr(
            Some(SocketAddr::new(addr, 0)),
            SocketAddr::new(IpAddr::V4(group), 0),
            WAIT,
        )
        .expect("rdma_resolve_addr to the group");
    drop(
        timeout(WAIT, id.wait_event(EventKind::AddrResolved))
            .await
            .expect("in time")
            .expect("AddrResolved"),
    );
    let param = timeout(WAIT, id.join_group(IpAddr::V4(group), JoinKind::FullMember))
        .await
        .expect("in time")
        .expect("join_group");
    assert_eq!(
        (param.qp_num, param.qkey),
        (0x00FF_FFFF, 0x0123_4567),
        "{param:?}"
    );
    assert_eq!(
        param.av.grh.map(|g| g.dgid),
        Some(Gid(group.to_ipv6_mapped().octets())),
        "{param:?}"
    );

    match timeout(WAIT, id.join_group(IpAddr::V4(group), JoinKind::FullMember)).await {
        Ok(Err(Error::InvalidArgument(_))) => {}
        other => panic!("a second join of the group: {other:?}"),
    }

    // The join that does not wait: its event comes through the async channel.
    let other = Ipv4Addr::new(239, 1, 2, 6);
    id.id()
        .join_multicast(IpAddr::V4(other), JoinKind::FullMember)
        .expect("rdma_join_multicast_ex");
    assert_eq!(
        id.id().multicast_groups(),
        vec![IpAddr::V4(group), IpAddr::V4(other)]
    );
    let joined = timeout(WAIT, id.wait_event(EventKind::MulticastJoin))
        .await
        .expect("in time")
        .expect("the cancelled join's event");
    assert_eq!(joined.multicast_group(), Some(IpAddr::V4(other)));
    drop(joined);
    id.id()
        .leave_multicast(IpAddr::V4(other))
        .expect("leave the cancelled join's group");
    id.id()
        .leave_multicast(IpAddr::V4(group))
        .expect("leave the group");
    assert!(id.id().multicast_groups().is_empty());
    drop(id);
    assert_cm_ids(before, "after the async multicast");
}
