//! In-flight tables of the owned-buffer data path (`docs/data-path.md`): what each queue of a
//! queue pair holds while the device may use it, the request ids that find it again, and the
//! routes by which a completion queue reaches the tables of its queue pairs.

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::buf::Buf;
use crate::error::{Error, Result};
use crate::spin::SpinLock;

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

    #[inline]
    fn next(&mut self) -> Result<u64> {
        if self.next == self.end {
            self.next_block()?;
        }
        let id = self.next;
        self.next += 1;
        Ok(id)
    }

    /// Takes the next block of ids from the process's counter: once per 65,536 ids.
    #[cold]
    #[inline(never)]
    fn next_block(&mut self) -> Result<()> {
        let block = NEXT_BLOCK
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                (b < BLOCKS).then_some(b + 1)
            })
            .map_err(|_| {
                Error::InvalidArgument("the process has used every owned request id".into())
            })?;
        self.next = OWNED_ID_BIT | self.kind | (block * BLOCK);
        self.end = self.next + BLOCK;
        Ok(())
    }
}

/// What the device may use while a request is in flight, and what the completion returns.
pub(crate) struct Entry {
    pub(crate) id: u64,
    pub(crate) tag: u64,
    pub(crate) buf: Option<Buf>,
    /// What else the device may use while the request is in flight (a UD send's address
    /// handle, the region a bind or a [`RegionRange`] names), kept alive until it is done.
    ///
    /// [`RegionRange`]: crate::RegionRange
    pub(crate) keep: Option<Arc<dyn Send + Sync>>,
}

impl Entry {
    /// Whether the request is a receive (its buffer's length becomes the bytes received):
    /// receive ids carry [`RECV_ID_BIT`].
    #[inline]
    pub(crate) fn is_recv(&self) -> bool {
        self.id & RECV_ID_BIT != 0
    }
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("id", &self.id)
            .field("tag", &self.tag)
            .field("buf", &self.buf)
            .field("keeps_alive", &self.keep.is_some())
            .finish()
    }
}

/// The in-flight requests of one queue (a queue pair's send or receive queue), in posting
/// order: such a queue completes in order, so a completion releases every request before
/// its own too (unsignaled sends).
///
/// A ring of slots, allocated once, between two positions that grow (`tail` moves back by one
/// only to undo a refused post): `head` (the oldest request in flight) and `tail` (one past
/// the newest). Two sides use it:
///
/// - the *poster*, the owner of the queue pair (it posts through `&mut`, and resets and
///   destroys the queue pair by value or `&mut`), so one thread at a time: [`push`](Self::push)
///   and [`unpush`](Self::unpush) are `unsafe` and require that. A push writes the slot at
///   `tail`, which no other code reads, and then publishes it by storing `tail + 1`; it takes
///   no lock.
/// - the *completers*: the completion queue's poller ([`complete`](Self::complete)), and
///   [`clear`](Self::clear) after a reset or destroy. They read and move out entries between
///   `head` and the `tail` they loaded, and store the new `head`, under `consumer`, a lock
///   taken once per completion.
///
/// The poster reuses a slot only once `head` has passed it (it loads `head` before writing),
/// so a slot is never written while a completer may read it; [`unpush`](Self::unpush) takes
/// back the newest entry, which completers may be scanning, so it takes the lock too.
pub(crate) struct Ring {
    slots: Box<[UnsafeCell<MaybeUninit<Entry>>]>,
    /// `slots.len() - 1`; the length is a power of two, at least `capacity`.
    mask: u64,
    /// At most this many requests in flight (the queue's size).
    capacity: u64,
    /// The oldest request in flight; stored only under `consumer`.
    head: AtomicU64,
    /// One past the newest request; stored only by the poster.
    tail: AtomicU64,
    consumer: SpinLock<()>,
    /// The poster's source of ids: used only by `push`.
    ids: UnsafeCell<IdSource>,
    /// A receive queue's ring.
    recv: bool,
}

