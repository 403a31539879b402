//! The shared window and its backing memory (docs/dsm.md, "Memory layout").
//!
//! One `memfd` holds a frame for every page of the window followed by a twin for every page.
//! The runtime maps all of it read-write at an address of the kernel's choosing (the *alias*):
//! fetched pages are written there, diffs computed there, and the RDMA transports register it.
//! The application's *window* maps the frames again at a fixed address, the same on every
//! node. With `SIGSEGV` faults, `mprotect` gives each of its pages `PROT_NONE`, read or
//! read-write; with `userfaultfd` the window is read-write and a page is either mapped
//! (`UFFDIO_CONTINUE`) or not (`MADV_DONTNEED`), see [`crate::userfault`]. Either way a page
//! is installed by filling its frame through the alias while the window page is still
//! inaccessible, and only then opening it: no thread sees a half-written page or writes into
//! one without faulting. The file is sparse, so untouched pages cost no memory.
//!
//! With `SIGSEGV` faults each run of window pages of one protection is one of the kernel's
//! mappings, and a process may have at most `vm.max_map_count` of them (65,530 by default).
//! The region counts the window's mappings as it changes protections ([`Maps`]) and refuses a
//! change that would pass its share of that limit with [`Error::MapLimit`], before the kernel
//! would refuse it half-way; the node then closes its cached copies, which joins their runs
//! (`client.rs`, `evict`).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::launch::FaultMechanism;
use crate::userfault::Userfault;

/// The page size the DSM works in (the kernel's must be the same).
pub const PAGE: usize = 4096;

/// A window page's access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Access {
    /// No access: the next touch faults.
    None,
    /// Reads only: the next write faults (`SIGSEGV` faults only).
    Read,
    /// Reads and writes.
    ReadWrite,
}

impl Access {
    fn prot(self) -> libc::c_int {
        match self {
            Access::None => libc::PROT_NONE,
            Access::Read => libc::PROT_READ,
            Access::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
        }
    }
}

/// The memfd, its alias mapping and the application window.
#[derive(Debug)]
pub(crate) struct Region {
    fd: OwnedFd,
    alias: *mut u8,
    window: *mut u8,
    len: usize,
    /// The descriptor that reports the window's faults, with `userfaultfd` faults.
    userfault: Option<Userfault>,
    /// The window's mappings, with `SIGSEGV` faults (`userfaultfd` never splits it).
    maps: Option<Mutex<Maps>>,
}

/// Mappings the process keeps free for everything but the window: thread stacks, libraries,
/// the allocator's arenas and the RDMA provider's mappings made after the window.
const MAPS_HEADROOM: usize = 2048;

/// The window's mappings as the kernel splits them: one per run of pages of one protection.
#[derive(Debug)]
pub(crate) struct Maps {
    /// Each page's access (`Access as u8`).
    access: Vec<u8>,
    /// Neighbouring pages of different access: the window is `boundaries + 1` mappings.
    boundaries: usize,
    /// How many mappings the window may be split into.
    pub(crate) budget: usize,
    /// `vm.max_map_count`, as read when the window was mapped.
    pub(crate) limit: usize,
}

impl Maps {
    /// A window of `pages` pages with no access, with `budget` mappings of `limit`.
    fn new(pages: usize, budget: usize, limit: usize) -> Maps {
        Maps {
            access: vec![Access::None as u8; pages],
            boundaries: 0,
            budget,
            limit,
        }
    }

    /// The mappings the window is now.
    pub(crate) fn count(&self) -> usize {
        self.boundaries + 1
    }

    /// The mappings the window would be with pages `first..first + count` (in the window,
    /// `count > 0`) set to `access`. Only the pairs of pages the run touches change.
    fn count_after(&self, first: usize, count: usize, access: Access) -> usize {
        let end = first + count;
        let lo = first.saturating_sub(1);
        let hi = (end + 1).min(self.access.len());
        let now = |i: usize| self.access[i];
        let after = |i: usize| {
            if (first..end).contains(&i) {
                access as u8
            } else {
                self.access[i]
            }
        };
        let (mut old, mut new) = (0, 0);
        for i in lo + 1..hi {
            old += usize::from(now(i - 1) != now(i));
            new += usize::from(after(i - 1) != after(i));
        }
        self.boundaries - old + new + 1
    }

