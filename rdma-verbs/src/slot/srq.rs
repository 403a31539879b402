//! [`SrqSlotRing`]: a slot ring bound to a shared receive queue, whose receives complete in
//! any order (each in the completion queue of the queue pair that consumed it).
//!
//! The record is one id per slot, and the id says which slot: a ring takes whole blocks of
//! ids from the process's counter (`crate::inflight`) and hands out `block + lap * step +
//! index`, where `step` is the slot count rounded up to a power of two and `lap` grows by one
//! at every post. So a completion finds its slot with a mask and one compare, in any order,
//! and no id is ever handed out twice: within a block each `lap` is used by one post, and no
//! other ring or table takes ids from a block this ring took.

use std::fmt;
use std::sync::atomic::Ordering;

use super::fill::{FillSlots, fill_chains};
use super::region::SlotRegion;
use super::{
    NEXT_RING, Slot, SlotRefused, fill_slot, other_ring, received_len, slot_bytes, slot_bytes_mut,
};
use crate::cq::WorkCompletion;
use crate::error::{Error, Result};
use crate::inflight::{BLOCK, NO_ID, RECV_ID_BIT, SrqTable, take_block};
use crate::qp::may_have_posted;
use crate::srq::SharedReceiveQueue;
use crate::wr::{Payload, RecvRequest};

/// The most slots an [`SrqSlotRing`] may have: the ids of one block of the process's id
/// counter (a slot's index is the low bits of its ids).
pub const MAX_SRQ_SLOTS: u32 = BLOCK as u32;

/// A shared receive queue's ring of registered slots (design and soundness:
/// [`docs::data_path`], "SRQ slot rings", and [`docs::safety`]). Made by
/// [`SharedReceiveQueue::slot_ring`]; its slots are posted with
/// [`SharedReceiveQueue::post_recv_slot`] and come back from [`complete`](Self::complete),
/// given the completion of their receive, polled from the completion queue of whichever queue
/// pair consumed it, in any order.
///
/// [`docs::data_path`]: crate::docs::data_path
/// [`docs::safety`]: crate::docs::safety
///
/// Its [`Slot`]s are those of a [`SlotRing`](crate::slot::SlotRing): a slot of one ring is refused
/// by every other. `Send` and `Sync`: posting and completing take it `&mut`, reading a slot's
/// bytes `&`.
pub struct SrqSlotRing {
    /// The registered slots, bound to the SRQ the ring posts to.
    region: SlotRegion<SrqTable>,
    /// This ring's number, which its slots carry.
    ring: u64,
    record: SrqRecord,
}

/// Which slots of an [`SrqSlotRing`] are posted, under which id, and which are free.
#[derive(Debug)]
struct SrqRecord {
    /// Per slot: the id of the receive it is posted under, or [`NO_ID`].
    ids: Box<[u64]>,
    /// Per slot: the tag of the receive it is posted under (its completion's slot's tag).
    tags: Box<[u64]>,
    /// Slots neither posted nor handed out (a stack: the last one back goes out first).
    free: Vec<u32>,
    /// How many slots are posted.
    posted: u32,
    /// The slot count rounded up to a power of two: how far apart the ids of two posts are.
    step: u64,
    /// `step - 1`: the bits of an id that are its slot's index.
    mask: u64,
    /// The next post's id, less the slot's index, and the end of the block it is in.
    next: u64,
    end: u64,
}

impl SrqRecord {
    /// A record of `count` slots (1 to [`MAX_SRQ_SLOTS`]), all free; no block taken yet.
    fn new(count: u32) -> Self {
        Self {
            ids: vec![NO_ID; count as usize].into_boxed_slice(),
            tags: vec![0; count as usize].into_boxed_slice(),
            free: (0..count).rev().collect(),
            posted: 0,
            step: u64::from(count.next_power_of_two()),
            mask: u64::from(count.next_power_of_two()) - 1,
            next: 0,
            end: 0,
        }
    }

