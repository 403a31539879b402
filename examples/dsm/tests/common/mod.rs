//! What the DSM's test files share: bounded runs of the `dsm` binary and their output, and the
//! cases that run the same with a device and without one ([`cases`]).

pub(crate) mod cases;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdma_test_support::TestDevice;

/// The binary under test.
pub(crate) const DSM: &str = env!("CARGO_BIN_EXE_dsm");

/// How long one run may take (TCG is slow; a hang fails the test instead of the suite).
pub(crate) const BOUND: Duration = Duration::from_secs(240);

/// Waits for `child` at most `bound`, reading its output as it runs; kills it after.
pub(crate) fn finish(mut child: Child, bound: Duration, what: &str) -> Output {
    let mut stderr = child.stderr.take().expect("piped stderr");
    let err = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stderr.read_to_end(&mut s);
        s
    });
    finish_reading(child, err, bound, what)
}

/// A running `dsm` process whose stderr is read line by line as it comes, so that a test can
/// act on what it says mid-run.
#[allow(
    dead_code,
    reason = "each test file is a crate of its own; not all use this"
)]
pub(crate) struct Watched {
    /// `None` once [`finish`](Self::finish) took them.
    child: Option<Child>,
    err: Option<JoinHandle<Vec<u8>>>,
    lines: Receiver<String>,
}

#[allow(
    dead_code,
    reason = "each test file is a crate of its own; not all use this"
)]
impl Watched {
    /// Starts reading `child`'s stderr (piped).
    pub(crate) fn new(mut child: Child) -> Self {
        let stderr = child.stderr.take().expect("piped stderr");
        let (send, lines) = mpsc::channel();
        let err = std::thread::spawn(move || {
            let mut stderr = BufReader::new(stderr);
            let mut all = Vec::new();
            loop {
                let start = all.len();
                match stderr.read_until(b'\n', &mut all) {
                    Ok(0) | Err(_) => break all,
                    Ok(_) => {
                        let line = text(&all[start..]).trim_end_matches('\n').to_string();
                        // The test may have stopped listening; the bytes are still kept.
                        let _ = send.send(line);
                    }
                }
            }
        });
        Self {
            child: Some(child),
            err: Some(err),
            lines,
        }
    }

    /// Whether the process writes the line `line` within `bound` (`false` if it ends first).
    pub(crate) fn wait_for_line(&self, line: &str, bound: Duration) -> bool {
        let deadline = Instant::now() + bound;
        loop {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            let left = deadline - now;
            match self.lines.recv_timeout(left) {
                Ok(got) if got == line => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
    }

    /// As [`finish`]: waits at most `bound`, kills it after.
    pub(crate) fn finish(mut self, bound: Duration, what: &str) -> Output {
        let (Some(child), Some(err)) = (self.child.take(), self.err.take()) else {
            unreachable!("finish takes the watch by value, once");
        };
        finish_reading(child, err, bound, what)
    }
}

impl Drop for Watched {
    /// A test that panics before [`finish`](Watched::finish) leaves no process behind.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// [`finish`], with `err` already reading the child's stderr.
fn finish_reading(
    mut child: Child,
    err: JoinHandle<Vec<u8>>,
    bound: Duration,
    what: &str,
) -> Output {
    let mut stdout = child.stdout.take().expect("piped stdout");
    let out = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stdout.read_to_end(&mut s);
        s
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > bound {
            // Where each thread is, read before the kill changes it.
            let threads = threads(child.id());
            let _ = child.kill();
            if !reaped(&mut child, Duration::from_secs(30)) {
                panic!(
                    "{what}: still running after {} s, and not gone 30 s after SIGKILL \
                     (stuck in the kernel); its threads:\n{threads}\nnow:\n{}",
                    bound.as_secs(),
                    self::threads(child.id())
                );
            }
            // Killed, its pipes close: what it wrote says where it was.
            let err = err.join().unwrap_or_default();
            panic!(
                "{what}: still running after {} s; its threads:\n{threads}\nits stderr:\n{}",
                bound.as_secs(),
                text(&err)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    }
}

/// Whether `child` exited within `bound` (after a kill).
fn reaped(child: &mut Child, bound: Duration) -> bool {
    let started = Instant::now();
    while started.elapsed() < bound {
        if let Ok(Some(_)) = child.try_wait() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// One line per thread of process `pid`: its id, name, state, wait channel and system call,
/// then its kernel stack where it can be read (as root, as in the VM).
fn threads(pid: u32) -> String {
    let read = |path: String| std::fs::read_to_string(path).unwrap_or_default();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return format!("(no /proc/{pid}/task)");
    };
    let mut lines = String::new();
    for task in tasks.flatten() {
        let dir = task.path().display().to_string();
        let stat = read(format!("{dir}/stat"));
        // The state is the field after the name, which ends at the last ')'.
        let state = stat
            .rfind(')')
            .and_then(|at| stat[at + 1..].split_whitespace().next())
            .unwrap_or("?");
        lines += &format!(
            "  {} {} {state} wchan={} syscall={}\n",
            task.file_name().to_string_lossy(),
            read(format!("{dir}/comm")).trim(),
            read(format!("{dir}/wchan")).trim(),
            read(format!("{dir}/syscall")).trim(),
        );
        for frame in read(format!("{dir}/stack")).lines() {
            lines += &format!("      {frame}\n");
        }
    }
    lines
}

/// The values of the statistics table's row `name` in `out` (one per node, then the total).
#[allow(
    dead_code,
    reason = "each test file is a crate of its own; not all use this"
)]
pub(crate) fn stats_row(out: &str, name: &str) -> Vec<u64> {
    out.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no {name} row:\n{out}"))
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().expect("a number"))
        .collect()
}

/// Fails unless the run succeeded; returns its standard output.
#[allow(
    dead_code,
    reason = "each test file is a crate of its own; not all use this"
)]
pub(crate) fn ok(output: Output, what: &str) -> String {
    assert!(
        output.status.success(),
        "{what}: {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    );
    text(&output.stdout)
}

/// Output bytes as text.
pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The command of one rank of a job launched by hand (the variables a scheduler would set),
/// output piped: `dsm <app>` as rank `rank` of `size`, meeting at `rendezvous`, over
/// `transport` on `device`, with an 8 MiB window and the peer bound `timeout_ms`. A test
/// spawns it, after adding to it what it needs.
#[allow(
    dead_code,
    reason = "each test file is a crate of its own; not all use this"
)]
pub(crate) fn rank_command(
    device: &TestDevice,
    transport: &str,
    rank: usize,
    size: usize,
    rendezvous: &str,
    timeout_ms: u32,
    app: &[&str],
) -> Command {
    let mut command = Command::new(DSM);
    command
        .args(app)
        .env("DSM_RANK", rank.to_string())
        .env("DSM_SIZE", size.to_string())
        .env("DSM_RENDEZVOUS", rendezvous)
        .env("DSM_TRANSPORT", transport)
        .env("DSM_DEVICE", &device.name)
        .env("DSM_GID_INDEX", device.gid_index.to_string())
        .env("DSM_WINDOW_MIB", "8")
        .env("DSM_TIMEOUT_MS", timeout_ms.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}
