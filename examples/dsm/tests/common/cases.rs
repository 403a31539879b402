//! The DSM's test cases that run the same on every transport, with a device (`nodes.rs`: the
//! RDMA transports) or without one (`host.rs`: `tcp` on the host). Each takes the transports
//! of its two-node runs and, where it has them, of its four-node runs.

#![allow(
    dead_code,
    reason = "each test file is a crate of its own; not all use these"
)]

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use rdma_test_support::TestDevice;

use super::{BOUND, DSM, finish, ok, stats_row, text};

/// Where the jobs run: on an RDMA device (its name and GID index passed to every job), or on
/// none (`tcp` only).
pub(crate) struct Runner<'a> {
    device: Option<&'a TestDevice>,
}

impl<'a> Runner<'a> {
    /// Jobs on `device`.
    pub(crate) fn on(device: &'a TestDevice) -> Self {
        Runner {
            device: Some(device),
        }
    }

    /// Jobs with no device (`tcp` only).
    pub(crate) fn host() -> Self {
        Runner { device: None }
    }

    /// `dsm run -n nodes -t transport <run options> <app...>`, with an 8 MiB window unless
    /// `extra` names another, the peer bound 20 s, and the kernel's default mapping limit
    /// (`DSM_MAX_MAP_COUNT`, whatever this machine's is).
    pub(crate) fn run(&self, nodes: u16, transport: &str, extra: &[&str], app: &[&str]) -> Output {
        let mut command = Command::new(DSM);
        command
            .env("DSM_MAX_MAP_COUNT", "65530")
            .args(["run", "-n", &nodes.to_string(), "-t", transport])
            .args(["--timeout-ms", "20000"]);
        if let Some(device) = self.device {
            command.args(["-d", &device.name, "-g", &device.gid_index.to_string()]);
        }
        if !extra.contains(&"--window-mib") {
            command.args(["--window-mib", "8"]);
        }
        command
            .args(extra)
            .args(app)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let what = format!("dsm run -n {nodes} -t {transport} {}", app.join(" "));
        finish(command.spawn().expect("spawn dsm"), BOUND, &what)
    }
}

pub(crate) fn counter(r: &Runner<'_>, transports: &[&str], four: &[&str]) {
    let runs = transports
        .iter()
        .map(|t| (*t, 2u16))
        .chain(four.iter().map(|t| (*t, 4)));
    for (transport, nodes) in runs {
        let what = format!("counter on {nodes} nodes over {transport}");
        let out = ok(
            r.run(
                nodes,
                transport,
                &[],
                &["counter", "--increments", "40", "--stats"],
            ),
            &what,
        );
        let expected = format!(
            "counter: {} after 40 increments on each of {nodes} nodes",
            40 * u64::from(nodes)
        );
        assert_eq!(
            out.lines().next(),
            Some(expected.as_str()),
            "{what}:\n{out}"
        );
        // The statistics table: node 0 is the lock's manager and the counter's home, so it
        // served pages and applied a diff for every increment of every other node.
        let row = |name: &str| stats_row(&out, name);
        let locks = row("locks");
        assert_eq!(locks.len(), usize::from(nodes) + 1, "{what}");
        assert_eq!(locks[usize::from(nodes)], 40 * u64::from(nodes), "{what}");
        let applied = row("diffs_applied");
        assert_eq!(applied[0], 40 * u64::from(nodes - 1), "{what}: {applied:?}");
        let upgrades = row("upgrade_faults");
        assert_eq!(upgrades[0], 0, "{what}: the home never faults");
        assert_eq!(
            upgrades[usize::from(nodes)],
            40 * u64::from(nodes - 1),
            "{what}"
        );
    }
}

