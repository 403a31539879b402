//! Queue pairs, with their state and transport as types.
//!
//! A queue pair is a [`QueuePair<T, S>`]: `T` is the transport ([`Rc`], [`Uc`], [`Ud`]) and `S`
//! the state ([`Reset`], [`Init`], [`Rtr`], [`Rts`], [`Error`](state::Error)). Each transition
//! consumes the queue pair and returns it in the new state; on failure it comes back unchanged
//! inside a [`TransitionError`]. Receives can be posted from INIT on, sends only in RTS:
//!
//! ```compile_fail,E0599
//! # use rdma_verbs::*;
//! # fn f(qp: QueuePair<Rc, Init>, list: &mut SendList<'_>) {
//! # let mut qp = qp;
//! unsafe { qp.post_send(list) }; // no `post_send` on a queue pair in INIT
//! # }
//! ```
//!
//! ```compile_fail,E0599
//! # use rdma_verbs::*;
//! # fn f(qp: QueuePair<Rc, Reset>, a: RcRtsAttr) {
//! let qp = qp.into_rts(&a); // RESET cannot go to RTS directly
//! # }
//! ```

mod attr;
mod extended;
mod state;

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

pub use attr::{
    AddressVector, ConnectedInitAttr, GlobalRoute, ModifyAttr, RawModifyAttr, RcRtrAttr, RcRtsAttr,
    SqPsnRtsAttr, UcRtrAttr, UdInitAttr, UdRtrAttr,
};
pub use extended::SendPath;
/// The ERR state marker (named `Error` in [`state`](self); re-exported as `Err` to keep it apart
/// from the crate's error type).
pub use state::Error as Err;
pub use state::{CanPostRecv, Init, QpState, QpStateKind, Reset, Rtr, Rts};

use crate::cq::{CompletionQueue, CqInner};
use crate::error::{Errno, Error, Result};
use crate::ffi;
use crate::inflight::QpTables;
use crate::pd::ProtectionDomain;
use crate::srq::{SharedReceiveQueue, SrqInner};
use crate::wr::{RecvList, RecvRequest, SendList, SendRequest, op};

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
    /// Whether sends need a datagram address ([`SendRequest::to`]).
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
    /// Set when a [`PostScope`](crate::PostScope) moved this queue pair to the error state or
    /// to RESET behind its type: the next scope checks the real state before it posts.
    pub(crate) state_changed: bool,
    /// The owned requests in flight (`docs/data-path.md`), reached by the completion queues
    /// through their routes.
    pub(crate) tables: Arc<QpTables>,
}

// SAFETY: verbs on a queue pair may be called from any thread; posting takes `&mut`, which also
// keeps every `ibv_wr_start` .. `ibv_wr_complete` batch of the extended path on one thread.
unsafe impl Send for QpInner {}
// SAFETY: shared access only queries (thread-safe in libibverbs); the `ibv_qp_ex` is touched
// only by posting, through `&mut`.
unsafe impl Sync for QpInner {}

