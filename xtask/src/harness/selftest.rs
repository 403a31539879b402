//! `cargo xtask harness-selftest`: proves that the harness's verdict can fail.
//!
//! Builds the fixture crate `xtask/fixture` (a workspace of its own, so no workspace command
//! ever builds or runs it) and runs its three test binaries through the real harness path
//! ([`super::execute`]) in the VM, on two lanes at once (as the suite runs), with a short
//! watchdog limit of its own:
//!
//! - `verdict`: one test that passes (and checks the second device and `RDMA_TEST_REPEAT`),
//!   then planted failures: an `#[ignore]`d test, `unsupported` of a capability test-support
//!   cannot check, `unsupported` of one the device has, a justified `unsupported`, a test that
//!   aborts the process, and one that therefore never runs;
//! - `hang`: one test that passes, then one that never ends, so the watchdog must stop the VM;
//! - `after`: one test that passes, run by the lane `hang` does not hold, while `hang` hangs
//!   beside it (each binary's lines must reach its own verdict);
//! - `multinode` (a second part, on two nodes): one test that passes on both, one that fails on
//!   node 1 only, one during which node 1 aborts while node 0 waits at a barrier, one that
//!   therefore never runs on node 1.
//!
//! It succeeds only if the harness judged every planted case as expected, failed the run for
//! the watchdog, and left no process of the VM behind.

use std::path::Path;
use std::time::{Duration, Instant};

use super::verdict::{BinaryVerdict, Tally};
use super::{Place, Plan, build, execute, print_summary, process};

/// The watchdog's limit of the fixture's VM run, from its first test on (its boot aside):
/// `verdict` and `after` take a few seconds; `hang` holds its lane until the watchdog fires.
/// `RDMA_TEST_SELFTEST_TIMEOUT` overrides it.
const SELFTEST_TIMEOUT_S: u64 = 30;

/// What the harness must conclude about one fixture binary.
struct Expected {
    binary: &'static str,
    passed: usize,
    /// Each failed test and a phrase its reason must contain.
    failed: &'static [(&'static str, &'static str)],
    skipped: &'static [&'static str],
}

const EXPECTED: &[Expected] = &[
    Expected {
        binary: "fixture/verdict",
        passed: 1,
        failed: &[
            ("b_is_ignored", "ignored"),
            ("c_skips_a_capability_nobody_can_check", "FAILED"),
            ("c_skips_a_capability_the_device_has", "FAILED"),
            (
                "d_aborts",
                "never finished: the binary was killed by signal 6",
            ),
            ("e_never_runs", "did not run"),
        ],
        skipped: &["c_skips_what_the_device_lacks"],
    },
    Expected {
        binary: "fixture/hang",
        passed: 1,
        failed: &[("b_hangs", "never finished: the binary was still running")],
        skipped: &[],
    },
    Expected {
        binary: "fixture/after",
        passed: 1,
        failed: &[],
        skipped: &[],
    },
];

/// What the multi-node part must conclude about `fixture/multinode`, run on two nodes.
const MULTINODE: Expected = Expected {
    binary: "fixture/multinode",
    passed: 1,
    failed: &[
        // No panic in this reason: node 1's binary dies in the next test, before libtest
        // prints its failures section, where the panics are.
        ("b_fails_on_node_1_only", "node 1: FAILED"),
        // Node 0's reason carries its panic.
        (
            "c_node_1_dies_while_node_0_waits",
            "node 1's test binary ended (exit 134) while node 0 waited for barrier `never reached \
             by node 1` of node 1; node 1: started but never finished: the binary was killed by \
             signal 6",
        ),
        ("d_never_runs_on_node_1", "node 1: did not run"),
    ],
    skipped: &[],
};

/// Test-support's own records of the two refused `unsupported` calls: `(test, phrase)`.
const REFUSED: &[(&str, &str)] = &[
    (
        "verdict::c_skips_a_capability_nobody_can_check",
        "cannot check",
    ),
    (
        "verdict::c_skips_a_capability_the_device_has",
        "the device has",
    ),
];

