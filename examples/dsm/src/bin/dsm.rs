//! `dsm`: the DSM's launcher and its applications.
//!
//! `dsm run -n N [options] <app> [app options]` starts N local nodes of `dsm <app>`; under
//! Slurm or MPI, start `dsm <app>` itself with `srun`/`mpirun` (see the package README).

use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use dsm::{Config, FaultMechanism, Node, Placement, TransportKind, apps};

#[derive(Parser, Debug)]
#[command(
    name = "dsm",
    about = "Software distributed shared memory over RDMA: launcher and applications"
)]
struct Cli {
    /// Each node says on stderr when it has joined the job: `dsm: node R of N joined`.
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Start N local nodes running one application.
    Run(RunArgs),
    /// A counter incremented under a lock by every node.
    Counter {
        /// Increments per node.
        #[arg(long, default_value_t = 100)]
        increments: u64,
        #[command(flatten)]
        report: ReportArgs,
    },
    /// C = A × B on n × n doubles, checked against a single-node product.
    Matmul {
        /// Matrix order.
        #[arg(long, default_value_t = 64)]
        n: usize,
        #[command(flatten)]
        report: ReportArgs,
    },
    /// Red-black SOR on an n × n grid, checked against a single-node run.
    Sor {
        /// Grid order.
        #[arg(long, default_value_t = 64)]
        n: usize,
        /// Sweeps.
        #[arg(long, default_value_t = 10)]
        iterations: usize,
        #[command(flatten)]
        report: ReportArgs,
    },
    /// Every node writes its own bytes of shared pages; all of them must survive.
    FalseSharing {
        /// Pages written.
        #[arg(long, default_value_t = 4)]
        pages: usize,
        #[command(flatten)]
        report: ReportArgs,
    },
    /// Every node writes, then reads, every `--stride`-th page of a large allocation.
    Stride {
        /// Pages allocated (placed in blocks).
        #[arg(long, default_value_t = 1024)]
        pages: usize,
        /// Every how many pages one is touched.
        #[arg(long, default_value_t = 2)]
        stride: usize,
        #[command(flatten)]
        report: ReportArgs,
    },
    /// Random locks and barriers, every critical section logged, the logs checked.
    Stress {
        /// Steps per node (every 8th a barrier, the others a critical section).
        #[arg(long, default_value_t = 200)]
        ops: usize,
        /// Locks to choose from.
        #[arg(long, default_value_t = 4)]
        locks: u32,
        /// The random sequence's seed (each node's is derived from it and its rank).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[command(flatten)]
        report: ReportArgs,
    },
    /// Node 0 writes to a page it holds no copy of; prints the faults that took.
    WriteFault,
    /// Reads at the first, last and boundary pages of a block; prints the fetch counts.
    Prefetch,
    /// The page-fetch microbenchmark: node 0 faults on pages homed at node 1.
    FetchBench {
        /// Pages fetched.
        #[arg(long, default_value_t = 200)]
        pages: usize,
    },
    /// Touches memory just past the shared window (the process must die of SIGSEGV).
    Outside,
    /// Node 0 reads a page homed at node 1 and writes one of its own, then drops both from
    /// its page tables behind the DSM's back (`MADV_DONTNEED`, as memory reclaim does) and
    /// reads them again; prints the values and what that cost.
    Refault,
    /// Allocates a shared array, optionally of a different size on the last node (to show
    /// the unequal-call error), and holds a barrier.
    Alloc {
        /// Elements (u64).
        #[arg(long, default_value_t = 1024)]
        len: usize,
        /// Elements on the last node, if different.
        #[arg(long)]
        last_len: Option<usize>,
        /// Deal the pages to the nodes one by one (`Placement::Interleaved`), not in blocks.
        #[arg(long)]
        interleaved: bool,
    },
    /// Node 0 takes lock 0 and holds it for `--ms` while every other node asks for it (each
    /// says so on stderr first); then each takes it in turn, after node 0's release.
    Hold {
        /// How long node 0 holds the lock, milliseconds (the others wait at most the lock
        /// bound, `--sync-timeout-ms`).
        #[arg(long, default_value_t = 1_000)]
        ms: u64,
    },
    /// Node `--victim` exits abruptly after the first barrier; the others go on to a second.
    Die {
        /// The node that exits.
        #[arg(long, default_value_t = 1)]
        victim: u16,
    },
}

