//! A node: the API's entry point (joining, allocations, locks, barriers, statistics,
//! leaving), and the threads that serve faults (`client`) and other nodes' requests (`home`).

use std::cell::Cell;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::client::{self, Client, PageState};
use crate::error::{Error, Result};
use crate::fault;
use crate::global::{GlobalSlice, Placement};
use crate::home::{Home, Kind};
use crate::launch::{Config, Launch, fnv1a};
use crate::region::{Access, PAGE, Region, for_each_run};
use crate::shared::{Layout, Shared};
use crate::stats::{Report, Stats, quantile};
use crate::transport;
use crate::wire::{Op, Reader, Writer};

/// Whether a node is live in this process (the window is one fixed range, so at most one).
static LIVE: AtomicBool = AtomicBool::new(false);

/// A node of the DSM: one per process.
///
/// Created by [`Node::init`] (or [`Node::from_env`]); every other node of the job must do the
/// same. It is `Send` but not `Sync`: shared memory is accessed by the thread that holds it,
/// through [`GlobalSlice`]s, which borrow it.
#[derive(Debug)]
pub struct Node {
    shared: Arc<Shared>,
    client: Arc<Mutex<Client>>,
    wake: Arc<OwnedFd>,
    stop: Arc<OwnedFd>,
    fault_thread: Option<JoinHandle<()>>,
    server_thread: Option<JoinHandle<Result<()>>>,
    /// Node 0 saw a collective call fail: its server stays up at drop (bounded) so that the
    /// nodes still to arrive get the failure rather than a closed connection.
    linger: Cell<bool>,
    _not_sync: PhantomData<Cell<()>>,
    /// Last, so dropped last: the next node may map the window once this one's is unmapped.
    _live: Live,
}

/// Clears [`LIVE`] when dropped.
#[derive(Debug)]
struct Live;

impl Drop for Live {
    fn drop(&mut self) {
        LIVE.store(false, Ordering::Release);
    }
}

fn eventfd() -> Result<OwnedFd> {
    // SAFETY: eventfd has no memory preconditions.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(Error::last_os("eventfd"));
    }
    // SAFETY: a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn signal(fd: &OwnedFd) {
    let one = 1u64;
    // SAFETY: an 8-byte write to an eventfd.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

impl Node {
    /// Joins the job described by the environment ([`Launch::from_env`],
    /// [`Config::from_env`]).
    pub fn from_env() -> Result<Node> {
        Node::init(&Launch::from_env()?, Config::from_env()?)
    }

    /// Joins the job: maps the window, meets the other nodes and connects to them, and starts
    /// the fault and server threads. Fails if another node is live in this process, if the
    /// window's range is taken, or if the others do not join within `config.timeout`.
    pub fn init(launch: &Launch, config: Config) -> Result<Node> {
        if launch.size == 0 || launch.rank >= launch.size {
            return Err(Error::Config(format!(
                "rank {} of {} nodes",
                launch.rank, launch.size
            )));
        }
        config.check()?;
        if config.transport != crate::launch::TransportKind::Tcp && launch.size > 256 {
            return Err(Error::Config(format!(
                "{} nodes: the RDMA transports take at most 256 (a gather must fit one message)",
                launch.size
            )));
        }
        if LIVE.swap(true, Ordering::AcqRel) {
            return Err(Error::Config(
                "a DSM node is already live in this process".into(),
            ));
        }
        Node::start(launch, config).inspect_err(|_| LIVE.store(false, Ordering::Release))
    }

