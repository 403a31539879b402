//! The tokio `async_echo` example on the device: sixteen concurrent connections to one server
//! with every echoed byte checked; a server killed while clients are connected (each client
//! ends with a one-line error, within its bound); a client killed mid-transfer (the server
//! ends that connection and goes on serving).

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{
    assert_refused, finish_within, run_against, show, spawn_reading, start_cm_server, text,
    wait_for_lines,
};

const PROGRAM: &str = env!("CARGO_BIN_EXE_async_echo");
const BOUND: Duration = Duration::from_secs(120);

fn next_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    27471 + (std::process::id() % 100) as u16 * 20 + NEXT.fetch_add(1, Ordering::Relaxed) % 20
}

fn address() -> Option<String> {
    let device = rdma_test_support::device()?;
    Some(device.addr.expect("the device's address").to_string())
}

#[test]
fn async_echo_sixteen_concurrent_clients() {
    let Some(addr) = address() else { return };
    let port = next_port();
    let what = "async_echo: 16 connections, 20 round trips of 4096 bytes";
    let server = start_cm_server(
        Command::new(PROGRAM).args(["-s", "-a", &addr, "-p", &port.to_string(), "-n", "16"]),
        port,
        BOUND,
        what,
    );
    let (server_out, client_out) = run_against(
        Command::new(PROGRAM)
            .args(["-c", "-a", &addr, "-p", &port.to_string()])
            .args(["-n", "16", "-C", "20", "-S", "4096"]),
        server,
        BOUND,
        what,
    );
    let client_text = text(&client_out.stdout);
    for c in 0..16 {
        for want in [
            format!("connection {c}: connected"),
            format!("connection {c}: 20 round trips of 4096 bytes verified"),
        ] {
            assert_eq!(
                client_text.lines().filter(|l| *l == want).count(),
                1,
                "{what}: {want:?} in {client_text}"
            );
        }
    }
    assert_eq!(
        client_text.lines().last(),
        Some("async_echo: 16 connections, 320 round trips of 4096 bytes verified")
    );
    let server_text = text(&server_out.stdout);
    assert_eq!(
        server_text
            .lines()
            .filter(|l| l.ends_with(": echoed 20 messages of 4096 bytes"))
            .count(),
        16,
        "{server_text}"
    );
    assert_eq!(
        server_text.lines().last(),
        Some("async_echo: served 16 connections, 0 ended early")
    );
}

/// The server is killed while four clients are connected and exchanging: each connection
/// notices (the connection manager's event or a failed completion), and the client exits 1
/// with one line naming the first connection that failed, within its bound.
#[test]
fn async_echo_server_killed_while_clients_are_connected() {
    let Some(addr) = address() else { return };
    let port = next_port().to_string();
    let mut server = Command::new(PROGRAM)
        .args(["-s", "-a", &addr, "-p", &port, "-n", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the server");
    let started = std::time::Instant::now();
    while !common::cm_listening(port.parse().unwrap()) {
        assert!(started.elapsed() < BOUND, "the server never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (client, lines) = spawn_reading(
        PROGRAM,
        &[
            "-c",
            "-a",
            &addr,
            "-p",
            &port,
            "-n",
            "4",
            "-C",
            "100000000",
            "-S",
            "4096",
            "--timeout",
            "20",
        ],
    );
    wait_for_lines(&lines, ": connected", 4, BOUND, "server killed");
    // Let them exchange for a while (the checks do not depend on how long).
    std::thread::sleep(Duration::from_millis(500));
    server.kill().expect("kill the server");
    server.wait().expect("reap the server");
    let out = finish_within(client, BOUND, "the client after the server died");
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    let stderr = text(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    rdma_test_support::note(&format!("server killed: the client said {stderr:?}"));
    assert!(
        stderr.starts_with("async_echo: connection ") && stderr.contains(": round "),
        "{stderr}"
    );
}

/// A client killed mid-transfer: the server ends that connection (its report says how) and
/// serves the next client in full.
#[test]
fn async_echo_client_killed_mid_transfer() {
    let Some(addr) = address() else { return };
    let port = next_port();
    let what = "async_echo: a client killed, then a full one";
    let server = start_cm_server(
        Command::new(PROGRAM).args(["-s", "-a", &addr, "-p", &port.to_string(), "-n", "2"]),
        port,
        BOUND,
        what,
    );
    let (mut doomed, lines) = spawn_reading(
        PROGRAM,
        &[
            "-c",
            "-a",
            &addr,
            "-p",
            &port.to_string(),
            "-n",
            "1",
            "-C",
            "100000000",
        ],
    );
    wait_for_lines(&lines, ": connected", 1, BOUND, what);
    // Let it exchange for a while (the checks do not depend on how long).
    std::thread::sleep(Duration::from_millis(500));
    doomed.kill().expect("kill the client");
    doomed.wait().expect("reap the client");
    let (server_out, client_out) = run_against(
        Command::new(PROGRAM).args(["-c", "-a", &addr, "-p", &port.to_string(), "-C", "5"]),
        server,
        BOUND,
        what,
    );
    assert!(
        text(&client_out.stdout).contains("connection 0: 5 round trips of 4096 bytes verified"),
        "{}",
        show(&client_out)
    );
    let server_text = text(&server_out.stdout);
    rdma_test_support::note(&format!("client killed: the server said {server_text:?}"));
    let lines: Vec<&str> = server_text.lines().collect();
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.ends_with(": echoed 5 messages of 4096 bytes"))
            .count(),
        1,
        "{server_text}"
    );
    let last = lines.last().copied().unwrap_or_default();
    assert!(
        last == "async_echo: served 2 connections, 0 ended early"
            || last == "async_echo: served 1 connections, 1 ended early",
        "{server_text}"
    );
}

/// Sizes out of range: one line, exit 1, before anything connects.
#[test]
fn async_echo_refuses_bad_sizes() {
    let Some(addr) = address() else { return };
    for size in ["0", "1048577"] {
        assert_refused(
            PROGRAM,
            &["-c", "-a", &addr, "-S", size],
            "async_echo: invalid size",
            Duration::from_secs(60),
        );
    }
}
