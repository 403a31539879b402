//! The nodes' meeting: every rank connects to rank 0 over TCP, sends its rank, the node count,
//! a digest of the shared settings and a blob (its transport's address: a TCP listener, or
//! queue pair numbers, GID and region key); rank 0 checks them and sends every blob to every
//! node. Frames: a `u32` length, then the bytes.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::launch::Launch;
use crate::wire::{Reader, Writer};

/// The longest frame accepted.
const MAX_FRAME: usize = 1 << 20;

pub(crate) fn write_frame(stream: &mut TcpStream, bytes: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(bytes.len()).map_err(|_| ErrorKind::InvalidInput)?;
    stream.write_all(&len.to_le_bytes())?;
    stream.write_all(bytes)
}

pub(crate) fn read_frame(stream: &mut TcpStream) -> Result<Vec<u8>> {
    let mut len = [0u8; 4];
    stream
        .read_exact(&mut len)
        .map_err(|e| Error::os("reading from the rendezvous", e))?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(Error::protocol(format!("a {len}-byte rendezvous frame")));
    }
    let mut bytes = vec![0u8; len];
    stream
        .read_exact(&mut bytes)
        .map_err(|e| Error::os("reading from the rendezvous", e))?;
    Ok(bytes)
}

/// Meets the other nodes; returns every node's blob by rank. `blob` is called with the local
/// address this node reaches the others from. Every wait is bounded by `bound`.
pub(crate) fn meet(
    launch: &Launch,
    digest: u64,
    bound: Duration,
    blob: impl FnOnce(IpAddr) -> Result<Vec<u8>>,
) -> Result<Vec<Vec<u8>>> {
    let deadline = Instant::now() + bound;
    if launch.rank == 0 {
        lead(launch, digest, deadline, blob)
    } else {
        join(launch, digest, deadline, blob)
    }
}

fn remaining(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

fn lead(
    launch: &Launch,
    digest: u64,
    deadline: Instant,
    blob: impl FnOnce(IpAddr) -> Result<Vec<u8>>,
) -> Result<Vec<Vec<u8>>> {
    let listener = TcpListener::bind(launch.rendezvous).map_err(|e| {
        Error::os(
            format!("listening at the rendezvous {}", launch.rendezvous),
            e,
        )
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::os("rendezvous listener", e))?;
    let size = usize::from(launch.size);
    let mut blobs: Vec<Option<Vec<u8>>> = vec![None; size];
    blobs[0] = Some(blob(launch.rendezvous.ip())?);
    let mut streams: Vec<TcpStream> = Vec::new();
    let result = (|| {
        while streams.len() + 1 < size {
            let mut stream = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing: Vec<String> = (0..size)
                            .filter(|r| blobs[*r].is_none())
                            .map(|r| r.to_string())
                            .collect();
                        return Err(Error::peer(
                            missing.first().and_then(|r| r.parse().ok()).unwrap_or(0),
                            format!(
                                "never joined (missing: nodes {}; bound DSM_TIMEOUT_MS)",
                                missing.join(", ")
                            ),
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                Err(e) => return Err(Error::os("accepting at the rendezvous", e)),
            };
            stream
                .set_nonblocking(false)
                .and_then(|_| stream.set_read_timeout(Some(remaining(deadline))))
                .map_err(|e| Error::os("rendezvous connection", e))?;
            let join = read_frame(&mut stream)?;
            let (rank, their_size, their_digest, theirs) = parse_join(&join)?;
            let theirs = theirs.to_vec();
            if their_size != launch.size {
                return Err(Error::Config(format!(
                    "node {rank} was started for {their_size} nodes, node 0 for {}",
                    launch.size
                )));
            }
            if their_digest != digest {
                return Err(Error::Config(format!(
                    "node {rank}'s settings (transport, window, prefetch) differ from node 0's"
                )));
            }
            let slot = blobs
                .get_mut(usize::from(rank))
                .ok_or_else(|| Error::Config(format!("a node joined with rank {rank}")))?;
            if slot.is_some() {
                return Err(Error::Config(format!("two nodes joined with rank {rank}")));
            }
            *slot = Some(theirs);
            streams.push(stream);
        }
        Ok(())
    })();
    let mut reply = Writer::new();
    match &result {
        Ok(()) => {
            reply.u8(0);
            for b in blobs.iter().flatten() {
                reply.u32(b.len() as u32).bytes(b);
            }
        }
        Err(e) => {
            reply.u8(1).bytes(e.to_string().as_bytes());
        }
    }
    let reply = reply.done();
    for stream in &mut streams {
        let _ = write_frame(stream, &reply);
    }
    result?;
    Ok(blobs.into_iter().flatten().collect())
}

fn join(
    launch: &Launch,
    digest: u64,
    deadline: Instant,
    blob: impl FnOnce(IpAddr) -> Result<Vec<u8>>,
) -> Result<Vec<Vec<u8>>> {
    let mut stream = loop {
        match TcpStream::connect_timeout(&launch.rendezvous, remaining(deadline)) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => {
                return Err(Error::peer(
                    0,
                    format!("no rendezvous at {}: {e}", launch.rendezvous),
                ));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    stream
        .set_read_timeout(Some(remaining(deadline)))
        .map_err(|e| Error::os("rendezvous connection", e))?;
    let local = stream
        .local_addr()
        .map_err(|e| Error::os("rendezvous connection", e))?
        .ip();
    let mine = blob(local)?;
    let mut join = Writer::new();
    join.u16(launch.rank)
        .u16(launch.size)
        .u64(digest)
        .bytes(&mine);
    write_frame(&mut stream, &join.done())
        .map_err(|e| Error::peer(0, format!("the rendezvous closed: {e}")))?;
    let reply = read_frame(&mut stream).map_err(|e| match e {
        Error::Os { source, .. } if source.kind() == ErrorKind::WouldBlock => {
            Error::peer(0, "the other nodes did not all join in time".to_string())
        }
        other => other,
    })?;
    parse_join_reply(&reply, launch.size)
}

/// A join record: the node's rank, the job size it was started for, its settings' digest and
/// its blob.
pub(crate) fn parse_join(join: &[u8]) -> Result<(u16, u16, u64, &[u8])> {
    let mut r = Reader::new(join);
    let (rank, size, digest) = (r.u16()?, r.u16()?, r.u64()?);
    Ok((rank, size, digest, r.rest()))
}

/// Node 0's reply to a join: every node's blob (`size` of them), or the refusal's text as an
/// error.
pub(crate) fn parse_join_reply(reply: &[u8], size: u16) -> Result<Vec<Vec<u8>>> {
    let mut r = Reader::new(reply);
    if r.u8()? != 0 {
        let text = String::from_utf8_lossy(r.rest()).into_owned();
        return Err(Error::Config(format!("node 0 refused the job: {text}")));
    }
    let mut blobs = Vec::with_capacity(usize::from(size));
    for _ in 0..size {
        let len = r.u32()? as usize;
        blobs.push(r.take(len)?.to_vec());
    }
    r.finish()?;
    Ok(blobs)
}