#[derive(Args, Debug, Clone, Copy)]
struct ReportArgs {
    /// Print every node's statistics (on node 0).
    #[arg(long)]
    stats: bool,
    /// Print the statistics as JSON (on node 0).
    #[arg(long)]
    json: bool,
    /// Print the application's own time (after joining, before leaving) on node 0.
    #[arg(long)]
    time: bool,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Nodes to start.
    #[arg(short = 'n', long, default_value_t = 2)]
    nodes: u16,
    /// Transport.
    #[arg(short, long, value_enum, default_value_t = TransportKind::Tcp)]
    transport: TransportKind,
    /// Shared window size in MiB.
    #[arg(long, default_value_t = 64)]
    window_mib: usize,
    /// The window's address (hex), the same on every node.
    #[arg(long, value_parser = parse_hex)]
    window_base: Option<usize>,
    /// Bound on joining and on each reply, milliseconds.
    #[arg(long, default_value_t = 30_000)]
    timeout_ms: u64,
    /// Bound on lock and barrier waits, milliseconds.
    #[arg(long, default_value_t = 300_000)]
    sync_timeout_ms: u64,
    /// Pages prefetched after a faulting one.
    #[arg(long, default_value_t = 0)]
    prefetch: u16,
    /// Pages after a faulting one examined for prefetch (those with a copy or another home
    /// are skipped); below --prefetch it counts as --prefetch.
    #[arg(long, default_value_t = 0)]
    max_checking: u16,
    /// RDMA device.
    #[arg(short = 'd', long)]
    device: Option<String>,
    /// GID index (RoCE).
    #[arg(short = 'g', long, default_value_t = 1)]
    gid_index: u8,
    /// How faults on the shared window are caught.
    #[arg(short = 'f', long, value_enum, default_value_t = FaultMechanism::Sigsegv)]
    faults: FaultMechanism,
    /// The application and its options.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    app: Vec<String>,
}

