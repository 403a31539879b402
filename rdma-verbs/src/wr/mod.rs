//! Work requests and reusable, doorbell-batched post lists.
//!
//! Building requests is safe: a request borrows the memory regions, inline data and address
//! handles it names, so they outlive it. Handing a list to the hardware is the `unsafe` step
//! (see [`QueuePair::post_send`](crate::QueuePair::post_send)), because the hardware keeps using
//! the memory after the call returns.
//!
//! Files: `send.rs` ([`SendRequest`]), `recv.rs` ([`RecvRequest`]), `list.rs` ([`PostList`]);
//! this file holds what they share: scatter/gather entries and payloads, the operation bits,
//! the `wr_id` check, and what a post verb's return value means.

mod list;
mod recv;
mod send;

pub use crate::flags::SendFlags;
pub use list::{PostList, RecvList, SendList, WorkRequest};
pub use recv::{RecvMemory, RecvRequest};
pub(crate) use send::SendWr;
pub(crate) use send::memory_sealed;
pub use send::{
    AnyOp, AtomicOp, AtomicTarget, BindOp, BindRegion, Borrowed, ImmOp, IntoMemory, InvalidateOp,
    Memoryless, Operation, ReadOp, SendOp, SendRequest, WriteOp,
};

use std::fmt;
use std::marker::PhantomData;

use crate::error::{Errno, Error, Result};
use crate::ffi;
use crate::inflight::OWNED_ID_BIT;
use crate::mr::{MemoryRegion, MrSlice};

/// A scatter/gather entry (`struct ibv_sge`) over registered memory. Same layout as the C
/// structure, so lists of them go to the hardware as they are.
#[repr(transparent)]
#[derive(Copy, Clone)]
#[must_use = "a scatter/gather entry does nothing until a request carries it"]
pub struct Sge<'a> {
    raw: ffi::ibv_sge,
    _region: PhantomData<&'a MemoryRegion>,
}

impl<'a> From<MrSlice<'a>> for Sge<'a> {
    fn from(slice: MrSlice<'a>) -> Self {
        Self {
            raw: ffi::ibv_sge {
                addr: slice.addr,
                length: slice.length,
                lkey: slice.lkey,
            },
            _region: PhantomData,
        }
    }
}

impl Sge<'static> {
    /// The entry as a slice of its region (for the owned path, whose entries are `'static`).
    #[inline]
    pub(crate) fn as_slice(&self) -> MrSlice<'static> {
        MrSlice::from_raw_parts(self.raw.addr, self.raw.length, self.raw.lkey)
    }
}

impl Sge<'_> {
    /// Length in bytes.
    pub fn len(&self) -> u32 {
        self.raw.length
    }

    /// Whether the entry is empty.
    pub fn is_empty(&self) -> bool {
        self.raw.length == 0
    }
}

impl fmt::Debug for Sge<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sge")
            .field("addr", &format_args!("{:#x}", self.raw.addr))
            .field("length", &self.raw.length)
            .field("lkey", &format_args!("{:#x}", self.raw.lkey))
            .finish()
    }
}

/// The local memory of a work request.
#[derive(Copy, Clone, Debug)]
pub enum Payload<'a> {
    /// No data (zero-length sends, receives for RDMA write with immediate).
    None,
    /// One range of a memory region.
    Slice(MrSlice<'a>),
    /// A scatter/gather list.
    List(&'a [Sge<'a>]),
    /// Bytes copied into the work request during the post (`IBV_SEND_INLINE`), up to the queue
    /// pair's `max_inline_data`. Needs no memory region, and the bytes may be reused as soon as
    /// the post returns.
    Inline(&'a [u8]),
}

impl<'a> From<MrSlice<'a>> for Payload<'a> {
    fn from(slice: MrSlice<'a>) -> Self {
        Self::Slice(slice)
    }
}

impl<'a> From<&'a [Sge<'a>]> for Payload<'a> {
    fn from(list: &'a [Sge<'a>]) -> Self {
        Self::List(list)
    }
}

impl Payload<'_> {
    /// The payload's scatter/gather pointer, entry count and extra send flags, using `one` as
    /// storage for a single entry.
    ///
    /// An empty slice or empty inline data becomes no entry at all: some providers read an
    /// entry of length 0 as 2 GiB (ionic), and the device would then reach past the slice into
    /// the rest of its region.
    #[inline]
    fn fill(&self, one: &mut ffi::ibv_sge) -> (*mut ffi::ibv_sge, i32, u32) {
        match *self {
            Payload::None => (std::ptr::null_mut(), 0, 0),
            Payload::Slice(slice) if slice.length == 0 => (std::ptr::null_mut(), 0, 0),
            Payload::Inline([]) => (std::ptr::null_mut(), 0, 0),
            Payload::Slice(slice) => {
                *one = ffi::ibv_sge {
                    addr: slice.addr,
                    length: slice.length,
                    lkey: slice.lkey,
                };
                (one, 1, 0)
            }
            // The provider only reads the list (the C prototype lacks `const`).
            Payload::List(list) => (
                list.as_ptr().cast::<ffi::ibv_sge>().cast_mut(),
                list.len() as i32,
                0,
            ),
            Payload::Inline(bytes) => {
                *one = ffi::ibv_sge {
                    addr: bytes.as_ptr() as u64,
                    length: bytes.len() as u32,
                    lkey: 0,
                };
                (one, 1, ffi::IBV_SEND_INLINE)
            }
        }
    }

    /// Whether [`fill`](Self::fill) points into its `one` storage.
    #[inline]
    fn uses_single_entry(&self) -> bool {
        match self {
            Payload::Slice(slice) => slice.length > 0,
            Payload::Inline(bytes) => !bytes.is_empty(),
            _ => false,
        }
    }

    #[inline]
    fn check(&self) -> Result<()> {
        match *self {
            Payload::List(list) if i32::try_from(list.len()).is_err() => {
                Err(Error::invalid("too many scatter/gather entries"))
            }
            // The caller's list goes to the provider as it is: an entry of length 0 in it
            // could be read as 2 GiB (see `fill`).
            Payload::List(list) if list.iter().any(|sge| sge.is_empty()) => {
                Err(Error::invalid("a scatter/gather entry of 0 bytes"))
            }
            Payload::Inline(bytes) if u32::try_from(bytes.len()).is_err() => {
                Err(Error::invalid("inline data too long"))
            }
            _ => Ok(()),
        }
    }
}

