//! What the `lat` and `bw` tools share: one connected RC queue pair with its two completion
//! queues, the two regions each side uses, the peer's region, the exchange's TCP link for
//! synchronising, the post-and-wait helpers, and the seeded pattern the data checks compare.

use std::time::Duration;

use rdma_examples::connect::{self, PairArgs, QpShape};
use rdma_examples::exchange::Link;
use rdma_verbs::{
    CompletionQueue, MemoryRegion, QueuePair,
    cq::{WcOpcode, WorkCompletion},
    mr::{AccessFlags, RemoteMemory},
    qp::{Rc, Rts},
    wr::{Operation, RecvRequest, SendFlags, SendRequest},
};

use crate::clock::{self, Deadline};
use crate::stats::RULE;

/// The connection flags both tools take, with perftest's letters, and the data checks' seed.
#[derive(clap::Args, Debug, Clone)]
pub struct ConnArgs {
    /// Listen on / connect to TCP port.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    pub port: u16,
    /// RDMA device (default: the first one).
    #[arg(short = 'd', long = "ib-dev")]
    pub ib_dev: Option<String>,
    /// Port of the device.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub ib_port: u8,
    /// GID index (needed on RoCE).
    #[arg(short = 'x', long = "gid-index")]
    pub gid_index: Option<u32>,
    /// Path MTU (256, 512, 1024, 2048 or 4096).
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    pub mtu: u32,
    /// Seed of the data checks' pattern (both sides must agree; a different one must fail).
    #[arg(long = "seed", default_value_t = 0)]
    pub seed: u8,
    /// Give up when the peer or a completion takes longer than this many seconds.
    #[arg(long = "timeout", default_value_t = 30)]
    pub timeout: u64,
}

impl ConnArgs {
    /// The connection options, for a client of `servername` (a server without it).
    pub fn pair(&self, servername: Option<String>) -> PairArgs {
        PairArgs {
            port: self.port,
            ib_dev: self.ib_dev.clone(),
            ib_port: self.ib_port,
            gid_idx: self.gid_index,
            mtu: self.mtu,
            timeout: self.timeout,
            servername,
        }
    }
}

/// The queue pair and its completion queues, with the bound on every wait.
#[derive(Debug)]
pub struct Io {
    /// The connected queue pair.
    pub qp: QueuePair<Rc, Rts>,
    /// Its send completion queue.
    pub send_cq: CompletionQueue,
    /// Its receive completion queue.
    pub recv_cq: CompletionQueue,
    /// How long any wait may take (the peer may be gone).
    pub timeout: Duration,
    /// Stamp-clock ticks per microsecond.
    pub per_us: f64,
}

/// One side of a benchmark connection.
///
/// Field order is drop order: the queue pair goes before the regions its posted requests name,
/// so no request can outlive its memory's registration, whichever way `run` ends.
#[derive(Debug)]
pub struct Conn {
    /// The queue pair and its queues.
    pub io: Io,
    /// What the peer writes, reads and adds into, and where this side's receives land.
    pub target: MemoryRegion,
    /// What this side sends or writes from, and where READ and atomic results land.
    pub source: MemoryRegion,
    /// The peer's `target`.
    pub remote: RemoteMemory,
    /// The exchange's TCP connection.
    pub link: Link,
    /// The device's name.
    pub device: String,
}