fn parse_hex(text: &str) -> Result<usize, String> {
    usize::from_str_radix(text.trim_start_matches("0x"), 16).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Run(args) => run(args, cli.verbose),
        app => node_main(app, cli.verbose),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            dsm::say!("dsm: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs one application as this process's node.
fn node_main(app: Cmd, verbose: bool) -> Result<(), String> {
    let node = Node::from_env().map_err(|e| e.to_string())?;
    let rank = node.rank();
    if verbose {
        dsm::say!("dsm: node {rank} of {} joined", node.nodes());
    }
    let mut compute = None;
    let report = match app {
        Cmd::Counter { increments, report } => {
            let t = apps::counter(&node, increments).map_err(|e| e.to_string())?;
            let v = t.value;
            compute = Some(t.compute);
            if rank == 0 {
                println!(
                    "counter: {v} after {increments} increments on each of {} nodes",
                    node.nodes()
                );
            }
            Some(report)
        }
        Cmd::Matmul { n, report } => {
            let t = apps::matmul(&node, n).map_err(|e| e.to_string())?;
            let sum = t.value;
            compute = Some(t.compute);
            if rank == 0 {
                println!(
                    "matmul: {n} x {n}, every element equal to the single-node product, sum {sum}"
                );
            }
            Some(report)
        }
        Cmd::Sor {
            n,
            iterations,
            report,
        } => {
            let t = apps::sor(&node, n, iterations).map_err(|e| e.to_string())?;
            let sum = t.value;
            compute = Some(t.compute);
            if rank == 0 {
                println!(
                    "sor: {n} x {n}, {iterations} sweeps, every cell equal to the single-node run, sum {sum}"
                );
            }
            Some(report)
        }
        Cmd::FalseSharing { pages, report } => {
            apps::false_sharing(&node, pages).map_err(|e| e.to_string())?;
            if rank == 0 {
                println!("false-sharing: every node's bytes kept on {pages} pages");
            }
            Some(report)
        }
        Cmd::Stride {
            pages,
            stride,
            report,
        } => {
            let done = apps::stride(&node, pages, stride).map_err(|e| e.to_string())?;
            if rank == 0 {
                println!(
                    "stride: {pages} pages, every {stride} written by every node ({} on each, \
                     {} of other homes twice), every word checked at its home",
                    done.touched, done.rewritten
                );
            }
            Some(report)
        }
        Cmd::Stress {
            ops,
            locks,
            seed,
            report,
        } => {
            let done = apps::stress(&node, ops, locks, seed).map_err(|e| e.to_string())?;
            if rank == 0 {
                println!(
                    "stress: {} critical sections and {} barriers on each of {} nodes over \
                     {locks} locks (seed {seed}), every log complete and in order",
                    done.sections,
                    done.barriers,
                    node.nodes()
                );
            }
            Some(report)
        }
        Cmd::WriteFault => {
            let (faults, writes, reads) = apps::write_fault(&node).map_err(|e| e.to_string())?;
            if rank == 0 {
                println!(
                    "write-fault: faults {faults}, write faults {writes}, read faults {reads}"
                );
            }
            None
        }
        Cmd::Prefetch => {
            let c = apps::prefetch(&node).map_err(|e| e.to_string())?;
            println!(
                "prefetch: node {rank}: fetches {}, pages {}, prefetched {}, hits {}",
                c.fetches, c.pages, c.prefetched, c.hits
            );
            None
        }
        Cmd::FetchBench { pages } => {
            let b = apps::fetch_bench(&node, pages).map_err(|e| e.to_string())?;
            if rank == 0 {
                println!(
                    "fetch-bench: {} pages: fault p50 {} p99 {} p99.9 {} ns; transfer p50 {} p99 {} ns; local fault p50 {} p99 {} ns",
                    b.pages,
                    b.fault_p50,
                    b.fault_p99,
                    b.fault_p999,
                    b.transfer_p50,
                    b.transfer_p99,
                    b.local_p50,
                    b.local_p99
                );
            }
            None
        }
        Cmd::Refault => {
            refault(&node)?;
            None
        }
        Cmd::Outside => {
            node.barrier().map_err(|e| e.to_string())?;
            let end = node.config().window_base + node.config().window_bytes;
            touch_past_window(end)?;
            return Err("the touch past the window did not fault".into());
        }
        Cmd::Alloc {
            len,
            last_len,
            interleaved,
        } => {
            let len = match last_len {
                Some(l) if rank + 1 == node.nodes() => l,
                _ => len,
            };
            let _array = node
                .alloc::<u64>(
                    len,
                    if interleaved {
                        Placement::Interleaved
                    } else {
                        Placement::Blocked
                    },
                )
                .map_err(|e| e.to_string())?;
            node.barrier().map_err(|e| e.to_string())?;
            None
        }
        Cmd::Hold { ms } => {
            hold(&node, ms).map_err(|e| e.to_string())?;
            match (rank, node.nodes() - 1) {
                (0, 0) => println!("hold: lock 0 held {ms} ms by node 0 (no other node)"),
                (0, others) => println!(
                    "hold: lock 0 held {ms} ms by node 0, then taken by each of the {others} \
                     others after its release"
                ),
                _ => {}
            }
            None
        }
        Cmd::Die { victim } => {
            node.barrier().map_err(|e| e.to_string())?;
            if rank == victim {
                dsm::say!("dsm: node {rank} exits without leaving (on purpose)");
                std::process::exit(3);
            }
            let started = Instant::now();
            let result = node.barrier();
            return match result {
                Ok(()) => Err("the barrier passed without the dead node".into()),
                Err(e) => Err(format!(
                    "{e} (noticed after {:.1} s)",
                    started.elapsed().as_secs_f64()
                )),
            };
        }
        Cmd::Run(_) => unreachable!("handled in main"),
    };
    let report_args = report;
    if let (0, Some(took), Some(true)) = (rank, compute, report_args.map(|r| r.time)) {
        println!("time: {} us", took.as_micros());
    }
    let report = node.finalize().map_err(|e| e.to_string())?;
    if let Some(args) = report_args {
        if rank == 0 && args.json {
            println!("{}", report.json());
        } else if rank == 0 && args.stats {
            print!("{}", report.table());
        }
    }
    Ok(())
}

/// The `hold` application (see [`Cmd::Hold`]): the others wait for a lock grant for as long
/// as node 0 holds the lock, which the fault tests use to take a host away during that wait.
///
/// Each holder counts itself into a shared word under the lock: node 0 writes 1 just before
/// its release, so a node that finds 0 took the lock before that release (an error), and the
/// word ends equal to the number of nodes.
fn hold(node: &Node, ms: u64) -> dsm::Result<()> {
    let rank = node.rank();
    let holders = node.alloc::<u64>(1, Placement::Home(0))?;
    if rank == 0 {
        let guard = node.lock(0)?;
        node.barrier()?;
        std::thread::sleep(Duration::from_millis(ms));
        holders.set(0, 1)?;
        guard.unlock()?;
    } else {
        node.barrier()?;
        dsm::say!("dsm: node {rank} asks for lock 0, which node 0 holds");
        let guard = node.lock(0)?;
        let before = holders.get(0)?;
        if before == 0 {
            return Err(dsm::Error::Check(format!(
                "node {rank}: took lock 0 before node 0 released it"
            )));
        }
        holders.set(0, before + 1)?;
        guard.unlock()?;
    }
    node.barrier()?;
    let holders = holders.get(0)?;
    if holders != u64::from(node.nodes()) {
        return Err(dsm::Error::Check(format!(
            "node {rank}: lock 0 had {holders} holders, {} expected",
            node.nodes()
        )));
    }
    node.barrier()
}

/// The `refault` application (see [`Cmd::Refault`]).
fn refault(node: &Node) -> Result<(), String> {
    let e = |e: dsm::Error| e.to_string();
    if node.nodes() != 2 {
        return Err("refault runs on exactly two nodes".into());
    }
    const PER_PAGE: usize = dsm::PAGE / 8;
    // Page 0 homed at node 0, page 1 at node 1.
    let pages = node
        .alloc::<u64>(2 * PER_PAGE, Placement::Cyclic { pages: 1 })
        .map_err(e)?;
    if node.rank() == 1 {
        pages.set(PER_PAGE, 41).map_err(e)?;
    }
    node.barrier().map_err(e)?;
    if node.rank() == 0 {
        pages.set(0, 7).map_err(e)?;
        let remote = pages.get(PER_PAGE).map_err(e)?;
        let before = node.stats();
        for i in [0, PER_PAGE] {
            let addr = pages.addr_of(i).map_err(e)?;
            // SAFETY: a whole page of the DSM's window (page aligned: each page starts an
            // element run of PER_PAGE); MADV_DONTNEED on its shared file mapping drops the
            // page-table entry and keeps the file's page, as reclaim does, and no reference
            // into the window exists.
            let rc =
                unsafe { libc::madvise(addr as *mut libc::c_void, dsm::PAGE, libc::MADV_DONTNEED) };
            if rc != 0 {
                return Err(format!("madvise: {}", std::io::Error::last_os_error()));
            }
        }
        let (home, again) = (pages.get(0).map_err(e)?, pages.get(PER_PAGE).map_err(e)?);
        pages.set(PER_PAGE + 1, 1).map_err(e)?;
        let after = node.stats();
        println!(
            "refault: home page {home}, remote page {remote} then {again}, fetches {}, faults {}",
            after.fetches - before.fetches,
            after.faults - before.faults
        );
    }
    node.barrier().map_err(e)?;
    Ok(())
}

/// Maps an inaccessible page right after the window and reads it: the fault is outside the
/// window, so the DSM's handler passes it on and the process dies of SIGSEGV.
fn touch_past_window(end: usize) -> Result<(), String> {
    // SAFETY: a new anonymous mapping at a fixed address that MAP_FIXED_NOREPLACE refuses to
    // take from anything already mapped.
    let page = unsafe {
        libc::mmap(
            end as *mut libc::c_void,
            dsm::PAGE,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if page == libc::MAP_FAILED || page as usize != end {
        return Err(format!("cannot map the page after the window at {end:#x}"));
    }
    // SAFETY: deliberately none: the page is inaccessible, the read faults, and the process
    // is meant to die of the signal. This is the test of that path, reached only by the
    // `outside` application.
    let _ = unsafe { std::ptr::read_volatile(page.cast::<u8>()) };
    Ok(())
}

/// Starts `nodes` copies of this program running `app`, waits for them, and fails if any
/// failed (the others are given the configured timeout to notice and stop, then killed).
fn run(args: RunArgs, verbose: bool) -> Result<(), String> {
    if args.nodes == 0 {
        return Err("-n must be at least 1".into());
    }
    let mut config = Config {
        transport: args.transport,
        window_bytes: args
            .window_mib
            .checked_mul(1 << 20)
            .filter(|b| *b > 0)
            .ok_or("--window-mib is out of range")?,
        timeout: Duration::from_millis(args.timeout_ms),
        sync_timeout: Duration::from_millis(args.sync_timeout_ms),
        prefetch: args.prefetch,
        max_checking: args.max_checking,
        device: args.device,
        gid_index: args.gid_index,
        faults: args.faults,
        ..Config::default()
    };
    if let Some(base) = args.window_base {
        config.window_base = base;
    }
    let rendezvous = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("choosing a rendezvous port: {e}"))?;
    let exe = std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?;
    let mut children: Vec<(u16, Child)> = Vec::new();
    for rank in 0..args.nodes {
        let mut command = Command::new(&exe);
        command
            .args(verbose.then_some("--verbose"))
            .args(&args.app)
            .env("DSM_RANK", rank.to_string())
            .env("DSM_SIZE", args.nodes.to_string())
            .env("DSM_RENDEZVOUS", rendezvous.to_string())
            .env_remove("SLURM_PROCID")
            .env_remove("PMI_RANK")
            .env_remove("OMPI_COMM_WORLD_RANK");
        for (name, value) in config.to_vars() {
            command.env(name, value);
        }
        match command.spawn() {
            Ok(child) => children.push((rank, child)),
            Err(e) => {
                for (_, c) in &mut children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(format!("starting node {rank}: {e}"));
            }
        }
    }
    let mut failed: Vec<String> = Vec::new();
    let mut deadline: Option<Instant> = None;
    let grace = config.timeout + Duration::from_secs(5);
    while !children.is_empty() {
        let mut i = 0;
        while i < children.len() {
            match children[i].1.try_wait() {
                Ok(Some(status)) => {
                    let (rank, _) = children.remove(i);
                    if !status.success() {
                        failed.push(format!("node {rank} {status}"));
                        deadline.get_or_insert(Instant::now() + grace);
                    }
                }
                Ok(None) => i += 1,
                Err(e) => return Err(format!("waiting for node {}: {e}", children[i].0)),
            }
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            for (rank, child) in &mut children {
                let _ = child.kill();
                let _ = child.wait();
                failed.push(format!(
                    "node {rank} killed after {:.0} s",
                    grace.as_secs_f64()
                ));
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("run failed: {}", failed.join("; ")))
    }
}
