//! Errors: [`Errno`], the [`Error`] enum and the crate's [`Result`] alias.

use std::fmt;
use std::io;

/// An `errno` value returned by a verb.
///
/// Verbs report failure either by returning an errno value or by returning null / -1 and setting
/// `errno`; both end up here.
#[repr(transparent)]
#[derive(Copy, Clone, PartialEq, Eq, Hash)]
pub struct Errno(i32);

impl Errno {
    /// `EPERM`: operation not permitted.
    pub const PERM: Self = Self(libc::EPERM);
    /// `ENOENT`: no such entry.
    pub const NOENT: Self = Self(libc::ENOENT);
    /// `EIO`: input/output error.
    pub const IO: Self = Self(libc::EIO);
    /// `EAGAIN`: try again (nothing ready on a non-blocking descriptor).
    pub const AGAIN: Self = Self(libc::EAGAIN);
    /// `ENOMEM`: out of memory, or a work queue is full.
    pub const NOMEM: Self = Self(libc::ENOMEM);
    /// `EFAULT`: bad address.
    pub const FAULT: Self = Self(libc::EFAULT);
    /// `EBUSY`: the object is in use (for example a CQ still used by a QP).
    pub const BUSY: Self = Self(libc::EBUSY);
    /// `ENODEV`: no such device.
    pub const NODEV: Self = Self(libc::ENODEV);
    /// `EINVAL`: invalid argument.
    pub const INVAL: Self = Self(libc::EINVAL);
    /// `ENOSPC`: no space left.
    pub const NOSPC: Self = Self(libc::ENOSPC);
    /// `ENOSYS`: function not implemented.
    pub const NOSYS: Self = Self(libc::ENOSYS);
    /// `ETIMEDOUT`: timed out.
    pub const TIMEDOUT: Self = Self(libc::ETIMEDOUT);
    /// `EOPNOTSUPP`: the device or provider does not support the operation.
    pub const OPNOTSUPP: Self = Self(libc::EOPNOTSUPP);
    /// `ENETUNREACH`: network unreachable (RoCE: no route to the destination GID).
    pub const NETUNREACH: Self = Self(libc::ENETUNREACH);

    /// Wraps a raw errno value.
    pub const fn from_raw(value: i32) -> Self {
        Self(value)
    }

    /// The raw errno value.
    pub const fn raw(self) -> i32 {
        self.0
    }

    /// The calling thread's current `errno`.
    pub fn last() -> Self {
        Self(io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }

    /// Sets the calling thread's `errno` to 0, before a call that may fail without setting it.
    pub(crate) fn clear() {
        // SAFETY: `__errno_location` returns this thread's `errno`, valid for the thread's life.
        unsafe { *libc::__errno_location() = 0 };
    }

    /// Interprets a verb's return value: 0 is success, anything else the errno (negative values,
    /// as some providers return, are negated). A value that has no positive counterpart
    /// (`i32::MIN`) is kept as it is rather than overflowing: it is a provider's bug, and still
    /// an error.
    pub(crate) fn result(ret: i32) -> Result<(), Self> {
        match ret {
            0 => Ok(()),
            e => Err(Self(e.checked_abs().unwrap_or(e))),
        }
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Errno({}: {})",
            self.0,
            io::Error::from_raw_os_error(self.0)
        )
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // io::Error's Display appends " (os error N)"; say it once, our way.
        let text = io::Error::from_raw_os_error(self.0).to_string();
        let text = text.split(" (os error").next().unwrap_or(&text);
        write!(f, "{} (errno {})", text.to_lowercase(), self.0)
    }
}

impl std::error::Error for Errno {}

impl From<Errno> for io::Error {
    fn from(errno: Errno) -> Self {
        io::Error::from_raw_os_error(errno.0)
    }
}

use crate::c_enum::QpStateKind;

/// Everything that can fail in this crate.
///
/// Variants name the verb that failed and carry its [`Errno`]; conditions callers branch on
/// (`QueueFull`, `Unsupported`, `InvalidArgument`, ...) have variants of their own. A failed work
/// completion is not an `Error`: it is a [`WcStatus`](crate::cq::WcStatus) on the completion.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A verb failed.
    #[error("{verb} failed: {errno}")]
    Verb {
        /// The C function that failed, for example `ibv_reg_mr`.
        verb: &'static str,
        /// Its errno.
        #[source]
        errno: Errno,
    },
    /// Moving a queue pair between states failed (`ibv_modify_qp`).
    #[error("moving the queue pair from {from} to {to} failed: {errno}")]
    ModifyQp {
        /// The state it was in.
        from: QpStateKind,
        /// The state it was asked to enter.
        to: QpStateKind,
        /// The errno of `ibv_modify_qp`.
        #[source]
        errno: Errno,
    },
    /// A work queue is full: the post asked for more work requests than the queue has room for
    /// (`ENOMEM` from a post verb).
    #[error("{verb}: the work queue is full")]
    QueueFull {
        /// The post verb.
        verb: &'static str,
        /// Index in the post list of the first request not posted.
        index: usize,
    },
    /// A post verb refused a work request (`EINVAL` and the like), for example on a queue pair
    /// in the error state.
    #[error("{verb} refused work request {index}: {errno}")]
    Post {
        /// The post verb.
        verb: &'static str,
        /// Index in the post list of the first request not posted.
        index: usize,
        /// The errno.
        #[source]
        errno: Errno,
    },
    /// A post verb failed without saying which work requests it took: `bad_wr` was left null
    /// (rxe does so when its doorbell fails after the requests were written to the queue), or
    /// pointed outside the list. Treat every request of the call as posted: its memory must stay
    /// valid until its completion is polled or the queue pair is reset.
    #[error("{verb} failed without saying which work requests it took: {errno}")]
    PostIndeterminate {
        /// The post verb.
        verb: &'static str,
        /// The errno.
        #[source]
        errno: Errno,
    },
    /// The device or its provider does not support the operation.
    #[error("not supported by the device: {0}")]
    Unsupported(&'static str),
    /// An argument is out of range or inconsistent; nothing was done.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// No device has that name.
    #[error("no RDMA device named {0:?}")]
    NoSuchDevice(String),
    /// A blocking wait ran out of time.
    #[error("timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// The memory region allows remote write or atomic access, or is
    /// [shared](crate::MemoryRegion::into_shared), so a peer or the device may change it at any
    /// time: it is read and written by copying, never through a Rust reference.
    #[error("the memory region is remotely writable or shared: use its copy methods")]
    RemotelyWritable,
    /// A [`PostScope`](crate::scope::PostScope) ended with requests whose completions never came: the
    /// queue pair was moved to the error state to flush them (and to RESET if even that failed),
    /// so the device no longer uses the scope's memory.
    #[error(
        "{pending} work requests were still outstanding when the scope ended; the queue pair was moved to {state}"
    )]
    Incomplete {
        /// Requests outstanding when the scope ended.
        pending: usize,
        /// The state the queue pair was left in (ERR, or RESET).
        state: QpStateKind,
    },
}

