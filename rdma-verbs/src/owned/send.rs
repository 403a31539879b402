//! [`OwnedSend`]: owned send requests, typed by operation, and their posting
//! ([`QueuePair::post_send_owned`]).

use std::fmt;
use std::marker::PhantomData;
use std::ops::RangeBounds;
use std::sync::Arc;

use super::{OwnedSges, PostRefused, RegionRange, check_pd, check_region, post_owned, range};
use crate::ah::AddressHandle;
use crate::buf::Buf;
use crate::error::{Error, Result};
use crate::flags::{AccessFlags, SendFlags};
use crate::inflight::Ring;
use crate::mr::{MemoryRegion, RemoteMemory};
use crate::mw::{BindRange, MemoryWindow, MwShared, MwType, check_bind};
use crate::qp::{QueuePair, Rts, Transport, may_have_posted};
use crate::wr::{
    AtomicOp, BindOp, ImmOp, InvalidateOp, Operation, Payload, ReadOp, SendOp, SendRequest, SendWr,
    WriteOp,
};

/// A send request of the owned-buffer path: what it sends (a [`Buf`], or inline bytes), the
/// operation, a tag the completion gives back, and whether it is signaled.
///
/// Signaled by default: its completion hands its buffer back. An [`unsignaled`](Self::unsignaled)
/// request produces no completion; its buffer returns to its pool when a later signaled
/// request of the same queue pair completes (the post signals it whatever it asked when
/// otherwise none might come: see [`QueuePair::post_send_owned`]).
///
/// The operation is part of the type (`K`: [`SendOp`], [`WriteOp`], [`ReadOp`], [`AtomicOp`],
/// [`InvalidateOp`], [`BindOp`]), so what an operation cannot carry is refused at compile time:
/// only SEND and RDMA WRITE have [`with_imm`](OwnedSend::with_imm), only SEND has a UD
/// destination ([`to`](OwnedSend::to)):
///
/// ```compile_fail,E0599
/// # fn f(buf: rdma_verbs::Buf, remote: rdma_verbs::RemoteMemory) {
/// let request = rdma_verbs::OwnedSend::read(buf, remote).with_imm(7);
/// # }
/// ```
#[must_use = "a request does nothing until it is posted"]
pub struct OwnedSend<'a, K: Operation = SendOp> {
    kind: Kind<'a>,
    tag: u64,
    imm: Option<u32>,
    /// `SIGNALED` (the default), `SOLICITED`, `FENCE`.
    flags: SendFlags,
    dest: Option<(AddressHandle, u32, u32)>,
    /// Bytes of a caller's region, after the buffer's ([`OwnedSend::and_range`]).
    range: Option<RegionRange>,
    /// A second range was given, which the request cannot carry: refused when prepared.
    ranges_over: bool,
    _op: PhantomData<fn() -> K>,
}

