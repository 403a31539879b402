//! The Soft-RoCE VM: booting it with virtme-ng, the watchdog, the guest scripts.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::build::TestBinary;
use super::process::{self, GroupGuard};

/// The address of the guest-internal dummy interface the first rxe device sits on.
pub(crate) const GUEST_ADDR: &str = "169.254.7.1";
/// The first device: the one tests and examples use.
pub(crate) const GUEST_DEVICE: &str = "rxe0";
/// The second device (`RDMA_TEST_DEVICE2`), on an interface of its own.
pub(crate) const GUEST_ADDR2: &str = "169.254.8.1";
pub(crate) const GUEST_DEVICE2: &str = "rxe1";

/// How long the watchdog waits after SIGTERM before it sends SIGKILL.
const GRACE: Duration = Duration::from_secs(10);

/// The bound of a VM's boot: from starting it to its first test (about 25 s here; two or four
/// VMs on two cores take longer).
const BOOT_BOUND: Duration = Duration::from_secs(600);

/// `RDMA_TEST_BINARY_TIMEOUT` (seconds), 900 by default: the bound of one test binary
/// (`timeout` in the guest, and on a host with a device). The interop repeats of the second
/// CI tier raise it: 50 runs of a pairing under a shared CPU take longer.
pub(crate) fn binary_timeout_from_env() -> u64 {
    std::env::var("RDMA_TEST_BINARY_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&s| s > 0)
        .unwrap_or(900)
}

/// `RDMA_TEST_TIMEOUT` (seconds), 2400 by default: the bound of a VM run from its first test
/// on (its boot is bounded by [`BOOT_BOUND`]); a hang bound: the whole single-node suite, one
/// binary at a time, took 1,312 s on 2026-11-26 and did not finish in 1,500 s on a slower run
/// the next day.
pub(crate) fn timeout_from_env() -> Duration {
    Duration::from_secs(
        std::env::var("RDMA_TEST_TIMEOUT")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(2400),
    )
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

/// The kernel `--kernel` chose for this run, if it did.
static CHOSEN_KERNEL: OnceLock<PathBuf> = OnceLock::new();

/// `--kernel VERSION`: boots the newest `/boot/vmlinuz-VERSION…` with `rdma_rxe` (`6.12`
/// matches `6.12.115+deb12-amd64`, not `6.1.0-56-amd64`) for the rest of this run.
pub(crate) fn choose_kernel(version: &str) -> Result<PathBuf, String> {
    let path = rxe_kernels()?
        .into_iter()
        .filter(|(v, _)| version_matches(v, version))
        .max_by(|a, b| version_key(&a.0).cmp(&version_key(&b.0)))
        .map(|(_, path)| path)
        .ok_or_else(|| {
            format!(
                "no kernel {version} with the rdma_rxe module in /boot; run `cargo xtask \
                 setup --kernel {version}`"
            )
        })?;
    let chosen = CHOSEN_KERNEL.get_or_init(|| path.clone());
    if *chosen != path {
        return Err(format!(
            "a run boots one kernel; {} was chosen first",
            chosen.display()
        ));
    }
    Ok(path)
}

/// Whether kernel `version` (`6.12.115+deb12-amd64`) is of `wanted` (`6.12`, `6.12.115`).
pub(crate) fn version_matches(version: &str, wanted: &str) -> bool {
    version
        .strip_prefix(wanted)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '-', '+']))
}

