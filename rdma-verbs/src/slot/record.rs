//! [`Record`]: which slots of a ring are posted, to which queue, under which request id, and
//! which are free; on UD, the address handle of each send posted. Owned by the ring (`&mut`
//! for every change): no lock, no atomic.

use crate::ah::AddressHandle;

/// One posted request: its id, the caller's tag, its slot and the slot's length.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(super) struct Posted {
    pub(super) id: u64,
    pub(super) tag: u64,
    pub(super) index: u32,
    pub(super) len: u32,
}

/// The posted slots of one queue, oldest first: a ring buffer whose capacity (a power of two)
/// is at least the ring's slot count, which it never needs to exceed, as a slot is posted at
/// most once at a time.
#[derive(Debug)]
pub(super) struct Fifo {
    entries: Box<[Posted]>,
    /// The capacity minus one.
    mask: u64,
    head: u64,
    tail: u64,
}

impl Fifo {
    fn new(count: u32) -> Self {
        let capacity = count.next_power_of_two() as usize;
        Self {
            entries: vec![Posted::default(); capacity].into_boxed_slice(),
            mask: capacity as u64 - 1,
            head: 0,
            tail: 0,
        }
    }

    #[inline]
    pub(super) fn len(&self) -> u64 {
        self.tail - self.head
    }

    #[inline]
    fn at(&self, position: u64) -> Posted {
        let index = (position & self.mask) as usize;
        debug_assert!(index < self.entries.len());
        // SAFETY: `mask` is the length minus one and the length a power of two, so the masked
        // position is in bounds.
        unsafe { *self.entries.get_unchecked(index) }
    }

    /// Appends `posted`; `false` (and nothing written) if the buffer is full, which a ring
    /// never makes it (each of its slots is posted at most once at a time), but which must
    /// not overwrite a live entry if it ever did.
    #[inline]
    fn push(&mut self, posted: Posted) -> bool {
        if self.len() > self.mask {
            return false;
        }
        let index = (self.tail & self.mask) as usize;
        // SAFETY: as in `at`.
        unsafe { *self.entries.get_unchecked_mut(index) = posted };
        self.tail += 1;
        true
    }
}

/// A ring's record of its slots: the two queues' posted slots and the free ones.
#[derive(Debug)]
pub(super) struct Record {
    pub(super) send: Fifo,
    pub(super) recv: Fifo,
    /// Slots neither posted nor handed out (a stack: the last one back goes out first).
    free: Vec<u32>,
    count: u32,
    /// On UD, per slot the address handle of the send posted from it (`None` while the slot
    /// is not a posted send), kept while the device may use it; empty on the other transports.
    dests: Box<[Option<AddressHandle>]>,
}

impl Record {
    /// A record of `count` slots, all free; with room for an address handle per slot if
    /// `datagram` (a UD queue pair's ring).
    pub(super) fn new(count: u32, datagram: bool) -> Self {
        let dests = if datagram { count } else { 0 };
        Self {
            send: Fifo::new(count),
            recv: Fifo::new(count),
            free: (0..count).rev().collect(),
            count,
            dests: (0..dests).map(|_| None).collect(),
        }
    }

    /// Keeps `ah` for the send just recorded from slot `index` (a UD ring's), until the slot
    /// leaves the record.
    #[inline]
    pub(super) fn keep_dest(&mut self, index: u32, ah: &AddressHandle) {
        if let Some(dest) = self.dests.get_mut(index as usize) {
            *dest = Some(ah.clone());
        }
    }

    /// Drops the address handle kept for slot `index`, whose send has left the record.
    #[inline]
    fn release_dest(&mut self, index: u32) {
        if let Some(dest) = self.dests.get_mut(index as usize) {
            *dest = None;
        }
    }

