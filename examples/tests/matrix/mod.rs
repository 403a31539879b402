//! The pingpong interop matrix on the device: each Rust program against rdma-core's C program
//! (both directions) and against itself.
//!
//! Both processes must exit 0, print their address lines and the two result lines, agree on
//! each other's queue pair numbers, and pass the data check: every run passes `-c` to both
//! sides. A Rust side with `-c` checks every byte of every message it receives and exits
//! non-zero on a mismatch; a C side checks one byte per page and only prints `invalid data in page N`, so no
//! output may contain `invalid data`.
//!
//! # Why these runs cover the options
//!
//! Each pairing (program × direction) runs a few configurations rather than the cross product
//! of every option; together they cover, in every direction:
//!
//! - `-c` always, on both sides (all four C programs have it);
//! - receive replenishment: `-r 4` with `-n` [`ITERS`] well above it (each slot is posted
//!   again as its echo completes, so the receives never run out), `-r 1` with `-e` for uc and
//!   ud (one receive posted: each must be posted again before the echo goes, or a message
//!   that no receive awaits is dropped) — and the default `-r 500`;
//! - path MTUs 2048 and 4096 (`-m`; rxe's active MTU is 1024 and, like the C program, the Rust
//!   one passes `-m` to the queue pair as given: rxe accepts up to its maximum MTU, 4096) for
//!   rc, uc and srq (`ibv_ud_pingpong` has no `-m`: a UD message fits the active MTU);
//! - odd sizes: 4095 (several packets at MTU 2048, the last one short), 1 (inline), UD 7 and
//!   1000; full-size messages of 4096 (UD: 1024, the active MTU);
//! - `-l 3` (service level), `-e` (completion events), for each program;
//! - `-q` for srq: 1, 2 and the default 16 queue pairs;
//! - `-N` (rc: sends through `ibv_wr_*`) against C's `-N` and Rust's.
//!
//! The matrix is split into one test binary per program (`interop_rc`, `interop_uc`,
//! `interop_ud`, `interop_srq`), so that 50 repeats of each stay within the harness's bound
//! of 900 s per binary.
//!
//! `cargo xtask test --repeat N` (`RDMA_TEST_REPEAT`) runs each pairing N times (at least once
//! per configuration): round `i` runs configuration `i % count`, so 50 repeats are 50 short runs
//! per pairing.

// Each test binary uses the configurations of its own program only.
#![allow(dead_code)]

use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use rdma_test_support::TestDevice;

/// Exchanges per run: well above the `-r 4` of the replenishment runs, short enough that 50
/// repeats of every pairing stay in the harness's time bound.
pub(crate) const ITERS: u32 = 60;
pub(crate) const DEADLINE: Duration = Duration::from_secs(60);

/// Each run gets its own TCP port, below the ephemeral range. The four interop binaries that
/// share this module run at the same time in the harness, so each has a range of its own
/// (1,800 runs before one repeats): 20000-21799 RC, then UC, UD and SRQ, up to 27199 (the
/// other examples' tests use 12471-14470, 17174-19173 and 27471-29470).
fn next_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let slot = match env!("CARGO_CRATE_NAME") {
        "interop_rc" => 0,
        "interop_uc" => 1,
        "interop_ud" => 2,
        _ => 3,
    };
    20000 + slot * 1800 + NEXT.fetch_add(1, Ordering::Relaxed) % 1800
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    Rust,
    C,
}

pub(crate) fn program(side: Side, name: &str) -> String {
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

/// One configuration: the message size and the options both sides get (besides `-d -i -g -p
/// -s -n -c`).
#[derive(Copy, Clone, Debug)]
pub(crate) struct Config {
    pub(crate) size: usize,
    pub(crate) args: &'static [&'static str],
}

const fn config(size: usize, args: &'static [&'static str]) -> Config {
    Config { size, args }
}

pub(crate) const RC: &[Config] = &[
    config(4095, &["-r", "4", "-m", "2048"]),
    config(4096, &["-m", "4096", "-l", "3", "-e"]),
    config(1, &["-r", "4", "-N"]),
    config(64, &["-N", "-e", "-m", "2048"]),
];

pub(crate) const UC: &[Config] = &[
    config(4095, &["-r", "4", "-m", "2048"]),
    config(4096, &["-m", "4096", "-l", "3", "-e"]),
    config(1, &["-r", "1", "-e"]),
];

