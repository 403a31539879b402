//! The message-rate and bandwidth tests of the `bw` tool, measured as perftest's `ib_send_bw`
//! and `ib_write_bw` measure them, on the `unsafe` post calls of rdma-verbs with
//! doorbell-batched post lists.
//!
//! The client keeps up to `tx_depth` requests outstanding, posting `post_list` of them per
//! `ibv_post_send` (one doorbell), and asks for a completion on every `cq_mod`-th request (and
//! the last); it stamps each list before posting it and each completion as it polls it
//! (16 per poll). A completion stands for `cq_mod` requests. From the stamps:
//!
//! - **BW average** = bytes of all requests / (last completion − first post), in MiB/s;
//! - **MsgRate** = requests / that time, in millions per second;
//! - **BW peak** = the best rate over any window from a list's post to a later completion.
//!
//! For send, the server keeps receives posted (`rx_depth` at first, one more per completion
//! until `iters` were posted) and counts them; for write it waits. After the timed run, outside
//! it, every receive's length has been checked (in the loop), the server checks it received
//! exactly `iters` messages, and one more message (send) or write of a seeded pattern is checked
//! byte for byte on the server.

use rdma_examples::connect::{PairArgs, QpShape};
use rdma_verbs::{SendList, SendRequest, WcOpcode, WorkCompletion};

use crate::alloc_count::allocations;
use crate::clock;
use crate::conn::{Conn, Io, compare, expect_opcode, fill, poll_one};
use crate::stats::RULE;

/// A bandwidth test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Test {
    /// SEND to posted receives (`ib_send_bw`).
    Send,
    /// RDMA WRITE (`ib_write_bw`).
    Write,
}

