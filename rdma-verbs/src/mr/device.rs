//! [`DeviceRegion`]: a registration of memory the CPU does not reach through it: a dmabuf
//! another driver exports (a GPU's memory, through CUDA's `cuMemGetHandleForAddressRange` or
//! ROCm's `hsa_amd_portable_export_dmabuf`), registered by its file descriptor
//! (`ibv_reg_dmabuf_mr`), or the device's own memory ([`DeviceMemory`], `ibv_reg_dm_mr`). It
//! has keys, an I/O virtual address and slices for scatter/gather entries (whose addresses are
//! I/O virtual addresses, not host ones: never sent inline), and no bytes.

use std::fmt;
use std::ops::RangeBounds;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

use std::sync::Arc;

use super::{MrSlice, Registration, RemoteMemory, sge_range};
use crate::dm::{DeviceMemory, DmInner};
use crate::error::{Error, Result};
use crate::ffi;
use crate::flags::AccessFlags;
use crate::pd::ProtectionDomain;

/// A registration of memory the CPU does not reach through it (`struct ibv_mr` of
/// `ibv_reg_dmabuf_mr` or `ibv_reg_dm_mr`): requests address it at [`iova`](Self::iova) +
/// offset, with [`lkey`](Self::lkey) locally and [`rkey`](Self::rkey) for peers. Made by the
/// `unsafe` [`ProtectionDomain::register_dmabuf`] (a dmabuf: GPU memory) or by
/// [`DeviceMemory::register`] (the device's own memory, addressed from 0); deregistered by
/// [`close`](Self::close) or on drop.
///
/// Not `Clone`: the one owner of its registration. It keeps its protection domain (and device
/// memory) alive. `Send` and `Sync`: it only holds numbers and the registration handle.
pub struct DeviceRegion {
    reg: Registration,
    iova: u64,
    len: usize,
    access: AccessFlags,
    pd: ProtectionDomain,
    /// The device memory under a registration of it, kept until the registration ends.
    _dm: Option<Arc<DmInner>>,
}

// SAFETY: the registration handle may be used and deregistered from any thread; the region
// gives no access to the memory itself.
unsafe impl Send for DeviceRegion {}
// SAFETY: as above; `&self` methods only read the handle's keys.
unsafe impl Sync for DeviceRegion {}

impl ProtectionDomain {
    /// `ibv_reg_dmabuf_mr`: registers `len` bytes of the dmabuf `fd`, from byte `offset` of
    /// it, addressed by requests at `iova` onwards, with `access` rights (remote rights also
    /// need [`AccessFlags::LOCAL_WRITE`], as for any region). The kernel holds the dmabuf while
    /// the region lives: `fd` may be closed after the call.
    ///
    /// GPU memory reaches this call as the dmabuf its driver exports: CUDA's
    /// `cuMemGetHandleForAddressRange(.., CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, ..)` over a
    /// `cuMemAlloc` range, ROCm's `hsa_amd_portable_export_dmabuf`. The device and its kernel
    /// driver must support peer-to-peer DMA with that GPU; Soft-RoCE does not (its provider
    /// refuses with `EOPNOTSUPP`).
    ///
    /// # Safety
    ///
    /// While the region is registered, no Rust reference points into the dmabuf's memory that
    /// the device could write behind (a receive, an RDMA read result, a peer's write or atomic,
    /// given the rights in `access`): memory a GPU owns is fine; a dmabuf over memory this
    /// process has mapped (a `udmabuf` of a memfd it holds slices of) must be reached only
    /// through raw pointers or volatile or atomic accesses, as with
    /// [`register_raw`](Self::register_raw).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a length of 0, a range `iova..iova + len` past the end
    /// of the address space, or access rights the crate refuses for any region (remote rights
    /// without local write); [`Error::Unsupported`] where the provider
    /// or device cannot register dmabufs (`EOPNOTSUPP`, Soft-RoCE's answer); [`Error::Verb`]
    /// with `ibv_reg_dmabuf_mr`'s errno otherwise (`EBADF` or `EINVAL` for a descriptor that is
    /// not a dmabuf or a range outside it).
    ///
    /// # References
    ///
    /// [`ibv_reg_dmabuf_mr(3)`](https://man7.org/linux/man-pages/man3/ibv_reg_mr.3.html)
    #[doc(alias = "ibv_reg_dmabuf_mr")]
    pub unsafe fn register_dmabuf(
        &self,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<DeviceRegion> {
        if len == 0 {
            return Err(Error::invalid("a dmabuf region of 0 bytes"));
        }
        // Every address a slice or remote handle computes stays below `iova + len`.
        if u64::try_from(len).map_or(true, |len| iova.checked_add(len).is_none()) {
            return Err(Error::InvalidArgument(format!(
                "{len} bytes from iova {iova:#x} pass the end of the 64-bit address space"
            )));
        }
        super::check_access(access)?;
        let access_raw = i32::try_from(access.bits())
            .map_err(|_| Error::invalid("access flags past the C int"))?;
        // SAFETY: a live protection domain; `fd` is open for the call (the kernel takes its own
        // reference to the dmabuf); the caller's contract covers what the device then reaches.
        let raw = unsafe {
            ffi::ibv_reg_dmabuf_mr(self.as_raw(), offset, len, iova, fd.as_raw_fd(), access_raw)
        };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_reg_dmabuf_mr"))?;
        Ok(DeviceRegion {
            reg: Registration::new(raw),
            iova,
            len,
            access,
            pd: self.clone(),
            _dm: None,
        })
    }
}

impl DeviceMemory {
    /// `ibv_reg_dm_mr`: registers the bytes `range` of the device memory in `pd` with `access`
    /// rights (remote rights also need [`AccessFlags::LOCAL_WRITE`], as for any region). The
    /// registration is zero-based (`IBV_ACCESS_ZERO_BASED`, which the call requires): requests
    /// and peers address its first byte as 0. It keeps the device memory allocated until it
    /// ends.
    ///
    /// Safe, unlike [`register_dmabuf`](ProtectionDomain::register_dmabuf): device memory is
    /// never host memory a Rust reference could point into; the CPU reaches it only through
    /// [`write`](Self::write) and [`read`](Self::read).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty range or one past the end, a protection domain
    /// of another context, or rights the crate refuses for any region (nothing is called);
    /// else [`Error::Verb`] with the call's errno, or [`Error::Unsupported`].
    ///
    /// # References
    ///
    /// [`ibv_reg_dm_mr(3)`](https://man7.org/linux/man-pages/man3/ibv_reg_dm_mr.3.html)
    #[doc(alias = "ibv_reg_dm_mr")]
    pub fn register(
        &self,
        pd: &ProtectionDomain,
        range: impl RangeBounds<usize>,
        access: AccessFlags,
    ) -> Result<DeviceRegion> {
        let (offset, end) = super::range_bounds(range, self.len());
        if offset >= end || end > self.len() {
            return Err(Error::InvalidArgument(format!(
                "bytes {offset}..{end} of {} bytes of device memory",
                self.len()
            )));
        }
        let len = end - offset;
        if pd.context().as_raw() != self.context().as_raw() {
            return Err(Error::invalid(
                "the protection domain belongs to another device context",
            ));
        }
        super::check_access(access)?;
        let flags = access | AccessFlags::ZERO_BASED;
        // SAFETY: a live protection domain and live device memory of the same context; the
        // range lies inside the allocation (checked above).
        let raw = unsafe {
            ffi::ibv_reg_dm_mr(
                pd.as_raw(),
                self.as_raw(),
                offset as u64,
                len,
                flags.bits() as std::ffi::c_uint,
            )
        };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_reg_dm_mr"))?;
        Ok(DeviceRegion {
            reg: Registration::new(raw),
            iova: 0,
            len,
            access,
            pd: pd.clone(),
            _dm: Some(Arc::clone(&self.0)),
        })
    }
}

impl DeviceRegion {
    /// The local key, for scatter/gather entries.
    pub fn lkey(&self) -> u32 {
        self.reg.lkey()
    }

