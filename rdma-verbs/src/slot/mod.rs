//! [`SlotRing`]: a queue pair's own ring of registered slots, the data path with the least
//! bookkeeping (`docs/data-path.md`, "Slot rings").
//!
//! A ring is one registered region cut into `count` slots, bound for life to the queue pair
//! that made it ([`QueuePair::slot_ring`]). A [`Slot`] is the right to one slot's bytes: the
//! ring hands each slot out once ([`SlotRing::take`]), posting moves the slot into the ring's
//! record of the queue it went to, and only the completion of that request
//! ([`SlotRing::complete`], given the [`WorkCompletion`] the caller polled) hands it back.
//! Unlike the owned-buffer path nothing is shared between threads: the ring is the caller's
//! (`&mut` to post and to complete), so there is no lock, no reference count per request, no
//! pool, and no route from a completion queue to the tables of its queue pairs: the caller,
//! who polled the completion, hands it to the ring of its queue pair.
//!
//! Files: `record.rs` (which slots are posted, under which ids, and which are free; on UD the
//! address handles of the sends posted), `post.rs` (the posts, and what a refused one gives
//! back), `fill.rs` (receives posted in chains, one doorbell each), `region.rs` (the
//! registered slots and what keeps them registered), `srq.rs` ([`SrqSlotRing`], the same
//! slots bound to a shared receive queue, completed in any order); this file holds the ring,
//! its slots, and the byte access both kinds of ring share.
//!
//! Why it is sound:
//! - a slot's bytes are reachable from Rust only through its [`Slot`], of which there is one
//!   per slot out of flight, and none while the slot is posted;
//! - a posted slot leaves the record only with the completion of its request, or of a later
//!   request of the same queue (a queue completes in order), found by the request's id: ids
//!   are unique in the process (the owned path's id source), and the other post paths refuse
//!   ids of that form, so no other completion, stale or copied, can match one;
//! - the region stays registered while the device may use it: the queue pair keeps it (an
//!   attachment of its in-flight tables) until `ibv_destroy_qp` has returned, unless the ring
//!   is dropped with nothing posted;
//! - a ring posts only to its own queue pair (checked on every post), and no peer can write
//!   its region (registered without remote rights).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::cq::WorkCompletion;
use crate::error::{Error, Result};
use crate::inflight::{IdSource, RECV_ID_BIT};
use crate::mr::MrSlice;
use crate::qp::{QpState, QueuePair, Reset, Transport};
mod fill;
mod list;
mod post;
mod record;
mod region;
mod srq;

use region::{Keeper, SlotRegion};

pub use list::SlotSendList;
pub use post::SlotRefused;
use record::{Posted, Record};
pub use srq::{MAX_SRQ_SLOTS, SrqSlotRing};

/// The rings of the process are numbered from 1, so that a [`Slot`] names its ring.
static NEXT_RING: AtomicU64 = AtomicU64::new(1);

/// The most slots a ring may have. A ring's record takes 52 to 100 bytes per slot besides the
/// region (both queues' records have room for every slot, rounded up to a power of two).
pub const MAX_SLOTS: u32 = 1 << 20;

/// A queue pair's ring of registered slots (design and soundness: [`docs::data_path`], "Slot
/// rings", and [`docs::safety`]). Made by [`QueuePair::slot_ring`].
///
/// [`docs::data_path`]: crate::docs::data_path
/// [`docs::safety`]: crate::docs::safety
///
/// One ring serves both queues of its queue pair, and one completion queue may serve both:
/// [`complete`](Self::complete) tells a completion of this ring from any other, and a receive
/// from a send.
///
/// ```no_run
/// # use rdma_verbs::{CompletionQueue, QueuePair, qp::{Rc, Rts}, wr::{RecvRequest, SendRequest}};
/// # use rdma_verbs::cq::WorkCompletion;
/// # fn demo(qp: &mut QueuePair<Rc, Rts>, cq: &mut CompletionQueue) -> rdma_verbs::Result<()> {
/// let mut ring = qp.slot_ring(32, 4096)?;
/// let mut out = ring.take().expect("a free slot"); // held out for a send
/// qp.fill_slot_ring(&mut ring)?; // the other 31 slots: receives, one doorbell
/// ring.fill(&mut out, b"hello")?;
/// qp.post_send_slot(&mut ring, SendRequest::send(out).tag(7))?;
/// let mut wcs = [WorkCompletion::default(); 16];
/// for wc in cq.poll(&mut wcs)? {
///     let Some(slot) = ring.complete(wc) else { continue }; // not this ring's
///     if wc.is_success() && wc.is_recv() {
///         println!("{:?}", ring.bytes(&slot)?);
///         qp.post_recv_slot(&mut ring, RecvRequest::new(slot))?; // read: posted again
///     } else {
///         ring.put(slot)?; // the send's (tag 7), or a failed request's: free to take again
///     }
/// }
/// # Ok(()) }
/// ```
///
/// `Send` and `Sync`: posting and completing take it `&mut`, reading a slot's bytes `&`.
pub struct SlotRing {
    /// The registered slots, bound to the queue pair the ring posts to.
    region: SlotRegion,
    /// At most `signal_every - 1` unsignaled sends of the queue pair in a row (counted by the
    /// queue pair, for all its rings and its owned sends): the next is signaled. The smaller
    /// of the slot count and the send queue's capacity.
    signal_every: u32,
    /// This ring's number, which its slots carry.
    ring: u64,
    send_ids: IdSource,
    recv_ids: IdSource,
    /// Which slots are posted (to which queue, under which id) and which are free.
    record: Record,
}

