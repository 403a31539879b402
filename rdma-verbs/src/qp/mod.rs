//! Queue pairs, with their state and transport as types.
//!
//! A queue pair is a [`QueuePair<T, S>`]: `T` is the transport ([`Rc`], [`Uc`], [`Ud`]) and `S`
//! the state ([`Reset`], [`Init`], [`Rtr`], [`Rts`], [`ErrorState`]). Each transition
//! consumes the queue pair and returns it in the new state; on failure it comes back unchanged
//! inside a [`TransitionError`]. Receives can be posted from INIT on, sends only in RTS:
//!
//! ```compile_fail,E0599
//! # use rdma_verbs::{*, ah::*, async_event::*, channel::*, cq::*, device::*, mr::*, mw::*, owned::*, qp::*, scope::*, slot::*, srq::*, wr::*, xrcd::*, ah::*, async_event::*, channel::*, cq::*, device::*, mr::*, mw::*, owned::*, qp::*, scope::*, slot::*, srq::*, wr::*, xrcd::*};
//! # fn f(qp: QueuePair<Rc, Init>, list: &mut SendList<'_>) {
//! # let mut qp = qp;
//! unsafe { qp.post_send(list) }; // no `post_send` on a queue pair in INIT
//! # }
//! ```
//!
//! ```compile_fail,E0599
//! # use rdma_verbs::{*, ah::*, async_event::*, channel::*, cq::*, device::*, mr::*, mw::*, owned::*, qp::*, scope::*, slot::*, srq::*, wr::*, xrcd::*, ah::*, async_event::*, channel::*, cq::*, device::*, mr::*, mw::*, owned::*, qp::*, scope::*, slot::*, srq::*, wr::*, xrcd::*};
//! # fn f(qp: QueuePair<Rc, Reset>, a: RcRtsAttr) {
//! let qp = qp.into_rts(&a); // RESET cannot go to RTS directly
//! # }
//! ```

mod attr;
mod bind;
mod builder;
mod connect;
mod ece;
mod extended;
mod mcast;
mod post;
mod rate;
mod state;

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

pub use crate::c_enum::SendOpcode;
pub use attr::{
    ConnectedInitAttr, ModifyAttr, RawModifyAttr, RcRtrAttr, RcRtsAttr, SqPsnRtsAttr, UcRtrAttr,
    UdInitAttr, UdRtrAttr,
};
pub use builder::{QpBuilder, QpMaker};
pub use connect::{Connected, ConnectionRecord};
pub use ece::Ece;
pub use extended::SendPath;
pub(crate) use post::{EXTENDED_POST_VERB, check_ops, may_have_posted};
pub use rate::RateLimit;
pub use state::{CanPostRecv, ErrorState, Init, QpState, QpStateKind, Reset, Rtr, Rts};

use crate::cq::CqInner;
use crate::error::{Errno, Error, Result};
use crate::ffi;
use crate::inflight::QpTables;
use crate::mw::MwShared;
use crate::pd::ProtectionDomain;
use crate::srq::SrqInner;
use crate::wr::op;

/// The signal rule of the safe send paths (owned and slot sends): the run of unsignaled
/// sends of the queue pair after one more is posted, when `run` were before it; 0 when that
/// send must be signaled: because `signal` (the caller asked, or its path forces it), or
/// because the run would reach `every` (at most the send queue's size), so that the send
/// queue never holds `every` unsignaled requests in a row with no signaled one after them.
#[inline(always)]
pub(crate) fn next_run(run: u32, signal: bool, every: u32) -> u32 {
    let next = run.saturating_add(1);
    if signal || next >= every { 0 } else { next }
}

mod sealed {
    pub trait Sealed {}
}

/// A transport: [`Rc`], [`Uc`] or [`Ud`]. It fixes the attributes of each transition and the
/// operations the queue pair may post.
pub trait Transport: sealed::Sealed + 'static {
    /// `IBV_QPT_*`.
    const QP_TYPE: u32;
    /// The transport's name.
    const NAME: &'static str;
    /// Operations (bits of the crate's op set) the transport allows.
    #[doc(hidden)]
    const OPS: u32;
    /// Whether sends need a datagram address ([`SendRequest::to`](crate::wr::SendRequest::to)).
    const DATAGRAM: bool;
    /// Attributes of RESET → INIT.
    type InitAttr: ModifyAttr;
    /// Attributes of INIT → RTR.
    type RtrAttr: ModifyAttr;
    /// Attributes of RTR → RTS.
    type RtsAttr: ModifyAttr;
}

