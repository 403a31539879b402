//! The async API (feature `tokio`): event channels in tokio's reactor, identifiers that
//! resolve, connect and accept without blocking a thread, and a listener whose connect
//! requests come as a stream.
//!
//! Every future here is cancel-safe: an event is taken off its channel only in the same
//! step that returns it, so a future dropped while it waits loses no event (the next wait gets
//! it), and the identifiers belong to the [`AsyncCmId`] or [`AsyncListener`], not to the
//! futures, so a dropped future leaks none. A queue pair moved into a dropped
//! [`connect_qp`](AsyncCmId::connect_qp) or [`accept_qp`](AsyncCmId::accept_qp) is destroyed
//! with it.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures_core::Stream;
use rdma_verbs::{
    Errno, QueuePair,
    qp::{Init, Rc, Reset, Rts},
};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::c_enum::EventKind;
use crate::channel::EventChannel;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::id::{CmId, PortSpace};
use crate::multicast::{JoinKind, NO_UD_PARAM};
use crate::param::ConnParam;
use crate::request::ConnectRequest;
use crate::ud::UdParam;

/// The channel's descriptor for the reactor; holds a handle, so the descriptor stays open
/// (and the same) while it is registered.
#[derive(Debug)]
struct ChannelFd(EventChannel);

impl AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// An [`EventChannel`] registered with tokio's reactor: events are awaited without blocking
/// a thread. Create it inside a tokio runtime (with I/O enabled).
///
/// One `AsyncEventChannel` per channel: the reactor registers a descriptor once, so a second
/// one for the same channel fails with `EEXIST`.
#[derive(Debug)]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub struct AsyncEventChannel {
    fd: AsyncFd<ChannelFd>,
}

impl AsyncEventChannel {
    /// Registers `channel` with the current runtime's reactor.
    ///
    /// # Errors
    ///
    /// [`Error::Call`] with `epoll_ctl` (no runtime: `ESHUTDOWN`; registered already:
    /// `EEXIST`).
    pub fn new(channel: EventChannel) -> Result<Self> {
        // SAFETY: `ChannelFd` holds a handle to the channel, so its descriptor stays open
        // (and the same: a channel's descriptor never changes) until the `AsyncFd`, which
        // owns the handle, is dropped; safe code cannot close a descriptor it only borrows.
        let fd = unsafe { AsyncFd::register_with_interest(ChannelFd(channel), Interest::READABLE) }
            .map_err(|e| io_error("epoll_ctl", &io::Error::from(e)))?;
        Ok(Self { fd })
    }

    /// The channel.
    pub fn channel(&self) -> &EventChannel {
        &self.fd.get_ref().0
    }

    /// Polls for the next event (`rdma_get_cm_event` when the descriptor is readable).
    ///
    /// # Errors
    ///
    /// As [`EventChannel::try_get_event`]; [`Error::Call`] with `epoll_wait` when the
    /// reactor fails.
    pub fn poll_next_event(&self, cx: &mut Context<'_>) -> Poll<Result<Event>> {
        loop {
            let mut guard =
                ready!(self.fd.poll_read_ready(cx)).map_err(|e| io_error("epoll_wait", &e))?;
            match self.channel().try_get_event() {
                Ok(Some(event)) => return Poll::Ready(Ok(event)),
                // Nothing there: sleep until the next readiness (tokio clears only the
                // readiness this guard saw, so an event that came meanwhile is not missed).
                Ok(None) => guard.clear_ready(),
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
    }

    /// The next event. Cancel-safe.
    ///
    /// # Errors
    ///
    /// As [`poll_next_event`](Self::poll_next_event).
    pub async fn next_event(&self) -> Result<Event> {
        std::future::poll_fn(|cx| self.poll_next_event(cx)).await
    }

    /// The events, as a stream that never ends (an error is an item; the stream goes on).
    pub fn events(&self) -> Events<'_> {
        Events(self)
    }
}

/// The events of an [`AsyncEventChannel`] as a [`Stream`]: from
/// [`AsyncEventChannel::events`].
#[derive(Debug)]
#[must_use = "streams do nothing unless polled"]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub struct Events<'a>(&'a AsyncEventChannel);

impl Stream for Events<'_> {
    type Item = Result<Event>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_next_event(cx).map(Some)
    }
}