enum Kind<'a> {
    Send(Option<Buf>),
    SendInline(&'a [u8]),
    Write(Option<Buf>, RemoteMemory),
    WriteInline(&'a [u8], RemoteMemory),
    Read(Option<Buf>, RemoteMemory),
    FetchAdd(Buf, RemoteMemory, u64),
    CompareSwap(Buf, RemoteMemory, u64, u64),
    LocalInvalidate(u32),
    SendInvalidate(Option<Buf>, u32),
    Bind(Bind<'a>, Arc<MemoryRegion>),
}

/// A checked BIND_MW: the window, the key the bind gives it (taken by the window only once
/// the request is posted, so that a request the device never sees leaves the window's key as
/// the device knows it), the range and the rights. The region travels beside it.
struct Bind<'a> {
    mw: &'a mut MemoryWindow,
    rkey: u32,
    range: BindRange,
    access: AccessFlags,
}

impl<'a, K: Operation> OwnedSend<'a, K> {
    fn new(kind: Kind<'a>) -> Self {
        Self {
            kind,
            tag: 0,
            imm: None,
            flags: SendFlags::SIGNALED,
            dest: None,
            range: None,
            ranges_over: false,
            _op: PhantomData,
        }
    }

    /// Appends `range` to the request's memory, after the buffer's bytes (a second
    /// scatter/gather entry; the queue pair needs `max_send_sge` of 2 for both). A request
    /// carries one range: a second is refused when the request is posted or pushed.
    fn with_range(mut self, range: RegionRange) -> Self {
        self.ranges_over |= self.range.is_some();
        self.range = Some(range);
        self
    }

    /// The tag [`Completion::tag`](crate::Completion::tag) gives back (0 by default).
    pub fn tag(mut self, tag: u64) -> Self {
        self.tag = tag;
        self
    }

    /// No completion for this request (see the type's documentation).
    pub fn unsignaled(mut self) -> Self {
        self.flags.remove(SendFlags::SIGNALED);
        self
    }

    /// Starts the request only once the queue pair's earlier RDMA READs and atomics have
    /// completed (`IBV_SEND_FENCE`): for example a SEND that tells the peer a READ's data has
    /// arrived, or a READ of what an earlier atomic changed.
    pub fn fenced(mut self) -> Self {
        self.flags.insert(SendFlags::FENCE);
        self
    }
}

impl<'a> OwnedSend<'a, SendOp> {
    /// SEND of the buffer's first [`len`](Buf::len) bytes.
    pub fn send(buf: Buf) -> Self {
        Self::new(Kind::Send(Some(buf)))
    }

    /// A SEND of no bytes (no buffer).
    pub fn send_empty() -> Self {
        Self::new(Kind::Send(None))
    }

    /// SEND of the bytes of `range`, zero-copy from the caller's region (see [`RegionRange`]).
    pub fn send_range(range: RegionRange) -> Self {
        Self::new(Kind::Send(None)).with_range(range)
    }

    /// The bytes of `range` sent after the buffer's (gathered: the buffer's
    /// [`len`](Buf::len) bytes, then the range's), for example a header from a pool buffer
    /// and a payload straight from the caller's region. Refused at post on an inline request
    /// and on a UD send (whose in-flight entry keeps its address handle instead).
    pub fn and_range(self, range: RegionRange) -> Self {
        self.with_range(range)
    }

    /// SEND of `bytes`, copied into the request when it is posted (`IBV_SEND_INLINE`, up to
    /// the queue pair's `max_inline_data`): no buffer, and `bytes` are free again as soon as
    /// the post returns.
    pub fn send_inline(bytes: &'a [u8]) -> Self {
        Self::new(Kind::SendInline(bytes))
    }

    /// The destination of a UD send: queue pair `remote_qpn` with Q_Key `remote_qkey` behind
    /// `ah`, which the request keeps alive (a clone) until it completes. Only UD queue pairs
    /// take it.
    pub fn to(mut self, ah: &AddressHandle, remote_qpn: u32, remote_qkey: u32) -> Self {
        self.dest = Some((ah.clone(), remote_qpn, remote_qkey));
        self
    }
}

impl OwnedSend<'_, InvalidateOp> {
    /// LOCAL_INV: invalidates the memory window (type 2) or region with remote key `rkey`, on
    /// this queue pair; after it completes, peers' accesses with the key fail. Carries no
    /// memory.
    pub fn local_invalidate(rkey: u32) -> Self {
        Self::new(Kind::LocalInvalidate(rkey))
    }

    /// SEND_WITH_INV: a SEND of the buffer's first [`len`](Buf::len) bytes that also
    /// invalidates the peer's memory window (type 2) with remote key `rkey`, bound to the
    /// receiving queue pair; the peer's receive completion names the key.
    pub fn send_with_invalidate(buf: Buf, rkey: u32) -> Self {
        Self::new(Kind::SendInvalidate(Some(buf), rkey))
    }

    /// Raises a solicited event at the receiver of a SEND_WITH_INV (`IBV_SEND_SOLICITED`), as
    /// [`OwnedSend::<SendOp>::solicited`](OwnedSend::solicited) does for a SEND; a LOCAL_INV
    /// sends nothing, and the flag does nothing.
    pub fn solicited(mut self) -> Self {
        self.flags.insert(SendFlags::SOLICITED);
        self
    }
}

