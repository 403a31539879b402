//! Helpers shared by the connection-manager tests.

#![allow(dead_code)] // each test binary uses a different part
#![allow(unreachable_pub)]

pub mod ud;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use rdma_cm::CmId;
use rdma_cm::rdma_verbs::{
    BufferPool, Completion, CompletionQueue, OwnedSend, QueuePair, Rc, Reset, Rts, WcOpcode,
    WcStatus,
};

/// Bound of every wait for an event or a completion.
pub const WAIT: Duration = Duration::from_secs(20);
pub const SIZE: usize = 4096;

pub fn pattern(seed: u8) -> Vec<u8> {
    (0..SIZE)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

/// A queue pair on `id`'s device, with a completion queue and a pool of `SIZE` buffers.
pub fn endpoint(id: &CmId) -> (QueuePair<Rc, Reset>, CompletionQueue, BufferPool) {
    let context = id.context().expect("the identifier's device");
    let pd = context.alloc_pd().expect("ibv_alloc_pd");
    let cq = context.create_cq(16).expect("ibv_create_cq");
    let qp = pd.qp_builder(&cq, &cq).build().expect("ibv_create_qp");
    let pool = BufferPool::new(&pd, 4, SIZE).expect("buffers");
    (qp, cq, pool)
}

pub fn reap(cq: &mut CompletionQueue, what: &str) -> Completion {
    let deadline = Instant::now() + WAIT;
    let mut got = None;
    while got.is_none() {
        cq.poll_each(1, |c| got = Some(c)).expect("ibv_poll_cq");
        assert!(
            Instant::now() < deadline,
            "{what}: no completion in {WAIT:?}"
        );
    }
    got.unwrap()
}

pub fn send(qp: &mut QueuePair<Rc, Rts>, pool: &BufferPool, seed: u8) {
    let mut buf = pool.take().expect("a buffer");
    buf.fill_from(&pattern(seed)).unwrap();
    qp.post_send_owned(OwnedSend::send(buf).tag(u64::from(seed)))
        .expect("post the send");
}

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
        &pattern(seed)[..],
        "{what}: the bytes"
    );
}

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
/// `pattern(seed)`.
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

/// A line on the real stderr (libtest keeps a passing test's `eprintln!` to itself).
pub fn note(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "NOTE: {line}");
}

pub fn device_addr() -> Option<IpAddr> {
    let device = rdma_test_support::device()?;
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
