//! Work requests and reusable, doorbell-batched post lists.
//!
//! Building requests is safe: a request borrows the memory regions, inline data and address
//! handles it names, so they outlive it. Handing a list to the hardware is the `unsafe` step
//! (see [`QueuePair::post_send`](crate::QueuePair::post_send)), because the hardware keeps using
//! the memory after the call returns.

use std::fmt;
use std::marker::PhantomData;
use std::ops::RangeBounds;

use crate::ah::AddressHandle;
use crate::error::{Errno, Error, Result};
use crate::ffi;
use crate::flags::{AccessFlags, SendFlags};
use crate::inflight::OWNED_ID_BIT;
use crate::mr::{MemoryRegion, MrSlice, RemoteMemory};
use crate::mw::{BindRange, MemoryWindow, MwType, check_bind};

/// A scatter/gather entry (`struct ibv_sge`) over registered memory. Same layout as the C
/// structure, so lists of them go to the hardware as they are.
#[repr(transparent)]
#[derive(Copy, Clone)]
#[must_use = "a scatter/gather entry does nothing until a request carries it"]
pub struct Sge<'a> {
    raw: ffi::ibv_sge,
    _region: PhantomData<&'a MemoryRegion>,
}

impl<'a> From<MrSlice<'a>> for Sge<'a> {
    fn from(slice: MrSlice<'a>) -> Self {
        Self {
            raw: ffi::ibv_sge {
                addr: slice.addr,
                length: slice.length,
                lkey: slice.lkey,
            },
            _region: PhantomData,
        }
    }
}

impl Sge<'static> {
    /// The entry as a slice of its region (for the owned path, whose entries are `'static`).
    #[inline]
    pub(crate) fn as_slice(&self) -> MrSlice<'static> {
        MrSlice::from_raw_parts(self.raw.addr, self.raw.length, self.raw.lkey)
    }
}

impl Sge<'_> {
    /// Length in bytes.
    pub fn len(&self) -> u32 {
        self.raw.length
    }

    /// Whether the entry is empty.
    pub fn is_empty(&self) -> bool {
        self.raw.length == 0
    }
}

impl fmt::Debug for Sge<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sge")
            .field("addr", &format_args!("{:#x}", self.raw.addr))
            .field("length", &self.raw.length)
            .field("lkey", &format_args!("{:#x}", self.raw.lkey))
            .finish()
    }
}

/// The local memory of a work request.
#[derive(Copy, Clone, Debug)]
pub enum Payload<'a> {
    /// No data (zero-length sends, receives for RDMA write with immediate).
    None,
    /// One range of a memory region.
    Slice(MrSlice<'a>),
    /// A scatter/gather list.
    List(&'a [Sge<'a>]),
    /// Bytes copied into the work request during the post (`IBV_SEND_INLINE`), up to the queue
    /// pair's `max_inline_data`. Needs no memory region, and the bytes may be reused as soon as
    /// the post returns.
    Inline(&'a [u8]),
}

impl<'a> From<MrSlice<'a>> for Payload<'a> {
    fn from(slice: MrSlice<'a>) -> Self {
        Self::Slice(slice)
    }
}

impl<'a> From<&'a [Sge<'a>]> for Payload<'a> {
    fn from(list: &'a [Sge<'a>]) -> Self {
        Self::List(list)
    }
}