    /// Records slot `index` (one the caller had out: neither free nor posted) as posted, and
    /// returns its new id.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`], nothing recorded, once the process has used every id, or for
    /// a slot the ring does not have or has posted already (neither can happen: see the
    /// callers).
    #[inline]
    fn post(&mut self, index: u32) -> Result<u64> {
        if self.next == self.end {
            self.renew()?;
        }
        let entry = self
            .ids
            .get_mut(index as usize)
            .ok_or_else(|| Error::InvalidArgument("no such slot".into()))?;
        if *entry != NO_ID {
            // Never: a slot is posted only from a `Slot` or the free list, neither of which a
            // posted slot is in. Refused rather than overwrite a live id, should it ever be.
            return Err(Error::InvalidArgument(format!(
                "slot {index} of the SRQ slot ring is posted already"
            )));
        }
        // `next` is a multiple of `step` and `index` below it: the sum has the index in its
        // low bits.
        let id = self.next | u64::from(index);
        *entry = id;
        self.next += self.step;
        self.posted += 1;
        Ok(id)
    }

    /// Takes a new block of ids: `BLOCK / step` posts (at least one: `step <= BLOCK`). A ring
    /// of more than 32,768 slots takes a block per post: about 2^46 posts of such rings use up
    /// the process's ids (months at ten million receives a second), after which every owned,
    /// slot and ring post of the process is refused.
    #[cold]
    fn renew(&mut self) -> Result<()> {
        let base = take_block(RECV_ID_BIT)?;
        self.next = base;
        self.end = base + BLOCK;
        Ok(())
    }

    /// Takes back the post of slot `index` under `id` (refused by the provider, which did not
    /// take the request): `false` if that is not what the slot is posted under.
    #[cold]
    fn unpost(&mut self, index: u32, id: u64) -> bool {
        match self.ids.get_mut(index as usize) {
            Some(entry) if *entry == id => {
                *entry = NO_ID;
                self.posted -= 1;
                true
            }
            _ => false,
        }
    }

    /// The receive `id` completed: its slot's index, out of the record. `None`, and nothing
    /// changes, if no slot is posted under `id`.
    #[inline]
    fn complete(&mut self, id: u64) -> Option<u32> {
        let index = (id & self.mask) as usize;
        let entry = self.ids.get_mut(index)?;
        // `NO_ID` marks a free slot; no receive has it (it lacks `RECV_ID_BIT`), but a
        // completion could still carry it, and must not match a free slot.
        if *entry != id || id == NO_ID {
            return None;
        }
        *entry = NO_ID;
        self.posted -= 1;
        Some(index as u32)
    }
}

impl SrqSlotRing {
    /// Hands out a slot that is neither posted nor out, its length the whole
    /// [`slot_size`](Self::slot_size); `None` if every slot is posted or out.
    #[inline]
    #[must_use = "a slot taken and dropped is lost to the ring"]
    pub fn take(&mut self) -> Option<Slot> {
        let index = self.record.free.pop()?;
        Some(Slot {
            ring: self.ring,
            index,
            len: self.region.size(),
            tag: 0,
        })
    }

    /// Gives `slot` back, for a later [`take`](Self::take).
    ///
    /// # Errors
    ///
    /// [`SlotRefused`] with the slot and [`Error::InvalidArgument`] for a slot of another ring.
    #[inline]
    pub fn put(&mut self, slot: Slot) -> std::result::Result<(), SlotRefused> {
        if slot.ring != self.ring {
            return Err(SlotRefused {
                error: other_ring(),
                slot: Some(slot),
            });
        }
        self.record.free.push(slot.index);
        Ok(())
    }

    /// The slot the completion `wc` hands back, if it completes a receive of this ring, its
    /// length set to the bytes received (see [`Slot::len`]; 0 after a failed receive, such as
    /// one flushed when the queue pair that consumed it went to the error state).
    ///
    /// `None` for a completion of any other request (of another ring, of another path, or
    /// one this ring has already taken): such completions change nothing, so completions may
    /// come from any poll of any completion queue, in any order.
    #[inline]
    #[must_use = "the slot a completion hands back is lost to the ring if dropped"]
    pub fn complete(&mut self, wc: &WorkCompletion) -> Option<Slot> {
        let index = self.record.complete(wc.wr_id())?;
        Some(Slot {
            ring: self.ring,
            index,
            len: received_len(wc, self.region.size()),
            tag: self.record.tags.get(index as usize).copied().unwrap_or(0),
        })
    }

    /// The first [`len`](Slot::len) bytes of `slot`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a slot of another ring, or a length over the slot size.
    #[inline]
    pub fn bytes<'a>(&'a self, slot: &'a Slot) -> Result<&'a [u8]> {
        slot_bytes(&self.region, self.ring, slot)
    }

