//! Completion queues and work completions; extended completion queues (`ibv_cq_ex`) and their
//! poll sessions in `extended`.

mod extended;

pub use crate::flags::WcFlags;
pub use extended::{CqPoll, RawClock, WcFields};

use std::fmt;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::c_enum::c_enum;
use crate::channel::{ChannelInner, CompletionChannel, CqEvent, EventCounter};
use crate::device::Context;
use crate::error::{Errno, Error, Result};
use crate::ffi;
use crate::inflight::{RouteCache, Routes};
use extended::Extended;

pub(crate) struct CqInner {
    raw: NonNull<ffi::ibv_cq>,
    events: Box<EventCounter>,
    pub(crate) context: Context,
    // Dropped after the CQ: a CQ must be destroyed before its channel.
    channel: Option<Arc<ChannelInner>>,
    /// The in-flight tables of the queue pairs completing here (owned-buffer data path).
    pub(crate) routes: Routes,
    /// Set once `ibv_destroy_cq` succeeded (by [`CompletionQueue::close`] or `Drop`).
    destroyed: bool,
    /// The token ([`extended::thread_token`]) of the thread in a poll session of the queue
    /// ([`CompletionQueue::poll_extended`]), or 0.
    pub(crate) session: AtomicUsize,
}

// SAFETY: libibverbs CQs may be polled, armed and destroyed from any thread (the provider locks
// the queue); the counter is atomic.
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl CqInner {
    /// How many queue-pair uses hold this queue: a queue pair holds one `Arc` for its send CQ
    /// and one for its receive CQ (two for one queue used for both), and the
    /// [`CompletionQueue`] handle holds the only other one. Nothing else may clone the `Arc`:
    /// [`PostScope`](crate::scope::PostScope) relies on this count to know that no other queue pair
    /// completes into the queue. While the caller holds the handle `&mut`, no queue pair can
    /// be created on it, so the count cannot grow.
    pub(crate) fn queue_pair_uses(self: &Arc<Self>) -> usize {
        Arc::strong_count(self).saturating_sub(1)
    }
}

impl CqInner {
    /// Whether the calling thread is in a poll session of this queue (inside the function it
    /// gave [`CompletionQueue::poll_extended`]): the provider may hold the queue's lock,
    /// which destroying or resetting one of its queue pairs would wait on forever.
    pub(crate) fn in_session_here(&self) -> bool {
        self.session.load(Ordering::Acquire) == extended::thread_token()
    }
}

impl CqInner {
    /// Acknowledges the events taken and not yet acknowledged, then `ibv_destroy_cq`, once.
    fn destroy(&mut self) -> Result<()> {
        if self.destroyed {
            return Ok(());
        }
        // Under the channel's event lock no thread is between taking an event of this CQ and
        // counting it, so the count is complete; events taken after it see `closing` (and
        // are acknowledged at once, also if the destroy below fails and the CQ lives on).
        let unacked = match &self.channel {
            Some(channel) => {
                let _counting = channel.lock_events();
                self.events.closing.store(true, Ordering::Relaxed);
                self.events.unacked.swap(0, Ordering::AcqRel)
            }
            None => self.events.unacked.swap(0, Ordering::AcqRel),
        };
        // SAFETY: live CQ (not yet destroyed); no queue pair is left using it (each holds an
        // Arc to this inner, and the caller has the only one). ibv_destroy_cq waits for every
        // event to be acknowledged, so acknowledge them first.
        let ret = unsafe {
            if unacked > 0 {
                ffi::ibv_ack_cq_events(self.raw.as_ptr(), unacked);
            }
            ffi::ibv_destroy_cq(self.raw.as_ptr())
        };
        if let Err(errno) = Errno::result(ret) {
            // The queue lives on: its events are acknowledged in batches again.
            if let Some(channel) = &self.channel {
                let _counting = channel.lock_events();
                self.events.closing.store(false, Ordering::Relaxed);
            }
            return Err(Error::verb("ibv_destroy_cq", errno));
        }
        self.destroyed = true;
        Ok(())
    }
}

