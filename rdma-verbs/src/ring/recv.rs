//! [`RecvRing`]: receives posted from a ring's slots in order, their bytes read in order.

use std::fmt;
use std::mem::MaybeUninit;

use super::Core;
use crate::cq::WorkCompletion;
use crate::error::{Error, Result};
use crate::ffi;
use crate::owned::check_room;
use crate::qp::{CanPostRecv, QpState, QueuePair, Reset, Transport, may_have_posted};

/// A queue pair's ring of receive slots, posted and completed in order (design and soundness:
/// [`docs::data_path`], "Rings", and [`docs::safety`]). Made by [`QueuePair::recv_ring`];
/// posted with [`QueuePair::post_recv_ring`]; each completion the caller polls goes to
/// [`complete`](Self::complete), which lends the bytes received.
///
/// [`docs::data_path`]: crate::docs::data_path
/// [`docs::safety`]: crate::docs::safety
///
/// ```no_run
/// # fn demo(qp: &mut rdma_verbs::QueuePair<rdma_verbs::Rc, rdma_verbs::Rts>,
/// #         cq: &mut rdma_verbs::CompletionQueue) -> rdma_verbs::Result<()> {
/// let mut ring = qp.recv_ring(16, 4096)?;
/// qp.fill_recv_ring(&mut ring)?; // every slot the receive queue has room for, one doorbell
/// let mut wcs = [rdma_verbs::WorkCompletion::default(); 16];
/// for wc in cq.poll(&mut wcs)? {
///     if let Some(bytes) = ring.complete(wc) {
///         println!("{} bytes", bytes.len());
///         qp.post_recv_ring(&mut ring)?; // the slot just read goes back to the device
///     }
/// }
/// # Ok(()) }
/// ```
///
/// `Send` and `Sync`: posting and completing take it `&mut`.
pub struct RecvRing {
    core: Core,
}

impl RecvRing {
    /// The bytes a completion `wc` of this ring's receives brought, lent until the ring is
    /// next used: its first [`WorkCompletion::byte_len`] bytes (at most the slot size; on UD
    /// the 40-byte GRH first), none for a failed receive or an RDMA WRITE with immediate data
    /// (whose bytes went to the target memory). The slot is free again: the next
    /// [`post_recv_ring`](QueuePair::post_recv_ring) may post it.
    ///
    /// `None` for a completion of any other request (of another ring, of another path, or
    /// one this ring has already taken): such completions change nothing, so completions may
    /// come from any poll of any completion queue.
    ///
    /// Hand the completions over in the order they were polled: a completion handed over
    /// before an earlier one of this ring frees the earlier slots with it (the device is done
    /// with them), and what they brought is lost.
    #[inline]
    pub fn complete(&mut self, wc: &WorkCompletion) -> Option<&[u8]> {
        // The oldest receive's completion, the usual case, returns straight from here.
        if let Some((index, _)) = self.core.record.complete_head(wc.wr_id()) {
            return Some(self.received(index, wc));
        }
        self.complete_later(wc)
    }

    #[cold]
    #[inline(never)]
    fn complete_later(&mut self, wc: &WorkCompletion) -> Option<&[u8]> {
        let (index, _) = self.core.record.complete_later(wc.wr_id())?;
        Some(self.received(index, wc))
    }

    /// The bytes `wc` brought into slot `index`, which it took out of the record.
    #[inline(always)]
    fn received(&self, index: u32, wc: &WorkCompletion) -> &[u8] {
        let len = if !wc.is_success() || wc.is_recv_rdma_with_imm() {
            0
        } else {
            wc.byte_len().min(self.core.region.size())
        };
        // SAFETY: the slot lies in the region, which the ring keeps registered; it is no
        // longer posted (its receive completed, or a later one of the ring did), and it is
        // posted again only through `&mut self`, which the caller's result borrows.
        unsafe { std::slice::from_raw_parts(self.core.region.ptr(index), len as usize) }
    }

