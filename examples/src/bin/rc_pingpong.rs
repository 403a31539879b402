//! `rc_pingpong`: rdma-core's `ibv_rc_pingpong` with rdma-verbs. Same options, same TCP
//! exchange, same output; a C peer and a Rust peer work together.
//!
//! Server: `rc_pingpong -g 1`. Client: `rc_pingpong -g 1 <server>`.

use clap::Parser;
use rdma_examples::exchange::{self, Dest};
use rdma_examples::pingpong::{self, Options, Pingpong};
use rdma_verbs::{AccessFlags, ConnectedInitAttr, Rc, RcRtrAttr, RcRtsAttr};

const PROGRAM: &str = "rc_pingpong";

fn main() {
    let options = Options::parse();
    if let Err(message) = run(&options) {
        pingpong::fail(PROGRAM, message);
    }
}

fn run(options: &Options) -> Result<(), String> {
    let mtu = pingpong::mtu(options)?;
    let mut setup = pingpong::setup(options, options.rx_depth + 1)?;
    let mut buffer = setup
        .pd
        .register(options.size.max(1), AccessFlags::LOCAL_WRITE)
        .map_err(|e| format!("couldn't register MR: {e}"))?;
    Pingpong::<Rc>::fill_buffer(&mut buffer, options, 0);

    // One send outstanding at a time, rx_depth receives; both on the same CQ.
    let qp = setup
        .pd
        .create_qp::<Rc>(&setup.cq, &setup.cq)
        .max_send_wr(1)
        .max_recv_wr(options.rx_depth)
        .build()
        .map_err(|e| format!("couldn't create QP: {e}"))?;
    let mut qp = qp
        .into_init(&ConnectedInitAttr::new(options.ib_port))
        .map_err(|e| format!("failed to modify QP to INIT: {e}"))?;
    // Receives may be posted from INIT on: have them ready before the peer can send.
    let routs = pingpong::post_receives(&mut qp, &buffer, options.size, options.rx_depth)?;
    if routs < options.rx_depth {
        return Err(format!("couldn't post receive ({routs})"));
    }

    let mine = Dest {
        lid: setup.port.lid,
        qpn: qp.qp_num(),
        psn: exchange::random_psn(),
        gid: setup.gid,
    };
    pingpong::print_address("local", &mine, false);

    // Moves the QP to RTS towards `remote`, with the C program's attributes.
    let connect = |qp: rdma_verbs::QueuePair<Rc, rdma_verbs::Init>, remote: &Dest| {
        let mut rtr = RcRtrAttr::new(
            pingpong::address_vector(options, remote, 1)?,
            remote.qpn,
            remote.psn,
        );
        rtr.path_mtu = mtu;
        qp.into_rtr(&rtr)
            .map_err(|e| format!("failed to modify QP to RTR: {e}"))?
            .into_rts(&RcRtsAttr::new(mine.psn))
            .map_err(|e| format!("failed to modify QP to RTS: {e}"))
    };

    let (qp, remote) = match &options.servername {
        Some(host) => {
            let remote = exchange::client_exchange(host, options.port, &[mine])?[0];
            pingpong::print_address("remote", &remote, false);
            (connect(qp, &remote)?, remote)
        }
        None => {
            let exchange = exchange::server_accept(options.port, 1)?;
            let remote = exchange.remote[0];
            pingpong::print_address("remote", &remote, false);
            // The server's QP is in RTS before it answers, as in the C program.
            let qp = connect(qp, &remote)?;
            exchange.reply(&[mine])?;
            (qp, remote)
        }
    };

    let mut pingpong = Pingpong::new(qp, None, buffer, remote.qpn, options.size, 0);
    let elapsed = pingpong.run(&mut setup, options, routs)?;
    pingpong::print_results(options.size, options.iters, elapsed);
    pingpong.finish(options);
    Ok(())
}
