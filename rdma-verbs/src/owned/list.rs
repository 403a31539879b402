//! Doorbell-batched owned posts: a list of owned requests handed to the device in one post
//! call, each request's buffer moving into the in-flight table exactly as a single owned post
//! moves it (see the parent module for why that is sound).
//!
//! A post records every request of the list, builds the work-request chain, and posts it. The
//! requests the provider did not take (a full queue, a refused request, a check that failed
//! before anything was posted) are taken back out of the table, in reverse order, and stay in
//! the list with their buffers, so the caller can post them again or drop them.

use std::cell::Cell;
use std::fmt;
use std::sync::Arc;

use super::recv::{check_room, room};
use super::{Owned, OwnedSges, PostRefused, Prepared, RegionRange, Table, check_pd};
use crate::buf::Buf;
use crate::error::{Error, Result};
use crate::ffi;
use crate::inflight::{Ring, SrqTable};
use crate::mw::MwShared;
use crate::qp::{
    CanPostRecv, QpState, QueuePair, Rts, Transport, check_ops, may_have_posted, next_run,
};
use crate::srq::SharedReceiveQueue;
use crate::wr::{
    Operation, PostList, RecvList, RecvRequest, SendList, SendRequest, SendWr, WorkRequest, op,
};

/// A list of owned send requests, posted with one doorbell by
/// [`QueuePair::post_send_list`].
///
/// The storage is allocated once, by [`with_capacity`](Self::with_capacity); pushing and
/// posting allocate nothing. After a post the list holds the requests the queue pair did not
/// take (none when the post succeeded), with their buffers: post it again, or
/// [`clear`](Self::clear) it (the buffers go back to their pools), or take the buffers with
/// [`take_bufs`](Self::take_bufs).
#[must_use = "a list does nothing until it is posted"]
pub struct OwnedSendList<'a> {
    items: Vec<Prepared<'a>>,
    ids: Vec<(u64, bool)>,
    chain: Chain<SendRequest<'static>>,
}

/// The storage of a work-request chain: filled during a post, empty otherwise.
pub(crate) struct Chain<W: WorkRequest>(PostList<'static, W>);

impl<W: WorkRequest> Chain<W> {
    /// Storage for chains of up to `capacity` requests.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self(PostList::with_capacity(capacity))
    }

    /// How many requests a chain may hold (0 after an unwind through [`with_chain`]).
    pub(crate) fn capacity(&self) -> usize {
        self.0.capacity()
    }
}

// SAFETY: a `PostList` is not `Send`/`Sync` because of the raw pointers its requests hold
// (into its own vectors, into registered memory, to address handles). A `Chain` holds none
// outside a post: `with_chain` fills it and empties it again before it returns, on every path
// (during an unwind it holds an empty placeholder), and a post runs under `&mut` of the list.
// An empty `PostList` is two empty vectors and counters.
unsafe impl<W: WorkRequest> Send for Chain<W> {}
// SAFETY: as for `Send`; through `&Chain` only the capacity is read.
unsafe impl<W: WorkRequest> Sync for Chain<W> {}

/// A list of owned receives, posted with one doorbell by [`QueuePair::post_recv_list`] or
/// [`SharedReceiveQueue::post_recv_list`]. Works as [`OwnedSendList`] does.
#[must_use = "a list does nothing until it is posted"]
pub struct OwnedRecvList {
    items: Vec<RecvItem>,
    ids: Vec<(u64, bool)>,
    chain: Chain<RecvRequest<'static>>,
}

/// An owned receive waiting in a list: its buffer (in the list, or in flight while a post
/// runs), its range's region, the entries of both, and its tag.
struct RecvItem {
    buf: Option<Buf>,
    range: Option<RegionRange>,
    /// Empty once disarmed.
    sges: OwnedSges,
    tag: u64,
}

/// What a list post needs of an item.
trait Item {
    fn buf(&mut self) -> &mut Option<Buf>;
    /// Makes the item name no memory: its buffer did not come back (see `post_list`).
    fn disarm(&mut self);
    fn tag(&self) -> u64;
    /// What the item's in-flight entry keeps alive (a reference of its own).
    fn keep(&self) -> Option<Arc<dyn Send + Sync>>;
    /// The provider may have the item's request (see `Prepared::hand_over`): the window of a
    /// bind, for the queue pair to record.
    fn hand_over(&mut self) -> Option<Arc<MwShared>>;
    /// The window of a bind, locked while the post verb runs.
    fn window(&self) -> Option<&Arc<MwShared>> {
        None
    }
}

