//! Shared code of the example programs: the pingpongs' out-of-band exchange and loop.

#![forbid(unsafe_code)] // the examples show the safe API: no `unsafe` anywhere

pub mod cmtool;
pub mod connect;
pub mod endpoint;
pub mod exchange;
pub mod pingpong;
pub mod udnode;
