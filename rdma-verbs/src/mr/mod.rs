//! Memory regions: registered memory the HCA may access.
//!
//! - here: [`MemoryRegion`], its registration (`ibv_reg_mr`), its bytes and deregistration;
//! - `slice.rs`: [`MrSlice`] and [`MrSliceMut`], its byte ranges for the `unsafe` posts;
//! - `remote.rs`: [`RemoteMemory`], a peer's memory as it advertises it;
//! - `device.rs`: [`DeviceRegion`], memory the CPU does not reach through the registration: a
//!   dmabuf another driver exports (GPU memory, `ibv_reg_dmabuf_mr`) or the device's own memory
//!   (`ibv_reg_dm_mr`).

use std::alloc::Layout;
use std::fmt;
use std::ops::{Bound, RangeBounds};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Errno, Error, Result};
use crate::ffi;
use crate::pd::ProtectionDomain;
use crate::shared::{copy_from_shared, copy_to_shared};

mod device;
mod null;
mod remote;
mod slice;

pub use crate::flags::AccessFlags;
pub use device::DeviceRegion;
pub use null::NullRegion;
pub use remote::RemoteMemory;
pub use slice::{MrSlice, MrSliceMut};

/// Alignment of the buffers [`ProtectionDomain::register`] allocates: a page, so that regions
/// never share pages with other allocations.
const BUFFER_ALIGN: usize = 4096;

enum Storage {
    /// A zeroed, page-aligned buffer the region allocated and frees after deregistration.
    Owned(Layout),
    /// Memory the caller registered with [`ProtectionDomain::register_raw`].
    External,
}

/// A registration (`struct ibv_mr`), deregistered at most once: what every region type holds.
pub(crate) struct Registration {
    raw: NonNull<ffi::ibv_mr>,
    /// Set once `ibv_dereg_mr` succeeded.
    deregistered: bool,
}

impl Registration {
    /// A registration the provider just returned.
    fn new(raw: NonNull<ffi::ibv_mr>) -> Self {
        Self {
            raw,
            deregistered: false,
        }
    }

    fn as_ptr(&self) -> *mut ffi::ibv_mr {
        self.raw.as_ptr()
    }

    fn lkey(&self) -> u32 {
        // SAFETY: live registration (deregistration happens only when its owner ends).
        unsafe { (*self.raw.as_ptr()).lkey }
    }

    fn rkey(&self) -> u32 {
        // SAFETY: as in `lkey`.
        unsafe { (*self.raw.as_ptr()).rkey }
    }

    /// `ibv_dereg_mr`, once: later calls after a success do nothing.
    fn deregister(&mut self) -> Result<()> {
        if self.deregistered {
            return Ok(());
        }
        // SAFETY: the registration is live (not yet deregistered) and deregistered once; its
        // owner frees any memory behind it only after this succeeds.
        let ret = unsafe { ffi::ibv_dereg_mr(self.raw.as_ptr()) };
        Errno::result(ret).map_err(|errno| Error::verb("ibv_dereg_mr", errno))?;
        self.deregistered = true;
        Ok(())
    }
}

/// A registered memory region (`struct ibv_mr`).
///
/// Made by [`ProtectionDomain::register`], which allocates the buffer and frees it only after
/// deregistration, or by the `unsafe` [`ProtectionDomain::register_raw`] over caller memory.
///
/// The region is not `Clone`: it is the single owner of its registration. It keeps its
/// protection domain alive. `Send` and `Sync`: the bytes are reached through `&self` only for
/// reading, and then only when no peer may write them.
///
/// # Access to the bytes
///
/// - A region without remote write or atomic rights is read and written through
///   [`as_slice`](Self::as_slice) and [`as_mut_slice`](Self::as_mut_slice).
/// - A region a peer may write ([`AccessFlags::remotely_writable`]) could change under any Rust
///   reference, so it hands none out: [`read_at`](Self::read_at) and
///   [`write_at`](Self::write_at) copy through raw pointers instead, with atomic loads and
///   stores. So does a region made [`into_shared`](Self::into_shared), which owned receives and
///   RDMA READs ([`RegionRange`](crate::owned::RegionRange)) may write while Rust holds it shared.
/// - Memory a posted work request uses must not be touched until the request completes; the
///   `unsafe` post functions make that the caller's promise.
pub struct MemoryRegion {
    reg: Registration,
    addr: NonNull<u8>,
    len: usize,
    access: AccessFlags,
    /// Rust reaches the bytes only through atomic copies ([`MemoryRegion::into_shared`]).
    shared: bool,
    storage: Storage,
    pd: ProtectionDomain,
}