impl<'a> OwnedSend<'a, BindOp> {
    /// BIND_MW: binds type 2 window `mw` to bytes `range` of `mr` with rights `access`, giving
    /// it a new key ([`rkey`](Self::rkey)), as [`SendRequest::bind_mw`] does, without its
    /// `unsafe` post: the request keeps `mr` (a reference count) until the bind has executed —
    /// until its completion, a later one of the same queue pair, or the queue pair's reset or
    /// destruction — so the device cannot find another region under the key.
    ///
    /// The window is borrowed by the request (and by an [`OwnedSendList`](crate::OwnedSendList)
    /// it is pushed to, for the list's life). It takes the new key only when the request is
    /// posted (or its post's outcome is unknown): a request the device never sees — refused by
    /// the post, dropped, cleared from a list, forgotten — leaves the window's key as the
    /// device knows it, so a retry works. The completion is
    /// [`WcOpcode::BindMw`](crate::WcOpcode::BindMw); hand the key to a peer after it. The
    /// window is bound to the queue pair the request is posted on, which must be of the
    /// window's protection domain. A bound type 2 window cannot be bound again before it is
    /// invalidated ([`local_invalidate`](OwnedSend::local_invalidate), or a peer's
    /// SEND_WITH_INV).
    ///
    /// While the window is bound, rxe refuses to deregister the region: keep a reference to
    /// `mr` until the window is dropped, or invalidated with the invalidation's completion
    /// polled. If the request's reference is the last one when the bind completes, the region's
    /// deregistration fails there, unreported, and its memory leaks (which is safe).
    ///
    /// # Errors
    ///
    /// As [`SendRequest::bind_mw`]: [`Error::InvalidArgument`] if `mw` is not of type 2, the
    /// window and region belong to different protection domains, the region does not own its
    /// memory, the range is empty or outside the region, or the region lacks
    /// [`MW_BIND`](crate::AccessFlags::MW_BIND) or a right the window would grant.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::sync::Arc;
    ///
    /// use rdma_verbs::{AccessFlags, MwType, OwnedSend, ProtectionDomain, QueuePair, Rc, Rts};
    ///
    /// # fn f(qp: &mut QueuePair<Rc, Rts>, pd: &ProtectionDomain) -> rdma_verbs::Result<()> {
    /// let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    /// let mr = Arc::new(pd.register(8192, rights | AccessFlags::MW_BIND)?);
    /// let mut mw = pd.alloc_mw(MwType::Type2)?;
    /// let bind = OwnedSend::bind_mw(&mut mw, &mr, 0..4096, AccessFlags::REMOTE_WRITE)?.tag(1);
    /// let rkey = bind.rkey();
    /// qp.post_send_owned(bind)?;
    /// // ... reap the completion tagged 1 with `poll_each`, then send `mr.addr()`, 4096 and
    /// // `rkey` to the peer; keep `mr` until the window is dropped or invalidated.
    /// # let _ = rkey;
    /// # Ok(()) }
    /// ```
    ///
    /// # References
    ///
    /// [`ibv_post_send(3)`](https://man7.org/linux/man-pages/man3/ibv_post_send.3.html)
    pub fn bind_mw(
        mw: &'a mut MemoryWindow,
        mr: &Arc<MemoryRegion>,
        range: impl RangeBounds<usize>,
        access: AccessFlags,
    ) -> Result<Self> {
        let range = check_bind(mw, MwType::Type2, mr, range, access)?;
        let rkey = mw.preview_type2_rkey()?;
        Ok(Self::new(Kind::Bind(
            Bind {
                mw,
                rkey,
                range,
                access,
            },
            Arc::clone(mr),
        )))
    }

    /// The window's key once the bind has executed (its [`rkey`](MemoryWindow::rkey) from
    /// the moment the request is posted).
    pub fn rkey(&self) -> u32 {
        match &self.kind {
            Kind::Bind(bind, _) => bind.rkey,
            // Only `bind_mw` makes an `OwnedSend<BindOp>`.
            _ => 0,
        }
    }
}

impl<'a> OwnedSend<'a, WriteOp> {
    /// RDMA WRITE of the buffer's first `len` bytes to `remote` (the peer's memory).
    pub fn write(buf: Buf, remote: RemoteMemory) -> Self {
        Self::new(Kind::Write(Some(buf), remote))
    }

    /// RDMA WRITE of the bytes of `range` (the caller's region, zero-copy) to `remote`.
    pub fn write_range(range: RegionRange, remote: RemoteMemory) -> Self {
        Self::new(Kind::Write(None, remote)).with_range(range)
    }

    /// The bytes of `range` written after the buffer's. Refused at post on an inline request.
    pub fn and_range(self, range: RegionRange) -> Self {
        self.with_range(range)
    }

