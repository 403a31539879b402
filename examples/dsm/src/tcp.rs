//! The `tcp` transport: kernel sockets, one connection from each node's client side to each
//! node's server side (itself included), requests and replies as [`Msg`]s.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use rdma_verbs::shared::copy_from_shared;

use crate::home::{Home, Out};
use crate::launch::Launch;
use crate::region::{PAGE, Region};
use crate::rendezvous;
use crate::wire::{HEADER_LEN, Header, Msg};

/// Writes `msg` in one `write_all` (header and payload together).
fn write_msg(stream: &mut TcpStream, msg: &Msg) -> std::io::Result<()> {
    let mut bytes = Vec::with_capacity(HEADER_LEN + msg.payload.len());
    bytes.extend_from_slice(&msg.header().encode());
    bytes.extend_from_slice(&msg.payload);
    stream.write_all(&bytes)
}

/// Writes a reply, copying the frames it carries (if any) out of `region`.
fn write_out(stream: &mut TcpStream, out: &Out, region: &Region) -> std::io::Result<()> {
    let header = out.header();
    let mut bytes = Vec::with_capacity(HEADER_LEN + header.len as usize);
    bytes.extend_from_slice(&header.encode());
    bytes.extend_from_slice(&out.msg.payload);
    if let Some((first, count)) = out.pages {
        let at = bytes.len();
        bytes.resize(at + usize::from(count) * PAGE, 0);
        let frame = region
            .frame(first as usize)
            .filter(|_| (first as usize + usize::from(count)) <= region.pages())
            .ok_or(ErrorKind::InvalidInput)?;
        // SAFETY: `count` whole frames of the alias (checked to lie in the window), accessed
        // only atomically or by the device (region.rs).
        unsafe { copy_from_shared(frame, &mut bytes[at..]) };
    }
    stream.write_all(&bytes)
}

/// Reads one whole message within `bound` (a deadline for the message, not for each read:
/// a peer that sends it a few bytes at a time cannot stretch the wait); `Ok(None)` on a
/// clean end of stream before its first byte, `TimedOut` past the deadline.
fn read_msg(stream: &mut TcpStream, bound: Duration) -> std::io::Result<Option<Msg>> {
    let deadline = Instant::now() + bound;
    let mut header = [0u8; HEADER_LEN];
    if !read_full(stream, &mut header, deadline)? {
        return Ok(None);
    }
    let header = Header::decode(&header)
        .map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e.to_string()))?;
    let mut payload = vec![0u8; header.len as usize];
    if !read_full(stream, &mut payload, deadline)? && !payload.is_empty() {
        return Err(ErrorKind::UnexpectedEof.into());
    }
    Ok(Some(Msg::from_header(header, payload)))
}

/// Fills `buf` before `deadline`; `Ok(false)` if the stream ended before its first byte.
fn read_full(stream: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> std::io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ErrorKind::TimedOut.into());
        }
        stream.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
        match stream.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Whether a read failed because its bound passed: the socket's receive timeout
/// (`WouldBlock`) or [`read_full`]'s deadline (a `TimedOut` with no OS error). A `TimedOut`
/// from the kernel (`ETIMEDOUT`: `TCP_USER_TIMEOUT`, keepalive) is the connection's own
/// failure, not a silent peer.
fn read_bound_passed(e: &std::io::Error) -> bool {
    e.kind() == ErrorKind::WouldBlock
        || (e.kind() == ErrorKind::TimedOut && e.raw_os_error().is_none())
}

/// What a peer whose connection ended (a clean end of stream) is said to have done.
const CLOSED: &str = "closed its connection (it died or left)";

/// The client side: a connection to every node's server.
#[derive(Debug)]
pub(crate) struct TcpLinks {
    conns: Vec<TcpStream>,
    /// A call failed part-way: a stream may hold half a message, so none is used again.
    broken: Option<String>,
}

impl TcpLinks {
    /// Sends `msg` to node `msg.to` and waits at most `bound` for its reply.
    pub(crate) fn call(&mut self, msg: &Msg, bound: Duration) -> Result<Msg> {
        let result = self.call_inner(msg, bound);
        if let Err(e) = &result {
            self.broken.get_or_insert_with(|| e.to_string());
        }
        result
    }

    fn call_inner(&mut self, msg: &Msg, bound: Duration) -> Result<Msg> {
        self.send(msg)?;
        self.reply(msg.to, bound, bound)
    }

