//! The `rdma-send` and `rdma-read` transports: RC queue pairs, one from each node's client
//! side to each node's server side (itself included, through the device's loopback).
//!
//! - Control messages go inline when they fit the queue pair's inline limit, the others from
//!   a pool buffer (copied in); replies land in a pool buffer.
//! - `Pages` replies are zero-copy at both ends: the home sends its header from a pool buffer
//!   and the pages straight from its frames (two scatter/gather entries), and the client posts
//!   the receive for it with the header going to a small pool buffer and the pages straight
//!   into its own frames.
//! - `rdma-read` sends no `GetPage`: the client READs the pages out of the home's registered
//!   frames. Diffs, locks and barriers go as messages in both.
//!
//! The nodes also keep the `tcp` transport's mesh of connections open, carrying nothing: a
//! process that dies closes them, so the servers learn of it at once (an RC queue pair learns
//! only when it next sends, after its retries), and keepalive notices a host that vanishes.
//!
//! Every post is rdma-verbs' owned (safe) path: messages go from and land in pool buffers
//! (`Buf`), which move into the queue pair while posted and come back with their completions
//! (`poll_each`); the pages go straight from and into the frames as `RegionRange`s of the
//! frames' registration, a shared region (`MemoryRegion::into_shared`) that Rust reads only
//! with atomic copies and that each request keeps registered until it is done. The frames'
//! registration holds the node's shared state, whose region (the mapping) it names, so the
//! mapping outlives every request that names it.

use std::net::TcpListener;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_verbs::{
    CompletionChannel, CompletionQueue, Context, MemoryRegion, ProtectionDomain, QueuePair,
    ah::AddressVector,
    cq::{WcOpcode, WcStatus},
    device::Gid,
    mr::{AccessFlags, RemoteMemory},
    owned::{Buf, BufferPool, Completion, Owned, RegionRange},
    qp::{CanPostRecv, ConnectedInitAttr, Rc, RcRtrAttr, RcRtsAttr, Rts},
    wr::{RecvRequest, SendRequest},
};

use crate::error::{Error, Result};
use crate::home::{Home, Out};
use crate::launch::Launch;
use crate::region::PAGE;
use crate::rendezvous;
use crate::shared::Shared;
use crate::tcp::{self, Liveness, TcpServer};
use crate::wire::{HEADER_LEN, Header, Msg, Op, Reader, Writer};

/// The largest message through the message buffers (header included).
pub(crate) const MSG_MAX: usize = 64 << 10;
/// The header of a `Pages` reply: message header, count and first page.
const PAGES_HEAD: usize = HEADER_LEN + 6;
/// Receives posted on each server queue pair.
const DEPTH: usize = 4;
/// Inline data asked of each queue pair.
const INLINE: u32 = 256;
/// How long a client polls before it sleeps on the completion channel.
const SPIN: Duration = Duration::from_micros(100);
/// The port used.
const PORT: u8 = 1;
/// How often a wait for a reply checks the peer's liveness link.
const LIVENESS: Duration = Duration::from_secs(1);

/// Tags of the client side's requests.
const ID_SEND: u64 = 1;
const ID_RECV: u64 = 2;
const ID_READ: u64 = 3;
const ID_HEAD: u64 = 4;
/// Tags of [`RdmaLinks::call_all`]'s requests: the kind above bit 32, the peer below.
const ID_BATCH_SEND: u64 = 1 << 32;
const ID_BATCH_RECV: u64 = 2 << 32;
const PEER_MASK: u64 = 0xffff_ffff;

/// The frames' registration, shared with the requests that name ranges of it; holds the
/// shared state so that the mapping it names outlives it.
#[derive(Debug)]
struct Frames {
    mr: Option<Arc<MemoryRegion>>,
    shared: Arc<Shared>,
}

impl Frames {
    fn mr(&self) -> &Arc<MemoryRegion> {
        self.mr.as_ref().expect("present until drop")
    }

    /// Pages `first..first + count` of the frames, for a request.
    fn pages(&self, first: u32, count: u16) -> Result<RegionRange> {
        let start = first as usize * PAGE;
        Ok(RegionRange::new(
            self.mr(),
            start..start + usize::from(count) * PAGE,
        )?)
    }
}

impl Drop for Frames {
    fn drop(&mut self) {
        let Some(mr) = self.mr.take() else { return };
        // The queue pairs went first (declared before the frames), and with them every
        // request's reference; a queue pair whose destruction failed keeps its requests, and
        // their references, for ever: then neither the registration nor the mapping it names
        // may go, and both are leaked.
        let closed = match Arc::try_unwrap(mr) {
            Ok(mr) => mr.close().map_err(|(mr, _)| Arc::new(mr)),
            Err(mr) => Err(mr),
        };
        if let Err(mr) = closed {
            std::mem::forget(mr);
            std::mem::forget(Arc::clone(&self.shared));
        }
    }
}

