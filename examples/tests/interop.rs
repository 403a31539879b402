//! The pingpong interop matrix on the device: each Rust program against rdma-core's C program
//! (both directions) and against itself, for several sizes, polling and with `-e`.
//!
//! Both processes must exit 0, print their address lines and the two result lines, and agree on
//! each other's queue pair numbers.

use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use common::listening;
use rdma_test_support::TestDevice;

mod common;

const ITERS: u32 = 200;
const DEADLINE: Duration = Duration::from_secs(60);

/// Each run gets its own TCP port.
fn next_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20000 + (std::process::id() % 1000) as u16 * 20;
    base + NEXT.fetch_add(1, Ordering::Relaxed)
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Side {
    Rust,
    C,
}

fn program(side: Side, name: &str) -> String {
    match side {
        Side::C => format!("ibv_{name}"),
        Side::Rust => match name {
            "rc_pingpong" => env!("CARGO_BIN_EXE_rc_pingpong").to_string(),
            "uc_pingpong" => env!("CARGO_BIN_EXE_uc_pingpong").to_string(),
            "ud_pingpong" => env!("CARGO_BIN_EXE_ud_pingpong").to_string(),
            "srq_pingpong" => env!("CARGO_BIN_EXE_srq_pingpong").to_string(),
            other => panic!("no Rust program {other}"),
        },
    }
}

