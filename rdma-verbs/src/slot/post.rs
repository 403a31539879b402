//! Posting slots: [`QueuePair::post_recv_slot`], [`QueuePair::post_send_slot`] with a
//! [`SendRequest`] of a [`Slot`], and [`SlotRefused`], what a refused post gives back.

use std::fmt;

use super::{Posted, Slot, SlotRing, other_qp, other_ring};
use crate::error::Error;
use crate::flags::SendFlags;
use crate::mr::RemoteMemory;
use crate::owned::check_room;
use crate::qp::{CanPostRecv, QueuePair, Rts, Transport, may_have_posted};
use crate::wr::{AtomicTarget, IntoMemory, Operation, memory_sealed};
use crate::wr::{Payload, RecvRequest, SendRequest};

/// A slot post the queue pair did not take: the error, and the slot, which the device never
/// saw (`None` when the provider did not say whether it took the request: the slot then
/// stays posted until a completion of its queue, a [`SlotRing::reclaim`](crate::SlotRing::reclaim)
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

impl<K: Operation> SendRequest<'_, K, Slot> {
    /// The slot, for a request that will not be posted.
    pub fn into_slot(self) -> Slot {
        self.into_parts().1
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

#[cold]
fn datagram_send() -> Error {
    Error::InvalidArgument(
        "a slot cannot be sent on UD (its address handle would need keeping): send from a Buf"
            .into(),
    )
}

impl<T: Transport, S: CanPostRecv> QueuePair<T, S> {
    /// Posts a receive into `slot` (all of its [`slot_size`](SlotRing::slot_size) bytes): the
    /// slot stays in `ring` until [`SlotRing::complete`] is given the receive's completion.
    /// Allocates nothing.
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
        slot: Slot,
    ) -> std::result::Result<(), SlotRefused> {
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
            tag: 0,
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
    /// completion comes to free them. Allocates nothing. Not on UD (send from a
    /// [`Buf`](crate::Buf), whose in-flight entry keeps the address handle alive).
    ///
    /// # Errors
    ///
    /// [`SlotRefused`], with the slot when the device never saw it:
    /// [`Error::InvalidArgument`] for a ring bound to another queue pair, a slot of another
    /// ring, a length over the slot size, a READ or WRITE longer than its remote memory, a UD
    /// queue pair; else as [`post_send_one`](Self::post_send_one) (an operation the transport
    /// does not carry, a full send queue).
    #[inline]
    pub fn post_send_slot<K: Operation>(
        &mut self,
        ring: &mut SlotRing,
        request: SendRequest<'_, K, Slot>,
    ) -> std::result::Result<(), SlotRefused> {
        let (request, mut slot) = request.into_parts();
        if request.has_atomic_result() {
            slot.len = 8;
        }
        let checked = if T::DATAGRAM {
            Err(datagram_send())
        } else if !ring.region.is_for(self.tables()) {
            Err(other_qp())
        } else {
            ring.check(&slot)
                .and_then(|len| match request.rdma_remote() {
                    Some(remote) if len as u64 > u64::from(remote.len) => {
                        Err(longer_than_remote(len as u32, &remote))
                    }
                    _ => Ok(()),
                })
        };
        if let Err(error) = checked {
            return Err(SlotRefused {
                error,
                slot: Some(slot),
            });
        }
        let id = match ring.send_ids.next() {
            Ok(id) => id.get(),
            Err(error) => {
                return Err(SlotRefused {
                    error,
                    slot: Some(slot),
                });
            }
        };
        let slice = ring.raw_slice(slot.index, slot.len);
        let posted = Posted {
            id,
            tag: request.wr_id(),
            index: slot.index,
            len: slot.len,
        };
        if !ring.record.push(false, posted) {
            return Err(SlotRefused {
                error: record_full(),
                slot: Some(slot),
            });
        }
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
        // completes in order), is handed to the ring, or this post fails without the device
        // having seen it. `remote` is the peer's memory.
        let result = unsafe { self.post_send_wr(&request) };
        self.count_unsignaled(run, &result);
        result.map_err(|error| refused(ring, false, id, error))
    }
}