/// What a node tells the others about its RDMA side.
#[derive(Debug)]
pub(crate) struct Addr {
    lid: u16,
    gid: [u8; 16],
    psn: u32,
    frames: RemoteMemory,
    client_qpn: Vec<u32>,
    server_qpn: Vec<u32>,
}

impl Addr {
    fn encode(&self, w: &mut Writer) {
        w.u16(self.lid)
            .bytes(&self.gid)
            .u32(self.psn)
            .u64(self.frames.addr)
            .u32(self.frames.len)
            .u32(self.frames.rkey)
            .u16(self.client_qpn.len() as u16);
        for (c, s) in self.client_qpn.iter().zip(&self.server_qpn) {
            w.u32(*c).u32(*s);
        }
    }

    fn decode(r: &mut Reader<'_>, size: u16) -> Result<Addr> {
        let lid = r.u16()?;
        let mut gid = [0u8; 16];
        gid.copy_from_slice(r.take(16)?);
        let psn = r.u32()?;
        let frames = RemoteMemory {
            addr: r.u64()?,
            len: r.u32()?,
            rkey: r.u32()?,
        };
        let n = r.u16()?;
        if n != size {
            return Err(Error::protocol(format!("{n} queue pairs for {size} nodes")));
        }
        let (mut client_qpn, mut server_qpn) = (Vec::new(), Vec::new());
        for _ in 0..n {
            client_qpn.push(r.u32()?);
            server_qpn.push(r.u32()?);
        }
        Ok(Addr {
            lid,
            gid,
            psn,
            frames,
            client_qpn,
            server_qpn,
        })
    }
}

/// A node's blob at the rendezvous, for `size` nodes: its TCP mesh address and its RDMA side.
pub(crate) fn parse_blob(blob: &[u8], size: u16) -> Result<(&[u8], Addr)> {
    let mut r = Reader::new(blob);
    let n = usize::from(r.u16()?);
    let tcp = r.take(n)?;
    let addr = Addr::decode(&mut r, size)?;
    r.finish()?;
    Ok((tcp, addr))
}

/// The client side.
#[derive(Debug)]
pub(crate) struct RdmaLinks {
    qps: Vec<QueuePair<Rc, Rts>>,
    cq: CompletionQueue,
    channel: CompletionChannel,
    /// The send buffer and the reply buffer (`MSG_MAX` each), each here while no request has
    /// it.
    send_buf: Option<Buf>,
    reply_buf: Option<Buf>,
    /// The buffer a `Pages` reply's header lands in (`PAGES_HEAD`), the pages going to the
    /// frames.
    head_buf: Option<Buf>,
    /// Per peer, the send and reply buffers of [`RdmaLinks::call_all`] (one request to each
    /// peer at a time), each here while no request has it.
    batch_send: Vec<Option<Buf>>,
    batch_reply: Vec<Option<Buf>>,
    remote: Vec<RemoteMemory>,
    read: bool,
    inline: u32,
    frames: Arc<Frames>,
    /// The liveness links (they carry nothing): a wait for a peer's reply also watches its
    /// link, which keepalive closes when the peer's host vanishes.
    tcp: Liveness,
    /// A wait failed with a request still posted, whose completion could come late and be
    /// taken for a later request's: no further request is made.
    broken: Option<String>,
}

/// The server side.
#[derive(Debug)]
pub(crate) struct RdmaServer {
    qps: Vec<QueuePair<Rc, Rts>>,
    recv_cq: CompletionQueue,
    send_cq: CompletionQueue,
    channel: CompletionChannel,
    /// One send buffer per queue pair, and one more (a send that never completes holds only
    /// its own peer's, as no more is sent to a peer whose send failed). The `DEPTH` receive
    /// buffers per queue pair are in flight, each posted again as its completion hands it
    /// back.
    send_bufs: BufferPool,
    frames: Arc<Frames>,
    tcp: TcpServer,
    me: u16,
}

