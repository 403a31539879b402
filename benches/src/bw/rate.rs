//! perftest's rules for a bandwidth test's depths, and its bandwidth figures from a run's
//! stamps (or a duration-mode window).

use super::Config;

/// The bandwidth table's header line, as perftest prints it.
pub const BW_HEADER: &str =
    " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]";

/// The header with `--report_gbits`, as perftest prints it then.
pub const BW_HEADER_GBITS: &str =
    " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]";

/// The header of a report in Gb/s (`gbits`) or MiB/s.
pub fn bw_header(gbits: bool) -> &'static str {
    if gbits { BW_HEADER_GBITS } else { BW_HEADER }
}

/// MiB, perftest's format factor.
const MIB: f64 = 1_048_576.0;

/// The parameters after perftest's rules: the completion moderation at most the send depth,
/// and a post list that is a multiple of it (its length by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Most requests outstanding.
    pub tx_depth: u32,
    /// Requests per post.
    pub post_list: u32,
    /// Requests per completion.
    pub cq_mod: u32,
}

/// Checks `config` and applies perftest's rules to its depths.
pub fn shape(config: &Config) -> Result<Shape, String> {
    let Config {
        iters, post_list, ..
    } = *config;
    if config.size == 0 || config.size > crate::lat::MAX_SIZE {
        return Err(format!(
            "message size {} is outside 1..={}",
            config.size,
            crate::lat::MAX_SIZE
        ));
    }
    if config.outstanding_reads == 0 {
        return Err("the outstanding reads (-o) must be positive".into());
    }
    if post_list == 0 || config.tx_depth == 0 || config.rx_depth == 0 {
        return Err("the depths and the post list must be positive".into());
    }
    // In duration mode the iterations play no part.
    let tx_depth = if config.duration.is_some() {
        config.tx_depth
    } else {
        if iters < 5 {
            return Err("iterations must be at least 5".into());
        }
        if iters % post_list != 0 {
            return Err("the iterations must be a multiple of the post list".into());
        }
        config.tx_depth.min(iters)
    };
    if post_list > tx_depth {
        return Err("the post list must fit the send queue (-t)".into());
    }
    let cq_mod = match config.cq_mod {
        Some(0) => return Err("the completion moderation must be positive".into()),
        Some(n) if post_list > 1 && post_list % n != 0 => {
            return Err("the post list must be a multiple of the completion moderation".into());
        }
        Some(n) => n,
        None if post_list > 1 => post_list,
        None => 100,
    };
    Ok(Shape {
        tx_depth,
        post_list,
        cq_mod: cq_mod.min(tx_depth),
    })
}

/// One bandwidth result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bandwidth {
    /// The best window's rate, MiB/s.
    pub peak: f64,
    /// The whole run's rate, MiB/s.
    pub average: f64,
    /// Requests per second, in millions.
    pub msg_rate: f64,
}

impl Bandwidth {
    /// From the stamps of a run: `posted[i]` for each list's first request `i` (other entries
    /// unused), `completed[j]` for each request `j` a completion ended (the `cq_mod`-th ones
    /// and the last), in ticks at `per_us` per microsecond. `None` when the time is not
    /// positive.
    pub fn from_stamps(
        posted: &[u64],
        completed: &[u64],
        shape: &Shape,
        size: usize,
        per_us: f64,
    ) -> Option<Self> {
        let iters = posted.len().min(completed.len());
        let first = *posted.first()?;
        let last = *completed.get(iters.checked_sub(1)?)?;
        let ticks = last.checked_sub(first).filter(|&t| t > 0)? as f64;
        let per_sec = per_us * 1e6;
        let (post_list, cq_mod) = (shape.post_list as usize, shape.cq_mod as usize);
        // The fewest ticks per request over any window from a list's post (i) to a later
        // completion (j, the last request of its completion group).
        let mut best = f64::INFINITY;
        for i in (0..iters).step_by(post_list) {
            let mut j = (i + 1).div_ceil(cq_mod) * cq_mod - 1;
            while j < iters {
                if let Some(span) = completed[j].checked_sub(posted[i]) {
                    best = best.min(span as f64 / (j - i + 1) as f64);
                }
                j += cq_mod;
            }
        }
        let bytes = size as f64;
        Some(Self {
            peak: if best > 0.0 && best.is_finite() {
                bytes * per_sec / best / MIB
            } else {
                0.0
            },
            average: bytes * iters as f64 * per_sec / ticks / MIB,
            msg_rate: iters as f64 * per_sec / ticks / 1e6,
        })
    }

    /// From a duration-mode run: `completions` completions of `cq_mod` requests each in
    /// `ticks`. No peak (perftest measures none in duration mode and prints 0). `None` when
    /// the time is not positive.
    pub fn from_window(
        completions: u64,
        ticks: u64,
        cq_mod: u32,
        size: usize,
        per_us: f64,
    ) -> Option<Self> {
        if ticks == 0 || per_us.is_nan() || per_us <= 0.0 {
            return None;
        }
        let requests = completions as f64 * f64::from(cq_mod);
        let seconds = ticks as f64 / per_us / 1e6;
        Some(Self {
            peak: 0.0,
            average: requests * size as f64 / seconds / MIB,
            msg_rate: requests / seconds / 1e6,
        })
    }

    /// The same rates with the bandwidths in Gb/s (10^9 bits per second) where `gbits`, as
    /// perftest's `--report_gbits` reports them; unchanged (MiB/s) otherwise.
    pub fn in_units(self, gbits: bool) -> Self {
        if !gbits {
            return self;
        }
        let factor = MIB * 8.0 / 1e9;
        Self {
            peak: self.peak * factor,
            average: self.average * factor,
            msg_rate: self.msg_rate,
        }
    }