/// Waits for both processes, for [`DEADLINE`] at most; on timeout kills both and fails with
/// everything they printed.
fn wait_both(server: Child, client: Child, what: &str) -> (Output, Output) {
    let deadline = Instant::now() + DEADLINE;
    let mut children = [server, client];
    loop {
        let mut done = true;
        for child in &mut children {
            done &= child.try_wait().expect("wait for a pingpong").is_some();
        }
        if done || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let timed_out = Instant::now() > deadline;
    let [server, client] = children.map(|mut child| {
        let _ = child.kill();
        child.wait_with_output().expect("collect output")
    });
    if timed_out {
        panic!(
            "{what}: did not finish within {DEADLINE:?}\nserver ({}):\n{}{}\nclient ({}):\n{}{}",
            server.status,
            String::from_utf8_lossy(&server.stdout),
            String::from_utf8_lossy(&server.stderr),
            client.status,
            String::from_utf8_lossy(&client.stdout),
            String::from_utf8_lossy(&client.stderr)
        );
    }
    (server, client)
}

struct Run {
    stdout: String,
}

impl Run {
    fn qpn(&self, which: &str) -> u32 {
        let line = self
            .stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{which} address:")))
            .unwrap_or_else(|| panic!("no {which} address line in:\n{}", self.stdout));
        let qpn = line.split("QPN 0x").nth(1).expect("QPN field");
        u32::from_str_radix(&qpn[..6], 16).expect("hex QPN")
    }
}

/// Checks the two result lines: `N bytes in S seconds = M Mbit/sec`, `I iters in S seconds = U
/// usec/iter`.
fn check_results(stdout: &str, size: usize, what: &str) {
    let bytes = size as u64 * u64::from(ITERS) * 2;
    let bytes_line = stdout
        .lines()
        .find(|l| l.contains(" bytes in ") && l.ends_with(" Mbit/sec"))
        .unwrap_or_else(|| panic!("{what}: no bytes line in:\n{stdout}"));
    let words: Vec<&str> = bytes_line.split_whitespace().collect();
    assert_eq!(
        words[0].parse::<u64>().ok(),
        Some(bytes),
        "{what}: {bytes_line}"
    );
    assert!(
        words[3].parse::<f64>().is_ok() && words[6].parse::<f64>().is_ok(),
        "{bytes_line}"
    );
    let iters_line = stdout
        .lines()
        .find(|l| l.contains(" iters in ") && l.ends_with(" usec/iter"))
        .unwrap_or_else(|| panic!("{what}: no iters line in:\n{stdout}"));
    let words: Vec<&str> = iters_line.split_whitespace().collect();
    assert_eq!(
        words[0].parse::<u32>().ok(),
        Some(ITERS),
        "{what}: {iters_line}"
    );
    let usec: f64 = words[6].parse().expect("usec/iter is a number");
    assert!(usec > 0.0, "{what}: {iters_line}");
}

/// Runs `name` with `server` and `client` implementations and checks both.
fn pair(device: &TestDevice, name: &str, server: Side, client: Side, size: usize, events: bool) {
    let port = next_port();
    let common = |cmd: &mut Command| {
        cmd.args(["-d", &device.name])
            .args(["-i", &device.port.to_string()])
            .args(["-g", &device.gid_index.to_string()])
            .args(["-s", &size.to_string()])
            .args(["-n", &ITERS.to_string()])
            .args(["-p", &port.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if events {
            cmd.arg("-e");
        }
    };
    let what = format!(
        "{name} size {size}{} server {server:?} client {client:?}",
        if events { " -e" } else { "" }
    );
    let mut server_cmd = Command::new(program(server, name));
    common(&mut server_cmd);
    let server_child = server_cmd
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: start server: {e}"));
    let started = Instant::now();
    while !listening(port) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{what}: server never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut client_cmd = Command::new(program(client, name));
    common(&mut client_cmd);
    client_cmd.arg("127.0.0.1");
    let client_child = client_cmd
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: start client: {e}"));
    let (server_out, client_out) = wait_both(server_child, client_child, &what);
    let show = |out: &Output| {
        format!(
            "({})\nstdout:\n{}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    assert!(
        server_out.status.success() && client_out.status.success(),
        "{what} failed\nserver {}\nclient {}",
        show(&server_out),
        show(&client_out)
    );
    for (role, out) in [("server", &server_out), ("client", &client_out)] {
        check_results(
            &String::from_utf8_lossy(&out.stdout),
            size,
            &format!("{what}: {role}"),
        );
    }
    let s = Run {
        stdout: String::from_utf8_lossy(&server_out.stdout).into_owned(),
    };
    let c = Run {
        stdout: String::from_utf8_lossy(&client_out.stdout).into_owned(),
    };
    assert_eq!(
        s.qpn("remote"),
        c.qpn("local"),
        "{what}: server saw another QPN"
    );
    assert_eq!(
        c.qpn("remote"),
        s.qpn("local"),
        "{what}: client saw another QPN"
    );
}

fn matrix(name: &str, server: Side, client: Side, sizes: &[usize]) {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    for &size in sizes {
        for events in [false, true] {
            pair(&device, name, server, client, size, events);
        }
    }
}

#[test]
fn rc_rust_server_c_client() {
    matrix("rc_pingpong", Side::Rust, Side::C, &[1, 64, 4096]);
}

#[test]
fn rc_c_server_rust_client() {
    matrix("rc_pingpong", Side::C, Side::Rust, &[1, 64, 4096]);
}

#[test]
fn rc_rust_to_rust() {
    matrix("rc_pingpong", Side::Rust, Side::Rust, &[1, 64, 4096]);
}

#[test]
fn uc_rust_server_c_client() {
    matrix("uc_pingpong", Side::Rust, Side::C, &[1, 64, 4096]);
}

#[test]
fn uc_c_server_rust_client() {
    matrix("uc_pingpong", Side::C, Side::Rust, &[1, 64, 4096]);
}

#[test]
fn uc_rust_to_rust() {
    matrix("uc_pingpong", Side::Rust, Side::Rust, &[1, 64, 4096]);
}

// UD messages fit in one MTU: rxe's active MTU is 1024 on a 1500-byte netdev.
#[test]
fn ud_rust_server_c_client() {
    matrix("ud_pingpong", Side::Rust, Side::C, &[1, 64, 1024]);
}

#[test]
fn ud_c_server_rust_client() {
    matrix("ud_pingpong", Side::C, Side::Rust, &[1, 64, 1024]);
}

#[test]
fn ud_rust_to_rust() {
    matrix("ud_pingpong", Side::Rust, Side::Rust, &[1, 64, 1024]);
}

// 16 queue pairs on one shared receive queue (the C default), 256 address records each way.
#[test]
fn srq_rust_server_c_client() {
    matrix("srq_pingpong", Side::Rust, Side::C, &[1, 64, 4096]);
}

#[test]
fn srq_c_server_rust_client() {
    matrix("srq_pingpong", Side::C, Side::Rust, &[1, 64, 4096]);
}

#[test]
fn srq_rust_to_rust() {
    matrix("srq_pingpong", Side::Rust, Side::Rust, &[1, 64, 4096]);
}
