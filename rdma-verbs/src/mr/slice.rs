//! [`MrSlice`] and [`MrSliceMut`]: bounds-checked byte ranges of a [`MemoryRegion`], the
//! scatter/gather entries of the `unsafe` post calls.

use super::MemoryRegion;
use crate::error::{Error, Result};

/// A bounds-checked byte range of a [`MemoryRegion`] (or a
/// [`DeviceRegion`](crate::DeviceRegion)), for a scatter/gather entry.
///
/// It borrows the region, so the region outlives the slice; whether the region outlives the work
/// request that uses it is up to the post call.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[must_use = "a slice does nothing until a request carries it"]
pub struct MrSlice<'a> {
    pub(crate) addr: u64,
    pub(crate) length: u32,
    pub(crate) lkey: u32,
    pub(super) _region: std::marker::PhantomData<&'a MemoryRegion>,
}

impl MrSlice<'_> {
    /// Start address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> u32 {
        self.length
    }

    /// Whether the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// The region's local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }
}

impl MrSlice<'static> {
    /// A slice that borrows nothing: for memory whose registration something other than a
    /// borrow keeps alive (an owned [`Buf`](crate::buf::Buf) moved into a queue pair's in-flight
    /// table before the post). A slice is only numbers; what makes posting it sound is the
    /// post's contract.
    pub(crate) fn from_raw_parts(addr: u64, length: u32, lkey: u32) -> Self {
        Self {
            addr,
            length,
            lkey,
            _region: std::marker::PhantomData,
        }
    }

    /// A slice of no region, for host tests that never post it.
    #[cfg(test)]
    pub(crate) fn unchecked_for_test(addr: u64, length: u32, lkey: u32) -> Self {
        Self::from_raw_parts(addr, length, lkey)
    }
}

impl<'a> MrSlice<'a> {
    /// The part of this slice starting `offset` bytes in, `len` bytes long: same region, same
    /// borrow. With [`MrSliceMut::as_slice`] it sends part of a receive target, as UD programs
    /// send the bytes after the 40-byte GRH of the buffer they receive into.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the range is outside this slice.
    pub fn sub(&self, offset: u32, len: u32) -> Result<MrSlice<'a>> {
        match offset.checked_add(len) {
            Some(end) if end <= self.length => Ok(MrSlice {
                addr: self.addr + u64::from(offset),
                length: len,
                lkey: self.lkey,
                _region: std::marker::PhantomData,
            }),
            _ => Err(Error::InvalidArgument(format!(
                "bytes {offset}..+{len} are outside the {}-byte slice",
                self.length
            ))),
        }
    }
}

/// A bounds-checked byte range of a [`MemoryRegion`] borrowed exclusively (see
/// [`MemoryRegion::slice_mut`]): the target of receives, RDMA reads and atomics posted through
/// a [`PostScope`](crate::scope::PostScope). Not `Copy`: sharing it (`&MrSliceMut`) lets several
/// requests target the same bytes, as C programs do, while Rust still cannot touch them.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a slice does nothing until a request carries it"]
pub struct MrSliceMut<'a> {
    pub(crate) addr: u64,
    pub(crate) length: u32,
    pub(crate) lkey: u32,
    pub(super) _region: std::marker::PhantomData<&'a mut MemoryRegion>,
}

impl MrSliceMut<'_> {
    /// Start address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> u32 {
        self.length
    }

    /// Whether the slice is empty.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// As a shared slice, for APIs that take one. The exclusive borrow stays in force for as
    /// long as the result lives.
    pub fn as_slice(&self) -> MrSlice<'_> {
        MrSlice {
            addr: self.addr,
            length: self.length,
            lkey: self.lkey,
            _region: std::marker::PhantomData,
        }
    }
}