    /// All [`slot_size`](Self::slot_size) bytes of `slot`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a slot of another ring.
    #[inline]
    pub fn bytes_mut<'a>(&'a self, slot: &'a mut Slot) -> Result<&'a mut [u8]> {
        slot_bytes_mut(&self.region, self.ring, slot)
    }

    /// Copies `data` into `slot` and sets its length.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a slot of another ring, or more bytes than a slot holds.
    pub fn fill(&self, slot: &mut Slot, data: &[u8]) -> Result<()> {
        fill_slot(&self.region, self.ring, slot, data)
    }

    /// The bytes a slot holds.
    pub fn slot_size(&self) -> usize {
        self.region.size() as usize
    }

    /// How many slots the ring has.
    pub fn slot_count(&self) -> u32 {
        self.region.count()
    }

    /// How many slots are posted: in flight, completed and not yet handed to
    /// [`complete`](Self::complete), or lost to the ring until it is dropped: a receive whose
    /// post's outcome the provider did not say and which never completes, or one a queue pair
    /// had taken from the SRQ when it was reset or destroyed (its completion discarded).
    pub fn posted(&self) -> u32 {
        self.record.posted
    }

    /// Whether the ring posts to `srq`.
    pub fn is_for(&self, srq: &SharedReceiveQueue) -> bool {
        self.region.is_for(&srq.inner.table)
    }
}

impl Drop for SrqSlotRing {
    /// Gives the region back from the SRQ's keeping only if nothing is posted (the device may
    /// still use a posted slot): then it is deregistered now; else the SRQ keeps it until it
    /// is destroyed.
    fn drop(&mut self) {
        if self.record.posted == 0 {
            self.region.release();
        }
    }
}

impl fmt::Debug for SrqSlotRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SrqSlotRing")
            .field("slot_size", &self.region.size())
            .field("slot_count", &self.region.count())
            .field("posted", &self.record.posted)
            .field("free", &self.record.free.len())
            .finish()
    }
}

/// An SRQ ring's free slots, as [`fill_chains`] takes them.
struct SrqFill<'a> {
    region: &'a SlotRegion<SrqTable>,
    record: &'a mut SrqRecord,
}

impl FillSlots for SrqFill<'_> {
    fn free(&self) -> u32 {
        self.record.free.len() as u32
    }

    #[inline]
    fn push(&mut self, _len: u32) -> Result<(u64, u64)> {
        let index = self
            .record
            .free
            .pop()
            .ok_or_else(|| Error::InvalidArgument("no free slot".into()))?;
        match self.record.post(index) {
            Ok(id) => {
                if let Some(tag) = self.record.tags.get_mut(index as usize) {
                    *tag = 0;
                }
                Ok((self.region.addr(index), id))
            }
            Err(error) => {
                self.record.free.push(index);
                Err(error)
            }
        }
    }

    fn unpush(&mut self, id: u64) {
        let index = (id & self.record.mask) as u32;
        if self.record.unpost(index, id) {
            self.record.free.push(index);
        }
    }
}

#[cold]
fn other_srq() -> Error {
    Error::InvalidArgument("the slot ring is bound to another shared receive queue".into())
}

impl SharedReceiveQueue {
    /// Registers `count` slots of `size` bytes (one region, in the SRQ's protection domain,
    /// local access only) as an [`SrqSlotRing`] bound to this SRQ. The SRQ keeps the region
    /// registered until it is destroyed, so that receives in flight stay valid whatever
    /// happens to the ring, unless the ring is dropped with nothing posted.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for no slot, a slot of no byte or of more than `u32::MAX`,
    /// more than [`MAX_SRQ_SLOTS`] slots, or a size that overflows; else as
    /// [`ProtectionDomain::register`](crate::ProtectionDomain::register).
    pub fn slot_ring(&self, count: u32, size: usize) -> Result<SrqSlotRing> {
        let region = SlotRegion::for_srq(self, count, size, MAX_SRQ_SLOTS, "SRQ slot ring")?;
        Ok(SrqSlotRing {
            ring: NEXT_RING.fetch_add(1, Ordering::Relaxed),
            record: SrqRecord::new(count),
            region,
        })
    }

