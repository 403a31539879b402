//! The DSM across hosts (`cargo xtask test --nodes N`): jobs whose ranks are spread over the
//! pair of VMs (rank r on node r mod 2), so pages, locks and barriers cross the virtual wire:
//! the counter and SOR with 2 and 4 ranks over `rdma-read` and `tcp`, a rank killed on one
//! host while the other waits for it, a host silenced mid-run, and a host whose link goes down
//! while its rank waits for a lock the other host's rank holds; and jobs of one rank per VM of
//! the whole run (2 VMs with `--nodes 2`, 4 with `--nodes 4`). Every process is bounded.

mod common;

use std::io::Write as _;
use std::process::{Child, Output};
use std::time::{Duration, Instant};

use common::{BOUND, Watched, finish, text};
use rdma_test_support::{Cluster, TestDevice};

fn setup() -> Option<(TestDevice, Cluster)> {
    let device = rdma_test_support::device()?;
    let cluster = rdma_test_support::cluster()?;
    Some((device, cluster))
}

/// Runs this host's ranks of a `size`-rank job of `dsm <app>` over `transport`, rank 0 on
/// node 0 listening at the rendezvous (its port published under `key`); returns each local
/// rank's output.
fn job(
    c: &Cluster,
    device: &TestDevice,
    transport: &str,
    size: u16,
    app: &[&str],
    key: &str,
) -> Vec<(u16, Output)> {
    let rendezvous = rendezvous(c, key);
    let children: Vec<(u16, Child)> = (0..size)
        .filter(|r| usize::from(*r) % 2 == c.node())
        .map(|rank| {
            let child = common::rank_command(
                device,
                transport,
                usize::from(rank),
                usize::from(size),
                &rendezvous,
                30_000,
                app,
            )
            .spawn()
            .expect("spawn a rank");
            (rank, child)
        })
        .collect();
    let outputs = children
        .into_iter()
        .map(|(rank, child)| (rank, finish(child, BOUND, &format!("{key}: rank {rank}"))))
        .collect();
    c.barrier(&format!("{key}-done"));
    outputs
}

/// Checks that a rank of a two-rank job exited 1 naming the other rank (on the other VM) as
/// the cause; returns the line that names it.
fn named_the_other(c: &Cluster, out: &Output, what: &str) -> String {
    let peer = 1 - c.node();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{what}: {err}");
    // Named as the cause: `dsm: node P: ...`, or inside a failed fault's line
    // (`dsm: node N: the access at ... cannot be served: node P: ...`).
    let named = format!("node {peer}: ");
    err.lines()
        .find(|l| l.starts_with("dsm: ") && l.contains(&named))
        .unwrap_or_else(|| panic!("{what}: the other node is not named:\n{err}"))
        .to_string()
}

/// The rendezvous of a job: node 0's address, at a port free on node 0, which it publishes
/// under `key` and node 1 fetches.
fn rendezvous(c: &Cluster, key: &str) -> String {
    let port = if c.node() == 0 {
        let port = std::net::TcpListener::bind((c.addr(0), 0))
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        c.publish(key, &port.to_string());
        port.to_string()
    } else {
        c.fetch(0, key)
    };
    format!("{}:{port}", c.addr(0))
}

fn all_ok(outputs: &[(u16, Output)], what: &str) {
    for (rank, out) in outputs {
        assert!(
            out.status.success(),
            "{what}: rank {rank}: {}\n{}",
            out.status,
            text(&out.stderr)
        );
    }
}

#[test]
fn multinode_dsm_counter_and_sor_across_hosts() {
    let Some((device, c)) = setup() else { return };
    for transport in ["rdma-read", "tcp"] {
        for size in [2u16, 4] {
            let what = format!("counter, {size} ranks over {transport}");
            let key = format!("counter-{transport}-{size}");
            let outputs = job(
                &c,
                &device,
                transport,
                size,
                &["counter", "--increments", "30"],
                &key,
            );
            all_ok(&outputs, &what);
            if c.node() == 0 {
                let out = text(&outputs[0].1.stdout);
                assert_eq!(
                    out.trim(),
                    format!(
                        "counter: {} after 30 increments on each of {size} nodes",
                        30 * size
                    ),
                    "{what}"
                );
            }
            let what = format!("sor, {size} ranks over {transport}");
            let key = format!("sor-{transport}-{size}");
            let outputs = job(
                &c,
                &device,
                transport,
                size,
                &["sor", "--n", "40", "--iterations", "4"],
                &key,
            );
            all_ok(&outputs, &what);
            if c.node() == 0 {
                let out = text(&outputs[0].1.stdout);
                assert!(
                    out.starts_with(
                        "sor: 40 x 40, 4 sweeps, every cell equal to the single-node run, sum 1898.822582543129"
                    ),
                    "{what}: {out}"
                );
            }
        }
    }
}