/// `hold`, which the cross-host fault test builds on: while node 0 holds lock 0, every other
/// node asks for it, and each takes it only after node 0's release (each finds node 0's count,
/// written just before the release, under the lock: `hold` fails otherwise); one node alone
/// holds it and ends.
pub(crate) fn hold(r: &Runner<'_>, transports: &[&str]) {
    for &transport in transports {
        let what = format!("hold on 3 nodes over {transport}");
        let output = r.run(3, transport, &["--verbose"], &["hold", "--ms", "300"]);
        let err = text(&output.stderr);
        let out = ok(output, &what);
        assert_eq!(
            out.trim(),
            "hold: lock 0 held 300 ms by node 0, then taken by each of the 2 others after its release",
            "{what}"
        );
        // `--verbose` reaches every node `dsm run` starts: each says it joined.
        for rank in 0..3 {
            let line = format!("dsm: node {rank} of 3 joined");
            assert!(
                err.lines().any(|l| l == line),
                "{what}: no {line:?} in:\n{err}"
            );
        }
        for rank in 1..3 {
            let line = format!("dsm: node {rank} asks for lock 0, which node 0 holds");
            assert!(
                err.lines().any(|l| l == line),
                "{what}: no {line:?} in:\n{err}"
            );
        }
    }
}

pub(crate) fn matmul_and_sor(r: &Runner<'_>, transports: &[&str], four: &[&str]) {
    for &transport in transports {
        let out = ok(
            r.run(2, transport, &[], &["matmul", "--n", "48"]),
            &format!("matmul over {transport}"),
        );
        assert!(
            out.starts_with(
                "matmul: 48 x 48, every element equal to the single-node product, sum -213.90625"
            ),
            "{transport}: {out}"
        );
        let out = ok(
            r.run(
                2,
                transport,
                &[],
                &["sor", "--n", "40", "--iterations", "4"],
            ),
            &format!("sor over {transport}"),
        );
        assert!(
            out.starts_with("sor: 40 x 40, 4 sweeps, every cell equal to the single-node run, sum 1898.822582543129"),
            "{transport}: {out}"
        );
    }
    // Four nodes: rows split four ways, pages shared across three borders.
    for &transport in four {
        let out = ok(
            r.run(
                4,
                transport,
                &[],
                &["sor", "--n", "40", "--iterations", "4"],
            ),
            &format!("sor on 4 nodes over {transport}"),
        );
        assert!(out.contains("sum 1898.822582543129"), "{transport}: {out}");
    }
}

/// Every node writes its own bytes of 4 pages dealt to the nodes in turn, so each node's
/// release after the writes sends diffs to every other home (3 of them on 4 nodes): it posts
/// them all and waits once (`diff_waits`), and every byte survives.
pub(crate) fn false_sharing(r: &Runner<'_>, transports: &[&str], four: &[&str]) {
    let runs = transports
        .iter()
        .map(|t| (*t, 2u16))
        .chain(four.iter().map(|t| (*t, 4)));
    for (transport, nodes) in runs {
        let what = format!("false sharing on {nodes} nodes over {transport}");
        let out = ok(
            r.run(
                nodes,
                transport,
                &[],
                &["false-sharing", "--pages", "4", "--stats"],
            ),
            &what,
        );
        assert_eq!(
            out.lines().next(),
            Some("false-sharing: every node's bytes kept on 4 pages"),
            "{what}"
        );
        let n = usize::from(nodes);
        let mut once = vec![1; n];
        once.push(u64::from(nodes));
        assert_eq!(stats_row(&out, "diff_waits"), once, "{what}:\n{out}");
        // Each node wrote 4 - 4 / n pages of other homes: on 4 nodes, one to each other home.
        let pages = (4 - 4 / n) as u64;
        assert_eq!(stats_row(&out, "diff_pages")[..n], vec![pages; n], "{what}");
    }
}

pub(crate) fn write_fault(r: &Runner<'_>, transports: &[&str]) {
    for &transport in transports {
        let out = ok(
            r.run(2, transport, &[], &["write-fault"]),
            &format!("write-fault over {transport}"),
        );
        assert_eq!(
            out.trim(),
            "write-fault: faults 1, write faults 1, read faults 0",
            "{transport}"
        );
    }
}

