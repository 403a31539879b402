//! The message-rate and bandwidth tests of the `bw` tool, measured as perftest's `ib_send_bw`,
//! `ib_write_bw` and `ib_read_bw` measure them, on the `unsafe` post calls of rdma-verbs with
//! doorbell-batched post lists, or (`--path slot`) on the safe slot path: the client's
//! requests sent from a slot ring's slots in `SlotSendList`s, each completion handing the
//! slots of its group back.
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
//!
//! In duration mode ([`crate::duration`]) the client posts until the run is over (at the end
//! of a completion group, so that the last request is signaled), waits for every completion,
//! and ends a send run with a SEND carrying immediate data (`STOP`); completions in the
//! measured window give the rate (no peak). The send server keeps every receive posted, counts
//! what arrives in its own window (and reports it, as perftest's does) until the end message,
//! and checks that it received as many messages as the client says it sent.

use rdma_examples::connect::{PairArgs, QpShape};
use rdma_verbs::{
    cq::{WcOpcode, WorkCompletion},
    slot::{SlotRing, SlotSendList},
    wr::{SendList, SendRequest},
};

use crate::alloc_count::allocations;
use crate::clock;
use crate::conn::{Conn, Io, compare, expect_opcode, fill, poll_one};
use crate::duration::{Duration, Window};
use crate::stats::RULE;

/// A bandwidth test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Test {
    /// SEND to posted receives (`ib_send_bw`).
    Send,
    /// RDMA WRITE (`ib_write_bw`).
    Write,
    /// RDMA READ of the server's memory (`ib_read_bw`).
    Read,
}

impl Test {
    fn title(self) -> &'static str {
        match self {
            Test::Send => "Send BW Test",
            Test::Write => "RDMA_Write BW Test",
            Test::Read => "RDMA_Read BW Test",
        }
    }

    fn opcode(self) -> WcOpcode {
        match self {
            Test::Send => WcOpcode::Send,
            Test::Write => WcOpcode::RdmaWrite,
            Test::Read => WcOpcode::RdmaRead,
        }
    }
}

/// How the client posts its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PostPath {
    /// rdma-verbs' `unsafe` calls, with `SendList`s of one region's bytes.
    Unsafe,
    /// The safe slot path: a slot ring's slots, posted in `SlotSendList`s.
    Slot,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Config {
    /// The test.
    pub test: Test,
    /// How the client posts (the server posts its receives with the `unsafe` calls).
    pub path: PostPath,
    /// Message size.
    pub size: usize,
    /// Requests (not used in duration mode).
    pub iters: u32,
    /// perftest's duration mode (`-D`, `-f`): run for a time rather than a number of
    /// requests; no BW peak.
    pub duration: Option<Duration>,
    /// Most requests outstanding.
    pub tx_depth: u32,
    /// Receives posted at first (send).
    pub rx_depth: u32,
    /// Requests per `ibv_post_send`.
    pub post_list: u32,
    /// A completion every this many requests; `None`: perftest's default (100, or the post
    /// list when it is longer than 1).
    pub cq_mod: Option<u32>,
    /// RDMA reads outstanding at once (perftest's `-o`).
    pub outstanding_reads: u8,
    /// perftest's `--report_gbits`: bandwidths in Gb/s instead of MiB/s.
    pub report_gbits: bool,
    /// Seed of the pattern the data check sends.
    pub seed: u8,
    /// Connection options (the client has a server name).
    pub pair: PairArgs,
}

mod rate;

pub use rate::{BW_HEADER, BW_HEADER_GBITS, Bandwidth, Shape, bw_header, shape};

/// Completions reaped per poll, as perftest's `CTX_POLL_BATCH`.
const POLL_BATCH: usize = 16;

/// Immediate data of the SEND that ends a duration-mode send run.
const STOP: u32 = 0x5354_4f50;