// SAFETY: the slots between `head` and `tail` are read and moved out only under `consumer`;
// the slot at `tail` is written only by the poster (one thread at a time, the contract of
// `push`), after `head` has passed it, and published by the release store of `tail`, which
// completers load with acquire. `ids` is used only by `push`. What the entries hold
// (`Buf`, `Arc<dyn Send + Sync>`) is `Send`.
unsafe impl Sync for Ring {}
// SAFETY: as above; the entries are `Send`.
unsafe impl Send for Ring {}

impl Ring {
    pub(crate) fn new(capacity: u32, recv: bool) -> Self {
        let capacity = u64::from(capacity.max(1));
        let size = capacity.next_power_of_two();
        let slots = (0..size)
            .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
            .collect();
        Self {
            slots,
            mask: size - 1,
            capacity,
            head: AtomicU64::new(0),
            tail: AtomicU64::new(0),
            consumer: SpinLock::new(()),
            ids: UnsafeCell::new(IdSource::new(recv)),
            recv,
        }
    }

    /// The slot of position `position`.
    #[inline]
    fn slot(&self, position: u64) -> *mut MaybeUninit<Entry> {
        // In bounds: masked to the slots' length.
        self.slots[(position & self.mask) as usize].get()
    }

    /// Records a request about to be posted and returns its id, and whether it took the ring's
    /// last free slot (the send path then makes it signaled, or unsignaled requests could
    /// fill the queue with nothing left to release them); the request must be posted
    /// only after this returns, so that its completion finds it. Gives `buf` back when the
    /// queue is full (as many requests in flight as the queue pair holds) or the ids ran out.
    ///
    /// # Safety
    ///
    /// The caller is the ring's poster: no other call of `push` or `unpush` on this ring runs
    /// at the same time (the owner of the queue pair calls them, through `&mut`).
    #[inline(always)]
    pub(crate) unsafe fn push(
        &self,
        tag: u64,
        buf: Option<Buf>,
        keep: Option<Arc<dyn Send + Sync>>,
    ) -> std::result::Result<(u64, bool), (Error, Option<Buf>)> {
        // Only the poster stores `tail`: its own last store.
        let tail = self.tail.load(Ordering::Relaxed);
        // Acquire: the completers moved the entries before `head` out before storing it.
        let head = self.head.load(Ordering::Acquire);
        let in_flight = tail.wrapping_sub(head);
        if in_flight >= self.capacity {
            return Err(queue_full(buf));
        }
        // SAFETY: only `push` uses `ids`, and the caller guarantees one push at a time.
        let ids = unsafe { &mut *self.ids.get() };
        let id = match ids.next() {
            Ok(id) => id,
            Err(error) => return Err((error, buf)),
        };
        // SAFETY: the slot of `tail` held position `tail - slots.len()` at most, which is
        // before `head` (fewer than `capacity <= slots.len()` requests are in flight), so no
        // completer reads it (they stay between `head` and the `tail` they loaded) and its
        // entry was moved out; the caller is the only poster.
        unsafe {
            (*self.slot(tail)).write(Entry { id, tag, buf, keep });
        }
        // Release: the entry is written before completers can see it.
        self.tail.store(tail.wrapping_add(1), Ordering::Release);
        Ok((id, in_flight + 1 == self.capacity))
    }

    /// Takes back the request `id` recorded last, whose post the provider refused.
    ///
    /// # Safety
    ///
    /// As [`push`](Self::push): the caller is the ring's poster.
    pub(crate) unsafe fn unpush(&self, id: u64) -> Option<Entry> {
        let _consumer = self.consumer.lock();
        let head = self.head.load(Ordering::Relaxed);
        let tail = self.tail.load(Ordering::Relaxed);
        if tail == head {
            return None;
        }
        let last = tail.wrapping_sub(1);
        // SAFETY: `last` is between `head` and `tail`: its slot holds an entry, which
        // completers reach only under the lock held here; the poster (the caller) does not
        // write it meanwhile.
        let entry = unsafe { (*self.slot(last)).assume_init_ref() };
        if entry.id != id {
            return None;
        }
        // SAFETY: as above; `tail` moves back over the slot, so it is read once.
        let entry = unsafe { (*self.slot(last)).assume_init_read() };
        self.tail.store(last, Ordering::Release);
        Some(entry)
    }

