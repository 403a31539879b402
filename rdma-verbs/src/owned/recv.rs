//! Owned receives ([`RecvRequest`]s of the [`Owned`] memory model), posted to a queue pair or
//! an SRQ.

use std::sync::Arc;

use super::{Owned, OwnedSges, PostRefused, RegionRange, check_pd, post_owned, range};
use crate::buf::Buf;
use crate::error::Error;
use crate::inflight::{Ring, SrqTable};
use crate::qp::{CanPostRecv, QueuePair, Transport};
use crate::srq::SharedReceiveQueue;
use crate::wr::{Payload, RecvMemory, RecvRequest};

impl<'a> RecvMemory<'a, Owned<'a>> for Buf {
    #[inline]
    fn into_recv_memory(self) -> (Payload<'a>, Owned<'a>) {
        (Payload::None, Owned::of(Some(self), None))
    }
}

impl<'a> RecvMemory<'a, Owned<'a>> for RegionRange {
    #[inline]
    fn into_recv_memory(self) -> (Payload<'a>, Owned<'a>) {
        (Payload::None, Owned::of(None, Some(self)))
    }
}

impl RecvRequest<'_, Owned<'_>> {
    /// The bytes past the buffer's capacity land in `range` (of a
    /// [shared](crate::MemoryRegion::is_shared) region): for example a header into a pool
    /// buffer and a payload straight into the caller's memory. The queue needs `max_recv_sge`
    /// (`max_sge` for an SRQ) of 2. A receive has one range: a second is refused when the
    /// receive is posted.
    pub fn and_range(mut self, range: RegionRange) -> Self {
        let memory = self.memory_mut();
        memory.ranges_over |= memory.range.is_some();
        memory.range = Some(range);
        self
    }

    /// The bytes the receive has room for.
    fn room(&self) -> usize {
        room(self.memory().buf.as_ref(), self.memory().range.as_ref())
    }

    /// The buffer, for a receive that will not be posted.
    pub fn into_buf(self) -> Option<Buf> {
        self.into_parts().1.buf
    }

    /// Checks the receive against protection domain `pd` and splits it for posting: its
    /// buffer, the region its in-flight entry keeps, and its scatter/gather entries.
    #[inline]
    fn prepare(self, pd: *mut crate::ffi::ibv_pd) -> std::result::Result<RecvParts, PostRefused> {
        let (tag, memory) = self.into_parts();
        let Owned {
            buf,
            range,
            ranges_over,
            ..
        } = memory;
        let checked = check_pd(buf.as_ref(), pd).and_then(|()| match &range {
            _ if ranges_over => Err(range::second_range("receive")),
            Some(range) => range.check(pd, true),
            None => Ok(()),
        });
        if let Err(error) = checked {
            return Err(PostRefused { error, buf });
        }
        let sges = OwnedSges::new(buf.as_ref().map(|b| b.raw_slice(true)), range.as_ref());
        Ok(RecvParts {
            buf,
            keep: range.map(|range| -> Arc<dyn Send + Sync> { range.into_region() }),
            sges,
            tag,
        })
    }
}

/// An owned receive checked and split for posting (see `RecvRequest::prepare`).
struct RecvParts {
    buf: Option<Buf>,
    /// The range's region.
    keep: Option<Arc<dyn Send + Sync>>,
    sges: OwnedSges,
    tag: u64,
}

