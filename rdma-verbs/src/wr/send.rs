//! [`SendRequest`]: send work requests (`struct ibv_send_wr`), typed by operation and by
//! memory model, and [`SendWr`], the untyped request that the `unsafe` calls, the lists, the
//! owned and slot paths and `PostScope` lower to `ibv_send_wr` through one function
//! ([`SendWr::fill`]).

use std::fmt;
use std::marker::PhantomData;
use std::ops::RangeBounds;

use super::{Payload, check_wr_id, foreign_object, op};
use crate::ah::AddressHandle;
use crate::error::{Error, Result};
use crate::ffi;
use crate::flags::{AccessFlags, SendFlags};
use crate::mr::{MemoryRegion, MrSlice, RemoteMemory};
use crate::mw::{BindRange, MemoryWindow, MwType, check_bind};
use crate::wr::Sge;

/// A send work request (`struct ibv_send_wr`), typed by its operation `K`: SEND (with
/// immediate data, or invalidating a peer's window), RDMA WRITE (with immediate data), RDMA
/// READ, the atomics (compare-and-swap, fetch-and-add, atomic write), BIND_MW and LOCAL_INV;
/// and by its memory model `M`, which the constructors take from what they are given:
///
/// - [`Borrowed`] (the default): memory the request borrows, a [`MrSlice`], a list of
///   [`Sge`]s or a [`Payload`], for the `unsafe` posts
///   ([`QueuePair::post_send_one`](crate::QueuePair::post_send_one), lists) and a
///   [`PostScope`](crate::scope::PostScope);
/// - [`Owned`](crate::owned::Owned): a [`Buf`](crate::buf::Buf) or a [`RegionRange`](crate::owned::RegionRange),
///   which the request carries into
///   [`QueuePair::post_send_owned`](crate::QueuePair::post_send_owned), safely;
/// - [`Slot`](crate::slot::Slot): a slot of a [`SlotRing`](crate::slot::SlotRing), which the request
///   carries into [`QueuePair::post_send_slot`](crate::QueuePair::post_send_slot), safely.
///
/// Bytes of no region (inline) make a [`Borrowed`] or an [`Owned`](crate::owned::Owned) request,
/// as its post asks ([`IntoMemory`]).
///
/// The operations, their options and their names are the same for every model.
///
/// Signaled by default (its completion comes to the send completion queue); options chain by
/// value. What an operation cannot carry does not compile: only SEND and RDMA WRITE take
/// [`with_imm`](Self::with_imm), [`solicited`](Self::solicited) and
/// [`inline`](Self::inline), only SEND takes a UD destination ([`to`](Self::to)):
///
/// ```no_run
/// # use rdma_verbs::{MemoryRegion, wr::SendRequest};
/// # fn f(mr: &MemoryRegion) -> rdma_verbs::Result<()> {
/// let request = SendRequest::send(mr.slice(..64)?).with_imm(0xfeed).tag(1);
/// # Ok(()) }
/// ```
///
/// ```compile_fail,E0599
/// # fn f(mr: &rdma_verbs::MemoryRegion, remote: rdma_verbs::mr::RemoteMemory) {
/// let request = rdma_verbs::wr::SendRequest::read(mr.slice(..8).unwrap(), remote).with_imm(7);
/// # }
/// ```
///
/// A [`Borrowed`] request borrows the memory it names (`'a`); posting it is the `unsafe` step
/// ([`QueuePair::post_send_one`](crate::QueuePair::post_send_one),
/// [`QueuePair::post_send`](crate::QueuePair::post_send) for a [`SendList`](crate::wr::SendList)),
/// because the device uses the memory after the call returns (or, safely, through a
/// [`PostScope`](crate::scope::PostScope), which outlives the memory's use). A request of a slot is
/// posted safely, the slot moving into its ring until the completion hands it back:
///
/// ```no_run
/// # use rdma_verbs::{QueuePair, qp::{Rc, Rts}, wr::SendRequest};
/// # fn f(qp: &mut QueuePair<Rc, Rts>) -> rdma_verbs::Result<()> {
/// let mut ring = qp.slot_ring(16, 4096)?;
/// let mut slot = ring.take().expect("a free slot");
/// ring.fill(&mut slot, b"hello")?;
/// qp.post_send_slot(&mut ring, SendRequest::send(slot).with_imm(7).tag(1))?;
/// # Ok(()) }
/// ```
#[must_use = "a request does nothing until it is posted"]
pub struct SendRequest<'a, K: Operation = SendOp, M = Borrowed> {
    wr: SendWr<'a>,
    /// What the memory model keeps besides `wr`'s payload (a [`Slot`](crate::slot::Slot)), or
    /// nothing.
    memory: M,
    _op: PhantomData<fn() -> K>,
}

impl<K: Operation, M: Clone> Clone for SendRequest<'_, K, M> {
    fn clone(&self) -> Self {
        Self {
            wr: self.wr,
            memory: self.memory.clone(),
            _op: PhantomData,
        }
    }
}

