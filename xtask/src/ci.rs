//! `cargo xtask ci`: the two tiers of CI.
//!
//! - `cargo xtask ci` runs `.ci/run`, the tier every change runs (CI runs that script on a
//!   fresh clone).
//! - `cargo xtask ci --full` runs `.ci/run` and then the second tier, what `.ci/run` leaves
//!   out: the four-VM DSM job, the criterion benches, the benchmark comparison's smoke, the
//!   interop pairings repeated 50 times, the DSM's wire decoders fuzzed for five minutes, and
//!   the single-node suite on a second kernel ([`SECOND_KERNEL`], installed by its first step
//!   where missing). Every step runs even when one before it failed; each
//!   step's output goes to the terminal and to its own log under `target/ci-full/`; the last
//!   line says how many steps passed, in how long.

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// The interop pairings that `--repeat N` runs N times each (the matrix's tests; the other
/// pairings of the examples run once whatever the count, so they are not repeated).
pub(crate) const REPEATED_PAIRINGS: &[&str] = &[
    "rc_rust_server_c_client",
    "rc_c_server_rust_client",
    "rc_rust_to_rust",
    "uc_rust_server_c_client",
    "uc_c_server_rust_client",
    "uc_rust_to_rust",
    "ud_rust_server_c_client",
    "ud_c_server_rust_client",
    "ud_rust_to_rust",
    "srq_rust_server_c_client",
    "srq_c_server_rust_client",
    "srq_rust_to_rust",
];

/// The second kernel the full tier runs the suite on: Debian 12 packages 6.12 beside its
/// default 6.1, and Soft-RoCE gained operations in between (RDMA atomic write and flush, 6.2).
pub(crate) const SECOND_KERNEL: &str = "6.12";

/// The tests the second-kernel run leaves out, each for a reason outside this workspace (they
/// run in the first tier, on the distribution's kernel):
///
/// - `mckey_rust_receiver_c_sender`: rdma-core's C `mckey` sender posts its datagrams
///   unsignaled and leaves the group and exits without waiting for them. Linux 6.12's
///   Soft-RoCE sends from a work queue, so the queue pair is often destroyed before they
///   leave: C to C loses them the same way (4 runs of 4 on 6.12; none lost on 6.1). Our
///   sender waits for its completions, and the other pairings pass there.
pub(crate) const SECOND_KERNEL_LEFT_OUT: &[&str] = &["mckey_rust_receiver_c_sender"];

/// `cargo xtask test` on the second kernel, without [`SECOND_KERNEL_LEFT_OUT`].
fn second_kernel_args() -> Vec<String> {
    let mut args = strings(&["test", "--no-doc", "--kernel", SECOND_KERNEL, "--"]);
    for name in SECOND_KERNEL_LEFT_OUT {
        args.extend(strings(&["--skip", name]));
    }
    args
}

/// How many times the second tier runs each repeated pairing.
const REPEATS: u32 = 50;

/// One step of the second tier: a name (also its log's), the `cargo xtask` arguments, and
/// the bound of each test binary when it is not the default (`RDMA_TEST_BINARY_TIMEOUT`).
struct Step {
    name: &'static str,
    args: Vec<String>,
    binary_timeout: Option<u64>,
}

/// The bound of one interop binary repeated: 3 pairings × 50 runs took about 600 s alone in the
/// VM and about 1.4 times that beside another binary; 900 s is too close.
const REPEAT_BINARY_TIMEOUT_S: u64 = 1800;

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// The second tier's steps, after `.ci/run`.
fn full_steps() -> Vec<Step> {
    let mut repeat = strings(&["test", "--no-doc", "--repeat"]);
    repeat.push(REPEATS.to_string());
    repeat.extend(strings(&["--", "--exact"]));
    repeat.extend(strings(REPEATED_PAIRINGS));
    vec![
        // Four VMs: a DSM job with one rank on each (the pairs' tests of `--nodes 2` spread 2-
        // and 4-rank jobs over two VMs); only this test, as the rest ran on two.
        Step {
            name: "nodes-4",
            args: strings(&[
                "test",
                "--nodes",
                "4",
                "--no-doc",
                "--",
                "multinode_dsm_one_rank_per_vm_of_the_whole_run",
            ]),
            binary_timeout: None,
        },
        // Briefly: they run on the device and check their data; no time is judged.
        Step {
            name: "criterion-benches",
            args: strings(&[
                "bench",
                "--",
                "--warm-up-time",
                "0.2",
                "--measurement-time",
                "0.5",
                "--sample-size",
                "10",
                "--nresamples",
                "1000",
                "--noplot",
            ]),
            binary_timeout: None,
        },
        // Rust lat/bw and C perftest at 64 bytes, and the instruction counts (200 rounds).
        Step {
            name: "bench-compare-smoke",
            args: strings(&["bench-compare", "--smoke"]),
            binary_timeout: None,
        },
        // The single-node suite on the second kernel (the doc tests, which do not depend on
        // it, ran in the first tier); its kernel is installed first where missing.
        Step {
            name: "second-kernel-setup",
            args: strings(&["setup", "--kernel", SECOND_KERNEL]),
            binary_timeout: None,
        },
        Step {
            name: "second-kernel",
            args: second_kernel_args(),
            binary_timeout: None,
        },
        // The DSM's wire decoders under libFuzzer, five minutes (cargo-fuzz installed first
        // where missing); the corpus it grows stays in examples/dsm/fuzz/corpus/.
        Step {
            name: "dsm-fuzz",
            args: strings(&["fuzz", "--seconds", "300"]),
            binary_timeout: None,
        },
        // The twelve pingpong pairings, 50 runs each: a teardown race shows up as a failure
        // in a repeat.
        Step {
            name: "interop-repeat",
            args: repeat,
            binary_timeout: Some(REPEAT_BINARY_TIMEOUT_S),
        },
    ]
}

