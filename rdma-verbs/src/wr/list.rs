//! [`PostList`]: reusable, doorbell-batched chains of work requests.

use std::fmt;
use std::marker::PhantomData;

use super::{Operation, RecvRequest, SendRequest, SendWr, element_index, foreign_object};
use crate::error::{Error, Result};
use crate::ffi;

/// The protection domains of the address handles and memory windows a [`PostList`] holds.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum ObjectPds {
    /// No request names one.
    None,
    /// Every one belongs to this one.
    One(*mut ffi::ibv_pd),
    /// Objects of several protection domains: no queue pair can take them all.
    Mixed,
}

/// Storage for a chain of work requests, handed to the provider in one post call (one doorbell).
///
/// The storage is allocated once, by [`with_capacity`](Self::with_capacity); pushing, posting and
/// [`clear`](Self::clear) never allocate. [`reuse`](Self::reuse) empties the list and lets it
/// borrow different memory, so one list serves a whole program.
#[must_use = "a list does nothing until it is posted"]
pub struct PostList<'a, W: WorkRequest> {
    // The chain points into both vectors (`next` into `wrs`, `sg_list` into `sges`), so neither
    // may ever reallocate: a push is refused once either is full (see `capacity`), whatever
    // capacities the allocator gave them.
    wrs: Vec<W::Raw>,
    sges: Vec<ffi::ibv_sge>,
    ops: u32,
    datagrams: usize,
    object_pds: ObjectPds,
    _borrow: PhantomData<&'a ()>,
}

/// A list of send requests of any operation for
/// [`QueuePair::post_send`](crate::QueuePair::post_send). (The second parameter only says which
/// C structure the list holds: [`push`](PostList::push) takes a [`SendRequest`] of any
/// operation.)
pub type SendList<'a> = PostList<'a, SendRequest<'a>>;
/// A list of receive requests for [`QueuePair::post_recv`](crate::QueuePair::post_recv) and
/// [`SharedReceiveQueue::post_recv`](crate::SharedReceiveQueue::post_recv).
pub type RecvList<'a> = PostList<'a, RecvRequest<'a>>;

/// A work request type a [`PostList`] holds: [`SendRequest`] or [`RecvRequest`].
pub trait WorkRequest: private::Sealed {
    #[doc(hidden)]
    type Raw: Copy + Default;
    /// Fills `raw`; returns whether its scatter/gather pointer points at `one`.
    #[doc(hidden)]
    fn fill_raw(&self, raw: &mut Self::Raw, one: &mut ffi::ibv_sge) -> Result<bool>;
    #[doc(hidden)]
    fn link(raw: &mut Self::Raw, next: *mut Self::Raw);
    #[doc(hidden)]
    fn set_sg_list(raw: &mut Self::Raw, sg_list: *mut ffi::ibv_sge);
    #[doc(hidden)]
    fn op_bits(&self) -> u32;
    #[doc(hidden)]
    fn datagram(&self) -> bool;
    #[doc(hidden)]
    fn object_pd(&self) -> Option<*mut ffi::ibv_pd>;
}

mod private {
    pub trait Sealed {}
}

impl private::Sealed for SendWr<'_> {}
impl WorkRequest for SendWr<'_> {
    type Raw = ffi::ibv_send_wr;
    fn fill_raw(&self, raw: &mut Self::Raw, one: &mut ffi::ibv_sge) -> Result<bool> {
        self.fill(raw, one)?;
        Ok(self.payload.uses_single_entry())
    }
    fn link(raw: &mut Self::Raw, next: *mut Self::Raw) {
        raw.next = next;
    }
    fn set_sg_list(raw: &mut Self::Raw, sg_list: *mut ffi::ibv_sge) {
        raw.sg_list = sg_list;
    }
    fn op_bits(&self) -> u32 {
        self.op()
    }
    fn datagram(&self) -> bool {
        self.is_datagram()
    }
    fn object_pd(&self) -> Option<*mut ffi::ibv_pd> {
        SendWr::object_pd(self)
    }
}

impl<K: Operation> private::Sealed for SendRequest<'_, K> {}
impl<K: Operation> WorkRequest for SendRequest<'_, K> {
    type Raw = ffi::ibv_send_wr;
    fn fill_raw(&self, raw: &mut Self::Raw, one: &mut ffi::ibv_sge) -> Result<bool> {
        self.wr().fill_raw(raw, one)
    }
    fn link(raw: &mut Self::Raw, next: *mut Self::Raw) {
        raw.next = next;
    }
    fn set_sg_list(raw: &mut Self::Raw, sg_list: *mut ffi::ibv_sge) {
        raw.sg_list = sg_list;
    }
    fn op_bits(&self) -> u32 {
        self.wr().op()
    }
    fn datagram(&self) -> bool {
        self.wr().is_datagram()
    }
    fn object_pd(&self) -> Option<*mut ffi::ibv_pd> {
        self.wr().object_pd()
    }
}

