//! Owned buffers of registered memory, the currency of the owned-buffer data path
//! (`docs/data-path.md`).
//!
//! A [`BufferPool`] registers one region and cuts it into buffers of one size. A [`Buf`] is one
//! of them, owned: while the caller holds it, it reads and writes the bytes as a plain slice;
//! posting it moves it into the queue pair, and the completion that proves the device is done
//! hands it back. Dropping a `Buf` returns it to its pool.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Errno, Error, Result};
use crate::flags::AccessFlags;
use crate::mr::{MemoryRegion, MrSlice};
use crate::pd::ProtectionDomain;

/// A pool of equal buffers in one registered region: [`take`](Self::take) hands them out,
/// dropping a [`Buf`] gives it back. Cheap to clone (all clones are the same pool).
///
/// The region is registered with [`LOCAL_WRITE`](AccessFlags::LOCAL_WRITE) only: no peer can
/// write it, so a buffer the caller holds is plain memory. It stays registered until the pool
/// and every buffer of it (including those in flight in a queue pair) are gone.
#[derive(Clone)]
pub struct BufferPool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    mr: MemoryRegion,
    size: usize,
    count: usize,
    /// Indices of the buffers not handed out. Its capacity is `count` from the start, and it
    /// never holds more, so giving a buffer back never allocates.
    free: Mutex<Vec<u32>>,
}

impl PoolInner {
    fn free(&self) -> MutexGuard<'_, Vec<u32>> {
        // A panic while holding the lock cannot leave the list inconsistent (push and pop are
        // single steps), so a poisoned lock is used as it is.
        self.free
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl BufferPool {
    /// Registers `count` buffers of `size` bytes each (one region of `count * size` bytes) in
    /// `pd`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `count` or `size` is zero, a buffer is larger than
    /// `u32::MAX` bytes (a work request's length), there are more than `u32::MAX` buffers, or
    /// the region's size overflows; else as [`ProtectionDomain::register`].
    pub fn new(pd: &ProtectionDomain, count: usize, size: usize) -> Result<Self> {
        if count == 0 || size == 0 {
            return Err(Error::InvalidArgument(
                "a buffer pool needs at least one buffer of at least one byte".into(),
            ));
        }
        if u32::try_from(size).is_err() || u32::try_from(count).is_err() {
            return Err(Error::InvalidArgument(format!(
                "{count} buffers of {size} bytes: at most u32::MAX of at most u32::MAX bytes"
            )));
        }
        let total = count.checked_mul(size).ok_or_else(|| {
            Error::InvalidArgument(format!("{count} buffers of {size} bytes overflow"))
        })?;
        let mr = pd.register(total, AccessFlags::LOCAL_WRITE)?;
        let mut free = Vec::with_capacity(count);
        // Handed out from the front of the region first (popped from the end).
        free.extend((0..count as u32).rev());
        Ok(Self {
            inner: Arc::new(PoolInner {
                mr,
                size,
                count,
                free: Mutex::new(free),
            }),
        })
    }

    /// A free buffer, its length set to the full [`buffer_size`](Self::buffer_size), or `None`
    /// when every buffer is out. Never allocates.
    pub fn take(&self) -> Option<Buf> {
        let index = self.inner.free().pop()?;
        Some(Buf {
            pool: self.inner.clone(),
            index,
            len: self.inner.size as u32,
        })
    }

    /// How many buffers are free now.
    pub fn available(&self) -> usize {
        self.inner.free().len()
    }

    /// How many buffers the pool has.
    pub fn count(&self) -> usize {
        self.inner.count
    }

    /// The size of each buffer, in bytes.
    pub fn buffer_size(&self) -> usize {
        self.inner.size
    }

    /// The protection domain of the pool's region.
    pub fn pd(&self) -> &ProtectionDomain {
        self.inner.mr.pd()
    }

    /// Deregisters and frees the pool's region ([`MemoryRegion::close`]): what dropping the
    /// last clone does once every buffer is back, with the failure reported. On failure the
    /// pool is handed back, still usable.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with `ibv_dereg_mr` and `EBUSY`, without calling it, while another
    /// clone or a buffer of the pool (held, or in flight in a queue pair) exists; else as
    /// [`MemoryRegion::close`].
    pub fn close(self) -> std::result::Result<(), (Self, Error)> {
        let inner = match Arc::try_unwrap(self.inner) {
            Ok(inner) => inner,
            Err(inner) => {
                return Err((Self { inner }, Error::verb("ibv_dereg_mr", Errno::BUSY)));
            }
        };
        let PoolInner {
            mr,
            size,
            count,
            free,
        } = inner;
        mr.close().map_err(|(mr, error)| {
            let inner = Arc::new(PoolInner {
                mr,
                size,
                count,
                free,
            });
            (Self { inner }, error)
        })
    }
}

impl fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferPool")
            .field("count", &self.inner.count)
            .field("buffer_size", &self.inner.size)
            .field("available", &self.available())
            .finish()
    }
}