#[test]
fn multinode_dsm_a_rank_killed_on_one_host_stops_the_other() {
    let Some((device, c)) = setup() else { return };
    for transport in ["rdma-read", "tcp"] {
        let key = format!("die-{transport}");
        let started = Instant::now();
        let outputs = job(&c, &device, transport, 2, &["die", "--victim", "1"], &key);
        let (rank, out) = &outputs[0];
        if c.node() == 1 {
            assert_eq!(*rank, 1);
            assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
        } else {
            assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
            let err = text(&out.stderr);
            assert!(
                err.starts_with("dsm: node 1: died (its connection closed without it leaving)"),
                "{transport}: {err}"
            );
            assert!(started.elapsed() < Duration::from_secs(120), "{transport}");
        }
    }
}

/// The whole run's VMs (not only this test's pair): this VM's number, how many there are and
/// their addresses, from the harness's variables.
fn whole_cluster() -> (usize, usize, Vec<String>) {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let node: usize = var(rdma_test_support::cluster::ENV_NODE)
        .parse()
        .expect("a node number");
    let addrs: Vec<String> = var(rdma_test_support::cluster::ENV_NODE_ADDRS)
        .split(',')
        .map(str::to_string)
        .collect();
    let nodes: usize = var(rdma_test_support::cluster::ENV_NODES)
        .parse()
        .expect("a count");
    assert_eq!(addrs.len(), nodes);
    (node, nodes, addrs)
}

#[test]
fn multinode_dsm_one_rank_per_vm_of_the_whole_run() {
    let Some((device, _pair)) = setup() else {
        return;
    };
    let (node, nodes, addrs) = whole_cluster();
    let jobs: [(&str, &[&str]); 4] = [
        ("rdma-read", &["counter", "--increments", "20"]),
        ("rdma-read", &["sor", "--n", "40", "--iterations", "4"]),
        ("tcp", &["counter", "--increments", "20"]),
        ("tcp", &["sor", "--n", "40", "--iterations", "4"]),
    ];
    for (i, (transport, app)) in jobs.into_iter().enumerate() {
        // Rank 0 (VM 0) listens at a port every VM knows: one per job, so a job never meets
        // the previous one's rendezvous.
        let rendezvous = format!("{}:{}", addrs[0], 17300 + i);
        let what = format!("{} on {nodes} VMs over {transport}", app.join(" "));
        let child = common::rank_command(&device, transport, node, nodes, &rendezvous, 60_000, app)
            .spawn()
            .expect("spawn a rank");
        let out = finish(child, BOUND, &what);
        assert!(out.status.success(), "{what}: {}", text(&out.stderr));
        if node == 0 {
            let line = text(&out.stdout);
            let expected = match app[0] {
                "counter" => format!("counter: {} after 20 increments on each of {nodes} nodes", 20 * nodes),
                _ => "sor: 40 x 40, 4 sweeps, every cell equal to the single-node run, sum 1898.822582543129".into(),
            };
            assert_eq!(line.trim(), expected, "{what}");
        }
    }
}