/// Runs `config`, printing perftest's report on stdout (the client measures; in duration
/// mode the send server too, as perftest's). Returns the allocations counted by
/// [`crate::alloc_count`] during the timed loop (the server's receive loop on the server).
pub fn run(config: &Config) -> Result<u64, String> {
    let shape = shape(config)?;
    let server = config.pair.servername.is_none();
    let size = config.size;
    let rx_depth = match config.duration {
        None => config.rx_depth.min(config.iters),
        Some(_) => config.rx_depth,
    } as usize;
    let qp_shape = QpShape {
        max_send_wr: shape.tx_depth,
        max_recv_wr: rx_depth as u32 + 1,
        max_inline_data: 0,
        separate_recv_cq: true,
        outstanding_reads: config.outstanding_reads,
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
        let mut window = config.duration.map(|d| d.start(conn.io.per_us));
        let received = match (config.test, &mut window) {
            (Test::Send, None) => {
                receive_all(&mut conn.io, &conn.target, config.iters, rx_depth, size)?;
                u64::from(config.iters)
            }
            (Test::Send, Some(window)) => {
                receive_until_stop(&mut conn.io, &conn.target, size, window)?
            }
            (Test::Write | Test::Read, _) => {
                // Nothing to do but wait; in duration mode for as long as the client runs.
                if let Some(duration) = config.duration {
                    std::thread::sleep(duration.total());
                }
                0
            }
        };
        let loop_allocations = allocations() - before;
        let sent = conn.exchange(received)?;
        if config.test == Test::Send && sent != received {
            return Err(format!(
                "data check failed: the client sent {sent} messages, {received} arrived"
            ));
        }
        check(config, true, &mut conn)?;
        if let (Test::Send, Some(window)) = (config.test, window) {
            print_window(&window, size, conn.io.per_us, config.report_gbits)?;
        }
        println!("{RULE}");
        conn.finish()?;
        return Ok(loop_allocations);
    }
    // Built before counting: set-up, as perftest's request arrays are.
    let list = match config.path {
        PostPath::Unsafe => Sender::Unsafe(SendList::with_capacity(shape.post_list as usize)),
        PostPath::Slot => Sender::Slot {
            // Room for every request outstanding and the list being built: a free slot is
            // always there, so no send is signaled but those `cq_mod` asks for.
            ring: Box::new(
                conn.io
                    .qp
                    .slot_ring(shape.tx_depth + shape.post_list, size)
                    .map_err(|e| format!("couldn't make the slot ring: {e}"))?,
            ),
            list: SlotSendList::with_capacity(shape.post_list as usize),
        },
    };
    let per_us = conn.io.per_us;
    let (loop_allocations, sent, row) = match config.duration {
        None => {
            let mut posted = vec![0u64; config.iters as usize];
            let mut completed = vec![0u64; config.iters as usize];
            let before = allocations();
            let mut stamps = Stamps {
                iters: config.iters,
                posted: &mut posted,
                completed: &mut completed,
            };
            let sent = post_all(config, &shape, &mut conn, list, &mut stamps)?;
            let loop_allocations = allocations() - before;
            let bandwidth = Bandwidth::from_stamps(&posted, &completed, &shape, size, per_us)
                .ok_or("the run took no time")?;
            let bandwidth = bandwidth.in_units(config.report_gbits);
            (loop_allocations, sent, bandwidth.row(size, sent))
        }
        Some(duration) => {
            let before = allocations();
            let mut window = Timed {
                window: duration.start(per_us),
                cq_mod: u64::from(shape.cq_mod),
            };
            let sent = post_all(config, &shape, &mut conn, list, &mut window)?;
            if config.test == Test::Send {
                // Every request completed: the server takes this one as the end.
                let local = conn.source.slice(..size).map_err(|e| e.to_string())?;
                conn.io
                    .post_send(SendRequest::send(local).with_imm(STOP), WcOpcode::Send)?;
            }
            let loop_allocations = allocations() - before;
            let (completions, ticks) = window.window.result().ok_or(NOTHING_MEASURED)?;
            let bandwidth = Bandwidth::from_window(completions, ticks, shape.cq_mod, size, per_us)
                .ok_or("the run took no time")?;
            let requests = completions * u64::from(shape.cq_mod);
            let bandwidth = bandwidth.in_units(config.report_gbits);
            (loop_allocations, sent, bandwidth.row(size, requests))
        }
    };
    conn.exchange(sent)?;
    check(config, false, &mut conn)?;
    println!("{}", bw_header(config.report_gbits));
    println!("{row}");
    println!("{RULE}");
    conn.finish()?;
    Ok(loop_allocations)
}

/// Why a duration-mode run has no result.
const NOTHING_MEASURED: &str =
    "nothing completed in the measured window: lengthen the duration or shorten the margin";

/// Prints the duration-mode send server's report: the messages received in its window.
fn print_window(window: &Window, size: usize, per_us: f64, gbits: bool) -> Result<(), String> {
    let (messages, ticks) = window.result().ok_or(NOTHING_MEASURED)?;
    let bandwidth = Bandwidth::from_window(messages, ticks, 1, size, per_us)
        .ok_or("the run took no time")?
        .in_units(gbits);
    println!("{}", bw_header(gbits));
    println!("{}", bandwidth.row(size, messages));
    Ok(())
}

