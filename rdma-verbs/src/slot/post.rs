//! Posting slots: [`QueuePair::post_recv_slot`], [`QueuePair::fill_slot_ring`],
//! [`QueuePair::post_send_slot`] with a [`SendRequest`] of a [`Slot`], and [`SlotRefused`],
//! what a refused post gives back.

use std::fmt;

use super::fill::{FillSlots, fill_chains};
use super::{Posted, Slot, SlotRing, other_qp, other_ring};
use crate::ah::AddressHandle;
use crate::error::{Error, Result};
use crate::flags::SendFlags;
use crate::mr::RemoteMemory;
use crate::owned::check_room;
use crate::qp::{CanPostRecv, QueuePair, Rts, Transport, may_have_posted};
use crate::wr::{AtomicTarget, IntoMemory, Operation, RecvMemory, SendOp, memory_sealed};
use crate::wr::{Payload, RecvRequest, SendRequest, SendWr};

/// A slot post the queue pair did not take: the error, and the slot, which the device never
/// saw (`None` when the provider did not say whether it took the request: the slot then
/// stays posted until a completion of its queue, a [`SlotRing::reclaim`](crate::slot::SlotRing::reclaim)
/// after a reset, or the queue pair's destruction).
#[derive(Debug)]
pub struct SlotRefused {
    pub(super) error: Error,
    pub(super) slot: Option<Slot>,
}

impl SlotRefused {
    /// Why the post failed.
    pub fn error(&self) -> &Error {
        &self.error
    }

    /// The error and the slot.
    pub fn into_parts(self) -> (Error, Option<Slot>) {
        (self.error, self.slot)
    }

    /// The slot, if it came back.
    pub fn into_slot(self) -> Option<Slot> {
        self.slot
    }
}

impl fmt::Display for SlotRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl std::error::Error for SlotRefused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<SlotRefused> for Error {
    fn from(refused: SlotRefused) -> Self {
        refused.error
    }
}

impl memory_sealed::Sealed for Slot {}
impl IntoMemory<'_, Slot> for Slot {
    /// The slot's bytes are named when the request is posted, from its ring.
    #[inline]
    fn into_memory(self) -> (Payload<'static>, Slot) {
        (Payload::None, self)
    }
}
impl AtomicTarget<'_, Slot> for Slot {}
impl RecvMemory<'_, Slot> for Slot {
    /// The slot's bytes (all of them) are named when the request is posted, from its ring.
    #[inline]
    fn into_recv_memory(self) -> (Payload<'static>, Slot) {
        (Payload::None, self)
    }
}

impl RecvRequest<'_, Slot> {
    /// The slot, for a request that will not be posted.
    pub fn into_slot(self) -> Slot {
        self.into_parts().1
    }
}

impl<K: Operation> SendRequest<'_, K, Slot> {
    /// The slot, for a request that will not be posted.
    pub fn into_slot(self) -> Slot {
        self.into_parts().1
    }
}

impl<'a> SendRequest<'a, SendOp, Slot> {
    /// Addresses a datagram (UD): to queue pair `remote_qpn` behind `ah`, with Q_Key
    /// `remote_qkey`. Required for every request posted to a UD queue pair, refused on the
    /// others. The ring keeps `ah` alive (a clone) until the slot comes back.
    #[inline]
    pub fn to(self, ah: &'a AddressHandle, remote_qpn: u32, remote_qkey: u32) -> Self {
        self.with_dest(ah, remote_qpn, remote_qkey)
    }
}

#[cold]
fn longer_than_remote(len: u32, remote: &RemoteMemory) -> Error {
    Error::InvalidArgument(format!(
        "{len} bytes against {} bytes of remote memory",
        remote.len
    ))
}

#[cold]
fn record_full() -> Error {
    Error::InvalidArgument("the slot ring's record is full (a slot posted twice?)".into())
}

/// A queue pair's ring's free slots, as [`fill_chains`] takes them: each posted as a receive
/// of all its bytes.
struct RecvFill<'a> {
    ring: &'a mut SlotRing,
}

