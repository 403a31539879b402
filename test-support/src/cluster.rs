//! Multi-node tests: which node a test runs on, the nodes' addresses, barriers and a small
//! exchange of values through a folder every node shares, and faults on the node's link.
//!
//! `cargo xtask test --nodes N` boots N VMs on one virtual Ethernet segment and runs every
//! multi-node test binary (a test target named `multinode*`) on all of them, the same tests in
//! the same order. Each test asks [`cluster`] for its role and meets the other nodes with
//! [`Cluster::barrier`]; values (queue pair numbers, GIDs, keys, a peer's output) go through
//! [`Cluster::publish`] and [`Cluster::fetch`]. Every wait is bounded
//! (`RDMA_TEST_CLUSTER_WAIT` seconds, default 120), and a test that panics on one node marks the
//! test as failed in the shared folder, so the other nodes fail at their next wait instead of
//! waiting out the bound.
//!
//! ```no_run
//! # fn main() {
//! let Some(device) = rdma_test_support::device() else { return };
//! let Some(cluster) = rdma_test_support::cluster() else { return };
//! if cluster.node() == 0 {
//!     cluster.publish("greeting", "hello from node 0");
//! } else {
//!     assert_eq!(cluster.fetch(0, "greeting"), "hello from node 0");
//! }
//! cluster.barrier("done");
//! # let _ = device;
//! # }
//! ```
//!
//! A test sees two nodes, 0 and 1 ([`Cluster::nodes`] is 2). A run of 4 nodes forms two
//! pairs, nodes 0 and 1, nodes 2 and 3, which run each test at the same time on the shared
//! segment, each pair on its own: its barriers, values and failure marks are the pair's, and
//! [`Cluster::node`] and [`Cluster::addr`] number within the pair ([`Cluster::cluster_node`]
//! and [`Cluster::pair`] give the run's numbering).
//!
//! Outside the harness the environment below describes the cluster (for real hosts with NICs:
//! give each host its number, the same address list and a folder they share, NFS for example):
//! [`ENV_NODE`], [`ENV_NODES`], [`ENV_NODE_ADDRS`], [`ENV_CLUSTER_DIR`], and for the fault
//! helpers [`ENV_NETDEV`] (they need root, `tc` and `ip`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::{skip, test_name};

/// This node's number, from 0 (`cargo xtask test --nodes N` sets it).
pub const ENV_NODE: &str = "RDMA_TEST_NODE";
/// How many nodes there are.
pub const ENV_NODES: &str = "RDMA_TEST_NODES";
/// The nodes' IP addresses (on the interface their RDMA device sits on), comma-separated, in
/// node order.
pub const ENV_NODE_ADDRS: &str = "RDMA_TEST_NODE_ADDRS";
/// A folder every node can read and write: the barriers and published values live there.
pub const ENV_CLUSTER_DIR: &str = "RDMA_TEST_CLUSTER_DIR";
/// The network interface the node's RDMA device sits on, for the fault helpers.
pub const ENV_NETDEV: &str = "RDMA_TEST_NETDEV";
/// The bound of every wait, in seconds (default 120).
pub const ENV_CLUSTER_WAIT: &str = "RDMA_TEST_CLUSTER_WAIT";
/// The running test binary's name in the harness's `exit.<binary>.<node>` flags (set by
/// `cargo xtask test --nodes`).
pub const ENV_BINARY: &str = "RDMA_TEST_BINARY";

/// How often a wait looks at the shared folder.
const POLL: Duration = Duration::from_millis(20);

/// The cluster a multi-node test runs on, seen from one node. See the [module](self) docs.
#[derive(Debug)]
pub struct Cluster {
    /// This node's number in its pair (0 or 1).
    node: usize,
    /// Nodes in the pair: 2.
    nodes: usize,
    /// The pair's addresses.
    addrs: Vec<IpAddr>,
    /// The run's numbers of the pair's nodes (for the harness's exit flags).
    members: Vec<usize>,
    /// Which pair.
    pair: usize,
    /// This test's (and this round's) folder inside the shared folder.
    dir: PathBuf,
    /// The shared folder itself (the harness's `exit.<binary>.<node>` flags are there).
    root: PathBuf,
    /// This test binary's name, as the harness's flags name it.
    binary: String,
    netdev: Option<String>,
    wait: Duration,
    barriers: AtomicU32,
}

