//! A node's client side: the page table, the fault service (the fault threads of both
//! mechanisms), fetches with prefetch, and the release and acquire steps (diffs home, cached
//! copies dropped) that locks and barriers are made of.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rdma_verbs::shared::{copy_from_shared, copy_to_shared};

use crate::error::{Error, Result};
use crate::fault;
use crate::home::Kind;
use crate::region::{Access, PAGE, for_each_run};
use crate::shared::Shared;
use crate::stats::Stats;
use crate::transport::Links;
use crate::wire::{HEADER_LEN, Msg, Op, Reader, Writer};

/// A page's state on this node (docs/dsm.md, "Consistency model and protocol").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PageState {
    /// No valid copy; the window page is inaccessible.
    Invalid,
    /// Fetched ahead of a fault: the frame holds the home's copy, the window page is still
    /// inaccessible (so that its first touch is counted as a prefetch hit).
    Prefetched,
    /// A valid copy, readable.
    ReadOnly,
    /// A valid copy with a twin, writable; diffed at the next release.
    Dirty,
    /// This node is the page's home: always valid and writable.
    Home,
}

/// The client side of a node: the transport's requests, the page table and the counters.
/// The application thread (locks, barriers, allocations) and the fault thread take it in turn.
#[derive(Debug)]
pub(crate) struct Client {
    pub(crate) links: Links,
    pub(crate) seq: u32,
    pub(crate) collectives: u32,
    pub(crate) pages: Vec<PageState>,
    /// Pages in state `Dirty`.
    pub(crate) dirty: Vec<u32>,
    /// Non-home pages in state `Prefetched`, `ReadOnly` or `Dirty` (invalidated at acquire).
    pub(crate) cached: Vec<u32>,
    /// This node's home pages as runs `(first, count)`, one or more per allocation: what
    /// [`Client::close_cached`] opens again with SIGSEGV faults.
    pub(crate) home_runs: Vec<(usize, usize)>,
    pub(crate) stats: Stats,
    /// An earlier failure that left the node unusable (an unequal collective, a failed unlock
    /// in a guard's `Drop`); every later call reports it.
    pub(crate) broken: Option<String>,
    /// Locks this node holds.
    pub(crate) held: Vec<u32>,
}

/// The fault thread's body, for the window's fault mechanism; returns when the node stops.
pub(crate) fn serve_faults(shared: &Shared, client: &Mutex<Client>, wake: &OwnedFd) {
    match shared.region.userfault() {
        None => serve_signalled_faults(shared, client, wake),
        Some(userfault) => {
            let _exit = ExitUnlessStopping(shared);
            serve_userfaults(shared, client, wake, userfault);
        }
    }
}

/// The fault thread with `SIGSEGV` faults: takes each fault the handler reports and installs
/// its page.
fn serve_signalled_faults(shared: &Shared, client: &Mutex<Client>, wake: &OwnedFd) {
    let mut requests = Vec::new();
    loop {
        let mut count = 0u64;
        // SAFETY: an 8-byte read from an eventfd into a u64.
        let n = unsafe { libc::read(wake.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
        if n != 8 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if shared.stopping.load(Ordering::Acquire) {
            return;
        }
        requests.clear();
        fault::pending(&mut requests);
        for &request in &requests {
            let served = serve_one(shared, client, request.addr, request.write);
            fault::complete(request, served);
        }
    }
}

/// Serves one fault; on failure, poisons the node and says why (the faulting thread cannot
/// be resumed: its caller ends the process).
fn serve_one(shared: &Shared, client: &Mutex<Client>, addr: usize, write: bool) -> bool {
    let mut c = client.lock().unwrap_or_else(|p| p.into_inner());
    let served = if shared.poisoned.load(Ordering::Acquire) {
        Err(Error::Config(
            "the node is unusable after an earlier failure".into(),
        ))
    } else {
        c.serve_fault(shared, addr, write)
    };
    match served {
        Ok(()) => true,
        Err(e) => {
            shared.poisoned.store(true, Ordering::Release);
            crate::say!(
                "dsm: node {}: the access at {addr:#x} cannot be served: {e}",
                shared.rank
            );
            false
        }
    }
}

/// Ends the process if the `userfaultfd` fault thread ends while the node is not stopping
/// (an error, a panic): the kernel would otherwise hold faulting threads for ever.
struct ExitUnlessStopping<'a>(&'a Shared);

impl Drop for ExitUnlessStopping<'_> {
    fn drop(&mut self) {
        if !self.0.stopping.load(Ordering::Acquire) {
            crate::say!("dsm: node {}: the fault thread has ended", self.0.rank);
            // SAFETY: _exit has no preconditions; it ends the process without unwinding
            // other threads (as the SIGSEGV handler does when a fault cannot be served).
            unsafe { libc::_exit(1) };
        }
    }
}