impl FillSlots for RecvFill<'_> {
    fn free(&self) -> u32 {
        self.ring.record.free_len() as u32
    }

    #[inline]
    fn push(&mut self, len: u32) -> Result<(u64, u64)> {
        let ring = &mut *self.ring;
        let index = ring
            .record
            .take_free()
            .ok_or_else(|| Error::InvalidArgument("no free slot".into()))?;
        let recorded = ring.recv_ids.next().and_then(|id| {
            let posted = Posted {
                id: id.get(),
                tag: 0,
                index,
                len,
            };
            if ring.record.push(true, posted) {
                Ok(posted.id)
            } else {
                Err(record_full())
            }
        });
        match recorded {
            Ok(id) => Ok((ring.region.addr(index), id)),
            Err(error) => {
                ring.record.put_free(index);
                Err(error)
            }
        }
    }

    fn unpush(&mut self, id: u64) {
        if let Some(posted) = self.ring.record.unpush(true, id) {
            self.ring.record.put_free(posted.index);
        }
    }
}

impl<T: Transport, S: CanPostRecv> QueuePair<T, S> {
    /// Posts a receive into a slot (`RecvRequest::new(slot)`: all of its
    /// [`slot_size`](SlotRing::slot_size) bytes): the slot stays in `ring` until
    /// [`SlotRing::complete`] is given the receive's completion, which hands it back with the
    /// request's [`tag`](RecvRequest::tag) ([`Slot::tag`]). Allocates nothing.
    ///
    /// ```no_run
    /// # use rdma_verbs::{QueuePair, qp::{Rc, Rts}, slot::SlotRing, wr::RecvRequest};
    /// # fn demo(qp: &mut QueuePair<Rc, Rts>, ring: &mut SlotRing) -> rdma_verbs::Result<()> {
    /// let slot = ring.take().expect("a free slot");
    /// qp.post_recv_slot(ring, RecvRequest::new(slot).tag(3))?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`SlotRefused`], with the slot when the device never saw it:
    /// [`Error::InvalidArgument`] for a ring bound to another queue pair, a slot of another
    /// ring, a UD queue pair's slot with no room for the GRH; else as
    /// [`post_recv_one`](Self::post_recv_one).
    #[inline]
    pub fn post_recv_slot(
        &mut self,
        ring: &mut SlotRing,
        request: RecvRequest<'_, Slot>,
    ) -> std::result::Result<(), SlotRefused> {
        let (tag, slot) = request.into_parts();
        if !ring.region.is_for(self.tables()) || slot.ring != ring.ring {
            let error = if slot.ring != ring.ring {
                other_ring()
            } else {
                other_qp()
            };
            return Err(SlotRefused {
                error,
                slot: Some(slot),
            });
        }
        if let Err(error) = check_room::<T>(ring.region.size() as usize) {
            return Err(SlotRefused {
                error,
                slot: Some(slot),
            });
        }
        let id = match ring.recv_ids.next() {
            Ok(id) => id.get(),
            Err(error) => {
                return Err(SlotRefused {
                    error,
                    slot: Some(slot),
                });
            }
        };
        let payload = Payload::Slice(ring.raw_slice(slot.index, ring.region.size()));
        let posted = Posted {
            id,
            tag,
            index: slot.index,
            len: ring.region.size(),
        };
        if !ring.record.push(true, posted) {
            return Err(SlotRefused {
                error: record_full(),
                slot: Some(slot),
            });
        }
        let request = RecvRequest::owned(payload, id);
        // SAFETY: the request names the slot's bytes, which lie in the ring's region. The queue
        // pair keeps that region registered (`slot_ring` attached it; only a ring with nothing
        // posted detaches it, and a successful `ibv_destroy_qp`), and the slot is recorded as
        // posted: its `Slot` is gone, so Rust cannot reach its bytes, until the completion of
        // this receive (or a later one of this queue, which completes in order) is handed to
        // the ring, or this post fails without the device having seen it. The id has
        // `OWNED_ID_BIT` and is unique in the process, so no other completion can release the
        // slot. No scope can count this receive's completion as its own (the contract's other
        // clause): a queue pair with a ring's region attached refuses to open one.
        match unsafe { self.post_recv_one(&request) } {
            Ok(()) => Ok(()),
            Err(error) => Err(refused(ring, true, id, error)),
        }
    }
}