    /// Frees every slot still posted, once the ring's queue pair `qp` is in RESET: a reset
    /// discards the queue pair's receives without completions, so the device uses none of them
    /// any more. A completion polled afterwards that was made before the reset matches nothing.
    /// (Also what frees the slots of posts whose outcome the provider did not say.)
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a queue pair the ring is not bound to.
    pub fn reclaim<T: Transport>(&mut self, qp: &QueuePair<T, Reset>) -> Result<()> {
        self.core.reclaim(qp)
    }

    /// How many slots are free to post.
    pub fn free(&self) -> u32 {
        self.core.free()
    }

    /// How many slots are posted: in flight, completed and not yet handed to
    /// [`complete`](Self::complete), or held for receives that may never complete (discarded
    /// by a reset) until a later completion of the ring frees them.
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
    pub fn is_for<T: Transport, S: QpState>(&self, qp: &QueuePair<T, S>) -> bool {
        self.core.region.is_for(qp.tables())
    }
}

impl fmt::Debug for RecvRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvRing")
            .field("slot_size", &self.core.region.size())
            .field("slot_count", &self.core.region.count())
            .field("posted", &self.core.record.posted())
            .finish()
    }
}

impl<T: Transport, S: QpState> QueuePair<T, S> {
    /// Registers `count` slots of `size` bytes (one region, in the queue pair's protection
    /// domain, local access only) as a [`RecvRing`] bound to this queue pair. The queue pair
    /// keeps the region registered until it is destroyed, so that receives in flight stay
    /// valid whatever happens to the ring, unless the ring is dropped with nothing posted. A
    /// queue pair with a ring cannot open a [`scope`](QueuePair::scope).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a queue pair that receives through an SRQ, no slot, a
    /// slot of no byte (of fewer than the 40-byte GRH on UD) or of more than `u32::MAX`, more
    /// than [`MAX_RING_SLOTS`](crate::MAX_RING_SLOTS) slots, or a size that overflows; else as
    /// [`ProtectionDomain::register`](crate::ProtectionDomain::register).
    pub fn recv_ring(&self, count: u32, size: usize) -> Result<RecvRing> {
        if self.has_srq() {
            return Err(Error::InvalidArgument(
                "this queue pair receives through its SRQ: a receive ring cannot post to it".into(),
            ));
        }
        check_room::<T>(size)?;
        Ok(RecvRing {
            core: Core::new(self, count, size, true)?,
        })
    }
}

