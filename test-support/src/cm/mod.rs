//! Helpers shared by `rdma-cm`'s device tests (feature `cm`): queue pairs on an identifier's
//! device, messages sent and received with every byte checked, bounded waits, the kernel's
//! count of identifiers. `use crate::cm::*` brings them in, with [`note`] and
//! [`pattern`].

pub mod ud;

use std::net::IpAddr;
use std::time::{Duration, Instant};

pub use crate::{note, pattern};
use rdma_cm::CmId;
use rdma_cm::rdma_verbs::{
    CompletionQueue, QueuePair,
    cq::{WcOpcode, WcStatus},
    owned::{BufferPool, Completion},
    qp::{Rc, Reset, Rts},
    wr::SendRequest,
};

/// Bound of every wait for an event or a completion.
pub const WAIT: Duration = Duration::from_secs(20);
/// The size of the buffers and messages of [`endpoint`], [`send`] and [`received`].
pub const SIZE: usize = 4096;

/// A queue pair on `id`'s device, with a completion queue and a pool of `SIZE` buffers.
pub fn endpoint(id: &CmId) -> (QueuePair<Rc, Reset>, CompletionQueue, BufferPool) {
    let context = id.context().expect("the identifier's device");
    let pd = context.alloc_pd().expect("ibv_alloc_pd");
    let cq = context.create_cq(16).expect("ibv_create_cq");
    let qp = pd.qp_builder(&cq, &cq).build().expect("ibv_create_qp");
    let pool = BufferPool::new(&pd, 4, SIZE).expect("buffers");
    (qp, cq, pool)
}

/// The next completion of `cq` (polled by `poll_each`, bounded by [`WAIT`]); `what` names it
/// in the failure.
pub fn reap(cq: &mut CompletionQueue, what: &str) -> Completion {
    let mut got = None;
    cq.poll_each_for(1, WAIT, |c| got = Some(c))
        .expect("ibv_poll_cq");
    got.unwrap_or_else(|| panic!("{what}: no completion in {WAIT:?}"))
}

/// Sends `pattern(SIZE, seed)` from a buffer of `pool`, tagged `seed`.
pub fn send(qp: &mut QueuePair<Rc, Rts>, pool: &BufferPool, seed: u8) {
    let mut buf = pool.take().expect("a buffer");
    buf.fill_from(&pattern(SIZE, seed)).unwrap();
    qp.post_send_owned(SendRequest::send(buf).tag(u64::from(seed)))
        .expect("post the send");
}

/// Reaps a successful receive of `pattern(SIZE, seed)` from `cq`, every byte checked.
pub fn received(cq: &mut CompletionQueue, seed: u8, what: &str) {
    check_received(reap(cq, what), seed, what);
}

fn check_received(mut done: Completion, seed: u8, what: &str) {
    assert_eq!(
        (done.status(), done.wc().opcode()),
        (WcStatus::Success, WcOpcode::Recv),
        "{what}: {:?}",
        done.wc()
    );
    assert_eq!(
        &done.take_buf().unwrap()[..],
        &pattern(SIZE, seed)[..],
        "{what}: the bytes"
    );
}

/// Reaps a successful SEND's completion from `cq`.
pub fn sent(cq: &mut CompletionQueue, what: &str) {
    check_sent(&reap(cq, what), what);
}

fn check_sent(done: &Completion, what: &str) {
    assert_eq!(
        (done.status(), done.wc().opcode()),
        (WcStatus::Success, WcOpcode::Send),
        "{what}: {:?}",
        done.wc()
    );
}

/// The completions of a SEND and of the receive of the peer's answer to it, from one queue, in
/// either order: the send completes when its acknowledgement is processed, which Soft-RoCE
/// (Linux 6.12) may do after the answer's receive has completed. The received bytes are
/// `pattern(SIZE, seed)`.
pub fn sent_and_received(cq: &mut CompletionQueue, seed: u8, what: &str) {
    let first = reap(cq, what);
    let second = reap(cq, what);
    let (send, recv) = if first.wc().opcode() == WcOpcode::Send {
        (first, second)
    } else {
        (second, first)
    };
    check_sent(&send, what);
    check_received(recv, seed, what);
}

/// The private data an event carried: `sent` first, zeros after it.
pub fn assert_private(got: &[u8], sent: &[u8], what: &str) {
    assert!(
        got.len() >= sent.len() && &got[..sent.len()] == sent,
        "{what}: private data {got:?}"
    );
    assert!(
        got[sent.len()..].iter().all(|&b| b == 0),
        "{what}: padding {got:?}"
    );
}

/// The IP address of the test device's interface, or `None` with no device (skipped visibly).
pub fn device_addr() -> Option<IpAddr> {
    let device = crate::device()?;
    Some(
        device
            .addr
            .expect("the test device's interface has an IP address (RDMA_TEST_ADDR)"),
    )
}

/// The connection manager identifiers bound to a device that the kernel knows (`rdma resource
/// show cm_id`): a count that does not depend on this crate's bookkeeping.
///
/// All of the system's, not this process's: the kernel records the creating thread's ID (the
/// `pid` it prints), and libtest runs every test on a thread of its own, whose ID is not the
/// process ID (and is gone, with a leaked identifier still listed, once the test ended). The
/// harness runs one test at a time, so the other identifiers listed are the test's own
/// helpers' (C tools), which `before` and `after` counts both see.
pub fn kernel_cm_ids() -> usize {
    let out = std::process::Command::new("rdma")
        .args(["resource", "show", "cm_id"])
        .output()
        .expect("run `rdma resource show cm_id`");
    assert!(out.status.success(), "{:?}", out);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| line.contains(" cm-idn "))
        .count()
}

/// Waits (bounded) until the kernel's count of this process's identifiers is `want`.
pub fn assert_cm_ids(want: usize, what: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let got = kernel_cm_ids();
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the kernel still has {got} identifiers of this process, expected {want}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
