//! `bw`: message rate and bandwidth of SEND, RDMA WRITE and RDMA READ between two processes,
//! measured and reported as perftest's `ib_send_bw`, `ib_write_bw` and `ib_read_bw` measure and
//! report them, on
//! rdma-verbs' `unsafe` post calls, `-l` requests per doorbell. Start the server without a
//! host, then the client with the server's host:
//!
//! ```text
//! bw send -d rxe0 -x 1 -s 64 -l 32            # server
//! bw send -d rxe0 -x 1 -s 64 -l 32 10.0.2.15  # client
//! ```
//!
//! Both sides must be given the same options. After the timed run the server checks that it
//! received every message and checks one more message (or write) byte for byte (see
//! `rdma_benches::bw`); a mismatch fails the program.

use std::process::ExitCode;

use clap::Parser;
use rdma_benches::alloc_count::{CountingAlloc, allocations};
use rdma_benches::bw::{self, Config, PostPath, Test};
use rdma_benches::conn::ConnArgs;
use rdma_benches::duration::DurationArgs;

#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

/// perftest's bandwidth flags (a subset), with its letters and defaults.
#[derive(Parser, Debug)]
#[command(
    about = "Message rate and bandwidth of SEND and WRITE, measured as perftest measures them"
)]
struct Args {
    /// The test.
    test: Test,
    /// Server to connect to (without it, act as the server).
    servername: Option<String>,
    /// Message size in bytes.
    #[arg(short = 's', long = "size", default_value_t = 65536)]
    size: usize,
    /// Requests (default: 1000 for send and read, 5000 for write, as perftest).
    #[arg(short = 'n', long = "iters")]
    iters: Option<u32>,
    /// Most requests outstanding.
    #[arg(short = 't', long = "tx-depth", default_value_t = 128)]
    tx_depth: u32,
    /// Receives posted at first (send).
    #[arg(short = 'r', long = "rx-depth", default_value_t = 512)]
    rx_depth: u32,
    /// Requests per post (one doorbell each).
    #[arg(short = 'l', long = "post_list", default_value_t = 1)]
    post_list: u32,
    /// A completion every this many requests (default 100, or the post list's length).
    #[arg(short = 'Q', long = "cq-mod")]
    cq_mod: Option<u32>,
    /// RDMA reads outstanding at once (perftest's default is the device's maximum: 16 on
    /// mlx5; rxe allows 128). Give both sides the same.
    #[arg(short = 'o', long = "outs", default_value_t = 16)]
    outs: u8,
    /// How the client posts: `unsafe` (rdma-verbs' `unsafe` calls on one region) or `slot`
    /// (the safe path: a slot ring's slots, posted in slot send lists).
    #[arg(long = "path", value_enum, default_value = "unsafe")]
    path: PostPath,
    /// Report bandwidths in Gb/s (10^9 bits per second) instead of MiB/s.
    #[arg(long = "report_gbits")]
    report_gbits: bool,
    /// Duration mode (no BW peak then, as perftest; the send server reports too).
    #[command(flatten)]
    duration: DurationArgs,
    /// Connection flags.
    #[command(flatten)]
    conn: ConnArgs,
    /// Print how many heap allocations the timed loops made (and the program in all) on
    /// stderr.
    #[arg(long = "count-allocs")]
    count_allocs: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let default_iters = match args.test {
        Test::Send => 1000,
        Test::Write => 5000,
        Test::Read => 1000,
    };
    let duration = match args.duration.duration() {
        Ok(duration) => duration,
        Err(message) => {
            eprintln!("bw: {message}");
            return ExitCode::FAILURE;
        }
    };
    let config = Config {
        test: args.test,
        path: args.path,
        duration,
        size: args.size,
        iters: args.iters.unwrap_or(default_iters),
        tx_depth: args.tx_depth,
        rx_depth: args.rx_depth,
        post_list: args.post_list,
        cq_mod: args.cq_mod,
        outstanding_reads: args.outs,
        report_gbits: args.report_gbits,
        seed: args.conn.seed,
        pair: args.conn.pair(args.servername),
    };
    match bw::run(&config) {
        Ok(loop_allocations) => {
            if args.count_allocs {
                eprintln!(
                    "bw: {loop_allocations} allocations in the timed loops, {} in all",
                    allocations()
                );
            }
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("bw: {message}");
            ExitCode::FAILURE
        }
    }
}
