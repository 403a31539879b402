//! `srq_pingpong`: rdma-core's `ibv_srq_pingpong` with rdma-verbs. Same options, same TCP
//! exchange, same output: a C peer and a Rust peer work together.
//!
//! Server: `srq_pingpong -g 1`. Client: `srq_pingpong -g 1 <server>`.
//!
//! `-q` RC queue pairs run the ping-pong side by side, all taking their receives from one shared
//! receive queue and completing on one CQ; completions are told apart by queue pair number.
//! As in the C program, `-n` counts sends and receives over all queue pairs together.
//!
//! It posts with the owned-buffer path, in safe code: receive buffers come from a
//! [`BufferPool`] and go to the SRQ in doorbell-batched lists ([`OwnedRecvList`]); each
//! completion hands its buffer back through [`CompletionQueue::poll_each`]. A queue pair
//! echoes the buffer it last received (inline when it fits, as the C program's
//! `IBV_SEND_INLINE`), so, as in the C program, each message is the last one received and the
//! client's all-zero message is the only one on the wire. Where the C program shares one buffer
//! between every receive and send, this one never lets two requests touch the same bytes, so
//! `-c` can check every message received, every byte, as it arrives.
//!
//! The end handshake runs before the queue pairs go (see [`rdma_examples::exchange::Link`]).

#![forbid(unsafe_code)] // the examples show the safe API: no `unsafe` anywhere

use std::time::Instant;