/// The right to one slot's bytes, until it is posted or given back ([`SlotRing::put`]).
///
/// Not `Clone`: there is one per slot out of flight. It reaches its bytes through its ring
/// ([`SlotRing::bytes`], [`SlotRing::bytes_mut`]). Dropping it loses the slot until the ring
/// is dropped.
#[must_use = "a dropped slot is lost to its ring: post it, or give it back with SlotRing::put"]
pub struct Slot {
    ring: u64,
    index: u32,
    len: u32,
    tag: u64,
}

impl Slot {
    /// The slot's index in its ring.
    #[inline]
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The bytes in use: what a send carries (the whole slot when taken), and after a receive
    /// what arrived (0 after a failed receive, and after an RDMA WRITE with immediate, whose
    /// bytes went to the target memory). On UD the 40-byte GRH comes first.
    #[inline]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// The tag of the request that carried the slot
    /// ([`SendRequest::tag`](crate::wr::SendRequest::tag), [`RecvRequest::tag`](crate::wr::RecvRequest::tag)),
    /// once its completion handed the slot back (0 for a receive a fill posted). A slot taken
    /// from its ring has tag 0; one a refused post gives back has 0 or the tag it had.
    #[inline]
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// Whether no byte is in use.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sets the bytes in use. At most the ring's [`slot_size`](SlotRing::slot_size): a
    /// longer length is refused when the slot is sent or its bytes are read (a receive uses
    /// the whole slot, whatever the length).
    #[inline]
    pub fn set_len(&mut self, len: usize) {
        self.len = u32::try_from(len).unwrap_or(u32::MAX);
    }
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot")
            .field("index", &self.index)
            .field("len", &self.len)
            .field("tag", &self.tag)
            .finish()
    }
}

impl SlotRing {
    /// Hands out a slot that is neither posted nor out, its length the whole
    /// [`slot_size`](Self::slot_size); `None` if every slot is posted or out.
    #[inline]
    #[must_use = "a slot taken and dropped is lost to the ring"]
    pub fn take(&mut self) -> Option<Slot> {
        let index = self.record.take_free()?;
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
        self.record.put_free(slot.index);
        Ok(())
    }

    /// The slot the completion `wc` hands back, if it completes a request of this ring: its
    /// length set to the bytes received for a receive (see [`Slot::len`]), as posted for a
    /// send. A send completion also releases the unsignaled sends of this ring posted before
    /// it (its queue completes in order): they return to the ring, for [`take`](Self::take).
    ///
    /// `None` for a completion of any other request (of another ring, of another path, or
    /// one this ring has already taken): such completions change nothing, so completions may
    /// come from any poll of any completion queue (one that several queue pairs share,
    /// [`CompletionQueue::poll`](crate::CompletionQueue::poll), a [`Completion`]'s
    /// [`wc`](crate::owned::Completion::wc) from
    /// [`CompletionQueue::poll_each`](crate::CompletionQueue::poll_each)).
    ///
    /// On UD, the slot of a send comes back with the address handle its request named let go
    /// (the last clone of a handle destroys it: `ibv_destroy_ah`, inside this call).
    ///
    /// Hand the completions of one queue over in the order they were polled. A completion
    /// handed over before an earlier one of its queue frees the earlier request's slot with
    /// it (the device is done with it), and the earlier completion then matches nothing: what
    /// that receive brought is lost (the slot goes back to the ring, for `take`).
    ///
    /// [`Completion`]: crate::owned::Completion
    #[inline]
    #[must_use = "the slot a completion hands back is lost to the ring if dropped"]
    pub fn complete(&mut self, wc: &WorkCompletion) -> Option<Slot> {
        let id = wc.wr_id();
        let recv = id & RECV_ID_BIT != 0;
        let posted = self.record.complete(recv, id)?;
        let len = if recv {
            received_len(wc, self.region.size())
        } else {
            posted.len
        };
        Some(Slot {
            ring: self.ring,
            index: posted.index,
            len,
            tag: posted.tag,
        })
    }

