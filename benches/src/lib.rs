//! Shared code of the benchmarks: perftest's latency statistics and the latency tests of the
//! `lat` tool.

pub mod clock;
pub mod lat;
pub mod stats;
