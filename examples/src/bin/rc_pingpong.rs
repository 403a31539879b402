//! `rc_pingpong`: rdma-core's `ibv_rc_pingpong` with rdma-verbs. Same options, same TCP
//! exchange, same output: a C peer and a Rust peer work together.
//!
//! Server: `rc_pingpong -g 1`. Client: `rc_pingpong -g 1 <server>`. The flow (device,
//! RC queue pair, receives posted in INIT, address exchange, RTR/RTS, the ping-pong loop, the
//! end handshake) is in [`rdma_examples::pingpong::run_connected`]; the RC-specific attributes
//! are in its `Connected` implementation for `Rc`. `-N` posts the sends through the `ibv_wr_*`
//! API; `-o`, `-O`, `-P`, `-t` and `-j` are described at
//! [`rdma_examples::pingpong::RcOptions`].

#![forbid(unsafe_code)] // the examples show the safe API: no `unsafe` anywhere

use clap::Parser;
use rdma_examples::pingpong::{self, Options, RcOptions};

#[derive(Parser, Debug)]
#[command(args_override_self = true)]
struct Args {
    #[command(flatten)]
    options: Options,
    #[command(flatten)]
    rc: RcOptions,
}

fn main() {
    let args = Args::parse();
    if let Err(message) = pingpong::run_connected::<rdma_verbs::qp::Rc>(&args.options, &args.rc) {
        pingpong::fail("rc_pingpong", message);
    }
}