impl Item for Prepared<'_> {
    fn buf(&mut self) -> &mut Option<Buf> {
        &mut self.buf
    }
    fn disarm(&mut self) {
        self.disarm();
    }
    fn tag(&self) -> u64 {
        Prepared::tag(self)
    }
    fn keep(&self) -> Option<Arc<dyn Send + Sync>> {
        Prepared::keep(self)
    }
    fn hand_over(&mut self) -> Option<Arc<MwShared>> {
        Prepared::hand_over(self)
    }
    fn window(&self) -> Option<&Arc<MwShared>> {
        Prepared::window(self)
    }
}

impl Item for RecvItem {
    fn buf(&mut self) -> &mut Option<Buf> {
        &mut self.buf
    }
    fn disarm(&mut self) {
        self.sges.clear();
    }
    fn tag(&self) -> u64 {
        self.tag
    }
    fn keep(&self) -> Option<Arc<dyn Send + Sync>> {
        let region = self.range.as_ref()?.region();
        Some(Arc::clone(region) as Arc<dyn Send + Sync>)
    }
    fn hand_over(&mut self) -> Option<Arc<MwShared>> {
        None
    }
}

/// The methods both lists have, and their `Debug`.
macro_rules! list_common {
    ($list:ty, $name:literal, $what:literal) => {
        impl $list {
            #[doc = concat!("The number of ", $what, " in the list.")]
            pub fn len(&self) -> usize {
                self.items.len()
            }

            /// Whether the list is empty.
            pub fn is_empty(&self) -> bool {
                self.items.is_empty()
            }

            #[doc = concat!("How many ", $what, " fit.")]
            pub fn capacity(&self) -> usize {
                self.items
                    .capacity()
                    .min(self.ids.capacity())
                    .min(self.chain.0.capacity())
            }

            #[doc = concat!("Removes every one of the ", $what, "; their buffers go back to their pools.")]
            pub fn clear(&mut self) {
                self.items.clear();
            }

            #[doc = concat!("Removes every one of the ", $what, " and yields their buffers (those without one yield none).")]
            pub fn take_bufs(&mut self) -> impl Iterator<Item = Buf> + '_ {
                self.items.drain(..).filter_map(|item| item.buf)
            }
        }

        impl fmt::Debug for $list {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct($name)
                    .field("len", &self.len())
                    .field("capacity", &self.capacity())
                    .finish()
            }
        }
    };
}

/// The refusal of a push into a full list.
fn list_full(capacity: usize) -> Error {
    Error::InvalidArgument(format!("the post list is full ({capacity} requests)"))
}

impl<'a> OwnedSendList<'a> {
    /// A list with room for `capacity` requests.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            items: Vec::with_capacity(capacity),
            ids: Vec::with_capacity(capacity),
            chain: Chain(SendList::with_capacity(capacity)),
        }
    }

    /// Appends `request`. Checks what can be checked without the queue pair (as
    /// [`QueuePair::post_send_owned`] does); does not allocate.
    ///
    /// # Errors
    ///
    /// [`PostRefused`] with the request's buffer: [`Error::InvalidArgument`] for a full list,
    /// an atomic whose buffer holds fewer than 8 bytes, a READ or WRITE longer than its
    /// remote memory, immediate data on an operation that cannot carry it, a READ into a range
    /// of a region that is not shared, a range on an inline request, on a UD send or given
    /// twice, or a request the work-request encoding refuses. (Protection domains are checked
    /// when the list is posted.)
    pub fn push<K: Operation>(
        &mut self,
        request: SendRequest<'a, K, Owned<'a>>,
    ) -> std::result::Result<(), PostRefused> {
        if self.items.len() >= self.capacity() {
            return Err(PostRefused {
                error: list_full(self.capacity()),
                buf: request.into_buf(),
            });
        }
        let prepared = request.prepare()?;
        if let Err(error) = prepared.check_sharing() {
            return Err(PostRefused {
                error,
                buf: prepared.buf,
            });
        }
        // The chain is built at post time from requests checked here, so building it then
        // cannot fail.
        let request = prepared.request(0, false);
        let mut raw = ffi::ibv_send_wr::default();
        let mut one = ffi::ibv_sge::default();
        let checked = match request.op() & op::INVALID {
            0 => request.fill(&mut raw, &mut one),
            _ => Err(Error::InvalidArgument(
                "immediate data on an operation other than SEND or RDMA WRITE, or inline data \
                 as the target of a read"
                    .into(),
            )),
        };
        if let Err(error) = checked {
            return Err(PostRefused {
                error,
                buf: prepared.buf,
            });
        }
        self.items.push(prepared);
        Ok(())
    }
}

