//! `cargo xtask test`: the Soft-RoCE test harness.
//!
//! 1. Builds every test of the workspace on the host (`cargo test --no-run`) and lists each
//!    test binary's tests there (`--list`, with the user's filter): the expected tests.
//! 2. Runs the doc tests and the compile-fail binaries on the host (they touch no device).
//! 3. Runs every other test binary on an RDMA device with `RDMA_TEST_REQUIRE_DEVICE=1`, so that
//!    a device test that cannot find a device, or skips a capability the device has, fails: on
//!    the host if it has an active port, otherwise inside a throwaway VM of the distribution
//!    kernel (virtme-ng, QEMU) where `rdma_rxe` makes two Soft-RoCE devices on guest-internal
//!    dummy interfaces. A watchdog stops the whole VM after `RDMA_TEST_TIMEOUT` seconds.
//! 4. Judges (see [`verdict`]): every expected test must have printed `ok`; a test that failed,
//!    was ignored, never finished or never ran counts as failed, and a justified skip counts as
//!    skipped. Prints each binary's results and the counts of device, host and doc tests, and
//!    last the line `N passed, N failed, N skipped`; the run is green only with 0 failed and 0
//!    skipped.

mod bench;
mod build;
mod criterion;
mod dsm_bench;
mod instructions;
mod kmsg;
mod nodes;
mod pingpong;
mod process;
mod schedule;
mod selftest;
mod verdict;
mod vm;

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use build::TestBinary;
use verdict::{DeviceReport, Exit, Kind, Output, Skips, Verdict};

pub(crate) use bench::bench_compare;
pub(crate) use build::build_benches;
pub(crate) use criterion::bench;
pub(crate) use dsm_bench::dsm_bench;
pub(crate) use instructions::instructions;
pub(crate) use kmsg::kernel_log;
pub(crate) use pingpong::pingpong;
pub(crate) use selftest::run as selftest;
pub(crate) use vm::{choose_kernel, find_kernel, find_vng, prefix_lines, shell_quote};

/// Test targets whose name ends so run on the host, not on the device: compile-fail tests,
/// which invoke the compiler (far too slow under the VM's software emulation), and `host`
/// targets (the DSM's `tcp` runs, which need no RDMA device); neither touches a device.
const HOST_ONLY_SUFFIXES: &[&str] = &["compile_fail", "/host"];

/// Whether a test binary runs on the host instead of the device: compile-fail targets, and the
/// unit tests inside `src/` of every library and program, which touch no device (their
/// structures, parsers and rules; the device tests are the integration test targets), and run
/// natively instead of under the VM's emulation. On a host without an RDMA device, a unit test
/// that tried to use one would fail.
fn runs_on_host(binary: &TestBinary) -> bool {
    binary.unit || HOST_ONLY_SUFFIXES.iter().any(|s| binary.name.ends_with(s))
}

/// The options of `cargo xtask test`, for error messages.
const OPTIONS: &str = "--vm, --host, --no-doc, --repeat N, --nodes N, --lanes N, --kernel VERSION, -- <test filter and libtest args>";

/// The most device binaries a VM may run at once.
const MAX_LANES: usize = 8;

#[derive(Default)]
struct Options {
    force_vm: bool,
    force_host: bool,
    skip_doc: bool,
    repeat: Option<u32>,
    /// `--nodes N`: the multi-node suite on N VMs.
    nodes: Option<usize>,
    /// `--lanes N`: device binaries the VM runs at once.
    lanes: Option<usize>,
    /// `--kernel VERSION`: the kernel the VMs boot (`6.12`), instead of the distribution's.
    kernel: Option<String>,
    test_args: Vec<String>,
}

/// Where the device tests run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// The host if it has an active RDMA port, else the VM.
    Auto,
    Vm,
    Host,
}

/// What to run.
pub(crate) struct Plan {
    /// Binaries that run on the device, in this order.
    pub(crate) device: Vec<TestBinary>,
    /// Binaries that run on the host (compile-fail tests).
    pub(crate) host: Vec<TestBinary>,
    /// Whether to run the workspace's doc tests.
    pub(crate) doc: bool,
    /// The user's filter and libtest arguments, for every binary.
    pub(crate) test_args: Vec<String>,
    /// `--repeat N`: exported as `RDMA_TEST_REPEAT`.
    pub(crate) repeat: Option<u32>,
    pub(crate) place: Place,
    /// The watchdog's limit for a VM run.
    pub(crate) timeout: Duration,
    /// How many device binaries the VM runs at once (those that must run alone aside).
    pub(crate) lanes: usize,
}