    fn start(launch: &Launch, config: Config) -> Result<Node> {
        let region = Region::new(config.window_base, config.window_bytes, config.faults)?;
        let pages = region.pages();
        let shared = Arc::new(Shared {
            rank: launch.rank,
            size: launch.size,
            config,
            region,
            layout: RwLock::new(Layout::default()),
            pages_served: AtomicU64::new(0),
            diffs_applied: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            poisoned: AtomicBool::new(false),
            others_gone: AtomicBool::new(false),
        });
        let (links, server) = transport::connect(launch, &shared)?;
        let client = Arc::new(Mutex::new(Client::new(links, pages)));
        let wake = Arc::new(eventfd()?);
        let stop = Arc::new(eventfd()?);
        if shared.region.detects_writes() {
            fault::install()?;
        }
        let server_thread = {
            let (shared, stop) = (Arc::clone(&shared), Arc::clone(&stop));
            std::thread::Builder::new()
                .name(format!("dsm-server-{}", shared.rank))
                .spawn(move || server.run(Home::new(Arc::clone(&shared)), &shared, &stop))
                .map_err(|e| Error::os("spawning the server thread", e))?
        };
        let fault_thread = {
            let (ours, client, wake) =
                (Arc::clone(&shared), Arc::clone(&client), Arc::clone(&wake));
            // Marked alive before the first fault can come, and until the thread ends.
            let alive = fault::Alive::new();
            let spawned = std::thread::Builder::new()
                .name(format!("dsm-faults-{}", shared.rank))
                .spawn(move || {
                    let _alive = alive;
                    client::serve_faults(&ours, &client, &wake);
                });
            match spawned {
                Ok(thread) => thread,
                Err(e) => {
                    // The server thread already serves the other nodes: it is stopped and
                    // joined before the error drops what it uses.
                    shared.stopping.store(true, Ordering::Release);
                    signal(&stop);
                    let _ = server_thread.join();
                    return Err(Error::os("spawning the fault thread", e));
                }
            }
        };
        if shared.region.detects_writes() {
            fault::serve(shared.region.base(), shared.region.len(), wake.as_raw_fd());
        }
        Ok(Node {
            shared,
            client,
            wake,
            stop,
            fault_thread: Some(fault_thread),
            server_thread: Some(server_thread),
            linger: Cell::new(false),
            _not_sync: PhantomData,
            _live: Live,
        })
    }

    /// This node's rank, `0..nodes()`.
    pub fn rank(&self) -> u16 {
        self.shared.rank
    }

    /// The number of nodes.
    pub fn nodes(&self) -> u16 {
        self.shared.size
    }

