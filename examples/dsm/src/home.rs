//! The serving side of a node, the same under every transport: its home pages (`GetPage`,
//! `Diff`), the locks it manages (lock `i` on node `i mod N`), and on node 0 the collective
//! calls. It never waits for another node: a request that cannot be answered yet (a held
//! lock, a barrier not everyone reached) is answered later, when the message that frees it
//! arrives. So no cycle of waits can run through two servers.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use rdma_verbs::shared::copy_to_shared;

use crate::error::{Error, Result};
use crate::region::PAGE;
use crate::shared::Shared;
use crate::wire::{FailKind, Msg, Op, Reader, Writer};

/// What a collective call is, for messages and error texts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    Barrier = 1,
    Alloc = 2,
    Gather = 3,
    Finalize = 4,
}

/// If the calls (one per node, by rank) differ, who called what: groups of equal calls in
/// order of their lowest rank, e.g. "nodes 0, 1 called alloc (collective call 2); node 2
/// called alloc (collective call 2) with other arguments".
fn unequal(calls: &[&Arrival]) -> Option<String> {
    let key = |a: &Arrival| (a.kind, a.number, a.digest);
    if calls.iter().all(|a| key(a) == key(calls[0])) {
        return None;
    }
    let mut groups: Vec<(Vec<usize>, &Arrival)> = Vec::new();
    for (rank, a) in calls.iter().enumerate() {
        match groups.iter_mut().find(|(_, g)| key(g) == key(a)) {
            Some((ranks, _)) => ranks.push(rank),
            None => groups.push((vec![rank], a)),
        }
    }
    let parts: Vec<String> = groups
        .iter()
        .enumerate()
        .map(|(i, (ranks, a))| {
            let who = match ranks.as_slice() {
                [one] => format!("node {one}"),
                many => format!(
                    "nodes {}",
                    many.iter()
                        .map(|r| r.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            let same_call = groups[..i]
                .iter()
                .any(|(_, g)| (g.kind, g.number) == (a.kind, a.number));
            let other = if same_call {
                " with other arguments"
            } else {
                ""
            };
            format!(
                "{who} called {} (collective call {}){other}",
                a.kind.name(),
                a.number
            )
        })
        .collect();
    Some(parts.join("; "))
}

impl Kind {
    pub(crate) fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Barrier,
            2 => Kind::Alloc,
            3 => Kind::Gather,
            4 => Kind::Finalize,
            _ => return None,
        })
    }
    fn name(self) -> &'static str {
        match self {
            Kind::Barrier => "barrier",
            Kind::Alloc => "alloc",
            Kind::Gather => "stats gather",
            Kind::Finalize => "finalize",
        }
    }
}

#[derive(Debug)]
struct Arrival {
    seq: u32,
    kind: Kind,
    number: u32,
    digest: u64,
    data: Vec<u8>,
}

#[derive(Debug)]
struct Pending {
    arrived: Vec<Option<Arrival>>,
}

#[derive(Debug, Default)]
struct Lock {
    holder: Option<u16>,
    waiters: VecDeque<(u16, u32)>,
}

/// A reply to send: a message, and for `Pages` the frames to append to its payload (the first
/// page and the count; the transport sends them from the frames, copying or not).
#[derive(Debug)]
pub(crate) struct Out {
    pub(crate) msg: Msg,
    pub(crate) pages: Option<(u32, u16)>,
}

impl From<Msg> for Out {
    fn from(msg: Msg) -> Out {
        Out { msg, pages: None }
    }
}

impl Out {
    /// The header, its length counting the appended frames.
    pub(crate) fn header(&self) -> crate::wire::Header {
        let mut h = self.msg.header();
        if let Some((_, count)) = self.pages {
            h.len = h.len.saturating_add(u32::from(count) * PAGE as u32);
        }
        h
    }
}

/// A `GetPage` request's first page and count (at least 1).
pub(crate) fn parse_get_page(payload: &[u8]) -> Result<(u32, u16)> {
    let mut r = Reader::new(payload);
    let (first, count) = (r.u32()?, r.u16()?);
    r.finish()?;
    if count == 0 {
        return Err(Error::protocol("a request for 0 pages"));
    }
    Ok((first, count))
}

/// The lock an `Acquire`, `Granted` or `Release` names.
pub(crate) fn parse_lock(payload: &[u8]) -> Result<u32> {
    let mut r = Reader::new(payload);
    let id = r.u32()?;
    r.finish()?;
    Ok(id)
}

