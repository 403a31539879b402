//! Statistics: counters per node, a fault-latency histogram, and the report gathered at the end
//! (a table, or JSON).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::Result;
use crate::wire::Reader;

/// Buckets of [`Histogram`]: 16 per power of two up to 2^63.
const BUCKETS: usize = 1024;

/// A histogram of nanosecond values that the signal handler can update (atomics only).
/// Values below 16 have their own bucket; above, each power of two is split in 16, so a
/// quantile is within 1/16 of the value.
#[derive(Debug)]
pub(crate) struct Histogram {
    counts: [AtomicU64; BUCKETS],
}

fn bucket(value: u64) -> usize {
    if value < 16 {
        return value as usize;
    }
    let exponent = 63 - value.leading_zeros() as usize; // >= 4
    let sub = ((value >> (exponent - 4)) & 15) as usize;
    (exponent - 3) * 16 + sub
}

fn bucket_floor(index: usize) -> u64 {
    if index < 16 {
        return index as u64;
    }
    let exponent = index / 16 + 3;
    let sub = (index % 16) as u64;
    (16 + sub) << (exponent - 4)
}

impl Histogram {
    /// An empty histogram.
    pub(crate) const fn new() -> Histogram {
        #[allow(clippy::declare_interior_mutable_const)]
        const ZERO: AtomicU64 = AtomicU64::new(0);
        Histogram {
            counts: [ZERO; BUCKETS],
        }
    }