    /// Posts a receive into every free slot of `ring` (neither posted nor out), handing the
    /// device up to 32 of them per `ibv_post_srq_recv` call (one doorbell): what a ring wants
    /// when it is made. Stops, without an error, at a full SRQ (the slots it did not post stay
    /// free). Returns how many receives it posted. Allocates nothing.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a ring bound to another SRQ (nothing posted); else a
    /// request the provider refused ([`Error::Post`]), or the process's request ids running
    /// out: the receives posted before it stay posted ([`SrqSlotRing::posted`] counts them)
    /// and the rest stay free, unless the provider did not say what it took
    /// ([`Error::PostIndeterminate`]): then every slot of that call stays posted.
    ///
    /// # References
    ///
    /// [`ibv_post_srq_recv(3)`](https://man7.org/linux/man-pages/man3/ibv_post_srq_recv.3.html)
    #[doc(alias = "ibv_post_srq_recv")]
    pub fn fill_slot_ring(&mut self, ring: &mut SrqSlotRing) -> Result<u32> {
        if !ring.region.is_for(&self.inner.table) {
            return Err(other_srq());
        }
        let size = ring.region.size();
        let lkey = ring.region.lkey();
        let mut slots = SrqFill {
            region: &ring.region,
            record: &mut ring.record,
        };
        fill_chains(&mut slots, size, lkey, |head, len| {
            // SAFETY: `fill_chains` passes `len` initialised requests, each linked to the next
            // and the last to none, each naming all the bytes of one free slot of the ring, now
            // recorded as posted under its id, as in `post_recv_slot`, whose argument holds for
            // each: the SRQ keeps the region registered, no `Slot` of a posted slot exists
            // (free slots have none), and only the completion carrying its id, unique in the
            // process, takes it out of the record.
            unsafe { self.post_recv_chain_raw(head, len) }
        })
    }

