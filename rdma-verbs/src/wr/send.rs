//! [`SendRequest`]: send work requests (`struct ibv_send_wr`), every operation.

use std::ops::RangeBounds;

use super::{Payload, check_wr_id, foreign_object, op};
use crate::ah::AddressHandle;
use crate::error::{Error, Result};
use crate::ffi;
use crate::flags::{AccessFlags, SendFlags};
use crate::mr::{MemoryRegion, MrSlice, RemoteMemory};
use crate::mw::{BindRange, MemoryWindow, MwType, check_bind};

/// A send work request (`struct ibv_send_wr`): SEND, SEND_WITH_IMM, RDMA_WRITE,
/// RDMA_WRITE_WITH_IMM, RDMA_READ, ATOMIC_CMP_AND_SWP, ATOMIC_FETCH_AND_ADD, ATOMIC_WRITE,
/// BIND_MW, LOCAL_INV or SEND_WITH_INV, with its options.
///
/// Options chain by value:
///
/// ```no_run
/// # use rdma_verbs::{SendRequest, MemoryRegion};
/// # fn f(mr: &MemoryRegion) -> rdma_verbs::Result<()> {
/// let request = SendRequest::send(1, mr.slice(..64)?).with_imm(0xfeed).fenced();
/// # Ok(()) }
/// ```
#[derive(Copy, Clone, Debug)]
#[must_use = "a request does nothing until it is posted"]
pub struct SendRequest<'a> {
    wr_id: u64,
    opcode: u32,
    op: u32,
    pub(super) payload: Payload<'a>,
    flags: SendFlags,
    imm: u32,
    remote: (u64, u32),
    atomic: (u64, u64),
    ud: Option<(&'a AddressHandle, u32, u32)>,
    invalidate_rkey: u32,
    bind: Option<MwBind<'a>>,
    /// Posted by the owned-buffer path, whose ids alone may have
    /// [`OWNED_ID_BIT`](crate::inflight::OWNED_ID_BIT).
    owned: bool,
}

/// The window, key, region, range and rights of a BIND_MW request.
#[derive(Copy, Clone, Debug)]
struct MwBind<'a> {
    mw: &'a MemoryWindow,
    rkey: u32,
    mr: &'a MemoryRegion,
    addr: u64,
    length: u64,
    access: AccessFlags,
}

impl<'a> SendRequest<'a> {
    #[inline]
    fn new(wr_id: u64, opcode: u32, op: u32, payload: Payload<'a>) -> Self {
        Self {
            wr_id,
            opcode,
            op,
            payload,
            flags: SendFlags::SIGNALED,
            imm: 0,
            remote: (0, 0),
            atomic: (0, 0),
            ud: None,
            invalidate_rkey: 0,
            bind: None,
            owned: false,
        }
    }

    /// SEND: delivers `payload` to the next receive request of the peer.
    #[inline]
    pub fn send(wr_id: u64, payload: impl Into<Payload<'a>>) -> Self {
        Self::new(wr_id, ffi::IBV_WR_SEND, op::SEND, payload.into())
    }

    /// RDMA_WRITE: writes `payload` to `remote` (the peer's memory, which must allow remote
    /// write). The peer gets no completion.
    #[inline]
    pub fn write(wr_id: u64, payload: impl Into<Payload<'a>>, remote: RemoteMemory) -> Self {
        let mut request = Self::new(wr_id, ffi::IBV_WR_RDMA_WRITE, op::WRITE, payload.into());
        request.remote = (remote.addr, remote.rkey);
        request
    }

    /// RDMA_READ: reads `remote` into `local` (which needs `LOCAL_WRITE`).
    ///
    /// The target cannot be [`Payload::Inline`] (the device writes it); posting such a request
    /// fails with `InvalidArgument`.
    #[inline]
    pub fn read(wr_id: u64, local: impl Into<Payload<'a>>, remote: RemoteMemory) -> Self {
        let local = local.into();
        let mut request = Self::new(wr_id, ffi::IBV_WR_RDMA_READ, op::READ, local);
        if let Payload::Inline(_) = local {
            request.op |= op::INVALID;
        }
        request.remote = (remote.addr, remote.rkey);
        request
    }

