//! `rdma_server` and `rdma_client` (the endpoint API) against rdma-core's C programs on the
//! device, both directions and Rust to Rust: each side's received message is checked (`-v`;
//! the C programs send 16 zero bytes, ours the client's message and its echo).

mod common;

use std::process::Command;
use std::time::Duration;

use common::{Side, run_against, start_cm_server, text};

const BOUND: Duration = Duration::from_secs(60);

fn next_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    30471 + (std::process::id() % 100) as u16 * 10 + NEXT.fetch_add(1, Ordering::Relaxed) % 10
}

/// The message line a Rust side printed (`-v`).
fn received(out: &std::process::Output, program: &str) -> String {
    let prefix = format!("{program}: received ");
    text(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(&prefix).map(str::to_string))
        .unwrap_or_else(|| panic!("{program} printed no message: {}", text(&out.stdout)))
}

/// Runs a server of `server` and a client of `client`; checks both exits, their closing
/// lines, and what each Rust side received.
fn pair(server: Side, client: Side) {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let addr = device.addr.expect("the device's address").to_string();
    let port = next_port().to_string();
    let what = format!("rdma_server {server:?}, rdma_client {client:?}");
    let mut server_cmd =
        Command::new(server.program(env!("CARGO_BIN_EXE_rdma_server"), "rdma_server"));
    server_cmd.args(["-s", &addr, "-p", &port]);
    if server == Side::Rust {
        server_cmd.arg("-v");
    }
    let server_thread = start_cm_server(
        &mut server_cmd,
        port.parse().unwrap(),
        BOUND,
        &format!("{what}: server"),
    );
    let mut client_cmd =
        Command::new(client.program(env!("CARGO_BIN_EXE_rdma_client"), "rdma_client"));
    client_cmd.args(["-s", &addr, "-p", &port]);
    if client == Side::Rust {
        client_cmd.arg("-v");
    }
    let (server_out, client_out) = run_against(&mut client_cmd, server_thread, BOUND, &what);
    for (out, program) in [(&server_out, "rdma_server"), (&client_out, "rdma_client")] {
        let stdout = text(&out.stdout);
        assert!(
            stdout.starts_with(&format!("{program}: start\n"))
                && stdout.trim_end().ends_with(&format!("{program}: end 0")),
            "{what}: {program}'s lines: {stdout}"
        );
    }
    let zeros = "00".repeat(16);
    let message: String = (0x10..0x20u8).map(|b| format!("{b:02x}")).collect();
    // The client's message reaches the server; the server answers with it (ours) or with
    // zeros (C's).
    let sent_by_client = if client == Side::Rust {
        &message
    } else {
        &zeros
    };
    if server == Side::Rust {
        assert_eq!(
            &received(&server_out, "rdma_server"),
            sent_by_client,
            "{what}"
        );
    }
    if client == Side::Rust {
        let echoed = if server == Side::Rust {
            &message
        } else {
            &zeros
        };
        assert_eq!(&received(&client_out, "rdma_client"), echoed, "{what}");
    }
}

#[test]
fn rdma_server_and_client_rust_to_rust() {
    pair(Side::Rust, Side::Rust);
}

#[test]
fn rdma_server_rust_c_client() {
    pair(Side::Rust, Side::C);
}

#[test]
fn rdma_server_c_rust_client() {
    pair(Side::C, Side::Rust);
}
