//! The `userfaultfd` fault mechanism (docs/dsm.md, "The fault path", and
//! [userfaultfd(2)](https://man7.org/linux/man-pages/man2/userfaultfd.2.html)): the kernel
//! holds a thread that touches a window page with no page-table entry and reports the fault
//! on a descriptor the fault thread reads; no signal handler runs.
//!
//! The window is a shared mapping of the frames' `memfd`, registered in *minor* mode (Linux
//! 5.14, `UFFD_FEATURE_MINOR_SHMEM`): a page the file holds but the window has not mapped
//! faults to us, and `UFFDIO_CONTINUE` maps the file's page (filled through the alias
//! beforehand) and wakes the waiting threads. *Missing* mode is registered too, so a touch of
//! a page the file does not hold yet (never allocated, never fetched) is reported rather than
//! filled with zeros. A page is dropped again with `madvise(MADV_DONTNEED)`, which unmaps it
//! from the window and leaves the file's page in place.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::error::{Error, Result};

// From <linux/userfaultfd.h> (the uapi is stable). The numbers are the ioctl encodings of the
// generic `_IOC` layout (x86, arm, arm64, riscv, loongarch, s390); powerpc, mips and sparc
// encode `_IOR` differently, and there `open` refuses (see `SUPPORTED`).
const UFFD_API: u64 = 0xaa;
const UFFD_USER_MODE_ONLY: libc::c_int = 1;
const UFFD_FEATURE_MINOR_SHMEM: u64 = 1 << 10;
const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;
const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00;
const UFFDIO_WAKE: libc::c_ulong = 0x8010_aa02;
const UFFDIO_CONTINUE: libc::c_ulong = 0xc020_aa07;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1 << 0;
const UFFDIO_REGISTER_MODE_MINOR: u64 = 1 << 2;
/// Bit of `_UFFDIO_CONTINUE` in the ioctl set `UFFDIO_REGISTER` returns.
const CONTINUE_IOCTL_BIT: u64 = 1 << 7;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const UFFD_PAGEFAULT_FLAG_WRITE: u64 = 1 << 0;
#[cfg(test)]
const UFFD_PAGEFAULT_FLAG_MINOR: u64 = 1 << 2;
/// Whether this architecture uses the generic ioctl encoding the numbers above are in.
const SUPPORTED: bool = cfg!(any(
    target_arch = "x86_64",
    target_arch = "x86",
    target_arch = "aarch64",
    target_arch = "arm",
    target_arch = "riscv64",
    target_arch = "loongarch64",
    target_arch = "s390x"
));
/// `sizeof(struct uffd_msg)`.
const MSG_LEN: usize = 32;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioContinue {
    range: UffdioRange,
    mode: u64,
    mapped: i64,
}

/// A fault the kernel reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fault {
    /// The faulting address, rounded down to its page.
    pub(crate) addr: usize,
    /// Whether the access was a write.
    pub(crate) write: bool,
}

/// A userfaultfd descriptor set up for minor faults on shared memory.
#[derive(Debug)]
pub(crate) struct Userfault {
    fd: OwnedFd,
}

