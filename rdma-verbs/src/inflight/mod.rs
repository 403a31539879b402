//! In-flight tables of the owned-buffer data path (`docs/data-path.md`): what each queue of a
//! queue pair holds while the device may use it, the request ids that find it again (the slot
//! rings take theirs from the same source), the routes by which a completion queue reaches the
//! tables of its queue pairs, and what a queue pair keeps alive for its slot rings.
//!
//! - here: request ids ([`OWNED_ID_BIT`], [`RECV_ID_BIT`], the process's id blocks), the
//!   [`Entry`] a table holds per request, a queue pair's [`QpTables`];
//! - `ring.rs`: [`Ring`], one queue of a queue pair (posting order, lock-free posts);
//! - `srq.rs`: [`SrqTable`], an SRQ's receives (any order, found by id);
//! - `route.rs`: [`Routes`] and [`RouteCache`], from a completion to its table.

use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::buf::Buf;
use crate::error::{Error, Result};
use crate::mw::BoundWindows;

mod ring;
mod route;
mod srq;

pub(crate) use ring::Ring;
pub(crate) use route::{RouteCache, Routes};
pub(crate) use srq::SrqTable;

/// The bit every owned request id has, and no other `wr_id` may have: the post paths refuse
/// `wr_id`s with it set, so a completion of another request can never be taken for an owned
/// one.
pub(crate) const OWNED_ID_BIT: u64 = 1 << 63;

/// The bit the ids of receives have (a queue pair's receive queue, or an SRQ), so that a
/// completion goes straight to the table that can hold its request. Only a hint of where to
/// look: every table still matches the whole id.
pub(crate) const RECV_ID_BIT: u64 = 1 << 62;

/// An id no request ever has: [`OWNED_ID_BIT`] alone, the first id of block 0, which is never
/// handed out (blocks are taken from 1). The rings mark an empty slot with it, so that no
/// completion can match one.
pub(crate) const NO_ID: u64 = OWNED_ID_BIT;

/// [`OWNED_ID_BIT`] as a `NonZeroU64`.
const OWNED: NonZeroU64 = match NonZeroU64::new(OWNED_ID_BIT) {
    Some(bit) => bit,
    None => unreachable!(),
};

/// Ids are handed to tables in blocks of this many.
pub(crate) const BLOCK: u64 = 1 << 16;
/// The next block of ids, for the whole process. Block `b` holds ids `OWNED_ID_BIT | b *
/// BLOCK ..` (with [`RECV_ID_BIT`] for a receive table); blocks are handed out from 1 (block 0
/// holds [`NO_ID`]) up to the one before the last, so there are 2^46 - 2 blocks (almost 2^62
/// ids) before the space runs out, which it refuses to do rather than wrap. The last block is
/// never handed out: the end of a receive block there would be 2^64, one past `u64`.
static NEXT_BLOCK: AtomicU64 = AtomicU64::new(1);
const BLOCKS: u64 = RECV_ID_BIT / BLOCK - 1;

/// A table's source of ids: no two requests of the process ever get the same id.
#[derive(Debug)]
pub(crate) struct IdSource {
    next: u64,
    end: u64,
    /// [`RECV_ID_BIT`] for a receive table, else 0.
    kind: u64,
}

impl IdSource {
    pub(crate) const fn new(recv: bool) -> Self {
        Self {
            next: 0,
            end: 0,
            kind: if recv { RECV_ID_BIT } else { 0 },
        }
    }

    /// The next id: never 0, since every id has [`OWNED_ID_BIT`] (which lets an
    /// `Option<Entry>` be as small as an [`Entry`]).
    #[inline]
    pub(crate) fn next(&mut self) -> Result<NonZeroU64> {
        // `next_block` set the bit on every id of the block; or-ing it in again makes the
        // type say so.
        self.next_u64().map(|id| OWNED | id)
    }

    /// [`next`](Self::next) as a plain `u64` (it has [`OWNED_ID_BIT`] all the same).
    #[inline]
    pub(crate) fn next_u64(&mut self) -> Result<u64> {
        if self.next == self.end {
            self.next_block()?;
        }
        let id = self.next;
        self.next += 1;
        Ok(id)
    }

    /// Takes the next block of ids from the process's counter: once per 65,536 ids.
    #[cold]
    #[inline(never)]
    fn next_block(&mut self) -> Result<()> {
        self.next = take_block(self.kind)?;
        self.end = self.next + BLOCK;
        Ok(())
    }
}

/// Takes the next block of ids from the process's counter: the first id of the block, which
/// holds the [`BLOCK`] ids from there, each with [`OWNED_ID_BIT`] and `kind`
/// ([`RECV_ID_BIT`] or 0). No other block holds any of them.
#[cold]
pub(crate) fn take_block(kind: u64) -> Result<u64> {
    let block = NEXT_BLOCK
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
            (b < BLOCKS).then_some(b + 1)
        })
        .map_err(|_| {
            Error::InvalidArgument("the process has used every owned request id".into())
        })?;
    Ok(OWNED_ID_BIT | kind | (block * BLOCK))
}