impl Test {
    fn title(self) -> &'static str {
        match self {
            Test::Send => "Send BW Test",
            Test::Write => "RDMA_Write BW Test",
        }
    }

    fn opcode(self) -> WcOpcode {
        match self {
            Test::Send => WcOpcode::Send,
            Test::Write => WcOpcode::RdmaWrite,
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Config {
    /// The test.
    pub test: Test,
    /// Message size.
    pub size: usize,
    /// Requests.
    pub iters: u32,
    /// Most requests outstanding.
    pub tx_depth: u32,
    /// Receives posted at first (send).
    pub rx_depth: u32,
    /// Requests per `ibv_post_send`.
    pub post_list: u32,
    /// A completion every this many requests; `None`: perftest's default (100, or the post
    /// list when it is longer than 1).
    pub cq_mod: Option<u32>,
    /// Seed of the pattern the data check sends.
    pub seed: u8,
    /// Connection options (the client has a server name).
    pub pair: PairArgs,
}

/// The bandwidth table's header line, as perftest prints it.
pub const BW_HEADER: &str =
    " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]";

/// Completions reaped per poll, as perftest's `CTX_POLL_BATCH`.
const POLL_BATCH: usize = 16;
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
    if iters < 5 {
        return Err("iterations must be at least 5".into());
    }
    if post_list == 0 || config.tx_depth == 0 || config.rx_depth == 0 {
        return Err("the depths and the post list must be positive".into());
    }
    if iters % post_list != 0 {
        return Err("the iterations must be a multiple of the post list".into());
    }
    let tx_depth = config.tx_depth.min(iters);
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

    /// The result line, laid out as perftest's `REPORT_FMT`.
    pub fn row(&self, size: usize, iters: u32) -> String {
        format!(
            " {size:<7}    {iters:<10}       {:<7.2}            {:<7.2}\t\t     {:<7.6}",
            self.peak, self.average, self.msg_rate
        )
    }
}

/// Runs `config`, printing perftest's report on stdout (the client measures). Returns the
/// allocations counted by [`crate::alloc_count`] during the timed loop (the server's receive
/// loop on the server).
pub fn run(config: &Config) -> Result<u64, String> {
    let shape = shape(config)?;
    let server = config.pair.servername.is_none();
    let size = config.size;
    let rx_depth = config.rx_depth.min(config.iters) as usize;
    let qp_shape = QpShape {
        max_send_wr: shape.tx_depth,
        max_recv_wr: rx_depth as u32 + 1,
        max_inline_data: 0,
        separate_recv_cq: true,
    };
    let mut conn = Conn::open(&config.pair, &qp_shape, size, size, config.test.title())?;
    if server && config.test == Test::Send {
        for _ in 0..rx_depth {
            conn.io.post_recv(&conn.target, 0, size, 0)?;
        }
    }
    conn.sync()?;
    if server {
        let before = allocations();
        if config.test == Test::Send {
            receive_all(&mut conn.io, &conn.target, config.iters, rx_depth, size)?;
        }
        let loop_allocations = allocations() - before;
        conn.sync()?;
        check(config, true, &mut conn)?;
        println!("{RULE}");
        conn.finish()?;
        return Ok(loop_allocations);
    }
    let mut posted = vec![0u64; config.iters as usize];
    let mut completed = vec![0u64; config.iters as usize];
    // Built before counting: set-up, as perftest's request arrays are.
    let list = SendList::with_capacity(shape.post_list as usize);
    let before = allocations();
    post_all(config, &shape, &mut conn, list, &mut posted, &mut completed)?;
    let loop_allocations = allocations() - before;
    conn.sync()?;
    check(config, false, &mut conn)?;
    let bandwidth = Bandwidth::from_stamps(&posted, &completed, &shape, size, conn.io.per_us)
        .ok_or("the run took no time")?;
    println!("{BW_HEADER}");
    println!("{}", bandwidth.row(size, config.iters));
    println!("{RULE}");
    conn.finish()?;
    Ok(loop_allocations)
}

/// The client's timed loop.
fn post_all(
    config: &Config,
    shape: &Shape,
    conn: &mut Conn,
    list: SendList<'_>,
    posted: &mut [u64],
    completed: &mut [u64],
) -> Result<(), String> {
    let iters = config.iters as usize;
    let (tx_depth, post_list, cq_mod) = (
        shape.tx_depth as usize,
        shape.post_list as usize,
        shape.cq_mod as usize,
    );
    let Conn {
        io, source, remote, ..
    } = conn;
    let local = source.slice(..config.size).map_err(|e| e.to_string())?;
    let to = remote
        .slice(0, config.size as u32)
        .map_err(|e| e.to_string())?;
    let opcode = config.test.opcode();
    let mut list: SendList<'_> = list.reuse();
    let mut wcs = [WorkCompletion::default(); POLL_BATCH];
    let (mut sent, mut done) = (0usize, 0usize);
    let mut idle = 0u32;
    let mut deadline = None;
    while sent < iters || done < iters {
        while sent < iters && sent + post_list <= tx_depth + done {
            list.clear();
            for k in sent..sent + post_list {
                let request = match config.test {
                    Test::Send => SendRequest::send(k as u64, local),
                    Test::Write => SendRequest::write(k as u64, local, to),
                };
                let signaled = (k + 1) % cq_mod == 0 || k == iters - 1;
                list.push(if signaled {
                    request.signaled()
                } else {
                    request
                })
                .map_err(|e| e.to_string())?;
            }
            posted[sent] = clock::ticks();
            // SAFETY: `source` and the peer's `target` stay registered until the queue pair is
            // destroyed (`Conn`'s field order); Rust writes `source` only after every request
            // completed (the check after the run).
            unsafe { io.qp.post_send(&mut list) }
                .map_err(|e| format!("couldn't post send: {e}"))?;
            sent += post_list;
        }
        if done < iters {
            let got = io
                .send_cq
                .poll(&mut wcs)
                .map_err(|e| format!("poll CQ failed: {e}"))?;
            for wc in got {
                if !wc.is_success() {
                    return Err(format!(
                        "completion failed: {} (request {})",
                        wc.status(),
                        wc.wr_id()
                    ));
                }
                expect_opcode(wc, opcode)?;
                done = (done + cq_mod).min(iters);
                completed[done - 1] = clock::ticks();
            }
            if got.is_empty() {
                idle = idle.wrapping_add(1);
                if idle % 1024 == 0 {
                    let at = *deadline
                        .get_or_insert_with(|| clock::Deadline::after(io.timeout, io.per_us));
                    if at.passed() {
                        return Err(format!(
                            "{done} of {iters} requests completed, then nothing for {} s",
                            io.timeout.as_secs()
                        ));
                    }
                }
            } else {
                deadline = None;
            }
        }
    }
    Ok(())
}

/// The send server's loop: counts `iters` receives of `size` bytes, keeping receives posted
/// until `iters` were.
fn receive_all(
    io: &mut Io,
    target: &rdma_verbs::MemoryRegion,
    iters: u32,
    rx_depth: usize,
    size: usize,
) -> Result<(), String> {
    let mut posted = rx_depth as u32;
    for _ in 0..iters {
        io.recv(size)?;
        if posted < iters {
            io.post_recv(target, 0, size, 0)?;
            posted += 1;
        }
    }
    Ok(())
}

/// The data check after the run: one more message (or write) of the pattern, checked on the
/// server byte for byte. The server has no receive posted here: exactly `iters` were.
fn check(config: &Config, server: bool, conn: &mut Conn) -> Result<(), String> {
    let err = |e: rdma_verbs::Error| e.to_string();
    let size = config.size;
    if server {
        if config.test == Test::Send {
            conn.io.post_recv(&conn.target, 0, size, 1)?;
        }
        conn.sync()?;
        if config.test == Test::Send {
            let wc = poll_one(&mut conn.io.recv_cq, conn.io.timeout, conn.io.per_us)?;
            if wc.wr_id() != 1 || wc.byte_len() as usize != size {
                return Err(format!(
                    "the check message took receive {} with {} bytes",
                    wc.wr_id(),
                    wc.byte_len()
                ));
            }
        }
        conn.sync()?;
        let mut got = vec![0u8; size];
        conn.target.read_at(0, &mut got).map_err(err)?;
        let what = match config.test {
            Test::Send => "the message received",
            Test::Write => "the region the peer wrote",
        };
        return compare(what, &got, config.seed);
    }
    conn.source
        .write_at(0, &fill(config.seed, size))
        .map_err(err)?;
    conn.sync()?;
    let local = conn.source.slice(..size).map_err(err)?;
    let request = match config.test {
        Test::Send => SendRequest::send(0, local),
        Test::Write => {
            SendRequest::write(0, local, conn.remote.slice(0, size as u32).map_err(err)?)
        }
    };
    conn.io.post_send(request, config.test.opcode())?;
    conn.sync()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(iters: u32, post_list: u32, cq_mod: Option<u32>) -> Config {
        Config {
            test: Test::Send,
            size: 64,
            iters,
            tx_depth: 128,
            rx_depth: 512,
            post_list,
            cq_mod,
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