impl Payload<'_> {
    /// The payload's scatter/gather pointer, entry count and extra send flags, using `one` as
    /// storage for a single entry.
    ///
    /// An empty slice or empty inline data becomes no entry at all: some providers read an
    /// entry of length 0 as 2 GiB (ionic), and the device would then reach past the slice into
    /// the rest of its region.
    #[inline]
    fn fill(&self, one: &mut ffi::ibv_sge) -> (*mut ffi::ibv_sge, i32, u32) {
        match *self {
            Payload::None => (std::ptr::null_mut(), 0, 0),
            Payload::Slice(slice) if slice.length == 0 => (std::ptr::null_mut(), 0, 0),
            Payload::Inline([]) => (std::ptr::null_mut(), 0, 0),
            Payload::Slice(slice) => {
                *one = ffi::ibv_sge {
                    addr: slice.addr,
                    length: slice.length,
                    lkey: slice.lkey,
                };
                (one, 1, 0)
            }
            // The provider only reads the list (the C prototype lacks `const`).
            Payload::List(list) => (
                list.as_ptr().cast::<ffi::ibv_sge>().cast_mut(),
                list.len() as i32,
                0,
            ),
            Payload::Inline(bytes) => {
                *one = ffi::ibv_sge {
                    addr: bytes.as_ptr() as u64,
                    length: bytes.len() as u32,
                    lkey: 0,
                };
                (one, 1, ffi::IBV_SEND_INLINE)
            }
        }
    }

    /// Whether [`fill`](Self::fill) points into its `one` storage.
    #[inline]
    fn uses_single_entry(&self) -> bool {
        match self {
            Payload::Slice(slice) => slice.length > 0,
            Payload::Inline(bytes) => !bytes.is_empty(),
            _ => false,
        }
    }

    #[inline]
    fn check(&self) -> Result<()> {
        match *self {
            Payload::List(list) if i32::try_from(list.len()).is_err() => {
                Err(Error::invalid("too many scatter/gather entries"))
            }
            // The caller's list goes to the provider as it is: an entry of length 0 in it
            // could be read as 2 GiB (see `fill`).
            Payload::List(list) if list.iter().any(|sge| sge.is_empty()) => {
                Err(Error::invalid("a scatter/gather entry of 0 bytes"))
            }
            Payload::Inline(bytes) if u32::try_from(bytes.len()).is_err() => {
                Err(Error::invalid("inline data too long"))
            }
            _ => Ok(()),
        }
    }
}

impl Payload<'_> {}

/// Send operations, as a bit set, so a list can say which it holds.
pub(crate) mod op {
    pub(crate) const SEND: u32 = 1 << 0;
    pub(crate) const SEND_WITH_IMM: u32 = 1 << 1;
    pub(crate) const WRITE: u32 = 1 << 2;
    pub(crate) const WRITE_WITH_IMM: u32 = 1 << 3;
    pub(crate) const READ: u32 = 1 << 4;
    pub(crate) const ATOMIC: u32 = 1 << 5;
    pub(crate) const BIND_MW: u32 = 1 << 6;
    pub(crate) const LOCAL_INV: u32 = 1 << 7;
    pub(crate) const SEND_WITH_INV: u32 = 1 << 8;
    /// A malformed request: immediate data on an operation that cannot carry it, or inline
    /// data as the target of a read.
    pub(crate) const INVALID: u32 = 1 << 31;
}