/// The cluster this test runs on, or `None` (after a visible skip) outside a multi-node run
/// when `RDMA_TEST_REQUIRE_DEVICE` is not `1`.
///
/// Each call starts a new round for the calling test: a test repeated in one process
/// (`--repeat`) meets the other nodes in a fresh folder each time, as long as every node calls
/// this the same number of times.
///
/// # Panics
///
/// When the environment describes no cluster (or a malformed one) and
/// `RDMA_TEST_REQUIRE_DEVICE=1`: that is the test's failure.
#[track_caller]
pub fn cluster() -> Option<Cluster> {
    match Cluster::from_env() {
        Ok(cluster) => Some(cluster),
        Err(reason) => {
            skip(&reason);
            None
        }
    }
}

impl Cluster {
    fn from_env() -> Result<Self, String> {
        let var = |name: &str| {
            std::env::var(name).map_err(|_| {
                format!(
                    "{name} is not set: a multi-node test runs under `cargo xtask test --nodes N`"
                )
            })
        };
        let node: usize = var(ENV_NODE)?
            .parse()
            .map_err(|_| format!("{ENV_NODE} is not a number"))?;
        let nodes: usize = var(ENV_NODES)?
            .parse()
            .map_err(|_| format!("{ENV_NODES} is not a number"))?;
        let addrs = var(ENV_NODE_ADDRS)?
            .split(',')
            .map(|a| a.trim().parse::<IpAddr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{ENV_NODE_ADDRS}: {e}"))?;
        if nodes < 2 || nodes % 2 != 0 || node >= nodes || addrs.len() != nodes {
            return Err(format!(
                "node {node} of {nodes} with {} addresses is no cluster of pairs",
                addrs.len()
            ));
        }
        let pair = node / 2;
        let members = vec![2 * pair, 2 * pair + 1];
        let addrs = members.iter().map(|&m| addrs[m]).collect();
        let root = PathBuf::from(var(ENV_CLUSTER_DIR)?);
        let wait = std::env::var(ENV_CLUSTER_WAIT)
            .ok()
            .and_then(|s| s.parse().ok())
            .map_or(Duration::from_secs(120), Duration::from_secs);
        let test = file_safe(&test_name());
        let round = next_round(&test);
        let dir = root
            .join(test)
            .join(round.to_string())
            .join(format!("pair-{pair}"));
        // The harness names each binary `package_target` in its flags (two packages may have a
        // target of the same name); without it, the executable's name.
        let binary = std::env::var(ENV_BINARY).unwrap_or_else(|_| {
            test_name()
                .split("::")
                .next()
                .unwrap_or_default()
                .to_string()
        });
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        Ok(Self {
            node: node % 2,
            nodes: 2,
            addrs,
            members,
            pair,
            dir,
            root,
            binary,
            netdev: std::env::var(ENV_NETDEV).ok().filter(|s| !s.is_empty()),
            wait,
            barriers: AtomicU32::new(0),
        })
    }

    /// This node's number in its pair: 0 or 1.
    pub fn node(&self) -> usize {
        self.node
    }

    /// How many nodes a test sees: 2.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// This node's number in the run (`RDMA_TEST_NODE`).
    pub fn cluster_node(&self) -> usize {
        self.members[self.node]
    }

    /// Which pair of the run this node belongs to (0 with 2 nodes).
    pub fn pair(&self) -> usize {
        self.pair
    }

    /// Node `node`'s (of this pair) IP address (on its RDMA device's interface).
    ///
    /// # Panics
    ///
    /// When there is no node `node`.
    pub fn addr(&self, node: usize) -> IpAddr {
        self.addrs[node]
    }

    /// The next node after this one (the other one, on two nodes).
    pub fn peer(&self) -> usize {
        (self.node + 1) % self.nodes
    }

    /// Waits until every node has called `barrier` with this name, as its same-numbered barrier
    /// of this round.
    ///
    /// # Panics
    ///
    /// When another node failed this test or its test binary ended, or not every node arrived
    /// within the bound.
    #[track_caller]
    pub fn barrier(&self, name: &str) {
        let seq = self.barriers.fetch_add(1, Ordering::Relaxed);
        let stem = format!("barrier-{seq:03}-{}", file_safe(name));
        write_atomically(&self.dir, &format!("{stem}.{}", self.node), "");
        let deadline = Instant::now() + self.wait;
        for node in 0..self.nodes {
            self.wait_for(
                &format!("{stem}.{node}"),
                &format!("barrier `{name}`"),
                node,
                deadline,
            );
        }
    }

    /// Makes `value` readable by every node under `key` (each node has its own `key`s).
    ///
    /// # Panics
    ///
    /// When the shared folder cannot be written, or this node published `key` already in this
    /// round (a second value would race with readers of the first).
    #[track_caller]
    pub fn publish(&self, key: &str, value: &str) {
        let file = format!("value-{}.{}", file_safe(key), self.node);
        assert!(
            !self.dir.join(&file).exists(),
            "node {} published `{key}` twice in one round",
            self.node
        );
        write_atomically(&self.dir, &file, value);
    }

    /// Waits for node `node`'s value under `key`, and returns it.
    ///
    /// # Panics
    ///
    /// When another node failed this test or its test binary ended, or the value did not come
    /// within the bound.
    #[track_caller]
    pub fn fetch(&self, node: usize, key: &str) -> String {
        self.fetch_by(node, key, Instant::now() + self.wait)
    }

    #[track_caller]
    fn fetch_by(&self, node: usize, key: &str, deadline: Instant) -> String {
        let file = format!("value-{}.{node}", file_safe(key));
        self.wait_for(&file, &format!("value `{key}`"), node, deadline);
        std::fs::read_to_string(self.dir.join(&file))
            .unwrap_or_else(|e| panic!("reading {}: {e}", self.dir.join(&file).display()))
    }

    /// Publishes `value` under `key` and returns every node's value under it, in node order
    /// (all within one bound).
    #[track_caller]
    pub fn exchange(&self, key: &str, value: &str) -> Vec<String> {
        self.publish(key, value);
        let deadline = Instant::now() + self.wait;
        (0..self.nodes)
            .map(|node| self.fetch_by(node, key, deadline))
            .collect()
    }

    /// Adds `tc netem` with `spec` (for example `"loss 3%"` or `"delay 2ms reorder 25% 50%"`)
    /// to the RoCE v2 packets this node sends (UDP destination port 4791) and to nothing else,
    /// so that address resolution is not disturbed and [`Netem::dropped`] counts RDMA packets
    /// only: a `prio` qdisc at the root, the netem under its third band, and a `u32` filter
    /// sending port 4791 there. The returned guard removes it all.
    ///
    /// # Panics
    ///
    /// When [`ENV_NETDEV`] is not set or `tc` fails (it needs root and the `sch_netem` module).
    #[track_caller]
    pub fn netem(&self, spec: &str) -> Netem {
        let netdev = self.netdev();
        let dev = netdev.as_str();
        run(
            "tc",
            &["qdisc", "add", "dev", dev, "root", "handle", "1:", "prio"],
        );
        let guard = Netem {
            netdev: netdev.clone(),
        };
        let mut args = vec![
            "qdisc", "add", "dev", dev, "parent", "1:3", "handle", "30:", "netem",
        ];
        args.extend(spec.split_whitespace());
        run("tc", &args);
        run(
            "tc",
            &[
                "filter", "add", "dev", dev, "protocol", "ip", "parent", "1:0", "prio", "1", "u32",
                "match", "ip", "protocol", "17", "0xff", "match", "ip", "dport", "4791", "0xffff",
                "flowid", "1:3",
            ],
        );
        guard
    }

    /// Silences this node: every packet it would send on its RDMA interface, RoCE and TCP
    /// alike, is dropped (`tc netem loss 100%` at the root), while what it receives is still
    /// delivered. To its peers it vanished (no FIN, no RST, no acknowledgement); unlike
    /// [`link_down`](Self::link_down) the link stays up, so the packets its programs still
    /// send are freed as they are dropped rather than held in a downed interface's queues
    /// (Soft-RoCE cannot destroy a queue pair whose packets are held: its destroy waits about
    /// 50 s and the kernel warns, `rxe_pool.c:255 __rxe_cleanup`). The returned guard removes
    /// the qdisc; [`Netem::dropped`] counts what it dropped.
    ///
    /// # Panics
    ///
    /// When [`ENV_NETDEV`] is not set or `tc` fails (it needs root and the `sch_netem` module).
    #[track_caller]
    pub fn silence(&self) -> Netem {
        let netdev = self.netdev();
        run(
            "tc",
            &[
                "qdisc", "add", "dev", &netdev, "root", "handle", "30:", "netem", "loss", "100%",
            ],
        );
        Netem { netdev }
    }

    /// Takes this node's interface down (`ip link set DEV down`). The returned guard brings it
    /// up again and waits (bounded) until the RDMA port on it is active.
    ///
    /// # Panics
    ///
    /// When [`ENV_NETDEV`] is not set or `ip` fails.
    #[track_caller]
    pub fn link_down(&self) -> LinkDown {
        let netdev = self.netdev();
        run("ip", &["link", "set", &netdev, "down"]);
        LinkDown { netdev }
    }

    #[track_caller]
    fn netdev(&self) -> String {
        self.netdev
            .clone()
            .unwrap_or_else(|| panic!("{ENV_NETDEV} names no interface for the fault helpers"))
    }

    /// Waits until `file` exists in this round's folder, until `deadline`; fails fast when
    /// another node marked the test failed or its test binary ended (the harness's
    /// `exit.<binary>.<node>` flag: a crash, a kill, or a binary already past this test).
    #[track_caller]
    fn wait_for(&self, file: &str, what: &str, from: usize, deadline: Instant) {
        loop {
            if self.dir.join(file).exists() {
                return;
            }
            for node in (0..self.nodes).filter(|&n| n != self.node) {
                if self.dir.join(format!("failed.{node}")).exists() {
                    panic!(
                        "node {node} failed this test (its output says why) while node {} \
                         waited for {what} of node {from}",
                        self.node
                    );
                }
                let ended = self
                    .root
                    .join(format!("exit.{}.{}", self.binary, self.members[node]));
                if let Ok(code) = std::fs::read_to_string(&ended) {
                    panic!(
                        "node {node}'s test binary ended (exit {}) while node {} waited for \
                         {what} of node {from}",
                        code.trim(),
                        self.node
                    );
                }
            }
            if Instant::now() > deadline {
                panic!(
                    "node {} waited {:?} for {what} of node {from}: it never came ({})",
                    self.node,
                    self.wait,
                    self.dir.display()
                );
            }
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Let the other nodes fail now rather than at the end of their wait.
            let _ = std::fs::write(self.dir.join(format!("failed.{}", self.node)), "");
        }
    }
}

/// `tc netem` on the node's RoCE v2 traffic, removed on drop.
#[derive(Debug)]
#[must_use = "the netem qdisc is removed when this guard drops"]
pub struct Netem {
    netdev: String,
}

impl Netem {
    /// Packets the netem qdisc dropped so far (its `tc -s` statistics): RoCE v2 packets only.
    ///
    /// # Panics
    ///
    /// When `tc` fails or prints no count for the qdisc.
    #[track_caller]
    pub fn dropped(&self) -> u64 {
        let out = Command::new("tc")
            .args(["-s", "qdisc", "show", "dev", &self.netdev])
            .output()
            .unwrap_or_else(|e| panic!("running tc: {e}"));
        let text = String::from_utf8_lossy(&out.stdout);
        // `qdisc netem 30: parent 1:3 limit ...` then ` Sent N bytes M pkt (dropped D, ...`.
        text.split("qdisc ")
            .find(|block| block.starts_with("netem 30:"))
            .and_then(|block| block.split("dropped ").nth(1))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no drop count of the netem qdisc in:\n{text}"))
    }
}

impl Drop for Netem {
    fn drop(&mut self) {
        let status = Command::new("tc")
            .args(["qdisc", "del", "dev", &self.netdev, "root"])
            .status();
        // A netem left behind would make the next test's link lossy: that must not pass
        // unnoticed (unless this test is failing already).
        if !status.is_ok_and(|s| s.success()) && !std::thread::panicking() {
            panic!("removing netem from {} failed", self.netdev);
        }
    }
}

/// The node's interface taken down; on drop it comes up again and the guard waits (bounded, 30
/// s) until an RDMA port on it is active.
#[derive(Debug)]
#[must_use = "the link comes up again when this guard drops"]
pub struct LinkDown {
    netdev: String,
}

impl LinkDown {
    /// Brings the link up now and waits for the port (what dropping does).
    pub fn restore(self) {}
}

impl Drop for LinkDown {
    fn drop(&mut self) {
        let up = Command::new("ip")
            .args(["link", "set", &self.netdev, "up"])
            .status();
        let mut failure = None;
        if !up.is_ok_and(|s| s.success()) {
            failure = Some(format!("`ip link set {} up` failed", self.netdev));
        } else {
            let deadline = Instant::now() + Duration::from_secs(30);
            while !port_active_on(&self.netdev) {
                if Instant::now() > deadline {
                    failure = Some(format!(
                        "no RDMA port on {} became active within 30 s",
                        self.netdev
                    ));
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        // A link left down would fail (or skew) the next tests: not silently.
        if let Some(failure) = failure {
            if !std::thread::panicking() {
                panic!("{failure}");
            }
        }
    }
}

/// Whether an RDMA device on `netdev` has an active port (from sysfs).
fn port_active_on(netdev: &str) -> bool {
    let Ok(devices) = std::fs::read_dir("/sys/class/infiniband") else {
        return false;
    };
    devices.flatten().any(|device| {
        let ports = device.path().join("ports");
        std::fs::read_dir(&ports).is_ok_and(|ports| {
            ports.flatten().any(|port| {
                let on_netdev =
                    std::fs::read_dir(port.path().join("gid_attrs/ndevs")).is_ok_and(|entries| {
                        entries.flatten().any(|entry| {
                            std::fs::read_to_string(entry.path())
                                .is_ok_and(|name| name.trim() == netdev)
                        })
                    });
                on_netdev
                    && std::fs::read_to_string(port.path().join("state"))
                        .is_ok_and(|state| state.contains("ACTIVE"))
            })
        })
    })
}

/// Runs a command; panics with its output unless it succeeds.
#[track_caller]
fn run(program: &str, args: &[&str]) {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(
        output.status.success(),
        "`{program} {}` failed ({}): {}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    );
}

/// The next round number of `test` in this process.
fn next_round(test: &str) -> u32 {
    static ROUNDS: Mutex<Option<HashMap<String, u32>>> = Mutex::new(None);
    let mut rounds = ROUNDS.lock().unwrap_or_else(|e| e.into_inner());
    let round = rounds
        .get_or_insert_with(HashMap::new)
        .entry(test.to_string())
        .or_insert(0);
    *round += 1;
    *round
}

/// `text` with every character but ASCII letters, digits, `_`, `-` and `.` replaced by `_`.
fn file_safe(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Writes `name` in `dir` as a whole: to a temporary name first, then renamed, so that a reader
/// on another node never sees it half written.
#[track_caller]
fn write_atomically(dir: &Path, name: &str, contents: &str) {
    let temporary = dir.join(format!(".{name}.tmp"));
    std::fs::write(&temporary, contents)
        .and_then(|()| std::fs::rename(&temporary, dir.join(name)))
        .unwrap_or_else(|e| panic!("writing {name} in {}: {e}", dir.display()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_file_names() {
        assert_eq!(file_safe("tests::rc write/read"), "tests__rc_write_read");
        assert_eq!(file_safe("a-b.c_d"), "a-b.c_d");
    }

    #[test]
    fn each_call_of_a_test_is_a_new_round() {
        assert_eq!(next_round("x"), 1);
        assert_eq!(next_round("x"), 2);
        assert_eq!(next_round("y"), 1);
    }
}
