//! Device memory (`struct ibv_dm`): memory on the device itself (on-chip memory of mlx5
//! devices), allocated with [`Context::alloc_dm`]. The CPU reaches it only by copies
//! ([`DeviceMemory::write`], [`DeviceMemory::read`]); the device reaches it through a
//! registration ([`DeviceMemory::register`], a [`DeviceRegion`](crate::DeviceRegion) addressed
//! from 0), faster than host memory for small hot data (counters, locks, doorbells of a
//! protocol).
//!
//! Soft-RoCE has none: its provider refuses [`Context::alloc_dm`] with
//! [`Error::Unsupported`] (`EOPNOTSUPP`).

use std::ffi::c_void;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::device::Context;
use crate::error::{Errno, Error, Result};
use crate::ffi;

pub(crate) struct DmInner {
    pub(crate) context: Context,
    raw: NonNull<ffi::ibv_dm>,
    len: usize,
    /// Set once `ibv_free_dm` succeeded.
    freed: bool,
}

// SAFETY: device memory is a provider handle; allocating, freeing and the copies are verbs that
// may be called from any thread. Copies into it need `&mut DeviceMemory`, so no two run at
// once, nor a read beside a write.
unsafe impl Send for DmInner {}
// SAFETY: as above; through `&DmInner` only reads (copies out) happen.
unsafe impl Sync for DmInner {}

impl DmInner {
    /// `ibv_free_dm`, once.
    fn free(&mut self) -> Result<()> {
        if self.freed {
            return Ok(());
        }
        // SAFETY: live device memory (not yet freed); every registration over it holds an Arc
        // to it, so none is left.
        let ret = unsafe { ffi::ibv_free_dm(self.raw.as_ptr()) };
        Errno::result(ret).map_err(|errno| Error::verb("ibv_free_dm", errno))?;
        self.freed = true;
        Ok(())
    }

    pub(crate) fn as_raw(&self) -> *mut ffi::ibv_dm {
        self.raw.as_ptr()
    }
}

impl Drop for DmInner {
    fn drop(&mut self) {
        // Drop cannot report a failure and must not panic; the kernel frees the memory with its
        // context.
        let _ = self.free();
    }
}

/// Memory on the device (`struct ibv_dm`), allocated by [`Context::alloc_dm`] and freed on
/// drop (or by [`close`](Self::close)).
///
/// Not `Clone`: the one owner of the allocation, so that a [`write`](Self::write) (`&mut`) never
/// runs beside another copy. Registrations over it
/// ([`register`](Self::register)) keep the allocation until they are gone. `Send` and `Sync`.
pub struct DeviceMemory(pub(crate) Arc<DmInner>);

impl fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceMemory")
            .field("len", &self.0.len)
            .finish()
    }
}

impl Context {
    /// `ibv_alloc_dm`: allocates `len` bytes of device memory, aligned to `2^log_align` bytes
    /// (`log_align_req`; 0 for no requirement). The device's limit is
    /// `max_dm_size` of `ibv_query_device_ex`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a length of 0 or an alignment of 2^64 or more (nothing is
    /// called); [`Error::Unsupported`] where the device has no memory to offer (Soft-RoCE);
    /// else [`Error::Verb`] with the call's errno (`ENOMEM`, `EINVAL` past the device's limit).
    ///
    /// # References
    ///
    /// [`ibv_alloc_dm(3)`](https://man7.org/linux/man-pages/man3/ibv_alloc_dm.3.html)
    #[doc(alias = "ibv_alloc_dm")]
    pub fn alloc_dm(&self, len: usize, log_align: u32) -> Result<DeviceMemory> {
        if len == 0 {
            return Err(Error::invalid("device memory of 0 bytes"));
        }
        if log_align >= u64::BITS {
            return Err(Error::InvalidArgument(format!(
                "an alignment of 2^{log_align} bytes"
            )));
        }
        let mut attr = ffi::ibv_alloc_dm_attr {
            length: len,
            log_align_req: log_align,
            comp_mask: 0,
        };
        // SAFETY: live context; `attr` is a valid structure the call reads.
        let raw = unsafe { ffi::ibv_alloc_dm(self.as_raw(), &mut attr) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_alloc_dm"))?;
        Ok(DeviceMemory(Arc::new(DmInner {
            context: self.clone(),
            raw,
            len,
            freed: false,
        })))
    }
}

impl DeviceMemory {
    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.0.len
    }

