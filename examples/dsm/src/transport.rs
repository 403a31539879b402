//! The transports behind one interface: the client side's requests and page fetches, and the
//! server side's loop.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use rdma_verbs::shared::copy_to_shared;

use crate::error::{Error, Result};
use crate::home::Home;
use crate::launch::{Launch, TransportKind};
use crate::rdma::{self, RdmaLinks, RdmaServer};
use crate::region::PAGE;
use crate::shared::Shared;
use crate::tcp::{self, TcpLinks, TcpServer};
use crate::wire::{MAX_PAYLOAD, Msg, Op, Reader};

/// The client side.
#[derive(Debug)]
pub(crate) enum Links {
    Tcp(TcpLinks),
    Rdma(Box<RdmaLinks>),
}

/// The server side.
#[derive(Debug)]
pub(crate) enum Server {
    Tcp(TcpServer),
    Rdma(Box<RdmaServer>),
}

/// Meets the other nodes and connects with `shared.config.transport`.
pub(crate) fn connect(launch: &Launch, shared: &Arc<Shared>) -> Result<(Links, Server)> {
    let config = &shared.config;
    match config.transport {
        TransportKind::Tcp => {
            let (l, s) = tcp::connect(launch, config.digest(), config.timeout)?;
            Ok((Links::Tcp(l), Server::Tcp(s)))
        }
        kind => {
            let (l, s) = rdma::connect(launch, shared, kind == TransportKind::RdmaRead)?;
            Ok((Links::Rdma(Box::new(l)), Server::Rdma(Box::new(s))))
        }
    }
}

/// A `Pages` reply's count and first page, read from its start (the pages follow on TCP).
pub(crate) fn parse_pages_head(r: &mut Reader<'_>) -> Result<(u16, u32)> {
    Ok((r.u16()?, r.u32()?))
}

impl Server {
    /// Serves until every node has left or `stop` is signalled.
    pub(crate) fn run(self, home: Home, shared: &Shared, stop: &OwnedFd) -> Result<()> {
        match self {
            Server::Tcp(s) => s.run(home, &shared.region, stop),
            Server::Rdma(s) => s.run(home, stop),
        }
    }
}

/// Checks that `reply` answers `request` with `expected`; a `Fail` reply becomes its error.
pub(crate) fn check_reply(request: &Msg, reply: Msg, expected: Op) -> Result<Msg> {
    if reply.op == Op::Fail {
        return Err(reply.into_error(expected));
    }
    if reply.op != expected || reply.seq != request.seq || reply.from != request.to {
        return Err(Error::protocol(format!(
            "node {} answered request {} ({:?}) with {:?} for request {}",
            reply.from, request.seq, request.op, reply.op, reply.seq
        )));
    }
    Ok(reply)
}

impl Links {
    /// The largest payload a message may carry.
    pub(crate) fn max_payload(&self) -> usize {
        match self {
            Links::Tcp(_) => MAX_PAYLOAD,
            Links::Rdma(_) => rdma::MSG_MAX - crate::wire::HEADER_LEN,
        }
    }

    /// Sends a request and returns its reply, checked to be `expected`.
    pub(crate) fn call(&mut self, msg: &Msg, expected: Op, bound: Duration) -> Result<Msg> {
        let reply = match self {
            Links::Tcp(l) => l.call(msg, bound)?,
            Links::Rdma(l) => l.call(msg, bound)?,
        };
        check_reply(msg, reply, expected)
    }

    /// Sends every request of `msgs` (at most one to each node) and then waits once for all
    /// their replies, each checked to be `expected`; returns them in `msgs`' order.
    pub(crate) fn call_all(
        &mut self,
        msgs: &[Msg],
        expected: Op,
        bound: Duration,
    ) -> Result<Vec<Msg>> {
        let replies = match self {
            Links::Tcp(l) => l.call_all(msgs, bound)?,
            Links::Rdma(l) => l.call_all(msgs, bound)?,
        };
        msgs.iter()
            .zip(replies)
            .map(|(msg, reply)| check_reply(msg, reply, expected))
            .collect()
    }

    /// Sends a message that has no reply.
    pub(crate) fn send(&mut self, msg: &Msg, bound: Duration) -> Result<()> {
        match self {
            Links::Tcp(l) => l.send(msg),
            Links::Rdma(l) => l.send(msg, bound),
        }
    }

    /// Fills the frames of pages `first..first + count` from their home, `msg.to` (`msg` is
    /// the `GetPage` request; `rdma-read` does not send it).
    pub(crate) fn fetch(
        &mut self,
        shared: &Shared,
        msg: &Msg,
        first: u32,
        count: u16,
        bound: Duration,
    ) -> Result<()> {
        let reply = match self {
            Links::Tcp(l) => l.call(msg, bound)?,
            Links::Rdma(l) => l.fetch(msg, first, count, bound)?,
        };
        let reply = check_reply(msg, reply, Op::Pages)?;
        let mut r = Reader::new(&reply.payload);
        let (got, at) = parse_pages_head(&mut r)?;
        if (got, at) != (count, first) {
            return Err(Error::protocol(format!(
                "node {} sent pages {at}..+{got} for a request of {first}..+{count}",
                msg.to
            )));
        }
        if let Links::Tcp(_) = self {
            let bytes = r.take(usize::from(count) * PAGE)?;
            let frame = shared
                .region
                .frame(first as usize)
                .filter(|_| first as usize + usize::from(count) <= shared.region.pages())
                .ok_or_else(|| {
                    Error::protocol(format!("pages {first}..+{count} are outside the window"))
                })?;
            // SAFETY: `count` whole frames of the alias whose window pages are inaccessible
            // (the pages are invalid here), so only this thread touches them; atomic stores.
            unsafe { copy_to_shared(bytes, frame) };
        }
        r.finish()
    }
}
