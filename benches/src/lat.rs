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

use std::time::Duration;

use rdma_examples::connect::{self, PairArgs, QpShape};
use rdma_examples::exchange::Link;
use rdma_verbs::{
    AccessFlags, CompletionQueue, MemoryRegion, Payload, QueuePair, Rc, RecvRequest, RemoteMemory,
    Rts, SendRequest, WcOpcode, WorkCompletion,
};

use crate::clock::{self, Deadline};
use crate::stats::{LAT_HEADER, Latency, MIN_ITERS, RULE};

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
    /// Iterations per size.
    pub iters: u32,
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

/// Runs `config`, printing perftest's report on stdout.
pub fn run(config: &Config) -> Result<(), String> {
    check_config(config)?;
    let max = config.sizes.iter().copied().max().unwrap_or(8);
    let server = config.pair.servername.is_none();
    let shape = QpShape {
        max_send_wr: TX_DEPTH,
        max_recv_wr: RX_SLOTS as u32,
        max_inline_data: config.inline,
        separate_recv_cq: true,
    };
    let access = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    println!("{RULE}");
    println!("                    {}", config.test.title());
    let pair = connect::connect_shaped(&config.pair, access, &shape)?;
    let connect::Pair {
        setup,
        mut qp,
        mut link,
        recv_cq,
    } = pair;
    let mut recv_cq = recv_cq.ok_or("no receive completion queue")?;
    let mut send_cq = setup.cq;
    println!(
        " Device         : {}\n Connection type : RC\n Mtu            : {}[B]\n Max inline data : {}[B]",
        setup.context.device_name(),
        config.pair.mtu,
        config.inline
    );
    println!("{RULE}");
    // The peer writes, reads and adds into `target`; `source` is what this side sends, and
    // where READ and atomic results land.
    let target_len = (RX_SLOTS * max).max(8);
    let mut target = setup
        .pd
        .register(target_len, AccessFlags::LOCAL_WRITE | access)
        .map_err(|e| format!("couldn't register {target_len} bytes: {e}"))?;
    let mut source = setup
        .pd
        .register(max.max(8), AccessFlags::LOCAL_WRITE)
        .map_err(|e| format!("couldn't register {max} bytes: {e}"))?;
    link.send_remote(&target.remote(..).map_err(|e| e.to_string())?)?;
    let remote = link.recv_remote()?;
    if (remote.len as usize) < max.max(8) {
        return Err(format!(
            "the peer's region holds {} bytes; run both sides with the same sizes",
            remote.len
        ));
    }
    let timeout = config.pair.timeout();
    let per_us = clock::ticks_per_us(Duration::from_millis(50));
    let mut io = Io {
        qp: &mut qp,
        send_cq: &mut send_cq,
        recv_cq: &mut recv_cq,
        timeout,
        per_us,
    };
    if config.test == Test::Send {
        for slot in 0..RX_SLOTS {
            io.post_recv(&target, slot, max)?;
        }
    }
    let mut stamps = Vec::with_capacity(config.iters as usize);
    let mut header_printed = false;
    for &size in &config.sizes {
        prepare(config, size, server, &mut target, &mut source)?;
        sync(&mut link)?;
        stamps.clear();
        let mut inline = vec![0u8; size];
        let inline = (size <= config.inline as usize).then_some(inline.as_mut_slice());
        let client = !server;
        match config.test {
            Test::Send => io.send_loop(
                config.iters,
                size,
                server,
                &source,
                inline,
                &target,
                &mut stamps,
            )?,
            Test::Write => io.write_loop(
                config.iters,
                size,
                server,
                &mut source,
                inline,
                &target,
                &remote,
                &mut stamps,
            )?,
            Test::Read if client => {
                io.read_loop(config.iters, size, &source, &remote, &mut stamps)?
            }
            Test::Atomic if client => {
                io.atomic_loop(config.iters, &source, &remote, &mut stamps)?
            }
            Test::Read | Test::Atomic => {}
        }
        sync(&mut link)?;
        check(
            config,
            size,
            server,
            &mut io,
            &mut link,
            &target,
            &mut source,
            &remote,
        )?;
        if client || config.test.symmetric() {
            let latency = Latency::from_stamps(&stamps, per_us, config.test.rtt_factor())
                .ok_or("the clock went backwards")?;
            if !header_printed {
                println!("{LAT_HEADER}");
                header_printed = true;
            }
            println!("{}", latency.row(size, config.iters));
        }
    }
    println!("{RULE}");
    link.finish(timeout)?;
    Ok(())
}