impl<T: Transport, S: CanPostRecv> QueuePair<T, S> {
    /// Posts a receive into the ring's next slot (all of its
    /// [`slot_size`](RecvRing::slot_size) bytes), which stays posted until
    /// [`RecvRing::complete`] is given the receive's completion. Allocates nothing.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a ring bound to another queue pair, or one with no free
    /// slot ([`RecvRing::free`] is 0); else as [`post_recv_one`](Self::post_recv_one) (a
    /// full receive queue). The slot stays free unless the provider did not say whether it
    /// took the request ([`Error::PostIndeterminate`]): it then stays posted until a later
    /// completion of the ring, a [`reclaim`](RecvRing::reclaim) after a reset, or the queue
    /// pair's destruction.
    ///
    /// # References
    ///
    /// [`ibv_post_recv(3)`](https://man7.org/linux/man-pages/man3/ibv_post_recv.3.html)
    #[doc(alias = "ibv_post_recv")]
    #[inline]
    pub fn post_recv_ring(&mut self, ring: &mut RecvRing) -> Result<()> {
        let core = &mut ring.core;
        let size = core.region.size();
        let (index, id) = core.take_tail(self.tables(), size)?;
        let mut sge = ffi::ibv_sge {
            addr: core.region.addr(index),
            length: size,
            lkey: core.region.lkey(),
        };
        let mut raw = ffi::ibv_recv_wr {
            wr_id: id,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        // SAFETY: the request names the tail slot's bytes, in the ring's region, which the
        // queue pair keeps registered (attached when the ring was made; detached only by a
        // ring with nothing posted, and by a successful `ibv_destroy_qp`); the slot was free
        // and is recorded as posted, so Rust cannot reach its bytes until the completion of
        // this receive (or of a later one of the ring) is handed to the ring, or the post
        // fails without the device having seen it. The id has `OWNED_ID_BIT` and is unique in
        // the process, so no other completion can release the slot. The queue pair has no SRQ
        // (refused when the ring was made), and no scope can count this receive's completion
        // as its own: a queue pair with a ring's region attached refuses to open one.
        match unsafe { self.post_recv_raw(&mut raw) } {
            Ok(()) => Ok(()),
            Err(error) => Err(core.refused(error)),
        }
    }

    /// Posts a receive into every free slot of the ring, in ring order, handing the device up
    /// to 32 of them per `ibv_post_recv` call (one doorbell): what a ring wants when it is
    /// made, and after a batch of completions. Stops, without an error, at a full receive
    /// queue (the slots it did not post stay free). Returns how many receives it posted.
    /// Allocates nothing.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a ring bound to another queue pair (nothing posted);
    /// else a request the provider refused ([`Error::Post`]), or the process's request ids
    /// running out: the receives posted before it stay posted ([`RecvRing::posted`] counts
    /// them) and the rest stay free, unless the provider did not say what it took
    /// ([`Error::PostIndeterminate`]): then every slot of that call stays posted, as for
    /// [`post_recv_ring`](Self::post_recv_ring).
    ///
    /// # References
    ///
    /// [`ibv_post_recv(3)`](https://man7.org/linux/man-pages/man3/ibv_post_recv.3.html)
    #[doc(alias = "ibv_post_recv")]
    pub fn fill_recv_ring(&mut self, ring: &mut RecvRing) -> Result<u32> {
        let core = &mut ring.core;
        if !core.region.is_for(self.tables()) {
            return Err(super::other_qp());
        }
        let (size, lkey) = (core.region.size(), core.region.lkey());
        fill_chains(core, size, lkey, |head, len| {
            // SAFETY: `fill_chains` passes `len` initialised requests, each linked to the next
            // and the last to none, each naming one free slot of the ring, now recorded as
            // posted, as in `post_recv_ring`, whose argument holds for each: the region is kept
            // registered by the queue pair, Rust reaches a slot's bytes only once a completion
            // has taken it out of the record, the ids are unique in the process, the queue pair
            // has no SRQ and can open no scope.
            unsafe { self.post_recv_chain_raw(head, len) }
        })
    }
}

/// What [`fill_chains`] needs of a ring's record: free slots to post, in order.
pub(crate) trait FillSlots {
    /// How many slots are free to post.
    fn free(&self) -> u32;
    /// Records the next free slot as posted, as a receive of `len` bytes: its address (as the
    /// device sees it) and its request's id.
    fn push(&mut self, len: u32) -> Result<(u64, u64)>;
    /// Takes back the post of request `id`, the newest not yet taken back, which the device
    /// never saw.
    fn unpush(&mut self, id: u64);
}

impl FillSlots for Core {
    fn free(&self) -> u32 {
        Core::free(self)
    }

    #[inline]
    fn push(&mut self, len: u32) -> Result<(u64, u64)> {
        let (index, id) = self.push_tail(len)?;
        Ok((self.region.addr(index), id))
    }

