//! [`Record`]: which slots of a ring are posted, under which request ids. Plain data, owned by
//! the ring (`&mut` for every change): no lock, no atomic.

use crate::inflight::NO_ID;

/// A ring's record: per slot the id of the request posted from it, or [`NO_ID`], and the bytes
/// it carries; the oldest
/// posted slot (`head`) and the next to post (`tail`). The posted slots are those from `head`
/// up to `tail`, in ring order (all of them when `head == tail` and the head is posted), their
/// ids increasing (one id source hands them out in increasing order).
#[derive(Debug)]
pub(super) struct Record {
    ids: Box<[u64]>,
    lens: Box<[u32]>,
    head: u32,
    tail: u32,
    /// The slot count: the length of `ids` and of `lens`, above `head` and `tail`.
    count: u32,
}

impl Record {
    /// A record of `count` slots (at least one), none posted.
    pub(super) fn new(count: u32) -> Self {
        debug_assert!(count > 0);
        Self {
            ids: vec![NO_ID; count as usize].into_boxed_slice(),
            lens: vec![0; count as usize].into_boxed_slice(),
            head: 0,
            tail: 0,
            count,
        }
    }

    #[inline]
    fn id(&self, index: u32) -> u64 {
        debug_assert!(index < self.count);
        // SAFETY: every index the record passes is `head`, `tail`, or made by `after` or
        // `index_at`, all below `count`, the length of `ids`.
        unsafe { *self.ids.get_unchecked(index as usize) }
    }

    /// The bytes slot `index` carries as last posted.
    #[inline]
    fn len(&self, index: u32) -> u32 {
        debug_assert!(index < self.count);
        // SAFETY: the length of `lens` is `count`, above `index`.
        unsafe { *self.lens.get_unchecked(index as usize) }
    }

    #[inline]
    fn set_id(&mut self, index: u32, id: u64) {
        debug_assert!(index < self.count);
        // SAFETY: as in `id`.
        unsafe { *self.ids.get_unchecked_mut(index as usize) = id };
    }

    /// The head: the oldest posted slot when any is posted, else the next to post.
    #[inline]
    pub(super) fn head(&self) -> u32 {
        self.head
    }

    /// The slot after `index`.
    #[inline]
    pub(super) fn after(&self, index: u32) -> u32 {
        let next = index + 1;
        if next == self.count { 0 } else { next }
    }

    /// The next slot to post, if it is free.
    #[inline]
    pub(super) fn free_tail(&self) -> Option<u32> {
        let tail = self.tail;
        (self.id(tail) == NO_ID).then_some(tail)
    }

    /// Whether slot `index` is posted.
    #[inline]
    fn is_posted(&self, index: u32) -> bool {
        self.id(index) != NO_ID
    }

    /// Records the tail slot, which [`free_tail`](Self::free_tail) returned, as posted under
    /// `id` (above every id the record holds, and not [`NO_ID`]), carrying `len` bytes.
    #[inline]
    pub(super) fn push(&mut self, id: u64, len: u32) {
        let tail = self.tail;
        debug_assert!(self.id(tail) == NO_ID && id != NO_ID);
        self.set_id(tail, id);
        // SAFETY: as in `len`, for `tail`.
        unsafe { *self.lens.get_unchecked_mut(tail as usize) = len };
        self.tail = self.after(tail);
    }

    /// Takes back the newest post, which the device never saw (the provider refused it).
    #[cold]
    pub(super) fn unpush(&mut self) {
        let newest = if self.tail == 0 {
            self.count - 1
        } else {
            self.tail - 1
        };
        debug_assert!(self.is_posted(newest));
        self.set_id(newest, NO_ID);
        self.tail = newest;
    }

    /// The request `id` completed, if it is the oldest posted: its slot, taken out of the
    /// record, and the bytes it carried. `None`, and nothing changes, otherwise (then try
    /// [`complete_later`](Self::complete_later)). The rings call the two in turn themselves, so
    /// that the usual case returns straight from this one.
    #[inline(always)]
    pub(super) fn complete_head(&mut self, id: u64) -> Option<(u32, u32)> {
        let head = self.head;
        // A head that is not posted holds `NO_ID`, which no completion carries.
        if self.id(head) != id {
            return None;
        }
        self.set_id(head, NO_ID);
        self.head = self.after(head);
        Some((head, self.len(head)))
    }

