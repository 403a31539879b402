//! In-flight tables of the owned-buffer data path (`docs/data-path.md`): what each queue of a
//! queue pair holds while the device may use it, the request ids that find it again, and the
//! routes by which a completion queue reaches the tables of its queue pairs.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::buf::Buf;
use crate::error::{Error, Result};

/// The bit every owned request id has, and no other `wr_id` may have: the post paths refuse
/// `wr_id`s with it set, so a completion of another request can never be taken for an owned
/// one.
pub(crate) const OWNED_ID_BIT: u64 = 1 << 63;

/// The bit the ids of receives have (a queue pair's receive queue, or an SRQ), so that a
/// completion goes straight to the table that can hold its request. Only a hint of where to
/// look: every table still matches the whole id.
pub(crate) const RECV_ID_BIT: u64 = 1 << 62;

/// Ids are handed to tables in blocks of this many.
const BLOCK: u64 = 1 << 16;
/// The next block of ids, for the whole process. Blocks are numbered from 0; block `b` holds
/// ids `OWNED_ID_BIT | b * BLOCK ..` (with [`RECV_ID_BIT`] for a receive table), so there are
/// 2^46 blocks (2^62 ids) before the space runs out, which it refuses to do rather than wrap.
static NEXT_BLOCK: AtomicU64 = AtomicU64::new(0);
const BLOCKS: u64 = RECV_ID_BIT / BLOCK;

/// A table's source of ids: no two requests of the process ever get the same id.
#[derive(Debug)]
struct IdSource {
    next: u64,
    end: u64,
    /// [`RECV_ID_BIT`] for a receive table, else 0.
    kind: u64,
}

impl IdSource {
    const fn new(recv: bool) -> Self {
        Self {
            next: 0,
            end: 0,
            kind: if recv { RECV_ID_BIT } else { 0 },
        }
    }

    fn next(&mut self) -> Result<u64> {
        if self.next == self.end {
            let block = NEXT_BLOCK
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                    (b < BLOCKS).then_some(b + 1)
                })
                .map_err(|_| {
                    Error::InvalidArgument("the process has used every owned request id".into())
                })?;
            self.next = OWNED_ID_BIT | self.kind | (block * BLOCK);
            self.end = self.next + BLOCK;
        }
        let id = self.next;
        self.next += 1;
        Ok(id)
    }
}

/// What the device may use while a request is in flight, and what the completion returns.
pub(crate) struct Entry {
    pub(crate) id: u64,
    pub(crate) tag: u64,
    pub(crate) buf: Option<Buf>,
    /// What else the device may use while the request is in flight (a UD send's address
    /// handle), kept alive until it is done.
    pub(crate) keep: Option<Arc<dyn Send + Sync>>,
    /// A receive (its buffer's length becomes the bytes received).
    pub(crate) recv: bool,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("id", &self.id)
            .field("tag", &self.tag)
            .field("buf", &self.buf)
            .field("keeps_alive", &self.keep.is_some())
            .field("recv", &self.recv)
            .finish()
    }
}

/// The in-flight requests of one queue (a queue pair's send or receive queue), in posting
/// order: such a queue completes in order, so a completion releases every request before
/// its own too (unsignaled sends).
#[derive(Debug)]
pub(crate) struct Ring {
    state: Mutex<RingState>,
    /// A receive queue's ring.
    recv: bool,
}

#[derive(Debug)]
struct RingState {
    ids: IdSource,
    /// At most `capacity` entries; its storage is allocated once, at creation.
    entries: VecDeque<Entry>,
    capacity: usize,
}

impl Ring {
    pub(crate) fn new(capacity: u32, recv: bool) -> Self {
        let capacity = capacity as usize;
        Self {
            state: Mutex::new(RingState {
                ids: IdSource::new(recv),
                entries: VecDeque::with_capacity(capacity),
                capacity,
            }),
            recv,
        }
    }

