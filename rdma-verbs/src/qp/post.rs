//! Posting work requests (`ibv_post_send`, `ibv_post_recv`, the `ibv_wr_*` builders) and
//! what a failed post means.

use super::{CanPostRecv, QueuePair, Rts, Transport, extended};
use crate::error::{Error, Result};
use crate::ffi;
use crate::wr::{
    Operation, RecvList, RecvRequest, SendList, SendRequest, SendWr, element_index, index_of_one,
    op, post_result,
};

/// Whether a failed post may still have handed the request to the device, so that its memory
/// must be treated as lent: the provider did not say (`bad_wr` null), or the extended path's
/// `ibv_wr_complete` failed, which can happen after the requests were queued (rxe stores the
/// producer index before it rings the doorbell, and the doorbell can fail).
pub(crate) fn may_have_posted(error: &Error) -> bool {
    match error {
        Error::PostIndeterminate { .. } => true,
        Error::QueueFull { verb, .. } | Error::Post { verb, .. } => *verb == EXTENDED_POST_VERB,
        _ => false,
    }
}

/// An atomic write the queue pair cannot post: the classic call has no way to carry it.
#[cold]
#[inline(never)]
fn no_atomic_write() -> Error {
    Error::Unsupported("ibv_wr_atomic_write")
}

