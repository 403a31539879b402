//! Async waits with tokio (feature `tokio`): completion events of a [`CompletionChannel`] and
//! asynchronous events of a [`Context`], both through tokio's `AsyncFd`.
//!
//! Both descriptors are non-blocking and edge-triggered in tokio's reactor: a wait checks
//! readiness, then takes an event with a non-blocking read, and only when that read finds
//! nothing does it clear the readiness and sleep again. An event is only ever taken in the same
//! step that returns it, so every future here is cancel-safe.

use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::task::{Context as TaskContext, Poll, ready};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::async_event::AsyncEvent;
use crate::channel::{CompletionChannel, CqEvent, set_nonblocking};
use crate::cq::{CompletionQueue, WorkCompletion};
use crate::device::Context;
use crate::error::{Errno, Error, Result};
use crate::owned::Completion;

/// The channel's descriptor for tokio's reactor. Holds a clone of the channel, so the
/// descriptor stays open (and the same) while it is registered.
#[derive(Debug)]
struct ChannelFd(CompletionChannel);

impl AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// The context's `async_fd` for tokio's reactor. Holds a clone of the context, so the
/// descriptor stays open (and the same) while it is registered.
#[derive(Debug)]
struct ContextEventFd(Context);

impl AsRawFd for ContextEventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// Registers `inner`'s descriptor with the current runtime's reactor, for reading.
///
/// # Safety
///
/// `inner.as_raw_fd()` must return the same open descriptor for as long as `inner` lives.
unsafe fn register<T: AsRawFd>(inner: T) -> Result<AsyncFd<T>> {
    // SAFETY: the caller's promise is `AsyncFd::register_with_interest`'s requirement: the
    // descriptor stays open and the same until the `AsyncFd` (which owns `inner`) is dropped.
    unsafe { AsyncFd::register_with_interest(inner, Interest::READABLE) }
        .map_err(|e| io_error("epoll_ctl", &io::Error::from(e)))
}

/// Maps an error of tokio's reactor: an OS error keeps its errno; tokio's own (the runtime is
/// shutting down) becomes `ESHUTDOWN`.
fn io_error(verb: &'static str, error: &io::Error) -> Error {
    Error::verb(
        verb,
        Errno::from_raw(error.raw_os_error().unwrap_or(libc::ESHUTDOWN)),
    )
}

/// A [`CompletionChannel`] registered with tokio's reactor: [`wait`](Self::wait) sleeps until
/// the channel has an event (`ibv_get_cq_event`) without blocking the thread.
///
/// Usually the completion queue is read with [`CompletionQueue::poll_async`], which does the
/// poll / arm / poll / wait sequence and closes the race between arming and a completion.
///
/// One `AsyncCompletionChannel` per channel: the reactor registers a descriptor once, so a
/// second one for the same channel (or a clone of it) on the same runtime fails with `EEXIST`.
/// The channel's other uses keep working: its blocking [`CompletionChannel::wait`] and
/// [`CompletionChannel::get_event`] may still be called, from any thread, and the blocking or
/// non-blocking mode set with [`CompletionChannel::set_nonblocking`] is left as it is.
///
/// `Send` and `Sync`; waiting takes `&self`, so several tasks may wait on one channel (each
/// event goes to one of them).
///
/// # Examples
///
/// ```no_run
/// # async fn example(context: rdma_verbs::Context) -> rdma_verbs::Result<()> {
/// use rdma_verbs::{AsyncCompletionChannel, cq::WorkCompletion};
///
/// let channel = context.create_comp_channel()?;
/// let mut cq = context.cq_builder(64).channel(&channel).build()?;
/// let channel = AsyncCompletionChannel::new(channel)?;
/// // ... create queue pairs on `cq`, post work ...
/// let mut completions = [WorkCompletion::default(); 16];
/// for wc in cq.poll_async(&channel, &mut completions).await? {
///     println!("{} {:?}", wc.wr_id(), wc.status());
/// }
/// # Ok(())
/// # }
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
#[derive(Debug)]
pub struct AsyncCompletionChannel {
    fd: AsyncFd<ChannelFd>,
}