    fn lock(&self) -> MutexGuard<'_, RingState> {
        // Every change is a single step (push, pop, drain), so a panic elsewhere while the lock
        // was held cannot leave the ring inconsistent.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records a request about to be posted and returns its id, and whether it took the ring's
    /// last free slot (the send path then makes it signaled, or unsignaled requests could
    /// fill the queue with nothing left to release them); the request must be posted
    /// only after this returns, so that its completion finds it. Gives `buf` back when the
    /// queue is full (as many requests in flight as the queue pair holds) or the ids ran out.
    pub(crate) fn push(
        &self,
        tag: u64,
        buf: Option<Buf>,
        keep: Option<Arc<dyn Send + Sync>>,
    ) -> std::result::Result<(u64, bool), (Error, Option<Buf>)> {
        let mut state = self.lock();
        if state.entries.len() >= state.capacity {
            return Err((
                Error::QueueFull {
                    verb: "owned post",
                    index: 0,
                },
                buf,
            ));
        }
        let id = match state.ids.next() {
            Ok(id) => id,
            Err(error) => return Err((error, buf)),
        };
        // Below capacity: no reallocation.
        state.entries.push_back(Entry {
            id,
            tag,
            buf,
            keep,
            recv: self.recv,
        });
        Ok((id, state.entries.len() == state.capacity))
    }

    /// Takes back the request `id` recorded last, whose post the provider refused.
    pub(crate) fn unpush(&self, id: u64) -> Option<Entry> {
        let mut state = self.lock();
        match state.entries.back() {
            Some(last) if last.id == id => state.entries.pop_back(),
            _ => None,
        }
    }

    /// The completion of request `id`: takes it and releases every request before it (their
    /// buffers return to their pools). `None` if `id` is not in flight here (a stale
    /// completion, or another queue's).
    pub(crate) fn complete(&self, id: u64) -> Option<Entry> {
        let mut state = self.lock();
        // Usually the oldest request (every request signaled, or this the first signaled one
        // after unsignaled ones were released): no scan, no drain.
        if state.entries.front().is_some_and(|e| e.id == id) {
            return state.entries.pop_front();
        }
        let position = state.entries.iter().position(|e| e.id == id)?;
        state.entries.drain(..position);
        state.entries.pop_front()
    }

    /// Releases every request: called once the device no longer uses any (the queue pair was
    /// reset or destroyed).
    pub(crate) fn clear(&self) {
        self.lock().entries.clear();
    }

    /// Requests in flight.
    pub(crate) fn len(&self) -> usize {
        self.lock().entries.len()
    }
}

/// The in-flight receives of a shared receive queue. They complete in any order (each in the
/// completion queue of the queue pair that consumed it), so entries are found by id in an
/// open-addressing table (linear probing, backward-shift deletion), twice the queue's size,
/// allocated once.
#[derive(Debug)]
pub(crate) struct SrqTable {
    state: Mutex<SrqState>,
}

#[derive(Debug)]
struct SrqState {
    ids: IdSource,
    slots: Vec<Option<Entry>>,
    /// `slots.len() - 1`; the length is a power of two.
    mask: usize,
    len: usize,
    capacity: usize,
}

impl SrqState {
    fn home(&self, id: u64) -> usize {
        // Ids of one table come in runs of consecutive numbers: their low bits spread them.
        (id ^ (id >> 32)) as usize & self.mask
    }

    fn find(&self, id: u64) -> Option<usize> {
        let mut i = self.home(id);
        loop {
            match &self.slots[i] {
                None => return None,
                Some(entry) if entry.id == id => return Some(i),
                Some(_) => i = (i + 1) & self.mask,
            }
        }
    }

    fn remove(&mut self, id: u64) -> Option<Entry> {
        let mut hole = self.find(id)?;
        let entry = self.slots[hole].take();
        self.len -= 1;
        // Backward-shift deletion: move later entries of the probe run into the hole when
        // their home is not between the hole and where they are, so lookups stay correct.
        let mut j = hole;
        loop {
            j = (j + 1) & self.mask;
            let Some(next) = &self.slots[j] else { break };
            let home = self.home(next.id);
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.slots[hole] = self.slots[j].take();
                hole = j;
            }
        }
        entry
    }
}

