//! [`SendRing`]: send requests posted from a ring's slots in order, freed in order by their
//! completions; [`RingSend`], what a post sends.

use std::fmt;
use std::marker::PhantomData;

use super::Core;
use crate::ah::AddressHandle;
use crate::cq::WorkCompletion;
use crate::error::{Error, Result};
use crate::ffi;
use crate::flags::SendFlags;
use crate::mr::RemoteMemory;
use crate::qp::{QpState, QueuePair, Rc, Reset, Rts, Transport, check_ops, may_have_posted};
use crate::wr::{AtomicOp, ImmOp, Operation, ReadOp, SendOp, WriteOp};
use crate::wr::{foreign_object, op};

/// A queue pair's ring of send slots, posted and freed in order (design and soundness:
/// [`docs::data_path`], "Rings", and [`docs::safety`]). Made by [`QueuePair::send_ring`];
/// the caller writes the next slot ([`next_mut`](Self::next_mut)) and posts it
/// ([`QueuePair::post_send_ring`] with a [`RingSend`]); each completion the caller polls goes
/// to [`complete`](Self::complete), which frees the slot (and the unsignaled ones before it).
/// Only a signaled send's completion frees slots: a program that waits for every slot to come
/// back must end on one.
///
/// `T` is the queue pair's transport. On UD each request names its destination
/// ([`RingSend::to`]), whose address handle the ring keeps until the request is done (and, if
/// the ring is dropped first, hands to the queue pair's keeping, as it does its region).
///
/// [`docs::data_path`]: crate::docs::data_path
/// [`docs::safety`]: crate::docs::safety
///
/// ```no_run
/// # use rdma_verbs::RingSend;
/// # fn demo(qp: &mut rdma_verbs::QueuePair<rdma_verbs::Rc, rdma_verbs::Rts>,
/// #         cq: &mut rdma_verbs::CompletionQueue) -> rdma_verbs::Result<()> {
/// let mut ring = qp.send_ring(16, 4096)?;
/// if let Some(bytes) = ring.next_mut() {
///     bytes[..5].copy_from_slice(b"hello");
///     qp.post_send_ring(&mut ring, RingSend::send(5))?;
/// }
/// let mut wcs = [rdma_verbs::WorkCompletion::default(); 16];
/// for wc in cq.poll(&mut wcs)? {
///     let _ = ring.complete(wc); // frees the slot
/// }
/// # Ok(()) }
/// ```
///
/// `Send` and `Sync`: writing, posting and completing take it `&mut`.
pub struct SendRing<T: Transport = Rc> {
    core: Core,
    /// At most `signal_every - 1` unsignaled sends of the queue pair in a row (counted by the
    /// queue pair, for all its rings and its owned sends): the next is signaled. The smaller
    /// of the slot count and the send queue's capacity.
    signal_every: u32,
    /// On UD, per slot the address handle of the request posted from it (`None` when the slot
    /// is free), kept while the device may use it; empty on the other transports.
    dests: Box<[Option<AddressHandle>]>,
    _transport: PhantomData<fn() -> T>,
}

impl<T: Transport> SendRing<T> {
    /// All [`slot_size`](Self::slot_size) bytes of the next slot to post, to write what it
    /// will send; `None` while every slot is posted (until a completion frees one).
    #[inline]
    pub fn next_mut(&mut self) -> Option<&mut [u8]> {
        let region = &self.core.region;
        let tail = self.core.record.free_tail()?;
        // SAFETY: the slot lies in the region, which the ring keeps registered; it is not
        // posted, so the device does not use it, and it is posted only through `&mut self`,
        // which the result borrows; slots do not overlap (`stride >= size`).
        Some(unsafe { std::slice::from_raw_parts_mut(region.ptr(tail), region.size() as usize) })
    }

    /// The slot a completion `wc` of this ring's requests frees, its bytes lent until the
    /// ring is next used: as many as the request carried (what an RDMA READ brought, an
    /// atomic's old value, what a SEND or WRITE sent; whatever the slot holds if the
    /// request failed: check the status). The unsignaled requests posted before it are done
    /// too (the send queue completes in order): their slots are free as well.
    ///
    /// `None` for a completion of any other request (of another ring, of another path, or
    /// one this ring has already taken): such completions change nothing.
    #[inline]
    pub fn complete(&mut self, wc: &WorkCompletion) -> Option<&[u8]> {
        // The oldest signaled request's completion, the usual case, returns straight from here.
        if let Some((index, len)) = self.core.record.complete_head(wc.wr_id()) {
            if T::DATAGRAM {
                self.release_dest(index);
            }
            return Some(self.carried(index, len));
        }
        self.complete_later(wc)
    }