/// Reliable connection: every operation, acknowledged and retried.
#[derive(Debug)]
pub enum Rc {}
/// Unreliable connection: SEND and RDMA WRITE (with or without immediate), no acknowledgement.
#[derive(Debug)]
pub enum Uc {}
/// Unreliable datagram: SEND (with or without immediate) to any UD queue pair through an
/// [`AddressHandle`](crate::AddressHandle), one MTU at most.
#[derive(Debug)]
pub enum Ud {}

impl sealed::Sealed for Rc {}
impl Transport for Rc {
    const QP_TYPE: u32 = ffi::IBV_QPT_RC;
    const NAME: &'static str = "RC";
    const OPS: u32 = op::SEND
        | op::SEND_WITH_IMM
        | op::WRITE
        | op::WRITE_WITH_IMM
        | op::READ
        | op::ATOMIC
        | op::ATOMIC_WRITE
        | op::BIND_MW
        | op::LOCAL_INV
        | op::SEND_WITH_INV;
    const DATAGRAM: bool = false;
    type InitAttr = ConnectedInitAttr;
    type RtrAttr = RcRtrAttr;
    type RtsAttr = RcRtsAttr;
}

impl sealed::Sealed for Uc {}
impl Transport for Uc {
    const QP_TYPE: u32 = ffi::IBV_QPT_UC;
    const NAME: &'static str = "UC";
    const OPS: u32 = op::SEND
        | op::SEND_WITH_IMM
        | op::WRITE
        | op::WRITE_WITH_IMM
        | op::BIND_MW
        | op::LOCAL_INV
        | op::SEND_WITH_INV;
    const DATAGRAM: bool = false;
    type InitAttr = ConnectedInitAttr;
    type RtrAttr = UcRtrAttr;
    type RtsAttr = SqPsnRtsAttr;
}

impl sealed::Sealed for Ud {}
impl Transport for Ud {
    const QP_TYPE: u32 = ffi::IBV_QPT_UD;
    const NAME: &'static str = "UD";
    const OPS: u32 = op::SEND | op::SEND_WITH_IMM;
    const DATAGRAM: bool = true;
    type InitAttr = UdInitAttr;
    type RtrAttr = UdRtrAttr;
    type RtsAttr = SqPsnRtsAttr;
}

/// The capacities of a queue pair (`struct ibv_qp_cap`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Outstanding send requests.
    pub max_send_wr: u32,
    /// Outstanding receive requests.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send request.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive request.
    pub max_recv_sge: u32,
    /// Bytes of inline data per send request.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    /// 16 send and 16 receive requests, one entry each, no inline data.
    fn default() -> Self {
        Self {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        }
    }
}

pub(crate) struct QpInner {
    raw: NonNull<ffi::ibv_qp>,
    /// The `ibv_qp_ex` whose builders post sends, when the queue pair uses the extended path.
    extended: Option<extended::ExtendedSend>,
    caps: QpCaps,
    pd: ProtectionDomain,
    // Dropped after the queue pair, which uses them.
    _send_cq: Arc<CqInner>,
    _recv_cq: Arc<CqInner>,
    _srq: Option<Arc<SrqInner>>,
    /// Set when a [`PostScope`](crate::scope::PostScope) moved this queue pair to the error state or
    /// to RESET behind its type: the next scope checks the real state before it posts.
    pub(crate) state_changed: bool,
    /// The owned requests in flight (`docs/data-path.md`), reached by the completion queues
    /// through their routes.
    pub(crate) tables: Arc<QpTables>,
    /// Set once `ibv_destroy_qp` succeeded (by [`QueuePair::close`] or `Drop`).
    pub(crate) destroyed: bool,
    /// Unsignaled sends of the safe paths (owned and slot sends) posted since the last
    /// signaled one of any of them: each path signals one before the send queue can fill with
    /// unsignaled requests, which on providers that free send-queue entries only at a
    /// completion would leave nothing to complete them (`docs/data-path.md`, "Slot rings",
    /// **Signals**).
    pub(crate) unsignaled_run: u32,
    /// The multicast groups (GID, LID) it is attached to: detached before the destroy, which
    /// the kernel refuses (`EBUSY`) while any is left.
    pub(crate) mcast: Vec<(crate::device::Gid, u16)>,
    /// The library that made the queue pair and destroys it ([`QpBuilder::build_by`]), or
    /// `None` for `ibv_create_qp(_ex)` and `ibv_destroy_qp`.
    pub(crate) maker: Option<Arc<dyn QpMaker>>,
}

