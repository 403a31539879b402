//! XRC domains (`struct ibv_xrcd`): the scope in which eXtended Reliable Connected queue pairs
//! and the SRQs they deliver to are shared, within one process or, through a file, between
//! processes.
//!
//! Soft-RoCE has no XRC: its provider refuses [`Context::open_xrcd`] with
//! [`Error::Unsupported`] (`EOPNOTSUPP`). mlx5 devices have it.

use std::fmt;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::device::Context;
use crate::error::{Errno, Error, Result};
use crate::ffi;

/// Which XRC domain [`Context::open_xrcd`] opens: the `fd` and `oflags` of
/// `ibv_xrcd_init_attr`.
#[derive(Copy, Clone, Debug)]
#[non_exhaustive]
pub enum XrcdFile<'fd> {
    /// A new domain of this process only (`fd` -1, `O_CREAT`).
    Private,
    /// The domain already associated with the file (an inode: every process that opens the
    /// same file shares the domain); refused when there is none.
    Existing(BorrowedFd<'fd>),
    /// The file's domain, created and associated with it if it has none (`O_CREAT`).
    OpenOrCreate(BorrowedFd<'fd>),
    /// A new domain for the file, refused when it already has one (`O_CREAT | O_EXCL`).
    New(BorrowedFd<'fd>),
}

impl XrcdFile<'_> {
    /// The `fd` and `oflags` of `ibv_xrcd_init_attr`.
    fn raw(self) -> (i32, i32) {
        match self {
            Self::Private => (-1, libc::O_CREAT),
            Self::Existing(fd) => (fd.as_raw_fd(), 0),
            Self::OpenOrCreate(fd) => (fd.as_raw_fd(), libc::O_CREAT),
            Self::New(fd) => (fd.as_raw_fd(), libc::O_CREAT | libc::O_EXCL),
        }
    }
}

pub(crate) struct XrcdInner {
    context: Context,
    raw: NonNull<ffi::ibv_xrcd>,
    /// Set once `ibv_close_xrcd` succeeded.
    closed: bool,
}

// SAFETY: an XRC domain is a kernel handle; opening and closing are thread-safe verbs, and this
// crate reads nothing through it.
unsafe impl Send for XrcdInner {}
// SAFETY: as above; `&XrcdInner` gives only the raw pointer.
unsafe impl Sync for XrcdInner {}

impl XrcdInner {
    /// `ibv_close_xrcd`, once.
    fn close(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        // SAFETY: a live domain (not yet closed); every object made with it holds an Arc to
        // it, so none is left.
        let ret = unsafe { ffi::ibv_close_xrcd(self.raw.as_ptr()) };
        Errno::result(ret).map_err(|errno| Error::verb("ibv_close_xrcd", errno))?;
        self.closed = true;
        Ok(())
    }
}

impl Drop for XrcdInner {
    fn drop(&mut self) {
        // Drop cannot report a failure and must not panic; the kernel closes the domain with
        // its context.
        let _ = self.close();
    }
}

/// An XRC domain (`struct ibv_xrcd`), opened by [`Context::open_xrcd`].
///
/// Cloning is cheap; the domain is closed when the last clone is gone. It keeps its
/// [`Context`] open. `Send` and `Sync`.
#[derive(Clone)]
pub struct XrcDomain(pub(crate) Arc<XrcdInner>);

impl fmt::Debug for XrcDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XrcDomain")
            .field("raw", &self.0.raw)
            .finish()
    }
}

impl Context {
    /// `ibv_open_xrcd`: opens an XRC domain, private or shared through a file.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] where the provider has no XRC (Soft-RoCE); else
    /// [`Error::Verb`] with the call's errno, among them the kernel's refusals of
    /// [`XrcdFile::Existing`] on a file with no domain and of [`XrcdFile::New`] on one that has
    /// one.
    ///
    /// # References
    ///
    /// [`ibv_open_xrcd(3)`](https://man7.org/linux/man-pages/man3/ibv_open_xrcd.3.html)
    #[doc(alias = "ibv_open_xrcd")]
    pub fn open_xrcd(&self, file: XrcdFile<'_>) -> Result<XrcDomain> {
        let (fd, oflags) = file.raw();
        let mut attr = ffi::ibv_xrcd_init_attr {
            comp_mask: ffi::IBV_XRCD_INIT_ATTR_FD | ffi::IBV_XRCD_INIT_ATTR_OFLAGS,
            fd,
            oflags,
        };
        // SAFETY: live context; `attr` is a valid structure the call reads; a file descriptor
        // it names is open for the call (borrowed), and the kernel takes what it keeps.
        let raw = unsafe { ffi::ibv_open_xrcd(self.as_raw(), &mut attr) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_open_xrcd"))?;
        Ok(XrcDomain(Arc::new(XrcdInner {
            context: self.clone(),
            raw,
            closed: false,
        })))
    }
}

impl XrcDomain {
    /// `ibv_close_xrcd`: what dropping the last handle does, with the failure reported. On
    /// failure the domain is handed back; dropping it tries again.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with `ibv_close_xrcd` and `EBUSY`, without calling it, while another
    /// handle still holds it; else the verb's error.
    ///
    /// # References
    ///
    /// [`ibv_close_xrcd(3)`](https://man7.org/linux/man-pages/man3/ibv_open_xrcd.3.html)
    #[doc(alias = "ibv_close_xrcd")]
    pub fn close(mut self) -> std::result::Result<(), (Self, Error)> {
        let result = match Arc::get_mut(&mut self.0) {
            Some(inner) => inner.close(),
            None => Err(Error::verb("ibv_close_xrcd", Errno::BUSY)),
        };
        result.map_err(|error| (self, error))
    }

    /// The context the domain belongs to.
    pub fn context(&self) -> &Context {
        &self.0.context
    }

    /// The raw `ibv_xrcd`, valid while a handle lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_xrcd {
        self.0.raw.as_ptr()
    }
}