    /// The request `id` completed: its slot, taken out of the record with the slots posted
    /// before it (done too, as a queue completes in order). `None`, and nothing changes, if
    /// no posted slot has `id`. The ids increase from the head to the tail, so an id outside
    /// that span is none of the ring's, found without reading the others, and one inside is
    /// found by bisection.
    #[cold]
    #[inline(never)]
    pub(super) fn complete_later(&mut self, id: u64) -> Option<(u32, u32)> {
        let posted = self.posted();
        if posted == 0 || id < self.id_at(0) || id > self.id_at(posted - 1) {
            return None;
        }
        // The first offset from the head whose id is not below `id`.
        let (mut low, mut high) = (0, posted);
        while low < high {
            let middle = low + (high - low) / 2;
            if self.id_at(middle) < id {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        if low == posted || self.id_at(low) != id {
            return None;
        }
        let found = self.index_at(low);
        for offset in 0..=low {
            let index = self.index_at(offset);
            self.set_id(index, NO_ID);
        }
        self.head = self.after(found);
        Some((found, self.len(found)))
    }

    /// The slot `offset` (below the count) places after the head.
    fn index_at(&self, offset: u32) -> u32 {
        // Below twice the count (at most 2^21): no overflow, one wrap at most.
        let index = self.head + offset;
        if index >= self.count {
            index - self.count
        } else {
            index
        }
    }

    /// The id of the slot `offset` places after the head.
    fn id_at(&self, offset: u32) -> u64 {
        self.id(self.index_at(offset))
    }

    /// How many slots are posted (counted from the head: see [`any_posted`](Self::any_posted)
    /// for a count that trusts nothing).
    pub(super) fn posted(&self) -> u32 {
        if !self.is_posted(self.head) {
            0
        } else if self.tail > self.head {
            self.tail - self.head
        } else {
            self.tail + self.count - self.head
        }
    }

    /// Whether any slot is posted, looking at every slot: the head and tail say so too, unless
    /// a completion carrying `NO_ID` (which only a request posted with a raw pointer and a
    /// reserved id could make) moved the head onto a free slot.
    pub(super) fn any_posted(&self) -> bool {
        self.ids.iter().any(|&id| id != NO_ID)
    }

    /// Forgets every post: for a queue pair that was reset since (the device uses none of its
    /// requests any more), or destroyed.
    pub(super) fn clear(&mut self) {
        self.ids.fill(NO_ID);
        self.head = 0;
        self.tail = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inflight::OWNED_ID_BIT;

    const ID: u64 = OWNED_ID_BIT | 1 << 20;

    impl Record {
        /// A completion as the rings hand it over: the head first, then the search.
        fn complete(&mut self, id: u64) -> Option<u32> {
            let done = self.complete_head(id).or_else(|| self.complete_later(id));
            if let Some((index, len)) = done {
                assert_eq!(len, self.len(index), "the length posted");
            }
            done.map(|(index, _)| index)
        }
    }

    /// Posting every slot and completing them in order: each completion gives its own slot,
    /// a completion given twice (a copy) matches nothing the second time, and a full ring has
    /// no free tail.
    #[test]
    fn in_order_completions_take_each_slot_out_once() {
        let mut record = Record::new(3);
        for round in 0..4u64 {
            for n in 0..3 {
                let index = record.free_tail().expect("a free slot");
                assert_eq!(index, n);
                record.push(ID + round * 10 + u64::from(n), 7);
            }
            assert_eq!(record.free_tail(), None, "full");
            assert_eq!(record.posted(), 3);
            for n in 0..3u32 {
                let id = ID + round * 10 + u64::from(n);
                assert_eq!(record.complete(id), Some(n));
                assert_eq!(record.complete(id), None, "a copy of the completion");
            }
            assert_eq!(record.posted(), 0);
            assert_eq!(record.complete(ID + 99), None, "an id never posted");
            assert_eq!(record.complete(5), None, "an id of another path");
        }
    }

    /// A later completion takes out the slots posted before it; an id outside the posted span,
    /// or between two posted ids, changes nothing; positions wrap around the ring.
    #[test]
    fn a_later_completion_takes_out_the_earlier_slots() {
        let mut record = Record::new(4);
        // Move the head and tail to slot 2, so that the posted span wraps.
        for id in [ID, ID + 1] {
            record.push(id, 7);
            assert!(record.complete(id).is_some());
        }
        for id in [ID + 10, ID + 12, ID + 14, ID + 16] {
            record.push(id, 7);
        }
        assert_eq!(record.posted(), 4);
        for stale in [ID + 9, ID + 13, ID + 17, ID + 1] {
            assert_eq!(record.complete(stale), None);
            assert_eq!(record.posted(), 4, "unchanged");
        }
        assert_eq!(
            record.complete(ID + 14),
            Some(0),
            "the third slot from slot 2"
        );
        assert_eq!(record.posted(), 1);
        // The head is slot 1 and the tail slot 2: slots 2, 3 and 0 are free.
        assert_eq!(record.free_tail(), Some(2));
        assert!(!record.is_posted(2) && !record.is_posted(3) && !record.is_posted(0));
        assert_eq!(record.complete(ID + 10), None, "taken out already");
        assert_eq!(record.complete(ID + 16), Some(1));
        assert_eq!(record.posted(), 0);
    }

    /// A refused post is taken back: the tail returns, the slot is free, and positions wrap.
    #[test]
    fn unpush_takes_back_the_newest() {
        let mut record = Record::new(2);
        for round in 0..5u64 {
            let index = record.free_tail().unwrap();
            record.push(ID + round * 2, 7);
            record.unpush();
            assert_eq!(record.free_tail(), Some(index));
            assert_eq!(record.posted(), 0);
            record.push(ID + round * 2 + 1, 7);
            assert_eq!(record.complete(ID + round * 2), None, "the refused one");
            assert_eq!(record.complete(ID + round * 2 + 1), Some(index));
        }
    }

    /// Clearing forgets every post: no completion matches one afterwards, and posting starts
    /// again at slot 0.
    #[test]
    fn clear_forgets_every_post() {
        let mut record = Record::new(3);
        for id in [ID, ID + 1, ID + 2] {
            record.push(id, 1);
        }
        assert!(record.complete(ID).is_some());
        record.push(ID + 3, 1);
        assert!(record.any_posted() && record.free_tail().is_none());
        record.clear();
        assert!(!record.any_posted());
        assert_eq!((record.posted(), record.free_tail()), (0, Some(0)));
        for id in [ID + 1, ID + 2, ID + 3] {
            assert_eq!(record.complete(id), None, "a request the reset discarded");
        }
        record.push(ID + 4, 1);
        assert_eq!(record.complete(ID + 4), Some(0));
    }

    /// A long pseudo-random run of posts (some refused), completions in and out of order,
    /// stale and foreign completions: after every step the posted slots are exactly those a
    /// model (a queue of ids) holds, in order, and a completion takes out exactly its slot and
    /// those before it.
    #[test]
    fn the_record_follows_a_queue_model() {
        const COUNT: u32 = 5;
        let mut record = Record::new(COUNT);
        let mut model: std::collections::VecDeque<(u64, u32)> = Default::default();
        let mut next_id = ID;
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut random = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let steps = if cfg!(miri) { 400 } else { 20_000 };
        for _ in 0..steps {
            match random(4) {
                0 | 1 => {
                    let free = record.free_tail();
                    assert_eq!(free.is_some(), model.len() < COUNT as usize);
                    if let Some(index) = free {
                        next_id += 1 + random(3);
                        record.push(next_id, (next_id % 1000) as u32);
                        if random(4) == 0 {
                            record.unpush();
                        } else {
                            model.push_back((next_id, index));
                        }
                    }
                }
                _ => {
                    let id = if model.is_empty() || random(4) == 0 {
                        // Any id a completion may carry: stale, never posted, another path's
                        // (never `NO_ID`, which no request has).
                        match random(3) {
                            0 => random(1 << 20),
                            _ => ID + random(next_id - ID + 2),
                        }
                    } else {
                        model[random(model.len() as u64) as usize].0
                    };
                    let done = record.complete(id);
                    match model.iter().position(|&(posted, _)| posted == id) {
                        Some(found) => {
                            assert_eq!(done, Some(model[found].1), "the slot with the id");
                            model.drain(..=found);
                        }
                        None => assert_eq!(done, None, "id {id:#x}"),
                    }
                }
            }
            assert_eq!(record.posted() as usize, model.len());
            assert_eq!(record.any_posted(), !model.is_empty());
            let posted: Vec<u32> = (0..COUNT).filter(|&i| record.is_posted(i)).collect();
            let mut expected: Vec<u32> = model.iter().map(|&(_, index)| index).collect();
            expected.sort_unstable();
            assert_eq!(posted, expected);
            for (offset, &(id, index)) in model.iter().enumerate() {
                assert_eq!(
                    (record.index_at(offset as u32), record.id(index)),
                    (index, id)
                );
                assert_eq!(record.len(index), (id % 1000) as u32);
            }
        }
    }
}