/// What the device may use while a request is in flight, and what the completion returns.
pub(crate) struct Entry {
    /// Non-zero, so that `Option<Entry>` (a completion's) needs no tag of its own.
    pub(crate) id: NonZeroU64,
    pub(crate) tag: u64,
    pub(crate) buf: Option<Buf>,
    /// What else the device may use while the request is in flight (a UD send's address
    /// handle, the region a bind or a [`RegionRange`] names), kept alive until it is done.
    ///
    /// [`RegionRange`]: crate::owned::RegionRange
    pub(crate) keep: Option<Arc<dyn Send + Sync>>,
}

// A completion's `Option<Entry>` takes no more room than the entry (its id is never 0): 48
// bytes on 64-bit targets, the size the docs quote.
const _: () = assert!(size_of::<Option<Entry>>() == size_of::<Entry>());
#[cfg(target_pointer_width = "64")]
const _: () = assert!(size_of::<Entry>() == 48);

impl Entry {
    /// Whether the request is a receive (its buffer's length becomes the bytes received):
    /// receive ids carry [`RECV_ID_BIT`].
    #[inline]
    pub(crate) fn is_recv(&self) -> bool {
        self.id.get() & RECV_ID_BIT != 0
    }
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("id", &self.id)
            .field("tag", &self.tag)
            .field("buf", &self.buf)
            .field("keeps_alive", &self.keep.is_some())
            .finish()
    }
}

/// The error of a post into a full table, with the buffer back.
#[cold]
pub(crate) fn queue_full(buf: Option<Buf>) -> (Error, Option<Buf>) {
    (
        Error::QueueFull {
            verb: "owned post",
            index: 0,
        },
        buf,
    )
}

/// The in-flight tables of one queue pair.
#[derive(Debug)]
pub(crate) struct QpTables {
    pub(crate) send: Ring,
    pub(crate) recv: Ring,
    /// The SRQ's table, for a queue pair that receives through one.
    pub(crate) srq: Option<Arc<SrqTable>>,
    /// What the queue pair keeps alive for its slot rings and rings (`slot/`, `ring/`, whose
    /// posted requests no table records): their regions, until the queue pair is destroyed or
    /// a ring dropped with nothing posted takes its own back, and the address handles of a UD
    /// send ring dropped with sends posted.
    pub(crate) attached: Attached,
    /// The type 2 windows its owned binds handed to the provider (`mw.rs`).
    pub(crate) windows: BoundWindows,
}

/// What a queue pair or an SRQ keeps alive for the slot rings and rings bound to it: values
/// [`attach`](Self::attach)ed until [`detach`](Self::detach)ed or, once the device no longer
/// uses the queue pair or SRQ, [`detach_all`](Self::detach_all)ed.
#[derive(Default)]
pub(crate) struct Attached(Mutex<Vec<Arc<dyn Send + Sync>>>);

impl Attached {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<dyn Send + Sync>>> {
        // A panic while it was held left a valid `Vec`.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Keeps `value` alive until [`detach`](Self::detach) or [`detach_all`](Self::detach_all).
    pub(crate) fn attach(&self, value: Arc<dyn Send + Sync>) {
        self.lock().push(value);
    }

    /// Whether nothing is attached (no ring lives, and none was dropped with slots posted).
    pub(crate) fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Drops the attachments that are `value` (compared by address), if any. Allocates
    /// nothing (a slot ring dropped in a program's loop detaches its region).
    pub(crate) fn detach<T: Send + Sync>(&self, value: &Arc<T>) {
        let target = Arc::as_ptr(value).cast::<()>();
        loop {
            let detached = {
                let mut attached = self.lock();
                match attached
                    .iter()
                    .position(|a| Arc::as_ptr(a).cast::<()>() == target)
                {
                    Some(at) => attached.swap_remove(at),
                    None => return,
                }
            };
            // Dropped outside the lock: a region's drop deregisters it.
            drop(detached);
        }
    }

    /// Drops what was attached: only once the device no longer uses the queue pair or SRQ.
    pub(crate) fn detach_all(&self) {
        let detached = std::mem::take(&mut *self.lock());
        drop(detached);
    }
}

impl std::fmt::Debug for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} attached", self.lock().len())
    }
}

impl QpTables {
    pub(crate) fn new(max_send_wr: u32, max_recv_wr: u32, srq: Option<Arc<SrqTable>>) -> Self {
        Self {
            send: Ring::new(max_send_wr, false),
            recv: Ring::new(max_recv_wr, true),
            srq,
            attached: Attached::default(),
            windows: BoundWindows::default(),
        }
    }

    /// Requests in flight in both queues.
    pub(crate) fn in_flight(&self) -> usize {
        self.send.len() + self.recv.len()
    }

    /// Releases everything (see [`Ring::clear`]).
    pub(crate) fn clear(&self) {
        self.send.clear();
        self.recv.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_marked() {
        let mut a = IdSource::new(false);
        let mut b = IdSource::new(true);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..(BLOCK as usize + 10) {
            let (send, recv) = (a.next().unwrap().get(), b.next().unwrap().get());
            assert_eq!(send & (OWNED_ID_BIT | RECV_ID_BIT), OWNED_ID_BIT);
            assert_eq!(
                recv & (OWNED_ID_BIT | RECV_ID_BIT),
                OWNED_ID_BIT | RECV_ID_BIT
            );
            for id in [send, recv] {
                assert!(
                    id & !RECV_ID_BIT >= OWNED_ID_BIT | BLOCK,
                    "id {id:#x} of block 0, which holds NO_ID"
                );
                assert!(seen.insert(id), "id {id:#x} handed out twice");
            }
        }
    }
}