    /// The remote key, which a peer needs for RDMA reads, writes and atomics.
    pub fn rkey(&self) -> u32 {
        self.reg.rkey()
    }

    /// The I/O virtual address of the first byte: requests and peers address the region from
    /// here.
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: a region has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The access rights it was registered with.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// Its protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The bytes `range` of the region, for a scatter/gather entry (addresses from
    /// [`iova`](Self::iova)).
    ///
    /// # Safety
    ///
    /// The slice is never sent with [`SendFlags::INLINE`](crate::flags::SendFlags::INLINE): an inline
    /// send makes the provider copy the entry's bytes on the CPU, from its address taken as a
    /// host address, and an I/O virtual address is not one. (Every other use has the device
    /// reach the memory through the registration.)
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the range is outside the region or longer than 4 GiB - 1.
    pub unsafe fn slice(&self, range: impl RangeBounds<usize>) -> Result<MrSlice<'_>> {
        let (start, length) = sge_range(range, self.len)?;
        Ok(MrSlice {
            addr: self.iova + start as u64,
            length,
            lkey: self.lkey(),
            _region: std::marker::PhantomData,
        })
    }

    /// The bytes `range` as a peer addresses them: address, length and this region's rkey.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the range is outside the region or longer than 4 GiB - 1.
    pub fn remote(&self, range: impl RangeBounds<usize>) -> Result<RemoteMemory> {
        let (start, len) = sge_range(range, self.len)?;
        Ok(RemoteMemory {
            addr: self.iova + start as u64,
            len,
            rkey: self.rkey(),
        })
    }

    /// `ibv_dereg_mr`: ends the registration, reporting a failure with the region back.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with `ibv_dereg_mr`'s errno (`EBUSY` while a memory window is bound
    /// to it); the region stays registered and is returned.
    ///
    /// # References
    ///
    /// [`ibv_dereg_mr(3)`](https://man7.org/linux/man-pages/man3/ibv_reg_mr.3.html)
    #[doc(alias = "ibv_dereg_mr")]
    pub fn close(mut self) -> std::result::Result<(), (Self, Error)> {
        match self.reg.deregister() {
            Ok(()) => Ok(()),
            Err(error) => Err((self, error)),
        }
    }
}

impl Drop for DeviceRegion {
    fn drop(&mut self) {
        // Cannot report; never panics. A failed deregistration leaves the registration (and
        // the kernel's hold on the dmabuf) in place until the context closes.
        let _ = self.reg.deregister();
    }
}

impl fmt::Debug for DeviceRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceRegion")
            .field("iova", &format_args!("{:#x}", self.iova))
            .field("len", &self.len)
            .field("lkey", &self.lkey())
            .field("rkey", &self.rkey())
            .field("access", &self.access)
            .finish()
    }
}