pub(crate) fn prefetch(r: &Runner<'_>, transports: &[&str]) {
    for &transport in transports {
        // Without prefetch: one fetch per page read.
        let out = ok(
            r.run(2, transport, &[], &["prefetch"]),
            &format!("prefetch 0 over {transport}"),
        );
        for rank in 0..2 {
            let line = format!("prefetch: node {rank}: fetches 3, pages 3, prefetched 0, hits 0");
            assert!(out.lines().any(|l| l == line), "{transport}: {out}");
        }
        // Two pages ahead: node 0 gets 4, 5, 6 with its first fault, hits 5, and fetches 7
        // alone (8 belongs to another home); node 1 fetches 11 alone (the end), then 0, 1, 2.
        let out = ok(
            r.run(2, transport, &["--prefetch", "2"], &["prefetch"]),
            &format!("prefetch 2 over {transport}"),
        );
        for rank in 0..2 {
            let line = format!("prefetch: node {rank}: fetches 2, pages 4, prefetched 2, hits 1");
            assert!(out.lines().any(|l| l == line), "{transport}: {out}");
        }
        // One page ahead, six checked (the choice itself is unit-tested in `prefetch.rs`):
        // node 0 gets 4 and 5, hits 5, then 7 alone; node 1 gets 11, then 0 and 1.
        let out = ok(
            r.run(
                2,
                transport,
                &["--prefetch", "1", "--max-checking", "6"],
                &["prefetch"],
            ),
            &format!("prefetch 1, checking 6, over {transport}"),
        );
        for rank in 0..2 {
            let line = format!("prefetch: node {rank}: fetches 2, pages 3, prefetched 1, hits 1");
            assert!(out.lines().any(|l| l == line), "{transport}: {out}");
        }
    }
}

/// A page the node keeps mapped (its home page, a fetched copy) dropped from the page tables
/// behind the DSM's back, as memory reclaim does: the next touch sees the same bytes without a
/// fetch; with `userfaultfd` each such touch is a fault that maps the page again (before this
/// was handled, a home page's fault ended the process and a dirty page's looped for ever).
pub(crate) fn refault(r: &Runner<'_>, transports: &[&str]) {
    for &transport in transports {
        for (faults, count) in [("sigsegv", 1), ("userfaultfd", 2)] {
            let out = ok(
                r.run(2, transport, &["--faults", faults], &["refault"]),
                &format!("refault over {transport} with {faults}"),
            );
            assert_eq!(
                out.trim(),
                format!("refault: home page 7, remote page 41 then 41, fetches 0, faults {count}"),
                "{transport}, {faults}"
            );
        }
    }
}

/// The applications with `userfaultfd` faults: the same results as with `SIGSEGV`, a write
/// to an invalid page still one fault, no upgrade faults at all (every mapped copy is
/// writable), prefetch unchanged, a dead node named by the others.
pub(crate) fn userfaultfd_apps(r: &Runner<'_>, transports: &[&str], four: &[&str]) {
    let uffd = ["--faults", "userfaultfd"];
    for &transport in transports {
        let what = |app: &str| format!("{app} over {transport} with userfaultfd");
        let out = ok(
            r.run(
                2,
                transport,
                &uffd,
                &["counter", "--increments", "40", "--stats"],
            ),
            &what("counter"),
        );
        assert_eq!(
            out.lines().next(),
            Some("counter: 80 after 40 increments on each of 2 nodes"),
            "{}:\n{out}",
            what("counter")
        );
        let row = |name: &str| stats_row(&out, name);
        assert_eq!(row("upgrade_faults"), [0, 0, 0], "{out}");
        // Node 1 reads the counter once per increment (its copy was dropped at the lock) and
        // once more at the end; each read is a fault that fetches; the write takes none.
        assert_eq!(row("read_faults")[1], 41, "{out}");
        assert_eq!(row("write_faults")[1], 0, "{out}");
        assert_eq!(row("faults")[1], 41, "{out}");
        assert_eq!(row("diffs_applied")[0], 40, "{out}");

        let out = ok(
            r.run(2, transport, &uffd, &["matmul", "--n", "48"]),
            &what("matmul"),
        );
        assert!(
            out.starts_with(
                "matmul: 48 x 48, every element equal to the single-node product, sum -213.90625"
            ),
            "{}: {out}",
            what("matmul")
        );
        let out = ok(
            r.run(
                2,
                transport,
                &uffd,
                &["sor", "--n", "40", "--iterations", "4"],
            ),
            &what("sor"),
        );
        assert!(
            out.contains("sum 1898.822582543129"),
            "{}: {out}",
            what("sor")
        );
        let out = ok(
            r.run(2, transport, &uffd, &["false-sharing", "--pages", "4"]),
            &what("false sharing"),
        );
        assert_eq!(
            out.trim(),
            "false-sharing: every node's bytes kept on 4 pages"
        );
        let out = ok(
            r.run(2, transport, &uffd, &["write-fault"]),
            &what("write-fault"),
        );
        assert_eq!(
            out.trim(),
            "write-fault: faults 1, write faults 1, read faults 0",
            "{}",
            what("write-fault")
        );
        let out = ok(
            r.run(
                2,
                transport,
                &["--faults", "userfaultfd", "--prefetch", "2"],
                &["prefetch"],
            ),
            &what("prefetch 2"),
        );
        for rank in 0..2 {
            let line = format!("prefetch: node {rank}: fetches 2, pages 4, prefetched 2, hits 1");
            assert!(
                out.lines().any(|l| l == line),
                "{}: {out}",
                what("prefetch")
            );
        }
        let out = r.run(3, transport, &uffd, &["die", "--victim", "1"]);
        assert_eq!(out.status.code(), Some(1), "{}", what("die"));
        let err = text(&out.stderr);
        let named = err
            .lines()
            .filter(|l| {
                l.starts_with("dsm: node 1: died (its connection closed without it leaving)")
            })
            .count();
        assert_eq!(named, 2, "{}: {err}", what("die"));
    }
    for &transport in four {
        let out = ok(
            r.run(
                4,
                transport,
                &uffd,
                &["sor", "--n", "40", "--iterations", "4"],
            ),
            &format!("sor on 4 nodes over {transport} with userfaultfd"),
        );
        assert!(out.contains("sum 1898.822582543129"), "{transport}: {out}");
    }
}

