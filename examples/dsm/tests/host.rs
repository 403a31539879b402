//! The DSM with no RDMA device: the `tcp` transport between processes on the host's loopback.
//! Every test here runs in a plain `cargo test`, and the harness runs this binary on the host
//! (its name ends in `host`), not in the device VM: the cases `nodes.rs` runs on the RDMA
//! transports (`common/cases.rs`) over `tcp`, a large window with over 100,000 pages touched
//! on both fault mechanisms, allocations refused up front, and the failures that need no peer
//! (a touch outside the window, a node that never joins, bad configuration).

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::cases::{self, Runner};
use common::{BOUND, DSM, finish, ok, stats_row, text};

/// The one transport that needs no device.
const TCP: [&str; 1] = ["tcp"];

/// `dsm run -n nodes -t tcp <run options> <app...>`, as [`Runner::run`] with no device.
fn run(nodes: u16, extra: &[&str], app: &[&str]) -> Output {
    Runner::host().run(nodes, "tcp", extra, app)
}

#[test]
fn the_counter_under_a_lock_counts_every_increment() {
    cases::counter(&Runner::host(), &TCP, &[]);
}

#[test]
fn hold_hands_the_lock_from_node_0_to_every_other_node() {
    let r = Runner::host();
    cases::hold(&r, &TCP);
    let output = r.run(1, "tcp", &[], &["hold", "--ms", "0"]);
    let err = text(&output.stderr);
    assert!(!err.contains("joined"), "not verbose, yet: {err}");
    let out = ok(output, "hold on 1 node");
    assert_eq!(
        out.trim(),
        "hold: lock 0 held 0 ms by node 0 (no other node)"
    );
}

#[test]
fn matmul_and_sor_equal_the_single_node_run_bit_for_bit() {
    cases::matmul_and_sor(&Runner::host(), &TCP, &TCP);
}

#[test]
fn false_sharing_keeps_every_nodes_bytes() {
    cases::false_sharing(&Runner::host(), &TCP, &TCP);
}

#[test]
fn a_write_to_an_invalid_page_takes_one_fault() {
    cases::write_fault(&Runner::host(), &TCP);
}

#[test]
fn prefetch_stops_at_home_boundaries_and_the_allocation_end() {
    cases::prefetch(&Runner::host(), &TCP);
}

#[test]
fn pages_dropped_by_the_kernel_come_back_unchanged() {
    cases::refault(&Runner::host(), &TCP);
}

#[test]
fn userfaultfd_faults_serve_every_application() {
    cases::userfaultfd_apps(&Runner::host(), &TCP, &[]);
}

#[test]
fn unequal_collective_calls_fail_on_every_node() {
    cases::unequal_calls(&Runner::host(), &TCP);
}

#[test]
fn a_dead_node_stops_the_others_with_its_name() {
    cases::dead_node(&Runner::host(), &TCP);
}

#[test]
fn a_random_stress_of_locks_and_barriers_keeps_every_log_complete() {
    cases::stress(
        &Runner::host(),
        &[("tcp", "sigsegv"), ("tcp", "userfaultfd")],
        &["1", "20261129"],
        400,
    );
}

/// A 1 GiB window, 200,100 pages allocated in two blocks, every other page written by both
/// nodes: each node touches 100,050 pages, 50,025 of them in the other node's block, each a
/// write fault and a fetch. With `SIGSEGV` faults those copies alternate with pages the node
/// holds no copy of, each a memory mapping of its own: about 100,000, past the kernel's
/// `vm.max_map_count` (65,530 by default), so a node must drop its copies, their changes sent
/// home, at least once (the `evictions` row) and goes on. The 6,253 pages at the start of the
/// other block are written again afterwards: dropped by then, each is a write fault and a
/// fetch again, and its second value is the one its home must hold. With `userfaultfd` the
/// window is never split, nothing is dropped and the second writes take no fault. Every word
/// is checked at its home.
#[test]
fn a_gibibyte_window_serves_over_100000_touched_pages_on_both_fault_mechanisms() {
    for faults in ["sigsegv", "userfaultfd"] {
        let out = ok(
            run(
                2,
                &["--window-mib", "1024", "--faults", faults],
                &["stride", "--pages", "200100", "--stats"],
            ),
            faults,
        );
        assert_eq!(
            out.lines().next(),
            Some(
                "stride: 200100 pages, every 2 written by every node (100050 on each, 6253 of \
                 other homes twice), every word checked at its home"
            ),
            "{faults}: {out}"
        );
        let evictions = stats_row(&out, "evictions");
        let (faulted, total) = if faults == "sigsegv" {
            (50_025 + 6_253, 2 * (50_025 + 6_253))
        } else {
            (50_025, 100_050)
        };
        assert_eq!(stats_row(&out, "write_faults"), [faulted, faulted, total]);
        assert_eq!(stats_row(&out, "fetches"), [faulted, faulted, total]);
        if faults == "sigsegv" {
            assert!(
                evictions[..2].iter().all(|&e| e >= 1),
                "{faults}: evictions {evictions:?}\n{out}"
            );
        } else {
            assert_eq!(evictions, [0, 0, 0], "{faults}");
        }
    }
}