/// A `Collective` call's kind, call number, digest and contribution.
pub(crate) fn parse_collective(payload: &[u8]) -> Result<(Kind, u32, u64, &[u8])> {
    let mut r = Reader::new(payload);
    let kind = r.u8()?;
    let kind =
        Kind::from_u8(kind).ok_or_else(|| Error::protocol(format!("collective kind {kind}")))?;
    let (number, digest) = (r.u32()?, r.u64()?);
    Ok((kind, number, digest, r.rest()))
}

/// One run of a `Diff`: its page, its offset in the page and its bytes.
pub(crate) type DiffRun<'a> = (usize, usize, &'a [u8]);

/// A `Diff` payload's page count and runs, each run checked to lie in its page and each page
/// by `home_page` (which returns its index).
pub(crate) fn parse_diff(
    payload: &[u8],
    home_page: impl Fn(u32) -> Result<usize>,
) -> Result<(u16, Vec<DiffRun<'_>>)> {
    let mut r = Reader::new(payload);
    let count = r.u16()?;
    let mut runs = Vec::new();
    for _ in 0..count {
        let page = home_page(r.u32()?)?;
        let n = r.u16()?;
        for _ in 0..n {
            let (offset, len) = (usize::from(r.u16()?), usize::from(r.u16()?));
            if offset + len > PAGE {
                return Err(Error::protocol(format!(
                    "a diff run {offset}..+{len} of page {page} passes its end"
                )));
            }
            runs.push((page, offset, r.take(len)?));
        }
    }
    r.finish()?;
    Ok((count, runs))
}

/// A node's serving state.
#[derive(Debug)]
pub(crate) struct Home {
    me: u16,
    size: u16,
    shared: Arc<Shared>,
    locks: HashMap<u32, Lock>,
    pending: Option<Pending>,
    /// Unequal collective calls were seen: every later collective call fails with this.
    broken: Option<String>,
    exited: Vec<bool>,
    dead: Option<(u16, String)>,
}

impl Home {
    pub(crate) fn new(shared: Arc<Shared>) -> Home {
        Home {
            me: shared.rank,
            size: shared.size,
            locks: HashMap::new(),
            pending: None,
            broken: None,
            exited: vec![false; usize::from(shared.size)],
            dead: None,
            shared,
        }
    }

    /// Whether every node said it leaves (or died).
    pub(crate) fn done(&self) -> bool {
        self.exited.iter().all(|e| *e)
    }

    /// Serves one message; replies (to any node) go to `out`.
    pub(crate) fn handle(&mut self, msg: Msg, out: &mut Vec<Out>) {
        if usize::from(msg.from) >= usize::from(self.size) {
            return; // The transport checks senders; nothing to answer.
        }
        if let Err(error) = self.serve(&msg, out) {
            let kind = match error {
                Error::UnequalCollective(_) => FailKind::Unequal,
                Error::Peer { .. } => FailKind::Peer,
                _ => FailKind::Protocol,
            };
            let (rank, text) = match &error {
                Error::Peer { rank, what } => (*rank, what.clone()),
                Error::UnequalCollective(text) => (self.me, text.clone()),
                other => (self.me, other.to_string()),
            };
            out.push(Out::from(msg.fail(self.me, kind, rank, &text)));
        }
    }

    fn reply(&self, to: &Msg, op: Op, payload: Vec<u8>) -> Msg {
        let mut m = Msg::new(op, self.me, to.from).with(payload);
        m.seq = to.seq;
        m
    }

    fn serve(&mut self, msg: &Msg, out: &mut Vec<Out>) -> Result<()> {
        match msg.op {
            Op::GetPage => {
                let reply = self.get_pages(msg)?;
                out.push(reply);
            }
            Op::Diff => {
                self.apply_diff(&msg.payload)?;
                out.push(Out::from(self.reply(msg, Op::DiffAck, Vec::new())));
            }
            Op::Acquire => self.acquire(msg, out)?,
            Op::Release => self.release(msg, out)?,
            Op::Collective => self.collective(msg, out)?,
            Op::Exit => self.exit(msg.from, out),
            other => return Err(Error::protocol(format!("a {other:?} message as a request"))),
        }
        Ok(())
    }

    fn home_page(&self, page: u32) -> Result<usize> {
        let layout = self.shared.layout.read().unwrap_or_else(|p| p.into_inner());
        match layout.home.get(page as usize) {
            Some(&h) if h == self.me => Ok(page as usize),
            Some(&h) => Err(Error::protocol(format!(
                "page {page} asked of node {} but its home is node {h}",
                self.me
            ))),
            None => Err(Error::protocol(format!(
                "page {page} is not allocated ({} pages are)",
                layout.home.len()
            ))),
        }
    }

