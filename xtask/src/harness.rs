//! `cargo xtask test`: the Soft-RoCE test harness.
//!
//! 1. Builds every test of the workspace on the host (`cargo test --no-run`) and runs the doc
//!    tests there (they compile examples; none touches a device).
//! 2. Runs every test binary on an RDMA device with `RDMA_TEST_REQUIRE_DEVICE=1`, so that a
//!    device test that cannot find a device fails instead of skipping: on the host if it has an
//!    active port, otherwise inside a throwaway VM of the distribution kernel (virtme-ng, QEMU)
//!    where `rdma_rxe` makes a Soft-RoCE device on a guest-internal dummy interface.
//! 3. Reads the device tests' report file and the test binaries' result lines, prints a summary
//!    and fails if any test failed, any device test skipped, or no device test ran.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// What running the test binaries produced.
struct SuiteRun {
    /// Their standard output, for the libtest result lines.
    log: String,
    /// Each binary's name and whether it exited 0.
    statuses: Vec<(String, bool)>,
    /// Where they ran, for the summary.
    place: String,
}

/// One test executable cargo built, and the package directory it runs in.
struct TestBinary {
    name: String,
    path: String,
    package_dir: String,
}

#[derive(Default)]
struct Options {
    force_vm: bool,
    force_host: bool,
    skip_doc: bool,
    test_args: Vec<String>,
}

/// Test targets whose name ends so run on the host, not on the device: compile-fail tests,
/// which invoke the compiler (far too slow under the VM's software emulation) and touch no
/// device.
const HOST_ONLY_SUFFIX: &str = "compile_fail";

/// The address of the guest-internal dummy interface the rxe device sits on.
const GUEST_ADDR: &str = "169.254.7.1";
const GUEST_DEVICE: &str = "rxe0";

pub(crate) fn run(root: &Path, args: &[String]) -> Result<(), String> {
    let options = parse_options(args)?;
    let started = Instant::now();
    let (host_only, binaries): (Vec<TestBinary>, Vec<TestBinary>) = build_tests(root)?
        .into_iter()
        .partition(|b| b.name.ends_with(HOST_ONLY_SUFFIX));
    println!(
        "harness: built {} test binaries ({} run on the host)",
        binaries.len() + host_only.len(),
        host_only.len()
    );
    let mut totals = Totals::default();
    if !options.skip_doc {
        let output = run_doc_tests(root)?;
        totals.add_results(&output);
    }
    let mut host_failures = Vec::new();
    for binary in &host_only {
        println!("harness: ==> {} (host)", binary.name);
        let output = Command::new(&binary.path)
            .current_dir(&binary.package_dir)
            // As cargo test would: the harness itself runs under `cargo run -p xtask`, whose
            // value would otherwise leak into the test (trybuild reads it).
            .env("CARGO_MANIFEST_DIR", &binary.package_dir)
            .args(&options.test_args)
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("running {}: {e}", binary.path))?;
        let text = String::from_utf8_lossy(&output.stdout);
        print!("{text}");
        totals.add_results(&text);
        if !output.status.success() {
            host_failures.push(binary.name.clone());
        }
    }
    // One directory per run, so that concurrent runs (several developers' shells) do not share
    // their report or status files.
    let work = root.join(".rdma-test").join(std::process::id().to_string());
    std::fs::create_dir_all(&work).map_err(|e| format!("creating {}: {e}", work.display()))?;
    let report = work.join("report.txt");
    let _ = std::fs::remove_file(&report);

    let use_host = options.force_host || (!options.force_vm && host_has_active_device());
    let SuiteRun {
        log,
        statuses,
        place,
    } = if use_host {
        run_on_host(&binaries, &report, &options.test_args)?
    } else {
        run_in_vm(root, &work, &binaries, &report, &options.test_args)?
    };
    totals.add_results(&log);
    let outcome = DeviceReport::read(&report);
    println!(
        "\nharness: summary ({place}, {:.0} s in all)",
        started.elapsed().as_secs_f64()
    );
    let failed_binaries: Vec<&String> = statuses
        .iter()
        .filter(|(_, ok)| !ok)
        .map(|(name, _)| name)
        .chain(&host_failures)
        .collect();
    println!(
        "harness: device tests: {} ran, {} skipped, {} failed to find a device, {} unsupported by the device",
        outcome.ran.len(),
        outcome.skipped.len(),
        outcome.no_device.len(),
        outcome.unsupported.len()
    );
    for line in &outcome.unsupported {
        println!("harness:   unsupported: {line}");
    }
    for line in outcome.skipped.iter().chain(&outcome.no_device) {
        println!("harness:   skipped: {line}");
    }
    for name in &failed_binaries {
        println!("harness:   failed: {name}");
    }
    println!(
        "{} passed, {} failed, {} skipped",
        totals.passed,
        totals.failed,
        outcome.skipped.len() + outcome.no_device.len() + totals.ignored
    );
    let mut problems = Vec::new();
    if totals.failed > 0 || !failed_binaries.is_empty() {
        problems.push(format!(
            "{} tests failed in {} binaries",
            totals.failed,
            failed_binaries.len()
        ));
    }
    if !outcome.skipped.is_empty() || !outcome.no_device.is_empty() {
        problems.push("device tests were skipped".to_string());
    }
    if outcome.ran.is_empty() && options.test_args.is_empty() {
        problems.push("no device test ran".to_string());
    }
    if statuses.len() != binaries.len() {
        problems.push(format!(
            "only {} of {} test binaries ran",
            statuses.len(),
            binaries.len()
        ));
    }
    if problems.is_empty() {
        println!("harness: ok");
        Ok(())
    } else {
        Err(problems.join("; "))
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
            "--" => {
                options.test_args = rest.cloned().collect();
                break;
            }
            other => {
                return Err(format!(
                    "unknown option `{other}` (test options: --vm, --host, --no-doc, -- <test filter and libtest args>)"
                ));
            }
        }
    }
    if options.force_vm && options.force_host {
        return Err("--vm and --host exclude each other".to_string());
    }
    Ok(options)
}