// SAFETY: the registration handle may be used and destroyed from any thread; the buffer is owned
// by the region (or, for register_raw, promised to outlive it) and only reached through &self /
// &mut self borrows.
unsafe impl Send for MemoryRegion {}
// SAFETY: shared access hands out `&[u8]` only for regions no peer can write; everything else
// copies.
unsafe impl Sync for MemoryRegion {}

impl ProtectionDomain {
    /// `ibv_reg_mr`: allocates a zeroed, page-aligned buffer of `len` bytes and registers it.
    ///
    /// The region owns the buffer and frees it after deregistering.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`] for `len == 0`, or remote write / atomic rights without
    ///   `LOCAL_WRITE` (verbs would refuse them with `EINVAL`);
    /// - [`Error::Verb`] with the errno of `ibv_reg_mr` (for example `ENOMEM` past the memlock
    ///   limit).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use rdma_verbs::{Context, mr::AccessFlags};
    ///
    /// let context = Context::open("rxe0")?;
    /// let pd = context.alloc_pd()?;
    /// let mut mr = pd.register(4096, AccessFlags::LOCAL_WRITE)?;
    /// mr.as_mut_slice()?[..5].copy_from_slice(b"hello");
    /// # Ok::<(), rdma_verbs::Error>(())
    /// ```
    ///
    /// # References
    ///
    /// [`ibv_reg_mr(3)`](https://man7.org/linux/man-pages/man3/ibv_reg_mr.3.html)
    #[doc(alias = "ibv_reg_mr")]
    pub fn register(&self, len: usize, access: AccessFlags) -> Result<MemoryRegion> {
        check_access(access)?;
        if len == 0 {
            return Err(Error::InvalidArgument(
                "a memory region needs at least one byte".into(),
            ));
        }
        let layout = Layout::from_size_align(len, BUFFER_ALIGN)
            .map_err(|_| Error::InvalidArgument(format!("{len} bytes is too large")))?;
        // SAFETY: the layout has a non-zero size.
        let addr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| Error::verb("alloc_zeroed", crate::Errno::NOMEM))?;
        // SAFETY: `addr` is a fresh allocation of `len` bytes, owned by the region built here.
        match unsafe { self.reg_mr(addr, len, access, Storage::Owned(layout)) } {
            Ok(mr) => Ok(mr),
            Err(error) => {
                // SAFETY: allocated above with `layout`, never registered.
                unsafe { std::alloc::dealloc(addr.as_ptr(), layout) };
                Err(error)
            }
        }
    }

    /// `ibv_reg_mr`: registers `len` bytes of caller memory at `addr`.
    ///
    /// # Safety
    ///
    /// - `addr..addr+len` is valid for reads (and, with any write right, for writes) until the
    ///   registration ends, and is not freed or unmapped before: the registration ends when
    ///   [`close`](MemoryRegion::close) returns `Ok`, or when a drop's `ibv_dereg_mr` succeeds,
    ///   which a drop cannot report (if it fails the memory stays registered, and a peer with
    ///   the key can still write it). To free the memory, close the region and free it only
    ///   after `Ok`;
    /// - while the region lives, Rust code does not hold references into that memory that the
    ///   HCA could write behind (a receive, an RDMA read result, or a peer's write or atomic):
    ///   access it through the region's methods or raw pointers.
    ///
    /// # Errors
    ///
    /// As [`register`](Self::register).
    ///
    /// # References
    ///
    /// [`ibv_reg_mr(3)`](https://man7.org/linux/man-pages/man3/ibv_reg_mr.3.html)
    #[doc(alias = "ibv_reg_mr")]
    pub unsafe fn register_raw(
        &self,
        addr: NonNull<u8>,
        len: usize,
        access: AccessFlags,
    ) -> Result<MemoryRegion> {
        check_access(access)?;
        // SAFETY: forwarded caller contract.
        unsafe { self.reg_mr(addr, len, access, Storage::External) }
    }

    /// # Safety
    ///
    /// `addr..addr+len` is valid as [`register_raw`](Self::register_raw) requires.
    unsafe fn reg_mr(
        &self,
        addr: NonNull<u8>,
        len: usize,
        access: AccessFlags,
        storage: Storage,
    ) -> Result<MemoryRegion> {
        let bits = access.bits();
        // SAFETY: live PD; the memory is valid per the caller. Optional access bits need the
        // iova2 entry point, exactly as the C `ibv_reg_mr` macro chooses.
        let raw = unsafe {
            if bits & ffi::IBV_ACCESS_OPTIONAL_RANGE == 0 {
                ffi::ibv_reg_mr(self.as_raw(), addr.as_ptr().cast(), len, bits as i32)
            } else {
                ffi::ibv_reg_mr_iova2(
                    self.as_raw(),
                    addr.as_ptr().cast(),
                    len,
                    addr.as_ptr() as u64,
                    bits,
                )
            }
        };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_reg_mr"))?;
        Ok(MemoryRegion {
            reg: Registration::new(raw),
            addr,
            len,
            access,
            shared: false,
            storage,
            pd: self.clone(),
        })
    }
}