/// What the client's loop records, and when it stops posting.
trait Record {
    /// The number of requests, if fixed (the last is then signaled, whatever `cq_mod`).
    fn limit(&self) -> Option<u64>;
    /// Whether to post another list, `sent` requests having been.
    fn post_more(&mut self, sent: u64) -> bool;
    /// Stamps the list whose first request is `first`, about to be posted.
    fn posted(&mut self, first: u64, now: u64);
    /// Stamps a completion that ended the requests up to `done`.
    fn completed(&mut self, done: u64, now: u64);
}

/// A fixed number of requests, every list and completion stamped.
struct Stamps<'a> {
    iters: u32,
    posted: &'a mut [u64],
    completed: &'a mut [u64],
}

impl Record for Stamps<'_> {
    fn limit(&self) -> Option<u64> {
        Some(self.iters.into())
    }
    #[inline]
    fn post_more(&mut self, sent: u64) -> bool {
        sent < u64::from(self.iters)
    }
    #[inline]
    fn posted(&mut self, first: u64, now: u64) {
        self.posted[first as usize] = now;
    }
    #[inline]
    fn completed(&mut self, done: u64, now: u64) {
        self.completed[done as usize - 1] = now;
    }
}

/// Duration mode: completions counted in the window; posting stops once the run is over, at
/// the end of a completion group so that the last request posted is signaled.
struct Timed {
    window: Window,
    cq_mod: u64,
}

impl Record for Timed {
    fn limit(&self) -> Option<u64> {
        None
    }
    #[inline]
    fn post_more(&mut self, sent: u64) -> bool {
        sent % self.cq_mod != 0 || !self.window.over()
    }
    #[inline]
    fn posted(&mut self, _: u64, _: u64) {}
    #[inline]
    fn completed(&mut self, _: u64, now: u64) {
        self.window.tick(now);
    }
}