/// Opens the device, makes both sides' queue pairs, meets the other nodes (trading queue pair
/// numbers, GIDs and the frames' keys along with the TCP mesh's addresses) and connects.
pub(crate) fn connect(
    launch: &Launch,
    shared: &Arc<Shared>,
    read: bool,
) -> Result<(RdmaLinks, RdmaServer)> {
    let config = &shared.config;
    let bound = config.timeout;
    let size = usize::from(launch.size);
    let context = open_device(config.device.as_deref())?;
    let port = context.query_port(PORT)?;
    let gid = context.query_gid(PORT, u32::from(config.gid_index))?.gid;
    let pd: ProtectionDomain = context.alloc_pd()?;
    let frames_len = shared.region.len();
    let alias = NonNull::new(shared.region.frame(0).unwrap_or(std::ptr::null_mut()))
        .ok_or_else(|| Error::protocol("the window has no frames"))?;
    // SAFETY: the frames are the first `len` bytes of the alias mapping, which `Frames` keeps
    // alive (it holds `shared`) until after the registration is dropped; Rust holds no
    // reference into them and reads or writes them only with atomic copies (region.rs, and
    // the region's own copies: it is made shared).
    let mr = unsafe {
        pd.register_raw(
            alias,
            frames_len,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        )?
    };
    let frames = Arc::new(Frames {
        mr: Some(Arc::new(mr.into_shared())),
        shared: Arc::clone(shared),
    });
    let frames_remote = RemoteMemory {
        addr: frames.mr().addr(),
        len: u32::try_from(frames_len)
            .map_err(|_| Error::Config("an RDMA window must be under 4 GiB".into()))?,
        rkey: frames.mr().rkey(),
    };

    let client_channel = context.create_comp_channel()?;
    let client_cq = context
        .cq_builder((size * 8) as u32)
        .channel(&client_channel)
        .build()?;
    let server_channel = context.create_comp_channel()?;
    let recv_cq = context
        .cq_builder((size * DEPTH) as u32)
        .channel(&server_channel)
        .build()?;
    let send_cq = context.create_cq((size * 4) as u32)?;
    let access = AccessFlags::REMOTE_READ;
    let make = |send: &CompletionQueue, recv: &CompletionQueue, depth: usize| {
        pd.qp_builder::<Rc>(send, recv)
            .max_send_wr(4)
            .max_recv_wr(depth as u32)
            .max_send_sge(2)
            .max_recv_sge(2)
            .max_inline_data(INLINE)
            .build()
            .map_err(Error::from)?
            .into_init(&ConnectedInitAttr::new(PORT).access(access))
            .map_err(|e| Error::from(e.into_parts().1))
    };
    let client_bufs = BufferPool::new(&pd, 2, MSG_MAX)?;
    let batch_bufs = BufferPool::new(&pd, 2 * size, MSG_MAX)?;
    let client_head = BufferPool::new(&pd, 1, PAGES_HEAD)?;
    let server_recv = BufferPool::new(&pd, size * DEPTH, MSG_MAX)?;
    let server_send = BufferPool::new(&pd, size + 1, MSG_MAX)?;
    let mut client_init = Vec::with_capacity(size);
    let mut server_init = Vec::with_capacity(size);
    for qp in 0..size {
        client_init.push(make(&client_cq, &client_cq, 2)?);
        let mut server = make(&send_cq, &recv_cq, DEPTH)?;
        // Receives go in before the queue pair can receive: a peer that connects first and
        // sends at once finds them there (no receiver-not-ready retries at start).
        for _ in 0..DEPTH {
            let buf = server_recv
                .take()
                .ok_or_else(|| Error::protocol("no receive buffer left"))?;
            post_slot(&mut server, buf, qp)?;
        }
        server_init.push(server);
    }
    let psn = (std::process::id() ^ 0x5a5a5a) & 0xff_ffff;
    let mine = Addr {
        lid: port.lid,
        gid: gid.0,
        psn,
        frames: frames_remote,
        client_qpn: client_init.iter().map(|q| q.qp_num()).collect(),
        server_qpn: server_init.iter().map(|q| q.qp_num()).collect(),
    };

    let mut listener: Option<TcpListener> = None;
    let blobs = rendezvous::meet(launch, config.digest(), bound, |ip| {
        let (l, tcp_blob) = tcp::listen(ip)?;
        listener = Some(l);
        let mut w = Writer::new();
        w.u16(tcp_blob.len() as u16).bytes(&tcp_blob);
        mine.encode(&mut w);
        Ok(w.done())
    })?;
    let mut tcp_blobs = Vec::with_capacity(size);
    let mut addrs = Vec::with_capacity(size);
    for blob in &blobs {
        let (tcp_blob, addr) = parse_blob(blob, launch.size)?;
        tcp_blobs.push(tcp_blob.to_vec());
        addrs.push(addr);
    }
    let listener = listener.ok_or_else(|| Error::protocol("no listener was made"))?;
    let (tcp_links, tcp_server) = tcp::mesh(launch, listener, &tcp_blobs, bound)?;

    let me = usize::from(launch.rank);
    let mtu = port.active_mtu;
    let connect_qp = |qp: QueuePair<Rc, rdma_verbs::qp::Init>, peer: &Addr, qpn: u32| {
        let mut av = AddressVector::new(PORT).dlid(peer.lid);
        if Gid(peer.gid).interface_id() != 0 {
            av = av.grh(Gid(peer.gid), config.gid_index);
        }
        let mut rtr = RcRtrAttr::new(av, qpn, peer.psn);
        rtr.path_mtu = mtu;
        rtr.max_dest_rd_atomic = 4;
        // A sender finding no receive posted waits 41 ms before each retry (code 24).
        rtr.min_rnr_timer = 24;
        let mut rts = RcRtsAttr::new(psn);
        // 7 retries mean "retry for ever" on some devices; a dead peer must end in an error.
        // Each try waits about a second (4.096 µs × 2^18): an emulated host under load can
        // take longer than the usual 67 ms to answer a READ, and a dead process is noticed
        // through the TCP mesh at once anyway.
        rts.retry_cnt = 6;
        rts.timeout = 18;
        // A peer with no receive posted for a message (which the protocol never does) is an
        // error after 6 receiver-not-ready retries, not a send that retries for ever.
        rts.rnr_retry = 6;
        rts.max_rd_atomic = 4;
        qp.into_rtr(&rtr)
            .map_err(|e| Error::from(e.into_parts().1))?
            .into_rts(&rts)
            .map_err(|e| Error::from(e.into_parts().1))
    };
    let mut client_qps = Vec::with_capacity(size);
    for (qp, peer) in client_init.into_iter().zip(&addrs) {
        let qpn = peer.server_qpn[me];
        client_qps.push(connect_qp(qp, peer, qpn)?);
    }
    let mut server_qps = Vec::with_capacity(size);
    for (qp, peer) in server_init.into_iter().zip(&addrs) {
        let qpn = peer.client_qpn[me];
        server_qps.push(connect_qp(qp, peer, qpn)?);
    }
    let inline = client_qps.first().map_or(0, |q| q.caps().max_inline_data);
    let server = RdmaServer {
        qps: server_qps,
        recv_cq,
        send_cq,
        channel: server_channel,
        send_bufs: server_send,
        frames: Arc::clone(&frames),
        tcp: tcp_server,
        me: launch.rank,
    };
    server.recv_cq.req_notify(false)?;
    let links = RdmaLinks {
        qps: client_qps,
        cq: client_cq,
        channel: client_channel,
        send_buf: client_bufs.take(),
        reply_buf: client_bufs.take(),
        head_buf: client_head.take(),
        batch_send: (0..size).map(|_| batch_bufs.take()).collect(),
        batch_reply: (0..size).map(|_| batch_bufs.take()).collect(),
        remote: addrs.iter().map(|a| a.frames).collect(),
        read,
        inline,
        frames,
        tcp: tcp_links.into_liveness()?,
        broken: None,
    };
    Ok((links, server))
}

