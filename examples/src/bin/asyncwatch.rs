//! `asyncwatch`: rdma-core's `ibv_asyncwatch` with rdma-verbs. Opens a device and prints its
//! asynchronous events (port up and down, LID, P_Key and GID changes, ...) as they arrive,
//! until it is killed.
//!
//! Output: `rxe0: async event FD 7`, then a line per event such as
//! `  event_type IBV_EVENT_PORT_ERR (10), port 1`.

#![forbid(unsafe_code)] // the examples show the safe API: no `unsafe` anywhere

use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

use clap::Parser;
use rdma_examples::pingpong::fail;
use rdma_verbs::async_event::AsyncEvent;

const PROGRAM: &str = "asyncwatch";

/// Print the asynchronous events of an RDMA device (rdma-core's ibv_asyncwatch).
#[derive(Parser, Debug)]
#[command(name = PROGRAM)]
struct Options {
    /// Use this IB device (default: the first device found).
    #[arg(short = 'd', long = "ib-dev", value_name = "dev")]
    ib_dev: Option<String>,
}

fn main() {
    let options = Options::parse();
    if let Err(message) = run(&options) {
        fail(PROGRAM, message);
    }
}

fn run(options: &Options) -> Result<(), String> {
    let devices =
        rdma_verbs::devices().map_err(|e| format!("Failed to get IB devices list: {e}"))?;
    let device = match &options.ib_dev {
        Some(name) => devices
            .find(name)
            .ok_or_else(|| format!("IB device {name} not found"))?,
        None => devices.iter().next().ok_or("No IB devices found")?,
    };
    let context = device
        .open()
        .map_err(|e| format!("Couldn't get context for {}: {e}", device.name()))?;
    // stdout is line-buffered, so each line reaches a pipe as soon as it is printed.
    println!(
        "{}: async event FD {}",
        device.name(),
        context.as_fd().as_raw_fd()
    );
    loop {
        let event = context
            .wait_async_event(Duration::MAX)
            .map_err(|e| format!("Failed to get async event: {e}"))?;
        let (name, port) = describe(&event);
        println!("  event_type {name} ({}), port {port}", event.raw_type());
    }
}

/// The event's name and port as `ibv_asyncwatch` prints them.
///
/// The C program names only port and device events and calls every other type "unexpected";
/// for those it prints the event's object pointer as if it were a port number. This context
/// owns no queue pairs, CQs, SRQs or work queues, so such events do not reach it; should one
/// arrive (or a device event, which names no port), port 0 is printed.
fn describe(event: &AsyncEvent) -> (&'static str, u8) {
    match *event {
        AsyncEvent::PortActive { port }
        | AsyncEvent::PortError { port }
        | AsyncEvent::LidChange { port }
        | AsyncEvent::PkeyChange { port }
        | AsyncEvent::SmChange { port }
        | AsyncEvent::ClientReregister { port }
        | AsyncEvent::GidChange { port } => (event.type_name(), port),
        AsyncEvent::DeviceFatal => (event.type_name(), 0),
        _ => ("unexpected", 0),
    }
}