impl Drop for CqInner {
    fn drop(&mut self) {
        // Drop cannot report a failure and must not panic (see "Resource cleanup" in the crate
        // documentation). A CQ that still exists keeps `events` as its `cq_context`, which a
        // later `ibv_get_cq_event` reads, and its channel: both are leaked rather than freed.
        if self.destroy().is_err() {
            let events = std::mem::replace(
                &mut self.events,
                Box::new(EventCounter {
                    unacked: AtomicU32::new(0),
                    closing: AtomicBool::new(true),
                }),
            );
            Box::leak(events);
            std::mem::forget(self.channel.clone());
        }
    }
}

/// A completion queue (`struct ibv_cq`).
///
/// Queue pairs made with it keep it alive. Polling takes `&mut self`; the queue is `Send` and
/// `Sync` (libibverbs locks it), so it may be moved to, or shared with, a polling thread.
pub struct CompletionQueue {
    pub(crate) inner: Arc<CqInner>,
    /// `inner`'s `ibv_cq`, copied here so that a poll reads it without going through the
    /// `Arc` (one load fewer per poll).
    raw: NonNull<ffi::ibv_cq>,
    capacity: u32,
    /// The poller's copy of `inner.routes` ([`poll_each`](Self::poll_each)).
    pub(crate) route_cache: RouteCache,
    /// For a queue created with `ibv_create_cq_ex`: its extended handle and poll state.
    pub(crate) ex: Option<Extended>,
}

// SAFETY: `raw` is a copy of `inner.raw`, which `inner` keeps alive; the handle is `Send` and
// `Sync` for the reasons `CqInner` is (libibverbs CQs may be used from any thread), and `poll`
// takes `&mut self`, so the pointer gives a second thread nothing `inner` does not.
unsafe impl Send for CompletionQueue {}
// SAFETY: as for `Send`.
unsafe impl Sync for CompletionQueue {}

impl fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl Context {
    /// `ibv_create_cq`: creates a completion queue with room for at least `cqe` completions and
    /// no completion channel.
    ///
    /// # Errors
    ///
    /// As [`CqBuilder::build`].
    ///
    /// # References
    ///
    /// [`ibv_create_cq(3)`](https://man7.org/linux/man-pages/man3/ibv_create_cq.3.html)
    #[doc(alias = "ibv_create_cq")]
    pub fn create_cq(&self, cqe: u32) -> Result<CompletionQueue> {
        self.cq_builder(cqe).build()
    }

    /// A builder for a completion queue with room for at least `cqe` completions.
    pub fn cq_builder(&self, cqe: u32) -> CqBuilder<'_> {
        CqBuilder {
            context: self,
            cqe,
            channel: None,
            comp_vector: 0,
            fields: None,
        }
    }
}

/// Options of a new completion queue; see [`Context::cq_builder`].
#[derive(Debug)]
#[must_use]
pub struct CqBuilder<'a> {
    context: &'a Context,
    cqe: u32,
    channel: Option<&'a CompletionChannel>,
    comp_vector: u32,
    fields: Option<WcFields>,
}

impl<'a> CqBuilder<'a> {
    /// Delivers completion events to `channel` (after [`CompletionQueue::req_notify`]).
    pub fn channel(mut self, channel: &'a CompletionChannel) -> Self {
        self.channel = Some(channel);
        self
    }

    /// The completion vector (interrupt) to signal events on; 0 by default.
    pub fn comp_vector(mut self, vector: u32) -> Self {
        self.comp_vector = vector;
        self
    }

    /// Creates the queue with `ibv_create_cq_ex`, reporting `fields` to
    /// [`CompletionQueue::poll_extended`]'s sessions (besides the id, status, opcode, vendor
    /// error and flags, which are always there). Polling with
    /// [`poll`](CompletionQueue::poll) works as on any queue.
    pub fn extended(mut self, fields: WcFields) -> Self {
        self.fields = Some(fields);
        self
    }