/// The fault thread with `userfaultfd`: waits for the descriptor's faults (or the node's
/// stop), and maps each page. A fault that cannot be served ends the process: the kernel
/// holds the faulting thread, and no answer can make its access fail.
fn serve_userfaults(
    shared: &Shared,
    client: &Mutex<Client>,
    wake: &OwnedFd,
    userfault: &crate::userfault::Userfault,
) {
    let mut faults = Vec::new();
    loop {
        let mut fds = [
            libc::pollfd {
                fd: userfault.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: a valid array of two pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if shared.stopping.load(Ordering::Acquire) {
            return;
        }
        faults.clear();
        if let Err(e) = userfault.read(&mut faults) {
            crate::say!("dsm: node {}: {e}", shared.rank);
            return;
        }
        for fault in &faults {
            let began = Instant::now();
            // Counted before the page is mapped: mapping it resumes the faulting thread,
            // which may read the count at once.
            fault::HANDLED.fetch_add(1, Ordering::Relaxed);
            // A page outside every allocation is refused by `serve_fault`, whether the file
            // held it (a minor fault) or not.
            if !serve_one(shared, client, fault.addr, fault.write) {
                // SAFETY: as in `ExitUnlessStopping`.
                unsafe { libc::_exit(1) };
            }
            fault::LATENCY.record(began.elapsed().as_nanos() as u64);
        }
    }
}

/// The byte runs in which `now` differs from `twin`, appended to `w` as (offset, length,
/// bytes); returns how many.
fn diff_runs(now: &[u8; PAGE], twin: &[u8; PAGE], w: &mut Writer) -> u16 {
    let mut runs = 0u16;
    let mut i = 0;
    while i < PAGE {
        // Skip equal 8-byte words quickly.
        if i % 8 == 0 && i + 8 <= PAGE && now[i..i + 8] == twin[i..i + 8] {
            i += 8;
            continue;
        }
        if now[i] == twin[i] {
            i += 1;
            continue;
        }
        let start = i;
        while i < PAGE && now[i] != twin[i] {
            i += 1;
        }
        w.u16(start as u16)
            .u16((i - start) as u16)
            .bytes(&now[start..i]);
        runs += 1;
    }
    runs
}

/// Every node's contribution, by rank, from a `CollectiveDone` payload for `size` nodes.
pub(crate) fn parse_collective_done(payload: &[u8], size: u16) -> Result<Vec<Vec<u8>>> {
    let mut r = Reader::new(payload);
    let count = r.u16()?;
    if count != size {
        return Err(Error::protocol(format!(
            "a collective reply for {count} nodes, not {size}"
        )));
    }
    // Each contribution takes at least its 4-byte length: a forged count reserves no more.
    let mut all = Vec::with_capacity(usize::from(count).min(payload.len() / 4));
    for _ in 0..count {
        let len = r.u32()? as usize;
        all.push(r.take(len)?.to_vec());
    }
    r.finish()?;
    Ok(all)
}

impl Client {
    /// A client over `links` for a window of `pages` pages, all invalid.
    pub(crate) fn new(links: Links, pages: usize) -> Client {
        Client {
            links,
            seq: 0,
            collectives: 0,
            pages: vec![PageState::Invalid; pages],
            dirty: Vec::new(),
            cached: Vec::new(),
            stats: Stats::default(),
            broken: None,
            held: Vec::new(),
            home_runs: Vec::new(),
        }
    }

    pub(crate) fn message(
        &mut self,
        shared: &Shared,
        to: u16,
        op: Op,
        flags: u8,
        payload: Vec<u8>,
    ) -> Msg {
        self.seq = self.seq.wrapping_add(1);
        let mut msg = Msg::new(op, shared.rank, to).with(payload);
        msg.flags = flags;
        msg.seq = self.seq;
        if op != Op::Diff {
            self.stats.control_bytes += (HEADER_LEN + msg.payload.len()) as u64;
        }
        msg
    }

    /// Sends a request and returns its reply, checked to be `expected` (a `Fail` reply
    /// becomes its error).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn call(
        &mut self,
        shared: &Shared,
        to: u16,
        op: Op,
        flags: u8,
        payload: Vec<u8>,
        expected: Op,
        bound: Duration,
    ) -> Result<Msg> {
        let msg = self.message(shared, to, op, flags, payload);
        self.links.call(&msg, expected, bound)
    }

    /// A collective call at node 0; returns every node's contribution, by rank.
    pub(crate) fn collective(
        &mut self,
        shared: &Shared,
        kind: Kind,
        digest: u64,
        data: &[u8],
    ) -> Result<Vec<Vec<u8>>> {
        self.collectives = self.collectives.wrapping_add(1);
        let mut w = Writer::new();
        w.u8(kind as u8)
            .u32(self.collectives)
            .u64(digest)
            .bytes(data);
        let bound = shared.config.sync_timeout;
        let reply = self.call(
            shared,
            0,
            Op::Collective,
            0,
            w.done(),
            Op::CollectiveDone,
            bound,
        )?;
        parse_collective_done(&reply.payload, shared.size)
    }

    fn copy_twin(shared: &Shared, page: usize) -> Result<()> {
        let (Some(frame), Some(twin)) = (shared.region.frame(page), shared.region.twin(page))
        else {
            return Err(Error::protocol(format!(
                "page {page} is outside the window"
            )));
        };
        let mut buf = [0u8; PAGE];
        // SAFETY: whole pages of the alias mapping; atomic accesses only (region.rs).
        unsafe {
            copy_from_shared(frame, &mut buf);
            copy_to_shared(&buf, twin);
        }
        Ok(())
    }

    /// Serves a fault at `addr` (module `fault` hands it over).
    fn serve_fault(&mut self, shared: &Shared, addr: usize, write: bool) -> Result<()> {
        let page = addr
            .checked_sub(shared.region.base())
            .map(|offset| offset / PAGE)
            .ok_or_else(|| Error::protocol(format!("a fault at {addr:#x} below the window")))?;
        let home = shared.home_of(page).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{addr:#x} is in the shared window but outside every allocation"
            ))
        })?;
        let region = &shared.region;
        // Opening a page adds at most two mappings; where the window has no room for them,
        // the cached copies go first (this page's too, if it had one: it is fetched again).
        if region
            .maps()
            .is_some_and(|(now, budget, _)| now + 2 > budget)
        {
            self.evict(shared)?;
        }
        match (self.pages[page], write) {
            // With userfaultfd, a page this node keeps mapped faults again when the kernel
            // dropped its mapping (reclaim swapped it out), or when a second fault on it was
            // reported before the first was served: map it again (the file holds it; if it is
            // mapped already, the waiting thread is woken).
            (PageState::Home | PageState::Dirty, _) if !region.detects_writes() => {
                region.protect(page, 1, Access::ReadWrite)
            }
            (PageState::Home, _) => Err(Error::protocol(format!(
                "a fault on home page {page}, which is always mapped"
            ))),
            // With SIGSEGV faults a dirty page is read-write: another thread's fault on it
            // was served first.
            (PageState::Dirty, _) => Ok(()),
            // Reads are allowed on a read-only page, so its fault is a write whatever the
            // decoded bit says (it is not decoded off x86-64).
            (PageState::ReadOnly, _) => {
                Client::copy_twin(shared, page)?;
                region.protect(page, 1, Access::ReadWrite)?;
                self.pages[page] = PageState::Dirty;
                self.dirty.push(page as u32);
                self.stats.upgrade_faults += 1;
                Ok(())
            }
            (PageState::Prefetched, write) => {
                self.stats.prefetch_hits += 1;
                self.open(shared, page, write)
            }
            (PageState::Invalid, write) => {
                self.fetch(shared, page, home)?;
                if write {
                    self.stats.write_faults += 1;
                } else {
                    self.stats.read_faults += 1;
                }
                self.open(shared, page, write)
            }
        }
    }

    /// Opens a page whose frame holds a valid copy: read-only, or writable with a twin (always
    /// writable where writes to readable pages do not fault).
    fn open(&mut self, shared: &Shared, page: usize, write: bool) -> Result<()> {
        if write || !shared.region.detects_writes() {
            Client::copy_twin(shared, page)?;
            shared.region.protect(page, 1, Access::ReadWrite)?;
            self.pages[page] = PageState::Dirty;
            self.dirty.push(page as u32);
        } else {
            shared.region.protect(page, 1, Access::Read)?;
            self.pages[page] = PageState::ReadOnly;
        }
        Ok(())
    }

    /// Fetches `page`, and the pages prefetch picks ([`crate::prefetch::runs`]: up to
    /// `prefetch` of the `max_checking` following pages that are invalid here and of the same
    /// home), into their frames, one request per run of consecutive pages; the window pages
    /// stay inaccessible.
    fn fetch(&mut self, shared: &Shared, page: usize, home: u16) -> Result<()> {
        let runs = {
            let layout = shared.layout.read().unwrap_or_else(|p| p.into_inner());
            crate::prefetch::runs(
                page,
                home,
                shared.config.prefetch,
                shared.config.max_checking,
                |p| self.pages.get(p) == Some(&PageState::Invalid),
                |p| layout.home.get(p).copied(),
            )
        };
        for (first, count) in runs {
            let mut w = Writer::new();
            w.u32(first as u32).u16(count);
            let msg = self.message(shared, home, Op::GetPage, 0, w.done());
            let began = Instant::now();
            self.links
                .fetch(shared, &msg, first as u32, count, shared.config.timeout)?;
            if first == page {
                fault::TRANSFER.record(began.elapsed().as_nanos() as u64);
            }
            for p in first..first + usize::from(count) {
                self.cached.push(p as u32);
                if p != page {
                    self.pages[p] = PageState::Prefetched;
                    self.stats.prefetched += 1;
                }
            }
            self.stats.fetches += 1;
            self.stats.pages_fetched += u64::from(count);
            self.stats.data_bytes += u64::from(count) * PAGE as u64;
        }
        Ok(())
    }

    /// Sends the changes of every dirty page home and waits until each home has them. With
    /// SIGSEGV faults the pages become read-only copies (or, where the window has no room
    /// for the mappings that would take, every cached copy is dropped: [`Client::evict`]);
    /// with userfaultfd they stay mapped read-write and dirty, each changed one with a new
    /// twin.
    pub(crate) fn flush(&mut self, shared: &Shared) -> Result<()> {
        if self.dirty.is_empty() {
            return Ok(());
        }
        let region = &shared.region;
        // Each run made read-only adds at most two mappings.
        if region
            .maps()
            .is_some_and(|(now, budget, _)| now + 2 * self.dirty.len() > budget)
        {
            return self.evict(shared);
        }
        let after = if region.detects_writes() {
            AfterDiff::ReadOnly
        } else {
            AfterDiff::Twinned
        };
        self.send_diffs(shared, after)
    }

    /// Drops every cached copy, the changes of the dirty ones sent home first: used where
    /// opening a page, or making dirty pages read-only, would split the window into more
    /// mappings than the kernel allows (`vm.max_map_count`, SIGSEGV faults only). Closing
    /// them joins every run of non-home pages into one mapping, so the window is left with
    /// the mappings its home pages take (at most half of its budget: `Node::alloc`). Dropping
    /// a valid copy and sending changes home early are both allowed between synchronisations.
    pub(crate) fn evict(&mut self, shared: &Shared) -> Result<()> {
        if self.cached.is_empty() {
            return Ok(());
        }
        self.close_cached(shared)?;
        self.send_diffs(shared, AfterDiff::Closed)?;
        self.drop_cached();
        self.stats.evictions += 1;
        Ok(())
    }

    /// Closes the window pages of every cached copy (their state is left to the caller). With
    /// SIGSEGV faults closing them one run at a time could split the window further (a copy
    /// between two home pages is one mapping of three afterwards), so every allocated page is
    /// closed in one `mprotect` and the home pages are opened again run by run: the window's
    /// mappings only grow on the way back, to what the home pages take (at most half the
    /// budget, `Node::alloc`); for pages placed in blocks that is two or three calls. Home
    /// pages are closed for that moment, which is harmless because the one application thread
    /// is not touching the window: it is in a synchronisation, or held in a fault.
    fn close_cached(&mut self, shared: &Shared) -> Result<()> {
        let region = &shared.region;
        if self.cached.is_empty() {
            return Ok(());
        }
        if region.maps().is_none() {
            return for_each_run(&mut self.cached, |f, c| region.protect(f, c, Access::None));
        }
        let allocated = shared
            .layout
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .home
            .len();
        region.protect(0, allocated, Access::None)?;
        self.home_runs
            .iter()
            .try_for_each(|&(f, c)| region.protect(f, c, Access::ReadWrite))
    }

    /// Marks every cached copy invalid (their window pages closed already).
    fn drop_cached(&mut self) {
        for &p in &self.cached {
            self.pages[p as usize] = PageState::Invalid;
        }
        // Every dirty page is a cached one (userfaultfd keeps them dirty through `flush`).
        self.dirty.clear();
        self.cached.clear();
    }

    /// Diffs every dirty page with its twin, sends the changes to their homes and waits until
    /// each has them; `after` says what becomes of the pages.
    fn send_diffs(&mut self, shared: &Shared, after: AfterDiff) -> Result<()> {
        let mut dirty = std::mem::take(&mut self.dirty);
        let region = &shared.region;
        // Where writes fault, the pages become read-only first (a write after this point is
        // a new change with a new twin); elsewhere they stay writable and are twinned again
        // below, after their diff.
        let keep = after == AfterDiff::Twinned;
        if after == AfterDiff::ReadOnly {
            for_each_run(&mut dirty, |f, c| region.protect(f, c, Access::Read))?;
        }
        let layout = shared.layout.read().unwrap_or_else(|p| p.into_inner());
        // Per home: the payload being built and its page count.
        let mut batches: Vec<(Writer, u16)> =
            (0..shared.size).map(|_| (Writer::new(), 0)).collect();
        let mut ready: Vec<(u16, Vec<u8>, u16)> = Vec::new();
        // A batch is sent once it passes this size; one more page's diff (at most 2048 runs
        // of one byte: 10 KiB and its header) still fits the transport's largest payload.
        let limit = self.links.max_payload().saturating_sub(3 * PAGE);
        let (mut now, mut twin) = ([0u8; PAGE], [0u8; PAGE]);
        for &page in &dirty {
            let p = page as usize;
            let home = layout.home[p];
            let (Some(frame), Some(twin_at)) = (region.frame(p), region.twin(p)) else {
                continue;
            };
            // SAFETY: whole pages of the alias, read with atomic copies (region.rs). The
            // thread that holds the node is here, so nothing writes them: with SIGSEGV faults
            // the window page is read-only now; with userfaultfd it is still writable, but
            // only through the node's thread.
            unsafe {
                copy_from_shared(frame, &mut now);
                copy_from_shared(twin_at, &mut twin);
            }
            let mut runs = Writer::new();
            let n = diff_runs(&now, &twin, &mut runs);
            match after {
                AfterDiff::Twinned if n > 0 => {
                    // SAFETY: a whole page of the alias (its twin); nothing else writes it.
                    unsafe { copy_to_shared(&now, twin_at) };
                }
                AfterDiff::ReadOnly => self.pages[p] = PageState::ReadOnly,
                AfterDiff::Twinned | AfterDiff::Closed => {}
            }
            self.stats.diff_pages += 1;
            if n == 0 {
                continue;
            }
            let (w, count) = &mut batches[usize::from(home)];
            w.u32(page).u16(n).bytes(&runs.done());
            *count += 1;
            if *count == u16::MAX || w.len() >= limit {
                ready.push((home, w.done(), *count));
                *count = 0;
            }
        }
        drop(layout);
        if keep {
            self.dirty = dirty;
        }
        for (home, (mut w, count)) in batches.into_iter().enumerate() {
            if count > 0 {
                ready.push((home as u16, w.done(), count));
            }
        }
        // Every home's diffs are posted before the node waits, once, for all their
        // acknowledgements; a home with more than one message of diffs takes them in rounds,
        // one message to each home in each.
        let bound = shared.config.timeout;
        let mut round = Vec::new();
        while !ready.is_empty() {
            round.clear();
            let mut i = 0;
            while i < ready.len() {
                if round.iter().any(|m: &Msg| m.to == ready[i].0) {
                    i += 1;
                    continue;
                }
                let (home, body, count) = ready.remove(i);
                let mut payload = Vec::with_capacity(2 + body.len());
                payload.extend_from_slice(&count.to_le_bytes());
                payload.extend_from_slice(&body);
                self.stats.diff_bytes += (HEADER_LEN + payload.len()) as u64;
                round.push(self.message(shared, home, Op::Diff, 0, payload));
            }
            self.links.call_all(&round, Op::DiffAck, bound)?;
            self.stats.diff_waits += 1;
        }
        Ok(())
    }

    /// Drops every cached copy of a non-home page (called after a successful `flush`: their
    /// changes are home).
    pub(crate) fn invalidate(&mut self, shared: &Shared) -> Result<()> {
        // Close the pages first: if that fails, the node is poisoned and no access is made.
        self.close_cached(shared)?;
        self.drop_cached();
        Ok(())
    }
}