pub(super) fn check_access(access: AccessFlags) -> Result<()> {
    if access.remotely_writable() && !access.contains(AccessFlags::LOCAL_WRITE) {
        return Err(Error::InvalidArgument(
            "remote write and remote atomic access need LOCAL_WRITE too".into(),
        ));
    }
    Ok(())
}

impl MemoryRegion {
    /// The local key, used in scatter/gather entries.
    pub fn lkey(&self) -> u32 {
        self.reg.lkey()
    }

    /// The remote key, which a peer needs for RDMA reads, writes and atomics.
    pub fn rkey(&self) -> u32 {
        self.reg.rkey()
    }

    /// The address of the first byte (also the address peers use: regions here are not
    /// zero-based).
    pub fn addr(&self) -> u64 {
        self.addr.as_ptr() as u64
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty (never true for a registered region).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The access rights it was registered with.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// Makes the region *shared*: from now on Rust reads and writes its bytes only with atomic
    /// copies ([`read_at`](Self::read_at), [`write_at`](Self::write_at),
    /// [`load_u64`](Self::load_u64)); [`as_slice`](Self::as_slice) and
    /// [`as_mut_slice`](Self::as_mut_slice) refuse. That is what lets the device write ranges
    /// of it while Rust still holds it: an owned receive or RDMA READ into a
    /// [`RegionRange`](crate::owned::RegionRange) needs a shared region (or a remotely writable one,
    /// which is shared already). Taking the region by value, it knows no reference into its
    /// bytes is alive.
    ///
    /// A region without [`LOCAL_WRITE`](AccessFlags::LOCAL_WRITE) is returned as it was: the
    /// device cannot write it, and atomic loads need writable memory.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # use rdma_verbs::{*, ah::*, async_event::*, channel::*, cq::*, device::*, mr::*, mw::*, owned::*, qp::*, scope::*, slot::*, srq::*, wr::*, xrcd::*, ah::*, async_event::*, channel::*, cq::*, device::*, mr::*, mw::*, owned::*, qp::*, scope::*, slot::*, srq::*, wr::*, xrcd::*};
    /// # fn f(pd: &ProtectionDomain) -> Result<()> {
    /// let frames = Arc::new(pd.register(1 << 20, AccessFlags::LOCAL_WRITE)?.into_shared());
    /// assert!(frames.is_shared());
    /// // Receives may now land in ranges of `frames` (see `RegionRange`).
    /// let range = RegionRange::new(&frames, 4096..8192)?;
    /// # drop(range); Ok(()) }
    /// ```
    #[must_use = "the shared region is returned"]
    pub fn into_shared(mut self) -> Self {
        if self.access.contains(AccessFlags::LOCAL_WRITE) {
            self.shared = true;
        }
        self
    }

    /// Whether Rust reaches the region's bytes only through atomic copies: it grants remote
    /// write or atomic access, or was made [`into_shared`](Self::into_shared).
    #[inline]
    pub fn is_shared(&self) -> bool {
        self.shared || self.access.remotely_writable()
    }

    /// Whether the region owns its memory ([`register`](ProtectionDomain::register)), as
    /// opposed to memory the caller promised ([`register_raw`](ProtectionDomain::register_raw)).
    pub(crate) fn owns_memory(&self) -> bool {
        matches!(self.storage, Storage::Owned(_))
    }

    /// The protection domain it belongs to.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The raw `ibv_mr`, valid while the region lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_mr {
        self.reg.as_ptr()
    }