/// What running a plan produced.
pub(crate) struct Executed {
    pub(crate) verdict: Verdict,
    pub(crate) report: DeviceReport,
    /// Where the device tests ran, for the summary.
    pub(crate) place: String,
    pub(crate) doc_ran: bool,
    /// The VM runs: none on the host, one per node in the multi-node mode.
    pub(crate) vms: Vec<vm::VmRun>,
}

pub(crate) fn run(root: &Path, args: &[String]) -> Result<(), String> {
    let options = parse_options(args)?;
    if let Some(version) = &options.kernel {
        let kernel = vm::choose_kernel(version)?;
        println!(
            "harness: --kernel {version}: the VMs boot {}",
            kernel.display()
        );
    }
    let started = Instant::now();
    let (host, device): (Vec<TestBinary>, Vec<TestBinary>) = build::build_tests(root)?
        .into_iter()
        .partition(runs_on_host);
    let (multinode, device): (Vec<TestBinary>, Vec<TestBinary>) =
        device.into_iter().partition(nodes::is_multinode);
    if let Some(count) = options.nodes {
        println!(
            "harness: built {} multi-node test binaries, for {count} nodes",
            multinode.len()
        );
        let plan = Plan {
            device: multinode,
            host: Vec::new(),
            doc: false,
            test_args: options.test_args,
            repeat: options.repeat,
            place: Place::Vm,
            timeout: vm::timeout_from_env(),
            lanes: 1,
        };
        let executed = nodes::execute(root, &plan, count)?;
        print_summary(&executed, started.elapsed());
        return if executed.verdict.reasons().is_empty() {
            Ok(())
        } else {
            Err(String::new())
        };
    }
    let unknown = schedule::unknown_names(&device);
    if !unknown.is_empty() {
        return Err(format!(
            "xtask/src/harness/schedule.rs names binaries that were not built: {} (renamed? \
             a binary that must run alone would run beside another)",
            unknown.join(", ")
        ));
    }
    println!(
        "harness: built {} test binaries ({} run on the host: unit, compile-fail and `host` tests; {} \
         multi-node binaries are left for `--nodes N`)",
        device.len() + host.len(),
        host.len(),
        multinode.len()
    );
    let plan = Plan {
        device,
        host,
        doc: !options.skip_doc,
        test_args: options.test_args,
        repeat: options.repeat,
        place: if options.force_vm {
            Place::Vm
        } else if options.force_host {
            Place::Host
        } else {
            Place::Auto
        },
        timeout: vm::timeout_from_env(),
        lanes: options.lanes.unwrap_or(schedule::LANES),
    };
    let executed = execute(root, &plan)?;
    print_summary(&executed, started.elapsed());
    if executed.verdict.reasons().is_empty() {
        Ok(())
    } else {
        // The summary said why; the counts line must stay the last line printed.
        Err(String::new())
    }
}

fn parse_options(args: &[String]) -> Result<Options, String> {
    let mut options = Options::default();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--vm" => options.force_vm = true,
            "--host" => options.force_host = true,
            "--no-doc" => options.skip_doc = true,
            "--nodes" => {
                let count = rest
                    .next()
                    .and_then(|n| n.parse::<usize>().ok())
                    .filter(|n| (2..=nodes::MAX_NODES).contains(n) && n % 2 == 0)
                    .ok_or(format!(
                        "--nodes takes an even node count from 2 to {} (tests run on pairs \
                         of nodes)",
                        nodes::MAX_NODES
                    ))?;
                options.nodes = Some(count);
            }
            "--lanes" => {
                let count = rest
                    .next()
                    .and_then(|n| n.parse::<usize>().ok())
                    .filter(|n| (1..=MAX_LANES).contains(n))
                    .ok_or(format!("--lanes takes a count from 1 to {MAX_LANES}"))?;
                options.lanes = Some(count);
            }
            "--kernel" => {
                let version = rest
                    .next()
                    .filter(|v| !v.is_empty() && !v.starts_with('-'))
                    .ok_or("--kernel takes a kernel version (`6.12`)")?;
                options.kernel = Some(version.clone());
            }
            "--repeat" => {
                let count = rest
                    .next()
                    .and_then(|n| n.parse::<u32>().ok())
                    .filter(|&n| n > 0)
                    .ok_or("--repeat takes a count of at least 1")?;
                options.repeat = Some(count);
            }
            "--" => {
                options.test_args = rest.cloned().collect();
                break;
            }
            other => {
                return Err(format!(
                    "unknown option `{other}` (test options: {OPTIONS})"
                ));
            }
        }
    }
    if options.force_vm && options.force_host {
        return Err("--vm and --host exclude each other".to_string());
    }
    if options.nodes.is_some() && options.lanes.is_some() {
        return Err(
            "--lanes is for the single-node suite; the nodes run their binaries in step"
                .to_string(),
        );
    }
    if options.kernel.is_some() && options.force_host {
        return Err("--kernel chooses the VMs' kernel; --host runs none".to_string());
    }
    if options.nodes.is_some() && options.force_host {
        return Err(
            "--nodes runs VMs; on real hosts run the multi-node binaries on each host \
             (docs/test-harness.md)"
                .to_string(),
        );
    }
    Ok(options)
}