impl Conn {
    /// Connects (a client with a server name, a server without), registers `target_len` bytes
    /// the peer may write, read and add into and `source_len` local bytes, and exchanges the
    /// targets. Prints perftest's title block for `title` first.
    pub fn open(
        pair: &PairArgs,
        shape: &QpShape,
        target_len: usize,
        source_len: usize,
        title: &str,
    ) -> Result<Self, String> {
        let access =
            AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
        println!("{RULE}");
        println!("                    {title}");
        let connect::Pair {
            setup,
            qp,
            mut link,
            recv_cq,
        } = connect::connect_shaped(
            pair,
            access,
            &QpShape {
                separate_recv_cq: true,
                ..*shape
            },
        )?;
        let recv_cq = recv_cq.ok_or("no receive completion queue")?;
        let device = setup.context.device_name();
        println!(
            " Device         : {device}\n Connection type : RC\n Mtu            : {}[B]\n Max inline data : {}[B]",
            pair.mtu, shape.max_inline_data
        );
        println!("{RULE}");
        let register = |len: usize, access: AccessFlags| {
            setup
                .pd
                .register(len, access)
                .map_err(|e| format!("couldn't register {len} bytes: {e}"))
        };
        let target = register(target_len, AccessFlags::LOCAL_WRITE | access)?;
        let source = register(source_len, AccessFlags::LOCAL_WRITE)?;
        link.send_remote(&target.remote(..).map_err(|e| e.to_string())?)?;
        let remote = link.recv_remote()?;
        if (remote.len as usize) < target_len {
            return Err(format!(
                "the peer's region holds {} bytes, not {target_len}: run both sides with the \
                 same options",
                remote.len
            ));
        }
        Ok(Self {
            io: Io {
                qp,
                send_cq: setup.cq,
                recv_cq,
                timeout: pair.timeout(),
                per_us: clock::ticks_per_us(Duration::from_millis(50)),
            },
            target,
            source,
            remote,
            link,
            device,
        })
    }

    /// A round trip on the TCP link: after it, the peer has done everything it did before its
    /// own `sync`.
    pub fn sync(&mut self) -> Result<(), String> {
        let token = RemoteMemory {
            addr: 0,
            len: 0,
            rkey: 0,
        };
        self.link.send_remote(&token)?;
        self.link.recv_remote().map(drop)
    }

    /// A round trip on the TCP link that also trades a count (of messages sent, of requests
    /// made) with the peer: sends `mine`, returns the peer's.
    pub fn exchange(&mut self, mine: u64) -> Result<u64, String> {
        let token = RemoteMemory {
            addr: mine,
            len: 0,
            rkey: 0,
        };
        self.link.send_remote(&token)?;
        self.link.recv_remote().map(|theirs| theirs.addr)
    }

    /// The end handshake with the peer.
    pub fn finish(self) -> Result<(), String> {
        let Conn { io, link, .. } = self;
        link.finish(io.timeout).map(drop)
    }
}

impl Io {
    /// Posts a receive of `len` bytes at `offset` in `target`, with id `id`.
    pub fn post_recv(
        &mut self,
        target: &MemoryRegion,
        offset: usize,
        len: usize,
        id: u64,
    ) -> Result<(), String> {
        let slice = target
            .slice(offset..offset + len)
            .map_err(|e| e.to_string())?;
        // SAFETY: `target` is deregistered only after the queue pair is destroyed (`Conn`'s
        // field order), and Rust reads a receive's bytes only after its completion and before
        // the range is posted again.
        unsafe { self.qp.post_recv_one(&RecvRequest::new(slice).tag(id)) }
            .map_err(|e| format!("couldn't post receive: {e}"))
    }

    /// Posts one signaled request and polls its completion, which must be `opcode`.
    #[inline]
    pub fn post_send<K: Operation>(
        &mut self,
        request: SendRequest<'_, K>,
        opcode: WcOpcode,
    ) -> Result<(), String> {
        // SAFETY: every region a request names is deregistered only after the queue pair is
        // destroyed (see `post_recv`), and the request completes before this returns, so Rust
        // touches no memory it uses while it is in flight.
        // Signaled whatever the caller asked: this waits for the completion.
        unsafe { self.qp.post_send_one(&request.flags(SendFlags::SIGNALED)) }
            .map_err(|e| format!("couldn't post send: {e}"))?;
        let wc = self.poll_send()?;
        expect_opcode(&wc, opcode)
    }

    /// Polls one send completion (a success).
    #[inline]
    pub fn poll_send(&mut self) -> Result<WorkCompletion, String> {
        poll_one(&mut self.send_cq, self.timeout, self.per_us)
    }

