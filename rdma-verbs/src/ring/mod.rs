//! [`RecvRing`] and [`SendRing`]: a queue pair's slots, posted and completed in ring order
//! (`docs/data-path.md`, "Rings"). The cheapest safe data path, for the commonest shape of
//! RDMA program: a ring of receives reposted as they complete, a ring of sends freed as their
//! completions come.
//!
//! A ring is one registered region cut into `count` slots, bound for life to the queue pair
//! that made it, as a [`SlotRing`](crate::SlotRing) is. Unlike a slot ring it hands out no
//! token: it posts its slots in order, from its tail, and a completion gives back the oldest
//! posted slot, at its head. What it records is one request id per slot (the id the slot was
//! posted under, or none), and the head and tail: a post writes one id, a completion compares
//! one. The caller reaches a slot's bytes only through the ring: a send ring's next slot
//! before it is posted ([`SendRing::next_mut`]), a completed slot while the completion's
//! borrow of the ring lasts ([`RecvRing::complete`], [`SendRing::complete`]).
//!
//! Files: `recv.rs` (the receive ring and its post), `send.rs` (the send ring, [`RingSend`]
//! and its post), `record.rs` (which slots are posted, under which ids), `region.rs` (the
//! registered slots, which slot rings are made of too); this file holds what both rings
//! share.
//!
//! Why it is sound (`docs/safety.md`, "Rings"):
//! - a posted slot's bytes are reachable from Rust by no path: the ring hands out the bytes of
//!   its tail slot only when that slot is not posted, and those of a completed slot only once
//!   the completion has taken it out of the record; both borrow the ring, and posting needs
//!   the ring `&mut`;
//! - a slot leaves the record only with the completion of its request, or of a later request
//!   of the ring (a queue completes in order), found by the request's id: ids are unique in the
//!   process (the owned path's id source), the other post paths refuse ids of that form, and
//!   an empty slot holds an id no request has (`NO_ID`);
//! - the region stays registered while the device may use it: the queue pair keeps it (an
//!   attachment of its in-flight tables) until `ibv_destroy_qp` has returned, unless the ring
//!   is dropped with nothing posted;
//! - a ring posts only to its own queue pair (checked on every post), and no peer can write
//!   its region (registered without remote rights).

use crate::error::{Error, Result};
use crate::inflight::IdSource;
use crate::qp::{QpState, QueuePair, Reset, Transport, may_have_posted};

mod record;
mod recv;
mod region;
mod send;

pub use recv::RecvRing;
pub(crate) use recv::{FillSlots, fill_chains};
pub(crate) use region::{Keeper, SlotRegion};
pub use send::{RingSend, SendRing};

use record::Record;

/// The most slots a ring may have (its record takes 12 bytes per slot besides the region).
pub const MAX_RING_SLOTS: u32 = 1 << 20;

/// What a ring of either kind is made of: the registered slots, the record of the posted ones,
/// and the source of their request ids.
#[derive(Debug)]
struct Core {
    region: SlotRegion,
    record: Record,
    ids: IdSource,
}

impl Core {
    fn new<T: Transport, S: QpState>(
        qp: &QueuePair<T, S>,
        count: u32,
        size: usize,
        recv: bool,
    ) -> Result<Self> {
        let what = if recv { "receive ring" } else { "send ring" };
        let region = SlotRegion::new(qp, count, size, MAX_RING_SLOTS, what)?;
        Ok(Self {
            record: Record::new(region.count()),
            region,
            ids: IdSource::new(recv),
        })
    }

    /// The tail slot, recorded as posted under a new id, if the ring posts to the queue pair
    /// whose tables are `tables` and the slot is free.
    #[inline]
    fn take_tail(
        &mut self,
        tables: &std::sync::Arc<crate::inflight::QpTables>,
        len: u32,
    ) -> Result<(u32, u64)> {
        if !self.region.is_for(tables) {
            return Err(other_qp());
        }
        self.push_tail(len)
    }

    /// The tail slot, recorded as posted under a new id, if it is free.
    #[inline]
    fn push_tail(&mut self, len: u32) -> Result<(u32, u64)> {
        let Some(index) = self.record.free_tail() else {
            return Err(ring_full());
        };
        let id = self.ids.next_u64()?;
        self.record.push(id, len);
        Ok((index, id))
    }

    /// Takes back the `count` newest posts, which the device never saw.
    #[cold]
    fn unpush(&mut self, count: usize) {
        for _ in 0..count {
            self.record.unpush();
        }
    }

    /// The post of the tail slot failed with `error`: the slot is free again unless the
    /// provider may have taken the request.
    #[cold]
    fn refused(&mut self, error: Error) -> Error {
        if !may_have_posted(&error) {
            self.record.unpush();
        }
        error
    }

    /// How many slots are free to post.
    fn free(&self) -> u32 {
        self.region.count() - self.record.posted()
    }

    /// Forgets every post, for `qp`, in RESET since they were made.
    fn reclaim<T: Transport>(&mut self, qp: &QueuePair<T, Reset>) -> Result<()> {
        if !self.region.is_for(qp.tables()) {
            return Err(other_qp());
        }
        self.record.clear();
        Ok(())
    }
}

impl Drop for Core {
    /// Gives the region back to the queue pair's keeping only if no slot is posted (the
    /// device may still use a posted slot); every slot is looked at, not the head alone.
    fn drop(&mut self) {
        if !self.record.any_posted() {
            self.region.release();
        }
    }
}

#[cold]
fn other_qp() -> Error {
    Error::InvalidArgument("the ring is bound to another queue pair".into())
}

#[cold]
fn ring_full() -> Error {
    Error::InvalidArgument("every slot of the ring is posted".into())
}