    /// A raw pointer to the first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr.as_ptr()
    }

    /// The bytes, for a region nothing may write behind Rust's back.
    ///
    /// # Errors
    ///
    /// [`Error::RemotelyWritable`] if the region grants remote write or atomic access, or is
    /// [shared](Self::is_shared).
    pub fn as_slice(&self) -> Result<&[u8]> {
        if self.is_shared() {
            return Err(Error::RemotelyWritable);
        }
        // SAFETY: the region owns (or was promised) `len` valid bytes, and no peer may write
        // them; local HCA writes happen only for posted requests, whose buffers the post
        // contract keeps untouched.
        Ok(unsafe { std::slice::from_raw_parts(self.addr.as_ptr(), self.len) })
    }

    /// The bytes, mutably, for a region nothing may write behind Rust's back.
    ///
    /// # Errors
    ///
    /// [`Error::RemotelyWritable`] if the region grants remote write or atomic access, or is
    /// [shared](Self::is_shared).
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8]> {
        if self.is_shared() {
            return Err(Error::RemotelyWritable);
        }
        // SAFETY: as `as_slice`, and `&mut self` makes the borrow unique.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.addr.as_ptr(), self.len) })
    }

    /// Copies `out.len()` bytes starting at `offset` into `out`, without forming a reference to
    /// the region's memory.
    ///
    /// In a [shared](Self::is_shared) region (remotely writable, or made
    /// [`into_shared`](Self::into_shared)) a peer or an owned request may write these bytes
    /// while they are copied, which a plain copy would make a data race: the copy is made of
    /// relaxed atomic loads instead (`AtomicU8` up to the first 8-byte boundary and after the
    /// last one, `AtomicU64` for the aligned words between), so a concurrent write yields some
    /// mix of old and new bytes, never undefined behaviour. Other regions (nothing writes them
    /// behind Rust: the `unsafe` post contract keeps local device writes away from reads) are
    /// copied with a plain `memcpy`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the range is outside the region.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range(offset, out.len())?;
        let src = self.addr.as_ptr().wrapping_add(offset);
        // SAFETY: the range is inside the region. A shared region has LOCAL_WRITE (checked at
        // registration for remote rights, by `into_shared` otherwise), so its memory is valid
        // for writes as atomic loads need, and Rust reaches it only through atomics (`read_at`,
        // `write_at`, `load_u64`; `as_slice` refuses); any other region has no concurrent
        // writer (see above). `out` is a distinct Rust buffer.
        unsafe { copy_out(self.is_shared(), src, out) };
        Ok(())
    }

    /// Copies `data` into the region at `offset`, without forming a reference to the region's
    /// memory. In a [shared](Self::is_shared) region the copy is made of relaxed atomic stores, as
    /// [`read_at`](Self::read_at) describes for loads (a peer may write the same bytes
    /// meanwhile: which write lands last is up to the timing).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the range is outside the region.
    pub fn write_at(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len())?;
        let dst = self.addr.as_ptr().wrapping_add(offset);
        // SAFETY: as in `read_at`.
        unsafe { copy_in(self.is_shared(), data, dst) };
        Ok(())
    }

    /// Reads the naturally aligned 8-byte word at `offset` in one atomic load, as a peer's RDMA
    /// atomic leaves it, in host order. That is the order rxe operates on; a device that treats
    /// atomic operands as big-endian leaves the word in that order (see
    /// [`SendRequest::compare_swap`](crate::wr::SendRequest::compare_swap)).
    ///
    /// An atomic load needs memory that is valid for writes, so the region must have
    /// [`LOCAL_WRITE`](AccessFlags::LOCAL_WRITE) (every region a peer can write has it). A
    /// region without it cannot change while Rust reads it: use [`read_at`](Self::read_at) or
    /// [`as_slice`](Self::as_slice).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the region lacks `LOCAL_WRITE`, or the word is outside the
    /// region or not 8-byte aligned.
    pub fn load_u64(&self, offset: usize) -> Result<u64> {
        if !self.access.contains(AccessFlags::LOCAL_WRITE) {
            return Err(Error::InvalidArgument(
                "load_u64 needs a region with LOCAL_WRITE (atomic loads need writable memory): \
                 use read_at"
                    .into(),
            ));
        }
        self.check_range(offset, 8)?;
        let ptr = self.addr.as_ptr().wrapping_add(offset);
        if ptr.addr() % 8 != 0 {
            return Err(Error::InvalidArgument(format!(
                "offset {offset} is not 8-byte aligned"
            )));
        }
        // SAFETY: in bounds, aligned, valid for writes (LOCAL_WRITE, checked above), and only
        // accessed atomically or by the device while shared.
        Ok(unsafe { load_word(ptr) })
    }

    /// The bytes `range` of the region, for use in a scatter/gather entry.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the range is outside the region or longer than 4 GiB - 1
    /// (an SGE length is 32 bits).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<MrSlice<'_>> {
        let (start, length) = sge_range(range, self.len)?;
        Ok(MrSlice {
            addr: self.addr() + start as u64,
            length,
            lkey: self.lkey(),
            _region: std::marker::PhantomData,
        })
    }

    /// The bytes `range` of the region, borrowed exclusively: while the returned slice lives,
    /// Rust code cannot read or write the region, so the device may write these bytes (a
    /// receive, an RDMA read result, an atomic's old value) through the safe
    /// [`PostScope`](crate::scope::PostScope).
    ///
    /// # Errors
    ///
    /// As [`slice`](Self::slice).
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<MrSliceMut<'_>> {
        let slice = self.slice(range)?;
        Ok(MrSliceMut {
            addr: slice.addr,
            length: slice.length,
            lkey: slice.lkey,
            _region: std::marker::PhantomData,
        })
    }

    /// Splits the region into disjoint exclusive slices of `chunk` bytes (the last may be
    /// shorter), for example one per posted receive.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `chunk` is 0 or above 4 GiB - 1.
    pub fn chunks_mut(&mut self, chunk: usize) -> Result<Vec<MrSliceMut<'_>>> {
        if chunk == 0 || u32::try_from(chunk).is_err() {
            return Err(Error::InvalidArgument(format!("bad chunk size {chunk}")));
        }
        let lkey = self.lkey();
        let base = self.addr();
        Ok((0..self.len)
            .step_by(chunk)
            .map(|start| MrSliceMut {
                addr: base + start as u64,
                length: chunk.min(self.len - start) as u32,
                lkey,
                _region: std::marker::PhantomData,
            })
            .collect())
    }

    /// The address, length and rkey of bytes `range`, to hand to a peer for RDMA reads, writes
    /// or atomics into this region.
    ///
    /// # Errors
    ///
    /// As [`slice`](Self::slice).
    pub fn remote(&self, range: impl RangeBounds<usize>) -> Result<RemoteMemory> {
        let slice = self.slice(range)?;
        Ok(RemoteMemory {
            addr: slice.addr,
            len: slice.length,
            rkey: self.rkey(),
        })
    }

    #[inline]
    fn check_range(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(outside_region(offset, len, self.len)),
        }
    }
}

