//! `cargo xtask test --nodes N`: the multi-node suite, one VM per node on one virtual Ethernet
//! segment.
//!
//! Each node is a VM of its own with one virtio NIC on a QEMU multicast segment (UDP multicast
//! on the host's loopback, a port of its own per run), and one Soft-RoCE device `rxe0` on that
//! NIC: every RDMA packet between nodes crosses a (virtual) wire, so it can be lost, delayed or
//! reordered with `tc netem`, and addresses resolve through ARP between hosts.
//!
//! Every node runs the same multi-node test binaries (the test targets whose name starts with
//! [`PREFIX`]) with the same tests, in the same order. A test learns its role from
//! `rdma_test_support::cluster()` (its node number, the nodes' addresses) and meets the other
//! nodes at barriers in the run's shared folder (`.rdma-test/<pid>/cluster/`, writable by every
//! guest through `--rwdir`). A test passed only if it passed on every node.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::build::TestBinary;
use super::verdict::{self, DeviceReport, Kind, Verdict};
use super::vm::{self, VmSpec, shell_quote};
use super::{Executed, Plan};

/// Test targets whose name starts with this are the multi-node suite: `cargo xtask test` leaves
/// them out, `cargo xtask test --nodes N` runs only them.
pub(crate) const PREFIX: &str = "multinode";

/// The most nodes a run may have. Tests see pairs: with 4 nodes, nodes 0 and 1 and nodes 2 and
/// 3 run each test at the same time, each pair on its own (`rdma_test_support::Cluster`), so a
/// run has an even number of nodes.
pub(crate) const MAX_NODES: usize = 4;

/// The segment's MTU: jumbo frames, so that rxe's active MTU is 4096.
const NIC_MTU: u32 = 9000;

/// How long a node waits at the start for the others to have their device up.
const READY_BOUND_S: u32 = 300;

/// Whether `binary` belongs to the multi-node suite.
pub(crate) fn is_multinode(binary: &TestBinary) -> bool {
    verdict::binary_stem(&binary.name).starts_with(PREFIX)
}

/// The address of node `node` (0-based) on the segment.
pub(crate) fn node_addr(node: usize) -> String {
    format!("10.77.0.{}", node + 1)
}

/// The MAC address of node `node`'s NIC.
fn node_mac(node: usize) -> String {
    format!("52:54:00:aa:00:{:02x}", node + 1)
}

/// The segment: a UDP multicast group and port on the host's loopback, drawn per run (from
/// the clock and the process ID), so that concurrent runs on one machine do not share a wire.
fn segment() -> (String, u16) {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mix = nanos ^ std::process::id().rotate_left(16);
    let group = format!(
        "230.{}.{}.{}",
        (mix >> 16) & 0xff,
        (mix >> 8) & 0xff,
        1 + mix % 250
    );
    (group, 30000 + (mix % 20000) as u16)
}

/// The QEMU options giving a node its NIC on the segment.
fn qemu_net(node: usize, (group, port): &(String, u16)) -> String {
    format!(
        "-netdev socket,id=seg0,mcast={group}:{port},localaddr=127.0.0.1 \
         -device virtio-net-pci,netdev=seg0,mac={}",
        node_mac(node)
    )
}

/// The guest's hooks around each binary: all nodes start it together (each waits, at most
/// [`READY_BOUND_S`], for the others' `start` flags), and each says when it ended
/// (`exit.<binary>.<node>`, read by test-support so that a node whose binary crashed fails its
/// peers at once instead of at the end of their waits). `<binary>` is the harness's name with
/// `/` as `_` (`rdma-verbs_multinode`: two packages may have a `multinode` target), exported to
/// the tests as `RDMA_TEST_BINARY`.
fn run_hooks(node: usize, nodes: usize) -> vm::RunHooks {
    let started_all: Vec<String> = (0..nodes)
        .map(|k| format!("[ -e \"$cluster/start.$stem.{k}\" ] || missing={k}"))
        .collect();
    vm::RunHooks {
        before: format!(
            r#"    stem=$(printf %s "$name" | tr / _)
    export RDMA_TEST_BINARY="$stem"
    touch "$cluster/start.$stem.{node}"
    i=0
    while :; do
        missing=
        {started_all}
        [ -z "$missing" ] && break
        i=$((i+1))
        if [ $i -gt {ticks} ]; then
            echo "guest: node {node}: node $missing did not start $stem within {READY_BOUND_S} s"
            break
        fi
        sleep 0.1
    done
"#,
            started_all = started_all.join("\n        "),
            ticks = READY_BOUND_S * 10,
        ),
        after: format!("    echo \"$code\" > \"$cluster/exit.$stem.{node}\"\n"),
    }
}