impl<K: Operation, M: Copy> Copy for SendRequest<'_, K, M> {}

impl<K: Operation, M: fmt::Debug> fmt::Debug for SendRequest<'_, K, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.wr.debug(f, &self.memory)
    }
}

/// The memory model of requests that borrow the memory they name (the default of
/// [`SendRequest`]): what the `unsafe` posts and the lists take.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Borrowed;

/// What a request's constructor takes as its memory ([`SendRequest::send`],
/// [`write`](SendRequest::write), [`read`](SendRequest::read),
/// [`send_with_invalidate`](SendRequest::send_with_invalidate)), for a request of memory
/// model `M`. Sealed. The memory decides the model, except for bytes of no region:
///
/// | given | model |
/// |---|---|
/// | a [`MrSlice`], a slice of [`Sge`]s, a [`Payload`] | [`Borrowed`] |
/// | a [`Buf`](crate::buf::Buf), a [`RegionRange`](crate::owned::RegionRange) | [`Owned`](crate::owned::Owned) |
/// | a [`Slot`](crate::slot::Slot) | [`Slot`](crate::slot::Slot) |
/// | bytes of no region (`&[u8]`, `&[u8; N]`, `&Vec<u8>`), copied into the request when it is posted (`IBV_SEND_INLINE`, up to the queue pair's `max_inline_data`; `b""` sends nothing) | [`Borrowed`] or [`Owned`](crate::owned::Owned), as the post that takes the request says |
pub trait IntoMemory<'a, M>: memory_sealed::Sealed {
    /// The payload the request names now, and what its model keeps.
    #[doc(hidden)]
    fn into_memory(self) -> (Payload<'a>, M);
}

/// What an atomic's constructor takes for the 8-byte word where the old value lands
/// ([`SendRequest::fetch_add`], [`compare_swap`](SendRequest::compare_swap)): a [`MrSlice`]
/// of 8 bytes (checked when posted), a [`Buf`](crate::buf::Buf) or a [`Slot`](crate::slot::Slot) (their
/// length set to 8 when
/// posted). Sealed.
pub trait AtomicTarget<'a, M>: IntoMemory<'a, M> {}

/// The memory models whose requests may name no memory at all
/// ([`SendRequest::local_invalidate`]): [`Borrowed`] and [`Owned`](crate::owned::Owned). Sealed.
pub trait Memoryless: memory_sealed::Sealed {
    /// What the model keeps for a request of no memory.
    #[doc(hidden)]
    fn none() -> Self;
}

/// The region a type 2 window is bound to ([`SendRequest::bind_mw`]), and the memory model
/// it gives the request: `&MemoryRegion` for [`Borrowed`] (the `unsafe` post; the window
/// takes its new key at once), `&Arc<MemoryRegion>` for [`Owned`](crate::owned::Owned) (the request
/// keeps the region until the bind has executed; the window takes its new key when posted).
/// Sealed.
pub trait BindRegion<'a, M>: memory_sealed::Sealed {
    /// The region.
    #[doc(hidden)]
    fn region(&self) -> &MemoryRegion;

    /// The bind request of `mw`, checked ([`check_bind`]) to `range`, with `access`.
    #[doc(hidden)]
    fn bind(
        self,
        mw: &'a mut MemoryWindow,
        range: BindRange,
        access: AccessFlags,
    ) -> Result<(SendWr<'a>, M)>;
}

pub(crate) mod memory_sealed {
    pub trait Sealed {}
}

impl memory_sealed::Sealed for Borrowed {}
impl Memoryless for Borrowed {
    #[inline]
    fn none() -> Self {
        Borrowed
    }
}

impl memory_sealed::Sealed for MrSlice<'_> {}
impl<'a> IntoMemory<'a, Borrowed> for MrSlice<'a> {
    #[inline]
    fn into_memory(self) -> (Payload<'a>, Borrowed) {
        (Payload::Slice(self), Borrowed)
    }
}
impl<'a> AtomicTarget<'a, Borrowed> for MrSlice<'a> {}

impl memory_sealed::Sealed for &[Sge<'_>] {}
impl<'a> IntoMemory<'a, Borrowed> for &'a [Sge<'a>] {
    #[inline]
    fn into_memory(self) -> (Payload<'a>, Borrowed) {
        (Payload::List(self), Borrowed)
    }
}

impl memory_sealed::Sealed for Payload<'_> {}
impl<'a> IntoMemory<'a, Borrowed> for Payload<'a> {
    #[inline]
    fn into_memory(self) -> (Payload<'a>, Borrowed) {
        (self, Borrowed)
    }
}

impl memory_sealed::Sealed for &[u8] {}
impl<'a, M: Memoryless> IntoMemory<'a, M> for &'a [u8] {
    #[inline]
    fn into_memory(self) -> (Payload<'a>, M) {
        (Payload::Inline(self), M::none())
    }
}

impl memory_sealed::Sealed for &Vec<u8> {}
impl<'a, M: Memoryless> IntoMemory<'a, M> for &'a Vec<u8> {
    #[inline]
    fn into_memory(self) -> (Payload<'a>, M) {
        (Payload::Inline(self), M::none())
    }
}

