//! The applications shipped with the DSM; each checks its result against a single-node run
//! of the same computation and returns [`Error::Check`] on any difference.
//!
//! - [`counter`]: a counter incremented under a lock by every node.
//! - [`matmul`]: `C = A × B` on `n × n` doubles, rows of `C` computed by their home nodes.
//! - [`sor`]: red-black successive over-relaxation on an `n × n` grid, with barriers.
//! - [`false_sharing`]: every node writes its own bytes of the same pages.
//! - [`write_fault`]: a write to an invalid page, counted as one fault.
//! - [`stride`]: every other page of a large allocation written and read by every node.
//! - [`stress`]: random locks and barriers, every critical section logged and checked.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::global::Placement;
use crate::launch::FaultMechanism;
use crate::node::Node;
use crate::region::PAGE;
use crate::stats::{Histogram, quantile};

/// What a timed application returns: its result, and the time of its parallel part (from the
/// barrier after set-up to the barrier after the computation, without the check against the
/// single-node run).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timed<T> {
    /// The result.
    pub value: T,
    /// The parallel part's time on this node.
    pub compute: Duration,
}

/// Every node adds 1 to a counter `increments` times, each under lock 0; after a barrier the
/// counter must be `nodes × increments` on every node. Returns the counter.
pub fn counter(node: &Node, increments: u64) -> Result<Timed<u64>> {
    let counter = node.alloc::<u64>(1, Placement::Home(0))?;
    node.barrier()?;
    let started = Instant::now();
    for _ in 0..increments {
        let guard = node.lock(0)?;
        counter.set(0, counter.get(0)? + 1)?;
        guard.unlock()?;
    }
    node.barrier()?;
    let compute = started.elapsed();
    let value = counter.get(0)?;
    let expected = increments * u64::from(node.nodes());
    if value != expected {
        return Err(Error::Check(format!(
            "node {}: the counter is {value}, {expected} expected",
            node.rank()
        )));
    }
    node.barrier()?;
    Ok(Timed { value, compute })
}

fn matrix_a(i: usize, j: usize) -> f64 {
    ((i * 7 + j * 3) % 17) as f64 / 4.0 - 2.0
}

fn matrix_b(i: usize, j: usize) -> f64 {
    ((i * 5 + j * 11) % 13) as f64 / 8.0 + 0.5
}

/// The rows `0..n` that node `rank` of `nodes` owns (contiguous, near-equal parts).
fn rows_of(rank: u16, nodes: u16, n: usize) -> std::ops::Range<usize> {
    let (r, k) = (usize::from(rank), usize::from(nodes));
    (r * n / k)..((r + 1) * n / k)
}

/// `C = A × B` for `n × n` matrices of doubles: each node fills its rows of `A` and `B`,
/// computes its rows of `C`, and every element of `C` is compared bit for bit with the same
/// product computed in this process alone. Returns the sum of `C`.
pub fn matmul(node: &Node, n: usize) -> Result<Timed<f64>> {
    let len = n
        .checked_mul(n)
        .ok_or_else(|| Error::InvalidArgument(format!("a {n} × {n} matrix")))?;
    let a = node.alloc::<f64>(len, Placement::Blocked)?;
    let b = node.alloc::<f64>(len, Placement::Blocked)?;
    let c = node.alloc::<f64>(len, Placement::Blocked)?;
    let mine = rows_of(node.rank(), node.nodes(), n);
    let mut row = vec![0.0; n];
    for i in mine.clone() {
        row.iter_mut()
            .enumerate()
            .for_each(|(j, v)| *v = matrix_a(i, j));
        a.write(i * n, &row)?;
        row.iter_mut()
            .enumerate()
            .for_each(|(j, v)| *v = matrix_b(i, j));
        b.write(i * n, &row)?;
    }
    node.barrier()?;
    let started = Instant::now();
    let mut bm = vec![0.0; n * n];
    b.read(0, &mut bm)?;
    let mut arow = vec![0.0; n];
    for i in mine {
        a.read(i * n, &mut arow)?;
        for (j, out) in row.iter_mut().enumerate() {
            *out = (0..n).map(|k| arow[k] * bm[k * n + j]).sum();
        }
        c.write(i * n, &row)?;
    }
    node.barrier()?;
    let compute = started.elapsed();
    let mut cm = vec![0.0; n * n];
    c.read(0, &mut cm)?;
    for i in 0..n {
        for j in 0..n {
            let expected: f64 = (0..n).map(|k| matrix_a(i, k) * matrix_b(k, j)).sum();
            let got = cm[i * n + j];
            if got.to_bits() != expected.to_bits() {
                return Err(Error::Check(format!(
                    "node {}: C[{i}][{j}] = {got}, the single-node product has {expected}",
                    node.rank()
                )));
            }
        }
    }
    node.barrier()?;
    Ok(Timed {
        value: cm.iter().sum(),
        compute,
    })
}

