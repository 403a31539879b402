//! [`SlotSendList`]: slot sends chained and posted with one doorbell by
//! [`QueuePair::post_send_slot_list`], each recorded as [`QueuePair::post_send_slot`] records
//! one.
//!
//! A post checks every request, records each under a new id (keeping a UD send's address
//! handle), builds the chain in the list's own storage and posts it. The requests the provider
//! did not take (a full queue, a refused request, a check that failed before anything was
//! posted) are taken back out of the record, newest first, and stay in the list with their
//! slots, so the caller can post them again or take their slots back.

use std::fmt;

use super::{Slot, SlotRefused, SlotRing, other_qp};
use crate::error::{Error, Result};
use crate::flags::SendFlags;
use crate::owned::{Chain, posted_before, run_after, with_chain};
use crate::qp::{QueuePair, Rts, Transport, next_run};
use crate::wr::{Operation, Payload, SendRequest, SendWr};

/// A list of slot send requests, posted with one doorbell by
/// [`QueuePair::post_send_slot_list`] (the slot path's [`OwnedSendList`](crate::owned::OwnedSendList)).
///
/// The storage is allocated once, by [`with_capacity`](Self::with_capacity); pushing and
/// posting allocate nothing. After a post the list holds the requests the queue pair did not
/// take (none when the post succeeded), with their slots: post it again, or take the slots
/// back with [`take_slots`](Self::take_slots).
///
/// ```no_run
/// # use rdma_verbs::{QueuePair, qp::{Rc, Rts}, slot::{SlotRing, SlotSendList}, wr::SendRequest};
/// # fn demo(qp: &mut QueuePair<Rc, Rts>, ring: &mut SlotRing) -> rdma_verbs::Result<()> {
/// let mut list = SlotSendList::with_capacity(32);
/// for n in 0..32 {
///     let Some(mut slot) = ring.take() else { break };
///     ring.fill(&mut slot, &[n; 64])?;
///     let request = SendRequest::send(slot).tag(u64::from(n));
///     // One completion for the chain: the last request's, which hands back every slot.
///     list.push(if n == 31 { request } else { request.unsignaled() })?;
/// }
/// qp.post_send_slot_list(ring, &mut list)?; // one doorbell
/// # Ok(()) }
/// ```
#[must_use = "a list does nothing until it is posted"]
pub struct SlotSendList<'a> {
    items: Vec<(SendWr<'a>, Slot)>,
    /// During a post, each recorded request's id and whether it is signaled.
    ids: Vec<(u64, bool)>,
    chain: Chain<SendRequest<'static>>,
}

impl<'a> SlotSendList<'a> {
    /// A list with room for `capacity` requests.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            items: Vec::with_capacity(capacity),
            ids: Vec::with_capacity(capacity),
            chain: Chain::with_capacity(capacity),
        }
    }

    /// Appends `request` (a slot's send, of any operation). Allocates nothing; the request is
    /// checked when the list is posted.
    ///
    /// # Errors
    ///
    /// [`SlotRefused`] with the request's slot and [`Error::InvalidArgument`] for a full list.
    pub fn push<K: Operation>(
        &mut self,
        request: SendRequest<'a, K, Slot>,
    ) -> std::result::Result<(), SlotRefused> {
        let (request, mut slot) = request.into_parts();
        if self.items.len() >= self.capacity() {
            return Err(SlotRefused {
                error: Error::InvalidArgument(format!(
                    "the slot send list is full ({} requests)",
                    self.capacity()
                )),
                slot: Some(slot),
            });
        }
        if request.has_atomic_result() {
            slot.len = 8;
        }
        self.items.push((request, slot));
        Ok(())
    }

    /// How many requests the list holds.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether the list holds no request.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// How many requests the list has room for.
    pub fn capacity(&self) -> usize {
        self.items
            .capacity()
            .min(self.ids.capacity())
            .min(self.chain.capacity())
    }

    /// Empties the list, handing back the slots of its requests (in order), for
    /// [`SlotRing::put`] or another post.
    pub fn take_slots(&mut self) -> impl Iterator<Item = Slot> + '_ {
        self.items.drain(..).map(|(_, slot)| slot)
    }
}

