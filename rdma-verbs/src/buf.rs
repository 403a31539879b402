//! Owned buffers of registered memory, the currency of the owned-buffer data path
//! (`docs/data-path.md`).
//!
//! A [`BufferPool`] registers one region and cuts it into buffers of one size. A [`Buf`] is one
//! of them, owned: while the caller holds it, it reads and writes the bytes as a plain slice;
//! posting it moves it into the queue pair, and the completion that proves the device is done
//! hands it back. Dropping a `Buf` returns it to its pool.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

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
    /// The protection domain's `ibv_pd`, as an address: compared with a queue pair's at each
    /// post without going through the region.
    pd_addr: usize,
    /// The buffers not handed out.
    free: FreeList,
}

/// Which of `count` buffers are free, one bit each (set: free; buffer `i` is bit `i % 64` of
/// word `i / 64`). Taking a buffer clears its bit with an atomic AND that must find it set,
/// giving it back sets it with an atomic OR: no lock, and no allocation after creation.
/// Acquire on taking and release on giving back order what a holder did with the buffer
/// before what the next holder does.
struct FreeList {
    words: Box<[AtomicU64]>,
    /// The word the last index was taken from: where the next search starts.
    hint: AtomicUsize,
}

impl FreeList {
    /// Every index below `count` free.
    fn new(count: usize) -> Self {
        // All bits of the full words, the low `count % 64` of the last.
        let words = (0..count.div_ceil(64))
            .map(|word| {
                let left = count - word * 64;
                AtomicU64::new(if left >= 64 {
                    u64::MAX
                } else {
                    (1 << left) - 1
                })
            })
            .collect();
        Self {
            words,
            hint: AtomicUsize::new(0),
        }
    }

    /// Takes a free index, or `None` if every one is out.
    #[inline]
    fn take(&self) -> Option<u32> {
        let words = self.words.len();
        let start = self.hint.load(Ordering::Relaxed);
        let mut word = start;
        for _ in 0..words {
            // In bounds: `start` and `word` stay below `words`.
            let bits_of = &self.words[word];
            let mut bits = bits_of.load(Ordering::Relaxed);
            while bits != 0 {
                // The lowest free bit, as a shift: clearing one bit known by its position
                // compiles to a single atomic bit-test-and-reset on x86-64 (`lock btr`), not a
                // compare-exchange loop.
                let bit = bits.trailing_zeros();
                let lowest = 1u64 << bit;
                let before = bits_of.fetch_and(!lowest, Ordering::Acquire);
                if before & lowest != 0 {
                    if word != start {
                        self.hint.store(word, Ordering::Relaxed);
                    }
                    // Below `count <= 2^32`: only bits of indices below it are ever set.
                    return Some((word * 64) as u32 + bit);
                }
                // Another thread took it: try what is still free in this word (loaded again,
                // so that `before` is used by the bit test alone, which the single
                // instruction needs).
                bits = bits_of.load(Ordering::Relaxed);
            }
            word += 1;
            if word == words {
                word = 0;
            }
        }
        None
    }

    /// Gives back `index`, which [`take`](Self::take) returned.
    #[inline]
    fn give_back(&self, index: u32) {
        let index = index as usize;
        // In bounds: `take` returns indices below `count`.
        self.words[index / 64].fetch_or(1 << (index % 64), Ordering::Release);
    }

    /// How many indices are free now.
    fn available(&self) -> usize {
        self.words
            .iter()
            .map(|word| word.load(Ordering::Relaxed).count_ones() as usize)
            .sum()
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
        Ok(Self {
            inner: Arc::new(PoolInner {
                pd_addr: pd.as_raw() as usize,
                mr,
                size,
                count,
                free: FreeList::new(count),
            }),
        })
    }

    /// A free buffer, its length set to the full [`buffer_size`](Self::buffer_size), or `None`
    /// when it found none free (every buffer out; under concurrency, one may have come back to
    /// a word it had passed). Never allocates, never blocks (lock-free: it may be called
    /// from any thread at once, as buffers may be dropped from any).
    #[inline]
    pub fn take(&self) -> Option<Buf> {
        let index = self.inner.free.take()?;
        Some(Buf {
            pool: self.inner.clone(),
            index,
            len: self.inner.size as u32,
        })
    }