impl<const N: usize> memory_sealed::Sealed for &[u8; N] {}
impl<'a, M: Memoryless, const N: usize> IntoMemory<'a, M> for &'a [u8; N] {
    #[inline]
    fn into_memory(self) -> (Payload<'a>, M) {
        (Payload::Inline(self), M::none())
    }
}

impl memory_sealed::Sealed for &MemoryRegion {}
impl<'a> BindRegion<'a, Borrowed> for &'a MemoryRegion {
    #[inline]
    fn region(&self) -> &MemoryRegion {
        self
    }

    fn bind(
        self,
        mw: &'a mut MemoryWindow,
        range: BindRange,
        access: AccessFlags,
    ) -> Result<(SendWr<'a>, Borrowed)> {
        let rkey = mw.next_type2_rkey()?;
        Ok((
            SendWr::bind_checked(mw, rkey, self, range, access),
            Borrowed,
        ))
    }
}

/// The operation of a [`SendRequest`] (of every memory model), as a
/// type: [`SendOp`], [`WriteOp`], [`ReadOp`], [`AtomicOp`], [`InvalidateOp`] or [`BindOp`]
/// ([`AnyOp`] for a request erased of it). Sealed.
pub trait Operation: sealed::Sealed {}

pub(crate) mod sealed {
    pub trait Sealed {
        /// Whether requests of the operation may be binds: the owned post path pays for what a
        /// bind needs (the window's new key taken after the post) only when they may.
        const BIND: bool = false;
    }
}

/// SEND (with or without immediate data, inline or from memory, to a UD destination).
#[derive(Debug)]
pub enum SendOp {}
/// RDMA WRITE (with or without immediate data, inline or from memory).
#[derive(Debug)]
pub enum WriteOp {}
/// RDMA READ.
#[derive(Debug)]
pub enum ReadOp {}
/// ATOMIC_FETCH_AND_ADD, ATOMIC_CMP_AND_SWP and ATOMIC_WRITE.
#[derive(Debug)]
pub enum AtomicOp {}
/// LOCAL_INV and SEND_WITH_INV: invalidating a memory window's key (type 2 windows).
#[derive(Debug)]
pub enum InvalidateOp {}
/// BIND_MW: binding a type 2 memory window to part of a region.
#[derive(Debug)]
pub enum BindOp {}
/// Any operation: a request [`erase`](SendRequest::erase)d of its operation's type, for a
/// program that chooses the operation at run time (a benchmark's `--test` option, say). It
/// keeps the options every operation has; the operation's own were set before erasing.
#[derive(Debug)]
pub enum AnyOp {}

impl sealed::Sealed for SendOp {}
impl sealed::Sealed for WriteOp {}
impl sealed::Sealed for ReadOp {}
impl sealed::Sealed for AtomicOp {}
impl sealed::Sealed for InvalidateOp {}
impl sealed::Sealed for BindOp {
    const BIND: bool = true;
}
impl sealed::Sealed for AnyOp {
    const BIND: bool = true;
}
/// The operations that carry immediate data, may raise a solicited event and may be sent
/// inline: [`SendOp`] and [`WriteOp`]. Sealed.
pub trait ImmOp: Operation {}
impl ImmOp for SendOp {}
impl ImmOp for WriteOp {}

impl Operation for SendOp {}
impl Operation for WriteOp {}
impl Operation for ReadOp {}
impl Operation for AtomicOp {}
impl Operation for InvalidateOp {}
impl Operation for BindOp {}
impl Operation for AnyOp {}

/// A send request of any operation, as the post paths hand it to [`fill`](Self::fill): the
/// one lowering to `struct ibv_send_wr`. Public only in name (this module is private), so that
/// the sealed traits' hidden methods can return it.
#[derive(Copy, Clone)]
pub struct SendWr<'a> {
    wr_id: u64,
    opcode: u32,
    op: u32,
    pub(super) payload: Payload<'a>,
    flags: SendFlags,
    imm: u32,
    /// The remote memory of a READ, a WRITE or an atomic (its length checked by the safe
    /// paths; the work request carries only its address and key).
    remote: RemoteMemory,
    atomic: (u64, u64),
    ud: Option<(&'a AddressHandle, u32, u32)>,
    invalidate_rkey: u32,
    bind: Option<MwBind<'a>>,
    /// Posted by the owned-buffer path, whose ids alone may have
    /// [`OWNED_ID_BIT`](crate::inflight::OWNED_ID_BIT).
    owned: bool,
}

// Named as users know it: `SendRequest`'s `Debug` is this.
impl fmt::Debug for SendWr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.debug(f, &Borrowed)
    }
}

