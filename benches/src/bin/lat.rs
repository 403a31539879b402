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
//! Both sides must be given the same test, sizes and iterations. After each size's timed loop
//! the data that crossed the wire is checked byte for byte (see `rdma_benches::lat`); a
//! mismatch fails the program.

use std::process::ExitCode;

use clap::Parser;
use rdma_benches::lat::{self, Config, Test};
use rdma_examples::connect::PairArgs;

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
    /// Largest message sent inline (perftest gives rxe 0).
    #[arg(short = 'I', long = "inline_size", default_value_t = 0)]
    inline: u32,
    /// Listen on / connect to TCP port.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    port: u16,
    /// RDMA device (default: the first one).
    #[arg(short = 'd', long = "ib-dev")]
    ib_dev: Option<String>,
    /// Port of the device.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// GID index (needed on RoCE).
    #[arg(short = 'x', long = "gid-index")]
    gid_index: Option<u32>,
    /// Path MTU (256, 512, 1024, 2048 or 4096).
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    mtu: u32,
    /// Seed of the data checks' pattern (both sides must agree; a different one must fail).
    #[arg(long = "seed", default_value_t = 0)]
    seed: u8,
    /// Give up when the peer or a completion takes longer than this many seconds.
    #[arg(long = "timeout", default_value_t = 30)]
    timeout: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let sizes = if args.all {
        lat::all_sizes(args.test)
    } else {
        let default = if args.test == Test::Atomic { 8 } else { 2 };
        vec![args.size.unwrap_or(default)]
    };
    let config = Config {
        test: args.test,
        sizes,
        iters: args.iters,
        inline: args.inline,
        seed: args.seed,
        pair: PairArgs {
            port: args.port,
            ib_dev: args.ib_dev,
            ib_port: args.ib_port,
            gid_idx: args.gid_index,
            mtu: args.mtu,
            timeout: args.timeout,
            servername: args.servername,
        },
    };
    match lat::run(&config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("lat: {message}");
            ExitCode::FAILURE
        }
    }
}
