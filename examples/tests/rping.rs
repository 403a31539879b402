//! `rping` against rdma-core's C `rping` on the device, both directions and Rust to Rust:
//! every ping's data line is checked on both sides (`-v`), the client validates every byte
//! (`-V`), and sizes 64, 4000 and 65535 (the largest either accepts) run.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{
    Side, assert_refused, is_c_rping_teardown_race, rping_text, run_against_tolerating, shorten,
    start_cm_server, text,
};
use rdma_test_support::TestDevice;

const BOUND: Duration = Duration::from_secs(90);

fn program(side: Side) -> &'static str {
    side.program(env!("CARGO_BIN_EXE_rping"), "rping")
}

fn next_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    17174 + (std::process::id() % 100) as u16 * 20 + NEXT.fetch_add(1, Ordering::Relaxed) % 20
}

/// Runs an `rping` server of `server` and a client of `client` with `count` pings of `size`
/// bytes; checks both sides' exits and every data line.
fn pair(device: &TestDevice, server: Side, client: Side, size: usize, count: usize) {
    let addr = device.addr.expect("the device's address").to_string();
    let port = next_port().to_string();
    let what = format!("rping -S {size} -C {count}: server {server:?}, client {client:?}");
    // The C server reads the client's buffer into one of its own `-S` size: both sides get
    // the same size.
    let server_thread = start_cm_server(
        Command::new(program(server))
            .args(["-s", "-v", "-a", &addr, "-p", &port])
            .args(["-S", &size.to_string()]),
        port.parse().unwrap(),
        BOUND,
        &format!("{what}: server"),
    );
    let started = Instant::now();
    // A C side may exit 255 after a run that succeeded (rdma-core 44's teardown race, see
    // `is_c_rping_teardown_race`); its data lines are still checked below.
    let (server_out, client_out) = run_against_tolerating(
        Command::new(program(client))
            .args(["-c", "-v", "-V", "-a", &addr, "-p", &port])
            .args(["-S", &size.to_string(), "-C", &count.to_string()]),
        server_thread,
        BOUND,
        &what,
        is_c_rping_teardown_race,
    );
    let expected: Vec<String> = (0..count).map(|i| rping_text(i, size)).collect();
    let client_lines: Vec<String> = text(&client_out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("ping data: ").map(str::to_string))
        .collect();
    let server_lines: Vec<String> = text(&server_out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("server ping data: ").map(str::to_string))
        .collect();
    check_lines(
        &client_lines,
        &expected,
        &format!("{what}: the client's data lines"),
    );
    check_lines(
        &server_lines,
        &expected,
        &format!("{what}: the server's data lines"),
    );
    eprintln!("{what}: {:.2} s", started.elapsed().as_secs_f64());
}

/// Every expected line, in order, and no other; a mismatch names the first differing line and
/// byte without printing 64 KiB lines.
fn check_lines(got: &[String], expected: &[String], what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: line count");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        if g != e {
            let at = g
                .bytes()
                .zip(e.bytes())
                .position(|(a, b)| a != b)
                .unwrap_or(g.len().min(e.len()));
            panic!(
                "{what}: line {i} differs at byte {at} (lengths {} and {}): {}",
                g.len(),
                e.len(),
                shorten(g.as_bytes())
            );
        }
    }
}

fn matrix(server: Side, client: Side) {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    for (size, count) in [(64, 10), (4000, 5), (65535, 3)] {
        pair(&device, server, client, size, count);
    }
}

#[test]
fn rping_rust_server_c_client() {
    matrix(Side::Rust, Side::C);
}

#[test]
fn rping_c_server_rust_client() {
    matrix(Side::C, Side::Rust);
}

#[test]
fn rping_rust_to_rust() {
    matrix(Side::Rust, Side::Rust);
}

/// A size neither accepts: one line and a failed exit, before anything connects.
#[test]
fn rping_refuses_a_size_out_of_range() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let addr = device.addr.expect("the device's address").to_string();
    for size in ["65536", "10"] {
        assert_refused(
            program(Side::Rust),
            &["-c", "-a", &addr, "-S", size],
            "rping: invalid size",
            Duration::from_secs(60),
        );
    }
}