/// An identifier alone on its own event channel, registered with tokio: the async
/// counterpart of the blocking helpers ([`CmId::resolve`], [`CmId::connect_qp`],
/// [`CmId::accept_qp`]). Librdmacm's own timers bound resolution; bound a connect or an
/// accept with `tokio::time::timeout` (cancel-safe).
#[derive(Debug)]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub struct AsyncCmId {
    id: CmId,
    events: AsyncEventChannel,
}

impl AsyncCmId {
    /// `rdma_create_id` in port space `ps` on a new event channel of its own.
    ///
    /// # Errors
    ///
    /// As [`EventChannel::new`], [`CmId::new`] and [`AsyncEventChannel::new`].
    pub fn new(ps: PortSpace) -> Result<Self> {
        let channel = EventChannel::new()?;
        let id = CmId::new(&channel, ps)?;
        Ok(Self {
            id,
            events: AsyncEventChannel::new(channel)?,
        })
    }

    /// Wraps `id`, registering its channel. The channel should be `id`'s alone (as after
    /// [`ConnectRequest::from_event`]): the waits here take every event of the channel as
    /// `id`'s.
    ///
    /// # Errors
    ///
    /// As [`AsyncEventChannel::new`].
    pub fn from_id(id: CmId) -> Result<Self> {
        let events = AsyncEventChannel::new(id.channel())?;
        Ok(Self { id, events })
    }

    /// The identifier, for the calls that do not wait ([`CmId::context`],
    /// [`CmId::disconnect`], [`CmId::reject`]...).
    pub fn id(&self) -> &CmId {
        &self.id
    }

    /// The next event of the identifier's channel. Cancel-safe.
    ///
    /// # Errors
    ///
    /// As [`AsyncEventChannel::next_event`].
    pub async fn next_event(&self) -> Result<Event> {
        self.events.next_event().await
    }

