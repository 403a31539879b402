//! Safe, idiomatic bindings to RDMA verbs (libibverbs).
//!
//! # Quick start
//!
//! ```no_run
//! use rdma_verbs::{Context, cq::WorkCompletion, mr::AccessFlags, qp::{ConnectionRecord, Rc}};
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
//! # Where things are
//!
//! The crate root holds the verbs objects ([`Context`], [`ProtectionDomain`],
//! [`MemoryRegion`], [`CompletionQueue`], [`QueuePair`], [`SharedReceiveQueue`],
//! [`AddressHandle`], ...) and the error type. Everything else lives in the module of the
//! object it belongs to:
//!
//! | module | what it holds |
//! |---|---|
//! | [`device`] | device and port attributes, GIDs, MTUs, fork support |
//! | [`mr`] | [`AccessFlags`](mr::AccessFlags), slices of a region, [`RemoteMemory`](mr::RemoteMemory) |
//! | [`cq`] | [`WorkCompletion`](cq::WorkCompletion), its status and opcode, the CQ builder, extended polling |
//! | [`qp`] | transports ([`Rc`](qp::Rc), [`Uc`](qp::Uc), [`Ud`](qp::Ud)), states ([`Rts`](qp::Rts), ...), transition attributes, connection records |
//! | [`wr`] | the one request vocabulary: [`SendRequest`](wr::SendRequest), [`RecvRequest`](wr::RecvRequest), post lists |
//! | [`slot`] | slot rings, the default safe data path: [`SlotRing`](slot::SlotRing), [`Slot`](slot::Slot), [`SlotSendList`](slot::SlotSendList) |
//! | [`owned`] | the pooled-buffer path: [`BufferPool`](owned::BufferPool), [`Buf`](owned::Buf), [`Completion`](owned::Completion) |
//! | [`scope`] | [`PostScope`](scope::PostScope), posts of borrowed memory |
//! | [`ah`], [`mw`], [`srq`], [`channel`], [`xrcd`], [`async_event`] | what belongs to those objects |
//!
//! # The model
//!
//! - Every verbs object is an RAII value that keeps its parents alive through reference counts:
//!   a queue pair keeps its protection domain, completion queues and SRQ; a CQ its context and
//!   completion channel. No drop order frees a parent under a child, and no type has a lifetime
//!   parameter, so context, PD, CQ and QP can sit in one struct.
//! - A queue pair's transport and state are types: [`QueuePair<Rc, Rts>`](QueuePair). Transitions
//!   consume it and hand it back on failure; sends exist only in RTS.
//! - Every path builds its requests with [`SendRequest`](wr::SendRequest) and
//!   [`RecvRequest`](wr::RecvRequest). The default safe path is slot rings: a queue pair's own
//!   registered slots ([`QueuePair::slot_ring`]) posted as [`Slot`](slot::Slot)s
//!   ([`QueuePair::post_send_slot`], [`QueuePair::post_recv_slot`],
//!   [`QueuePair::fill_slot_ring`] for every free slot, 32 per doorbell, a
//!   [`SlotSendList`](slot::SlotSendList) of sends with one doorbell) and handed back by
//!   [`SlotRing::complete`](slot::SlotRing::complete) for the completions the caller polled,
//!   cheapest when they come back in order (an SRQ's too: [`SharedReceiveQueue::slot_ring`]).
//!   For what slots cannot serve, the pooled-buffer path moves a [`Buf`](owned::Buf) into the
//!   queue pair ([`QueuePair::post_send_owned`], [`QueuePair::post_recv_owned`]) and
//!   [`CompletionQueue::poll_each`] hands it back with its completion: buffers that move
//!   between queue pairs, many queue pairs on one completion queue routed for the caller. In
//!   [`QueuePair::scope`], memory stays borrowed until its completion is reaped. Posting
//!   requests of arbitrary memory ([`PostList`](wr::PostList)) is `unsafe`: the device uses the
//!   memory after the call returns. Which to pick, with a complete program: the repository's
//!   `docs/start-here.md`. Why each is sound: [`docs::safety`]; how the paths work:
//!   [`docs::data_path`]; the state types: [`docs::typestate`]; where each verb lives:
//!   [`docs::modules`].
//! - Polling fills a caller's array; nothing allocates on the data path.
//! - Failed verbs return [`Error`], naming the verb and its errno; failed work requests are
//!   completions with a [`WcStatus`](cq::WcStatus). The library does not panic on bad input.
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

pub mod ah;
pub mod async_event;
mod buf;
mod c_enum;
pub mod channel;
#[cfg(doctest)]
mod compile_fail;
pub mod cq;
pub mod device;
mod dm;
pub mod docs;
mod error;
mod flags;
mod inflight;
pub mod mr;
pub mod mw;
pub mod owned;
mod pd;
pub mod qp;
pub mod scope;
pub mod shared;
pub mod slot;
mod spin;
pub mod srq;
mod td;
#[cfg(feature = "tokio")]
mod tokio_io;
pub mod wr;
pub mod xrcd;

// The verbs objects and the errors; everything else is in the module of the object it
// belongs to (`qp::Rts`, `wr::SendRequest`, `cq::WorkCompletion`, `slot::SlotRing`, ...).
pub use ah::AddressHandle;
pub use channel::CompletionChannel;
pub use cq::CompletionQueue;
pub use device::{Context, Device, DeviceList, devices};
pub use dm::DeviceMemory;
pub use error::{Errno, Error, Result};
pub use mr::{DeviceRegion, MemoryRegion, NullRegion};
pub use mw::MemoryWindow;
pub use pd::ProtectionDomain;
pub use qp::QueuePair;
pub use srq::SharedReceiveQueue;
pub use td::ThreadDomain;
#[cfg(feature = "tokio")]
pub use tokio_io::{AsyncCompletionChannel, AsyncContextEvents};
pub use xrcd::XrcDomain;