use clap::Parser;
use rdma_examples::exchange::PeerEnd;
use rdma_examples::exchange::{self, Dest};
use rdma_examples::pingpong::{self, C_PEER_LINGER, Options, RECV_ID, SEND_ID};
use rdma_verbs::{
    BufferPool, Completion, CompletionChannel, CompletionQueue, ConnectedInitAttr, OwnedRecvList,
    QueuePair, Rc, Rts, SendRequest, SharedReceiveQueue,
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

/// Posts `n` receives to the SRQ in one list (one doorbell), each into a buffer of `pool`;
/// returns how many went.
fn post_receives(
    srq: &mut SharedReceiveQueue,
    pool: &BufferPool,
    list: &mut OwnedRecvList,
    n: u32,
) -> u32 {
    for _ in 0..n {
        let Some(buf) = pool.take() else { break };
        if list.push(buf, RECV_ID).is_err() {
            break;
        }
    }
    let wanted = list.len() as u32;
    // What the SRQ did not take stays in the list; dropping it returns the buffers.
    let posted = match srq.post_recv_list(list) {
        Ok(()) => wanted,
        Err(_) => wanted - list.len() as u32,
    };
    list.clear();
    posted
}

/// Sends `message`, the buffer last received: inline when it fits (the buffer then goes back
/// to its pool as soon as the post returns), else the buffer itself.
fn post_send(
    qp: &mut QueuePair<Rc, Rts>,
    message: rdma_verbs::Buf,
    inline: bool,
) -> Result<(), String> {
    let posted = if inline {
        qp.post_send_owned(SendRequest::send(&message[..]).tag(SEND_ID))
    } else {
        qp.post_send_owned(SendRequest::send(message).tag(SEND_ID))
    };
    posted.map_err(|e| format!("couldn't post send: {e}"))
}

/// Waits for completions and hands them to `out` (emptied first), as
/// [`pingpong::wait_until`] says.
fn wait_each(
    cq: &mut CompletionQueue,
    channel: Option<&CompletionChannel>,
    out: &mut Vec<Completion>,
    idle: std::time::Duration,
) -> Result<(), String> {
    out.clear();
    pingpong::wait_until(cq, channel, idle, |cq| {
        // `out` has room for everything the queue can hold: pushing never reallocates.
        let room = out.capacity() - out.len();
        cq.poll_each(room, |c| out.push(c))
    })?;
    Ok(())
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
    // Every receive in flight, one buffer held per queue pair between its receive and its
    // send, one send in flight per queue pair, and the client's first messages.
    let pool = BufferPool::new(
        &setup.pd,
        (options.rx_depth + 3 * num_qp) as usize,
        size.max(1),
    )
    .map_err(|e| format!("couldn't register MR: {e}"))?;
    let message = pingpong::client_message(size, SRQ_FILL, options.chk);
    let mut srq = setup
        .pd
        .create_srq(options.rx_depth, 1)
        .map_err(|e| format!("couldn't create SRQ: {e}"))?;

    let mut qps = Vec::new();
    let mut inline = true;
    for i in 0..num_qp {
        let qp = setup
            .pd
            .qp_builder::<Rc>(&setup.cq, &setup.cq)
            .srq(&srq)
            .max_send_wr(1)
            .build()
            .map_err(|e| format!("couldn't create QP[{i}]: {e}"))?;
        inline &= qp.caps().max_inline_data as usize >= size;
        qps.push(
            qp.into_init(&ConnectedInitAttr::new(options.ib_port))
                .map_err(|e| format!("failed to modify QP[{i}] to INIT: {e}"))?,
        );
    }
    let mut receives = OwnedRecvList::with_capacity(options.rx_depth as usize);
    let mut routs = post_receives(&mut srq, &pool, &mut receives, options.rx_depth);
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
    // The buffer each queue pair last received, which its next send echoes.
    let mut held: Vec<Option<rdma_verbs::Buf>> = (0..qps.len()).map(|_| None).collect();
    if options.servername.is_some() {
        for (i, qp) in qps.iter_mut().enumerate() {
            let mut first = pool.take().ok_or("out of buffers")?;
            first
                .fill_from(&message)
                .map_err(|e| format!("couldn't fill the buffer: {e}"))?;
            post_send(qp, first, inline)?;
            pending[i] |= SEND_ID;
        }
    }
    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0u32, 0u32);
    let idle = std::time::Duration::from_secs(options.timeout);
    let mut completions = Vec::with_capacity((num_qp + options.rx_depth) as usize);
    while rcnt < options.iters || scnt < options.iters {
        wait_each(
            &mut setup.cq,
            setup.channel.as_ref(),
            &mut completions,
            idle,
        )?;
        for mut c in completions.drain(..) {
            if !c.is_success() {
                return Err(format!(
                    "Failed status {} for wr_id {}",
                    c.status(),
                    c.tag().unwrap_or(c.wc().wr_id())
                ));
            }
            let index = qps
                .iter()
                .position(|qp| qp.qp_num() == c.wc().qp_num())
                .ok_or_else(|| format!("Couldn't find QPN {:06x}", c.wc().qp_num()))?;
            let id = c.tag().ok_or("a completion of no request of ours")?;
            match id {
                SEND_ID => scnt += 1,
                RECV_ID => {
                    let got = c.take_buf().ok_or("a receive without its buffer")?;
                    if options.chk && got[..] != message[..] {
                        pingpong::check_message(&got, SRQ_FILL)?;
                        return Err(format!(
                            "invalid data: received {} bytes, expected {size}",
                            got.len()
                        ));
                    }
                    // The previous one, if still held, goes back to the pool.
                    held[index] = Some(got);
                    routs -= 1;
                    if routs <= num_qp {
                        routs +=
                            post_receives(&mut srq, &pool, &mut receives, options.rx_depth - routs);
                        if routs < options.rx_depth {
                            return Err(format!("couldn't post receive ({routs})"));
                        }
                    }
                    rcnt += 1;
                }
                other => return Err(format!("Completion for unknown wr_id {other}")),
            }
            pending[index] &= !id;
            if scnt < options.iters && pending[index] == 0 {
                let echo = held[index].take().ok_or("nothing received to echo")?;
                post_send(&mut qps[index], echo, inline)?;
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
    // Dropping the queue pairs and then the SRQ releases the buffers still posted.
    drop(qps);
    drop(srq);
    Ok(())
}