    /// The completion of request `id`: takes it and releases every request before it (their
    /// buffers return to their pools). `None` if `id` is not in flight here (a stale
    /// completion, or another queue's).
    #[inline]
    pub(crate) fn complete(&self, id: u64) -> Option<Entry> {
        let _consumer = self.consumer.lock();
        let head = self.head.load(Ordering::Relaxed);
        // Acquire: the entries before `tail` were written before it was stored.
        let tail = self.tail.load(Ordering::Acquire);
        let mut position = head;
        // Usually the oldest request (every request signaled, or this the first signaled one
        // after unsignaled ones were released): found at once.
        while position != tail {
            // SAFETY: between `head` and `tail`, under the lock: an entry, not written by the
            // poster until `head` passes it.
            if unsafe { (*self.slot(position)).assume_init_ref() }.id == id {
                break;
            }
            position = position.wrapping_add(1);
        }
        if position == tail {
            return None;
        }
        if position != head {
            // SAFETY: under the lock, `head` is `head` and `position` is before the loaded
            // `tail`.
            unsafe { self.release(head, position) };
        }
        // SAFETY: as above; `head` moves past it below, so it is read once.
        let entry = unsafe { (*self.slot(position)).assume_init_read() };
        self.head.store(position.wrapping_add(1), Ordering::Release);
        Some(entry)
    }

    /// Drops the entries from `from` up to (not including) `to`, moving `head` past each one
    /// before dropping it: an entry's destructor that panics leaves `head` past that entry,
    /// so it is never dropped twice (by a later completion, a `clear`, or the ring's drop).
    ///
    /// # Safety
    ///
    /// The caller holds `consumer` (or `&mut self`), `from` is `head` and `to` at most the
    /// `tail` it loaded.
    unsafe fn release(&self, from: u64, to: u64) {
        let mut position = from;
        while position != to {
            // SAFETY: an entry between `head` and `tail` (the caller's contract); `head`
            // moves past it before it is dropped, so it is read once.
            let entry = unsafe { (*self.slot(position)).assume_init_read() };
            position = position.wrapping_add(1);
            self.head.store(position, Ordering::Release);
            drop(entry);
        }
    }

    /// Releases every request: called once the device no longer uses any (the queue pair was
    /// reset or destroyed).
    pub(crate) fn clear(&self) {
        let _consumer = self.consumer.lock();
        let head = self.head.load(Ordering::Relaxed);
        let tail = self.tail.load(Ordering::Acquire);
        // SAFETY: under the lock, from `head` to the loaded `tail`.
        unsafe { self.release(head, tail) };
    }

    /// Requests in flight.
    pub(crate) fn len(&self) -> usize {
        let head = self.head.load(Ordering::Acquire);
        let tail = self.tail.load(Ordering::Acquire);
        // `head` was loaded first and only grows; `tail` moves back only in `unpush`, and
        // never below `head`: the difference is not negative, but may be one too high while
        // an undo runs.
        tail.saturating_sub(head) as usize
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        let head = *self.head.get_mut();
        let tail = *self.tail.get_mut();
        // SAFETY: `&mut self`: nobody else uses the ring, and it is not used again.
        unsafe { self.release(head, tail) };
    }
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("in_flight", &self.len())
            .field("capacity", &self.capacity)
            .field("recv", &self.recv)
            .finish()
    }
}

