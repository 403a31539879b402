//! `lat`: round-trip latency of SEND, RDMA WRITE, RDMA READ and FETCH_AND_ADD between two
//! processes, measured and reported as perftest's `ib_send_lat`, `ib_write_lat`,
//! `ib_read_lat` and `ib_atomic_lat` measure and report it, on rdma-verbs' `unsafe` post
//! calls. Start the server without a host, then the client with the server's host:
//!
//! ```text
//! lat write -d rxe0 -x 1 -s 64            # server
//! lat write -d rxe0 -x 1 -s 64 10.0.2.15  # client
//! ```
//!
//! Both sides must be given the same test, sizes and iterations (or duration, `-D`). After each
//! size's timed loop the data that crossed the wire is checked byte for byte (see
//! `rdma_benches::lat`); a mismatch fails the program.

use std::process::ExitCode;

use clap::Parser;
use rdma_benches::alloc_count::{CountingAlloc, allocations};
use rdma_benches::conn::ConnArgs;
use rdma_benches::duration::DurationArgs;

#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;
use rdma_benches::lat::{self, Config, Test};

/// perftest's latency flags (a subset), with its letters.
#[derive(Parser, Debug)]
#[command(about = "Latency of SEND, WRITE, READ and atomics, measured as perftest measures it")]
struct Args {
    /// The test.
    test: Test,
    /// Server to connect to (without it, act as the server).
    servername: Option<String>,
    /// Message size in bytes (perftest's default: 2; 8 for atomics).
    #[arg(short = 's', long = "size")]
    size: Option<usize>,
    /// Run sizes 2, 4, ..., 2^23 (8 only for atomics).
    #[arg(short = 'a', long = "all")]
    all: bool,
    /// Iterations per size (at least 5).
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    iters: u32,
    /// Duration mode (the report then gives the mean and the round trips per second).
    #[command(flatten)]
    duration: DurationArgs,
    /// Largest message sent inline (perftest gives rxe 0).
    #[arg(short = 'I', long = "inline_size", default_value_t = 0)]
    inline: u32,
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
    let sizes = if args.all {
        lat::all_sizes(args.test)
    } else {
        let default = if args.test == Test::Atomic { 8 } else { 2 };
        vec![args.size.unwrap_or(default)]
    };
    let duration = match args.duration.duration() {
        Ok(duration) => duration,
        Err(message) => {
            eprintln!("lat: {message}");
            return ExitCode::FAILURE;
        }
    };
    let config = Config {
        test: args.test,
        sizes,
        iters: args.iters,
        duration,
        inline: args.inline,
        seed: args.conn.seed,
        pair: args.conn.pair(args.servername),
    };
    match lat::run(&config) {
        Ok(loop_allocations) => {
            if args.count_allocs {
                eprintln!(
                    "lat: {loop_allocations} allocations in the timed loops, {} in all",
                    allocations()
                );
            }
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("lat: {message}");
            ExitCode::FAILURE
        }
    }
}