    #[cold]
    #[inline(never)]
    fn complete_later(&mut self, wc: &WorkCompletion) -> Option<&[u8]> {
        let head = self.core.record.head();
        let (index, len) = self.core.record.complete_later(wc.wr_id())?;
        if T::DATAGRAM {
            // The slots from the old head through `index` left the record together.
            let mut slot = head;
            while slot != index {
                self.release_dest(slot);
                slot = self.core.record.after(slot);
            }
            self.release_dest(index);
        }
        Some(self.carried(index, len))
    }

    /// Drops the address handle kept for slot `index`, which has left the record (UD).
    #[inline]
    fn release_dest(&mut self, index: u32) {
        if let Some(dest) = self.dests.get_mut(index as usize) {
            *dest = None;
        }
    }

    /// The `len` bytes the request of slot `index`, which a completion took out of the record,
    /// carried.
    #[inline(always)]
    fn carried(&self, index: u32, len: u32) -> &[u8] {
        // SAFETY: the slot lies in the region, which the ring keeps registered; it is no
        // longer posted (its request completed, or a later one of the ring did), and it is
        // posted again only through `&mut self`, which the caller's result borrows; `len` is
        // at most the slot size (checked when posted).
        unsafe { std::slice::from_raw_parts(self.core.region.ptr(index), len as usize) }
    }

    /// Frees every slot still posted, once the ring's queue pair `qp` is in RESET: a reset
    /// discards the queue pair's requests without completions, so the device uses none of them
    /// any more. A completion polled afterwards that was made before the reset matches nothing.
    /// (Also what frees the slots of posts whose outcome the provider did not say.)
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a queue pair the ring is not bound to.
    pub fn reclaim(&mut self, qp: &QueuePair<T, Reset>) -> Result<()> {
        self.core.reclaim(qp)?;
        self.dests.iter_mut().for_each(|dest| *dest = None);
        Ok(())
    }

    /// How many slots are free to post.
    pub fn free(&self) -> u32 {
        self.core.free()
    }

    /// How many slots are posted: in flight, completed and not yet handed to
    /// [`complete`](Self::complete) (or unsignaled, waiting for a later signaled one), or held
    /// for requests that may never complete (discarded by a reset) until a later completion of
    /// the ring frees them.
    pub fn posted(&self) -> u32 {
        self.core.record.posted()
    }

    /// The bytes a slot holds.
    pub fn slot_size(&self) -> usize {
        self.core.region.size() as usize
    }

    /// How many slots the ring has.
    pub fn slot_count(&self) -> u32 {
        self.core.region.count()
    }

    /// Whether the ring posts to `qp`.
    pub fn is_for<U: Transport, S: QpState>(&self, qp: &QueuePair<U, S>) -> bool {
        self.core.region.is_for(qp.tables())
    }
}

impl<T: Transport> Drop for SendRing<T> {
    /// Hands the address handles of UD requests still posted to the queue pair's keeping
    /// (until `ibv_destroy_qp` has returned): the device may still use them. The region is the
    /// core's to give back or not.
    fn drop(&mut self) {
        for dest in self.dests.iter_mut() {
            if let Some(ah) = dest.take() {
                self.core.region.keep(ah.keep_alive());
            }
        }
    }
}

impl<T: Transport> fmt::Debug for SendRing<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendRing")
            .field("slot_size", &self.core.region.size())
            .field("slot_count", &self.core.region.count())
            .field("posted", &self.core.record.posted())
            .finish()
    }
}

/// What [`QueuePair::post_send_ring`] sends from the ring's next slot, typed by operation as
/// [`SendRequest`](crate::SendRequest) is: SEND and RDMA WRITE take
/// [`with_imm`](RingSend::with_imm), the other operations cannot. Signaled by default; an
/// [`unsignaled`](Self::unsignaled) request's slot is freed when a later signaled request of
/// the ring completes.
#[must_use = "a request does nothing until it is posted"]
pub struct RingSend<'a, K: Operation = SendOp> {
    op: RingOp,
    len: u32,
    imm: Option<u32>,
    flags: SendFlags,
    /// A UD send's destination: the address handle (borrowed: the post clones it for the
    /// slot, so that a request holds nothing to drop), the remote queue pair number and Q_Key.
    dest: Option<(&'a AddressHandle, u32, u32)>,
    _op: PhantomData<fn() -> K>,
}