impl private::Sealed for RecvRequest<'_> {}
impl WorkRequest for RecvRequest<'_> {
    type Raw = ffi::ibv_recv_wr;
    fn fill_raw(&self, raw: &mut Self::Raw, one: &mut ffi::ibv_sge) -> Result<bool> {
        self.fill(raw, one)?;
        Ok(self.payload.uses_single_entry())
    }
    fn link(raw: &mut Self::Raw, next: *mut Self::Raw) {
        raw.next = next;
    }
    fn set_sg_list(raw: &mut Self::Raw, sg_list: *mut ffi::ibv_sge) {
        raw.sg_list = sg_list;
    }
    fn op_bits(&self) -> u32 {
        0
    }
    fn datagram(&self) -> bool {
        false
    }
    fn object_pd(&self) -> Option<*mut ffi::ibv_pd> {
        None
    }
}

impl<'a, W: WorkRequest> PostList<'a, W> {
    /// A list with room for `capacity` requests.
    pub fn with_capacity(capacity: usize) -> Self {
        Self::from_storage(Vec::with_capacity(capacity), Vec::with_capacity(capacity))
    }

    /// A list over empty vectors, whose capacities may differ.
    fn from_storage(wrs: Vec<W::Raw>, sges: Vec<ffi::ibv_sge>) -> Self {
        debug_assert!(wrs.is_empty() && sges.is_empty());
        Self {
            wrs,
            sges,
            ops: 0,
            datagrams: 0,
            object_pds: ObjectPds::None,
            _borrow: PhantomData,
        }
    }

    /// Appends `request`, chaining it after the last one: a [`SendRequest`] of any operation
    /// to a [`SendList`], a [`RecvRequest`] to a [`RecvList`]. Does not allocate.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the list is full or the request is malformed (inline data
    /// in a receive, too many entries).
    pub fn push<R>(&mut self, request: R) -> Result<()>
    where
        R: WorkRequest<Raw = W::Raw> + 'a,
    {
        if self.wrs.len() >= self.capacity() {
            return Err(Error::InvalidArgument(format!(
                "the post list is full ({} requests)",
                self.capacity()
            )));
        }
        let mut raw = W::Raw::default();
        let mut one = ffi::ibv_sge::default();
        let single = request.fill_raw(&mut raw, &mut one)?;
        // Neither vector reallocates (both are below their capacity: `capacity` is the smaller
        // one, and both hold `len` elements), so the addresses taken here stay valid for as
        // long as the list holds them.
        self.sges.push(one);
        if single {
            if let Some(stored) = self.sges.last_mut() {
                W::set_sg_list(&mut raw, stored);
            }
        }
        self.wrs.push(raw);
        let n = self.wrs.len();
        if n >= 2 {
            let (head, tail) = self.wrs.split_at_mut(n - 1);
            W::link(&mut head[n - 2], &mut tail[0]);
        }
        self.ops |= request.op_bits();
        self.datagrams += usize::from(request.datagram());
        if let Some(pd) = request.object_pd() {
            self.object_pds = match self.object_pds {
                ObjectPds::None => ObjectPds::One(pd),
                ObjectPds::One(known) if known == pd => ObjectPds::One(known),
                _ => ObjectPds::Mixed,
            };
        }
        Ok(())
    }

    /// Removes every request; keeps the storage.
    pub fn clear(&mut self) {
        self.wrs.clear();
        self.sges.clear();
        self.ops = 0;
        self.datagrams = 0;
        self.object_pds = ObjectPds::None;
    }

    /// Empties the list so that it can borrow other memory, keeping the storage.
    pub fn reuse<'b, V>(mut self) -> PostList<'b, V>
    where
        V: WorkRequest<Raw = W::Raw>,
    {
        self.clear();
        PostList::from_storage(self.wrs, self.sges)
    }

    /// The number of requests.
    pub fn len(&self) -> usize {
        self.wrs.len()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.wrs.is_empty()
    }

    /// How many requests fit: the smaller capacity of the two vectors the chain points into,
    /// which [`with_capacity`](Self::with_capacity) asks to be equal but the allocator may
    /// make larger.
    pub fn capacity(&self) -> usize {
        self.wrs.capacity().min(self.sges.capacity())
    }

    pub(crate) fn ops(&self) -> u32 {
        self.ops
    }

    pub(crate) fn datagrams(&self) -> usize {
        self.datagrams
    }

    /// Refuses a list holding an address handle or memory window of a protection domain other
    /// than `qp_pd` (the queue pair's); see [`SendWr::check_object_pd`]. A pointer
    /// comparison.
    pub(crate) fn check_object_pd(&self, qp_pd: *mut ffi::ibv_pd) -> Result<()> {
        match self.object_pds {
            ObjectPds::None => Ok(()),
            ObjectPds::One(pd) if pd == qp_pd => Ok(()),
            _ => Err(foreign_object()),
        }
    }

    /// The head of the chain, or null when empty.
    pub(crate) fn head(&mut self) -> *mut W::Raw {
        self.wrs.as_mut_ptr()
    }