    /// Sends every request of `msgs` before waiting for their replies, at most `bound` in
    /// all; returns them in `msgs`' order (each connection answers in the order it is asked).
    pub(crate) fn call_all(&mut self, msgs: &[Msg], bound: Duration) -> Result<Vec<Msg>> {
        let result = self.call_all_inner(msgs, bound);
        if let Err(e) = &result {
            self.broken.get_or_insert_with(|| e.to_string());
        }
        result
    }

    fn call_all_inner(&mut self, msgs: &[Msg], bound: Duration) -> Result<Vec<Msg>> {
        for msg in msgs {
            self.send(msg)?;
        }
        let deadline = Instant::now() + bound;
        msgs.iter()
            .map(|msg| {
                let left = deadline.saturating_duration_since(Instant::now());
                self.reply(msg.to, left, bound)
            })
            .collect()
    }

    /// Reads the next reply from node `to`, waiting at most `left` (`bound` is the whole
    /// wait, for the error's text).
    fn reply(&mut self, to: u16, left: Duration, bound: Duration) -> Result<Msg> {
        let stream = &mut self.conns[usize::from(to)];
        match read_msg(stream, left.max(Duration::from_millis(1))) {
            Ok(Some(reply)) => Ok(reply),
            Ok(None) => Err(Error::peer(to, CLOSED)),
            Err(e) if read_bound_passed(&e) => Err(Error::peer(
                to,
                format!("no reply within {:.1} s", bound.as_secs_f64()),
            )),
            Err(e) => Err(Error::peer(to, format!("connection failed: {e}"))),
        }
    }

    /// The links as the RDMA transports keep them: carrying nothing, only watching their peers.
    ///
    /// # Errors
    ///
    /// A socket that cannot be made non-blocking.
    pub(crate) fn into_liveness(self) -> Result<Liveness> {
        for conn in &self.conns {
            conn.set_nonblocking(true)
                .map_err(|e| Error::os("liveness connection", e))?;
        }
        Ok(Liveness { conns: self.conns })
    }

    /// Sends `msg` to node `msg.to` without waiting for a reply.
    pub(crate) fn send(&mut self, msg: &Msg) -> Result<()> {
        if let Some(why) = &self.broken {
            return Err(Error::Config(format!(
                "the TCP links are unusable after an earlier failure: {why}"
            )));
        }
        let to = msg.to;
        let stream = self
            .conns
            .get_mut(usize::from(to))
            .ok_or_else(|| Error::InvalidArgument(format!("no node {to}")))?;
        let result =
            write_msg(stream, msg).map_err(|e| Error::peer(to, format!("cannot send to it: {e}")));
        if let Err(e) = &result {
            self.broken.get_or_insert_with(|| e.to_string());
        }
        result
    }
}

/// The client links of the RDMA transports, which carry nothing but keep each peer watched
/// (keepalive, `TCP_USER_TIMEOUT`); non-blocking.
#[derive(Debug)]
pub(crate) struct Liveness {
    conns: Vec<TcpStream>,
}

impl Liveness {
    /// Why the link to `peer` is gone (closed, failed, or carrying bytes it never should), or
    /// `None` while it lives. Never blocks. The mesh links every node, itself included, so a
    /// node without a link is no node of the run: named so rather than taken for alive.
    pub(crate) fn gone(&mut self, peer: u16) -> Option<String> {
        let Some(conn) = self.conns.get_mut(usize::from(peer)) else {
            return Some("no liveness link (no such node)".into());
        };
        let mut byte = [0u8; 1];
        match conn.read(&mut byte) {
            Ok(0) => Some(CLOSED.into()),
            Ok(_) => Some("sent bytes on its liveness connection, which carries none".into()),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => None,
            Err(e) => Some(format!("connection failed: {e}")),
        }
    }
}

/// The server side: a connection from every node's client.
#[derive(Debug)]
pub(crate) struct TcpServer {
    me: u16,
    conns: Vec<Option<TcpStream>>,
    /// Per connection, the bytes of a message not yet whole, and since when it has waited.
    partial: Vec<Partial>,
    bound: Duration,
}

/// Reassembles the messages of one connection from what each non-blocking read returned, so
/// that one peer sending slowly never holds the server (and every other node's requests).
#[derive(Debug, Default)]
pub(crate) struct Partial {
    bytes: Vec<u8>,
    since: Option<Instant>,
}