/// The operation of a ring or slot send, and its remote memory.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RingOp {
    Send,
    Write(RemoteMemory),
    Read(RemoteMemory),
    FetchAdd(RemoteMemory, u64),
    CompareSwap(RemoteMemory, u64, u64),
}

impl<K: Operation> RingSend<'_, K> {
    fn new(op: RingOp, len: usize) -> Self {
        Self {
            op,
            len: u32::try_from(len).unwrap_or(u32::MAX),
            imm: None,
            flags: SendFlags::SIGNALED,
            dest: None,
            _op: PhantomData,
        }
    }

    /// No completion for this request (see the type's documentation).
    pub fn unsignaled(mut self) -> Self {
        self.flags.remove(SendFlags::SIGNALED);
        self
    }

    /// Starts the request only once the queue pair's earlier RDMA READs and atomics have
    /// completed (`IBV_SEND_FENCE`).
    pub fn fenced(mut self) -> Self {
        self.flags.insert(SendFlags::FENCE);
        self
    }
}

impl<K: ImmOp> RingSend<'_, K> {
    /// Immediate data, delivered with the peer's receive completion (an RDMA WRITE with it also
    /// consumes a receive at the peer).
    pub fn with_imm(mut self, imm: u32) -> Self {
        self.imm = Some(imm);
        self
    }

    /// Raises a solicited event at the receiver with its receive completion
    /// (`IBV_SEND_SOLICITED`; an RDMA WRITE without immediate data completes no receive).
    pub fn solicited(mut self) -> Self {
        self.flags.insert(SendFlags::SOLICITED);
        self
    }

    /// Sends the bytes inline (`IBV_SEND_INLINE`): the provider copies them into the work
    /// request during the post, so the device does not read the slot (on NICs that would
    /// otherwise fetch the payload, a shorter round trip for small messages). Refused by the
    /// provider when longer than the queue pair's granted `max_inline_data`
    /// ([`QueuePair::caps`](crate::QueuePair::caps)). The slot stays posted until the
    /// request's completion, as any other.
    pub fn inline(mut self) -> Self {
        self.flags.insert(SendFlags::INLINE);
        self
    }
}

impl RingSend<'static, SendOp> {
    /// SEND of the slot's first `len` bytes (refused when posted if longer than a slot).
    pub fn send(len: usize) -> Self {
        Self::new(RingOp::Send, len)
    }
}

impl<'a> RingSend<'a, SendOp> {
    /// The destination of a UD send: queue pair `remote_qpn` with Q_Key `remote_qkey` behind
    /// `ah`, which the ring keeps (a clone) until the request is done. Every send of a UD ring
    /// needs one; on the other transports one is refused when posted.
    pub fn to<'b>(self, ah: &'b AddressHandle, remote_qpn: u32, remote_qkey: u32) -> RingSend<'b> {
        RingSend {
            op: self.op,
            len: self.len,
            imm: self.imm,
            flags: self.flags,
            dest: Some((ah, remote_qpn, remote_qkey)),
            _op: PhantomData,
        }
    }
}

impl RingSend<'static, WriteOp> {
    /// RDMA WRITE of the slot's first `len` bytes to `remote` (refused when posted if longer
    /// than a slot or than `remote`).
    pub fn write(len: usize, remote: RemoteMemory) -> Self {
        Self::new(RingOp::Write(remote), len)
    }
}

impl RingSend<'static, ReadOp> {
    /// RDMA READ of `len` bytes of `remote` into the slot (refused when posted if longer than
    /// a slot or than `remote`).
    pub fn read(len: usize, remote: RemoteMemory) -> Self {
        Self::new(RingOp::Read(remote), len)
    }
}

impl RingSend<'static, AtomicOp> {
    /// ATOMIC_FETCH_AND_ADD of `add` to the 8 bytes at `remote`; the old value lands in the
    /// slot's first 8 bytes (in the byte order the provider writes).
    pub fn fetch_add(remote: RemoteMemory, add: u64) -> Self {
        Self::new(RingOp::FetchAdd(remote, add), 8)
    }

    /// ATOMIC_CMP_AND_SWP: `swap` into the 8 bytes at `remote` if they hold `compare`; the
    /// old value lands in the slot's first 8 bytes.
    pub fn compare_swap(remote: RemoteMemory, compare: u64, swap: u64) -> Self {
        Self::new(RingOp::CompareSwap(remote, compare, swap), 8)
    }
}