    /// Always `false`: an allocation has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    /// The context it belongs to.
    pub fn context(&self) -> &Context {
        &self.0.context
    }

    /// The raw `ibv_dm`, valid while the allocation lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_dm {
        self.0.as_raw()
    }

    /// `ibv_memcpy_to_dm`: copies `bytes` into the device memory from byte `offset`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `offset + bytes.len()` passes the end (nothing is
    /// called); else [`Error::Verb`] with the provider's errno (mlx5 wants `offset` and the
    /// length in multiples of 4 bytes).
    ///
    /// # References
    ///
    /// [`ibv_memcpy_to_dm(3)`](https://man7.org/linux/man-pages/man3/ibv_alloc_dm.3.html)
    #[doc(alias = "ibv_memcpy_to_dm")]
    pub fn write(&mut self, offset: usize, bytes: &[u8]) -> Result<()> {
        self.check_range(offset, bytes.len())?;
        // SAFETY: live device memory, copied into by this call only (`&mut self`); `bytes` is
        // readable for its length during the call.
        let ret = unsafe {
            ffi::ibv_memcpy_to_dm(
                self.as_raw(),
                offset as u64,
                bytes.as_ptr().cast::<c_void>(),
                bytes.len(),
            )
        };
        Errno::result(ret).map_err(|errno| Error::verb("ibv_memcpy_to_dm", errno))
    }

    /// `ibv_memcpy_from_dm`: fills `out` from the device memory, from byte `offset`. What the
    /// device writes there meanwhile (an RDMA write through a registration) may or may not be
    /// seen: the copy is not atomic.
    ///
    /// # Errors
    ///
    /// As [`write`](Self::write), with `ibv_memcpy_from_dm`.
    ///
    /// # References
    ///
    /// [`ibv_memcpy_from_dm(3)`](https://man7.org/linux/man-pages/man3/ibv_alloc_dm.3.html)
    #[doc(alias = "ibv_memcpy_from_dm")]
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range(offset, out.len())?;
        // SAFETY: live device memory; no write into it runs beside this (`write` takes `&mut
        // self`); `out` is writable for its length during the call.
        let ret = unsafe {
            ffi::ibv_memcpy_from_dm(
                out.as_mut_ptr().cast::<c_void>(),
                self.as_raw(),
                offset as u64,
                out.len(),
            )
        };
        Errno::result(ret).map_err(|errno| Error::verb("ibv_memcpy_from_dm", errno))
    }

    fn check_range(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.0.len => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "{len} bytes at offset {offset} of {} bytes of device memory",
                self.0.len
            ))),
        }
    }

    /// `ibv_free_dm`: what dropping does, with the failure reported. On failure the memory is
    /// handed back; dropping it tries again.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with `ibv_free_dm` and `EBUSY`, without calling it, while a
    /// registration over it lives; else the verb's error.
    ///
    /// # References
    ///
    /// [`ibv_free_dm(3)`](https://man7.org/linux/man-pages/man3/ibv_alloc_dm.3.html)
    #[doc(alias = "ibv_free_dm")]
    pub fn close(mut self) -> std::result::Result<(), (Self, Error)> {
        let result = match Arc::get_mut(&mut self.0) {
            Some(inner) => inner.free(),
            None => Err(Error::verb("ibv_free_dm", Errno::BUSY)),
        };
        result.map_err(|error| (self, error))
    }
}
