//! Shared receive queues.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{Errno, Error, Result};
use crate::ffi;
use crate::inflight::SrqTable;
use crate::pd::ProtectionDomain;
use crate::wr::{RecvList, RecvRequest};

pub(crate) struct SrqInner {
    raw: NonNull<ffi::ibv_srq>,
    pd: ProtectionDomain,
    /// The owned receives in flight (`docs/data-path.md`).
    pub(crate) table: Arc<SrqTable>,
    /// Set once `ibv_destroy_srq` succeeded.
    destroyed: bool,
}

// SAFETY: SRQ verbs are thread-safe in libibverbs; posting takes `&mut`.
unsafe impl Send for SrqInner {}
// SAFETY: as above.
unsafe impl Sync for SrqInner {}

impl SrqInner {
    /// `ibv_destroy_srq`, once; on success the owned receives still posted are released.
    fn destroy(&mut self) -> Result<()> {
        if self.destroyed {
            return Ok(());
        }
        // SAFETY: live SRQ (not yet destroyed); every queue pair using it holds an Arc to this
        // inner, so none is left.
        let ret = unsafe { ffi::ibv_destroy_srq(self.raw.as_ptr()) };
        Errno::result(ret).map_err(|errno| Error::verb("ibv_destroy_srq", errno))?;
        self.destroyed = true;
        // The device holds none of the SRQ's receives any more: owned ones are released, and
        // the regions of its slot rings.
        self.table.clear();
        self.table.attached.detach_all();
        Ok(())
    }
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // Drop cannot report a failure and must not panic (see "Resource cleanup" in the crate
        // documentation). Receives of an SRQ that still exists may still be written: the table
        // and its buffers are leaked, and the protection domain their region is in stays
        // allocated.
        if self.destroy().is_err() {
            std::mem::forget(self.table.clone());
            std::mem::forget(self.pd.clone());
        }
    }
}

/// A shared receive queue (`struct ibv_srq`): one pool of receive requests for many queue
/// pairs.
///
/// Queue pairs made with [`QpBuilder::srq`](crate::qp::QpBuilder::srq) keep it alive. Not `Clone`
/// (posting takes `&mut self`); `Send` and `Sync`.
pub struct SharedReceiveQueue {
    pub(crate) inner: Arc<SrqInner>,
    max_wr: u32,
    max_sge: u32,
}

impl fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedReceiveQueue")
            .field("max_wr", &self.max_wr)
            .field("max_sge", &self.max_sge)
            .finish()
    }
}

impl ProtectionDomain {
    /// `ibv_create_srq`: a shared receive queue for `max_wr` requests of `max_sge` entries
    /// each, its limit event disarmed. For the limit, [`srq_builder`](Self::srq_builder).
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with the errno of `ibv_create_srq` (`EINVAL` above the device's limits).
    ///
    /// # References
    ///
    /// [`ibv_create_srq(3)`](https://man7.org/linux/man-pages/man3/ibv_create_srq.3.html)
    #[doc(alias = "ibv_create_srq")]
    pub fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<SharedReceiveQueue> {
        self.srq_builder(max_wr).max_sge(max_sge).build()
    }

    /// A builder for a shared receive queue of `max_wr` requests: entries per request, the
    /// limit event, then [`build`](SrqBuilder::build).
    pub fn srq_builder(&self, max_wr: u32) -> SrqBuilder<'_> {
        SrqBuilder {
            pd: self,
            max_wr,
            max_sge: 1,
            srq_limit: 0,
        }
    }
}

/// Options for a new [`SharedReceiveQueue`]; from [`ProtectionDomain::srq_builder`].
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct SrqBuilder<'a> {
    pd: &'a ProtectionDomain,
    max_wr: u32,
    max_sge: u32,
    srq_limit: u32,
}