impl<K: Operation> fmt::Debug for RingSend<'_, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingSend")
            .field("op", &self.op)
            .field("len", &self.len)
            .field("imm", &self.imm)
            .field("flags", &self.flags)
            .field("remote_qpn", &self.dest.as_ref().map(|(_, qpn, _)| *qpn))
            .finish()
    }
}

impl<T: Transport, S: QpState> QueuePair<T, S> {
    /// Registers `count` slots of `size` bytes (one region, in the queue pair's protection
    /// domain, local access only) as a [`SendRing`] bound to this queue pair, which keeps the
    /// region registered until it is destroyed (unless the ring is dropped with nothing
    /// posted). A queue pair with a ring cannot open a [`scope`](QueuePair::scope).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for no slot, a slot of no byte or of more than `u32::MAX`,
    /// more than [`MAX_RING_SLOTS`](crate::MAX_RING_SLOTS) slots, or a size that overflows;
    /// else as
    /// [`ProtectionDomain::register`](crate::ProtectionDomain::register).
    pub fn send_ring(&self, count: u32, size: usize) -> Result<SendRing<T>> {
        let core = Core::new(self, count, size, false)?;
        let dests: Box<[Option<AddressHandle>]> = if T::DATAGRAM {
            (0..core.region.count()).map(|_| None).collect()
        } else {
            Box::default()
        };
        Ok(SendRing {
            core,
            signal_every: count.min(self.caps().max_send_wr).max(1),
            dests,
            _transport: PhantomData,
        })
    }
}