fn open_device(name: Option<&str>) -> Result<Context> {
    let devices = rdma_verbs::devices()?;
    let device = match name {
        Some(n) => devices
            .find(n)
            .ok_or_else(|| Error::Config(format!("no RDMA device {n}")))?,
        None => devices
            .iter()
            .next()
            .ok_or_else(|| Error::Config("no RDMA device".into()))?,
    };
    Ok(device.open()?)
}

fn status_error(peer: u16, status: WcStatus) -> Error {
    Error::peer(
        peer,
        format!("a request to it failed: {status} (it died or is unreachable)"),
    )
}

impl RdmaLinks {
    fn check(&self) -> Result<()> {
        match &self.broken {
            Some(why) => Err(Error::Config(format!(
                "the RDMA links are unusable after an earlier failure: {why}"
            ))),
            None => Ok(()),
        }
    }

    /// Waits for the completions `want` (tags) of requests to `peer`; returns the receive's
    /// byte count if one was wanted. On failure the links are marked broken.
    fn wait(&mut self, peer: u16, want: &[u64], bound: Duration) -> Result<u32> {
        self.wait_all(want.iter().map(|&tag| (peer, tag)), bound)
    }

    /// Waits for the completions `want` (peer, tag) of requests to several peers; as
    /// [`RdmaLinks::wait`], which waits on one.
    fn wait_all(
        &mut self,
        want: impl IntoIterator<Item = (u16, u64)>,
        bound: Duration,
    ) -> Result<u32> {
        let result = self.wait_inner(want.into_iter().collect(), bound);
        if let Err(e) = &result {
            self.broken.get_or_insert_with(|| e.to_string());
        }
        result
    }

