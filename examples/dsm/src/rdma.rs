//! The `rdma-send` and `rdma-read` transports: RC queue pairs, one from each node's client
//! side to each node's server side (itself included, through the device's loopback).
//!
//! - Control messages go inline when they fit the queue pair's inline limit, the others from
//!   a registered bounce buffer (copied in); replies land in a registered receive buffer.
//! - `Pages` replies are zero-copy at both ends: the home sends its header from the bounce
//!   buffer and the pages straight from its frames (two scatter/gather entries), and the
//!   client posts the receive for it with the header going to a small buffer and the pages
//!   straight into its own frames.
//! - `rdma-read` sends no `GetPage`: the client READs the pages out of the home's registered
//!   frames. Diffs, locks and barriers go as messages in both.
//!
//! The nodes also keep the `tcp` transport's mesh of connections open, carrying nothing: a
//! process that dies closes them, so the servers learn of it at once (an RC queue pair learns
//! only when it next sends, after its retries), and keepalive notices a host that vanishes.
//!
//! Memory the device writes (receive buffers, frames) is read only with atomic copies
//! (`rdma_verbs::shared`), and every region outlives the queue pairs that name it: each
//! struct declares its queue pairs before the regions (fields drop in order), and the frames'
//! registration holds the node's shared state, whose region (the mapping) it names.

use std::net::TcpListener;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_verbs::shared::copy_from_shared;
use rdma_verbs::{
    AccessFlags, AddressVector, CanPostRecv, CompletionChannel, CompletionQueue, ConnectedInitAttr,
    Context, Gid, MemoryRegion, Payload, ProtectionDomain, QueuePair, Rc, RcRtrAttr, RcRtsAttr,
    RecvRequest, RemoteMemory, Rts, SendRequest, Sge, WcOpcode, WorkCompletion,
};

use crate::error::{Error, Result};
use crate::home::{Home, Out};
use crate::launch::Launch;
use crate::region::PAGE;
use crate::rendezvous;
use crate::shared::Shared;
use crate::tcp::{self, TcpLinks, TcpServer};
use crate::wire::{HEADER_LEN, Header, Msg, Op, Reader, Writer};

/// The largest message through the bounce buffers (header included).
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

/// wr_id values of the client side.
const ID_SEND: u64 = 1;
const ID_RECV: u64 = 2;
const ID_READ: u64 = 3;

/// The frames' registration; holds the shared state so that the mapping it names outlives it.
#[derive(Debug)]
struct Frames {
    mr: Option<MemoryRegion>,
    shared: Arc<Shared>,
}

impl Frames {
    fn mr(&self) -> &MemoryRegion {
        self.mr.as_ref().expect("present until drop")
    }
}

impl Drop for Frames {
    fn drop(&mut self) {
        if let Some(mr) = self.mr.take() {
            if let Err((mr, _)) = mr.close() {
                // Still registered: the device may still use the memory, so neither the
                // registration nor the mapping it names may go. Both are leaked.
                std::mem::forget(mr);
                std::mem::forget(Arc::clone(&self.shared));
            }
        }
    }
}