/// A send work request (`struct ibv_send_wr`): SEND, SEND_WITH_IMM, RDMA_WRITE,
/// RDMA_WRITE_WITH_IMM, RDMA_READ, ATOMIC_CMP_AND_SWP, ATOMIC_FETCH_AND_ADD, BIND_MW, LOCAL_INV
/// or SEND_WITH_INV, with its options.
///
/// Options chain by value:
///
/// ```no_run
/// # use rdma_verbs::{SendRequest, MemoryRegion};
/// # fn f(mr: &MemoryRegion) -> rdma_verbs::Result<()> {
/// let request = SendRequest::send(1, mr.slice(..64)?).with_imm(0xfeed).signaled();
/// # Ok(()) }
/// ```
#[derive(Copy, Clone, Debug)]
#[must_use = "a request does nothing until it is posted"]
pub struct SendRequest<'a> {
    wr_id: u64,
    opcode: u32,
    op: u32,
    payload: Payload<'a>,
    flags: SendFlags,
    imm: u32,
    remote: (u64, u32),
    atomic: (u64, u64),
    ud: Option<(&'a AddressHandle, u32, u32)>,
    invalidate_rkey: u32,
    bind: Option<MwBind<'a>>,
    /// Posted by the owned-buffer path, whose ids alone may have [`OWNED_ID_BIT`].
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
            flags: SendFlags::empty(),
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
    /// unsafe { qp.post_send_one(&bind.signaled())? };
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
        let rkey = mw.next_type2_rkey();
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

    /// Asks for a completion (`IBV_SEND_SIGNALED`) even on a queue pair that does not signal
    /// every request.
    #[inline]
    pub fn signaled(mut self) -> Self {
        self.flags |= SendFlags::SIGNALED;
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
    fn object_pd(&self) -> Option<*mut ffi::ibv_pd> {
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
            op::ATOMIC => {
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
    /// The same request, as an owned request with id `id` (see [`OWNED_ID_BIT`]).
    pub(crate) fn owned(mut self, id: u64) -> Self {
        self.wr_id = id;
        self.owned = true;
        self
    }
}

/// Refuses a `wr_id` with [`OWNED_ID_BIT`] set unless the owned-buffer path posts it: its
/// completion could otherwise be taken for an owned request's, and release a buffer the device
/// still uses.
#[inline]
pub(crate) fn check_wr_id(wr_id: u64, owned: bool) -> Result<()> {
    if wr_id & OWNED_ID_BIT != 0 && !owned {
        return Err(reserved_wr_id(wr_id));
    }
    Ok(())
}

// The errors of the checks above and below are built out of line, so that the checks inline
// into the post calls as a compare and a branch (see docs/benchmarks.md, instruction counts).

#[cold]
#[inline(never)]
fn reserved_wr_id(wr_id: u64) -> Error {
    Error::InvalidArgument(format!(
        "wr_id {wr_id:#x}: ids with the top bit set are reserved for owned requests"
    ))
}

#[cold]
#[inline(never)]
fn foreign_object() -> Error {
    Error::invalid(
        "the address handle or memory window belongs to another protection domain than the \
         queue pair",
    )
}

/// The protection domains of the address handles and memory windows a [`PostList`] holds.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum ObjectPds {
    /// No request names one.
    None,
    /// Every one belongs to this one.
    One(*mut ffi::ibv_pd),
    /// Objects of several protection domains: no queue pair can take them all.
    Mixed,
}

/// A receive work request (`struct ibv_recv_wr`).
#[derive(Copy, Clone, Debug)]
#[must_use = "a request does nothing until it is posted"]
pub struct RecvRequest<'a> {
    wr_id: u64,
    payload: Payload<'a>,
    owned: bool,
}

impl<'a> RecvRequest<'a> {
    /// Receives into `payload` (memory with `LOCAL_WRITE`). [`Payload::Inline`] is not
    /// allowed for receives.
    pub fn new(wr_id: u64, payload: impl Into<Payload<'a>>) -> Self {
        Self {
            wr_id,
            payload: payload.into(),
            owned: false,
        }
    }

    /// The same receive, as an owned request with id `id` (see [`OWNED_ID_BIT`]).
    pub(crate) fn owned(mut self, id: u64) -> Self {
        self.wr_id = id;
        self.owned = true;
        self
    }

    /// A receive with no buffer: for RDMA writes with immediate and zero-length sends.
    pub fn empty(wr_id: u64) -> Self {
        Self {
            wr_id,
            payload: Payload::None,
            owned: false,
        }
    }

    /// The request's `wr_id`.
    pub fn wr_id(&self) -> u64 {
        self.wr_id
    }

    #[inline]
    pub(crate) fn fill(&self, raw: &mut ffi::ibv_recv_wr, one: &mut ffi::ibv_sge) -> Result<()> {
        check_wr_id(self.wr_id, self.owned)?;
        if let Payload::Inline(_) = self.payload {
            return Err(Error::invalid("a receive cannot use inline data"));
        }
        self.payload.check()?;
        let (sg_list, num_sge, _) = self.payload.fill(one);
        *raw = ffi::ibv_recv_wr {
            wr_id: self.wr_id,
            next: std::ptr::null_mut(),
            sg_list,
            num_sge,
        };
        Ok(())
    }
}

/// Storage for a chain of work requests, handed to the provider in one post call (one doorbell).
///
/// The storage is allocated once, by [`with_capacity`](Self::with_capacity); pushing, posting and
/// [`clear`](Self::clear) never allocate. [`reuse`](Self::reuse) empties the list and lets it
/// borrow different memory, so one list serves a whole program.
#[must_use = "a list does nothing until it is posted"]
pub struct PostList<'a, W: WorkRequest> {
    // The chain points into both vectors (`next` into `wrs`, `sg_list` into `sges`), so neither
    // may ever reallocate: a push is refused once either is full (see `capacity`), whatever
    // capacities the allocator gave them.
    wrs: Vec<W::Raw>,
    sges: Vec<ffi::ibv_sge>,
    ops: u32,
    datagrams: usize,
    object_pds: ObjectPds,
    _borrow: PhantomData<&'a ()>,
}

/// A list of send requests for [`QueuePair::post_send`](crate::QueuePair::post_send).
pub type SendList<'a> = PostList<'a, SendRequest<'a>>;
/// A list of receive requests for [`QueuePair::post_recv`](crate::QueuePair::post_recv) and
/// [`SharedReceiveQueue::post_recv`](crate::SharedReceiveQueue::post_recv).
pub type RecvList<'a> = PostList<'a, RecvRequest<'a>>;

