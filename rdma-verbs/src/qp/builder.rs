//! Creating queue pairs: `ProtectionDomain::qp_builder` and the builder (`ibv_create_qp`,
//! `ibv_create_qp_ex`).

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

use super::extended::{self, SendPath};
use super::{QpCaps, QpInner, QpState, QueuePair, Reset, Transport};
use crate::cq::CompletionQueue;
use crate::error::{Error, Result};
use crate::ffi;
use crate::inflight::QpTables;
use crate::pd::ProtectionDomain;
use crate::srq::SharedReceiveQueue;
use crate::wr::op;

/// Options of a new queue pair; see [`ProtectionDomain::qp_builder`].
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
    /// `ibv_create_qp`: a queue pair of transport `T` with the default capacities
    /// ([`QpCaps::default`]: 16 requests of one entry each way, no inline data) and the
    /// classic send path, whose send and receive completions go to `send_cq` and `recv_cq`
    /// (which may be the same queue). For anything else, [`qp_builder`](Self::qp_builder).
    ///
    /// # Errors
    ///
    /// As [`QpBuilder::build`].
    ///
    /// # References
    ///
    /// [`ibv_create_qp(3)`](https://man7.org/linux/man-pages/man3/ibv_create_qp.3.html)
    #[doc(alias = "ibv_create_qp")]
    pub fn create_qp<T: Transport>(
        &self,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
    ) -> Result<QueuePair<T, Reset>> {
        self.qp_builder(send_cq, recv_cq).build()
    }

    /// A builder for a queue pair of transport `T` whose send and receive completions go to
    /// `send_cq` and `recv_cq` (which may be the same queue): capacities, an SRQ, signaling
    /// and the send path, then [`build`](QpBuilder::build).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use rdma_verbs::{Context, qp::Rc};
    ///
    /// let context = Context::open("rxe0")?;
    /// let pd = context.alloc_pd()?;
    /// let cq = context.create_cq(64)?;
    /// let qp = pd.qp_builder::<Rc>(&cq, &cq).max_send_wr(32).build()?;
    /// # Ok::<(), rdma_verbs::Error>(())
    /// ```
    ///
    /// # References
    ///
    /// [`ibv_create_qp(3)`](https://man7.org/linux/man-pages/man3/ibv_create_qp.3.html)
    #[doc(alias = "ibv_create_qp")]
    pub fn qp_builder<'a, T: Transport>(
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

    /// Every send request generates a completion (`sq_sig_all`), even one marked
    /// [`SendRequest::unsignaled`](crate::wr::SendRequest::unsignaled).
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
    /// use rdma_verbs::{Context, qp::{Rc, SendPath}};
    ///
    /// let context = Context::open("rxe0")?;
    /// let pd = context.alloc_pd()?;
    /// let cq = context.create_cq(64)?;
    /// let qp = pd.qp_builder::<Rc>(&cq, &cq).send_path(SendPath::Auto).build()?;
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
        self.build_inner(None)
    }

    /// Creates the queue pair through `maker`, another library that makes and destroys it
    /// itself (the connection manager's `rdma_create_qp_ex` and `rdma_destroy_qp`), with the
    /// attributes [`build`](Self::build) would give `ibv_create_qp_ex`; it comes back in the
    /// state `S` the maker leaves it in. Everything else is as for `build`: the same errors,
    /// and the queue pair takes every path of this crate.
    ///
    /// # Safety
    ///
    /// `maker` keeps [`QpMaker`]'s contract, and leaves the queue pairs it makes in state `S`.
    pub unsafe fn build_by<S: QpState>(self, maker: Arc<dyn QpMaker>) -> Result<QueuePair<T, S>> {
        let qp = self.build_inner(Some(maker))?;
        // SAFETY: the maker left the queue pair in `S` (the contract).
        Ok(unsafe { qp.assume_state::<S>() })
    }

    fn build_inner(self, maker: Option<Arc<dyn QpMaker>>) -> Result<QueuePair<T, Reset>> {
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
        let verb = if maker.is_some() {
            "rdma_create_qp_ex"
        } else {
            "ibv_create_qp"
        };
        let mut create_ex = |attr: &mut ffi::ibv_qp_init_attr_ex| match &maker {
            Some(maker) => maker.create(attr),
            // SAFETY: the PD's live context; `attr` names the PD, CQs and SRQ of that context
            // (checked above) and is valid and writable.
            None => unsafe { ffi::ibv_create_qp_ex(context, attr) },
        };
        let mut created = None;
        if self.send_path != SendPath::Classic {
            // What the device adds to the transport's operations, or works around.
            let device = self.pd.context().query_device().ok();
            let inline_lists = device.as_ref().is_some_and(|d| !d.is_soft_roce());
            let mut ops = T::OPS;
            if !device.as_ref().is_some_and(|d| d.supports_atomic_write()) {
                ops &= !op::ATOMIC_WRITE;
            }
            // SAFETY: live PD, whose context's CQs and SRQ `init` names (checked above);
            // `create_ex` is `ibv_create_qp_ex` or a maker keeping its contract.
            let attempt = unsafe {
                extended::create(
                    self.pd.as_raw(),
                    &init,
                    ops,
                    T::DATAGRAM,
                    inline_lists,
                    &mut create_ex,
                )
            }?;
            let required = self.send_path == SendPath::Extended;
            match attempt {
                extended::Created::Qp {
                    raw,
                    extended: None,
                    ..
                } if required => {
                    match &maker {
                        Some(maker) => {
                            let _ = maker.destroy(raw);
                        }
                        None => {
                            // SAFETY: the queue pair just created, destroyed once and never
                            // used.
                            let _ = unsafe { ffi::ibv_destroy_qp(raw.as_ptr()) };
                        }
                    }
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
            None if maker.is_none() => {
                // SAFETY: live PD, CQs and SRQ of one context (checked above); `init` is valid.
                let raw = unsafe { ffi::ibv_create_qp(self.pd.as_raw(), &mut init) };
                let raw = NonNull::new(raw).ok_or_else(|| Error::last(verb))?;
                (raw, init.cap, None)
            }
            None => {
                // The classic creation through the maker: the attributes with no extension.
                let mut attr = extended::attr_ex(&init, self.pd.as_raw());
                let raw = NonNull::new(create_ex(&mut attr)).ok_or_else(|| Error::last(verb))?;
                (raw, attr.cap, None)
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
                destroyed: false,
                unsignaled_run: 0,
                mcast: Vec::new(),
                raw,
                extended,
                caps,
                pd: self.pd.clone(),
                _send_cq: self.send_cq.inner.clone(),
                _recv_cq: self.recv_cq.inner.clone(),
                _srq: self.srq.map(|s| s.inner.clone()),
                state_changed: false,
                tables,
                maker,
            },
            _type: PhantomData,
        })
    }
}