impl<T: Transport, S: CanPostRecv> QueuePair<T, S> {
    /// Posts a receive into every free slot of `ring` (neither posted nor out: take the slots
    /// meant for sends out first), handing the device up to 32 of them per `ibv_post_recv`
    /// call (one doorbell): what a ring of receives wants when it is made, and after a batch
    /// of completions whose slots went back ([`SlotRing::put`]). Stops, without an error, at a
    /// full receive queue (the slots it did not post stay free). Returns how many receives it
    /// posted. Each comes back as [`post_recv_slot`](Self::post_recv_slot)'s do, through
    /// [`SlotRing::complete`]. Allocates nothing.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a ring bound to another queue pair, a queue pair that
    /// receives through an SRQ, a UD queue pair's slot with no room for the GRH (nothing
    /// posted); else a request the provider refused ([`Error::Post`]), or the process's
    /// request ids running out: the receives posted before it stay posted
    /// ([`SlotRing::posted`] counts them) and the rest stay free, unless the provider did not
    /// say what it took ([`Error::PostIndeterminate`]): then every slot of that call stays
    /// posted, until a completion of its queue, a [`reclaim`](SlotRing::reclaim) after a
    /// reset, or the queue pair's destruction.
    ///
    /// # References
    ///
    /// [`ibv_post_recv(3)`](https://man7.org/linux/man-pages/man3/ibv_post_recv.3.html)
    #[doc(alias = "ibv_post_recv")]
    pub fn fill_slot_ring(&mut self, ring: &mut SlotRing) -> Result<u32> {
        if !ring.region.is_for(self.tables()) {
            return Err(other_qp());
        }
        self.check_no_srq()?;
        check_room::<T>(ring.region.size() as usize)?;
        let (size, lkey) = (ring.region.size(), ring.region.lkey());
        fill_chains(&mut RecvFill { ring }, size, lkey, |head, len| {
            // SAFETY: `fill_chains` passes `len` initialised requests, each linked to the next
            // and the last to none, each naming all the bytes of one free slot of the ring, now
            // recorded as posted under its id, as in `post_recv_slot`, whose argument holds for
            // each: the queue pair keeps the region registered, no `Slot` of a posted slot
            // exists (free slots have none), only the completion carrying its id (unique in the
            // process), or a later one of this queue, takes it out of the record, and no scope
            // can open on a queue pair with a ring. The queue pair has no SRQ (checked above).
            unsafe { self.post_recv_chain_raw(head, len) }
        })
    }
}

impl SlotRing {
    /// What a send from `slot` must be, checked before it is recorded (by the single post and
    /// the list alike): a slot of this ring, at most the slot size, no longer than a READ's or
    /// WRITE's remote memory.
    #[inline]
    pub(super) fn check_send(&self, request: &SendWr<'_>, slot: &Slot) -> Result<()> {
        let len = self.check(slot)?;
        match request.rdma_remote() {
            Some(remote) if len as u64 > u64::from(remote.len) => {
                Err(longer_than_remote(len as u32, &remote))
            }
            _ => Ok(()),
        }
    }

    /// Records a send of `request` from `slot` under a new id, the newest entry of the send
    /// queue's record, and on a `datagram` (UD) ring keeps its address handle until the slot
    /// leaves the record (a refusal taken back included). Returns the id.
    #[inline]
    pub(super) fn record_send(
        &mut self,
        request: &SendWr<'_>,
        slot: &Slot,
        datagram: bool,
    ) -> Result<u64> {
        let id = self.send_ids.next()?.get();
        let posted = Posted {
            id,
            tag: request.wr_id(),
            index: slot.index,
            len: slot.len,
        };
        if !self.record.push(false, posted) {
            return Err(record_full());
        }
        if datagram {
            if let Some(ah) = request.dest_ah() {
                self.record.keep_dest(slot.index, ah);
            }
        }
        Ok(id)
    }
}