    /// Posts a receive into a slot (`RecvRequest::new(slot)`: all of its
    /// [`slot_size`](SrqSlotRing::slot_size) bytes): the slot stays in `ring` until
    /// [`SrqSlotRing::complete`] is given the receive's completion, from the completion queue
    /// of the queue pair that consumes it, which hands it back with the request's
    /// [`tag`](RecvRequest::tag). Allocates nothing. (On a UD queue pair the 40-byte GRH comes first: a slot too small for it fails
    /// its receive.)
    ///
    /// # Errors
    ///
    /// [`SlotRefused`], with the slot when the device never saw it:
    /// [`Error::InvalidArgument`] for a ring bound to another SRQ, a slot of another ring, or
    /// the process's request ids run out; else as [`post_recv_one`](Self::post_recv_one) (a
    /// full SRQ: [`Error::QueueFull`]).
    #[inline]
    pub fn post_recv_slot(
        &mut self,
        ring: &mut SrqSlotRing,
        request: RecvRequest<'_, Slot>,
    ) -> std::result::Result<(), SlotRefused> {
        let (tag, slot) = request.into_parts();
        let checked = if !ring.region.is_for(&self.inner.table) {
            Err(other_srq())
        } else if slot.ring != ring.ring {
            Err(other_ring())
        } else {
            ring.record.post(slot.index)
        };
        let id = match checked {
            Ok(id) => id,
            Err(error) => {
                return Err(SlotRefused {
                    error,
                    slot: Some(slot),
                });
            }
        };
        if let Some(kept) = ring.record.tags.get_mut(slot.index as usize) {
            *kept = tag;
        }
        let size = ring.region.size();
        let payload = Payload::Slice(crate::mr::MrSlice::from_raw_parts(
            ring.region.addr(slot.index),
            size,
            ring.region.lkey(),
        ));
        let request = RecvRequest::owned(payload, id);
        // SAFETY: the request names the slot's bytes, which lie in the ring's region. The SRQ
        // keeps that region registered (`slot_ring` attached it; only a ring with nothing
        // posted detaches it, and a successful `ibv_destroy_srq`), and the slot is recorded
        // as posted: its `Slot` is gone, so Rust cannot reach its bytes, until the completion
        // of this receive is handed to the ring (found by its id, which no other request of
        // the process has), or this post fails without the device having seen it.
        match unsafe { self.post_recv_one(&request) } {
            Ok(()) => Ok(()),
            Err(error) => {
                if may_have_posted(&error) || !ring.record.unpost(slot.index, id) {
                    return Err(SlotRefused { error, slot: None });
                }
                Err(SlotRefused {
                    error,
                    slot: Some(slot),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inflight::OWNED_ID_BIT;

    /// Ids name their slot in their low bits, are never handed out twice (across blocks too),
    /// and a completion finds its slot in any order, once; stale, foreign and `NO_ID`
    /// completions match nothing; a refused post is taken back.
    #[test]
    fn srq_record_completes_in_any_order() {
        for count in [1u32, 3, 8] {
            let mut record = SrqRecord::new(count);
            let mut seen = std::collections::HashSet::new();
            let mut live: Vec<(u32, u64)> = Vec::new();
            let mut stale = Vec::new();
            let rounds = if cfg!(miri) { 300 } else { 70_000 };
            for round in 0..rounds {
                while let Some(index) = record.free.pop() {
                    let id = record.post(index).unwrap();
                    assert_eq!(
                        id & (OWNED_ID_BIT | RECV_ID_BIT),
                        OWNED_ID_BIT | RECV_ID_BIT
                    );
                    assert_eq!(id & record.mask, u64::from(index));
                    assert!(seen.insert(id), "id {id:#x} handed out twice");
                    live.push((index, id));
                }
                assert_eq!(record.posted, count);
                assert_eq!(record.complete(NO_ID), None);
                assert_eq!(record.complete(0), None);
                // Complete one from a position that varies with the round.
                let (index, id) = live.remove((round * 7 + 3) % live.len());
                assert_eq!(record.complete(id), Some(index));
                assert_eq!(record.complete(id), None, "taken once");
                // The slot's entry is `NO_ID` now: a completion carrying it matches nothing.
                assert_eq!(record.complete(NO_ID), None, "a free slot's entry");
                assert!(record.post(index).is_ok_and(|again| {
                    record.post(index).is_err() && record.unpost(index, again)
                }));
                for &old in stale.iter().rev().take(4) {
                    assert_eq!(record.complete(old), None, "stale");
                }
                stale.push(id);
                if round % 5 == 0 {
                    // A refused post of the freed slot is taken back; a wrong id is not.
                    let again = record.post(index).unwrap();
                    assert!(!record.unpost(index, again ^ record.step));
                    assert!(record.unpost(index, again));
                    assert_eq!(record.complete(again), None);
                }
                record.free.push(index);
                assert_eq!(record.posted, count - 1);
            }
        }
    }

    /// The largest ring: every index's bit is in the mask, each post takes a block of its own
    /// (one lap per block), and the first and last slots are found from their ids, in any
    /// order, across blocks.
    #[test]
    fn srq_record_at_the_most_slots() {
        let mut record = SrqRecord::new(MAX_SRQ_SLOTS);
        assert_eq!(
            (record.step, record.mask),
            (u64::from(MAX_SRQ_SLOTS), u64::from(MAX_SRQ_SLOTS) - 1)
        );
        let last = MAX_SRQ_SLOTS - 1;
        let mut previous = None;
        for _ in 0..3 {
            let (low, high) = (record.post(0).unwrap(), record.post(last).unwrap());
            assert_eq!(
                (low & record.mask, high & record.mask),
                (0, u64::from(last))
            );
            // Other tests of this process take blocks too: the next block is a later one, not
            // necessarily the one after.
            assert!(high & !record.mask > low & !record.mask, "a block per post");
            assert_eq!(record.next, (high & !record.mask) + BLOCK);
            if let Some(previous) = previous {
                assert!(low > previous, "blocks only go up");
            }
            previous = Some(high);
            assert_eq!(record.posted, 2);
            assert_eq!(record.complete(high), Some(last));
            assert_eq!(record.complete(low ^ 1), None, "another slot's index");
            assert_eq!(record.complete(low), Some(0));
            assert_eq!(record.complete(high), None);
            assert_eq!(record.posted, 0);
        }
    }

    /// Slot rings and slots may move to another thread, and be shared (`&` gives only
    /// reads): what their docs say.
    #[test]
    fn rings_are_send_and_sync() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<SrqSlotRing>();
        send_sync::<crate::slot::SlotRing>();
        send_sync::<Slot>();
    }
}