pub(crate) fn run(root: &Path, args: &[String]) -> Result<(), String> {
    if let Some(arg) = args.first() {
        return Err(format!("harness-selftest takes no arguments (got `{arg}`)"));
    }
    let started = Instant::now();
    let fixture = root.join("xtask").join("fixture");
    let target = root.join("target").join("harness-fixture");
    let built = build::build_test_binaries(
        &fixture,
        &["--locked"],
        &[("CARGO_TARGET_DIR", &target.to_string_lossy())],
    )?;
    let multinode = built
        .iter()
        .find(|b| b.name == MULTINODE.binary)
        .cloned()
        .ok_or_else(|| format!("the fixture has no test binary {}", MULTINODE.binary))?;
    let mut device = Vec::new();
    for wanted in EXPECTED {
        let binary = built
            .iter()
            .find(|b| b.name == wanted.binary)
            .ok_or_else(|| format!("the fixture has no test binary {}", wanted.binary))?;
        device.push(binary.clone());
    }
    let timeout = Duration::from_secs(
        std::env::var("RDMA_TEST_SELFTEST_TIMEOUT")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(SELFTEST_TIMEOUT_S),
    );
    let plan = Plan {
        device,
        host: Vec::new(),
        doc: false,
        test_args: Vec::new(),
        repeat: Some(3),
        place: Place::Vm,
        timeout,
        lanes: 2,
    };
    println!(
        "harness-selftest: running the fixture's planted failures in the VM (watchdog: {} s)",
        timeout.as_secs()
    );
    let executed = execute(root, &plan)?;
    print_summary(&executed, started.elapsed());

    let mut wrong = Vec::new();
    let verdict = &executed.verdict;
    for wanted in EXPECTED {
        match verdict.binaries.iter().find(|b| b.name == wanted.binary) {
            Some(got) => check_binary(wanted, got, &mut wrong),
            None => wrong.push(format!("{}: no verdict", wanted.binary)),
        }
    }
    for (test, phrase) in REFUSED {
        if !executed
            .report
            .failures
            .iter()
            .any(|line| line.starts_with(test) && line.contains(phrase))
        {
            wrong.push(format!(
                "test-support recorded no refusal of {test} saying \"{phrase}\""
            ));
        }
    }
    let tally = verdict.tally(None);
    let want = Tally {
        passed: 3,
        failed: 6,
        skipped: 1,
    };
    if tally != want {
        wrong.push(format!(
            "counts: {}, expected {}",
            tally.line(),
            want.line()
        ));
    }
    let reasons = verdict.reasons();
    if !reasons.iter().any(|r| r.contains("watchdog stopped it")) {
        wrong.push(format!(
            "the run did not fail for the watchdog: {reasons:?}"
        ));
    }
    match executed.vms.first() {
        Some(vm) => {
            if vm.first_marker.is_none() {
                wrong.push("inconclusive: the VM reached no test".to_string());
            }
            if vm.timed_out.is_none() {
                wrong.push("the watchdog did not fire".to_string());
            }
            if !vm.survivors.is_empty() || process::group_alive(vm.leader) {
                wrong.push(format!(
                    "processes of the VM survived: {:?} (process group {})",
                    vm.survivors, vm.leader
                ));
            }
        }
        None => wrong.push("the fixture did not run in a VM".to_string()),
    }
    // Two VMs on two cores boot more slowly than one: a bound of its own.
    multinode_part(root, multinode, Duration::from_secs(300), &mut wrong)?;
    if wrong.is_empty() {
        println!(
            "harness-selftest: ok: the watchdog stopped the hung VM (process group {} gone), \
             the verdict caught every planted failure ({}), and the multi-node verdict caught a \
             test failing on one node and a node dying mid-test",
            executed.vms.first().map_or(0, |vm| vm.leader),
            tally.line()
        );
        Ok(())
    } else {
        Err(format!(
            "harness-selftest: the harness missed planted failures:\n  {}",
            wrong.join("\n  ")
        ))
    }
}

/// The multi-node part: `fixture/multinode` on two nodes. Node 1 fails one test and aborts in
/// the next while node 0 waits for it at a barrier: node 0 must fail that test because node
/// 1's binary ended (the harness's exit flag), not by waiting out its bound, and the merged
/// verdict must name each node's reason.
fn multinode_part(
    root: &Path,
    binary: super::build::TestBinary,
    timeout: Duration,
    wrong: &mut Vec<String>,
) -> Result<(), String> {
    let plan = Plan {
        device: vec![binary],
        host: Vec::new(),
        doc: false,
        test_args: Vec::new(),
        repeat: None,
        place: Place::Vm,
        timeout,
        lanes: 1,
    };
    println!("harness-selftest: running the planted multi-node failures on 2 nodes");
    let started = Instant::now();
    let executed = super::nodes::execute(root, &plan, 2)?;
    print_summary(&executed, started.elapsed());
    match executed
        .verdict
        .binaries
        .iter()
        .find(|b| b.name == MULTINODE.binary)
    {
        Some(got) => check_binary(&MULTINODE, got, wrong),
        None => wrong.push(format!("{}: no verdict", MULTINODE.binary)),
    }
    let node0 = executed.vms.first().map_or("", |vm| vm.log.as_str());
    if !node0.contains("node 1's test binary ended (exit 134)") {
        wrong.push(
            "node 0 did not fail c_node_1_dies_while_node_0_waits for node 1's exit flag"
                .to_string(),
        );
    }
    if executed.vms.len() != 2 || executed.vms.iter().any(|vm| vm.timed_out.is_some()) {
        wrong.push("the two nodes' VMs did not both finish".to_string());
    }
    Ok(())
}

fn check_binary(wanted: &Expected, got: &BinaryVerdict, wrong: &mut Vec<String>) {
    let name = wanted.binary;
    if got.passed != wanted.passed {
        wrong.push(format!(
            "{name}: {} passed, expected {}",
            got.passed, wanted.passed
        ));
    }
    let failed: Vec<&str> = got.failed.iter().map(|(test, _)| test.as_str()).collect();
    let want_failed: Vec<&str> = wanted.failed.iter().map(|(test, _)| *test).collect();
    if failed != want_failed {
        wrong.push(format!(
            "{name}: failed {failed:?}, expected {want_failed:?}"
        ));
    }
    for (test, phrase) in wanted.failed {
        if let Some((_, why)) = got.failed.iter().find(|(t, _)| t == test) {
            if !why.contains(phrase) {
                wrong.push(format!(
                    "{name}: {test} failed for \"{why}\", expected \"{phrase}\""
                ));
            }
        }
    }
    let skipped: Vec<&str> = got.skipped.iter().map(|(test, _)| test.as_str()).collect();
    if skipped != wanted.skipped {
        wrong.push(format!(
            "{name}: skipped {skipped:?}, expected {:?}",
            wanted.skipped
        ));
    }
}