list_common!(OwnedSendList<'_>, "OwnedSendList", "requests");

impl OwnedRecvList {
    /// A list with room for `capacity` receives.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            items: Vec::with_capacity(capacity),
            ids: Vec::with_capacity(capacity),
            chain: Chain(RecvList::with_capacity(capacity)),
        }
    }

    /// Appends a receive into the whole of `buf`, with `tag`. Does not allocate.
    ///
    /// # Errors
    ///
    /// [`PostRefused`] with the buffer: [`Error::InvalidArgument`] for a full list.
    pub fn push(&mut self, buf: Buf, tag: u64) -> std::result::Result<(), PostRefused> {
        self.push_owned(RecvRequest::new(buf).tag(tag))
    }

    /// Appends an owned receive (a buffer, a range of a shared region, or both). Does not
    /// allocate. The range's protection domain and sharing are checked when the list is
    /// posted, as its buffer's are.
    ///
    /// # Errors
    ///
    /// [`PostRefused`] with the buffer: [`Error::InvalidArgument`] for a full list, or a
    /// receive given two ranges.
    pub fn push_owned(
        &mut self,
        request: RecvRequest<'_, Owned<'_>>,
    ) -> std::result::Result<(), PostRefused> {
        let (tag, memory) = request.into_parts();
        let Owned {
            buf,
            range,
            ranges_over,
            ..
        } = memory;
        if self.items.len() >= self.capacity() {
            return Err(PostRefused {
                error: list_full(self.capacity()),
                buf,
            });
        }
        if ranges_over {
            return Err(PostRefused {
                error: super::range::second_range("receive"),
                buf,
            });
        }
        let sges = OwnedSges::new(buf.as_ref().map(|b| b.raw_slice(true)), range.as_ref());
        self.items.push(RecvItem {
            buf,
            range,
            sges,
            tag,
        });
        Ok(())
    }
}

list_common!(OwnedRecvList, "OwnedRecvList", "receives");

/// Refuses the list unless every buffer's region is in protection domain `pd` (nothing is
/// recorded or posted then); the error names the first request refused.
fn check_pds<I: Item>(items: &mut [I], pd: *mut ffi::ibv_pd) -> Result<()> {
    for (index, item) in items.iter_mut().enumerate() {
        check_pd(item.buf().as_ref(), pd).map_err(|error| at(index, error))?;
    }
    Ok(())
}

/// Refuses a receive list unless every buffer and range is in protection domain `pd` and
/// every range's region is shared (see [`RegionRange`]).
fn check_recvs(items: &mut [RecvItem], pd: *mut ffi::ibv_pd) -> Result<()> {
    check_pds(items, pd)?;
    for (index, item) in items.iter().enumerate() {
        if let Some(range) = &item.range {
            range.check(pd, true).map_err(|error| at(index, error))?;
        }
    }
    Ok(())
}