    /// ATOMIC_CMP_AND_SWP: if the 8-byte word at `remote.addr` equals `compare`, replaces it
    /// with `swap`. The old value lands in `local` (8 bytes, `LOCAL_WRITE`) in the byte order
    /// the device writes: host order on rxe, big-endian (the wire order) on some devices; read
    /// it with [`u64::from_ne_bytes`] only where the device is known to write host order.
    #[inline]
    pub fn compare_swap(
        wr_id: u64,
        local: MrSlice<'a>,
        remote: RemoteMemory,
        compare: u64,
        swap: u64,
    ) -> Self {
        let mut request = Self::new(
            wr_id,
            ffi::IBV_WR_ATOMIC_CMP_AND_SWP,
            op::ATOMIC,
            local.into(),
        );
        request.remote = (remote.addr, remote.rkey);
        request.atomic = (compare, swap);
        request
    }

    /// ATOMIC_FETCH_AND_ADD: adds `add` to the 8-byte word at `remote.addr`. The old value
    /// lands in `local` (8 bytes, `LOCAL_WRITE`) in the byte order the device writes (see
    /// [`compare_swap`](Self::compare_swap)).
    #[inline]
    pub fn fetch_add(wr_id: u64, local: MrSlice<'a>, remote: RemoteMemory, add: u64) -> Self {
        let mut request = Self::new(
            wr_id,
            ffi::IBV_WR_ATOMIC_FETCH_AND_ADD,
            op::ATOMIC,
            local.into(),
        );
        request.remote = (remote.addr, remote.rkey);
        request.atomic = (add, 0);
        request
    }

    /// ATOMIC_WRITE (`IBV_WR_ATOMIC_WRITE`): writes the 8 bytes of `value`, as they lie in
    /// this host's memory (native byte order), to `remote.addr` (8-byte aligned) in one
    /// indivisible access: a peer never reads half of it. No local memory is involved.
    ///
    /// Only a reliable connected queue pair that [uses the extended
    /// API](crate::QueuePair::uses_extended_post) on a device that
    /// [supports it](crate::DeviceAttr::supports_atomic_write) posts it (through
    /// `ibv_wr_atomic_write`). Another RC queue pair refuses the post with
    /// [`Error::Unsupported`]`("ibv_wr_atomic_write")`, and UC and UD with
    /// [`Error::InvalidArgument`] (they have no atomics), posting nothing of the list.
    /// Completes with [`WcOpcode::AtomicWrite`](crate::WcOpcode::AtomicWrite).
    ///
    /// # References
    ///
    /// [`ibv_wr_post(3)`](https://man7.org/linux/man-pages/man3/ibv_wr_post.3.html)
    #[doc(alias = "ibv_wr_atomic_write")]
    #[doc(alias = "IBV_WR_ATOMIC_WRITE")]
    #[inline]
    pub fn atomic_write(wr_id: u64, remote: RemoteMemory, value: u64) -> Self {
        let mut request = Self::new(
            wr_id,
            ffi::IBV_WR_ATOMIC_WRITE,
            op::ATOMIC_WRITE,
            Payload::None,
        );
        request.remote = (remote.addr, remote.rkey);
        request.atomic = (value, 0);
        request
    }

