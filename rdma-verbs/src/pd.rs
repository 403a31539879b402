//! Protection domains.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::device::Context;
use crate::error::{Errno, Error, Result};
use crate::ffi;
use crate::td::ThreadDomain;

pub(crate) struct PdInner {
    pub(crate) context: Context,
    raw: NonNull<ffi::ibv_pd>,
    /// Set once `ibv_dealloc_pd` (or `ibv_unimport_pd`) succeeded.
    freed: bool,
    /// Imported with `ibv_import_pd`: let go with `ibv_unimport_pd`, never deallocated here.
    imported: bool,
    /// For a parent domain: the protection domain and thread domain it was made of, kept
    /// until it is freed.
    _parent: Option<(ProtectionDomain, Option<ThreadDomain>)>,
}

// SAFETY: a protection domain is an immutable kernel handle; verbs on it are thread-safe.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl PdInner {
    /// `ibv_dealloc_pd`, once.
    fn dealloc(&mut self) -> Result<()> {
        if self.freed {
            return Ok(());
        }
        if self.imported {
            // SAFETY: a live imported PD (not yet let go); every object made in it holds an Arc
            // to it, so none is left. The call reports no failure (mlx5 asserts on one it
            // meets, and otherwise leaves the domain to the context's close).
            unsafe { ffi::ibv_unimport_pd(self.raw.as_ptr()) };
            self.freed = true;
            return Ok(());
        }
        // SAFETY: live PD (not yet freed); every object in the domain holds an Arc to it, so
        // none is left.
        let ret = unsafe { ffi::ibv_dealloc_pd(self.raw.as_ptr()) };
        Errno::result(ret).map_err(|errno| Error::verb("ibv_dealloc_pd", errno))?;
        self.freed = true;
        Ok(())
    }
}

impl Drop for PdInner {
    fn drop(&mut self) {
        // Drop cannot report a failure and must not panic (see "Resource cleanup" in the crate
        // documentation); the kernel frees the domain with its context.
        let _ = self.dealloc();
    }
}

/// A protection domain (`struct ibv_pd`): the scope in which memory regions, queue pairs,
/// address handles and memory windows may be used together.
///
/// Cloning is cheap; the domain is freed when the last clone and the last object in it are
/// gone. It keeps its [`Context`] open. `Send` and `Sync`.
#[derive(Clone)]
pub struct ProtectionDomain(pub(crate) Arc<PdInner>);

impl fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("handle", &self.handle())
            .finish()
    }
}

impl Context {
    /// `ibv_alloc_pd`: allocates a protection domain.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with the errno of `ibv_alloc_pd` (`ENOMEM` when out of resources).
    ///
    /// # References
    ///
    /// [`ibv_alloc_pd(3)`](https://man7.org/linux/man-pages/man3/ibv_alloc_pd.3.html)
    #[doc(alias = "ibv_alloc_pd")]
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        // SAFETY: live context.
        let raw = unsafe { ffi::ibv_alloc_pd(self.as_raw()) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_alloc_pd"))?;
        Ok(ProtectionDomain(Arc::new(PdInner {
            context: self.clone(),
            raw,
            freed: false,
            imported: false,
            _parent: None,
        })))
    }

    /// `ibv_import_pd`: the protection domain whose kernel handle is `handle`
    /// ([`ProtectionDomain::handle`] in the process that made it), on a context imported
    /// from that process's ([`Context::import`]). Dropping the import lets it go
    /// (`ibv_unimport_pd`) and leaves the domain to its maker.
    ///
    /// # Safety
    ///
    /// The domain stays allocated by its maker while the import and everything made in it
    /// live: its maker may not deallocate it before. (The kernel does not tie the two: a
    /// domain freed under an import would leave this process's objects naming a handle the
    /// kernel may give to another domain.)
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] where the provider cannot import (Soft-RoCE; mlx5 can); else
    /// [`Error::Verb`] with the call's errno (the kernel's, for a handle that names no
    /// domain).
    ///
    /// # References
    ///
    /// [`ibv_import_pd(3)`](https://man7.org/linux/man-pages/man3/ibv_import_pd.3.html)
    #[doc(alias = "ibv_import_pd")]
    pub unsafe fn import_pd(&self, handle: u32) -> Result<ProtectionDomain> {
        // SAFETY: live context; the handle is only looked up by the kernel.
        let raw = unsafe { ffi::ibv_import_pd(self.as_raw(), handle) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_import_pd"))?;
        Ok(ProtectionDomain(Arc::new(PdInner {
            context: self.clone(),
            raw,
            freed: false,
            imported: true,
            _parent: None,
        })))
    }
}