// SAFETY: verbs on a queue pair may be called from any thread; posting takes `&mut`, which also
// keeps every `ibv_wr_start` .. `ibv_wr_complete` batch of the extended path on one thread.
unsafe impl Send for QpInner {}
// SAFETY: shared access only queries (thread-safe in libibverbs); the `ibv_qp_ex` is touched
// only by posting, through `&mut`.
unsafe impl Sync for QpInner {}

impl QpInner {
    /// `ibv_destroy_qp`, once; on success the owned requests still in flight are released.
    fn destroy(&mut self) -> Result<()> {
        if self.destroyed {
            return Ok(());
        }
        // Inside a poll session of one of its queues (on this thread) the provider may hold
        // the queue's lock, which the destroy takes (mlx5): it would never return.
        if self._send_cq.in_session_here() || self._recv_cq.in_session_here() {
            return Err(Error::verb("ibv_destroy_qp", Errno::BUSY));
        }
        // A window bound through this queue pair holds it in the device (rxe waits about 50 s
        // for it, then destroys anyway): end those bindings first.
        self.tables.windows.release_all();
        // A detach that fails leaves the group attached: the destroy then fails and says so.
        let raw_qp = self.raw.as_ptr();
        self.mcast.retain(|&(gid, lid)| {
            let raw = gid.to_raw();
            // SAFETY: a live queue pair; the GID is read during the call.
            unsafe { ffi::ibv_detach_mcast(raw_qp, &raw, lid) != 0 }
        });
        let (verb, ret) = match &self.maker {
            Some(maker) => ("rdma_destroy_qp", maker.destroy(self.raw)),
            // SAFETY: live queue pair (not yet destroyed), destroyed once, before the CQs, SRQ
            // and PD it holds.
            None => ("ibv_destroy_qp", unsafe {
                ffi::ibv_destroy_qp(self.raw.as_ptr())
            }),
        };
        Errno::result(ret).map_err(|errno| Error::verb(verb, errno))?;
        self.destroyed = true;
        // The device no longer uses anything of the queue pair's: owned requests still in
        // flight are released (their buffers go back to their pools), and late completions
        // find no route.
        self._send_cq.routes.remove(&self.tables);
        self._recv_cq.routes.remove(&self.tables);
        self.tables.clear();
        self.tables.attached.detach_all();
        Ok(())
    }
}

impl Drop for QpInner {
    fn drop(&mut self) {
        // Drop cannot report a failure and must not panic (see "Resource cleanup" in the
        // crate documentation). A queue pair that still exists may still complete into its
        // queues and use its SRQ and protection domain: they are leaked, so they stay alive and
        // count as used (a scope then refuses those queues, whose completions it could not
        // account for), and its routes stay, with the tables and their buffers: a completion
        // may still release them.
        if self.destroy().is_err() {
            std::mem::forget(self._send_cq.clone());
            std::mem::forget(self._recv_cq.clone());
            std::mem::forget(self._srq.clone());
            std::mem::forget(self.pd.clone());
            // And the library that made it, which must not end what it still uses.
            std::mem::forget(self.maker.clone());
        }
    }
}

/// A queue pair (`struct ibv_qp`) of transport `T` in state `S`.
///
/// It keeps its protection domain, completion queues and shared receive queue alive, so it can
/// live in one struct with them in any order. Not `Clone`: it is the one handle that may change
/// the queue pair's state and post to it. `Send` and `Sync` (posting takes `&mut self`).
pub struct QueuePair<T: Transport, S: QpState> {
    inner: QpInner,
    _type: PhantomData<fn() -> (T, S)>,
}

impl<T: Transport, S: QpState> fmt::Debug for QueuePair<T, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("transport", &T::NAME)
            .field("state", &S::KIND)
            .field("qp_num", &self.qp_num())
            .finish()
    }
}

/// A failed transition: the queue pair, unchanged in state `S`, and the error.
pub struct TransitionError<T: Transport, S: QpState> {
    qp: QueuePair<T, S>,
    error: Error,
}

