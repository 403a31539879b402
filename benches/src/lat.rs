//! The latency tests of the `lat` tool, measured as perftest's `ib_send_lat`, `ib_write_lat`,
//! `ib_read_lat` and `ib_atomic_lat` measure them (see [`crate::stats`] for the statistics),
//! on the `unsafe` post calls of rdma-verbs.
//!
//! - **send**: both sides keep receives posted; the client sends first, the server waits for a
//!   receive first; each side stamps, posts one signaled SEND and polls its completion after
//!   each receive (a sample is a round trip of two SENDs).
//! - **write**: no receives; each side spins on the last byte of the region the peer writes
//!   until it holds the iteration count (mod 256), then stamps, writes the count into the last
//!   byte of its own message and RDMA WRITEs the message to the peer.
//! - **read**: the client stamps, posts one RDMA READ of the server's region and polls its
//!   completion; the server only waits.
//! - **atomic**: as read, with 8-byte FETCH_AND_ADD (add 1) on the server's counter.
//!
//! What crossed the wire is checked after each size's timed loop, outside it: a SEND each way
//! (or a WRITE each way) of a full message of a seeded pattern, every byte compared; the last
//! READ's bytes against the server's pattern; every fetch-and-add's effect (the last old value
//! is `iters - 1` and the server's counter ends at `iters`). Every completion's status and
//! opcode are checked in the loop, and a receive's length.
//!
//! In duration mode ([`crate::duration`]) the loops run until the run is over (waits for the
//! peer give up then too); the sides then trade how many requests each sent, a ping-pong side
//! takes the messages its peer sent before stopping, and the checks use those counts.

use rdma_examples::connect::{PairArgs, QpShape};
use rdma_verbs::{
    MemoryRegion,
    cq::WcOpcode,
    mr::RemoteMemory,
    wr::{Payload, SendRequest},
};

use crate::alloc_count::allocations;
use crate::clock::{self, Deadline};
use crate::conn::{Conn, Io, compare, fill};
use crate::duration::{Duration, Window};
use crate::stats::{DurationLatency, LAT_DUR_HEADER, LAT_HEADER, Latency, MIN_ITERS};

/// A latency test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Test {
    /// SEND/RECV ping-pong (`ib_send_lat`).
    Send,
    /// RDMA WRITE ping-pong polling memory (`ib_write_lat`).
    Write,
    /// RDMA READ (`ib_read_lat`).
    Read,
    /// FETCH_AND_ADD (`ib_atomic_lat`).
    Atomic,
}