/// One buffer of a [`BufferPool`], owned: it dereferences to its first [`len`](Self::len)
/// bytes. Posting it (for example with [`QueuePair::post_recv_buf`]) moves it to the queue
/// pair until its completion hands it back; dropping it returns it to its pool.
///
/// [`QueuePair::post_recv_buf`]: crate::QueuePair::post_recv_buf
#[must_use = "dropping a buffer returns it to its pool"]
pub struct Buf {
    pool: Arc<PoolInner>,
    index: u32,
    len: u32,
}

impl Buf {
    /// The bytes in use: what a send carries, and after a receive, what arrived (on UD,
    /// including the 40-byte GRH in front; 0 after an RDMA WRITE with immediate, whose bytes
    /// went to the target memory, and after a failed receive).
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether no byte is in use.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer's size: the most `len` can be.
    pub fn capacity(&self) -> usize {
        self.pool.size
    }

    /// Sets how many bytes are in use (a send carries that many; a receive may fill up to the
    /// capacity whatever this says).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `len` exceeds the capacity.
    pub fn set_len(&mut self, len: usize) -> Result<()> {
        if len > self.pool.size {
            return Err(Error::InvalidArgument(format!(
                "length {len} exceeds the buffer's {} bytes",
                self.pool.size
            )));
        }
        self.len = len as u32;
        Ok(())
    }

    /// Sets the length to `data.len()` and copies `data` in.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `data` is longer than the capacity.
    pub fn fill_from(&mut self, data: &[u8]) -> Result<()> {
        self.set_len(data.len())?;
        self.copy_from_slice(data);
        Ok(())
    }

    /// Whether the buffer belongs to `pool`.
    pub fn is_from(&self, pool: &BufferPool) -> bool {
        Arc::ptr_eq(&self.pool, &pool.inner)
    }

    /// The protection domain of the buffer's region.
    pub(crate) fn pd(&self) -> &ProtectionDomain {
        self.pool.mr.pd()
    }

    /// Sets the length after a completion: `Some(n)` for a receive of `n` bytes (never past
    /// the capacity), `None` to leave it.
    pub(crate) fn set_received(&mut self, received: Option<u32>) {
        if let Some(n) = received {
            self.len = n.min(self.pool.size as u32);
        }
    }

    /// The bytes a request carries: the first `len` (all of them for a receive, with
    /// `whole`), as a slice of the region with no borrow: the caller moves `self` into the
    /// queue pair's in-flight table before posting, which keeps the region registered and the
    /// bytes unreachable until the device is done.
    pub(crate) fn raw_slice(&self, whole: bool) -> MrSlice<'static> {
        let length = if whole {
            self.pool.size as u32
        } else {
            self.len
        };
        let offset = self.index as u64 * self.pool.size as u64;
        MrSlice::from_raw_parts(self.pool.mr.addr() + offset, length, self.pool.mr.lkey())
    }

    fn as_ptr(&self) -> *mut u8 {
        // In bounds: `index < count`, so the buffer lies within the region.
        self.pool
            .mr
            .as_ptr()
            .wrapping_add(self.index as usize * self.pool.size)
    }
}

impl Deref for Buf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: the buffer's `size` bytes lie in the pool's region, which lives as long as
        // `self.pool`; `len <= size`. Nobody else reaches them: no other `Buf` has this index
        // (the free list hands each index out once), the device uses them only while the
        // buffer is in flight (moved into a queue pair, not here), and no peer can write the
        // region (registered without remote rights).
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len as usize) }
    }
}

impl DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `deref`; `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), self.len as usize) }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // Never reallocates: the list's capacity is the pool's count, and each index is in
        // it at most once.
        self.pool.free().push(self.index);
    }
}

impl fmt::Debug for Buf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buf")
            .field("index", &self.index)
            .field("len", &self.len)
            .field("capacity", &self.pool.size)
            .finish()
    }
}