/// The numbers of a kernel version in order, for comparing `6.12.99` below `6.12.115`.
fn version_key(version: &str) -> Vec<u64> {
    version
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// The kernels in `/boot` whose modules include `rdma_rxe`, as (version, image).
fn rxe_kernels() -> Result<Vec<(String, PathBuf)>, String> {
    Ok(std::fs::read_dir("/boot")
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
        .collect())
}

/// The kernel version the distribution's kernel package (`linux-image-amd64`) installs, as
/// dpkg names its dependency (`linux-image-6.1.0-56-amd64 (= …)` gives `6.1.0-56-amd64`).
fn distribution_kernel() -> Option<String> {
    let output = Command::new("dpkg-query")
        .args(["-W", "-f=${Depends}", "linux-image-amd64"])
        .output()
        .ok()?;
    let depends = String::from_utf8_lossy(&output.stdout);
    let first = depends.split([',', '|']).next()?.trim();
    let package = first.split_whitespace().next()?;
    package.strip_prefix("linux-image-").map(str::to_string)
}

/// The kernel to boot: the one `--kernel` chose, else `RDMA_TEST_KERNEL`, else the
/// distribution's (what `linux-image-amd64` installs: a second kernel installed for the full
/// tier does not change what the first tier boots), else the newest `/boot/vmlinuz-*` whose
/// modules include `rdma_rxe`.
pub(crate) fn find_kernel() -> Result<PathBuf, String> {
    if let Some(kernel) = CHOSEN_KERNEL.get() {
        return Ok(kernel.clone());
    }
    if let Some(kernel) = std::env::var_os("RDMA_TEST_KERNEL") {
        return Ok(PathBuf::from(kernel));
    }
    let mut kernels = rxe_kernels()?;
    if let Some(default) = distribution_kernel() {
        if let Some(index) = kernels.iter().position(|(v, _)| *v == default) {
            return Ok(kernels.swap_remove(index).1);
        }
    }
    kernels.sort_by_key(|(version, _)| version_key(version));
    kernels.pop().map(|(_, path)| path).ok_or_else(|| {
        "no kernel with the rdma_rxe module in /boot; run `cargo xtask setup` \
         (Debian package linux-image-amd64)"
            .to_string()
    })
}

/// What a VM run produced.
pub(crate) struct VmRun {
    /// The guest's console output.
    pub(crate) log: String,
    /// Time from starting the VM to the first line starting with the marker.
    pub(crate) first_marker: Option<Duration>,
    /// The kernel it booted.
    pub(crate) kernel: PathBuf,
    /// The limit, when the watchdog had to stop the VM: [`BOOT_BOUND`] if it reached no test
    /// (then `first_marker` is `None`), else the run's limit from its first test on.
    pub(crate) timed_out: Option<Duration>,
    /// How `vng` ended.
    pub(crate) status: Option<ExitStatus>,
    /// `vng`'s standard error.
    pub(crate) stderr: String,
    /// Processes of the VM still alive after SIGKILL (none, normally).
    pub(crate) survivors: Vec<u32>,
    /// The process ID of `vng`, which leads the VM's process group.
    pub(crate) leader: u32,
}

impl VmRun {
    /// Why the VM run as a whole failed, if it did (the tests' own results aside).
    pub(crate) fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(limit) = self.timed_out {
            problems.push(if self.first_marker.is_some() {
                format!(
                    "the VM did not finish within {} s of its first test: the watchdog stopped \
                     it; the results it gathered are above",
                    limit.as_secs()
                )
            } else {
                format!(
                    "the VM reached no test within {} s: the watchdog stopped it",
                    limit.as_secs()
                )
            });
        } else if self.first_marker.is_none() {
            let hint = self
                .stderr
                .lines()
                .chain(self.log.lines())
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("no output");
            let status = self
                .status
                .map_or_else(|| "unknown status".to_string(), |s| s.to_string());
            problems.push(format!(
                "the VM ran nothing ({status}); last output: {hint}"
            ));
        } else if !self.log.lines().any(|l| l.trim() == "guest: done") {
            problems.push(format!(
                "the VM ended before its script did ({})",
                self.status
                    .map_or_else(|| "unknown status".to_string(), |s| s.to_string())
            ));
        }
        if !self.survivors.is_empty() {
            problems.push(format!(
                "processes of the VM survived SIGKILL: {:?}",
                self.survivors
            ));
        }
        problems
    }
}

/// Boots the VM, runs `script` (a path inside the workspace) in it, streams its output, and
/// stops it if it reaches no `marker` line within [`BOOT_BOUND`] or runs on for `timeout` after
/// the first: `vng` runs in a process group of its own, which the watchdog
/// signals as a whole (SIGTERM, then SIGKILL after a grace period), together with every
/// descendant of `vng` that left the group.
pub(crate) fn boot_vm(
    root: &Path,
    script: &Path,
    marker: &str,
    timeout: Duration,
) -> Result<VmRun, String> {
    boot_vm_with(root, script, marker, timeout, &VmSpec::single())
}