/// What becomes of dirty pages once their diffs are home.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AfterDiff {
    /// Read-only copies (SIGSEGV faults: the next write faults and twins again).
    ReadOnly,
    /// Still mapped read-write, each changed one twinned again (userfaultfd).
    Twinned,
    /// Closed already; the caller drops them ([`Client::evict`]).
    Closed,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diffs_name_exactly_the_changed_bytes() {
        let twin = [0u8; PAGE];
        let mut now = [0u8; PAGE];
        now[0] = 1;
        now[9] = 2;
        now[10] = 3;
        now[4095] = 4;
        let mut w = Writer::new();
        assert_eq!(diff_runs(&now, &twin, &mut w), 3);
        let bytes = w.done();
        let mut r = Reader::new(&bytes);
        let run = |r: &mut Reader<'_>| (r.u16().unwrap(), r.u16().unwrap());
        assert_eq!(run(&mut r), (0, 1));
        assert_eq!(r.take(1).unwrap(), [1]);
        assert_eq!(run(&mut r), (9, 2));
        assert_eq!(r.take(2).unwrap(), [2, 3]);
        assert_eq!(run(&mut r), (4095, 1));
        assert_eq!(r.take(1).unwrap(), [4]);
        r.finish().unwrap();
        assert_eq!(diff_runs(&twin, &twin, &mut Writer::new()), 0);
    }
}
