//! Bad input and faults for the pingpong programs, on the device: each gives one line on
//! stderr and a non-zero exit within a bounded time, never a hang or a panic. Also: options for
//! device features rxe lacks fail as the C program does, and `-c` fails on data that differs
//! from what the protocol says.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::free_port;
use rdma_test_support::TestDevice;

mod common;

const BOUND: Duration = Duration::from_secs(40);

fn rc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rc_pingpong"))
}

/// `ibv_rc_pingpong` on the test device and `port`.
fn c_rc(device: &TestDevice, port: u16) -> Command {
    let mut cmd = Command::new("ibv_rc_pingpong");
    cmd.args(["-d", &device.name])
        .args(["-g", &device.gid_index.to_string()])
        .args(["-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn ud() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ud_pingpong"))
}

fn base<'a>(cmd: &'a mut Command, device: &TestDevice, port: u16) -> &'a mut Command {
    cmd.args(["-d", &device.name])
        .args(["-g", &device.gid_index.to_string()])
        .args(["-p", &port.to_string()])
        .args(["--timeout", "5"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
}

fn finish(child: Child, what: &str) -> Output {
    common::finish_within(child, BOUND, what)
}

/// The process failed with exactly one line on stderr that contains `expected`.
fn assert_one_line_error(out: &Output, expected: &str, what: &str) {
    assert_one_line_error_of("rc_pingpong", out, expected, what);
}

/// `program` failed with exactly one line on stderr, `program: ...` containing `expected`.
fn assert_one_line_error_of(program: &str, out: &Output, expected: &str, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{what}: exited 0\nstderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{what}: panicked: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "{what}: expected one line on stderr, got:\n{stderr}"
    );
    assert!(
        lines[0].starts_with(&format!("{program}: ")) && lines[0].contains(expected),
        "{what}: expected {expected:?} in {:?}",
        lines[0]
    );
}

#[test]
fn pingpong_fault_unknown_device() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let mut cmd = rc();
    base(&mut cmd, &device, free_port()).args(["-d", "nosuchdev0"]);
    let out = finish(cmd.spawn().expect("spawn"), "unknown device");
    assert_one_line_error(&out, "IB device nosuchdev0 not found", "unknown device");
}

#[test]
fn pingpong_fault_bad_gid_index_and_port() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let mut cmd = rc();
    base(&mut cmd, &device, free_port()).args(["-g", "4000"]);
    let out = finish(cmd.spawn().expect("spawn"), "bad GID index");
    assert_one_line_error(&out, "sgid of index 4000", "bad GID index");

    let mut cmd = rc();
    base(&mut cmd, &device, free_port()).args(["-i", "7"]);
    let out = finish(cmd.spawn().expect("spawn"), "missing port");
    assert_one_line_error(&out, "port 7", "missing port");

    let mut cmd = rc();
    base(&mut cmd, &device, free_port()).args(["-m", "1500"]);
    let out = finish(cmd.spawn().expect("spawn"), "bad MTU");
    assert_one_line_error(&out, "invalid MTU 1500", "bad MTU");
}

#[test]
fn pingpong_fault_connection_refused() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let port = free_port();
    let mut cmd = rc();
    base(&mut cmd, &device, port).arg("127.0.0.1");
    let out = finish(cmd.spawn().expect("spawn"), "connection refused");
    assert_one_line_error(&out, "couldn't connect to 127.0.0.1", "connection refused");
}

/// A fake server that answers a client's record with `reply` and then closes.
fn fake_server(reply: &'static [u8]) -> (u16, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let handle = std::thread::spawn(move || {
        if let Ok((mut stream, _)) = listener.accept() {
            let mut record = [0u8; 52];
            let _ = stream.read_exact(&mut record);
            let _ = stream.write_all(reply);
        }
    });
    (port, handle)
}