/// A host that vanishes mid-run (silenced: it sends nothing more, no FIN, no RST, no
/// acknowledgement): each side names the other and exits 1, through the liveness checks (TCP
/// keepalive, the transports' bounded waits), not after the long lock and barrier bound. The
/// host is silenced rather than its link taken down: a rank that exits while its link is down
/// leaves Soft-RoCE unable to destroy its queue pairs (packets held in the downed interface's
/// queue), which made the kernel warn (`rxe_pool.c:255 __rxe_cleanup`) and the exit wait about
/// 50 s.
#[test]
fn multinode_dsm_a_host_that_vanishes_is_named_by_the_other() {
    let Some((device, c)) = setup() else { return };
    for transport in ["rdma-read", "tcp"] {
        let key = format!("vanish-{transport}");
        let rendezvous = rendezvous(&c, &key);
        // Far more increments than can finish before the link goes down.
        let app = ["--verbose", "counter", "--increments", "1000000"];
        let mut command =
            common::rank_command(&device, transport, c.node(), 2, &rendezvous, 10_000, &app);
        let child = Watched::new(command.spawn().expect("spawn a rank"));
        let what = format!("{transport}: node {}", c.node());
        let started = Instant::now();
        let out = if c.node() == 1 {
            // Mid-run: joined (however long that took under emulation) and counting for 2 s.
            let joined = child.wait_for_line("dsm: node 1 of 2 joined", BOUND);
            std::thread::sleep(Duration::from_secs(2));
            let silenced = c.silence();
            let out = child.finish(BOUND, &what);
            let dropped = silenced.dropped();
            drop(silenced);
            assert!(joined, "{what}: it never joined:\n{}", text(&out.stderr));
            assert!(dropped > 0, "{what}: nothing was silenced");
            out
        } else {
            child.finish(BOUND, &what)
        };
        let took = started.elapsed();
        let named = named_the_other(&c, &out, &what);
        // On the real stderr: libtest keeps a passing test's `eprintln!` to itself.
        let _ = writeln!(
            std::io::stderr(),
            "NOTE: {what}: exit 1 after {:.1} s (node 1 silenced 2 s after it joined): {named}",
            took.as_secs_f64(),
        );
        c.barrier(&format!("{key}-done"));
    }
}

/// A host that vanishes while its rank waits for a lock grant from the other host: node 0's
/// rank holds lock 0 (`dsm hold`), node 1's rank says it asks for it, and 2 s later node 1's
/// link goes down. Node 1 then sends nothing (no RDMA retry can fail) and gets no grant; the
/// lock bound is an hour (300 s by default, past the 240 s process bound too), so its wait
/// ends only when the TCP connection to node 0 fails (keepalive and `TCP_USER_TIMEOUT` at the
/// 10 s peer bound: the liveness link on `rdma-read`, the request connection on `tcp`). Each
/// side names the other and exits 1; node 1's cause must be that connection.
#[test]
fn multinode_dsm_a_host_that_vanishes_during_a_lock_wait_is_named() {
    let Some((device, c)) = setup() else { return };
    for transport in ["rdma-read", "tcp"] {
        let key = format!("vanish-lock-{transport}");
        let rendezvous = rendezvous(&c, &key);
        // Node 0 holds the lock longer than node 1 takes to ask and the link to go down (the
        // link comes back only after node 1's rank has ended, so a grant can never reach it).
        let app = ["hold", "--ms", "15000"];
        let mut command =
            common::rank_command(&device, transport, c.node(), 2, &rendezvous, 10_000, &app);
        command.env("DSM_SYNC_TIMEOUT_MS", "3600000");
        let child = Watched::new(command.spawn().expect("spawn a rank"));
        let what = format!("{transport}, lock wait: node {}", c.node());
        let started = Instant::now();
        let out = if c.node() == 1 {
            let asked =
                child.wait_for_line("dsm: node 1 asks for lock 0, which node 0 holds", BOUND);
            // The request leaves right after the line (node 0 holds the lock for 15 s): 2 s
            // later node 1 can only be waiting for the grant.
            std::thread::sleep(Duration::from_secs(2));
            let down = c.link_down();
            let out = child.finish(BOUND, &what);
            down.restore();
            assert!(
                asked,
                "{what}: it never asked for the lock:\n{}",
                text(&out.stderr)
            );
            out
        } else {
            child.finish(BOUND, &what)
        };
        let named = named_the_other(&c, &out, &what);
        if c.node() == 1 {
            // Ended by the TCP connection to node 0 (`tcp::Liveness::gone` on `rdma-read`, the
            // call's read on `tcp`), not by a bound ("within") or a failed RDMA request.
            assert!(
                named.contains("node 0: connection failed: "),
                "{what}: {named}"
            );
        }
        let _ = writeln!(
            std::io::stderr(),
            "NOTE: {what}: exit 1 after {:.1} s: {named}",
            started.elapsed().as_secs_f64(),
        );
        c.barrier(&format!("{key}-done"));
    }
}
