//! The DSM on the device, through its launcher and by hand: every application on the RDMA
//! transports (2 nodes, and 4 for some), the fault path, prefetch, and the failures (a node
//! that dies, unequal collective calls), with the cases shared with `host.rs`, which runs
//! them over `tcp` with no device (`common/cases.rs`); and launches by hand with the variables
//! of Slurm and MPI. Each run is bounded; results are checked by the applications against
//! single-node runs and by the tests against exact output lines.

mod common;

use std::process::{Child, Command, Output, Stdio};

use common::cases::{self, Runner};
use common::{BOUND, DSM, finish, text};
use rdma_test_support::TestDevice;

/// The transports that need the device.
const RDMA: [&str; 2] = ["rdma-send", "rdma-read"];

fn device() -> Option<TestDevice> {
    rdma_test_support::device()
}

/// Two nodes on every RDMA transport; four on the one-sided one.
#[test]
fn the_counter_under_a_lock_counts_every_increment() {
    let Some(device) = device() else { return };
    let r = Runner::on(&device);
    cases::counter(&r, &RDMA, &["rdma-read"]);
}

#[test]
fn hold_hands_the_lock_from_node_0_to_every_other_node() {
    let Some(device) = device() else { return };
    let r = Runner::on(&device);
    cases::hold(&r, &RDMA);
}

#[test]
fn matmul_and_sor_equal_the_single_node_run_bit_for_bit() {
    let Some(device) = device() else { return };
    let r = Runner::on(&device);
    cases::matmul_and_sor(&r, &RDMA, &["rdma-read"]);
}

#[test]
fn false_sharing_keeps_every_nodes_bytes() {
    let Some(device) = device() else { return };
    let r = Runner::on(&device);
    cases::false_sharing(&r, &RDMA, &["rdma-send"]);
}

#[test]
fn a_write_to_an_invalid_page_takes_one_fault() {
    let Some(device) = device() else { return };
    let r = Runner::on(&device);
    cases::write_fault(&r, &RDMA);
}

#[test]
fn prefetch_stops_at_home_boundaries_and_the_allocation_end() {
    let Some(device) = device() else { return };
    let r = Runner::on(&device);
    cases::prefetch(&r, &RDMA);
}

#[test]
fn pages_dropped_by_the_kernel_come_back_unchanged() {
    let Some(device) = device() else { return };
    let r = Runner::on(&device);
    cases::refault(&r, &RDMA);
}

#[test]
fn userfaultfd_faults_serve_every_application() {
    let Some(device) = device() else { return };
    let r = Runner::on(&device);
    cases::userfaultfd_apps(&r, &RDMA, &["rdma-read"]);
}

#[test]
fn unequal_collective_calls_fail_on_every_node() {
    let Some(device) = device() else { return };
    let r = Runner::on(&device);
    cases::unequal_calls(&r, &RDMA);
}

#[test]
fn a_dead_node_stops_the_others_with_its_name() {
    let Some(device) = device() else { return };
    let r = Runner::on(&device);
    cases::dead_node(&r, &RDMA);
}

#[test]
fn a_random_stress_of_locks_and_barriers_keeps_every_log_complete() {
    let Some(device) = device() else { return };
    cases::stress(
        &Runner::on(&device),
        &[("rdma-read", "sigsegv"), ("rdma-send", "userfaultfd")],
        &["20261129"],
        64,
    );
}

/// Starts `nodes` processes of `dsm counter` with the variables `vars(rank)` gives, as srun
/// or mpirun would, and checks node 0's result line.
fn launch_by_hand(
    device: &TestDevice,
    nodes: u16,
    transport: &str,
    vars: impl Fn(u16) -> Vec<(&'static str, String)>,
) {
    let children: Vec<Child> = (0..nodes)
        .map(|rank| {
            let mut c = Command::new(DSM);
            c.args(["counter", "--increments", "10"])
                .env_remove("DSM_RANK")
                .env_remove("DSM_SIZE")
                .env("DSM_TRANSPORT", transport)
                .env("DSM_DEVICE", &device.name)
                .env("DSM_GID_INDEX", device.gid_index.to_string())
                .env("DSM_WINDOW_MIB", "4")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in vars(rank) {
                c.env(k, v);
            }
            c.spawn().expect("spawn")
        })
        .collect();
    let outputs: Vec<Output> = children
        .into_iter()
        .map(|c| finish(c, BOUND, "a node started by hand"))
        .collect();
    let all: Vec<String> = outputs
        .iter()
        .enumerate()
        .map(|(rank, o)| format!("node {rank}: {}: {}", o.status, text(&o.stderr)))
        .collect();
    for out in &outputs {
        assert!(out.status.success(), "{transport}:\n{}", all.join("\n"));
    }
    assert_eq!(
        text(&outputs[0].stdout).trim(),
        format!(
            "counter: {} after 10 increments on each of {nodes} nodes",
            10 * nodes
        )
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

#[test]
fn slurm_and_mpi_variables_launch_it_by_hand() {
    let Some(device) = device() else { return };
    // srun: SLURM_PROCID, SLURM_NTASKS, the rendezvous host from the node list.
    let port = free_port();
    launch_by_hand(&device, 2, "rdma-read", |rank| {
        vec![
            ("SLURM_PROCID", rank.to_string()),
            ("SLURM_NTASKS", "2".into()),
            ("SLURM_JOB_NODELIST", "localhost".into()),
            ("DSM_PORT", port.to_string()),
        ]
    });
    // MPICH / Intel MPI (PMI) and Open MPI: rank and size, the rendezvous given.
    let port = free_port();
    launch_by_hand(&device, 3, "tcp", |rank| {
        vec![
            ("PMI_RANK", rank.to_string()),
            ("PMI_SIZE", "3".into()),
            ("DSM_RENDEZVOUS", format!("127.0.0.1:{port}")),
        ]
    });
    let port = free_port();
    launch_by_hand(&device, 2, "rdma-send", |rank| {
        vec![
            ("OMPI_COMM_WORLD_RANK", rank.to_string()),
            ("OMPI_COMM_WORLD_SIZE", "2".into()),
            ("DSM_RENDEZVOUS", format!("127.0.0.1:{port}")),
        ]
    });
}