impl SendWr<'_> {
    /// The request's fields, and what its memory model keeps.
    fn debug<M: fmt::Debug>(&self, f: &mut fmt::Formatter<'_>, memory: &M) -> fmt::Result {
        f.debug_struct("SendRequest")
            .field("wr_id", &self.wr_id)
            .field("opcode", &self.opcode)
            .field("payload", &self.payload)
            .field("flags", &self.flags)
            .field("imm", &self.imm)
            .field("remote", &self.remote)
            .field("atomic", &self.atomic)
            .field("ud", &self.ud)
            .field("invalidate_rkey", &self.invalidate_rkey)
            .field("bind", &self.bind)
            .field("memory", memory)
            .finish()
    }
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

impl<'a> SendWr<'a> {
    #[inline]
    fn new(opcode: u32, op: u32, payload: Payload<'a>) -> Self {
        Self {
            wr_id: 0,
            opcode,
            op,
            payload,
            flags: SendFlags::SIGNALED,
            imm: 0,
            remote: RemoteMemory {
                addr: 0,
                len: 0,
                rkey: 0,
            },
            atomic: (0, 0),
            ud: None,
            invalidate_rkey: 0,
            bind: None,
            owned: false,
        }
    }

    /// A BIND_MW request whose window and region a safe path names at post
    /// ([`with_bind`](Self::with_bind)).
    #[inline]
    pub(crate) fn bind_pending() -> Self {
        Self::new(ffi::IBV_WR_BIND_MW, op::BIND_MW, Payload::None)
    }

    /// A BIND_MW request of a bind [`check_bind`] accepted, with the window's new key `rkey`.
    #[inline]
    pub(crate) fn bind_checked(
        mw: &'a MemoryWindow,
        rkey: u32,
        mr: &'a MemoryRegion,
        range: BindRange,
        access: AccessFlags,
    ) -> Self {
        Self::new(ffi::IBV_WR_BIND_MW, op::BIND_MW, Payload::None)
            .with_bind(mw, rkey, mr, range, access)
    }
}

impl<'a, K: Operation, M> SendRequest<'a, K, M> {
    #[inline]
    fn typed(wr: SendWr<'a>, memory: M) -> Self {
        Self {
            wr,
            memory,
            _op: PhantomData,
        }
    }

    /// A request of operation `K` with `memory`: its payload goes into the request.
    #[inline]
    fn of<P: IntoMemory<'a, M>>(opcode: u32, op: u32, memory: P) -> Self {
        let (payload, memory) = memory.into_memory();
        Self::typed(SendWr::new(opcode, op, payload), memory)
    }

    /// A tag for the request, which its completion gives back: as its `wr_id`
    /// ([`WorkCompletion::wr_id`](crate::cq::WorkCompletion::wr_id)) for a [`Borrowed`] request, as
    /// the slot's [`tag`](crate::slot::Slot::tag) for a slot's. 0 unless set.
    #[inline]
    pub fn tag(mut self, tag: u64) -> Self {
        self.wr.wr_id = tag;
        self
    }

    /// Asks for no completion (clears `IBV_SEND_SIGNALED`, which every request has unless
    /// this is called): the request's resources are free once a later signaled request of
    /// the queue pair completes. A queue pair built with
    /// [`QpBuilder::sq_sig_all`](crate::qp::QpBuilder::sq_sig_all) signals every request whatever
    /// this says.
    #[inline]
    pub fn unsignaled(mut self) -> Self {
        self.wr.flags.remove(SendFlags::SIGNALED);
        self
    }

    /// Starts the request only once the queue pair's earlier RDMA READs and atomics have
    /// completed (`IBV_SEND_FENCE`).
    #[inline]
    pub fn fenced(mut self) -> Self {
        self.wr.flags |= SendFlags::FENCE;
        self
    }

    /// The request's tag ([`tag`](Self::tag)), its `wr_id`.
    #[inline]
    pub fn wr_id(&self) -> u64 {
        self.wr.wr_id
    }

    /// The same request, of [`AnyOp`]: requests of different operations then have one type.
    #[inline]
    pub fn erase(self) -> SendRequest<'a, AnyOp, M> {
        SendRequest::typed(self.wr, self.memory)
    }

    /// What the memory model keeps.
    #[inline]
    pub(crate) fn memory(&self) -> &M {
        &self.memory
    }

    /// What the memory model keeps, to change it.
    #[inline]
    pub(crate) fn memory_mut(&mut self) -> &mut M {
        &mut self.memory
    }

    /// The untyped request and what its memory model keeps, for the post paths.
    #[inline]
    pub(crate) fn into_parts(self) -> (SendWr<'a>, M) {
        (self.wr, self.memory)
    }
}

impl<'a, K: Operation> SendRequest<'a, K> {
    /// Adds raw `IBV_SEND_*` flags (a [`Borrowed`] request's only: the safe paths pass no
    /// flag they do not know to the provider).
    #[inline]
    pub fn flags(mut self, flags: SendFlags) -> Self {
        self.wr.flags |= flags;
        self
    }

    /// The untyped request, for the post paths.
    #[inline]
    pub(crate) fn wr(&self) -> &SendWr<'a> {
        &self.wr
    }

    /// The untyped request, for the post paths.
    #[inline]
    pub(crate) fn into_wr(self) -> SendWr<'a> {
        self.wr
    }
}