/// The shape of one VM: its label in the output, its size and extra QEMU options.
#[derive(Clone, Debug)]
pub(crate) struct VmSpec {
    /// Prefixed to each line the VM prints (`[node1] `), when several run at once.
    pub(crate) label: Option<String>,
    pub(crate) cpus: u32,
    pub(crate) memory: &'static str,
    /// Added with `--qemu-opts` (a network device, for the multi-node mode).
    pub(crate) qemu_opts: Option<String>,
}

impl VmSpec {
    /// The single-node VM: 2 vCPUs, 4 GiB, no network device.
    pub(crate) fn single() -> Self {
        Self {
            label: None,
            cpus: 2,
            memory: "4G",
            qemu_opts: None,
        }
    }
}

/// [`boot_vm`] with a given VM shape.
pub(crate) fn boot_vm_with(
    root: &Path,
    script: &Path,
    marker: &str,
    timeout: Duration,
    spec: &VmSpec,
) -> Result<VmRun, String> {
    let vng = find_vng().ok_or(
        "this host has no active RDMA device and `vng` (virtme-ng) is not installed; \
         run `cargo xtask setup`",
    )?;
    let kernel = find_kernel()?;
    let prefix = spec
        .label
        .as_ref()
        .map_or_else(String::new, |label| format!("[{label}] "));
    println!(
        "{prefix}harness: booting {} under QEMU with Soft-RoCE devices (watchdog: {} s)",
        kernel.display(),
        timeout.as_secs()
    );
    let mut command = Command::new(&vng);
    command
        .current_dir(root)
        .arg("--run")
        .arg(&kernel)
        .arg("--force-9p")
        .arg("--cpus")
        .arg(spec.cpus.to_string())
        .arg("--memory")
        .arg(spec.memory);
    if let Some(options) = &spec.qemu_opts {
        command.arg(format!("--qemu-opts={options}"));
    }
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
        .stderr(Stdio::piped())
        .process_group(0);
    let started = Instant::now();
    let mut child = command
        .spawn()
        .map_err(|e| format!("starting {}: {e}", vng.display()))?;
    let leader = child.id();
    let guard = GroupGuard::new(leader);
    let stderr = child.stderr.take();
    let err_prefix = prefix.clone();
    let stderr_thread = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(stderr) = stderr {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("{err_prefix}{line}");
                text.push_str(&line);
                text.push('\n');
            }
        }
        text
    });
    // One message when the first marker line comes; dropped when the VM has ended.
    let (done, finished) = mpsc::channel::<()>();
    let watchdog_prefix = prefix.clone();
    let watchdog = std::thread::spawn(move || {
        let (limit, phase) = match finished.recv_timeout(BOOT_BOUND) {
            Ok(()) => match finished.recv_timeout(timeout) {
                Err(RecvTimeoutError::Timeout) => (timeout, "its first test"),
                _ => return None,
            },
            Err(RecvTimeoutError::Timeout) => (BOOT_BOUND, "its start, before any test"),
            Err(RecvTimeoutError::Disconnected) => return None,
        };
        eprintln!(
            "{watchdog_prefix}harness: watchdog: the VM is still running {} s after {phase}; \
             stopping its process group {leader} and every process below vng (SIGTERM, \
             SIGKILL after {} s)",
            limit.as_secs(),
            GRACE.as_secs()
        );
        Some((limit, process::stop_group(leader, GRACE)))
    });
    let mut log = String::new();
    let mut first_marker: Option<Duration> = None;
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let mut out = std::io::stdout().lock();
            if first_marker.is_none() && line.starts_with(marker) {
                first_marker = Some(started.elapsed());
                let _ = done.send(());
                let _ = writeln!(
                    out,
                    "{prefix}harness: VM boot to first test: {:.1} s",
                    started.elapsed().as_secs_f64()
                );
            }
            let _ = writeln!(out, "{prefix}{line}");
            let _ = out.flush();
            log.push_str(&line);
            log.push('\n');
        }
    }
    let status = child.wait().ok();
    drop(done);
    drop(guard);
    let stopped = watchdog.join().unwrap_or(None);
    let stderr = stderr_thread.join().unwrap_or_default();
    let (timed_out, survivors) = match stopped {
        Some((limit, survivors)) => (Some(limit), survivors),
        None => (None, Vec::new()),
    };
    Ok(VmRun {
        log,
        first_marker,
        kernel,
        timed_out,
        status,
        stderr,
        survivors,
        leader,
    })
}

