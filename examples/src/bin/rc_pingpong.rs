//! `rc_pingpong`: rdma-core's `ibv_rc_pingpong` with rdma-verbs. Same options, same TCP
//! exchange, same output: a C peer and a Rust peer work together.
//!
//! Server: `rc_pingpong -g 1`. Client: `rc_pingpong -g 1 <server>`. The flow (device,
//! RC queue pair, receives posted in INIT, address exchange, RTR/RTS, the ping-pong loop) is in
//! [`rdma_examples::pingpong::run_connected`]; the RC-specific attributes are in its
//! `Connected` implementation for `Rc`.

use clap::Parser;
use rdma_examples::pingpong::{self, Options};

fn main() {
    let options = Options::parse();
    if let Err(message) = pingpong::run_connected::<rdma_verbs::Rc>(&options) {
        pingpong::fail("rc_pingpong", message);
    }
}