    /// How many buffers are free now.
    pub fn available(&self) -> usize {
        self.inner.free.available()
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
            pd_addr,
            free,
        } = inner;
        mr.close().map_err(|(mr, error)| {
            let inner = Arc::new(PoolInner {
                mr,
                size,
                count,
                pd_addr,
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
    #[inline]
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
    #[inline]
    pub fn set_len(&mut self, len: usize) -> Result<()> {
        if len > self.pool.size {
            return Err(too_long(len, self.pool.size));
        }
        self.len = len as u32;
        Ok(())
    }

    /// Sets the length to `data.len()` and copies `data` in.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `data` is longer than the capacity.
    #[inline]
    pub fn fill_from(&mut self, data: &[u8]) -> Result<()> {
        self.set_len(data.len())?;
        self.copy_from_slice(data);
        Ok(())
    }

    /// Whether the buffer belongs to `pool`.
    pub fn is_from(&self, pool: &BufferPool) -> bool {
        Arc::ptr_eq(&self.pool, &pool.inner)
    }

    /// The address of the `ibv_pd` of the buffer's region.
    #[inline]
    pub(crate) fn pd_addr(&self) -> usize {
        self.pool.pd_addr
    }

    /// Sets the length after a completion: `Some(n)` for a receive of `n` bytes (never past
    /// the capacity), `None` to leave it.
    #[inline]
    pub(crate) fn set_received(&mut self, received: Option<u32>) {
        if let Some(n) = received {
            self.len = n.min(self.pool.size as u32);
        }
    }

    /// The bytes a request carries: the first `len` (all of them for a receive, with
    /// `whole`), as a slice of the region with no borrow: the caller moves `self` into the
    /// queue pair's in-flight table before posting, which keeps the region registered and the
    /// bytes unreachable until the device is done.
    #[inline]
    pub(crate) fn raw_slice(&self, whole: bool) -> MrSlice<'static> {
        let length = if whole {
            self.pool.size as u32
        } else {
            self.len
        };
        let offset = self.index as u64 * self.pool.size as u64;
        MrSlice::from_raw_parts(self.pool.mr.addr() + offset, length, self.pool.mr.lkey())
    }

    #[inline]
    fn as_ptr(&self) -> *mut u8 {
        // In bounds: `index < count`, so the buffer lies within the region.
        self.pool
            .mr
            .as_ptr()
            .wrapping_add(self.index as usize * self.pool.size)
    }
}

#[cold]
fn too_long(len: usize, size: usize) -> Error {
    Error::InvalidArgument(format!("length {len} exceeds the buffer's {size} bytes"))
}

impl Deref for Buf {
    type Target = [u8];

    #[inline]
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
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `deref`; `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), self.len as usize) }
    }
}

impl Drop for Buf {
    #[inline]
    fn drop(&mut self) {
        // Its bit is clear (this `Buf` took it) and no other `Buf` has this index.
        self.pool.free.give_back(self.index);
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

#[cfg(test)]
mod tests {
    use super::FreeList;
    use std::sync::Arc;

    #[test]
    fn every_index_is_taken_once_then_none() {
        for count in [1, 5, 63, 64, 65, 200] {
            let list = FreeList::new(count);
            assert_eq!(list.available(), count);
            let mut taken: Vec<u32> = std::iter::from_fn(|| list.take()).collect();
            taken.sort_unstable();
            assert_eq!(
                taken,
                (0..count as u32).collect::<Vec<_>>(),
                "count {count}"
            );
            assert_eq!(list.available(), 0);
            list.give_back(taken[count / 2]);
            assert_eq!(list.take(), Some(taken[count / 2]));
            assert_eq!(list.take(), None);
        }
    }

    /// Four threads take and give back indices of a 130-entry list a hundred thousand times
    /// each, marking each index held in a shared table: an index handed to two threads at
    /// once would be seen marked.
    #[test]
    fn no_index_is_held_twice() {
        use std::sync::atomic::{AtomicBool, Ordering};
        const COUNT: usize = 130;
        let list = Arc::new(FreeList::new(COUNT));
        let held: Arc<Vec<AtomicBool>> =
            Arc::new((0..COUNT).map(|_| AtomicBool::new(false)).collect());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (list, held) = (list.clone(), held.clone());
                std::thread::spawn(move || {
                    let mut mine = Vec::with_capacity(40);
                    for round in 0..if cfg!(miri) { 300 } else { 100_000usize } {
                        if round % 3 != 2 && mine.len() < 40 {
                            if let Some(index) = list.take() {
                                assert!(!held[index as usize].swap(true, Ordering::Relaxed));
                                mine.push(index);
                            }
                        } else if let Some(index) = mine.pop() {
                            assert!(held[index as usize].swap(false, Ordering::Relaxed));
                            list.give_back(index);
                        }
                    }
                    for index in mine {
                        held[index as usize].store(false, Ordering::Relaxed);
                        list.give_back(index);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(list.available(), COUNT);
    }
}
