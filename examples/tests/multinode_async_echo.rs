//! The tokio `async_echo` server between two hosts (`cargo xtask test --nodes 2`): eight
//! concurrent connections from node 1 to a server on node 0, every echoed byte checked; and
//! the server's process killed while the clients exchange, which every client notices within
//! its bound.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{
    finish_within, free_port, show, spawn_reading, start_cm_server, text, wait_for_lines,
};
use rdma_test_support::Cluster;

const PROGRAM: &str = env!("CARGO_BIN_EXE_async_echo");
const SERVER: usize = 0;
const BOUND: Duration = Duration::from_secs(180);

fn setup() -> Option<Cluster> {
    rdma_test_support::device()?;
    rdma_test_support::cluster()
}

/// Eight connections at once across hosts, 20 round trips of 8 KiB each (several packets per
/// message at the link's MTU); both sides' reports checked on their own node.
#[test]
fn async_echo_across_hosts() {
    let Some(c) = setup() else { return };
    let what = "async_echo across hosts: 8 connections";
    if c.node() == SERVER {
        let port = free_port();
        let server = start_cm_server(
            Command::new(PROGRAM)
                .args(["-s", "-a", &c.addr(SERVER).to_string()])
                .args(["-p", &port.to_string(), "-n", "8"]),
            port,
            BOUND,
            what,
        );
        c.publish("port", &port.to_string());
        let out = server.join().expect("the server's output");
        assert!(out.status.success(), "{what}: {}", show(&out));
        let report = text(&out.stdout);
        assert_eq!(
            report
                .lines()
                .filter(|l| l.starts_with(&format!("{}:", c.addr(c.peer())))
                    && l.ends_with(": echoed 20 messages of 8192 bytes"))
                .count(),
            8,
            "{what}: one line per connection from the client's host: {report}"
        );
        assert_eq!(
            report.lines().last(),
            Some("async_echo: served 8 connections, 0 ended early")
        );
    } else {
        let port = c.fetch(SERVER, "port");
        let out = finish_within(
            Command::new(PROGRAM)
                .args(["-c", "-a", &c.addr(SERVER).to_string(), "-p", &port])
                .args(["-n", "8", "-C", "20", "-S", "8192"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("start the client"),
            BOUND,
            what,
        );
        assert!(out.status.success(), "{what}: {}", show(&out));
        assert_eq!(
            text(&out.stdout).lines().last(),
            Some("async_echo: 8 connections, 160 round trips of 8192 bytes verified"),
            "{}",
            show(&out)
        );
    }
}

/// The server node kills its server while four connections from the other host exchange:
/// the client exits 1 with one line, within its bound.
#[test]
fn async_echo_server_node_killed_mid_transfer() {
    let Some(c) = setup() else { return };
    let what = "async_echo: server killed across hosts";
    if c.node() == SERVER {
        let port = free_port();
        let (mut server, _lines) = spawn_reading(
            PROGRAM,
            &[
                "-s",
                "-a",
                &c.addr(SERVER).to_string(),
                "-p",
                &port.to_string(),
                "-n",
                "0",
            ],
        );
        let started = std::time::Instant::now();
        while !common::cm_listening(port) {
            assert!(
                started.elapsed() < BOUND,
                "{what}: the server never listened"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        c.publish("port", &port.to_string());
        c.fetch(c.peer(), "connected");
        // Let them exchange for a while (the checks do not depend on how long).
        std::thread::sleep(Duration::from_millis(500));
        server.kill().expect("kill the server");
        server.wait().expect("reap the server");
        c.publish("killed", "yes");
    } else {
        let port = c.fetch(SERVER, "port");
        let (client, lines) = spawn_reading(
            PROGRAM,
            &[
                "-c",
                "-a",
                &c.addr(SERVER).to_string(),
                "-p",
                &port,
                "-n",
                "4",
                "-C",
                "100000000",
                "--timeout",
                "30",
            ],
        );
        wait_for_lines(&lines, ": connected", 4, BOUND, what);
        c.publish("connected", "yes");
        c.fetch(SERVER, "killed");
        let out = finish_within(client, BOUND, what);
        assert_eq!(out.status.code(), Some(1), "{what}: {}", show(&out));
        let stderr = text(&out.stderr);
        rdma_test_support::note(&format!("{what}: the client said {stderr:?}"));
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with("async_echo: connection ") && stderr.contains(": round "),
            "{stderr}"
        );
    }
}
