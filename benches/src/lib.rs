//! Shared code of the benchmarks: the `lat` and `bw` tools' tests (perftest's latency,
//! bandwidth and message-rate tests on rdma-verbs), perftest's statistics and duration mode,
//! the stamp clock, and the one-process loopback connection of the instruction counts and
//! criterion benches.

pub mod alloc_count;
pub mod bw;
pub mod clock;
pub mod conn;
pub mod duration;
pub mod lat;
pub mod loopback;
pub mod stats;
