//! The examples written in safe code only, on the device, each as server and client:
//!
//! - `rdma_rw` (RDMA WRITE and READ): both sides check every byte that crossed the wire, so a
//!   run with patterns that disagree (`--seed`) must fail on both sides with one line naming
//!   the first wrong byte; a client whose size disagrees with the server's region fails before
//!   posting anything.
//! - `atomic_counter` (fetch-and-add on a counter, compare-and-swap on a lock): the client
//!   checks every old value, the server the final counter and lock; a counter that does not
//!   start where the client expects fails on the first old value.
//! - `start_here` (the program of `docs/start-here.md`, one process): messages back and forth
//!   between two connected queue pairs from slot rings, every echo checked.

mod common;

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::free_port;
use rdma_test_support::TestDevice;

/// A generous bound on each process (the VM is emulated): past it the process is killed and
/// the test fails.
const BOUND: Duration = Duration::from_secs(60);

const RDMA_RW: &str = env!("CARGO_BIN_EXE_rdma_rw");
const ATOMIC_COUNTER: &str = env!("CARGO_BIN_EXE_atomic_counter");

fn program(path: &str, device: &TestDevice, port: u16, extra: &[&str]) -> Command {
    common::safe_example(path, device, port, 10, extra)
}

fn finish(child: Child, what: &str) -> Output {
    common::finish_within(child, BOUND, what)
}

/// Runs `path` as a server with `server_args` and as a client with `client_args`; returns
/// both outputs.
fn run(
    path: &str,
    device: &TestDevice,
    server_args: &[&str],
    client_args: &[&str],
) -> (Output, Output) {
    let port = free_port();
    let mut client_args = client_args.to_vec();
    client_args.push("127.0.0.1");
    common::run_server_client(
        &mut program(path, device, port, server_args),
        &mut program(path, device, port, &client_args),
        port,
        BOUND,
    )
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The one line on stderr of a failed run.
fn one_error_line(out: &Output, what: &str) -> String {
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{what}: exit code; stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{what}: {stderr}");
    lines[0].to_string()
}

#[test]
fn rdma_rw_writes_and_reads_every_byte() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    for size in ["8192", "2", "65537"] {
        let (server, client) = run(RDMA_RW, &device, &["-s", size], &["-s", size]);
        let what = format!("-s {size}");
        assert!(
            server.status.success() && client.status.success(),
            "{what}: server {:?}: {}\nclient {:?}: {}",
            server.status,
            text(&server.stderr),
            client.status,
            text(&client.stderr)
        );
        let half = size.parse::<usize>().unwrap() / 2;
        let rest = size.parse::<usize>().unwrap() - half;
        assert!(
            text(&client.stdout).contains(&format!("{half} bytes written and {rest} bytes read")),
            "{what}: {}",
            text(&client.stdout)
        );
        assert!(
            text(&server.stdout).contains(&format!(
                "{half} bytes written by the client, all as expected"
            )),
            "{what}: {}",
            text(&server.stdout)
        );
    }
}

/// Patterns that disagree: the server finds the client's bytes wrong, and the client the
/// server's, each naming the first wrong byte. This is what shows that each side's check looks
/// at the bytes that crossed the wire.
#[test]
fn rdma_rw_checks_fail_on_other_bytes() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let (server, client) = run(
        RDMA_RW,
        &device,
        &["-s", "4096"],
        &["-s", "4096", "--seed", "3"],
    );
    assert_eq!(
        one_error_line(&server, "server"),
        "rdma_rw: the RDMA WRITE: byte 0 is 0x04, expected 0x01 (2048 of 2048 bytes wrong)"
    );
    assert_eq!(
        one_error_line(&client, "client"),
        "rdma_rw: the RDMA READ: byte 0 is 0x05, expected 0x08 (2048 of 2048 bytes wrong)"
    );
}

/// A client whose size disagrees with the server's region stops before posting: one line,
/// exit 1; the server, left without the end handshake, says so.
#[test]
fn rdma_rw_size_mismatch_is_an_error_on_both_sides() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let (server, client) = run(RDMA_RW, &device, &["-s", "4096"], &["-s", "8192"]);
    assert_eq!(
        one_error_line(&client, "client"),
        "rdma_rw: the server's region has 4096 bytes; this client was started with -s 8192"
    );
    assert_eq!(
        one_error_line(&server, "server"),
        "rdma_rw: the client closed the connection before the end"
    );
}

