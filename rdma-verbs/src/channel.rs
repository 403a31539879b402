//! Completion channels: file descriptors that wake a thread when a completion queue has work.

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::cq::{CompletionQueue, EventCounter};
use crate::device::Context;
use crate::error::{Errno, Error, Result};
use crate::ffi;

/// Events are acknowledged (`ibv_ack_cq_events`) in batches of this many per CQ; the rest when
/// the CQ is dropped. Acknowledging takes a mutex, so one call per event would cost on the
/// event path.
const ACK_BATCH: u32 = 64;

pub(crate) struct ChannelInner {
    raw: NonNull<ffi::ibv_comp_channel>,
    context: Context,
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
}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        // SAFETY: every CQ using the channel holds an Arc to it, so none is left.
        let ret = unsafe { ffi::ibv_destroy_comp_channel(self.raw.as_ptr()) };
        debug_assert_eq!(ret, 0, "ibv_destroy_comp_channel failed");
    }
}

/// A completion channel (`struct ibv_comp_channel`): a file descriptor that becomes readable
/// when an armed completion queue attached to it gets a completion.
///
/// Use: create the CQ with [`CqBuilder::channel`](crate::CqBuilder::channel), arm it with
/// [`CompletionQueue::req_notify`], wait with [`wait`](Self::wait) (or poll the descriptor,
/// for example with tokio's `AsyncFd`), then poll the CQ and re-arm it. Events are
/// acknowledged in batches, and the rest when the CQ is dropped.
///
/// `Send` and `Sync`; cloning is cheap.
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
    /// Whether this event is for `cq`.
    pub fn is_for(&self, cq: &CompletionQueue) -> bool {
        self.cq == cq.as_raw()
    }
}

impl Context {
    /// `ibv_create_comp_channel`: creates a completion channel.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with the errno of `ibv_create_comp_channel`.
    #[doc(alias = "ibv_create_comp_channel")]
    pub fn create_comp_channel(&self) -> Result<CompletionChannel> {
        // SAFETY: live context.
        let raw = unsafe { ffi::ibv_create_comp_channel(self.as_raw()) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_create_comp_channel"))?;
        Ok(CompletionChannel {
            inner: Arc::new(ChannelInner {
                raw,
                context: self.clone(),
            }),
        })
    }
}

impl CompletionChannel {
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
    /// # Errors
    ///
    /// [`Error::Verb`] if `fcntl` fails.
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<()> {
        set_nonblocking(self.as_raw_fd(), nonblocking)
    }

    /// `ibv_get_cq_event`: takes the next event: `Ok(Some(event))`, or `Ok(None)` if the channel
    /// is non-blocking and no event is ready. A blocking channel waits for one.
    ///
    /// The event is counted for acknowledgement against its CQ.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with the errno of `ibv_get_cq_event`.
    #[doc(alias = "ibv_get_cq_event")]
    pub fn get_event(&self) -> Result<Option<CqEvent>> {
        let mut cq: *mut ffi::ibv_cq = std::ptr::null_mut();
        let mut cq_context: *mut libc::c_void = std::ptr::null_mut();
        // SAFETY: live channel; valid out-pointers.
        let ret = unsafe { ffi::ibv_get_cq_event(self.as_raw(), &mut cq, &mut cq_context) };
        if ret != 0 {
            let errno = Errno::last();
            if errno == Errno::AGAIN {
                return Ok(None);
            }
            return Err(Error::verb("ibv_get_cq_event", errno));
        }
        if !cq_context.is_null() {
            // SAFETY: every CQ this crate creates has a boxed EventCounter as its cq_context,
            // alive until the CQ is destroyed; ibv_destroy_cq waits for this event's
            // acknowledgement, so the CQ (and the counter) is alive here.
            let counter = unsafe { &*cq_context.cast::<EventCounter>() };
            let unacked = counter.unacked.fetch_add(1, Ordering::AcqRel) + 1;
            if unacked >= ACK_BATCH {
                let taken = counter.unacked.swap(0, Ordering::AcqRel);
                if taken > 0 {
                    // SAFETY: live CQ with at least `taken` unacknowledged events.
                    unsafe { ffi::ibv_ack_cq_events(cq, taken) };
                }
            }
        }
        Ok(Some(CqEvent { cq }))
    }

    /// Waits up to `timeout` for the next event.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] if none arrives in time, else as [`get_event`](Self::get_event).
    pub fn wait(&self, timeout: Duration) -> Result<CqEvent> {
        let deadline = Instant::now() + timeout;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if !poll_readable(self.as_raw_fd(), remaining)? {
                return Err(Error::Timeout(timeout));
            }
            // The descriptor may be blocking: it is readable, so this does not block.
            let was_nonblocking = is_nonblocking(self.as_raw_fd())?;
            if !was_nonblocking {
                set_nonblocking(self.as_raw_fd(), true)?;
            }
            let event = self.get_event();
            if !was_nonblocking {
                set_nonblocking(self.as_raw_fd(), false)?;
            }
            if let Some(event) = event? {
                return Ok(event);
            }
        }
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

/// Waits up to `timeout` for `fd` to be readable; `Ok(false)` on timeout.
pub(crate) fn poll_readable(fd: RawFd, timeout: Duration) -> Result<bool> {
    let deadline = Instant::now() + timeout;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let millis = i32::try_from(remaining.as_millis()).unwrap_or(i32::MAX);
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
            if Instant::now() >= deadline {
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
