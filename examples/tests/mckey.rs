//! `mckey` against rdma-core's C `mckey` on the device, both directions and Rust to Rust:
//! identifiers join an IP multicast group over the connection manager, the sender's datagrams
//! reach every receiving queue pair (every completion checked by a Rust receiver: status,
//! opcode, immediate data equal to the source queue pair, length; every byte between two Rust
//! programs with `-V`), send-only joins, and each side's report lines exactly.

mod common;

use std::sync::mpsc::Receiver;
use std::time::Duration;

use common::{
    Side, assert_refused, finish_within, mckey_lines, show, spawn_line_buffered, spawn_reading,
};

const BOUND: Duration = Duration::from_secs(90);

fn program(side: Side) -> &'static str {
    side.program(env!("CARGO_BIN_EXE_mckey"), "mckey")
}

/// What `child` printed (its standard output read into `out`; `seen` the lines read from it
/// already), once it ended successfully.
fn collect(
    child: std::process::Child,
    mut seen: Vec<String>,
    out: Receiver<String>,
    what: &str,
) -> Vec<String> {
    let done = finish_within(child, BOUND, what);
    assert!(done.status.success(), "{what}: {}", show(&done));
    // The reader ends at the end of the output, which the exit closed.
    seen.extend(out.iter());
    seen
}

/// A receiver of `receiver` with `rx_conns` joins, then (once every join is reported) a
/// sender of `sender` with one: `count` datagrams of `size` bytes to `group`; both exits and
/// report lines checked. `extra_tx` goes to the sender (`-o`), and between two Rust programs
/// the receiver compares every byte (`-V`).
fn pair(
    receiver: Side,
    sender: Side,
    group: &str,
    rx_conns: usize,
    count: usize,
    size: usize,
    extra_tx: &[&str],
) {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let addr = device.addr.expect("the device's address").to_string();
    let what = format!(
        "mckey -m {group} -C {count} -S {size}: receiver {receiver:?} x{rx_conns}, sender {sender:?} {extra_tx:?}"
    );
    let (count_s, size_s, conns_s) = (count.to_string(), size.to_string(), rx_conns.to_string());
    let common = ["-m", group, "-b", &addr, "-C", &count_s, "-S", &size_s];
    let mut rx_args: Vec<&str> = common.to_vec();
    rx_args.extend(["-c", &conns_s]);
    if (receiver, sender) == (Side::Rust, Side::Rust) {
        rx_args.push("-V");
    }
    let (rx_child, rx_lines) = spawn_line_buffered(program(receiver), &rx_args);
    // The receiver's lines up to its joins (its receives are posted and its queue pairs
    // attached before it reports a join).
    let mut rx_seen = Vec::new();
    while rx_seen
        .iter()
        .filter(|l: &&String| l.ends_with(" mlid 0x0 sl 0"))
        .count()
        < rx_conns
    {
        let line = rx_lines.recv_timeout(BOUND).unwrap_or_else(|_| {
            panic!("{what}: the receiver reported {rx_seen:?} and no more joins")
        });
        rx_seen.push(line);
    }
    let mut tx_args: Vec<&str> = common.to_vec();
    tx_args.push("-s");
    tx_args.extend(extra_tx);
    let (tx_child, tx_lines) = spawn_reading(program(sender), &tx_args);
    let tx_report = collect(tx_child, Vec::new(), tx_lines, &format!("{what}: sender"));
    let rx_report = collect(rx_child, rx_seen, rx_lines, &format!("{what}: receiver"));
    assert_eq!(
        rx_report,
        mckey_lines(false, group, rx_conns),
        "{what}: the receiver's report"
    );
    assert_eq!(
        tx_report,
        mckey_lines(true, group, 1),
        "{what}: the sender's report"
    );
}

#[test]
fn mckey_c_receiver_rust_sender() {
    pair(Side::C, Side::Rust, "239.1.3.1", 1, 10, 100, &[]);
    pair(Side::C, Side::Rust, "239.1.3.2", 2, 20, 1000, &["-o"]);
}

#[test]
fn mckey_rust_receiver_c_sender() {
    pair(Side::Rust, Side::C, "239.1.3.3", 1, 10, 100, &[]);
    pair(Side::Rust, Side::C, "239.1.3.4", 2, 20, 1000, &["-o"]);
}

#[test]
fn mckey_rust_to_rust() {
    pair(Side::Rust, Side::Rust, "239.1.3.5", 1, 10, 100, &[]);
    pair(Side::Rust, Side::Rust, "239.1.3.6", 3, 30, 1024, &["-o"]);
}

/// An unmapped address, no loopback, another port space, a unicast address and a datagram
/// larger than the port's active MTU: one line and a failed exit each, within the bound.
#[test]
fn mckey_refuses_bad_input() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let addr = device.addr.expect("the device's address").to_string();
    let cases: [(&[&str], &str); 5] = [
        (&["-M", "ff12::1"], "mckey: -M: unmapped (AF_IB)"),
        (
            &["-m", "239.1.3.9", "-l"],
            "mckey: -l: blocking multicast loopback",
        ),
        (
            &["-m", "239.1.3.9", "-p", "0x2"],
            "mckey: port space 0x2: only 0x111 (UDP) is supported",
        ),
        (
            &["-m", "10.1.2.3", "-b", &addr],
            "mckey: 10.1.2.3: not a multicast address",
        ),
        (
            &["-m", "239.1.3.9", "-b", &addr, "-S", "4097"],
            "mckey: message_size 4097 is larger than active mtu",
        ),
    ];
    for (args, want) in cases {
        assert_refused(program(Side::Rust), args, want, BOUND);
    }
}
