//! Address handles: the destination of UD datagrams.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::cq::WorkCompletion;
use crate::device::Gid;
use crate::error::{Errno, Error, Result};
use crate::ffi;
use crate::pd::ProtectionDomain;

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
    /// Set once `ibv_destroy_ah` succeeded.
    destroyed: bool,
}

// SAFETY: an address handle is an immutable kernel/provider object usable from any thread.
unsafe impl Send for AhInner {}
// SAFETY: as above.
unsafe impl Sync for AhInner {}

impl AddressHandle {
    /// `ibv_destroy_ah`: what dropping the last clone does, with the failure reported. On
    /// failure the handle is handed back; dropping it tries again.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with `ibv_destroy_ah` and `EBUSY`, without calling it, while another
    /// clone (an owned UD send in flight holds one) still exists; else the verb's error
    /// ([`Error::Verb`] with its errno, or [`Error::Unsupported`]).
    ///
    /// # References
    ///
    /// [`ibv_destroy_ah(3)`](https://man7.org/linux/man-pages/man3/ibv_create_ah.3.html)
    #[doc(alias = "ibv_destroy_ah")]
    pub fn close(mut self) -> std::result::Result<(), (Self, Error)> {
        let result = match Arc::get_mut(&mut self.inner) {
            Some(inner) => inner.destroy(),
            None => Err(Error::verb("ibv_destroy_ah", Errno::BUSY)),
        };
        result.map_err(|error| (self, error))
    }

    fn new(raw: NonNull<ffi::ibv_ah>, pd: &ProtectionDomain) -> Self {
        Self {
            inner: Arc::new(AhInner {
                raw,
                pd: pd.clone(),
                destroyed: false,
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

impl AhInner {
    /// `ibv_destroy_ah`, once.
    fn destroy(&mut self) -> Result<()> {
        if self.destroyed {
            return Ok(());
        }
        // SAFETY: live address handle (not yet destroyed), destroyed once, when its last clone
        // goes. Posted UD requests that use it are the caller's responsibility under the post
        // contract, or hold a clone (owned sends).
        let ret = unsafe { ffi::ibv_destroy_ah(self.raw.as_ptr()) };
        Errno::result(ret).map_err(|errno| Error::verb("ibv_destroy_ah", errno))?;
        self.destroyed = true;
        Ok(())
    }
}

impl Drop for AhInner {
    fn drop(&mut self) {
        // Drop cannot report a failure and must not panic (see "Resource cleanup" in the crate
        // documentation).
        let _ = self.destroy();
    }
}

/// Addressing of the remote port (`struct ibv_ah_attr`): for RC and UC the path in
/// [`RcRtrAttr`](crate::RcRtrAttr)/[`UcRtrAttr`](crate::UcRtrAttr), for UD an
/// [`AddressHandle`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[must_use = "attributes do nothing until a transition uses them"]
#[non_exhaustive]
pub struct AddressVector {
    /// Destination LID (InfiniBand; 0 on RoCE).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Static rate (0: port's rate).
    pub static_rate: u8,
    /// Local port number (1-based).
    pub port: u8,
    /// Global routing header: required on RoCE and across subnets.
    pub grh: Option<GlobalRoute>,
}

impl AddressVector {
    /// A vector from local port `port` with no destination set yet.
    pub fn new(port: u8) -> Self {
        Self {
            dlid: 0,
            sl: 0,
            src_path_bits: 0,
            static_rate: 0,
            port,
            grh: None,
        }
    }

    /// Sets the destination LID.
    pub fn dlid(mut self, dlid: u16) -> Self {
        self.dlid = dlid;
        self
    }

    /// Routes by GID: destination `dgid` from local GID table entry `sgid_index`, hop limit 64.
    pub fn grh(mut self, dgid: Gid, sgid_index: u8) -> Self {
        self.grh = Some(GlobalRoute::new(dgid, sgid_index));
        self
    }

    /// The vector C structure `raw` describes (for example the address handle attributes of
    /// a connection manager's UD event). Its GRH is kept only when `is_global` is set.
    pub fn from_raw(raw: &ffi::ibv_ah_attr) -> Self {
        Self {
            dlid: raw.dlid,
            sl: raw.sl,
            src_path_bits: raw.src_path_bits,
            static_rate: raw.static_rate,
            port: raw.port_num,
            grh: (raw.is_global != 0).then(|| GlobalRoute {
                dgid: Gid::from_raw(&raw.grh.dgid),
                flow_label: raw.grh.flow_label,
                sgid_index: raw.grh.sgid_index,
                hop_limit: raw.grh.hop_limit,
                traffic_class: raw.grh.traffic_class,
            }),
        }
    }

    pub(crate) fn to_raw(self) -> ffi::ibv_ah_attr {
        let mut raw = ffi::ibv_ah_attr {
            dlid: self.dlid,
            sl: self.sl,
            src_path_bits: self.src_path_bits,
            static_rate: self.static_rate,
            port_num: self.port,
            ..Default::default()
        };
        if let Some(grh) = self.grh {
            raw.is_global = 1;
            raw.grh = ffi::ibv_global_route {
                dgid: grh.dgid.to_raw(),
                flow_label: grh.flow_label,
                sgid_index: grh.sgid_index,
                hop_limit: grh.hop_limit,
                traffic_class: grh.traffic_class,
            };
        }
        raw
    }
}

/// Bytes in front of every UD receive, where the device writes the datagram's global routing
/// header (`struct ibv_grh`) when it has one: a UD receive needs this much room before the
/// datagram's bytes, even for a datagram of none.
pub const GRH_LEN: usize = 40;

/// Global routing (`struct ibv_global_route`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[must_use = "attributes do nothing until a transition uses them"]
#[non_exhaustive]
pub struct GlobalRoute {
    /// Destination GID.
    pub dgid: Gid,
    /// Flow label.
    pub flow_label: u32,
    /// Index of the source GID in the local port's table.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

impl GlobalRoute {
    /// A route to `dgid` from local GID table entry `sgid_index`: hop limit 64, flow label
    /// and traffic class 0 (the C examples' values). Change a field afterwards for others.
    pub fn new(dgid: Gid, sgid_index: u8) -> Self {
        Self {
            dgid,
            flow_label: 0,
            sgid_index,
            hop_limit: 64,
            traffic_class: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_raw_inverts_to_raw() {
        let mut av = AddressVector::new(2).dlid(7).grh(Gid([9; 16]), 1);
        av.sl = 3;
        if let Some(grh) = av.grh.as_mut() {
            grh.flow_label = 0x12345;
            grh.traffic_class = 0x20;
        }
        assert_eq!(AddressVector::from_raw(&av.to_raw()), av);
        let local = AddressVector::new(1).dlid(5);
        assert_eq!(AddressVector::from_raw(&local.to_raw()), local);
    }

    #[test]
    fn a_global_route_sets_the_grh_with_hop_limit_64() {
        let av = AddressVector::new(1).grh(Gid([1; 16]), 3).to_raw();
        assert_eq!(
            (av.is_global, av.grh.sgid_index, av.grh.hop_limit),
            (1, 3, 64)
        );
    }
}