    /// BIND_MW (`IBV_WR_BIND_MW`): binds type 2 window `mw` to bytes `range` of `mr` with rights
    /// `access`, giving it a new key (`ibv_inc_rkey` of its current one).
    ///
    /// The window's [`rkey`](MemoryWindow::rkey) is the new key as soon as the request is built.
    /// The request (and a list holding it) borrows the window exclusively;
    /// [`bind_rkey`](Self::bind_rkey) reads the key meanwhile. Post the request once: the device
    /// checks the key being replaced, so a request built and never posted leaves the window
    /// unusable for later binds.
    ///
    /// The window is bound to the queue pair the request is posted on, which must belong to the
    /// window's protection domain (else the bind completes with
    /// [`WcStatus::MwBindErr`](crate::WcStatus::MwBindErr)); peers reach it only through that
    /// queue pair. It stays bound until invalidated ([`local_invalidate`](Self::local_invalidate),
    /// a peer's [`send_with_invalidate`](Self::send_with_invalidate)) and can then be bound
    /// again.
    ///
    /// `access` may hold [`REMOTE_READ`](AccessFlags::REMOTE_READ),
    /// [`REMOTE_WRITE`](AccessFlags::REMOTE_WRITE), [`REMOTE_ATOMIC`](AccessFlags::REMOTE_ATOMIC)
    /// and [`ZERO_BASED`](AccessFlags::ZERO_BASED). A window may only grant remote write and
    /// atomic rights that `mr` was registered with, so that the region keeps refusing Rust
    /// references to memory a peer may write.
    ///
    /// Posting it is `unsafe` like every post: besides the contract of
    /// [`post_send`](crate::QueuePair::post_send), `mr` stays registered (is not dropped) until
    /// the bind has executed (its completion, or a later signaled one, is polled), because the
    /// device finds the region by its key when the bind executes.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `mw` is not of type 2, the window and region belong to
    /// different protection domains, the region does not own its memory (registered with
    /// `register_raw`: a window stays bound after the region's owner may have freed it), the
    /// range is empty or outside the region, or the region lacks
    /// [`MW_BIND`](AccessFlags::MW_BIND) or a right the window would grant.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use rdma_verbs::{AccessFlags, MwType, ProtectionDomain, QueuePair, Rc, Rts, SendRequest};
    ///
    /// # fn f(qp: &mut QueuePair<Rc, Rts>, pd: &ProtectionDomain) -> rdma_verbs::Result<()> {
    /// let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    /// let mr = pd.register(8192, rights | AccessFlags::MW_BIND)?;
    /// let mut mw = pd.alloc_mw(MwType::Type2)?;
    /// let bind = SendRequest::bind_mw(1, &mut mw, &mr, 0..4096, AccessFlags::REMOTE_WRITE)?;
    /// // SAFETY: `mr` outlives the bind's completion (and the window).
    /// unsafe { qp.post_send_one(&bind)? };
    /// // ... poll the completion, then send `mr.addr()`, 4096 and `mw.rkey()` to the peer.
    /// # Ok(()) }
    /// ```
    ///
    /// # References
    ///
    /// [`ibv_post_send(3)`](https://man7.org/linux/man-pages/man3/ibv_post_send.3.html)
    #[doc(alias = "IBV_WR_BIND_MW")]
    pub fn bind_mw(
        wr_id: u64,
        mw: &'a mut MemoryWindow,
        mr: &'a MemoryRegion,
        range: impl RangeBounds<usize>,
        access: AccessFlags,
    ) -> Result<Self> {
        let range = check_bind(mw, MwType::Type2, mr, range, access)?;
        let rkey = mw.next_type2_rkey()?;
        Ok(Self::bind_checked(wr_id, mw, rkey, mr, range, access))
    }

    /// A BIND_MW request of a bind [`check_bind`] accepted, with the window's new key `rkey`.
    #[inline]
    pub(crate) fn bind_checked(
        wr_id: u64,
        mw: &'a MemoryWindow,
        rkey: u32,
        mr: &'a MemoryRegion,
        range: BindRange,
        access: AccessFlags,
    ) -> Self {
        let mut request = Self::new(wr_id, ffi::IBV_WR_BIND_MW, op::BIND_MW, Payload::None);
        request.bind = Some(MwBind {
            mw,
            rkey,
            mr,
            addr: range.addr,
            length: range.length,
            access,
        });
        request
    }

    /// LOCAL_INV (`IBV_WR_LOCAL_INV`): invalidates the type 2 memory window with remote key
    /// `rkey`, posted on the queue pair the window is bound to. Once it has executed the key grants
    /// nothing, and the window may be bound again. Completes with
    /// [`WcOpcode::LocalInv`](crate::WcOpcode::LocalInv) when signaled.
    ///
    /// # References
    ///
    /// [`ibv_post_send(3)`](https://man7.org/linux/man-pages/man3/ibv_post_send.3.html)
    #[doc(alias = "IBV_WR_LOCAL_INV")]
    #[inline]
    pub fn local_invalidate(wr_id: u64, rkey: u32) -> Self {
        let mut request = Self::new(wr_id, ffi::IBV_WR_LOCAL_INV, op::LOCAL_INV, Payload::None);
        request.invalidate_rkey = rkey;
        request
    }

    /// SEND_WITH_INV (`IBV_WR_SEND_WITH_INV`): a SEND that also invalidates the peer's type 2
    /// memory window with remote key `rkey` before the peer's receive completes; the receive's
    /// completion reports the key
    /// ([`WorkCompletion::invalidated_rkey`](crate::WorkCompletion::invalidated_rkey)). The
    /// window must be bound to the receiving queue pair.
    ///
    /// # References
    ///
    /// [`ibv_post_send(3)`](https://man7.org/linux/man-pages/man3/ibv_post_send.3.html)
    #[doc(alias = "IBV_WR_SEND_WITH_INV")]
    #[inline]
    pub fn send_with_invalidate(wr_id: u64, payload: impl Into<Payload<'a>>, rkey: u32) -> Self {
        let mut request = Self::new(
            wr_id,
            ffi::IBV_WR_SEND_WITH_INV,
            op::SEND_WITH_INV,
            payload.into(),
        );
        request.invalidate_rkey = rkey;
        request
    }