    fn unpush(&mut self, _id: u64) {
        Core::unpush(self, 1);
    }
}

/// Posts a receive of `size` bytes (key `lkey`) into every free slot of `slots`, handing
/// `post` chains of up to [`FILL_BATCH`] requests built on the stack: `post(head, len)` gets
/// `len` (at least one) initialised requests, each linked to the next and the last to none,
/// every one naming a slot `slots` has just recorded as posted. Stops, without an error, when
/// no slot is free or at a full queue; a chain refused part way, or one the record cannot
/// finish (never posted), takes back the requests the provider did not take (as
/// [`chain_taken`] says), newest first. Returns how many receives were posted. Allocates
/// nothing.
pub(crate) fn fill_chains<S: FillSlots>(
    slots: &mut S,
    size: u32,
    lkey: u32,
    mut post: impl FnMut(*mut ffi::ibv_recv_wr, usize) -> Result<()>,
) -> Result<u32> {
    let mut sges = [const { MaybeUninit::<ffi::ibv_sge>::uninit() }; FILL_BATCH];
    let mut chain = [const { MaybeUninit::<ffi::ibv_recv_wr>::uninit() }; FILL_BATCH];
    let sge_base = sges.as_mut_ptr().cast::<ffi::ibv_sge>();
    let head = chain.as_mut_ptr().cast::<ffi::ibv_recv_wr>();
    let mut posted = 0;
    loop {
        let len = (slots.free() as usize).min(FILL_BATCH);
        if len == 0 {
            return Ok(posted);
        }
        for k in 0..len {
            let (addr, id) = match slots.push(size) {
                Ok(taken) => taken,
                Err(error) => {
                    take_back(slots, head, 0..k);
                    return Err(error);
                }
            };
            let next = if k + 1 < len {
                head.wrapping_add(k + 1)
            } else {
                std::ptr::null_mut()
            };
            // SAFETY: `k < len <= FILL_BATCH`, so both writes are to elements of the two
            // arrays, through pointers derived from them once (nothing else touches them
            // while the chain is built and posted).
            unsafe {
                sge_base.add(k).write(ffi::ibv_sge {
                    addr,
                    length: size,
                    lkey,
                });
                head.add(k).write(ffi::ibv_recv_wr {
                    wr_id: id,
                    next,
                    sg_list: sge_base.add(k),
                    num_sge: 1,
                });
            }
        }
        match post(head, len) {
            Ok(()) => posted += len as u32,
            Err(error) => {
                let taken = chain_taken(&error, len);
                take_back(slots, head, taken..len);
                posted += taken as u32;
                return match error {
                    Error::QueueFull { .. } => Ok(posted),
                    error => Err(error),
                };
            }
        }
    }
}

/// Takes back the posts of the chain's requests `range` (written, never seen by the device),
/// newest first.
#[cold]
fn take_back<S: FillSlots>(
    slots: &mut S,
    head: *const ffi::ibv_recv_wr,
    range: std::ops::Range<usize>,
) {
    for k in range.rev() {
        // SAFETY: the caller wrote the chain's requests up to `range.end` (elements of the
        // chain array `head` points at), and the provider does not keep or change them after
        // the call.
        let id = unsafe { (*head.add(k)).wr_id };
        slots.unpush(id);
    }
}

/// The most receives [`QueuePair::fill_recv_ring`] hands the device in one call.
const FILL_BATCH: usize = 32;

/// How many requests of a chain of `len` the provider took, by the error its post returned:
/// those before the one `bad_wr` named; all of them (so that their slots stay posted) when it
/// named none, may have taken them, or the error is of another kind.
fn chain_taken(error: &Error, len: usize) -> usize {
    if may_have_posted(error) {
        return len;
    }
    match error {
        Error::QueueFull { index, .. } | Error::Post { index, .. } => (*index).min(len),
        _ => len,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Errno;

    #[test]
    fn a_refused_chain_keeps_only_what_the_provider_may_have_taken() {
        let verb = "ibv_post_recv";
        let full = |index| Error::QueueFull { verb, index };
        let refused = |index| Error::Post {
            verb,
            index,
            errno: Errno::INVAL,
        };
        assert_eq!(chain_taken(&full(0), 32), 0);
        assert_eq!(chain_taken(&full(17), 32), 17);
        assert_eq!(chain_taken(&refused(1), 5), 1);
        assert_eq!(chain_taken(&refused(4), 5), 4);
        // An index past the chain (no provider gives one) takes nothing back.
        assert_eq!(chain_taken(&refused(9), 5), 5);
        let unsaid = Error::PostIndeterminate {
            verb,
            errno: Errno::INVAL,
        };
        assert_eq!(chain_taken(&unsaid, 7), 7);
        let extended = Error::QueueFull {
            verb: crate::qp::EXTENDED_POST_VERB,
            index: 0,
        };
        assert_eq!(chain_taken(&extended, 3), 3);
        assert_eq!(chain_taken(&Error::InvalidArgument("x".into()), 3), 3);
    }

    /// A record of `free` slots whose posts are numbered; `fail_at` makes the push of that
    /// number fail.
    struct Fake {
        free: u32,
        next: u64,
        fail_at: Option<u64>,
        taken_back: Vec<u64>,
    }

    impl FillSlots for Fake {
        fn free(&self) -> u32 {
            self.free
        }
        fn push(&mut self, len: u32) -> Result<(u64, u64)> {
            assert_eq!(len, 64);
            if self.fail_at == Some(self.next) {
                return Err(Error::InvalidArgument("ids ran out".into()));
            }
            self.free -= 1;
            self.next += 1;
            Ok((0x1000 * self.next, self.next))
        }
        fn unpush(&mut self, id: u64) {
            assert_eq!(id, self.next, "taken back newest first");
            self.taken_back.push(id);
            self.next -= 1;
            self.free += 1;
        }
    }

    /// The chains `fill_chains` hands over are linked and initialised as it says, at most 32
    /// long; a refusal part way takes back exactly the requests after the one the provider
    /// named, newest first; a full queue ends the fill without an error; a push that fails
    /// takes back the chain built so far, never posted. Runs under Miri (the chain is written
    /// and read through raw pointers).
    #[test]
    fn fill_chains_posts_linked_chains_and_takes_back_the_refused() {
        let verb = "ibv_post_recv";
        let mut seen = Vec::new();
        let mut fake = Fake {
            free: 70,
            next: 0,
            fail_at: None,
            taken_back: Vec::new(),
        };
        let mut calls = 0;
        let posted = fill_chains(&mut fake, 64, 7, |head, len| {
            calls += 1;
            assert!((1..=FILL_BATCH).contains(&len));
            let mut wr = head;
            for k in 0..len {
                // SAFETY: the chain's contract: `len` linked, initialised requests.
                let (id, next, sge) = unsafe { ((*wr).wr_id, (*wr).next, *(*wr).sg_list) };
                assert_eq!((sge.addr, sge.length, sge.lkey), (0x1000 * id, 64, 7));
                seen.push(id);
                assert_eq!(next.is_null(), k + 1 == len);
                wr = next;
            }
            // The third chain: the provider takes 3 and the queue is full.
            if calls == 3 {
                return Err(Error::QueueFull { verb, index: 3 });
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(calls, 3);
        assert_eq!(posted, 32 + 32 + 3);
        assert_eq!(seen, (1..=70).collect::<Vec<u64>>());
        // The third chain held 65 to 70; the provider took 65, 66 and 67.
        assert_eq!(fake.taken_back, vec![70, 69, 68]);
        assert_eq!((fake.free, fake.next), (3, 67));

        // Another refusal is an error, with the same take-back.
        fake.taken_back.clear();
        let refused = fill_chains(&mut fake, 64, 7, |_, len| {
            assert_eq!(len, 3);
            Err(Error::Post {
                verb,
                index: 1,
                errno: crate::Errno::INVAL,
            })
        });
        assert!(matches!(refused, Err(Error::Post { index: 1, .. })));
        assert_eq!(fake.taken_back, vec![70, 69]);
        assert_eq!((fake.free, fake.next), (2, 68));

        // A push that fails part way: nothing of that chain is posted.
        fake.taken_back.clear();
        fake.fail_at = Some(69);
        let failed = fill_chains(&mut fake, 64, 7, |_, _| panic!("never posted"));
        assert!(matches!(failed, Err(Error::InvalidArgument(_))));
        assert_eq!(fake.taken_back, vec![69]);
        assert_eq!((fake.free, fake.next), (2, 68));
    }
}
