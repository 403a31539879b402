//! `devices`: rdma-core's `ibv_devices` with rdma-verbs. Lists each RDMA device with its node
//! GUID, in the same columns.

#![forbid(unsafe_code)] // the examples show the safe API: no `unsafe` anywhere

use std::fmt::Write as _;
use std::io::Write as _;

use clap::Parser;
use rdma_examples::pingpong::fail;

const PROGRAM: &str = "devices";

/// List the RDMA devices and their node GUIDs (rdma-core's ibv_devices).
#[derive(Parser, Debug)]
#[command(name = PROGRAM)]
struct Options {}

fn main() {
    let _options = Options::parse();
    let devices = rdma_verbs::devices()
        .unwrap_or_else(|e| fail(PROGRAM, format!("Failed to get IB devices list: {e}")));
    let mut out = String::new();
    let _ = writeln!(out, "    {:<16}\t   node GUID", "device");
    let _ = writeln!(out, "    {:<16}\t----------------", "------");
    for device in &devices {
        let _ = writeln!(out, "    {:<16}\t{:016x}", device.name(), device.guid());
    }
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
    {
        drop(stdout);
        fail(PROGRAM, format!("cannot write to stdout: {e}"));
    }
}
