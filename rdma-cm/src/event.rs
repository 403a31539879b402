//! Events: what the connection manager reports, each acknowledged exactly once, when dropped.

use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rdma_verbs::Errno;
use rdma_verbs_sys as ffi;

use crate::c_enum::EventKind;
use crate::channel::EventChannel;
use crate::error::{Error, Result};
use crate::id::{CmId, IdInner, PortSpace};
use crate::param::PeerParam;

/// One event read from an [`EventChannel`]. Dropping it acknowledges it
/// (`rdma_ack_cm_event`), exactly once; its private data is readable until then. It holds the
/// identifier it is about, so that identifier cannot be destroyed under it.
///
/// # References
///
/// [`rdma_get_cm_event(3)`](https://man7.org/linux/man-pages/man3/rdma_get_cm_event.3.html),
/// [`rdma_ack_cm_event(3)`](https://man7.org/linux/man-pages/man3/rdma_ack_cm_event.3.html)
#[derive(Debug)]
#[must_use = "an event is acknowledged when dropped; a connect request's identifier is destroyed with it unless taken"]
#[doc(alias = "rdma_get_cm_event")]
#[doc(alias = "rdma_ack_cm_event")]
pub struct Event {
    raw: NonNull<ffi::rdma_cm_event>,
    kind: EventKind,
    status: i32,
    ud: bool,
    /// The identifier whose events the acknowledgement completes: the listener for a
    /// connect request, otherwise the event's own identifier.
    owner: Arc<IdInner>,
    /// A connect request's new identifier, until taken.
    new_id: Option<CmId>,
    /// For a multicast event, its group's token and address.
    pub(crate) group: Option<(usize, std::net::IpAddr)>,
}

// SAFETY: the event's memory is librdmacm's until acknowledged and is only read here;
// `rdma_ack_cm_event` may be called from any thread.
unsafe impl Send for Event {}
// SAFETY: as above: shared access only reads.
unsafe impl Sync for Event {}

impl Event {
    /// The kind.
    pub fn kind(&self) -> EventKind {
        self.kind
    }

    /// The status: 0 on success; a negative errno for errors (`AddrError`, `RouteError`,
    /// `Unreachable`, `ConnectError`: for example -110, `ETIMEDOUT`); for `Rejected` the
    /// reject reason (28 when the peer's application rejected); for `Unreachable` of a UD
    /// identifier the SIDR reply's status (1 when nothing listens on the port, 2 when the
    /// server rejected).
    pub fn status(&self) -> i32 {
        self.status
    }

    /// The private data the peer sent with it (connect request, response, established,
    /// rejected), empty for other kinds. On InfiniBand and RoCE the wire has no length, so
    /// this is the whole private-data field of the message (56 bytes in a connect request,
    /// 196 in an accept, 148 in a reject), the sender's bytes first and zeros after them.
    pub fn private_data(&self) -> &[u8] {
        if !self.kind.has_param() {
            return &[];
        }
        // SAFETY: an unacknowledged event; the union member follows from the identifier's
        // port space, and both members start with the private data pointer and length.
        let (data, len) = unsafe {
            let param = &(*self.raw.as_ptr()).param;
            if self.ud {
                (param.ud.private_data, param.ud.private_data_len)
            } else {
                (param.conn.private_data, param.conn.private_data_len)
            }
        };
        if data.is_null() || len == 0 {
            return &[];
        }
        // SAFETY: librdmacm keeps the private data with the event until it is acknowledged,
        // which cannot happen while `self` is borrowed.
        unsafe { std::slice::from_raw_parts(data.cast::<u8>(), usize::from(len)) }
    }

    /// The peer's connection parameters, for connected port spaces and the kinds that carry
    /// them.
    pub fn peer_param(&self) -> Option<PeerParam> {
        if self.ud || !self.kind.has_param() {
            return None;
        }
        // SAFETY: an unacknowledged event of a connected port space: `conn` is the member.
        Some(PeerParam::from_raw(unsafe {
            &(*self.raw.as_ptr()).param.conn
        }))
    }