    /// RDMA WRITE of `bytes`, inline.
    pub fn write_inline(bytes: &'a [u8], remote: RemoteMemory) -> Self {
        Self::new(Kind::WriteInline(bytes, remote))
    }
}

impl<K: ImmOp> OwnedSend<'_, K> {
    /// Immediate data, delivered with the peer's receive completion (an RDMA WRITE with it also
    /// consumes a receive at the peer).
    pub fn with_imm(mut self, imm: u32) -> Self {
        self.imm = Some(imm);
        self
    }

    /// Raises a solicited event at the receiver with its receive completion
    /// (`IBV_SEND_SOLICITED`), which wakes a completion queue armed for solicited completions
    /// only ([`CompletionQueue::req_notify`](crate::CompletionQueue::req_notify)`(true)`). An
    /// RDMA WRITE without immediate data completes no receive: the flag does nothing there.
    pub fn solicited(mut self) -> Self {
        self.flags.insert(SendFlags::SOLICITED);
        self
    }
}

impl OwnedSend<'_, ReadOp> {
    /// RDMA READ of `remote` into the buffer's first `len` bytes.
    pub fn read(target: Buf, remote: RemoteMemory) -> Self {
        Self::new(Kind::Read(Some(target), remote))
    }

    /// RDMA READ of `remote` into `range`, zero-copy into the caller's region, which must be
    /// [shared](MemoryRegion::is_shared) (see [`RegionRange`]): as many bytes as the range
    /// holds.
    pub fn read_range(range: RegionRange, remote: RemoteMemory) -> Self {
        Self::new(Kind::Read(None, remote)).with_range(range)
    }

    /// Scatters the READ's bytes: the buffer's first `len` bytes, then `range`'s (of a shared
    /// region).
    pub fn and_range(self, range: RegionRange) -> Self {
        self.with_range(range)
    }
}

impl OwnedSend<'_, AtomicOp> {
    /// ATOMIC_FETCH_AND_ADD on the 8-byte word at `remote`; the old value lands in the first 8
    /// bytes of `result` (its length is set to 8), in the byte order the device writes (host
    /// order on rxe, big-endian on some devices).
    pub fn fetch_add(result: Buf, remote: RemoteMemory, add: u64) -> Self {
        Self::new(Kind::FetchAdd(result, remote, add))
    }

    /// ATOMIC_CMP_AND_SWP on the 8-byte word at `remote`: if it equals `compare`, it becomes
    /// `swap`. The old value lands in the first 8 bytes of `result` (its length is set to 8).
    pub fn compare_swap(result: Buf, remote: RemoteMemory, compare: u64, swap: u64) -> Self {
        Self::new(Kind::CompareSwap(result, remote, compare, swap))
    }
}

impl<K: Operation> fmt::Debug for OwnedSend<'_, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match &self.kind {
            Kind::Send(_) => "SEND",
            Kind::SendInline(_) => "SEND (inline)",
            Kind::Write(..) => "RDMA_WRITE",
            Kind::WriteInline(..) => "RDMA_WRITE (inline)",
            Kind::Read(..) => "RDMA_READ",
            Kind::FetchAdd(..) => "ATOMIC_FETCH_AND_ADD",
            Kind::CompareSwap(..) => "ATOMIC_CMP_AND_SWP",
            Kind::LocalInvalidate(_) => "LOCAL_INV",
            Kind::SendInvalidate(..) => "SEND_WITH_INV",
            Kind::Bind(..) => "BIND_MW",
        };
        f.debug_struct("OwnedSend")
            .field("op", &op)
            .field("tag", &self.tag)
            .field("imm", &self.imm)
            .field("flags", &self.flags)
            .field("range", &self.range)
            .finish()
    }
}

