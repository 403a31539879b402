//! Thread domains: a promise that one thread at a time uses the objects made with them, which
//! lets a provider drop its locks (perftest's `--no_lock`). A thread domain takes effect
//! through a parent domain (the `unsafe`
//! [`ProtectionDomain::parent_domain`](crate::ProtectionDomain::parent_domain), whose caller
//! makes the promise).

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::device::Context;
use crate::error::{Errno, Error, Result};
use crate::ffi;

pub(crate) struct TdInner {
    context: Context,
    raw: NonNull<ffi::ibv_td>,
    /// Set once `ibv_dealloc_td` succeeded.
    freed: bool,
}

// SAFETY: a thread domain is a provider handle; allocating and freeing it are thread-safe
// verbs, and this crate reads nothing through it. The single-thread promise it stands for
// is about the objects made in a parent domain with it: `parent_domain`'s caller makes it.
unsafe impl Send for TdInner {}
// SAFETY: as above; `&TdInner` gives only the raw pointer.
unsafe impl Sync for TdInner {}

impl TdInner {
    /// `ibv_dealloc_td`, once.
    fn dealloc(&mut self) -> Result<()> {
        if self.freed {
            return Ok(());
        }
        // SAFETY: live thread domain (not yet freed); every parent domain made with it holds
        // an Arc to it, so none is left.
        let ret = unsafe { ffi::ibv_dealloc_td(self.raw.as_ptr()) };
        Error::check("ibv_dealloc_td", ret)?;
        self.freed = true;
        Ok(())
    }
}

impl Drop for TdInner {
    fn drop(&mut self) {
        // Drop cannot report a failure and must not panic; the kernel frees the domain with
        // its context.
        let _ = self.dealloc();
    }
}

/// A thread domain (`struct ibv_td`).
///
/// Cloning is cheap; the domain is freed when the last clone and the last parent domain made
/// with it are gone. It keeps its [`Context`] open.
///
/// Devices that have none refuse [`Context::alloc_td`] with [`Error::Unsupported`]
/// (Soft-RoCE does; mlx5 has them).
#[derive(Clone)]
pub struct ThreadDomain(pub(crate) Arc<TdInner>);

impl fmt::Debug for ThreadDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThreadDomain")
            .field("raw", &self.0.raw)
            .finish()
    }
}

impl Context {
    /// `ibv_alloc_td`: allocates a thread domain.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] where the provider has no thread domains (Soft-RoCE); else
    /// [`Error::Verb`] with the call's errno (`ENOMEM`).
    ///
    /// # References
    ///
    /// [`ibv_alloc_td(3)`](https://man7.org/linux/man-pages/man3/ibv_alloc_td.3.html)
    #[doc(alias = "ibv_alloc_td")]
    pub fn alloc_td(&self) -> Result<ThreadDomain> {
        let mut attr = ffi::ibv_td_init_attr { comp_mask: 0 };
        // SAFETY: live context; `attr` is a valid structure the call reads.
        let raw = unsafe { ffi::ibv_alloc_td(self.as_raw(), &mut attr) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_alloc_td"))?;
        Ok(ThreadDomain(Arc::new(TdInner {
            context: self.clone(),
            raw,
            freed: false,
        })))
    }
}

impl ThreadDomain {
    /// `ibv_dealloc_td`: what dropping the last handle does, with the failure reported. On
    /// failure the domain is handed back; dropping it tries again.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with `ibv_dealloc_td` and `EBUSY`, without calling it, while another
    /// handle or a parent domain made with it still holds it; else the verb's error.
    ///
    /// # References
    ///
    /// [`ibv_dealloc_td(3)`](https://man7.org/linux/man-pages/man3/ibv_alloc_td.3.html)
    #[doc(alias = "ibv_dealloc_td")]
    pub fn close(mut self) -> std::result::Result<(), (Self, Error)> {
        let result = match Arc::get_mut(&mut self.0) {
            Some(inner) => inner.dealloc(),
            None => Err(Error::verb("ibv_dealloc_td", Errno::BUSY)),
        };
        result.map_err(|error| (self, error))
    }

    /// The context the domain belongs to.
    pub fn context(&self) -> &Context {
        &self.0.context
    }

    /// The raw `ibv_td`, valid while this domain (or a clone) is alive.
    pub fn as_raw(&self) -> *mut ffi::ibv_td {
        self.0.raw.as_ptr()
    }
}
