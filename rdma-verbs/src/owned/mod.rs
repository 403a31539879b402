//! The owned-buffer data path (`docs/data-path.md`): posting moves a [`Buf`] into the queue
//! pair, and the completion that proves the device is done with it hands it back, through
//! [`CompletionQueue::poll_each`](crate::CompletionQueue::poll_each). Safe, with no scope to outlive: a receive ring can stay
//! posted across iterations, many queue pairs can share a completion queue, and sends may be
//! unsignaled.
//!
//! Why it is sound: a posted buffer is in the queue's in-flight table, where no Rust code
//! reaches it, and it holds its pool's region registered. It leaves the table only (a) with
//! the completion of its own request, or of a later one of the same queue, which completes in
//! order; (b) when the queue pair is reset or destroyed, after the verb has returned; or (c)
//! when the provider refused the post and said so. Each request's `wr_id` is an id no other
//! request of the process ever had (see `inflight/mod.rs`), and the other post paths refuse ids of
//! that form, so no other completion, stale or not, can be taken for it.
//!
//! Files: `send.rs` (owned send requests and their post), `recv.rs` (owned receives, on queue
//! pairs and SRQs), `list.rs` (both kinds in doorbell-batched lists), `range.rs` (ranges of
//! the caller's regions), `completion.rs` (`Completion` and `poll_each`); this file holds what
//! they share: the refusal type, the protection-domain check and the record-post-undo step.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::inflight::{Entry, Ring, SrqTable};
use crate::qp::{QpState, QueuePair, Transport, may_have_posted};

mod completion;
mod list;
mod range;
mod recv;
mod send;
pub use crate::buf::{Buf, BufferPool};
pub use completion::Completion;
pub(crate) use list::{Chain, posted_before, run_after, with_chain};
pub use list::{OwnedRecvList, OwnedSendList};
pub use range::RegionRange;
use range::{OwnedSges, check_region};

pub(crate) use recv::check_room;
pub use send::Owned;
pub(crate) use send::Prepared;

/// A post the queue pair did not take: the error, and the buffer, which the device never saw.
///
/// `buf` is `None` when the request had none, and when the provider did not say whether it
/// took the request ([`Error::PostIndeterminate`], or the extended path's `ibv_wr_complete`
/// failing): the buffer (and what else the request keeps: a UD address handle, a bind's
/// region, a range's region) then stays in flight until a completion, a reset or the
/// destruction of the queue pair releases it, and a bind's window takes the bind's key.
#[derive(Debug)]
pub struct PostRefused {
    error: Error,
    buf: Option<Buf>,
}

impl PostRefused {
    /// Why the post failed.
    pub fn error(&self) -> &Error {
        &self.error
    }

    /// The error and the buffer.
    pub fn into_parts(self) -> (Error, Option<Buf>) {
        (self.error, self.buf)
    }

    /// The buffer, if it came back.
    pub fn into_buf(self) -> Option<Buf> {
        self.buf
    }
}

impl fmt::Display for PostRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl std::error::Error for PostRefused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<PostRefused> for Error {
    fn from(refused: PostRefused) -> Self {
        refused.error
    }
}

/// Refuses `buf` unless its region is in the queue pair's protection domain (the device
/// would refuse the key at run time; this says so at post time).
#[inline]
pub(crate) fn check_pd(buf: Option<&Buf>, qp_pd: *mut crate::ffi::ibv_pd) -> Result<()> {
    match buf {
        Some(buf) if buf.pd_addr() != qp_pd as usize => Err(other_pd()),
        _ => Ok(()),
    }
}

#[cold]
fn other_pd() -> Error {
    Error::InvalidArgument(
        "the buffer's pool is in another protection domain than the queue pair".into(),
    )
}

/// An in-flight table a post records its request in.
///
/// Its methods are `unsafe`: a queue pair's rings take one poster at a time (see
/// `inflight::Ring`), which the post functions guarantee by holding the queue `&mut`.
pub(crate) trait Table {
    /// Records a request about to be posted: its id, and whether it took the last free slot.
    ///
    /// # Safety
    ///
    /// The caller holds the queue (the queue pair or SRQ) the table belongs to `&mut`, so no
    /// other `record` or `unrecord` of this table runs at the same time.
    unsafe fn record(
        &self,
        tag: u64,
        buf: Option<Buf>,
        keep: Option<Arc<dyn Send + Sync>>,
    ) -> std::result::Result<(u64, bool), (Error, Option<Buf>)>;
    /// Takes back request `id`, whose post the provider refused.
    ///
    /// # Safety
    ///
    /// As [`record`](Self::record).
    unsafe fn unrecord(&self, id: u64) -> Option<Entry>;
}

impl Table for Ring {
    #[inline(always)]
    unsafe fn record(
        &self,
        tag: u64,
        buf: Option<Buf>,
        keep: Option<Arc<dyn Send + Sync>>,
    ) -> std::result::Result<(u64, bool), (Error, Option<Buf>)> {
        // SAFETY: the caller's contract is `push`'s.
        unsafe { self.push(tag, buf, keep) }
    }

    unsafe fn unrecord(&self, id: u64) -> Option<Entry> {
        // SAFETY: as in `record`.
        unsafe { self.unpush(id) }
    }
}

impl Table for SrqTable {
    unsafe fn record(
        &self,
        tag: u64,
        buf: Option<Buf>,
        keep: Option<Arc<dyn Send + Sync>>,
    ) -> std::result::Result<(u64, bool), (Error, Option<Buf>)> {
        // Receives are all signaled: whether the slot was the last does not matter.
        self.push(tag, buf, keep).map(|id| (id, false))
    }

    unsafe fn unrecord(&self, id: u64) -> Option<Entry> {
        self.take(id)
    }
}

/// Records `buf` in the table `table` finds in `queue`, posts with `post` (given the queue,
/// the request's id and whether it took the table's last slot), and undoes the record if the
/// provider refused the post and said so. The table is borrowed only for the record and the
/// undo, not across the post, so no reference count is taken per post.
#[inline]
fn post_owned<Q, Tb: Table>(
    queue: &mut Q,
    table: impl Fn(&Q) -> &Tb,
    tag: u64,
    buf: Option<Buf>,
    keep: Option<Arc<dyn Send + Sync>>,
    post: impl FnOnce(&mut Q, u64, bool) -> Result<()>,
) -> std::result::Result<(), PostRefused> {
    // SAFETY: `queue` is held `&mut` (the tables a queue's getter returns are its own).
    let (id, last_slot) = unsafe { table(queue).record(tag, buf, keep) }
        .map_err(|(error, buf)| PostRefused { error, buf })?;
    match post(queue, id, last_slot) {
        Ok(()) => Ok(()),
        Err(error) if may_have_posted(&error) => Err(PostRefused { error, buf: None }),
        Err(error) => {
            // SAFETY: as for `record`.
            let buf = unsafe { table(queue).unrecord(id) }.and_then(|entry| entry.buf);
            Err(PostRefused { error, buf })
        }
    }
}

impl<T: Transport, S: QpState> QueuePair<T, S> {
    /// Owned requests in flight, in both queues.
    pub fn owned_in_flight(&self) -> usize {
        self.tables().in_flight()
    }
}