/// Builds all test targets and returns their executables.
fn build_tests(root: &Path) -> Result<Vec<TestBinary>, String> {
    let output = Command::new(env!("CARGO"))
        .current_dir(root)
        .args([
            "test",
            "--workspace",
            "--exclude",
            "xtask",
            "--all-targets",
            "--all-features",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !output.status.success() {
        return Err("building the tests failed".to_string());
    }
    let mut binaries = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        if !line.contains("\"reason\":\"compiler-artifact\"") || !profile_is_test(line) {
            continue;
        }
        let (Some(path), Some(manifest), Some(name)) = (
            json_string(line, "executable"),
            json_string(line, "manifest_path"),
            json_string(line, "name"),
        ) else {
            continue;
        };
        let package_dir = Path::new(&manifest)
            .parent()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let package = Path::new(&package_dir)
            .file_name()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        binaries.push(TestBinary {
            name: format!("{package}/{name}"),
            path,
            package_dir,
        });
    }
    binaries.sort_by(|a, b| a.name.cmp(&b.name));
    binaries.dedup_by(|a, b| a.path == b.path);
    if binaries.is_empty() {
        return Err("cargo built no test binaries".to_string());
    }
    Ok(binaries)
}

/// Whether an artifact line was built by the test profile (a test harness), as opposed to, say,
/// a binary built for integration tests: its `"profile"` object says `"test":true`. (The
/// `"target"` object has a `"test"` field of its own, meaning something else.)
fn profile_is_test(line: &str) -> bool {
    let Some(start) = line.find("\"profile\":{") else {
        return false;
    };
    let profile = &line[start..];
    let end = profile.find('}').unwrap_or(profile.len());
    profile[..end].contains("\"test\":true")
}

/// The value of the first `"key":"value"` string field of a line of cargo's JSON output.
fn json_string(line: &str, key: &str) -> Option<String> {
    let start = line.find(&format!("\"{key}\":\""))? + key.len() + 4;
    let mut value = String::new();
    let mut chars = line[start..].chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(value),
            '\\' => match chars.next()? {
                'n' => value.push('\n'),
                't' => value.push('\t'),
                other => value.push(other),
            },
            c => value.push(c),
        }
    }
    None
}

