//! Latency statistics computed the way perftest's `print_report_lat` computes them, and its
//! result table.
//!
//! One stamp is taken per iteration, just before the iteration's request is posted; a sample
//! is the time between two consecutive stamps, which is one full round trip plus the loop's own
//! cost. Samples are divided by 2 for tests whose round trip is two messages (SEND, WRITE:
//! perftest reports half the round trip) and by 1 for READ and atomics (one request is the round
//! trip). They are sorted and the two largest dropped; then
//!
//! - `t_min` is the smallest kept sample and `t_max` the sample just past the kept ones (the
//!   third largest of all, as perftest indexes it);
//! - `t_typical` is the median and `t_avg` the mean of the kept samples;
//! - `t_stdev` is their standard deviation (perftest truncates each deviation to a whole
//!   number of cycles before squaring it; here it is computed without truncation);
//! - the 99 % and 99.9 % percentiles are the samples at `ceil(kept × 0.99)` and
//!   `ceil(kept × 0.999)` (so at 1000 iterations the 99.9 % column equals `t_max`, as in every
//!   perftest run).
//!
//! Stamps are ticks of [`crate::clock`] (the cycle counter, as perftest reads it), converted
//! with a measured rate; values are reported in microseconds.

/// perftest drops this many of the largest samples (`LAT_MEASURE_TAIL`).
pub const MEASURE_TAIL: usize = 2;

/// The fewest iterations that leave samples to report (perftest refuses fewer than 5).
pub const MIN_ITERS: u32 = 5;

/// The ruler line above and below perftest's tables (87 dashes).
pub const RULE: &str =
    "---------------------------------------------------------------------------------------";

/// The latency table's header line, as perftest prints it.
pub const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";

/// One latency result, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Latency {
    /// The smallest sample.
    pub min: f64,
    /// The sample just past the kept ones.
    pub max: f64,
    /// The median of the kept samples.
    pub typical: f64,
    /// The mean of the kept samples.
    pub avg: f64,
    /// The standard deviation of the kept samples.
    pub stdev: f64,
    /// The 99th percentile.
    pub p99: f64,
    /// The 99.9th percentile.
    pub p999: f64,
}

impl Latency {
    /// The statistics of `stamps` (ticks, `per_us` to the microsecond, one per iteration, in
    /// order), each round trip divided by `rtt_factor` (2 for SEND and WRITE, 1 for READ and
    /// atomics). `None` with fewer than [`MIN_ITERS`] stamps, stamps that go backwards, or a
    /// rate that is not positive.
    pub fn from_stamps(stamps: &[u64], per_us: f64, rtt_factor: u32) -> Option<Self> {
        if stamps.len() < MIN_ITERS as usize
            || rtt_factor == 0
            || per_us.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater)
        {
            return None;
        }
        let mut samples = Vec::with_capacity(stamps.len() - 1);
        for pair in stamps.windows(2) {
            samples.push(pair[1].checked_sub(pair[0])?);
        }
        samples.sort_unstable();
        let kept = samples.len() - MEASURE_TAIL;
        let us = |ticks: u64| ticks as f64 / per_us / f64::from(rtt_factor);
        let d = &samples;
        let median = if kept % 2 == 0 {
            (us(d[kept / 2]) + us(d[kept / 2 - 1])) / 2.0
        } else {
            us(d[kept / 2])
        };
        let avg = d[..kept].iter().map(|&s| us(s)).sum::<f64>() / kept as f64;
        let variance = d[..kept]
            .iter()
            .map(|&s| (us(s) - avg).powi(2))
            .sum::<f64>()
            / kept as f64;
        let at = |fraction: f64| us(d[((kept as f64 * fraction).ceil() as usize).min(kept)]);
        Some(Self {
            min: us(d[0]),
            max: us(d[kept]),
            typical: median,
            avg,
            stdev: variance.sqrt(),
            p99: at(0.99),
            p999: at(0.999),
        })
    }

    /// The result line for `size` bytes and `iters` iterations, laid out as perftest's
    /// `REPORT_FMT_LAT` lays it out.
    pub fn row(&self, size: usize, iters: u32) -> String {
        format!(
            " {size:<7} {iters}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
            self.min, self.max, self.typical, self.avg, self.stdev, self.p99, self.p999
        )
    }
}

/// The duration-mode latency table's header line, as perftest prints it
/// (`RESULT_FMT_LAT_DUR`).
pub const LAT_DUR_HEADER: &str = " #bytes        #iterations       t_avg[usec]    tps average";

/// A duration-mode latency result: `iters` round trips that took `ticks` at `per_us` ticks per
/// microsecond, each round trip divided by `rtt_factor`. As perftest's
/// `print_report_lat_duration`: the mean and the round trips per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DurationLatency {
    /// Round trips measured.
    pub iters: u64,
    /// The mean, in microseconds (half a round trip for SEND and WRITE).
    pub avg: f64,
    /// Round trips per second.
    pub tps: f64,
}

impl DurationLatency {
    /// `None` when nothing was measured or the rate is not positive.
    pub fn new(iters: u64, ticks: u64, per_us: f64, rtt_factor: u32) -> Option<Self> {
        if iters == 0 || ticks == 0 || per_us.is_nan() || per_us <= 0.0 {
            return None;
        }
        let us = ticks as f64 / per_us;
        Some(Self {
            iters,
            avg: us / f64::from(rtt_factor) / iters as f64,
            tps: iters as f64 / (us / 1e6),
        })
    }

    /// The result line for `size` bytes, laid out as perftest's `REPORT_FMT_LAT_DUR`.
    pub fn row(&self, size: usize) -> String {
        format!(
            " {size:<7}       {}            {:<7.2}        {:<7.2}",
            self.iters, self.avg, self.tps
        )
    }
}

