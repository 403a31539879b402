//! Address handles: the destination of UD datagrams.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::cq::WorkCompletion;
use crate::device::{Context, Gid};
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
    /// # use rdma_verbs::{*, ah::*, async_event::*, channel::*, cq::*, device::*, mr::*, mw::*, owned::*, qp::*, scope::*, slot::*, srq::*, wr::*, xrcd::*, ah::*, async_event::*, channel::*, cq::*, device::*, mr::*, mw::*, owned::*, qp::*, scope::*, slot::*, srq::*, wr::*, xrcd::*};
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
        grh: &[u8; GRH_LEN],
    ) -> Result<AddressHandle> {
        let mut wc_raw = *wc.as_raw();
        let mut grh_raw = read_grh(grh);
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
/// [`RcRtrAttr`](crate::qp::RcRtrAttr)/[`UcRtrAttr`](crate::qp::UcRtrAttr), for UD an
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
    /// The rate the sender limits the path to ([`StaticRate::PORT`]: the port's rate).
    pub static_rate: StaticRate,
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
            static_rate: StaticRate::PORT,
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
            static_rate: StaticRate(raw.static_rate),
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

    /// `ibv_init_ah_from_wc`: the path back to the sender of a UD receive completion on
    /// `port` of `context`, with its GRH (the first [`GRH_LEN`] bytes of the receive buffer)
    /// turned around: what [`ProtectionDomain::create_ah_from_wc`] creates a handle for, as a
    /// vector to change first (a rate, a service level) or to connect a queue pair with.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with the errno of `ibv_init_ah_from_wc`: on RoCE, `EINVAL` for a
    /// multicast destination or a header that is neither IPv4 nor IPv6, `EPROTONOSUPPORT` for
    /// an IPv6 header of another protocol, and an error when no local GID matches the
    /// datagram's destination GID.
    ///
    /// # References
    ///
    /// [`ibv_init_ah_from_wc(3)`](https://man7.org/linux/man-pages/man3/ibv_init_ah_from_wc.3.html)
    #[doc(alias = "ibv_init_ah_from_wc")]
    pub fn from_completion(
        context: &Context,
        port: u8,
        wc: &WorkCompletion,
        grh: &[u8; GRH_LEN],
    ) -> Result<Self> {
        let mut wc_raw = *wc.as_raw();
        let mut grh_raw = read_grh(grh);
        let mut attr = ffi::ibv_ah_attr::default();
        Errno::clear();
        // SAFETY: live context; the three structures are local and the call writes only `attr`.
        let ret = unsafe {
            ffi::ibv_init_ah_from_wc(context.as_raw(), port, &mut wc_raw, &mut grh_raw, &mut attr)
        };
        if ret != 0 {
            return Err(Error::last_or("ibv_init_ah_from_wc", Errno::INVAL));
        }
        Ok(Self::from_raw(&attr))
    }

    pub(crate) fn to_raw(self) -> ffi::ibv_ah_attr {
        let mut raw = ffi::ibv_ah_attr {
            dlid: self.dlid,
            sl: self.sl,
            src_path_bits: self.src_path_bits,
            static_rate: self.static_rate.0,
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

/// A static rate (`enum ibv_rate`): the injection rate a sender limits a path to, set in an
/// [`AddressVector`]. [`PORT`](Self::PORT), the default, is the port's own rate.
///
/// Rates are named by their link speed; the conversions are libibverbs' own tables, so a rate
/// converts exactly as the C tools convert it.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct StaticRate(u8);

impl StaticRate {
    /// `IBV_RATE_MAX`: no limit below the port's rate.
    pub const PORT: Self = Self(0);

    /// `mbps_to_ibv_rate`: the rate of exactly `mbps` megabits per second as libibverbs lists
    /// it (for example 10000, 25781 or 103125); `None` for a speed that has no rate.
    ///
    /// # References
    ///
    /// [`mbps_to_ibv_rate(3)`](https://man7.org/linux/man-pages/man3/mbps_to_ibv_rate.3.html)
    #[doc(alias = "mbps_to_ibv_rate")]
    pub fn from_mbps(mbps: u32) -> Option<Self> {
        let mbps = i32::try_from(mbps).ok()?;
        // SAFETY: a pure function of its argument.
        Self::listed(unsafe { ffi::mbps_to_ibv_rate(mbps) })
    }

    /// `mult_to_ibv_rate`: the rate `multiplier` times 2.5 Gb/s (1, 2, 4, 8, 12, 16, 24, 32,
    /// 48, and the multipliers of 28, 50, 400, 600, 800 and 1200 Gb/s); `None` for another.
    ///
    /// # References
    ///
    /// [`mult_to_ibv_rate(3)`](https://man7.org/linux/man-pages/man3/mult_to_ibv_rate.3.html)
    #[doc(alias = "mult_to_ibv_rate")]
    pub fn from_multiplier(multiplier: u32) -> Option<Self> {
        let multiplier = i32::try_from(multiplier).ok()?;
        // SAFETY: a pure function of its argument.
        Self::listed(unsafe { ffi::mult_to_ibv_rate(multiplier) })
    }

    /// `ibv_rate_to_mbps`: the rate in megabits per second; `None` for
    /// [`PORT`](Self::PORT) and for a value libibverbs does not list.
    ///
    /// # References
    ///
    /// [`ibv_rate_to_mbps(3)`](https://man7.org/linux/man-pages/man3/ibv_rate_to_mbps.3.html)
    #[doc(alias = "ibv_rate_to_mbps")]
    pub fn mbps(self) -> Option<u32> {
        // SAFETY: a pure function of its argument.
        u32::try_from(unsafe { ffi::ibv_rate_to_mbps(self.as_raw()) }).ok()
    }

    /// `ibv_rate_to_mult`: the rate as a multiple of 2.5 Gb/s; `None` for
    /// [`PORT`](Self::PORT) and for a rate libibverbs' multiplier table lacks (14, 25, 56,
    /// 100, 112, 168, 200 and 300 Gb/s, the rates named by their signalling speed).
    ///
    /// # References
    ///
    /// [`ibv_rate_to_mult(3)`](https://man7.org/linux/man-pages/man3/ibv_rate_to_mult.3.html)
    #[doc(alias = "ibv_rate_to_mult")]
    pub fn multiplier(self) -> Option<u32> {
        // SAFETY: a pure function of its argument.
        u32::try_from(unsafe { ffi::ibv_rate_to_mult(self.as_raw()) }).ok()
    }

    /// The rate of C value `raw` (`enum ibv_rate`), as an [`AddressVector`] carries it.
    pub fn from_raw(raw: u8) -> Self {
        Self(raw)
    }

    /// The C value.
    pub fn as_raw(self) -> ffi::ibv_rate {
        ffi::ibv_rate::from(self.0)
    }

    /// A rate the conversions returned: `IBV_RATE_MAX` means "none listed" there.
    fn listed(raw: ffi::ibv_rate) -> Option<Self> {
        u8::try_from(raw).ok().filter(|&r| r != 0).map(Self)
    }
}

/// The Ethernet link-layer address of a RoCE path's far end, as
/// [`Context::resolve_eth_l2`] finds it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct EthL2 {
    /// The MAC address.
    pub mac: [u8; 6],
    /// The VLAN the path leaves through, if the interface is a VLAN.
    pub vlan: Option<u16>,
}

impl Context {
    /// `ibv_resolve_eth_l2_from_gid`: the MAC address (and VLAN) of the peer a RoCE path `av`
    /// leads to (its destination GID, from its source GID entry), through the kernel's
    /// neighbour table: an ARP or neighbour-discovery request when the entry is missing,
    /// answered within libibverbs' bound (3 s).
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`] for a path without a GRH.
    /// - [`Error::Verb`] with `ibv_resolve_eth_l2_from_gid`: `EHOSTUNREACH` when nobody
    ///   answered, `EINVAL` for an address the source cannot reach.
    ///
    /// # References
    ///
    /// [`ibv_resolve_eth_l2_from_gid(3)`](https://man7.org/linux/man-pages/man3/ibv_resolve_eth_l2_from_gid.3.html)
    #[doc(alias = "ibv_resolve_eth_l2_from_gid")]
    pub fn resolve_eth_l2(&self, av: &AddressVector) -> Result<EthL2> {
        if av.grh.is_none() {
            return Err(Error::InvalidArgument(
                "ibv_resolve_eth_l2_from_gid: a RoCE path needs a GRH".into(),
            ));
        }
        let mut attr = av.to_raw();
        let mut mac = [0u8; 6];
        let mut vid: u16 = 0xffff;
        Errno::clear();
        // SAFETY: live context; `attr`, `mac` (6 bytes, ETHERNET_LL_SIZE) and `vid` are local
        // and writable.
        let ret = unsafe {
            ffi::ibv_resolve_eth_l2_from_gid(self.as_raw(), &mut attr, mac.as_mut_ptr(), &mut vid)
        };
        if ret != 0 {
            // Negative errno values, or a positive one from the GID query.
            let errno = ret.checked_abs().map_or(Errno::last(), Errno::from_raw);
            return Err(Error::verb("ibv_resolve_eth_l2_from_gid", errno));
        }
        Ok(EthL2 {
            mac,
            vlan: (vid <= 0xfff).then_some(vid),
        })
    }
}

/// The `ibv_grh` in the first [`GRH_LEN`] bytes of a UD receive buffer.
fn read_grh(grh: &[u8; GRH_LEN]) -> ffi::ibv_grh {
    const _: () = assert!(std::mem::size_of::<ffi::ibv_grh>() == GRH_LEN);
    // SAFETY: `grh` is GRH_LEN readable bytes, the size of `ibv_grh` (checked above; plain
    // integers, any bit pattern valid); read unaligned because a byte array has no alignment.
    unsafe { grh.as_ptr().cast::<ffi::ibv_grh>().read_unaligned() }
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
