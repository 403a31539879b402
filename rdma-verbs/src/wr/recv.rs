//! [`RecvRequest`]: receive work requests (`struct ibv_recv_wr`), typed by memory model as
//! [`SendRequest`](super::SendRequest)s are, and their one lowering ([`RecvRequest::fill`]).

use std::fmt;

use super::send::{Borrowed, Memoryless, memory_sealed};
use super::{Payload, Sge, check_wr_id};
use crate::error::{Error, Result};
use crate::ffi;
use crate::mr::MrSlice;

/// A receive work request (`struct ibv_recv_wr`): where the bytes of the next message land, and
/// a tag its completion gives back. Its memory model `M` comes from what
/// [`new`](Self::new) is given ([`RecvMemory`]), as a send request's does:
///
/// - [`Borrowed`] (the default): a [`MrSlice`], a slice of [`Sge`]s or a [`Payload`] (memory
///   with `LOCAL_WRITE`), posted by the `unsafe` calls
///   ([`QueuePair::post_recv_one`](crate::QueuePair::post_recv_one),
///   [`SharedReceiveQueue::post_recv_one`](crate::SharedReceiveQueue::post_recv_one), a
///   [`RecvList`](crate::wr::RecvList));
/// - [`Owned`](crate::owned::Owned): a [`Buf`](crate::buf::Buf) (its whole capacity) or a
///   [`RegionRange`](crate::owned::RegionRange) of a shared region, or both
///   ([`and_range`](Self::and_range)), posted safely by
///   [`QueuePair::post_recv_owned`](crate::QueuePair::post_recv_owned) (or an SRQ's, or an
///   [`OwnedRecvList`](crate::owned::OwnedRecvList)), which move the memory into the queue until the
///   completion hands it back;
/// - [`Slot`](crate::slot::Slot): a slot of a slot ring (all its bytes), posted by
///   [`QueuePair::post_recv_slot`](crate::QueuePair::post_recv_slot) (or an SRQ's), whose
///   completion hands the slot back with the request's tag ([`Slot::tag`](crate::slot::Slot::tag)).
///
/// ```no_run
/// # use rdma_verbs::{MemoryRegion, QueuePair, owned::BufferPool, qp::{Rc, Rts}, wr::RecvRequest};
/// # fn f(qp: &mut QueuePair<Rc, Rts>, pool: &BufferPool, mr: &MemoryRegion)
/// #     -> Result<(), Box<dyn std::error::Error>> {
/// qp.post_recv_owned(RecvRequest::new(pool.take().expect("a free buffer")).tag(1))?;
/// let borrowed = RecvRequest::new(mr.slice(..)?).tag(2);
/// // SAFETY: `mr` is neither used nor dropped until the receive completes.
/// unsafe { qp.post_recv_one(&borrowed)? };
/// # Ok(()) }
/// ```
#[must_use = "a request does nothing until it is posted"]
pub struct RecvRequest<'a, M = Borrowed> {
    wr_id: u64,
    pub(super) payload: Payload<'a>,
    owned: bool,
    /// What the memory model keeps besides the payload (a buffer and a range), or nothing.
    memory: M,
}

impl<M: Clone> Clone for RecvRequest<'_, M> {
    fn clone(&self) -> Self {
        Self {
            wr_id: self.wr_id,
            payload: self.payload,
            owned: self.owned,
            memory: self.memory.clone(),
        }
    }
}

impl<M: Copy> Copy for RecvRequest<'_, M> {}

impl<M: fmt::Debug> fmt::Debug for RecvRequest<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvRequest")
            .field("wr_id", &self.wr_id)
            .field("payload", &self.payload)
            .field("memory", &self.memory)
            .finish()
    }
}

/// What [`RecvRequest::new`] takes as the memory a message lands in, for a request of memory
/// model `M`: a [`MrSlice`], a slice of [`Sge`]s or a [`Payload`] for [`Borrowed`]; a
/// [`Buf`](crate::buf::Buf) or a [`RegionRange`](crate::owned::RegionRange) for
/// [`Owned`](crate::owned::Owned); a [`Slot`](crate::slot::Slot) for the slot model. Sealed. (Bytes of no
/// region are no receive's memory.)
pub trait RecvMemory<'a, M>: memory_sealed::Sealed {
    /// The payload the request names now, and what its model keeps.
    #[doc(hidden)]
    fn into_recv_memory(self) -> (Payload<'a>, M);
}

