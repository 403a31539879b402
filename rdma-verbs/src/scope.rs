//! A safe way to post: memory stays borrowed until its completion is reaped.
//!
//! [`QueuePair::scope`] runs a closure with a [`PostScope`]. Requests posted through the scope
//! borrow their memory for the whole scope, and the scope does not end until every request it
//! posted has completed: the closure reaps completions with [`PostScope::poll`], and whatever
//! is still outstanding when it returns (or panics) is waited for, then flushed by moving the
//! queue pair to the error state, and as a last resort discarded by resetting it. Memory is
//! therefore never freed, moved or touched by Rust while the device may still use it.
//!
//! The device writes only memory borrowed exclusively ([`MrSliceMut`]): receive buffers, RDMA
//! read targets and atomics' result words. Send and write sources are shared borrows, so Rust
//! may read them while the device does, but not change them.
//!
//! The scope counts completions to know when the device is done, so it must see every
//! completion of its queue pair and no one else's: it takes the queue pair's own completion
//! queues, and only if no other queue pair uses them (see [`QueuePair::scope`]). The proof of
//! soundness is in `docs/safety.md`, section "The safe post path: `QueuePair::scope`".

use std::io::Write;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ah::AddressHandle;
use crate::cq::{CompletionQueue, CqInner, WorkCompletion, poll_until};
use crate::error::{Error, Result};
use crate::ffi;
use crate::flags::SendFlags;
use crate::mr::{MrSliceMut, RemoteMemory};
use crate::qp::{QpStateKind, QueuePair, Rts, Transport, may_have_posted};
use crate::wr::{Operation, Payload, RecvRequest, SendRequest, SendWr, op};

/// How long the end of a scope waits for outstanding completions before flushing them.
const DRAIN: Duration = Duration::from_secs(5);
/// How long it then waits for the flush completions before resetting the queue pair.
const FLUSH: Duration = Duration::from_secs(5);
/// The longest drain [`PostScope::set_drain_timeout`] accepts.
const MAX_DRAIN: Duration = Duration::from_secs(600);
/// Empty polls a wait yields between before it starts sleeping.
const SPIN_ROUNDS: u32 = 1000;
/// The sleep between empty polls after that.
const IDLE_SLEEP: Duration = Duration::from_micros(100);

/// The completion queues a scope polls: the queue pair's send CQ and, if different, its receive
/// CQ. They must be the very queues the queue pair was created with, and no other queue pair
/// may use them; [`QueuePair::scope`] checks both.
#[derive(Debug)]
#[must_use = "the queues do nothing until a scope runs with them"]
pub struct ScopeCqs<'env> {
    send: &'env mut CompletionQueue,
    recv: Option<&'env mut CompletionQueue>,
}

impl<'env> ScopeCqs<'env> {
    /// The queue pair's one completion queue, which it uses for sends and receives.
    pub fn shared(cq: &'env mut CompletionQueue) -> Self {
        Self {
            send: cq,
            recv: None,
        }
    }

    /// The queue pair's send and receive completion queues, when they are two queues.
    pub fn split(send: &'env mut CompletionQueue, recv: &'env mut CompletionQueue) -> Self {
        Self {
            send,
            recv: Some(recv),
        }
    }
}