impl SrqTable {
    /// Room for `capacity` receives (the SRQ's `max_wr`) in twice as many slots, rounded up
    /// to a power of two: about 112 bytes per receive, allocated here, once. At most 2^30
    /// receives are tracked; an SRQ granted more takes at most that many owned receives.
    pub(crate) fn new(capacity: u32) -> Self {
        let capacity = (capacity as usize).clamp(1, 1 << 30);
        let size = (capacity * 2).next_power_of_two();
        let mut slots = Vec::with_capacity(size);
        slots.resize_with(size, || None);
        Self {
            state: Mutex::new(SrqState {
                ids: IdSource::new(true),
                slots,
                mask: size - 1,
                len: 0,
                capacity,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, SrqState> {
        // As `Ring::lock`: a removal's shifts complete before the lock is released, and
        // nothing in them panics.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// As [`Ring::push`], for a receive.
    pub(crate) fn push(
        &self,
        tag: u64,
        buf: Option<Buf>,
    ) -> std::result::Result<u64, (Error, Option<Buf>)> {
        let mut state = self.lock();
        if state.len >= state.capacity {
            return Err((
                Error::QueueFull {
                    verb: "owned post",
                    index: 0,
                },
                buf,
            ));
        }
        let id = match state.ids.next() {
            Ok(id) => id,
            Err(error) => return Err((error, buf)),
        };
        // At most half full: a free slot exists on the probe path.
        let mut i = state.home(id);
        while state.slots[i].is_some() {
            i = (i + 1) & state.mask;
        }
        state.slots[i] = Some(Entry {
            id,
            tag,
            buf,
            keep: None,
            recv: true,
        });
        state.len += 1;
        Ok(id)
    }

    /// Takes request `id` back (a refused post), or takes it with its completion: `None` if
    /// it is not in flight here.
    pub(crate) fn take(&self, id: u64) -> Option<Entry> {
        self.lock().remove(id)
    }

    /// Releases every request (the SRQ was destroyed).
    pub(crate) fn clear(&self) {
        let mut state = self.lock();
        state.slots.iter_mut().for_each(|slot| *slot = None);
        state.len = 0;
    }

    /// Requests in flight.
    pub(crate) fn len(&self) -> usize {
        self.lock().len
    }
}

/// The in-flight tables of one queue pair.
#[derive(Debug)]
pub(crate) struct QpTables {
    pub(crate) send: Ring,
    pub(crate) recv: Ring,
    /// The SRQ's table, for a queue pair that receives through one.
    pub(crate) srq: Option<Arc<SrqTable>>,
}

impl QpTables {
    pub(crate) fn new(max_send_wr: u32, max_recv_wr: u32, srq: Option<Arc<SrqTable>>) -> Self {
        Self {
            send: Ring::new(max_send_wr, false),
            recv: Ring::new(max_recv_wr, true),
            srq,
        }
    }

    /// Requests in flight in both queues.
    pub(crate) fn in_flight(&self) -> usize {
        self.send.len() + self.recv.len()
    }

    /// Releases everything (see [`Ring::clear`]).
    pub(crate) fn clear(&self) {
        self.send.clear();
        self.recv.clear();
    }
}

/// How a completion queue reaches the tables of a queue pair that completes into it.
#[derive(Debug)]
pub(crate) struct Route {
    pub(crate) qp_num: u32,
    pub(crate) tables: Arc<QpTables>,
    /// The queue pair's send queue completes here.
    pub(crate) send: bool,
    /// Its receive queue completes here.
    pub(crate) recv: bool,
}

/// The routes of one completion queue: written when a queue pair is created on it or
/// destroyed, read once per [`poll_each`](crate::CompletionQueue::poll_each) call.
#[derive(Debug, Default)]
pub(crate) struct Routes {
    routes: Mutex<Vec<Route>>,
}

impl Routes {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Vec<Route>> {
        self.routes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds a queue pair's route (or marks its other queue on the route it has here).
    pub(crate) fn add(&self, qp_num: u32, tables: &Arc<QpTables>, send: bool, recv: bool) {
        let mut routes = self.lock();
        if let Some(route) = routes.iter_mut().find(|r| Arc::ptr_eq(&r.tables, tables)) {
            route.send |= send;
            route.recv |= recv;
        } else {
            routes.push(Route {
                qp_num,
                tables: tables.clone(),
                send,
                recv,
            });
        }
    }

    /// Removes the route to `tables` (its queue pair was destroyed).
    pub(crate) fn remove(&self, tables: &Arc<QpTables>) {
        self.lock().retain(|r| !Arc::ptr_eq(&r.tables, tables));
    }
}

/// Finds the owned request a completion of queue pair `qp_num` with `wr_id` ends, among
/// `routes`: takes it from its table (releasing the requests before it). `None` for a
/// completion of no owned request.
pub(crate) fn take_completed(routes: &[Route], qp_num: u32, wr_id: u64) -> Option<Entry> {
    if wr_id & OWNED_ID_BIT == 0 {
        return None;
    }
    // Ids are unique in the process, so at most one table holds it; several routes share a
    // number only while a destroyed queue pair's route is being removed. The receive bit says
    // which queue's table to look in (an SRQ's, for a queue pair on one).
    let recv = wr_id & RECV_ID_BIT != 0;
    routes.iter().filter(|r| r.qp_num == qp_num).find_map(|r| {
        if !recv {
            return r.send.then(|| r.tables.send.complete(wr_id)).flatten();
        }
        if !r.recv {
            return None;
        }
        match &r.tables.srq {
            Some(srq) => srq.take(wr_id),
            None => r.tables.recv.complete(wr_id),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_marked() {
        let mut a = IdSource::new(false);
        let mut b = IdSource::new(true);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..(BLOCK as usize + 10) {
            let (send, recv) = (a.next().unwrap(), b.next().unwrap());
            assert_eq!(send & (OWNED_ID_BIT | RECV_ID_BIT), OWNED_ID_BIT);
            assert_eq!(
                recv & (OWNED_ID_BIT | RECV_ID_BIT),
                OWNED_ID_BIT | RECV_ID_BIT
            );
            for id in [send, recv] {
                assert!(seen.insert(id), "id {id:#x} handed out twice");
            }
        }
    }

    #[test]
    fn a_completion_releases_its_request_and_those_before_it() {
        let ring = Ring::new(4, false);
        let pushed: Vec<(u64, bool)> = (0..4)
            .map(|tag| ring.push(tag, None, None).unwrap())
            .collect();
        // Only the fourth takes the last free slot.
        let last: Vec<bool> = pushed.iter().map(|p| p.1).collect();
        assert_eq!(last, [false, false, false, true]);
        let ids: Vec<u64> = pushed.iter().map(|p| p.0).collect();
        let (error, _) = ring.push(9, None, None).unwrap_err();
        assert!(matches!(error, Error::QueueFull { .. }), "{error:?}");
        // Completing the third releases the first two (unsignaled) and returns the third.
        let entry = ring.complete(ids[2]).unwrap();
        assert_eq!(entry.tag, 2);
        assert_eq!(ring.len(), 1);
        // A stale or unknown id releases nothing.
        assert!(ring.complete(ids[0]).is_none());
        assert!(ring.complete(OWNED_ID_BIT | 12345).is_none());
        assert_eq!(ring.len(), 1);
        // Undoing a post works only for the last one pushed.
        let (last, _) = ring.push(5, None, None).unwrap();
        assert!(ring.unpush(ids[3]).is_none());
        assert_eq!(ring.unpush(last).unwrap().tag, 5);
        ring.clear();
        assert_eq!(ring.len(), 0);
    }

    #[test]
    fn only_owned_ids_are_looked_up() {
        let tables = Arc::new(QpTables::new(2, 2, None));
        let (id, _) = tables.recv.push(7, None, None).unwrap();
        let routes = vec![Route {
            qp_num: 5,
            tables: tables.clone(),
            send: false,
            recv: true,
        }];
        assert!(take_completed(&routes, 5, id & !OWNED_ID_BIT).is_none());
        assert!(
            take_completed(&routes, 6, id).is_none(),
            "another queue pair"
        );
        assert_eq!(take_completed(&routes, 5, id).unwrap().tag, 7);
        assert!(take_completed(&routes, 5, id).is_none(), "taken once");
    }
}

#[cfg(test)]
mod srq_tests {
    use super::*;

    /// Entries complete in any order and are all found; the table never holds more than its
    /// capacity; removals keep every other entry reachable (backward shift), over many rounds
    /// that wrap the probe sequences around the end of the slots.
    #[test]
    fn entries_are_found_in_any_order() {
        let table = SrqTable::new(8);
        let mut live: Vec<(u64, u64)> = Vec::new();
        let mut tag = 0u64;
        for round in 0..2000usize {
            while live.len() < 8 {
                let id = table.push(tag, None).unwrap();
                live.push((id, tag));
                tag += 1;
            }
            assert!(table.push(99, None).is_err(), "full at capacity");
            // Take one from a position that varies with the round.
            let (id, want) = live.remove((round * 5) % live.len());
            assert_eq!(table.take(id).unwrap().tag, want);
            assert!(table.take(id).is_none(), "taken once");
            for &(id, want) in &live {
                let state = table.lock();
                let i = state.find(id).expect("still reachable");
                assert_eq!(state.slots[i].as_ref().unwrap().tag, want);
            }
            assert_eq!(table.len(), live.len());
        }
        assert!(table.take(OWNED_ID_BIT | 1).is_none());
        table.clear();
        assert_eq!(table.len(), 0);
    }
}