fn check_config(config: &Config) -> Result<(), String> {
    if config.iters < MIN_ITERS {
        return Err(format!("iterations must be at least {MIN_ITERS}"));
    }
    if config.sizes.is_empty() {
        return Err("no message size".into());
    }
    for &size in &config.sizes {
        if size == 0 || size > MAX_SIZE {
            return Err(format!("message size {size} is outside 1..={MAX_SIZE}"));
        }
        if config.test == Test::Atomic && size != 8 {
            return Err("atomic operations are 8 bytes: -s 8".into());
        }
        if config.test == Test::Write && size < 1 {
            return Err("a write test needs at least 1 byte".into());
        }
    }
    Ok(())
}

/// One byte of the check pattern: depends on the seed, the size and the position, so a
/// message of the wrong size, a stale message or a shifted one fails the check.
fn pattern(seed: u8, size: usize, i: usize) -> u8 {
    (i as u64)
        .wrapping_mul(31)
        .wrapping_add(size as u64)
        .wrapping_add(u64::from(seed).wrapping_mul(101)) as u8
}

fn fill(seed: u8, size: usize) -> Vec<u8> {
    (0..size).map(|i| pattern(seed, size, i)).collect()
}

/// Compares `got` with the pattern; names the first wrong byte.
fn compare(what: &str, got: &[u8], seed: u8) -> Result<(), String> {
    let want = fill(seed, got.len());
    match got.iter().zip(&want).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(format!(
            "data check failed: {what}, {} bytes: byte {i} is {:#04x}, expected {:#04x}",
            got.len(),
            got[i],
            want[i]
        )),
    }
}

/// Sets up each size's memory: the write test's polled bytes zeroed, the read test's served
/// pattern, the atomic counter at 0.
fn prepare(
    config: &Config,
    size: usize,
    server: bool,
    target: &mut MemoryRegion,
    source: &mut MemoryRegion,
) -> Result<(), String> {
    let err = |e: rdma_verbs::Error| e.to_string();
    match config.test {
        Test::Send => Ok(()),
        Test::Write => {
            target.write_at(0, &vec![0u8; size]).map_err(err)?;
            source.write_at(0, &vec![0u8; size]).map_err(err)
        }
        Test::Read if server => target.write_at(0, &fill(config.seed, size)).map_err(err),
        Test::Read => source.write_at(0, &vec![0u8; size]).map_err(err),
        Test::Atomic => target.write_at(0, &0u64.to_ne_bytes()).map_err(err),
    }
}

/// A round trip on the exchange's TCP connection: after it, the peer has done everything it
/// did before its own `sync`.
fn sync(link: &mut Link) -> Result<(), String> {
    let token = RemoteMemory {
        addr: 0,
        len: 0,
        rkey: 0,
    };
    link.send_remote(&token)?;
    link.recv_remote().map(drop)
}

/// Checks what crossed the wire for one size (see the module documentation).
#[allow(clippy::too_many_arguments)]
fn check(
    config: &Config,
    size: usize,
    server: bool,
    io: &mut Io<'_>,
    link: &mut Link,
    target: &MemoryRegion,
    source: &mut MemoryRegion,
    remote: &RemoteMemory,
) -> Result<(), String> {
    let seed = config.seed;
    let err = |e: rdma_verbs::Error| e.to_string();
    match config.test {
        Test::Send => {
            // The client's check message first, then the server's.
            for sender in [false, true] {
                if sender == server {
                    source.write_at(0, &fill(seed, size)).map_err(err)?;
                    io.post_send(
                        SendRequest::send(0, source.slice(..size).map_err(err)?),
                        WcOpcode::Send,
                    )?;
                } else {
                    let wc = io.recv(size)?;
                    let slot = wc.wr_id() as usize;
                    let mut got = vec![0u8; size];
                    target
                        .read_at(slot * (target.len() / RX_SLOTS), &mut got)
                        .map_err(err)?;
                    io.post_recv(target, slot, target.len() / RX_SLOTS)?;
                    compare("the message received", &got, seed)?;
                }
            }
            Ok(())
        }
        Test::Write => {
            for writer in [false, true] {
                if writer == server {
                    source.write_at(0, &fill(seed, size)).map_err(err)?;
                    let to = remote.slice(0, size as u32).map_err(err)?;
                    io.post_send(
                        SendRequest::write(0, source.slice(..size).map_err(err)?, to),
                        WcOpcode::RdmaWrite,
                    )?;
                    sync(link)?;
                } else {
                    sync(link)?;
                    let mut got = vec![0u8; size];
                    target.read_at(0, &mut got).map_err(err)?;
                    compare("the region the peer wrote", &got, seed)?;
                }
            }
            Ok(())
        }
        Test::Read if !server => {
            let mut got = vec![0u8; size];
            source.read_at(0, &mut got).map_err(err)?;
            compare("the last read", &got, seed)
        }
        Test::Atomic if !server => {
            let old = source.load_u64(0).map_err(err)?;
            if old != u64::from(config.iters) - 1 {
                return Err(format!(
                    "data check failed: the last fetch-and-add returned {old}, expected {}",
                    config.iters - 1
                ));
            }
            Ok(())
        }
        Test::Atomic => {
            let counter = target.load_u64(0).map_err(err)?;
            if counter != u64::from(config.iters) {
                return Err(format!(
                    "data check failed: the counter is {counter} after {} fetch-and-adds",
                    config.iters
                ));
            }
            Ok(())
        }
        Test::Read => Ok(()),
    }
}