    /// `ibv_create_cq` (or `ibv_create_cq_ex`, [`extended`](Self::extended)): creates the
    /// queue.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`] if `cqe` is 0 or above `i32::MAX`, or the channel belongs to
    ///   another device context;
    /// - [`Error::Verb`] with the errno of `ibv_create_cq` (`EINVAL` above the device's
    ///   `max_cqe`);
    /// - [`Error::Unsupported`] with `ibv_create_cq_ex` for fields the device cannot report
    ///   (Soft-RoCE reports the [`WcFields::STANDARD`] ones and no timestamps).
    ///
    /// # References
    ///
    /// [`ibv_create_cq(3)`](https://man7.org/linux/man-pages/man3/ibv_create_cq.3.html),
    /// [`ibv_create_cq_ex(3)`](https://man7.org/linux/man-pages/man3/ibv_create_cq_ex.3.html)
    #[doc(alias = "ibv_create_cq")]
    #[doc(alias = "ibv_create_cq_ex")]
    pub fn build(self) -> Result<CompletionQueue> {
        let cqe = i32::try_from(self.cqe)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                Error::InvalidArgument(format!("a CQ needs 1..=i32::MAX entries, not {}", self.cqe))
            })?;
        let channel = match self.channel {
            Some(channel) => {
                if channel.context().as_raw() != self.context.as_raw() {
                    return Err(Error::InvalidArgument(
                        "the completion channel belongs to another context".into(),
                    ));
                }
                Some(channel.inner.clone())
            }
            None => None,
        };
        let events = Box::new(EventCounter {
            unacked: AtomicU32::new(0),
            closing: AtomicBool::new(false),
        });
        let vector = i32::try_from(self.comp_vector)
            .map_err(|_| Error::InvalidArgument("completion vector out of range".into()))?;
        let cq_context = (&*events as *const EventCounter).cast_mut().cast();
        let channel_raw = channel
            .as_ref()
            .map_or(std::ptr::null_mut(), |c| c.as_raw());
        let (raw, ex) = match self.fields {
            None => {
                // SAFETY: live context; the channel (if any) is live and kept by the new CQ;
                // the cq_context points at `events`, which lives in a Box as long as the CQ.
                let raw = unsafe {
                    ffi::ibv_create_cq(self.context.as_raw(), cqe, cq_context, channel_raw, vector)
                };
                (
                    NonNull::new(raw).ok_or_else(|| Error::last("ibv_create_cq"))?,
                    None,
                )
            }
            Some(fields) => {
                let mut attr = ffi::ibv_cq_init_attr_ex {
                    cqe: cqe.unsigned_abs(),
                    cq_context,
                    channel: channel_raw,
                    comp_vector: vector.unsigned_abs(),
                    wc_flags: fields.bits(),
                    ..Default::default()
                };
                // SAFETY: as above; no parent domain (comp_mask 0), so the queue keeps its
                // lock.
                let raw = unsafe { ffi::ibv_create_cq_ex(self.context.as_raw(), &mut attr) };
                let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_create_cq_ex"))?;
                let ex = Extended::new(self.context, raw, fields);
                (ex.as_cq(), Some(ex))
            }
        };
        // SAFETY: live CQ; `cqe` holds the real capacity.
        let capacity = u32::try_from(unsafe { (*raw.as_ptr()).cqe }).unwrap_or(0);
        Ok(CompletionQueue {
            raw,
            inner: Arc::new(CqInner {
                raw,
                events,
                context: self.context.clone(),
                destroyed: false,
                channel,
                routes: Routes::default(),
                session: AtomicUsize::new(0),
            }),
            capacity,
            route_cache: RouteCache::new(),
            ex,
        })
    }
}

impl CompletionQueue {
    /// `ibv_destroy_cq`: what dropping the last handle does, with the failure reported. On
    /// failure the queue is handed back, still usable; dropping it tries again.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with `ibv_destroy_cq` and `EBUSY`, without calling it, while a queue
    /// pair still uses the queue (as the verb itself would answer); else the verb's error
    /// ([`Error::Verb`] with its errno, or [`Error::Unsupported`]).
    ///
    /// # References
    ///
    /// [`ibv_destroy_cq(3)`](https://man7.org/linux/man-pages/man3/ibv_destroy_cq.3.html)
    #[doc(alias = "ibv_destroy_cq")]
    pub fn close(mut self) -> std::result::Result<(), (Self, Error)> {
        let result = match Arc::get_mut(&mut self.inner) {
            Some(inner) => inner.destroy(),
            None => Err(Error::verb("ibv_destroy_cq", Errno::BUSY)),
        };
        result.map_err(|error| (self, error))
    }