fn sor_initial(i: usize, j: usize, n: usize) -> f64 {
    if i == 0 || j == 0 || i == n - 1 || j == n - 1 {
        ((i * 3 + j * 5) % 11) as f64
    } else {
        0.0
    }
}

const OMEGA: f64 = 1.25;

fn sor_update(grid: &[f64], n: usize, i: usize, j: usize) -> f64 {
    let old = grid[i * n + j];
    let around =
        grid[(i - 1) * n + j] + grid[(i + 1) * n + j] + grid[i * n + j - 1] + grid[i * n + j + 1];
    (1.0 - OMEGA) * old + OMEGA * 0.25 * around
}

/// Red-black SOR on an `n × n` grid (fixed borders) for `iterations` sweeps: each node
/// updates the interior cells of its rows, red cells then black cells, a barrier after each
/// half; the grid is compared bit for bit with the same sweeps run in this process alone.
/// Returns the grid's sum.
pub fn sor(node: &Node, n: usize, iterations: usize) -> Result<Timed<f64>> {
    if n < 3 {
        return Err(Error::InvalidArgument(format!(
            "a {n} × {n} grid (at least 3 × 3)"
        )));
    }
    let len = n
        .checked_mul(n)
        .ok_or_else(|| Error::InvalidArgument(format!("a {n} × {n} grid")))?;
    let grid = node.alloc::<f64>(len, Placement::Blocked)?;
    let mine = rows_of(node.rank(), node.nodes(), n);
    for i in mine.clone() {
        let row: Vec<f64> = (0..n).map(|j| sor_initial(i, j, n)).collect();
        grid.write(i * n, &row)?;
    }
    node.barrier()?;
    let started = Instant::now();
    let interior = mine.start.max(1)..mine.end.min(n - 1);
    let mut local = vec![0.0; n * n];
    for _ in 0..iterations {
        for colour in 0..2 {
            // Read the rows around this node's part once per half sweep.
            if !interior.is_empty() {
                let from = interior.start - 1;
                let to = interior.end + 1;
                grid.read(from * n, &mut local[from * n..to * n])?;
                for i in interior.clone() {
                    for j in 1..n - 1 {
                        if (i + j) % 2 == colour {
                            grid.set(i * n + j, sor_update(&local, n, i, j))?;
                        }
                    }
                }
            }
            node.barrier()?;
        }
    }
    let compute = started.elapsed();
    let mut reference: Vec<f64> = (0..n * n).map(|x| sor_initial(x / n, x % n, n)).collect();
    for _ in 0..iterations {
        for colour in 0..2 {
            for i in 1..n - 1 {
                for j in 1..n - 1 {
                    if (i + j) % 2 == colour {
                        reference[i * n + j] = sor_update(&reference, n, i, j);
                    }
                }
            }
        }
    }
    grid.read(0, &mut local)?;
    for (x, (got, expected)) in local.iter().zip(&reference).enumerate() {
        if got.to_bits() != expected.to_bits() {
            return Err(Error::Check(format!(
                "node {}: cell ({}, {}) = {got}, the single-node run has {expected}",
                node.rank(),
                x / n,
                x % n
            )));
        }
    }
    node.barrier()?;
    Ok(Timed {
        value: local.iter().sum(),
        compute,
    })
}