/// The queue pair and its queues, with the bound on every wait.
struct Io<'a> {
    qp: &'a mut QueuePair<Rc, Rts>,
    send_cq: &'a mut CompletionQueue,
    recv_cq: &'a mut CompletionQueue,
    timeout: Duration,
    /// Stamp-clock ticks per microsecond.
    per_us: f64,
}

impl Io<'_> {
    /// Posts a receive into slot `slot` of `target` (slots of `slot_len` bytes); its id is the
    /// slot.
    fn post_recv(
        &mut self,
        target: &MemoryRegion,
        slot: usize,
        slot_len: usize,
    ) -> Result<(), String> {
        let at = slot * slot_len;
        let slice = target.slice(at..at + slot_len).map_err(|e| e.to_string())?;
        // SAFETY: `target` outlives the queue pair (`run` drops the queue pair first, and
        // resets nothing while receives are posted), and Rust reads a slot only after its
        // receive completed and before it is posted again.
        unsafe { self.qp.post_recv_one(&RecvRequest::new(slot as u64, slice)) }
            .map_err(|e| format!("couldn't post receive: {e}"))
    }

    /// Posts one signaled request and polls its completion, which must be `opcode`.
    #[inline]
    fn post_send(&mut self, request: SendRequest<'_>, opcode: WcOpcode) -> Result<(), String> {
        // SAFETY: every region a request names outlives the queue pair (see `post_recv`), and
        // the request completes before this returns, so Rust touches no memory it uses while
        // it is in flight.
        unsafe { self.qp.post_send_one(&request.signaled()) }
            .map_err(|e| format!("couldn't post send: {e}"))?;
        let wc = poll_one(self.send_cq, self.timeout, self.per_us)?;
        if wc.opcode() != opcode {
            return Err(format!(
                "completion opcode {:?}, expected {opcode:?}",
                wc.opcode()
            ));
        }
        Ok(())
    }

    /// Polls one receive completion of `size` bytes.
    #[inline]
    fn recv(&mut self, size: usize) -> Result<WorkCompletion, String> {
        let wc = poll_one(self.recv_cq, self.timeout, self.per_us)?;
        if wc.opcode() != WcOpcode::Recv || wc.byte_len() as usize != size {
            return Err(format!(
                "receive completion {:?} of {} bytes, expected Recv of {size}",
                wc.opcode(),
                wc.byte_len()
            ));
        }
        Ok(wc)
    }

    #[allow(clippy::too_many_arguments)]
    fn send_loop(
        &mut self,
        iters: u32,
        size: usize,
        server: bool,
        source: &MemoryRegion,
        inline: Option<&mut [u8]>,
        target: &MemoryRegion,
        stamps: &mut Vec<u64>,
    ) -> Result<(), String> {
        let slot_len = target.len() / RX_SLOTS;
        let payload: Payload<'_> = match inline {
            Some(bytes) => Payload::Inline(bytes),
            None => source.slice(..size).map_err(|e| e.to_string())?.into(),
        };
        let (mut sent, mut received) = (0, 0);
        while sent < iters || received < iters {
            if received < iters && !(sent < 1 && server) {
                let wc = self.recv(size)?;
                received += 1;
                self.post_recv(target, wc.wr_id() as usize, slot_len)?;
            }
            if sent < iters {
                stamps.push(clock::ticks());
                self.post_send(SendRequest::send(1, payload), WcOpcode::Send)?;
                sent += 1;
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn write_loop(
        &mut self,
        iters: u32,
        size: usize,
        server: bool,
        source: &mut MemoryRegion,
        mut inline: Option<&mut [u8]>,
        target: &MemoryRegion,
        remote: &RemoteMemory,
        stamps: &mut Vec<u64>,
    ) -> Result<(), String> {
        let last = size - 1;
        let to = remote.slice(0, size as u32).map_err(|e| e.to_string())?;
        let (mut sent, mut received) = (0u32, 0u32);
        while sent < iters || received < iters {
            if received < iters && !(sent < 1 && server) {
                received += 1;
                self.wait_byte(target, last, received as u8)?;
            }
            if sent < iters {
                stamps.push(clock::ticks());
                sent += 1;
                let request = match inline.as_deref_mut() {
                    Some(bytes) => {
                        bytes[last] = sent as u8;
                        SendRequest::write(1, Payload::Inline(bytes), to)
                    }
                    None => {
                        source
                            .write_at(last, &[sent as u8])
                            .map_err(|e| e.to_string())?;
                        SendRequest::write(1, source.slice(..size).map_err(|e| e.to_string())?, to)
                    }
                };
                self.post_send(request, WcOpcode::RdmaWrite)?;
            }
        }
        Ok(())
    }

    /// Spins until byte `at` of `target` (which the peer writes) is `value`.
    fn wait_byte(&self, target: &MemoryRegion, at: usize, value: u8) -> Result<(), String> {
        let deadline = Deadline::after(self.timeout, self.per_us);
        let mut byte = [0u8];
        let mut spins = 0u32;
        loop {
            target.read_at(at, &mut byte).map_err(|e| e.to_string())?;
            if byte[0] == value {
                return Ok(());
            }
            spins = spins.wrapping_add(1);
            if spins % 4096 == 0 && deadline.passed() {
                return Err(format!(
                    "the peer's write of iteration {value} did not arrive within {} s",
                    self.timeout.as_secs()
                ));
            }
        }
    }

    fn read_loop(
        &mut self,
        iters: u32,
        size: usize,
        source: &MemoryRegion,
        remote: &RemoteMemory,
        stamps: &mut Vec<u64>,
    ) -> Result<(), String> {
        let from = remote.slice(0, size as u32).map_err(|e| e.to_string())?;
        let local = source.slice(..size).map_err(|e| e.to_string())?;
        for _ in 0..iters {
            stamps.push(clock::ticks());
            self.post_send(SendRequest::read(1, local, from), WcOpcode::RdmaRead)?;
        }
        Ok(())
    }

    fn atomic_loop(
        &mut self,
        iters: u32,
        source: &MemoryRegion,
        remote: &RemoteMemory,
        stamps: &mut Vec<u64>,
    ) -> Result<(), String> {
        let counter = remote.slice(0, 8).map_err(|e| e.to_string())?;
        let local = source.slice(..8).map_err(|e| e.to_string())?;
        for _ in 0..iters {
            stamps.push(clock::ticks());
            self.post_send(
                SendRequest::fetch_add(1, local, counter, 1),
                WcOpcode::FetchAdd,
            )?;
        }
        Ok(())
    }
}

/// Polls `cq` until it yields one completion, which must be a success; fails after `timeout`.
#[inline]
fn poll_one(
    cq: &mut CompletionQueue,
    timeout: Duration,
    per_us: f64,
) -> Result<WorkCompletion, String> {
    let mut wc = [WorkCompletion::default()];
    let mut deadline = None;
    let mut empty = 0u32;
    loop {
        let n = cq
            .poll(&mut wc)
            .map_err(|e| format!("poll CQ failed: {e}"))?
            .len();
        if n == 1 {
            if !wc[0].is_success() {
                return Err(format!("completion failed: {}", wc[0].status()));
            }
            return Ok(wc[0]);
        }
        // The clock is read once per 1024 empty polls (empty polls fill every round trip, and
        // C polls without reading a clock).
        empty = empty.wrapping_add(1);
        if empty % 1024 != 0 {
            continue;
        }
        match deadline {
            None => deadline = Some(Deadline::after(timeout, per_us)),
            Some(at) if at.passed() => {
                return Err(format!("no completion within {} s", timeout.as_secs()));
            }
            Some(_) => {}
        }
    }
}
