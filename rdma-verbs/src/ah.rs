//! Address handles: the destination of UD datagrams.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::cq::WorkCompletion;
use crate::error::{Error, Result};
use crate::ffi;
use crate::pd::ProtectionDomain;
use crate::qp::AddressVector;

/// An address handle (`struct ibv_ah`): a path to a remote port, for UD sends.
///
/// Keeps its protection domain alive. Cheap to clone (clones are the same handle, destroyed
/// with the last one), so an owned UD send can keep it alive while in flight. `Send` and
/// `Sync`.
#[derive(Clone)]
pub struct AddressHandle {
    inner: Arc<AhInner>,
}

struct AhInner {
    raw: NonNull<ffi::ibv_ah>,
    pd: ProtectionDomain,
}

// SAFETY: an address handle is an immutable kernel/provider object usable from any thread.
unsafe impl Send for AhInner {}
// SAFETY: as above.
unsafe impl Sync for AhInner {}

impl AddressHandle {
    fn new(raw: NonNull<ffi::ibv_ah>, pd: &ProtectionDomain) -> Self {
        Self {
            inner: Arc::new(AhInner {
                raw,
                pd: pd.clone(),
            }),
        }
    }
}

impl ProtectionDomain {
    /// `ibv_create_ah`: an address handle for `av`.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with the errno of `ibv_create_ah` (on RoCE, `EINVAL` or `ENETUNREACH`
    /// without a valid GRH).
    ///
    /// # Examples
    ///
    /// A datagram to a peer known by its GID (RoCE) through the local routable GID:
    ///
    /// ```no_run
    /// # use rdma_verbs::*;
    /// # fn f(pd: &ProtectionDomain, peer_gid: Gid) -> Result<AddressHandle> {
    /// let local = pd.context().routable_gid(1)?;
    /// let av = AddressVector::new(1).grh(peer_gid, local.index as u8);
    /// pd.create_ah(&av)
    /// # }
    /// ```
    ///
    /// # References
    ///
    /// [`ibv_create_ah(3)`](https://man7.org/linux/man-pages/man3/ibv_create_ah.3.html)
    #[doc(alias = "ibv_create_ah")]
    pub fn create_ah(&self, av: &AddressVector) -> Result<AddressHandle> {
        let mut raw_attr = av.to_raw();
        // SAFETY: live PD; valid attributes.
        let raw = unsafe { ffi::ibv_create_ah(self.as_raw(), &mut raw_attr) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_create_ah"))?;
        Ok(AddressHandle::new(raw, self))
    }

    /// `ibv_create_ah_from_wc`: an address handle back to the sender of a UD receive
    /// completion on `port`. `grh` is the first 40 bytes of the receive buffer.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with the errno of `ibv_create_ah_from_wc`.
    ///
    /// # References
    ///
    /// [`ibv_create_ah_from_wc(3)`](https://man7.org/linux/man-pages/man3/ibv_create_ah_from_wc.3.html)
    #[doc(alias = "ibv_create_ah_from_wc")]
    pub fn create_ah_from_wc(
        &self,
        port: u8,
        wc: &WorkCompletion,
        grh: &[u8; 40],
    ) -> Result<AddressHandle> {
        let mut wc_raw = *wc.as_raw();
        // SAFETY: `grh` is 40 readable bytes, the size of `ibv_grh` (plain integers, any bit
        // pattern valid); read unaligned because a byte array has no alignment.
        let mut grh_raw = unsafe { grh.as_ptr().cast::<ffi::ibv_grh>().read_unaligned() };
        // SAFETY: live PD; both structures are local copies the call only reads.
        let raw =
            unsafe { ffi::ibv_create_ah_from_wc(self.as_raw(), &mut wc_raw, &mut grh_raw, port) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_create_ah_from_wc"))?;
        Ok(AddressHandle::new(raw, self))
    }
}

impl AddressHandle {
    /// The protection domain it was created in. A UD queue pair takes only address handles of
    /// its own protection domain: posting a request with another's fails with
    /// [`Error::InvalidArgument`] (the provider would take the handle for one of its own).
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.pd
    }

    /// A reference that keeps the handle alive, for an owned request in flight.
    pub(crate) fn keep_alive(&self) -> Arc<dyn Send + Sync> {
        self.inner.clone()
    }

    /// The raw `ibv_ah`.
    pub fn as_raw(&self) -> *mut ffi::ibv_ah {
        self.inner.raw.as_ptr()
    }
}

impl fmt::Debug for AddressHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // SAFETY: live address handle.
        let handle = unsafe { (*self.as_raw()).handle };
        f.debug_struct("AddressHandle")
            .field("handle", &handle)
            .finish()
    }
}

impl Drop for AhInner {
    fn drop(&mut self) {
        // SAFETY: live address handle, destroyed once, when its last clone goes. Posted UD
        // requests that use it are the caller's responsibility under the post contract, or
        // hold a clone (owned sends).
        let ret = unsafe { ffi::ibv_destroy_ah(self.raw.as_ptr()) };
        // Drop cannot report a failure and must not panic (see "Resource cleanup" in the
        // crate documentation).
        let _ = ret;
    }
}
