//! [`NullRegion`]: a memory region with no memory (`ibv_alloc_null_mr`). A scatter entry with
//! its key discards what the device writes there and reads as zeroes: a receive can skip the
//! bytes of a message it does not want, without a buffer for them.

use std::fmt;
use std::ptr::NonNull;

use super::Registration;
use crate::error::{Error, Result};
use crate::ffi;
use crate::pd::ProtectionDomain;

/// A null memory region (`struct ibv_mr` of `ibv_alloc_null_mr`): only a local key, for
/// scatter/gather entries whose bytes the device drops (writes) or makes zero (reads). It has
/// no memory for Rust to reach, so nothing about it can be unsound to share.
///
/// Devices that have none refuse [`ProtectionDomain::alloc_null_mr`] with
/// [`Error::Unsupported`] (Soft-RoCE does; mlx5 has them).
pub struct NullRegion {
    reg: Registration,
    pd: ProtectionDomain,
}

// SAFETY: the handle may be used and deregistered from any thread; no memory behind it.
unsafe impl Send for NullRegion {}
// SAFETY: as above; `&self` only reads the key.
unsafe impl Sync for NullRegion {}

impl ProtectionDomain {
    /// `ibv_alloc_null_mr`: a null memory region in this domain.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] where the provider has none (Soft-RoCE); else [`Error::Verb`]
    /// with the call's errno.
    ///
    /// # References
    ///
    /// [`ibv_alloc_null_mr(3)`](https://man7.org/linux/man-pages/man3/ibv_alloc_null_mr.3.html)
    #[doc(alias = "ibv_alloc_null_mr")]
    pub fn alloc_null_mr(&self) -> Result<NullRegion> {
        // SAFETY: live domain.
        let raw = unsafe { ffi::ibv_alloc_null_mr(self.as_raw()) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_alloc_null_mr"))?;
        Ok(NullRegion {
            reg: Registration::new(raw),
            pd: self.clone(),
        })
    }
}

impl NullRegion {
    /// The local key, for the scatter/gather entries of the `unsafe` posts.
    pub fn lkey(&self) -> u32 {
        self.reg.lkey()
    }

    /// The protection domain it belongs to.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The raw `ibv_mr`, valid while the region lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_mr {
        self.reg.as_ptr()
    }

    /// `ibv_dereg_mr`: what dropping does, with the failure reported. On failure the region
    /// is handed back; dropping it tries again.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with `ibv_dereg_mr`'s errno.
    ///
    /// # References
    ///
    /// [`ibv_dereg_mr(3)`](https://man7.org/linux/man-pages/man3/ibv_reg_mr.3.html)
    #[doc(alias = "ibv_dereg_mr")]
    pub fn close(mut self) -> std::result::Result<(), (Self, Error)> {
        match self.reg.deregister() {
            Ok(()) => Ok(()),
            Err(error) => Err((self, error)),
        }
    }
}

impl Drop for NullRegion {
    fn drop(&mut self) {
        // Drop cannot report a failure and must not panic.
        let _ = self.reg.deregister();
    }
}

impl fmt::Debug for NullRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NullRegion")
            .field("lkey", &self.lkey())
            .finish()
    }
}