    /// The result line, laid out as perftest's `REPORT_FMT`.
    pub fn row(&self, size: usize, iters: u64) -> String {
        format!(
            " {size:<7}    {iters:<10}       {:<7.2}            {:<7.2}\t\t     {:<7.6}",
            self.peak, self.average, self.msg_rate
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bw::Test;
    use crate::duration::Duration;
    use rdma_examples::connect::PairArgs;

    fn config(iters: u32, post_list: u32, cq_mod: Option<u32>) -> Config {
        Config {
            test: Test::Send,
            path: super::super::PostPath::Unsafe,
            size: 64,
            iters,
            duration: None,
            tx_depth: 128,
            rx_depth: 512,
            post_list,
            cq_mod,
            outstanding_reads: 16,
            report_gbits: false,
            seed: 0,
            pair: PairArgs {
                port: 1,
                ib_dev: None,
                ib_port: 1,
                gid_idx: None,
                mtu: 1024,
                timeout: 1,
                servername: None,
            },
        }
    }

    #[test]
    fn gigabits_are_mebibytes_times_8_388_608_over_a_billion() {
        let b = Bandwidth {
            peak: 2000.0,
            average: 1000.0,
            msg_rate: 16.384,
        };
        assert_eq!(b.in_units(false), b);
        let g = b.in_units(true);
        assert!((g.average - 8.388_608).abs() < 1e-9, "{g:?}");
        assert!((g.peak - 16.777_216).abs() < 1e-9, "{g:?}");
        assert_eq!(g.msg_rate, b.msg_rate);
        assert_eq!(bw_header(true), BW_HEADER_GBITS);
        assert_eq!(bw_header(false), BW_HEADER);
    }

    #[test]
    fn perftest_s_rules_for_depths() {
        let s = |i, l, q| shape(&config(i, l, q));
        assert_eq!(
            s(1000, 1, None),
            Ok(Shape {
                tx_depth: 128,
                post_list: 1,
                cq_mod: 100
            })
        );
        // A post list sets the moderation to its length.
        assert_eq!(s(1024, 32, None).map(|s| s.cq_mod), Ok(32));
        assert_eq!(s(1024, 32, Some(8)).map(|s| s.cq_mod), Ok(8));
        assert!(s(1024, 32, Some(5)).is_err());
        assert!(s(1000, 32, None).is_err(), "1000 is no multiple of 32");
        // The moderation is clamped to the send depth, the depth to the iterations.
        assert_eq!(s(1000, 1, Some(500)).map(|s| s.cq_mod), Ok(128));
        assert_eq!(s(64, 1, None).map(|s| (s.tx_depth, s.cq_mod)), Ok((64, 64)));
        assert!(s(4, 1, None).is_err());
        assert!(s(1000, 1, Some(0)).is_err());
        // In duration mode the iterations do not count.
        let timed = |l, q| {
            shape(&Config {
                duration: Some(Duration::new(4, None).unwrap()),
                ..config(1, l, q)
            })
        };
        assert_eq!(
            timed(32, None),
            Ok(Shape {
                tx_depth: 128,
                post_list: 32,
                cq_mod: 32
            })
        );
        assert_eq!(timed(1, None).map(|s| s.cq_mod), Ok(100));
    }

    #[test]
    fn bandwidth_from_a_window() {
        // 50 completions of 100 requests of 64 bytes in 0.5 s at 1000 ticks per µs.
        let b = Bandwidth::from_window(50, 500_000_000, 100, 64, 1000.0).unwrap();
        assert!((b.msg_rate - 0.01).abs() < 1e-12, "{b:?}");
        assert!(
            (b.average - 5000.0 * 64.0 / 0.5 / MIB).abs() < 1e-9,
            "{b:?}"
        );
        assert_eq!(b.peak, 0.0);
        assert!(Bandwidth::from_window(50, 0, 100, 64, 1000.0).is_none());
    }

    #[test]
    fn bandwidth_from_stamps() {
        // 8 requests, lists of 2, a completion every 4; 1 tick per ns (1000 per µs).
        let shape = Shape {
            tx_depth: 8,
            post_list: 2,
            cq_mod: 4,
        };
        let mut posted = vec![0u64; 8];
        let mut completed = vec![0u64; 8];
        for (i, t) in [(0, 1000), (2, 1100), (4, 1200), (6, 1300)] {
            posted[i] = t;
        }
        completed[3] = 1500; // 4 requests in 500 ns from the first post
        completed[7] = 1700; // 8 requests in 700 ns
        let b = Bandwidth::from_stamps(&posted, &completed, &shape, 1024, 1000.0).unwrap();
        // 8 requests in 700 ns: 11.43 million per second.
        assert!((b.msg_rate - 8.0 / 0.7).abs() < 1e-9, "{b:?}");
        assert!((b.average - 8.0 * 1024.0 / 700e-9 / MIB).abs() < 1e-6);
        // Best window: posts at 1200 (request 4) to completion of request 7 at 1700: 4 in 500
        // ns = 125 ns each; and request 0 to 3: 4 in 500 ns too; 0 to 7: 87.5 ns each.
        assert!((b.peak - 1024.0 / 87.5e-9 / MIB).abs() < 1e-6, "{b:?}");
        let line = b.row(1024, 8);
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(fields.len(), 5);
        assert_eq!(fields[..2], ["1024", "8"]);
        assert!(Bandwidth::from_stamps(&posted, &[0; 8], &shape, 1024, 1000.0).is_none());
    }
}