/// Posting and reaping inside [`QueuePair::scope`]: the safe way to post.
///
/// Everything a request names must outlive the whole scope (`'scope`), and the scope does not
/// end until every request it posted has completed: the closure reaps completions with
/// [`poll`](Self::poll); whatever is still outstanding when it returns (or panics) is waited
/// for, then flushed by moving the queue pair to the error state, and as a last resort
/// discarded by resetting it. The device writes only memory borrowed exclusively
/// ([`MrSliceMut`]): receive buffers, RDMA read targets and atomics' result words. Send and
/// write sources are shared borrows, so Rust may read them meanwhile but not change them.
#[derive(Debug)]
pub struct PostScope<'scope, 'env, T: Transport> {
    qp: &'scope mut QueuePair<T, Rts>,
    cqs: &'scope mut ScopeCqs<'env>,
    outstanding: usize,
    /// Set when a poll found more of this queue pair's completions than were outstanding:
    /// the count can no longer be trusted, and the scope ends by resetting the queue pair.
    miscounted: bool,
    drain: Duration,
    finished: bool,
    // Invariant in both lifetimes, as `std::thread::Scope` is.
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

impl<T: Transport> QueuePair<T, Rts> {
    /// Runs `f` with a [`PostScope`] on this queue pair, and returns once every request posted
    /// in it has completed.
    ///
    /// `cqs` must hold this queue pair's own completion queues (the ones it was created with:
    /// [`ScopeCqs::shared`] when it uses one queue for sends and receives, [`ScopeCqs::split`]
    /// otherwise), and no other queue pair may use them: the scope knows the device is done with
    /// its memory by counting completions, so it must see every completion of this queue pair
    /// and nothing else may complete into its queues. Completions the scope reaps itself (at
    /// its start and at its end) are discarded.
    ///
    /// For the same reason requests posted earlier with the `unsafe` functions must have
    /// completed and been polled (their contract says so), and a queue pair that takes its
    /// receives from an SRQ is refused: receives posted to the SRQ elsewhere would complete
    /// with this queue pair's number.
    ///
    /// Before it runs `f`, the scope empties the queues: anything there is stale (late
    /// completions of requests an earlier scope discarded by a reset, or those of a destroyed
    /// queue pair whose number this one now has) and would be miscounted. That costs one empty
    /// `ibv_poll_cq` per queue.
    ///
    /// When the scope ends with requests outstanding it waits for them, then moves the queue
    /// pair to the error state (flushing them), and if even that does not complete them,
    /// resets it. A scope that reaped more of its queue pair's completions than it had
    /// outstanding cannot trust its count, and ends by resetting the queue pair too. If the
    /// reset itself fails, the device may still write memory that Rust is about to use again,
    /// and no safe way out remains: the process aborts.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`], before anything is posted, for a queue pair attached to an
    /// SRQ, for completion queues that are not this queue pair's (another queue, another
    /// device's, or `shared` given for a queue pair with two queues), for queues another
    /// queue pair also uses, for queues that do not empty, for a queue pair an earlier scope
    /// left in the error state or RESET (reset and reconnect it first), and for a queue pair
    /// with owned requests ([`post_send_owned`](Self::post_send_owned)) in flight.
    /// [`Error::Incomplete`] if requests were still outstanding when `f` returned and their
    /// completions did not arrive within 5 s (configurable with
    /// [`PostScope::set_drain_timeout`]): the queue pair was then moved to the error state (or
    /// reset), whatever its type says; check [`query_state`](Self::query_state). Also
    /// [`Error::Incomplete`], with state RESET, when the count went wrong (more completions
    /// than requests). A polling error at the end is returned after the same clean-up.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use rdma_verbs::{*, ah::*, async_event::*, channel::*, cq::*, device::*, mr::*, mw::*, owned::*, qp::*, scope::*, slot::*, srq::*, wr::*, xrcd::*, ah::*, async_event::*, channel::*, cq::*, device::*, mr::*, mw::*, owned::*, qp::*, scope::*, slot::*, srq::*, wr::*, xrcd::*};
    /// # fn f(qp: &mut QueuePair<Rc, Rts>, cq: &mut CompletionQueue, mr: &mut MemoryRegion,
    /// #      src: &MemoryRegion) -> Result<()> {
    /// let target = mr.slice_mut(..64)?;
    /// qp.scope(ScopeCqs::shared(cq), |s| -> Result<()> {
    ///     s.recv(1, &target)?;
    ///     s.send(SendRequest::send(src.slice(..64)?).tag(2))?;
    ///     let mut wcs = [WorkCompletion::default(); 4];
    ///     while s.outstanding() > 0 {
    ///         for wc in s.poll(&mut wcs)? {
    ///             assert!(wc.is_success());
    ///         }
    ///     }
    ///     Ok(())
    /// })??;
    /// // `target`'s region may be read again here: the device is done with it.
    /// # Ok(()) }
    /// ```
    pub fn scope<'env, F, R>(&'env mut self, mut cqs: ScopeCqs<'env>, f: F) -> Result<R>
    where
        F: for<'scope> FnOnce(&mut PostScope<'scope, 'env, T>) -> R,
    {
        if self.has_srq() {
            return Err(Error::InvalidArgument(
                "a scope cannot run on a queue pair attached to an SRQ".into(),
            ));
        }
        if self.owned_in_flight() > 0 {
            // Their completions carry this queue pair's number: the scope would count them.
            return Err(Error::InvalidArgument(
                "owned requests are in flight on this queue pair: reap them before a scope".into(),
            ));
        }
        if !self.tables().attached.is_empty() {
            // Its slot rings' completions carry this queue pair's number too.
            return Err(Error::InvalidArgument(
                "a queue pair with a slot ring cannot open a scope".into(),
            ));
        }
        check_cqs(self.cq_inners(), &cqs)?;
        let mut scope = PostScope {
            qp: self,
            cqs: &mut cqs,
            outstanding: 0,
            miscounted: false,
            drain: DRAIN,
            finished: false,
            _scope: PhantomData,
            _env: PhantomData,
        };
        // Nothing in the queues can be this scope's: they are this queue pair's alone, and
        // earlier requests have completed and been polled (the unsafe posts' contract). What
        // is there is stale (a reset scope's late completions, or those of a destroyed queue
        // pair whose number this one now has) and would be miscounted: it is discarded.
        scope.finished = true;
        if !scope.purge()? {
            return Err(Error::InvalidArgument(
                "the completion queues do not empty: completions keep arriving for a queue pair \
                 that has nothing posted"
                    .into(),
            ));
        }
        if *scope.qp.state_changed_mut() {
            // An earlier scope moved the queue pair out of RTS behind its type.
            let state = scope.qp.query_state()?;
            if state != QpStateKind::Rts {
                return Err(Error::InvalidArgument(format!(
                    "the queue pair is in state {state}, not RTS (an earlier scope flushed or \
                     reset it): reset and reconnect it first"
                )));
            }
            *scope.qp.state_changed_mut() = false;
        }
        scope.finished = false;
        let result = f(&mut scope);
        // `finish` ends the scope only once nothing is outstanding (or aborts).
        scope.finish()?;
        Ok(result)
    }
}

/// Checks that `cqs` are the queue pair's own completion queues (`own`: send, receive) and that
/// no other queue pair uses them.
fn check_cqs(own: (&Arc<CqInner>, &Arc<CqInner>), cqs: &ScopeCqs<'_>) -> Result<()> {
    let (own_send, own_recv) = own;
    let one_queue = Arc::ptr_eq(own_send, own_recv);
    let not_own = || {
        Error::InvalidArgument(
            "the scope's completion queues must be the ones the queue pair was created with".into(),
        )
    };
    match cqs.recv.as_deref() {
        None => {
            if !one_queue {
                return Err(Error::InvalidArgument(
                    "the queue pair has separate send and receive completion queues: use \
                     ScopeCqs::split"
                        .into(),
                ));
            }
            if !Arc::ptr_eq(&cqs.send.inner, own_send) {
                return Err(not_own());
            }
            // This queue pair holds two uses of it: as send and as receive queue.
            if own_send.queue_pair_uses() != 2 {
                return Err(shared_with_others());
            }
        }
        Some(recv) => {
            if one_queue {
                return Err(Error::InvalidArgument(
                    "the queue pair uses one completion queue: use ScopeCqs::shared".into(),
                ));
            }
            if !Arc::ptr_eq(&cqs.send.inner, own_send) || !Arc::ptr_eq(&recv.inner, own_recv) {
                return Err(not_own());
            }
            if own_send.queue_pair_uses() != 1 || own_recv.queue_pair_uses() != 1 {
                return Err(shared_with_others());
            }
        }
    }
    Ok(())
}

fn shared_with_others() -> Error {
    Error::InvalidArgument(
        "another queue pair also uses the scope's completion queue, so the scope could not \
         account for every completion: give each scoped queue pair queues of its own"
            .into(),
    )
}

/// Refuses, before the post, flags the crate does not know (`SendFlags` keeps any bit): a
/// scope passes the provider only what it knows the meaning of. (`IBV_SEND_INLINE` on a
/// region's bytes goes, as C programs send it: `docs/safety.md`, "Known gaps", says what that
/// leaves open for a shared region.)
fn check_scope_flags(request: &SendWr<'_>) -> Result<()> {
    let known = SendFlags::FENCE
        | SendFlags::SIGNALED
        | SendFlags::SOLICITED
        | SendFlags::INLINE
        | SendFlags::IP_CSUM;
    let flags = request.flags();
    if !known.contains(flags) {
        return Err(Error::InvalidArgument(format!(
            "unknown send flags {:#x} in a scope",
            (flags - known).bits()
        )));
    }
    Ok(())
}

impl<'scope, 'env, T: Transport> PostScope<'scope, 'env, T> {
    /// Posts a send request: SEND, RDMA WRITE (with or without immediate), or a memory-window
    /// bind or invalidation. Every request is made signaled, so that its completion can be
    /// counted.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for RDMA READ and atomics (use [`read`](Self::read),
    /// [`compare_swap`](Self::compare_swap), [`fetch_add`](Self::fetch_add): the device writes
    /// their targets, which must be borrowed exclusively), for flags the crate does not know,
    /// and for a bind of a window deallocated since the request was made; else as
    /// [`QueuePair::post_send`](crate::QueuePair::post_send).
    pub fn send<K: Operation>(&mut self, request: SendRequest<'scope, K>) -> Result<()> {
        let request = request.into_wr();
        if request.op() & (op::READ | op::ATOMIC) != 0 {
            return Err(Error::InvalidArgument(
                "post RDMA reads and atomics with PostScope::read, compare_swap or fetch_add"
                    .into(),
            ));
        }
        self.post(request)
    }

