//! Multicast over the connection manager (`rdma_join_multicast_ex`, `rdma_leave_multicast`):
//! a UD identifier joins an IP multicast group; the `MulticastJoin` event says where the
//! group's datagrams go ([`UdParam`]), and UD queue pairs attached to the group receive them.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use rdma_verbs::{
    QueuePair,
    qp::{QpState, Ud},
};
use rdma_verbs_sys as ffi;

use crate::addr;
use crate::c_enum::EventKind;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::id::{CmId, check};
use crate::ud::UdParam;

/// How an identifier joins a multicast group (`enum rdma_cm_mc_join_flags`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum JoinKind {
    /// `RDMA_MC_JOIN_FLAG_FULLMEMBER`: sends to the group and receives from it (attach a
    /// queue pair with [`UdParam::attach`]).
    #[default]
    FullMember,
    /// `RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER`: only sends to the group. On RoCE no IGMP
    /// membership report is sent for it.
    SendOnly,
}

impl JoinKind {
    fn raw(self) -> u32 {
        match self {
            JoinKind::FullMember => ffi::RDMA_MC_JOIN_FLAG_FULLMEMBER,
            JoinKind::SendOnly => ffi::RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER,
        }
    }
}

impl CmId {
    /// `rdma_join_multicast_ex`: joins multicast group `group` (an IPv4 or IPv6 multicast
    /// address) as `kind`; a [`MulticastJoin`](EventKind::MulticastJoin) event follows, whose
    /// [`ud_param`](Event::ud_param) says where datagrams to the group go, or a
    /// `MulticastError`. The identifier must be of [`PortSpace::Udp`](crate::PortSpace::Udp)
    /// and bound to a device: resolve the group's address first
    /// ([`resolve_addr`](Self::resolve_addr) with a local source address and the group as
    /// destination, then `AddrResolved`), or bind to a local address of an RDMA interface.
    ///
    /// The connection manager joins the fabric's group (IGMP on RoCE, the subnet
    /// administrator on InfiniBand); it does not attach queue pairs it did not make: attach
    /// yours with [`UdParam::attach`]. Groups still joined when the identifier is destroyed
    /// are left then.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an identifier not of the UDP port space, an address
    /// that is not multicast, or a group this identifier already joined; [`Error::NoDevice`]
    /// before the identifier is bound to a device; [`Error::Call`] with
    /// `rdma_join_multicast_ex`.
    ///
    /// # References
    ///
    /// [`rdma_join_multicast_ex(3)`](https://man7.org/linux/man-pages/man3/rdma_join_multicast_ex.3.html)
    #[doc(alias = "rdma_join_multicast")]
    #[doc(alias = "rdma_join_multicast_ex")]
    pub fn join_multicast(&self, group: IpAddr, kind: JoinKind) -> Result<()> {
        self.require_udp()?;
        if !group.is_multicast() {
            return Err(Error::InvalidArgument("not a multicast address"));
        }
        let addr = SocketAddr::new(group, 0);
        self.0.with_device(|raw| {
            let mut groups = self.0.groups.lock().unwrap_or_else(|e| e.into_inner());
            if groups.held(addr).is_some() {
                return Err(Error::InvalidArgument(
                    "this identifier joined that group already",
                ));
            }
            let token = groups.next_token();
            let mut storage = addr::to_storage(addr);
            let mut attr = ffi::rdma_cm_join_mc_attr_ex {
                comp_mask: ffi::RDMA_CM_JOIN_MC_ATTR_ADDRESS | ffi::RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
                join_flags: kind.raw(),
                addr: (&raw mut storage).cast(),
            };
            // SAFETY: a live identifier bound to a device, under its channel's lock; the
            // attributes and address are read during the call. The context is a number,
            // never dereferenced: librdmacm only hands it back in the group's events.
            check("rdma_join_multicast_ex", unsafe {
                ffi::rdma_join_multicast_ex(
                    raw,
                    &raw mut attr,
                    std::ptr::without_provenance_mut(token),
                )
            })?;
            groups.add(token, addr);
            Ok(())
        })
    }