impl<K: ImmOp, M> SendRequest<'_, K, M> {
    /// Adds immediate data (host order): SEND becomes SEND_WITH_IMM and RDMA_WRITE becomes
    /// RDMA_WRITE_WITH_IMM, which consumes a receive request at the peer and is delivered with
    /// its completion.
    #[inline]
    pub fn with_imm(mut self, imm: u32) -> Self {
        self.wr = self.wr.with_imm(imm);
        self
    }

    /// Raises a solicited event at the receiver with its receive completion
    /// (`IBV_SEND_SOLICITED`; an RDMA WRITE without immediate data completes no receive).
    #[inline]
    pub fn solicited(mut self) -> Self {
        self.wr.flags |= SendFlags::SOLICITED;
        self
    }

    /// Sends the bytes inline (`IBV_SEND_INLINE`): the provider copies them into the work
    /// request during the post, so the device does not read the memory (on NICs that would
    /// otherwise fetch it, a shorter round trip for small messages). Refused by the provider
    /// when longer than the queue pair's granted `max_inline_data`
    /// ([`QueuePair::caps`](crate::QueuePair::caps)). [`Payload::Inline`] sends bytes of no
    /// region this way. A slot sent inline stays posted until the request's completion, as
    /// any other.
    #[inline]
    pub fn inline(mut self) -> Self {
        self.wr.flags |= SendFlags::INLINE;
        self
    }
}

impl<'a, M> SendRequest<'a, SendOp, M> {
    /// SEND: delivers `memory` (a slot's first [`len`](crate::slot::Slot::len) bytes) to the next
    /// receive request of the peer.
    #[inline]
    pub fn send<P: IntoMemory<'a, M>>(memory: P) -> Self {
        Self::of(ffi::IBV_WR_SEND, op::SEND, memory)
    }
}

impl<'a> SendRequest<'a, SendOp> {
    /// Addresses a datagram (UD): to queue pair `remote_qpn` behind `ah`, with Q_Key
    /// `remote_qkey`. Required for every request posted to a UD queue pair, refused on the
    /// others.
    #[inline]
    pub fn to(self, ah: &'a AddressHandle, remote_qpn: u32, remote_qkey: u32) -> Self {
        self.with_dest(ah, remote_qpn, remote_qkey)
    }
}

impl<'a, M> SendRequest<'a, SendOp, M> {
    /// The UD destination, for the models whose `to` borrows the address handle.
    #[inline]
    pub(crate) fn with_dest(
        mut self,
        ah: &'a AddressHandle,
        remote_qpn: u32,
        remote_qkey: u32,
    ) -> Self {
        self.wr = self.wr.to(ah, remote_qpn, remote_qkey);
        self
    }
}

impl<'a, M> SendRequest<'a, WriteOp, M> {
    /// RDMA_WRITE: writes `memory` to `remote` (the peer's memory, which must allow remote
    /// write). The peer gets no completion (unless [`with_imm`](Self::with_imm)). The safe
    /// paths refuse a write longer than `remote`.
    #[inline]
    pub fn write<P: IntoMemory<'a, M>>(memory: P, remote: RemoteMemory) -> Self {
        let mut request = Self::of(ffi::IBV_WR_RDMA_WRITE, op::WRITE, memory);
        request.wr.remote = remote;
        request
    }
}

impl<'a, M> SendRequest<'a, ReadOp, M> {
    /// RDMA_READ: reads `remote` into `local` (which needs `LOCAL_WRITE`). The safe paths
    /// refuse a read longer than `remote`.
    ///
    /// The target cannot be [`Payload::Inline`] (the device writes it); posting such a request
    /// fails with `InvalidArgument`.
    #[inline]
    pub fn read<P: IntoMemory<'a, M>>(local: P, remote: RemoteMemory) -> Self {
        let mut request = Self::of(ffi::IBV_WR_RDMA_READ, op::READ, local);
        if let Payload::Inline(_) = request.wr.payload {
            request.wr.op |= op::INVALID;
        }
        request.wr.remote = remote;
        request
    }
}

impl<'a, M> SendRequest<'a, AtomicOp, M> {
    /// ATOMIC_CMP_AND_SWP: if the 8-byte word at `remote.addr` equals `compare`, replaces it
    /// with `swap`. The old value lands in `local` (8 bytes, `LOCAL_WRITE`) in the byte order
    /// the device writes: host order on rxe, big-endian (the wire order) on some devices; read
    /// it with [`u64::from_ne_bytes`] only where the device is known to write host order.
    #[inline]
    pub fn compare_swap<P: AtomicTarget<'a, M>>(
        local: P,
        remote: RemoteMemory,
        compare: u64,
        swap: u64,
    ) -> Self {
        let mut request = Self::of(ffi::IBV_WR_ATOMIC_CMP_AND_SWP, op::ATOMIC, local);
        request.wr.remote = remote;
        request.wr.atomic = (compare, swap);
        request
    }

    /// ATOMIC_FETCH_AND_ADD: adds `add` to the 8-byte word at `remote.addr`. The old value
    /// lands in `local` (8 bytes, `LOCAL_WRITE`) in the byte order the device writes (see
    /// [`compare_swap`](Self::compare_swap)).
    #[inline]
    pub fn fetch_add<P: AtomicTarget<'a, M>>(local: P, remote: RemoteMemory, add: u64) -> Self {
        let mut request = Self::of(ffi::IBV_WR_ATOMIC_FETCH_AND_ADD, op::ATOMIC, local);
        request.wr.remote = remote;
        request.wr.atomic = (add, 0);
        request
    }
}

