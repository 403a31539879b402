//! A node: the API's entry point, its client side (faults, locks, barriers, allocations) and
//! the threads that serve faults and other nodes' requests.

use std::cell::Cell;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdma_verbs::shared::{copy_from_shared, copy_to_shared};

use crate::error::{Error, Result};
use crate::fault;
use crate::global::{GlobalSlice, Placement};
use crate::home::{Home, Kind};
use crate::launch::{Config, Launch, fnv1a};
use crate::region::{Access, PAGE, Region, for_each_run};
use crate::stats::{Report, Stats, quantile};
use crate::transport::{self, Links};
use crate::wire::{HEADER_LEN, Msg, Op, Reader, Writer};

/// Whether a node is live in this process (the window is one fixed range, so at most one).
static LIVE: AtomicBool = AtomicBool::new(false);

/// Which node is the home of each allocated page (its length is the allocated page count).
#[derive(Debug, Default)]
pub(crate) struct Layout {
    pub(crate) home: Vec<u16>,
}

/// What the node's threads share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) rank: u16,
    pub(crate) size: u16,
    pub(crate) config: Config,
    pub(crate) region: Region,
    pub(crate) layout: RwLock<Layout>,
    pub(crate) pages_served: AtomicU64,
    pub(crate) diffs_applied: AtomicU64,
    stopping: AtomicBool,
    /// An operation failed part-way and the page table may no longer match the window's
    /// protections: every access through the API is refused from then on.
    pub(crate) poisoned: AtomicBool,
}

impl Shared {
    /// The home of window page `page`, if it is allocated.
    pub(crate) fn home_of(&self, page: usize) -> Option<u16> {
        let layout = self.layout.read().unwrap_or_else(|p| p.into_inner());
        layout.home.get(page).copied()
    }
}