    /// `ibv_poll_cq`: moves up to `completions.len()` completions into `completions` and returns
    /// the filled prefix. Allocates nothing.
    ///
    /// An empty result means the queue was empty. Failed work requests are completions with a
    /// [`WcStatus`] other than `Success`, not errors.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] if the provider reports a polling failure.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use rdma_verbs::{Context, cq::WorkCompletion};
    /// # let context = Context::open("rxe0")?;
    /// let mut cq = context.create_cq(64)?;
    /// let mut completions = [WorkCompletion::default(); 16];
    /// for wc in cq.poll(&mut completions)? {
    ///     println!("{} {:?} {:?}", wc.wr_id(), wc.status(), wc.opcode());
    /// }
    /// # Ok::<(), rdma_verbs::Error>(())
    /// ```
    ///
    /// # References
    ///
    /// [`ibv_poll_cq(3)`](https://man7.org/linux/man-pages/man3/ibv_poll_cq.3.html)
    #[doc(alias = "ibv_poll_cq")]
    #[inline]
    pub fn poll<'a>(
        &mut self,
        completions: &'a mut [WorkCompletion],
    ) -> Result<&'a [WorkCompletion]> {
        // SAFETY: `WorkCompletion` is `Copy`, so viewing initialised values as maybe
        // uninitialised loses nothing; `poll_uninit` only writes whole values into them.
        let slots = unsafe {
            &mut *(std::ptr::from_mut(completions) as *mut [MaybeUninit<WorkCompletion>])
        };
        self.poll_uninit(slots)
    }

    /// [`poll`](Self::poll) into storage that need not be initialised (no zeroing per call):
    /// returns the completions written at its start.
    #[inline]
    pub(crate) fn poll_uninit<'a>(
        &mut self,
        completions: &'a mut [MaybeUninit<WorkCompletion>],
    ) -> Result<&'a [WorkCompletion]> {
        let max = i32::try_from(completions.len()).unwrap_or(i32::MAX);
        // SAFETY: live CQ; WorkCompletion is a transparent ibv_wc and the slice has room for
        // `max` of them; the provider only writes them.
        let n = unsafe { ffi::ibv_poll_cq(self.as_raw(), max, completions.as_mut_ptr().cast()) };
        if n < 0 {
            // A provider's value: negated without overflowing (i32::MIN stays as it is).
            let errno = n.checked_neg().unwrap_or(n);
            return Err(Error::verb("ibv_poll_cq", crate::Errno::from_raw(errno)));
        }
        // Never more than the slice holds, whatever the provider returned.
        let n = (n as usize).min(completions.len());
        // SAFETY: the provider wrote the first `n` completions (`ibv_poll_cq` returns how many
        // it wrote); `MaybeUninit<T>` has `T`'s layout.
        Ok(unsafe { std::slice::from_raw_parts(completions.as_ptr().cast::<WorkCompletion>(), n) })
    }

    /// Polls until `min` completions have arrived (at most `completions.len()`) or `timeout`
    /// has passed, and returns every completion it reaped, so none is lost when time runs
    /// out: fewer than `min` means the time ran out. A busy poll that backs off from yielding
    /// to 50 µs sleeps after a thousand empty polls; to wait without polling, arm the queue
    /// and wait on its [`CompletionChannel`].
    ///
    /// # Errors
    ///
    /// As [`poll`](Self::poll); completions reaped before a polling error are lost with it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use rdma_verbs::{CompletionQueue, cq::WorkCompletion};
    /// # fn f(cq: &mut CompletionQueue) -> rdma_verbs::Result<()> {
    /// let mut completions = [WorkCompletion::default(); 2];
    /// let got = cq.poll_for(&mut completions, 2, Duration::from_secs(5))?;
    /// if got.len() < 2 {
    ///     eprintln!("only {} of 2 completions within 5 s", got.len());
    /// }
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn poll_for<'a>(
        &mut self,
        completions: &'a mut [WorkCompletion],
        min: usize,
        timeout: Duration,
    ) -> Result<&'a [WorkCompletion]> {
        let min = min.min(completions.len());
        let n = poll_until(min, timeout, |n| {
            Ok(self.poll(&mut completions[n..])?.len())
        })?;
        Ok(&completions[..n])
    }

    /// `ibv_req_notify_cq`: arms the queue: its next completion (or next solicited one, with
    /// `solicited_only`) raises an event on its completion channel.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with the provider's errno.
    ///
    /// # References
    ///
    /// [`ibv_req_notify_cq(3)`](https://man7.org/linux/man-pages/man3/ibv_req_notify_cq.3.html)
    #[doc(alias = "ibv_req_notify_cq")]
    #[inline]
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        // SAFETY: live CQ.
        let ret = unsafe { ffi::ibv_req_notify_cq(self.as_raw(), i32::from(solicited_only)) };
        Error::check("ibv_req_notify_cq", ret)
    }

    /// The number of completions the queue holds (at least what was asked for).
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// `ibv_resize_cq`: makes the queue hold at least `entries` completions (the provider may
    /// round up: [`capacity`](Self::capacity) says how many it holds after). The completions
    /// in it stay, in order.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for 0 or more than `i32::MAX` entries; [`Error::Verb`] with
    /// `ibv_resize_cq`'s errno, the queue unchanged: `EINVAL` for fewer entries than the
    /// completions it holds now, or more than the device allows; [`Error::Unsupported`] where
    /// the provider cannot resize.
    ///
    /// # References
    ///
    /// [`ibv_resize_cq(3)`](https://man7.org/linux/man-pages/man3/ibv_resize_cq.3.html)
    #[doc(alias = "ibv_resize_cq")]
    pub fn resize(&mut self, entries: u32) -> Result<()> {
        let cqe = i32::try_from(entries)
            .ok()
            .filter(|cqe| *cqe > 0)
            .ok_or_else(|| {
                Error::InvalidArgument(format!("a CQ needs 1..=i32::MAX entries, not {entries}"))
            })?;
        // SAFETY: a live CQ, and `&mut self`: no poll through this handle runs meanwhile (the
        // provider also takes the queue's lock).
        let ret = unsafe { ffi::ibv_resize_cq(self.as_raw(), cqe) };
        Error::check("ibv_resize_cq", ret)?;
        // SAFETY: live CQ; `cqe` holds the new capacity.
        self.capacity = u32::try_from(unsafe { (*self.raw.as_ptr()).cqe }).unwrap_or(0);
        Ok(())
    }

    /// The raw `ibv_cq`, valid while this queue lives.
    #[inline]
    pub fn as_raw(&self) -> *mut ffi::ibv_cq {
        self.raw.as_ptr()
    }

    /// The context the queue belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.context
    }
}

