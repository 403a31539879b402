//! [`RegionRange`]: bytes of a caller's registered region that an owned request names.

use std::fmt;
use std::ops::RangeBounds;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::ffi;
use crate::mr::{MemoryRegion, MrSlice};
use crate::wr::{Payload, Sge};

/// Bytes of a registered region, for owned requests: the zero-copy counterpart of a [`Buf`]
/// for memory the program manages itself (a region it registered, with
/// [`register`](crate::ProtectionDomain::register) or
/// [`register_raw`](crate::ProtectionDomain::register_raw)).
///
/// A request that names a range holds a reference to its region from the post until its
/// completion (or a later one of the same queue, or the queue pair's reset or destruction;
/// for an SRQ receive, its completion or the SRQ's destruction), so the region stays
/// registered while the device may use it; the completion drops that reference.
/// What Rust may do with the region meanwhile follows from holding it in an [`Arc`]: only
/// `&self` methods, which read. So:
///
/// - the device may **read** a range of any region (a SEND or an RDMA WRITE from it): Rust
///   can only read the same bytes meanwhile;
/// - the device may **write** a range (a receive into it, an RDMA READ into it) only of a
///   [shared](MemoryRegion::is_shared) region, which Rust reads with atomic copies alone
///   ([`read_at`](MemoryRegion::read_at)): a region with remote write or atomic rights, or
///   one made [`into_shared`](MemoryRegion::into_shared). Posting such a request into another
///   region is refused with [`Error::InvalidArgument`].
///
/// Requests on connected queue pairs and receives (of any transport) carry ranges; a UD send
/// does not (it is refused: its in-flight entry keeps the address handle alive instead), nor
/// does an inline request.
///
/// Two requests may name overlapping ranges: what the device makes of that (which write lands
/// last) is the program's affair, not a hazard to Rust.
///
/// [`Buf`]: crate::buf::Buf
#[derive(Clone)]
#[must_use = "a range does nothing until a request carries it"]
pub struct RegionRange {
    region: Arc<MemoryRegion>,
    offset: usize,
    len: u32,
}

impl RegionRange {
    /// Bytes `range` of `region`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the range is empty (a scatter/gather entry of 0 bytes
    /// means 2 GiB to some devices), outside the region, reversed, or 4 GiB or longer.
    pub fn new(region: &Arc<MemoryRegion>, range: impl RangeBounds<usize>) -> Result<Self> {
        let slice = region.slice(range)?;
        if slice.is_empty() {
            return Err(Error::invalid("a region range needs at least one byte"));
        }
        Ok(Self {
            offset: (slice.addr() - region.addr()) as usize,
            len: slice.len(),
            region: Arc::clone(region),
        })
    }

    /// The region.
    pub fn region(&self) -> &Arc<MemoryRegion> {
        &self.region
    }

    /// Where the range starts in its region.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Always `false`: an empty range is refused by [`new`](Self::new).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The scatter/gather entry: the region's memory stays registered while the entry is in
    /// flight because the request's in-flight entry holds the region.
    #[inline]
    pub(crate) fn raw_slice(&self) -> MrSlice<'static> {
        MrSlice::from_raw_parts(
            self.region.addr() + self.offset as u64,
            self.len,
            self.region.lkey(),
        )
    }

    /// Checks that the range may go in a request of protection domain `pd` that lets the
    /// device write it (`device_writes`) or only read it.
    pub(crate) fn check(&self, pd: *mut ffi::ibv_pd, device_writes: bool) -> Result<()> {
        check_region(&self.region, pd, device_writes)
    }

    /// The region, for the request's in-flight entry.
    pub(crate) fn into_region(self) -> Arc<MemoryRegion> {
        self.region
    }
}

/// Checks that a range of `region` may go in a request of protection domain `pd` that lets the
/// device write it (`device_writes`) or only read it.
pub(crate) fn check_region(
    region: &MemoryRegion,
    pd: *mut ffi::ibv_pd,
    device_writes: bool,
) -> Result<()> {
    if region.pd().as_raw() != pd {
        return Err(Error::InvalidArgument(
            "the range's region belongs to another protection domain than the queue's".into(),
        ));
    }
    if device_writes && !region.is_shared() {
        return Err(not_shared());
    }
    Ok(())
}

/// The refusal of a request given two ranges (`what`: "request" or "receive").
#[cold]
pub(crate) fn second_range(what: &str) -> Error {
    Error::InvalidArgument(format!(
        "a {what} carries one region range (and_range was given a second)"
    ))
}

/// The refusal of a device write into a region that is not shared.
#[cold]
pub(crate) fn not_shared() -> Error {
    Error::InvalidArgument(
        "a receive or RDMA READ into a region range needs a shared region \
         (MemoryRegion::into_shared, which needs LOCAL_WRITE, or remote write or atomic rights)"
            .into(),
    )
}

impl fmt::Debug for RegionRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegionRange")
            .field("region", &format_args!("{:#x}", self.region.addr()))
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

/// The scatter/gather entries of an owned request: its buffer's bytes, a range's, both (in
/// that order), or none.
#[derive(Clone, Copy)]
pub(crate) struct OwnedSges {
    sges: [Sge<'static>; 2],
    len: u8,
}

impl OwnedSges {
    /// The entries of `buf` (skipped if empty: an entry of 0 bytes means 2 GiB to some
    /// devices) and then `range`.
    #[inline]
    pub(crate) fn new(buf: Option<MrSlice<'static>>, range: Option<&RegionRange>) -> Self {
        let none = Sge::from(MrSlice::from_raw_parts(0, 0, 0));
        let mut sges = Self {
            sges: [none; 2],
            len: 0,
        };
        if let Some(slice) = buf {
            if !slice.is_empty() {
                sges.sges[0] = Sge::from(slice);
                sges.len = 1;
            }
        }
        if let Some(range) = range {
            sges.sges[usize::from(sges.len)] = Sge::from(range.raw_slice());
            sges.len += 1;
        }
        sges
    }

    /// The request's payload.
    #[inline]
    pub(crate) fn payload(&self) -> Payload<'_> {
        match self.len {
            0 => Payload::None,
            1 => Payload::Slice(self.sges[0].as_slice()),
            _ => Payload::List(&self.sges),
        }
    }

    /// How many bytes the entries hold.
    pub(crate) fn bytes(&self) -> u64 {
        self.sges[..usize::from(self.len)]
            .iter()
            .map(|sge| u64::from(sge.len()))
            .sum()
    }

    /// Names no memory any more.
    pub(crate) fn clear(&mut self) {
        self.len = 0;
    }
}