    /// Posts a UD send of `payload` to queue pair `remote_qpn` behind `ah`.
    ///
    /// # Errors
    ///
    /// As [`send`](Self::send).
    pub fn send_to(
        &mut self,
        wr_id: u64,
        payload: impl Into<Payload<'scope>>,
        ah: &'scope AddressHandle,
        remote_qpn: u32,
        remote_qkey: u32,
    ) -> Result<()> {
        self.send(
            SendRequest::send(payload.into())
                .tag(wr_id)
                .to(ah, remote_qpn, remote_qkey),
        )
    }

    /// Posts an RDMA READ of `remote` into `target`.
    ///
    /// # Errors
    ///
    /// As [`QueuePair::post_send`](crate::QueuePair::post_send).
    pub fn read(
        &mut self,
        wr_id: u64,
        target: &'scope MrSliceMut<'scope>,
        remote: RemoteMemory,
    ) -> Result<()> {
        self.post(
            SendRequest::read(target.as_slice(), remote)
                .tag(wr_id)
                .into_wr(),
        )
    }

    /// Posts an ATOMIC_CMP_AND_SWP on the word at `remote`; the old value lands in `result`
    /// (8 bytes).
    ///
    /// # Errors
    ///
    /// As [`QueuePair::post_send`](crate::QueuePair::post_send).
    pub fn compare_swap(
        &mut self,
        wr_id: u64,
        result: &'scope MrSliceMut<'scope>,
        remote: RemoteMemory,
        compare: u64,
        swap: u64,
    ) -> Result<()> {
        self.post(
            SendRequest::compare_swap(result.as_slice(), remote, compare, swap)
                .tag(wr_id)
                .into_wr(),
        )
    }