c_enum! {
    /// Status of a work completion (`enum ibv_wc_status`).
    WcStatus: u32 {
        /// `IBV_WC_SUCCESS`.
        Success = ffi::IBV_WC_SUCCESS,
        /// `IBV_WC_LOC_LEN_ERR`: the receive buffer was too small, or a send too long.
        LocLenErr = ffi::IBV_WC_LOC_LEN_ERR,
        /// `IBV_WC_LOC_QP_OP_ERR`: internal queue-pair consistency error.
        LocQpOpErr = ffi::IBV_WC_LOC_QP_OP_ERR,
        /// `IBV_WC_LOC_EEC_OP_ERR`.
        LocEecOpErr = ffi::IBV_WC_LOC_EEC_OP_ERR,
        /// `IBV_WC_LOC_PROT_ERR`: a local buffer's lkey or rights did not allow the access.
        LocProtErr = ffi::IBV_WC_LOC_PROT_ERR,
        /// `IBV_WC_WR_FLUSH_ERR`: flushed because the queue pair entered the error state.
        WrFlushErr = ffi::IBV_WC_WR_FLUSH_ERR,
        /// `IBV_WC_MW_BIND_ERR`.
        MwBindErr = ffi::IBV_WC_MW_BIND_ERR,
        /// `IBV_WC_BAD_RESP_ERR`.
        BadRespErr = ffi::IBV_WC_BAD_RESP_ERR,
        /// `IBV_WC_LOC_ACCESS_ERR`.
        LocAccessErr = ffi::IBV_WC_LOC_ACCESS_ERR,
        /// `IBV_WC_REM_INV_REQ_ERR`: the peer found the request invalid.
        RemInvReqErr = ffi::IBV_WC_REM_INV_REQ_ERR,
        /// `IBV_WC_REM_ACCESS_ERR`: the peer refused the access (wrong rkey, rights, range).
        RemAccessErr = ffi::IBV_WC_REM_ACCESS_ERR,
        /// `IBV_WC_REM_OP_ERR`: the peer could not complete the operation.
        RemOpErr = ffi::IBV_WC_REM_OP_ERR,
        /// `IBV_WC_RETRY_EXC_ERR`: transport retries exhausted (peer gone or unreachable).
        RetryExcErr = ffi::IBV_WC_RETRY_EXC_ERR,
        /// `IBV_WC_RNR_RETRY_EXC_ERR`: receiver-not-ready retries exhausted.
        RnrRetryExcErr = ffi::IBV_WC_RNR_RETRY_EXC_ERR,
        /// `IBV_WC_LOC_RDD_VIOL_ERR`.
        LocRddViolErr = ffi::IBV_WC_LOC_RDD_VIOL_ERR,
        /// `IBV_WC_REM_INV_RD_REQ_ERR`.
        RemInvRdReqErr = ffi::IBV_WC_REM_INV_RD_REQ_ERR,
        /// `IBV_WC_REM_ABORT_ERR`.
        RemAbortErr = ffi::IBV_WC_REM_ABORT_ERR,
        /// `IBV_WC_INV_EECN_ERR`.
        InvEecnErr = ffi::IBV_WC_INV_EECN_ERR,
        /// `IBV_WC_INV_EEC_STATE_ERR`.
        InvEecStateErr = ffi::IBV_WC_INV_EEC_STATE_ERR,
        /// `IBV_WC_FATAL_ERR`.
        FatalErr = ffi::IBV_WC_FATAL_ERR,
        /// `IBV_WC_RESP_TIMEOUT_ERR`.
        RespTimeoutErr = ffi::IBV_WC_RESP_TIMEOUT_ERR,
        /// `IBV_WC_GENERAL_ERR`.
        GeneralErr = ffi::IBV_WC_GENERAL_ERR,
        /// `IBV_WC_TM_ERR`.
        TmErr = ffi::IBV_WC_TM_ERR,
        /// `IBV_WC_TM_RNDV_INCOMPLETE`.
        TmRndvIncomplete = ffi::IBV_WC_TM_RNDV_INCOMPLETE,
    }
}