impl Userfault {
    /// Opens the descriptor (non-blocking) and negotiates the API. Without the privilege to
    /// serve faults the kernel itself takes (`vm.unprivileged_userfaultfd = 0` and no
    /// `CAP_SYS_PTRACE`), it falls back to faults from user mode only: a system call handed a
    /// window address that is not mapped then fails with `EFAULT`, as with `SIGSEGV`.
    pub(crate) fn open() -> Result<Userfault> {
        if !SUPPORTED {
            return Err(Error::Config(
                "userfaultfd faults are not built for this architecture; use --faults sigsegv"
                    .into(),
            ));
        }
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        // SAFETY: userfaultfd takes flags only.
        let mut raw = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
        if raw < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM) {
            // SAFETY: as above.
            raw = unsafe { libc::syscall(libc::SYS_userfaultfd, flags | UFFD_USER_MODE_ONLY) };
        }
        if raw < 0 {
            let error = std::io::Error::last_os_error();
            return Err(Error::os(
                "userfaultfd (not permitted or not built into this kernel; use --faults sigsegv)",
                error,
            ));
        }
        // SAFETY: a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw as libc::c_int) };
        let mut api = UffdioApi {
            api: UFFD_API,
            features: UFFD_FEATURE_MINOR_SHMEM,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API with a valid uffdio_api the kernel reads and writes.
        if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API, &mut api) } != 0 {
            let error = std::io::Error::last_os_error();
            return Err(Error::os(
                "UFFDIO_API: this kernel's userfaultfd has no minor faults on shared memory \
                 (Linux 5.14 or later); use --faults sigsegv",
                error,
            ));
        }
        Ok(Userfault { fd })
    }

    /// Registers `start..start + len` (a shared mapping of a memfd) for missing and minor
    /// faults.
    pub(crate) fn register(&self, start: usize, len: usize) -> Result<()> {
        let mut register = UffdioRegister {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode: UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_MINOR,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER with a valid uffdio_register; the range is a mapping the
        // caller owns.
        if unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_REGISTER, &mut register) } != 0 {
            return Err(Error::last_os("UFFDIO_REGISTER of the window"));
        }
        if register.ioctls & CONTINUE_IOCTL_BIT == 0 {
            return Err(Error::Config(
                "userfaultfd offers no UFFDIO_CONTINUE on the window; use --faults sigsegv".into(),
            ));
        }
        Ok(())
    }

    /// Maps the file's pages into `start..start + len` (whole pages) of the registered window
    /// and wakes the threads waiting there (`UFFDIO_CONTINUE`). Pages already mapped are left
    /// as they are.
    pub(crate) fn install(&self, start: usize, len: usize) -> Result<()> {
        let (mut at, end) = (start, start + len);
        while at < end {
            let mut request = UffdioContinue {
                range: UffdioRange {
                    start: at as u64,
                    len: (end - at) as u64,
                },
                mode: 0,
                mapped: 0,
            };
            // SAFETY: UFFDIO_CONTINUE with a valid uffdio_continue inside the registered
            // window; it maps pages of the file and writes `mapped`.
            let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_CONTINUE, &mut request) };
            if rc == 0 {
                return Ok(());
            }
            let error = std::io::Error::last_os_error();
            // Bytes mapped before the error (the kernel writes the error there if none).
            let done = usize::try_from(request.mapped).unwrap_or(0);
            match error.raw_os_error() {
                // The mappings changed under the call: go on after what it mapped.
                Some(libc::EAGAIN) => at += done,
                // The next page is mapped already (another fault on it got there first): let
                // its waiters go, and go on after it.
                Some(libc::EEXIST) => {
                    at += done;
                    self.wake(at, crate::region::PAGE)?;
                    at += crate::region::PAGE;
                }
                _ => {
                    return Err(Error::os(
                        format!("UFFDIO_CONTINUE of {:#x}..+{:#x}", at, end - at),
                        error,
                    ));
                }
            }
        }
        Ok(())
    }

    /// Wakes the threads waiting on faults in `start..start + len` (`UFFDIO_WAKE`).
    pub(crate) fn wake(&self, start: usize, len: usize) -> Result<()> {
        let range = UffdioRange {
            start: start as u64,
            len: len as u64,
        };
        // SAFETY: UFFDIO_WAKE reads a valid uffdio_range.
        if unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_WAKE, &range) } != 0 {
            return Err(Error::last_os("UFFDIO_WAKE"));
        }
        Ok(())
    }

    /// Appends the page faults reported now (none if there are none; it does not block).
    pub(crate) fn read(&self, out: &mut Vec<Fault>) -> Result<()> {
        let mut buf = [0u8; 16 * MSG_LEN];
        loop {
            // SAFETY: reads at most `buf.len()` bytes into `buf`.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                let error = std::io::Error::last_os_error();
                return match error.raw_os_error() {
                    Some(libc::EAGAIN) => Ok(()),
                    Some(libc::EINTR) => continue,
                    _ => Err(Error::os("reading the userfaultfd", error)),
                };
            }
            let n = n as usize;
            for msg in buf[..n].chunks_exact(MSG_LEN) {
                if let Some(fault) = parse(msg) {
                    out.push(fault);
                }
            }
            if n < buf.len() {
                return Ok(());
            }
        }
    }
}

impl AsRawFd for Userfault {
    fn as_raw_fd(&self) -> libc::c_int {
        self.fd.as_raw_fd()
    }
}

/// A page fault from one `struct uffd_msg` (other events are not enabled, so not expected;
/// they are skipped).
fn parse(msg: &[u8]) -> Option<Fault> {
    let word = |at: usize| -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&msg[at..at + 8]);
        u64::from_ne_bytes(b)
    };
    if msg.len() != MSG_LEN || msg[0] != UFFD_EVENT_PAGEFAULT {
        return None;
    }
    let flags = word(8);
    let addr = usize::try_from(word(16)).ok()? & !(crate::region::PAGE - 1);
    Some(Fault {
        addr,
        write: flags & UFFD_PAGEFAULT_FLAG_WRITE != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_parse() {
        let mut msg = [0u8; MSG_LEN];
        msg[0] = UFFD_EVENT_PAGEFAULT;
        msg[8..16].copy_from_slice(
            &(UFFD_PAGEFAULT_FLAG_WRITE | UFFD_PAGEFAULT_FLAG_MINOR).to_ne_bytes(),
        );
        msg[16..24].copy_from_slice(&0x2000_0000_1234u64.to_ne_bytes());
        assert_eq!(
            parse(&msg),
            Some(Fault {
                addr: 0x2000_0000_1000,
                write: true,
            })
        );
        msg[8..16].copy_from_slice(&0u64.to_ne_bytes());
        assert_eq!(
            parse(&msg),
            Some(Fault {
                addr: 0x2000_0000_1000,
                write: false,
            })
        );
        msg[0] = 0x13; // UFFD_EVENT_FORK
        assert_eq!(parse(&msg), None);
        assert_eq!(parse(&msg[..16]), None);
    }
}