    fn wait_inner(&mut self, mut missing: Vec<(u16, u64)>, bound: Duration) -> Result<u32> {
        let started = Instant::now();
        let mut received = 0;
        let mut failed = None;
        let mut armed = false;
        while let Some(&(first, _)) = missing.first() {
            let Self {
                cq,
                send_buf,
                reply_buf,
                head_buf,
                batch_send,
                batch_reply,
                ..
            } = self;
            let done = cq.poll_each(4, |mut c: Completion| {
                let Some(tag) = c.tag() else { return };
                // Each buffer goes back to its place, whatever the status.
                let peer = (tag & PEER_MASK) as usize;
                let slot = match tag & !PEER_MASK {
                    0 => match tag {
                        ID_SEND => Some(&mut *send_buf),
                        ID_RECV => Some(&mut *reply_buf),
                        ID_HEAD => Some(&mut *head_buf),
                        _ => None,
                    },
                    ID_BATCH_SEND => batch_send.get_mut(peer),
                    ID_BATCH_RECV => batch_reply.get_mut(peer),
                    _ => None,
                };
                if let (Some(slot), Some(buf)) = (slot, c.take_buf()) {
                    *slot = Some(buf);
                }
                // A completion of a request this wait is not for (a late one) is blamed on
                // the first peer waited for.
                let from = missing
                    .iter()
                    .find(|(_, t)| *t == tag)
                    .map_or(first, |(p, _)| *p);
                if !c.is_success() {
                    failed.get_or_insert((from, c.status()));
                } else if tag == ID_RECV || tag == ID_HEAD {
                    received = c.wc().byte_len();
                }
                missing.retain(|&(_, t)| t != tag);
            })?;
            if let Some((peer, status)) = failed {
                return Err(status_error(peer, status));
            }
            if done == 0 {
                let waited = started.elapsed();
                if waited >= bound {
                    return Err(Error::peer(
                        first,
                        format!("no reply within {:.1} s", bound.as_secs_f64()),
                    ));
                }
                if waited < SPIN {
                    std::hint::spin_loop();
                    continue;
                }
                if !armed {
                    self.cq.req_notify(false)?;
                    armed = true;
                    continue; // poll once more: a completion before the arming raises no event
                }
                // In slices: a reply can be long in coming (a lock held elsewhere, a barrier),
                // and a peer that vanished meanwhile (its host down: nothing more on the wire,
                // so no completion ever says so) is noticed by the TCP link's keepalive.
                // Only a slice that passed with no event checks it: a completion that came is
                // taken first, even if the peer has closed its link since (it has left).
                match self.channel.wait((bound - waited).min(LIVENESS)) {
                    Ok(_) => {}
                    Err(rdma_verbs::Error::Timeout(_)) => {
                        for &(peer, _) in &missing {
                            if let Some(why) = self.tcp.gone(peer) {
                                return Err(Error::peer(peer, why));
                            }
                        }
                    }
                    Err(e) => return Err(e.into()),
                }
                armed = false;
            }
        }
        Ok(received)
    }

    /// Posts a send of `msg` (inline when it fits, else from the send buffer).
    fn post_msg(&mut self, msg: &Msg) -> Result<()> {
        let qp = &mut self.qps[usize::from(msg.to)];
        post_msg(qp, self.inline, msg, ID_SEND, &mut self.send_buf)
    }

    /// Marks the links broken after an error: a request may still be posted, and its late
    /// completion could be taken for a later request's, so no further request is made.
    fn retire<T>(&mut self, result: Result<T>) -> Result<T> {
        if let Err(e) = &result {
            self.broken.get_or_insert_with(|| e.to_string());
        }
        result
    }

    /// Sends a request and returns its reply.
    pub(crate) fn call(&mut self, msg: &Msg, bound: Duration) -> Result<Msg> {
        self.check()?;
        let result = self.call_inner(msg, bound);
        self.retire(result)
    }

    fn call_inner(&mut self, msg: &Msg, bound: Duration) -> Result<Msg> {
        let buf = take(&mut self.reply_buf, "reply")?;
        let qp = &mut self.qps[usize::from(msg.to)];
        post_recv(qp, RecvRequest::new(buf).tag(ID_RECV), &mut self.reply_buf)?;
        self.post_msg(msg)?;
        self.wait(msg.to, &[ID_SEND, ID_RECV], bound)?;
        // The receive's completion set the buffer's length to the bytes received.
        Msg::decode(self.reply_buf.as_deref().unwrap_or_default().to_vec())
    }

