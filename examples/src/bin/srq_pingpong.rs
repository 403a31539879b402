//! `srq_pingpong`: rdma-core's `ibv_srq_pingpong` with rdma-verbs. Same options, same TCP
//! exchange, same output: a C peer and a Rust peer work together.
//!
//! Server: `srq_pingpong -g 1`. Client: `srq_pingpong -g 1 <server>`.
//!
//! `-q` RC queue pairs run the ping-pong side by side, all taking their receives from one shared
//! receive queue and completing on one CQ; completions are told apart by queue pair number.
//! As in the C program, `-n` counts sends and receives over all queue pairs together.
//!
//! Unlike the other pingpongs, this one posts with the `unsafe` calls: the safe
//! [`rdma_verbs::PostScope`] covers one queue pair and its own receive queue, not an SRQ
//! shared by many.
//!
//! As in the C program, one buffer takes every receive and gives every send, so each message
//! echoes the last one received, on whichever queue pair. The client's message is all zeroes
//! (the C program's buffer is zeroed, and `-c` sets the page-start bytes to 0). The server's
//! buffer starts as 0x7b instead: it never goes on the wire (the server sends only after a
//! receive has overwritten it), and `-c` on the server then also proves that messages landed.
//! `-c` checks every byte of the last message, on either side, once every queue pair and the
//! SRQ are gone; the end handshake runs before they go (see [`rdma_examples::exchange::Link`]).

use std::time::Instant;

use clap::Parser;
use rdma_examples::exchange::PeerEnd;
use rdma_examples::exchange::{self, Dest};
use rdma_examples::pingpong::{self, C_PEER_LINGER, FILL, Options, RECV_ID, SEND_ID};
use rdma_verbs::{
    AccessFlags, ConnectedInitAttr, MemoryRegion, QueuePair, Rc, RecvRequest, Rts, SendFlags,
    SendRequest, SharedReceiveQueue, WorkCompletion,
};

const PROGRAM: &str = "srq_pingpong";
/// The C program always exchanges this many records, used or not.
const MAX_QP: usize = 256;
/// The C program's buffer is zeroed: the client's message, and the one `-c` expects.
const SRQ_FILL: u8 = 0;

#[derive(Parser, Debug)]
#[command(args_override_self = true)]
struct Args {
    #[command(flatten)]
    options: Options,
    /// Number of QPs to use.
    #[arg(short = 'q', long = "num-qp", default_value_t = 16)]
    num_qp: u32,
}

fn main() {
    let args = Args::parse();
    if let Err(message) = run(&args.options, args.num_qp) {
        pingpong::fail(PROGRAM, message);
    }
}

/// Posts `n` receives of the first `size` bytes of `buffer` to the SRQ; returns how many went.
fn post_receives(srq: &mut SharedReceiveQueue, buffer: &MemoryRegion, size: usize, n: u32) -> u32 {
    let Ok(slice) = buffer.slice(..size) else {
        return 0;
    };
    for i in 0..n {
        // SAFETY: the buffer stays registered until the queue pairs and the SRQ are gone (they
        // are dropped first, see the end of `run`), and Rust does not touch it meanwhile.
        if unsafe { srq.post_recv_one(&RecvRequest::new(RECV_ID, slice)) }.is_err() {
            return i;
        }
    }
    n
}

fn post_send(
    qp: &mut QueuePair<Rc, Rts>,
    buffer: &MemoryRegion,
    size: usize,
    flags: SendFlags,
) -> Result<(), String> {
    let slice = buffer.slice(..size).map_err(|e| e.to_string())?;
    // SAFETY: as in `post_receives`.
    unsafe { qp.post_send_one(&SendRequest::send(SEND_ID, slice).flags(flags)) }
        .map_err(|e| format!("couldn't post send: {e}"))
}