/// The start of node `node`'s guest script: its NIC up with its address, `rxe0` on it, then a
/// bounded wait until every node has written its `ready` flag into `cluster`, and the
/// environment test-support reads (`RDMA_TEST_NODE`, `RDMA_TEST_NODES`, `RDMA_TEST_NODE_ADDRS`,
/// `RDMA_TEST_CLUSTER_DIR`, `RDMA_TEST_NETDEV`, `RDMA_TEST_ADDR`).
pub(crate) fn node_prelude(node: usize, nodes: usize, cluster: &Path) -> String {
    let addrs: Vec<String> = (0..nodes).map(node_addr).collect();
    let ready_all: Vec<String> = (0..nodes)
        .map(|k| format!("[ -e \"$cluster/ready.{k}\" ] || missing={k}"))
        .collect();
    format!(
        r#"#!/bin/sh
# Written by `cargo xtask test --nodes {nodes}`; runs inside node {node}'s throwaway VM.
exec 2>&1
fail() {{ echo "guest: node {node}: $*"; exit 90; }}
for module in virtio_net rdma_rxe sch_netem; do
    modprobe $module || fail "modprobe $module failed"
done
ip link set lo up
ulimit -l unlimited
nic=
for dev in /sys/class/net/*; do
    [ "$(cat "$dev/address")" = {mac} ] && nic=${{dev##*/}}
done
[ -n "$nic" ] || fail "no network interface with MAC {mac}"
# Jumbo frames, as RoCE networks have them: rxe's active MTU follows the interface's (4096
# here; 1024 at the default 1500, where a queue pair set to a larger path MTU stalls).
ip link set "$nic" mtu {NIC_MTU} || fail "cannot set the MTU of $nic to {NIC_MTU}"
ip link set "$nic" up
ip addr add {addr}/24 dev "$nic"
rdma link add rxe0 type rxe netdev "$nic" || fail "rdma link add rxe0 failed"
i=0
until ibv_devinfo -d rxe0 2>/dev/null | grep -q PORT_ACTIVE; do
    i=$((i+1)); [ $i -gt 100 ] && fail "rxe0's port never became active"
    sleep 0.1
done
cluster={cluster}
touch "$cluster/ready.{node}"
i=0
while :; do
    missing=
    {ready_all}
    [ -z "$missing" ] && break
    i=$((i+1)); [ $i -gt {ready_ticks} ] && fail "node $missing was not ready within {READY_BOUND_S} s"
    sleep 0.1
done
export RDMA_TEST_NODE={node}
export RDMA_TEST_NODES={nodes}
export RDMA_TEST_NODE_ADDRS={addr_list}
export RDMA_TEST_CLUSTER_DIR="$cluster"
export RDMA_TEST_NETDEV="$nic"
export RDMA_TEST_ADDR={addr}
export PATH="$PATH:$HOME/.cargo/bin"
echo "guest: node {node}: rxe0 on $nic ({addr}, {mac}) is active; all {nodes} nodes are ready"
"#,
        mac = node_mac(node),
        addr = node_addr(node),
        cluster = shell_quote(&cluster.to_string_lossy()),
        ready_all = ready_all.join("\n    "),
        ready_ticks = READY_BOUND_S * 10,
        addr_list = addrs.join(","),
    )
}

