//! What the DSM's device test files share: bounded runs of the `dsm` binary and their output.

use std::io::Read;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rdma_test_support::TestDevice;

/// The binary under test.
pub(crate) const DSM: &str = env!("CARGO_BIN_EXE_dsm");

/// How long one run may take (TCG is slow; a hang fails the test instead of the suite).
pub(crate) const BOUND: Duration = Duration::from_secs(240);

/// Waits for `child` at most `bound`, reading its output as it runs; kills it after.
pub(crate) fn finish(mut child: Child, bound: Duration, what: &str) -> Output {
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let out = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stdout.read_to_end(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stderr.read_to_end(&mut s);
        s
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > bound {
            let _ = child.kill();
            let _ = child.wait();
            // Killed, its pipes close: what it wrote says where it was.
            let err = err.join().unwrap_or_default();
            panic!(
                "{what}: still running after {} s; its stderr:\n{}",
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

/// Output bytes as text.
pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// One rank of a job launched by hand (the variables a scheduler would set), output piped:
/// `dsm <app>` as rank `rank` of `size`, meeting at `rendezvous`, over `transport` on
/// `device`, with an 8 MiB window and the peer bound `timeout_ms`.
#[allow(
    dead_code,
    reason = "each test file is a crate of its own; not all use this"
)]
pub(crate) fn rank(
    device: &TestDevice,
    transport: &str,
    rank: usize,
    size: usize,
    rendezvous: &str,
    timeout_ms: u32,
    app: &[&str],
) -> Child {
    Command::new(DSM)
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
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn a rank")
}