impl Test {
    /// perftest's name of the test, in the title line.
    fn title(self) -> &'static str {
        match self {
            Test::Send => "Send Latency Test",
            Test::Write => "RDMA_Write Latency Test",
            Test::Read => "RDMA_Read Latency Test",
            Test::Atomic => "Atomic FETCH_AND_ADD Latency Test",
        }
    }

    /// Round trips per sample: 2 messages for the ping-pongs, 1 request for READ and atomics.
    fn rtt_factor(self) -> u32 {
        match self {
            Test::Send | Test::Write => 2,
            Test::Read | Test::Atomic => 1,
        }
    }

    /// Whether both sides measure (the ping-pongs) or only the client.
    fn symmetric(self) -> bool {
        matches!(self, Test::Send | Test::Write)
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Config {
    /// The test.
    pub test: Test,
    /// Message sizes, in order.
    pub sizes: Vec<usize>,
    /// Iterations per size (not used in duration mode).
    pub iters: u32,
    /// perftest's duration mode (`-D`, `-f`): one size, run for a time rather than a number of
    /// iterations.
    pub duration: Option<Duration>,
    /// Largest message sent inline (0: none).
    pub inline: u32,
    /// Seed of the pattern the data checks send.
    pub seed: u8,
    /// Connection options (the client has a server name).
    pub pair: PairArgs,
}

/// Receive slots of the send test: a ping-pong has at most one message in flight each way,
/// plus the check message.
const RX_SLOTS: usize = 4;
/// Send queue size.
const TX_DEPTH: u32 = 4;
/// The largest message (perftest's `-a` goes up to 2^23 bytes).
pub const MAX_SIZE: usize = 1 << 23;

/// perftest's `-a` sizes for `test`: 2, 4, ..., 2^23 bytes (8 only for atomics).
pub fn all_sizes(test: Test) -> Vec<usize> {
    match test {
        Test::Atomic => vec![8],
        _ => (1..24).map(|shift| 1usize << shift).collect(),
    }
}

/// Runs `config`, printing perftest's report on stdout. Returns the allocations counted by
/// [`crate::alloc_count`] during the timed loops.
pub fn run(config: &Config) -> Result<u64, String> {
    check_config(config)?;
    let max = config.sizes.iter().copied().max().unwrap_or(8).max(8);
    let server = config.pair.servername.is_none();
    let shape = QpShape {
        max_send_wr: TX_DEPTH,
        max_recv_wr: RX_SLOTS as u32,
        max_inline_data: config.inline,
        separate_recv_cq: true,
        // One round trip in flight.
        outstanding_reads: 1,
    };
    let mut conn = Conn::open(
        &config.pair,
        &shape,
        RX_SLOTS * max,
        max,
        config.test.title(),
    )?;
    if config.test == Test::Send {
        for slot in 0..RX_SLOTS {
            conn.io
                .post_recv(&conn.target, slot * max, max, slot as u64)?;
        }
    }
    // Duration mode keeps no stamps.
    let mut stamps = match config.duration {
        None => Vec::with_capacity(config.iters as usize),
        Some(_) => Vec::new(),
    };
    let mut header_printed = false;
    let mut loop_allocations = 0;
    for &size in &config.sizes {
        prepare(config, size, server, &mut conn)?;
        conn.sync()?;
        stamps.clear();
        let mut inline = vec![0u8; size];
        let inline = (size <= config.inline as usize).then_some(inline.as_mut_slice());
        let before = allocations();
        let ((sent, received), report) = match config.duration {
            None => {
                let mut pace = Iterations {
                    iters: config.iters,
                    stamps: &mut stamps,
                };
                let counts = timed_loop(config, size, server, inline, &mut conn, &mut pace)?;
                (counts, None)
            }
            Some(duration) => {
                let mut window = duration.start(conn.io.per_us);
                let counts = timed_loop(config, size, server, inline, &mut conn, &mut window)?;
                (counts, Some(window))
            }
        };
        loop_allocations += allocations() - before;
        let peer_sent = conn.exchange(sent)?;
        if config.test == Test::Send {
            // In duration mode a side may stop with a message of its peer not yet taken (the
            // peer sent it before its own run ended): take those before the check.
            for _ in received..peer_sent {
                take_message(&mut conn.io, &conn.target, size)?;
            }
        }
        // The counter the server checks: in duration mode, the client's count.
        let adds = match (server, config.duration) {
            (true, None) => u64::from(config.iters),
            (true, Some(_)) => peer_sent,
            (false, _) => sent,
        };
        check(config, size, server, adds, &mut conn)?;
        if !server || config.test.symmetric() {
            let row = match report {
                None => Latency::from_stamps(&stamps, conn.io.per_us, config.test.rtt_factor())
                    .ok_or("the clock went backwards")?
                    .row(size, config.iters),
                Some(window) => {
                    let (iters, ticks) = window.result().ok_or(
                        "no iteration fell in the measured window: lengthen the duration or \
                         shorten the margin",
                    )?;
                    DurationLatency::new(iters, ticks, conn.io.per_us, config.test.rtt_factor())
                        .ok_or("the clock went backwards")?
                        .row(size)
                }
            };
            if !header_printed {
                let header = match config.duration {
                    None => LAT_HEADER,
                    Some(_) => LAT_DUR_HEADER,
                };
                println!("{header}");
                header_printed = true;
            }
            println!("{row}");
        }
    }
    println!("{}", crate::stats::RULE);
    conn.finish()?;
    Ok(loop_allocations)
}

/// The timed loop of one size; returns the requests this side sent (SENDs, WRITEs, READs,
/// fetch-and-adds) and the messages it received (SENDs, WRITEs seen).
fn timed_loop(
    config: &Config,
    size: usize,
    server: bool,
    inline: Option<&mut [u8]>,
    conn: &mut Conn,
    pace: &mut impl Pace,
) -> Result<(u64, u64), String> {
    let Conn {
        io,
        target,
        source,
        remote,
        ..
    } = conn;
    match config.test {
        Test::Send => send_loop(io, pace, size, server, source, inline, target),
        Test::Write => write_loop(io, pace, size, server, source, inline, target, remote),
        Test::Read if !server => Ok((read_loop(io, pace, size, source, remote)?, 0)),
        Test::Atomic if !server => Ok((atomic_loop(io, pace, source, remote)?, 0)),
        Test::Read | Test::Atomic => {
            // The server only waits; in duration mode, for as long as the client runs.
            if let Some(duration) = config.duration {
                std::thread::sleep(duration.total());
            }
            Ok((0, 0))
        }
    }
}

/// How a timed loop decides whether to go on, and what it records: a number of iterations,
/// every stamp kept for the statistics, or perftest's duration mode, a window counted.
trait Pace {
    /// Whether another message is to be sent or received, `done` having been.
    fn more(&self, done: u64) -> bool;
    /// Records the stamp of an iteration about to start; `false` when the run is over.
    fn stamp(&mut self, now: u64) -> bool;
    /// When waits for the peer give up (the end of a duration-mode run), if they do.
    fn end(&self) -> Option<u64>;
}

/// A fixed number of iterations, each stamped.
struct Iterations<'a> {
    iters: u32,
    stamps: &'a mut Vec<u64>,
}