fn run_doc_tests(root: &Path) -> Result<String, String> {
    println!("harness: doc tests (host)");
    let output = Command::new(env!("CARGO"))
        .current_dir(root)
        .args([
            "test",
            "--workspace",
            "--exclude",
            "xtask",
            "--all-features",
            "--doc",
        ])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running cargo: {e}"))?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    print!("{text}");
    if !output.status.success() {
        return Err("doc tests failed".to_string());
    }
    Ok(text)
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

fn run_on_host(
    binaries: &[TestBinary],
    report: &Path,
    test_args: &[String],
) -> Result<SuiteRun, String> {
    println!("harness: running the suite on this host's RDMA device");
    let mut log = String::new();
    let mut statuses = Vec::new();
    for binary in binaries {
        println!("harness: ==> {}", binary.name);
        let output = Command::new(&binary.path)
            .current_dir(&binary.package_dir)
            .env("CARGO_MANIFEST_DIR", &binary.package_dir)
            .arg("--test-threads=1")
            .args(test_args)
            .env("RDMA_TEST_REQUIRE_DEVICE", "1")
            .env("RDMA_TEST_REPORT", report)
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("running {}: {e}", binary.path))?;
        let text = String::from_utf8_lossy(&output.stdout);
        print!("{text}");
        log.push_str(&text);
        statuses.push((binary.name.clone(), output.status.success()));
    }
    Ok(SuiteRun {
        log,
        statuses,
        place: "the host's RDMA device".to_string(),
    })
}

/// Finds `vng` on PATH or in Python's script directory.
pub(crate) fn find_vng() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("vng"))
            .find(|candidate| candidate.is_file())
    });
    on_path.or_else(|| {
        let output = Command::new("python3")
            .args([
                "-c",
                "import sysconfig; print(sysconfig.get_path('scripts'))",
            ])
            .output()
            .ok()?;
        let dir = String::from_utf8_lossy(&output.stdout).trim().to_string();
        let candidate = Path::new(&dir).join("vng");
        candidate.is_file().then_some(candidate)
    })
}

/// The kernel to boot: `RDMA_TEST_KERNEL`, else the newest `/boot/vmlinuz-*` whose modules
/// include `rdma_rxe`.
pub(crate) fn find_kernel() -> Result<PathBuf, String> {
    if let Some(kernel) = std::env::var_os("RDMA_TEST_KERNEL") {
        return Ok(PathBuf::from(kernel));
    }
    let mut kernels: Vec<(String, PathBuf)> = std::fs::read_dir("/boot")
        .map_err(|e| format!("reading /boot: {e}"))?
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let version = name.strip_prefix("vmlinuz-")?.to_string();
            let rxe = Path::new("/lib/modules")
                .join(&version)
                .join("kernel/drivers/infiniband/sw/rxe");
            rxe.is_dir().then(|| (version, entry.path()))
        })
        .collect();
    kernels.sort();
    kernels.pop().map(|(_, path)| path).ok_or_else(|| {
        "no kernel with the rdma_rxe module in /boot; run `cargo xtask setup` \
         (Debian package linux-image-amd64)"
            .to_string()
    })
}

/// What a VM run produced.
struct VmRun {
    /// The guest's standard output.
    log: String,
    /// Time from starting the VM to the first line starting with the marker.
    first_marker: Option<Duration>,
    /// The kernel it booted.
    kernel: PathBuf,
}