impl<'a> RecvMemory<'a, Borrowed> for MrSlice<'a> {
    #[inline]
    fn into_recv_memory(self) -> (Payload<'a>, Borrowed) {
        (Payload::Slice(self), Borrowed)
    }
}

impl<'a> RecvMemory<'a, Borrowed> for &'a [Sge<'a>] {
    #[inline]
    fn into_recv_memory(self) -> (Payload<'a>, Borrowed) {
        (Payload::List(self), Borrowed)
    }
}

/// A [`Payload::Inline`] is refused when the request is posted.
impl<'a> RecvMemory<'a, Borrowed> for Payload<'a> {
    #[inline]
    fn into_recv_memory(self) -> (Payload<'a>, Borrowed) {
        (self, Borrowed)
    }
}

impl<'a, M> RecvRequest<'a, M> {
    /// A receive into `memory` (see [`RecvMemory`]; a [`Buf`](crate::buf::Buf) receives into its
    /// whole capacity), tagged 0.
    #[inline]
    pub fn new<P: RecvMemory<'a, M>>(memory: P) -> Self {
        let (payload, memory) = memory.into_recv_memory();
        Self {
            wr_id: 0,
            payload,
            owned: false,
            memory,
        }
    }

    /// A tag for the request, which its completion gives back (its `wr_id`,
    /// [`WorkCompletion::wr_id`](crate::cq::WorkCompletion::wr_id) of a [`Borrowed`] request, whose
    /// post refuses a tag with the top bit set, which the safe paths' ids use;
    /// [`Completion::tag`](crate::owned::Completion::tag) of an owned one and
    /// [`Slot::tag`](crate::slot::Slot::tag) of a slot's, which may be any value).
    /// 0 unless set.
    #[inline]
    pub fn tag(mut self, tag: u64) -> Self {
        self.wr_id = tag;
        self
    }

    /// The request's tag ([`tag`](Self::tag)).
    #[inline]
    pub fn wr_id(&self) -> u64 {
        self.wr_id
    }

    /// What the memory model keeps.
    #[inline]
    pub(crate) fn memory(&self) -> &M {
        &self.memory
    }

    /// What the memory model keeps, to change it.
    #[inline]
    pub(crate) fn memory_mut(&mut self) -> &mut M {
        &mut self.memory
    }

    /// The tag and what the memory model keeps, for the post paths.
    #[inline]
    pub(crate) fn into_parts(self) -> (u64, M) {
        (self.wr_id, self.memory)
    }
}

impl<M: Memoryless> RecvRequest<'_, M> {
    /// A receive with no memory: it takes a message of no bytes (a zero-length SEND, with or
    /// without immediate data) or an RDMA WRITE with immediate data, whose bytes land in the
    /// writer's target, and its completion carries the immediate data. A message with bytes
    /// ends it in [`WcStatus::LocLenErr`](crate::cq::WcStatus::LocLenErr). A UD queue pair refuses
    /// an owned one when posted: every datagram needs [`GRH_LEN`](crate::ah::GRH_LEN) bytes (an
    /// SRQ cannot tell which transports it feeds: receives for UD queue pairs on an SRQ need
    /// that room too, and without it complete in error).
    #[inline]
    pub fn empty() -> Self {
        Self {
            wr_id: 0,
            payload: Payload::None,
            owned: false,
            memory: M::none(),
        }
    }
}

impl<'a> RecvRequest<'a> {
    /// A receive into `payload`, as a safe path names it at post, with owned id `id` (see
    /// [`OWNED_ID_BIT`](crate::inflight::OWNED_ID_BIT)).
    #[inline]
    pub(crate) fn owned(payload: Payload<'a>, id: u64) -> Self {
        Self {
            wr_id: id,
            payload,
            owned: true,
            memory: Borrowed,
        }
    }

    /// Writes the request into `raw` (its `next` left null), using `one` as storage for a
    /// single scatter/gather entry: the one lowering to `struct ibv_recv_wr`.
    #[inline]
    pub(crate) fn fill(&self, raw: &mut ffi::ibv_recv_wr, one: &mut ffi::ibv_sge) -> Result<()> {
        check_wr_id(self.wr_id, self.owned)?;
        if let Payload::Inline(_) = self.payload {
            return Err(Error::invalid("a receive cannot use inline data"));
        }
        self.payload.check()?;
        let (sg_list, num_sge, _) = self.payload.fill(one);
        *raw = ffi::ibv_recv_wr {
            wr_id: self.wr_id,
            next: std::ptr::null_mut(),
            sg_list,
            num_sge,
        };
        Ok(())
    }
}