/// `range`'s start and end (exclusive) in a region of `len` bytes, unchecked: an unbounded end
/// is `len`, and inclusive or exclusive bounds saturate rather than overflow.
#[inline]
pub(crate) fn range_bounds(range: impl RangeBounds<usize>, len: usize) -> (usize, usize) {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    (start, end)
}

/// `range` of a region of `len` bytes as a scatter/gather entry's start and length: not
/// reversed, inside the region, at most 4 GiB - 1 (an SGE length is 32 bits).
#[inline]
pub(crate) fn sge_range(range: impl RangeBounds<usize>, len: usize) -> Result<(usize, u32)> {
    let (start, end) = range_bounds(range, len);
    if start > end {
        return Err(reversed_range(start, end));
    }
    if end > len {
        return Err(outside_region(start, end - start, len));
    }
    let Ok(length) = u32::try_from(end - start) else {
        return Err(Error::invalid(
            "a scatter/gather entry is at most 4 GiB - 1",
        ));
    };
    Ok((start, length))
}

// The errors of `slice` and `check_range`, built out of line so that the checks inline into
// the caller as compares and branches.

#[cold]
#[inline(never)]
fn reversed_range(start: usize, end: usize) -> Error {
    Error::InvalidArgument(format!("range {start}..{end} is reversed"))
}