impl WcStatus {
    /// `ibv_wc_status_str`: libibverbs' description of the status.
    #[doc(alias = "ibv_wc_status_str")]
    pub fn description(self) -> String {
        // SAFETY: ibv_wc_status_str returns a static string for any value.
        let text = unsafe { ffi::ibv_wc_status_str(self.as_raw()) };
        if text.is_null() {
            return format!("status {}", self.as_raw());
        }
        // SAFETY: a static, NUL-terminated string.
        unsafe { std::ffi::CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.description(), self.as_raw())
    }
}

c_enum! {
    /// Opcode of a work completion (`enum ibv_wc_opcode`).
    WcOpcode: u32 {
        /// `IBV_WC_SEND`.
        Send = ffi::IBV_WC_SEND,
        /// `IBV_WC_RDMA_WRITE`.
        RdmaWrite = ffi::IBV_WC_RDMA_WRITE,
        /// `IBV_WC_RDMA_READ`.
        RdmaRead = ffi::IBV_WC_RDMA_READ,
        /// `IBV_WC_COMP_SWAP`.
        CompSwap = ffi::IBV_WC_COMP_SWAP,
        /// `IBV_WC_FETCH_ADD`.
        FetchAdd = ffi::IBV_WC_FETCH_ADD,
        /// `IBV_WC_BIND_MW`.
        BindMw = ffi::IBV_WC_BIND_MW,
        /// `IBV_WC_LOCAL_INV`.
        LocalInv = ffi::IBV_WC_LOCAL_INV,
        /// `IBV_WC_TSO`.
        Tso = ffi::IBV_WC_TSO,
        /// `IBV_WC_ATOMIC_WRITE`.
        AtomicWrite = ffi::IBV_WC_ATOMIC_WRITE,
        /// `IBV_WC_RECV`: a receive consumed by a send.
        Recv = ffi::IBV_WC_RECV,
        /// `IBV_WC_RECV_RDMA_WITH_IMM`: a receive consumed by an RDMA write with immediate.
        RecvRdmaWithImm = ffi::IBV_WC_RECV_RDMA_WITH_IMM,
        /// `IBV_WC_TM_ADD`.
        TmAdd = ffi::IBV_WC_TM_ADD,
        /// `IBV_WC_TM_DEL`.
        TmDel = ffi::IBV_WC_TM_DEL,
        /// `IBV_WC_TM_SYNC`.
        TmSync = ffi::IBV_WC_TM_SYNC,
        /// `IBV_WC_TM_RECV`.
        TmRecv = ffi::IBV_WC_TM_RECV,
        /// `IBV_WC_TM_NO_TAG`.
        TmNoTag = ffi::IBV_WC_TM_NO_TAG,
        /// `IBV_WC_DRIVER1`.
        Driver1 = ffi::IBV_WC_DRIVER1,
        /// `IBV_WC_DRIVER2`.
        Driver2 = ffi::IBV_WC_DRIVER2,
        /// `IBV_WC_DRIVER3`.
        Driver3 = ffi::IBV_WC_DRIVER3,
    }
}