/// Refuses a send list holding a request a `T` queue pair in protection domain `pd` does not
/// take: as [`check_pds`], and an operation the transport does not allow, a destination on a
/// connected queue pair or none on UD, an address handle of another protection domain.
fn check_sends<T: Transport>(items: &mut [Prepared<'_>], pd: *mut ffi::ibv_pd) -> Result<()> {
    check_pds(items, pd)?;
    for (index, item) in items.iter().enumerate() {
        item.check_range(pd).map_err(|error| at(index, error))?;
        let request = item.request(0, false);
        check_ops::<T>(request.op(), usize::from(request.is_datagram()), 1)
            .and_then(|()| request.check_object_pd(pd))
            .map_err(|error| at(index, error))?;
    }
    Ok(())
}

/// `error`, said of request `index` of a list.
fn at(index: usize, error: Error) -> Error {
    match error {
        Error::InvalidArgument(why) => Error::InvalidArgument(format!("request {index}: {why}")),
        other => other,
    }
}

/// How many requests of a chain of `len` a post that failed with `error` handed to the
/// device: those before the index it names, all of them when the provider did not say (they
/// stay in flight until a completion, a reset or the queue's destruction releases them), and
/// none for an error raised before the post verb ran.
pub(crate) fn posted_before(error: &Error, len: usize) -> usize {
    if may_have_posted(error) {
        return len;
    }
    match error {
        Error::QueueFull { index, .. } | Error::Post { index, .. } => (*index).min(len),
        _ => 0,
    }
}

/// A queue that posts lists: what it does with the window of a bind it posted (a send queue
/// records it, to deallocate it before its destruction: `mw.rs`).
trait KeepWindow {
    fn keep_window(&mut self, _window: Arc<MwShared>) {}
}

impl<T: Transport, S: QpState> KeepWindow for QueuePair<T, S> {
    fn keep_window(&mut self, window: Arc<MwShared>) {
        QueuePair::keep_window(self, window);
    }
}

impl KeepWindow for SharedReceiveQueue {}

/// Posts `items` as one chain: records each in `table` (stopping at the first the table
/// refuses), lets `post` build and post the chain of the recorded ones with their ids, takes
/// back what the device did not get, and leaves only that in `items`.
fn post_list<Q: KeepWindow, Tb: Table, I: Item>(
    queue: &mut Q,
    table: impl Fn(&Q) -> &Tb,
    items: &mut Vec<I>,
    ids: &mut Vec<(u64, bool)>,
    post: impl FnOnce(&mut Q, &[I], &[(u64, bool)]) -> Result<()>,
) -> Result<()> {
    ids.clear();
    let mut refused = None;
    for item in items.iter_mut() {
        let keep = item.keep();
        let tag = item.tag();
        // SAFETY: `queue` is held `&mut` (the table a queue's getter returns is its own).
        match unsafe { table(queue).record(tag, item.buf().take(), keep) } {
            // Below capacity: `ids` has room for every item.
            Ok(recorded) => ids.push(recorded),
            Err((error, buf)) => {
                *item.buf() = buf;
                refused = Some(match error {
                    Error::QueueFull { verb, .. } => Error::QueueFull {
                        verb,
                        index: ids.len(),
                    },
                    other => other,
                });
                break;
            }
        }
    }
    let recorded = ids.len();
    let result = if recorded == 0 {
        Ok(())
    } else {
        // Each bind holds its window's lock from the check that the window is allocated until
        // the post verb returns (`mw.rs`); a list with no bind allocates nothing here. A
        // window deallocated meanwhile refuses the whole chain before the verb.
        let mut guards = Vec::new();
        let mut refused_window = None;
        for window in items[..recorded].iter().filter_map(Item::window) {
            match window.lock_for_post() {
                Ok(guard) => guards.push(guard),
                Err(error) => {
                    refused_window = Some(error);
                    break;
                }
            }
        }
        let result = match refused_window {
            Some(error) => Err(error),
            None => post(queue, &items[..recorded], ids),
        };
        drop(guards);
        result
    };
    let posted = match &result {
        Ok(()) => recorded,
        Err(error) => posted_before(error, recorded),
    };
    // Undo in reverse: a ring takes back only its newest entry.
    for (item, &(id, _)) in items[posted..recorded].iter_mut().zip(&ids[posted..]).rev() {
        // SAFETY: as for `record`.
        match unsafe { table(queue).unrecord(id) } {
            Some(entry) => *item.buf() = entry.buf,
            // Cannot happen (the request was never posted, and `&mut` keeps other posts
            // out); if it did, the buffer is not ours to hand back, and the item must never
            // name its bytes again.
            None => {
                debug_assert!(false, "an unposted request left its table");
                item.disarm();
            }
        }
    }
    for item in &mut items[..posted] {
        if let Some(window) = item.hand_over() {
            queue.keep_window(window);
        }
    }
    items.drain(..posted);
    ids.clear();
    match (result, refused) {
        (Err(error), _) | (Ok(()), Some(error)) => Err(error),
        (Ok(()), None) => Ok(()),
    }
}

/// The run of unsignaled sends after a list of `len` sends was posted from run `start`
/// (`next_run` for each request the provider took, `signals` saying whether its path signals
/// it whatever the run: asked, or the table's last slot), given the post's `result`: all of
/// them, those before the one refused, none for an error raised before the post verb, and
/// when the provider did not say what it took, one more per request, the most it can be.
pub(crate) fn run_after(
    start: u32,
    every: u32,
    signals: impl Iterator<Item = bool>,
    len: usize,
    result: &Result<()>,
) -> u32 {
    let took = match result {
        Ok(()) => len,
        Err(error) if may_have_posted(error) => {
            return start.saturating_add(u32::try_from(len).unwrap_or(u32::MAX));
        }
        Err(error) => posted_before(error, len),
    };
    signals
        .take(took)
        .fold(start, |run, signal| next_run(run, signal, every))
}

/// Builds the chain of `items` in `storage`'s vectors and hands it to `post`; the storage is
/// put back, empty, whatever happens.
pub(crate) fn with_chain<'s, W, V, R, I>(
    storage: &mut Chain<W>,
    items: &'s [I],
    ids: &[(u64, bool)],
    request: impl Fn(&'s I, u64, bool) -> R,
    post: impl FnOnce(&mut PostList<'s, V>) -> Result<()>,
) -> Result<()>
where
    W: WorkRequest,
    V: WorkRequest<Raw = W::Raw>,
    R: WorkRequest<Raw = W::Raw> + 's,
{
    let mut chain: PostList<'s, V> =
        std::mem::replace(&mut storage.0, PostList::with_capacity(0)).reuse();
    let mut result = Ok(());
    for (item, &(id, last_slot)) in items.iter().zip(ids) {
        if let Err(error) = chain.push(request(item, id, last_slot)) {
            result = Err(error);
            break;
        }
    }
    if result.is_ok() {
        result = post(&mut chain);
    }
    storage.0 = chain.reuse();
    result
}

impl<T: Transport> QueuePair<T, Rts> {
    /// Posts every request of `list` with one doorbell (`ibv_post_send` of a chain), each as
    /// [`post_send_owned`](Self::post_send_owned) posts one: its buffer moves into the queue
    /// pair until its completion, or a later one of this queue pair, hands it back through
    /// [`CompletionQueue::poll_each`](crate::CompletionQueue::poll_each). Allocates nothing
    /// (but for the record of a bind's window, as there).
    ///
    /// Unsignaled requests produce no completion; signal at least the last of a list whose
    /// buffers you want back soon. A request that takes the queue's last free slot is signaled
    /// whatever it asked, and so is one that would make `max_send_wr` unsignaled sends of this
    /// queue pair in a row (owned and slot sends counted together).
    ///
    /// On success the list is empty. On error it holds, in order and with their buffers, the
    /// requests the device did not get; those before them were posted.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`], nothing posted, the message naming the request
    ///   (`request 2: ...`): a buffer, range or address handle of another protection domain, an
    ///   operation the transport does not allow, a missing or unexpected UD destination;
    /// - [`Error::QueueFull`] with `index` and verb `owned post`: as many owned requests are in
    ///   flight as the send queue holds; the requests before `index` were posted;
    /// - [`Error::QueueFull`] or [`Error::Post`] with `index` and verb `ibv_post_send`: the
    ///   provider's queue was full, or it refused that request; those before it were posted;
    /// - [`Error::PostIndeterminate`], or any error with verb `ibv_wr_complete` (the extended
    ///   path): the provider did not say what it took, so every request it was given is taken
    ///   as posted and stays in flight until a completion, a reset or the queue pair's
    ///   destruction releases it; the list keeps only requests that never reached the
    ///   provider (none, unless the in-flight table was full first).
    ///
    /// # Liveness
    ///
    /// If the extended path fails after it took a list whose last request was made signaled
    /// because it filled the table, and the provider in fact dropped the batch, nothing
    /// completes the unsignaled requests before it: owned posts then fail with
    /// [`Error::QueueFull`] until the queue pair is reset. Not seen on rxe; it needs the
    /// provider's queue to be full while the table is not, which only other posts to the same
    /// queue pair (slot, ring or `unsafe` ones) can cause.
    ///
    /// # References
    ///
    /// [`ibv_post_send(3)`](https://man7.org/linux/man-pages/man3/ibv_post_send.3.html)
    #[doc(alias = "ibv_post_send")]
    pub fn post_send_list(&mut self, list: &mut OwnedSendList<'_>) -> Result<()> {
        if list.is_empty() {
            return Ok(());
        }
        check_sends::<T>(&mut list.items, self.pd().as_raw())?;
        let OwnedSendList { items, ids, chain } = list;
        post_list(
            self,
            |qp: &Self| -> &Ring { &qp.tables().send },
            items,
            ids,
            |qp, items, ids| {
                // Each request signaled as `post_send_owned` signals one, the run of unsignaled
                // sends carried from request to request.
                let (start, every) = (qp.unsignaled_run(), qp.caps().max_send_wr);
                let signal = |item: &Prepared<'_>, last_slot: bool| item.asks_signal() || last_slot;
                let run = Cell::new(start);
                let result = with_chain(
                    chain,
                    items,
                    ids,
                    |item, id, last_slot| {
                        run.set(next_run(run.get(), signal(item, last_slot), every));
                        send_request(item, id, run.get() == 0)
                    },
                    |chain| {
                        // SAFETY: as in `post_send_owned`, for each request of the chain: its
                        // buffer is in the send table (recorded by `post_list` before this
                        // call) and leaves it only with a completion of this queue, the queue
                        // pair's reset or destruction, or `post_list`'s undo of a request the
                        // device did not get. Inline bytes are copied during the call.
                        unsafe { qp.post_send(chain) }
                    },
                );
                let signals = items
                    .iter()
                    .zip(ids.iter())
                    .map(|(item, &(_, last_slot))| signal(item, last_slot));
                let after = run_after(start, every, signals, items.len(), &result);
                qp.set_unsignaled_run(after);
                result
            },
        )
    }
}

impl<T: Transport, S: CanPostRecv> QueuePair<T, S> {
    /// Posts every receive of `list` with one doorbell (`ibv_post_recv` of a chain), each as
    /// [`post_recv_buf`](Self::post_recv_buf) posts one. Allocates nothing. On success the
    /// list is empty; on error it holds the receives the device did not get, with their
    /// buffers.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`], nothing posted: a queue pair on an SRQ, a receive on UD with
    /// room for fewer than [`GRH_LEN`](crate::ah::GRH_LEN) bytes, a buffer or range of another
    /// protection domain, a range of a region that is not shared; [`Error::QueueFull`]
    /// or [`Error::Post`] with `index`, and [`Error::PostIndeterminate`], as for
    /// [`post_send_list`](QueuePair::post_send_list).
    ///
    /// # References
    ///
    /// [`ibv_post_recv(3)`](https://man7.org/linux/man-pages/man3/ibv_post_recv.3.html)
    #[doc(alias = "ibv_post_recv")]
    pub fn post_recv_list(&mut self, list: &mut OwnedRecvList) -> Result<()> {
        if list.is_empty() {
            return Ok(());
        }
        if self.has_srq() {
            return Err(Error::InvalidArgument(
                "a queue pair on an SRQ receives through the SRQ".into(),
            ));
        }
        check_recvs(&mut list.items, self.pd().as_raw())?;
        for (index, item) in list.items.iter().enumerate() {
            check_room::<T>(room(item.buf.as_ref(), item.range.as_ref()))
                .map_err(|error| at(index, error))?;
        }
        let OwnedRecvList { items, ids, chain } = list;
        post_list(
            self,
            |qp: &Self| -> &Ring { &qp.tables().recv },
            items,
            ids,
            |qp, items, ids| {
                with_chain(chain, items, ids, recv_request, |chain| {
                    // SAFETY: as in `post_recv_buf`, for each receive of the chain: its buffer is
                    // in the receive table until its completion, the queue pair's reset or
                    // destruction, or `post_list`'s undo of a receive the device did not get.
                    unsafe { qp.post_recv(chain) }
                })
            },
        )
    }
}

impl SharedReceiveQueue {
    /// Posts every receive of `list` to the SRQ with one doorbell, each as
    /// [`post_recv_buf`](Self::post_recv_buf) posts one. Allocates nothing. On success the
    /// list is empty; on error it holds the receives the device did not get.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`], nothing posted: a buffer or range of another protection
    /// domain, a range of a region that is not shared;
    /// [`Error::QueueFull`] or [`Error::Post`] with `index`, and [`Error::PostIndeterminate`],
    /// as for [`QueuePair::post_send_list`].
    ///
    /// # References
    ///
    /// [`ibv_post_srq_recv(3)`](https://man7.org/linux/man-pages/man3/ibv_post_srq_recv.3.html)
    #[doc(alias = "ibv_post_srq_recv")]
    pub fn post_recv_list(&mut self, list: &mut OwnedRecvList) -> Result<()> {
        if list.is_empty() {
            return Ok(());
        }
        check_recvs(&mut list.items, self.pd().as_raw())?;
        let OwnedRecvList { items, ids, chain } = list;
        post_list(
            self,
            |srq: &Self| -> &SrqTable { &srq.inner.table },
            items,
            ids,
            |srq, items, ids| {
                with_chain(chain, items, ids, recv_request, |chain| {
                    // SAFETY: as in `SharedReceiveQueue::post_recv_buf`, for each receive: its
                    // buffer is in the SRQ's table until the completion with its id, the SRQ's
                    // destruction, or `post_list`'s undo of a receive the device did not get.
                    unsafe { srq.post_recv(chain) }
                })
            },
        )
    }
}

/// The receive request of a list item with owned id `id`.
fn recv_request(item: &RecvItem, id: u64, _last_slot: bool) -> RecvRequest<'_> {
    RecvRequest::owned(item.sges.payload(), id)
}

/// The send request of a list item with owned id `id`, signaled whatever it asked if `signal`.
fn send_request<'s>(item: &'s Prepared<'_>, id: u64, signal: bool) -> SendWr<'s> {
    item.request(id, signal)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Errno;
    use crate::qp::EXTENDED_POST_VERB;

    /// The run after a list: replayed over the requests the provider took (all, those before
    /// the refused one, none for an error before the post verb), and one more per request
    /// when it did not say what it took; never below the true run.
    #[test]
    fn the_run_after_a_list_follows_what_the_provider_took() {
        // Four sends from run 1, bound 4: the third is forced (run 4), the fourth asked.
        let signals = [false, false, false, true];
        let after = |result: &Result<()>| run_after(1, 4, signals.iter().copied(), 4, result);
        assert_eq!(after(&Ok(())), 0, "the last one was signaled");
        let refused = |index| Error::Post {
            verb: "ibv_post_send",
            index,
            errno: Errno::INVAL,
        };
        assert_eq!(after(&Err(refused(0))), 1, "none taken");
        assert_eq!(after(&Err(refused(2))), 3, "two taken");
        assert_eq!(after(&Err(refused(3))), 0, "the forced one taken");
        let full = Error::QueueFull {
            verb: "ibv_post_send",
            index: 1,
        };
        assert_eq!(after(&Err(full)), 2);
        for unknown in [
            Error::PostIndeterminate {
                verb: "ibv_post_send",
                errno: Errno::BUSY,
            },
            Error::Post {
                verb: EXTENDED_POST_VERB,
                index: 0,
                errno: Errno::NOMEM,
            },
        ] {
            assert_eq!(after(&Err(unknown)), 5, "the most it can be");
        }
        assert_eq!(after(&Err(Error::InvalidArgument("built".into()))), 1);
        assert_eq!(
            run_after(u32::MAX - 1, u32::MAX, [false; 3].into_iter(), 3, &{
                Err(Error::PostIndeterminate {
                    verb: "ibv_post_send",
                    errno: Errno::BUSY,
                })
            }),
            u32::MAX,
            "saturates"
        );
    }
}
