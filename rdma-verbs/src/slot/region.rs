//! [`SlotRegion`]: one registered region cut into equal slots and bound to a queue pair or an
//! SRQ, what a slot ring and an SRQ slot ring are made of.

use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::flags::AccessFlags;
use crate::inflight::{Attached, QpTables, SrqTable};
use crate::mr::MemoryRegion;
use crate::pd::ProtectionDomain;
use crate::qp::{QpState, QueuePair, Transport};
use crate::srq::SharedReceiveQueue;

/// A region of `count` slots of `size` bytes, registered for local access only and attached
/// to the queue pair (or SRQ) it is bound to, which keeps it registered until it is destroyed
/// (or the owner [`release`](Self::release)s it with nothing posted).
#[derive(Debug)]
pub(crate) struct SlotRegion<K: Keeper = QpTables> {
    mr: Arc<MemoryRegion>,
    /// The region's first byte, for Rust, and as the device sees it, with its key.
    ptr: NonNull<u8>,
    base: u64,
    lkey: u32,
    /// The bytes a slot holds, and the distance between slots (`size` rounded up to 8, so
    /// that every slot is aligned for atomics).
    size: u32,
    stride: u32,
    count: u32,
    /// The in-flight tables of the queue pair (or SRQ) the region is bound to: the one queue
    /// its owner posts to, compared by address (held, so the address is not reused meanwhile).
    tables: Arc<K>,
}

/// What a region can be bound to: the in-flight tables of a queue pair or of an SRQ, which
/// keep it attached. A type parameter rather than an enum, so that a queue pair's ring
/// compares one pointer on every post.
pub(crate) trait Keeper: std::fmt::Debug + Send + Sync {
    /// What the queue pair or SRQ keeps alive.
    fn attached(&self) -> &Attached;
}

impl Keeper for QpTables {
    fn attached(&self) -> &Attached {
        &self.attached
    }
}

impl Keeper for SrqTable {
    fn attached(&self) -> &Attached {
        &self.attached
    }
}

// SAFETY: `ptr` points into `mr`, which is `Send` and `Sync`; the region gives out no access
// to its bytes itself (its owners do, through `&`/`&mut` of themselves).
unsafe impl<K: Keeper> Send for SlotRegion<K> {}
// SAFETY: as for `Send`.
unsafe impl<K: Keeper> Sync for SlotRegion<K> {}

impl SlotRegion {
    /// Registers `count` (1 to `max`) slots of `size` bytes in `qp`'s protection domain and
    /// attaches the region to `qp`. `what` names the owner in errors.
    pub(crate) fn new<T: Transport, S: QpState>(
        qp: &QueuePair<T, S>,
        count: u32,
        size: usize,
        max: u32,
        what: &str,
    ) -> Result<Self> {
        Self::register(qp.pd(), qp.tables().clone(), count, size, max, what)
    }
}

impl SlotRegion<SrqTable> {
    /// [`SlotRegion::new`] for an SRQ: the region is attached to `srq`.
    pub(crate) fn for_srq(
        srq: &SharedReceiveQueue,
        count: u32,
        size: usize,
        max: u32,
        what: &str,
    ) -> Result<Self> {
        Self::register(srq.pd(), srq.inner.table.clone(), count, size, max, what)
    }
}

impl<K: Keeper> SlotRegion<K> {
    fn register(
        pd: &ProtectionDomain,
        tables: Arc<K>,
        count: u32,
        size: usize,
        max: u32,
        what: &str,
    ) -> Result<Self> {
        if count == 0 || size == 0 || count > max {
            return Err(Error::InvalidArgument(format!(
                "a {what} of {count} slots of {size} bytes: 1 to {max} slots of at least one \
                 byte"
            )));
        }
        let bad_size =
            || Error::InvalidArgument(format!("{count} slots of {size} bytes: too large"));
        let size32 = u32::try_from(size).map_err(|_| bad_size())?;
        let stride = size32.checked_next_multiple_of(8).ok_or_else(bad_size)?;
        let total = (stride as usize)
            .checked_mul(count as usize)
            .ok_or_else(bad_size)?;
        let mr = Arc::new(pd.register(total, AccessFlags::LOCAL_WRITE)?);
        let ptr = NonNull::new(mr.as_ptr())
            .ok_or_else(|| Error::InvalidArgument("a region at address 0".into()))?;
        tables.attached().attach(mr.clone());
        Ok(Self {
            ptr,
            base: mr.addr(),
            lkey: mr.lkey(),
            mr,
            size: size32,
            stride,
            count,
            tables,
        })
    }

    /// Whether the region is bound to the queue pair (or SRQ) whose tables are `tables`.
    #[inline]
    pub(crate) fn is_for(&self, tables: &Arc<K>) -> bool {
        Arc::ptr_eq(&self.tables, tables)
    }

    /// The bytes a slot holds.
    #[inline]
    pub(crate) fn size(&self) -> u32 {
        self.size
    }

    /// How many slots there are.
    #[inline]
    pub(crate) fn count(&self) -> u32 {
        self.count
    }

    /// The region's key.
    #[inline]
    pub(crate) fn lkey(&self) -> u32 {
        self.lkey
    }

    /// The address of slot `index` (below `count`) as the device sees it.
    #[inline]
    pub(crate) fn addr(&self, index: u32) -> u64 {
        debug_assert!(index < self.count);
        self.base + u64::from(index) * u64::from(self.stride)
    }

    /// Slot `index`'s (below `count`) first byte, for Rust.
    #[inline]
    pub(crate) fn ptr(&self, index: u32) -> *mut u8 {
        debug_assert!(index < self.count);
        // In bounds: `index < count`, and the region holds `count` strides.
        self.ptr
            .as_ptr()
            .wrapping_add(index as usize * self.stride as usize)
    }

    /// Hands `value` to the keeping of the queue pair (or SRQ) the region is bound to: it lives
    /// until `ibv_destroy_qp` (`ibv_destroy_srq`) has returned (what a UD slot ring's address
    /// handles need when it is dropped with sends posted).
    pub(crate) fn keep(&self, value: Arc<dyn Send + Sync>) {
        self.tables.attached().attach(value);
    }

    /// Gives the region back from the queue pair's (or SRQ's) keeping: it is deregistered once its last
    /// holder is gone. Only for an owner with nothing posted.
    pub(crate) fn release(&self) {
        self.tables.attached().detach(&self.mr);
    }
}