/// A work completion (`struct ibv_wc`), filled by [`CompletionQueue::poll`].
///
/// The layout is the C structure's, so polling writes straight into a caller's array.
#[repr(transparent)]
#[derive(Copy, Clone, Default)]
pub struct WorkCompletion(ffi::ibv_wc);

impl WorkCompletion {
    /// The work request's `wr_id`.
    #[inline]
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id
    }

    /// The status.
    #[inline]
    pub fn status(&self) -> WcStatus {
        WcStatus::from_raw(self.0.status)
    }

    /// Whether the request succeeded.
    #[inline]
    pub fn is_success(&self) -> bool {
        self.0.status == ffi::IBV_WC_SUCCESS
    }

    /// The opcode. Only meaningful for successful completions (verbs leaves it undefined for
    /// failed ones).
    #[inline]
    pub fn opcode(&self) -> WcOpcode {
        WcOpcode::from_raw(self.0.opcode)
    }

    /// Whether the completion is of a receive a SEND or an RDMA WRITE with immediate data
    /// consumed (opcode `IBV_WC_RECV` or `IBV_WC_RECV_RDMA_WITH_IMM`), not of a send request:
    /// two compares, no conversion. Only meaningful for successful completions, as
    /// [`opcode`](Self::opcode).
    #[inline]
    pub fn is_recv(&self) -> bool {
        matches!(
            self.0.opcode,
            ffi::IBV_WC_RECV | ffi::IBV_WC_RECV_RDMA_WITH_IMM
        )
    }

    /// Whether the completion is of a receive an RDMA WRITE with immediate data consumed (its
    /// bytes went to the writer's target, not to the receive): the raw opcode compared, with
    /// no conversion.
    #[inline]
    pub(crate) fn is_recv_rdma_with_imm(&self) -> bool {
        self.0.opcode == ffi::IBV_WC_RECV_RDMA_WITH_IMM
    }

    /// The vendor's error code, for failed completions.
    pub fn vendor_err(&self) -> u32 {
        self.0.vendor_err
    }

    /// Bytes received (receive completions) or transferred.
    #[inline]
    pub fn byte_len(&self) -> u32 {
        self.0.byte_len
    }

    /// The immediate data, in host byte order, if the completion carries one.
    #[inline]
    pub fn imm_data(&self) -> Option<u32> {
        // SAFETY: both union members are plain u32s.
        self.flags()
            .contains(WcFlags::WITH_IMM)
            .then(|| u32::from_be(unsafe { self.0.__bindgen_anon_1.imm_data }))
    }

    /// The rkey a send-with-invalidate invalidated, if any.
    pub fn invalidated_rkey(&self) -> Option<u32> {
        // SAFETY: both union members are plain u32s.
        let rkey = unsafe { self.0.__bindgen_anon_1.invalidated_rkey };
        self.flags().contains(WcFlags::WITH_INV).then_some(rkey)
    }

    /// The local queue pair number the completion belongs to.
    #[inline]
    pub fn qp_num(&self) -> u32 {
        self.0.qp_num
    }

    /// The sender's queue pair number (UD receives).
    pub fn src_qp(&self) -> u32 {
        self.0.src_qp
    }

    /// Completion flags.
    #[inline]
    pub fn flags(&self) -> WcFlags {
        WcFlags::from_bits_retain(self.0.wc_flags)
    }

    /// P_Key index (GSI queue pairs).
    pub fn pkey_index(&self) -> u16 {
        self.0.pkey_index
    }

    /// The sender's LID (UD receives on InfiniBand).
    pub fn slid(&self) -> u16 {
        self.0.slid
    }

    /// The sender's service level (UD receives).
    pub fn sl(&self) -> u8 {
        self.0.sl
    }

    /// Destination LID path bits (UD receives).
    pub fn dlid_path_bits(&self) -> u8 {
        self.0.dlid_path_bits
    }

    pub(crate) fn as_raw(&self) -> &ffi::ibv_wc {
        &self.0
    }
}