/// The refusal of post `id` to queue `recv` of `ring`: the slot comes back unless the provider
/// may have taken the request.
#[cold]
fn refused(ring: &mut SlotRing, recv: bool, id: u64, error: Error) -> SlotRefused {
    if may_have_posted(&error) {
        return SlotRefused { error, slot: None };
    }
    let slot = ring.record.unpush(recv, id).map(|posted| Slot {
        ring: ring.ring,
        index: posted.index,
        len: posted.len,
        tag: 0,
    });
    SlotRefused { error, slot }
}

impl<T: Transport> QueuePair<T, Rts> {
    /// Posts a send request from a slot (SEND, with immediate data or invalidating a peer's
    /// window, RDMA WRITE, READ, both atomics: [`SendRequest`] given a [`Slot`]): the slot stays
    /// in `ring` until [`SlotRing::complete`] is given the request's completion (or, for an
    /// unsignaled request, a later signaled one's of the ring), which hands it back with the
    /// request's tag. A request is signaled whatever it asked when no slot of the ring is
    /// left free, and after fewer unsignaled sends of this queue pair in a row (of any of its
    /// rings, and its owned sends) than the ring has slots and the send queue holds, so that a
    /// completion comes to free them. Allocates nothing. On UD every request names its
    /// destination ([`SendRequest::to`]), whose address handle the ring keeps until the slot
    /// comes back (and, if the ring is dropped first, hands to the queue pair's keeping, with
    /// its region).
    ///
    /// # Errors
    ///
    /// [`SlotRefused`], with the slot when the device never saw it:
    /// [`Error::InvalidArgument`] for a ring bound to another queue pair, a slot of another
    /// ring, a length over the slot size, a READ or WRITE longer than its remote memory; else
    /// as [`post_send_one`](Self::post_send_one) (an operation the transport does not carry, a
    /// UD request with no destination or another transport's with one, a full send queue).
    #[inline(always)]
    pub fn post_send_slot<K: Operation>(
        &mut self,
        ring: &mut SlotRing,
        request: SendRequest<'_, K, Slot>,
    ) -> std::result::Result<(), SlotRefused> {
        let (request, mut slot) = request.into_parts();
        if request.has_atomic_result() {
            slot.len = 8;
        }
        let recorded = if !ring.region.is_for(self.tables()) {
            Err(other_qp())
        } else {
            ring.check_send(&request, &slot)
                .and_then(|()| ring.record_send(&request, &slot, T::DATAGRAM))
        };
        let id = match recorded {
            Ok(id) => id,
            Err(error) => {
                return Err(SlotRefused {
                    error,
                    slot: Some(slot),
                });
            }
        };
        let slice = ring.raw_slice(slot.index, slot.len);
        // Unsignaled sends come back only with a later signaled one: one is signaled after
        // `signal_every - 1` unsignaled sends of this queue pair in a row (of any ring, or of
        // the owned path: fewer than this ring's slots and than the send queue holds), and
        // whenever no slot of this ring is left free (the caller may have none to post).
        let mut flags = request.flags();
        let run = self.next_unsignaled(
            flags.contains(SendFlags::SIGNALED) || ring.record.free_is_empty(),
            ring.signal_every,
        );
        if run == 0 {
            flags.insert(SendFlags::SIGNALED);
        }
        let request = request
            .with_payload(Payload::Slice(slice))
            .owned(id)
            .set_flags(flags);
        // SAFETY: as in `post_recv_slot`: the request names the slot's first `len` bytes (at
        // most the slot size, checked), in the ring's region, which the queue pair keeps
        // registered; the slot is recorded as posted and its `Slot` is gone until the
        // completion of this request, or of a later signaled one of this queue (which
        // completes in order), is handed to the ring, this post fails without the device
        // having seen it, or `reclaim` is given the queue pair in RESET (the device then uses
        // none of it). A UD request's address handle is kept by the record (`keep_dest`
        // above) for as long as the slot's entry: past the request's use by the device.
        // `remote` is the peer's memory.
        let result = unsafe { self.post_send_wr(&request) };
        self.count_unsignaled(run, &result);
        result.map_err(|error| refused(ring, false, id, error))
    }
}