    /// Records that pages `first..first + count` are now `access`.
    fn set(&mut self, first: usize, count: usize, access: Access) {
        self.boundaries = self.count_after(first, count, access) - 1;
        self.access[first..first + count].fill(access as u8);
    }
}

/// The mapping limit: `DSM_MAX_MAP_COUNT` where set (a lower limit than the kernel's, to leave
/// room for the rest of a program, or the default on a machine that raised it, as the tests
/// do), else what `/proc/sys/vm/max_map_count` says (the kernel's default where it cannot be
/// read); and how many mappings the process has now.
fn map_limit_and_use() -> (usize, usize) {
    let limit = std::env::var("DSM_MAX_MAP_COUNT")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/vm/max_map_count").ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(65_530);
    let used = std::fs::read_to_string("/proc/self/maps")
        .map(|s| s.lines().count())
        .unwrap_or(0);
    (limit, used)
}

// SAFETY: `Region` holds addresses of mappings it owns; it never makes references into them.
// Every access to the bytes goes through raw pointers with atomic copies
// (`rdma_verbs::shared`), and mapping changes are system calls, so sharing the addresses
// between threads is sound.
unsafe impl Send for Region {}
// SAFETY: as for `Send`.
unsafe impl Sync for Region {}

impl Region {
    /// Creates the memfd (`2 × len` bytes: frames, then twins), maps the alias, and maps the
    /// window at `base`, failing if anything is mapped there already (`MAP_FIXED_NOREPLACE`):
    /// with no access for `SIGSEGV` faults, read-write and registered with a new
    /// `userfaultfd` for those.
    pub(crate) fn new(base: usize, len: usize, faults: FaultMechanism) -> Result<Region> {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page != PAGE as libc::c_long {
            return Err(Error::Config(format!(
                "the kernel's page size is {page} bytes; the DSM needs {PAGE}"
            )));
        }
        if len == 0 || len % PAGE != 0 || base % PAGE != 0 {
            return Err(Error::Config(format!(
                "a window of {len} bytes at {base:#x}: both must be non-zero page multiples"
            )));
        }
        let total = len
            .checked_mul(2)
            .filter(|t| i64::try_from(*t).is_ok())
            .ok_or_else(|| Error::Config(format!("a window of {len} bytes is too large")))?;
        // SAFETY: a NUL-terminated name and valid flags.
        let raw = unsafe { libc::memfd_create(c"dsm-frames".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(Error::last_os("memfd_create"));
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: a valid descriptor; `total` fits off_t (checked above).
        if unsafe { libc::ftruncate(fd.as_raw_fd(), total as libc::off_t) } != 0 {
            return Err(Error::last_os("ftruncate of the frame memfd"));
        }
        // SAFETY: a new shared mapping of the whole file at an address the kernel chooses.
        let alias = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if alias == libc::MAP_FAILED {
            return Err(Error::last_os("mmap of the runtime alias"));
        }
        let prot = match faults {
            FaultMechanism::Sigsegv => libc::PROT_NONE,
            // Unmapped pages fault whatever the protection says.
            FaultMechanism::Userfaultfd => libc::PROT_READ | libc::PROT_WRITE,
        };
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; the range is the
        // caller's choice and is checked below.
        let window = unsafe {
            libc::mmap(
                base as *mut libc::c_void,
                len,
                prot,
                libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE | libc::MAP_NORESERVE,
                fd.as_raw_fd(),
                0,
            )
        };
        if window == libc::MAP_FAILED || window as usize != base {
            let error = std::io::Error::last_os_error();
            // SAFETY: `alias` is the mapping made above, unused; and `window`, when mapped at
            // another address (a kernel ignoring MAP_FIXED_NOREPLACE), is ours too.
            unsafe {
                libc::munmap(alias, total);
                if window != libc::MAP_FAILED {
                    libc::munmap(window, len);
                }
            }
            return Err(Error::os(
                format!(
                    "mapping the {} MiB window at {base:#x} (every node needs it at the same address; \
                     choose another with --window-base)",
                    len >> 20
                ),
                error,
            ));
        }
        let maps = (faults == FaultMechanism::Sigsegv).then(|| {
            let (limit, used) = map_limit_and_use();
            let budget = limit.saturating_sub(used + MAPS_HEADROOM).max(1);
            Mutex::new(Maps::new(len / PAGE, budget, limit))
        });
        let mut region = Region {
            fd,
            alias: alias.cast(),
            window: window.cast(),
            len,
            userfault: None,
            maps,
        };
        if faults == FaultMechanism::Userfaultfd {
            // Registered before any page of the window was touched: every page faults.
            let userfault = Userfault::open()?;
            userfault.register(base, len)?;
            region.userfault = Some(userfault);
        }
        Ok(region)
    }

    /// The `userfaultfd` that reports the window's faults, if that is the mechanism.
    pub(crate) fn userfault(&self) -> Option<&Userfault> {
        self.userfault.as_ref()
    }

    /// Whether a write to a readable page faults (`SIGSEGV` faults), so that twins can wait
    /// for the first write; with `userfaultfd`, every mapped copy is writable.
    pub(crate) fn detects_writes(&self) -> bool {
        self.userfault.is_none()
    }

    /// With `SIGSEGV` faults, `(mappings now, budget, vm.max_map_count)`; `None` with
    /// `userfaultfd`, which never splits the window.
    pub(crate) fn maps(&self) -> Option<(usize, usize, usize)> {
        let maps = self
            .maps
            .as_ref()?
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        Some((maps.count(), maps.budget, maps.limit))
    }

    /// The window's first address.
    pub(crate) fn base(&self) -> usize {
        self.window as usize
    }

    /// The window's length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The number of pages in the window.
    pub(crate) fn pages(&self) -> usize {
        self.len / PAGE
    }

    /// The frame of page `page` (in the alias), or `None` past the window.
    pub(crate) fn frame(&self, page: usize) -> Option<*mut u8> {
        (page < self.pages()).then(|| self.alias.wrapping_add(page * PAGE))
    }

    /// The twin of page `page` (in the alias), or `None` past the window.
    pub(crate) fn twin(&self, page: usize) -> Option<*mut u8> {
        (page < self.pages()).then(|| self.alias.wrapping_add(self.len + page * PAGE))
    }

    /// The window address of page `page`.
    pub(crate) fn page_addr(&self, page: usize) -> *mut u8 {
        self.window.wrapping_add(page * PAGE)
    }

    fn check_pages(&self, first: usize, count: usize) -> Result<()> {
        if first
            .checked_add(count)
            .is_none_or(|end| end > self.pages())
        {
            return Err(Error::InvalidArgument(format!(
                "pages {first}..+{count} are outside the window"
            )));
        }
        Ok(())
    }

    /// Sets the access of window pages `first..first + count`: `mprotect` with `SIGSEGV`
    /// faults; with `userfaultfd`, [`Access::None`] unmaps them from the window
    /// (`MADV_DONTNEED`, the file keeps their frames) and [`Access::ReadWrite`] maps their
    /// frames (`UFFDIO_CONTINUE`, which also wakes the threads waiting on them; the frames
    /// must exist in the file: fetched, or [`Region::populate`]d).
    pub(crate) fn protect(&self, first: usize, count: usize, access: Access) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        self.check_pages(first, count)?;
        if let Some(userfault) = &self.userfault {
            let (start, len) = (self.page_addr(first) as usize, count * PAGE);
            return match access {
                Access::ReadWrite => userfault.install(start, len),
                Access::None => {
                    // SAFETY: the range lies inside the window mapping this region owns; no
                    // reference into the window exists, and the file keeps the pages.
                    let rc = unsafe {
                        libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED)
                    };
                    if rc != 0 {
                        return Err(Error::last_os(format!(
                            "madvise(MADV_DONTNEED) of window pages {first}..+{count}"
                        )));
                    }
                    Ok(())
                }
                Access::Read => Err(Error::InvalidArgument(
                    "read-only window pages need SIGSEGV faults".into(),
                )),
            };
        }
        // Held across the call, so the count follows the kernel's; every caller holds the
        // node's client lock anyway.
        let mut maps = self
            .maps
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|p| p.into_inner()));
        if let Some(maps) = &maps {
            let needed = maps.count_after(first, count, access);
            if needed > maps.count() && needed > maps.budget {
                return Err(Error::MapLimit {
                    what: format!("setting the access of window pages {first}..+{count}"),
                    needed,
                    allowed: maps.budget,
                    limit: maps.limit,
                });
            }
        }
        // SAFETY: the range lies inside the window mapping this region owns; changing its
        // protection invalidates no reference (none into the window exists).
        let rc =
            unsafe { libc::mprotect(self.page_addr(first).cast(), count * PAGE, access.prot()) };
        if rc != 0 {
            let error = std::io::Error::last_os_error();
            let what = format!("mprotect of window pages {first}..+{count}");
            return Err(match (error.raw_os_error(), &maps) {
                // The kernel refuses a split past vm.max_map_count with ENOMEM.
                (Some(libc::ENOMEM), Some(m)) => Error::MapLimit {
                    what,
                    needed: m.count_after(first, count, access),
                    allowed: m.budget,
                    limit: m.limit,
                },
                _ => Error::os(what, error),
            });
        }
        if let Some(maps) = &mut maps {
            maps.set(first, count, access);
        }
        Ok(())
    }
}