/// Runs `script` (POSIX shell, which may call `fail "why"`) on the RDMA device: on the host
/// when it has an active port, otherwise in a throwaway VM after [`guest_prelude`], with
/// `title` on the guest's `==>` line and the script written to `work/<name>.sh`. Succeeds only
/// when the script ran to its end.
pub(crate) fn run_on_device(
    root: &Path,
    work: &Path,
    name: &str,
    title: &str,
    script: &str,
) -> Result<(), String> {
    if super::host_has_active_device() {
        let text = format!("fail() {{ echo \"{name}: $*\" >&2; exit 1; }}\n{script}");
        let status = Command::new("sh")
            .args(["-c", &text])
            .status()
            .map_err(|e| format!("running the {name} script: {e}"))?;
        return if status.success() {
            Ok(())
        } else {
            Err(format!("{name} failed on the host's device ({status})"))
        };
    }
    let done = format!("guest: {name} ok");
    let path = work.join(format!("{name}.sh"));
    let mut text = guest_prelude();
    text.push_str(&format!("echo \"guest: ==> {title}\"\n"));
    text.push_str(script);
    text.push_str(&format!("echo \"{done}\"\necho \"guest: done\"\n"));
    std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    let run = boot_vm(root, &path, "guest: ==>", timeout_from_env())?;
    let problems = run.problems();
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    if !run.log.lines().any(|l| l == done) {
        return Err(format!("{name} did not finish in the VM"));
    }
    Ok(())
}

/// The start of every guest script: load rdma_rxe, put an rxe device on each of two dummy
/// interfaces and wait until their ports are active. `rxe0` is made first, so it is the first
/// device of `ibv_get_device_list` (the examples and the C tools use that one); the script
/// checks it.
pub(crate) fn guest_prelude() -> String {
    format!(
        r#"#!/bin/sh
# Written by `cargo xtask`; runs inside the throwaway VM.
exec 2>&1
fail() {{ echo "guest: $*"; exit 90; }}
modprobe rdma_rxe || fail "modprobe rdma_rxe failed"
ip link set lo up
sysctl -qw net.ipv4.conf.all.accept_local=1
ulimit -l unlimited
add_rxe() {{
    ip link add "$2" type dummy || fail "cannot add the dummy interface $2"
    ip link set "$2" up
    ip addr add "$3/24" dev "$2"
    rdma link add "$1" type rxe netdev "$2" || fail "rdma link add $1 failed"
    i=0
    until ibv_devinfo -d "$1" 2>/dev/null | grep -q PORT_ACTIVE; do
        i=$((i+1)); [ $i -gt 100 ] && fail "$1 port never became active"
        sleep 0.1
    done
}}
add_rxe {GUEST_DEVICE} d0 {GUEST_ADDR}
add_rxe {GUEST_DEVICE2} d1 {GUEST_ADDR2}
first=$(ibv_devices | awk 'NR == 3 {{ print $1 }}')
[ "$first" = {GUEST_DEVICE} ] || fail "the first device is $first, not {GUEST_DEVICE}"
export RDMA_TEST_DEVICE2={GUEST_DEVICE2}
export PATH="$PATH:$HOME/.cargo/bin"
echo "guest: {GUEST_DEVICE} on d0 ({GUEST_ADDR}) and {GUEST_DEVICE2} on d1 ({GUEST_ADDR2}) are active"
"#
    )
}