impl Pace for Iterations<'_> {
    #[inline]
    fn more(&self, done: u64) -> bool {
        done < u64::from(self.iters)
    }
    #[inline]
    fn stamp(&mut self, now: u64) -> bool {
        self.stamps.push(now);
        true
    }
    #[inline]
    fn end(&self) -> Option<u64> {
        None
    }
}

impl Pace for Window {
    #[inline]
    fn more(&self, _: u64) -> bool {
        true
    }
    #[inline]
    fn stamp(&mut self, now: u64) -> bool {
        self.tick(now)
    }
    #[inline]
    fn end(&self) -> Option<u64> {
        Some(Window::end(self))
    }
}

fn check_config(config: &Config) -> Result<(), String> {
    if config.iters < MIN_ITERS {
        return Err(format!("iterations must be at least {MIN_ITERS}"));
    }
    if config.sizes.is_empty() {
        return Err("no message size".into());
    }
    if config.duration.is_some() && config.sizes.len() > 1 {
        return Err("duration mode runs one size (-s), not all (-a)".into());
    }
    for &size in &config.sizes {
        if size == 0 || size > MAX_SIZE {
            return Err(format!("message size {size} is outside 1..={MAX_SIZE}"));
        }
        if config.test == Test::Atomic && size != 8 {
            return Err("atomic operations are 8 bytes: -s 8".into());
        }
    }
    Ok(())
}

/// Sets up each size's memory: the write test's polled bytes zeroed, the read test's served
/// pattern, the atomic counter at 0.
fn prepare(config: &Config, size: usize, server: bool, conn: &mut Conn) -> Result<(), String> {
    let err = |e: rdma_verbs::Error| e.to_string();
    match config.test {
        Test::Send => Ok(()),
        Test::Write => {
            conn.target.write_at(0, &vec![0u8; size]).map_err(err)?;
            conn.source.write_at(0, &vec![0u8; size]).map_err(err)
        }
        Test::Read if server => conn
            .target
            .write_at(0, &fill(config.seed, size))
            .map_err(err),
        Test::Read => conn.source.write_at(0, &vec![0u8; size]).map_err(err),
        Test::Atomic => conn.target.write_at(0, &0u64.to_ne_bytes()).map_err(err),
    }
}

