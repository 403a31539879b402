//! Running a benchmark tool (`lat`, `bw`) as server and client on the device, and checking
//! the frame of its report.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use rdma_benches::stats::RULE;
use rdma_test_support::TestDevice;

use crate::common::{self, free_port, text};

/// A generous bound on each process (the VM is emulated).
pub(crate) const BOUND: Duration = Duration::from_secs(120);

/// `path` with `args` on `device`, TCP port `port`, output piped; a 20-second bound on its
/// waits unless `args` set one.
fn command(path: &str, device: &TestDevice, port: u16, args: &[&str]) -> Command {
    let mut cmd = Command::new(path);
    cmd.args(args)
        .args(["-d", &device.name])
        .args(["-x", &device.gid_index.to_string()])
        .args(["-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if !args.contains(&"--timeout") {
        cmd.args(["--timeout", "20"]);
    }
    cmd
}

/// Runs `path` as a server with `server_args` and as a client with `client_args`; both
/// outputs (server first).
pub(crate) fn run(
    path: &str,
    device: &TestDevice,
    server_args: &[&str],
    client_args: &[&str],
) -> (Output, Output) {
    let port = free_port();
    common::run_server_client(
        &mut command(path, device, port, server_args),
        command(path, device, port, client_args).arg("127.0.0.1"),
        port,
        BOUND,
    )
}

/// The report's lines, after checking that the tool succeeded and that the report starts
/// with the ruler and `title` and ends with the ruler.
pub(crate) fn report(out: &Output, title: &str) -> Vec<String> {
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "failed: {}\n{stdout}",
        text(&out.stderr)
    );
    let lines: Vec<String> = stdout.lines().map(str::to_string).collect();
    assert_eq!(lines.first().map(String::as_str), Some(RULE), "{stdout}");
    assert_eq!(lines.get(1).map(|l| l.trim()), Some(title), "{stdout}");
    assert_eq!(lines.last().map(String::as_str), Some(RULE), "{stdout}");
    lines
}

/// Checks the `--count-allocs` line of `tool`'s stderr: no allocation in the timed loops, and
/// a live counter (the program as a whole allocated).
pub(crate) fn assert_no_loop_allocations(tool: &str, out: &Output, what: &str) {
    let stderr = text(&out.stderr);
    let prefix = format!("{tool}: 0 allocations in the timed loops, ");
    let line = stderr
        .lines()
        .find(|l| {
            l.starts_with(&format!("{tool}: ")) && l.contains(" allocations in the timed loops, ")
        })
        .unwrap_or_else(|| panic!("{what}: no allocation count in {stderr:?}"));
    let total: u64 = line
        .strip_prefix(&prefix)
        .and_then(|rest| rest.strip_suffix(" in all"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{what}: the timed loops allocated: {line:?}"));
    assert!(total > 0, "{what}: the counter is not live: {line:?}");
}

/// Runs `path` with `args` on the host and checks that it refused them: exit status 1,
/// `want` as its one line on stderr, nothing on stdout.
pub(crate) fn assert_refused(path: &str, args: &[&str], want: &str) {
    let out = Command::new(path)
        .args(args)
        .output()
        .expect("run the tool");
    assert_eq!(out.status.code(), Some(1), "{args:?}");
    assert_eq!(text(&out.stderr).trim(), want, "{args:?}");
    assert_eq!(
        text(&out.stdout),
        "",
        "{args:?}: nothing before the refusal"
    );
}