    /// Polls one receive completion of `size` bytes.
    #[inline]
    pub fn recv(&mut self, size: usize) -> Result<WorkCompletion, String> {
        let wc = poll_one(&mut self.recv_cq, self.timeout, self.per_us)?;
        expect_recv(&wc, size)?;
        Ok(wc)
    }

    /// As [`recv`](Self::recv), but gives up with `None` once the stamp clock reaches `end`
    /// (a duration-mode run is over).
    #[inline]
    pub fn recv_until(&mut self, size: usize, end: u64) -> Result<Option<WorkCompletion>, String> {
        let wc = poll_until(&mut self.recv_cq, self.timeout, self.per_us, Some(end))?;
        if let Some(wc) = &wc {
            expect_recv(wc, size)?;
        }
        Ok(wc)
    }
}

/// Fails unless `wc` is a receive of `size` bytes.
#[inline]
pub fn expect_recv(wc: &WorkCompletion, size: usize) -> Result<(), String> {
    if wc.opcode() != WcOpcode::Recv || wc.byte_len() as usize != size {
        return Err(format!(
            "receive completion {:?} of {} bytes, expected Recv of {size}",
            wc.opcode(),
            wc.byte_len()
        ));
    }
    Ok(())
}

/// Fails unless `wc` has `opcode`.
#[inline]
pub fn expect_opcode(wc: &WorkCompletion, opcode: WcOpcode) -> Result<(), String> {
    if wc.opcode() != opcode {
        return Err(format!(
            "completion opcode {:?}, expected {opcode:?}",
            wc.opcode()
        ));
    }
    Ok(())
}

/// Polls `cq` until it yields one completion, which must be a success; fails after `timeout`.
#[inline]
pub fn poll_one(
    cq: &mut CompletionQueue,
    timeout: Duration,
    per_us: f64,
) -> Result<WorkCompletion, String> {
    poll_until(cq, timeout, per_us, None)?.ok_or_else(|| "no completion".into())
}

/// As [`poll_one`], but gives up with `None` once the stamp clock reaches `end`, if given (a
/// duration-mode run is over).
#[inline]
pub fn poll_until(
    cq: &mut CompletionQueue,
    timeout: Duration,
    per_us: f64,
    end: Option<u64>,
) -> Result<Option<WorkCompletion>, String> {
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
            return Ok(Some(wc[0]));
        }
        // The clock is read once per 1024 empty polls (empty polls fill every round trip, and
        // C polls without reading a clock).
        empty = empty.wrapping_add(1);
        if empty % 1024 != 0 {
            continue;
        }
        if end.is_some_and(|end| clock::ticks() >= end) {
            return Ok(None);
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

/// One byte of the check pattern: depends on the seed, the size and the position, so a
/// message of the wrong size, a stale message or a shifted one fails the check.
pub fn pattern(seed: u8, size: usize, i: usize) -> u8 {
    (i as u64)
        .wrapping_mul(31)
        .wrapping_add(size as u64)
        .wrapping_add(u64::from(seed).wrapping_mul(101)) as u8
}

/// A whole message of the pattern.
pub fn fill(seed: u8, size: usize) -> Vec<u8> {
    (0..size).map(|i| pattern(seed, size, i)).collect()
}

/// Compares `got` with the pattern; names the first wrong byte.
pub fn compare(what: &str, got: &[u8], seed: u8) -> Result<(), String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pattern_depends_on_seed_size_and_position() {
        assert_ne!(fill(0, 64), fill(1, 64));
        assert_ne!(fill(0, 64)[..32], fill(0, 32)[..]);
        assert_eq!(compare("x", &fill(3, 300), 3), Ok(()));
        let mut bad = fill(3, 300);
        bad[299] ^= 1;
        let message = compare("x", &bad, 3).unwrap_err();
        assert!(
            message.starts_with("data check failed: x, 300 bytes: byte 299 is"),
            "{message}"
        );
    }
}