impl<T: Transport> QueuePair<T, Rts> {
    /// `ibv_post_send`: hands every request of `list` to the device in one call (one doorbell).
    ///
    /// # Safety
    ///
    /// Until the completion of each request is polled (for unsignaled requests: until a later
    /// signaled request of the same queue pair completes), or the queue pair is reset:
    /// - the memory every scatter/gather entry names stays registered and is not freed;
    /// - Rust code does not write memory a send or write reads, nor read or write memory a
    ///   read, atomic or receive writes;
    /// - for UD, the address handles stay alive.
    ///
    /// Inline payloads are copied during the call and are exempt.
    ///
    /// A memory window a bind request names ([`SendRequest::bind_mw`]) stays allocated until
    /// the call returns: no queue pair that bound it through the owned path, whose destruction
    /// deallocates it (see [`MemoryWindow`]), is destroyed after the request was made and
    /// before the call returns, on any thread. Invalidate or
    /// drop such a window before the queue pair is destroyed: rxe holds the destruction of a
    /// queue pair with a window bound to it for about 50 s.
    ///
    /// [`SendRequest::bind_mw`]: crate::wr::SendRequest::bind_mw
    /// [`MemoryWindow`]: crate::MemoryWindow
    ///
    /// And when [`scope`](QueuePair::scope) is called on this queue pair, no completion with this
    /// queue pair's number may still be pending in its completion queues, nor still to come
    /// (every request posted here has completed, and its completion, if signaled, has been
    /// polled): a scope counts the completions of its queue pair as its own.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`] before posting anything, for an operation the transport does
    ///   not allow (for example RDMA read on UC), a UD request without a destination, a UD
    ///   destination whose [`AddressHandle`](crate::AddressHandle) or a memory-window bind whose
    ///   [`MemoryWindow`](crate::MemoryWindow) belongs to another protection domain (of this
    ///   context or another), immediate data on an operation that cannot carry it, or a
    ///   `wr_id` with the top bit set (reserved for owned requests, see
    ///   [`post_send_owned`](QueuePair::post_send_owned));
    /// - [`Error::QueueFull`] (`ENOMEM`): the send queue has no room; requests before `index`
    ///   were posted;
    /// - [`Error::Post`]: the provider refused request `index` (for example a queue pair the
    ///   device moved to an error state); requests before it were posted.
    /// - [`Error::PostIndeterminate`]: the provider failed without naming a request (`bad_wr`
    ///   null; rxe does so when its doorbell fails after it queued every request): take every
    ///   request of the list as posted.
    ///
    /// # The extended path
    ///
    /// On a queue pair that [uses the extended API](Self::uses_extended_post), the list goes to
    /// the device as one `ibv_wr_start` .. `ibv_wr_complete` batch (one doorbell), which posts
    /// all of it or nothing. Its failures are [`Error::QueueFull`] (`ENOMEM`, or `ENOSPC` as
    /// rxe reports a full queue) and [`Error::Post`], both with verb `ibv_wr_complete` and
    /// index 0: as the builders report them (rxe, mlx5), no request of the list was posted.
    /// One failure cannot be told apart: a doorbell that fails after the batch was queued (rxe
    /// rings it with a `write` to the device, which the kernel can fail, `ENOMEM` included);
    /// then the requests were posted. Code that must be sound whatever the provider does, as
    /// [`PostScope`](crate::scope::PostScope) is, treats an `ibv_wr_complete` failure as posted.
    ///
    /// A list the batch cannot carry goes to `ibv_post_send` instead, with the errors above:
    /// one holding an operation the queue pair was not created for (see [`SendPath::Auto`](super::SendPath::Auto)),
    /// inline data over the granted `max_inline_data` or in more than 16 entries (in more than
    /// one on Soft-RoCE, whose provider mishandles inline lists), or more entries than
    /// `max_send_sge`. The classic call is valid on these queue pairs, between batches; it
    /// cannot carry an atomic write, so a list holding one that the batch cannot carry is
    /// refused with [`Error::Unsupported`]`("ibv_wr_atomic_write")`, nothing posted.
    ///
    /// # Examples
    ///
    /// Sixteen sends, one doorbell; the list's storage serves every batch:
    ///
    /// ```no_run
    /// # use rdma_verbs::{*, ah::*, async_event::*, channel::*, cq::*, device::*, mr::*, mw::*, owned::*, qp::*, scope::*, slot::*, srq::*, wr::*, xrcd::*, ah::*, async_event::*, channel::*, cq::*, device::*, mr::*, mw::*, owned::*, qp::*, scope::*, slot::*, srq::*, wr::*, xrcd::*};
    /// # fn f(qp: &mut QueuePair<Rc, Rts>, mr: &MemoryRegion) -> Result<()> {
    /// let mut list = SendList::with_capacity(16);
    /// for i in 0..16 {
    ///     let request = SendRequest::send(mr.slice(i as usize * 64..(i as usize + 1) * 64)?).tag(i);
    ///     // Signal every fourth request only: fewer completions to poll.
    ///     list.push(if i % 4 == 3 { request } else { request.unsignaled() })?;
    /// }
    /// // SAFETY: `mr` stays registered and untouched until the completions are polled.
    /// unsafe { qp.post_send(&mut list)? };
    /// # Ok(()) }
    /// ```
    ///
    /// # References
    ///
    /// [`ibv_post_send(3)`](https://man7.org/linux/man-pages/man3/ibv_post_send.3.html)
    /// [`ibv_wr_complete(3)`](https://man7.org/linux/man-pages/man3/ibv_wr_complete.3.html)
    #[doc(alias = "ibv_post_send")]
    #[doc(alias = "ibv_wr_complete")]
    #[inline]
    pub unsafe fn post_send(&mut self, list: &mut SendList<'_>) -> Result<()> {
        if list.is_empty() {
            return Ok(());
        }
        check_ops::<T>(list.ops(), list.datagrams(), list.len())?;
        list.check_object_pd(self.inner.pd.as_raw())?;
        if let Some(ex) = self.inner.extended.filter(|ex| ex.covers(list.ops())) {
            // SAFETY: `ex` is this live queue pair's, held through `&mut self` (no batch open),
            // and covers every operation of the list, which checked its destinations above; the
            // list is a valid chain built by the crate, whose memory the caller keeps valid as
            // the contract above says.
            let posted = unsafe { extended::post(ex, &self.inner.caps, T::DATAGRAM, list.head()) };
            if let Some(result) = posted {
                return result;
            }
        }
        if list.ops() & op::ATOMIC_WRITE != 0 {
            return Err(no_atomic_write());
        }
        let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: live queue pair; the list is a valid chain whose memory the caller keeps
        // valid as the contract above says.
        let ret = unsafe { ffi::ibv_post_send(self.as_raw(), list.head(), &mut bad) };
        post_result("ibv_post_send", ret, || list.index_of(bad))
    }

    /// `ibv_post_send` of one request, without a list.
    ///
    /// # Safety
    ///
    /// As [`post_send`](Self::post_send).
    ///
    /// # Errors
    ///
    /// As [`post_send`](Self::post_send).
    ///
    /// # References
    ///
    /// [`ibv_post_send(3)`](https://man7.org/linux/man-pages/man3/ibv_post_send.3.html)
    /// [`ibv_wr_complete(3)`](https://man7.org/linux/man-pages/man3/ibv_wr_complete.3.html)
    #[doc(alias = "ibv_post_send")]
    #[doc(alias = "ibv_wr_complete")]
    // Forced: with the owned post inlined beside it, a plain `#[inline]` let the compiler
    // keep one out-of-line copy, which cost every `unsafe` post about 95 instructions.
    #[inline(always)]
    pub unsafe fn post_send_one<K: Operation>(
        &mut self,
        request: &SendRequest<'_, K>,
    ) -> Result<()> {
        // SAFETY: the caller's contract is `post_send_wr`'s.
        unsafe { self.post_send_wr(request.wr()) }
    }