    /// Sends every request of `msgs` (each to another peer) before waiting once for all their
    /// replies; returns them in `msgs`' order.
    pub(crate) fn call_all(&mut self, msgs: &[Msg], bound: Duration) -> Result<Vec<Msg>> {
        self.check()?;
        let result = self.call_all_inner(msgs, bound);
        self.retire(result)
    }

    fn call_all_inner(&mut self, msgs: &[Msg], bound: Duration) -> Result<Vec<Msg>> {
        let mut want = Vec::with_capacity(2 * msgs.len());
        for msg in msgs {
            let to = usize::from(msg.to);
            let (Some(qp), Some(send), Some(reply)) = (
                self.qps.get_mut(to),
                self.batch_send.get_mut(to),
                self.batch_reply.get_mut(to),
            ) else {
                return Err(Error::InvalidArgument(format!("no node {to}")));
            };
            let buf = take(reply, "reply")
                .map_err(|_| Error::protocol(format!("two requests to node {to} at once")))?;
            let (send_tag, recv_tag) = (ID_BATCH_SEND | to as u64, ID_BATCH_RECV | to as u64);
            post_recv(qp, RecvRequest::new(buf).tag(recv_tag), reply)?;
            post_msg(qp, self.inline, msg, send_tag, send)?;
            want.push((msg.to, send_tag));
            want.push((msg.to, recv_tag));
        }
        self.wait_all(want, bound)?;
        msgs.iter()
            .map(|msg| {
                // Each receive's completion set its buffer's length to the bytes received.
                let reply = self.batch_reply[usize::from(msg.to)].as_deref();
                Msg::decode(reply.unwrap_or_default().to_vec())
            })
            .collect()
    }

    /// Sends a message that has no reply.
    pub(crate) fn send(&mut self, msg: &Msg, bound: Duration) -> Result<()> {
        self.check()?;
        let result = self
            .post_msg(msg)
            .and_then(|()| self.wait(msg.to, &[ID_SEND], bound).map(drop));
        self.retire(result)
    }

    /// Fills the frames of pages `first..first + count` with their home's copy: an RDMA READ
    /// (`rdma-read`), or the `GetPage` request `msg` with the reply's pages received straight
    /// into the frames (`rdma-send`). Returns the reply (`Pages`, `Fail`), whose payload holds
    /// no page bytes; for a READ, a `Pages` message made here.
    pub(crate) fn fetch(
        &mut self,
        msg: &Msg,
        first: u32,
        count: u16,
        bound: Duration,
    ) -> Result<Msg> {
        self.check()?;
        let result = self.fetch_inner(msg, first, count, bound);
        self.retire(result)
    }

    fn fetch_inner(&mut self, msg: &Msg, first: u32, count: u16, bound: Duration) -> Result<Msg> {
        let home = usize::from(msg.to);
        let bytes = usize::from(count) * PAGE;
        let start = first as usize * PAGE;
        let pages = self.frames.pages(first, count)?;
        if self.read {
            let remote = self.remote[home].slice(start as u32, bytes as u32)?;
            // The window's pages are inaccessible meanwhile (invalid here), and the runtime
            // reads the frames only after the completion.
            let request = SendRequest::read(pages, remote).tag(ID_READ);
            post_send(&mut self.qps[home], request, &mut None)?;
            self.wait(msg.to, &[ID_READ], bound)?;
            let mut w = Writer::new();
            w.u16(count).u32(first);
            let mut reply = Msg::new(Op::Pages, msg.to, msg.from).with(w.done());
            reply.seq = msg.seq;
            return Ok(reply);
        }
        // The reply's header lands in the head buffer, its pages in the frames.
        let head = take(&mut self.head_buf, "header")?;
        let request = RecvRequest::new(head).and_range(pages).tag(ID_HEAD);
        post_recv(&mut self.qps[home], request, &mut self.head_buf)?;
        self.post_msg(msg)?;
        let len = self.wait(msg.to, &[ID_SEND, ID_HEAD], bound)? as usize;
        let mut raw = self.head_buf.as_deref().unwrap_or_default().to_vec();
        if len < PAGES_HEAD {
            return Msg::decode(raw);
        }
        let mut head = [0u8; HEADER_LEN];
        head.copy_from_slice(&raw[..HEADER_LEN]);
        let h = Header::decode(&head)?;
        if h.op == Op::Fail {
            // The rest of the failure's text went to the frames.
            raw.resize(len, 0);
            self.frames.mr().read_at(start, &mut raw[PAGES_HEAD..])?;
            return Msg::decode(raw);
        }
        if h.len as usize != len - HEADER_LEN || len != PAGES_HEAD + bytes {
            return Err(Error::protocol(format!(
                "a {len}-byte Pages reply for {count} pages"
            )));
        }
        // The payload without the pages, which are in the frames already.
        Ok(Msg::from_header(h, raw.split_off(HEADER_LEN)))
    }
}