impl AsyncCompletionChannel {
    /// Registers `channel`'s descriptor (already non-blocking) with the current tokio
    /// runtime's reactor.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] naming `epoll_ctl` with the reactor's errno: `EEXIST` if the channel is
    /// already registered with this runtime, `ESHUTDOWN` if the runtime is shutting down.
    ///
    /// # Panics
    ///
    /// As tokio's `AsyncFd`: outside a tokio runtime, or in one built without I/O enabled
    /// (`enable_io` or `enable_all`).
    pub fn new(channel: CompletionChannel) -> Result<Self> {
        // SAFETY: `ChannelFd` owns a clone of the channel, whose descriptor is closed only when
        // the last clone is dropped, and `as_raw_fd` always reads the same `fd` field.
        let fd = unsafe { register(ChannelFd(channel))? };
        Ok(Self { fd })
    }

    /// The channel.
    pub fn channel(&self) -> &CompletionChannel {
        &self.fd.get_ref().0
    }

    /// Deregisters the channel from the reactor and returns it.
    pub fn into_inner(self) -> CompletionChannel {
        self.fd.into_inner().0
    }

    /// `ibv_get_cq_event`, awaited: the next completion event, counted for acknowledgement
    /// against its CQ like [`CompletionChannel::get_event`].
    ///
    /// An event comes only for an armed CQ ([`CompletionQueue::req_notify`]); after it, poll
    /// the CQ and re-arm it. For that whole sequence, see [`CompletionQueue::poll_async`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: the future takes an event only in the step that returns it, so dropping it
    /// (for example when a `tokio::time::timeout` or a `select!` branch loses) loses no event.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with the errno of `ibv_get_cq_event`, or naming `epoll_wait` with
    /// `ESHUTDOWN` if the runtime is shutting down.
    ///
    /// # References
    ///
    /// [`ibv_get_cq_event(3)`](https://man7.org/linux/man-pages/man3/ibv_get_cq_event.3.html)
    #[doc(alias = "ibv_get_cq_event")]
    pub async fn wait(&self) -> Result<CqEvent> {
        loop {
            let mut guard = self
                .fd
                .readable()
                .await
                .map_err(|e| io_error("epoll_wait", &e))?;
            match self.channel().try_get_event()? {
                // The guard keeps the readiness: the channel may hold more events.
                Some(event) => return Ok(event),
                // Seen empty (EAGAIN): sleep until the descriptor becomes readable again.
                None => guard.clear_ready(),
            }
        }
    }

    /// `ibv_get_cq_event` as a poll function, for hand-written futures and streams: `Ready`
    /// with the next event, or `Pending` with `cx`'s waker registered.
    ///
    /// Only the waker of the last call is kept; tasks sharing the channel should use
    /// [`wait`](Self::wait). Takes an event only when it returns `Ready(Ok(_))`.
    ///
    /// # Errors
    ///
    /// As [`wait`](Self::wait).
    pub fn poll_wait(&self, cx: &mut TaskContext<'_>) -> Poll<Result<CqEvent>> {
        loop {
            let mut guard =
                ready!(self.fd.poll_read_ready(cx)).map_err(|e| io_error("epoll_wait", &e))?;
            match self.channel().try_get_event()? {
                Some(event) => return Poll::Ready(Ok(event)),
                None => guard.clear_ready(),
            }
        }
    }
}

