//! `mckey` between two hosts (`cargo xtask test --nodes 2`): an IP multicast group joined
//! over the connection manager on both, the sender's datagrams crossing the virtual wire to
//! every receiving queue pair of the other host (every byte checked between Rust programs),
//! and rdma-core's C `mckey` receiving from the Rust sender.

mod common;

use std::time::Duration;

use common::{mckey_lines, show, spawn_line_buffered, spawn_reading};
use rdma_test_support::Cluster;

const PROGRAM: &str = env!("CARGO_BIN_EXE_mckey");
const BOUND: Duration = Duration::from_secs(180);

fn setup() -> Option<Cluster> {
    rdma_test_support::device()?;
    rdma_test_support::cluster()
}

/// Runs `program` with `args` to its end; its report lines.
fn report(program: &str, args: &[&str], what: &str) -> Vec<String> {
    let (child, lines) = spawn_reading(program, args);
    let out = common::finish_within(child, BOUND, what);
    assert!(out.status.success(), "{what}: {}", show(&out));
    lines.iter().collect()
}

/// Node `receiver_node` runs `receiver` with `connections` joins and publishes `key` once
/// they are reported; the other node then sends `count` datagrams of `size` bytes with the
/// Rust `mckey` (send-only). Both reports checked on their own node.
fn across(
    c: &Cluster,
    receiver_node: usize,
    receiver: &str,
    group: &str,
    connections: usize,
    key: &str,
    what: &str,
) {
    let own = c.addr(c.node()).to_string();
    let base = ["-m", group, "-b", &own, "-C", "20", "-S", "1000"];
    if c.node() == receiver_node {
        let conns = connections.to_string();
        let mut args = base.to_vec();
        args.extend(["-c", &conns]);
        if receiver == PROGRAM {
            args.push("-V");
        }
        let (child, lines) = spawn_line_buffered(receiver, &args);
        let mut seen = Vec::new();
        while seen
            .iter()
            .filter(|l: &&String| l.ends_with(" mlid 0x0 sl 0"))
            .count()
            < connections
        {
            seen.push(
                lines
                    .recv_timeout(BOUND)
                    .unwrap_or_else(|_| panic!("{what}: the receiver reported only {seen:?}")),
            );
        }
        c.publish(key, "yes");
        let out = common::finish_within(child, BOUND, what);
        assert!(out.status.success(), "{what}: receiver: {}", show(&out));
        seen.extend(lines.iter());
        assert_eq!(
            seen,
            mckey_lines(false, group, connections),
            "{what}: receiver"
        );
    } else {
        c.fetch(receiver_node, key);
        let mut args = base.to_vec();
        args.extend(["-s", "-o"]);
        let got = report(PROGRAM, &args, &format!("{what}: sender"));
        assert_eq!(got, mckey_lines(true, group, 1), "{what}: sender");
    }
}

/// Two Rust receivers' queue pairs on node 0, the Rust sender on node 1: 20 datagrams of
/// 1000 bytes each, every byte compared.
#[test]
fn mckey_across_hosts_rust_to_rust() {
    let Some(c) = setup() else { return };
    across(
        &c,
        0,
        PROGRAM,
        "239.1.4.1",
        2,
        "mckey-rust-joined",
        "mckey across hosts: Rust to Rust",
    );
}

/// rdma-core's `mckey` receiving on node 1 from the Rust sender on node 0.
#[test]
fn mckey_across_hosts_c_receiver() {
    let Some(c) = setup() else { return };
    across(
        &c,
        1,
        "mckey",
        "239.1.4.2",
        1,
        "mckey-c-joined",
        "mckey across hosts: C receiver",
    );
}