/// Every node writes bytes `rank` and `PAGE - 1 - rank` of each of `pages` pages (homes dealt
/// in turn), with no synchronisation between the writes; after a barrier every node checks
/// that all nodes' bytes are there and no other byte changed: diffs merge at the home.
pub fn false_sharing(node: &Node, pages: usize) -> Result<()> {
    let nodes = usize::from(node.nodes());
    if nodes > 100 {
        return Err(Error::InvalidArgument(format!(
            "{nodes} nodes (false-sharing marks bytes 1..=100 and 101..=200: at most 100)"
        )));
    }
    let bytes = node.alloc::<u8>(pages * PAGE, Placement::Interleaved)?;
    node.barrier()?;
    let r = usize::from(node.rank());
    for p in 0..pages {
        bytes.set(p * PAGE + r, r as u8 + 1)?;
        bytes.set(p * PAGE + PAGE - 1 - r, r as u8 + 101)?;
    }
    node.barrier()?;
    let mut page = vec![0u8; PAGE];
    for p in 0..pages {
        bytes.read(p * PAGE, &mut page)?;
        for (i, &b) in page.iter().enumerate() {
            let expected = if i < nodes {
                i as u8 + 1
            } else if i >= PAGE - nodes {
                (PAGE - 1 - i) as u8 + 101
            } else {
                0
            };
            if b != expected {
                return Err(Error::Check(format!(
                    "node {}: byte {i} of shared page {p} is {b}, {expected} expected",
                    node.rank()
                )));
            }
        }
    }
    node.barrier()?;
    Ok(())
}

/// What [`stride`] did on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strided {
    /// Pages touched.
    pub touched: usize,
    /// Pages of other homes written a second time.
    pub rewritten: usize,
}

/// A large window's workout: `pages` pages of `u64`s placed in blocks, of which every
/// `stride`-th page is written by every node (its word `1 + rank`), and those in the first
/// eighth of each block written again (after the first pass: with many pages, their copies
/// were dropped by then and are fetched again). After a barrier each home reads back its
/// pages among them (no fault: they are its own), every node's last word and the page's
/// untouched first word checked. With a stride of 2 the pages a node holds copies of
/// alternate with pages it holds none of, so with `SIGSEGV` faults each copy is a memory
/// mapping of its own: past the process's share of `vm.max_map_count` the node drops its
/// copies (the `evictions` counter) instead of failing.
pub fn stride(node: &Node, pages: usize, stride: usize) -> Result<Strided> {
    const WORDS: usize = PAGE / 8;
    let nodes = usize::from(node.nodes());
    if stride == 0 || nodes >= WORDS {
        return Err(Error::InvalidArgument(format!(
            "a stride of {stride} pages on {nodes} nodes (at least 1, at most {} nodes)",
            WORDS - 1
        )));
    }
    let len = pages.checked_mul(WORDS).ok_or_else(|| {
        Error::InvalidArgument(format!("{pages} pages overflow the address space"))
    })?;
    let words = node.alloc::<u64>(len, Placement::Blocked)?;
    let home = |page: usize| usize::from(Placement::Blocked.home(page, pages, node.nodes()));
    // Whether `page` lies in the first eighth of its home's block.
    let early = |page: usize| page - (home(page) * pages).div_ceil(nodes) < pages / nodes / 8;
    let value = |page: usize, rank: usize| {
        let again = if early(page) { 1 << 63 } else { 0 };
        again | (page as u64) << 16 | (rank as u64 + 1)
    };
    let r = usize::from(node.rank());
    node.barrier()?;
    let touched = (0..pages).step_by(stride);
    for page in touched.clone() {
        words.set(page * WORDS + 1 + r, value(page, r) & !(1 << 63))?;
    }
    let again = touched.clone().filter(|&p| early(p));
    for page in again.clone() {
        words.set(page * WORDS + 1 + r, value(page, r))?;
    }
    node.barrier()?;
    let mut seen = vec![0u64; 1 + nodes];
    for page in touched.clone().filter(|&p| home(p) == r) {
        words.read(page * WORDS, &mut seen)?;
        let expected = |w: usize| if w == 0 { 0 } else { value(page, w - 1) };
        if let Some(w) = (0..=nodes).find(|&w| seen[w] != expected(w)) {
            return Err(Error::Check(format!(
                "node {r}: word {w} of page {page} is {:#x}, {:#x} expected",
                seen[w],
                expected(w)
            )));
        }
    }
    node.barrier()?;
    Ok(Strided {
        touched: touched.count(),
        rewritten: again.filter(|&p| home(p) != r).count(),
    })
}

/// What [`stress`] did on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stressed {
    /// Critical sections (a random lock taken, its log appended to).
    pub sections: u64,
    /// Barriers.
    pub barriers: u64,
}