    /// The address handles still kept (of sends posted), taken out: for a ring dropped with
    /// sends posted, whose queue pair keeps them instead.
    pub(super) fn take_dests(&mut self) -> impl Iterator<Item = AddressHandle> + '_ {
        self.dests.iter_mut().filter_map(Option::take)
    }

    /// A free slot's index, taken out.
    #[inline]
    pub(super) fn take_free(&mut self) -> Option<u32> {
        self.free.pop()
    }

    /// Makes slot `index` free again. The caller had it out (a `Slot`), so it is neither
    /// free nor posted, and the stack has room (it never holds more than `count`).
    #[inline]
    pub(super) fn put_free(&mut self, index: u32) {
        debug_assert!(self.free.len() < self.count as usize);
        self.free.push(index);
    }

    /// How many slots are free.
    pub(super) fn free_len(&self) -> usize {
        self.free.len()
    }

    /// Whether no slot is free (every one is posted or out).
    #[inline]
    pub(super) fn free_is_empty(&self) -> bool {
        self.free.is_empty()
    }

    /// Records a posted request of queue `recv` (a receive) or not (a send); `false` if its
    /// queue's record is full (see [`Fifo::push`]). Its id must be above every id the queue
    /// holds (ids from one id source increase), which [`complete`](Self::complete)'s search
    /// relies on: checked in debug builds.
    #[inline]
    pub(super) fn push(&mut self, recv: bool, posted: Posted) -> bool {
        let fifo = if recv { &mut self.recv } else { &mut self.send };
        debug_assert!(fifo.len() == 0 || fifo.at(fifo.tail - 1).id < posted.id);
        fifo.push(posted)
    }

    /// Takes back the newest request of its queue if it is `id` (a post the provider refused
    /// without taking the request).
    #[cold]
    pub(super) fn unpush(&mut self, recv: bool, id: u64) -> Option<Posted> {
        let fifo = if recv { &mut self.recv } else { &mut self.send };
        if fifo.tail == fifo.head {
            return None;
        }
        let newest = fifo.at(fifo.tail - 1);
        if newest.id != id {
            return None;
        }
        fifo.tail -= 1;
        if !recv {
            self.release_dest(newest.index);
        }
        Some(newest)
    }

    /// The request `id` of queue `recv` completed: takes it out of the record, and with it the
    /// requests posted to that queue before it (done too, as a queue completes in order),
    /// which become free. `None`, and nothing changes, if no posted request has `id`.
    #[inline]
    pub(super) fn complete(&mut self, recv: bool, id: u64) -> Option<Posted> {
        let fifo = if recv { &mut self.recv } else { &mut self.send };
        if fifo.head == fifo.tail {
            return None;
        }
        let oldest = fifo.at(fifo.head);
        if oldest.id == id {
            fifo.head += 1;
            if !recv {
                self.release_dest(oldest.index);
            }
            return Some(oldest);
        }
        self.complete_later(recv, id)
    }

    /// Forgets every posted request of both queues (for a queue pair reset since they were
    /// posted: the device uses none of them any more): their slots become free.
    pub(super) fn clear_posted(&mut self) {
        for fifo in [&mut self.send, &mut self.recv] {
            for position in fifo.head..fifo.tail {
                let index = fifo.at(position).index;
                debug_assert!(self.free.len() < self.count as usize);
                self.free.push(index);
            }
            fifo.head = fifo.tail;
        }
        for dest in &mut self.dests {
            *dest = None;
        }
    }

    /// [`complete`](Self::complete) of a request that is not the oldest of its queue. A
    /// queue's ids increase from its oldest entry to its newest (an id source hands them out
    /// in increasing order), so an id outside that span is none of the queue's, found without
    /// reading the entries, and one inside is found by bisection: a completion of another
    /// ring or path costs a few reads, however many slots are posted.
    #[cold]
    #[inline(never)]
    fn complete_later(&mut self, recv: bool, id: u64) -> Option<Posted> {
        let fifo = if recv { &mut self.recv } else { &mut self.send };
        let (mut low, mut high) = (fifo.head, fifo.tail);
        if id < fifo.at(low).id || id > fifo.at(high - 1).id {
            return None;
        }
        // The first position whose id is not below `id`.
        while low < high {
            let middle = low + (high - low) / 2;
            if fifo.at(middle).id < id {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        let found = low;
        if found == fifo.tail || fifo.at(found).id != id {
            return None;
        }
        let (head, posted) = (fifo.head, fifo.at(found));
        fifo.head = found + 1;
        for position in head..found {
            let fifo = if recv { &self.recv } else { &self.send };
            let index = fifo.at(position).index;
            debug_assert!(self.free.len() < self.count as usize);
            self.free.push(index);
            if !recv {
                self.release_dest(index);
            }
        }
        if !recv {
            self.release_dest(posted.index);
        }
        Some(posted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn posted(id: u64, index: u32) -> Posted {
        Posted {
            id,
            tag: id,
            index,
            len: 10,
        }
    }

    /// Taking every slot, posting them, completing them in order: each completion gives its
    /// own slot back, and a completion given twice (a copy of it) matches nothing the second
    /// time.
    #[test]
    fn in_order_completions_give_each_slot_back_once() {
        let mut record = Record::new(3, false);
        let taken: Vec<u32> = std::iter::from_fn(|| record.take_free()).collect();
        assert_eq!(taken, [0, 1, 2]);
        assert!(record.push(true, posted(100, 0)));
        assert!(record.push(true, posted(101, 1)));
        assert!(record.free_is_empty());
        assert!(record.push(false, posted(200, 2)));
        assert_eq!(record.complete(true, 100), Some(posted(100, 0)));
        assert_eq!(record.complete(true, 100), None, "a copy of the completion");
        assert_eq!(record.complete(false, 101), None, "the other queue's id");
        assert_eq!(record.complete(true, 101), Some(posted(101, 1)));
        assert_eq!(record.complete(false, 200), Some(posted(200, 2)));
        assert_eq!((record.send.len(), record.recv.len()), (0, 0));
        assert_eq!(record.free_len(), 0, "the slots went back to their callers");
        assert_eq!(record.complete(true, 7), None, "an id never posted");
    }

    /// A later completion releases the earlier requests of its queue (unsignaled sends) into
    /// the free slots, and leaves the other queue alone; an id that is not posted changes
    /// nothing.
    #[test]
    fn a_later_completion_frees_the_earlier_requests() {
        let mut record = Record::new(6, false);
        for index in 0..6 {
            assert_eq!(record.take_free(), Some(index));
        }
        for (id, index) in [(10, 0), (11, 1), (12, 2), (13, 3)] {
            record.push(false, posted(id, index));
        }
        record.push(true, posted(20, 4));
        record.push(true, posted(21, 5));
        assert_eq!(record.complete(false, 99), None);
        assert_eq!((record.send.len(), record.free_len()), (4, 0), "unchanged");
        assert_eq!(record.complete(false, 12), Some(posted(12, 2)));
        assert_eq!(record.send.len(), 1);
        let mut freed: Vec<u32> = std::iter::from_fn(|| record.take_free()).collect();
        freed.sort_unstable();
        assert_eq!(freed, [0, 1], "the two unsignaled sends before it");
        assert_eq!(record.complete(false, 10), None, "released already");
        assert_eq!(record.recv.len(), 2, "the receive queue is untouched");
        assert_eq!(record.complete(false, 13), Some(posted(13, 3)));
        assert_eq!(record.complete(true, 21), Some(posted(21, 5)));
        assert_eq!(record.take_free(), Some(4), "the receive before it");
    }

    /// A refused post is taken back only if it is the newest of its queue and has the id; the
    /// positions wrap around the buffer's capacity.
    #[test]
    fn unpush_takes_back_only_the_newest_and_positions_wrap() {
        let mut record = Record::new(2, false);
        let (a, b) = (record.take_free().unwrap(), record.take_free().unwrap());
        for round in 0..10u64 {
            record.push(false, posted(round * 2, a));
            assert_eq!(record.unpush(false, round * 2 + 1), None, "another id");
            assert_eq!(record.unpush(true, round * 2), None, "the other queue");
            record.push(false, posted(round * 2 + 1, b));
            assert_eq!(record.unpush(false, round * 2), None, "not the newest");
            assert_eq!(
                record.unpush(false, round * 2 + 1),
                Some(posted(round * 2 + 1, b))
            );
            record.push(false, posted(round * 2 + 1, b));
            assert_eq!(
                record.complete(false, round * 2),
                Some(posted(round * 2, a))
            );
            assert_eq!(
                record.complete(false, round * 2 + 1),
                Some(posted(round * 2 + 1, b))
            );
        }
        assert_eq!(record.unpush(false, 0), None, "empty");
        record.put_free(a);
        assert_eq!(record.take_free(), Some(a));
    }

    /// A long pseudo-random run of takes, gives back, posts (some refused), completions in and
    /// out of order and stale completions: after every step each slot is in exactly one place
    /// (free, out with its caller, or posted to one queue), and a full record refuses a push
    /// rather than overwrite an entry.
    #[test]
    fn every_slot_is_in_exactly_one_place() {
        const COUNT: u32 = 5;
        let mut record = Record::new(COUNT, false);
        let mut out: Vec<u32> = Vec::new();
        let mut next_id = 1u64;
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut random = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let steps = if cfg!(miri) { 400 } else { 20_000 };
        for _ in 0..steps {
            match random(25) {
                0..=4 => out.extend(record.take_free()),
                24 => {
                    // A reset: every posted slot is free again, the slots out stay out.
                    let posted = record.send.len() + record.recv.len();
                    let free_before = record.free_len() as u64;
                    record.clear_posted();
                    assert_eq!(record.send.len() + record.recv.len(), 0);
                    assert_eq!(record.free_len() as u64, free_before + posted);
                }
                5 | 6 if !out.is_empty() => {
                    let index = out.swap_remove(random(out.len() as u64) as usize);
                    record.put_free(index);
                }
                7..=14 if !out.is_empty() => {
                    let index = out.swap_remove(random(out.len() as u64) as usize);
                    let recv = random(2) == 0;
                    let id = next_id | if recv { 1 << 62 } else { 0 };
                    next_id += 1;
                    assert!(record.push(
                        recv,
                        Posted {
                            id,
                            tag: 0,
                            index,
                            len: 1
                        }
                    ));
                    if random(4) == 0 {
                        // Refused by the provider: taken back.
                        assert_eq!(record.unpush(recv, id).map(|p| p.index), Some(index));
                        out.push(index);
                    }
                }
                15..=23 => {
                    let recv = random(2) == 0;
                    let fifo = if recv { &record.recv } else { &record.send };
                    let queued: Vec<Posted> = (fifo.head..fifo.tail)
                        .map(|position| fifo.at(position))
                        .collect();
                    let id = if queued.is_empty() || random(5) == 0 {
                        // Any id handed out so far (of either queue, posted or not).
                        random(next_id) | if random(2) == 0 { 1 << 62 } else { 0 }
                    } else {
                        queued[random(queued.len() as u64) as usize].id
                    };
                    let free_before = record.free.clone();
                    let other = if recv {
                        record.send.len()
                    } else {
                        record.recv.len()
                    };
                    let done = record.complete(recv, id);
                    let fifo = if recv { &record.recv } else { &record.send };
                    let left: Vec<Posted> = (fifo.head..fifo.tail)
                        .map(|position| fifo.at(position))
                        .collect();
                    let other_after = if recv {
                        record.send.len()
                    } else {
                        record.recv.len()
                    };
                    assert_eq!(other, other_after, "the other queue is untouched");
                    match queued.iter().position(|p| p.id == id) {
                        Some(found) => {
                            assert_eq!(done, Some(queued[found]), "the entry with the id");
                            assert_eq!(left, queued[found + 1..], "the entries after it stay");
                            let mut freed: Vec<u32> = record.free[free_before.len()..].to_vec();
                            let mut earlier: Vec<u32> =
                                queued[..found].iter().map(|p| p.index).collect();
                            freed.sort_unstable();
                            earlier.sort_unstable();
                            assert_eq!(freed, earlier, "the entries before it are freed");
                            out.push(queued[found].index);
                        }
                        None => {
                            assert_eq!(done, None);
                            assert_eq!(left, queued, "nothing changes");
                            assert_eq!(record.free, free_before);
                        }
                    }
                }
                _ => {}
            }
            let mut places = vec![0u32; COUNT as usize];
            for &index in record.free.iter().chain(&out) {
                places[index as usize] += 1;
            }
            for fifo in [&record.send, &record.recv] {
                for position in fifo.head..fifo.tail {
                    places[fifo.at(position).index as usize] += 1;
                }
            }
            assert!(places.iter().all(|&n| n == 1), "{places:?}");
        }
        // A full queue record refuses a push.
        let mut full = Fifo::new(2);
        assert!(full.push(posted(1, 0)) && full.push(posted(2, 1)));
        assert!(!full.push(posted(3, 0)));
        assert_eq!((full.len(), full.at(0).id, full.at(1).id), (2, 1, 2));
    }
}