    /// Frees every slot still posted, to either queue, once the ring's queue pair `qp` is in
    /// RESET: a reset discards the queue pair's requests without completions, so the device
    /// uses none of their slots any more; they return to the ring, for
    /// [`take`](Self::take). A completion polled afterwards that was made before the reset
    /// matches nothing. (Also what frees the slots of posts whose outcome the provider did not
    /// say.) The slots out of the ring (a [`Slot`] the caller holds) are not touched.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a queue pair the ring is not bound to.
    pub fn reclaim<T: Transport>(&mut self, qp: &QueuePair<T, Reset>) -> Result<()> {
        if !self.region.is_for(qp.tables()) {
            return Err(other_qp());
        }
        self.record.clear_posted();
        Ok(())
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

    /// All [`slot_size`](Self::slot_size) bytes of `slot`, to write what it will send (set
    /// its [`len`](Slot::len) to match).
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
    /// [`complete`](Self::complete), or held for requests that may never complete (discarded
    /// by a reset, or whose post's outcome the provider did not say) until a later completion
    /// of their queue, or [`reclaim`](Self::reclaim) after a reset, frees them.
    pub fn posted(&self) -> u32 {
        (self.record.send.len() + self.record.recv.len()) as u32
    }

    /// Whether the ring posts to `qp`.
    pub fn is_for<T: Transport, S: QpState>(&self, qp: &QueuePair<T, S>) -> bool {
        self.region.is_for(qp.tables())
    }

    /// The slot's length, checked against the ring and the slot size.
    #[inline]
    fn check(&self, slot: &Slot) -> Result<usize> {
        check_slot(&self.region, self.ring, slot)
    }

    /// The slot's bytes as the work request names them: its first `len`.
    #[inline]
    fn raw_slice(&self, index: u32, len: u32) -> MrSlice<'static> {
        raw_slice(&self.region, index, len)
    }
}

/// The first `len` bytes of slot `index` of `region`, as a work request names them.
#[inline]
fn raw_slice(region: &SlotRegion, index: u32, len: u32) -> MrSlice<'static> {
    MrSlice::from_raw_parts(region.addr(index), len, region.lkey())
}

/// `slot`'s length, checked against the ring `ring` (whose region is `region`) and the slot
/// size.
#[inline]
fn check_slot<K: Keeper>(region: &SlotRegion<K>, ring: u64, slot: &Slot) -> Result<usize> {
    if slot.ring != ring {
        return Err(other_ring());
    }
    if slot.len > region.size() {
        return Err(too_long(slot.len, region.size()));
    }
    Ok(slot.len as usize)
}

/// The first [`len`](Slot::len) bytes of `slot`, a slot of ring `ring`, whose region is
/// `region`, checked ([`check_slot`]).
#[inline]
fn slot_bytes<'a, K: Keeper>(
    region: &'a SlotRegion<K>,
    ring: u64,
    slot: &'a Slot,
) -> Result<&'a [u8]> {
    let len = check_slot(region, ring, slot)?;
    // SAFETY: the slot lies in the region, which its ring keeps (a `Slot` of ring `ring`
    // names one of its slots: only that ring makes them); `slot` is the one right to these
    // bytes (the device uses them only while the slot is posted, when no `Slot` for it
    // exists), and the result borrows `slot`, so no `slot_bytes_mut` of it (which needs
    // `&mut Slot`) can run while the result lives.
    Ok(unsafe { std::slice::from_raw_parts(region.ptr(slot.index), len) })
}