impl<'a, K: Operation> OwnedSend<'a, K> {
    /// Checks what can be checked without the queue pair, and splits the request into what the
    /// in-flight table keeps and what the work request needs.
    #[inline]
    pub(super) fn prepare(self) -> std::result::Result<Prepared<'a>, PostRefused> {
        let OwnedSend {
            kind,
            tag,
            imm,
            flags,
            dest,
            range,
            ranges_over,
            _op,
        } = self;
        let mut region = None;
        let (mut buf, build): (Option<Buf>, Build<'_>) = match kind {
            Kind::Send(buf) => (buf, Build::Send),
            Kind::SendInline(bytes) => (None, Build::SendInline(bytes)),
            Kind::Write(buf, remote) => (buf, Build::Write(remote)),
            Kind::WriteInline(bytes, remote) => (None, Build::WriteInline(bytes, remote)),
            Kind::Read(buf, remote) => (buf, Build::Read(remote)),
            Kind::FetchAdd(buf, remote, add) => (Some(buf), Build::FetchAdd(remote, add)),
            Kind::CompareSwap(buf, remote, compare, swap) => {
                (Some(buf), Build::CompareSwap(remote, compare, swap))
            }
            Kind::LocalInvalidate(rkey) => (None, Build::LocalInvalidate(rkey)),
            Kind::SendInvalidate(buf, rkey) => (buf, Build::SendInvalidate(rkey)),
            Kind::Bind(bind, mr) => {
                region = Some(mr);
                (None, Build::Bind(bind))
            }
        };
        if build.is_atomic() {
            if let Some(result) = buf.as_mut() {
                if let Err(error) = result.set_len(8) {
                    return Err(PostRefused { error, buf });
                }
            }
        }
        if range.is_some() {
            let error = if ranges_over {
                Some(range::second_range("request"))
            } else if matches!(build, Build::SendInline(_) | Build::WriteInline(..)) {
                Some(Error::invalid(
                    "an inline request cannot carry a region range",
                ))
            } else if dest.is_some() {
                Some(Error::invalid(
                    "a UD send cannot carry a region range (send it from a buffer)",
                ))
            } else {
                None
            };
            if let Some(error) = error {
                return Err(PostRefused { error, buf });
            }
        }
        let sges = OwnedSges::new(buf.as_ref().map(|b| b.raw_slice(false)), range.as_ref());
        if let Some(range) = range {
            // Binds carry no range (`and_range` is not theirs).
            region = Some(range.into_region());
        }
        // The device moves as many bytes as the local side names, whatever the remote
        // memory's length: a READ or WRITE longer than it would reach past it.
        let remote_op = match build {
            Build::Read(remote) => Some(("a read of", sges.bytes(), "from", remote)),
            Build::Write(remote) => Some(("a write of", sges.bytes(), "to", remote)),
            Build::WriteInline(bytes, remote) => {
                Some(("a write of", bytes.len() as u64, "to", remote))
            }
            _ => None,
        };
        if let Some((what, bytes, direction, remote)) = remote_op {
            if bytes > u64::from(remote.len) {
                let error = Error::InvalidArgument(format!(
                    "{what} {bytes} bytes {direction} {} bytes of remote memory",
                    remote.len
                ));
                return Err(PostRefused { error, buf });
            }
        }
        Ok(Prepared {
            buf,
            sges,
            build,
            region,
            tag,
            imm,
            flags,
            dest,
        })
    }

    /// The buffer the request carries, if any: for a request that will not be posted.
    pub fn into_buf(self) -> Option<Buf> {
        match self.kind {
            Kind::Send(buf) | Kind::Write(buf, _) | Kind::Read(buf, _) => buf,
            Kind::SendInline(_)
            | Kind::WriteInline(..)
            | Kind::LocalInvalidate(_)
            | Kind::Bind(..) => None,
            Kind::SendInvalidate(buf, _) => buf,
            Kind::FetchAdd(buf, ..) | Kind::CompareSwap(buf, ..) => Some(buf),
        }
    }
}

/// An owned send request checked and split for posting: the buffer (which moves into the
/// in-flight table when posted, and comes back if the post is refused), the range of its
/// bytes the work request names, and the rest of the request.
pub(crate) struct Prepared<'a> {
    pub(crate) buf: Option<Buf>,
    /// The buffer's bytes and the range's, as the work request names them.
    sges: OwnedSges,
    build: Build<'a>,
    /// The region a bind ([`Build::Bind`]) names, or the region of the caller's range the
    /// request names after the buffer: its in-flight entry keeps it registered.
    region: Option<Arc<MemoryRegion>>,
    pub(crate) tag: u64,
    imm: Option<u32>,
    flags: SendFlags,
    dest: Option<(AddressHandle, u32, u32)>,
}