/// A work request type a [`PostList`] holds: [`SendRequest`] or [`RecvRequest`].
pub trait WorkRequest: private::Sealed {
    #[doc(hidden)]
    type Raw: Copy + Default;
    /// Fills `raw`; returns whether its scatter/gather pointer points at `one`.
    #[doc(hidden)]
    fn fill_raw(&self, raw: &mut Self::Raw, one: &mut ffi::ibv_sge) -> Result<bool>;
    #[doc(hidden)]
    fn link(raw: &mut Self::Raw, next: *mut Self::Raw);
    #[doc(hidden)]
    fn set_sg_list(raw: &mut Self::Raw, sg_list: *mut ffi::ibv_sge);
    #[doc(hidden)]
    fn op_bits(&self) -> u32;
    #[doc(hidden)]
    fn datagram(&self) -> bool;
    #[doc(hidden)]
    fn object_pd(&self) -> Option<*mut ffi::ibv_pd>;
}

mod private {
    pub trait Sealed {}
}

impl private::Sealed for SendRequest<'_> {}
impl WorkRequest for SendRequest<'_> {
    type Raw = ffi::ibv_send_wr;
    fn fill_raw(&self, raw: &mut Self::Raw, one: &mut ffi::ibv_sge) -> Result<bool> {
        self.fill(raw, one)?;
        Ok(self.payload.uses_single_entry())
    }
    fn link(raw: &mut Self::Raw, next: *mut Self::Raw) {
        raw.next = next;
    }
    fn set_sg_list(raw: &mut Self::Raw, sg_list: *mut ffi::ibv_sge) {
        raw.sg_list = sg_list;
    }
    fn op_bits(&self) -> u32 {
        self.op()
    }
    fn datagram(&self) -> bool {
        self.is_datagram()
    }
    fn object_pd(&self) -> Option<*mut ffi::ibv_pd> {
        SendRequest::object_pd(self)
    }
}

impl private::Sealed for RecvRequest<'_> {}
impl WorkRequest for RecvRequest<'_> {
    type Raw = ffi::ibv_recv_wr;
    fn fill_raw(&self, raw: &mut Self::Raw, one: &mut ffi::ibv_sge) -> Result<bool> {
        self.fill(raw, one)?;
        Ok(self.payload.uses_single_entry())
    }
    fn link(raw: &mut Self::Raw, next: *mut Self::Raw) {
        raw.next = next;
    }
    fn set_sg_list(raw: &mut Self::Raw, sg_list: *mut ffi::ibv_sge) {
        raw.sg_list = sg_list;
    }
    fn op_bits(&self) -> u32 {
        0
    }
    fn datagram(&self) -> bool {
        false
    }
    fn object_pd(&self) -> Option<*mut ffi::ibv_pd> {
        None
    }
}

impl<'a, W: WorkRequest> PostList<'a, W> {
    /// A list with room for `capacity` requests.
    pub fn with_capacity(capacity: usize) -> Self {
        Self::from_storage(Vec::with_capacity(capacity), Vec::with_capacity(capacity))
    }

    /// A list over empty vectors, whose capacities may differ.
    fn from_storage(wrs: Vec<W::Raw>, sges: Vec<ffi::ibv_sge>) -> Self {
        debug_assert!(wrs.is_empty() && sges.is_empty());
        Self {
            wrs,
            sges,
            ops: 0,
            datagrams: 0,
            object_pds: ObjectPds::None,
            _borrow: PhantomData,
        }
    }

