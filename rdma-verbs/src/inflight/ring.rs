//! [`Ring`]: the in-flight requests of one queue of a queue pair, in posting order.

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Entry, IdSource, queue_full};
use crate::buf::Buf;
use crate::error::Error;
use crate::spin::SpinLock;

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
/// - the *completers*: the completion queue's poller ([`complete_into`](Self::complete_into)), and
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
        let index = (position & self.mask) as usize;
        debug_assert!(index < self.slots.len());
        // SAFETY: `slots.len()` is `mask + 1` (a power of two, set in `new` and never
        // changed), so the masked position is in bounds.
        unsafe { self.slots.get_unchecked(index) }.get()
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
        Ok((id.get(), in_flight + 1 == self.capacity))
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
        if entry.id.get() != id {
            return None;
        }
        // SAFETY: as above; `tail` moves back over the slot, so it is read once.
        let entry = unsafe { (*self.slot(last)).assume_init_read() };
        self.tail.store(last, Ordering::Release);
        Some(entry)
    }

    /// [`complete_into`](Self::complete_into), the entry returned (for tests).
    #[cfg(test)]
    pub(crate) fn complete(&self, id: u64) -> Option<Entry> {
        let mut out = None;
        let found = self.complete_into(id, &mut out);
        assert_eq!(found, out.is_some(), "returns whether it wrote");
        out
    }

    /// The completion of request `id`: moves its entry into `out`, which holds `None` (it is
    /// overwritten, not dropped: were it `Some`, that entry would leak), and releases every
    /// request before it (their buffers return to their pools); returns whether it did,
    /// `false` if `id` is not in flight here (a stale completion, or another queue's). The
    /// entry is copied once, from its slot into `out`.
    #[inline]
    pub(crate) fn complete_into(&self, id: u64, out: &mut Option<Entry>) -> bool {
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
            if unsafe { (*self.slot(position)).assume_init_ref() }.id.get() == id {
                break;
            }
            position = position.wrapping_add(1);
        }
        if position == tail {
            return false;
        }
        if position != head {
            // SAFETY: under the lock, `head` is `head` and `position` is before the loaded
            // `tail`.
            unsafe { self.release(head, position) };
        }
        debug_assert!(out.is_none(), "an entry would leak");
        // SAFETY: as above: the slot holds an entry, which `head` moves past below with
        // nothing between that can panic (`ptr::write` only), so it is read once. `out` is a
        // `&mut`, so valid and aligned; what it held (`None`) is overwritten, not dropped.
        unsafe {
            std::ptr::write(out, Some((*self.slot(position)).assume_init_read()));
        }
        self.head.store(position.wrapping_add(1), Ordering::Release);
        true
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::inflight::{OWNED_ID_BIT, RECV_ID_BIT};
    use std::sync::atomic::AtomicUsize;
    use std::sync::mpsc;

    /// Records an entry with `tag` and no buffer; panics if the ring refuses it.
    pub(crate) fn push(ring: &Ring, tag: u64) -> (u64, bool) {
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
                        assert_eq!(entry.id.get(), id);
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