impl Prepared<'_> {
    /// Whether the caller asked for a completion.
    #[inline]
    pub(crate) fn asks_signal(&self) -> bool {
        self.flags.contains(SendFlags::SIGNALED)
    }

    /// Makes the request name no memory (see `list.rs`).
    pub(crate) fn disarm(&mut self) {
        self.sges.clear();
    }

    /// Marks the request as one the provider may have taken (posted, or its post's outcome
    /// unknown): a bind's window takes the bind's key, and is returned for the queue pair to
    /// record (`QueuePair::keep_window`).
    #[inline]
    pub(crate) fn hand_over(&mut self) -> Option<Arc<MwShared>> {
        if let Build::Bind(bind) = &mut self.build {
            bind.mw.commit_rkey(bind.rkey);
            return Some(bind.mw.shared().clone());
        }
        None
    }

    /// The window of a bind.
    #[inline]
    pub(crate) fn window(&self) -> Option<&Arc<MwShared>> {
        match &self.build {
            Build::Bind(bind) => Some(bind.mw.shared()),
            _ => None,
        }
    }

    /// What the in-flight entry keeps alive besides the buffer: the region of a bind or a
    /// range (a reference of its own, so that the request can be taken back whole), or a UD
    /// destination's handle (a UD send carries no range, and no bind).
    #[inline]
    pub(crate) fn keep(&self) -> Option<Arc<dyn Send + Sync>> {
        if let Some(region) = &self.region {
            return Some(region.clone());
        }
        self.dest.as_ref().map(|(ah, _, _)| ah.keep_alive())
    }

    /// Checks the range's region (if any) against protection domain `pd`, and that the device
    /// may write it if the operation writes (a READ).
    #[inline]
    pub(crate) fn check_range(&self, pd: *mut crate::ffi::ibv_pd) -> Result<()> {
        match (&self.region, &self.build) {
            (Some(_), Build::Bind(_)) | (None, _) => Ok(()),
            (Some(region), build) => check_region(region, pd, !build.device_only_reads()),
        }
    }

    /// Refuses, without the queue pair, a device write into a range of a region that is not
    /// shared (the protection domain is checked at post).
    pub(crate) fn check_sharing(&self) -> Result<()> {
        match (&self.region, &self.build) {
            (Some(region), build)
                if !matches!(build, Build::Bind(_))
                    && !build.device_only_reads()
                    && !region.is_shared() =>
            {
                Err(range::not_shared())
            }
            _ => Ok(()),
        }
    }

    /// The work request, with owned id `id`, signaled whatever the caller asked if `signal`:
    /// for the request that took the in-flight table's last free slot, and one the safe paths'
    /// run of unsignaled sends forces (`QueuePair::next_unsignaled`). Unsignaled requests are
    /// released only by a later completion, and with the queue full of them none could come.
    #[inline]
    pub(crate) fn request(&self, id: u64, signal: bool) -> SendWr<'_> {
        let mut request = self
            .build
            .request(self.sges.payload(), &self.region)
            .owned(id);
        if let Some((ah, remote_qpn, remote_qkey)) = &self.dest {
            request = request.to(ah, *remote_qpn, *remote_qkey);
        }
        if let Some(imm) = self.imm {
            request = request.with_imm(imm);
        }
        let flags = if signal {
            self.flags | SendFlags::SIGNALED
        } else {
            self.flags
        };
        request.set_flags(flags)
    }
}

impl fmt::Debug for Prepared<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prepared")
            .field("buf", &self.buf)
            .field("tag", &self.tag)
            .finish_non_exhaustive()
    }
}