    /// The configuration every node shares.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    fn client(&self) -> Result<MutexGuard<'_, Client>> {
        let client = self.client.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(why) = &client.broken {
            return Err(Error::Config(format!(
                "the node is unusable after an earlier failure: {why}"
            )));
        }
        Ok(client)
    }

    fn broken<T>(&self, client: &mut Client, result: Result<T>) -> Result<T> {
        if let Err(e) = &result {
            client.broken.get_or_insert_with(|| e.to_string());
            self.shared.poisoned.store(true, Ordering::Release);
            if self.rank() == 0 && matches!(e, Error::UnequalCollective(_) | Error::Peer { .. }) {
                self.linger.set(true);
            }
        }
        result
    }

    /// Allocates a shared array of `len` elements of `T`, zeroed, collectively: every node
    /// must make the same call (same `len`, type size and placement) in the same order, or
    /// every node gets [`Error::UnequalCollective`]. Allocations start on a page boundary;
    /// `placement` says which node is each page's home.
    pub fn alloc<T: bytemuck::Pod>(
        &self,
        len: usize,
        placement: Placement,
    ) -> Result<GlobalSlice<'_, T>> {
        if std::mem::align_of::<T>() > PAGE {
            return Err(Error::InvalidArgument(format!(
                "an alignment of {} bytes (at most {PAGE})",
                std::mem::align_of::<T>()
            )));
        }
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            Error::InvalidArgument(format!("{len} elements overflow the address space"))
        })?;
        let pages = bytes.div_ceil(PAGE);
        placement.check(self.nodes())?;
        let mut client = self.client()?;
        let first = self
            .shared
            .layout
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .home
            .len();
        let available = self.shared.region.pages() - first;
        let digest = fnv1a(
            format!(
                "{len}|{}|{}|{placement:?}",
                std::mem::size_of::<T>(),
                std::mem::align_of::<T>()
            )
            .as_bytes(),
        );
        if pages > available {
            // Still a collective call, so that a node whose call differs is reported as such
            // and no node waits for one that gave up here.
            let result = client.collective(&self.shared, Kind::Alloc, digest, &[]);
            self.broken(&mut client, result)?;
            return Err(Error::InvalidArgument(format!(
                "an allocation of {bytes} bytes ({pages} pages) does not fit: {available} of the \
                 window's {} pages are left (raise --window-mib)",
                self.shared.region.pages()
            )));
        }
        // Record the new pages before the collective call: once node 0 answers anyone, every
        // node has recorded them, so a fault on one of them finds its home ready to serve it.
        let mut home_pages = Vec::new();
        {
            let mut layout = self
                .shared
                .layout
                .write()
                .unwrap_or_else(|p| p.into_inner());
            for i in 0..pages {
                let home = placement.home(i, pages, self.nodes());
                layout.home.push(home);
                if home == self.rank() {
                    home_pages.push((first + i) as u32);
                }
            }
        }
        let region = &self.shared.region;
        // With SIGSEGV faults the home pages' runs split the window into mappings: an
        // allocation after which they would take more than half of the window's budget (the
        // rest is for cached copies) is refused on every node, each node saying so in its
        // contribution to the collective call.
        let room = self.home_maps().and_then(|(needed, budget, limit)| {
            (needed > budget / 2).then_some((needed, budget / 2, limit))
        });
        let mut runs = Vec::new();
        for_each_run(&mut home_pages, |f, c| {
            runs.push((f, c));
            Ok(())
        })?;
        let known_runs = client.home_runs.len();
        let mut opened = Ok(());
        // Opening adds at most two mappings a run; cached copies may have taken them.
        if room.is_none()
            && region
                .maps()
                .is_some_and(|(now, budget, _)| now + 2 * runs.len() > budget)
        {
            opened = client.evict(&self.shared);
        }
        if room.is_none() && opened.is_ok() {
            for &p in &home_pages {
                client.pages[p as usize] = PageState::Home;
            }
            client.home_runs.extend_from_slice(&runs);
            opened = runs.iter().try_for_each(|&(f, c)| {
                if !region.detects_writes() {
                    // A frame the file does not hold cannot be mapped with userfaultfd.
                    region.populate(f, c)?;
                }
                region.protect(f, c, Access::ReadWrite)
            });
        }
        let mut said = Writer::new();
        match room {
            None => said.u8(1),
            Some((needed, allowed, limit)) => said
                .u8(0)
                .u64(needed as u64)
                .u64(allowed as u64)
                .u64(limit as u64),
        };
        let result = opened
            .and_then(|()| client.collective(&self.shared, Kind::Alloc, digest, &said.done()));
        let all = self.broken(&mut client, result)?;
        if let Some(error) = refusal(&all, pages, placement)? {
            // Every node refuses: the pages are forgotten and this node's homes closed.
            self.shared
                .layout
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .home
                .truncate(first);
            if room.is_none() {
                client.home_runs.truncate(known_runs);
                let closed = runs
                    .iter()
                    .try_for_each(|&(f, c)| region.protect(f, c, Access::None));
                self.broken(&mut client, closed)?;
                for &p in &home_pages {
                    client.pages[p as usize] = PageState::Invalid;
                }
            }
            return Err(error);
        }
        Ok(GlobalSlice::new(
            self,
            region.page_addr(first).cast::<T>(),
            len,
            first,
        ))
    }

    /// With `SIGSEGV` faults, `(needed, budget, vm.max_map_count)`: the mappings the window
    /// takes when only this node's home pages (of every allocation, in the layout) are open.
    fn home_maps(&self) -> Option<(usize, usize, usize)> {
        let (_, budget, limit) = self.shared.region.maps()?;
        let layout = self.shared.layout.read().unwrap_or_else(|p| p.into_inner());
        let me = self.rank();
        let mut boundaries = 0;
        let mut before = false;
        for &home in &layout.home {
            let mine = home == me;
            boundaries += usize::from(mine != before);
            before = mine;
        }
        // The pages past the allocations are closed.
        boundaries += usize::from(before);
        Some((boundaries + 1, budget, limit))
    }

    /// The fault-service and page-transfer histograms now (process-wide counts per bucket;
    /// difference two snapshots to measure a phase, see [`crate::stats::quantile`]).
    pub(crate) fn histograms(&self) -> (Vec<u64>, Vec<u64>) {
        (fault::LATENCY.snapshot(), fault::TRANSFER.snapshot())
    }

    /// Whether an earlier failure left the page table unreliable (accesses are refused).
    pub(crate) fn poisoned(&self) -> bool {
        self.shared.poisoned.load(Ordering::Acquire)
    }

    /// Which node is the home of window page `page`, if it is allocated.
    pub(crate) fn home_of_page(&self, page: usize) -> Option<u16> {
        self.shared.home_of(page)
    }

    /// Waits until every node has called `barrier`: this node's changes go home first, and
    /// afterwards every cached copy is dropped, so each node sees every change made before
    /// the barrier (release, then acquire).
    pub fn barrier(&self) -> Result<()> {
        let mut client = self.client()?;
        let began = Instant::now();
        let result = client
            .flush(&self.shared)
            .and_then(|()| client.collective(&self.shared, Kind::Barrier, 0, &[]))
            .and_then(|_| client.invalidate(&self.shared));
        client.stats.barriers += 1;
        client.stats.barrier_wait_ns += began.elapsed().as_nanos() as u64;
        self.broken(&mut client, result)
    }

    /// Takes lock `id` (managed by node `id mod nodes()`), waiting as long as another node
    /// holds it (at most the configured sync timeout). Changes other nodes made before they
    /// released it are visible once it is taken. Released by [`LockGuard::unlock`] or when
    /// the guard is dropped.
    pub fn lock(&self, id: u32) -> Result<LockGuard<'_>> {
        let mut client = self.client()?;
        if client.held.contains(&id) {
            return Err(Error::InvalidArgument(format!(
                "lock {id} is already held by this node"
            )));
        }
        let began = Instant::now();
        let manager = (id % u32::from(self.nodes())) as u16;
        let bound = self.shared.config.sync_timeout;
        let result = client
            .flush(&self.shared)
            .and_then(|()| {
                client.call(
                    &self.shared,
                    manager,
                    Op::Acquire,
                    0,
                    id.to_le_bytes().to_vec(),
                    Op::Granted,
                    bound,
                )
            })
            .and_then(|_| client.invalidate(&self.shared));
        client.stats.locks += 1;
        client.stats.lock_wait_ns += began.elapsed().as_nanos() as u64;
        self.broken(&mut client, result)?;
        client.held.push(id);
        Ok(LockGuard {
            node: self,
            id,
            held: true,
        })
    }

    fn unlock(&self, id: u32) -> Result<()> {
        let mut client = self.client()?;
        client.held.retain(|&h| h != id);
        let manager = (id % u32::from(self.nodes())) as u16;
        let result = client.flush(&self.shared).and_then(|()| {
            let msg = client.message(
                &self.shared,
                manager,
                Op::Release,
                0,
                id.to_le_bytes().to_vec(),
            );
            client.links.send(&msg, self.shared.config.timeout)
        });
        self.broken(&mut client, result)
    }

    /// This node's counters now.
    pub fn stats(&self) -> Stats {
        let client = self.client.lock().unwrap_or_else(|p| p.into_inner());
        let mut s = client.stats.clone();
        s.pages_served = self.shared.pages_served.load(Ordering::Relaxed);
        s.diffs_applied = self.shared.diffs_applied.load(Ordering::Relaxed);
        s.faults = fault::HANDLED.load(Ordering::Relaxed);
        let counts = fault::LATENCY.snapshot();
        s.fault_p50_ns = quantile(&counts, 0.5);
        s.fault_p99_ns = quantile(&counts, 0.99);
        s.fault_p999_ns = quantile(&counts, 0.999);
        s
    }

    /// Leaves the job: a last barrier, every node's statistics gathered (each node gets the
    /// whole report), and the connections closed once every node has left.
    pub fn finalize(mut self) -> Result<Report> {
        let report = {
            let stats = self.stats().encode();
            let mut client = self.client()?;
            let result = client
                .flush(&self.shared)
                .and_then(|()| client.collective(&self.shared, Kind::Finalize, 0, &stats));
            let all = self.broken(&mut client, result)?;
            let nodes = all
                .iter()
                .map(|b| Stats::decode(b))
                .collect::<Result<Vec<Stats>>>()?;
            for rank in 0..self.nodes() {
                let msg = client.message(&self.shared, rank, Op::Exit, 0, Vec::new());
                client.links.send(&msg, self.shared.config.timeout)?;
            }
            Report { nodes }
        };
        // Every node sent its `Exit`; the server ends once all have arrived (or their senders
        // died). Bounded: a node that never sends one is treated as gone.
        let deadline = Instant::now() + self.shared.config.timeout;
        while self
            .server_thread
            .as_ref()
            .is_some_and(|t| !t.is_finished())
        {
            if Instant::now() >= deadline {
                return Err(Error::protocol(
                    "not every node said it was leaving within the reply bound",
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Some(server) = self.server_thread.take() {
            let done = server
                .join()
                .map_err(|_| Error::protocol("the server thread panicked"))?;
            done?;
        }
        Ok(report)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.linger.get() {
            // Serve until every other node has left or died (its failure reply sent), within
            // the peer bound.
            let deadline = Instant::now() + self.shared.config.timeout;
            while self
                .server_thread
                .as_ref()
                .is_some_and(|t| !t.is_finished())
                && !self.shared.others_gone.load(Ordering::Acquire)
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        fault::unserve();
        self.shared.stopping.store(true, Ordering::Release);
        signal(&self.wake);
        signal(&self.stop);
        if let Some(t) = self.fault_thread.take() {
            let _ = t.join();
        }
        if let Some(t) = self.server_thread.take() {
            let _ = t.join();
        }
        // `LIVE` is cleared by the `_live` field, after `shared` (and its window) is dropped.
    }
}

/// The error every node returns when a node refused an allocation of `pages` pages placed by
/// `placement` (its contribution to the collective call: `0`, the mappings needed, allowed
/// and the limit; `1` where it fits), or `None` when every node took it.
pub(crate) fn refusal(
    all: &[Vec<u8>],
    pages: usize,
    placement: Placement,
) -> Result<Option<Error>> {
    for (rank, said) in all.iter().enumerate() {
        let mut r = Reader::new(said);
        if r.u8()? == 1 {
            r.finish()?;
            continue;
        }
        let (needed, allowed, limit) = (r.u64()?, r.u64()?, r.u64()?);
        r.finish()?;
        return Ok(Some(Error::MapLimit {
            what: format!(
                "node {rank}: the home pages of an allocation of {pages} pages placed \
                 {placement:?} (they may take half the window's mappings, the rest is for \
                 cached copies)"
            ),
            needed: needed as usize,
            allowed: allowed as usize,
            limit: limit as usize,
        }));
    }
    Ok(None)
}

/// A held lock; released by [`LockGuard::unlock`] (which reports errors) or on drop (which
/// records an error and makes the node's next call report it).
#[derive(Debug)]
#[must_use = "the lock is released when the guard is dropped"]
pub struct LockGuard<'n> {
    node: &'n Node,
    id: u32,
    held: bool,
}

impl LockGuard<'_> {
    /// The lock's id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Sends this node's changes home, then gives the lock back.
    pub fn unlock(mut self) -> Result<()> {
        self.held = false;
        self.node.unlock(self.id)
    }
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        if self.held {
            // An error is recorded in the node (`broken`) and reported by its next call.
            let _ = self.node.unlock(self.id);
        }
    }
}