impl<'a> SendRequest<'a, AtomicOp> {
    /// ATOMIC_WRITE (`IBV_WR_ATOMIC_WRITE`): writes the 8 bytes of `value`, as they lie in
    /// this host's memory (native byte order), to `remote.addr` (8-byte aligned) in one
    /// indivisible access: a peer never reads half of it. No local memory is involved.
    ///
    /// Only a reliable connected queue pair that [uses the extended
    /// API](crate::QueuePair::uses_extended_post) on a device that
    /// [supports it](crate::device::DeviceAttr::supports_atomic_write) posts it (through
    /// `ibv_wr_atomic_write`). Another RC queue pair refuses the post with
    /// [`Error::Unsupported`]`("ibv_wr_atomic_write")`, and UC and UD with
    /// [`Error::InvalidArgument`] (they have no atomics), posting nothing of the list.
    /// Completes with [`WcOpcode::AtomicWrite`](crate::cq::WcOpcode::AtomicWrite).
    ///
    /// # References
    ///
    /// [`ibv_wr_post(3)`](https://man7.org/linux/man-pages/man3/ibv_wr_post.3.html)
    #[doc(alias = "ibv_wr_atomic_write")]
    #[doc(alias = "IBV_WR_ATOMIC_WRITE")]
    #[inline]
    pub fn atomic_write(remote: RemoteMemory, value: u64) -> Self {
        let mut wr = SendWr::new(ffi::IBV_WR_ATOMIC_WRITE, op::ATOMIC_WRITE, Payload::None);
        wr.remote = remote;
        wr.atomic = (value, 0);
        Self::typed(wr, Borrowed)
    }
}

impl<'a, M> SendRequest<'a, BindOp, M> {
    /// BIND_MW (`IBV_WR_BIND_MW`): binds type 2 window `mw` to bytes `range` of `mr` with rights
    /// `access`, giving it a new key (`ibv_inc_rkey` of its current one), which
    /// [`rkey`](Self::rkey) reads. The region decides the memory model ([`BindRegion`]):
    ///
    /// - `&MemoryRegion`, [`Borrowed`]: the window's [`rkey`](MemoryWindow::rkey) is the new
    ///   key as soon as the request is built; post the request once, as the device checks the
    ///   key being replaced, so a request built and never posted leaves the window unusable
    ///   for later binds. Posting it is `unsafe` like every borrowed post: besides the
    ///   contract of [`post_send`](crate::QueuePair::post_send), `mr` stays registered (is not
    ///   dropped) until the bind has executed (its completion, or a later signaled one, is
    ///   polled), because the device finds the region by its key when the bind executes.
    /// - `&Arc<MemoryRegion>`, [`Owned`](crate::owned::Owned): posted safely
    ///   ([`QueuePair::post_send_owned`](crate::QueuePair::post_send_owned)); the request keeps
    ///   the region (a reference count) until the bind has executed (its completion, a later
    ///   one of the same queue pair, or the queue pair's reset or destruction), so the device
    ///   cannot find another region under the key. The window takes the new key only when the
    ///   request is posted (or its post's outcome is unknown): a request the device never
    ///   sees (refused by the post, dropped, cleared from a list, forgotten) leaves the
    ///   window's key as the device knows it, so a retry works. While the window is bound,
    ///   rxe refuses to deregister the region: keep a reference to `mr` until the window is
    ///   dropped, or invalidated with the invalidation's completion polled (if the request's
    ///   reference is the last one when the bind completes, the region's deregistration fails
    ///   there, unreported, and its memory leaks, which is safe).
    ///
    /// The request (and a list holding it) borrows the window exclusively. The window is bound
    /// to the queue pair the request is posted on, which must belong to the window's
    /// protection domain (else the bind completes with
    /// [`WcStatus::MwBindErr`](crate::cq::WcStatus::MwBindErr)); peers reach it only through that
    /// queue pair. It stays bound until invalidated ([`local_invalidate`](Self::local_invalidate),
    /// a peer's [`send_with_invalidate`](Self::send_with_invalidate)) and can then be bound
    /// again. The completion is [`WcOpcode::BindMw`](crate::cq::WcOpcode::BindMw); hand the key to
    /// a peer after it.
    ///
    /// `access` may hold [`REMOTE_READ`](AccessFlags::REMOTE_READ),
    /// [`REMOTE_WRITE`](AccessFlags::REMOTE_WRITE), [`REMOTE_ATOMIC`](AccessFlags::REMOTE_ATOMIC)
    /// and [`ZERO_BASED`](AccessFlags::ZERO_BASED). A window may only grant remote write and
    /// atomic rights that `mr` was registered with, so that the region keeps refusing Rust
    /// references to memory a peer may write.
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
    /// Safely, the request keeping the region:
    ///
    /// ```no_run
    /// use std::sync::Arc;
    ///
    /// use rdma_verbs::{ProtectionDomain, QueuePair, mr::AccessFlags, mw::MwType, qp::{Rc, Rts}, wr::SendRequest};
    ///
    /// # fn f(qp: &mut QueuePair<Rc, Rts>, pd: &ProtectionDomain) -> rdma_verbs::Result<()> {
    /// let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    /// let mr = Arc::new(pd.register(8192, rights | AccessFlags::MW_BIND)?);
    /// let mut mw = pd.alloc_mw(MwType::Type2)?;
    /// let bind = SendRequest::bind_mw(&mut mw, &mr, 0..4096, AccessFlags::REMOTE_WRITE)?.tag(1);
    /// let rkey = bind.rkey();
    /// qp.post_send_owned(bind)?;
    /// // ... reap the completion tagged 1 with `poll_each`, then send `mr.addr()`, 4096 and
    /// // `rkey` to the peer; keep `mr` until the window is dropped or invalidated.
    /// # let _ = rkey;
    /// # Ok(()) }
    /// ```
    ///
    /// With the `unsafe` post, the caller keeping the region:
    ///
    /// ```no_run
    /// use rdma_verbs::{ProtectionDomain, QueuePair, mr::AccessFlags, mw::MwType, qp::{Rc, Rts}, wr::SendRequest};
    ///
    /// # fn f(qp: &mut QueuePair<Rc, Rts>, pd: &ProtectionDomain) -> rdma_verbs::Result<()> {
    /// let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    /// let mr = pd.register(8192, rights | AccessFlags::MW_BIND)?;
    /// let mut mw = pd.alloc_mw(MwType::Type2)?;
    /// let bind = SendRequest::bind_mw(&mut mw, &mr, 0..4096, AccessFlags::REMOTE_WRITE)?;
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
    pub fn bind_mw<R: BindRegion<'a, M>>(
        mw: &'a mut MemoryWindow,
        mr: R,
        range: impl RangeBounds<usize>,
        access: AccessFlags,
    ) -> Result<Self> {
        let range = check_bind(mw, MwType::Type2, mr.region(), range, access)?;
        let (wr, memory) = mr.bind(mw, range, access)?;
        Ok(Self::typed(wr, memory))
    }
}

