//! [`SrqTable`]: the in-flight receives of a shared receive queue, found by id.

use std::sync::{Arc, Mutex, MutexGuard};

use super::{Attached, Entry, IdSource, queue_full};
use crate::buf::Buf;
use crate::error::Error;

/// The in-flight receives of a shared receive queue. They complete in any order (each in the
/// completion queue of the queue pair that consumed it), so entries are found by id in an
/// open-addressing table (linear probing, backward-shift deletion), twice the queue's size,
/// allocated once.
#[derive(Debug)]
pub(crate) struct SrqTable {
    state: Mutex<SrqState>,
    /// What the SRQ keeps alive for its slot rings (`slot/srq.rs`, whose posted receives no
    /// table records): their regions, until the SRQ is destroyed or a ring dropped with
    /// nothing posted takes its own back.
    pub(crate) attached: Attached,
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
                Some(entry) if entry.id.get() == id => return Some(i),
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
            let home = self.home(next.id.get());
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
    /// to a power of two: about 96 bytes per receive, allocated here, once. At most 2^30
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
            attached: Attached::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, SrqState> {
        // A poisoned lock is used as it is: a removal's shifts complete before the lock is
        // released, and nothing in them panics.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// As [`Ring::push`](super::Ring::push), for a receive.
    pub(crate) fn push(
        &self,
        tag: u64,
        buf: Option<Buf>,
        keep: Option<Arc<dyn Send + Sync>>,
    ) -> std::result::Result<u64, (Error, Option<Buf>)> {
        let mut state = self.lock();
        if state.len >= state.capacity {
            return Err(queue_full(buf));
        }
        let id = match state.ids.next() {
            Ok(id) => id,
            Err(error) => return Err((error, buf)),
        };
        // At most half full: a free slot exists on the probe path.
        let mut i = state.home(id.get());
        while state.slots[i].is_some() {
            i = (i + 1) & state.mask;
        }
        state.slots[i] = Some(Entry { id, tag, buf, keep });
        state.len += 1;
        Ok(id.get())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inflight::OWNED_ID_BIT;

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