impl SrqBuilder<'_> {
    /// Scatter/gather entries per receive (1).
    pub fn max_sge(mut self, n: u32) -> Self {
        self.max_sge = n;
        self
    }

    /// Arms the limit event at `limit` once the SRQ exists (0, the default: disarmed); see
    /// [`SharedReceiveQueue::arm_limit`].
    pub fn srq_limit(mut self, limit: u32) -> Self {
        self.srq_limit = limit;
        self
    }

    /// `ibv_create_srq_ex` for a basic SRQ (which libibverbs serves with `ibv_create_srq`),
    /// then `ibv_modify_srq` for a limit (the creation ignores one).
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with the errno of `ibv_create_srq_ex` (`EINVAL` above the device's
    /// limits) or of `ibv_modify_srq` (`EINVAL` for a limit above the capacity; the SRQ is then
    /// destroyed).
    ///
    /// # References
    ///
    /// [`ibv_create_srq_ex(3)`](https://man7.org/linux/man-pages/man3/ibv_create_srq_ex.3.html)
    #[doc(alias = "ibv_create_srq")]
    #[doc(alias = "ibv_create_srq_ex")]
    pub fn build(self) -> Result<SharedReceiveQueue> {
        let mut init = ffi::ibv_srq_init_attr_ex {
            attr: ffi::ibv_srq_attr {
                max_wr: self.max_wr,
                max_sge: self.max_sge,
                srq_limit: 0,
            },
            comp_mask: ffi::IBV_SRQ_INIT_ATTR_TYPE | ffi::IBV_SRQ_INIT_ATTR_PD,
            srq_type: ffi::IBV_SRQT_BASIC,
            pd: self.pd.as_raw(),
            ..Default::default()
        };
        // SAFETY: live PD of the live context; valid attributes, the PD the only pointer the
        // mask selects.
        let raw = unsafe { ffi::ibv_create_srq_ex(self.pd.context().as_raw(), &mut init) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_create_srq_ex"))?;
        let srq = SharedReceiveQueue {
            inner: Arc::new(SrqInner {
                raw,
                pd: self.pd.clone(),
                table: Arc::new(SrqTable::new(init.attr.max_wr)),
                destroyed: false,
            }),
            max_wr: init.attr.max_wr,
            max_sge: init.attr.max_sge,
        };
        if self.srq_limit > 0 {
            srq.arm_limit(self.srq_limit)?;
        }
        Ok(srq)
    }
}

impl SharedReceiveQueue {
    /// `ibv_destroy_srq`: what dropping does, with the failure reported. On success the owned
    /// receives still posted are released. On failure the SRQ is handed back, still usable;
    /// dropping it tries again.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with `ibv_destroy_srq` and `EBUSY`, without calling it, while a queue
    /// pair still uses the SRQ; else the verb's error
    /// ([`Error::Verb`] with its errno, or [`Error::Unsupported`]).
    ///
    /// # References
    ///
    /// [`ibv_destroy_srq(3)`](https://man7.org/linux/man-pages/man3/ibv_create_srq.3.html)
    #[doc(alias = "ibv_destroy_srq")]
    pub fn close(mut self) -> std::result::Result<(), (Self, Error)> {
        let result = match Arc::get_mut(&mut self.inner) {
            Some(inner) => inner.destroy(),
            None => Err(Error::verb("ibv_destroy_srq", Errno::BUSY)),
        };
        result.map_err(|error| (self, error))
    }

    /// The raw `ibv_srq`.
    ///
    /// A receive posted through it (`ffi::ibv_post_srq_recv`) must not carry a `wr_id` with the
    /// top bit set: those are the owned path's ids (see
    /// [`QueuePair::as_raw`](crate::QueuePair::as_raw)).
    pub fn as_raw(&self) -> *mut ffi::ibv_srq {
        self.inner.raw.as_ptr()
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.pd
    }

    /// Requests the queue holds (as granted), as [`CompletionQueue::capacity`](crate::CompletionQueue::capacity)
    /// says for completions.
    pub fn capacity(&self) -> u32 {
        self.max_wr
    }

    /// Scatter/gather entries per receive (as granted).
    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }

    /// `ibv_get_srq_num`: the SRQ's number, which XRC senders address it by.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] where the provider has no SRQ numbers (Soft-RoCE, which has no
    /// XRC); else [`Error::Verb`] with the call's errno.
    ///
    /// # References
    ///
    /// [`ibv_get_srq_num(3)`](https://man7.org/linux/man-pages/man3/ibv_get_srq_num.3.html)
    #[doc(alias = "ibv_get_srq_num")]
    pub fn srq_num(&self) -> Result<u32> {
        let mut num = 0;
        // SAFETY: a live SRQ; `num` is writable.
        let ret = unsafe { ffi::ibv_get_srq_num(self.as_raw(), &mut num) };
        Error::check("ibv_get_srq_num", ret)?;
        Ok(num)
    }

    /// `ibv_modify_srq` with `IBV_SRQ_LIMIT`: arms the limit event. When the number of posted
    /// receives drops below `limit`, the context raises one
    /// [`AsyncEvent::SrqLimitReached`](crate::async_event::AsyncEvent::SrqLimitReached) and disarms.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] (`EINVAL` for a limit above `max_wr`).
    ///
    /// # References
    ///
    /// [`ibv_modify_srq(3)`](https://man7.org/linux/man-pages/man3/ibv_modify_srq.3.html)
    #[doc(alias = "ibv_modify_srq")]
    pub fn arm_limit(&self, limit: u32) -> Result<()> {
        let mut attr = ffi::ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: limit,
        };
        // SAFETY: live SRQ; valid attributes for the LIMIT mask.
        let ret =
            unsafe { ffi::ibv_modify_srq(self.as_raw(), &mut attr, ffi::IBV_SRQ_LIMIT as i32) };
        Error::check("ibv_modify_srq", ret)
    }

    /// `ibv_query_srq`: the current limit (0 when disarmed).
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with the errno of `ibv_query_srq`.
    ///
    /// # References
    ///
    /// [`ibv_query_srq(3)`](https://man7.org/linux/man-pages/man3/ibv_query_srq.3.html)
    #[doc(alias = "ibv_query_srq")]
    pub fn limit(&self) -> Result<u32> {
        let mut attr = ffi::ibv_srq_attr::default();
        // SAFETY: live SRQ; writable attributes.
        let ret = unsafe { ffi::ibv_query_srq(self.as_raw(), &mut attr) };
        Error::check("ibv_query_srq", ret)?;
        Ok(attr.srq_limit)
    }

    /// `ibv_post_srq_recv`: posts every request of `list` in one call.
    ///
    /// # Safety
    ///
    /// As [`QueuePair::post_recv`](crate::QueuePair::post_recv).
    ///
    /// # Errors
    ///
    /// [`Error::QueueFull`] or [`Error::Post`], with the index of the first request not posted;
    /// [`Error::PostIndeterminate`] when the provider did not name one: take every request as
    /// posted.
    /// [`Error::InvalidArgument`], before posting anything, for a `wr_id` with the top bit set
    /// (reserved for owned requests).
    ///
    /// # References
    ///
    /// [`ibv_post_srq_recv(3)`](https://man7.org/linux/man-pages/man3/ibv_post_srq_recv.3.html)
    #[doc(alias = "ibv_post_srq_recv")]
    pub unsafe fn post_recv(&mut self, list: &mut RecvList<'_>) -> Result<()> {
        if list.is_empty() {
            return Ok(());
        }
        let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: live SRQ; valid chain; memory kept valid by the caller.
        let ret = unsafe { ffi::ibv_post_srq_recv(self.as_raw(), list.head(), &mut bad) };
        crate::wr::post_result("ibv_post_srq_recv", ret, || list.index_of(bad))
    }

    /// `ibv_post_srq_recv` of a chain of `len` requests starting at `head`, linked by their
    /// `next` pointers (the last one's null): a ring's batch, built on the stack.
    ///
    /// # Safety
    ///
    /// `head` points at `len` (at least one) initialised requests, linked as said, valid for
    /// the call; each is as [`post_recv`](Self::post_recv) requires.
    pub(crate) unsafe fn post_recv_chain_raw(
        &mut self,
        head: *mut ffi::ibv_recv_wr,
        len: usize,
    ) -> Result<()> {
        let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: live SRQ; the chain is valid for the call, as the caller says; memory kept
        // valid by the caller.
        let ret = unsafe { ffi::ibv_post_srq_recv(self.as_raw(), head, &mut bad) };
        crate::wr::post_result("ibv_post_srq_recv", ret, || {
            crate::wr::element_index(head.cast_const(), len, bad)
        })
    }

    /// `ibv_post_srq_recv` of one request.
    ///
    /// # Safety
    ///
    /// As [`QueuePair::post_recv`](crate::QueuePair::post_recv).
    ///
    /// # Errors
    ///
    /// As [`post_recv`](Self::post_recv).
    ///
    /// # References
    ///
    /// [`ibv_post_srq_recv(3)`](https://man7.org/linux/man-pages/man3/ibv_post_srq_recv.3.html)
    #[doc(alias = "ibv_post_srq_recv")]
    pub unsafe fn post_recv_one(&mut self, request: &RecvRequest<'_>) -> Result<()> {
        let mut raw = ffi::ibv_recv_wr::default();
        let mut one = ffi::ibv_sge::default();
        request.fill(&mut raw, &mut one)?;
        let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: live SRQ; `raw`/`one` outlive the call; memory kept valid by the caller.
        let ret = unsafe { ffi::ibv_post_srq_recv(self.as_raw(), &mut raw, &mut bad) };
        crate::wr::post_result("ibv_post_srq_recv", ret, || {
            crate::wr::index_of_one(&raw, bad)
        })
    }
}