impl SendRequest<'_, BindOp> {
    /// The key the bind gives its window.
    #[inline]
    pub fn rkey(&self) -> u32 {
        self.wr.bind.map_or(0, |bind| bind.rkey)
    }
}

impl<'a, M: Memoryless> SendRequest<'a, InvalidateOp, M> {
    /// LOCAL_INV (`IBV_WR_LOCAL_INV`): invalidates the type 2 memory window (or the region)
    /// with remote key `rkey`, posted on the queue pair the window is bound to. Once it has
    /// executed the key grants nothing, and the window may be bound again. Carries no memory.
    /// Completes with [`WcOpcode::LocalInv`](crate::cq::WcOpcode::LocalInv) when signaled.
    ///
    /// # References
    ///
    /// [`ibv_post_send(3)`](https://man7.org/linux/man-pages/man3/ibv_post_send.3.html)
    #[doc(alias = "IBV_WR_LOCAL_INV")]
    #[inline]
    pub fn local_invalidate(rkey: u32) -> Self {
        let mut wr = SendWr::new(ffi::IBV_WR_LOCAL_INV, op::LOCAL_INV, Payload::None);
        wr.invalidate_rkey = rkey;
        Self::typed(wr, M::none())
    }
}

impl<'a, M> SendRequest<'a, InvalidateOp, M> {
    /// SEND_WITH_INV (`IBV_WR_SEND_WITH_INV`): a SEND of `memory` that also invalidates the
    /// peer's type 2 memory window with remote key `rkey` before the peer's receive completes;
    /// the receive's completion reports the key
    /// ([`WorkCompletion::invalidated_rkey`](crate::cq::WorkCompletion::invalidated_rkey)). The
    /// window must be bound to the receiving queue pair.
    ///
    /// # References
    ///
    /// [`ibv_post_send(3)`](https://man7.org/linux/man-pages/man3/ibv_post_send.3.html)
    #[doc(alias = "IBV_WR_SEND_WITH_INV")]
    #[inline]
    pub fn send_with_invalidate<P: IntoMemory<'a, M>>(memory: P, rkey: u32) -> Self {
        let mut request = Self::of(ffi::IBV_WR_SEND_WITH_INV, op::SEND_WITH_INV, memory);
        request.wr.invalidate_rkey = rkey;
        request
    }

    /// Raises a solicited event at the receiver of a SEND_WITH_INV (`IBV_SEND_SOLICITED`); a
    /// LOCAL_INV sends nothing, and the flag does nothing there.
    #[inline]
    pub fn solicited(mut self) -> Self {
        self.wr.flags |= SendFlags::SOLICITED;
        self
    }
}