impl fmt::Debug for WorkCompletion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("WorkCompletion");
        s.field("wr_id", &self.wr_id())
            .field("status", &self.status());
        if self.is_success() {
            s.field("opcode", &self.opcode())
                .field("byte_len", &self.byte_len());
            if let Some(imm) = self.imm_data() {
                s.field("imm_data", &imm);
            }
        } else {
            s.field("vendor_err", &self.vendor_err());
        }
        s.field("qp_num", &self.qp_num()).finish()
    }
}

impl CqEvent {
    /// Whether this event is for `cq`. A comparison of addresses: an event kept after its
    /// queue was destroyed may match a queue created later at the same address.
    pub fn is_for(&self, cq: &CompletionQueue) -> bool {
        self.cq() == cq.as_raw()
    }
}

/// The bounded waits' loop (`poll_for`, `poll_each_for`, `poll_extended_for`,
/// `PostScope::poll_for`): calls `poll` with how many completions are in, which reaps some of
/// the rest and returns how many, until `min` are in or `timeout` has passed (backing off as
/// [`Backoff`] says); returns how many are in.
#[inline]
pub(crate) fn poll_until(
    min: usize,
    timeout: Duration,
    mut poll: impl FnMut(usize) -> Result<usize>,
) -> Result<usize> {
    if min == 0 {
        return Ok(0);
    }
    // The first poll, inlined, reads no clock: where the completions are already in, the
    // wait costs the poll alone.
    let n = poll(0)?;
    if n >= min {
        return Ok(n);
    }
    poll_more(min, timeout, n, poll)
}

/// [`poll_until`] after a first poll that found `n` of `min`: the waiting, out of line.
#[inline(never)]
fn poll_more(
    min: usize,
    timeout: Duration,
    mut n: usize,
    mut poll: impl FnMut(usize) -> Result<usize>,
) -> Result<usize> {
    let mut backoff = Backoff::new(timeout);
    let mut got = n;
    while n < min && backoff.again(got) {
        got = poll(n)?;
        n += got;
    }
    Ok(n)
}

/// The wait between polls of a bounded poll ([`poll_until`]): a busy poll that yields, and
/// after a thousand empty polls in a row sleeps 50 µs between them, until `timeout` has passed
/// since it was made.
#[derive(Debug)]
struct Backoff {
    start: Instant,
    timeout: Duration,
    idle: u32,
}

impl Backoff {
    const SPIN_ROUNDS: u32 = 1000;
    const IDLE_SLEEP: Duration = Duration::from_micros(50);

    fn new(timeout: Duration) -> Self {
        Self {
            start: Instant::now(),
            timeout,
            idle: 0,
        }
    }

    /// After a poll that reaped `got` completions: `false` once the time is up, else waits
    /// as the poll's luck says and returns `true`.
    fn again(&mut self, got: usize) -> bool {
        if self.start.elapsed() >= self.timeout {
            return false;
        }
        if got > 0 {
            self.idle = 0;
        } else if self.idle < Self::SPIN_ROUNDS {
            self.idle += 1;
            std::thread::yield_now();
        } else {
            std::thread::sleep(Self::IDLE_SLEEP);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_completion_is_an_ibv_wc() {
        assert_eq!(
            std::mem::size_of::<WorkCompletion>(),
            std::mem::size_of::<ffi::ibv_wc>()
        );
        let mut raw = ffi::ibv_wc {
            wr_id: 7,
            status: ffi::IBV_WC_REM_ACCESS_ERR,
            wc_flags: ffi::IBV_WC_WITH_IMM,
            ..Default::default()
        };
        raw.__bindgen_anon_1.imm_data = 0x1234_5678u32.to_be();
        let wc = WorkCompletion(raw);
        assert_eq!(wc.status(), WcStatus::RemAccessErr);
        assert!(!wc.is_success());
        assert_eq!(wc.imm_data(), Some(0x1234_5678));
        assert_eq!(WcStatus::from_raw(999), WcStatus::Unknown(999));
    }
}