impl ProtectionDomain {
    /// `ibv_dealloc_pd`: what dropping the last handle does, with the failure reported. On
    /// failure the domain is handed back, still usable; dropping it tries again. (An imported
    /// domain is let go with `ibv_unimport_pd` instead, which reports no failure.)
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with `ibv_dealloc_pd` and `EBUSY`, without calling it, while another
    /// handle or an object of the domain (region, queue pair, SRQ, address handle, window,
    /// buffer pool, or a `Buf` of one) still holds it; else the verb's error
    /// ([`Error::Verb`] with its errno, or [`Error::Unsupported`]).
    ///
    /// # References
    ///
    /// [`ibv_dealloc_pd(3)`](https://man7.org/linux/man-pages/man3/ibv_alloc_pd.3.html)
    #[doc(alias = "ibv_dealloc_pd")]
    pub fn close(mut self) -> std::result::Result<(), (Self, Error)> {
        let result = match Arc::get_mut(&mut self.0) {
            Some(inner) => inner.dealloc(),
            None => Err(Error::verb("ibv_dealloc_pd", Errno::BUSY)),
        };
        result.map_err(|error| (self, error))
    }

    /// `ibv_alloc_parent_domain`: a parent domain of this protection domain, with thread
    /// domain `td` where given. It is a protection domain itself: the queue pairs and SRQs
    /// created in it use the thread domain's single-thread resources, without the provider's
    /// locks (perftest's `--no_lock`). It keeps `self` and `td` alive.
    ///
    /// Create the objects its queue pairs use (regions, address handles, windows) in the
    /// parent domain too: this crate matches protection domains by identity, so it refuses a
    /// base domain's object on a parent domain's queue pair, though the device would take it.
    ///
    /// # Safety
    ///
    /// With a thread domain, the objects made in the returned domain share unlocked provider
    /// state: on mlx5 every queue pair of the thread domain rings one doorbell register, and
    /// its SRQs have no lock, though the completion queues' pollers and queue-pair teardown
    /// still touch them. The caller ensures that one thread at a time uses all of them
    /// together: posts to any queue pair or SRQ of the domain, polls of the completion queues
    /// they complete into, and their destruction happen on one thread (or under one lock of
    /// the caller's). `&mut` on each object is not enough: it orders uses of that object, not
    /// of its siblings. Without a thread domain there is nothing to promise.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`] when `td` belongs to another device context.
    /// - [`Error::Unsupported`] where the provider has no parent domains (Soft-RoCE); else
    ///   [`Error::Verb`] with the call's errno.
    ///
    /// # References
    ///
    /// [`ibv_alloc_parent_domain(3)`](https://man7.org/linux/man-pages/man3/ibv_alloc_parent_domain.3.html)
    #[doc(alias = "ibv_alloc_parent_domain")]
    pub unsafe fn parent_domain(&self, td: Option<&ThreadDomain>) -> Result<ProtectionDomain> {
        if let Some(td) = td {
            if td.context().as_raw() != self.context().as_raw() {
                return Err(Error::InvalidArgument(
                    "ibv_alloc_parent_domain: the thread domain belongs to another device context"
                        .into(),
                ));
            }
        }
        let mut attr = ffi::ibv_parent_domain_init_attr {
            pd: self.as_raw(),
            td: td.map_or(std::ptr::null_mut(), ThreadDomain::as_raw),
            ..Default::default()
        };
        // SAFETY: live context, protection domain and thread domain (all of one context,
        // checked above); no allocator callbacks (comp_mask 0). The thread domain's promise is
        // the caller's (the contract).
        let raw = unsafe { ffi::ibv_alloc_parent_domain(self.context().as_raw(), &mut attr) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_alloc_parent_domain"))?;
        Ok(ProtectionDomain(Arc::new(PdInner {
            context: self.context().clone(),
            raw,
            freed: false,
            imported: false,
            _parent: Some((self.clone(), td.cloned())),
        })))
    }

    /// The context the domain belongs to.
    pub fn context(&self) -> &Context {
        &self.0.context
    }

    /// The raw `ibv_pd`, valid while this domain (or a clone) is alive.
    pub fn as_raw(&self) -> *mut ffi::ibv_pd {
        self.0.raw.as_ptr()
    }

    /// The kernel's handle of the domain.
    pub fn handle(&self) -> u32 {
        // SAFETY: live PD.
        unsafe { (*self.as_raw()).handle }
    }
}