impl Partial {
    /// Adds `data` (read at `now`) and moves every whole message into `out`; an error if the
    /// bytes are not a message (the connection is then closed).
    pub(crate) fn push(&mut self, data: &[u8], now: Instant, out: &mut Vec<Msg>) -> Result<()> {
        self.bytes.extend_from_slice(data);
        let mut at = 0;
        while self.bytes.len() - at >= HEADER_LEN {
            let mut raw = [0u8; HEADER_LEN];
            raw.copy_from_slice(&self.bytes[at..at + HEADER_LEN]);
            let header = Header::decode(&raw)?;
            let end = at + HEADER_LEN + header.len as usize;
            if self.bytes.len() < end {
                break;
            }
            out.push(Msg::from_header(
                header,
                self.bytes[at + HEADER_LEN..end].to_vec(),
            ));
            at = end;
        }
        self.bytes.drain(..at);
        self.since = if self.bytes.is_empty() {
            None
        } else if at > 0 {
            // A message completed: the bound runs from here for the next one.
            Some(now)
        } else {
            self.since.or(Some(now))
        };
        Ok(())
    }
}

/// Sets the options every mesh connection gets: no Nagle delay; keepalive probes after a
/// second of silence, a second apart, three of them; and `TCP_USER_TIMEOUT` of `bound` (data
/// sent but unacknowledged for that long aborts the connection, where the kernel would
/// otherwise retransmit for many minutes; with keepalive on, it also decides when unanswered
/// probes end an idle connection). A peer host that vanishes (rather than a process that
/// dies, which closes its sockets) is so noticed within about `bound` whether the connection
/// was idle or busy.
fn tune(stream: &TcpStream, bound: Duration) -> Result<()> {
    stream
        .set_nodelay(true)
        .map_err(|e| Error::os("TCP_NODELAY", e))?;
    let fd = stream.as_raw_fd();
    let user_timeout = libc::c_int::try_from(bound.as_millis()).unwrap_or(libc::c_int::MAX);
    for (level, name, value) in [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3),
        (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, user_timeout),
    ] {
        let value: libc::c_int = value;
        // SAFETY: a valid socket and a pointer to a c_int of the size given.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(Error::last_os("setsockopt (keepalive, user timeout)"));
        }
    }
    Ok(())
}

/// A listener for the mesh on `ip`, and the blob that tells the other nodes where it is.
pub(crate) fn listen(ip: IpAddr) -> Result<(TcpListener, Vec<u8>)> {
    let l = TcpListener::bind(SocketAddr::new(ip, 0))
        .map_err(|e| Error::os(format!("listening on {ip}"), e))?;
    let addr = l.local_addr().map_err(|e| Error::os("listener", e))?;
    Ok((l, addr.to_string().into_bytes()))
}

/// Joins the `tcp` transport's mesh: meets at the rendezvous (this node's blob is its
/// listener's address), then connects (see [`mesh`]).
pub(crate) fn connect(
    launch: &Launch,
    digest: u64,
    bound: Duration,
) -> Result<(TcpLinks, TcpServer)> {
    let mut listener = None;
    let blobs = rendezvous::meet(launch, digest, bound, |ip| {
        let (l, blob) = listen(ip)?;
        listener = Some(l);
        Ok(blob)
    })?;
    let listener = listener.ok_or_else(|| Error::protocol("no listener was made"))?;
    mesh(launch, listener, &blobs, bound)
}