    /// Posts an ATOMIC_FETCH_AND_ADD on the word at `remote`; the old value lands in `result`.
    ///
    /// # Errors
    ///
    /// As [`QueuePair::post_send`](crate::QueuePair::post_send).
    pub fn fetch_add(
        &mut self,
        wr_id: u64,
        result: &'scope MrSliceMut<'scope>,
        remote: RemoteMemory,
        add: u64,
    ) -> Result<()> {
        self.post(
            SendRequest::fetch_add(result.as_slice(), remote, add)
                .tag(wr_id)
                .into_wr(),
        )
    }

    /// Posts a receive into `target`. Several receives may share one target.
    ///
    /// # Errors
    ///
    /// As [`QueuePair::post_recv`](crate::QueuePair::post_recv).
    pub fn recv(&mut self, wr_id: u64, target: &'scope MrSliceMut<'scope>) -> Result<()> {
        let request = RecvRequest::new(target.as_slice()).tag(wr_id);
        // SAFETY: `target` borrows its region exclusively for the whole scope, so Rust cannot
        // touch the memory, and the region outlives the scope; the scope does not end before
        // this request's completion is reaped, flushed, or the queue pair reset (`count`).
        let posted = unsafe { self.qp.post_recv_one(&request) };
        self.count(posted)
    }

