//! `ucmatose` against rdma-core's C `ucmatose` on the device, both directions and Rust to
//! Rust: several RC connections over the connection manager, messages both ways on each
//! (every completion checked by the Rust side, every byte between two Rust programs with
//! `-V`), the server's disconnect of all of them, with and without `-m` (every connection
//! moved to a new event channel first), and each side's report lines exactly.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{Side, run_against, show, start_cm_server, text};

const BOUND: Duration = Duration::from_secs(120);

fn program(side: Side) -> &'static str {
    side.program(env!("CARGO_BIN_EXE_ucmatose"), "ucmatose")
}

/// A connection-manager port below the ephemeral range (which another binary's automatically
/// bound identifiers draw from while the harness runs two binaries at once) and apart from
/// the other examples' tests (docs/test-harness.md lists the ranges).
fn next_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    12471 + (std::process::id() % 100) as u16 * 20 + NEXT.fetch_add(1, Ordering::Relaxed) % 20
}

fn server_lines(migrate: bool) -> Vec<&'static str> {
    let mut lines = vec![
        "cmatose: starting server",
        "initiating data transfers",
        "completing sends",
        "receiving data transfers",
        "data transfers complete",
    ];
    if migrate {
        lines.push("migrating to new event channel");
    }
    lines.extend([
        "cmatose: disconnecting",
        "disconnected",
        "test complete",
        "return status 0",
    ]);
    lines
}

fn client_lines(migrate: bool) -> Vec<&'static str> {
    let mut lines = vec![
        "cmatose: starting client",
        "cmatose: connecting",
        "receiving data transfers",
        "sending replies",
        "data transfers complete",
    ];
    if migrate {
        lines.push("migrating to new event channel");
    }
    lines.extend(["test complete", "return status 0"]);
    lines
}

/// A server of `server` and a client of `client`: `connections` connections, `count`
/// messages of `size` bytes each way on each, `-m` on both when `migrate`.
fn pair(server: Side, client: Side, connections: usize, count: usize, size: usize, migrate: bool) {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let addr = device.addr.expect("the device's address").to_string();
    let port = next_port();
    let what = format!(
        "ucmatose -c {connections} -C {count} -S {size}{}: server {server:?}, client {client:?}",
        if migrate { " -m" } else { "" }
    );
    let mut common_args = vec![
        "-p".to_string(),
        port.to_string(),
        "-c".to_string(),
        connections.to_string(),
        "-C".to_string(),
        count.to_string(),
        "-S".to_string(),
        size.to_string(),
    ];
    if migrate {
        common_args.push("-m".to_string());
    }
    let both_rust = (server, client) == (Side::Rust, Side::Rust);
    let mut server_cmd = Command::new(program(server));
    server_cmd.args(["-b", &addr]).args(&common_args);
    let mut client_cmd = Command::new(program(client));
    client_cmd.args(["-s", &addr]).args(&common_args);
    if both_rust {
        server_cmd.arg("-V");
        client_cmd.arg("-V");
    }
    let server_out = start_cm_server(&mut server_cmd, port, BOUND, &format!("{what}: server"));
    let (server_out, client_out) = run_against(&mut client_cmd, server_out, BOUND, &what);
    assert_eq!(
        text(&server_out.stdout).lines().collect::<Vec<_>>(),
        server_lines(migrate),
        "{what}: the server's report\n{}",
        show(&server_out)
    );
    assert_eq!(
        text(&client_out.stdout).lines().collect::<Vec<_>>(),
        client_lines(migrate),
        "{what}: the client's report\n{}",
        show(&client_out)
    );
}

#[test]
fn ucmatose_rust_server_c_client() {
    pair(Side::Rust, Side::C, 4, 10, 100, false);
    pair(Side::Rust, Side::C, 10, 20, 4096, true);
}

#[test]
fn ucmatose_c_server_rust_client() {
    pair(Side::C, Side::Rust, 4, 10, 100, false);
    pair(Side::C, Side::Rust, 10, 20, 4096, true);
}

#[test]
fn ucmatose_rust_to_rust() {
    pair(Side::Rust, Side::Rust, 4, 10, 100, false);
    pair(Side::Rust, Side::Rust, 16, 20, 4096, true);
}
