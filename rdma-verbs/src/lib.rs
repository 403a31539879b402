//! Safe, idiomatic bindings to RDMA verbs (libibverbs).
//!
//! This crate is being built; today it re-exports the raw bindings as [`ffi`]. The safe API
//! (contexts, protection domains, memory regions, completion queues, typestate queue pairs and
//! doorbell-batched post lists) lands here next.

#![deny(missing_docs)]

pub use rdma_verbs_sys as ffi;