/// Connects to every node's listener (its own too; `blobs` are what [`listen`] returned on
/// each node, by rank) and accepts every node's connection.
pub(crate) fn mesh(
    launch: &Launch,
    listener: TcpListener,
    blobs: &[Vec<u8>],
    bound: Duration,
) -> Result<(TcpLinks, TcpServer)> {
    let deadline = Instant::now() + bound;
    let size = usize::from(launch.size);
    let mut links = Vec::with_capacity(size);
    for (rank, blob) in blobs.iter().enumerate() {
        let addr: SocketAddr = std::str::from_utf8(blob)
            .ok()
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| Error::protocol(format!("node {rank}'s address is unreadable")))?;
        let mut stream = TcpStream::connect_timeout(&addr, bound)
            .map_err(|e| Error::peer(rank as u16, format!("cannot connect to {addr}: {e}")))?;
        tune(&stream, bound)?;
        stream
            .set_write_timeout(Some(bound))
            .map_err(|e| Error::os("socket timeout", e))?;
        stream
            .write_all(&launch.rank.to_le_bytes())
            .map_err(|e| Error::peer(rank as u16, format!("cannot greet it: {e}")))?;
        links.push(stream);
    }
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::os("listener", e))?;
    let mut conns: Vec<Option<TcpStream>> = (0..size).map(|_| None).collect();
    let mut accepted = 0;
    while accepted < size {
        match listener.accept() {
            Ok((mut stream, _)) => {
                stream
                    .set_nonblocking(false)
                    .and_then(|_| stream.set_read_timeout(Some(bound)))
                    .and_then(|_| stream.set_write_timeout(Some(bound)))
                    .map_err(|e| Error::os("accepted connection", e))?;
                tune(&stream, bound)?;
                let mut rank = [0u8; 2];
                stream
                    .read_exact(&mut rank)
                    .map_err(|e| Error::os("reading a node's greeting", e))?;
                let rank = u16::from_le_bytes(rank);
                let slot = conns
                    .get_mut(usize::from(rank))
                    .filter(|s| s.is_none())
                    .ok_or_else(|| Error::protocol(format!("a second or unknown node {rank}")))?;
                *slot = Some(stream);
                accepted += 1;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing = conns.iter().position(Option::is_none).unwrap_or(0);
                    return Err(Error::peer(
                        missing as u16,
                        "never connected to this node's server",
                    ));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(Error::os("accepting a node", e)),
        }
    }
    Ok((
        TcpLinks {
            conns: links,
            broken: None,
        },
        TcpServer {
            me: launch.rank,
            partial: (0..conns.len()).map(|_| Partial::default()).collect(),
            conns,
            bound,
        },
    ))
}

