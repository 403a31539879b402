//! `uc_pingpong`: rdma-core's `ibv_uc_pingpong` with rdma-verbs. Same options, same TCP
//! exchange, same output: a C peer and a Rust peer work together.
//!
//! Server: `uc_pingpong -g 1`. Client: `uc_pingpong -g 1 <server>`. The flow (device,
//! UC queue pair, receives posted in INIT, address exchange, RTR/RTS, the ping-pong loop, the
//! end handshake) is in
//! [`rdma_examples::pingpong::run_connected`]; the UC-specific attributes are in its
//! `Connected` implementation for `Uc`.

#![forbid(unsafe_code)] // the examples show the safe API: no `unsafe` anywhere

use clap::Parser;
use rdma_examples::pingpong::{self, Options, RcOptions};

fn main() {
    let options = Options::parse();
    if let Err(message) =
        pingpong::run_connected::<rdma_verbs::qp::Uc>(&options, &RcOptions::default())
    {
        pingpong::fail("uc_pingpong", message);
    }
}