    /// Posts a receive without a buffer (for RDMA writes with immediate).
    ///
    /// # Errors
    ///
    /// As [`QueuePair::post_recv`](crate::QueuePair::post_recv).
    pub fn recv_empty(&mut self, wr_id: u64) -> Result<()> {
        // SAFETY: the request names no memory.
        let posted = unsafe { self.qp.post_recv_one(&RecvRequest::empty().tag(wr_id)) };
        self.count(posted)
    }

    fn post(&mut self, request: SendWr<'scope>) -> Result<()> {
        let request = request.add_flags(SendFlags::SIGNALED);
        check_scope_flags(&request)?;
        // A bind holds its window's lock from the check that the window is allocated until the
        // post verb returns, so that no queue pair's destruction deallocates it meanwhile
        // (`mw.rs`), as on the owned path.
        let guard = match request.bind_window() {
            Some(mw) => Some(mw.shared().lock_for_post()?),
            None => None,
        };
        // SAFETY: everything the request borrows lives for 'scope, which outlasts the scope's
        // end; sources are shared borrows (Rust cannot change them) and targets exclusive ones
        // (Rust cannot touch them); the scope does not end before the completion is reaped,
        // flushed, or the queue pair reset (`count`). A bound window is allocated and stays so
        // until the verb returns (`guard`); its region is borrowed for 'scope. No flag the
        // crate does not know reaches the provider (`check_scope_flags`).
        let posted = unsafe { self.qp.post_send_wr(&request) };
        drop(guard);
        self.count(posted)
    }

    /// Counts a post as outstanding when it succeeded, and also when it failed in a way that
    /// may have handed the request to the device: a request counted but never posted only
    /// makes the end of the scope flush and reset; one posted but not counted would let the
    /// scope end while the device still uses its memory.
    fn count(&mut self, posted: Result<()>) -> Result<()> {
        match &posted {
            Ok(()) => self.outstanding += 1,
            Err(error) if may_have_posted(error) => self.outstanding += 1,
            Err(_) => {}
        }
        posted
    }