impl<T: Transport, S: QpState> TransitionError<T, S> {
    /// The queue pair and the error.
    pub fn into_parts(self) -> (QueuePair<T, S>, Error) {
        (self.qp, self.error)
    }

    /// The error.
    pub fn error(&self) -> &Error {
        &self.error
    }

    /// The queue pair, still in state `S`.
    pub fn into_qp(self) -> QueuePair<T, S> {
        self.qp
    }
}

impl<T: Transport, S: QpState> fmt::Debug for TransitionError<T, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransitionError")
            .field("qp", &self.qp)
            .field("error", &self.error)
            .finish()
    }
}

impl<T: Transport, S: QpState> fmt::Display for TransitionError<T, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl<T: Transport, S: QpState> std::error::Error for TransitionError<T, S> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.error)
    }
}

impl<T: Transport, S: QpState> From<TransitionError<T, S>> for Error {
    fn from(error: TransitionError<T, S>) -> Self {
        error.error
    }
}

/// Result of a transition.
pub type Transition<T, From, To> = std::result::Result<QueuePair<T, To>, TransitionError<T, From>>;

impl<T: Transport, S: QpState> QueuePair<T, S> {
    /// `ibv_destroy_qp`: what dropping does, with the failure reported. Before it, the type 2
    /// windows owned binds of this queue pair bound are deallocated, even if the destroy then
    /// fails (see
    /// [`MemoryWindow`](crate::MemoryWindow), "Destroying the queue pair a window is bound
    /// to"). On success the owned requests still in flight are released, as on drop. On failure the queue pair is handed
    /// back unchanged; dropping it tries again (and then leaks its queues, SRQ and protection
    /// domain, which it may still use).
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with `ibv_destroy_qp`'s errno (or [`Error::Unsupported`]).
    ///
    /// # References
    ///
    /// [`ibv_destroy_qp(3)`](https://man7.org/linux/man-pages/man3/ibv_destroy_qp.3.html)
    #[doc(alias = "ibv_destroy_qp")]
    pub fn close(mut self) -> std::result::Result<(), (Self, Error)> {
        match self.inner.destroy() {
            Ok(()) => Ok(()),
            Err(error) => Err((self, error)),
        }
    }