    /// [`post_send_one`](Self::post_send_one) of an untyped request (the safe paths').
    ///
    /// # Safety
    ///
    /// As [`post_send`](Self::post_send).
    #[inline(always)]
    pub(crate) unsafe fn post_send_wr(&mut self, request: &SendWr<'_>) -> Result<()> {
        check_ops::<T>(request.op(), usize::from(request.is_datagram()), 1)?;
        request.check_object_pd(self.inner.pd.as_raw())?;
        let mut raw = ffi::ibv_send_wr::default();
        let mut one = ffi::ibv_sge::default();
        request.fill_zeroed(&mut raw, &mut one)?;
        // SAFETY: `raw` is a checked request of operation `request.op()`, its entry `one`;
        // the caller keeps the memory valid as the contract says.
        unsafe { self.post_send_raw(&mut raw, request.op()) }
    }

    /// Posts the one request `raw` (its `next` null) of operation `ops`, on the extended path
    /// when the queue pair uses it and it covers `ops`, else with `ibv_post_send`.
    ///
    /// # Safety
    ///
    /// `raw` is a valid request this queue pair's transport carries (as [`check_ops`] and the
    /// request builders check), its `sg_list` valid for the call, and the memory it names
    /// kept as [`post_send`](Self::post_send)'s contract says.
    #[inline(always)]
    pub(crate) unsafe fn post_send_raw(
        &mut self,
        raw: &mut ffi::ibv_send_wr,
        ops: u32,
    ) -> Result<()> {
        if let Some(ex) = self.inner.extended.filter(|ex| ex.covers(ops)) {
            // SAFETY: as in `post_send`, for a chain of one request, which outlives the call.
            let posted = unsafe { extended::post(ex, &self.inner.caps, T::DATAGRAM, raw) };
            if let Some(result) = posted {
                return result;
            }
        }
        if ops & op::ATOMIC_WRITE != 0 {
            return Err(no_atomic_write());
        }
        let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: live queue pair; `raw` outlives the call; the caller keeps the memory valid
        // as the contract says.
        let ret = unsafe { ffi::ibv_post_send(self.as_raw(), raw, &mut bad) };
        post_result("ibv_post_send", ret, || index_of_one(raw, bad))
    }
}

impl<T: Transport, S: CanPostRecv> QueuePair<T, S> {
    /// `ibv_post_recv`: hands every receive request of `list` to the device in one call.
    ///
    /// # Safety
    ///
    /// Until each request's completion is polled, or the queue pair is reset, the memory it
    /// names stays registered, is not freed, and is neither read nor written from Rust.
    ///
    /// And when [`scope`](QueuePair::scope) is called on this queue pair, no completion with this
    /// queue pair's number may still be pending in its completion queues, nor still to come
    /// (every request posted here has completed, and its completion, if signaled, has been
    /// polled): a scope counts the completions of its queue pair as its own.
    ///
    /// # Errors
    ///
    /// [`Error::QueueFull`] or [`Error::Post`] as for [`post_send`](QueuePair::post_send);
    /// [`Error::InvalidArgument`] for a queue pair that takes its receives from an SRQ, or a
    /// `wr_id` with the top bit set (reserved for owned requests).
    ///
    /// # References
    ///
    /// [`ibv_post_recv(3)`](https://man7.org/linux/man-pages/man3/ibv_post_recv.3.html)
    #[doc(alias = "ibv_post_recv")]
    #[inline]
    pub unsafe fn post_recv(&mut self, list: &mut RecvList<'_>) -> Result<()> {
        if list.is_empty() {
            return Ok(());
        }
        self.check_no_srq()?;
        let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: live queue pair; valid chain; memory kept valid by the caller.
        let ret = unsafe { ffi::ibv_post_recv(self.as_raw(), list.head(), &mut bad) };
        post_result("ibv_post_recv", ret, || list.index_of(bad))
    }