#[cold]
#[inline(never)]
fn outside_region(offset: usize, len: usize, region: usize) -> Error {
    Error::InvalidArgument(format!(
        "bytes {offset}..{} are outside the {region}-byte region",
        offset.saturating_add(len)
    ))
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .field("access", &self.access)
            .finish()
    }
}

/// Advice for [`MemoryRegion::advise`] (`enum ibv_advise_mr_advice`): what the device should
/// fault in ahead of use, for a region registered with [`AccessFlags::ON_DEMAND`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Advice {
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH`: map the pages for reading.
    Prefetch,
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE`: map the pages for writing.
    PrefetchWrite,
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT`: map the pages already present, faulting none.
    PrefetchNoFault,
}

impl Advice {
    fn as_raw(self) -> ffi::ib_uverbs_advise_mr_advice {
        match self {
            Self::Prefetch => ffi::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH,
            Self::PrefetchWrite => ffi::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE,
            Self::PrefetchNoFault => ffi::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT,
        }
    }
}

impl MemoryRegion {
    /// `ibv_rereg_mr` with `IBV_REREG_MR_CHANGE_ACCESS`: changes the region's access rights
    /// in place (same memory, same protection domain). The keys may change: read
    /// [`lkey`](Self::lkey) and [`rkey`](Self::rkey) again, and hand peers a new
    /// [`remote`](Self::remote).
    ///
    /// Taking `&mut self`, no reference into the bytes is alive across the change. A region
    /// that was remotely writable stays [shared](Self::is_shared) after losing the right: a
    /// peer's write already on the wire may still land.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`], the region unchanged, for remote write or atomic rights
    ///   without [`LOCAL_WRITE`](AccessFlags::LOCAL_WRITE), and for a region over caller memory
    ///   ([`register_raw`](ProtectionDomain::register_raw)) gaining a write right it was not
    ///   registered with (the caller promised memory fit for those rights only).
    /// - [`Error::Unsupported`] where the provider cannot re-register (Soft-RoCE): the region
    ///   is unchanged.
    /// - [`Error::Verb`] with `ibv_rereg_mr` and its errno. Where the provider's command
    ///   failed, the region may be unusable by the device until dropped, and is treated as
    ///   granting both the old and the new rights.
    ///
    /// # References
    ///
    /// [`ibv_rereg_mr(3)`](https://man7.org/linux/man-pages/man3/ibv_rereg_mr.3.html)
    #[doc(alias = "ibv_rereg_mr")]
    pub fn set_access(&mut self, access: AccessFlags) -> Result<()> {
        check_access(access)?;
        let old = self.access;
        let write =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
        if matches!(self.storage, Storage::External) && !old.contains(access & write) {
            // `register_raw`'s caller promised memory fit for the rights it registered: the
            // device may not gain a write right over it.
            return Err(Error::InvalidArgument(
                "ibv_rereg_mr: a region over caller memory cannot gain a write right".into(),
            ));
        }
        Errno::clear();
        // SAFETY: live registration; an access change keeps the memory and the domain, so
        // only the flags are read.
        let ret = unsafe {
            ffi::ibv_rereg_mr(
                self.reg.as_ptr(),
                ffi::IBV_REREG_MR_CHANGE_ACCESS as i32,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
                access.bits() as i32,
            )
        };
        let was_shared = self.is_shared();
        let result = if ret == 0 {
            self.access = access;
            Ok(())
        } else {
            let error = Error::last_or("ibv_rereg_mr", Errno::IO);
            // libibverbs reports every failure of the provider's command as "command failed,
            // do not use the region"; a provider without the operation changed nothing.
            let untouched = matches!(error, Error::Unsupported(_));
            if ret <= ffi::IBV_REREG_MR_ERR_CMD && !untouched {
                // The command may have failed part-way: either set of rights may apply.
                self.access = old | access;
            }
            Err(error)
        };
        if was_shared && old.contains(AccessFlags::LOCAL_WRITE) {
            self.shared = true;
        }
        result
    }

    /// `ibv_advise_mr`: asks the device to fault in bytes `range` of an on-demand-paging region
    /// ahead of use; with `flush`, the call returns once they are mapped.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`] for a range outside the region.
    /// - [`Error::Unsupported`] where the provider has no on-demand paging (Soft-RoCE on
    ///   kernels before 6.10); else [`Error::Verb`] with the call's errno (`EINVAL` for a
    ///   region without [`AccessFlags::ON_DEMAND`]).
    ///
    /// # References
    ///
    /// [`ibv_advise_mr(3)`](https://man7.org/linux/man-pages/man3/ibv_advise_mr.3.html)
    #[doc(alias = "ibv_advise_mr")]
    pub fn advise(
        &self,
        advice: Advice,
        range: impl RangeBounds<usize>,
        flush: bool,
    ) -> Result<()> {
        let slice = self.slice(range)?;
        let mut sge = ffi::ibv_sge {
            addr: slice.addr,
            length: slice.length,
            lkey: slice.lkey,
        };
        let flags = if flush {
            ffi::IB_UVERBS_ADVISE_MR_FLAG_FLUSH
        } else {
            0
        };
        // SAFETY: live domain and registration; one readable entry inside the region.
        let ret =
            unsafe { ffi::ibv_advise_mr(self.pd.as_raw(), advice.as_raw(), flags, &mut sge, 1) };
        Error::check("ibv_advise_mr", ret)
    }

    /// `ibv_dereg_mr`, and for a region that owns its memory, freeing it: what dropping does,
    /// with the failure reported. On failure the region is handed back, still registered and
    /// usable; dropping it tries again (and then leaks the memory if it fails again, as the
    /// device may still reach it).
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with `ibv_dereg_mr`'s errno, for example while a memory window is bound
    /// to the region (`EINVAL` on rxe; the specification leaves the code to the device).
    ///
    /// # References
    ///
    /// [`ibv_dereg_mr(3)`](https://man7.org/linux/man-pages/man3/ibv_reg_mr.3.html)
    #[doc(alias = "ibv_dereg_mr")]
    pub fn close(mut self) -> std::result::Result<(), (Self, Error)> {
        match self.deregister() {
            Ok(()) => Ok(()),
            Err(error) => Err((self, error)),
        }
    }

    fn deregister(&mut self) -> Result<()> {
        if self.reg.deregistered {
            // Deregistered (and its memory freed) by an earlier call.
            return Ok(());
        }
        self.reg.deregister()?;
        if let Storage::Owned(layout) = self.storage {
            // SAFETY: allocated by `register` with this layout; the HCA can no longer reach it
            // after a successful deregistration, and no Rust reference to it is left (`close`
            // consumes the region, `Drop` ends it).
            unsafe { std::alloc::dealloc(self.addr.as_ptr(), layout) };
        }
        Ok(())
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // Drop cannot report a failure and must not panic (see "Resource cleanup" in the crate
        // documentation). If deregistration fails the HCA may still reach the memory: leaking
        // it is the only sound choice, and `deregister` frees it only after a success.
        let _ = self.deregister();
    }
}