    /// Counts `value`.
    pub(crate) fn record(&self, value: u64) {
        self.counts[bucket(value)].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts now.
    pub(crate) fn snapshot(&self) -> Vec<u64> {
        self.counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }
}

/// The value at quantile `q` (0..=1) of bucket counts `counts` (the lower bound of its
/// bucket), or 0 when there are none.
pub(crate) fn quantile(counts: &[u64], q: f64) -> u64 {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return 0;
    }
    let rank = ((total as f64 * q).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (i, &c) in counts.iter().enumerate() {
        seen += c;
        if seen >= rank {
            return bucket_floor(i);
        }
    }
    bucket_floor(counts.len() - 1)
}

macro_rules! counters {
    ($($(#[doc = $doc:literal])* $name:ident,)*) => {
        /// One node's counters.
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct Stats {
            $($(#[doc = $doc])* pub $name: u64,)*
        }

        impl Stats {
            /// The counters' names, in report order.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($name)),*];

            /// The counters' values, in [`Stats::NAMES`]' order.
            pub fn values(&self) -> Vec<u64> {
                vec![$(self.$name),*]
            }

            fn from_values(values: &[u64]) -> Stats {
                let mut it = values.iter().copied();
                Stats { $($name: it.next().unwrap_or(0),)* }
            }
        }
    };
}

counters! {
    /// Read faults on invalid pages.
    read_faults,
    /// Write faults on invalid pages (fetched and made writable in one fault).
    write_faults,
    /// Write faults on read-only copies (a twin made, no fetch).
    upgrade_faults,
    /// Remote fetch requests (one per fault that needed the home's copy).
    fetches,
    /// Pages fetched, prefetched ones included.
    pages_fetched,
    /// Pages fetched ahead of a fault.
    prefetched,
    /// Prefetched pages touched before they were invalidated.
    prefetch_hits,
    /// Diff pages sent home.
    diff_pages,
    /// Waits for homes' acknowledgements of diffs: one per release that sent any, however
    /// many homes it sent to (more only where one home's diffs took several messages).
    diff_waits,
    /// Bytes of control messages sent (headers, requests, lock and barrier traffic).
    control_bytes,
    /// Bytes of page data received.
    data_bytes,
    /// Bytes of diffs sent (run headers and changed bytes).
    diff_bytes,
    /// Lock acquisitions.
    locks,
    /// Nanoseconds waited for locks.
    lock_wait_ns,
    /// Barriers.
    barriers,
    /// Nanoseconds waited in barriers (including the release before).
    barrier_wait_ns,
    /// Pages this node served as a home.
    pages_served,
    /// Diff pages this node applied as a home.
    diffs_applied,
    /// Times every cached copy was dropped (changes sent home) because the window had no
    /// room for another memory mapping (`vm.max_map_count`, `SIGSEGV` faults only).
    evictions,
    /// Faults served: the handler's count with `SIGSEGV` faults, the faults the kernel
    /// reported with `userfaultfd`.
    faults,
    /// Fault-service time, median, nanoseconds.
    fault_p50_ns,
    /// Fault-service time, 99th percentile.
    fault_p99_ns,
    /// Fault-service time, 99.9th percentile.
    fault_p999_ns,
}

impl Stats {
    /// The wire form: each counter as a little-endian `u64`.
    pub(crate) fn encode(&self) -> Vec<u8> {
        self.values().iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// Reads the wire form.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Stats> {
        let mut r = Reader::new(bytes);
        let values = Stats::NAMES
            .iter()
            .map(|_| r.u64())
            .collect::<Result<Vec<u64>>>()?;
        r.finish()?;
        Ok(Stats::from_values(&values))
    }
}

/// Every node's statistics, as rank 0 gathers them at the end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Per node, by rank.
    pub nodes: Vec<Stats>,
}

impl Report {
    /// A table: one row per counter, one column per node and the total (latencies: the
    /// largest).
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = write!(out, "{:<16}", "counter");
        for rank in 0..self.nodes.len() {
            let _ = write!(out, " {:>14}", format!("node {rank}"));
        }
        let _ = writeln!(out, " {:>14}", "total");
        let rows: Vec<Vec<u64>> = self.nodes.iter().map(Stats::values).collect();
        for (i, name) in Stats::NAMES.iter().enumerate() {
            let _ = write!(out, "{name:<16}");
            for row in &rows {
                let _ = write!(out, " {:>14}", row[i]);
            }
            let column = rows.iter().map(|r| r[i]);
            let total = if name.starts_with("fault_p") {
                column.max().unwrap_or(0)
            } else {
                column.fold(0u64, u64::saturating_add)
            };
            let _ = writeln!(out, " {total:>14}");
        }
        out
    }

    /// JSON: `{"nodes":[{"read_faults":…,…},…]}`.
    pub fn json(&self) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|s| {
                let fields: Vec<String> = Stats::NAMES
                    .iter()
                    .zip(s.values())
                    .map(|(n, v)| format!("\"{n}\":{v}"))
                    .collect();
                format!("{{{}}}", fields.join(","))
            })
            .collect();
        format!("{{\"nodes\":[{}]}}", nodes.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_within_a_sixteenth() {
        let mut last = 0;
        for v in (0..5000u64).chain([1 << 20, (1 << 20) + 12345, u64::MAX]) {
            let b = bucket(v);
            assert!(b >= last || v > 5000, "{v}");
            last = b;
            let floor = bucket_floor(b);
            assert!(floor <= v, "{v}: floor {floor}");
            assert!(v - floor <= v / 16, "{v}: floor {floor}");
        }
        assert!(bucket(u64::MAX) < BUCKETS);
    }

    #[test]
    fn quantiles_of_known_counts() {
        let h = Histogram::new();
        for v in 1..=100u64 {
            h.record(v * 1000);
        }
        let counts = h.snapshot();
        let p50 = quantile(&counts, 0.5);
        assert!((47_000..=50_000).contains(&p50), "{p50}");
        let p99 = quantile(&counts, 0.99);
        assert!((93_000..=99_000).contains(&p99), "{p99}");
        assert_eq!(quantile(&[0; 4], 0.5), 0);
    }

    #[test]
    fn stats_round_trip_and_short_ones_are_refused() {
        let s = Stats {
            read_faults: 3,
            fault_p999_ns: u64::MAX,
            ..Stats::default()
        };
        let bytes = s.encode();
        assert_eq!(bytes.len(), Stats::NAMES.len() * 8);
        assert_eq!(Stats::decode(&bytes).unwrap(), s);
        assert!(Stats::decode(&bytes[1..]).is_err());
        let report = Report {
            nodes: vec![s.clone(), s],
        };
        assert!(
            report
                .table()
                .contains("read_faults                   3              3              6")
        );
        assert!(report.json().starts_with("{\"nodes\":[{\"read_faults\":3,"));
    }
}