impl TcpServer {
    /// Adds a `pollfd` for each open connection to `fds`; returns their ranks, in order.
    pub(crate) fn poll_fds(&self, fds: &mut Vec<libc::pollfd>) -> Vec<usize> {
        let mut ranks = Vec::new();
        for (rank, conn) in self.conns.iter().enumerate() {
            if let Some(c) = conn {
                fds.push(libc::pollfd {
                    fd: c.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
                ranks.push(rank);
            }
        }
        ranks
    }

    /// For a connection that carries nothing (the RDMA transports' liveness mesh) and polled
    /// readable: whether it has closed (end of stream, an error, or bytes it should never
    /// carry); a closed one is dropped.
    pub(crate) fn closed_now(&mut self, rank: usize) -> bool {
        let Some(conn) = self.conns.get_mut(rank).and_then(Option::as_mut) else {
            return false;
        };
        let mut byte = [0u8; 1];
        let _ = conn.set_nonblocking(true);
        let closed = !matches!(
            conn.read(&mut byte),
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted
        );
        if closed {
            self.conns[rank] = None;
        }
        closed
    }

    /// Reads what connection `rank` has now without blocking; returns its whole messages and
    /// whether it is still open (not ended, no error, no bytes that are not a message).
    fn receive(&mut self, rank: usize, now: Instant) -> (Vec<Msg>, bool) {
        let mut msgs = Vec::new();
        let Some(conn) = self.conns[rank].as_ref() else {
            return (msgs, false);
        };
        let fd = conn.as_raw_fd();
        let mut buf = [0u8; 64 * 1024];
        loop {
            // SAFETY: reads at most `buf.len()` bytes into `buf`; MSG_DONTWAIT makes this one
            // call non-blocking without changing the socket (its replies are written
            // blocking, with the write timeout).
            let n =
                unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
            match n {
                0 => return (msgs, false),
                n if n > 0 => {
                    let got = &buf[..n as usize];
                    if self.partial[rank].push(got, now, &mut msgs).is_err() {
                        return (msgs, false);
                    }
                }
                _ => {
                    let error = std::io::Error::last_os_error();
                    match error.kind() {
                        ErrorKind::Interrupted => {}
                        ErrorKind::WouldBlock => return (msgs, true),
                        _ => return (msgs, false),
                    }
                }
            }
        }
    }

    /// Drops connection `rank` and whatever it had half sent.
    fn close(&mut self, rank: usize) {
        self.conns[rank] = None;
        self.partial[rank] = Partial::default();
    }

    /// Serves requests until every node has left, or `stop` becomes readable. Reads never
    /// block: a message is reassembled from what arrives, and a connection whose message
    /// stays incomplete for the bound is closed as a dead node's.
    pub(crate) fn run(mut self, mut home: Home, region: &Region, stop: &OwnedFd) -> Result<()> {
        let mut out = Vec::new();
        while !home.done() {
            let mut fds: Vec<libc::pollfd> = vec![libc::pollfd {
                fd: stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            let ranks = self.poll_fds(&mut fds);
            // Wake in time to close a connection whose message stopped half-way.
            let now = Instant::now();
            let timeout = self
                .partial
                .iter()
                .filter_map(|p| p.since)
                .map(|since| (since + self.bound).saturating_duration_since(now))
                .min()
                .map_or(-1, |left| {
                    libc::c_int::try_from(left.as_millis() + 1).unwrap_or(libc::c_int::MAX)
                });
            // SAFETY: `fds` is a valid array of pollfd of the given length.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == ErrorKind::Interrupted {
                    continue;
                }
                return Err(Error::os("poll", e));
            }
            if fds[0].revents != 0 {
                return Ok(());
            }
            let now = Instant::now();
            for (fd, &rank) in fds[1..].iter().zip(&ranks) {
                let stalled = self.partial[rank]
                    .since
                    .is_some_and(|since| now.duration_since(since) >= self.bound);
                if fd.revents == 0 && !stalled {
                    continue;
                }
                let (msgs, open) = self.receive(rank, now);
                for msg in msgs {
                    if self.conns[rank].is_none() {
                        break;
                    }
                    if usize::from(msg.from) == rank && msg.to == self.me {
                        home.handle(msg, &mut out);
                    } else {
                        crate::say!(
                            "dsm: node {}: a message from node {} on node {rank}'s connection; \
                             closing it",
                            self.me,
                            msg.from
                        );
                        self.close(rank);
                        home.closed(rank as u16, &mut out);
                    }
                }
                let stalled = self.partial[rank]
                    .since
                    .is_some_and(|since| now.duration_since(since) >= self.bound);
                if self.conns[rank].is_some() && (!open || stalled) {
                    if stalled {
                        crate::say!(
                            "dsm: node {}: node {rank} sent part of a message and nothing more \
                             for {:.1} s; closing its connection",
                            self.me,
                            self.bound.as_secs_f64()
                        );
                    }
                    self.close(rank);
                    home.closed(rank as u16, &mut out);
                }
            }
            // A failed write closes that node, whose waiters' failures go out in turn.
            while !out.is_empty() {
                let mut more = Vec::new();
                for reply in out.drain(..) {
                    let to = reply.msg.to;
                    let Some(conn) = self.conns.get_mut(usize::from(to)).and_then(Option::as_mut)
                    else {
                        continue;
                    };
                    if write_out(conn, &reply, region).is_err() {
                        self.close(usize::from(to));
                        home.closed(to, &mut more);
                    }
                }
                out = more;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Op;

    fn wire(msg: &Msg) -> Vec<u8> {
        let mut bytes = msg.header().encode().to_vec();
        bytes.extend_from_slice(&msg.payload);
        bytes
    }

    /// Messages come out whole whatever the chunks the reads return; an incomplete one is
    /// timed from its first byte (and again from the end of the previous whole one); bytes
    /// that are not a message are refused.
    #[test]
    fn messages_are_reassembled_from_any_chunks() {
        let a = Msg::new(Op::GetPage, 1, 0).with(vec![1, 2, 3, 4, 5, 6]);
        let b = Msg::new(Op::Release, 1, 0).with(Vec::new());
        let c = Msg::new(Op::Acquire, 1, 0).with(vec![9; 4]);
        let stream: Vec<u8> = [wire(&a), wire(&b), wire(&c)].concat();
        let t0 = Instant::now();
        for chunk in [1, 3, 7, 16, 17, 22, stream.len()] {
            let mut p = Partial::default();
            let mut out = Vec::new();
            for (i, piece) in stream.chunks(chunk).enumerate() {
                p.push(piece, t0 + Duration::from_millis(i as u64), &mut out)
                    .unwrap();
            }
            assert_eq!(out, [a.clone(), b.clone(), c.clone()], "chunks of {chunk}");
            assert!(p.bytes.is_empty() && p.since.is_none(), "chunks of {chunk}");
        }
        // Half a header: waiting since its first byte; the rest completes it.
        let mut p = Partial::default();
        let mut out = Vec::new();
        let ab = [wire(&a), wire(&b)].concat();
        p.push(&ab[..5], t0, &mut out).unwrap();
        assert_eq!((out.len(), p.since), (0, Some(t0)));
        let t1 = t0 + Duration::from_secs(1);
        p.push(&ab[5..HEADER_LEN + 6 + 3], t1, &mut out).unwrap();
        assert_eq!((out.len(), p.since), (1, Some(t1)));
        p.push(&ab[HEADER_LEN + 6 + 3..], t1, &mut out).unwrap();
        assert_eq!((out.len(), p.since), (2, None));
        // A header no message has.
        let mut bad = wire(&a);
        bad[0] = 0xff;
        assert!(Partial::default().push(&bad, t0, &mut out).is_err());
    }

    /// The read bound's own errors count as a silent peer; the kernel's `ETIMEDOUT` (and any
    /// other OS error) as a failed connection.
    #[test]
    fn only_the_read_bound_counts_as_a_silent_peer() {
        assert!(read_bound_passed(&ErrorKind::WouldBlock.into()));
        assert!(read_bound_passed(&ErrorKind::TimedOut.into()));
        let kernel = std::io::Error::from_raw_os_error(libc::ETIMEDOUT);
        assert_eq!(kernel.kind(), ErrorKind::TimedOut);
        assert!(!read_bound_passed(&kernel));
        assert!(!read_bound_passed(&std::io::Error::from_raw_os_error(
            libc::ECONNRESET
        )));
        assert!(!read_bound_passed(&ErrorKind::UnexpectedEof.into()));
    }

    /// The liveness links never block, take a quiet peer for a live one, and name each way a
    /// link goes: closed, carrying a byte (they carry none), or no link at all.
    #[test]
    fn liveness_tells_each_way_a_link_goes() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut accepted = Vec::new();
        let conns: Vec<TcpStream> = (0..3)
            .map(|_| {
                let conn = TcpStream::connect(addr).unwrap();
                accepted.push(listener.accept().unwrap().0);
                conn
            })
            .collect();
        let links = TcpLinks {
            conns,
            broken: None,
        };
        let mut liveness = links.into_liveness().unwrap();
        // Quiet and open: alive, and the read returns at once (a blocking one would hang).
        for peer in 0..3 {
            assert_eq!(liveness.gone(peer), None, "node {peer}");
        }
        let mut accepted = accepted.into_iter();
        let quiet = accepted.next().unwrap();
        accepted.next().unwrap().write_all(&[7]).unwrap();
        drop(accepted.next().unwrap());
        // What happened on the other ends reaches these sockets soon; wait for it, bounded.
        let settle = |liveness: &mut Liveness, peer| {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match liveness.gone(peer) {
                    Some(why) => return Some(why),
                    None if Instant::now() >= deadline => return None,
                    None => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        };
        assert_eq!(
            settle(&mut liveness, 1).as_deref(),
            Some("sent bytes on its liveness connection, which carries none")
        );
        assert_eq!(settle(&mut liveness, 2).as_deref(), Some(CLOSED));
        assert_eq!(liveness.gone(0), None, "the quiet link still lives");
        assert_eq!(
            liveness.gone(3).as_deref(),
            Some("no liveness link (no such node)")
        );
        drop(quiet);
        assert_eq!(settle(&mut liveness, 0).as_deref(), Some(CLOSED));
    }

    /// A peer that takes the request and never replies is reported as silent for the bound
    /// (not as a failed connection), and the links are unusable afterwards (half a message
    /// may be on the stream); a peer that closed its end is reported as gone.
    #[test]
    fn a_silent_peer_is_timed_out_and_a_closed_one_named() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let silent = TcpStream::connect(addr).unwrap();
        let (_held, _) = listener.accept().unwrap();
        let closing = TcpStream::connect(addr).unwrap();
        drop(listener.accept().unwrap());
        let mut links = TcpLinks {
            conns: vec![silent, closing],
            broken: None,
        };
        let msg = Msg::new(Op::GetPage, 1, 0);
        let err = links.call(&msg, Duration::from_millis(100)).unwrap_err();
        assert_eq!(
            err.to_string(),
            Error::peer(0, "no reply within 0.1 s").to_string()
        );
        let again = links.call(&msg, Duration::from_millis(100)).unwrap_err();
        assert!(again.to_string().contains("unusable"), "{again}");

        links.broken = None;
        let err = links
            .call(&Msg::new(Op::GetPage, 0, 1), Duration::from_secs(5))
            .unwrap_err();
        assert_eq!(err.to_string(), Error::peer(1, CLOSED).to_string());
    }
}