/// Node `rank`'s random lock choices in [`stress`]: the lock of each critical section, in
/// order (every 8th step is a barrier and takes none). Every node can replay every other's.
fn stress_choices(seed: u64, rank: usize, ops: usize, locks: u32) -> Vec<usize> {
    let mut rng = seed ^ (rank as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (0..ops)
        .filter(|step| step % 8 != 7)
        .map(|_| {
            // xorshift64*
            rng ^= rng >> 12;
            rng ^= rng << 25;
            rng ^= rng >> 27;
            (rng.wrapping_mul(0x2545_f491_4f6c_dd1d) % u64::from(locks)) as usize
        })
        .collect()
}

/// A randomised lock-and-barrier stress with a checker. Each node runs `ops` steps: every 8th
/// a barrier (all nodes take the same steps, so they meet), every other a critical section
/// under a random one of `locks` locks, chosen from its own random sequence (`seed` and its
/// rank). Under the lock it reads the lock's header (the last holder and the log's length, on
/// the last node) and checks that the log's last entry (on another page, another home) is the
/// last holder's; then appends its entry (its rank and its count of sections under that
/// lock), and writes the header. At the end every node checks every lock's log against what
/// it computes itself by replaying every node's sequence: the length is the number of
/// sections, and each node's entries are all there, once, in the order it made them. So a
/// lost, stale or reordered write of any node (an invalidation missed, a diff lost or applied
/// late) breaks a check, on the node that sees it.
pub fn stress(node: &Node, ops: usize, locks: u32, seed: u64) -> Result<Stressed> {
    if locks == 0 {
        return Err(Error::InvalidArgument("a stress over 0 locks".into()));
    }
    let nodes = usize::from(node.nodes());
    let r = usize::from(node.rank());
    let l = locks as usize;
    // Every node's sections per lock, replayed here.
    let mut expected = vec![vec![0u64; l]; nodes];
    for (n, counts) in expected.iter_mut().enumerate() {
        for lock in stress_choices(seed, n, ops, locks) {
            counts[lock] += 1;
        }
    }
    // Header of lock i: words 2i (the last holder, rank + 1, or 0) and 2i + 1 (log length).
    let heads = node.alloc::<u64>(2 * l, Placement::Home(node.nodes() - 1))?;
    // Each log can take every section of every node.
    let cap = ops * nodes;
    let logs = node.alloc::<u64>(l * cap, Placement::Interleaved)?;
    let mut mine = vec![0u64; l];
    let mut done = Stressed {
        sections: 0,
        barriers: 0,
    };
    let mut choices = stress_choices(seed, r, ops, locks).into_iter();
    node.barrier()?;
    for step in 0..ops {
        if step % 8 == 7 {
            node.barrier()?;
            done.barriers += 1;
            continue;
        }
        let Some(lock) = choices.next() else {
            return Err(Error::Check(format!(
                "node {r}: a step with no lock chosen"
            )));
        };
        let guard = node.lock(lock as u32)?;
        let last = heads.get(2 * lock)?;
        let len = heads.get(2 * lock + 1)? as usize;
        if len >= cap {
            return Err(Error::Check(format!(
                "node {r}: lock {lock}'s log has {len} entries, more than {cap} sections made"
            )));
        }
        let previous = match len {
            0 => 0,
            n => logs.get(lock * cap + n - 1)? >> 32,
        };
        if previous != last {
            return Err(Error::Check(format!(
                "node {r}: lock {lock}'s header says node {} held it last, its log's last \
                 entry is node {}'s",
                last.wrapping_sub(1) as i64,
                previous.wrapping_sub(1) as i64
            )));
        }
        logs.set(lock * cap + len, (r as u64 + 1) << 32 | mine[lock])?;
        heads.set(2 * lock + 1, len as u64 + 1)?;
        heads.set(2 * lock, r as u64 + 1)?;
        guard.unlock()?;
        mine[lock] += 1;
        done.sections += 1;
    }
    node.barrier()?;
    let mut log = vec![0u64; cap];
    for lock in 0..l {
        let len = heads.get(2 * lock + 1)? as usize;
        let sections: u64 = expected.iter().map(|counts| counts[lock]).sum();
        if len as u64 != sections || len > cap {
            return Err(Error::Check(format!(
                "node {r}: lock {lock}'s log has {len} entries, {sections} sections were made"
            )));
        }
        logs.read(lock * cap, &mut log[..len])?;
        let mut seen = vec![0u64; nodes];
        for (at, &entry) in log[..len].iter().enumerate() {
            let (who, count) = ((entry >> 32) as usize, entry & 0xffff_ffff);
            if who == 0 || who > nodes || seen[who - 1] != count {
                return Err(Error::Check(format!(
                    "node {r}: entry {at} of lock {lock}'s log is {entry:#x} (node {}, section \
                     {count}); {} expected next from that node",
                    who.wrapping_sub(1) as i64,
                    seen.get(who.wrapping_sub(1)).copied().unwrap_or(0)
                )));
            }
            seen[who - 1] += 1;
        }
        if let Some(n) = (0..nodes).find(|&n| seen[n] != expected[n][lock]) {
            return Err(Error::Check(format!(
                "node {r}: lock {lock}'s log has {} entries of node {n}, which made {} sections \
                 under it",
                seen[n], expected[n][lock]
            )));
        }
    }
    node.barrier()?;
    Ok(done)
}

/// Node 0 writes one byte of a page whose home is node 1 (invalid on node 0), then another
/// byte of it; returns node 0's (faults served, write faults, read faults) counted across
/// the two writes, which must be (1, 1, 0) where the fault's write bit is decoded (x86-64).
/// Node 1 checks both bytes after a barrier.
pub fn write_fault(node: &Node) -> Result<(u64, u64, u64)> {
    if node.nodes() < 2 {
        return Err(Error::InvalidArgument("write-fault needs two nodes".into()));
    }
    let bytes = node.alloc::<u8>(PAGE, Placement::Home(1))?;
    node.barrier()?;
    let mut counted = (0, 0, 0);
    if node.rank() == 0 {
        let before = node.stats();
        bytes.set(100, 7)?;
        bytes.set(200, 9)?;
        let after = node.stats();
        counted = (
            after.faults - before.faults,
            after.write_faults - before.write_faults,
            after.read_faults - before.read_faults,
        );
    }
    node.barrier()?;
    if node.rank() == 1 && (bytes.get(100)?, bytes.get(200)?) != (7, 9) {
        return Err(Error::Check(format!(
            "node 1 sees bytes {} and {} at its home, 7 and 9 expected",
            bytes.get(100)?,
            bytes.get(200)?
        )));
    }
    node.barrier()?;
    Ok(counted)
}

/// What a node counted while it read the pages [`prefetch`] names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefetchCounts {
    /// Fetch requests.
    pub fetches: u64,
    /// Pages fetched.
    pub pages: u64,
    /// Pages fetched ahead.
    pub prefetched: u64,
    /// Prefetched pages then touched.
    pub hits: u64,
}