impl<T: Transport> QueuePair<T, Rts> {
    /// Posts `request` from the ring's next slot (written through [`SendRing::next_mut`]),
    /// which stays posted until [`SendRing::complete`] is given the request's completion (or,
    /// for an unsignaled request, a later signaled one's of the ring). A request is signaled
    /// whatever it asked when it takes the ring's last free slot, and after fewer unsignaled
    /// sends of this queue pair in a row (of any of its rings, and its owned sends) than the
    /// ring has slots and the send queue holds, so that a completion comes to free them.
    /// Allocates nothing.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a ring bound to another queue pair, one with no free
    /// slot, a length over the slot size, a READ or WRITE longer than its remote memory, an
    /// operation the transport does not carry, a UD request without a destination
    /// ([`RingSend::to`]) or one with an address handle of another protection domain, a
    /// destination on RC or UC; else as
    /// [`post_send_one`](Self::post_send_one) (a full send queue). The slot stays free unless
    /// the provider did not say whether it took the request ([`Error::PostIndeterminate`], and
    /// on the extended send path any failure of `ibv_wr_complete`, a full queue included): it
    /// then stays posted until a later completion of the ring, a
    /// [`reclaim`](SendRing::reclaim) after a reset, or the queue pair's destruction.
    ///
    /// # References
    ///
    /// [`ibv_post_send(3)`](https://man7.org/linux/man-pages/man3/ibv_post_send.3.html)
    #[doc(alias = "ibv_post_send")]
    #[inline]
    pub fn post_send_ring<K: Operation>(
        &mut self,
        ring: &mut SendRing<T>,
        request: RingSend<'_, K>,
    ) -> Result<()> {
        let RingSend {
            op,
            len,
            imm,
            mut flags,
            dest,
            _op,
        } = request;
        if len > ring.core.region.size() {
            return Err(too_long(len, ring.core.region.size()));
        }
        let (opcode, ops, remote) = match op {
            RingOp::Send if imm.is_some() => (ffi::IBV_WR_SEND_WITH_IMM, op::SEND_WITH_IMM, None),
            RingOp::Send => (ffi::IBV_WR_SEND, op::SEND, None),
            RingOp::Write(remote) if imm.is_some() => (
                ffi::IBV_WR_RDMA_WRITE_WITH_IMM,
                op::WRITE_WITH_IMM,
                Some(remote),
            ),
            RingOp::Write(remote) => (ffi::IBV_WR_RDMA_WRITE, op::WRITE, Some(remote)),
            RingOp::Read(remote) => (ffi::IBV_WR_RDMA_READ, op::READ, Some(remote)),
            RingOp::FetchAdd(..) => (ffi::IBV_WR_ATOMIC_FETCH_AND_ADD, op::ATOMIC, None),
            RingOp::CompareSwap(..) => (ffi::IBV_WR_ATOMIC_CMP_AND_SWP, op::ATOMIC, None),
        };
        check_ops::<T>(ops, usize::from(dest.is_some()), 1)?;
        if let Some((ah, _, _)) = dest {
            // The provider reads the handle as one of its own: it must be of this queue
            // pair's protection domain (hence context and device).
            if ah.pd().as_raw() != self.pd().as_raw() {
                return Err(foreign_object());
            }
        }
        match remote {
            Some(remote) if len > remote.len => return Err(longer_than_remote(len, &remote)),
            _ => {}
        }
        let core = &mut ring.core;
        let (index, id) = core.take_tail(self.tables(), len)?;
        // Unsignaled sends are freed only by a later signaled one: one is signaled after
        // `signal_every - 1` unsignaled sends of this queue pair in a row (of any ring, or of
        // the owned and slot paths: fewer than this ring's slots and than the send queue
        // holds), and when it takes the ring's last free slot (the caller would have none left
        // to post a signaled one).
        let run = self.next_unsignaled(
            flags.contains(SendFlags::SIGNALED) || core.record.free_tail().is_none(),
            ring.signal_every,
        );
        if run == 0 {
            flags.insert(SendFlags::SIGNALED);
        }
        let mut sge = ffi::ibv_sge {
            addr: core.region.addr(index),
            length: len,
            lkey: core.region.lkey(),
        };
        let mut raw = ffi::ibv_send_wr {
            wr_id: id,
            sg_list: &mut sge,
            num_sge: i32::from(len != 0),
            opcode,
            send_flags: flags.bits(),
            ..Default::default()
        };
        if let Some(imm) = imm {
            raw.__bindgen_anon_1.imm_data = imm.to_be();
        }
        match op {
            RingOp::Send => {
                if let Some((ah, remote_qpn, remote_qkey)) = dest {
                    raw.wr.ud = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
                        ah: ah.as_raw(),
                        remote_qpn,
                        remote_qkey,
                    };
                }
            }
            RingOp::Write(remote) | RingOp::Read(remote) => {
                raw.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                };
            }
            RingOp::FetchAdd(remote, add) => {
                raw.wr.atomic = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                    remote_addr: remote.addr,
                    compare_add: add,
                    swap: 0,
                    rkey: remote.rkey,
                };
            }
            RingOp::CompareSwap(remote, compare, swap) => {
                raw.wr.atomic = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                    remote_addr: remote.addr,
                    compare_add: compare,
                    swap,
                    rkey: remote.rkey,
                };
            }
        }
        if T::DATAGRAM {
            // Kept with the slot until it leaves the record (cleared below if the provider
            // refuses the request without taking it), then by the queue pair if the ring is
            // dropped first.
            if let (Some(kept), Some((ah, _, _))) = (ring.dests.get_mut(index as usize), dest) {
                *kept = Some(ah.clone());
            }
        }
        // SAFETY: the request names the tail slot's first `len` bytes (at most the slot size,
        // checked), in the ring's region, which the queue pair keeps registered (as in
        // `post_recv_ring`); the slot was free and is recorded as posted, so Rust cannot reach
        // its bytes until the completion of this request, or of a later signaled one of the
        // ring (the send queue completes in order), is handed to the ring, or the post fails
        // without the device having seen it. An atomic's 8 bytes are one aligned word of the
        // slot (slots are 8-aligned). `remote` is the peer's memory. The operation is one the
        // transport carries, with a destination on UD and none elsewhere (checked); a UD
        // destination's address handle is kept with the slot (above).
        let result = unsafe { self.post_send_raw(&mut raw, ops) };
        self.count_unsignaled(run, &result);
        match result {
            Ok(()) => Ok(()),
            Err(error) => {
                if T::DATAGRAM && !may_have_posted(&error) {
                    if let Some(kept) = ring.dests.get_mut(index as usize) {
                        *kept = None;
                    }
                }
                Err(core.refused(error))
            }
        }
    }
}

#[cold]
fn too_long(len: u32, size: u32) -> Error {
    Error::InvalidArgument(format!(
        "a request of {len} bytes exceeds the slot size of {size}"
    ))
}

#[cold]
fn longer_than_remote(len: u32, remote: &RemoteMemory) -> Error {
    Error::InvalidArgument(format!(
        "{len} bytes against {} bytes of remote memory",
        remote.len
    ))
}