/// Posts a send of `msg` on `qp` tagged `tag`: inline when it fits `inline` (and [`INLINE`]),
/// else from the buffer in `slot`, which goes back there with the completion.
fn post_msg(
    qp: &mut QueuePair<Rc, Rts>,
    inline: u32,
    msg: &Msg,
    tag: u64,
    slot: &mut Option<Buf>,
) -> Result<()> {
    let header = msg.header().encode();
    let len = HEADER_LEN + msg.payload.len();
    if len > MSG_MAX {
        return Err(Error::protocol(format!(
            "a {len}-byte message (the RDMA transports carry at most {MSG_MAX})"
        )));
    }
    if len as u32 <= inline.min(INLINE) {
        let mut bytes = [0u8; INLINE as usize];
        bytes[..HEADER_LEN].copy_from_slice(&header);
        bytes[HEADER_LEN..len].copy_from_slice(&msg.payload);
        let request = SendRequest::send(&bytes[..len]).tag(tag);
        return post_send(qp, request, &mut None);
    }
    let mut buf = take(slot, "send")?;
    buf.set_len(len)?;
    buf[..HEADER_LEN].copy_from_slice(&header);
    buf[HEADER_LEN..].copy_from_slice(&msg.payload);
    post_send(qp, SendRequest::send(buf).tag(tag), slot)
}

/// The buffer in `slot`, which a request that never completed may still hold.
fn take(slot: &mut Option<Buf>, what: &str) -> Result<Buf> {
    slot.take()
        .ok_or_else(|| Error::protocol(format!("the {what} buffer is still in flight")))
}

/// Posts `request`; a buffer the post refused goes back to `slot`.
fn post_send<K: rdma_verbs::wr::Operation>(
    qp: &mut QueuePair<Rc, Rts>,
    request: SendRequest<'_, K, Owned<'_>>,
    slot: &mut Option<Buf>,
) -> Result<()> {
    qp.post_send_owned(request).map_err(|refused| {
        let (error, buf) = refused.into_parts();
        *slot = buf.or(slot.take());
        error.into()
    })
}

/// Posts `request`; a buffer the post refused goes back to `slot`.
fn post_recv<S: CanPostRecv>(
    qp: &mut QueuePair<Rc, S>,
    request: RecvRequest<'_, Owned<'_>>,
    slot: &mut Option<Buf>,
) -> Result<()> {
    qp.post_recv_owned(request).map_err(|refused| {
        let (error, buf) = refused.into_parts();
        *slot = buf.or(slot.take());
        error.into()
    })
}

/// Posts `buf` as a receive of server queue pair `index` (tagged with it).
fn post_slot<S: CanPostRecv>(qp: &mut QueuePair<Rc, S>, buf: Buf, index: usize) -> Result<()> {
    post_recv(qp, RecvRequest::new(buf).tag(index as u64), &mut None)
}

impl RdmaServer {
    /// Sends a reply and waits for its completion. A failure (an error completion, or none
    /// within the bound) means the peer is dead to this server: the caller sends it nothing
    /// more, so a send that never completes holds one pool buffer at most per peer (the pool
    /// has one more than there are peers). Sends are tagged with their peer's rank, so a late
    /// completion of a dead peer's send is not taken for another's.
    fn send_out(&mut self, out: &Out, bound: Duration) -> Result<()> {
        let to = usize::from(out.msg.to);
        let header = out.header().encode();
        let len = HEADER_LEN + out.msg.payload.len();
        if len > MSG_MAX {
            return Err(Error::protocol(format!("a {len}-byte reply")));
        }
        let mut buf = self
            .send_bufs
            .take()
            .ok_or_else(|| Error::protocol("no send buffer is free"))?;
        buf.set_len(len)?;
        buf[..HEADER_LEN].copy_from_slice(&header);
        buf[HEADER_LEN..].copy_from_slice(&out.msg.payload);
        let mut request = SendRequest::send(buf).tag(to as u64);
        if let Some((first, count)) = out.pages {
            // The pages go straight from the frames. They are home pages, which the
            // application may store into meanwhile, but only with relaxed atomic stores
            // (`GlobalSlice`), which the registration's remote-read exposure already requires:
            // a store racing the send changes which bytes go out (bytes the requester may not
            // read before its next acquire, in a race-free program).
            request = request.and_range(self.frames.pages(first, count)?);
        }
        // A refused post's buffer goes back to the pool with the refusal.
        self.qps[to]
            .post_send_owned(request)
            .map_err(rdma_verbs::Error::from)?;
        let started = Instant::now();
        loop {
            let mut status = None;
            // Other completions are late ones of peers already given up (their buffers go
            // back to the pool as they are dropped).
            self.send_cq.poll_each(4, |c| {
                if c.tag() == Some(to as u64) {
                    status.get_or_insert(c.status());
                }
            })?;
            match status {
                Some(WcStatus::Success) => return Ok(()),
                Some(failed) => return Err(status_error(to as u16, failed)),
                None if started.elapsed() > bound => {
                    return Err(Error::peer(to as u16, "a reply to it never completed"));
                }
                None => std::thread::yield_now(),
            }
        }
    }

