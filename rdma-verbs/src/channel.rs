//! Completion channels: file descriptors that wake a thread when a completion queue has work.

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::device::Context;
use crate::error::{Errno, Error, Result};
use crate::ffi;

/// Events are acknowledged (`ibv_ack_cq_events`) in batches of this many per CQ; the rest when
/// the CQ is dropped. Acknowledging takes a mutex, so one call per event would cost on the
/// event path.
const ACK_BATCH: u32 = 64;

/// Per-CQ bookkeeping the completion channel reaches through `cq_context`: events received but
/// not yet acknowledged.
pub(crate) struct EventCounter {
    pub(crate) unacked: AtomicU32,
    /// Set (under the channel's event lock) when the CQ is being destroyed: an event for it
    /// taken from the channel after that is acknowledged at once, because `ibv_destroy_cq`
    /// waits for it and would otherwise wait forever.
    pub(crate) closing: AtomicBool,
}

pub(crate) struct ChannelInner {
    raw: NonNull<ffi::ibv_comp_channel>,
    context: Context,
    /// Whether [`CompletionChannel::get_event`] returns `Ok(None)` rather than waiting when no
    /// event is ready. The descriptor is made non-blocking when the channel is created, and the
    /// crate never changes that: switching its flag around each read would race with other
    /// threads reading the same channel (one thread's restore could leave another's read
    /// blocking past its time-out).
    nonblocking: AtomicBool,
    /// Held from taking an event to counting it against its CQ, and by a CQ's drop while it
    /// takes the count: without it, a CQ could be destroyed (and its counter freed) between
    /// the two, leaving `ibv_destroy_cq` waiting for an event nobody acknowledges.
    ///
    /// The crate reads the descriptor only under this lock, and only after `poll` said an event
    /// is there, so the read returns at once even if the descriptor was made blocking behind
    /// the crate's back (safe code can: a duplicate of [`AsFd`] shares the file status flags);
    /// the lock is never held across a wait.
    events: Mutex<()>,
    /// Set once `ibv_destroy_comp_channel` succeeded.
    destroyed: bool,
}

// SAFETY: a completion channel is a file descriptor plus libibverbs bookkeeping that is safe to
// use from any thread.
unsafe impl Send for ChannelInner {}
// SAFETY: as above.
unsafe impl Sync for ChannelInner {}

impl ChannelInner {
    pub(crate) fn as_raw(&self) -> *mut ffi::ibv_comp_channel {
        self.raw.as_ptr()
    }

    pub(crate) fn lock_events(&self) -> MutexGuard<'_, ()> {
        // Nothing panics while holding it; a poisoned lock still serializes.
        self.events.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl ChannelInner {
    /// `ibv_destroy_comp_channel`, once.
    fn destroy(&mut self) -> Result<()> {
        if self.destroyed {
            return Ok(());
        }
        // SAFETY: live channel (not yet destroyed); every CQ using it holds an Arc to it, so
        // none is left.
        let ret = unsafe { ffi::ibv_destroy_comp_channel(self.raw.as_ptr()) };
        Errno::result(ret).map_err(|errno| Error::verb("ibv_destroy_comp_channel", errno))?;
        self.destroyed = true;
        Ok(())
    }
}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        // Drop cannot report a failure and must not panic (see "Resource cleanup" in the crate
        // documentation).
        let _ = self.destroy();
    }
}