/// A page's state on this node (docs/dsm.md, "Consistency model and protocol").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PageState {
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
struct Client {
    links: Links,
    seq: u32,
    collectives: u32,
    pages: Vec<PageState>,
    /// Pages in state `Dirty`.
    dirty: Vec<u32>,
    /// Non-home pages in state `Prefetched`, `ReadOnly` or `Dirty` (invalidated at acquire).
    cached: Vec<u32>,
    stats: Stats,
    /// An earlier failure that left the node unusable (an unequal collective, a failed unlock
    /// in a guard's `Drop`); every later call reports it.
    broken: Option<String>,
    /// Locks this node holds.
    held: Vec<u32>,
}

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
        let region = Region::new(config.window_base, config.window_bytes)?;
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
        });
        let (links, server) = transport::connect(launch, &shared)?;
        let client = Arc::new(Mutex::new(Client {
            links,
            seq: 0,
            collectives: 0,
            pages: vec![PageState::Invalid; pages],
            dirty: Vec::new(),
            cached: Vec::new(),
            stats: Stats::default(),
            broken: None,
            held: Vec::new(),
        }));
        let wake = Arc::new(eventfd()?);
        let stop = Arc::new(eventfd()?);
        fault::install()?;
        let server_thread = {
            let (shared, stop) = (Arc::clone(&shared), Arc::clone(&stop));
            std::thread::Builder::new()
                .name(format!("dsm-server-{}", shared.rank))
                .spawn(move || server.run(Home::new(Arc::clone(&shared)), &shared, &stop))
                .map_err(|e| Error::os("spawning the server thread", e))?
        };
        let fault_thread = {
            let (shared, client, wake) =
                (Arc::clone(&shared), Arc::clone(&client), Arc::clone(&wake));
            // Marked alive before the first fault can come, and until the thread ends.
            let alive = fault::Alive::new();
            std::thread::Builder::new()
                .name(format!("dsm-faults-{}", shared.rank))
                .spawn(move || {
                    let _alive = alive;
                    serve_faults(&shared, &client, &wake)
                })
                .map_err(|e| Error::os("spawning the fault thread", e))?
        };
        fault::serve(shared.region.base(), shared.region.len(), wake.as_raw_fd());
        Ok(Node {
            shared,
            client,
            wake,
            stop,
            fault_thread: Some(fault_thread),
            server_thread: Some(server_thread),
            linger: Cell::new(false),
            _not_sync: PhantomData,
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
        for &p in &home_pages {
            client.pages[p as usize] = PageState::Home;
        }
        let region = &self.shared.region;
        let opened = for_each_run(&mut home_pages, |f, c| {
            region.protect(f, c, Access::ReadWrite)
        });
        let result =
            opened.and_then(|()| client.collective(&self.shared, Kind::Alloc, digest, &[]));
        self.broken(&mut client, result)?;
        Ok(GlobalSlice::new(
            self,
            region.page_addr(first).cast::<T>(),
            len,
            first,
        ))
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
            // The server ends by itself once every other node has left or died.
            let deadline = Instant::now() + self.shared.config.timeout;
            while self
                .server_thread
                .as_ref()
                .is_some_and(|t| !t.is_finished())
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
        LIVE.store(false, Ordering::Release);
    }
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

/// The fault thread: takes each fault the handler reports and installs its page.
fn serve_faults(shared: &Shared, client: &Mutex<Client>, wake: &OwnedFd) {
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
            let mut c = client.lock().unwrap_or_else(|p| p.into_inner());
            let served = if shared.poisoned.load(Ordering::Acquire) {
                Err(Error::Config(
                    "the node is unusable after an earlier failure".into(),
                ))
            } else {
                c.serve_fault(shared, request.addr, request.write)
            };
            if served.is_err() {
                shared.poisoned.store(true, Ordering::Release);
            }
            match served {
                Ok(()) => fault::complete(request, true),
                Err(e) => {
                    crate::say!(
                        "dsm: node {}: the access at {:#x} cannot be served: {e}",
                        shared.rank,
                        request.addr
                    );
                    fault::complete(request, false);
                }
            }
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

impl Client {
    fn message(&mut self, shared: &Shared, to: u16, op: Op, flags: u8, payload: Vec<u8>) -> Msg {
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
    fn call(
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
    fn collective(
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
        let mut r = Reader::new(&reply.payload);
        let count = r.u16()?;
        if count != shared.size {
            return Err(Error::protocol(format!(
                "a collective reply for {count} nodes, not {}",
                shared.size
            )));
        }
        let mut all = Vec::with_capacity(usize::from(count));
        for _ in 0..count {
            let len = r.u32()? as usize;
            all.push(r.take(len)?.to_vec());
        }
        r.finish()?;
        Ok(all)
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
        match (self.pages[page], write) {
            (PageState::Home, _) => Err(Error::protocol(format!(
                "a fault on home page {page}, which is always mapped"
            ))),
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

    /// Opens a page whose frame holds a valid copy: read-only, or writable with a twin.
    fn open(&mut self, shared: &Shared, page: usize, write: bool) -> Result<()> {
        if write {
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

    /// Fetches `page` (and up to `prefetch` following pages of the same home that are
    /// invalid here) into their frames; the window pages stay inaccessible.
    fn fetch(&mut self, shared: &Shared, page: usize, home: u16) -> Result<()> {
        let mut count: u16 = 1;
        {
            let layout = shared.layout.read().unwrap_or_else(|p| p.into_inner());
            for extra in 1..=usize::from(shared.config.prefetch) {
                let next = page + extra;
                if self.pages.get(next) != Some(&PageState::Invalid)
                    || layout.home.get(next) != Some(&home)
                {
                    break;
                }
                count += 1;
            }
        }
        let mut w = Writer::new();
        w.u32(page as u32).u16(count);
        let msg = self.message(shared, home, Op::GetPage, 0, w.done());
        let began = Instant::now();
        self.links
            .fetch(shared, &msg, page as u32, count, shared.config.timeout)?;
        fault::TRANSFER.record(began.elapsed().as_nanos() as u64);
        for i in 0..usize::from(count) {
            self.cached.push((page + i) as u32);
            if i > 0 {
                self.pages[page + i] = PageState::Prefetched;
                self.stats.prefetched += 1;
            }
        }
        self.stats.fetches += 1;
        self.stats.pages_fetched += u64::from(count);
        self.stats.data_bytes += u64::from(count) * PAGE as u64;
        Ok(())
    }

    /// Sends the changes of every dirty page home and waits until each home has them; the
    /// pages become read-only copies.
    fn flush(&mut self, shared: &Shared) -> Result<()> {
        if self.dirty.is_empty() {
            return Ok(());
        }
        let mut dirty = std::mem::take(&mut self.dirty);
        let region = &shared.region;
        for_each_run(&mut dirty, |f, c| region.protect(f, c, Access::Read))?;
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
            // SAFETY: whole pages of the alias; the window page is read-only now and the
            // application thread is here, so nothing writes them (region.rs).
            unsafe {
                copy_from_shared(frame, &mut now);
                copy_from_shared(twin_at, &mut twin);
            }
            let mut runs = Writer::new();
            let n = diff_runs(&now, &twin, &mut runs);
            self.pages[p] = PageState::ReadOnly;
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
        for (home, (mut w, count)) in batches.into_iter().enumerate() {
            if count > 0 {
                ready.push((home as u16, w.done(), count));
            }
        }
        let bound = shared.config.timeout;
        for (home, body, count) in ready {
            let mut payload = Vec::with_capacity(2 + body.len());
            payload.extend_from_slice(&count.to_le_bytes());
            payload.extend_from_slice(&body);
            self.stats.diff_bytes += (HEADER_LEN + payload.len()) as u64;
            self.call(shared, home, Op::Diff, 0, payload, Op::DiffAck, bound)?;
        }
        Ok(())
    }

    /// Drops every cached copy of a non-home page (after `flush`, none is dirty).
    fn invalidate(&mut self, shared: &Shared) -> Result<()> {
        let mut cached = std::mem::take(&mut self.cached);
        let region = &shared.region;
        // Close the pages first: if that fails, the node is poisoned and no access is made.
        for_each_run(&mut cached, |f, c| region.protect(f, c, Access::None))?;
        for &p in &cached {
            self.pages[p as usize] = PageState::Invalid;
        }
        cached.clear();
        self.cached = cached;
        Ok(())
    }
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