/// A result line of a perftest latency table (from our tool or from perftest), parsed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Row {
    /// Message size in bytes.
    pub size: usize,
    /// Iterations.
    pub iters: u32,
    /// The statistics.
    pub latency: Latency,
}

impl Row {
    /// Parses a result line: nine whitespace-separated numbers. `None` for any other line.
    pub fn parse(line: &str) -> Option<Self> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [size, iters, rest @ ..] = fields.as_slice() else {
            return None;
        };
        let values: Vec<f64> = rest.iter().map(|f| f.parse().ok()).collect::<Option<_>>()?;
        let [min, max, typical, avg, stdev, p99, p999] = values.as_slice() else {
            return None;
        };
        Some(Self {
            size: size.parse().ok()?,
            iters: iters.parse().ok()?,
            latency: Latency {
                min: *min,
                max: *max,
                typical: *typical,
                avg: *avg,
                stdev: *stdev,
                p99: *p99,
                p999: *p999,
            },
        })
    }

    /// The result lines of a whole latency report.
    pub fn parse_all(text: &str) -> Vec<Self> {
        text.lines().filter_map(Self::parse).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duration_latency_is_the_mean_and_the_rate() {
        // 1000 round trips of SEND in 50 ms at 2000 ticks per µs: 50 µs each, 25 one way.
        let d = DurationLatency::new(1000, 100_000_000, 2000.0, 2).unwrap();
        assert!((d.avg - 25.0).abs() < 1e-9, "{d:?}");
        assert!((d.tps - 20_000.0).abs() < 1e-6, "{d:?}");
        let row = d.row(64);
        let fields: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(fields, ["64", "1000", "25.00", "20000.00"]);
        assert_eq!(DurationLatency::new(0, 5, 1.0, 1), None);
        assert_eq!(DurationLatency::new(5, 5, f64::NAN, 1), None);
    }

    /// Stamps whose round trips are `samples` (ns).
    fn stamps(samples: &[u64]) -> Vec<u64> {
        let mut t = 1_000_000;
        let mut out = vec![t];
        for s in samples {
            t += s;
            out.push(t);
        }
        out
    }

    #[test]
    fn statistics_follow_perftest() {
        // 10 samples (11 stamps), in µs after halving: 1..=8, then 50 and 100 (dropped).
        let raw: Vec<u64> = [3, 1, 100, 2, 8, 5, 50, 4, 7, 6]
            .iter()
            .map(|us| us * 2000)
            .collect();
        let l = Latency::from_stamps(&stamps(&raw), 1000.0, 2).unwrap();
        assert_eq!(l.min, 1.0);
        // Kept: 1..=8 (8 samples); t_max is the one just past them.
        assert_eq!(l.max, 50.0);
        assert_eq!(l.typical, 4.5);
        assert_eq!(l.avg, 4.5);
        assert!((l.stdev - 5.25f64.sqrt()).abs() < 1e-12);
        // ceil(8 × 0.99) = 8 and ceil(8 × 0.999) = 8: both are t_max.
        assert_eq!((l.p99, l.p999), (50.0, 50.0));
    }

    #[test]
    fn odd_count_median_and_full_round_trips() {
        // 9 samples, 7 kept: 10, 20, ..., 70; READ-style (factor 1).
        let raw: Vec<u64> = [70, 10, 900, 30, 20, 800, 60, 50, 40]
            .iter()
            .map(|us| us * 1000)
            .collect();
        let l = Latency::from_stamps(&stamps(&raw), 1000.0, 1).unwrap();
        assert_eq!((l.min, l.typical, l.avg, l.max), (10.0, 40.0, 40.0, 800.0));
    }

    #[test]
    fn at_1000_iterations_the_last_percentile_is_t_max() {
        let raw: Vec<u64> = (1..1000).map(|i| i * 1000).collect();
        let l = Latency::from_stamps(&stamps(&raw), 1000.0, 1).unwrap();
        // 999 samples, 997 kept: t_max = 998 µs; 99 % = sample ceil(987.03) = 988 → 989 µs.
        assert_eq!((l.max, l.p999, l.p99), (998.0, 998.0, 989.0));
    }

    #[test]
    fn too_few_or_backwards_stamps_give_nothing() {
        assert_eq!(Latency::from_stamps(&[1, 2, 3, 4], 1.0, 1), None);
        assert_eq!(Latency::from_stamps(&[1, 2, 3, 2, 5, 6], 1.0, 1), None);
        assert_eq!(Latency::from_stamps(&[1, 2, 3, 4, 5, 6], 1.0, 0), None);
        assert_eq!(Latency::from_stamps(&[1, 2, 3, 4, 5, 6], 0.0, 1), None);
        assert_eq!(Latency::from_stamps(&[1, 2, 3, 4, 5, 6], f64::NAN, 1), None);
    }

    #[test]
    fn rows_round_trip_and_match_perftest_lines() {
        let l = Latency::from_stamps(&stamps(&[1500; 20]), 1000.0, 2).unwrap();
        let line = l.row(64, 21);
        assert_eq!(
            Row::parse(&line),
            Some(Row {
                size: 64,
                iters: 21,
                latency: l
            })
        );
        // A line printed by perftest's ib_send_lat.
        let c = " 2       1000          0.76           0.95         0.78     \t       0.78        \t0.01   \t\t0.83    \t\t0.95   ";
        let row = Row::parse(c).unwrap();
        assert_eq!((row.size, row.iters, row.latency.typical), (2, 1000, 0.78));
        assert_eq!(Row::parse(LAT_HEADER), None);
        assert_eq!(Row::parse(RULE), None);
        assert_eq!(Row::parse(" local address: LID 0x00 QPN 0x0011"), None);
    }
}
