//! The `bw` tool on the device: SEND and WRITE message rate with post lists of 1, 8 and 32 and
//! a multi-packet size, the client posting with the `unsafe` calls or from slots (`--path
//! slot`, the safe path, no allocation in its loop either). The server checks that it received every message and one more message
//! (or write) byte for byte, so runs whose patterns disagree (`--seed`) must fail with the
//! check's message; the client's report must have perftest's shape with rates that agree with
//! each other.

#[path = "../../examples/tests/common/mod.rs"]
mod common;
mod tool;

use std::process::Output;

use common::text;
use rdma_benches::bw::{BW_HEADER, BW_HEADER_GBITS};
use rdma_test_support::TestDevice;

const BW: &str = env!("CARGO_BIN_EXE_bw");

fn run(device: &TestDevice, server_args: &[&str], client_args: &[&str]) -> (Output, Output) {
    tool::run(BW, device, server_args, client_args)
}

/// The client's one result row, after checking the report's frame: (size, iterations, peak,
/// average, message rate).
fn result(out: &Output, title: &str) -> (usize, u32, f64, f64, f64) {
    result_under(out, title, BW_HEADER)
}

/// As [`result`], under the header `expected` (MiB/s or Gb/s).
fn result_under(out: &Output, title: &str, expected: &str) -> (usize, u32, f64, f64, f64) {
    let lines = tool::report(out, title);
    let header = lines.iter().position(|l| l == expected).expect("header");
    let fields: Vec<&str> = lines[header + 1].split_whitespace().collect();
    let [size, iters, peak, average, rate] = fields[..] else {
        panic!("not a result row: {:?}", lines[header + 1]);
    };
    let number = |f: &str| f.parse::<f64>().expect("a number");
    (
        size.parse().expect("size"),
        iters.parse().expect("iterations"),
        number(peak),
        number(average),
        number(rate),
    )
}

#[test]
fn message_rate_with_post_lists_and_checked_data() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    // One case reports in Gb/s (`--report_gbits`); three post from slots (`--path slot`).
    let cases: [(&str, &str, &str, &str, bool, &str); 11] = [
        ("send", "Send BW Test", "64", "1", false, "unsafe"),
        ("send", "Send BW Test", "64", "8", false, "unsafe"),
        ("send", "Send BW Test", "64", "32", false, "unsafe"),
        ("send", "Send BW Test", "64", "32", false, "slot"),
        ("send", "Send BW Test", "4096", "8", false, "unsafe"),
        ("write", "RDMA_Write BW Test", "64", "1", false, "unsafe"),
        ("write", "RDMA_Write BW Test", "64", "32", false, "unsafe"),
        ("write", "RDMA_Write BW Test", "64", "32", false, "slot"),
        ("write", "RDMA_Write BW Test", "4096", "8", true, "unsafe"),
        ("read", "RDMA_Read BW Test", "4096", "8", false, "unsafe"),
        ("read", "RDMA_Read BW Test", "4096", "8", false, "slot"),
    ];
    for (test, title, size, list, gbits, path) in cases {
        let mut args = vec![
            test,
            "-s",
            size,
            "-n",
            "2048",
            "-l",
            list,
            "--timeout",
            "30",
            "--count-allocs",
        ];
        if gbits {
            args.push("--report_gbits");
        }
        let mut client_args = args.clone();
        client_args.extend(["--path", path]);
        let (server, client) = run(&device, &args, &client_args);
        let what = format!(
            "{test} -s {size} -l {list} --path {path}{}",
            if gbits { " --report_gbits" } else { "" }
        );
        // Neither the client's posting loop nor the server's receiving loop allocated.
        tool::assert_no_loop_allocations("bw", &client, &what);
        tool::assert_no_loop_allocations("bw", &server, &what);
        let header = if gbits { BW_HEADER_GBITS } else { BW_HEADER };
        let (got_size, iters, peak, average, rate) = result_under(&client, title, header);
        assert_eq!(
            (got_size.to_string().as_str(), iters),
            (size, 2048),
            "{what}"
        );
        assert!(rate > 0.0 && average > 0.0, "{what}");
        // The average is the message rate times the size (MiB/s, or Gb/s, against millions
        // per second).
        let unit = if gbits { 1e9 / 8.0 } else { 1_048_576.0 };
        let expected = rate * 1e6 * got_size as f64 / unit;
        assert!(
            (average - expected).abs() <= expected * 0.01 + 0.01,
            "{what}: average {average} against rate {rate}"
        );
        assert!(
            peak >= average * 0.99,
            "{what}: peak {peak} below average {average}"
        );
        // The server counted every message and checked the last one.
        assert!(server.status.success(), "{what}: {}", text(&server.stderr));
        assert!(
            !text(&server.stdout).contains(header),
            "{what}: the server does not measure"
        );
        let unit = if gbits { "Gb/s" } else { "MiB/s" };
        rdma_test_support::note(&format!("{what}: {rate:.4} Mpps, {average:.2} {unit}"));
    }
}