/// How the client's loop posts: a list of requests on one region with the `unsafe` call, or a
/// slot ring and its list.
enum Sender {
    Unsafe(SendList<'static>),
    Slot {
        ring: Box<SlotRing>,
        list: SlotSendList<'static>,
    },
}

/// The client's timed loop; returns the requests posted (all completed).
fn post_all(
    config: &Config,
    shape: &Shape,
    conn: &mut Conn,
    sender: Sender,
    record: &mut impl Record,
) -> Result<u64, String> {
    let limit = record.limit();
    let (tx_depth, post_list, cq_mod) = (
        u64::from(shape.tx_depth),
        u64::from(shape.post_list),
        u64::from(shape.cq_mod),
    );
    let Conn {
        io, source, remote, ..
    } = conn;
    let local = source.slice(..config.size).map_err(|e| e.to_string())?;
    let to = remote
        .slice(0, config.size as u32)
        .map_err(|e| e.to_string())?;
    let opcode = config.test.opcode();
    let mut sender = match sender {
        Sender::Unsafe(list) => Ok(list.reuse::<SendRequest<'_>>()),
        Sender::Slot { ring, list } => Err((ring, list)),
    };
    let mut wcs = [WorkCompletion::default(); POLL_BATCH];
    let (mut sent, mut done) = (0u64, 0u64);
    let mut stopped = false;
    let mut idle = 0u32;
    let mut deadline = None;
    loop {
        while !stopped && sent + post_list <= tx_depth + done {
            if !record.post_more(sent) {
                stopped = true;
                break;
            }
            let signaled = |k: u64| (k + 1) % cq_mod == 0 || limit == Some(k + 1);
            match &mut sender {
                Ok(list) => {
                    list.clear();
                    for k in sent..sent + post_list {
                        let request = match config.test {
                            Test::Send => SendRequest::send(local).tag(k).erase(),
                            Test::Write => SendRequest::write(local, to).tag(k).erase(),
                            Test::Read => SendRequest::read(local, to).tag(k).erase(),
                        };
                        list.push(if signaled(k) {
                            request
                        } else {
                            request.unsignaled()
                        })
                        .map_err(|e| e.to_string())?;
                    }
                    record.posted(sent, clock::ticks());
                    // SAFETY: `source` and the peer's `target` stay registered until the
                    // queue pair is destroyed (`Conn`'s field order); Rust reads or writes
                    // `source` (which reads write) only after every request completed (the
                    // check after the run).
                    unsafe { io.qp.post_send(list) }
                        .map_err(|e| format!("couldn't post send: {e}"))?;
                }
                Err((ring, list)) => {
                    for k in sent..sent + post_list {
                        let slot = ring.take().ok_or("no free slot in the ring")?;
                        let request = match config.test {
                            Test::Send => SendRequest::send(slot).tag(k).erase(),
                            Test::Write => SendRequest::write(slot, to).tag(k).erase(),
                            Test::Read => SendRequest::read(slot, to).tag(k).erase(),
                        };
                        list.push(if signaled(k) {
                            request
                        } else {
                            request.unsignaled()
                        })
                        .map_err(|e| e.to_string())?;
                    }
                    record.posted(sent, clock::ticks());
                    io.qp
                        .post_send_slot_list(ring, list)
                        .map_err(|e| format!("couldn't post send: {e}"))?;
                }
            }
            sent += post_list;
        }
        if stopped && done == sent {
            return Ok(sent);
        }
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
            done = match &mut sender {
                Ok(_) => (done + cq_mod).min(sent),
                Err((ring, _)) => {
                    // The slot of the completed request, with its tag: the request's number.
                    let slot = ring.complete(wc).ok_or("a completion of no slot")?;
                    let finished = slot.tag() + 1;
                    ring.put(slot).map_err(|e| e.to_string())?;
                    finished
                }
            };
            record.completed(done, clock::ticks());
        }
        if got.is_empty() {
            idle = idle.wrapping_add(1);
            if idle % 1024 == 0 {
                let at =
                    *deadline.get_or_insert_with(|| clock::Deadline::after(io.timeout, io.per_us));
                if at.passed() {
                    return Err(format!(
                        "{done} of {sent} requests completed, then nothing for {} s",
                        io.timeout.as_secs()
                    ));
                }
            }
        } else {
            deadline = None;
        }
    }
}

/// The duration-mode send server's loop: takes receives of `size` bytes, each posted again and
/// counted in `window`, until the client's end message (immediate data [`STOP`]); returns how
/// many arrived before it.
fn receive_until_stop(
    io: &mut Io,
    target: &rdma_verbs::MemoryRegion,
    size: usize,
    window: &mut Window,
) -> Result<u64, String> {
    let mut received = 0;
    loop {
        let wc = io.recv(size)?;
        if let Some(imm) = wc.imm_data() {
            if imm != STOP {
                return Err(format!("a message with immediate data {imm:#x}"));
            }
            return Ok(received);
        }
        received += 1;
        window.tick(clock::ticks());
        io.post_recv(target, 0, size, 0)?;
    }
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
/// server byte for byte. After a run of `iters` the server has no receive posted: exactly
/// `iters` were, and it posts one for the check; after a duration-mode run its receives are
/// still posted (all into the same bytes), and the check message takes one of them.
fn check(config: &Config, server: bool, conn: &mut Conn) -> Result<(), String> {
    let err = |e: rdma_verbs::Error| e.to_string();
    let size = config.size;
    if config.test == Test::Read {
        // The server writes the pattern; the client reads it and checks it.
        if server {
            conn.target
                .write_at(0, &fill(config.seed, size))
                .map_err(err)?;
            conn.sync()?;
            return conn.sync();
        }
        conn.sync()?;
        let local = conn.source.slice(..size).map_err(err)?;
        let from = conn.remote.slice(0, size as u32).map_err(err)?;
        conn.io
            .post_send(SendRequest::read(local, from), WcOpcode::RdmaRead)?;
        let mut got = vec![0u8; size];
        conn.source.read_at(0, &mut got).map_err(err)?;
        compare("the region read from the peer", &got, config.seed)?;
        return conn.sync();
    }
    if server {
        let check_id = match config.duration {
            None => 1,
            Some(_) => 0,
        };
        if config.test == Test::Send && config.duration.is_none() {
            conn.io.post_recv(&conn.target, 0, size, check_id)?;
        }
        conn.sync()?;
        if config.test == Test::Send {
            let wc = poll_one(&mut conn.io.recv_cq, conn.io.timeout, conn.io.per_us)?;
            if wc.wr_id() != check_id || wc.byte_len() as usize != size {
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
            Test::Read => "the region read from the peer",
        };
        return compare(what, &got, config.seed);
    }
    conn.source
        .write_at(0, &fill(config.seed, size))
        .map_err(err)?;
    conn.sync()?;
    let local = conn.source.slice(..size).map_err(err)?;
    let request = match config.test {
        Test::Send => SendRequest::send(local).erase(),
        Test::Write | Test::Read => {
            SendRequest::write(local, conn.remote.slice(0, size as u32).map_err(err)?).erase()
        }
    };
    conn.io.post_send(request, config.test.opcode())?;
    conn.sync()
}