/// Checks what crossed the wire for one size (see the module documentation), after a timed
/// loop in which `adds` fetch-and-adds were made.
fn check(
    config: &Config,
    size: usize,
    server: bool,
    adds: u64,
    conn: &mut Conn,
) -> Result<(), String> {
    let seed = config.seed;
    let err = |e: rdma_verbs::Error| e.to_string();
    let slot_len = conn.target.len() / RX_SLOTS;
    match config.test {
        Test::Send => {
            // The client's check message first, then the server's.
            for sender in [false, true] {
                if sender == server {
                    conn.source.write_at(0, &fill(seed, size)).map_err(err)?;
                    let slice = conn.source.slice(..size).map_err(err)?;
                    conn.io
                        .post_send(SendRequest::send(slice), WcOpcode::Send)?;
                } else {
                    let wc = conn.io.recv(size)?;
                    let slot = wc.wr_id() as usize;
                    let mut got = vec![0u8; size];
                    conn.target
                        .read_at(slot * slot_len, &mut got)
                        .map_err(err)?;
                    conn.io
                        .post_recv(&conn.target, slot * slot_len, slot_len, slot as u64)?;
                    compare("the message received", &got, seed)?;
                }
            }
            Ok(())
        }
        Test::Write => {
            for writer in [false, true] {
                if writer == server {
                    conn.source.write_at(0, &fill(seed, size)).map_err(err)?;
                    let to = conn.remote.slice(0, size as u32).map_err(err)?;
                    let from = conn.source.slice(..size).map_err(err)?;
                    conn.io
                        .post_send(SendRequest::write(from, to), WcOpcode::RdmaWrite)?;
                    conn.sync()?;
                } else {
                    conn.sync()?;
                    let mut got = vec![0u8; size];
                    conn.target.read_at(0, &mut got).map_err(err)?;
                    compare("the region the peer wrote", &got, seed)?;
                }
            }
            Ok(())
        }
        Test::Read if !server => {
            let mut got = vec![0u8; size];
            conn.source.read_at(0, &mut got).map_err(err)?;
            compare("the last read", &got, seed)
        }
        Test::Atomic if !server => {
            let old = conn.source.load_u64(0).map_err(err)?;
            if adds == 0 || old != adds - 1 {
                return Err(format!(
                    "data check failed: the last of {adds} fetch-and-adds returned {old}, \
                     expected {}",
                    adds.saturating_sub(1)
                ));
            }
            Ok(())
        }
        Test::Atomic => {
            let counter = conn.target.load_u64(0).map_err(err)?;
            if counter != adds {
                return Err(format!(
                    "data check failed: the counter is {counter} after {adds} fetch-and-adds"
                ));
            }
            Ok(())
        }
        Test::Read => Ok(()),
    }
}

/// Takes one received message of `size` bytes and posts its receive again.
#[inline]
fn take_message(io: &mut Io, target: &MemoryRegion, size: usize) -> Result<(), String> {
    let wc = io.recv(size)?;
    repost(io, target, wc.wr_id())
}

/// Posts receive slot `slot` of `target` again.
#[inline]
fn repost(io: &mut Io, target: &MemoryRegion, slot: u64) -> Result<(), String> {
    let slot_len = target.len() / RX_SLOTS;
    io.post_recv(target, slot as usize * slot_len, slot_len, slot)
}

fn send_loop(
    io: &mut Io,
    pace: &mut impl Pace,
    size: usize,
    server: bool,
    source: &MemoryRegion,
    inline: Option<&mut [u8]>,
    target: &MemoryRegion,
) -> Result<(u64, u64), String> {
    let payload: Payload<'_> = match inline {
        Some(bytes) => Payload::Inline(bytes),
        None => source.slice(..size).map_err(|e| e.to_string())?.into(),
    };
    let (mut sent, mut received) = (0, 0);
    while pace.more(sent) || pace.more(received) {
        // The client sends first; the server waits for its message first (as perftest).
        if pace.more(received) && (server || sent >= 1) {
            let wc = match pace.end() {
                None => io.recv(size)?,
                Some(end) => match io.recv_until(size, end)? {
                    Some(wc) => wc,
                    None => break,
                },
            };
            received += 1;
            repost(io, target, wc.wr_id())?;
        }
        if pace.more(sent) {
            if !pace.stamp(clock::ticks()) {
                break;
            }
            io.post_send(SendRequest::send(payload).tag(1), WcOpcode::Send)?;
            sent += 1;
        }
    }
    Ok((sent, received))
}