/// The script the guest runs: make the rxe devices, then run the test binaries as `schedule`
/// says, each bounded by `timeout 900`, appending `EXIT-CODE NAME` to `statuses` (or its lane's
/// file) as each one ends.
pub(crate) fn guest_script(
    schedule: &Schedule<'_>,
    report: &Path,
    statuses: &Path,
    test_args: &[String],
    repeat: Option<u32>,
) -> String {
    let mut script = guest_prelude();
    script.push_str(&format!("export RDMA_TEST_ADDR={GUEST_ADDR}\n"));
    script.push_str(&test_runs(
        schedule,
        report,
        statuses,
        test_args,
        repeat,
        &RunHooks::default(),
    ));
    script
}

/// Shell run inside the guest's `run` function around each test binary (the multi-node mode
/// meets the other nodes before each binary and says when one ended): `before` runs after
/// `name=` is set, `after` after `code=` is set.
#[derive(Debug, Default)]
pub(crate) struct RunHooks {
    pub(crate) before: String,
    pub(crate) after: String,
}

/// Which binaries a guest runs, and how: first `alone`, one at a time, in order; then `pooled`
/// on `lanes` lanes at once, each lane taking the next binary nobody has taken yet.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Schedule<'a> {
    pub(crate) alone: &'a [TestBinary],
    pub(crate) pooled: &'a [TestBinary],
    pub(crate) lanes: usize,
}

impl<'a> Schedule<'a> {
    /// Every binary one at a time, in order.
    pub(crate) fn serial(binaries: &'a [TestBinary]) -> Self {
        Self {
            alone: binaries,
            pooled: &[],
            lanes: 1,
        }
    }

    /// The status or report files the guest writes, for a base path: the base itself (binaries
    /// run alone, and lane 0), then one per further lane (`<base>.1`, ...).
    pub(crate) fn lane_files(&self, base: &Path) -> Vec<PathBuf> {
        let mut files = vec![base.to_path_buf()];
        if !self.pooled.is_empty() {
            for lane in 1..self.lanes {
                let mut name = base.as_os_str().to_owned();
                name.push(format!(".{lane}"));
                files.push(PathBuf::from(name));
            }
        }
        files
    }
}