/// A completion channel (`struct ibv_comp_channel`): a file descriptor that becomes readable
/// when an armed completion queue attached to it gets a completion.
///
/// Use: create the CQ with [`CqBuilder::channel`](crate::cq::CqBuilder::channel), arm it with
/// [`CompletionQueue::req_notify`](crate::CompletionQueue::req_notify), wait with
/// [`wait`](Self::wait) (or poll the descriptor, for example with tokio's `AsyncFd`), then poll
/// the CQ and re-arm it. Events are acknowledged in batches, and the rest when the CQ is
/// dropped.
///
/// `Send` and `Sync`; cloning is cheap.
///
/// # Examples
///
/// ```no_run
/// # use rdma_verbs::{*, ah::*, async_event::*, channel::*, cq::*, device::*, mr::*, mw::*, owned::*, qp::*, scope::*, slot::*, srq::*, wr::*, xrcd::*, ah::*, async_event::*, channel::*, cq::*, device::*, mr::*, mw::*, owned::*, qp::*, scope::*, slot::*, srq::*, wr::*, xrcd::*};
/// # use std::time::Duration;
/// # let context = Context::open("rxe0")?;
/// let channel = context.create_comp_channel()?;
/// let mut cq = context.cq_builder(64).channel(&channel).build()?;
/// let mut completions = [WorkCompletion::default(); 16];
/// loop {
///     // Arm first, then poll once more: a completion that landed before the arming raises no
///     // event, and would otherwise be slept on.
///     cq.req_notify(false)?;
///     let done = cq.poll(&mut completions)?;
///     if done.is_empty() {
///         channel.wait(Duration::from_secs(5))?;
///         continue;
///     }
///     for wc in done {
///         println!("{} {:?}", wc.wr_id(), wc.status());
///     }
/// #   break;
/// }
/// # Ok::<(), Error>(())
/// ```
#[derive(Clone)]
pub struct CompletionChannel {
    pub(crate) inner: Arc<ChannelInner>,
}

impl fmt::Debug for CompletionChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionChannel")
            .field("fd", &self.as_raw_fd())
            .finish()
    }
}

/// A completion event: the queue named by it has a new completion (it must be re-armed to
/// raise another).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CqEvent {
    cq: *mut ffi::ibv_cq,
}

// SAFETY: the event is only an identity (compared, never dereferenced).
unsafe impl Send for CqEvent {}
// SAFETY: as above.
unsafe impl Sync for CqEvent {}

impl CqEvent {
    /// The queue the event is for (compared, never dereferenced).
    pub(crate) fn cq(&self) -> *mut ffi::ibv_cq {
        self.cq
    }
}

impl Context {
    /// `ibv_create_comp_channel`: creates a completion channel.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with the errno of `ibv_create_comp_channel`, or of `fcntl` making its
    /// descriptor non-blocking.
    ///
    /// # References
    ///
    /// [`ibv_create_comp_channel(3)`](https://man7.org/linux/man-pages/man3/ibv_create_comp_channel.3.html)
    #[doc(alias = "ibv_create_comp_channel")]
    pub fn create_comp_channel(&self) -> Result<CompletionChannel> {
        // SAFETY: live context.
        let raw = unsafe { ffi::ibv_create_comp_channel(self.as_raw()) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_create_comp_channel"))?;
        let inner = Arc::new(ChannelInner {
            raw,
            context: self.clone(),
            nonblocking: AtomicBool::new(false),
            events: Mutex::new(()),
            destroyed: false,
        });
        // SAFETY: `raw` is live (owned by `inner`, which destroys it on every path).
        let fd = unsafe { (*raw.as_ptr()).fd };
        set_nonblocking(fd, true)?;
        Ok(CompletionChannel { inner })
    }
}

impl CompletionChannel {
    /// `ibv_destroy_comp_channel`: what dropping the last handle does, with the failure
    /// reported. On failure the channel is handed back; dropping it tries again.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with `ibv_destroy_comp_channel` and `EBUSY`, without calling it, while
    /// a completion queue (or another handle) still holds it; else the verb's error
    /// ([`Error::Verb`] with its errno, or [`Error::Unsupported`]).
    ///
    /// # References
    ///
    /// [`ibv_destroy_comp_channel(3)`](https://man7.org/linux/man-pages/man3/ibv_create_comp_channel.3.html)
    #[doc(alias = "ibv_destroy_comp_channel")]
    pub fn close(mut self) -> std::result::Result<(), (Self, Error)> {
        let result = match Arc::get_mut(&mut self.inner) {
            Some(inner) => inner.destroy(),
            None => Err(Error::verb("ibv_destroy_comp_channel", Errno::BUSY)),
        };
        result.map_err(|error| (self, error))
    }

