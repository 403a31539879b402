//! `rdma_rw` (RDMA WRITE and READ between two processes, safe code only) on the device: both
//! sides check every byte that crossed the wire, so a run with patterns that disagree
//! (`--seed`) must fail on both sides with one line naming the first wrong byte; and a client
//! whose size disagrees with the server's region fails before posting anything.

mod common;

use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::listening;
use rdma_test_support::TestDevice;

/// A generous bound on each process (the VM is emulated): past it the process is killed and
/// the test fails.
const BOUND: Duration = Duration::from_secs(60);

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

fn rdma_rw(device: &TestDevice, port: u16, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rdma_rw"));
    cmd.args(["-d", &device.name])
        .args(["-g", &device.gid_index.to_string()])
        .args(["-p", &port.to_string()])
        .args(["--timeout", "10"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn finish(mut child: Child, what: &str) -> Output {
    let deadline = Instant::now() + BOUND;
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "{what}: still running after {BOUND:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// Runs a server with `server_args` and a client with `client_args`; returns both outputs.
fn run(device: &TestDevice, server_args: &[&str], client_args: &[&str]) -> (Output, Output) {
    let port = free_port();
    let server = rdma_rw(device, port, server_args)
        .spawn()
        .expect("spawn server");
    let started = Instant::now();
    while !listening(port) {
        assert!(started.elapsed() < BOUND, "the server never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut client_args = client_args.to_vec();
    client_args.push("127.0.0.1");
    let client = rdma_rw(device, port, &client_args)
        .spawn()
        .expect("spawn client");
    let client = finish(client, "client");
    let server = finish(server, "server");
    (server, client)
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
        let (server, client) = run(&device, &["-s", size], &["-s", size]);
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
    let (server, client) = run(&device, &["-s", "4096"], &["-s", "4096", "--seed", "3"]);
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
    let (server, client) = run(&device, &["-s", "4096"], &["-s", "8192"]);
    assert_eq!(
        one_error_line(&client, "client"),
        "rdma_rw: the server's region has 4096 bytes; this client was started with -s 8192"
    );
    assert_eq!(
        one_error_line(&server, "server"),
        "rdma_rw: the client closed the connection before the end"
    );
}