#[allow(clippy::too_many_arguments)]
fn write_loop(
    io: &mut Io,
    pace: &mut impl Pace,
    size: usize,
    server: bool,
    source: &mut MemoryRegion,
    mut inline: Option<&mut [u8]>,
    target: &MemoryRegion,
    remote: &RemoteMemory,
) -> Result<(u64, u64), String> {
    let last = size - 1;
    let to = remote.slice(0, size as u32).map_err(|e| e.to_string())?;
    let (mut sent, mut received) = (0u64, 0u64);
    while pace.more(sent) || pace.more(received) {
        if pace.more(received) && (server || sent >= 1) {
            if !wait_byte(io, target, last, (received + 1) as u8, pace.end())? {
                break;
            }
            received += 1;
        }
        if pace.more(sent) {
            if !pace.stamp(clock::ticks()) {
                break;
            }
            sent += 1;
            let request = match inline.as_deref_mut() {
                Some(bytes) => {
                    bytes[last] = sent as u8;
                    SendRequest::write(Payload::Inline(bytes), to).tag(1)
                }
                None => {
                    source
                        .write_at(last, &[sent as u8])
                        .map_err(|e| e.to_string())?;
                    SendRequest::write(source.slice(..size).map_err(|e| e.to_string())?, to).tag(1)
                }
            };
            io.post_send(request, WcOpcode::RdmaWrite)?;
        }
    }
    Ok((sent, received))
}

/// Spins until byte `at` of `target` (which the peer writes) is `value`; `false` if the stamp
/// clock reaches `end` first (a duration-mode run is over).
fn wait_byte(
    io: &Io,
    target: &MemoryRegion,
    at: usize,
    value: u8,
    end: Option<u64>,
) -> Result<bool, String> {
    let deadline = Deadline::after(io.timeout, io.per_us);
    let mut byte = [0u8];
    let mut spins = 0u32;
    loop {
        target.read_at(at, &mut byte).map_err(|e| e.to_string())?;
        if byte[0] == value {
            return Ok(true);
        }
        spins = spins.wrapping_add(1);
        if spins % 4096 != 0 {
            continue;
        }
        if end.is_some_and(|end| clock::ticks() >= end) {
            return Ok(false);
        }
        if deadline.passed() {
            return Err(format!(
                "the peer's write of iteration {value} did not arrive within {} s",
                io.timeout.as_secs()
            ));
        }
    }
}

fn read_loop(
    io: &mut Io,
    pace: &mut impl Pace,
    size: usize,
    source: &MemoryRegion,
    remote: &RemoteMemory,
) -> Result<u64, String> {
    let from = remote.slice(0, size as u32).map_err(|e| e.to_string())?;
    let local = source.slice(..size).map_err(|e| e.to_string())?;
    let mut sent = 0;
    while pace.more(sent) && pace.stamp(clock::ticks()) {
        io.post_send(SendRequest::read(local, from).tag(1), WcOpcode::RdmaRead)?;
        sent += 1;
    }
    Ok(sent)
}

fn atomic_loop(
    io: &mut Io,
    pace: &mut impl Pace,
    source: &MemoryRegion,
    remote: &RemoteMemory,
) -> Result<u64, String> {
    let counter = remote.slice(0, 8).map_err(|e| e.to_string())?;
    let local = source.slice(..8).map_err(|e| e.to_string())?;
    let mut sent = 0;
    while pace.more(sent) && pace.stamp(clock::ticks()) {
        io.post_send(
            SendRequest::fetch_add(local, counter, 1).tag(1),
            WcOpcode::FetchAdd,
        )?;
        sent += 1;
    }
    Ok(sent)
}
