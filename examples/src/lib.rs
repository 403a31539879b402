//! Shared code of the example programs: the pingpongs' out-of-band exchange and loop.

pub mod connect;
pub mod exchange;
pub mod pingpong;