    fn get_pages(&self, msg: &Msg) -> Result<Out> {
        let (first, count) = parse_get_page(&msg.payload)?;
        for i in 0..u32::from(count) {
            let page = first
                .checked_add(i)
                .ok_or_else(|| Error::protocol("page numbers past 2^32"))?;
            self.home_page(page)?;
        }
        self.shared
            .pages_served
            .fetch_add(u64::from(count), Ordering::Relaxed);
        let mut w = Writer::with_capacity(6);
        w.u16(count).u32(first);
        Ok(Out {
            msg: self.reply(msg, Op::Pages, w.done()),
            pages: Some((first, count)),
        })
    }

    /// Applies a `Diff` payload to home frames; checks every page and run before writing.
    pub(crate) fn apply_diff(&self, payload: &[u8]) -> Result<()> {
        let (count, runs) = parse_diff(payload, |page| self.home_page(page))?;
        for (page, offset, bytes) in runs {
            let Some(frame) = self.shared.region.frame(page) else {
                continue; // home_page checked it lies in the window
            };
            // SAFETY: `offset + len <= PAGE` inside a frame of the alias; atomic stores only
            // (region.rs).
            unsafe { copy_to_shared(bytes, frame.wrapping_add(offset)) };
        }
        self.shared
            .diffs_applied
            .fetch_add(u64::from(count), Ordering::Relaxed);
        Ok(())
    }

    fn dead_error(&self) -> Result<()> {
        match &self.dead {
            Some((rank, what)) => Err(Error::peer(*rank, what.clone())),
            None => Ok(()),
        }
    }

    fn lock_id(&self, msg: &Msg) -> Result<u32> {
        let id = parse_lock(&msg.payload)?;
        if id % u32::from(self.size) != u32::from(self.me) {
            return Err(Error::protocol(format!(
                "lock {id} is managed by node {}, not {}",
                id % u32::from(self.size),
                self.me
            )));
        }
        Ok(id)
    }

    fn acquire(&mut self, msg: &Msg, out: &mut Vec<Out>) -> Result<()> {
        self.dead_error()?;
        let id = self.lock_id(msg)?;
        let lock = self.locks.entry(id).or_default();
        match lock.holder {
            None => {
                lock.holder = Some(msg.from);
                out.push(Out::from(self.reply(
                    msg,
                    Op::Granted,
                    id.to_le_bytes().to_vec(),
                )));
            }
            Some(holder) if holder == msg.from => {
                return Err(Error::protocol(format!(
                    "node {holder} asked for lock {id}, which it holds"
                )));
            }
            Some(_) => lock.waiters.push_back((msg.from, msg.seq)),
        }
        Ok(())
    }

    fn release(&mut self, msg: &Msg, out: &mut Vec<Out>) -> Result<()> {
        let id = self.lock_id(msg)?;
        let lock = self.locks.entry(id).or_default();
        if lock.holder != Some(msg.from) {
            return Err(Error::protocol(format!(
                "node {} released lock {id}, which it does not hold",
                msg.from
            )));
        }
        lock.holder = None;
        if let Some((next, seq)) = lock.waiters.pop_front() {
            lock.holder = Some(next);
            let mut granted = Msg::new(Op::Granted, self.me, next).with(id.to_le_bytes().to_vec());
            granted.seq = seq;
            out.push(Out::from(granted));
        }
        Ok(())
    }

    /// A collective call arrives. Once every node's has, they are compared: all the same,
    /// and every node gets every contribution; otherwise every node gets the same
    /// description of who called what.
    fn collective(&mut self, msg: &Msg, out: &mut Vec<Out>) -> Result<()> {
        if self.me != 0 {
            return Err(Error::protocol(
                "a collective call sent to a node other than 0",
            ));
        }
        self.dead_error()?;
        if let Some(text) = &self.broken {
            return Err(Error::UnequalCollective(text.clone()));
        }
        let (kind, number, digest, data) = parse_collective(&msg.payload)?;
        let data = data.to_vec();
        let size = usize::from(self.size);
        let pending = self.pending.get_or_insert_with(|| Pending {
            arrived: (0..size).map(|_| None).collect(),
        });
        let slot = &mut pending.arrived[usize::from(msg.from)];
        if slot.is_some() {
            return Err(Error::protocol(format!(
                "node {} made collective call {number} twice",
                msg.from
            )));
        }
        *slot = Some(Arrival {
            seq: msg.seq,
            kind,
            number,
            digest,
            data,
        });
        if !pending.arrived.iter().all(Option::is_some) {
            return Ok(());
        }
        let pending = self.pending.take().expect("checked above");
        let calls: Vec<&Arrival> = pending.arrived.iter().flatten().collect();
        if let Some(text) = unequal(&calls) {
            self.pending = Some(pending);
            self.fail_collective(FailKind::Unequal, self.me, &text, out);
            self.broken = Some(text);
            return Ok(());
        }
        let mut w = Writer::new();
        w.u16(self.size);
        for a in &calls {
            w.u32(a.data.len() as u32).bytes(&a.data);
        }
        let payload = w.done();
        for (rank, a) in calls.iter().enumerate() {
            let mut done = Msg::new(Op::CollectiveDone, self.me, rank as u16).with(payload.clone());
            done.seq = a.seq;
            out.push(Out::from(done));
        }
        Ok(())
    }

