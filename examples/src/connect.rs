//! What the two-process examples that are not pingpongs share (`rdma_rw`, `atomic_counter`):
//! their connection options, one connected RC queue pair, and waiting for the next
//! completion.

use std::time::Duration;

use rdma_verbs::{
    CompletionQueue, QueuePair,
    cq::WorkCompletion,
    mr::AccessFlags,
    qp::{ConnectedInitAttr, Rc, Rts},
};

/// The queue pair [`connect_shaped`] makes: its queue sizes, its inline size, and whether its
/// receives complete on a queue of their own.
#[derive(Debug, Clone, Copy)]
pub struct QpShape {
    /// Send queue size.
    pub max_send_wr: u32,
    /// Receive queue size.
    pub max_recv_wr: u32,
    /// Bytes of inline data per send.
    pub max_inline_data: u32,
    /// Receives complete on [`Pair::recv_cq`] instead of the setup's queue.
    pub separate_recv_cq: bool,
    /// RDMA reads and atomics outstanding at once, each way (`max_rd_atomic` and
    /// `max_dest_rd_atomic`; 1 as the C pingpongs set them).
    pub outstanding_reads: u8,
}

use crate::exchange::{self, Dest, Link};
use crate::pingpong::{self, Connected, Options, Setup};

/// The connection options, with the pingpongs' short names.
#[derive(clap::Args, Debug, Clone)]
pub struct PairArgs {
    /// Listen on / connect to TCP port.
    #[arg(short = 'p', long = "port", default_value_t = 18516)]
    pub port: u16,
    /// Use IB device (default: the first device found).
    #[arg(short = 'd', long = "ib-dev")]
    pub ib_dev: Option<String>,
    /// Use port of IB device.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub ib_port: u8,
    /// Local port GID index (needed on RoCE).
    #[arg(short = 'g', long = "gid-idx")]
    pub gid_idx: Option<u32>,
    /// Path MTU (256, 512, 1024, 2048 or 4096).
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    pub mtu: u32,
    /// Give up when a completion or the peer takes longer than this many seconds.
    #[arg(long = "timeout", default_value_t = 30)]
    pub timeout: u64,
    /// Server to connect to (without it, act as the server).
    pub servername: Option<String>,
}

impl PairArgs {
    /// How long to wait for a completion or for the peer.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout)
    }
}

/// One side's connected queue pair, with what made it and the exchange's connection.
#[derive(Debug)]
pub struct Pair {
    /// Device, protection domain and completion queue.
    pub setup: Setup,
    /// The queue pair, in RTS, connected to the peer's.
    pub qp: QueuePair<Rc, Rts>,
    /// The exchange's TCP connection, open for more records and the end handshake.
    pub link: Link,
    /// The receive completion queue, when the shape asked for one of its own.
    pub recv_cq: Option<CompletionQueue>,
}

/// Opens the device and connects one RC queue pair to the peer's (client with a server name,
/// server without), letting the peer access this side's memory with `access`. Prints the two
/// address lines as the pingpongs do.
pub fn connect(args: &PairArgs, access: AccessFlags, max_send_wr: u32) -> Result<Pair, String> {
    let shape = QpShape {
        max_send_wr,
        max_recv_wr: 1,
        max_inline_data: 0,
        separate_recv_cq: false,
        outstanding_reads: 1,
    };
    connect_shaped(args, access, &shape)
}

/// [`connect`] with a queue pair of the given shape.
pub fn connect_shaped(
    args: &PairArgs,
    access: AccessFlags,
    shape: &QpShape,
) -> Result<Pair, String> {
    // The pingpongs' set-up (device, port, GID, PD, CQ) takes their options.
    let options = Options {
        port: args.port,
        mtu: args.mtu,
        timeout: args.timeout,
        servername: args.servername.clone(),
        ..Options::for_device(args.ib_dev.clone(), args.ib_port, args.gid_idx)
    };
    let mtu = pingpong::mtu(&options)?;
    let cq_size = shape.max_send_wr + shape.max_recv_wr;
    let setup = pingpong::setup(&options, cq_size)?;
    let recv_cq = match shape.separate_recv_cq {
        true => Some(
            setup
                .context
                .create_cq(shape.max_recv_wr)
                .map_err(|e| format!("couldn't create CQ: {e}"))?,
        ),
        false => None,
    };
    let qp = setup
        .pd
        .qp_builder::<Rc>(&setup.cq, recv_cq.as_ref().unwrap_or(&setup.cq))
        .max_send_wr(shape.max_send_wr)
        .max_recv_wr(shape.max_recv_wr)
        .max_inline_data(shape.max_inline_data)
        .build()
        .map_err(|e| format!("couldn't create QP: {e}"))?
        .into_init(&ConnectedInitAttr::new(args.ib_port).access(access))
        .map_err(|e| format!("failed to modify QP to INIT: {e}"))?;
    let mine = Dest {
        lid: setup.port.lid,
        qpn: qp.qp_num(),
        psn: exchange::random_psn(),
        gid: setup.gid,
    };
    pingpong::print_address("local", &mine, false);
    // The client has the server's address and the connection; the server, the client's
    // address and an exchange to answer once its queue pair is connected.
    let (remote, link, pending) = match &args.servername {
        Some(host) => {
            let (remote, link) = exchange::client_exchange(host, args.port, &[mine])?;
            (remote[0], Some(link), None)
        }
        None => {
            let exchange = exchange::server_accept(args.port, 1)?;
            (exchange.remote[0], None, Some(exchange))
        }
    };
    pingpong::print_address("remote", &remote, false);
    let av = pingpong::address_vector(&options, &remote, 1)?;
    let mut rtr = Rc::rtr(av, &remote, mtu);
    rtr.max_dest_rd_atomic = shape.outstanding_reads;
    let mut rts = Rc::rts(mine.psn);
    rts.max_rd_atomic = shape.outstanding_reads;
    let qp = qp
        .into_rtr(&rtr)
        .map_err(|e| format!("failed to modify QP to RTR: {e}"))?
        .into_rts(&rts)
        .map_err(|e| format!("failed to modify QP to RTS: {e}"))?;
    let link = match (link, pending) {
        (Some(link), _) => link,
        (None, Some(exchange)) => exchange.reply(&[mine])?,
        (None, None) => return Err("no connection to the peer".into()),
    };
    Ok(Pair {
        setup,
        qp,
        link,
        recv_cq,
    })
}

/// Polls the next completion from `cq` (the slot path's: the caller hands it to its ring).
/// Fails on an error completion, on a polling error, and after `timeout`.
pub fn next_wc(cq: &mut CompletionQueue, timeout: Duration) -> Result<WorkCompletion, String> {
    let mut wcs = [WorkCompletion::default(); 1];
    match cq
        .poll_for(&mut wcs, 1, timeout)
        .map_err(|e| format!("poll CQ failed: {e}"))?
    {
        [wc] if wc.is_success() => Ok(*wc),
        [wc] => Err(format!("a request failed: {}", wc.status())),
        _ => Err(format!("no completion within {} s", timeout.as_secs())),
    }
}