    /// Appends `request`, chaining it after the last one. Does not allocate.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the list is full or the request is malformed (inline data
    /// in a receive, too many entries).
    pub fn push(&mut self, request: W) -> Result<()> {
        if self.wrs.len() >= self.capacity() {
            return Err(Error::InvalidArgument(format!(
                "the post list is full ({} requests)",
                self.capacity()
            )));
        }
        let mut raw = W::Raw::default();
        let mut one = ffi::ibv_sge::default();
        let single = request.fill_raw(&mut raw, &mut one)?;
        // Neither vector reallocates (both are below their capacity: `capacity` is the smaller
        // one, and both hold `len` elements), so the addresses taken here stay valid for as
        // long as the list holds them.
        self.sges.push(one);
        if single {
            if let Some(stored) = self.sges.last_mut() {
                W::set_sg_list(&mut raw, stored);
            }
        }
        self.wrs.push(raw);
        let n = self.wrs.len();
        if n >= 2 {
            let (head, tail) = self.wrs.split_at_mut(n - 1);
            W::link(&mut head[n - 2], &mut tail[0]);
        }
        self.ops |= request.op_bits();
        self.datagrams += usize::from(request.datagram());
        if let Some(pd) = request.object_pd() {
            self.object_pds = match self.object_pds {
                ObjectPds::None => ObjectPds::One(pd),
                ObjectPds::One(known) if known == pd => ObjectPds::One(known),
                _ => ObjectPds::Mixed,
            };
        }
        Ok(())
    }

    /// Removes every request; keeps the storage.
    pub fn clear(&mut self) {
        self.wrs.clear();
        self.sges.clear();
        self.ops = 0;
        self.datagrams = 0;
        self.object_pds = ObjectPds::None;
    }

    /// Empties the list so that it can borrow other memory, keeping the storage.
    pub fn reuse<'b, V>(mut self) -> PostList<'b, V>
    where
        V: WorkRequest<Raw = W::Raw>,
    {
        self.clear();
        PostList::from_storage(self.wrs, self.sges)
    }

    /// The number of requests.
    pub fn len(&self) -> usize {
        self.wrs.len()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.wrs.is_empty()
    }

    /// How many requests fit: the smaller capacity of the two vectors the chain points into,
    /// which [`with_capacity`](Self::with_capacity) asks to be equal but the allocator may
    /// make larger.
    pub fn capacity(&self) -> usize {
        self.wrs.capacity().min(self.sges.capacity())
    }

    pub(crate) fn ops(&self) -> u32 {
        self.ops
    }

    pub(crate) fn datagrams(&self) -> usize {
        self.datagrams
    }

    /// Refuses a list holding an address handle or memory window of a protection domain other
    /// than `qp_pd` (the queue pair's); see [`SendRequest::check_object_pd`]. A pointer
    /// comparison.
    pub(crate) fn check_object_pd(&self, qp_pd: *mut ffi::ibv_pd) -> Result<()> {
        match self.object_pds {
            ObjectPds::None => Ok(()),
            ObjectPds::One(pd) if pd == qp_pd => Ok(()),
            _ => Err(foreign_object()),
        }
    }

    /// The head of the chain, or null when empty.
    pub(crate) fn head(&mut self) -> *mut W::Raw {
        self.wrs.as_mut_ptr()
    }

    /// The index of `bad` (the request a failed post verb reported) in the list, or `None` when
    /// it names no element of the list: null (the provider did not say) or a stray pointer.
    pub(crate) fn index_of(&self, bad: *const W::Raw) -> Option<usize> {
        element_index(self.wrs.as_ptr(), self.wrs.len(), bad)
    }
}

impl<W: WorkRequest> fmt::Debug for PostList<'_, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostList")
            .field("len", &self.len())
            .field("capacity", &self.capacity())
            .finish()
    }
}

/// The index of `bad` in the `len` elements at `base`, or `None` when it points at none of
/// them (null, outside, or between elements). Address arithmetic only: `bad` comes from a
/// provider and is never dereferenced.
pub(crate) fn element_index<R>(base: *const R, len: usize, bad: *const R) -> Option<usize> {
    let size = std::mem::size_of::<R>();
    if bad.is_null() || size == 0 {
        return None;
    }
    let offset = (bad as usize).checked_sub(base as usize)?;
    let index = offset / size;
    (offset % size == 0 && index < len).then_some(index)
}

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

#[cfg(test)]
mod element_index_tests {
    use super::element_index;

    #[test]
    fn only_pointers_to_elements_have_an_index() {
        let items = [0u64; 4];
        let base = items.as_ptr();
        assert_eq!(element_index(base, 4, base), Some(0));
        assert_eq!(element_index(base, 4, base.wrapping_add(3)), Some(3));
        assert_eq!(element_index(base, 4, std::ptr::null()), None);
        assert_eq!(element_index(base, 4, base.wrapping_add(4)), None);
        assert_eq!(element_index(base, 4, base.wrapping_sub(1)), None);
        let between = (base as usize + 3) as *const u64;
        assert_eq!(element_index(base, 4, between), None);
    }
}

