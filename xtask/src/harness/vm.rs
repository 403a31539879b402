//! The Soft-RoCE VM: booting it with virtme-ng, the watchdog, the guest scripts.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
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

/// `RDMA_TEST_TIMEOUT` (seconds), 2400 by default: the bound of a whole VM run (a hang bound:
/// the whole single-node suite took 1,312 s on 2026-11-26 and did not finish in 1,500 s on a
/// slower run the next day).
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
pub(crate) struct VmRun {
    /// The guest's console output.
    pub(crate) log: String,
    /// Time from starting the VM to the first line starting with the marker.
    pub(crate) first_marker: Option<Duration>,
    /// The kernel it booted.
    pub(crate) kernel: PathBuf,
    /// The limit, when the watchdog had to stop the VM.
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
            problems.push(format!(
                "the VM did not finish within {} s: the watchdog stopped it; the results it \
                 gathered are above",
                limit.as_secs()
            ));
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
/// stops it after `timeout`: `vng` runs in a process group of its own, which the watchdog
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
    let (done, finished) = mpsc::channel::<()>();
    let watchdog_prefix = prefix.clone();
    let watchdog = std::thread::spawn(move || match finished.recv_timeout(timeout) {
        Err(RecvTimeoutError::Timeout) => {
            eprintln!(
                "{watchdog_prefix}harness: watchdog: the VM is still running after {} s; stopping its process \
                 group {leader} and every process below vng (SIGTERM, SIGKILL after {} s)",
                timeout.as_secs(),
                GRACE.as_secs()
            );
            Some(process::stop_group(leader, GRACE))
        }
        _ => None,
    });
    let mut log = String::new();
    let mut first_marker: Option<Duration> = None;
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let mut out = std::io::stdout().lock();
            if first_marker.is_none() && line.starts_with(marker) {
                first_marker = Some(started.elapsed());
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
    Ok(VmRun {
        log,
        first_marker,
        kernel,
        timed_out: stopped.is_some().then_some(timeout),
        status,
        stderr,
        survivors: stopped.unwrap_or_default(),
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

/// The script the guest runs: make the rxe devices, then run every test binary in turn, each
/// bounded by `timeout 900`, appending `EXIT-CODE NAME` to `statuses` as each one ends.
pub(crate) fn guest_script(
    binaries: &[TestBinary],
    report: &Path,
    statuses: &Path,
    test_args: &[String],
    repeat: Option<u32>,
) -> String {
    let mut script = guest_prelude();
    script.push_str(&format!("export RDMA_TEST_ADDR={GUEST_ADDR}\n"));
    script.push_str(&test_runs(
        binaries,
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

/// The part of a guest script after the device set-up: run every test binary in turn, each
/// bounded by `timeout 900`, appending `EXIT-CODE NAME` to `statuses` as each one ends, then
/// print `guest: done`.
pub(crate) fn test_runs(
    binaries: &[TestBinary],
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
export RDMA_TEST_REPORT={report}
export RUST_BACKTRACE=0
run() {{
    name=$1; dir=$2; shift 2
{before}    echo "guest: ==> $name"
    (cd "$dir" && CARGO_MANIFEST_DIR="$dir" timeout --kill-after=10 900 "$@")
    code=$?
{after}    echo "$code $name" >> {statuses}
    # A binary that died mid-line leaves `test NAME ... ` unterminated.
    echo
    echo "guest: <== $name exit $code"
}}
"#,
        report = shell_quote(&report.to_string_lossy()),
        statuses = shell_quote(&statuses.to_string_lossy()),
        before = hooks.before,
        after = hooks.after,
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

pub(crate) fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        };
        let script = guest_script(
            std::slice::from_ref(&binary),
            Path::new("/w/report.txt"),
            Path::new("/w/status.txt"),
            &["scope_".to_string()],
            Some(7),
        );
        assert!(script.contains("export RDMA_TEST_REPEAT=7\n"));
        assert!(script.contains("export RDMA_TEST_DEVICE2=rxe1\n"));
        assert!(script.contains("add_rxe rxe0 d0 169.254.7.1\nadd_rxe rxe1 d1 169.254.8.1\n"));
        assert!(script.contains("run 'p/t' '/x' '/x/t-1' --test-threads=1 'scope_'\n"));
        assert!(script.ends_with("echo \"guest: done\"\n"));
        let plain = guest_script(&[binary], Path::new("/r"), Path::new("/s"), &[], None);
        assert!(!plain.contains("RDMA_TEST_REPEAT"));
    }
}