/// The error of a post into a full table, with the buffer back.
#[cold]
fn queue_full(buf: Option<Buf>) -> (Error, Option<Buf>) {
    (
        Error::QueueFull {
            verb: "owned post",
            index: 0,
        },
        buf,
    )
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
        // A poisoned lock is used as it is: a removal's shifts complete before the lock is
        // released, and nothing in them panics.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// As [`Ring::push`], for a receive.
    pub(crate) fn push(
        &self,
        tag: u64,
        buf: Option<Buf>,
        keep: Option<Arc<dyn Send + Sync>>,
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
        state.slots[i] = Some(Entry { id, tag, buf, keep });
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
#[derive(Debug, Clone)]
pub(crate) struct Route {
    pub(crate) qp_num: u32,
    pub(crate) tables: Arc<QpTables>,
    /// The queue pair's send queue completes here.
    pub(crate) send: bool,
    /// Its receive queue completes here.
    pub(crate) recv: bool,
}

/// The routes of one completion queue: written when a queue pair is created on it or
/// destroyed; its poller reads them through a [`RouteCache`].
#[derive(Debug, Default)]
pub(crate) struct Routes {
    routes: Mutex<Vec<Route>>,
    /// Counts the changes of `routes`: a cache whose count differs reloads.
    generation: AtomicU64,
}

impl Routes {
    fn lock(&self) -> MutexGuard<'_, Vec<Route>> {
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
        // Release, under the lock: a cache that sees the new count reloads the new routes.
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Removes the route to `tables` (its queue pair was destroyed).
    pub(crate) fn remove(&self, tables: &Arc<QpTables>) {
        self.lock().retain(|r| !Arc::ptr_eq(&r.tables, tables));
        self.generation.fetch_add(1, Ordering::Release);
    }
}

/// A poller's copy of a completion queue's routes, reloaded when they change (a queue pair
/// created on the queue or destroyed), so that a completion finds its tables without a lock.
///
/// The copy is checked after every batch polled, before its completions are matched, and a
/// queue pair's route is added before it can post; and an owned completion that matches
/// nothing in the copy reloads it and looks again (see
/// [`take_completed`](Self::take_completed)), so no completion is missed for a copy too old.
/// A copy that still has a destroyed queue pair's route is harmless: a completion is matched
/// by its request's id, which is in flight in one table only, and a destroyed queue pair's
/// tables were emptied by its destruction.
#[derive(Debug)]
pub(crate) struct RouteCache {
    generation: u64,
    routes: Vec<Route>,
}

impl RouteCache {
    /// Routes a queue's copy has room for from its creation: reloading the copy allocates only
    /// when more queue pairs than this complete into the queue (once, when they are created),
    /// never per request.
    const ROOM: usize = 8;

    /// An empty copy with room for [`ROOM`](Self::ROOM) routes.
    pub(crate) fn new() -> Self {
        Self {
            generation: 0,
            routes: Vec::with_capacity(Self::ROOM),
        }
    }

    /// Reloads the copy if `routes` changed since it was taken: one load when they did not.
    #[inline]
    pub(crate) fn refresh(&mut self, routes: &Routes) {
        if routes.generation.load(Ordering::Acquire) != self.generation {
            self.reload(routes);
        }
    }

    #[cold]
    #[inline(never)]
    fn reload(&mut self, routes: &Routes) {
        let locked = routes.lock();
        // Reuses the copy's storage: allocates only when there are more routes than ever.
        self.routes.clone_from(&locked);
        self.generation = routes.generation.load(Ordering::Relaxed);
    }

    /// Finds the owned request a completion of queue pair `qp_num` with `wr_id` ends: takes
    /// it from its table (releasing the requests before it). `None` for a completion of no
    /// owned request.
    ///
    /// An owned id that matches nothing makes it reload the copy from `routes` and look once
    /// more: Rust's memory model does not order a route's addition (on the thread that created
    /// the queue pair) before the load of the change count that follows a poll, since what
    /// links them goes through the device. A stale completion (its request released by a reset
    /// or destroy) takes that path too, which costs a lock, not an allocation (the copy reuses
    /// its storage).
    #[inline]
    pub(crate) fn take_completed(
        &mut self,
        routes: &Routes,
        qp_num: u32,
        wr_id: u64,
    ) -> Option<Entry> {
        let entry = take_completed(&self.routes, qp_num, wr_id);
        if entry.is_some() || wr_id & OWNED_ID_BIT == 0 {
            return entry;
        }
        self.retry(routes, qp_num, wr_id)
    }

    /// [`take_completed`](Self::take_completed)'s second look, after a reload.
    #[cold]
    #[inline(never)]
    fn retry(&mut self, routes: &Routes, qp_num: u32, wr_id: u64) -> Option<Entry> {
        self.reload(routes);
        take_completed(&self.routes, qp_num, wr_id)
    }
}

/// Finds the owned request a completion of queue pair `qp_num` with `wr_id` ends, among
/// `routes`: takes it from its table (releasing the requests before it). `None` for a
/// completion of no owned request.
#[inline(always)]
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

    /// Records an entry with `tag` and no buffer; panics if the ring refuses it.
    pub(super) fn push(ring: &Ring, tag: u64) -> (u64, bool) {
        // SAFETY: each test is the only poster of its rings.
        unsafe { ring.push(tag, None, None) }.unwrap()
    }

    #[test]
    fn a_completion_releases_its_request_and_those_before_it() {
        let ring = Ring::new(4, false);
        let pushed: Vec<(u64, bool)> = (0..4).map(|tag| push(&ring, tag)).collect();
        // Only the fourth takes the last free slot.
        let last: Vec<bool> = pushed.iter().map(|p| p.1).collect();
        assert_eq!(last, [false, false, false, true]);
        let ids: Vec<u64> = pushed.iter().map(|p| p.0).collect();
        // SAFETY: this test is the ring's only poster.
        let (error, _) = unsafe { ring.push(9, None, None) }.unwrap_err();
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
        let (last, _) = push(&ring, 5);
        // SAFETY: as in `push`.
        unsafe {
            assert!(ring.unpush(ids[3]).is_none());
            assert_eq!(ring.unpush(last).unwrap().tag, 5);
        }
        ring.clear();
        assert_eq!(ring.len(), 0);
    }

    #[test]
    fn only_owned_ids_are_looked_up() {
        let tables = Arc::new(QpTables::new(2, 2, None));
        let (id, _) = push(&tables.recv, 7);
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

    /// A completion is looked up only in the queue its id names (send or receive), only on a
    /// route that carries that queue, in the SRQ's table for a queue pair on one, and past a
    /// route of the same number whose tables do not hold it (a destroyed queue pair's, not yet
    /// removed).
    #[test]
    fn lookups_follow_the_id_and_the_route() {
        let srq = Arc::new(SrqTable::new(4));
        let old = Arc::new(QpTables::new(2, 2, None));
        let live = Arc::new(QpTables::new(2, 2, Some(srq.clone())));
        let (send, _) = push(&live.send, 1);
        let (recv, _) = push(&live.recv, 2);
        let on_srq = srq.push(3, None, None).unwrap();
        let route = |tables: &Arc<QpTables>, send, recv| Route {
            qp_num: 9,
            tables: tables.clone(),
            send,
            recv,
        };
        // The send queue completes elsewhere: the send id is not looked up here.
        let routes = [route(&old, true, true), route(&live, false, true)];
        assert!(take_completed(&routes, 9, send).is_none());
        // The receive id: this queue pair is on the SRQ, so its own receive ring is not used.
        assert!(take_completed(&routes, 9, recv).is_none());
        assert_eq!(take_completed(&routes, 9, on_srq).unwrap().tag, 3);
        let routes = [route(&old, true, true), route(&live, true, false)];
        assert_eq!(take_completed(&routes, 9, send).unwrap().tag, 1);
        assert_eq!((live.send.len(), live.recv.len(), srq.len()), (0, 1, 0));
    }
}

#[cfg(test)]
mod ring_tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::mpsc;

    /// Counts its drops: an entry's `keep` that says how often entries were released.
    struct Counted(Arc<AtomicUsize>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A poster thread pushes 200,000 entries into a ring of 5 (8 slots) while a completer
    /// thread completes every third id, which releases the two before it too, and a third
    /// thread clears the ring now and then (as a reset would): every entry is released
    /// exactly once, none is completed twice, and the ring ends empty.
    #[test]
    fn poster_and_completers_on_two_threads() {
        // Fewer under Miri, which runs this too (`cargo +nightly miri test -p rdma-verbs --lib`).
        const N: u64 = if cfg!(miri) { 600 } else { 200_000 };
        let ring = Arc::new(Ring::new(5, false));
        let dropped = Arc::new(AtomicUsize::new(0));
        let completed = Arc::new(AtomicUsize::new(0));
        let (ids_tx, ids_rx) = mpsc::channel::<u64>();
        let poster = {
            let (ring, dropped) = (ring.clone(), dropped.clone());
            std::thread::spawn(move || {
                let mut pushed = 0;
                while pushed < N {
                    let keep: Arc<dyn Send + Sync> = Arc::new(Counted(dropped.clone()));
                    // SAFETY: this thread is the ring's only poster.
                    match unsafe { ring.push(pushed, None, Some(keep)) } {
                        Ok((id, _)) => {
                            pushed += 1;
                            if pushed % 3 == 0 {
                                ids_tx.send(id).unwrap();
                            }
                        }
                        Err((Error::QueueFull { .. }, _)) => {
                            // The refused request's `keep` was dropped: not a release.
                            dropped.fetch_sub(1, Ordering::Relaxed);
                            std::thread::yield_now();
                        }
                        Err((other, _)) => panic!("{other:?}"),
                    }
                }
            })
        };
        let completer = {
            let (ring, completed) = (ring.clone(), completed.clone());
            std::thread::spawn(move || {
                for id in ids_rx {
                    if let Some(entry) = ring.complete(id) {
                        assert_eq!(entry.id, id);
                        assert_eq!(entry.tag % 3, 2, "the third of each group");
                        completed.fetch_add(1, Ordering::Relaxed);
                    }
                    assert!(ring.complete(id).is_none(), "completed twice");
                }
            })
        };
        let clearer = {
            let ring = ring.clone();
            std::thread::spawn(move || {
                for _ in 0..if cfg!(miri) { 5 } else { 200 } {
                    ring.clear();
                    std::thread::yield_now();
                }
            })
        };
        // The poster waits for room, which the completer and the clearer make.
        poster.join().unwrap();
        completer.join().unwrap();
        clearer.join().unwrap();
        ring.clear();
        assert_eq!(ring.len(), 0);
        assert_eq!(
            dropped.load(Ordering::Relaxed),
            N as usize,
            "each released once"
        );
        assert!(completed.load(Ordering::Relaxed) > 0);
    }

    use super::tests::push;

    /// Panics when dropped the first time it is (the ring must not drop it again), and counts
    /// its drops.
    struct PanicsOnDrop(Arc<AtomicUsize>);

    impl Drop for PanicsOnDrop {
        fn drop(&mut self) {
            if self.0.fetch_add(1, Ordering::Relaxed) == 0 {
                panic!("an entry's destructor panicked");
            }
        }
    }

    /// An entry whose destructor panics while a completion releases it is not dropped again
    /// by a later completion, a clear, or the ring's drop: `head` moved past it first.
    #[test]
    fn a_panicking_release_drops_nothing_twice() {
        let drops = Arc::new(AtomicUsize::new(0));
        let ring = Ring::new(4, false);
        let panicky: Arc<dyn Send + Sync> = Arc::new(PanicsOnDrop(drops.clone()));
        // SAFETY: this test is the ring's only poster.
        let (_, _) = unsafe { ring.push(0, None, Some(panicky)) }.unwrap();
        let (second, _) = push(&ring, 1);
        let (third, _) = push(&ring, 2);
        // Completing the second releases the first, whose destructor panics.
        let unwound =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ring.complete(second)));
        assert!(unwound.is_err());
        assert_eq!(drops.load(Ordering::Relaxed), 1);
        // The panicking entry is gone; the second is still there, found by its id.
        assert_eq!(ring.len(), 2);
        assert_eq!(ring.complete(second).unwrap().tag, 1);
        ring.clear();
        assert!(ring.complete(third).is_none());
        drop(ring);
        assert_eq!(drops.load(Ordering::Relaxed), 1, "dropped once");
    }

    /// The poster undoes some of its records (a refused post) while a completer completes on
    /// another thread: every entry is dropped exactly once, whichever side takes it.
    #[test]
    fn undo_races_completions() {
        let n: u64 = if cfg!(miri) { 300 } else { 100_000 };
        let ring = Arc::new(Ring::new(4, false));
        let dropped = Arc::new(AtomicUsize::new(0));
        let (ids_tx, ids_rx) = mpsc::channel::<u64>();
        let completer = {
            let ring = ring.clone();
            std::thread::spawn(move || {
                for id in ids_rx {
                    ring.complete(id);
                }
            })
        };
        let mut made = 0usize;
        let mut undone = 0usize;
        for i in 0..n {
            let keep: Arc<dyn Send + Sync> = Arc::new(Counted(dropped.clone()));
            // SAFETY: this thread is the ring's only poster.
            match unsafe { ring.push(i, None, Some(keep)) } {
                Ok((id, _)) => {
                    made += 1;
                    if i % 3 == 0 {
                        // SAFETY: as above.
                        let entry = unsafe { ring.unpush(id) }.expect("the newest entry");
                        assert_eq!(entry.tag, i);
                        undone += 1;
                    } else {
                        ids_tx.send(id).unwrap();
                    }
                }
                Err((Error::QueueFull { .. }, _)) => {
                    // The refused request's `keep` was dropped: not a release.
                    dropped.fetch_sub(1, Ordering::Relaxed);
                    std::thread::yield_now();
                }
                Err((other, _)) => panic!("{other:?}"),
            }
        }
        drop(ids_tx);
        completer.join().unwrap();
        ring.clear();
        assert!(undone > 0);
        assert_eq!(dropped.load(Ordering::Relaxed), made, "each dropped once");
    }

    /// Positions wrap the slots many times over; the last free slot is reported each time
    /// the ring fills; dropping a ring with entries in flight releases them.
    #[test]
    fn wraps_and_releases_on_drop() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let ring = Ring::new(3, true);
        let keep = || -> Option<Arc<dyn Send + Sync>> { Some(Arc::new(Counted(dropped.clone()))) };
        let rounds = if cfg!(miri) { 20 } else { 1000 };
        for round in 0..rounds {
            // SAFETY: this test is the ring's only poster.
            let pushed: Vec<(u64, bool)> = (0..3)
                .map(|t| unsafe { ring.push(round * 3 + t, None, keep()) }.unwrap())
                .collect();
            assert_eq!(
                pushed.iter().map(|p| p.1).collect::<Vec<_>>(),
                [false, false, true]
            );
            assert!(pushed.iter().all(|p| p.0 & RECV_ID_BIT != 0));
            assert_eq!(ring.complete(pushed[2].0).unwrap().tag, round * 3 + 2);
        }
        assert_eq!(dropped.load(Ordering::Relaxed), 3 * rounds as usize);
        // SAFETY: as above.
        unsafe {
            ring.push(1, None, keep()).unwrap();
            ring.push(2, None, keep()).unwrap();
        }
        drop(ring);
        assert_eq!(dropped.load(Ordering::Relaxed), 3 * rounds as usize + 2);
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
                let id = table.push(tag, None, None).unwrap();
                live.push((id, tag));
                tag += 1;
            }
            assert!(table.push(99, None, None).is_err(), "full at capacity");
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
