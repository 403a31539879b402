//! The `lat` tool on the device: every test as server and client, at sizes that fit one packet
//! and sizes that need several, inline and not. The tool checks every byte that crossed the
//! wire after each timed loop, so runs whose patterns disagree (`--seed`) must fail with the
//! check's message; the report must have perftest's shape with statistics that agree with
//! each other.

#[path = "../../examples/tests/common/mod.rs"]
mod common;

use std::process::{Command, Output};
use std::time::Duration;

use common::{free_port, text};
use rdma_benches::stats::{LAT_HEADER, RULE, Row};
use rdma_test_support::TestDevice;

const LAT: &str = env!("CARGO_BIN_EXE_lat");
/// A generous bound on each process (the VM is emulated).
const BOUND: Duration = Duration::from_secs(120);

fn lat(device: &TestDevice, port: u16, args: &[&str]) -> Command {
    let mut cmd = Command::new(LAT);
    cmd.args(args)
        .args(["-d", &device.name])
        .args(["-x", &device.gid_index.to_string()])
        .args(["-p", &port.to_string()])
        .args(["--timeout", "20"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    cmd
}

/// Runs a server with `server_args` and a client with `client_args`; both outputs.
fn run(device: &TestDevice, server_args: &[&str], client_args: &[&str]) -> (Output, Output) {
    let port = free_port();
    let server = lat(device, port, server_args)
        .spawn()
        .expect("spawn server");
    common::await_listening(port, BOUND, "lat server");
    let client = lat(device, port, client_args)
        .arg("127.0.0.1")
        .spawn()
        .expect("spawn client");
    let client = common::finish_within(client, BOUND, "client");
    let server = common::finish_within(server, BOUND, "server");
    (server, client)
}

/// The report's result rows, after checking its frame: the rulers, the title, and the header
/// line right before the rows (when there are rows).
fn rows(out: &Output, title: &str) -> Vec<Row> {
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "lat failed: {}\n{stdout}",
        text(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.first(), Some(&RULE), "{stdout}");
    assert_eq!(lines.get(1).map(|l| l.trim()), Some(title), "{stdout}");
    assert_eq!(lines.last(), Some(&RULE), "{stdout}");
    let rows = Row::parse_all(&stdout);
    if !rows.is_empty() {
        let header = lines.iter().position(|l| *l == LAT_HEADER).expect("header");
        assert!(Row::parse(lines[header + 1]).is_some(), "{stdout}");
    }
    rows
}

/// One row of `size` bytes and `iters` iterations whose statistics are consistent.
fn assert_row(rows: &[Row], size: usize, iters: u32) {
    let [row] = rows else {
        panic!("expected one result row, got {rows:?}");
    };
    assert_eq!((row.size, row.iters), (size, iters));
    let l = row.latency;
    assert!(l.min > 0.0, "{l:?}");
    assert!(l.min <= l.typical && l.typical <= l.max, "{l:?}");
    assert!(l.min <= l.avg && l.avg <= l.max, "{l:?}");
    assert!(
        l.p99 <= l.p999 && l.p999 <= l.max && l.min <= l.p99,
        "{l:?}"
    );
    assert!(l.stdev >= 0.0 && l.stdev <= l.max - l.min, "{l:?}");
}

#[test]
fn every_test_reports_and_checks_its_data() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    // (test, title, size, extra flags): one packet and several (MTU 1024), inline and not.
    let cases: [(&str, &str, usize, &[&str]); 8] = [
        ("send", "Send Latency Test", 2, &[]),
        ("send", "Send Latency Test", 4096, &[]),
        ("send", "Send Latency Test", 64, &["-I", "64"]),
        ("write", "RDMA_Write Latency Test", 2, &[]),
        ("write", "RDMA_Write Latency Test", 4096, &[]),
        ("write", "RDMA_Write Latency Test", 64, &["-I", "64"]),
        ("read", "RDMA_Read Latency Test", 4096, &[]),
        ("atomic", "Atomic FETCH_AND_ADD Latency Test", 8, &[]),
    ];
    for (test, title, size, extra) in cases {
        let size_arg = size.to_string();
        let mut args = vec![test, "-n", "200", "-s", &size_arg];
        args.extend_from_slice(extra);
        let (server, client) = run(&device, &args, &args);
        let what = format!("{test} {size} {extra:?}");
        assert_row(&rows(&client, title), size, 200);
        let server_rows = rows(&server, title);
        if test == "send" || test == "write" {
            // Both sides of a ping-pong measure.
            assert_row(&server_rows, size, 200);
        } else {
            assert!(
                server_rows.is_empty(),
                "{what}: the server measured {server_rows:?}"
            );
        }
        common::note(&format!(
            "{what}: t_typical client {:.2} us",
            Row::parse_all(&text(&client.stdout))[0].latency.typical
        ));
    }
}

#[test]
fn data_that_disagrees_fails_the_check() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    // Patterns that disagree: the side that receives (both, for the ping-pongs) names the
    // first wrong byte.
    for test in ["send", "write", "read"] {
        let args = [test, "-n", "20", "-s", "300"];
        let mut other = args.to_vec();
        other.extend(["--seed", "7"]);
        let (server, client) = run(&device, &other, &args);
        let checker = if test == "read" { &client } else { &server };
        let stderr = text(&checker.stderr);
        assert!(!checker.status.success(), "{test}: the check passed");
        let first = if test == "send" {
            "lat: data check failed: the message received, 300 bytes: byte 0 is"
        } else if test == "write" {
            "lat: data check failed: the region the peer wrote, 300 bytes: byte 0 is"
        } else {
            "lat: data check failed: the last read, 300 bytes: byte 0 is"
        };
        assert!(stderr.starts_with(first), "{test}: {stderr}");
        assert!(!client.status.success() || test == "read" || !server.status.success());
    }
    // A server that expects fewer fetch-and-adds than the client makes sees the counter past
    // its count.
    let (server, _client) = run(&device, &["atomic", "-n", "10"], &["atomic", "-n", "25"]);
    assert!(!server.status.success());
    assert_eq!(
        text(&server.stderr).trim(),
        "lat: data check failed: the counter is 25 after 10 fetch-and-adds"
    );
}

#[test]
fn bad_input_is_refused_with_one_line() {
    for (args, want) in [
        (
            &["send", "-n", "4"][..],
            "lat: iterations must be at least 5",
        ),
        (
            &["atomic", "-s", "64"][..],
            "lat: atomic operations are 8 bytes: -s 8",
        ),
        (
            &["write", "-s", "0"][..],
            "lat: message size 0 is outside 1..=8388608",
        ),
        (
            &["read", "-s", "8388609"][..],
            "lat: message size 8388609 is outside 1..=8388608",
        ),
    ] {
        let out = Command::new(LAT).args(args).output().expect("run lat");
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(text(&out.stderr).trim(), want, "{args:?}");
        assert_eq!(
            text(&out.stdout),
            "",
            "{args:?}: nothing before the refusal"
        );
    }
}