/// The copy [`MemoryRegion::read_at`] makes out of a region: relaxed atomic loads if the
/// region is shared ([`MemoryRegion::is_shared`]: a peer or an owned request may write it while
/// Rust holds it), a `memcpy` otherwise. Separate from the region so that Miri can check it
/// against a concurrent writer.
///
/// # Safety
///
/// `src..src + out.len()` is valid for reads; if `shared`, it is also valid for writes and,
/// while this runs, accessed only atomically or by the device; otherwise nothing writes it
/// while this runs.
#[inline]
unsafe fn copy_out(shared: bool, src: *const u8, out: &mut [u8]) {
    if shared {
        // SAFETY: the caller's contract for shared memory is `copy_from_shared`'s.
        unsafe { copy_from_shared(src, out) };
    } else {
        // SAFETY: valid for reads with no concurrent writer (the contract); `out` is a
        // distinct Rust buffer.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
    }
}

/// The load [`MemoryRegion::load_u64`] makes: one acquire load of an aligned word.
///
/// # Safety
///
/// `ptr` is 8-byte aligned, `ptr..ptr + 8` is valid for reads and writes and, while this runs,
/// accessed only atomically or by the device.
#[inline]
unsafe fn load_word(ptr: *const u8) -> u64 {
    // SAFETY: the contract is `AtomicU64::from_ptr`'s for the duration of the load.
    unsafe { AtomicU64::from_ptr(ptr.cast_mut().cast()) }.load(Ordering::Acquire)
}