    /// The queue pair number.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: live queue pair.
        unsafe { (*self.inner.raw.as_ptr()).qp_num }
    }

    /// The capacities the device granted.
    #[inline]
    pub fn caps(&self) -> QpCaps {
        self.inner.caps
    }

    /// Records `window`, whose owned bind this queue pair posted (or may have), so that its
    /// destruction deallocates the window first.
    pub(crate) fn keep_window(&mut self, window: Arc<MwShared>) {
        self.inner.tables.windows.keep(window);
    }

    /// The in-flight tables of owned requests.
    pub(crate) fn tables(&self) -> &Arc<QpTables> {
        &self.inner.tables
    }

    /// Whether the queue pair receives through an SRQ.
    pub(crate) fn has_srq(&self) -> bool {
        self.inner._srq.is_some()
    }

    /// The completion queues this queue pair was created with: (send, receive).
    pub(crate) fn cq_inners(&self) -> (&Arc<CqInner>, &Arc<CqInner>) {
        (&self.inner._send_cq, &self.inner._recv_cq)
    }

    /// See [`QpInner::state_changed`].
    pub(crate) fn state_changed_mut(&mut self) -> &mut bool {
        &mut self.inner.state_changed
    }

    /// The run of unsignaled sends of the safe paths posted since the last signaled one (see
    /// [`QpInner::unsignaled_run`]).
    #[inline(always)]
    pub(crate) fn unsignaled_run(&self) -> u32 {
        self.inner.unsignaled_run
    }

    /// Sets [`unsignaled_run`](Self::unsignaled_run), after a post.
    #[inline(always)]
    pub(crate) fn set_unsignaled_run(&mut self, run: u32) {
        self.inner.unsignaled_run = run;
    }

    /// The signal rule of the safe send paths for one more send ([`next_run`] from the
    /// current run): 0 when it must be signaled. Changes nothing: the post's outcome goes to
    /// [`count_unsignaled`](Self::count_unsignaled).
    #[inline(always)]
    pub(crate) fn next_unsignaled(&self, signal: bool, every: u32) -> u32 {
        next_run(self.inner.unsignaled_run, signal, every)
    }

    /// Records the outcome of a post that [`next_unsignaled`](Self::next_unsignaled) gave
    /// `run`: the run it made if the provider took the request, one more than before if the
    /// provider did not say (the most it can be), unchanged if it refused it.
    #[inline(always)]
    pub(crate) fn count_unsignaled(&mut self, run: u32, result: &Result<()>) {
        match result {
            Ok(()) => self.inner.unsignaled_run = run,
            Err(error) if may_have_posted(error) => {
                self.inner.unsignaled_run = self.inner.unsignaled_run.saturating_add(1);
            }
            Err(_) => {}
        }
    }

    /// Whether sends go through the extended `ibv_wr_*` API (see [`SendPath`]): `false` for
    /// [`SendPath::Classic`], and for [`SendPath::Auto`] where the provider did not offer it.
    pub fn uses_extended_post(&self) -> bool {
        self.inner.extended.is_some()
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.pd
    }

    /// Whether another library made the queue pair and destroys it
    /// ([`QpBuilder::build_by`]: the connection manager's own queue pairs).
    pub fn has_maker(&self) -> bool {
        self.inner.maker.is_some()
    }

    /// The raw `ibv_qp`.
    ///
    /// A request posted through it (with `ffi::ibv_post_send` and the like) must not carry a
    /// `wr_id` with the top bit set: those are the owned path's and the slot rings' ids, which the
    /// crate's own post calls refuse, and a completion carrying one could hand back a buffer or
    /// slot the device still uses.
    pub fn as_raw(&self) -> *mut ffi::ibv_qp {
        self.inner.raw.as_ptr()
    }

    /// `ibv_query_qp`: the state the device reports, which differs from `S` when the device
    /// moved the queue pair to an error state (for example after a transport error).
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with the errno of `ibv_query_qp`.
    ///
    /// # References
    ///
    /// [`ibv_query_qp(3)`](https://man7.org/linux/man-pages/man3/ibv_query_qp.3.html)
    #[doc(alias = "ibv_query_qp")]
    pub fn query_state(&self) -> Result<QpStateKind> {
        let mut attr = ffi::ibv_qp_attr::default();
        let mut init = ffi::ibv_qp_init_attr::default();
        // SAFETY: live queue pair; writable out-structures.
        let ret = unsafe {
            ffi::ibv_query_qp(
                self.as_raw(),
                &mut attr,
                ffi::IBV_QP_STATE as i32,
                &mut init,
            )
        };
        Error::check("ibv_query_qp", ret)?;
        Ok(QpStateKind::from_raw(attr.qp_state))
    }

    fn modify<To: QpState>(
        self,
        fill: impl FnOnce(&mut ffi::ibv_qp_attr) -> u32,
    ) -> Transition<T, S, To> {
        let mut attr = ffi::ibv_qp_attr {
            qp_state: To::KIND.as_raw(),
            ..Default::default()
        };
        let mask = fill(&mut attr) | ffi::IBV_QP_STATE;
        self.modify_raw(attr, mask)
    }

    fn modify_raw<To: QpState>(
        mut self,
        mut attr: ffi::ibv_qp_attr,
        mask: u32,
    ) -> Transition<T, S, To> {
        let (send_cq, recv_cq) = self.cq_inners();
        let ret = if To::KIND == QpStateKind::Reset
            && (send_cq.in_session_here() || recv_cq.in_session_here())
        {
            // As in `destroy`: a reset cleans the queues under their lock (mlx5).
            libc::EBUSY
        } else {
            // SAFETY: live queue pair; `attr` holds every field `mask` names.
            unsafe { ffi::ibv_modify_qp(self.as_raw(), &mut attr, mask as i32) }
        };
        match Errno::result(ret) {
            Ok(()) => {
                if To::KIND == QpStateKind::Reset {
                    // The device dropped every request: owned ones are released, and no
                    // unsignaled send is left in the send queue.
                    self.inner.tables.clear();
                    self.inner.unsignaled_run = 0;
                }
                Ok(self.cast())
            }
            Err(errno) => Err(TransitionError {
                error: Error::ModifyQp {
                    from: S::KIND,
                    to: QpStateKind::from_raw(attr.qp_state),
                    errno,
                },
                qp: self,
            }),
        }
    }

    fn cast<To: QpState>(self) -> QueuePair<T, To> {
        QueuePair {
            inner: self.inner,
            _type: PhantomData,
        }
    }

    /// Moves the queue pair to ERR: outstanding and later requests complete with
    /// [`WcStatus::WrFlushErr`](crate::cq::WcStatus::WrFlushErr).
    ///
    /// # Errors
    ///
    /// [`Error::ModifyQp`], with the queue pair back.
    pub fn into_error(self) -> Transition<T, S, ErrorState> {
        self.modify(|_| 0)
    }

    /// Moves the queue pair to RESET, discarding outstanding requests (poll their completions
    /// first, or move to ERR and poll the flush completions).
    ///
    /// # Errors
    ///
    /// [`Error::ModifyQp`], with the queue pair back.
    pub fn into_reset(self) -> Transition<T, S, Reset> {
        self.modify(|_| 0)
    }

    /// Asserts that the queue pair is in state `To`, for a queue pair moved outside this type
    /// (for example with [`modify_raw_in_place`](Self::modify_raw_in_place) or by the connection manager).
    ///
    /// # Safety
    ///
    /// The queue pair must really be in state `To` (or an error state the device moved it
    /// to): posting in a state the device refuses is reported as an error, but the crate's
    /// types then describe the wrong state. `To = Reset` needs a queue pair that really was
    /// reset (an `ibv_modify_qp` to RESET succeeded since its last post), not one in an error
    /// state: the slot rings' `reclaim` frees every slot of a queue pair typed `Reset`.
    pub unsafe fn assume_state<To: QpState>(self) -> QueuePair<T, To> {
        self.cast()
    }

    /// `ibv_modify_qp` with caller-made attributes, without a state change in the type.
    ///
    /// # Safety
    ///
    /// The attributes must not move the queue pair to a state other than `S` (use
    /// [`assume_state`](Self::assume_state) afterwards if they do), and must be valid for
    /// `ibv_modify_qp` with their mask.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with the errno of `ibv_modify_qp`.
    pub unsafe fn modify_raw_in_place(&mut self, attr: &RawModifyAttr) -> Result<()> {
        let (mut raw, mask) = attr.raw();
        // SAFETY: live queue pair; the caller vouches for the attributes.
        let ret = unsafe { ffi::ibv_modify_qp(self.as_raw(), &mut raw, mask as i32) };
        Error::check("ibv_modify_qp", ret)
    }

    fn check_target(attr: &RawModifyAttr, to: QpStateKind) -> Result<()> {
        if attr.raw().1 & ffi::IBV_QP_STATE == 0 {
            return Err(Error::InvalidArgument(
                "the attribute mask lacks IBV_QP_STATE: the queue pair would not move".into(),
            ));
        }
        if attr.target() != to {
            return Err(Error::InvalidArgument(format!(
                "the attributes move to {}, not {to}",
                attr.target()
            )));
        }
        Ok(())
    }
}