impl<'a> SendWr<'a> {
    #[inline]
    pub(crate) fn op(&self) -> u32 {
        self.op
    }

    #[inline]
    pub(crate) fn is_datagram(&self) -> bool {
        self.ud.is_some()
    }

    /// The address handle of a UD request.
    #[inline]
    pub(crate) fn dest_ah(&self) -> Option<&'a AddressHandle> {
        self.ud.map(|(ah, _, _)| ah)
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
                    remote_addr: self.remote.addr,
                    compare_add: self.atomic.0,
                    swap: self.atomic.1,
                    rkey: self.remote.rkey,
                };
            }
            op::WRITE | op::WRITE_WITH_IMM | op::READ => {
                raw.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                    remote_addr: self.remote.addr,
                    rkey: self.remote.rkey,
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

impl SendWr<'_> {
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

impl<'a> SendWr<'a> {
    /// Immediate data on an untyped request ([`SendRequest::with_imm`], and the owned and slot
    /// paths, whose requests are typed already): an operation that cannot carry it is marked
    /// invalid, refused when posted.
    #[inline]
    pub(crate) fn with_imm(mut self, imm: u32) -> Self {
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

    /// A UD destination on an untyped request.
    #[inline]
    pub(crate) fn to(mut self, ah: &'a AddressHandle, remote_qpn: u32, remote_qkey: u32) -> Self {
        self.ud = Some((ah, remote_qpn, remote_qkey));
        self
    }

    /// Sets the `IBV_SEND_*` flags to exactly `flags` (the safe paths, which decide signaling).
    #[inline]
    pub(crate) fn set_flags(mut self, flags: SendFlags) -> Self {
        self.flags = flags;
        self
    }

    /// Adds `IBV_SEND_*` flags.
    #[inline]
    pub(crate) fn add_flags(mut self, flags: SendFlags) -> Self {
        self.flags |= flags;
        self
    }

    /// The request's `wr_id`: the caller's tag until a safe path gives it an id of its own.
    #[inline]
    pub(crate) fn wr_id(&self) -> u64 {
        self.wr_id
    }

    /// The `IBV_SEND_*` flags the caller asked for.
    #[inline]
    pub(crate) fn flags(&self) -> SendFlags {
        self.flags
    }

    /// Whether the operation is an atomic with a result word (compare-and-swap, fetch-and-add).
    #[inline]
    pub(crate) fn has_atomic_result(&self) -> bool {
        self.op & !op::INVALID == op::ATOMIC
    }

    /// The remote memory of a READ or a WRITE (with or without immediate data), whose length
    /// the safe paths check against the local bytes.
    #[inline]
    pub(crate) fn rdma_remote(&self) -> Option<RemoteMemory> {
        match self.op & !op::INVALID {
            op::WRITE | op::WRITE_WITH_IMM | op::READ => Some(self.remote),
            _ => None,
        }
    }

    /// The window a BIND_MW binds, whose lock a safe post holds across the verb.
    #[inline]
    pub(crate) fn bind_window(&self) -> Option<&'a MemoryWindow> {
        self.bind.map(|bind| bind.mw)
    }

    /// The payload the request names (inline bytes, or none, for a request whose memory a
    /// safe path names at post).
    #[inline]
    pub(crate) fn payload(&self) -> Payload<'a> {
        self.payload
    }

    /// Whether the device only reads the request's local memory (SEND, WRITE, with immediate
    /// data or invalidating): any other operation is taken to write it, so that a range of a
    /// new operation is checked as a write unless it is listed here.
    #[inline]
    pub(crate) fn device_only_reads(&self) -> bool {
        let reads =
            op::SEND | op::SEND_WITH_IMM | op::WRITE | op::WRITE_WITH_IMM | op::SEND_WITH_INV;
        self.op & reads != 0
    }

    /// The same request binding `mw` (a BIND_MW built without its bind, whose safe path
    /// names the window and region at post).
    #[inline]
    pub(crate) fn with_bind(
        mut self,
        mw: &'a MemoryWindow,
        rkey: u32,
        mr: &'a MemoryRegion,
        range: BindRange,
        access: AccessFlags,
    ) -> Self {
        self.bind = Some(MwBind {
            mw,
            rkey,
            mr,
            addr: range.addr,
            length: range.length,
            access,
        });
        self
    }

    /// The same request naming `payload` (a slot's bytes, at post).
    #[inline]
    pub(crate) fn with_payload(mut self, payload: Payload<'a>) -> Self {
        self.payload = payload;
        self
    }

    /// The same request, as an owned request with id `id` (see [`OWNED_ID_BIT`](crate::inflight::OWNED_ID_BIT)).
    pub(crate) fn owned(mut self, id: u64) -> Self {
        self.wr_id = id;
        self.owned = true;
        self
    }
}
