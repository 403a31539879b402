//! Safe, idiomatic bindings to RDMA verbs (libibverbs).
//!
//! # Quick start
//!
//! ```no_run
//! use rdma_verbs::{AccessFlags, ConnectionRecord, Context, Rc, WorkCompletion};
//! # fn exchange(me: [u8; ConnectionRecord::LEN]) -> Vec<u8> { me.to_vec() }
//!
//! let context = Context::open("rxe0")?;
//! let pd = context.alloc_pd()?;
//! let mut cq = context.create_cq(64)?;
//! let qp = pd.qp_builder::<Rc>(&cq, &cq).build()?;
//! let me = qp.record(1, 1)?; // port 1, GID index 1
//! // Send `me.to_bytes()` to the peer (over TCP, say) and read its record back:
//! let peer = ConnectionRecord::from_bytes(&exchange(me.to_bytes()))?;
//! let qp = qp.connect(&me, &peer, AccessFlags::empty())?; // RESET to RTS
//! let mut completions = [WorkCompletion::default(); 8];
//! let done = cq.poll(&mut completions)?;
//! # drop(qp);
//! # Ok::<(), rdma_verbs::Error>(())
//! ```
//!
//! Two queue pairs of one device connect to each other with
//! [`QueuePair::connect_loopback`]; to choose each transition's attributes, use
//! `into_init`, `into_rtr` and `into_rts` one by one.
//!
//! # The model
//!
//! - Every verbs object is an RAII value that keeps its parents alive through reference counts:
//!   a queue pair keeps its protection domain, completion queues and SRQ; a CQ its context and
//!   completion channel. No drop order frees a parent under a child, and no type has a lifetime
//!   parameter, so context, PD, CQ and QP can sit in one struct.
//! - A queue pair's transport and state are types: [`QueuePair<Rc, Rts>`]. Transitions consume
//!   it and hand it back on failure; sends exist only in RTS.
//! - Work requests are built safely and chained into reusable [`PostList`]s that go to the device
//!   in one call. Posting them directly is `unsafe`: the device uses the memory after the call
//!   returns. The safe ways: slot rings, a queue pair's own registered slots
//!   ([`QueuePair::slot_ring`]) posted as [`Slot`]s ([`QueuePair::post_send_slot`],
//!   [`QueuePair::post_recv_slot`], [`QueuePair::fill_slot_ring`] for every free slot, 32 per
//!   doorbell, a [`SlotSendList`] of sends with one doorbell) and handed back by [`SlotRing::complete`] for the completions the caller polled,
//!   cheapest when they come back in order (an SRQ's too: [`SharedReceiveQueue::slot_ring`],
//!   [`SrqSlotRing`]); the owned-buffer path, in which posting moves a [`Buf`] of a
//!   [`BufferPool`] into the queue pair ([`QueuePair::post_send_owned`],
//!   [`QueuePair::post_recv_owned`]) and [`CompletionQueue::poll_each`] hands it back with its
//!   completion: buffers that move between queue pairs, many queue pairs on one completion
//!   queue routed for the caller, doorbell-batched [`OwnedSendList`]s; and
//!   [`QueuePair::scope`], in which memory stays borrowed until its completion is reaped. Every
//!   path builds its requests with [`SendRequest`] and [`RecvRequest`]. Which to pick, with a
//!   complete program: the repository's `docs/start-here.md`. Why each is sound:
//!   [`docs::safety`]; how the paths work: [`docs::data_path`]; the state types:
//!   [`docs::typestate`]; where each verb lives: [`docs::modules`].
//! - Polling fills a caller's array; nothing allocates on the data path.
//! - Failed verbs return [`Error`], naming the verb and its errno; failed work requests are
//!   completions with a [`WcStatus`]. The library does not panic on bad input.
//!
//! # Features
//!
//! All off by default.
//!
//! - `tokio`: async waits on tokio's reactor (`AsyncFd`), without a blocked thread.
//!   `AsyncCompletionChannel` awaits completion events (`ibv_get_cq_event`),
//!   `CompletionQueue::poll_async` awaits completions with the poll / arm / poll / wait
//!   sequence done right, and `AsyncContextEvents` awaits the context's asynchronous events
//!   (`ibv_get_async_event`). The futures are cancel-safe: dropping one (a time-out, a losing
//!   `select!` branch) loses no event and no completion.
//!
//! # Thread safety
//!
//! Contexts, protection domains, memory regions, CQs, channels, SRQs, address handles and queue
//! pairs are `Send` and `Sync`; each type's documentation says why. Operations that change a
//! queue (polling, posting) take `&mut self`.
//!
//! # Resource cleanup
//!
//! Dropping an object destroys it after its children. A destroy verb that fails (for example
//! `ibv_dereg_mr` while a memory window is still bound to the region) cannot report from
//! `Drop`, and `Drop` never panics: the failure is ignored, and memory the device might still
//! reach is leaked rather than freed. The kernel releases every object when the device context
//! closes. To see the failure, call `close()` instead of dropping (every object has it, for
//! example [`MemoryRegion::close`]): it returns the error together with the object, still
//! usable; a shared object (context, domain, channel, CQ, SRQ, address handle) answers
//! `EBUSY` without calling the verb while other handles or child objects still hold it.

