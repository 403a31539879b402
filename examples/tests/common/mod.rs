//! Helpers shared by the example programs' tests.

#![allow(dead_code)] // each test binary uses a different part

/// Whether something listens on TCP `port` (from /proc/net/tcp*, without connecting: the
/// pingpong server accepts exactly one connection).
pub(crate) fn listening(port: u16) -> bool {
    let wanted = format!(":{port:04X} ");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|file| {
        std::fs::read_to_string(file).is_ok_and(|text| {
            text.lines()
                .skip(1)
                .any(|line| line.contains(&wanted) && line.split_whitespace().nth(3) == Some("0A"))
        })
    })
}

/// A free TCP port (bound, then released).
pub(crate) fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

/// Waits for `child` for at most `bound`; kills it and fails the test if it is still running,
/// with what it printed.
pub(crate) fn finish_within(
    mut child: std::process::Child,
    bound: std::time::Duration,
    what: &str,
) -> std::process::Output {
    let deadline = std::time::Instant::now() + bound;
    while child.try_wait().expect("try_wait").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "{what}: still running after {bound:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// A safe example (`rdma_rw`, `atomic_counter`) on `device` with TCP port `port`, its exchange
/// bounded by `timeout` seconds, with `extra` arguments; output piped.
pub(crate) fn safe_example(
    path: &str,
    device: &rdma_test_support::TestDevice,
    port: u16,
    timeout: u32,
    extra: &[&str],
) -> std::process::Command {
    let mut cmd = std::process::Command::new(path);
    cmd.args(["-d", &device.name])
        .args(["-g", &device.gid_index.to_string()])
        .args(["-p", &port.to_string()])
        .args(["--timeout", &timeout.to_string()])
        .args(extra)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    cmd
}