impl Error {
    /// The errno behind this error, if it came from a verb.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            Self::Verb { errno, .. }
            | Self::ModifyQp { errno, .. }
            | Self::Post { errno, .. }
            | Self::PostIndeterminate { errno, .. } => Some(*errno),
            Self::QueueFull { .. } => Some(Errno::NOMEM),
            Self::Unsupported(_) => Some(Errno::OPNOTSUPP),
            Self::Timeout(_) => Some(Errno::TIMEDOUT),
            Self::InvalidArgument(_) => Some(Errno::INVAL),
            Self::NoSuchDevice(_) => Some(Errno::NODEV),
            Self::RemotelyWritable | Self::Incomplete { .. } => None,
        }
    }

    /// [`Error::InvalidArgument`] with a fixed message, built out of line: checks on the data
    /// path call it on failure only, so that they inline as a compare and a branch.
    #[cold]
    #[inline(never)]
    pub(crate) fn invalid(what: &'static str) -> Self {
        Self::InvalidArgument(what.into())
    }

    /// An error of `verb` with `errno`, mapping `EOPNOTSUPP`/`ENOSYS` to
    /// [`Unsupported`](Self::Unsupported).
    pub(crate) fn verb(verb: &'static str, errno: Errno) -> Self {
        if errno == Errno::OPNOTSUPP || errno == Errno::NOSYS {
            Self::Unsupported(verb)
        } else {
            Self::Verb { verb, errno }
        }
    }

    /// An error of `verb` with the calling thread's `errno`.
    pub(crate) fn last(verb: &'static str) -> Self {
        Self::verb(verb, Errno::last())
    }

    /// An error of `verb` with the calling thread's `errno`, or with `fallback` where the call
    /// failed without setting it (`errno` was [cleared](Errno::clear) before the call).
    pub(crate) fn last_or(verb: &'static str, fallback: Errno) -> Self {
        let errno = Errno::last();
        Self::verb(verb, if errno.raw() == 0 { fallback } else { errno })
    }

    /// Turns a verb's int return value into a result.
    pub(crate) fn check(verb: &'static str, ret: i32) -> Result<()> {
        Errno::result(ret).map_err(|errno| Self::verb(verb, errno))
    }
}

impl From<Error> for io::Error {
    fn from(error: Error) -> Self {
        match error.errno() {
            Some(errno) => io::Error::new(io::Error::from(errno).kind(), error),
            None => io::Error::other(error),
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_lower_case_without_period() {
        let error = Error::verb("ibv_reg_mr", Errno::INVAL);
        assert_eq!(
            error.to_string(),
            "ibv_reg_mr failed: invalid argument (errno 22)"
        );
        assert_eq!(error.errno(), Some(Errno::INVAL));
        assert!(matches!(
            Error::verb("ibv_alloc_mw", Errno::OPNOTSUPP),
            Error::Unsupported("ibv_alloc_mw")
        ));
    }

    #[test]
    fn negative_return_values_are_errnos() {
        assert_eq!(Errno::result(-22), Err(Errno::INVAL));
        assert_eq!(Errno::result(0), Ok(()));
    }

    #[test]
    fn any_return_value_is_interpreted_without_overflow() {
        // A provider's value, not ours: i32::MIN has no positive counterpart.
        assert_eq!(Errno::result(i32::MIN), Err(Errno::from_raw(i32::MIN)));
        assert_eq!(Errno::result(i32::MAX), Err(Errno::from_raw(i32::MAX)));
        assert_eq!(Errno::result(-i32::MAX), Err(Errno::from_raw(i32::MAX)));
        let error = Error::check("ibv_modify_qp", i32::MIN).unwrap_err();
        assert_eq!(error.errno(), Some(Errno::from_raw(i32::MIN)));
        // Display and Debug of such a value do not panic either.
        assert!(!error.to_string().is_empty());
        assert!(!format!("{error:?}").is_empty());
    }
}