    /// Adds immediate data (host order): SEND becomes SEND_WITH_IMM and RDMA_WRITE becomes
    /// RDMA_WRITE_WITH_IMM, which consumes a receive request at the peer. Other operations
    /// cannot carry immediate data; posting them then fails with `InvalidArgument`.
    #[inline]
    pub fn with_imm(mut self, imm: u32) -> Self {
        self.imm = imm;
        match self.op {
            op::SEND | op::SEND_WITH_IMM => {
                self.opcode = ffi::IBV_WR_SEND_WITH_IMM;
                self.op = op::SEND_WITH_IMM;
            }
            op::WRITE | op::WRITE_WITH_IMM => {
                self.opcode = ffi::IBV_WR_RDMA_WRITE_WITH_IMM;
                self.op = op::WRITE_WITH_IMM;
            }
            _ => self.op |= op::INVALID,
        }
        self
    }

    /// Asks for no completion (clears `IBV_SEND_SIGNALED`, which every request has unless
    /// this is called): the request's resources are free once a later signaled request of
    /// the queue pair completes. A queue pair built with
    /// [`QpBuilder::sq_sig_all`](crate::QpBuilder::sq_sig_all) signals every request whatever
    /// this says.
    #[inline]
    pub fn unsignaled(mut self) -> Self {
        self.flags.remove(SendFlags::SIGNALED);
        self
    }

    /// Waits for earlier RDMA reads and atomics first (`IBV_SEND_FENCE`).
    #[inline]
    pub fn fenced(mut self) -> Self {
        self.flags |= SendFlags::FENCE;
        self
    }

    /// Raises a solicited event at the receiver (`IBV_SEND_SOLICITED`).
    #[inline]
    pub fn solicited(mut self) -> Self {
        self.flags |= SendFlags::SOLICITED;
        self
    }

    /// Adds raw `IBV_SEND_*` flags.
    #[inline]
    pub fn flags(mut self, flags: SendFlags) -> Self {
        self.flags |= flags;
        self
    }

    /// Sets the `IBV_SEND_*` flags to exactly `flags` (the safe paths, which decide signaling).
    #[inline]
    pub(crate) fn set_flags(mut self, flags: SendFlags) -> Self {
        self.flags = flags;
        self
    }

    /// Addresses a datagram (UD): to queue pair `remote_qpn` behind `ah`, with Q_Key
    /// `remote_qkey`. Required for every request posted to a UD queue pair.
    #[inline]
    pub fn to(mut self, ah: &'a AddressHandle, remote_qpn: u32, remote_qkey: u32) -> Self {
        self.ud = Some((ah, remote_qpn, remote_qkey));
        self
    }

    /// The request's `wr_id`.
    #[inline]
    pub fn wr_id(&self) -> u64 {
        self.wr_id
    }

    /// The key a BIND_MW request gives its window, or `None` for other operations.
    #[inline]
    pub fn bind_rkey(&self) -> Option<u32> {
        self.bind.map(|bind| bind.rkey)
    }

    #[inline]
    pub(crate) fn op(&self) -> u32 {
        self.op
    }

    #[inline]
    pub(crate) fn is_datagram(&self) -> bool {
        self.ud.is_some()
    }

    /// The protection domain of the verbs object the request hands the provider (its address
    /// handle, or the memory window it binds), if it names one.
    #[inline]
    pub(super) fn object_pd(&self) -> Option<*mut ffi::ibv_pd> {
        match (self.ud, self.bind) {
            (Some((ah, _, _)), None) => Some(ah.pd().as_raw()),
            (None, Some(bind)) => Some(bind.mw.pd().as_raw()),
            // No transport takes both (the post refuses it anyway), but if they disagree, no
            // queue pair's domain matches: null is never a live `ibv_pd`.
            (Some((ah, _, _)), Some(bind)) if ah.pd().as_raw() == bind.mw.pd().as_raw() => {
                Some(ah.pd().as_raw())
            }
            (Some(_), Some(_)) => Some(std::ptr::null_mut()),
            (None, None) => None,
        }
    }