impl CompletionQueue {
    /// `ibv_poll_cq`, awaiting completions: fills `completions` with at least one completion,
    /// sleeping on `channel` (`ibv_req_notify_cq`, `ibv_get_cq_event`) while the queue is
    /// empty, and returns the filled prefix.
    ///
    /// The sequence, which closes the race between emptying the queue and arming it:
    ///
    /// 1. poll; return what is there;
    /// 2. otherwise arm the queue (`ibv_req_notify_cq`, any completion);
    /// 3. poll again: a completion that arrived between 1 and 2 raised no event, so it must be
    ///    seen here;
    /// 4. otherwise await an event, then start over.
    ///
    /// A call that returns early (at 1 or 3) may leave the queue armed, or an event pending:
    /// the next call then wakes once for nothing and polls again, so no completion is missed
    /// and none is waited for twice. Events are acknowledged as usual (in batches, and the rest
    /// when the queue is dropped).
    ///
    /// `channel` should serve this queue only: an event for another queue on the same channel
    /// is taken (and treated as a spurious wake-up), so that queue's waiter would miss it.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: completions are only taken in the step that returns them, and the only
    /// await is [`AsyncCompletionChannel::wait`], itself cancel-safe. A dropped call can leave
    /// the queue armed, which costs the next call one spurious wake-up.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`] if `completions` is empty or the queue was not created on
    ///   `channel`'s channel (it would never wake up);
    /// - else as [`poll`](Self::poll), [`req_notify`](Self::req_notify) and
    ///   [`AsyncCompletionChannel::wait`].
    ///
    /// # References
    ///
    /// [`ibv_poll_cq(3)`](https://man7.org/linux/man-pages/man3/ibv_poll_cq.3.html)
    /// [`ibv_req_notify_cq(3)`](https://man7.org/linux/man-pages/man3/ibv_req_notify_cq.3.html)
    #[doc(alias = "ibv_poll_cq")]
    #[doc(alias = "ibv_req_notify_cq")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn poll_async<'a>(
        &mut self,
        channel: &AsyncCompletionChannel,
        completions: &'a mut [WorkCompletion],
    ) -> Result<&'a [WorkCompletion]> {
        if completions.is_empty() {
            return Err(Error::InvalidArgument(
                "poll_async needs room for at least one completion".into(),
            ));
        }
        self.check_channel(channel)?;
        loop {
            let n = self.poll(completions)?.len();
            if n > 0 {
                return Ok(&completions[..n]);
            }
            self.req_notify(false)?;
            let n = self.poll(completions)?.len();
            if n > 0 {
                return Ok(&completions[..n]);
            }
            // Whichever queue the event is for, poll again: at worst a spurious wake-up.
            channel.wait().await?;
        }
    }

    /// [`poll_each`](Self::poll_each), awaiting completions: hands at least one completion
    /// (up to `max`) to `f`, with the buffer and tag of each owned request, sleeping on
    /// `channel` while the queue is empty, and returns how many it handed over. The same
    /// sequence as [`poll_async`](Self::poll_async) (poll, arm, poll, await), with the same
    /// rule: `channel` should serve this queue only (a waiter of another queue on it could take
    /// this queue's event, and this call would sleep past its completion).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: completions are taken only inside `poll_each`, which hands each to `f`
    /// before it returns; the only await is [`AsyncCompletionChannel::wait`]. A dropped call
    /// loses no completion and no buffer.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `max` is 0 or the queue is not on `channel`'s channel;
    /// else as [`poll_each`](Self::poll_each) and [`AsyncCompletionChannel::wait`].
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn poll_each_async(
        &mut self,
        channel: &AsyncCompletionChannel,
        max: usize,
        mut f: impl FnMut(Completion),
    ) -> Result<usize> {
        if max == 0 {
            return Err(Error::InvalidArgument(
                "poll_each_async needs to hand over at least one completion".into(),
            ));
        }
        self.check_channel(channel)?;
        loop {
            let n = self.poll_each(max, &mut f)?;
            if n > 0 {
                return Ok(n);
            }
            self.req_notify(false)?;
            let n = self.poll_each(max, &mut f)?;
            if n > 0 {
                return Ok(n);
            }
            channel.wait().await?;
        }
    }

    /// Refuses a channel the queue was not created on (a wait on it would never wake).
    fn check_channel(&self, channel: &AsyncCompletionChannel) -> Result<()> {
        // SAFETY: live CQ; `channel` is set at creation and never changes.
        let own_channel = unsafe { (*self.as_raw()).channel };
        if own_channel != channel.channel().as_raw() {
            return Err(Error::InvalidArgument(
                "the completion queue is not on this completion channel".into(),
            ));
        }
        Ok(())
    }
}