/// Runs a plan and judges it. An `Err` is a failure to start at all (no VM tooling); every
/// failure after the expected lists are known is part of the verdict.
pub(crate) fn execute(root: &Path, plan: &Plan) -> Result<Executed, String> {
    let mut verdict = Verdict::default();
    let expected = expected_lists(plan, &mut verdict);
    let count = |binaries: &[TestBinary]| -> usize {
        binaries
            .iter()
            .map(|b| expected[b.name.as_str()].len())
            .sum()
    };
    println!(
        "harness: expecting {} device tests and {} host tests (`--list` of each binary)",
        count(&plan.device),
        count(&plan.host)
    );
    let mut envs: Vec<(&str, String)> = Vec::new();
    if let Some(repeat) = plan.repeat {
        envs.push(("RDMA_TEST_REPEAT", repeat.to_string()));
    }
    if plan.doc {
        // A filtered run names the tests it wants; the compile-fail step belongs to full runs,
        // and then the doc-test run leaves the compile-fail cases to it (each compiled once).
        let compile_fail = plan.test_args.is_empty();
        let started = Instant::now();
        let (output, succeeded) = build::run_doc_tests(root, &plan.test_args, compile_fail)?;
        let mut judged = verdict::judge_doc("doc tests", &output, succeeded, 0);
        judged.seconds = Some(started.elapsed().as_secs_f64());
        verdict.binaries.push(judged);
        if compile_fail {
            let started = Instant::now();
            let (output, succeeded) = build::run_compile_fail(root)?;
            let mut judged =
                verdict::judge_doc("compile-fail (error codes)", &output, succeeded, 1);
            judged.seconds = Some(started.elapsed().as_secs_f64());
            verdict.binaries.push(judged);
        }
    }
    // Inside the harness nothing may return early: a unit test that would skip for a missing
    // kernel feature (the DSM's userfaultfd test) reads the same variable as the device tests.
    let mut host_envs = envs.clone();
    host_envs.push(("RDMA_TEST_REQUIRE_DEVICE", "1".to_string()));
    for binary in &plan.host {
        println!("harness: ==> {} (host)", binary.name);
        let started = Instant::now();
        let (text, exit) = run_on_host(binary, &plan.test_args, &host_envs)?;
        let mut judged = verdict::judge(
            &binary.name,
            Kind::Host,
            &expected[binary.name.as_str()],
            &verdict::parse_libtest(&text),
            exit,
            &Skips::new(),
        );
        judged.seconds = Some(started.elapsed().as_secs_f64());
        verdict.binaries.push(judged);
    }
    let work = run_dir(root)?;
    let report_path = work.join("report.txt");
    let _ = std::fs::remove_file(&report_path);

    let use_host =
        plan.place == Place::Host || (plan.place == Place::Auto && host_has_active_device());
    let mut outputs: BTreeMap<String, Output> = BTreeMap::new();
    let mut exits: BTreeMap<String, Exit> = BTreeMap::new();
    let mut times: BTreeMap<String, f64> = BTreeMap::new();
    let mut kernel: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut report_files = vec![report_path.clone()];
    let mut vms = Vec::new();
    let place = if plan.device.is_empty() {
        "no device binaries".to_string()
    } else if use_host {
        println!("harness: running the device tests on this host's RDMA device");
        let mut device_envs = envs.clone();
        device_envs.push(("RDMA_TEST_REQUIRE_DEVICE", "1".to_string()));
        device_envs.push((
            "RDMA_TEST_REPORT",
            report_path.to_string_lossy().into_owned(),
        ));
        let mut args = vec!["--test-threads=1".to_string()];
        args.extend(plan.test_args.iter().cloned());
        for binary in &plan.device {
            println!("harness: ==> {}", binary.name);
            let started = Instant::now();
            let (text, exit) = run_on_host(binary, &args, &device_envs)?;
            times.insert(binary.name.clone(), started.elapsed().as_secs_f64());
            outputs.insert(binary.name.clone(), verdict::parse_libtest(&text));
            exits.insert(binary.name.clone(), exit);
        }
        "the host's RDMA device".to_string()
    } else {
        let statuses_path = work.join("status.txt");
        let (alone, pooled) = schedule::split(&plan.device, plan.lanes);
        let schedule = vm::Schedule {
            alone: &alone,
            pooled: &pooled,
            lanes: plan.lanes,
        };
        for path in schedule
            .lane_files(&statuses_path)
            .iter()
            .chain(&schedule.lane_files(&report_path))
        {
            let _ = std::fs::remove_file(path);
        }
        report_files = schedule.lane_files(&report_path);
        let script = work.join("guest.sh");
        let text = vm::guest_script(
            &schedule,
            &report_path,
            &statuses_path,
            &plan.test_args,
            plan.repeat,
        );
        std::fs::write(&script, text).map_err(|e| format!("writing {}: {e}", script.display()))?;
        if pooled.is_empty() {
            println!("harness: {} device binaries, one at a time", alone.len());
        } else {
            println!(
                "harness: {} device binaries alone ({}), then {} on {} lanes at once",
                alone.len(),
                alone
                    .iter()
                    .map(|b| b.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                pooled.len(),
                plan.lanes
            );
        }
        let run = vm::boot_vm(root, &script, "guest: ==>", plan.timeout)?;
        verdict.problems.extend(run.problems());
        let results = verdict::GuestResults::read(&run.log, &schedule.lane_files(&statuses_path));
        for binary in &plan.device {
            outputs.insert(binary.name.clone(), results.output(&binary.name));
            exits.insert(binary.name.clone(), results.exit(&binary.name));
            if let Some(seconds) = results.seconds(&binary.name) {
                times.insert(binary.name.clone(), seconds);
            }
            kernel.insert(binary.name.clone(), results.kernel(&binary.name).to_vec());
        }
        let place = format!(
            "Soft-RoCE {} and {} in a QEMU VM of {}, boot to first test {:.1} s",
            vm::GUEST_DEVICE,
            vm::GUEST_DEVICE2,
            run.kernel.display(),
            run.first_marker.unwrap_or_default().as_secs_f64()
        );
        vms.push(run);
        place
    };
    let report = DeviceReport::parse(
        &report_files
            .iter()
            .map(|path| std::fs::read_to_string(path).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n"),
    );
    for binary in &plan.device {
        let mut judged = verdict::judge(
            &binary.name,
            Kind::Device,
            &expected[binary.name.as_str()],
            &outputs.remove(&binary.name).unwrap_or_default(),
            exits.get(&binary.name).copied().unwrap_or(Exit::NotStarted),
            &report.skips,
        );
        judged.seconds = times.get(&binary.name).copied();
        verdict::add_kernel_findings(
            &mut judged,
            kernel.get(&binary.name).map_or(&[], Vec::as_slice),
        );
        verdict.binaries.push(judged);
    }
    if report.ran.is_empty() && plan.test_args.is_empty() && !plan.device.is_empty() {
        verdict
            .problems
            .push("no device test found the device".to_string());
    }
    Ok(Executed {
        verdict,
        report,
        place,
        doc_ran: plan.doc,
        vms,
    })
}

/// Each binary's expected tests (`--list` with the user's filter); a failed list is a problem
/// of the run and leaves the binary expecting nothing.
fn expected_lists(plan: &Plan, verdict: &mut Verdict) -> BTreeMap<String, Vec<String>> {
    let mut expected = BTreeMap::new();
    for binary in plan.host.iter().chain(&plan.device) {
        let list = build::list_tests(binary, &plan.test_args).unwrap_or_else(|error| {
            verdict.problems.push(error);
            Vec::new()
        });
        expected.insert(binary.name.clone(), list);
    }
    expected
}

/// The run's own directory, `.rdma-test/<pid>/`, so that concurrent runs (several developers'
/// shells) do not share their report, status or rendezvous files.
fn run_dir(root: &Path) -> Result<std::path::PathBuf, String> {
    let work = root.join(".rdma-test").join(std::process::id().to_string());
    std::fs::create_dir_all(&work).map_err(|e| format!("creating {}: {e}", work.display()))?;
    Ok(work)
}

/// The exit of a process as a shell reports it: its code, or 128 + the signal that killed it.
fn shell_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1)
}