/// Send operations, as a bit set, so a list can say which it holds.
pub(crate) mod op {
    pub(crate) const SEND: u32 = 1 << 0;
    pub(crate) const SEND_WITH_IMM: u32 = 1 << 1;
    pub(crate) const WRITE: u32 = 1 << 2;
    pub(crate) const WRITE_WITH_IMM: u32 = 1 << 3;
    pub(crate) const READ: u32 = 1 << 4;
    pub(crate) const ATOMIC: u32 = 1 << 5;
    pub(crate) const BIND_MW: u32 = 1 << 6;
    pub(crate) const LOCAL_INV: u32 = 1 << 7;
    pub(crate) const SEND_WITH_INV: u32 = 1 << 8;
    /// RDMA atomic write: only the extended path's builder (`ibv_wr_atomic_write`) carries it.
    pub(crate) const ATOMIC_WRITE: u32 = 1 << 9;
    /// A malformed request: immediate data on an operation that cannot carry it, or inline
    /// data as the target of a read.
    pub(crate) const INVALID: u32 = 1 << 31;
}

/// Refuses a `wr_id` with [`OWNED_ID_BIT`] set unless the owned-buffer path posts it: its
/// completion could otherwise be taken for an owned request's, and release a buffer the device
/// still uses.
#[inline]
pub(crate) fn check_wr_id(wr_id: u64, owned: bool) -> Result<()> {
    if wr_id & OWNED_ID_BIT != 0 && !owned {
        return Err(reserved_wr_id(wr_id));
    }
    Ok(())
}

// The errors of the checks above and below are built out of line, so that the checks inline
// into the post calls as a compare and a branch (see docs/benchmarks.md, instruction counts).

#[cold]
#[inline(never)]
fn reserved_wr_id(wr_id: u64) -> Error {
    Error::InvalidArgument(format!(
        "wr_id {wr_id:#x}: ids with the top bit set are reserved for owned requests"
    ))
}

#[cold]
#[inline(never)]
pub(crate) fn foreign_object() -> Error {
    Error::invalid(
        "the address handle or memory window belongs to another protection domain than the \
         queue pair",
    )
}

/// The index of `bad` in the `len` elements at `base`, or `None` when it points at none of
/// them (null, outside, or between elements). Address arithmetic only: `bad` comes from a
/// provider and is never dereferenced.
pub(crate) fn element_index<R>(base: *const R, len: usize, bad: *const R) -> Option<usize> {
    let size = std::mem::size_of::<R>();
    if bad.is_null() || size == 0 {
        return None;
    }
    let offset = (bad as usize).checked_sub(base as usize)?;
    let index = offset / size;
    (offset % size == 0 && index < len).then_some(index)
}

/// Turns a post verb's return value into a result: `ENOMEM` is a full queue, anything else a
/// refused request at `index`. `index` is the position of the request `bad_wr` named, or `None`
/// when it named none of them (null, or a stray pointer): then the provider did not say what it
/// took, and every request must be taken as posted ([`Error::PostIndeterminate`]).
#[inline]
pub(crate) fn post_result(
    verb: &'static str,
    ret: i32,
    index: impl FnOnce() -> Option<usize>,
) -> Result<()> {
    match Errno::result(ret) {
        Ok(()) => Ok(()),
        Err(errno) => Err(match (index(), errno) {
            (None, errno) => Error::PostIndeterminate { verb, errno },
            (Some(index), Errno::NOMEM) => Error::QueueFull { verb, index },
            (Some(index), errno) => Error::Post { verb, index, errno },
        }),
    }
}

/// The index `bad_wr` gives a one-request post: 0 when it names `raw`, else `None`.
#[inline]
pub(crate) fn index_of_one<R>(raw: &R, bad: *const R) -> Option<usize> {
    std::ptr::eq(raw, bad).then_some(0)
}

#[cfg(test)]
mod element_index_tests {
    use super::element_index;

    #[test]
    fn only_pointers_to_elements_have_an_index() {
        let items = [0u64; 4];
        let base = items.as_ptr();
        assert_eq!(element_index(base, 4, base), Some(0));
        assert_eq!(element_index(base, 4, base.wrapping_add(3)), Some(3));
        assert_eq!(element_index(base, 4, std::ptr::null()), None);
        assert_eq!(element_index(base, 4, base.wrapping_add(4)), None);
        assert_eq!(element_index(base, 4, base.wrapping_sub(1)), None);
        let between = (base as usize + 3) as *const u64;
        assert_eq!(element_index(base, 4, between), None);
    }
}