/// The part of a guest script after the device set-up: run the binaries as `schedule` says,
/// each bounded by `timeout` ([`binary_timeout_from_env`], 900 s by default), with every line it prints prefixed `[NAME] ` (two binaries
/// may share the console) and its wall time on its `guest: <== NAME exit CODE in S s` line,
/// appending `EXIT-CODE NAME` to `statuses` (lane `k > 0`: `statuses.k`; likewise the report
/// file) as each one ends, then print `guest: done`.
pub(crate) fn test_runs(
    schedule: &Schedule<'_>,
    report: &Path,
    statuses: &Path,
    test_args: &[String],
    repeat: Option<u32>,
    hooks: &RunHooks,
) -> String {
    let mut script = String::new();
    if let Some(count) = repeat {
        script.push_str(&format!("export RDMA_TEST_REPEAT={count}\n"));
    }
    script.push_str(&format!(
        r#"export RDMA_TEST_REQUIRE_DEVICE=1
report={report}
statuses={statuses}
export RDMA_TEST_REPORT="$report"
status_file="$statuses"
export RUST_BACKTRACE=0
binary_timeout={binary_timeout}
# fd 4: the console, for the prefixing filter inside the command substitution below.
exec 4>&1
run() {{
    name=$1; dir=$2; shift 2
{before}    echo "guest: ==> $name"
    kseq=$({xtask} kernel-log mark)
    start=$(date +%s%N)
    # The binary's exit code comes out on fd 3; what it prints goes to the console with its
    # name before every line, as it comes (`xtask prefix-lines`, which ends a piece the binary
    # left mid-line as a line of its own: a test's `test NAME ... ` shows while it runs).
    # `timeout` leads a process group of its own (its pid, as the subshell execs it): what a
    # test left running in it is killed when the binary ends, so that nothing holds the pipe
    # to the prefixer open after the binary. `--report-time` puts each test's time after its
    # result (`ok <1.234s>`); libtest takes it from a stable toolchain with RUSTC_BOOTSTRAP=1.
    code=$( {{ {{ (cd "$dir" && export CARGO_MANIFEST_DIR="$dir" &&
            export RUSTC_BOOTSTRAP=1 && exec timeout --kill-after=10 "$binary_timeout" "$@" \
            -Z unstable-options --report-time) 2>&1 3>&- &
        pid=$!; wait $pid; binary_code=$?; kill -KILL -$pid 2>/dev/null
        echo $binary_code >&3; }} | {xtask} prefix-lines "$name" >&4 3>&-; }} 3>&1 )
    ms=$(( ($(date +%s%N) - start) / 1000000 ))
    # What the kernel logged meanwhile that looks like a provider bug: `guest: kernel during
    # NAME: MESSAGE` lines, each a failure of the binary.
    {xtask} kernel-log since "$kseq" "$name"
{after}    echo "$code $name" >> "$status_file"
    echo "guest: <== $name exit $code in $((ms / 1000)).$(printf %03d $((ms % 1000))) s"
}}
"#,
        report = shell_quote(&report.to_string_lossy()),
        statuses = shell_quote(&statuses.to_string_lossy()),
        before = hooks.before,
        after = hooks.after,
        binary_timeout = binary_timeout_from_env(),
        xtask = std::env::current_exe()
            .map(|path| shell_quote(&path.to_string_lossy()))
            .unwrap_or_else(|_| "xtask".to_string()),
    ));
    let extra: Vec<String> = test_args.iter().map(|a| shell_quote(a)).collect();
    let run_line = |binary: &TestBinary| {
        format!(
            "run {} {} {} --test-threads=1 {}",
            shell_quote(&binary.name),
            shell_quote(&binary.package_dir),
            shell_quote(&binary.path),
            extra.join(" ")
        )
    };
    for binary in schedule.alone {
        script.push_str(&run_line(binary));
        script.push('\n');
    }
    if schedule.lanes <= 1 {
        for binary in schedule.pooled {
            script.push_str(&run_line(binary));
            script.push('\n');
        }
    } else if !schedule.pooled.is_empty() {
        // Each lane walks the same list and runs a binary only if it claims it first: `mkdir`
        // of its number either creates the folder or fails, atomically.
        script.push_str(
            r#"claims="$statuses.claims"
rm -rf "$claims"
mkdir "$claims" || fail "cannot make $claims"
job() {
    case $1 in
"#,
        );
        for (index, binary) in schedule.pooled.iter().enumerate() {
            script.push_str(&format!("    {index}) {} ;;\n", run_line(binary)));
        }
        script.push_str(&format!(
            r#"    esac
}}
lane() {{
    if [ "$1" -gt 0 ]; then
        export RDMA_TEST_REPORT="$report.$1"
        status_file="$statuses.$1"
    fi
    claim=0
    while [ $claim -lt {count} ]; do
        mkdir "$claims/$claim" 2>/dev/null && job $claim
        claim=$((claim+1))
    done
}}
"#,
            count = schedule.pooled.len()
        ));
        let lanes: Vec<String> = (1..schedule.lanes).map(|k| format!("lane {k} &")).collect();
        script.push_str(&format!("{}\nlane 0\nwait\n", lanes.join("\n")));
    }
    script.push_str("echo \"guest: done\"\n");
    script
}

/// `cargo xtask prefix-lines NAME` (run by the guest scripts, not by people): copies its
/// standard input to its standard output with `[NAME] ` before every line, as it comes, one
/// write per line (so that two binaries sharing a console never split each other's lines). A read that ends mid-line is written as a line of its own, so that libtest's
/// `test NAME ... `, printed before the test runs, shows at once and stays in the log if the
/// test never ends; the verdict reads a result word on a later line of its own.
pub(crate) fn prefix_lines(args: &[String]) -> Result<(), String> {
    use std::io::Read;
    let [name] = args else {
        return Err("usage: prefix-lines NAME".to_string());
    };
    let prefix = format!("[{name}] ");
    let mut input = std::io::stdin().lock();
    let mut output = std::io::stdout().lock();
    let mut buffer = vec![0u8; 64 * 1024];
    // What came after the last newline: held back while more may complete it (a line a test
    // prints with several writes, as `eprintln!` of a formatted line does).
    let mut pending: Vec<u8> = Vec::new();
    let mut emit = |bytes: &[u8]| -> Result<(), String> {
        // One write per line: a line is short enough that no pipe or console splits it.
        for line in prefixed(&prefix, bytes).split_inclusive(|&b| b == b'\n') {
            output
                .write_all(line)
                .and_then(|()| output.flush())
                .map_err(|e| format!("prefix-lines: writing: {e}"))?;
        }
        Ok(())
    };
    loop {
        if !pending.is_empty() && !readable_within(PIECE_WAIT_MS) {
            emit(&std::mem::take(&mut pending))?;
        }
        let read = match input.read(&mut buffer) {
            Ok(0) => return emit(&pending),
            Ok(read) => read,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("prefix-lines: reading: {e}")),
        };
        pending.extend_from_slice(&buffer[..read]);
        if let Some(end) = pending.iter().rposition(|&b| b == b'\n') {
            let rest = pending.split_off(end + 1);
            emit(&pending)?;
            pending = rest;
        }
    }
}

