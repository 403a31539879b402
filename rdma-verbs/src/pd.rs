//! Protection domains.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::device::Context;
use crate::error::{Error, Result};
use crate::ffi;

pub(crate) struct PdInner {
    pub(crate) context: Context,
    raw: NonNull<ffi::ibv_pd>,
}

// SAFETY: a protection domain is an immutable kernel handle; verbs on it are thread-safe.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: every object in the domain holds an Arc to it, so none is left; freed once.
        let ret = unsafe { ffi::ibv_dealloc_pd(self.raw.as_ptr()) };
        // Drop cannot report a failure and must not panic (see "Resource cleanup" in the
        // crate documentation).
        let _ = ret;
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
        })))
    }
}

impl ProtectionDomain {
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