#[test]
fn pingpong_fault_malformed_and_short_records() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let cases: [(&'static [u8], &str); 3] = [
        (
            b"this is not an address record at all, not even hex!\0",
            "malformed",
        ),
        (
            b"0000:zzzzzz:000000:00000000000000000000000000000000\0",
            "malformed QPN",
        ),
        (b"0000:0000", "couldn't read remote address"),
    ];
    for (reply, expected) in cases {
        let (port, server) = fake_server(reply);
        let mut cmd = rc();
        base(&mut cmd, &device, port).arg("127.0.0.1");
        let out = finish(cmd.spawn().expect("spawn"), expected);
        assert_one_line_error(&out, expected, expected);
        server.join().expect("fake server");
    }

    // A client that sends garbage to a real server.
    let port = free_port();
    let mut cmd = rc();
    let server = base(&mut cmd, &device, port).spawn().expect("spawn");
    let deadline = Instant::now() + BOUND;
    let mut stream = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(stream) => break stream,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("server never listened: {e}"),
        }
    };
    stream.write_all(&[b'x'; 52]).expect("write");
    let out = finish(server, "server given garbage");
    assert_one_line_error(&out, "malformed", "server given garbage");
}

#[test]
fn pingpong_fault_peer_dies_mid_run() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let port = free_port();
    // Enough iterations that the run is still going when the client is killed.
    let mut server_cmd = rc();
    base(&mut server_cmd, &device, port).args(["-n", "100000000", "-s", "64"]);
    let server = server_cmd.spawn().expect("spawn server");
    common::await_listening(port, BOUND, "server");
    let mut client_cmd = rc();
    base(&mut client_cmd, &device, port)
        .args(["-n", "100000000", "-s", "64"])
        .arg("127.0.0.1");
    let mut client = client_cmd.spawn().expect("spawn client");
    // Wait until the client has exchanged addresses (it prints the remote address then).
    let stdout = client.stdout.take().expect("client stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("remote address:") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(BOUND).expect("the client never connected");
    // Let traffic flow, then kill the client without warning.
    std::thread::sleep(Duration::from_secs(1));
    client.kill().expect("kill client");
    let _ = client.wait();
    let out = finish(server, "server after the client died");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "server exited 0 after its peer died");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line on stderr: {stderr}");
    assert!(
        stderr.contains("Failed status") || stderr.contains("no completion for"),
        "{stderr}"
    );
}

/// `-o`, `-O`, `-P`, `-t` and `-j` on a device that lacks what they ask for (rxe lacks on-demand
/// paging, completion timestamps and device memory; the test checks that first): the Rust
/// program fails with the C program's message, as the C program does, before any exchange.
#[test]
fn pingpong_fault_missing_device_features_fail_like_c() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let context = rdma_verbs::Context::open(&device.name).expect("open the device");
    let attr = context.query_device().expect("query the device");
    assert_eq!(
        attr.odp_general_caps & u64::from(rdma_verbs::ffi::IBV_ODP_SUPPORT),
        0,
        "this test expects a device without on-demand paging (rxe)"
    );
    assert_eq!(
        attr.completion_timestamp_mask, 0,
        "expects no completion timestamps"
    );
    assert_eq!(attr.max_dm_size, 0, "expects no device memory");
    drop(context);
    let cases: [(&[&str], &str); 8] = [
        (
            &["-o"],
            "The device isn't ODP capable or does not support RC send and receive with ODP",
        ),
        (
            &["-O"],
            "The device isn't ODP capable or does not support RC send and receive with ODP",
        ),
        (
            &["-o", "-P"],
            "The device isn't ODP capable or does not support RC send and receive with ODP",
        ),
        (
            &["-P"],
            "prefetch is valid only with on-demand memory region",
        ),
        (&["-t"], "The device isn't completion timestamp capable"),
        (&["-j"], "Device doesn't support dm allocation"),
        (&["-o", "-j"], "DM memory region can't be on demand"),
        (
            &["-N", "-t"],
            "The device isn't completion timestamp capable",
        ),
    ];
    for (flags, message) in cases {
        let what = format!("rc_pingpong {}", flags.join(" "));
        // Both as servers: each fails before it listens. (The C program has no --timeout.)
        let mut c = c_rc(&device, free_port());
        c.args(flags);
        let c_out = finish(c.spawn().expect("spawn ibv_rc_pingpong"), &what);
        let c_stderr = String::from_utf8_lossy(&c_out.stderr);
        assert!(!c_out.status.success(), "C {what}: exited 0");
        assert_eq!(
            c_stderr.trim_end(),
            message,
            "C {what}: its message changed"
        );

        let mut rust = rc();
        base(&mut rust, &device, free_port()).args(flags);
        let out = finish(rust.spawn().expect("spawn"), &what);
        assert_one_line_error(&out, message, &what);
        assert_eq!(
            String::from_utf8_lossy(&out.stderr).trim_end(),
            format!("rc_pingpong: {message}"),
            "{what}"
        );
        assert_eq!(out.status.code(), c_out.status.code(), "{what}: exit code");
    }
}