#[test]
fn duration_mode_counts_the_window() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    // (test, title, post list): 3 seconds, the middle one measured; no peak.
    for (test, title, list) in [
        ("send", "Send BW Test", "8"),
        ("send", "Send BW Test", "1"),
        ("write", "RDMA_Write BW Test", "32"),
    ] {
        let args = [
            test,
            "-s",
            "64",
            "-l",
            list,
            "-D",
            "3",
            "-f",
            "1",
            "--count-allocs",
        ];
        let (server, client) = run(&device, &args, &args);
        let what = format!("{test} -l {list} -D 3 -f 1");
        tool::assert_no_loop_allocations("bw", &client, &what);
        tool::assert_no_loop_allocations("bw", &server, &what);
        let mut measuring = vec![("client", &client)];
        if test == "send" {
            // perftest's send server reports in duration mode too.
            measuring.push(("server", &server));
        } else {
            assert!(!text(&server.stdout).contains(BW_HEADER), "{what}");
        }
        for (side, out) in measuring {
            let (size, iters, peak, average, rate) = result(out, title);
            assert_eq!(size, 64, "{what} {side}");
            assert!(iters > 0 && rate > 0.0, "{what} {side}");
            assert_eq!(peak, 0.0, "{what} {side}: perftest measures no peak here");
            let expected = rate * 1e6 * 64.0 / 1_048_576.0;
            assert!(
                (average - expected).abs() <= expected * 0.01 + 0.01,
                "{what} {side}: average {average} against rate {rate}"
            );
            // The window is the middle second (give or take a completion group).
            let window = f64::from(iters) / (rate * 1e6);
            assert!((0.5..2.0).contains(&window), "{what} {side}: {window} s");
            rdma_test_support::note(&format!("{what} {side}: {iters} messages, {rate:.4} Mpps"));
        }
    }
    // The server's checks run after a duration-mode run too.
    let args = ["send", "-s", "300", "-D", "2"];
    let mut other = args.to_vec();
    other.extend(["--seed", "9"]);
    let (server, _client) = run(&device, &other, &args);
    assert!(!server.status.success(), "the check passed");
    let stderr = text(&server.stderr);
    assert!(
        stderr.starts_with("bw: data check failed: the message received, 300 bytes: byte 0 is"),
        "{stderr}"
    );
}

#[test]
fn data_or_counts_that_disagree_fail() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    for (test, what) in [
        ("send", "the message received"),
        ("write", "the region the peer wrote"),
    ] {
        let args = [test, "-s", "300", "-n", "64"];
        let mut other = args.to_vec();
        other.extend(["--seed", "9"]);
        let (server, _client) = run(&device, &other, &args);
        let stderr = text(&server.stderr);
        assert!(!server.status.success(), "{test}: the check passed");
        let want = format!("bw: data check failed: {what}, 300 bytes: byte 0 is");
        assert!(stderr.starts_with(&want), "{test}: {stderr}");
    }
    // A server expecting more messages than the client sends waits in vain, within its bound.
    let (server, _client) = run(
        &device,
        &["send", "-s", "64", "-n", "128", "--timeout", "3"],
        &["send", "-s", "64", "-n", "64", "--timeout", "3"],
    );
    assert!(!server.status.success());
    assert_eq!(text(&server.stderr).trim(), "bw: no completion within 3 s");
}

#[test]
fn bad_input_is_refused_with_one_line() {
    for (args, want) in [
        (
            &["send", "-l", "32", "-n", "1000"][..],
            "bw: the iterations must be a multiple of the post list",
        ),
        (
            &["send", "-l", "32", "-n", "1024", "-Q", "5"][..],
            "bw: the post list must be a multiple of the completion moderation",
        ),
        (
            &["write", "-s", "0"][..],
            "bw: message size 0 is outside 1..=8388608",
        ),
        (
            &["send", "-n", "4"][..],
            "bw: iterations must be at least 5",
        ),
        (
            &["send", "-l", "256", "-n", "1024"][..],
            "bw: the post list must fit the send queue (-t)",
        ),
        (
            &["write", "-D", "2", "-f", "1"][..],
            "bw: the duration (2 s) must be longer than twice the margin (1 s)",
        ),
    ] {
        tool::assert_refused(BW, args, want);
    }
}