impl fmt::Debug for SlotSendList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotSendList")
            .field("len", &self.items.len())
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl<T: Transport> QueuePair<T, Rts> {
    /// Posts every request of `list` with one doorbell (`ibv_post_send` of a chain), each as
    /// [`post_send_slot`](Self::post_send_slot) posts one: its slot stays in `ring` until
    /// [`SlotRing::complete`] is given its completion, or a later one of this queue pair's
    /// sends of the ring, and comes back with the request's tag. Allocates nothing.
    ///
    /// Unsignaled requests produce no completion; signal the last of a list whose slots you
    /// want back. The last request is signaled whatever it asked when no slot of the ring is
    /// left free, and any request that would make too many unsignaled sends of this queue pair
    /// in a row (as for a single post, the run carried from request to request). A list the
    /// provider took only part of may leave its posted requests unsignaled: post the rest (a
    /// signaled last request brings their slots back), or they come back only with a later
    /// signaled send of the ring, or [`reclaim`](SlotRing::reclaim) after a reset.
    ///
    /// On success the list is empty. On error it holds, in order and with their slots, the
    /// requests the device did not get; those before them were posted.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`], nothing posted: a ring bound to another queue pair; a
    ///   slot of another ring, a length over the slot size, a READ or WRITE longer than its
    ///   remote memory (these name the request: `request 2: ...`); an operation the
    ///   transport does not carry, a UD request with no destination or another transport's
    ///   with one, an address handle of another protection domain (checked for the whole
    ///   chain); the process's request ids run out;
    /// - [`Error::QueueFull`] or [`Error::Post`] with `index`: the provider's queue was full,
    ///   or it refused that request; those before it were posted;
    /// - [`Error::PostIndeterminate`], or any error with verb `ibv_wr_complete` (the extended
    ///   path): the provider did not say what it took, so every request is taken as posted and
    ///   stays in the ring until a completion of its queue, a
    ///   [`reclaim`](SlotRing::reclaim) after a reset, or the queue pair's destruction; the
    ///   list is empty.
    ///
    /// # References
    ///
    /// [`ibv_post_send(3)`](https://man7.org/linux/man-pages/man3/ibv_post_send.3.html)
    #[doc(alias = "ibv_post_send")]
    pub fn post_send_slot_list(
        &mut self,
        ring: &mut SlotRing,
        list: &mut SlotSendList<'_>,
    ) -> Result<()> {
        if list.items.is_empty() {
            return Ok(());
        }
        if !ring.region.is_for(self.tables()) {
            return Err(other_qp());
        }
        for (n, (request, slot)) in list.items.iter().enumerate() {
            if let Err(error) = ring.check_send(request, slot) {
                return Err(Error::InvalidArgument(format!("request {n}: {error}")));
            }
        }
        // Record every request (newest last, as the record's search needs), each signaled as a
        // single post would be, the run carried from request to request; the last is signaled
        // too when no slot of the ring is free (the caller may have none left to post).
        let SlotSendList { items, ids, chain } = list;
        ids.clear();
        let (start, every) = (self.unsignaled_run(), ring.signal_every);
        let last = items.len() - 1;
        let mut run = start;
        let mut recorded = Ok(());
        for (n, (request, slot)) in items.iter().enumerate() {
            let id = match ring.record_send(request, slot, T::DATAGRAM) {
                Ok(id) => id,
                Err(error) => {
                    recorded = Err(error);
                    break;
                }
            };
            let asks = request.flags().contains(SendFlags::SIGNALED)
                || (n == last && ring.record.free_is_empty());
            run = next_run(run, asks, every);
            ids.push((id, run == 0));
        }
        let result = match recorded {
            Err(error) => Err(error),
            Ok(()) => {
                let region = &ring.region;
                with_chain(
                    chain,
                    items,
                    ids,
                    |(request, slot), id, signaled| {
                        let slice = super::raw_slice(region, slot.index, slot.len);
                        let mut flags = request.flags();
                        flags.set(SendFlags::SIGNALED, signaled);
                        request
                            .with_payload(Payload::Slice(slice))
                            .owned(id)
                            .set_flags(flags)
                    },
                    |chain| {
                        // SAFETY: for each request of the chain: it names its slot's first
                        // `len` bytes (at most the slot size, checked above), in the ring's
                        // region, which the queue pair keeps registered (attached when the
                        // ring was made; detached only by a ring with nothing posted, and by a
                        // successful `ibv_destroy_qp`); the slot is recorded as posted under
                        // the request's id, and its `Slot` leaves the list below once the post
                        // took the request (or stays in the list, taken back out of the
                        // record, if the device never saw it), so Rust reaches its bytes again
                        // only after the completion of this request, or of a later signaled
                        // one of this queue, is handed to the ring, or `reclaim` is given the
                        // queue pair in RESET. A UD request's address handle is kept by the
                        // record for as long as the entry. No scope can count these
                        // completions as its own: a queue pair with a ring refuses to open
                        // one. `remote` is the peer's memory.
                        unsafe { self.post_send(chain) }
                    },
                )
            }
        };
        let signals = ids.iter().map(|&(_, signaled)| signaled);
        let after = run_after(start, every, signals, ids.len(), &result);
        self.set_unsignaled_run(after);
        let posted = match &result {
            Ok(()) => ids.len(),
            Err(error) => posted_before(error, ids.len()),
        };
        // Take back, newest first, what the device did not get (the record takes back only
        // its newest entry); the slots stay in the list with their requests. An entry that
        // could not be taken back (none can: each is the newest when its turn comes) stays
        // recorded, and its slot leaves the list, lost, rather than be reachable twice.
        for n in (posted..ids.len()).rev() {
            if ring.record.unpush(false, ids[n].0).is_none() {
                debug_assert!(false, "a recorded request is the newest");
                let (_, lost) = items.remove(n);
                let _ = lost;
            }
        }
        items.drain(..posted);
        ids.clear();
        result
    }
}