pub(crate) const UD: &[Config] = &[
    config(7, &["-r", "4"]),
    config(1000, &["-l", "3", "-e"]),
    config(1024, &["-r", "1", "-e"]),
];

pub(crate) const SRQ: &[Config] = &[
    config(4095, &["-r", "4", "-q", "2", "-m", "2048"]),
    config(4096, &["-m", "4096", "-l", "3", "-e"]),
    config(1, &["-r", "4", "-q", "1"]),
];

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
        std::thread::sleep(Duration::from_millis(5));
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

/// The queue pair number of the `which` ("local" or "remote") address line.
pub(crate) fn qpn(stdout: &str, which: &str) -> u32 {
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{which} address:")))
        .unwrap_or_else(|| panic!("no {which} address line in:\n{stdout}"));
    let qpn = line.split("QPN 0x").nth(1).expect("QPN field");
    u32::from_str_radix(&qpn[..6], 16).expect("hex QPN")
}

/// Checks the two result lines: `N bytes in S seconds = M Mbit/sec`, `I iters in S seconds = U
/// usec/iter`.
pub(crate) fn check_results(stdout: &str, size: usize, what: &str) {
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

/// Runs `name` with `server` and `client` implementations in configuration `config`, and checks
/// both.
fn pair(device: &TestDevice, name: &str, server: Side, client: Side, config: Config) {
    let port = next_port();
    let common = |cmd: &mut Command| {
        cmd.args(["-d", &device.name])
            .args(["-i", &device.port.to_string()])
            .args(["-g", &device.gid_index.to_string()])
            .args(["-s", &config.size.to_string()])
            .args(["-n", &ITERS.to_string()])
            .args(["-p", &port.to_string()])
            .arg("-c")
            .args(config.args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
    };
    let what = format!(
        "{name} -s {} {} server {server:?} client {client:?}",
        config.size,
        config.args.join(" ")
    );
    let mut server_cmd = Command::new(program(server, name));
    common(&mut server_cmd);
    let server_child = server_cmd
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: start server: {e}"));
    let started = Instant::now();
    crate::common::await_listening(port, Duration::from_secs(20), &what);
    let mut client_cmd = Command::new(program(client, name));
    common(&mut client_cmd);
    client_cmd.arg("127.0.0.1");
    let client_child = client_cmd
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: start client: {e}"));
    let (server_out, client_out) = wait_both(server_child, client_child, &what);
    eprintln!("{what}: {:.2} s", started.elapsed().as_secs_f64());
    let show = |out: &Output| {
        format!(
            "({})\nstdout:\n{}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let failed = !server_out.status.success() || !client_out.status.success();
    let invalid = [&server_out, &client_out]
        .iter()
        .any(|out| String::from_utf8_lossy(&out.stdout).contains("invalid data"));
    assert!(
        !failed && !invalid,
        "{what} failed\nserver {}\nclient {}",
        show(&server_out),
        show(&client_out)
    );
    let server_stdout = String::from_utf8_lossy(&server_out.stdout);
    let client_stdout = String::from_utf8_lossy(&client_out.stdout);
    check_results(&server_stdout, config.size, &format!("{what}: server"));
    check_results(&client_stdout, config.size, &format!("{what}: client"));
    // srq_pingpong prints one address line per queue pair: the first ones pair up.
    assert_eq!(
        qpn(&server_stdout, "remote"),
        qpn(&client_stdout, "local"),
        "{what}: server saw another QPN"
    );
    assert_eq!(
        qpn(&client_stdout, "remote"),
        qpn(&server_stdout, "local"),
        "{what}: client saw another QPN"
    );
}

/// Runs a pairing `rdma_test_support::repeat()` times, at least once per configuration.
pub(crate) fn matrix(name: &str, server: Side, client: Side, configs: &[Config]) {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let rounds = rdma_test_support::repeat().max(configs.len());
    let started = Instant::now();
    for round in 0..rounds {
        let config = configs[round % configs.len()];
        pair(&device, name, server, client, config);
    }
    // Shown with --nocapture.
    eprintln!(
        "{name} server {server:?} client {client:?}: {rounds} runs of {} configurations passed \
         in {:.1} s",
        configs.len(),
        started.elapsed().as_secs_f64()
    );
}