    /// The identifier the event is about: a connect request's new one (`None` once
    /// [`take_id`](Self::take_id) took it), otherwise the identifier it was reported for.
    pub fn id(&self) -> Option<CmId> {
        if self.kind == EventKind::ConnectRequest {
            self.new_id.clone()
        } else {
            Some(CmId(self.owner.clone()))
        }
    }

    /// For a connect request, the listening identifier it came to.
    pub fn listener(&self) -> Option<CmId> {
        (self.kind == EventKind::ConnectRequest).then(|| CmId(self.owner.clone()))
    }

    /// Takes a connect request's new identifier, to accept or reject on. Not taken, it is
    /// destroyed after the event is acknowledged (the peer's request goes unanswered, and
    /// times out or is rejected by its connection manager).
    pub fn take_id(&mut self) -> Option<CmId> {
        self.new_id.take()
    }

    /// Whether the event is about `id` (for a connect request: came to listener `id`).
    pub fn is_for(&self, id: &CmId) -> bool {
        Arc::ptr_eq(&self.owner, &id.0)
    }

    /// Whether the event is about an identifier of the UDP port space (its parameters are
    /// the `ud` member).
    pub(crate) fn is_ud(&self) -> bool {
        self.ud
    }

    /// The raw event, valid until this is dropped.
    pub fn as_raw(&self) -> *mut ffi::rdma_cm_event {
        self.raw.as_ptr()
    }

    /// Copies what a failed wait reports.
    pub(crate) fn into_error(self, expected: EventKind) -> Error {
        Error::Event {
            expected,
            event: self.kind,
            status: self.status,
            private_data: self.private_data().to_vec(),
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: read from librdmacm and not acknowledged yet; this is the only place that
        // acknowledges it. The identifiers it names are alive (`owner`, `new_id`, dropped
        // only after this body).
        unsafe { ffi::rdma_ack_cm_event(self.raw.as_ptr()) };
        if let Some((token, _)) = self.group {
            let mut groups = self.owner.groups.lock().unwrap_or_else(|e| e.into_inner());
            groups.event_done(token);
        }
        self.owner.held.fetch_sub(1, Ordering::SeqCst);
    }
}

impl EventChannel {
    /// `rdma_get_cm_event`: the next event, waiting at most `timeout` (`None`: forever);
    /// `Ok(None)` when none came in time.
    ///
    /// Events about identifiers that are being destroyed (their last handle is gone) are
    /// acknowledged here and not returned.
    ///
    /// # Errors
    ///
    /// [`Error::Call`] with `poll` or `rdma_get_cm_event`.
    ///
    /// # References
    ///
    /// [`rdma_get_cm_event(3)`](https://man7.org/linux/man-pages/man3/rdma_get_cm_event.3.html)
    #[doc(alias = "rdma_get_cm_event")]
    pub fn get_event(&self, timeout: Option<Duration>) -> Result<Option<Event>> {
        // A timeout too large to add is no timeout.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            if let Some(event) = self.try_get_event()? {
                return Ok(Some(event));
            }
            let wait_ms = match deadline {
                None => -1,
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(None);
                    }
                    // Rounded up, so that a short wait does not spin.
                    i32::try_from(left.as_millis() + 1).unwrap_or(i32::MAX)
                }
            };
            let mut pollfd = libc::pollfd {
                fd: self.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the channel's open descriptor.
            let ret = unsafe { libc::poll(&mut pollfd, 1, wait_ms) };
            if ret < 0 && Errno::last().raw() != libc::EINTR {
                return Err(Error::last("poll"));
            }
        }
    }

    /// `rdma_get_cm_event` without waiting: the next event if one is there.
    ///
    /// # Errors
    ///
    /// [`Error::Call`] with `rdma_get_cm_event`.
    pub fn try_get_event(&self) -> Result<Option<Event>> {
        loop {
            let guard = self.0.lock();
            // The descriptor must be non-blocking, or librdmacm's read would block with the
            // lock held; safe code can clear the flag through `AsFd`, so it is checked here.
            self.0.ensure_nonblocking()?;
            let mut raw = std::ptr::null_mut();
            // SAFETY: a live channel whose descriptor is non-blocking; the channel lock is
            // held, since reading an event updates its identifier's fields.
            let ret = unsafe { ffi::rdma_get_cm_event(self.as_raw(), &mut raw) };
            if ret != 0 {
                let errno = Errno::last();
                drop(guard);
                if errno.raw() == libc::EAGAIN || errno.raw() == libc::EWOULDBLOCK {
                    return Ok(None);
                }
                if errno.raw() == libc::EINTR {
                    continue;
                }
                return Err(Error::Call {
                    call: "rdma_get_cm_event",
                    errno,
                });
            }
            let Some(raw) = NonNull::new(raw) else {
                continue;
            };
            let mut discard = Vec::new();
            // SAFETY: a fresh, unacknowledged event; the lock is held.
            let event = unsafe { wrap(raw, self, &mut discard) };
            drop(guard);
            // Handles found along the way, dropped without the lock (a last one takes it).
            drop(discard);
            match event {
                Some(event) => return Ok(Some(event)),
                // About an identifier being destroyed: acknowledged; read the next one.
                None => continue,
            }
        }
    }
}