impl<T: Transport> QueuePair<T, Reset> {
    /// `ibv_modify_qp` RESET → INIT.
    ///
    /// # Errors
    ///
    /// [`Error::ModifyQp`] (for example `EINVAL` for a port the device lacks), with the queue
    /// pair back in RESET.
    ///
    /// # References
    ///
    /// [`ibv_modify_qp(3)`](https://man7.org/linux/man-pages/man3/ibv_modify_qp.3.html)
    #[doc(alias = "ibv_modify_qp")]
    pub fn into_init(self, attr: &T::InitAttr) -> Transition<T, Reset, Init> {
        self.modify(|raw| attr.fill(raw))
    }

    /// RESET → INIT with attributes prepared elsewhere (for example by `rdma_init_qp_attr`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `attr` does not target INIT, else as
    /// [`into_init`](Self::into_init).
    pub fn into_init_with(self, attr: &RawModifyAttr) -> Transition<T, Reset, Init> {
        if let Err(error) = Self::check_target(attr, QpStateKind::Init) {
            return Err(TransitionError { qp: self, error });
        }
        let (raw, mask) = attr.raw();
        self.modify_raw(raw, mask)
    }
}

impl<T: Transport> QueuePair<T, Init> {
    /// `ibv_modify_qp` INIT → INIT with attributes prepared elsewhere: updates what INIT sets
    /// (access flags, port, P_Key index) without leaving the state. The connection manager's
    /// active side needs it: its INIT attributes before the connection is known allow no
    /// remote access, the ones after the peer's response carry the access the connection
    /// negotiated (librdmacm's own queue pairs take the same step).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `attr` does not target INIT; [`Error::Verb`] with the
    /// errno of `ibv_modify_qp` (the queue pair stays in INIT).
    ///
    /// # References
    ///
    /// [`ibv_modify_qp(3)`](https://man7.org/linux/man-pages/man3/ibv_modify_qp.3.html)
    #[doc(alias = "ibv_modify_qp")]
    pub fn update_init_with(&mut self, attr: &RawModifyAttr) -> Result<()> {
        Self::check_target(attr, QpStateKind::Init)?;
        // SAFETY: the attributes keep the queue pair in INIT (checked above), and a
        // `RawModifyAttr` is valid for `ibv_modify_qp` by its construction contract.
        unsafe { self.modify_raw_in_place(attr) }
    }
}