#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use rdma_verbs_sys as ffi;

// The README's code blocks are compiled with the doc tests (its quick start).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

mod ah;
mod async_event;
mod buf;
mod c_enum;
mod channel;
#[cfg(doctest)]
mod compile_fail;
mod cq;
mod device;
mod dm;
pub mod docs;
mod error;
mod flags;
mod inflight;
mod mr;
mod mw;
mod owned;
mod pd;
pub mod qp;
mod scope;
pub mod shared;
mod slot;
mod spin;
mod srq;
mod td;
#[cfg(feature = "tokio")]
mod tokio_io;
mod wr;
mod xrcd;

pub use ah::{AddressHandle, GRH_LEN};
pub use async_event::AsyncEvent;
pub use buf::{Buf, BufferPool};
pub use channel::{CompletionChannel, CqEvent};
pub use cq::{
    CompletionQueue, CqBuilder, CqPoll, RawClock, WcFields, WcOpcode, WcStatus, WorkCompletion,
};
pub use device::{
    AtomicCap, Context, Device, DeviceAttr, DeviceList, DeviceTransport, ForkStatus, Gid, GidEntry,
    GidType, LinkLayer, Mtu, NodeType, PortAttr, PortState, devices, fork_init, fork_status,
};
pub use dm::DeviceMemory;
pub use error::{Errno, Error, Result};
pub use flags::{AccessFlags, SendFlags, WcFlags};
pub use mr::{Advice, DeviceRegion, MemoryRegion, MrSlice, MrSliceMut, NullRegion, RemoteMemory};
pub use mw::{MemoryWindow, MwType};
pub use owned::{Completion, Owned, OwnedRecvList, OwnedSendList, PostRefused, RegionRange};
pub use pd::ProtectionDomain;
pub use qp::{
    AddressVector, CanPostRecv, Connected, ConnectedInitAttr, ConnectionRecord, ErrorState,
    GlobalRoute, Init, QpBuilder, QpCaps, QpState, QpStateKind, QueuePair, RawModifyAttr, Rc,
    RcRtrAttr, RcRtsAttr, Reset, Rtr, Rts, SendPath, SqPsnRtsAttr, TransitionError, Transport, Uc,
    UcRtrAttr, Ud, UdInitAttr, UdRtrAttr,
};
pub use scope::{PostScope, ScopeCqs};
pub use slot::{MAX_SLOTS, MAX_SRQ_SLOTS, Slot, SlotRefused, SlotRing, SlotSendList, SrqSlotRing};
pub use srq::{SharedReceiveQueue, SrqBuilder};
pub use td::ThreadDomain;
#[cfg(feature = "tokio")]
pub use tokio_io::{AsyncCompletionChannel, AsyncContextEvents};
pub use wr::{
    AnyOp, AtomicOp, AtomicTarget, BindOp, BindRegion, Borrowed, ImmOp, IntoMemory, InvalidateOp,
    Memoryless, Operation, Payload, PostList, ReadOp, RecvList, RecvMemory, RecvRequest, SendList,
    SendOp, SendRequest, Sge, WorkRequest, WriteOp,
};
pub use xrcd::{XrcDomain, XrcdFile};