/// The copy [`MemoryRegion::write_at`] makes into a region, as [`copy_out`] chooses it.
///
/// # Safety
///
/// As [`copy_out`], for `dst..dst + data.len()`, which must be valid for writes in any case.
#[inline]
unsafe fn copy_in(shared: bool, data: &[u8], dst: *mut u8) {
    if shared {
        // SAFETY: the caller's contract for shared memory is `copy_to_shared`'s.
        unsafe { copy_to_shared(data, dst) };
    } else {
        // SAFETY: valid for writes with no concurrent writer (the contract); `data` is a
        // distinct Rust buffer.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU8};

    /// The accesses a DMA engine makes, as Rust's memory model can describe them: another
    /// thread's relaxed atomic stores, of the same sizes the copies use at each place (Rust
    /// forbids racing atomic accesses of different sizes to the same bytes, so the stand-in
    /// matches the copies' split: bytes up to the first 8-byte boundary and after the last
    /// one, words between).
    fn nic_store(base: *mut u8, start: usize, len: usize, value: u8) {
        let mut i = start;
        while i < start + len {
            let at = base.wrapping_add(i);
            if at.addr() % 8 == 0 && start + len - i >= 8 {
                // SAFETY: inside the test's backing store, aligned; accessed only atomically
                // while the threads run.
                unsafe { AtomicU64::from_ptr(at.cast()) }
                    .store(u64::from_ne_bytes([value; 8]), Ordering::Relaxed);
                i += 8;
            } else {
                // SAFETY: as above.
                unsafe { AtomicU8::from_ptr(at) }.store(value, Ordering::Relaxed);
                i += 1;
            }
        }
    }

    /// Memory a peer writes while `read_at` and `write_at` copy it and `load_u64` reads it.
    /// Under Miri this is the proof that these accesses to a remotely writable region are not
    /// data races: replace either atomic copy with the `memcpy` used for other regions, or the
    /// word's atomic load with a plain read, and Miri reports "Data race detected" here
    /// (each checked by hand when this test was written). A whole word is one store's. The writer does not
    /// synchronise with the copies on purpose (the flag is relaxed), as a NIC does not.
    #[test]
    fn copies_of_a_remotely_writable_region_race_a_writer_without_a_data_race() {
        struct Backing([AtomicU64; 8]);
        let backing = Arc::new(Backing(Default::default()));
        let base = backing.0.as_ptr().cast::<u8>().cast_mut();
        let (start, len) = (3, 50);
        let done = Arc::new(AtomicBool::new(false));
        let writer = {
            let (backing, done) = (Arc::clone(&backing), Arc::clone(&done));
            std::thread::spawn(move || {
                let base = backing.0.as_ptr().cast::<u8>().cast_mut();
                for value in 1..=3 {
                    nic_store(base, start, len, value);
                }
                done.store(true, Ordering::Relaxed);
            })
        };
        // A remotely writable region is shared.
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let shared = access.remotely_writable();
        let mut out = [0u8; 50];
        let mut seen_done = false;
        while !seen_done {
            seen_done = done.load(Ordering::Relaxed);
            // SAFETY: inside the backing store, which is writable and accessed only
            // atomically (the writer, these copies) while the writer runs.
            unsafe { copy_out(shared, base.wrapping_add(start), &mut out) };
            // Each byte is one that a store left there (or the initial zero).
            assert!(out.iter().all(|&b| b <= 3 || b == 9), "{out:?}");
            // SAFETY: an aligned word of the backing store (bytes 8..16), as above.
            let word = unsafe { load_word(base.wrapping_add(8)) }.to_ne_bytes();
            assert!(word.iter().all(|&b| b == word[0]), "{word:?}");
            // SAFETY: as above; a local write racing the peer's.
            unsafe { copy_in(shared, &[9; 50], base.wrapping_add(start)) };
            std::thread::yield_now();
        }
        writer.join().unwrap();
        // After the join the writer's stores happen before this copy.
        nic_store(base, start, len, 4);
        // SAFETY: as above, no other thread left.
        unsafe { copy_out(shared, base.wrapping_add(start), &mut out) };
        assert_eq!(out, [4; 50]);
    }
}