    /// `rdma_leave_multicast`: leaves group `group`. Detach your queue pairs from it first
    /// ([`UdParam::detach`]) if they should stop receiving its datagrams at once.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if this identifier did not join `group` (or left it);
    /// [`Error::EventsHeld`] while a `MulticastJoin` or `MulticastError` event about the group
    /// is held (librdmacm would wait for its acknowledgement forever: drop it first);
    /// [`Error::Call`] with `rdma_leave_multicast` (the group is forgotten all the same).
    ///
    /// # References
    ///
    /// [`rdma_leave_multicast(3)`](https://man7.org/linux/man-pages/man3/rdma_leave_multicast.3.html)
    #[doc(alias = "rdma_leave_multicast")]
    pub fn leave_multicast(&self, group: IpAddr) -> Result<()> {
        let addr = SocketAddr::new(group, 0);
        self.0.with(|raw| {
            let mut groups = self.0.groups.lock().unwrap_or_else(|e| e.into_inner());
            let held = groups.held(addr).ok_or(Error::InvalidArgument(
                "this identifier did not join that group",
            ))?;
            if held > 0 {
                return Err(Error::EventsHeld {
                    call: "rdma_leave_multicast",
                    count: held,
                });
            }
            groups.remove(addr);
            drop(groups);
            let mut storage = addr::to_storage(addr);
            // SAFETY: a live identifier that joined `addr`, under its channel's lock: no event
            // about the group is held and none can be read meanwhile (reading takes that
            // lock), so librdmacm has none to wait for; unread ones are discarded.
            check("rdma_leave_multicast", unsafe {
                ffi::rdma_leave_multicast(raw, (&raw mut storage).cast())
            })
        })
    }

    /// The multicast groups this identifier joined and has not left, oldest first.
    pub fn multicast_groups(&self) -> Vec<IpAddr> {
        let groups = self.0.groups.lock().unwrap_or_else(|e| e.into_inner());
        groups.addrs()
    }

    /// Joins `group` ([`join_multicast`](Self::join_multicast)) and waits at most `timeout`
    /// for the `MulticastJoin` event; returns where the group's datagrams go. On failure the
    /// group is left again.
    ///
    /// # Errors
    ///
    /// As [`join_multicast`](Self::join_multicast) and [`wait_event`](Self::wait_event)
    /// (`MulticastError` is an [`Error::Event`] with the errno as its status).
    pub fn join_group(&self, group: IpAddr, kind: JoinKind, timeout: Duration) -> Result<UdParam> {
        self.join_multicast(group, kind)?;
        let joined = self
            .wait_event(EventKind::MulticastJoin, timeout)
            .and_then(|event| event.ud_param().ok_or(NO_UD_PARAM));
        if joined.is_err() {
            let _ = self.leave_multicast(group);
        }
        joined
    }
}

pub(crate) const NO_UD_PARAM: Error =
    Error::InvalidArgument("a MulticastJoin event without UD parameters");

impl Event {
    /// For a `MulticastJoin` or `MulticastError` event, the group it is about.
    pub fn multicast_group(&self) -> Option<IpAddr> {
        self.group.map(|(_, addr)| addr)
    }
}

impl UdParam {
    /// `ibv_attach_mcast` of `qp` to the multicast group this describes (from a
    /// `MulticastJoin` event): `qp` then receives the group's datagrams, if its Q_Key is the
    /// group's ([`qkey`](Self::qkey); [`CmId::ready_ud_qp`] gives it the identifier's, which
    /// is the group's on RoCE).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for parameters without a global route (not a group's);
    /// [`Error::Verbs`] with `ibv_attach_mcast`.
    pub fn attach<S: QpState>(&self, qp: &mut QueuePair<Ud, S>) -> Result<()> {
        let gid = self.group_gid()?;
        Ok(qp.attach_mcast(gid, self.av.dlid)?)
    }

    /// `ibv_detach_mcast` of `qp` from the group this describes.
    ///
    /// # Errors
    ///
    /// As [`attach`](Self::attach), with `ibv_detach_mcast`.
    pub fn detach<S: QpState>(&self, qp: &mut QueuePair<Ud, S>) -> Result<()> {
        let gid = self.group_gid()?;
        Ok(qp.detach_mcast(gid, self.av.dlid)?)
    }

    fn group_gid(&self) -> Result<rdma_verbs::device::Gid> {
        self.av
            .grh
            .map(|grh| grh.dgid)
            .ok_or(Error::InvalidArgument(
                "UD parameters without a global route",
            ))
    }
}