impl<T: Transport> QueuePair<T, Init> {
    /// `ibv_modify_qp` INIT → RTR.
    ///
    /// # Errors
    ///
    /// [`Error::ModifyQp`] (on RoCE, `ETIMEDOUT` or `ENETUNREACH` when the GID has no route),
    /// with the queue pair back in INIT.
    ///
    /// # References
    ///
    /// [`ibv_modify_qp(3)`](https://man7.org/linux/man-pages/man3/ibv_modify_qp.3.html)
    #[doc(alias = "ibv_modify_qp")]
    pub fn into_rtr(self, attr: &T::RtrAttr) -> Transition<T, Init, Rtr> {
        self.modify(|raw| attr.fill(raw))
    }

    /// INIT → RTR with attributes prepared elsewhere.
    ///
    /// # Errors
    ///
    /// As [`into_init_with`](QueuePair::into_init_with).
    pub fn into_rtr_with(self, attr: &RawModifyAttr) -> Transition<T, Init, Rtr> {
        if let Err(error) = Self::check_target(attr, QpStateKind::Rtr) {
            return Err(TransitionError { qp: self, error });
        }
        let (raw, mask) = attr.raw();
        self.modify_raw(raw, mask)
    }
}

impl<T: Transport> QueuePair<T, Rtr> {
    /// `ibv_modify_qp` RTR → RTS.
    ///
    /// # Errors
    ///
    /// [`Error::ModifyQp`], with the queue pair back in RTR.
    ///
    /// # References
    ///
    /// [`ibv_modify_qp(3)`](https://man7.org/linux/man-pages/man3/ibv_modify_qp.3.html)
    #[doc(alias = "ibv_modify_qp")]
    pub fn into_rts(self, attr: &T::RtsAttr) -> Transition<T, Rtr, Rts> {
        self.modify(|raw| attr.fill(raw))
    }

    /// RTR → RTS with attributes prepared elsewhere.
    ///
    /// # Errors
    ///
    /// As [`into_init_with`](QueuePair::into_init_with).
    pub fn into_rts_with(self, attr: &RawModifyAttr) -> Transition<T, Rtr, Rts> {
        if let Err(error) = Self::check_target(attr, QpStateKind::Rts) {
            return Err(TransitionError { qp: self, error });
        }
        let (raw, mask) = attr.raw();
        self.modify_raw(raw, mask)
    }
}

#[cfg(test)]
mod tests {
    use super::next_run;

    /// The run grows by one per unsignaled send and returns to 0 for a signaled one: asked or
    /// forced, or the one that would make the run reach `every`; it never wraps.
    #[test]
    fn the_signal_rule_bounds_the_run() {
        let every = 4;
        let mut run = 0;
        let mut runs = Vec::new();
        for _ in 0..9 {
            run = next_run(run, false, every);
            runs.push(run);
        }
        assert_eq!(runs, [1, 2, 3, 0, 1, 2, 3, 0, 1]);
        assert_eq!(next_run(2, true, every), 0, "asked or forced");
        assert_eq!(next_run(0, false, 1), 0, "a send queue of one: every send");
        assert_eq!(next_run(0, false, 0), 0);
        assert_eq!(next_run(u32::MAX, false, u32::MAX), 0, "no overflow");
        assert_eq!(next_run(u32::MAX - 2, false, u32::MAX), u32::MAX - 1);
    }
}