/// An allocation whose home pages alone would split a `SIGSEGV` window into more mappings than
/// half of what the process has left under `vm.max_map_count` is refused before any page is
/// opened, on every node, with the same line naming the limit; the same allocation with
/// `userfaultfd` faults, which never split the window, is taken.
#[test]
fn an_allocation_whose_home_pages_pass_the_mapping_limit_is_refused_on_every_node() {
    // 50,000 pages dealt one by one to two nodes: each node's 25,000 home pages are 50,001
    // mappings.
    let app = ["alloc", "--len", "25600000", "--interleaved"];
    let out = run(2, &["--window-mib", "1024"], &app);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    let refused: Vec<&str> = err
        .lines()
        .filter(|l| {
            l.starts_with(
                "dsm: node 0: the home pages of an allocation of 50000 pages placed Interleaved \
                 (they may take half the window's mappings, the rest is for cached copies): the \
                 shared window would take 50001 memory mappings, more than the ",
            ) && l.contains(
                "this process has for it under vm.max_map_count = 65530; place allocations in \
                 larger blocks",
            )
        })
        .collect();
    assert_eq!(refused.len(), 2, "both nodes say so:\n{err}");
    ok(
        run(
            2,
            &["--window-mib", "1024", "--faults", "userfaultfd"],
            &app,
        ),
        "the same allocation with userfaultfd",
    );
}

#[test]
fn a_touch_outside_the_window_dies_of_sigsegv() {
    for faults in ["sigsegv", "userfaultfd"] {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let child = Command::new(DSM)
            .arg("outside")
            .env("DSM_RANK", "0")
            .env("DSM_SIZE", "1")
            .env("DSM_RENDEZVOUS", port.to_string())
            .env("DSM_WINDOW_MIB", "4")
            .env("DSM_FAULTS", faults)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let out = finish(child, BOUND, "outside");
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGSEGV),
            "{faults}: {:?}\n{}",
            out.status,
            text(&out.stderr)
        );
    }
}

#[test]
fn an_allocation_larger_than_the_window_is_refused() {
    // 8 MiB window: 2048 pages; 2 Mi u64 need 4096.
    let out = run(2, &[], &["alloc", "--len", "2097152"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.lines().filter(|l| l.starts_with(
            "dsm: an allocation of 16777216 bytes (4096 pages) does not fit: 2048 of the window's 2048 pages are left"
        )).count() == 2,
        "{err}"
    );
}

#[test]
fn a_node_that_never_joins_is_named_within_the_bound() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let started = Instant::now();
    let child = Command::new(DSM)
        .args(["counter", "--increments", "1"])
        .env("DSM_RANK", "0")
        .env("DSM_SIZE", "2")
        .env("DSM_RENDEZVOUS", port.to_string())
        .env("DSM_TIMEOUT_MS", "2000")
        .env("DSM_WINDOW_MIB", "4")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let out = finish(child, BOUND, "lonely node 0");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr).trim(),
        "dsm: node 1: never joined (missing: nodes 1; bound DSM_TIMEOUT_MS)"
    );
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn bad_configuration_is_one_line_and_exit_1() {
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case<'_>; 4] = [
        (
            &["counter"],
            &[],
            "dsm: configuration: no rank in the environment: start under `dsm run`, srun or mpirun, or set DSM_RANK, DSM_SIZE and DSM_RENDEZVOUS",
        ),
        (
            &["counter"],
            &[
                ("DSM_RANK", "2"),
                ("DSM_SIZE", "2"),
                ("DSM_RENDEZVOUS", "127.0.0.1:1"),
            ],
            "dsm: configuration: rank 2 of 2 nodes (DSM_RANK, DSM_SIZE)",
        ),
        (
            &["counter"],
            &[
                ("DSM_RANK", "0"),
                ("DSM_SIZE", "1"),
                ("DSM_RENDEZVOUS", "127.0.0.1:1"),
                ("DSM_TRANSPORT", "udp"),
            ],
            "dsm: configuration: transport \"udp\" (tcp, rdma-send or rdma-read)",
        ),
        (
            &["run", "-n", "0", "counter"],
            &[],
            "dsm: -n must be at least 1",
        ),
    ];
    for (args, vars, expected) in cases {
        let mut c = Command::new(DSM);
        c.args(args)
            .env_remove("DSM_RANK")
            .env_remove("SLURM_PROCID")
            .env_remove("PMI_RANK")
            .env_remove("OMPI_COMM_WORLD_RANK")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in vars {
            c.env(k, v);
        }
        let out = finish(c.spawn().expect("spawn"), BOUND, "bad configuration");
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(text(&out.stderr).trim(), expected, "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}