    /// The context the channel belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.context
    }

    /// The raw `ibv_comp_channel`.
    pub fn as_raw(&self) -> *mut ffi::ibv_comp_channel {
        self.inner.as_raw()
    }

    /// Makes [`get_event`](Self::get_event) return `Ok(None)` instead of blocking when no event
    /// is ready (or blocking again, with `false`).
    ///
    /// This is a mode of the channel, not of its descriptor: the crate makes the descriptor
    /// non-blocking when it creates the channel, as event loops (for example tokio's `AsyncFd`)
    /// need it, and never changes it afterwards. Code that clears `O_NONBLOCK` on it (through a
    /// duplicate of [`AsFd`], which shares the flag) does not make the crate's reads block: it
    /// reads only when `poll` reports an event, under a lock all its reads take.
    ///
    /// # Errors
    ///
    /// None at present; the `Result` is kept for API stability.
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<()> {
        self.inner.nonblocking.store(nonblocking, Ordering::Relaxed);
        Ok(())
    }

    /// `ibv_get_cq_event`: takes the next event: `Ok(Some(event))`, or `Ok(None)` if the channel
    /// is non-blocking and no event is ready. A blocking channel waits for one.
    ///
    /// The event is counted for acknowledgement against its CQ.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with the errno of `ibv_get_cq_event` (or of `poll` while waiting).
    ///
    /// # References
    ///
    /// [`ibv_get_cq_event(3)`](https://man7.org/linux/man-pages/man3/ibv_get_cq_event.3.html)
    #[doc(alias = "ibv_get_cq_event")]
    pub fn get_event(&self) -> Result<Option<CqEvent>> {
        loop {
            if let Some(event) = self.try_get_event()? {
                return Ok(Some(event));
            }
            if self.inner.nonblocking.load(Ordering::Relaxed) {
                return Ok(None);
            }
            // Another thread may take the event this one was woken for: then wait again.
            poll_readable(self.as_raw_fd(), None)?;
        }
    }

    /// Waits up to `timeout` for the next event. [`Duration::MAX`] (or any time-out too long
    /// to represent) waits without a deadline; [`Duration::ZERO`] only takes an event that is
    /// already there. Works the same on a blocking and a non-blocking channel, and with other
    /// threads waiting on the same channel.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] if none arrives in time, else as [`get_event`](Self::get_event).
    pub fn wait(&self, timeout: Duration) -> Result<CqEvent> {
        let deadline = Instant::now().checked_add(timeout);
        loop {
            if let Some(event) = self.try_get_event()? {
                return Ok(event);
            }
            if !poll_readable(self.as_raw_fd(), deadline)? {
                return Err(Error::Timeout(timeout));
            }
        }
    }