    /// The index of `bad` (the request a failed post verb reported) in the list, or `None` when
    /// it names no element of the list: null (the provider did not say) or a stray pointer.
    pub(crate) fn index_of(&self, bad: *const W::Raw) -> Option<usize> {
        element_index(self.wrs.as_ptr(), self.wrs.len(), bad)
    }
}

impl<W: WorkRequest> fmt::Debug for PostList<'_, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostList")
            .field("len", &self.len())
            .field("capacity", &self.capacity())
            .finish()
    }
}

#[cfg(test)]
mod post_list_tests {
    use super::*;
    use crate::mr::MrSlice;

    /// Every single-entry request of `list` points at its own entry in the list's current
    /// entry storage, and every request but the last at the next one.
    fn assert_chain_intact(list: &PostList<'_, RecvRequest<'_>>) {
        let sges = list.sges.as_ptr_range();
        for (i, raw) in list.wrs.iter().enumerate() {
            let sg = raw.sg_list.cast_const();
            assert!(sges.contains(&sg), "request {i}: entry outside the storage");
            assert_eq!(sg, list.sges.as_ptr().wrapping_add(i), "request {i}");
            let next = list.wrs.as_ptr().wrapping_add(i + 1).cast_mut();
            let want = if i + 1 < list.wrs.len() {
                next
            } else {
                std::ptr::null_mut()
            };
            assert_eq!(raw.next, want, "request {i}: broken chain");
        }
    }

    #[test]
    fn a_list_never_outgrows_either_vector() {
        // The allocator may give the two vectors different capacities: the list must hold no
        // more than the smaller, or pushing would move the entries the chain points at.
        for (wr_cap, sge_cap) in [(8, 2), (2, 8), (4, 4)] {
            let mut list: RecvList<'_> =
                PostList::from_storage(Vec::with_capacity(wr_cap), Vec::with_capacity(sge_cap));
            let cap = wr_cap.min(sge_cap);
            assert_eq!(list.capacity(), cap);
            for i in 0..wr_cap.max(sge_cap) {
                let slice = MrSlice::unchecked_for_test(0x1000 + 8 * i as u64, 8, 1);
                let pushed = list.push(RecvRequest::new(slice).tag(i as u64));
                if i < cap {
                    pushed.expect("below capacity");
                } else {
                    assert!(matches!(pushed, Err(Error::InvalidArgument(_))), "push {i}");
                }
                assert_chain_intact(&list);
            }
            assert_eq!(list.len(), cap);
            // `reuse` keeps both vectors, and the same bound.
            let mut list: RecvList<'_> = list.reuse();
            assert_eq!(list.capacity(), cap);
            for i in 0..cap {
                list.push(RecvRequest::empty().tag(i as u64))
                    .expect("reused list");
            }
            assert!(list.push(RecvRequest::empty().tag(99)).is_err());
        }
    }
}

#[cfg(test)]
mod empty_entry_tests {
    use super::*;
    use crate::mr::{MrSlice, RemoteMemory};
    use crate::wr::{Payload, Sge};

    /// An empty slice or empty inline data goes to the provider as no entry at all (some read
    /// length 0 as 2 GiB), on every request kind and in lists; a caller's list with an empty
    /// entry is refused.
    #[test]
    fn nothing_of_length_zero_reaches_the_provider() {
        let empty = MrSlice::unchecked_for_test(0x1000, 0, 7);
        let mut raw = ffi::ibv_send_wr::default();
        let mut one = ffi::ibv_sge::default();
        for request in [
            SendRequest::send(empty).tag(1).into_wr(),
            SendRequest::send(Payload::Inline(&[])).tag(2).into_wr(),
            SendRequest::read(
                empty,
                RemoteMemory {
                    addr: 0x2000,
                    len: 64,
                    rkey: 9,
                },
            )
            .tag(3)
            .into_wr(),
        ] {
            request.fill(&mut raw, &mut one).unwrap();
            assert_eq!((raw.num_sge, raw.sg_list), (0, std::ptr::null_mut()));
            assert_eq!(raw.send_flags & ffi::IBV_SEND_INLINE, 0);
        }
        let mut recv = ffi::ibv_recv_wr::default();
        RecvRequest::new(empty)
            .tag(4)
            .fill(&mut recv, &mut one)
            .unwrap();
        assert_eq!((recv.num_sge, recv.sg_list), (0, std::ptr::null_mut()));

        let mut list: RecvList<'_> = PostList::with_capacity(2);
        list.push(RecvRequest::new(empty).tag(5)).unwrap();
        assert_eq!(list.wrs[0].num_sge, 0);
        assert!(list.wrs[0].sg_list.is_null());

        let entry = |addr, length| Sge {
            raw: ffi::ibv_sge {
                addr,
                length,
                lkey: 7,
            },
            _region: PhantomData,
        };
        let entries = [entry(0x1000, 8), entry(0x2000, 0)];
        let refused = SendRequest::send(&entries[..])
            .tag(6)
            .wr()
            .fill(&mut raw, &mut one);
        assert!(
            matches!(refused, Err(Error::InvalidArgument(_))),
            "{refused:?}"
        );
    }
}