impl<T: Transport, S: CanPostRecv> QueuePair<T, S> {
    /// Posts an owned receive into the whole of `buf` (its capacity): the buffer moves into the
    /// queue pair until the receive's completion hands it back, with its length set to the
    /// bytes received, through
    /// [`CompletionQueue::poll_each`](crate::CompletionQueue::poll_each) on the receive
    /// completion queue. Allocates nothing. As [`post_recv_owned`](Self::post_recv_owned) of
    /// [`RecvRequest::new`]`(buf).tag(tag)`, on a path of its own (no range to check or carry).
    ///
    /// # Errors
    ///
    /// As [`post_recv_owned`](Self::post_recv_owned).
    pub fn post_recv_buf(&mut self, buf: Buf, tag: u64) -> std::result::Result<(), PostRefused> {
        if self.has_srq() {
            return Err(on_srq(Some(buf)));
        }
        let checked =
            check_pd(Some(&buf), self.pd().as_raw()).and_then(|()| check_room::<T>(buf.capacity()));
        if let Err(error) = checked {
            return Err(PostRefused {
                error,
                buf: Some(buf),
            });
        }
        let slice = buf.raw_slice(true);
        self.post_recv_payload(Some(buf), None, Payload::Slice(slice), tag)
    }

    /// Records `buf` and `keep` (a range's region) in the receive table and posts a receive
    /// into `payload`.
    #[inline(always)]
    fn post_recv_payload(
        &mut self,
        buf: Option<Buf>,
        keep: Option<Arc<dyn Send + Sync>>,
        payload: Payload<'_>,
        tag: u64,
    ) -> std::result::Result<(), PostRefused> {
        post_owned(
            self,
            |qp: &Self| -> &Ring { &qp.tables().recv },
            tag,
            buf,
            keep,
            |qp, id, _| {
                let request = RecvRequest::owned(payload, id);
                // SAFETY: as in `post_send_owned`: the buffer is in the receive table, where
                // nothing reaches it, until this receive's completion (receive queues complete in
                // order), the queue pair's reset or destruction, or a refused post. A range's
                // region is shared (checked by the caller): Rust reads it only atomically
                // meanwhile, and the table keeps it registered.
                unsafe { qp.post_recv_one(&request) }
            },
        )
    }

    /// Posts an owned receive: its buffer moves into the queue pair, and its range's region is
    /// kept registered, until the receive's completion hands the buffer back (its length set to
    /// the bytes received, at most its capacity; the rest landed in the range) through
    /// [`CompletionQueue::poll_each`](crate::CompletionQueue::poll_each) on the receive
    /// completion queue. Allocates nothing.
    ///
    /// # Errors
    ///
    /// [`PostRefused`], with the buffer when the device never saw it:
    /// [`Error::InvalidArgument`] for a queue pair on an SRQ, a receive on UD with room for
    /// fewer than [`GRH_LEN`](crate::ah::GRH_LEN) bytes, a buffer or range of another protection
    /// domain, or a range of a region that is not shared; [`Error::QueueFull`] when
    /// as many receives are in flight as the receive queue holds; else as
    /// [`post_recv_one`](Self::post_recv_one).
    pub fn post_recv_owned(
        &mut self,
        request: RecvRequest<'_, Owned<'_>>,
    ) -> std::result::Result<(), PostRefused> {
        if self.has_srq() {
            return Err(on_srq(request.into_buf()));
        }
        // Counted before `prepare` splits the request, checked after its checks.
        let room = request.room();
        let parts = request.prepare(self.pd().as_raw())?;
        if let Err(error) = check_room::<T>(room) {
            return Err(PostRefused {
                error,
                buf: parts.buf,
            });
        }
        self.post_recv_payload(parts.buf, parts.keep, parts.sges.payload(), parts.tag)
    }
}

/// The bytes a receive into `buf` and `range` has room for: the buffer's capacity and the
/// range's length.
pub(super) fn room(buf: Option<&Buf>, range: Option<&RegionRange>) -> usize {
    buf.map_or(0, Buf::capacity) + range.map_or(0, RegionRange::len)
}

/// Refuses a receive with room for `room` bytes on a `T` queue pair that cannot take a
/// message into it: on UD, one with no room for the GRH (the device would end it in
/// `IBV_WC_LOC_LEN_ERR` whatever arrived). Free on the connected transports.
#[inline(always)]
pub(crate) fn check_room<T: Transport>(room: usize) -> crate::error::Result<()> {
    // UD is the only datagram transport (the trait is sealed), and every UD receive starts
    // with the GRH's room; a datagram transport without it would need its own constant.
    if T::DATAGRAM && room < crate::ah::GRH_LEN {
        return Err(no_room_for_grh(room));
    }
    Ok(())
}