    /// One non-blocking `ibv_get_cq_event`: `Ok(None)` when no event is ready.
    pub(crate) fn try_get_event(&self) -> Result<Option<CqEvent>> {
        let mut cq: *mut ffi::ibv_cq = std::ptr::null_mut();
        let mut cq_context: *mut libc::c_void = std::ptr::null_mut();
        // Until the event is counted, its CQ cannot finish dropping (see `ChannelInner`).
        let _counting = self.inner.lock_events();
        // Only read an event that is there: the descriptor may have been made blocking through
        // a duplicate, and a blocking read here would hold the lock for as long as no event
        // comes. Every read of the crate happens under this lock, so the event seen stays.
        if !readable_now(self.as_raw_fd())? {
            return Ok(None);
        }
        // SAFETY: live channel with an event ready, so the read does not wait whatever the
        // descriptor's flags; valid out-pointers.
        let ret = unsafe { ffi::ibv_get_cq_event(self.as_raw(), &mut cq, &mut cq_context) };
        if ret != 0 {
            let errno = Errno::last();
            if errno == Errno::AGAIN || errno.raw() == libc::EINTR {
                return Ok(None);
            }
            return Err(Error::verb("ibv_get_cq_event", errno));
        }
        if !cq_context.is_null() {
            // SAFETY: every CQ this crate creates has a boxed EventCounter as its cq_context,
            // freed after ibv_destroy_cq returns; that waits for this event's acknowledgement,
            // which happens below (here, or in the CQ's drop, which takes the count only under
            // the lock held here), so the counter is alive until then.
            let counter = unsafe { &*cq_context.cast::<EventCounter>() };
            let unacked = counter.unacked.fetch_add(1, Ordering::AcqRel) + 1;
            // A CQ being dropped is waiting in ibv_destroy_cq for this event: acknowledge it
            // now. Nothing touches the counter after the acknowledgement.
            if unacked >= ACK_BATCH || counter.closing.load(Ordering::Relaxed) {
                let taken = counter.unacked.swap(0, Ordering::AcqRel);
                if taken > 0 {
                    // SAFETY: live CQ with at least `taken` unacknowledged events.
                    unsafe { ffi::ibv_ack_cq_events(cq, taken) };
                }
            }
        }
        Ok(Some(CqEvent { cq }))
    }
}

impl AsFd for CompletionChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor is open for as long as the channel, which `self` borrows.
        unsafe { BorrowedFd::borrow_raw(self.as_raw_fd()) }
    }
}

impl AsRawFd for CompletionChannel {
    fn as_raw_fd(&self) -> RawFd {
        // SAFETY: live channel.
        unsafe { (*self.as_raw()).fd }
    }
}

pub(crate) fn is_nonblocking(fd: RawFd) -> Result<bool> {
    // SAFETY: F_GETFL on a descriptor we own has no memory effects.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(Error::last("fcntl"));
    }
    Ok(flags & libc::O_NONBLOCK != 0)
}

pub(crate) fn set_nonblocking(fd: RawFd, nonblocking: bool) -> Result<()> {
    // SAFETY: F_GETFL/F_SETFL on a descriptor we own have no memory effects.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 {
            return Err(Error::last("fcntl"));
        }
        let flags = if nonblocking {
            flags | libc::O_NONBLOCK
        } else {
            flags & !libc::O_NONBLOCK
        };
        if libc::fcntl(fd, libc::F_SETFL, flags) < 0 {
            return Err(Error::last("fcntl"));
        }
    }
    Ok(())
}

/// Whether `fd` is readable now, without waiting (`poll` with a zero time-out). An interrupted
/// `poll` counts as not readable: the callers look again.
fn readable_now(fd: RawFd) -> Result<bool> {
    let mut pollfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut pollfd, 1, 0) };
    if n < 0 {
        let errno = Errno::last();
        if errno.raw() == libc::EINTR {
            return Ok(false);
        }
        return Err(Error::verb("poll", errno));
    }
    Ok(n > 0)
}

/// Waits until `fd` is readable (`Ok(true)`) or `deadline` passes (`Ok(false)`); `None` waits
/// without a deadline.
pub(crate) fn poll_readable(fd: RawFd, deadline: Option<Instant>) -> Result<bool> {
    loop {
        let millis = match deadline {
            None => -1,
            Some(deadline) => {
                let remaining = deadline.saturating_duration_since(Instant::now());
                // Rounded up, so that the wait never ends before the deadline.
                i32::try_from(remaining.as_nanos().div_ceil(1_000_000)).unwrap_or(i32::MAX)
            }
        };
        let mut pollfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pollfd, 1, millis) };
        if n > 0 {
            return Ok(true);
        }
        if n == 0 {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(false);
            }
            continue;
        }
        let errno = Errno::last();
        if errno.raw() != libc::EINTR {
            return Err(Error::verb("poll", errno));
        }
    }
}
