//! Event channels: where the connection manager reports what happened to identifiers.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

use rdma_verbs_sys as ffi;

use crate::error::{Error, Result};

/// An event channel (`rdma_create_event_channel`): a file descriptor the connection manager
/// reports events on, for every identifier created on it or migrated to it.
///
/// The descriptor is non-blocking from the start; [`get_event`](Self::get_event) waits with
/// `poll(2)` for a bounded time, and the descriptor ([`AsFd`]) can go into any event loop.
/// Cloning gives another handle to the same channel; the channel is destroyed when the last
/// handle and the last identifier on it are gone, so that no identifier outlives the channel
/// it reports on.
///
/// # References
///
/// [`rdma_create_event_channel(3)`](https://man7.org/linux/man-pages/man3/rdma_create_event_channel.3.html)
#[derive(Clone, Debug)]
#[doc(alias = "rdma_create_event_channel")]
pub struct EventChannel(pub(crate) Arc<ChannelInner>);

#[derive(Debug)]
pub(crate) struct ChannelInner {
    raw: NonNull<ffi::rdma_event_channel>,
    /// Held while librdmacm reads or writes the fields of an identifier reporting on this
    /// channel: by every call on such an identifier and while an event is read (reading an
    /// event updates its identifier's address and route). See `docs/rdma-cm.md`.
    lock: Mutex<()>,
}

// SAFETY: the channel is a file descriptor plus librdmacm's bookkeeping; librdmacm's calls on
// it are thread-safe, and this crate serialises the ones that touch identifier fields with
// `lock`.
unsafe impl Send for ChannelInner {}
// SAFETY: as above.
unsafe impl Sync for ChannelInner {}

impl ChannelInner {
    pub(crate) fn as_raw(&self) -> *mut ffi::rdma_event_channel {
        self.raw.as_ptr()
    }

    /// The lock of the identifiers on this channel. A panic while it was held left no
    /// librdmacm state half-changed (the C calls do not unwind), so a poisoned lock is taken.
    pub(crate) fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets `O_NONBLOCK` on the descriptor if something cleared it.
    pub(crate) fn ensure_nonblocking(&self) -> Result<()> {
        let fd = self.fd();
        // SAFETY: fcntl on the channel's own open descriptor.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(Error::last("fcntl"));
        }
        if flags & libc::O_NONBLOCK != 0 {
            return Ok(());
        }
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(Error::last("fcntl"));
        }
        Ok(())
    }

    pub(crate) fn fd(&self) -> RawFd {
        // SAFETY: a live channel; `fd` is set at creation and never changes.
        unsafe { (*self.raw.as_ptr()).fd }
    }
}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        // SAFETY: every identifier created on or migrated to this channel holds it, so none
        // is left; every event read from it held an identifier, so all are acknowledged.
        unsafe { ffi::rdma_destroy_event_channel(self.raw.as_ptr()) };
    }
}

impl EventChannel {
    /// `rdma_create_event_channel`, with the descriptor set non-blocking.
    ///
    /// # Errors
    ///
    /// [`Error::Call`] with `rdma_create_event_channel` (`ENODEV` when the kernel has no RDMA
    /// connection manager) or `fcntl`.
    ///
    /// # References
    ///
    /// [`rdma_create_event_channel(3)`](https://man7.org/linux/man-pages/man3/rdma_create_event_channel.3.html)
    #[doc(alias = "rdma_create_event_channel")]
    pub fn new() -> Result<Self> {
        // SAFETY: no arguments; returns null on failure.
        let raw = unsafe { ffi::rdma_create_event_channel() };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("rdma_create_event_channel"))?;
        let inner = ChannelInner {
            raw,
            lock: Mutex::new(()),
        };
        // On failure `inner` is dropped, destroying the channel.
        inner.ensure_nonblocking()?;
        Ok(Self(Arc::new(inner)))
    }

    /// The raw channel, valid while this handle lives.
    pub fn as_raw(&self) -> *mut ffi::rdma_event_channel {
        self.0.as_raw()
    }

    /// Whether `self` and `other` are handles to the same channel.
    pub fn same_as(&self, other: &EventChannel) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl AsFd for EventChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor stays open while the channel (held by this handle) lives.
        unsafe { BorrowedFd::borrow_raw(self.0.fd()) }
    }
}

impl AsRawFd for EventChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.0.fd()
    }
}

/// Waits at most `timeout` (`poll(2)`, restarted on `EINTR`) for `fd` to be readable.
///
/// # Errors
///
/// [`Error::Call`] with `poll` and its errno.
pub(crate) fn readable_within(fd: BorrowedFd<'_>, timeout: std::time::Duration) -> Result<bool> {
    let deadline = std::time::Instant::now().checked_add(timeout);
    loop {
        let wait_ms = match deadline {
            None => -1,
            Some(deadline) => {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                // Rounded up, so that a short wait does not spin.
                i32::try_from(left.as_millis() + 1).unwrap_or(i32::MAX)
            }
        };
        let mut pollfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for a descriptor the borrow keeps open.
        let ret = unsafe { libc::poll(&mut pollfd, 1, wait_ms) };
        if ret > 0 {
            return Ok(true);
        }
        if ret == 0 {
            return Ok(false);
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return Err(Error::last("poll"));
        }
    }
}