    /// `ibv_post_recv` of one request.
    ///
    /// # Safety
    ///
    /// As [`post_recv`](Self::post_recv).
    ///
    /// # Errors
    ///
    /// As [`post_recv`](Self::post_recv).
    ///
    /// # References
    ///
    /// [`ibv_post_recv(3)`](https://man7.org/linux/man-pages/man3/ibv_post_recv.3.html)
    #[doc(alias = "ibv_post_recv")]
    // Forced, as `post_send_one` is: with the slot post beside the owned one, a plain
    // `#[inline]` kept one out-of-line copy, which cost every receive post about 45
    // instructions.
    #[inline(always)]
    pub unsafe fn post_recv_one(&mut self, request: &RecvRequest<'_>) -> Result<()> {
        self.check_no_srq()?;
        let mut raw = ffi::ibv_recv_wr::default();
        let mut one = ffi::ibv_sge::default();
        request.fill(&mut raw, &mut one)?;
        // SAFETY: `raw` is a checked request, its entry `one`; the SRQ is checked above; the
        // caller keeps the memory valid as the contract says.
        unsafe { self.post_recv_raw(&mut raw) }
    }

    /// `ibv_post_recv` of the one request `raw` (its `next` null).
    ///
    /// # Safety
    ///
    /// `raw` is a valid request, its `sg_list` valid for the call; the queue pair has no SRQ;
    /// the memory it names is kept as [`post_recv`](Self::post_recv)'s contract says.
    #[inline(always)]
    pub(crate) unsafe fn post_recv_raw(&mut self, raw: &mut ffi::ibv_recv_wr) -> Result<()> {
        let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: live queue pair; `raw` outlives the call; memory kept valid by the caller.
        let ret = unsafe { ffi::ibv_post_recv(self.as_raw(), raw, &mut bad) };
        post_result("ibv_post_recv", ret, || index_of_one(raw, bad))
    }

    /// `ibv_post_recv` of the `len` requests at `head`, each linked by `next` to the one after
    /// it (the last one's `next` null): one call, one doorbell.
    ///
    /// # Safety
    ///
    /// `head` points at `len` (at least one) initialised requests, linked as said, valid for
    /// the call; each is as [`post_recv_raw`](Self::post_recv_raw) requires.
    pub(crate) unsafe fn post_recv_chain_raw(
        &mut self,
        head: *mut ffi::ibv_recv_wr,
        len: usize,
    ) -> Result<()> {
        let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: live queue pair; the chain is valid for the call, as the caller says; memory
        // kept valid by the caller.
        let ret = unsafe { ffi::ibv_post_recv(self.as_raw(), head, &mut bad) };
        post_result("ibv_post_recv", ret, || {
            element_index(head.cast_const(), len, bad)
        })
    }

    #[inline]
    pub(crate) fn check_no_srq(&self) -> Result<()> {
        if self.inner._srq.is_some() {
            return Err(Error::invalid(
                "this queue pair receives through its SRQ: post there",
            ));
        }
        Ok(())
    }
}

/// Refuses operations `T` does not carry, malformed requests, and destinations on the wrong
/// transport: `ops` is the union of the requests' operations, `datagrams` how many of the `len`
/// requests name a destination.
#[inline]
pub(crate) fn check_ops<T: Transport>(ops: u32, datagrams: usize, len: usize) -> Result<()> {
    let destinations_right = if T::DATAGRAM {
        datagrams == len
    } else {
        datagrams == 0
    };
    if ops & (op::INVALID | !T::OPS) == 0 && destinations_right {
        return Ok(());
    }
    Err(ops_error::<T>(ops, datagrams, len))
}

/// The error [`check_ops`] returns, built out of line.
#[cold]
#[inline(never)]
fn ops_error<T: Transport>(ops: u32, datagrams: usize, len: usize) -> Error {
    match ops_check::<T>(ops, datagrams, len) {
        Err(error) => error,
        Ok(()) => Error::InvalidArgument("a malformed request".into()),
    }
}

fn ops_check<T: Transport>(ops: u32, datagrams: usize, len: usize) -> Result<()> {
    if ops & op::INVALID != 0 {
        return Err(Error::InvalidArgument(
            "immediate data on an operation other than SEND or RDMA WRITE, or inline data as \
             the target of a read"
                .into(),
        ));
    }
    if ops & !T::OPS != 0 {
        return Err(Error::InvalidArgument(format!(
            "an operation {} queue pairs do not support",
            T::NAME
        )));
    }
    if T::DATAGRAM && datagrams != len {
        return Err(Error::InvalidArgument(
            "every request to a UD queue pair needs a destination (its `to`)".into(),
        ));
    }
    if !T::DATAGRAM && datagrams != 0 {
        return Err(Error::InvalidArgument(format!(
            "datagram destinations are for UD, not {}",
            T::NAME
        )));
    }
    Ok(())
}

/// The verb named in the errors of the extended send path.
pub(crate) const EXTENDED_POST_VERB: &str = "ibv_wr_complete";