/// One node's part of the run: its VM, and where its status and report files are.
struct NodeRun {
    run: vm::VmRun,
    statuses: PathBuf,
    report: PathBuf,
    log: PathBuf,
}

/// Runs the plan's (multi-node) device binaries on `nodes` VMs booted in parallel, and judges
/// them: each binary's verdict merges the nodes' ([`verdict::merge_nodes`]).
pub(crate) fn execute(root: &Path, plan: &Plan, nodes: usize) -> Result<Executed, String> {
    let mut verdict = Verdict::default();
    let expected = super::expected_lists(plan, &mut verdict);
    let total: usize = expected.values().map(Vec::len).sum();
    println!(
        "harness: expecting {total} multi-node tests, each run on all {nodes} nodes \
         (`--list` of each binary)"
    );
    if total == 0 {
        verdict
            .problems
            .push("no multi-node test matched: nothing would run".to_string());
    }
    // A folder of its own, new for this run: flags, barriers and values of an earlier run
    // with the same process ID must not be seen.
    let work = root.join(".rdma-test").join(format!(
        "{}-nodes-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let cluster = work.join("cluster");
    std::fs::create_dir_all(work.parent().unwrap_or(root))
        .and_then(|()| std::fs::create_dir(&work))
        .and_then(|()| std::fs::create_dir(&cluster))
        .map_err(|e| format!("creating a new {}: {e}", cluster.display()))?;
    let segment = segment();
    let mut handles = Vec::new();
    for node in 0..nodes {
        let statuses = work.join(format!("status.{node}.txt"));
        let report = work.join(format!("report.{node}.txt"));
        let script = work.join(format!("guest.{node}.sh"));
        let mut text = node_prelude(node, nodes, &cluster);
        text.push_str(&vm::test_runs(
            &vm::Schedule::serial(&plan.device),
            &report,
            &statuses,
            &plan.test_args,
            plan.repeat,
            &run_hooks(node, nodes),
        ));
        std::fs::write(&script, text).map_err(|e| format!("writing {}: {e}", script.display()))?;
        let spec = VmSpec {
            label: Some(format!("node{node}")),
            cpus: 1,
            memory: "2G",
            qemu_opts: Some(qemu_net(node, &segment)),
        };
        let root = root.to_path_buf();
        let timeout = plan.timeout;
        let log = work.join(format!("node{node}.log"));
        handles.push(std::thread::spawn(move || {
            vm::boot_vm_with(&root, &script, "guest: ==>", timeout, &spec).map(|run| NodeRun {
                run,
                statuses,
                report,
                log,
            })
        }));
    }
    // Every VM is waited for (each has its watchdog) before any failure is reported.
    let joined: Vec<Result<NodeRun, String>> = handles
        .into_iter()
        .enumerate()
        .map(|(node, handle)| {
            handle
                .join()
                .map_err(|_| format!("the thread running node {node}'s VM panicked"))?
        })
        .collect();
    let mut runs = Vec::new();
    for run in joined {
        let run = run?;
        let _ = std::fs::write(&run.log, &run.run.log);
        runs.push(run);
    }
    let mut merged_report = DeviceReport::default();
    let mut per_binary: BTreeMap<String, Vec<verdict::BinaryVerdict>> = BTreeMap::new();
    for (node, node_run) in runs.iter().enumerate() {
        for problem in node_run.run.problems() {
            verdict.problems.push(format!(
                "node {node}: {problem} (its console: {})",
                node_run.log.display()
            ));
        }
        let results = verdict::GuestResults::read(
            &node_run.run.log,
            std::slice::from_ref(&node_run.statuses),
        );
        let report =
            DeviceReport::parse(&std::fs::read_to_string(&node_run.report).unwrap_or_default());
        for binary in &plan.device {
            let mut judged = verdict::judge(
                &binary.name,
                Kind::Device,
                &expected[binary.name.as_str()],
                &results.output(&binary.name),
                results.exit(&binary.name),
                &report.skips,
            );
            judged.seconds = results.seconds(&binary.name);
            verdict::add_kernel_findings(&mut judged, results.kernel(&binary.name));
            per_binary
                .entry(binary.name.clone())
                .or_default()
                .push(judged);
        }
        merged_report.ran.extend(report.ran);
        merged_report.skips.extend(report.skips);
        merged_report.failures.extend(
            report
                .failures
                .into_iter()
                .map(|line| format!("node {node}: {line}")),
        );
    }
    for binary in &plan.device {
        let per_node = per_binary.remove(&binary.name).unwrap_or_default();
        verdict.binaries.push(verdict::merge_nodes(
            &expected[binary.name.as_str()],
            per_node,
        ));
    }
    if plan.device.is_empty() {
        verdict.problems.push(format!(
            "no multi-node test binaries (test targets named {PREFIX}*)"
        ));
    } else if merged_report.ran.is_empty() && plan.test_args.is_empty() {
        verdict
            .problems
            .push("no multi-node test found the device".to_string());
    }
    let boots: Vec<String> = runs
        .iter()
        .map(|r| {
            format!(
                "{:.1}",
                r.run.first_marker.unwrap_or_default().as_secs_f64()
            )
        })
        .collect();
    let kernel = runs
        .first()
        .map(|r| r.run.kernel.display().to_string())
        .unwrap_or_default();
    Ok(Executed {
        verdict,
        report: merged_report,
        place: format!(
            "{nodes} QEMU VMs of {kernel} on one virtual Ethernet segment, rxe0 on each \
             ({}..{}), boot to first test {} s",
            node_addr(0),
            node_addr(nodes - 1),
            boots.join(" / ")
        ),
        doc_ran: false,
        vms: runs.into_iter().map(|r| r.run).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_node_gets_its_own_address_mac_and_the_shared_environment() {
        let script = node_prelude(1, 3, Path::new("/w/.rdma-test/7/cluster"));
        assert!(script.contains("cluster='/w/.rdma-test/7/cluster'\n"));
        assert!(script.contains("ip addr add 10.77.0.2/24 dev \"$nic\"\n"));
        assert!(script.contains("= 52:54:00:aa:00:02 ]"));
        assert!(script.contains("export RDMA_TEST_NODE=1\nexport RDMA_TEST_NODES=3\n"));
        assert!(script.contains("export RDMA_TEST_NODE_ADDRS=10.77.0.1,10.77.0.2,10.77.0.3\n"));
        assert!(script.contains("touch \"$cluster/ready.1\""));
        for k in 0..3 {
            assert!(script.contains(&format!("[ -e \"$cluster/ready.{k}\" ] || missing={k}")));
        }
        let segment = ("230.1.2.3".to_string(), 31234);
        assert!(qemu_net(1, &segment).contains("mcast=230.1.2.3:31234"));
        assert!(qemu_net(1, &segment).ends_with("mac=52:54:00:aa:00:02"));
        let (group, port) = super::segment();
        assert!(group.starts_with("230.") && (30000..50000).contains(&port));
        let hooks = run_hooks(1, 2);
        assert!(hooks.before.contains("export RDMA_TEST_BINARY=\"$stem\""));
        assert!(hooks.before.contains("touch \"$cluster/start.$stem.1\""));
        assert!(
            hooks
                .before
                .contains("[ -e \"$cluster/start.$stem.0\" ] || missing=0")
        );
        assert_eq!(
            hooks.after,
            "    echo \"$code\" > \"$cluster/exit.$stem.1\"\n"
        );
    }

    #[test]
    fn multi_node_binaries_are_recognised_by_their_target_name() {
        let binary = |name: &str| TestBinary {
            name: name.to_string(),
            path: String::new(),
            package_dir: String::new(),
            unit: false,
        };
        assert!(is_multinode(&binary("examples/multinode_pingpong")));
        assert!(is_multinode(&binary("rdma-verbs/multinode")));
        assert!(!is_multinode(&binary("rdma-verbs/scope")));
        assert!(!is_multinode(&binary("examples/pingpong-bin")));
    }
}