/// What a node tells the others about its RDMA side.
#[derive(Debug)]
struct Addr {
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

/// The client side.
#[derive(Debug)]
pub(crate) struct RdmaLinks {
    qps: Vec<QueuePair<Rc, Rts>>,
    cq: CompletionQueue,
    channel: CompletionChannel,
    /// `[send: MSG_MAX | receive: MSG_MAX | pages header: PAGES_HEAD]`.
    bufs: MemoryRegion,
    remote: Vec<RemoteMemory>,
    read: bool,
    inline: u32,
    frames: Arc<Frames>,
    _tcp: TcpLinks,
    /// A wait failed with a request still posted: the buffers may still be written, so no
    /// further request is made.
    broken: Option<String>,
}

/// The server side.
#[derive(Debug)]
pub(crate) struct RdmaServer {
    qps: Vec<QueuePair<Rc, Rts>>,
    recv_cq: CompletionQueue,
    send_cq: CompletionQueue,
    channel: CompletionChannel,
    /// `DEPTH` receive slots of `MSG_MAX` per queue pair, then one send buffer per queue pair
    /// (a send that never completes holds only its own peer's).
    bufs: MemoryRegion,
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
    // reference into them and reads or writes them only with atomic copies (region.rs).
    let mr = unsafe {
        pd.register_raw(
            alias,
            frames_len,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        )?
    };
    let frames = Arc::new(Frames {
        mr: Some(mr),
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
    let client_bufs = pd.register(2 * MSG_MAX + PAGES_HEAD, AccessFlags::LOCAL_WRITE)?;
    let server_bufs = pd.register(size * (DEPTH + 1) * MSG_MAX, AccessFlags::LOCAL_WRITE)?;
    let mut client_init = Vec::with_capacity(size);
    let mut server_init = Vec::with_capacity(size);
    for qp in 0..size {
        client_init.push(make(&client_cq, &client_cq, 2)?);
        let mut server = make(&send_cq, &recv_cq, DEPTH)?;
        // Receives go in before the queue pair can receive: a peer that connects first and
        // sends at once finds them there (no receiver-not-ready retries at start).
        for slot in 0..DEPTH {
            post_slot(&mut server, &server_bufs, qp, slot)?;
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
        let mut r = Reader::new(blob);
        let n = usize::from(r.u16()?);
        tcp_blobs.push(r.take(n)?.to_vec());
        addrs.push(Addr::decode(&mut r, launch.size)?);
        r.finish()?;
    }
    let listener = listener.ok_or_else(|| Error::protocol("no listener was made"))?;
    let (tcp_links, tcp_server) = tcp::mesh(launch, listener, &tcp_blobs, bound)?;

    let me = usize::from(launch.rank);
    let mtu = port.active_mtu;
    let connect_qp = |qp: QueuePair<Rc, rdma_verbs::Init>, peer: &Addr, qpn: u32| {
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
        bufs: server_bufs,
        frames: Arc::clone(&frames),
        tcp: tcp_server,
        me: launch.rank,
    };
    server.recv_cq.req_notify(false)?;
    let links = RdmaLinks {
        qps: client_qps,
        cq: client_cq,
        channel: client_channel,
        bufs: client_bufs,
        remote: addrs.iter().map(|a| a.frames).collect(),
        read,
        inline,
        frames,
        _tcp: tcp_links,
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

fn status_error(peer: u16, wc: &WorkCompletion) -> Error {
    Error::peer(
        peer,
        format!(
            "a request to it failed: {} (it died or is unreachable)",
            wc.status()
        ),
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

    /// Waits for the completions `want` (wr_ids) of requests to `peer`; returns the receive's
    /// byte count if one was wanted. On failure the links are marked broken.
    fn wait(&mut self, peer: u16, want: &[u64], bound: Duration) -> Result<u32> {
        let result = self.wait_inner(peer, want, bound);
        if let Err(e) = &result {
            self.broken.get_or_insert_with(|| e.to_string());
        }
        result
    }

    fn wait_inner(&mut self, peer: u16, want: &[u64], bound: Duration) -> Result<u32> {
        let started = Instant::now();
        let mut missing: Vec<u64> = want.to_vec();
        let mut received = 0;
        let mut wcs = [WorkCompletion::default(); 4];
        let mut armed = false;
        while !missing.is_empty() {
            let done = self.cq.poll(&mut wcs)?;
            if done.is_empty() {
                let waited = started.elapsed();
                if waited >= bound {
                    return Err(Error::peer(
                        peer,
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
                match self.channel.wait(bound - waited) {
                    Ok(_) | Err(rdma_verbs::Error::Timeout(_)) => {}
                    Err(e) => return Err(e.into()),
                }
                armed = false;
                continue;
            }
            for wc in done {
                if !wc.is_success() {
                    return Err(status_error(peer, wc));
                }
                if wc.wr_id() == ID_RECV {
                    received = wc.byte_len();
                }
                missing.retain(|&id| id != wc.wr_id());
            }
        }
        Ok(received)
    }

    /// Posts a send of `msg` (inline when it fits, else from the bounce buffer).
    fn post_msg(&mut self, msg: &Msg) -> Result<()> {
        let header = msg.header().encode();
        let len = HEADER_LEN + msg.payload.len();
        if len > MSG_MAX {
            return Err(Error::protocol(format!(
                "a {len}-byte message (the RDMA transports carry at most {MSG_MAX})"
            )));
        }
        let qp = &mut self.qps[usize::from(msg.to)];
        if len as u32 <= self.inline.min(INLINE) {
            let mut bytes = [0u8; INLINE as usize];
            bytes[..HEADER_LEN].copy_from_slice(&header);
            bytes[HEADER_LEN..len].copy_from_slice(&msg.payload);
            let request = SendRequest::send(ID_SEND, Payload::Inline(&bytes[..len])).signaled();
            // SAFETY: inline data is copied by the call; no memory is named.
            unsafe { qp.post_send_one(&request) }?;
        } else {
            self.bufs.write_at(0, &header)?;
            self.bufs.write_at(HEADER_LEN, &msg.payload)?;
            let request = SendRequest::send(ID_SEND, self.bufs.slice(0..len)?).signaled();
            // SAFETY: the send buffer stays registered while the queue pair lives (field
            // order), and is written again only after this send's completion is polled (every
            // call waits for it, and a failed wait stops all further requests).
            unsafe { qp.post_send_one(&request) }?;
        }
        Ok(())
    }

    /// Marks the links broken after an error: a request may still be posted, so no buffer is
    /// used again.
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
        let recv = RecvRequest::new(ID_RECV, self.bufs.slice(MSG_MAX..2 * MSG_MAX)?);
        // SAFETY: the receive buffer stays registered while the queue pair lives, and is read
        // only after this receive's completion (with atomic copies).
        unsafe { self.qps[usize::from(msg.to)].post_recv_one(&recv) }?;
        self.post_msg(msg)?;
        let len = self.wait(msg.to, &[ID_SEND, ID_RECV], bound)? as usize;
        self.read_reply(MSG_MAX, len)
    }

    fn read_reply(&self, at: usize, len: usize) -> Result<Msg> {
        if len > MSG_MAX {
            return Err(Error::protocol(format!("a {len}-byte message")));
        }
        let mut bytes = vec![0u8; len];
        self.bufs.read_at(at, &mut bytes)?;
        Msg::decode(bytes)
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
        let local = self.frames.mr().slice(start..start + bytes)?;
        if self.read {
            let remote = self.remote[home].slice(start as u32, bytes as u32)?;
            let request = SendRequest::read(ID_READ, local, remote).signaled();
            // SAFETY: the frames stay registered while the queue pair lives (`Frames` outlives
            // it); their window pages are inaccessible (the pages are invalid here), and the
            // runtime reads them only after the completion, so nothing touches them meanwhile.
            unsafe { self.qps[home].post_send_one(&request) }?;
            self.wait(msg.to, &[ID_READ], bound)?;
            let mut w = Writer::new();
            w.u16(count).u32(first);
            let mut reply = Msg::new(Op::Pages, msg.to, msg.from).with(w.done());
            reply.seq = msg.seq;
            return Ok(reply);
        }
        let head = self.bufs.slice(2 * MSG_MAX..2 * MSG_MAX + PAGES_HEAD)?;
        let sges = [Sge::from(head), Sge::from(local)];
        let recv = RecvRequest::new(ID_RECV, Payload::List(&sges));
        // SAFETY: as for the READ: registered memory nobody touches until the completion.
        unsafe { self.qps[home].post_recv_one(&recv) }?;
        self.post_msg(msg)?;
        let len = self.wait(msg.to, &[ID_SEND, ID_RECV], bound)? as usize;
        if len < PAGES_HEAD {
            return self.read_reply(2 * MSG_MAX, len);
        }
        let mut raw = vec![0u8; PAGES_HEAD];
        self.bufs.read_at(2 * MSG_MAX, &mut raw)?;
        let mut head = [0u8; HEADER_LEN];
        head.copy_from_slice(&raw[..HEADER_LEN]);
        let h = Header::decode(&head)?;
        if h.op == Op::Fail {
            // The rest of the failure's text went to the frames.
            raw.resize(len, 0);
            let frame = self.frames.mr().as_ptr().wrapping_add(start);
            // SAFETY: `len - PAGES_HEAD` bytes the receive wrote into these frames (it is
            // complete), inside the registration.
            unsafe { copy_from_shared(frame, &mut raw[PAGES_HEAD..]) };
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

/// Posts receive slot `slot` of server queue pair `index` (wr_id `index * DEPTH + slot`).
fn post_slot<S: CanPostRecv>(
    qp: &mut QueuePair<Rc, S>,
    bufs: &MemoryRegion,
    index: usize,
    slot: usize,
) -> Result<()> {
    let at = (index * DEPTH + slot) * MSG_MAX;
    let recv = RecvRequest::new((index * DEPTH + slot) as u64, bufs.slice(at..at + MSG_MAX)?);
    // SAFETY: the slot stays registered while the queue pair lives (`RdmaServer` declares its
    // queue pairs before the buffers), and is read only after its completion, before it is
    // posted again.
    unsafe { qp.post_recv_one(&recv) }?;
    Ok(())
}

impl RdmaServer {
    fn post_recv(&mut self, qp: usize, slot: usize) -> Result<()> {
        post_slot(&mut self.qps[qp], &self.bufs, qp, slot)
    }

    /// Sends a reply and waits for its completion. A failure (an error completion, or none
    /// within the bound) means the peer is dead to this server: the caller sends it nothing
    /// more, so its send buffer, which a never-completed send may still read, is not written
    /// again. Sends are identified by their peer's rank (`wr_id`), so a late completion of a
    /// dead peer's send is not taken for another's.
    fn send_out(&mut self, out: &Out, bound: Duration) -> Result<()> {
        let to = usize::from(out.msg.to);
        let header = out.header().encode();
        let len = HEADER_LEN + out.msg.payload.len();
        if len > MSG_MAX {
            return Err(Error::protocol(format!("a {len}-byte reply")));
        }
        let at = (self.qps.len() * DEPTH + to) * MSG_MAX;
        self.bufs.write_at(at, &header)?;
        self.bufs.write_at(at + HEADER_LEN, &out.msg.payload)?;
        let head = self.bufs.slice(at..at + len)?;
        let sges;
        let request = match out.pages {
            Some((first, count)) => {
                let start = first as usize * PAGE;
                let pages = self
                    .frames
                    .mr()
                    .slice(start..start + usize::from(count) * PAGE)?;
                sges = [Sge::from(head), Sge::from(pages)];
                SendRequest::send(to as u64, Payload::List(&sges))
            }
            None => SendRequest::send(to as u64, head),
        };
        // SAFETY: the send buffer and the frames stay registered while the queue pair lives
        // (field order; `Frames` outlives every queue pair). This peer's send buffer is
        // written again only after this send's completion (waited for below; on failure the
        // peer gets nothing more). The frames are home pages, which the application may store
        // into meanwhile, but only with relaxed atomic stores (`GlobalSlice`), which the
        // registration's remote-read exposure already requires: a store racing the send
        // changes which bytes go out (bytes the requester may not read before its next
        // acquire, in a race-free program), and no Rust reference covers them.
        unsafe { self.qps[to].post_send_one(&request.signaled()) }?;
        let started = Instant::now();
        let mut wcs = [WorkCompletion::default(); 4];
        loop {
            for wc in self.send_cq.poll(&mut wcs)? {
                if wc.wr_id() != to as u64 {
                    continue; // a late completion of a peer already given up
                }
                if !wc.is_success() {
                    return Err(status_error(to as u16, wc));
                }
                return Ok(());
            }
            if started.elapsed() > bound {
                return Err(Error::peer(to as u16, "a reply to it never completed"));
            }
            std::thread::yield_now();
        }
    }

    /// Serves requests until every node has left, or `stop` becomes readable.
    pub(crate) fn run(mut self, mut home: Home, stop: &OwnedFd) -> Result<()> {
        let bound = self.frames.shared.config.timeout;
        let mut out: Vec<Out> = Vec::new();
        let mut wcs = [WorkCompletion::default(); 16];
        let mut dead = vec![false; self.qps.len()];
        while !home.done() {
            let mut done = self.recv_cq.poll(&mut wcs)?.to_vec();
            if done.is_empty() {
                self.recv_cq.req_notify(false)?;
                // Poll once more: a completion that came before the arming raises no event.
                done = self.recv_cq.poll(&mut wcs)?.to_vec();
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
            for wc in &done {
                let id = wc.wr_id() as usize;
                let (qp, slot) = (id / DEPTH, id % DEPTH);
                if !wc.is_success() {
                    if dead.get(qp) == Some(&false) {
                        dead[qp] = true;
                        home.closed(qp as u16, &mut out);
                    }
                    continue;
                }
                if wc.opcode() != WcOpcode::Recv {
                    continue;
                }
                let msg = self.read_slot(qp, slot, wc.byte_len() as usize);
                if self.post_recv(qp, slot).is_err() {
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

    fn read_slot(&self, qp: usize, slot: usize, len: usize) -> Result<Msg> {
        if len > MSG_MAX {
            return Err(Error::protocol(format!("a {len}-byte message")));
        }
        let at = (qp * DEPTH + slot) * MSG_MAX;
        let mut bytes = vec![0u8; len];
        self.bufs.read_at(at, &mut bytes)?;
        Msg::decode(bytes)
    }
}
