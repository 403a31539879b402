//! Safe bindings to the RDMA connection manager (librdmacm).
//!
//! This crate is being built; the connection manager API lands here after the verbs API of
//! [`rdma_verbs`] it builds on.

#![deny(missing_docs)]

pub use rdma_verbs;