/// A context's asynchronous events (`ibv_get_async_event`) registered with tokio's reactor:
/// [`next`](Self::next) sleeps until the device reports one (a port change, a queue pair or
/// CQ error, an SRQ limit, ...) without blocking the thread.
///
/// One per context: a second for the same context on the same runtime fails with `EEXIST`.
/// [`Context::get_async_event`] and [`Context::wait_async_event`] keep working; each event goes
/// to one reader.
///
/// `Send` and `Sync`.
///
/// # Examples
///
/// ```no_run
/// # async fn example(context: rdma_verbs::Context) -> rdma_verbs::Result<()> {
/// use rdma_verbs::{AsyncContextEvents, async_event::AsyncEvent};
///
/// let events = AsyncContextEvents::new(context.clone())?;
/// loop {
///     match events.next().await? {
///         AsyncEvent::PortError { port } => eprintln!("port {port} went down"),
///         event => eprintln!("{}", event.type_name()),
///     }
/// }
/// # }
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
#[derive(Debug)]
pub struct AsyncContextEvents {
    fd: AsyncFd<ContextEventFd>,
}

impl AsyncContextEvents {
    /// Makes `context`'s asynchronous event descriptor (`async_fd`) non-blocking and registers
    /// it with the current tokio runtime's reactor.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] naming `fcntl`, or `epoll_ctl` with the reactor's errno: `EEXIST` if the
    /// context's events are already registered with this runtime, `ESHUTDOWN` if the runtime
    /// is shutting down.
    ///
    /// # Panics
    ///
    /// As tokio's `AsyncFd`: outside a tokio runtime, or in one built without I/O enabled
    /// (`enable_io` or `enable_all`).
    pub fn new(context: Context) -> Result<Self> {
        set_nonblocking(context.as_fd().as_raw_fd(), true)?;
        // SAFETY: `ContextEventFd` owns a clone of the context, whose `async_fd` is open until
        // the device context is closed, which the clone prevents; `as_raw_fd` always reads the
        // same field.
        let fd = unsafe { register(ContextEventFd(context))? };
        Ok(Self { fd })
    }

    /// The context.
    pub fn context(&self) -> &Context {
        &self.fd.get_ref().0
    }

    /// `ibv_get_async_event` + `ibv_ack_async_event`, awaited: the next asynchronous event,
    /// already acknowledged.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: an event is taken (and acknowledged) only in the step that returns it.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with the errno of `ibv_get_async_event`, or naming `epoll_wait` with
    /// `ESHUTDOWN` if the runtime is shutting down.
    ///
    /// # References
    ///
    /// [`ibv_get_async_event(3)`](https://man7.org/linux/man-pages/man3/ibv_get_async_event.3.html)
    /// [`ibv_ack_async_event(3)`](https://man7.org/linux/man-pages/man3/ibv_ack_async_event.3.html)
    #[doc(alias = "ibv_get_async_event")]
    #[doc(alias = "ibv_ack_async_event")]
    pub async fn next(&self) -> Result<AsyncEvent> {
        loop {
            let mut guard = self
                .fd
                .readable()
                .await
                .map_err(|e| io_error("epoll_wait", &e))?;
            match self.context().get_async_event()? {
                Some(event) => return Ok(event),
                None => guard.clear_ready(),
            }
        }
    }

    /// `ibv_get_async_event` + `ibv_ack_async_event` as a poll function, for hand-written
    /// futures and streams: `Ready` with the next event, or `Pending` with `cx`'s waker
    /// registered.
    ///
    /// Only the waker of the last call is kept; tasks sharing the events should use
    /// [`next`](Self::next). Takes an event only when it returns `Ready(Ok(_))`.
    ///
    /// # Errors
    ///
    /// As [`next`](Self::next).
    pub fn poll_next(&self, cx: &mut TaskContext<'_>) -> Poll<Result<AsyncEvent>> {
        loop {
            let mut guard =
                ready!(self.fd.poll_read_ready(cx)).map_err(|e| io_error("epoll_wait", &e))?;
            match self.context().get_async_event()? {
                Some(event) => return Poll::Ready(Ok(event)),
                None => guard.clear_ready(),
            }
        }
    }
}
