//! `srq_pingpong`: rdma-core's `ibv_srq_pingpong` with rdma-verbs. Same options, same TCP
//! exchange, same output: a C peer and a Rust peer work together.
//!
//! Server: `srq_pingpong -g 1`. Client: `srq_pingpong -g 1 <server>`.
//!
//! `-q` RC queue pairs run the ping-pong side by side, all taking their receives from one shared
//! receive queue and completing on one CQ; completions are told apart by queue pair number.
//! As in the C program, `-n` counts sends and receives over all queue pairs together.
//!
//! It posts from slot rings, in safe code: the receives from an [`SrqSlotRing`] of the SRQ,
//! posted 32 to a doorbell ([`SharedReceiveQueue::fill_slot_ring`]); each queue pair's sends
//! from a [`SlotRing`] of its own with one slot. A queue pair echoes the message it last
//! received, copied from the SRQ's slot into its send slot (inline when it fits, as the C
//! program's `IBV_SEND_INLINE`), so, as in the C program, each message is the last one
//! received and the client's all-zero message is the only one on the wire. Where the C program
//! shares one buffer between every receive and send, this one never lets two requests touch
//! the same bytes, so `-c` can check every message received, every byte, as it arrives.
//!
//! The end handshake runs before the queue pairs go (see [`rdma_examples::exchange::Link`]).

#![forbid(unsafe_code)] // the examples show the safe API: no `unsafe` anywhere

use std::time::Instant;

