//! The shared window and its backing memory (docs/dsm.md, "Memory layout").
//!
//! One `memfd` holds a frame for every page of the window followed by a twin for every page.
//! The runtime maps all of it read-write at an address of the kernel's choosing (the *alias*):
//! fetched pages are written there, diffs computed there, and the RDMA transports register it.
//! The application's *window* maps the frames again at a fixed address, the same on every
//! node, and `mprotect` gives each of its pages `PROT_NONE`, read or read-write. A page is
//! installed by filling its frame through the alias while the window page is still
//! inaccessible, and only then opening it: no thread sees a half-written page or writes into
//! one without faulting. The file is sparse, so untouched pages cost no memory.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::error::{Error, Result};

/// The page size the DSM works in (the kernel's must be the same).
pub const PAGE: usize = 4096;

/// A window page's access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// No access: the next touch faults.
    None,
    /// Reads only: the next write faults.
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
    _fd: OwnedFd,
    alias: *mut u8,
    window: *mut u8,
    len: usize,
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
    /// window at `base` with no access, failing if anything is mapped there already
    /// (`MAP_FIXED_NOREPLACE`).
    pub(crate) fn new(base: usize, len: usize) -> Result<Region> {
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
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; the range is the
        // caller's choice and is checked below.
        let window = unsafe {
            libc::mmap(
                base as *mut libc::c_void,
                len,
                libc::PROT_NONE,
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
        Ok(Region {
            _fd: fd,
            alias: alias.cast(),
            window: window.cast(),
            len,
        })
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

    /// Sets the access of window pages `first..first + count` (`mprotect`).
    pub(crate) fn protect(&self, first: usize, count: usize, access: Access) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        if first
            .checked_add(count)
            .is_none_or(|end| end > self.pages())
        {
            return Err(Error::InvalidArgument(format!(
                "pages {first}..+{count} are outside the window"
            )));
        }
        // SAFETY: the range lies inside the window mapping this region owns; changing its
        // protection invalidates no reference (none into the window exists).
        let rc =
            unsafe { libc::mprotect(self.page_addr(first).cast(), count * PAGE, access.prot()) };
        if rc != 0 {
            return Err(Error::last_os(format!(
                "mprotect of window pages {first}..+{count}"
            )));
        }
        Ok(())
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
