//! `rdma_client`: rdma-core's endpoint-API client (`rdma_create_ep`, the connection
//! manager's own queue pair), interoperable with the C `rdma_server` and ours.
//!
//! It resolves the server, posts a 16-byte receive, connects, sends 16 bytes and waits for
//! the send's and the receive's completions, then disconnects. With `-v` it prints the
//! message it received (ours echoes the client's message; the C server sends zeros).
//!
//! ```text
//! rdma_client [-s server_address] [-p port_number] [-v]
//! ```

#![forbid(unsafe_code)] // the examples show the safe API: no `unsafe` anywhere

use std::time::Duration;

use clap::Parser;
use rdma_cm::rdma_verbs::cq::WcOpcode;
use rdma_cm::{AddrHints, ConnParam, Endpoint, getaddrinfo};
use rdma_examples::endpoint::{MESSAGE, complete, finish, hex, send, side};

const PROGRAM: &str = "rdma_client";

/// One message each way through an endpoint.
#[derive(Parser, Debug)]
#[command(name = PROGRAM, args_override_self = true)]
struct Args {
    /// The server's address.
    #[arg(short = 's', default_value = "127.0.0.1")]
    server: String,
    /// The server's port.
    #[arg(short = 'p', default_value = "7471")]
    port: String,
    /// Print the message received.
    #[arg(short = 'v')]
    verbose: bool,
    /// Bound of every wait for a completion, in seconds.
    #[arg(long = "timeout", default_value_t = 30)]
    timeout: u64,
}

/// The client's message: bytes 0x10 to 0x1f.
fn message() -> [u8; MESSAGE] {
    std::array::from_fn(|i| 0x10 + i as u8)
}

fn run(args: &Args) -> Result<(), String> {
    let timeout = Duration::from_secs(args.timeout);
    let hints = AddrHints::default();
    let info = getaddrinfo(Some(&args.server), Some(&args.port), &hints)
        .map_err(|e| format!("rdma_getaddrinfo: {e}"))?;
    let info = info.first().ok_or("rdma_getaddrinfo: no address")?;
    let ep = Endpoint::new(info).map_err(|e| format!("rdma_create_ep: {e}"))?;
    let (qp, mut side) = side(&ep)?;
    let (mut qp, _) = ep
        .connect(qp, &ConnParam::new())
        .map_err(|e| format!("rdma_connect: {e}"))?;
    send(&mut qp, &mut side, &message())?;
    let got =
        complete(&mut side, &[WcOpcode::Send, WcOpcode::Recv], timeout)?.ok_or("no message")?;
    if args.verbose {
        println!("{PROGRAM}: received {}", hex(&got));
    }
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