use clap::Parser;
use rdma_examples::exchange::PeerEnd;
use rdma_examples::exchange::{self, Dest};
use rdma_examples::pingpong::{self, C_PEER_LINGER, Options, RECV_ID, SEND_ID};
use rdma_verbs::{
    QueuePair, SharedReceiveQueue,
    cq::WorkCompletion,
    qp::{ConnectedInitAttr, Rc, Rts},
    slot::{Slot, SlotRing, SrqSlotRing},
    wr::SendRequest,
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

/// One queue pair of the program, with the ring it sends from (one slot: one send in flight).
struct Side {
    qp: QueuePair<Rc, Rts>,
    ring: SlotRing,
    /// What the loop waits for: [`RECV_ID`], [`SEND_ID`] or both.
    pending: u64,
    /// The SRQ slot this queue pair last received, which its next send echoes.
    held: Option<Slot>,
}

impl Side {
    /// The queue pair's send slot, holding `message`.
    fn message(&mut self, message: &[u8]) -> Result<Slot, String> {
        let mut slot = self.ring.take().ok_or("the send slot is still in use")?;
        self.ring
            .fill(&mut slot, message)
            .map_err(|e| format!("couldn't fill the send slot: {e}"))?;
        Ok(slot)
    }

    /// Sends the message in `slot`, inline when it fits.
    fn send(&mut self, slot: Slot, inline: bool) -> Result<(), String> {
        let mut request = SendRequest::send(slot).tag(SEND_ID);
        if inline {
            request = request.inline();
        }
        self.qp
            .post_send_slot(&mut self.ring, request)
            .map_err(|e| format!("couldn't post send: {e}"))?;
        self.pending |= SEND_ID;
        Ok(())
    }
}

/// Posts a receive into every free slot of the SRQ's ring; returns how many are posted.
fn post_receives(srq: &mut SharedReceiveQueue, ring: &mut SrqSlotRing) -> Result<u32, String> {
    srq.fill_slot_ring(ring)
        .map_err(|e| format!("couldn't post receive: {e}"))?;
    Ok(ring.posted())
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
    let message = pingpong::client_message(size, SRQ_FILL, options.chk);
    let mut srq = setup
        .pd
        .create_srq(options.rx_depth, 1)
        .map_err(|e| format!("couldn't create SRQ: {e}"))?;
    // Every receive posted, and one slot held per queue pair between its receive and its send.
    let mut receives = srq
        .slot_ring(options.rx_depth + num_qp, size.max(1))
        .map_err(|e| format!("couldn't register MR: {e}"))?;

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
    let routs = post_receives(&mut srq, &mut receives)?;
    if routs < options.rx_depth {
        return Err(format!("couldn't post receive ({routs})"));
    }

    // Unused records are all zeroes, as the C program sends them.
    let mut mine = vec![
        Dest {
            lid: 0,
            qpn: 0,
            psn: 0,
            gid: rdma_verbs::device::Gid::default()
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
    let connect = |qps: Vec<QueuePair<Rc, rdma_verbs::qp::Init>>, remote: &[Dest]| {
        let mut connected = Vec::with_capacity(qps.len());
        for (i, qp) in qps.into_iter().enumerate() {
            let mut dest = remote[i];
            dest.gid = remote[0].gid;
            let av = pingpong::address_vector(options, &dest, 1)?;
            let mut rtr = rdma_verbs::qp::RcRtrAttr::new(av, dest.qpn, dest.psn);
            rtr.path_mtu = mtu;
            let qp = qp
                .into_rtr(&rtr)
                .map_err(|e| format!("failed to modify QP[{i}] to RTR: {e}"))?
                .into_rts(&rdma_verbs::qp::RcRtsAttr::new(mine[i].psn))
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
    let (qps, link) = match &options.servername {
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
    let mut sides = Vec::with_capacity(qps.len());
    for qp in qps {
        let ring = qp
            .slot_ring(1, size.max(1))
            .map_err(|e| format!("couldn't register MR: {e}"))?;
        sides.push(Side {
            qp,
            ring,
            pending: RECV_ID,
            held: None,
        });
    }

    if options.servername.is_some() {
        for side in &mut sides {
            let slot = side.message(&message)?;
            side.send(slot, inline)?;
        }
    }
    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0u32, 0u32);
    let idle = std::time::Duration::from_secs(options.timeout);
    let mut completions = vec![WorkCompletion::default(); (num_qp + options.rx_depth) as usize];
    while rcnt < options.iters || scnt < options.iters {
        let n = pingpong::wait_until(&mut setup.cq, setup.channel.as_ref(), idle, |cq| {
            cq.poll(&mut completions).map(|found| found.len())
        })?;
        for wc in &completions[..n] {
            let index = sides
                .iter()
                .position(|side| side.qp.qp_num() == wc.qp_num())
                .ok_or_else(|| format!("Couldn't find QPN {:06x}", wc.qp_num()))?;
            let side = &mut sides[index];
            // A receive's slot comes back from the SRQ's ring, a send's from the queue pair's.
            let received = receives.complete(wc);
            let sent = match received {
                Some(_) => None,
                None => side.ring.complete(wc),
            };
            if !wc.is_success() {
                // The C program's ids.
                let wr_id = match (&received, &sent) {
                    (Some(_), _) => RECV_ID,
                    (_, Some(_)) => SEND_ID,
                    _ => wc.wr_id(),
                };
                return Err(format!("Failed status {} for wr_id {wr_id}", wc.status()));
            }
            if let Some(slot) = received {
                let got = receives.bytes(&slot).map_err(|e| e.to_string())?;
                if options.chk && got != &message[..] {
                    pingpong::check_message(got, SRQ_FILL)?;
                    return Err(format!(
                        "invalid data: received {} bytes, expected {size}",
                        got.len()
                    ));
                }
                // The previous one, if still held, goes back to the ring.
                if let Some(earlier) = side.held.replace(slot) {
                    receives.put(earlier).map_err(|e| e.to_string())?;
                }
                side.pending &= !RECV_ID;
                rcnt += 1;
            } else if let Some(slot) = sent {
                side.ring.put(slot).map_err(|e| e.to_string())?;
                side.pending &= !SEND_ID;
                scnt += 1;
            } else {
                return Err(format!("Completion for unknown wr_id {}", wc.wr_id()));
            }
            if scnt < options.iters && side.pending == 0 {
                let echo = side.held.take().ok_or("nothing received to echo")?;
                let slot = side.message(receives.bytes(&echo).map_err(|e| e.to_string())?)?;
                // The SRQ's slot, copied out, is free again: posted with the others that are,
                // before the echo goes.
                receives.put(echo).map_err(|e| e.to_string())?;
                let routs = post_receives(&mut srq, &mut receives)?;
                if routs < options.rx_depth {
                    return Err(format!("couldn't post receive ({routs})"));
                }
                side.send(slot, inline)?;
                side.pending |= RECV_ID;
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
    // The queue pairs, then the SRQ (which keeps its ring's slots registered while receives
    // are posted) go.
    drop(sides);
    drop(srq);
    Ok(())
}
