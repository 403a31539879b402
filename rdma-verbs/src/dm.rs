//! Device memory (`struct ibv_dm`): memory on the device itself (on-chip memory of mlx5
//! devices), allocated with [`Context::alloc_dm`]. The CPU reaches it only by copies
//! ([`DeviceMemory::write`], [`DeviceMemory::read`]); the device reaches it through a
//! registration ([`DeviceMemory::register`], a [`DeviceRegion`](crate::DeviceRegion) addressed
//! from 0), faster than host memory for small hot data (counters, locks, doorbells of a
//! protocol).
//!
//! Soft-RoCE has none: its provider refuses [`Context::alloc_dm`] with
//! [`Error::Unsupported`] (`EOPNOTSUPP`).
//!
//! The copies go through function pointers the provider sets in each `ibv_dm`. mlx5 sets them;
//! the MANA provider (rdma-core 62 and later) allocates its `ibv_dm` without initialising them,
//! so calling them would jump to whatever the heap held. The copies are therefore made only on
//! devices of vendor 0x02c9 (Mellanox/NVIDIA: mlx5) and refused elsewhere. mlx5 reads and
//! writes the host buffer as 32-bit words, so the copies go through an aligned buffer of the
//! crate's where the caller's is not 4-byte aligned.

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
    /// Whether the provider is known to set the copy functions of its `ibv_dm` (see
    /// [`Context::alloc_dm`]).
    copies: bool,
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
        // SAFETY: live device memory (not yet freed). Every registration over it holds an Arc
        // to it, so none is left, except one whose `ibv_dereg_mr` failed on drop: the kernel
        // then refuses this call (`EBUSY`, the memory's use count) and the provider keeps its
        // mapping.
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
        let copies = self
            .query_device()
            .is_ok_and(|attr| attr.vendor_id == MLX5_VENDOR_ID);
        Ok(DeviceMemory(Arc::new(DmInner {
            context: self.clone(),
            raw,
            len,
            copies,
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
    /// [`Error::InvalidArgument`] when `offset + bytes.len()` passes the end, or `offset` or
    /// the length is not a multiple of 4 (the device copies 4-byte words); [`Error::Unsupported`]
    /// on a device other than mlx5 (see the module documentation): nothing is called then. Else
    /// [`Error::Verb`] with the provider's errno.
    ///
    /// # References
    ///
    /// [`ibv_memcpy_to_dm(3)`](https://man7.org/linux/man-pages/man3/ibv_alloc_dm.3.html)
    #[doc(alias = "ibv_memcpy_to_dm")]
    pub fn write(&mut self, offset: usize, bytes: &[u8]) -> Result<()> {
        self.check_copy(offset, bytes.len(), "ibv_memcpy_to_dm")?;
        let mut at = 0;
        for chunk in chunks(bytes.as_ptr(), bytes.len()) {
            let mut staging = [0u32; STAGING_WORDS];
            let host = if chunk.direct {
                // SAFETY: the chunk lies in `bytes` (`chunks` cuts it from its length).
                unsafe { bytes.as_ptr().add(at) }
            } else {
                let part = &bytes[at..at + chunk.len];
                // SAFETY: `staging` holds STAGING_WORDS * 4 >= `chunk.len` bytes; plain bytes
                // into plain words, no overlap.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        part.as_ptr(),
                        staging.as_mut_ptr().cast::<u8>(),
                        part.len(),
                    );
                }
                staging.as_ptr().cast::<u8>()
            };
            // SAFETY: live device memory of a provider that sets its copy functions (checked
            // above), copied into by this call only (`&mut self`); `host` is readable and
            // 4-byte aligned for `chunk.len` bytes during the call.
            let ret = unsafe {
                ffi::ibv_memcpy_to_dm(
                    self.as_raw(),
                    (offset + at) as u64,
                    host.cast::<c_void>(),
                    chunk.len,
                )
            };
            Errno::result(ret).map_err(|errno| Error::verb("ibv_memcpy_to_dm", errno))?;
            at += chunk.len;
        }
        Ok(())
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
        self.check_copy(offset, out.len(), "ibv_memcpy_from_dm")?;
        let mut at = 0;
        for chunk in chunks(out.as_ptr(), out.len()) {
            let mut staging = [0u32; STAGING_WORDS];
            let host = if chunk.direct {
                // SAFETY: the chunk lies in `out` (`chunks` cuts it from its length).
                unsafe { out.as_mut_ptr().add(at) }
            } else {
                staging.as_mut_ptr().cast::<u8>()
            };
            // SAFETY: live device memory of a provider that sets its copy functions (checked
            // above); no write into it runs beside this (`write` takes `&mut self`); `host` is
            // writable and 4-byte aligned for `chunk.len` bytes during the call.
            let ret = unsafe {
                ffi::ibv_memcpy_from_dm(
                    host.cast::<c_void>(),
                    self.as_raw(),
                    (offset + at) as u64,
                    chunk.len,
                )
            };
            Errno::result(ret).map_err(|errno| Error::verb("ibv_memcpy_from_dm", errno))?;
            if !chunk.direct {
                // SAFETY: the provider wrote `chunk.len` bytes of `staging`, which holds at
                // least that many; `out[at..]` has room for them; no overlap.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        staging.as_ptr().cast::<u8>(),
                        out.as_mut_ptr().add(at),
                        chunk.len,
                    );
                }
            }
            at += chunk.len;
        }
        Ok(())
    }

    /// Refuses a copy of `len` bytes at `offset` that passes the end, or on a provider whose
    /// copy functions cannot be trusted.
    fn check_copy(&self, offset: usize, len: usize, verb: &'static str) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.0.len => {}
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "{len} bytes at offset {offset} of {} bytes of device memory",
                    self.0.len
                )));
            }
        }
        if offset % 4 != 0 || len % 4 != 0 {
            // mlx5's rule, checked here so that a copy in pieces is all or nothing.
            return Err(Error::InvalidArgument(format!(
                "device memory is copied in 4-byte words: {len} bytes at offset {offset}"
            )));
        }
        if !self.0.copies {
            return Err(Error::Unsupported(verb));
        }
        Ok(())
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