/// All the bytes of `slot`, a slot of ring `ring`, whose region is `region`.
#[inline]
fn slot_bytes_mut<'a, K: Keeper>(
    region: &'a SlotRegion<K>,
    ring: u64,
    slot: &'a mut Slot,
) -> Result<&'a mut [u8]> {
    if slot.ring != ring {
        return Err(other_ring());
    }
    // SAFETY: as in `slot_bytes`; `&mut slot` makes the access unique, and slots do not
    // overlap (`stride >= size`).
    Ok(unsafe { std::slice::from_raw_parts_mut(region.ptr(slot.index), region.size() as usize) })
}

/// Copies `data` into `slot` (of ring `ring`, whose region is `region`) and sets its length.
fn fill_slot<K: Keeper>(
    region: &SlotRegion<K>,
    ring: u64,
    slot: &mut Slot,
    data: &[u8],
) -> Result<()> {
    let bytes = slot_bytes_mut(region, ring, slot)?;
    let target = bytes.get_mut(..data.len()).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{} bytes do not fit a slot of {} bytes",
            data.len(),
            region.size()
        ))
    })?;
    target.copy_from_slice(data);
    slot.set_len(data.len());
    Ok(())
}

/// The length a receive completion `wc` gives its slot of `size` bytes: what arrived, 0 after
/// a failure or an RDMA WRITE with immediate (whose bytes went elsewhere).
#[inline]
fn received_len(wc: &WorkCompletion, size: u32) -> u32 {
    if !wc.is_success() || wc.is_recv_rdma_with_imm() {
        0
    } else {
        wc.byte_len().min(size)
    }
}

impl Drop for SlotRing {
    /// Gives the region back to the queue pair's keeping only if nothing is posted (the
    /// device may still use a posted slot): then it is deregistered now, and the queue pair
    /// may open a scope again once it has no other ring. Else the queue pair keeps the region,
    /// and the address handles of UD sends posted, until it is destroyed.
    fn drop(&mut self) {
        if self.record.send.len() + self.record.recv.len() == 0 {
            self.region.release();
            return;
        }
        // The device may still use the address handles of UD sends posted: the queue pair
        // keeps them, with the region, until it is destroyed.
        for ah in self.record.take_dests() {
            self.region.keep(ah.keep_alive());
        }
    }
}

impl fmt::Debug for SlotRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotRing")
            .field("slot_size", &self.region.size())
            .field("slot_count", &self.region.count())
            .field("posted_sends", &self.record.send.len())
            .field("posted_receives", &self.record.recv.len())
            .field("free", &self.record.free_len())
            .finish()
    }
}

#[cold]
fn other_ring() -> Error {
    Error::InvalidArgument("the slot belongs to another ring".into())
}

#[cold]
fn too_long(len: u32, size: u32) -> Error {
    Error::InvalidArgument(format!(
        "a slot length of {len} bytes exceeds the slot size of {size}"
    ))
}

#[cold]
fn other_qp() -> Error {
    Error::InvalidArgument("the slot ring is bound to another queue pair".into())
}

impl<T: Transport, S: QpState> QueuePair<T, S> {
    /// Registers `count` slots of `size` bytes (one region, in the queue pair's protection
    /// domain, local access only) as a [`SlotRing`] bound to this queue pair. The queue pair
    /// keeps the region registered until it is destroyed, so that requests in flight stay
    /// valid whatever happens to the ring, unless the ring is dropped with nothing posted. A
    /// queue pair with a ring (or the region of one dropped with slots posted) cannot open a
    /// [`scope`](QueuePair::scope), whose count of completions the ring's would upset.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for no slot, a slot of no byte or of more than `u32::MAX`,
    /// more than [`MAX_SLOTS`] slots, or a size that overflows; else as
    /// [`ProtectionDomain::register`](crate::ProtectionDomain::register).
    pub fn slot_ring(&self, count: u32, size: usize) -> Result<SlotRing> {
        let region = SlotRegion::new(self, count, size, MAX_SLOTS, "slot ring")?;
        Ok(SlotRing {
            signal_every: count.min(self.caps().max_send_wr).max(1),
            ring: NEXT_RING.fetch_add(1, Ordering::Relaxed),
            send_ids: IdSource::new(false),
            recv_ids: IdSource::new(true),
            record: Record::new(count, T::DATAGRAM),
            region,
        })
    }
}