    /// The events of the identifier's channel, as a stream that never ends.
    pub fn events(&self) -> Events<'_> {
        self.events.events()
    }

    /// The next event, which must be a `kind` event about this identifier. Cancel-safe.
    ///
    /// # Errors
    ///
    /// [`Error::Event`] when another kind came (a rejection, an error: its status and private
    /// data are in the error); [`Error::OtherIdentifier`] for an event about another
    /// identifier of the channel.
    pub async fn wait_event(&self, kind: EventKind) -> Result<Event> {
        let event = self.next_event().await?;
        self.id.expect_event(event, kind)
    }

    /// Resolves `dst`'s address and route, each within librdmacm's `timeout`, as
    /// [`CmId::resolve`].
    ///
    /// # Errors
    ///
    /// As [`CmId::resolve`] (an unreachable address is an [`Error::Event`] with `AddrError`).
    pub async fn resolve(&self, dst: SocketAddr, timeout: Duration) -> Result<()> {
        self.id.resolve_addr(None, dst, timeout)?;
        drop(self.wait_event(EventKind::AddrResolved).await?);
        self.id.resolve_route(timeout)?;
        drop(self.wait_event(EventKind::RouteResolved).await?);
        Ok(())
    }

    /// Connects `qp` (RC, RESET, on this identifier's [`context`](CmId::context), after
    /// [`resolve`](Self::resolve)) as [`CmId::connect_qp`] does: returns it in RTS with the
    /// private data of the peer's accept.
    ///
    /// # Errors
    ///
    /// As [`CmId::connect_qp`]: a refusal is [`Error::Event`] (`Rejected` with the peer's
    /// private data, `Unreachable`, `ConnectError`).
    pub async fn connect_qp(
        &self,
        qp: QueuePair<Rc, Reset>,
        param: &ConnParam,
    ) -> Result<(QueuePair<Rc, Rts>, Vec<u8>)> {
        self.connect_init_qp(self.id.init_rc_qp(qp)?, param).await
    }

    /// [`connect_qp`](Self::connect_qp) for a queue pair in INIT already, its first receives
    /// posted: from [`CmId::init_rc_qp`], or the identifier's own from [`CmId::create_qp`]
    /// (as [`CmId::connect_init_qp`] does).
    ///
    /// # Errors
    ///
    /// As [`connect_qp`](Self::connect_qp).
    pub async fn connect_init_qp(
        &self,
        qp: QueuePair<Rc, Init>,
        param: &ConnParam,
    ) -> Result<(QueuePair<Rc, Rts>, Vec<u8>)> {
        if self.id.made(&qp) {
            self.id.connect(param)?;
            let established = self.wait_event(EventKind::Established).await?;
            let private_data = established.private_data().to_vec();
            drop(established);
            // SAFETY: the connection manager moved its queue pair to RTS before reporting
            // `Established` (`rdma_connect` with `id->qp` set).
            return Ok((unsafe { qp.assume_state::<Rts>() }, private_data));
        }
        self.id.check_qp(&qp)?;
        self.id.connect(&param.clone().qp_num(qp.qp_num()))?;
        let response = self.wait_event(EventKind::ConnectResponse).await?;
        let private_data = response.private_data().to_vec();
        drop(response);
        Ok((self.id.connect_finish(qp)?, private_data))
    }

    /// Accepts the connect request this identifier came with on `qp` (RC, RESET, on its
    /// [`context`](CmId::context)) as [`CmId::accept_qp`] does, and waits for `Established`.
    /// To post receives before the client can send, use [`CmId::ready_rc_qp`] and
    /// [`accept`](Self::accept) instead.
    ///
    /// # Errors
    ///
    /// As [`CmId::accept_qp`].
    pub async fn accept_qp(
        &self,
        qp: QueuePair<Rc, Reset>,
        param: &ConnParam,
    ) -> Result<QueuePair<Rc, Rts>> {
        let qp = self.id.ready_rc_qp(qp)?;
        self.accept(&qp, param).await?;
        Ok(qp)
    }

    /// `rdma_accept` of the connect request this identifier came with, on `qp` (from
    /// [`CmId::ready_rc_qp`], its first receives posted), then waits for `Established`.
    ///
    /// # Errors
    ///
    /// As [`CmId::accept`] and [`wait_event`](Self::wait_event); on a failed wait the
    /// connection is ended (`rdma_disconnect`, best effort).
    pub async fn accept(&self, qp: &QueuePair<Rc, Rts>, param: &ConnParam) -> Result<()> {
        self.id.accept(&param.clone().qp_num(qp.qp_num()))?;
        match self.wait_event(EventKind::Established).await {
            Ok(established) => {
                drop(established);
                Ok(())
            }
            Err(error) => {
                // As in the blocking helper: end the connection should it still complete.
                let _ = self.id.disconnect();
                Err(error)
            }
        }
    }

    /// Disconnects ([`CmId::disconnect`]) and waits for the `Disconnected` event.
    ///
    /// # Errors
    ///
    /// As [`CmId::disconnect`] and [`wait_event`](Self::wait_event).
    pub async fn disconnect(&self) -> Result<()> {
        self.id.disconnect()?;
        drop(self.wait_event(EventKind::Disconnected).await?);
        Ok(())
    }

    /// Joins multicast group `group` and waits for the `MulticastJoin` event, as
    /// [`CmId::join_group`]. Cancelled after the join went out, the group stays joined
    /// ([`CmId::multicast_groups`] lists it; leave it, or it is left when the identifier is
    /// destroyed) and its event stays queued for the next wait.
    ///
    /// # Errors
    ///
    /// As [`CmId::join_group`].
    pub async fn join_group(&self, group: IpAddr, kind: JoinKind) -> Result<UdParam> {
        self.id.join_multicast(group, kind)?;
        let joined = match self.wait_event(EventKind::MulticastJoin).await {
            Ok(event) => event.ud_param().ok_or(NO_UD_PARAM),
            Err(error) => Err(error),
        };
        if joined.is_err() {
            let _ = self.id.leave_multicast(group);
        }
        joined
    }
}