#[cold]
fn no_room_for_grh(room: usize) -> Error {
    Error::InvalidArgument(format!(
        "a UD receive needs room for the {}-byte GRH in front of the datagram, \
         and this one has room for {room} bytes",
        crate::ah::GRH_LEN
    ))
}

/// The refusal of a receive posted to a queue pair on an SRQ.
#[cold]
fn on_srq(buf: Option<Buf>) -> PostRefused {
    PostRefused {
        error: Error::InvalidArgument("a queue pair on an SRQ receives through the SRQ".into()),
        buf,
    }
}

impl SharedReceiveQueue {
    /// Posts an owned receive into the whole of `buf`: [`post_recv_owned`](Self::post_recv_owned)
    /// of [`RecvRequest::new`]`(buf).tag(tag)`.
    ///
    /// # Errors
    ///
    /// As [`post_recv_owned`](Self::post_recv_owned).
    #[inline]
    pub fn post_recv_buf(&mut self, buf: Buf, tag: u64) -> std::result::Result<(), PostRefused> {
        self.post_recv_owned(RecvRequest::new(buf).tag(tag))
    }

    /// Posts an owned receive: its buffer moves into the SRQ, and its range's region is kept
    /// registered, until the completion of the receive, in the receive completion queue of
    /// whichever queue pair consumed it, hands the buffer back through
    /// [`CompletionQueue::poll_each`](crate::CompletionQueue::poll_each), with its length set
    /// to the bytes received (at most its capacity). Allocates nothing.
    ///
    /// A receive consumed by a queue pair that is reset or destroyed before its completion is
    /// polled (or whose completion the provider removes with the queue pair) is released only
    /// when the SRQ is destroyed: enough of those fill the SRQ's table, and posts then fail
    /// with [`Error::QueueFull`]. Stop such a queue pair by moving it to ERR, waiting for the
    /// last-WQE-reached event, and reaping with `poll_each` before dropping it.
    ///
    /// # Errors
    ///
    /// [`PostRefused`], with the buffer when the device never saw it:
    /// [`Error::InvalidArgument`] for a buffer or range of another protection domain, or a
    /// range of a region that is not shared; [`Error::QueueFull`] when as many receives are in
    /// flight as the SRQ holds; else as [`post_recv_one`](Self::post_recv_one). An SRQ cannot
    /// tell which transports it feeds, so it does not refuse a receive with room for fewer than
    /// [`GRH_LEN`](crate::ah::GRH_LEN) bytes, as a UD queue pair does: one that UD consumes
    /// completes in error.
    #[inline]
    pub fn post_recv_owned(
        &mut self,
        request: RecvRequest<'_, Owned<'_>>,
    ) -> std::result::Result<(), PostRefused> {
        let parts = request.prepare(self.pd().as_raw())?;
        let sges = parts.sges;
        post_owned(
            self,
            |srq: &Self| -> &SrqTable { &srq.inner.table },
            parts.tag,
            parts.buf,
            parts.keep,
            |srq, id, _| {
                let request = RecvRequest::owned(sges.payload(), id);
                // SAFETY: as in `QueuePair::post_recv_owned`: the buffer is in the SRQ's table,
                // where nothing reaches it, until the completion with its id (found by id: SRQ
                // receives complete in any order), the SRQ's destruction, or a refused post. The
                // SRQ outlives every queue pair that could consume the receive.
                unsafe { srq.post_recv_one(&request) }
            },
        )
    }

    /// Owned receives in flight.
    pub fn owned_in_flight(&self) -> usize {
        self.inner.table.len()
    }
}
