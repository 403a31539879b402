//! Safe bindings to the RDMA connection manager (librdmacm): IP addresses and ports instead of
//! LIDs, GIDs and an out-of-band exchange; listen, accept, reject and connect with private
//! data; the queue pairs are the typestate queue pairs of [`rdma_verbs`].
//!
//! - [`EventChannel`]: where events are reported (a non-blocking descriptor,
//!   [`AsFd`](std::os::fd::AsFd)), read as [`Event`]s, each acknowledged exactly once when
//!   dropped.
//! - [`CmId`]: an identifier (the connection manager's socket): bind, resolve, listen,
//!   connect, accept, reject, disconnect, migrate to another channel; its device's verbs
//!   [`Context`](rdma_verbs::Context) and the queue pair attributes of its connection.
//! - [`getaddrinfo`]: names and services to addresses (`rdma_getaddrinfo`).
//! - Blocking helpers for an identifier alone on its channel:
//!   [`CmId::resolve`], [`CmId::connect_qp`], [`CmId::accept_qp`], [`CmId::wait_event`].
//! - Servers: [`CmId::get_request`] takes a listener's next [`ConnectRequest`], its identifier
//!   on a channel of its own; [`CmId::ready_rc_qp`] readies the queue pair before
//!   [`CmId::accept`].
//! - With the `tokio` feature, the async API: `AsyncEventChannel`, `AsyncCmId` (resolve,
//!   connect, accept, disconnect) and `AsyncListener` (`accept()` and the `incoming()`
//!   stream); every future cancel-safe.
//! - Queue pairs the connection manager makes and moves ([`CmId::create_qp`], then
//!   [`CmId::connect_init_qp`] or [`CmId::accept_init_qp`]), and [`Endpoint`]s: synchronous
//!   identifiers (`rdma_create_ep`), as rdma-core's `rdma_server` and `rdma_client` use them.
//! - Enhanced connection establishment ([`CmId::set_local_ece`], [`CmId::remote_ece`],
//!   [`CmId::reject_ece`]) and the devices librdmacm opened ([`devices`]).
//! - UD over the connection manager ([`PortSpace::Udp`]): [`CmId::ready_ud_qp`],
//!   [`CmId::connect_ud`] (the server's queue pair, Q_Key and path as a [`UdParam`]),
//!   [`CmId::accept_ud`]; multicast: [`CmId::join_multicast`] / [`CmId::join_group`],
//!   [`UdParam::attach`], [`CmId::leave_multicast`].
//!
//! A client:
//!
//! ```no_run
//! use std::time::Duration;
//! use rdma_cm::{CmId, ConnParam, EventChannel, PortSpace};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let wait = Duration::from_secs(5);
//! let channel = EventChannel::new()?;
//! let id = CmId::new(&channel, PortSpace::Tcp)?;
//! id.resolve("192.0.2.1:7174".parse()?, wait)?;
//! let context = id.context()?;
//! let pd = context.alloc_pd()?;
//! let cq = context.create_cq(16)?;
//! let qp = pd.qp_builder(&cq, &cq).build()?;
//! let (qp, accepted_with) = id.connect_qp(qp, &ConnParam::new().private_data(b"hello")?, wait)?;
//! // ... post on `qp` ...
//! id.disconnect()?;
//! # drop((qp, accepted_with));
//! # Ok(())
//! # }
//! ```
//!
//! The event model, the locking and why no drop order is unsafe: `docs/rdma-cm.md`.

#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The README's code blocks are compiled with the doc tests (its quick start).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

mod addr;
mod addrinfo;
mod blocking;
mod c_enum;
mod channel;
mod devices;
mod endpoint;
mod error;
mod event;
mod group;
mod id;
mod managed;
mod multicast;
mod param;
mod request;
#[cfg(feature = "tokio")]
mod tokio_io;
mod ud;

pub use addrinfo::{AddrHints, AddrInfo, getaddrinfo};
pub use c_enum::EventKind;
pub use channel::EventChannel;
pub use devices::devices;
pub use endpoint::Endpoint;
pub use error::{Error, Result};
pub use event::Event;
pub use id::{CmId, PortSpace};
pub use multicast::JoinKind;
pub use param::{ConnParam, PeerParam};
pub use rdma_verbs;
pub use request::ConnectRequest;
#[cfg(feature = "tokio")]
pub use tokio_io::{
    AsyncCmId, AsyncConnectRequest, AsyncEventChannel, AsyncListener, Events, Incoming,
};
pub use ud::UdParam;
