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

/// Waits until something listens on TCP `port`; fails the test, naming `what`, after `bound`.
pub(crate) fn await_listening(port: u16, bound: std::time::Duration, what: &str) {
    let started = std::time::Instant::now();
    while !listening(port) {
        assert!(
            started.elapsed() < bound,
            "{what}: the server never listened on {port}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Starts `server`, waits until it listens on TCP `port`, runs `client` against it, and
/// waits for both (each at most `bound`); both outputs, the server's first.
pub(crate) fn run_server_client(
    server: &mut std::process::Command,
    client: &mut std::process::Command,
    port: u16,
    bound: std::time::Duration,
) -> (std::process::Output, std::process::Output) {
    let server = server.spawn().expect("spawn server");
    await_listening(port, bound, "server");
    let client = client.spawn().expect("spawn client");
    let client = finish_within(client, bound, "client");
    let server = finish_within(server, bound, "server");
    (server, client)
}

/// A free TCP port (bound, then released).
pub(crate) fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

/// Waits for `child` for at most `bound`; kills it and fails the test if it is still running,
/// with what it printed. Its standard output and error (when piped) are read while it runs, so
/// a child printing more than a pipe holds does not stall on a full pipe.
pub(crate) fn finish_within(
    mut child: std::process::Child,
    bound: std::time::Duration,
    what: &str,
) -> std::process::Output {
    use std::io::Read;
    fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    }
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = std::time::Instant::now() + bound;
    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            timed_out = true;
            let _ = child.kill();
            break child.wait().expect("wait");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let output = std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    };
    if timed_out {
        panic!(
            "{what}: still running after {bound:?}\nstdout:\n{}\nstderr:\n{}",
            shorten(&output.stdout),
            shorten(&output.stderr)
        );
    }
    output
}

/// `bytes` as text with every line cut to 200 characters, for failure messages.
pub(crate) fn shorten(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .lines()
        .map(|line| match line.char_indices().nth(200) {
            Some((cut, _)) => format!("{}... ({} more bytes)", &line[..cut], line.len() - cut),
            None => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
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

/// Whether an rdma_cm identifier of this host listens on `port` (`rdma resource show cm_id`;
/// rdma_cm listeners are not in /proc/net/tcp).
pub(crate) fn cm_listening(port: u16) -> bool {
    std::process::Command::new("rdma")
        .args(["resource", "show", "cm_id"])
        .output()
        .is_ok_and(|out| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .any(|l| l.contains("LISTEN") && l.contains(&format!(":{port} ")))
        })
}

/// The text of `rping` ping `ping` of `size` bytes: `rdma-ping-N: ` and letters from `A` + N
/// (mod 58) through `z`, wrapping to `A`, `size - 1` characters in all.
pub(crate) fn rping_text(ping: usize, size: usize) -> String {
    let mut text = format!("rdma-ping-{ping}: ");
    text.truncate(size - 1);
    let mut c = b'A' + (ping % 58) as u8;
    while text.len() < size - 1 {
        text.push(c as char);
        c = if c >= b'z' { b'A' } else { c + 1 };
    }
    text
}

/// A process's exit and output (lines cut to 200 characters), for failure messages.
pub(crate) fn show(out: &std::process::Output) -> String {
    format!(
        "({})\nstdout:\n{}\nstderr:\n{}",
        out.status,
        shorten(&out.stdout),
        shorten(&out.stderr)
    )
}

/// Bytes a process printed, as text.
pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Starts `cmd` (a connection-manager server), piping its output; waits (at most 30 s) until
/// an rdma_cm identifier of this host listens on `port` and then, in a thread, until the server
/// ends (at most `bound`), reading its output meanwhile. Join the handle for that output. A
/// server that exits before it listens fails the test with what it printed.
pub(crate) fn start_cm_server(
    cmd: &mut std::process::Command,
    port: u16,
    bound: std::time::Duration,
    what: &str,
) -> std::thread::JoinHandle<std::process::Output> {
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: start the server: {e}"));
    let started = std::time::Instant::now();
    while !cm_listening(port) {
        if child.try_wait().ok().flatten().is_some() {
            let out = finish_within(child, bound, what);
            panic!(
                "{what}: the server ended before it listened: {}",
                show(&out)
            );
        }
        if started.elapsed() > std::time::Duration::from_secs(30) {
            let _ = child.kill();
            let out = finish_within(child, bound, what);
            panic!(
                "{what}: the server never listened on {port}: {}",
                show(&out)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let what = what.to_string();
    std::thread::spawn(move || finish_within(child, bound, &what))
}

/// Runs `client` (output piped, at most `bound`) against the server `start_cm_server` started,
/// then waits for that server; fails the test unless both succeeded. Returns the server's and
/// the client's output.
pub(crate) fn run_against(
    client: &mut std::process::Command,
    server: std::thread::JoinHandle<std::process::Output>,
    bound: std::time::Duration,
    what: &str,
) -> (std::process::Output, std::process::Output) {
    run_against_tolerating(client, server, bound, what, |_| false)
}

/// C `rping` before rdma-core 59 (commit f3ae6534a, "rping: terminate CM event thread before
/// exiting") can fail after a run that succeeded: its main thread destroys the CM event
/// channel while the event thread, done with the last event, is about to wait on it again,
/// and that wait's `EBADF` exits the process with status 255. The installed rdma-core 44
/// has the race. Whether an output is exactly that: status 255, and standard error ending in
/// the `DISCONNECT EVENT...` line (the last event, handled) and the failed wait. The caller
/// still checks every data line the process printed.
pub(crate) fn is_c_rping_teardown_race(out: &std::process::Output) -> bool {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    out.status.code() == Some(255)
        && lines.len() >= 2
        && lines[lines.len() - 2].ends_with("DISCONNECT EVENT...")
        && lines[lines.len() - 1] == "rdma_get_cm_event: Bad file descriptor"
}

/// [`run_against`], where an output (the client's or the server's) for which `tolerated` is
/// true passes as a success (with a note on standard error).
pub(crate) fn run_against_tolerating(
    client: &mut std::process::Command,
    server: std::thread::JoinHandle<std::process::Output>,
    bound: std::time::Duration,
    what: &str,
    tolerated: impl Fn(&std::process::Output) -> bool,
) -> (std::process::Output, std::process::Output) {
    use std::process::Stdio;
    let client_out = finish_within(
        client
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{what}: start the client: {e}")),
        bound,
        &format!("{what}: client"),
    );
    let server_out = server.join().expect("the server's output");
    let ok = |out: &std::process::Output, side: &str| {
        let tolerated = !out.status.success() && tolerated(out);
        if tolerated {
            eprintln!("{what}: the {side}'s known teardown failure, tolerated");
        }
        out.status.success() || tolerated
    };
    assert!(
        ok(&client_out, "client") & ok(&server_out, "server"),
        "{what}\nserver {}\nclient {}",
        show(&server_out),
        show(&client_out)
    );
    (server_out, client_out)
}

/// Runs `program` with `args` (at most `bound`) and checks that it failed the examples' way:
/// exit status 1 and one line on standard error, starting with `want`.
pub(crate) fn assert_refused(program: &str, args: &[&str], want: &str, bound: std::time::Duration) {
    use std::process::Stdio;
    let out = finish_within(
        std::process::Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("run {program}: {e}")),
        bound,
        &format!("{program} {args:?}"),
    );
    assert_eq!(out.status.code(), Some(1), "{args:?}: {}", show(&out));
    let stderr = text(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
    assert!(stderr.starts_with(want), "{args:?}: {stderr}");
}

/// Starts `program` with `args` (standard error piped); its standard output is read line by
/// line, as it comes, into the returned receiver.
pub(crate) fn spawn_reading(
    program: &str,
    args: &[&str],
) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    use std::io::BufRead;
    use std::process::Stdio;
    let mut child = std::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {program}: {e}"));
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// [`spawn_reading`] with the program's standard output line-buffered (`stdbuf -oL`): a C
/// program's `printf` to a pipe otherwise stays in its buffer until it exits, and a test that
/// waits for a line in the middle would wait for nothing.
pub(crate) fn spawn_line_buffered(
    program: &str,
    args: &[&str],
) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let mut all = vec!["-oL", program];
    all.extend(args);
    spawn_reading("stdbuf", &all)
}

/// Waits until `count` lines ending with `suffix` came from `lines`, each within `bound`.
pub(crate) fn wait_for_lines(
    lines: &std::sync::mpsc::Receiver<String>,
    suffix: &str,
    count: usize,
    bound: std::time::Duration,
    what: &str,
) {
    let mut seen = 0;
    while seen < count {
        let line = lines
            .recv_timeout(bound)
            .unwrap_or_else(|_| panic!("{what}: {seen} of {count} lines ending {suffix:?}"));
        if line.ends_with(suffix) {
            seen += 1;
        }
    }
}

/// Which implementation of a tool runs on one side of an interop test.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// Ours: the example binary `rust` (a `CARGO_BIN_EXE_*` path).
    Rust,
    /// rdma-core's program of that name, from `PATH`.
    C,
}

impl Side {
    /// The program to run for this side.
    pub(crate) fn program(self, rust: &'static str, c: &'static str) -> &'static str {
        match self {
            Side::Rust => rust,
            Side::C => c,
        }
    }
}

/// `mckey`'s report lines: of a receiver (`sender` false) or a sender with `connections` joins.
pub(crate) fn mckey_lines(sender: bool, group: &str, connections: usize) -> Vec<String> {
    let mut lines = vec![
        format!(
            "mckey: starting {}",
            if sender { "client" } else { "server" }
        ),
        "mckey: joining".to_string(),
    ];
    for _ in 0..connections {
        lines.push(format!("mckey: joined dgid: ::ffff:{group} mlid 0x0 sl 0"));
    }
    lines.push(
        if sender {
            "initiating data transfers"
        } else {
            "receiving data transfers"
        }
        .to_string(),
    );
    for line in [
        "data transfers complete",
        "test complete",
        "return status 0",
    ] {
        lines.push(line.to_string());
    }
    lines
}