pub(crate) fn run(root: &Path, args: &[String]) -> Result<(), String> {
    let full = match args {
        [] => false,
        [flag] if flag == "--full" => true,
        _ => return Err("usage: cargo xtask ci [--full]".to_string()),
    };
    if !full {
        let status = Command::new("bash")
            .arg(root.join(".ci").join("run"))
            .current_dir(root)
            .status()
            .map_err(|e| format!("running .ci/run: {e}"))?;
        return if status.success() {
            Ok(())
        } else {
            Err(format!(".ci/run failed ({status})"))
        };
    }
    let logs = root.join("target").join("ci-full");
    std::fs::create_dir_all(&logs).map_err(|e| format!("creating {}: {e}", logs.display()))?;
    let started = Instant::now();
    let xtask = |args: &[String]| {
        let mut command = Command::new(env!("CARGO"));
        command.arg("xtask").args(args);
        command
    };
    let mut results: Vec<(String, bool, f64)> = Vec::new();
    let mut tier_one = Command::new("bash");
    tier_one.arg(root.join(".ci").join("run"));
    results.push(run_step(root, &logs, "ci-run", tier_one)?);
    for step in full_steps() {
        let mut command = xtask(&step.args);
        if let Some(seconds) = step.binary_timeout {
            command.env("RDMA_TEST_BINARY_TIMEOUT", seconds.to_string());
        }
        results.push(run_step(root, &logs, step.name, command)?);
    }
    println!("\n=== ci --full: step timings (s)");
    for (name, ok, seconds) in &results {
        println!(
            "{seconds:6.0}  {name} ({})",
            if *ok { "passed" } else { "FAILED" }
        );
    }
    let passed = results.iter().filter(|(_, ok, _)| *ok).count();
    let failed: Vec<&str> = results
        .iter()
        .filter(|(_, ok, _)| !ok)
        .map(|(name, _, _)| name.as_str())
        .collect();
    println!(
        "ci --full: {passed} of {} steps passed in {:.0} s{} (logs: {})",
        results.len(),
        started.elapsed().as_secs_f64(),
        if failed.is_empty() {
            String::new()
        } else {
            format!("; FAILED: {}", failed.join(", "))
        },
        logs.display()
    );
    if failed.is_empty() {
        Ok(())
    } else {
        Err(String::new())
    }
}

/// Runs one step with its output on the terminal and in `logs/<name>.log`; returns its name,
/// whether it succeeded, and its seconds.
fn run_step(
    root: &Path,
    logs: &Path,
    name: &str,
    command: Command,
) -> Result<(String, bool, f64), String> {
    let log = logs.join(format!("{name}.log"));
    println!("\n=== ci --full: {name} (log: {})", log.display());
    let _ = std::io::stdout().flush();
    let started = Instant::now();
    // The step's standard output and error, merged, through `tee` into the log.
    let program = std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|a| super::harness::shell_quote(&a.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ");
    let mut shell = Command::new("bash");
    for (key, value) in command.get_envs() {
        if let Some(value) = value {
            shell.env(key, value);
        }
    }
    let status = shell
        .args(["-o", "pipefail", "-c"])
        .arg(format!(
            "{program} 2>&1 | tee {}",
            super::harness::shell_quote(&log.to_string_lossy())
        ))
        .current_dir(root)
        .status()
        .map_err(|e| format!("running step {name}: {e}"))?;
    Ok((
        name.to_string(),
        status.success(),
        started.elapsed().as_secs_f64(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_full_tier_repeats_exactly_the_twelve_pairings_fifty_times() {
        let steps = full_steps();
        let repeat = steps
            .iter()
            .find(|s| s.name == "interop-repeat")
            .expect("the repeat step");
        let args: Vec<&str> = repeat.args.iter().map(String::as_str).collect();
        assert_eq!(&args[..5], ["test", "--no-doc", "--repeat", "50", "--"]);
        assert_eq!(args[5], "--exact", "names match exactly, nothing else");
        assert_eq!(&args[6..], REPEATED_PAIRINGS);
        assert_eq!(REPEATED_PAIRINGS.len(), 12);
        let names: Vec<&str> = steps.iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            [
                "nodes-4",
                "criterion-benches",
                "bench-compare-smoke",
                "second-kernel-setup",
                "second-kernel",
                "dsm-fuzz",
                "interop-repeat"
            ]
        );
        let second = steps.iter().find(|s| s.name == "second-kernel").unwrap();
        assert_eq!(
            second.args,
            [
                "test",
                "--no-doc",
                "--kernel",
                SECOND_KERNEL,
                "--",
                "--skip",
                "mckey_rust_receiver_c_sender"
            ]
        );
    }
}