impl<T: Transport> QueuePair<T, Rts> {
    /// Posts an owned send request: its buffer moves into the queue pair until the request's
    /// completion (or a later one of this queue pair, for an unsignaled request) hands it back
    /// through [`CompletionQueue::poll_each`](crate::CompletionQueue::poll_each) on the send
    /// completion queue. Allocates nothing, except that a bind's window is recorded by the
    /// queue pair (see [`MemoryWindow`]), which may grow its record.
    ///
    /// An [`unsignaled`](OwnedSend::unsignaled) request is signaled whatever it asked when it
    /// takes the send table's last free slot, or when it would make `max_send_wr` unsignaled
    /// sends of this queue pair in a row (owned, slot and ring sends counted together), so
    /// that a completion always comes to release them.
    ///
    /// A UD queue pair needs a destination ([`OwnedSend::to`]); its address handle stays
    /// alive until the request completes. To post several requests with one doorbell, use
    /// [`post_send_list`](Self::post_send_list).
    ///
    /// # Errors
    ///
    /// [`PostRefused`], with the buffer when the device never saw it:
    /// [`Error::InvalidArgument`] for an operation the transport does not allow (a bind on
    /// UD), immediate data where it cannot go, an atomic whose buffer holds fewer than 8
    /// bytes, a READ or WRITE longer than its remote memory, a buffer, range, address handle
    /// or memory window of another protection domain, a READ into a range of a region that
    /// is not shared, or a range on an inline request, on a UD send, or given twice;
    /// [`Error::QueueFull`] when as many requests are in flight as the send queue holds; else
    /// as [`post_send_one`](Self::post_send_one).
    // Inlined at every call site, where the kind of request is known, so that the compiler
    // folds the dispatch on it (docs/benchmarks.md, "What inlining bought": 579 to 445
    // instructions per post in the benchmark).
    #[inline(always)]
    pub fn post_send_owned<K: Operation>(
        &mut self,
        request: OwnedSend<'_, K>,
    ) -> std::result::Result<(), PostRefused> {
        let mut prepared = request.prepare()?;
        let pd = self.pd().as_raw();
        if let Err(error) =
            check_pd(prepared.buf.as_ref(), pd).and_then(|()| prepared.check_range(pd))
        {
            return Err(PostRefused {
                error,
                buf: prepared.buf,
            });
        }
        // A bind holds its window's lock from the check that the window is allocated until the
        // post verb returns, so that no queue pair's destruction deallocates it meanwhile
        // (`mw.rs`).
        let window = if K::BIND {
            prepared.window().cloned()
        } else {
            None
        };
        let guard = match window.as_deref().map(MwShared::lock_for_post).transpose() {
            Ok(guard) => guard,
            Err(error) => {
                return Err(PostRefused {
                    error,
                    buf: prepared.buf,
                });
            }
        };
        let keep = prepared.keep();
        let buf = prepared.buf.take();
        let asked = prepared.asks_signal();
        // Built before the record, whose atomic stores would make the compiler reload the
        // prepared request from memory and dispatch on its kind again; the id and the last
        // slot's signal are set after it.
        let request = prepared.request(0, false);
        let result = post_owned(
            self,
            |qp: &Self| -> &Ring { &qp.tables().send },
            prepared.tag,
            buf,
            keep,
            |qp, id, last_slot| {
                let request = request.owned(id);
                // Signaled as asked, when it takes the table's last slot, and after
                // `max_send_wr - 1` unsignaled sends of the safe paths in a row.
                let run = qp.next_unsignaled(asked || last_slot, qp.caps().max_send_wr);
                let request = if run == 0 {
                    request.add_flags(SendFlags::SIGNALED)
                } else {
                    request
                };
                // SAFETY: the request names the buffer's bytes and a range's (`sges`), or inline
                // bytes copied during the call, or none. The buffer was moved into the send table
                // before this post, with a reference to the range's region, and they leave it
                // only with this request's completion (or a later one of this queue, which
                // completes in order), with the queue pair's reset or destruction, or if this
                // post fails without the device having seen it; the buffer holds its region
                // registered meanwhile, and no Rust code can reach its bytes. The range's region
                // stays registered, and Rust reaches it only through `&` (`Arc`): reads, which
                // a device read does not race, and for a READ into it (`check_range`) only
                // atomic ones, as the region is shared. `remote` is the peer's memory. The
                // request's id has `OWNED_ID_BIT`, which no other post may use, so no other
                // completion can release the buffer.
                let result = unsafe { qp.post_send_wr(&request) };
                qp.count_unsignaled(run, &result);
                result
            },
        );
        drop(guard);
        // The provider may have the request: a bind keeps the window's new key.
        if K::BIND
            && result
                .as_ref()
                .map_or_else(|refused| may_have_posted(&refused.error), |()| true)
        {
            if let Some(window) = prepared.hand_over() {
                self.keep_window(window);
            }
        }
        result
    }
}

