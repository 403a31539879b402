//! The `lat` tool on the device: every test as server and client, at sizes that fit one packet
//! and sizes that need several, inline and not. The tool checks every byte that crossed the
//! wire after each timed loop, so runs whose patterns disagree (`--seed`) must fail with the
//! check's message; the report must have perftest's shape with statistics that agree with
//! each other.

#[path = "../../examples/tests/common/mod.rs"]
mod common;
mod tool;

use std::process::Output;

use common::text;
use rdma_benches::stats::{LAT_DUR_HEADER, LAT_HEADER, Row};
use rdma_test_support::TestDevice;

const LAT: &str = env!("CARGO_BIN_EXE_lat");

fn run(device: &TestDevice, server_args: &[&str], client_args: &[&str]) -> (Output, Output) {
    tool::run(LAT, device, server_args, client_args)
}

/// The report's result rows, after checking its frame: the rulers, the title, and the header
/// line right before the rows (when there are rows).
fn rows(out: &Output, title: &str) -> Vec<Row> {
    let lines = tool::report(out, title);
    let rows: Vec<Row> = lines.iter().filter_map(|l| Row::parse(l)).collect();
    if !rows.is_empty() {
        let header = lines.iter().position(|l| l == LAT_HEADER).expect("header");
        assert!(Row::parse(&lines[header + 1]).is_some(), "{lines:?}");
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
        let mut args = vec![test, "-n", "200", "-s", &size_arg, "--count-allocs"];
        args.extend_from_slice(extra);
        let (server, client) = run(&device, &args, &args);
        let what = format!("{test} {size} {extra:?}");
        // Neither side's timed loop allocated.
        tool::assert_no_loop_allocations("lat", &client, &what);
        tool::assert_no_loop_allocations("lat", &server, &what);
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
        rdma_test_support::note(&format!(
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

/// The duration-mode row after checking the report's frame: (size, iterations, t_avg, tps).
fn duration_row(out: &Output, title: &str) -> (usize, u64, f64, f64) {
    let lines = tool::report(out, title);
    let header = lines
        .iter()
        .position(|l| l == LAT_DUR_HEADER)
        .unwrap_or_else(|| panic!("no duration header in {lines:?}"));
    let fields: Vec<&str> = lines[header + 1].split_whitespace().collect();
    let [size, iters, avg, tps] = fields[..] else {
        panic!("not a duration row: {:?}", lines[header + 1]);
    };
    (
        size.parse().expect("size"),
        iters.parse().expect("iterations"),
        avg.parse().expect("t_avg"),
        tps.parse().expect("tps"),
    )
}

#[test]
fn duration_mode_reports_the_mean_and_the_rate() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    // (test, title, size, round trip factor): 3 seconds, the middle one measured.
    let cases = [
        ("send", "Send Latency Test", 64, 2.0),
        ("write", "RDMA_Write Latency Test", 64, 2.0),
        ("read", "RDMA_Read Latency Test", 4096, 1.0),
        ("atomic", "Atomic FETCH_AND_ADD Latency Test", 8, 1.0),
    ];
    for (test, title, size, rtt) in cases {
        let size_arg = size.to_string();
        let args = [
            test,
            "-D",
            "3",
            "-f",
            "1",
            "-s",
            &size_arg,
            "--count-allocs",
        ];
        let (server, client) = run(&device, &args, &args);
        let what = format!("{test} -D 3 -f 1 -s {size}");
        tool::assert_no_loop_allocations("lat", &client, &what);
        tool::assert_no_loop_allocations("lat", &server, &what);
        let mut measuring = vec![&client];
        if test == "send" || test == "write" {
            measuring.push(&server);
        } else {
            assert!(
                !text(&server.stdout).contains(LAT_DUR_HEADER),
                "{what}: the server measured"
            );
        }
        for out in measuring {
            let (got_size, iters, avg, tps) = duration_row(out, title);
            assert_eq!(got_size, size, "{what}");
            assert!(iters > 0 && avg > 0.0 && tps > 0.0, "{what}");
            // The mean and the rate describe the same round trips: t_avg × factor µs each,
            // tps of them per second (t_avg is printed to 0.01 µs).
            let product = avg * rtt * tps / 1e6;
            assert!((product - 1.0).abs() < 0.01, "{what}: {avg} us x {tps}/s");
            // The measured window is the middle second (give or take an iteration; the
            // bounds only catch a window of the wrong phases).
            let window = iters as f64 / tps;
            assert!((0.5..2.0).contains(&window), "{what}: window {window} s");
            rdma_test_support::note(&format!(
                "{what}: {iters} round trips, t_avg {avg:.2} us, {tps:.0}/s"
            ));
        }
    }
    // The data checks run after a duration-mode loop too.
    let args = ["send", "-D", "2", "-s", "300"];
    let mut other = args.to_vec();
    other.extend(["--seed", "7"]);
    let (server, _client) = run(&device, &other, &args);
    assert!(!server.status.success(), "the check passed");
    let stderr = text(&server.stderr);
    assert!(
        stderr.starts_with("lat: data check failed: the message received, 300 bytes: byte 0 is"),
        "{stderr}"
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
        (
            &["send", "-D", "4", "-f", "2"][..],
            "lat: the duration (4 s) must be longer than twice the margin (2 s)",
        ),
        (
            &["send", "-D", "0"][..],
            "lat: the duration must be at least 1 second",
        ),
        (
            &["write", "-D", "2", "-a"][..],
            "lat: duration mode runs one size (-s), not all (-a)",
        ),
    ] {
        tool::assert_refused(LAT, args, want);
    }
}