    /// `ibv_poll_cq` on the scope's queue(s): fills `completions` and counts those with this
    /// queue pair's number as done. (The queues are this queue pair's alone; a queue pair
    /// whose `ibv_destroy_qp` failed keeps its queues in use, so a scope refuses them.)
    /// Completions of the send queue are counted even if polling the receive queue then
    /// fails; they are lost to the caller with the error.
    ///
    /// # Errors
    ///
    /// As [`CompletionQueue::poll`].
    pub fn poll<'a>(
        &mut self,
        completions: &'a mut [WorkCompletion],
    ) -> Result<&'a [WorkCompletion]> {
        let n = self.cqs.send.poll(completions)?.len();
        // Counted before the receive queue is polled, so that a failing second poll does not
        // lose them from the count.
        self.count_done(&completions[..n]);
        let mut total = n;
        if n < completions.len() {
            if let Some(recv) = self.cqs.recv.as_deref_mut() {
                let m = recv.poll(&mut completions[n..])?.len();
                total += m;
            }
            self.count_done(&completions[n..total]);
        }
        Ok(&completions[..total])
    }

    /// [`poll`](Self::poll) until `min` completions have arrived (at most
    /// `completions.len()`) or `timeout` has passed, and returns every completion it reaped
    /// (fewer than `min`: the time ran out), each counted as `poll` counts it. Waits as
    /// [`CompletionQueue::poll_for`] does.
    ///
    /// # Errors
    ///
    /// As [`poll`](Self::poll); completions reaped before a polling error are counted and
    /// lost to the caller with it.
    #[inline]
    pub fn poll_for<'a>(
        &mut self,
        completions: &'a mut [WorkCompletion],
        min: usize,
        timeout: Duration,
    ) -> Result<&'a [WorkCompletion]> {
        let min = min.min(completions.len());
        let n = poll_until(min, timeout, |n| {
            Ok(self.poll(&mut completions[n..])?.len())
        })?;
        Ok(&completions[..n])
    }

    /// Counts `reaped` completions of this queue pair as done.
    fn count_done(&mut self, reaped: &[WorkCompletion]) {
        let qp_num = self.qp.qp_num();
        let ours = reaped.iter().filter(|wc| wc.qp_num() == qp_num).count();
        if ours > self.outstanding {
            // A completion that is not this scope's was counted (see `miscounted`).
            self.miscounted = true;
        }
        self.outstanding = self.outstanding.saturating_sub(ours);
    }

    /// Ends outstanding requests now: moves the queue pair to the error state, which completes
    /// every outstanding request with a flush error, and reaps those completions (5 s at
    /// most). Returns how many were flushed. For programs that keep receives posted until they
    /// stop, as rdma-core's pingpongs do.
    ///
    /// The queue pair stays in the error state, whatever its type says; posting to it then
    /// completes with flush errors.
    ///
    /// # Errors
    ///
    /// As [`QueuePair::query_state`](crate::QueuePair::query_state) and
    /// [`poll`](Self::poll); [`Error::Timeout`] if the flush completions did not all arrive.
    pub fn flush_outstanding(&mut self) -> Result<usize> {
        let pending = self.outstanding;
        if pending == 0 {
            return Ok(0);
        }
        self.move_to(QpStateKind::Error)?;
        if self.reap(FLUSH)? {
            Ok(pending)
        } else {
            Err(Error::Timeout(FLUSH))
        }
    }

    /// `ibv_req_notify_cq` on the scope's queue(s): the next completion raises an event on
    /// their completion channel.
    ///
    /// # Errors
    ///
    /// As [`CompletionQueue::req_notify`].
    pub fn req_notify(&mut self, solicited_only: bool) -> Result<()> {
        self.cqs.send.req_notify(solicited_only)?;
        if let Some(recv) = self.cqs.recv.as_deref_mut() {
            recv.req_notify(solicited_only)?;
        }
        Ok(())
    }

    /// Requests posted in this scope whose completions have not been reaped yet.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// How long the end of the scope waits for outstanding completions before flushing them:
    /// 5 s by default, at most 10 minutes (a longer `timeout` is taken as 10 minutes, so that
    /// the end of a scope, which also runs when its closure panics, is always bounded).
    pub fn set_drain_timeout(&mut self, timeout: Duration) {
        self.drain = timeout.min(MAX_DRAIN);
    }

    /// How long the end of the scope will wait before flushing (see
    /// [`set_drain_timeout`](Self::set_drain_timeout)).
    pub fn drain_timeout(&self) -> Duration {
        self.drain
    }

    /// The queue pair's number.
    pub fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    /// Reaps until nothing is outstanding or `timeout` passes; returns whether it got there.
    /// The deadline is checked on every round, and the rounds back off from yielding to short
    /// sleeps, so a device that never completes costs little CPU while the scope waits.
    fn reap(&mut self, timeout: Duration) -> Result<bool> {
        let start = Instant::now();
        let timeout = timeout.min(MAX_DRAIN);
        let mut completions = [WorkCompletion::default(); 16];
        let mut idle: u32 = 0;
        while self.outstanding > 0 {
            if start.elapsed() >= timeout {
                return Ok(false);
            }
            if self.poll(&mut completions)?.is_empty() {
                idle = idle.saturating_add(1);
                if idle < SPIN_ROUNDS {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(IDLE_SLEEP);
                }
            } else {
                idle = 0;
            }
        }
        Ok(true)
    }

    /// Ends the scope: waits for, then flushes, then discards outstanding requests. It marks
    /// the scope finished only once nothing is outstanding; no error returns early.
    fn finish(&mut self) -> Result<()> {
        if self.miscounted {
            // The count is wrong, so no wait can tell when the device is done: RESET can.
            let pending = self.outstanding;
            self.reset_and_purge();
            return Err(Error::Incomplete {
                pending,
                state: QpStateKind::Reset,
            });
        }
        if self.outstanding == 0 {
            self.finished = true;
            return Ok(());
        }
        let pending = self.outstanding;
        let drained = self.reap(self.drain);
        if self.miscounted {
            // Found while draining: the count that reached zero cannot be trusted.
            self.reset_and_purge();
            return Err(Error::Incomplete {
                pending,
                state: QpStateKind::Reset,
            });
        }
        if matches!(drained, Ok(true)) {
            self.finished = true;
            return Ok(());
        }
        // A polling error is reported, but only after the clean-up below.
        let polling_error = drained.err();
        // Flush: in the error state every outstanding request completes with a flush error.
        if self.move_to(QpStateKind::Error).is_ok()
            && matches!(self.reap(FLUSH), Ok(true))
            && !self.miscounted
        {
            self.finished = true;
            return Err(polling_error.unwrap_or(Error::Incomplete {
                pending,
                state: QpStateKind::Error,
            }));
        }
        self.reset_and_purge();
        Err(polling_error.unwrap_or(Error::Incomplete {
            pending,
            state: QpStateKind::Reset,
        }))
    }

    /// The last resort: RESET discards every request, after which the device no longer uses
    /// their memory; without it the borrows cannot end soundly, so a failure aborts. Then
    /// empties the queues (best effort: the next scope empties them again before it posts).
    fn reset_and_purge(&mut self) {
        if let Err(error) = self.move_to(QpStateKind::Reset) {
            abort_lent(self.qp.qp_num(), &error);
        }
        self.outstanding = 0;
        let _ = self.purge();
        self.finished = true;
    }

    /// Polls the scope's queues until they are empty, discarding what it finds; used only when
    /// the queue pair is not posting (reset, or before the scope posts). Returns whether they
    /// emptied; bounded, in case a broken provider never reports them empty.
    fn purge(&mut self) -> Result<bool> {
        let mut completions = [WorkCompletion::default(); 16];
        let capacity = self.cqs.send.capacity() as usize
            + self
                .cqs
                .recv
                .as_deref()
                .map_or(0, |cq| cq.capacity() as usize);
        let rounds = capacity / completions.len() + 2;
        for _ in 0..rounds {
            let mut n = self.cqs.send.poll(&mut completions)?.len();
            if let Some(recv) = self.cqs.recv.as_deref_mut() {
                n += recv.poll(&mut completions)?.len();
            }
            if n == 0 {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn move_to(&mut self, state: QpStateKind) -> Result<()> {
        let mut attr = ffi::ibv_qp_attr {
            qp_state: state.as_raw(),
            ..Default::default()
        };
        // The typed state no longer matches: the next scope checks the real one.
        *self.qp.state_changed_mut() = true;
        // SAFETY: live queue pair; a state-only change needs no other attribute. Posting in
        // the new state fails with typed errors or completes with flush errors, and the next
        // scope refuses to run until the queue pair is in RTS again.
        let ret =
            unsafe { ffi::ibv_modify_qp(self.qp.as_raw(), &mut attr, ffi::IBV_QP_STATE as i32) };
        Error::check("ibv_modify_qp", ret)
    }
}

/// The one exit when a queue pair that may still write borrowed memory cannot be stopped:
/// returning would end the borrows while the device owns the memory.
#[cold]
fn abort_lent(qp_num: u32, error: &Error) -> ! {
    // `eprintln!` would panic if stderr is closed; the message is best effort.
    let _ = writeln!(
        std::io::stderr(),
        "rdma-verbs: PostScope could not reset queue pair {qp_num:#x} ({error}) while the device \
         may still use memory the scope lent it; aborting"
    );
    std::process::abort()
}

impl<T: Transport> Drop for PostScope<'_, '_, T> {
    /// Runs only when the closure panicked: the memory it borrowed must not be released while
    /// the device may still use it, so the scope drains (and flushes, and resets) first.
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Errno;
    use crate::wr::post_result;

    #[test]
    fn a_post_that_may_have_reached_the_device_is_counted() {
        // bad_wr null: the provider did not say what it took.
        let unknown = post_result("ibv_post_send", -5, || None).unwrap_err();
        assert_eq!(unknown.errno(), Some(Errno::from_raw(5)));
        assert!(matches!(unknown, Error::PostIndeterminate { .. }));
        assert!(may_have_posted(&unknown));
        // bad_wr named the request: it was not posted.
        let full = post_result("ibv_post_recv", 12, || Some(0)).unwrap_err();
        assert!(
            matches!(full, Error::QueueFull { index: 0, .. }),
            "{full:?}"
        );
        assert!(!may_have_posted(&full));
        let refused = post_result("ibv_post_send", 22, || Some(0)).unwrap_err();
        assert!(!may_have_posted(&refused));
        // The extended path cannot tell a refused batch from a failed doorbell.
        let batch = Error::QueueFull {
            verb: crate::qp::EXTENDED_POST_VERB,
            index: 0,
        };
        assert!(may_have_posted(&batch));
        // Refused by the crate's own checks, before the provider saw anything.
        assert!(!may_have_posted(&Error::InvalidArgument(String::new())));
        assert!(post_result("ibv_post_send", 0, || None).is_ok());
    }
}
