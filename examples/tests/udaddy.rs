//! `udaddy` against rdma-core's C `udaddy` on the device, both directions and Rust to Rust:
//! UD over the connection manager (SIDR), several connections, every datagram checked by the
//! Rust side (status, opcode, immediate data equal to the sender's queue pair, length), every
//! byte compared between two Rust programs (`-V`), and each side's report lines exactly.

mod common;

use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use common::{Side, assert_refused, run_against, start_cm_server, text};

const BOUND: Duration = Duration::from_secs(90);
/// The C program's port: it has no option for another.
const C_PORT: u16 = 7174;

/// The tests that use port 7174 take turns.
static PORT_7174: Mutex<()> = Mutex::new(());

fn program(side: Side) -> &'static str {
    side.program(env!("CARGO_BIN_EXE_udaddy"), "udaddy")
}

const SERVER_LINES: [&str; 6] = [
    "udaddy: starting server",
    "receiving data transfers",
    "sending replies",
    "data transfers complete",
    "test complete",
    "return status 0",
];

const CLIENT_LINES: [&str; 7] = [
    "udaddy: starting client",
    "udaddy: connecting",
    "initiating data transfers",
    "receiving data transfers",
    "data transfers complete",
    "test complete",
    "return status 0",
];

/// Runs a server of `server` and a client of `client`: `connections` connections, `count`
/// datagrams of `size` bytes each way on each; checks both exits and report lines.
fn pair(server: Side, client: Side, connections: usize, count: usize, size: usize) {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let _turn = PORT_7174.lock().unwrap_or_else(|e| e.into_inner());
    let addr = device.addr.expect("the device's address").to_string();
    let what = format!(
        "udaddy -c {connections} -C {count} -S {size}: server {server:?}, client {client:?}"
    );
    let numbers = [
        "-c".to_string(),
        connections.to_string(),
        "-C".to_string(),
        count.to_string(),
        "-S".to_string(),
        size.to_string(),
    ];
    let server_out = start_cm_server(
        Command::new(program(server))
            .args(["-b", &addr])
            .args(&numbers),
        C_PORT,
        BOUND,
        &format!("{what}: server"),
    );
    let mut client_cmd = Command::new(program(client));
    client_cmd.args(["-s", &addr]).args(&numbers);
    if (server, client) == (Side::Rust, Side::Rust) {
        // The Rust server echoes each payload: compare every byte.
        client_cmd.arg("-V");
    }
    let (server_out, client_out) = run_against(&mut client_cmd, server_out, BOUND, &what);
    assert_eq!(
        text(&server_out.stdout).lines().collect::<Vec<_>>(),
        SERVER_LINES,
        "{what}: the server's report"
    );
    assert_eq!(
        text(&client_out.stdout).lines().collect::<Vec<_>>(),
        CLIENT_LINES,
        "{what}: the client's report"
    );
}

#[test]
fn udaddy_rust_server_c_client() {
    pair(Side::Rust, Side::C, 1, 10, 100);
    pair(Side::Rust, Side::C, 4, 20, 1024);
}

#[test]
fn udaddy_c_server_rust_client() {
    pair(Side::C, Side::Rust, 1, 10, 100);
    pair(Side::C, Side::Rust, 4, 20, 1024);
}

#[test]
fn udaddy_rust_to_rust() {
    pair(Side::Rust, Side::Rust, 1, 10, 100);
    pair(Side::Rust, Side::Rust, 4, 20, 1024);
}

/// A datagram larger than the port's active MTU, a port space other than UDP, and a server
/// nobody runs: one line and a failed exit each, within the bound.
#[test]
fn udaddy_refuses_bad_input() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let _turn = PORT_7174.lock().unwrap_or_else(|e| e.into_inner());
    let addr = device.addr.expect("the device's address").to_string();
    let cases: [(&[&str], &str); 3] = [
        (
            &["-s", &addr, "-S", "4097"],
            "udaddy: message_size 4097 is larger than active mtu",
        ),
        (
            &["-s", &addr, "-p", "0x106"],
            "udaddy: port space 0x106: only 0x111 (UDP) is supported",
        ),
        (
            &["-s", &addr],
            "udaddy: event: RDMA_CM_EVENT_UNREACHABLE, error: 1",
        ),
    ];
    for (args, want) in cases {
        assert_refused(program(Side::Rust), args, want, BOUND);
    }
}