/// The vendor ID of Mellanox/NVIDIA devices (mlx5), whose provider sets the copy functions.
const MLX5_VENDOR_ID: u32 = 0x02c9;

/// Words of the aligned buffer a copy of a misaligned host buffer goes through.
const STAGING_WORDS: usize = 64;

/// One provider call of a copy: `len` bytes, straight from the caller's buffer (`direct`,
/// when it is 4-byte aligned) or through the staging buffer.
struct Chunk {
    len: usize,
    direct: bool,
}

/// The calls a copy of `len` bytes at `host` takes: one straight call for an aligned buffer,
/// else pieces of the staging buffer's size.
fn chunks(host: *const u8, len: usize) -> impl Iterator<Item = Chunk> {
    let direct = host.align_offset(4) == 0;
    let step = if direct {
        len.max(1)
    } else {
        STAGING_WORDS * 4
    };
    let count = if len == 0 { 1 } else { len.div_ceil(step) };
    (0..count).map(move |i| Chunk {
        len: step.min(len - i * step),
        direct,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_cut_into_aligned_calls_that_cover_the_buffer() {
        let words = [0u32; 200];
        let base = words.as_ptr().cast::<u8>();
        // Aligned: one call, whatever the length.
        for len in [0, 3, 4, 799] {
            let calls: Vec<Chunk> = chunks(base, len).collect();
            assert_eq!(calls.len(), 1);
            assert!(calls[0].direct && calls[0].len == len);
        }
        // Misaligned: staging-sized pieces that add up to the length.
        // SAFETY: inside `words`.
        let odd = unsafe { base.add(1) };
        for len in [0, 1, 256, 257, 700] {
            let calls: Vec<Chunk> = chunks(odd, len).collect();
            assert!(
                calls
                    .iter()
                    .all(|c| !c.direct && c.len <= STAGING_WORDS * 4)
            );
            assert_eq!(calls.iter().map(|c| c.len).sum::<usize>(), len);
            assert_eq!(calls.len(), len.div_ceil(STAGING_WORDS * 4).max(1));
        }
    }
}