/// Runs one test binary on the host, bounded like in the guest (`timeout 900`), and returns
/// its standard output (also printed) and exit.
fn run_on_host(
    binary: &TestBinary,
    args: &[String],
    envs: &[(&str, String)],
) -> Result<(String, Exit), String> {
    let output = Command::new("timeout")
        .arg("--kill-after=10")
        .arg(vm::binary_timeout_from_env().to_string())
        .arg(&binary.path)
        .args(args)
        .current_dir(&binary.package_dir)
        // As cargo test would: the harness itself runs under `cargo run -p xtask`, whose
        // value would otherwise leak into the test (trybuild reads it).
        .env("CARGO_MANIFEST_DIR", &binary.package_dir)
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running {}: {e}", binary.path))?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    print!("{text}");
    Ok((text, Exit::Code(shell_code(output.status))))
}

/// Prints each binary's results, the counts per kind, the reasons, and last the counts line.
pub(crate) fn print_summary(executed: &Executed, elapsed: Duration) {
    let verdict = &executed.verdict;
    println!(
        "\nharness: summary ({}, {:.0} s in all)",
        executed.place,
        elapsed.as_secs_f64()
    );
    for binary in &verdict.binaries {
        let mut tally = verdict::Tally::default();
        tally.add(binary);
        if tally == verdict::Tally::default() {
            continue;
        }
        println!(
            "harness:   {}: {} ({}{})",
            binary.name,
            tally.line(),
            binary.exit.describe(),
            binary
                .seconds
                .map_or_else(String::new, |s| format!(", {s:.1} s"))
        );
        for (test, why) in &binary.failed {
            println!("harness:     FAILED {test}: {why}");
        }
        for (test, why) in &binary.skipped {
            println!("harness:     SKIPPED {test}: {why}");
        }
    }
    for line in &executed.report.failures {
        println!("harness:   test-support recorded: {line}");
    }
    let slowest_binaries = slowest(&verdict.binaries, SLOWEST);
    if !slowest_binaries.is_empty() {
        println!("harness: the {} slowest:", slowest_binaries.len());
        for (name, seconds) in slowest_binaries {
            println!("harness:   {seconds:8.1} s  {name}");
        }
    }
    let slowest_tests = slowest_tests(&verdict.binaries, SLOWEST);
    if !slowest_tests.is_empty() {
        println!("harness: the {} slowest tests:", slowest_tests.len());
        for (name, seconds) in slowest_tests {
            println!("harness:   {seconds:8.1} s  {name}");
        }
    }
    // Again, last, where a log cut in the middle (CI's record keeps the head and the tail)
    // still shows them.
    let failed: Vec<String> = verdict
        .binaries
        .iter()
        .flat_map(|b| {
            b.failed
                .iter()
                .map(move |(test, why)| format!("{}::{test}: {why}", b.name))
        })
        .collect();
    if !failed.is_empty() {
        println!("harness: the {} failed tests:", failed.len());
        for line in failed {
            println!("harness:   {line}");
        }
    }
    for kind in [Kind::Device, Kind::Host, Kind::Doc] {
        if kind == Kind::Doc && !executed.doc_ran {
            println!("harness: {}: not run (--no-doc, or --nodes)", kind.label());
            continue;
        }
        let binaries = verdict.binaries.iter().filter(|b| b.kind == kind).count();
        println!(
            "harness: {}: {} ({binaries} binaries)",
            kind.label(),
            verdict.tally(Some(kind)).line()
        );
    }
    let reasons = verdict.reasons();
    if reasons.is_empty() {
        println!("harness: ok");
    } else {
        println!("harness: FAILED: {}", reasons.join("; "));
    }
    println!("{}", verdict.tally(None).line());
}

