//! `ud_pingpong`: rdma-core's `ibv_ud_pingpong` with rdma-verbs. Same options, same TCP
//! exchange, same output: a C peer and a Rust peer work together.
//!
//! Server: `ud_pingpong -g 1`. Client: `ud_pingpong -g 1 <server>`.
//!
//! Datagrams differ from the connected pingpongs in three ways: the queue pair is not tied to
//! the peer (each send names its destination through an address handle and the Q_Key), a
//! message fits in one MTU, and every receive starts with 40 bytes of global routing header.

#![forbid(unsafe_code)] // the examples show the safe API: no `unsafe` anywhere

use clap::Parser;
use rdma_examples::exchange::{self, Dest};
use rdma_examples::pingpong::{self, Options, Pingpong, UD_QKEY};
use rdma_verbs::{
    QueuePair,
    ah::GRH_LEN,
    qp::{Init, SqPsnRtsAttr, Ud, UdInitAttr, UdRtrAttr},
};

const PROGRAM: &str = "ud_pingpong";

fn main() {
    let options = Options::parse();
    if let Err(message) = run(&options) {
        pingpong::fail(PROGRAM, message);
    }
}

fn run(options: &Options) -> Result<(), String> {
    let size = options.message_size(1024);
    let mut setup = pingpong::setup(options, options.rx_depth + 1)?;
    let mtu = setup.port.active_mtu.bytes().unwrap_or(0) as usize;
    if size > mtu {
        return Err(format!("Requested size larger than port MTU ({mtu})"));
    }
    let qp = setup
        .pd
        .qp_builder::<Ud>(&setup.cq, &setup.cq)
        .max_send_wr(1)
        .max_recv_wr(options.rx_depth)
        .build()
        .map_err(|e| format!("couldn't create QP: {e}"))?;
    let qp = qp
        .into_init(&UdInitAttr::new(options.ib_port, UD_QKEY))
        .map_err(|e| format!("failed to modify QP to INIT: {e}"))?;
    let mine = Dest {
        lid: setup.port.lid,
        qpn: qp.qp_num(),
        psn: exchange::random_psn(),
        gid: setup.gid,
    };
    pingpong::print_address("local", &mine, true);

    // A UD queue pair needs no peer to reach RTS; the peer's address goes into an address
    // handle that each send names.
    let activate = |qp: QueuePair<Ud, Init>, remote: &Dest| {
        let qp = qp
            .into_rtr(&UdRtrAttr)
            .map_err(|e| format!("failed to modify QP to RTR: {e}"))?
            .into_rts(&SqPsnRtsAttr::new(mine.psn))
            .map_err(|e| format!("failed to modify QP to RTS: {e}"))?;
        let av = pingpong::address_vector(options, remote, 64)?;
        let ah = setup
            .pd
            .create_ah(&av)
            .map_err(|e| format!("failed to create AH: {e}"))?;
        // Receives land in a slot with the 40-byte GRH in front; the echo is what follows it.
        Pingpong::new(options, qp, Some(ah), remote.qpn, size, GRH_LEN)
    };
    let (mut pingpong, exchange) = match &options.servername {
        Some(host) => {
            let (remote, link) = exchange::client_exchange(host, options.port, &[mine])?;
            let remote = remote[0];
            pingpong::print_address("remote", &remote, false);
            (activate(qp, &remote)?, Ok(link))
        }
        None => {
            let exchange = exchange::server_accept(options.port, 1)?;
            let remote = exchange.remote[0];
            pingpong::print_address("remote", &remote, false);
            (activate(qp, &remote)?, Err(exchange))
        }
    };
    // The server answers once its receives are posted.
    let (elapsed, _) = pingpong.run(&mut setup, options, || match exchange {
        Ok(link) => Ok(link),
        Err(exchange) => exchange.reply(&[mine]),
    })?;
    pingpong::print_results(size, options.iters, elapsed);
    pingpong.check()
}
