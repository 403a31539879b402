//! `rdma_server`: rdma-core's endpoint-API server (`rdma_create_ep`, `rdma_get_request`, the
//! connection manager's own queue pair), interoperable with the C `rdma_client` and ours.
//!
//! It listens, takes one connect request, posts a 16-byte receive, accepts, waits for the
//! client's message, sends it back (the C server sends 16 zero bytes) and waits for the
//! send's completion, then disconnects. With `-v` it prints the message it received.
//!
//! ```text
//! rdma_server [-s server_address] [-p port_number] [-v]
//! ```

#![forbid(unsafe_code)] // the examples show the safe API: no `unsafe` anywhere

use std::time::Duration;

use clap::Parser;
use rdma_cm::rdma_verbs::cq::WcOpcode;
use rdma_cm::{AddrHints, ConnParam, Endpoint, getaddrinfo};
use rdma_examples::endpoint::{complete, finish, hex, send, side};

const PROGRAM: &str = "rdma_server";

/// One message each way through an endpoint.
#[derive(Parser, Debug)]
#[command(name = PROGRAM, args_override_self = true)]
struct Args {
    /// The address to listen on.
    #[arg(short = 's', default_value = "0.0.0.0")]
    server: String,
    /// The port to listen on.
    #[arg(short = 'p', default_value = "7471")]
    port: String,
    /// Print the message received.
    #[arg(short = 'v')]
    verbose: bool,
    /// Bound of the wait for a client and of every wait for a completion, in seconds.
    #[arg(long = "timeout", default_value_t = 60)]
    timeout: u64,
}

fn run(args: &Args) -> Result<(), String> {
    let timeout = Duration::from_secs(args.timeout);
    let hints = AddrHints {
        passive: true,
        ..AddrHints::default()
    };
    let info = getaddrinfo(Some(&args.server), Some(&args.port), &hints)
        .map_err(|e| format!("rdma_getaddrinfo: {e}"))?;
    let info = info.first().ok_or("rdma_getaddrinfo: no address")?;
    let listener = Endpoint::new(info).map_err(|e| format!("rdma_create_ep: {e}"))?;
    listener
        .listen(0)
        .map_err(|e| format!("rdma_listen: {e}"))?;
    let ep = listener
        .get_request(Some(timeout))
        .map_err(|e| format!("rdma_get_request: {e}"))?;
    let (qp, mut side) = side(&ep)?;
    let mut qp = ep
        .accept(qp, &ConnParam::new())
        .map_err(|e| format!("rdma_accept: {e}"))?;
    let got = complete(&mut side, &[WcOpcode::Recv], timeout)?.ok_or("no message")?;
    if args.verbose {
        println!("{PROGRAM}: received {}", hex(&got));
    }
    send(&mut qp, &mut side, &got)?;
    complete(&mut side, &[WcOpcode::Send], timeout)?;
    ep.disconnect()
        .map_err(|e| format!("rdma_disconnect: {e}"))?;
    drop(qp);
    Ok(())
}

fn main() {
    let args = Args::parse();
    println!("{PROGRAM}: start");
    finish(PROGRAM, run(&args));
}