/// Starts `server` (listening on `port`), then `client`; returns both outputs.
fn run_pair(mut server: Command, mut client: Command, port: u16, what: &str) -> (Output, Output) {
    let server = server.spawn().expect("spawn server");
    common::await_listening(port, BOUND, what);
    let client = client.spawn().expect("spawn client");
    let client_out = finish(client, &format!("{what}: client"));
    let server_out = finish(server, &format!("{what}: server"));
    (server_out, client_out)
}

/// `-c` on a server whose client sends other data than the protocol says: a client without
/// `-c` leaves out the page markers (0 at each page start), so the server's last message has
/// 0x7b at byte 0. The C client does not check and exits 0; the Rust server fails, after its
/// result lines, with one line naming the byte.
#[test]
fn pingpong_fault_data_mismatch_fails_the_check() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    // C client without -c against a Rust rc server with -c.
    let port = free_port();
    let mut server = rc();
    base(&mut server, &device, port).args(["-c", "-n", "20", "-s", "4096"]);
    let mut client = c_rc(&device, port);
    client.args(["-n", "20", "-s", "4096", "127.0.0.1"]);
    let (server_out, client_out) = run_pair(server, client, port, "rc mismatch");
    assert!(
        client_out.status.success(),
        "the C client: {}",
        String::from_utf8_lossy(&client_out.stderr)
    );
    let stdout = String::from_utf8_lossy(&server_out.stdout);
    assert!(stdout.contains("20 iters in "), "the loop ran: {stdout}");
    assert_one_line_error(
        &server_out,
        "invalid data in page 0: byte 0 is 0x7b, expected 0x00 (1 of 4096 bytes wrong)",
        "rc server -c, C client without -c",
    );

    // The same between two Rust UD programs: the client without -c.
    let port = free_port();
    let mut server = ud();
    base(&mut server, &device, port).args(["-c", "-n", "20", "-s", "1000"]);
    let mut client = ud();
    base(&mut client, &device, port).args(["-n", "20", "-s", "1000", "127.0.0.1"]);
    let (server_out, client_out) = run_pair(server, client, port, "ud mismatch");
    assert!(
        client_out.status.success(),
        "the client: {}",
        String::from_utf8_lossy(&client_out.stderr)
    );
    assert_one_line_error_of(
        "ud_pingpong",
        &server_out,
        "invalid data in page 0: byte 0 is 0x7b, expected 0x00 (1 of 1000 bytes wrong)",
        "ud server -c, client without -c",
    );
}

/// srq_pingpong checks every message as it arrives with `-c`: a client sending 2048-byte
/// messages to a server expecting 4096 fails the server's check on the first one, with one
/// line; the client, whose peer is gone, fails within its timeout instead of hanging.
#[test]
fn pingpong_fault_srq_checks_each_message() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let srq = || Command::new(env!("CARGO_BIN_EXE_srq_pingpong"));
    let port = free_port();
    let mut server = srq();
    base(&mut server, &device, port).args(["-c", "-n", "20", "-s", "4096", "-q", "2"]);
    let mut client = srq();
    base(&mut client, &device, port).args(["-n", "20", "-s", "2048", "-q", "2", "127.0.0.1"]);
    let (server_out, client_out) = run_pair(server, client, port, "srq size mismatch");
    assert_one_line_error_of(
        "srq_pingpong",
        &server_out,
        "invalid data: received 2048 bytes, expected 4096",
        "srq server -c, client sending 2048 bytes",
    );
    let stdout = String::from_utf8_lossy(&server_out.stdout);
    assert!(
        !stdout.contains("iters in"),
        "the loop ended early: {stdout}"
    );
    assert!(
        !client_out.status.success(),
        "the client's peer died: {}",
        String::from_utf8_lossy(&client_out.stderr)
    );
}