fn run(options: &Options, num_qp: u32) -> Result<(), String> {
    if num_qp > options.rx_depth {
        return Err(format!(
            "rx_depth {} is too small for {num_qp} QPs -- must have at least one receive per QP.",
            options.rx_depth
        ));
    }
    if num_qp == 0 || num_qp as usize >= MAX_QP {
        return Err(format!("the number of QPs must be 1 to {}", MAX_QP - 1));
    }
    let mtu = pingpong::mtu(options)?;
    let size = options.message_size(4096);
    let mut setup = pingpong::setup(options, options.rx_depth + num_qp)?;
    let mut buffer = setup
        .pd
        .register(size.max(1), AccessFlags::LOCAL_WRITE)
        .map_err(|e| format!("couldn't register MR: {e}"))?;
    let initial = if options.servername.is_some() {
        pingpong::client_message(size, SRQ_FILL, options.chk)
    } else {
        vec![FILL; size]
    };
    buffer
        .write_at(0, &initial)
        .map_err(|e| format!("couldn't fill the buffer: {e}"))?;
    let mut srq = setup
        .pd
        .create_srq(options.rx_depth, 1)
        .map_err(|e| format!("couldn't create SRQ: {e}"))?;

    let mut qps = Vec::new();
    let mut flags = SendFlags::SIGNALED;
    for i in 0..num_qp {
        let qp = setup
            .pd
            .create_qp::<Rc>(&setup.cq, &setup.cq)
            .srq(&srq)
            .max_send_wr(1)
            .build()
            .map_err(|e| format!("couldn't create QP[{i}]: {e}"))?;
        if qp.caps().max_inline_data as usize >= size {
            flags |= SendFlags::INLINE;
        }
        qps.push(
            qp.into_init(&ConnectedInitAttr::new(options.ib_port))
                .map_err(|e| format!("failed to modify QP[{i}] to INIT: {e}"))?,
        );
    }
    let mut routs = post_receives(&mut srq, &buffer, size, options.rx_depth);
    if routs < options.rx_depth {
        return Err(format!("couldn't post receive ({routs})"));
    }

    // Unused records are all zeroes, as the C program sends them.
    let mut mine = vec![
        Dest {
            lid: 0,
            qpn: 0,
            psn: 0,
            gid: rdma_verbs::Gid::default()
        };
        MAX_QP
    ];
    for (dest, qp) in mine.iter_mut().zip(&qps) {
        *dest = Dest {
            lid: setup.port.lid,
            qpn: qp.qp_num(),
            psn: exchange::random_psn(),
            gid: setup.gid,
        };
        pingpong::print_address("local", dest, false);
    }

    // Brings every queue pair to RTS towards its peer (all peers share the first one's GID).
    let connect = |qps: Vec<QueuePair<Rc, rdma_verbs::Init>>, remote: &[Dest]| {
        let mut connected = Vec::with_capacity(qps.len());
        for (i, qp) in qps.into_iter().enumerate() {
            let mut dest = remote[i];
            dest.gid = remote[0].gid;
            let av = pingpong::address_vector(options, &dest, 1)?;
            let mut rtr = rdma_verbs::RcRtrAttr::new(av, dest.qpn, dest.psn);
            rtr.path_mtu = mtu;
            let qp = qp
                .into_rtr(&rtr)
                .map_err(|e| format!("failed to modify QP[{i}] to RTR: {e}"))?
                .into_rts(&rdma_verbs::RcRtsAttr::new(mine[i].psn))
                .map_err(|e| format!("failed to modify QP[{i}] to RTS: {e}"))?;
            connected.push(qp);
        }
        Ok::<_, String>(connected)
    };
    let print_remote = |remote: &[Dest]| {
        for dest in &remote[..num_qp as usize] {
            pingpong::print_address("remote", dest, false);
        }
    };
    let (mut qps, link) = match &options.servername {
        Some(host) => {
            let (remote, link) = exchange::client_exchange(host, options.port, &mine)?;
            print_remote(&remote);
            (connect(qps, &remote)?, link)
        }
        None => {
            let exchange = exchange::server_accept(options.port, MAX_QP)?;
            // The server connects before it answers, as the C program does.
            let qps = connect(qps, &exchange.remote)?;
            let remote = exchange.remote.clone();
            let link = exchange.reply(&mine)?;
            print_remote(&remote);
            (qps, link)
        }
    };

    let mut pending = vec![RECV_ID; qps.len()];
    if options.servername.is_some() {
        for (i, qp) in qps.iter_mut().enumerate() {
            post_send(qp, &buffer, size, flags)?;
            pending[i] |= SEND_ID;
        }
    }
    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0u32, 0u32);
    let idle = std::time::Duration::from_secs(options.timeout);
    let mut completions = vec![WorkCompletion::default(); (num_qp + options.rx_depth) as usize];
    while rcnt < options.iters || scnt < options.iters {
        for wc in pingpong::wait(
            &mut setup.cq,
            setup.channel.as_ref(),
            &mut completions,
            idle,
        )? {
            if !wc.is_success() {
                return Err(format!(
                    "Failed status {} for wr_id {}",
                    wc.status(),
                    wc.wr_id()
                ));
            }
            let index = qps
                .iter()
                .position(|qp| qp.qp_num() == wc.qp_num())
                .ok_or_else(|| format!("Couldn't find QPN {:06x}", wc.qp_num()))?;
            match wc.wr_id() {
                SEND_ID => scnt += 1,
                RECV_ID => {
                    routs -= 1;
                    if routs <= num_qp {
                        routs += post_receives(&mut srq, &buffer, size, options.rx_depth - routs);
                        if routs < options.rx_depth {
                            return Err(format!("couldn't post receive ({routs})"));
                        }
                    }
                    rcnt += 1;
                }
                other => return Err(format!("Completion for unknown wr_id {other}")),
            }
            pending[index] &= !wc.wr_id();
            if scnt < options.iters && pending[index] == 0 {
                post_send(&mut qps[index], &buffer, size, flags)?;
                pending[index] = RECV_ID | SEND_ID;
            }
        }
    }
    let elapsed = start.elapsed();
    // The end handshake, before the queue pairs are destroyed (which would drop the ACK of a
    // message the peer still waits for).
    if link.finish(idle)? == PeerEnd::Closed {
        std::thread::sleep(C_PEER_LINGER);
    }
    pingpong::print_results(size, options.iters, elapsed);
    // The queue pairs and the SRQ go before the buffer they use, and before Rust reads it.
    drop(qps);
    drop(srq);
    if options.chk {
        let bytes = buffer.as_slice().map_err(|e| e.to_string())?;
        pingpong::check_message(&bytes[..size], SRQ_FILL)?;
    }
    drop(buffer);
    Ok(())
}