#[test]
fn atomic_counter_counts_and_locks() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let (server, client) = run(
        ATOMIC_COUNTER,
        &device,
        &["--start", "1000"],
        &["--start", "1000", "-n", "300"],
    );
    assert!(
        server.status.success() && client.status.success(),
        "server {:?}: {}\nclient {:?}: {}",
        server.status,
        text(&server.stderr),
        client.status,
        text(&client.stderr)
    );
    assert!(
        text(&client.stdout).contains("lock taken, counter 1000 -> 1300, lock released"),
        "{}",
        text(&client.stdout)
    );
    // The server reads the words the client's atomics changed.
    assert!(
        text(&server.stdout).contains("counter 1300, lock 0"),
        "{}",
        text(&server.stdout)
    );
}

/// The client expects the counter at 0, the server starts it at 7: the first fetch-and-add
/// returns 7, and the client stops there, holding the lock; the server, left without the end
/// handshake, says so.
#[test]
fn atomic_counter_checks_every_old_value() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let (server, client) = run(ATOMIC_COUNTER, &device, &["--start", "7"], &["-n", "5"]);
    assert_eq!(
        one_error_line(&client, "client"),
        "atomic_counter: FETCH_AND_ADD 1 returned 7, expected 0"
    );
    assert_eq!(
        one_error_line(&server, "server"),
        "atomic_counter: the client closed the connection before the end"
    );
}

/// One process, two UD queue pairs through the device: every datagram with the right Q_Key
/// arrives and is checked byte for byte (behind its GRH); one with another Q_Key is dropped,
/// leaving its receive posted.
#[test]
fn ud_loopback_delivers_the_right_qkey_and_drops_another() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let out = ud_loopback(&device, &["-n", "50", "-s", "1000", "--qkey", "0x1234"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}\n{stdout}", text(&out.stderr));
    assert!(
        stdout.contains("50 datagrams of 1000 bytes received and checked"),
        "{stdout}"
    );
    assert!(
        stdout.contains("a datagram with Q_Key 0x5a5a486e was dropped; 1 receive still posted"),
        "{stdout}"
    );
    // A datagram larger than the port's MTU is refused before anything is posted.
    let out = ud_loopback(&device, &["-s", "100000"]);
    assert!(
        one_error_line(&out, "too large").starts_with("ud_loopback: size 100000 out of range"),
        "{}",
        text(&out.stderr)
    );
}

fn ud_loopback(device: &TestDevice, extra: &[&str]) -> Output {
    let child = Command::new(env!("CARGO_BIN_EXE_ud_loopback"))
        .args(["-d", &device.name])
        .args(["-g", &device.gid_index.to_string()])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ud_loopback");
    finish(child, "ud_loopback")
}

/// `start_here`, the program `docs/start-here.md` shows: 50 messages of 300 bytes each way
/// between two connected queue pairs on one completion queue, sent from and received into slot
/// rings; the program checks every byte of every echo (a wrong one exits 1), and prints one
/// line per round. A device that does not exist is one line on stderr and exit status 1.
#[test]
fn start_here_sends_and_echoes_every_message() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let out = start_here(&["-d", &device.name, "-n", "50", "-s", "300"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}\n{stdout}", text(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    let expected: Vec<String> = (0..50)
        .map(|n| format!("round {n}: 300 bytes there and back"))
        .collect();
    assert_eq!(lines, expected);
    let out = start_here(&["-d", "nosuchdev9"]);
    let line = one_error_line(&out, "no such device");
    assert!(line.starts_with("start_here: "), "{line}");
    assert!(line.contains("nosuchdev9"), "{line}");
}

fn start_here(args: &[&str]) -> Output {
    run_one(env!("CARGO_BIN_EXE_start_here"), args, "start_here")
}

/// Runs the one-process example at `path` with `args`, output piped, within the bound.
fn run_one(path: &str, args: &[&str], what: &str) -> Output {
    let child = Command::new(path)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    finish(child, what)
}

/// `cm_start_here`, the quick start `rdma-cm`'s README shows: a server and a client of one
/// process connect through the connection manager on the device's address and the message
/// crosses from the client's slot ring to the server's, every byte printed as received.
/// Without an address it says how to call it and exits 1.
#[test]
fn cm_start_here_sends_a_message() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let addr = device.addr.expect("the device's address");
    let at = std::net::SocketAddr::new(addr, free_port()).to_string();
    let out = cm_start_here(&[&at]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}\n{stdout}", text(&out.stderr));
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort_unstable();
    assert_eq!(
        lines,
        [
            "client sent its message",
            "server received \"hello over rdma-cm\""
        ]
    );
    let out = cm_start_here(&[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "Error: \"usage: cm_start_here ADDRESS:PORT\"\n"
    );
}

fn cm_start_here(args: &[&str]) -> Output {
    run_one(env!("CARGO_BIN_EXE_cm_start_here"), args, "cm_start_here")
}