/// How many of the slowest binaries the summary lists.
const SLOWEST: usize = 10;

/// The `count` binaries (doc-test steps included) that took longest, slowest first.
fn slowest(binaries: &[verdict::BinaryVerdict], count: usize) -> Vec<(&str, f64)> {
    let mut timed: Vec<(&str, f64)> = binaries
        .iter()
        .filter_map(|b| Some((b.name.as_str(), b.seconds?)))
        .collect();
    timed.sort_by(|a, b| b.1.total_cmp(&a.1));
    timed.truncate(count);
    timed
}

/// The `count` tests that took longest (`BINARY::TEST`), slowest first.
fn slowest_tests(binaries: &[verdict::BinaryVerdict], count: usize) -> Vec<(String, f64)> {
    let mut timed: Vec<(String, f64)> = binaries
        .iter()
        .flat_map(|b| {
            b.test_seconds
                .iter()
                .map(|(test, seconds)| (format!("{}::{test}", b.name), *seconds))
        })
        .collect();
    timed.sort_by(|a, b| b.1.total_cmp(&a.1));
    timed.truncate(count);
    timed
}

/// Whether any port of any RDMA device of this host is active.
pub(crate) fn host_has_active_device() -> bool {
    let Ok(devices) = std::fs::read_dir("/sys/class/infiniband") else {
        return false;
    };
    devices.flatten().any(|device| {
        std::fs::read_dir(device.path().join("ports")).is_ok_and(|ports| {
            ports.flatten().any(|port| {
                std::fs::read_to_string(port.path().join("state"))
                    .is_ok_and(|state| state.contains("ACTIVE"))
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn unit_compile_fail_and_host_targets_run_on_the_host_and_nothing_else() {
        let binary = |name: &str, unit: bool| TestBinary {
            name: name.to_string(),
            path: String::new(),
            package_dir: String::new(),
            unit,
        };
        assert!(runs_on_host(&binary("dsm/host", false)));
        assert!(runs_on_host(&binary("rdma-verbs/compile_fail", false)));
        assert!(runs_on_host(&binary("dsm", true)));
        for device in [
            "dsm/nodes",
            "dsm/multinode",
            "examples/ghost",
            "rdma-verbs/slot",
        ] {
            assert!(!runs_on_host(&binary(device, false)), "{device}");
        }
    }

    #[test]
    fn options_are_parsed() {
        let options = parse_options(&strings(&["--vm", "--repeat", "5", "--", "rc_", "--exact"]))
            .expect("valid options");
        assert_eq!(options.nodes, None);
        let nodes = parse_options(&strings(&["--nodes", "2"])).expect("--nodes");
        assert_eq!(nodes.nodes, Some(2));
        let nodes = parse_options(&strings(&["--nodes", "4"])).expect("--nodes 4");
        assert_eq!(nodes.nodes, Some(4));
        assert!(options.force_vm && !options.force_host && !options.skip_doc);
        assert_eq!(options.repeat, Some(5));
        assert_eq!(options.test_args, strings(&["rc_", "--exact"]));
        assert_eq!(parse_options(&[]).expect("no options").repeat, None);
        assert_eq!(
            parse_options(&strings(&["--lanes", "3"]))
                .expect("--lanes")
                .lanes,
            Some(3)
        );
        assert_eq!(
            parse_options(&strings(&["--kernel", "6.12", "--no-doc"]))
                .expect("--kernel")
                .kernel
                .as_deref(),
            Some("6.12")
        );
        assert!(vm::version_matches("6.12.115+deb12-amd64", "6.12"));
        assert!(vm::version_matches("6.12.115+deb12-amd64", "6.12.115"));
        assert!(vm::version_matches("6.1.0-56-amd64", "6.1"));
        assert!(!vm::version_matches("6.12.115+deb12-amd64", "6.1"));
        assert!(!vm::version_matches("6.1.0-56-amd64", "6.12"));
        for bad in [
            &["--repeat"][..],
            &["--repeat", "0"],
            &["--repeat", "x"],
            &["--vm", "--host"],
            &["--nodes"],
            &["--nodes", "1"],
            &["--nodes", "3"],
            &["--nodes", "6"],
            &["--nodes", "2", "--host"],
            &["--lanes", "0"],
            &["--lanes", "9"],
            &["--lanes"],
            &["--nodes", "2", "--lanes", "2"],
            &["--kernel"],
            &["--kernel", "--no-doc"],
            &["--kernel", "6.12", "--host"],
            &["--bogus"],
        ] {
            assert!(parse_options(&strings(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn signals_are_reported_as_a_shell_would() {
        assert_eq!(shell_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(shell_code(ExitStatus::from_raw(101 << 8)), 101);
        assert_eq!(shell_code(ExitStatus::from_raw(libc::SIGABRT)), 134);
    }
}