/// Wraps a fresh event read from `channel`: finds the identifier it is accounted to and, for a
/// connect request, wraps the new identifier. Returns `None` (after acknowledging it) when the
/// identifier is being destroyed or is not this crate's.
///
/// # Safety
///
/// `raw` was just returned by `rdma_get_cm_event` on `channel` and is not acknowledged; the
/// caller holds `channel`'s lock.
unsafe fn wrap(
    raw: NonNull<ffi::rdma_cm_event>,
    channel: &EventChannel,
    discard: &mut Vec<Arc<IdInner>>,
) -> Option<Event> {
    // SAFETY: a fresh event.
    let ev = unsafe { &*raw.as_ptr() };
    let kind = EventKind::from_raw(ev.event);
    let accounted = if kind == EventKind::ConnectRequest {
        ev.listen_id
    } else {
        ev.id
    };
    // SAFETY: the event names `accounted` and is not acknowledged; the lock is held.
    let Some(owner) = (unsafe { IdInner::lookup(accounted, discard) }) else {
        let new_id = if kind == EventKind::ConnectRequest {
            ev.id
        } else {
            std::ptr::null_mut()
        };
        // SAFETY: the event is acknowledged once, here, and not used again. A connect request
        // to a listener being destroyed leaves a new identifier nobody will claim: destroyed
        // (no event is accounted to it, so rdma_destroy_id does not wait).
        unsafe {
            ffi::rdma_ack_cm_event(raw.as_ptr());
            if !new_id.is_null() {
                ffi::rdma_destroy_id(new_id);
            }
        }
        return None;
    };
    owner.held.fetch_add(1, Ordering::SeqCst);
    let new_id = if kind == EventKind::ConnectRequest {
        NonNull::new(ev.id).map(|new| {
            // SAFETY: librdmacm made this identifier for the request, on the listener's
            // channel (the one locked); nothing wraps it yet.
            CmId(unsafe { IdInner::register(new, owner.ps, channel.clone()) })
        })
    } else {
        None
    };
    let group = if matches!(kind, EventKind::MulticastJoin | EventKind::MulticastError) {
        // SAFETY: a multicast event: `ud` is the member, and its private-data pointer is the
        // context of the join, a token of this crate (a number, not dereferenced).
        let token = unsafe { ev.param.ud.private_data }.addr();
        let mut groups = owner.groups.lock().unwrap_or_else(|e| e.into_inner());
        groups.event_read(token).map(|addr| (token, addr))
    } else {
        None
    };
    Some(Event {
        raw,
        kind,
        status: ev.status,
        ud: owner.ps == PortSpace::Udp,
        owner,
        new_id,
        group,
    })
}