    /// Fails every node waiting in the pending collective call.
    fn fail_collective(&mut self, kind: FailKind, rank: u16, text: &str, out: &mut Vec<Out>) {
        if let Some(pending) = self.pending.take() {
            for (from, a) in pending.arrived.iter().enumerate() {
                if let Some(a) = a {
                    let mut req = Msg::new(Op::Collective, from as u16, self.me);
                    req.seq = a.seq;
                    out.push(Out::from(req.fail(self.me, kind, rank, text)));
                }
            }
        }
    }

    /// Marks node `rank` gone (left or died), and tells the node's threads once every other
    /// node is.
    fn gone(&mut self, rank: u16) {
        self.exited[usize::from(rank)] = true;
        let me = usize::from(self.me);
        if self
            .exited
            .iter()
            .enumerate()
            .all(|(rank, gone)| *gone || rank == me)
        {
            self.shared.others_gone.store(true, Ordering::Release);
        }
    }

    fn exit(&mut self, from: u16, out: &mut Vec<Out>) {
        self.gone(from);
        let waiting = self
            .pending
            .as_ref()
            .is_some_and(|p| p.arrived[usize::from(from)].is_none());
        if waiting {
            self.fail_collective(
                FailKind::Peer,
                from,
                "left without making the collective call the others wait in",
                out,
            );
        }
    }

    /// Node `rank`'s connection closed without an `Exit`: it died. Every waiter here fails.
    pub(crate) fn closed(&mut self, rank: u16, out: &mut Vec<Out>) {
        if self.exited[usize::from(rank)] {
            return;
        }
        self.gone(rank);
        let what = "died (its connection closed without it leaving)".to_string();
        self.fail_collective(FailKind::Peer, rank, &what, out);
        for lock in self.locks.values_mut() {
            for (waiter, seq) in lock.waiters.drain(..) {
                let mut req = Msg::new(Op::Acquire, waiter, self.me);
                req.seq = seq;
                out.push(Out::from(req.fail(self.me, FailKind::Peer, rank, &what)));
            }
        }
        self.dead = Some((rank, what));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(kind: Kind, number: u32, digest: u64) -> Arrival {
        Arrival {
            seq: 0,
            kind,
            number,
            digest,
            data: Vec::new(),
        }
    }

    #[test]
    fn unequal_calls_are_described_by_rank_whatever_the_order() {
        let same = [call(Kind::Barrier, 3, 0), call(Kind::Barrier, 3, 0)];
        assert_eq!(unequal(&same.iter().collect::<Vec<_>>()), None);
        let args = [
            call(Kind::Alloc, 1, 7),
            call(Kind::Alloc, 1, 7),
            call(Kind::Alloc, 1, 9),
        ];
        assert_eq!(
            unequal(&args.iter().collect::<Vec<_>>()).unwrap(),
            "nodes 0, 1 called alloc (collective call 1); node 2 called alloc (collective call 1) \
             with other arguments"
        );
        let kinds = [
            call(Kind::Barrier, 2, 0),
            call(Kind::Alloc, 2, 5),
            call(Kind::Barrier, 2, 0),
        ];
        assert_eq!(
            unequal(&kinds.iter().collect::<Vec<_>>()).unwrap(),
            "nodes 0, 2 called barrier (collective call 2); node 1 called alloc (collective call 2)"
        );
        let counts = [call(Kind::Barrier, 4, 0), call(Kind::Barrier, 5, 0)];
        assert_eq!(
            unequal(&counts.iter().collect::<Vec<_>>()).unwrap(),
            "node 0 called barrier (collective call 4); node 1 called barrier (collective call 5)"
        );
    }
}
