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

use std::marker::PhantomData;
use std::time::{Duration, Instant};

use crate::ah::AddressHandle;
use crate::cq::{CompletionQueue, WorkCompletion};
use crate::error::{Error, Result};
use crate::ffi;
use crate::flags::SendFlags;
use crate::mr::{MrSliceMut, RemoteMemory};
use crate::qp::{QpStateKind, QueuePair, Rts, Transport};
use crate::wr::{Payload, RecvRequest, SendRequest, op};

/// How long the end of a scope waits for outstanding completions before flushing them.
const DRAIN: Duration = Duration::from_secs(5);
/// How long it then waits for the flush completions before resetting the queue pair.
const FLUSH: Duration = Duration::from_secs(5);

/// The completion queues a scope polls: the queue pair's send CQ and, if different, its receive
/// CQ.
#[derive(Debug)]
pub struct ScopeCqs<'env> {
    send: &'env mut CompletionQueue,
    recv: Option<&'env mut CompletionQueue>,
}

impl<'env> ScopeCqs<'env> {
    /// One completion queue for sends and receives.
    pub fn shared(cq: &'env mut CompletionQueue) -> Self {
        Self {
            send: cq,
            recv: None,
        }
    }

    /// Separate send and receive completion queues.
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
    /// The queue pair's completions must go to the queue(s) in `cqs`, which the scope polls.
    /// Completions the scope reaps itself at the end are counted and discarded.
    ///
    /// The scope counts the completions of this queue pair as its own, so requests posted
    /// earlier with the `unsafe` functions must have completed and been polled (their contract
    /// says so), and a queue pair that takes its receives from an SRQ is refused: receives
    /// posted to the SRQ elsewhere would complete with this queue pair's number.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a queue pair attached to an SRQ.
    /// [`Error::Incomplete`] if requests were still outstanding when `f` returned and their
    /// completions did not arrive within 5 s (configurable with
    /// [`PostScope::set_drain_timeout`]): the queue pair was then moved to the error state (or
    /// reset), whatever its type says; check [`query_state`](Self::query_state). Polling errors
    /// are returned as they are.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use rdma_verbs::*;
    /// # fn f(qp: &mut QueuePair<Rc, Rts>, cq: &mut CompletionQueue, mr: &mut MemoryRegion,
    /// #      src: &MemoryRegion) -> Result<()> {
    /// let target = mr.slice_mut(..64)?;
    /// qp.scope(ScopeCqs::shared(cq), |s| -> Result<()> {
    ///     s.recv(1, &target)?;
    ///     s.send(SendRequest::send(2, src.slice(..64)?))?;
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
        let mut scope = PostScope {
            qp: self,
            cqs: &mut cqs,
            outstanding: 0,
            drain: DRAIN,
            finished: false,
            _scope: PhantomData,
            _env: PhantomData,
        };
        let result = f(&mut scope);
        scope.finish()?;
        Ok(result)
    }
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
    /// their targets, which must be borrowed exclusively), else as
    /// [`QueuePair::post_send`](crate::QueuePair::post_send).
    pub fn send(&mut self, request: SendRequest<'scope>) -> Result<()> {
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
        self.send(SendRequest::send(wr_id, payload).to(ah, remote_qpn, remote_qkey))
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
        self.post(SendRequest::read(wr_id, target.as_slice(), remote))
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
        self.post(SendRequest::compare_swap(
            wr_id,
            result.as_slice(),
            remote,
            compare,
            swap,
        ))
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
        self.post(SendRequest::fetch_add(
            wr_id,
            result.as_slice(),
            remote,
            add,
        ))
    }

    /// Posts a receive into `target`. Several receives may share one target.
    ///
    /// # Errors
    ///
    /// As [`QueuePair::post_recv`](crate::QueuePair::post_recv).
    pub fn recv(&mut self, wr_id: u64, target: &'scope MrSliceMut<'scope>) -> Result<()> {
        let request = RecvRequest::new(wr_id, target.as_slice());
        // SAFETY: `target` borrows its region exclusively for the whole scope, so Rust cannot
        // touch the memory, and the region outlives the scope; the scope does not end before
        // this request's completion is reaped, flushed, or the queue pair reset.
        unsafe { self.qp.post_recv_one(&request)? };
        self.outstanding += 1;
        Ok(())
    }

    /// Posts a receive without a buffer (for RDMA writes with immediate).
    ///
    /// # Errors
    ///
    /// As [`QueuePair::post_recv`](crate::QueuePair::post_recv).
    pub fn recv_empty(&mut self, wr_id: u64) -> Result<()> {
        // SAFETY: the request names no memory.
        unsafe { self.qp.post_recv_one(&RecvRequest::empty(wr_id))? };
        self.outstanding += 1;
        Ok(())
    }

    fn post(&mut self, request: SendRequest<'scope>) -> Result<()> {
        let request = request.flags(SendFlags::SIGNALED);
        // SAFETY: everything the request borrows lives for 'scope, which outlasts the scope's
        // end; sources are shared borrows (Rust cannot change them) and targets exclusive ones
        // (Rust cannot touch them); the scope does not end before the completion is reaped,
        // flushed, or the queue pair reset.
        unsafe { self.qp.post_send_one(&request)? };
        self.outstanding += 1;
        Ok(())
    }

    /// `ibv_poll_cq` on the scope's queue(s): fills `completions` and counts those of this
    /// queue pair. Completions of other queue pairs sharing the CQ are returned too, uncounted.
    ///
    /// # Errors
    ///
    /// As [`CompletionQueue::poll`].
    pub fn poll<'a>(
        &mut self,
        completions: &'a mut [WorkCompletion],
    ) -> Result<&'a [WorkCompletion]> {
        let mut n = self.cqs.send.poll(completions)?.len();
        if n < completions.len() {
            if let Some(recv) = self.cqs.recv.as_deref_mut() {
                n += recv.poll(&mut completions[n..])?.len();
            }
        }
        let qp_num = self.qp.qp_num();
        let ours = completions[..n]
            .iter()
            .filter(|wc| wc.qp_num() == qp_num)
            .count();
        self.outstanding = self.outstanding.saturating_sub(ours);
        Ok(&completions[..n])
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

    /// How long the end of the scope waits for outstanding completions before flushing them
    /// (5 s by default).
    pub fn set_drain_timeout(&mut self, timeout: Duration) {
        self.drain = timeout;
    }

    /// The queue pair's number.
    pub fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    /// Reaps until nothing is outstanding or `timeout` passes; returns whether it got there.
    fn reap(&mut self, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now().checked_add(timeout);
        let mut completions = [WorkCompletion::default(); 16];
        while self.outstanding > 0 {
            if self.poll(&mut completions)?.is_empty() {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Ok(false);
                }
                std::thread::yield_now();
            }
        }
        Ok(true)
    }

    /// Ends the scope: waits for, then flushes, then discards outstanding requests.
    fn finish(&mut self) -> Result<()> {
        self.finished = true;
        if self.outstanding == 0 {
            return Ok(());
        }
        let pending = self.outstanding;
        if self.reap(self.drain)? {
            return Ok(());
        }
        // Flush: in the error state every outstanding request completes with a flush error.
        let flushed = self.move_to(QpStateKind::Error).is_ok() && self.reap(FLUSH).unwrap_or(false);
        if flushed {
            return Err(Error::Incomplete {
                pending,
                state: QpStateKind::Error,
            });
        }
        // Last resort: RESET discards every request, after which the device no longer uses
        // their memory.
        self.move_to(QpStateKind::Reset)?;
        self.outstanding = 0;
        Err(Error::Incomplete {
            pending,
            state: QpStateKind::Reset,
        })
    }

    fn move_to(&mut self, state: QpStateKind) -> Result<()> {
        let mut attr = ffi::ibv_qp_attr {
            qp_state: state.as_raw(),
            ..Default::default()
        };
        // SAFETY: live queue pair; a state-only change needs no other attribute. The typed
        // state of the queue pair no longer matches; posting then fails with typed errors,
        // which the scope's error tells the caller.
        let ret =
            unsafe { ffi::ibv_modify_qp(self.qp.as_raw(), &mut attr, ffi::IBV_QP_STATE as i32) };
        Error::check("ibv_modify_qp", ret)
    }
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
