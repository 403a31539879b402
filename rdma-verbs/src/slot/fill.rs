//! Posting receives in batches: [`fill_chains`] posts a receive into every free slot of a
//! queue pair's or an SRQ's slot ring, in chains of up to 32 requests (one doorbell each),
//! built on the stack, and takes back what the provider did not take.

use std::mem::MaybeUninit;

use crate::error::{Error, Result};
use crate::ffi;
use crate::qp::may_have_posted;

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

/// The most receives a fill hands the device in one call.
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