/// Boots the VM, runs `script` (a path inside the workspace) in it, streams its output, and
/// stops it after `RDMA_TEST_TIMEOUT` seconds (1500 by default).
fn boot_vm(root: &Path, script: &Path, marker: &str) -> Result<VmRun, String> {
    let vng = find_vng().ok_or(
        "this host has no active RDMA device and `vng` (virtme-ng) is not installed; \
         run `cargo xtask setup`",
    )?;
    let kernel = find_kernel()?;
    println!(
        "harness: no RDMA device on this host; booting {} under QEMU with a Soft-RoCE device",
        kernel.display()
    );
    let mut command = Command::new(&vng);
    command.current_dir(root).arg("--run").arg(&kernel).args([
        "--force-9p",
        "--cpus",
        "2",
        "--memory",
        "4G",
    ]);
    // KVM failed on these machines (QEMU dies setting an MSR); software emulation is the default.
    if std::env::var("RDMA_TEST_VM_KVM").as_deref() != Ok("1") {
        command.arg("--disable-kvm");
    }
    command
        .arg("--rwdir")
        .arg(root)
        .arg("--cwd")
        .arg(root)
        .arg("--exec")
        .arg(format!("sh {}", script.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = command
        .spawn()
        .map_err(|e| format!("starting {}: {e}", vng.display()))?;
    let stderr = child.stderr.take();
    let stderr_thread = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(stderr) = stderr {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("{line}");
                text.push_str(&line);
                text.push('\n');
            }
        }
        text
    });
    let timeout = Duration::from_secs(
        std::env::var("RDMA_TEST_TIMEOUT")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1500),
    );
    let child_id = child.id();
    let watchdog = std::thread::spawn(move || {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(500));
            // Ends when the VM is gone: signal 0 probes whether the process still exists.
            let alive = Command::new("kill")
                .args(["-0", &child_id.to_string()])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !alive {
                return false;
            }
        }
        let _ = Command::new("kill").arg(child_id.to_string()).status();
        true
    });
    let mut log = String::new();
    let mut first_marker: Option<Duration> = None;
    if let Some(stdout) = child.stdout.take() {
        let mut out = std::io::stdout().lock();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if first_marker.is_none() && line.starts_with(marker) {
                first_marker = Some(started.elapsed());
                let _ = writeln!(
                    out,
                    "harness: VM boot to first test: {:.1} s",
                    started.elapsed().as_secs_f64()
                );
            }
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
            log.push_str(&line);
            log.push('\n');
        }
    }
    let status: ExitStatus = child.wait().map_err(|e| format!("waiting for vng: {e}"))?;
    let timed_out = watchdog.join().unwrap_or(false);
    let stderr_text = stderr_thread.join().unwrap_or_default();
    if timed_out {
        return Err(format!(
            "the VM did not finish within {} s (RDMA_TEST_TIMEOUT) and was stopped",
            timeout.as_secs()
        ));
    }
    if first_marker.is_none() {
        let hint = stderr_text
            .lines()
            .chain(log.lines())
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no output");
        return Err(format!(
            "the VM ran nothing ({status}); last output: {hint}"
        ));
    }
    Ok(VmRun {
        log,
        first_marker,
        kernel,
    })
}

fn run_in_vm(
    root: &Path,
    work: &Path,
    binaries: &[TestBinary],
    report: &Path,
    test_args: &[String],
) -> Result<SuiteRun, String> {
    let statuses_file = work.join("status.txt");
    let _ = std::fs::remove_file(&statuses_file);
    let script = work.join("guest.sh");
    std::fs::write(
        &script,
        guest_script(binaries, report, &statuses_file, test_args),
    )
    .map_err(|e| format!("writing {}: {e}", script.display()))?;
    let run = boot_vm(root, &script, "guest: ==>")?;
    let place = format!(
        "Soft-RoCE {GUEST_DEVICE} in a QEMU VM of {}, boot to first test {:.1} s",
        run.kernel.display(),
        run.first_marker.unwrap_or_default().as_secs_f64()
    );
    Ok(SuiteRun {
        log: run.log,
        statuses: read_statuses(&statuses_file),
        place,
    })
}

/// The start of every guest script: load rdma_rxe, put an rxe device on a dummy interface and
/// wait until its port is active.
fn guest_prelude() -> String {
    format!(
        r#"#!/bin/sh
# Written by `cargo xtask`; runs inside the throwaway VM.
exec 2>&1
fail() {{ echo "guest: $*"; exit 90; }}
modprobe rdma_rxe || fail "modprobe rdma_rxe failed"
ip link set lo up
ip link add d0 type dummy || fail "cannot add the dummy interface"
ip link set d0 up
ip addr add {GUEST_ADDR}/24 dev d0
rdma link add {GUEST_DEVICE} type rxe netdev d0 || fail "rdma link add failed"
sysctl -qw net.ipv4.conf.all.accept_local=1
ulimit -l unlimited
i=0
until ibv_devinfo -d {GUEST_DEVICE} 2>/dev/null | grep -q PORT_ACTIVE; do
    i=$((i+1)); [ $i -gt 100 ] && fail "{GUEST_DEVICE} port never became active"
    sleep 0.1
done
export PATH="$PATH:$HOME/.cargo/bin"
echo "guest: {GUEST_DEVICE} on d0 ({GUEST_ADDR}) is active"
"#
    )
}