/// How long `prefix-lines` waits for the rest of a line before it writes the piece it has as
/// a line of its own (libtest's `test NAME ... ` of a test that hangs must still show).
const PIECE_WAIT_MS: i32 = 200;

/// Whether standard input has something to read (or has ended) within `ms` milliseconds.
fn readable_within(ms: i32) -> bool {
    let mut fd = libc::pollfd {
        fd: 0,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid `pollfd`, for the duration of the call.
    let n = unsafe { libc::poll(&mut fd, 1, ms) };
    n != 0
}

fn prefixed(prefix: &str, bytes: &[u8]) -> Vec<u8> {
    let mut text = Vec::with_capacity(bytes.len() + 2 * prefix.len());
    for line in bytes.split_inclusive(|&b| b == b'\n') {
        text.extend_from_slice(prefix.as_bytes());
        text.extend_from_slice(line);
        if !line.ends_with(b"\n") {
            text.push(b'\n');
        }
    }
    text
}

pub(crate) fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_is_prefixed_and_a_piece_mid_line_becomes_a_line() {
        assert_eq!(prefixed("[p/a] ", b"one\ntwo\n"), b"[p/a] one\n[p/a] two\n");
        assert_eq!(
            prefixed("[p/a] ", b"running 1 test\ntest x ... "),
            b"[p/a] running 1 test\n[p/a] test x ... \n"
        );
        assert_eq!(prefixed("[p/a] ", b"ok\n"), b"[p/a] ok\n");
        assert!(prefixed("[p/a] ", b"").is_empty());
        // The verdict reads such a split test line as it read noise between name and result.
        let log = "guest: ==> p/a\n[p/a] test x ... \n[p/a] ok\n[p/a] test y ... \n";
        let parts = super::super::verdict::split_guest_log(log);
        let output = super::super::verdict::parse_libtest(&parts["p/a"]);
        assert_eq!(output.results.len(), 1);
        assert_eq!(output.unfinished, vec!["y".to_string()]);
    }

    #[test]
    fn shell_quoting_survives_quotes() {
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn the_guest_script_exports_repeat_and_both_devices() {
        let binary = TestBinary {
            name: "p/t".to_string(),
            path: "/x/t-1".to_string(),
            package_dir: "/x".to_string(),
            unit: false,
        };
        let script = guest_script(
            &Schedule::serial(std::slice::from_ref(&binary)),
            Path::new("/w/report.txt"),
            Path::new("/w/status.txt"),
            &["scope_".to_string()],
            Some(7),
        );
        assert!(script.contains("export RDMA_TEST_REPEAT=7\n"));
        assert!(script.contains("export RDMA_TEST_DEVICE2=rxe1\n"));
        assert!(script.contains("add_rxe rxe0 d0 169.254.7.1\nadd_rxe rxe1 d1 169.254.8.1\n"));
        assert!(script.contains("run 'p/t' '/x' '/x/t-1' --test-threads=1 'scope_'\n"));
        assert!(!script.contains("lane "), "one binary alone needs no lanes");
        assert!(script.ends_with("echo \"guest: done\"\n"));
        let plain = guest_script(
            &Schedule::serial(std::slice::from_ref(&binary)),
            Path::new("/r"),
            Path::new("/s"),
            &[],
            None,
        );
        assert!(!plain.contains("RDMA_TEST_REPEAT"));
    }
}