    /// Refuses a request whose address handle or memory window belongs to a protection domain
    /// other than `qp_pd` (the queue pair's): the provider would take the object for one of its
    /// own, of another device or context perhaps, and read it as such.
    #[inline]
    pub(crate) fn check_object_pd(&self, qp_pd: *mut ffi::ibv_pd) -> Result<()> {
        match self.object_pd() {
            Some(pd) if pd != qp_pd => Err(foreign_object()),
            _ => Ok(()),
        }
    }

    /// Writes the request into `raw` (its `next` left null), using `one` as storage for a
    /// single scatter/gather entry. Forced inline for the reason `post_send_one` is.
    #[inline(always)]
    pub(crate) fn fill(&self, raw: &mut ffi::ibv_send_wr, one: &mut ffi::ibv_sge) -> Result<()> {
        // Zeroed, then written field by field: building a whole value and storing it made the
        // compiler zero a temporary and copy it.
        *raw = ffi::ibv_send_wr::default();
        self.fill_zeroed(raw, one)
    }

    /// As [`fill`](Self::fill), into a `raw` that is zeroed (`Default`) already: a single
    /// post's fresh request, which the compiler would otherwise zero twice.
    #[inline(always)]
    pub(crate) fn fill_zeroed(
        &self,
        raw: &mut ffi::ibv_send_wr,
        one: &mut ffi::ibv_sge,
    ) -> Result<()> {
        check_wr_id(self.wr_id, self.owned)?;
        self.payload.check()?;
        if self.op & op::ATOMIC != 0 {
            self.check_atomic_result()?;
        }
        let (sg_list, num_sge, inline) = self.payload.fill(one);
        raw.wr_id = self.wr_id;
        raw.sg_list = sg_list;
        raw.num_sge = num_sge;
        raw.opcode = self.opcode;
        raw.send_flags = self.flags.bits() | inline;
        raw.__bindgen_anon_1.imm_data = self.imm.to_be();
        match self.op & !op::INVALID {
            op::ATOMIC | op::ATOMIC_WRITE => {
                raw.wr.atomic = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                    remote_addr: self.remote.0,
                    compare_add: self.atomic.0,
                    swap: self.atomic.1,
                    rkey: self.remote.1,
                };
            }
            op::WRITE | op::WRITE_WITH_IMM | op::READ => {
                raw.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                    remote_addr: self.remote.0,
                    rkey: self.remote.1,
                };
            }
            op::BIND_MW => {
                if let Some(bind) = self.bind {
                    raw.__bindgen_anon_2.bind_mw = ffi::ibv_send_wr__bindgen_ty_4__bindgen_ty_1 {
                        mw: bind.mw.as_raw(),
                        rkey: bind.rkey,
                        bind_info: ffi::ibv_mw_bind_info {
                            mr: bind.mr.as_raw(),
                            addr: bind.addr,
                            length: bind.length,
                            mw_access_flags: bind.access.bits(),
                        },
                    };
                }
            }
            // The key shares its union with the immediate data, which these cannot carry.
            op::LOCAL_INV | op::SEND_WITH_INV => {
                raw.__bindgen_anon_1.invalidate_rkey = self.invalidate_rkey;
            }
            _ => {
                if let Some((ah, remote_qpn, remote_qkey)) = self.ud {
                    raw.wr.ud = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
                        ah: ah.as_raw(),
                        remote_qpn,
                        remote_qkey,
                    };
                }
            }
        }
        Ok(())
    }
}

impl SendRequest<'_> {
    /// An atomic's result is one 8-byte word in one registered range: the device writes
    /// exactly 8 bytes, so a shorter range would let it write past what the request borrows,
    /// and a longer or scattered one is refused by the specification (rxe would complete it
    /// with an error, other devices may not check).
    fn check_atomic_result(&self) -> Result<()> {
        match self.payload {
            Payload::Slice(slice) if slice.length == 8 => Ok(()),
            Payload::Slice(slice) => Err(Error::InvalidArgument(format!(
                "an atomic's result is one 8-byte word, not {} bytes",
                slice.length
            ))),
            _ => Err(Error::InvalidArgument(
                "an atomic's result is one 8-byte range of a memory region".into(),
            )),
        }
    }
}

impl SendRequest<'_> {
    /// The same request, as an owned request with id `id` (see [`OWNED_ID_BIT`](crate::inflight::OWNED_ID_BIT)).
    pub(crate) fn owned(mut self, id: u64) -> Self {
        self.wr_id = id;
        self.owned = true;
        self
    }
}