/// The [`SendRequest`] constructor an owned request maps to.
enum Build<'a> {
    Send,
    SendInline(&'a [u8]),
    Write(RemoteMemory),
    WriteInline(&'a [u8], RemoteMemory),
    Read(RemoteMemory),
    FetchAdd(RemoteMemory, u64),
    CompareSwap(RemoteMemory, u64, u64),
    LocalInvalidate(u32),
    SendInvalidate(u32),
    /// The region is `Prepared::region`.
    Bind(Bind<'a>),
}

impl<'a> Build<'a> {
    #[inline]
    fn is_atomic(&self) -> bool {
        matches!(self, Build::FetchAdd(..) | Build::CompareSwap(..))
    }

    /// Whether the device only reads the request's local memory (SEND, WRITE): any other
    /// operation is taken to write it, so that a range on a new operation is checked as a
    /// write unless it is listed here.
    #[inline]
    fn device_only_reads(&self) -> bool {
        matches!(
            self,
            Build::Send | Build::Write(_) | Build::SendInvalidate(_)
        )
    }

    /// The request, with `payload` (the buffer's slice, or none) and a placeholder id.
    #[inline]
    fn request<'s>(
        &'s self,
        payload: Payload<'s>,
        region: &'s Option<Arc<MemoryRegion>>,
    ) -> SendWr<'s> {
        match *self {
            Build::Send => SendRequest::send(payload).into_wr(),
            Build::SendInline(bytes) => SendRequest::send(Payload::Inline(bytes)).into_wr(),
            Build::Write(remote) => SendRequest::write(payload, remote).into_wr(),
            Build::WriteInline(bytes, remote) => {
                SendRequest::write(Payload::Inline(bytes), remote).into_wr()
            }
            Build::Read(remote) => SendRequest::read(payload, remote).into_wr(),
            Build::FetchAdd(remote, add) => match payload {
                Payload::Slice(slice) => SendRequest::fetch_add(slice, remote, add).into_wr(),
                // No buffer: refused by the atomic check when posted.
                other => SendRequest::send(other).into_wr(),
            },
            Build::CompareSwap(remote, compare, swap) => match payload {
                Payload::Slice(slice) => {
                    SendRequest::compare_swap(slice, remote, compare, swap).into_wr()
                }
                other => SendRequest::send(other).into_wr(),
            },
            Build::LocalInvalidate(rkey) => SendRequest::local_invalidate(rkey).into_wr(),
            Build::SendInvalidate(rkey) => {
                SendRequest::send_with_invalidate(payload, rkey).into_wr()
            }
            Build::Bind(ref bind) => match region {
                Some(mr) => SendWr::bind_checked(bind.mw, bind.rkey, mr, bind.range, bind.access),
                // Cannot happen (`prepare` sets both). Were it to, a request naming no memory
                // that fails loudly on the device (key 0 is no window's) rather than one that
                // silently does something.
                None => SendRequest::local_invalidate(0).into_wr(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi;

    /// The raw `send_flags` an owned request's work request carries.
    fn raw_flags<K: Operation>(request: OwnedSend<'_, K>, last_slot: bool) -> u32 {
        let prepared = request.prepare().expect("prepared");
        let mut raw = ffi::ibv_send_wr::default();
        let mut one = ffi::ibv_sge::default();
        prepared
            .request(7, last_slot)
            .fill(&mut raw, &mut one)
            .expect("filled");
        raw.send_flags
    }

    /// Signaled by default; `unsignaled`, `solicited` and `fenced` reach the work request; the
    /// request that takes a queue's last slot is signaled whatever it asked.
    #[test]
    fn owned_send_flags_reach_the_work_request() {
        let (signaled, solicited, fence) = (
            ffi::IBV_SEND_SIGNALED,
            ffi::IBV_SEND_SOLICITED,
            ffi::IBV_SEND_FENCE,
        );
        assert_eq!(raw_flags(OwnedSend::send_empty(), false), signaled);
        assert_eq!(raw_flags(OwnedSend::send_empty().unsignaled(), false), 0);
        assert_eq!(
            raw_flags(OwnedSend::send_empty().unsignaled(), true),
            signaled
        );
        assert_eq!(
            raw_flags(OwnedSend::send_empty().with_imm(1).solicited(), false),
            signaled | solicited
        );
        assert_eq!(
            raw_flags(OwnedSend::send_empty().fenced().unsignaled(), false),
            fence
        );
        assert_eq!(
            raw_flags(OwnedSend::local_invalidate(9).fenced(), false),
            signaled | fence
        );
        assert_eq!(
            raw_flags(OwnedSend::local_invalidate(9).solicited(), false),
            signaled | solicited
        );
    }
}