/// Twelve pages in blocks of four (homes 0, 1, 0 on two nodes), each page's first `u64` its
/// number, written by its home. Then node 0 reads pages 4 (the first of node 1's block), 5
/// (fetched ahead with it when prefetching) and 7 (the block's last: prefetch stops at the
/// home boundary), and node 1 reads pages 11 (the allocation's last: prefetch stops at its
/// end), 0 (the first) and 1. Returns this node's counts over its reads; every value read is
/// checked.
pub fn prefetch(node: &Node) -> Result<PrefetchCounts> {
    if node.nodes() != 2 {
        return Err(Error::InvalidArgument(
            "prefetch runs on exactly two nodes".into(),
        ));
    }
    const PER_PAGE: usize = PAGE / 8;
    let pages = node.alloc::<u64>(12 * PER_PAGE, Placement::Cyclic { pages: 4 })?;
    for p in 0..12 {
        if pages.home_of(p * PER_PAGE)? == node.rank() {
            pages.set(p * PER_PAGE, p as u64)?;
        }
    }
    node.barrier()?;
    let reads: &[usize] = if node.rank() == 0 {
        &[4, 5, 7]
    } else {
        &[11, 0, 1]
    };
    let before = node.stats();
    for &p in reads {
        let v = pages.get(p * PER_PAGE)?;
        if v != p as u64 {
            return Err(Error::Check(format!(
                "node {}: page {p} starts with {v}",
                node.rank()
            )));
        }
    }
    let after = node.stats();
    node.barrier()?;
    Ok(PrefetchCounts {
        fetches: after.fetches - before.fetches,
        pages: after.pages_fetched - before.pages_fetched,
        prefetched: after.prefetched - before.prefetched,
        hits: after.prefetch_hits - before.prefetch_hits,
    })
}