impl Drop for QpInner {
    fn drop(&mut self) {
        // SAFETY: live queue pair, destroyed once, before the CQs, SRQ and PD it holds.
        let ret = unsafe { ffi::ibv_destroy_qp(self.raw.as_ptr()) };
        // Drop cannot report a failure and must not panic (see "Resource cleanup" in the
        // crate documentation). A queue pair that still exists may still complete into its
        // queues and use its SRQ and protection domain: they are leaked, so they stay alive and
        // count as used (a scope then refuses those queues, whose completions it could not
        // account for).
        if ret == 0 {
            // The device no longer uses anything of the queue pair's: owned requests still in
            // flight are released (their buffers go back to their pools), and late
            // completions find no route.
            self._send_cq.routes.remove(&self.tables);
            self._recv_cq.routes.remove(&self.tables);
            self.tables.clear();
        } else {
            // The routes stay, and with them the tables and their buffers: a completion may
            // still release them.
            std::mem::forget(self._send_cq.clone());
            std::mem::forget(self._recv_cq.clone());
            std::mem::forget(self._srq.clone());
            std::mem::forget(self.pd.clone());
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

/// Options of a new queue pair; see [`ProtectionDomain::create_qp`].
#[derive(Debug)]
#[must_use]
pub struct QpBuilder<'a, T: Transport> {
    pd: &'a ProtectionDomain,
    send_cq: &'a CompletionQueue,
    recv_cq: &'a CompletionQueue,
    srq: Option<&'a SharedReceiveQueue>,
    caps: QpCaps,
    sq_sig_all: bool,
    send_path: SendPath,
    _transport: PhantomData<fn() -> T>,
}

impl ProtectionDomain {
    /// A builder for a queue pair of transport `T` whose send and receive completions go to
    /// `send_cq` and `recv_cq` (which may be the same queue).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use rdma_verbs::{Context, Rc};
    ///
    /// let context = Context::open("rxe0")?;
    /// let pd = context.alloc_pd()?;
    /// let cq = context.create_cq(64)?;
    /// let qp = pd.create_qp::<Rc>(&cq, &cq).max_send_wr(32).build()?;
    /// # Ok::<(), rdma_verbs::Error>(())
    /// ```
    ///
    /// # References
    ///
    /// [`ibv_create_qp(3)`](https://man7.org/linux/man-pages/man3/ibv_create_qp.3.html)
    #[doc(alias = "ibv_create_qp")]
    pub fn create_qp<'a, T: Transport>(
        &'a self,
        send_cq: &'a CompletionQueue,
        recv_cq: &'a CompletionQueue,
    ) -> QpBuilder<'a, T> {
        QpBuilder {
            pd: self,
            send_cq,
            recv_cq,
            srq: None,
            caps: QpCaps::default(),
            sq_sig_all: false,
            send_path: SendPath::Classic,
            _transport: PhantomData,
        }
    }
}

impl<'a, T: Transport> QpBuilder<'a, T> {
    /// Outstanding send requests (16).
    pub fn max_send_wr(mut self, n: u32) -> Self {
        self.caps.max_send_wr = n;
        self
    }

    /// Outstanding receive requests (16; ignored with an SRQ).
    pub fn max_recv_wr(mut self, n: u32) -> Self {
        self.caps.max_recv_wr = n;
        self
    }

    /// Scatter/gather entries per send request (1).
    pub fn max_send_sge(mut self, n: u32) -> Self {
        self.caps.max_send_sge = n;
        self
    }

    /// Scatter/gather entries per receive request (1).
    pub fn max_recv_sge(mut self, n: u32) -> Self {
        self.caps.max_recv_sge = n;
        self
    }

    /// Bytes of inline data per send (0). The device may grant more; see
    /// [`QueuePair::caps`].
    pub fn max_inline_data(mut self, n: u32) -> Self {
        self.caps.max_inline_data = n;
        self
    }

    /// Every send request generates a completion (`sq_sig_all`); otherwise only those marked
    /// [`SendRequest::signaled`].
    pub fn sq_sig_all(mut self, all: bool) -> Self {
        self.sq_sig_all = all;
        self
    }

    /// Takes receives from `srq` instead of a receive queue of its own.
    pub fn srq(mut self, srq: &'a SharedReceiveQueue) -> Self {
        self.srq = Some(srq);
        self
    }