impl Region {
    /// Makes the file hold frames `first..first + count` (`fallocate`; frames it holds
    /// already keep their bytes), so that they can be mapped with `userfaultfd`.
    pub(crate) fn populate(&self, first: usize, count: usize) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        self.check_pages(first, count)?;
        loop {
            // SAFETY: a valid descriptor; the range lies inside the file (its frame half).
            let rc = unsafe {
                libc::fallocate(
                    self.fd.as_raw_fd(),
                    0,
                    (first * PAGE) as libc::off_t,
                    (count * PAGE) as libc::off_t,
                )
            };
            if rc == 0 {
                return Ok(());
            }
            let error = std::io::Error::last_os_error();
            // A signal arrived while shmem allocated: the pages it made are kept; go on.
            if error.kind() != std::io::ErrorKind::Interrupted {
                return Err(Error::os(
                    format!("fallocate of frames {first}..+{count}"),
                    error,
                ));
            }
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: both mappings are this region's, and nothing uses them any more (the node
        // that owns the region has stopped its threads first).
        unsafe {
            libc::munmap(self.window.cast(), self.len);
            libc::munmap(self.alias.cast(), self.len * 2);
        }
    }
}

/// Calls `apply(first, count)` for each run of consecutive page numbers in `pages` (sorted
/// first), so that one `mprotect` covers each run.
pub(crate) fn for_each_run(
    pages: &mut [u32],
    mut apply: impl FnMut(usize, usize) -> Result<()>,
) -> Result<()> {
    pages.sort_unstable();
    let mut i = 0;
    while i < pages.len() {
        let first = pages[i];
        let mut end = i + 1;
        while end < pages.len() && pages[end] == first + (end - i) as u32 {
            end += 1;
        }
        apply(first as usize, end - i)?;
        i = end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits (bounded) for the window's next fault.
    fn next_fault(region: &Region) -> crate::userfault::Fault {
        let userfault = region.userfault().expect("userfaultfd");
        let mut faults = Vec::new();
        for _ in 0..10_000 {
            userfault.read(&mut faults).unwrap();
            if let Some(f) = faults.first() {
                assert_eq!(faults.len(), 1, "{faults:?}");
                return *f;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        panic!("no fault reported within 10 s");
    }

    /// The userfaultfd life of a page, on the kernel of the machine running the test: a read
    /// of a page the file does not hold faults (missing), a page filled through the alias and
    /// mapped is read as filled, a write to it takes no fault and shows in the alias, a
    /// dropped page faults again (minor) and keeps its bytes, and a write to a dropped page is
    /// reported as a write.
    #[test]
    fn userfaultfd_pages_fault_until_mapped_and_again_once_dropped() {
        let base = 0x2100_0000_0000 + (std::process::id() as usize % 1024) * (1 << 24);
        let region = match Region::new(base, 4 * PAGE, FaultMechanism::Userfaultfd) {
            Ok(region) => region,
            // Outside the harness (a container that refuses the system call, a kernel
            // without it) there is nothing to test; inside it, this must run.
            Err(e) if std::env::var_os("RDMA_TEST_REQUIRE_DEVICE").is_none() => {
                eprintln!("userfaultfd is not available here ({e}); not tested");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        assert!(!region.detects_writes());
        let at = |page: usize| region.page_addr(page) as usize;
        let frame = region.frame(1).unwrap() as usize;

        // A reader of page 1 waits in the kernel until the page is mapped.
        let reader = std::thread::spawn(move || {
            // SAFETY: a page of the test's window; the kernel holds the thread until it is
            // mapped, and the test writes it only through the alias before that.
            unsafe { std::ptr::read_volatile((at_page(base, 1) + 8) as *const u64) }
        });
        let fault = next_fault(&region);
        assert_eq!((fault.addr, fault.write), (at(1), false));
        let mut bytes = [0u8; PAGE];
        bytes[8..16].copy_from_slice(&0x1122_3344_5566_7788u64.to_ne_bytes());
        // SAFETY: a whole page of the alias; nothing else writes it.
        unsafe { rdma_verbs::shared::copy_to_shared(&bytes, frame as *mut u8) };
        region.protect(1, 1, Access::ReadWrite).unwrap();
        assert_eq!(reader.join().unwrap(), 0x1122_3344_5566_7788);

        // Mapped: a write takes no fault and lands in the frame.
        // SAFETY: page 1 is mapped read-write.
        unsafe { std::ptr::write_volatile((at(1) + 16) as *mut u64, 7) };
        let mut now = [0u8; PAGE];
        // SAFETY: as above.
        unsafe { rdma_verbs::shared::copy_from_shared(frame as *const u8, &mut now) };
        assert_eq!(now[16], 7);

        // Dropped: the next touch (a write) faults as a write; the frame kept its bytes.
        region.protect(1, 1, Access::None).unwrap();
        let writer = std::thread::spawn(move || {
            // SAFETY: as for the reader.
            unsafe { std::ptr::write_volatile((at_page(base, 1) + 24) as *mut u64, 9) };
        });
        let fault = next_fault(&region);
        assert_eq!((fault.addr, fault.write), (at(1), true));
        region.protect(1, 1, Access::ReadWrite).unwrap();
        writer.join().unwrap();
        // SAFETY: page 1 is mapped.
        let (old, new) = unsafe {
            (
                std::ptr::read_volatile((at(1) + 8) as *const u64),
                std::ptr::read_volatile((at(1) + 24) as *const u64),
            )
        };
        assert_eq!((old, new), (0x1122_3344_5566_7788, 9));
        assert!(region.protect(0, 1, Access::Read).is_err());

        // Mapping a run in which a page is mapped already maps the rest too: a reader of
        // every page of the run then takes no fault (any fault it did take is served, so the
        // test ends, and counted).
        region.populate(0, 4).unwrap();
        region.protect(0, 4, Access::ReadWrite).unwrap();
        let reader = std::thread::spawn(move || {
            (0..4)
                // SAFETY: pages of the test's window, mapped (or served below).
                .map(|p| unsafe { std::ptr::read_volatile(at_page(base, p) as *const u8) })
                .map(usize::from)
                .sum::<usize>()
        });
        let userfault = region.userfault().unwrap();
        let mut unexpected = Vec::new();
        while !reader.is_finished() {
            let mut faults = Vec::new();
            userfault.read(&mut faults).unwrap();
            for f in faults {
                unexpected.push(f.addr);
                region
                    .protect((f.addr - base) / PAGE, 1, Access::ReadWrite)
                    .unwrap();
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // Page 1's first byte is 0 (its words at 8, 16 and 24 were written); the others are
        // untouched zeros.
        assert_eq!(reader.join().unwrap(), 0);
        assert_eq!(unexpected, [0usize; 0], "pages left unmapped");
    }

    fn at_page(base: usize, page: usize) -> usize {
        base + page * PAGE
    }

    #[test]
    fn maps_count_the_runs_of_one_access() {
        let mut maps = Maps::new(10, 4, 65_530);
        assert_eq!(maps.count(), 1);
        assert_eq!(maps.count_after(3, 1, Access::Read), 3);
        maps.set(3, 1, Access::Read);
        assert_eq!(
            maps.count_after(4, 1, Access::Read),
            3,
            "joins its left neighbour"
        );
        assert_eq!(maps.count_after(5, 1, Access::Read), 5, "a run of its own");
        maps.set(5, 1, Access::Read);
        assert_eq!(maps.count(), 5);
        assert_eq!(maps.count_after(4, 1, Access::Read), 3, "closes the gap");
        assert_eq!(maps.count_after(3, 3, Access::None), 1);
        assert_eq!(maps.count_after(0, 10, Access::ReadWrite), 1);
        assert_eq!(
            maps.count_after(9, 1, Access::ReadWrite),
            6,
            "at the window's end"
        );
        assert_eq!(maps.count_after(0, 1, Access::ReadWrite), 6, "at its start");
        maps.set(0, 10, Access::None);
        assert_eq!((maps.count(), maps.boundaries), (1, 0));
    }

    /// The region refuses a protection change past its budget before calling the kernel, and
    /// counts the window's mappings as the kernel sees them (`/proc/self/maps`).
    #[test]
    fn sigsegv_windows_refuse_more_mappings_than_their_budget() {
        let base = 0x2200_0000_0000 + (std::process::id() as usize % 1024) * (1 << 24);
        let region = Region::new(base, 16 * PAGE, FaultMechanism::Sigsegv).unwrap();
        let kernel = || {
            std::fs::read_to_string("/proc/self/maps")
                .unwrap()
                .lines()
                .filter(|l| {
                    let range = l.split_whitespace().next().unwrap();
                    let start = usize::from_str_radix(range.split('-').next().unwrap(), 16);
                    start.is_ok_and(|s| (base..base + 16 * PAGE).contains(&s))
                })
                .count()
        };
        region.protect(2, 1, Access::Read).unwrap();
        region.protect(6, 2, Access::ReadWrite).unwrap();
        let (now, budget, limit) = region.maps().unwrap();
        assert_eq!((now, kernel()), (5, 5));
        assert!(budget > 5 && budget < limit, "{budget} of {limit}");
        region.maps.as_ref().unwrap().lock().unwrap().budget = 6;
        match region.protect(10, 1, Access::Read) {
            Err(Error::MapLimit {
                needed: 7,
                allowed: 6,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(kernel(), 5, "nothing changed");
        // A change that joins runs is always allowed, even at the budget.
        region.protect(3, 3, Access::Read).unwrap();
        assert_eq!((region.maps().unwrap().0, kernel()), (4, 4));
        region.protect(0, 16, Access::None).unwrap();
        assert_eq!((region.maps().unwrap().0, kernel()), (1, 1));
    }

    #[test]
    fn runs_cover_each_page_once() {
        let mut pages = vec![7, 3, 4, 5, 10, 8];
        let mut runs = Vec::new();
        for_each_run(&mut pages, |f, c| {
            runs.push((f, c));
            Ok(())
        })
        .unwrap();
        assert_eq!(runs, [(3, 3), (7, 2), (10, 1)]);
    }
}
