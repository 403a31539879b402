//! Workspace tasks, run as `cargo xtask <task>`.
//!
//! - `setup`: installs what a fresh machine needs (idempotent).
//! - `test`: builds every test on the host and runs the suite on an RDMA device: the host's own
//!   if it has an active one, otherwise a Soft-RoCE device in a throwaway VM.
//! - `harness-selftest`: proves that the test harness's verdict can fail (planted failures and
//!   a hung VM).
//! - `instructions`: counts the instructions of a post+poll round in C, on the `unsafe` calls
//!   and on owned buffers.
//! - `bench-compare`: the Rust `lat` and `bw` tools against C perftest, alternately, in one
//!   run.
//! - `bench`: the criterion benches (`cargo bench`) on the device.
//! - `build-benches`: builds the benches, the benchmark tools and the C reference program.
//! - `ci`: `.ci/run`, the tier of CI every change runs; `ci --full` adds the second tier.
//! - `modules`: prints the module graph of each library crate and fails where one breaks the
//!   layers `docs/modules.md` declares for it (or has a cycle).
//! - `bindgen`: regenerates the checked-in raw bindings of `rdma-verbs-sys`.
//! - `fuzz`: the DSM's wire decoders under libFuzzer for a bounded time.

#[cfg(feature = "bindgen")]
mod bindgen;
mod ci;
mod coverage;
#[cfg(test)]
mod docs_pages;
mod fuzz;
mod harness;
mod modules;
mod setup;

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace_root();
    let result = match args.first().map(String::as_str) {
        Some("bindgen") => run_bindgen(&root),
        Some("setup") => match &args[1..] {
            [] => setup::run(),
            [flag, version] if flag == "--kernel" => setup::run_kernel(version),
            _ => Err("usage: cargo xtask setup [--kernel VERSION]".to_string()),
        },
        Some("test") => harness::run(&root, &args[1..]),
        Some("pingpong") => harness::pingpong(&root, &args[1..]),
        Some("harness-selftest") => harness::selftest(&root, &args[1..]),
        Some("modules") => modules::run(&root),
        Some("coverage") => coverage::run(&root, &args[1..]),
        Some("instructions") => harness::instructions(&root, &args[1..]),
        Some("bench-compare") => harness::bench_compare(&root, &args[1..]),
        Some("bench") => harness::bench(&root, &args[1..]),
        Some("build-benches") => harness::build_benches(&root, &args[1..]),
        Some("ci") => ci::run(&root, &args[1..]),
        // Internal: the guest scripts' line prefixer.
        Some("prefix-lines") => harness::prefix_lines(&args[1..]),
        // Internal: the guest scripts' check of the kernel log around each binary.
        Some("kernel-log") => harness::kernel_log(&args[1..]),
        Some("dsm-bench") => harness::dsm_bench(&root, &args[1..]),
        Some("fuzz") => fuzz::run(&root, &args[1..]),
        Some("-h" | "--help") | None => {
            print!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown task `{other}`\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            // An empty message: the task printed its verdict already, and its last line must
            // stay last.
            if !message.is_empty() {
                eprintln!("xtask: {message}");
            }
            ExitCode::FAILURE
        }
    }
}

const USAGE: &str = "usage: cargo xtask <task>
tasks:
  setup             install the packages a fresh machine needs (idempotent); --kernel
                    VERSION: only the distribution's kernel VERSION (6.12), for test --kernel
  test              build all tests and run them on an RDMA device (Soft-RoCE VM if the host
                    has none); options: --vm, --host, --no-doc, --repeat N, --nodes N,
                    --lanes N (device binaries at once in the VM, default 2),
                    --kernel VERSION (the VMs boot that kernel, not the distribution's),
                    -- <test filter and libtest arguments>
  ci                run .ci/run, the tier of CI every change runs; --full: then the second
                    tier (four-VM DSM job, criterion benches, bench-compare --smoke, the
                    interop pairings 50 times each, the suite on kernel 6.12, the DSM's
                    wire decoders fuzzed for 300 s), logs in target/ci-full/
  pingpong          run rc_pingpong server and client on the device (Soft-RoCE VM if the host
                    has none); extra arguments go to both, e.g. `cargo xtask pingpong -s 64`
  harness-selftest  prove the test harness fails on planted failures and stops a hung VM
  instructions      count the user-space instructions of a post+poll round with callgrind,
                    in C, on the unsafe calls and on owned buffers (on the device;
                    Soft-RoCE VM if none); option: the round count (default 2000)
  bench             run the criterion benches (`cargo bench -p rdma-benches`) on the device
                    (Soft-RoCE VM if none); criterion's arguments after `--`
  build-benches     build the criterion benches, the release tools (lat, bw, instructions,
                    dsm) and the C reference program, running nothing
  bench-compare     run the Rust `lat`/`bw` tools and C perftest's ib_*_lat/ib_send_bw
                    alternately on the device (Soft-RoCE VM if none) and print their
                    latencies, message rates and ratios;
                    options: --rounds N (5), --iters N (1000), --sizes a,b,.. (2,64,1024,4096),
                    --write (the table into docs/benchmarks.md, the plot into docs/),
                    --smoke (1 round, 100 iterations, 64 bytes)
  dsm-bench         the DSM's page-fetch benchmark over tcp, rdma-send and rdma-read, C
                    perftest's 4 KiB read and send latency, and the applications on 1 and 2
                    nodes (Soft-RoCE VM if no device); options: --rounds N (3), --pages N
                    (200), --write (tables into examples/dsm/README.md, plot beside it)
  fuzz              the DSM's wire decoders under libFuzzer (cargo fuzz on the pinned
                    nightly, installed where missing); option: --seconds N (60)
  coverage          how many of the installed rdma-core's public functions the library
                    crates call, by area; --check (against docs/coverage.md), --write (into it)
  modules           print each library crate's module graph; fail if it breaks
                    the layers docs/modules.md declares (or has a cycle)
  bindgen           regenerate rdma-verbs-sys/src/bindings from the installed headers
";

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

#[cfg(feature = "bindgen")]
fn run_bindgen(root: &std::path::Path) -> Result<(), String> {
    bindgen::generate(root)
}

/// Without the `bindgen` feature, rebuild this tool with it and run the task there, so that
/// everyday `cargo xtask` invocations do not compile bindgen.
#[cfg(not(feature = "bindgen"))]
fn run_bindgen(root: &std::path::Path) -> Result<(), String> {
    let status = std::process::Command::new(env!("CARGO"))
        .current_dir(root)
        .args([
            "run",
            "--quiet",
            "--package",
            "xtask",
            "--features",
            "bindgen",
            "--",
            "bindgen",
        ])
        .status()
        .map_err(|e| format!("running cargo: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err("binding generation failed".to_string())
    }
}