/// What [`fetch_bench`] measured on node 0, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FetchBench {
    /// Pages touched.
    pub pages: usize,
    /// A read of a page with no copy here, as the application sees it (the fault, the
    /// hand-off to the fault thread, the fetch, the mapping and the return): p50.
    pub fault_p50: u64,
    /// The same, p99.
    pub fault_p99: u64,
    /// The same, p99.9.
    pub fault_p999: u64,
    /// The transfer inside those faults (request to the page in its frame): p50.
    pub transfer_p50: u64,
    /// The same, p99.
    pub transfer_p99: u64,
    /// A write to a page already read, as the application sees it: with `SIGSEGV` faults a
    /// local fault (a twin and an `mprotect`, no transfer); with `userfaultfd` no fault at
    /// all (the copy is writable). p50.
    pub local_p50: u64,
    /// The same, p99.
    pub local_p99: u64,
}

fn delta(after: &[u64], before: &[u64]) -> Vec<u64> {
    after.iter().zip(before).map(|(a, b)| a - b).collect()
}

/// Runs `access` and records how long it took.
fn timed<T>(histogram: &Histogram, access: impl FnOnce() -> Result<T>) -> Result<T> {
    let began = Instant::now();
    let value = access();
    histogram.record(began.elapsed().as_nanos() as u64);
    value
}

/// The page-fetch microbenchmark: node 1 is the home of `pages` pages (each starting with its
/// number); node 0 reads the first word of each (a fault and a fetch each), then writes it
/// (a local fault each with `SIGSEGV` faults, none with `userfaultfd`), timing each access.
/// Returns node 0's measurements (zeros on node 1); every value read and the number of faults
/// are checked.
pub fn fetch_bench(node: &Node, pages: usize) -> Result<FetchBench> {
    if node.nodes() != 2 {
        return Err(Error::InvalidArgument(
            "fetch-bench runs on exactly two nodes".into(),
        ));
    }
    const PER_PAGE: usize = PAGE / 8;
    let len = pages
        .checked_mul(PER_PAGE)
        .ok_or_else(|| Error::InvalidArgument(format!("{pages} pages")))?;
    let array = node.alloc::<u64>(len, Placement::Home(1))?;
    if node.rank() == 1 {
        for p in 0..pages {
            array.set(p * PER_PAGE, p as u64)?;
        }
    }
    node.barrier()?;
    let mut result = FetchBench {
        pages,
        ..FetchBench::default()
    };
    if node.rank() == 0 {
        let (seen_fetch, seen_local) = (Histogram::new(), Histogram::new());
        let (_, transfers0) = node.histograms();
        let faults0 = node.stats().faults;
        for p in 0..pages {
            let v = timed(&seen_fetch, || array.get(p * PER_PAGE))?;
            if v != p as u64 {
                return Err(Error::Check(format!("page {p} starts with {v}")));
            }
        }
        let (_, transfers1) = node.histograms();
        let faults1 = node.stats().faults;
        for p in 0..pages {
            timed(&seen_local, || array.set(p * PER_PAGE + 1, 1))?;
        }
        let faults2 = node.stats().faults;
        let fetch = seen_fetch.snapshot();
        let local = seen_local.snapshot();
        let transfer = delta(&transfers1, &transfers0);
        result.fault_p50 = quantile(&fetch, 0.5);
        result.fault_p99 = quantile(&fetch, 0.99);
        result.fault_p999 = quantile(&fetch, 0.999);
        result.transfer_p50 = quantile(&transfer, 0.5);
        result.transfer_p99 = quantile(&transfer, 0.99);
        result.local_p50 = quantile(&local, 0.5);
        result.local_p99 = quantile(&local, 0.99);
        let writes_fault = node.config().faults == FaultMechanism::Sigsegv;
        let expected = (pages as u64, if writes_fault { pages as u64 } else { 0 });
        let counted = (faults1 - faults0, faults2 - faults1);
        if counted != expected {
            return Err(Error::Check(format!(
                "{} and {} faults for {pages} reads and {pages} writes of fresh pages ({} and {} \
                 expected)",
                counted.0, counted.1, expected.0, expected.1
            )));
        }
    }
    node.barrier()?;
    Ok(result)
}