    /// Serves requests until every node has left, or `stop` becomes readable.
    pub(crate) fn run(mut self, mut home: Home, stop: &OwnedFd) -> Result<()> {
        let bound = self.frames.shared.config.timeout;
        let mut out: Vec<Out> = Vec::new();
        let mut done: Vec<Completion> = Vec::with_capacity(16);
        let mut dead = vec![false; self.qps.len()];
        while !home.done() {
            self.recv_cq.poll_each(16, |c| done.push(c))?;
            if done.is_empty() {
                self.recv_cq.req_notify(false)?;
                // Poll once more: a completion that came before the arming raises no event.
                self.recv_cq.poll_each(16, |c| done.push(c))?;
            }
            if done.is_empty() {
                let mut fds = vec![
                    libc::pollfd {
                        fd: stop.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    },
                    libc::pollfd {
                        fd: self.channel.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    },
                ];
                let ranks = self.tcp.poll_fds(&mut fds);
                // SAFETY: a valid array of pollfd of the given length.
                let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 1000) };
                if n < 0 {
                    let e = std::io::Error::last_os_error();
                    if e.kind() == std::io::ErrorKind::Interrupted {
                        continue;
                    }
                    return Err(Error::os("poll", e));
                }
                if fds[0].revents != 0 {
                    return Ok(());
                }
                if fds[1].revents != 0 {
                    // Take the event (acknowledged by the channel); the next round polls.
                    let _ = self.channel.wait(Duration::ZERO);
                }
                for (fd, &rank) in fds[2..].iter().zip(&ranks) {
                    if fd.revents != 0 && self.tcp.closed_now(rank) {
                        home.closed(rank as u16, &mut out);
                    }
                }
            }
            for mut c in done.drain(..) {
                // Every receive here is tagged with its queue pair's index.
                let Some(qp) = c.tag().map(|tag| tag as usize) else {
                    continue;
                };
                if !c.is_success() {
                    if dead.get(qp) == Some(&false) {
                        dead[qp] = true;
                        home.closed(qp as u16, &mut out);
                    }
                    continue;
                }
                let Some(buf) = c.take_buf().filter(|_| c.wc().opcode() == WcOpcode::Recv) else {
                    continue;
                };
                // The completion set the buffer's length to the bytes received.
                let msg = Msg::decode(buf.to_vec());
                if post_slot(&mut self.qps[qp], buf, qp).is_err() {
                    // This queue pair cannot receive any more: its node is gone to us.
                    dead[qp] = true;
                    home.closed(qp as u16, &mut out);
                    continue;
                }
                match msg {
                    Ok(msg) if usize::from(msg.from) == qp && msg.to == self.me => {
                        home.handle(msg, &mut out)
                    }
                    _ => {
                        crate::say!(
                            "dsm: node {}: an unreadable message on node {qp}'s queue pair",
                            self.me
                        );
                        home.closed(qp as u16, &mut out);
                    }
                }
            }
            // A failed send closes that node, whose waiters' failures go out in turn.
            while !out.is_empty() {
                let mut more = Vec::new();
                for reply in out.drain(..) {
                    let to = usize::from(reply.msg.to);
                    if dead.get(to) != Some(&false) {
                        continue;
                    }
                    if self.send_out(&reply, bound).is_err() {
                        dead[to] = true;
                        home.closed(to as u16, &mut more);
                    }
                }
                out = more;
            }
        }
        Ok(())
    }
}