/// A library that creates and destroys queue pairs itself, for [`QpBuilder::build_by`]: the
/// connection manager, whose `rdma_create_qp_ex` records the queue pair in its identifier and
/// moves it through its states while connecting, and whose `rdma_destroy_qp` must then destroy
/// it.
///
/// # Safety
///
/// - `create` makes a queue pair from `attr` exactly as `ibv_create_qp_ex` on the context of
///   `attr.pd` does (the same protection domain, queues, SRQ, type and capacities, the granted
///   capacities written back into `attr`), or returns null with `errno` set.
/// - `destroy` destroys a queue pair `create` made, as `ibv_destroy_qp` does, and returns 0 or
///   an errno; after a failure the queue pair still exists.
/// - Between the two, nothing the maker does makes the queue pair use memory or queues other
///   than those `attr` named; it may change the queue pair's state only as its own documented
///   calls do (for the connection manager, while connecting and disconnecting).
pub unsafe trait QpMaker: Send + Sync + 'static {
    /// Creates a queue pair from `attr` (see the trait's contract).
    fn create(&self, attr: &mut ffi::ibv_qp_init_attr_ex) -> *mut ffi::ibv_qp;
    /// Destroys a queue pair [`create`](Self::create) made.
    fn destroy(&self, qp: NonNull<ffi::ibv_qp>) -> i32;
}