    /// How sends are posted ([`SendPath::Classic`]): through `ibv_post_send`, or through the
    /// extended `ibv_wr_*` API of a queue pair created by `ibv_create_qp_ex`, chosen by what
    /// the provider offers ([`SendPath::Auto`]) or required ([`SendPath::Extended`]).
    ///
    /// The path changes neither the posting API nor its safety contract;
    /// [`QueuePair::post_send`] says how its errors differ.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use rdma_verbs::{Context, Rc, SendPath};
    ///
    /// let context = Context::open("rxe0")?;
    /// let pd = context.alloc_pd()?;
    /// let cq = context.create_cq(64)?;
    /// let qp = pd.create_qp::<Rc>(&cq, &cq).send_path(SendPath::Auto).build()?;
    /// println!("extended sends: {}", qp.uses_extended_post());
    /// # Ok::<(), rdma_verbs::Error>(())
    /// ```
    ///
    /// # References
    ///
    /// [`ibv_create_qp_ex(3)`](https://man7.org/linux/man-pages/man3/ibv_create_qp_ex.3.html)
    #[doc(alias = "ibv_create_qp_ex")]
    pub fn send_path(mut self, path: SendPath) -> Self {
        self.send_path = path;
        self
    }

    /// `ibv_create_qp`: creates the queue pair, in RESET (`ibv_create_qp_ex` first, for the
    /// [`send_path`](Self::send_path)s `Auto` and `Extended`).
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`] if a CQ or SRQ belongs to another device context;
    /// - [`Error::Verb`] with the errno of `ibv_create_qp` (`EINVAL` for capacities above the
    ///   device's limits, `ENOMEM`), [`Error::Unsupported`] for a transport the device lacks;
    /// - [`Error::Verb`] with the errno of `ibv_create_qp_ex` when it fails for another reason
    ///   than a refusal of the extended API (`ENOMEM`: no fallback would help);
    /// - with [`SendPath::Extended`], where [`SendPath::Auto`] would fall back:
    ///   [`Error::Unsupported`] (`ibv_create_qp_ex`: the provider lacks it or refused the send
    ///   operations with `EOPNOTSUPP`; `ibv_qp_to_qp_ex`: the queue pair it made has no usable
    ///   builders) or [`Error::Verb`] (`ibv_create_qp_ex` refused them with `EINVAL`).
    ///
    /// # References
    ///
    /// [`ibv_create_qp(3)`](https://man7.org/linux/man-pages/man3/ibv_create_qp.3.html)
    /// [`ibv_create_qp_ex(3)`](https://man7.org/linux/man-pages/man3/ibv_create_qp_ex.3.html)
    #[doc(alias = "ibv_create_qp")]
    #[doc(alias = "ibv_create_qp_ex")]
    pub fn build(self) -> Result<QueuePair<T, Reset>> {
        let context = self.pd.context().as_raw();
        let foreign = self.send_cq.context().as_raw() != context
            || self.recv_cq.context().as_raw() != context
            || self
                .srq
                .is_some_and(|s| s.pd().context().as_raw() != context);
        if foreign {
            return Err(Error::InvalidArgument(
                "the completion queues and SRQ must belong to the protection domain's context"
                    .into(),
            ));
        }
        let mut init = ffi::ibv_qp_init_attr {
            send_cq: self.send_cq.as_raw(),
            recv_cq: self.recv_cq.as_raw(),
            srq: self.srq.map_or(std::ptr::null_mut(), |s| s.as_raw()),
            cap: ffi::ibv_qp_cap {
                max_send_wr: self.caps.max_send_wr,
                max_recv_wr: self.caps.max_recv_wr,
                max_send_sge: self.caps.max_send_sge,
                max_recv_sge: self.caps.max_recv_sge,
                max_inline_data: self.caps.max_inline_data,
            },
            qp_type: T::QP_TYPE,
            sq_sig_all: i32::from(self.sq_sig_all),
            ..Default::default()
        };
        let mut created = None;
        if self.send_path != SendPath::Classic {
            // SAFETY: live context of the PD, whose CQs and SRQ `init` names (checked above).
            let attempt =
                unsafe { extended::create(context, self.pd.as_raw(), &init, T::OPS, T::DATAGRAM) }?;
            let required = self.send_path == SendPath::Extended;
            match attempt {
                extended::Created::Qp {
                    raw,
                    extended: None,
                    ..
                } if required => {
                    // SAFETY: the queue pair just created, destroyed once and never used.
                    let _ = unsafe { ffi::ibv_destroy_qp(raw.as_ptr()) };
                    return Err(Error::Unsupported("ibv_qp_to_qp_ex"));
                }
                extended::Created::Qp { raw, cap, extended } => {
                    created = Some((raw, cap, extended));
                }
                extended::Created::Refused(errno) if required => {
                    return Err(Error::verb("ibv_create_qp_ex", errno));
                }
                extended::Created::Refused(_) => {}
            }
        }
        let (raw, cap, extended) = match created {
            Some(created) => created,
            None => {
                // SAFETY: live PD, CQs and SRQ of one context (checked above); `init` is valid.
                let raw = unsafe { ffi::ibv_create_qp(self.pd.as_raw(), &mut init) };
                let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_create_qp"))?;
                (raw, init.cap, None)
            }
        };
        // Both creators write back the capacities they granted.
        let caps = QpCaps {
            max_send_wr: cap.max_send_wr,
            max_recv_wr: cap.max_recv_wr,
            max_send_sge: cap.max_send_sge,
            max_recv_sge: cap.max_recv_sge,
            max_inline_data: cap.max_inline_data,
        };
        // The tables for owned requests, and the routes by which the queues reach them
        // (allocated here, once: posting and polling never allocate).
        let srq_table = self.srq.map(|srq| srq.inner.table.clone());
        let tables = Arc::new(QpTables::new(caps.max_send_wr, caps.max_recv_wr, srq_table));
        // SAFETY: the queue pair just created.
        let qp_num = unsafe { (*raw.as_ptr()).qp_num };
        let one_cq = Arc::ptr_eq(&self.send_cq.inner, &self.recv_cq.inner);
        self.send_cq.inner.routes.add(qp_num, &tables, true, one_cq);
        if !one_cq {
            self.recv_cq.inner.routes.add(qp_num, &tables, false, true);
        }
        Ok(QueuePair {
            inner: QpInner {
                raw,
                extended,
                caps,
                pd: self.pd.clone(),
                _send_cq: self.send_cq.inner.clone(),
                _recv_cq: self.recv_cq.inner.clone(),
                _srq: self.srq.map(|s| s.inner.clone()),
                state_changed: false,
                tables,
            },
            _type: PhantomData,
        })
    }
}

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
    /// The queue pair number.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: live queue pair.
        unsafe { (*self.inner.raw.as_ptr()).qp_num }
    }

    /// The capacities the device granted.
    pub fn caps(&self) -> QpCaps {
        self.inner.caps
    }

    /// The in-flight tables of owned requests.
    pub(crate) fn tables(&self) -> &Arc<QpTables> {
        &self.inner.tables
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

    /// The raw `ibv_qp`.
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
        self,
        mut attr: ffi::ibv_qp_attr,
        mask: u32,
    ) -> Transition<T, S, To> {
        // SAFETY: live queue pair; `attr` holds every field `mask` names.
        let ret = unsafe { ffi::ibv_modify_qp(self.as_raw(), &mut attr, mask as i32) };
        match Errno::result(ret) {
            Ok(()) => {
                if To::KIND == QpStateKind::Reset {
                    // The device dropped every request: owned ones are released.
                    self.inner.tables.clear();
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
    /// [`WcStatus::WrFlushErr`](crate::WcStatus::WrFlushErr).
    ///
    /// # Errors
    ///
    /// [`Error::ModifyQp`], with the queue pair back.
    pub fn into_error(self) -> Transition<T, S, Err> {
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
    /// types then describe the wrong state.
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
    /// [`PostScope`](crate::PostScope) is, treats an `ibv_wr_complete` failure as posted.
    ///
    /// A list the batch cannot carry goes to `ibv_post_send` instead, with the errors above:
    /// one holding an operation the queue pair was not created for (see [`SendPath::Auto`]),
    /// inline data over the granted `max_inline_data` or in more than one entry, or more
    /// entries than `max_send_sge`. The classic call is valid on these queue pairs, between
    /// batches.
    ///
    /// # Examples
    ///
    /// Sixteen sends, one doorbell; the list's storage serves every batch:
    ///
    /// ```no_run
    /// # use rdma_verbs::*;
    /// # fn f(qp: &mut QueuePair<Rc, Rts>, mr: &MemoryRegion) -> Result<()> {
    /// let mut list = SendList::with_capacity(16);
    /// for i in 0..16 {
    ///     let request = SendRequest::send(i, mr.slice(i as usize * 64..(i as usize + 1) * 64)?);
    ///     // Signal every fourth request only: fewer completions to poll.
    ///     list.push(if i % 4 == 3 { request.signaled() } else { request })?;
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
    #[inline]
    pub unsafe fn post_send_one(&mut self, request: &SendRequest<'_>) -> Result<()> {
        check_ops::<T>(request.op(), usize::from(request.is_datagram()), 1)?;
        request.check_object_pd(self.inner.pd.as_raw())?;
        let mut raw = ffi::ibv_send_wr::default();
        let mut one = ffi::ibv_sge::default();
        request.fill(&mut raw, &mut one)?;
        if let Some(ex) = self.inner.extended.filter(|ex| ex.covers(request.op())) {
            // SAFETY: as in `post_send`, for a chain of one request; `raw` and `one` outlive
            // the call.
            let posted = unsafe { extended::post(ex, &self.inner.caps, T::DATAGRAM, &raw) };
            if let Some(result) = posted {
                return result;
            }
        }
        let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: live queue pair; `raw` and `one` outlive the call; the caller keeps the
        // memory valid as the contract says.
        let ret = unsafe { ffi::ibv_post_send(self.as_raw(), &mut raw, &mut bad) };
        post_result("ibv_post_send", ret, || index_of_one(&raw, bad))
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
    #[inline]
    pub unsafe fn post_recv_one(&mut self, request: &RecvRequest<'_>) -> Result<()> {
        self.check_no_srq()?;
        let mut raw = ffi::ibv_recv_wr::default();
        let mut one = ffi::ibv_sge::default();
        request.fill(&mut raw, &mut one)?;
        let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: live queue pair; `raw`/`one` outlive the call; memory kept valid by caller.
        let ret = unsafe { ffi::ibv_post_recv(self.as_raw(), &mut raw, &mut bad) };
        post_result("ibv_post_recv", ret, || index_of_one(&raw, bad))
    }

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

    fn check_no_srq(&self) -> Result<()> {
        if self.inner._srq.is_some() {
            return Err(Error::InvalidArgument(
                "this queue pair receives through its SRQ: post there".into(),
            ));
        }
        Ok(())
    }
}

fn check_ops<T: Transport>(ops: u32, datagrams: usize, len: usize) -> Result<()> {
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
            "every request to a UD queue pair needs a destination (SendRequest::to)".into(),
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

/// Turns a post verb's return value into a result: `ENOMEM` is a full queue, anything else a
/// refused request at `index`. `index` is the position of the request `bad_wr` named, or `None`
/// when it named none of them (null, or a stray pointer): then the provider did not say what it
/// took, and every request must be taken as posted ([`Error::PostIndeterminate`]).
#[inline]
pub(crate) fn post_result(
    verb: &'static str,
    ret: i32,
    index: impl FnOnce() -> Option<usize>,
) -> Result<()> {
    match Errno::result(ret) {
        Ok(()) => Ok(()),
        Err(errno) => Err(match (index(), errno) {
            (None, errno) => Error::PostIndeterminate { verb, errno },
            (Some(index), Errno::NOMEM) => Error::QueueFull { verb, index },
            (Some(index), errno) => Error::Post { verb, index, errno },
        }),
    }
}

/// The index `bad_wr` gives a one-request post: 0 when it names `raw`, else `None`.
#[inline]
pub(crate) fn index_of_one<R>(raw: &R, bad: *const R) -> Option<usize> {
    std::ptr::eq(raw, bad).then_some(0)
}