/// A listening identifier registered with tokio: connect requests come as
/// [`AsyncConnectRequest`]s, each identifier on a channel of its own.
#[derive(Debug)]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub struct AsyncListener {
    id: AsyncCmId,
}

impl AsyncListener {
    /// Binds `addr` in port space `ps` (port 0: any free port) and listens with `backlog`.
    ///
    /// # Errors
    ///
    /// As [`AsyncCmId::new`], [`CmId::bind_addr`] and [`CmId::listen`].
    pub fn bind(addr: SocketAddr, ps: PortSpace, backlog: i32) -> Result<Self> {
        let id = AsyncCmId::new(ps)?;
        id.id().bind_addr(addr)?;
        id.id().listen(backlog)?;
        Ok(Self { id })
    }

    /// The listening identifier.
    pub fn id(&self) -> &CmId {
        self.id.id()
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.id().local_addr()
    }

    /// Polls for the next connect request. Events of other kinds on the listener (address
    /// changes) are acknowledged and passed over, except `DeviceRemoval`, an error.
    ///
    /// # Errors
    ///
    /// As [`AsyncEventChannel::poll_next_event`] and [`ConnectRequest::from_event`];
    /// [`Error::Event`] for `DeviceRemoval`.
    pub fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<Result<AsyncConnectRequest>> {
        loop {
            let event = ready!(self.id.events.poll_next_event(cx))?;
            match event.kind() {
                EventKind::ConnectRequest => {
                    return Poll::Ready(
                        ConnectRequest::from_event(event).and_then(AsyncConnectRequest::new),
                    );
                }
                EventKind::DeviceRemoval => {
                    return Poll::Ready(Err(event.into_error(EventKind::ConnectRequest)));
                }
                _ => drop(event),
            }
        }
    }

    /// The next connect request. Cancel-safe.
    ///
    /// # Errors
    ///
    /// As [`poll_accept`](Self::poll_accept).
    pub async fn accept(&self) -> Result<AsyncConnectRequest> {
        std::future::poll_fn(|cx| self.poll_accept(cx)).await
    }

    /// The connect requests, as a stream that never ends (an error is an item).
    pub fn incoming(&self) -> Incoming<'_> {
        Incoming(self)
    }
}

/// The connect requests of an [`AsyncListener`] as a [`Stream`]: from
/// [`AsyncListener::incoming`].
#[derive(Debug)]
#[must_use = "streams do nothing unless polled"]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub struct Incoming<'a>(&'a AsyncListener);

impl Stream for Incoming<'_> {
    type Item = Result<AsyncConnectRequest>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_accept(cx).map(Some)
    }
}

/// A connect request from an [`AsyncListener`]: its identifier (alone on its own channel, in
/// the reactor) and what the request carried. Accept with [`AsyncCmId::accept_qp`] (or
/// [`CmId::accept_ud`]) or [`CmId::reject`]; dropped, the client is refused.
#[derive(Debug)]
#[must_use = "a connect request is refused when dropped"]
#[non_exhaustive]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub struct AsyncConnectRequest {
    /// The request's identifier.
    pub id: AsyncCmId,
    /// The private data of the request (the whole field of the message).
    pub private_data: Vec<u8>,
    /// The client's connection parameters (connected port spaces).
    pub peer: Option<crate::PeerParam>,
}

impl AsyncConnectRequest {
    fn new(request: ConnectRequest) -> Result<Self> {
        Ok(Self {
            id: AsyncCmId::from_id(request.id)?,
            private_data: request.private_data,
            peer: request.peer,
        })
    }
}

/// Maps an error of tokio's reactor: an OS error keeps its errno; tokio's own (no runtime, or
/// one shutting down) becomes `ESHUTDOWN`.
fn io_error(call: &'static str, error: &io::Error) -> Error {
    Error::Call {
        call,
        errno: Errno::from_raw(error.raw_os_error().unwrap_or(libc::ESHUTDOWN)),
    }
}