#[cfg(test)]
mod post_list_tests {
    use super::*;

    /// Every single-entry request of `list` points at its own entry in the list's current
    /// entry storage, and every request but the last at the next one.
    fn assert_chain_intact(list: &PostList<'_, RecvRequest<'_>>) {
        let sges = list.sges.as_ptr_range();
        for (i, raw) in list.wrs.iter().enumerate() {
            let sg = raw.sg_list.cast_const();
            assert!(sges.contains(&sg), "request {i}: entry outside the storage");
            assert_eq!(sg, list.sges.as_ptr().wrapping_add(i), "request {i}");
            let next = list.wrs.as_ptr().wrapping_add(i + 1).cast_mut();
            let want = if i + 1 < list.wrs.len() {
                next
            } else {
                std::ptr::null_mut()
            };
            assert_eq!(raw.next, want, "request {i}: broken chain");
        }
    }

    #[test]
    fn a_list_never_outgrows_either_vector() {
        // The allocator may give the two vectors different capacities: the list must hold no
        // more than the smaller, or pushing would move the entries the chain points at.
        for (wr_cap, sge_cap) in [(8, 2), (2, 8), (4, 4)] {
            let mut list: RecvList<'_> =
                PostList::from_storage(Vec::with_capacity(wr_cap), Vec::with_capacity(sge_cap));
            let cap = wr_cap.min(sge_cap);
            assert_eq!(list.capacity(), cap);
            for i in 0..wr_cap.max(sge_cap) {
                let slice = MrSlice::unchecked_for_test(0x1000 + 8 * i as u64, 8, 1);
                let pushed = list.push(RecvRequest::new(i as u64, slice));
                if i < cap {
                    pushed.expect("below capacity");
                } else {
                    assert!(matches!(pushed, Err(Error::InvalidArgument(_))), "push {i}");
                }
                assert_chain_intact(&list);
            }
            assert_eq!(list.len(), cap);
            // `reuse` keeps both vectors, and the same bound.
            let mut list: RecvList<'_> = list.reuse();
            assert_eq!(list.capacity(), cap);
            for i in 0..cap {
                list.push(RecvRequest::empty(i as u64))
                    .expect("reused list");
            }
            assert!(list.push(RecvRequest::empty(99)).is_err());
        }
    }
}

#[cfg(test)]
mod empty_entry_tests {
    use super::*;

    /// An empty slice or empty inline data goes to the provider as no entry at all (some read
    /// length 0 as 2 GiB), on every request kind and in lists; a caller's list with an empty
    /// entry is refused.
    #[test]
    fn nothing_of_length_zero_reaches_the_provider() {
        let empty = MrSlice::unchecked_for_test(0x1000, 0, 7);
        let mut raw = ffi::ibv_send_wr::default();
        let mut one = ffi::ibv_sge::default();
        for request in [
            SendRequest::send(1, empty),
            SendRequest::send(2, Payload::Inline(&[])),
            SendRequest::read(
                3,
                empty,
                RemoteMemory {
                    addr: 0x2000,
                    len: 64,
                    rkey: 9,
                },
            ),
        ] {
            request.fill(&mut raw, &mut one).unwrap();
            assert_eq!((raw.num_sge, raw.sg_list), (0, std::ptr::null_mut()));
            assert_eq!(raw.send_flags & ffi::IBV_SEND_INLINE, 0);
        }
        let mut recv = ffi::ibv_recv_wr::default();
        RecvRequest::new(4, empty)
            .fill(&mut recv, &mut one)
            .unwrap();
        assert_eq!((recv.num_sge, recv.sg_list), (0, std::ptr::null_mut()));

        let mut list: RecvList<'_> = PostList::with_capacity(2);
        list.push(RecvRequest::new(5, empty)).unwrap();
        assert_eq!(list.wrs[0].num_sge, 0);
        assert!(list.wrs[0].sg_list.is_null());

        let entry = |addr, length| Sge {
            raw: ffi::ibv_sge {
                addr,
                length,
                lkey: 7,
            },
            _region: PhantomData,
        };
        let entries = [entry(0x1000, 8), entry(0x2000, 0)];
        let refused = SendRequest::send(6, &entries[..]).fill(&mut raw, &mut one);
        assert!(
            matches!(refused, Err(Error::InvalidArgument(_))),
            "{refused:?}"
        );
    }
}
