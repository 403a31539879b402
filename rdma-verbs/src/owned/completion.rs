//! [`Completion`]: what [`CompletionQueue::poll_each`] hands over, with the buffer an owned
//! request gives back.

use std::mem::MaybeUninit;
use std::time::Duration;

use crate::buf::Buf;
use crate::cq::{CompletionQueue, WcStatus, WorkCompletion, poll_until};
use crate::error::Result;
use crate::inflight::Entry;

/// A work completion, and for an owned request, its tag and the buffer it hands back.
#[derive(Debug)]
#[must_use = "a completion may hold a buffer"]
pub struct Completion {
    wc: WorkCompletion,
    /// The owned request's entry, taken from its table: its tag, its buffer, and what it kept
    /// alive (dropped with the completion).
    entry: Option<Entry>,
}

impl Completion {
    /// Sets the length of a receive's buffer from the work completion.
    #[inline]
    fn set_received(&mut self) {
        if let Some(entry) = self.entry.as_mut() {
            let recv = entry.is_recv();
            if let Some(buf) = entry.buf.as_mut() {
                buf.set_received(received_len(&self.wc, recv));
            }
        }
    }

    /// The work completion. For an owned request its `wr_id` is the crate's id; use
    /// [`tag`](Self::tag).
    #[inline]
    pub fn wc(&self) -> &WorkCompletion {
        &self.wc
    }

    /// The tag of the owned request this completes, or `None` for a request posted another
    /// way (then [`wc`](Self::wc)`.wr_id()` is its `wr_id`).
    #[inline]
    pub fn tag(&self) -> Option<u64> {
        self.entry.as_ref().map(|entry| entry.tag)
    }

    /// The buffer the completed owned request hands back. After a receive its length is the
    /// bytes received (see [`Buf::len`]); after a failed completion its contents are
    /// undefined.
    #[inline]
    pub fn take_buf(&mut self) -> Option<Buf> {
        self.entry.as_mut().and_then(|entry| entry.buf.take())
    }

    /// The buffer the completed owned request hands back, borrowed (as
    /// [`take_buf`](Self::take_buf), which it stays available to).
    pub fn buf(&self) -> Option<&Buf> {
        self.entry.as_ref().and_then(|entry| entry.buf.as_ref())
    }

    /// The completion's status.
    #[inline]
    pub fn status(&self) -> WcStatus {
        self.wc.status()
    }

    /// Whether the request succeeded.
    #[inline]
    pub fn is_success(&self) -> bool {
        self.wc.is_success()
    }
}

/// The length a buffer gets back from its completion: for a receive, the bytes that landed in
/// it (none for an RDMA WRITE with immediate, whose bytes went to the peer's target memory, and
/// none after an error, whose bytes are undefined); for a send, `None` (unchanged).
#[inline]
fn received_len(wc: &WorkCompletion, recv: bool) -> Option<u32> {
    if !recv {
        return None;
    }
    if !wc.is_success() || wc.is_recv_rdma_with_imm() {
        return Some(0);
    }
    Some(wc.byte_len())
}

impl CompletionQueue {
    /// Polls up to `max` completions and hands each to `f`, with what it releases: for an owned
    /// request ([`QueuePair::post_send_owned`](crate::QueuePair::post_send_owned),
    /// [`QueuePair::post_recv_buf`](crate::QueuePair::post_recv_buf),
    /// [`QueuePair::post_recv_owned`](crate::QueuePair::post_recv_owned),
    /// [`SharedReceiveQueue::post_recv_buf`](crate::SharedReceiveQueue::post_recv_buf),
    /// [`SharedReceiveQueue::post_recv_owned`](crate::SharedReceiveQueue::post_recv_owned), and
    /// the lists of [`QueuePair::post_send_list`](crate::QueuePair::post_send_list)) its tag
    /// and its buffer; completions of requests posted another way come as they are. Returns how
    /// many it handed over (0 when the queue is empty). Allocates nothing.
    ///
    /// Poll queues that owned requests complete into with this only: a completion that
    /// [`poll`](Self::poll), [`poll_for`](Self::poll_for), the `tokio` feature's
    /// `poll_async` or a [`PostScope`](crate::scope::PostScope) takes cannot release its buffer,
    /// which then stays with the queue pair until it is reset or destroyed (an SRQ receive:
    /// until the SRQ is destroyed); a leak, not a hazard.
    ///
    /// Unsignaled sends a completion releases go back to their pools; only the completed
    /// request's buffer is handed over.
    ///
    /// # Errors
    ///
    /// As [`poll`](Self::poll). If `f` panics, the completions of that poll not yet handed
    /// over are lost, as polled completions not handed to `poll_each` are: their buffers stay
    /// in flight until a later completion of the same queue releases them (queues complete in
    /// order), or the queue pair is reset or destroyed (an SRQ receive: until the SRQ is
    /// destroyed). A leak, not a hazard.
    // Inlined with the caller's closure (docs/benchmarks.md, "What the code is shaped by").
    #[inline(always)]
    pub fn poll_each(&mut self, max: usize, mut f: impl FnMut(Completion)) -> Result<usize> {
        const BATCH: usize = 16;
        let mut wcs = [const { MaybeUninit::<WorkCompletion>::uninit() }; BATCH];
        let mut done = 0;
        while done < max {
            let want = (max - done).min(BATCH);
            let polled = self.poll_uninit(&mut wcs[..want])?;
            let n = polled.len();
            // After the poll: every queue pair whose completion it returned has its route.
            self.route_cache.refresh(&self.inner.routes);
            for wc in polled {
                // No lock is held while `f` runs, which may post (taking table locks) or
                // create queue pairs on this queue (changing the routes). The completion is built
                // first and the entry copied once, from its table straight into it
                // (docs/benchmarks.md, "The owned path"); whether one was
                // found is the entry's `Option`.
                let mut completion = Completion {
                    wc: *wc,
                    entry: None,
                };
                self.route_cache.take_completed(
                    &self.inner.routes,
                    wc.qp_num(),
                    wc.wr_id(),
                    &mut completion.entry,
                );
                completion.set_received();
                f(completion);
            }
            done += n;
            if n < want {
                break;
            }
        }
        Ok(done)
    }

    /// [`poll_each`](Self::poll_each) until `min` completions have been handed to `f` or
    /// `timeout` has passed, polling as [`poll_for`](Self::poll_for) does (a busy poll that
    /// backs off to 50 µs sleeps). It hands over `min` at most (the rest stay queued for the
    /// next poll) and returns how many: fewer than `min` means the time ran out. A peer that
    /// never answers costs `timeout`, not a hang.
    ///
    /// # Errors
    ///
    /// As [`poll_each`](Self::poll_each). Completions handed over before a polling error stay
    /// handed over, and the error does not say how many there were: count them in `f` where
    /// that matters.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # fn f(cq: &mut rdma_verbs::CompletionQueue) -> rdma_verbs::Result<()> {
    /// let got = cq.poll_each_for(2, Duration::from_secs(5), |mut done| {
    ///     if let Some(buf) = done.take_buf() {
    ///         // ... the bytes a receive brought, or a send's buffer back ...
    ///         drop(buf);
    ///     }
    /// })?;
    /// if got < 2 {
    ///     eprintln!("only {got} of 2 completions within 5 s");
    /// }
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn poll_each_for(
        &mut self,
        min: usize,
        timeout: Duration,
        mut f: impl FnMut(Completion),
    ) -> Result<usize> {
        poll_until(min, timeout, |done| self.poll_each(min - done, &mut f))
    }
}