pub(crate) fn unequal_calls(r: &Runner<'_>, transports: &[&str]) {
    for &transport in transports {
        let out = r.run(
            3,
            transport,
            &[],
            &["alloc", "--len", "1024", "--last-len", "5"],
        );
        assert_eq!(out.status.code(), Some(1), "{transport}");
        let err = text(&out.stderr);
        let line = "dsm: unequal collective calls: nodes 0, 1 called alloc (collective call 1); node 2 called alloc (collective call 1) with other arguments";
        assert_eq!(
            err.lines().filter(|l| *l == line).count(),
            3,
            "{transport}: {err}"
        );
    }
}

pub(crate) fn dead_node(r: &Runner<'_>, transports: &[&str]) {
    for &transport in transports {
        let started = Instant::now();
        let out = r.run(3, transport, &[], &["die", "--victim", "1"]);
        let took = started.elapsed();
        assert_eq!(out.status.code(), Some(1), "{transport}");
        let err = text(&out.stderr);
        let noticed = err
            .lines()
            .filter(|l| {
                l.starts_with("dsm: node 1: died (its connection closed without it leaving)")
            })
            .count();
        assert_eq!(
            noticed, 2,
            "{transport}: both survivors name node 1:\n{err}"
        );
        assert!(
            err.contains("dsm: run failed: node 0 exit status: 1")
                || err.contains("exit status: 3"),
            "{transport}: {err}"
        );
        // Well inside the 20-second peer bound: the death is seen, not timed out.
        assert!(took < Duration::from_secs(60), "{transport}: {took:?}");
    }
}

/// The randomised lock-and-barrier stress (`dsm stress`) on 3 nodes, for each (transport, fault
/// mechanism) of `runs` and each of `seeds`: every critical section's log entry is found, once,
/// in its lock's log, in the order each node made them (the app checks, on every node), and
/// every node counts the same steps.
pub(crate) fn stress(r: &Runner<'_>, runs: &[(&str, &str)], seeds: &[&str], ops: usize) {
    let sections = ops - ops / 8;
    for &(transport, faults) in runs {
        for &seed in seeds {
            let what = format!("stress over {transport} with {faults}, seed {seed}");
            let out = ok(
                r.run(
                    3,
                    transport,
                    &["--faults", faults],
                    &[
                        "stress",
                        "--ops",
                        &ops.to_string(),
                        "--locks",
                        "3",
                        "--seed",
                        seed,
                        "--stats",
                    ],
                ),
                &what,
            );
            assert_eq!(
                out.lines().next().map(str::to_string),
                Some(format!(
                    "stress: {sections} critical sections and {} barriers on each of 3 nodes \
                     over 3 locks (seed {seed}), every log complete and in order",
                    ops / 8
                )),
                "{what}"
            );
            let s = sections as u64;
            assert_eq!(stats_row(&out, "locks"), [s, s, s, 3 * s], "{what}");
        }
    }
}