/// The script the guest runs: make the rxe device, then run every test binary in turn.
fn guest_script(
    binaries: &[TestBinary],
    report: &Path,
    statuses: &Path,
    test_args: &[String],
) -> String {
    let mut script = guest_prelude();
    script.push_str(&format!(
        r#"export RDMA_TEST_REQUIRE_DEVICE=1
export RDMA_TEST_REPORT={report}
export RDMA_TEST_ADDR={GUEST_ADDR}
export RUST_BACKTRACE=0
run() {{
    name=$1; dir=$2; shift 2
    echo "guest: ==> $name"
    (cd "$dir" && CARGO_MANIFEST_DIR="$dir" timeout --kill-after=10 900 "$@")
    echo "$? $name" >> {statuses}
}}
"#,
        report = shell_quote(&report.to_string_lossy()),
        statuses = shell_quote(&statuses.to_string_lossy()),
    ));
    let extra: Vec<String> = test_args.iter().map(|a| shell_quote(a)).collect();
    for binary in binaries {
        script.push_str(&format!(
            "run {} {} {} --test-threads=1 {}\n",
            shell_quote(&binary.name),
            shell_quote(&binary.package_dir),
            shell_quote(&binary.path),
            extra.join(" ")
        ));
    }
    script.push_str("echo \"guest: done\"\n");
    script
}

/// `cargo xtask pingpong`: the README's main job: `rc_pingpong` server and client on the
/// device (in the VM where the host has none), printing their address and result lines.
pub(crate) fn pingpong(root: &Path, args: &[String]) -> Result<(), String> {
    let output = Command::new(env!("CARGO"))
        .current_dir(root)
        .args([
            "build",
            "--package",
            "rdma-examples",
            "--bin",
            "rc_pingpong",
            "--message-format=json-render-diagnostics",
        ])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !output.status.success() {
        return Err("building rc_pingpong failed".to_string());
    }
    let binary = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| l.contains("\"reason\":\"compiler-artifact\""))
        .filter_map(|l| json_string(l, "executable"))
        .find(|p| p.ends_with("/rc_pingpong"))
        .ok_or("cargo did not report the rc_pingpong binary")?;
    let extra: Vec<String> = args.iter().map(|a| shell_quote(a)).collect();
    let extra = extra.join(" ");
    let port = 18515;
    if host_has_active_device() {
        let gid = std::env::var("RDMA_TEST_GID_INDEX").unwrap_or_else(|_| "1".to_string());
        let mut server = Command::new(&binary)
            .args(["-g", &gid, "-p", &port.to_string()])
            .args(args)
            .spawn()
            .map_err(|e| format!("starting the server: {e}"))?;
        std::thread::sleep(Duration::from_secs(1));
        let client = Command::new(&binary)
            .args(["-g", &gid, "-p", &port.to_string()])
            .args(args)
            .arg("127.0.0.1")
            .status()
            .map_err(|e| format!("starting the client: {e}"))?;
        let server = server.wait().map_err(|e| format!("waiting: {e}"))?;
        return if client.success() && server.success() {
            Ok(())
        } else {
            Err(format!("server {server}, client {client}"))
        };
    }
    let work = root.join(".rdma-test").join(std::process::id().to_string());
    std::fs::create_dir_all(&work).map_err(|e| format!("creating {}: {e}", work.display()))?;
    let script = work.join("pingpong.sh");
    let mut text = guest_prelude();
    text.push_str(&format!(
        r#"echo "guest: ==> rc_pingpong server and client on {GUEST_DEVICE}"
bin={binary}
$bin -g 1 -p {port} {extra} > {server_log} 2>&1 &
server=$!
i=0
until grep -q ":$(printf %04X {port}) .* 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null; do
    i=$((i+1)); [ $i -gt 600 ] && fail "the server never listened"
    sleep 0.1
done
$bin -g 1 -p {port} {extra} 127.0.0.1 > {client_log} 2>&1
client_status=$?
wait $server
server_status=$?
echo "guest: server (exit $server_status):"; sed 's/^/  /' {server_log}
echo "guest: client (exit $client_status):"; sed 's/^/  /' {client_log}
[ $server_status -eq 0 ] && [ $client_status -eq 0 ] && echo "guest: pingpong ok"
"#,
        binary = shell_quote(&binary),
        server_log = shell_quote(&work.join("server.log").to_string_lossy()),
        client_log = shell_quote(&work.join("client.log").to_string_lossy()),
    ));
    std::fs::write(&script, text).map_err(|e| format!("writing {}: {e}", script.display()))?;
    let run = boot_vm(root, &script, "guest: ==>")?;
    if run.log.lines().any(|l| l == "guest: pingpong ok") {
        Ok(())
    } else {
        Err("rc_pingpong failed in the VM".to_string())
    }
}

fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

fn read_statuses(path: &Path) -> Vec<(String, bool)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let (code, name) = line.split_once(' ')?;
            Some((name.to_string(), code == "0"))
        })
        .collect()
}

#[derive(Default)]
struct Totals {
    passed: usize,
    failed: usize,
    ignored: usize,
}

impl Totals {
    /// Adds up libtest's `test result: ok. 3 passed; 0 failed; 1 ignored; ...` lines.
    fn add_results(&mut self, log: &str) {
        for line in log.lines() {
            let Some(rest) = line.trim().strip_prefix("test result: ") else {
                continue;
            };
            for part in rest.split(';') {
                let mut words = part.split_whitespace().rev();
                let (Some(kind), Some(count)) = (words.next(), words.next()) else {
                    continue;
                };
                let Ok(count) = count.parse::<usize>() else {
                    continue;
                };
                match kind {
                    "passed" => self.passed += count,
                    "failed" => self.failed += count,
                    "ignored" => self.ignored += count,
                    _ => {}
                }
            }
        }
    }
}

/// The lines device tests appended to `RDMA_TEST_REPORT` (see `rdma-test-support`).
#[derive(Default)]
struct DeviceReport {
    ran: BTreeSet<String>,
    skipped: Vec<String>,
    no_device: Vec<String>,
    unsupported: Vec<String>,
}

impl DeviceReport {
    fn read(path: &Path) -> Self {
        let mut report = Self::default();
        for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
            let Some((kind, rest)) = line.split_once(' ') else {
                continue;
            };
            match kind {
                "ran" => {
                    report
                        .ran
                        .insert(rest.split(' ').next().unwrap_or(rest).to_string());
                }
                "skipped" => report.skipped.push(rest.to_string()),
                "failed" => report.no_device.push(rest.to_string()),
                "unsupported" => report.unsupported.push(rest.to_string()),
                _ => {}
            }
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtest_result_lines_add_up() {
        let mut totals = Totals::default();
        totals.add_results(
            "test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s\n\
             noise\n\
             test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.00s\n",
        );
        assert_eq!((totals.passed, totals.failed, totals.ignored), (5, 1, 1));
    }

    #[test]
    fn json_fields_are_read() {
        let line = r#"{"reason":"compiler-artifact","manifest_path":"/w/a b/Cargo.toml","target":{"name":"device"},"executable":"/w/t/x\"y"}"#;
        assert_eq!(
            json_string(line, "manifest_path").as_deref(),
            Some("/w/a b/Cargo.toml")
        );
        assert_eq!(json_string(line, "name").as_deref(), Some("device"));
        assert_eq!(
            json_string(line, "executable").as_deref(),
            Some("/w/t/x\"y")
        );
        assert_eq!(json_string(line, "missing"), None);
    }

    #[test]
    fn only_test_profile_artifacts_are_test_binaries() {
        let harness = r#"{"reason":"compiler-artifact","target":{"name":"x","test":true},"profile":{"opt_level":"0","test":true},"executable":"/t/x-1"}"#;
        let plain_bin = r#"{"reason":"compiler-artifact","target":{"name":"x","test":true},"profile":{"opt_level":"0","test":false},"executable":"/t/x"}"#;
        assert!(profile_is_test(harness));
        assert!(!profile_is_test(plain_bin));
    }

    #[test]
    fn shell_quoting_survives_quotes() {
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
