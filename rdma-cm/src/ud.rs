//! UD over the connection manager (`RDMA_PS_UDP`): the client's connect is a service ID
//! resolution request (SIDR) and the `Established` event carries what a datagram needs to
//! reach the server's queue pair.

use std::time::Duration;

use rdma_verbs::{
    QueuePair,
    ah::AddressVector,
    qp::{QpStateKind, Reset, Rts, SqPsnRtsAttr, Ud, UdRtrAttr},
};
use rdma_verbs_sys as ffi;

use crate::c_enum::EventKind;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::id::{CmId, PortSpace};
use crate::param::ConnParam;

/// Where a UD peer's datagrams go: what an `Established` event of a [`PortSpace::Udp`]
/// identifier reports (`event->param.ud`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct UdParam {
    /// The peer's queue pair number.
    pub qp_num: u32,
    /// The Q_Key the peer's queue pair accepts.
    pub qkey: u32,
    /// The path to the peer: give it to
    /// [`ProtectionDomain::create_ah`](rdma_verbs::ProtectionDomain::create_ah).
    pub av: AddressVector,
}

impl Event {
    /// For an `Established` event of a [`PortSpace::Udp`] identifier, the peer's queue pair,
    /// Q_Key and address vector; for a `MulticastJoin` event, the group's (queue pair
    /// `0xFFFFFF`, the group's Q_Key, its GID as destination GID and its LID); `None` for
    /// other events.
    pub fn ud_param(&self) -> Option<UdParam> {
        let kind = self.kind();
        if !self.is_ud() || !matches!(kind, EventKind::Established | EventKind::MulticastJoin) {
            return None;
        }
        // SAFETY: an unacknowledged event of the UDP port space: `ud` is the member.
        let ud = unsafe { &(*self.as_raw()).param.ud };
        Some(UdParam {
            qp_num: ud.qp_num,
            qkey: ud.qkey,
            av: AddressVector::from_raw(&ud.ah_attr),
        })
    }
}

impl CmId {
    /// Moves `qp` (a UD queue pair in RESET, made on this identifier's
    /// [`context`](Self::context)) to RTS for this identifier: INIT with the identifier's
    /// port, partition and Q_Key (`rdma_init_qp_attr`), RTR, RTS with send PSN 0 — what
    /// `rdma_create_qp` does for a UD identifier. The client calls it once the route is
    /// resolved, the server on a connect request's identifier.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an identifier not of [`PortSpace::Udp`] or a queue pair
    /// of another device; as [`init_qp_attr`](Self::init_qp_attr) and the transitions (the
    /// queue pair is destroyed on failure).
    pub fn ready_ud_qp(&self, qp: QueuePair<Ud, Reset>) -> Result<QueuePair<Ud, Rts>> {
        self.require_udp()?;
        self.check_device(qp.pd().context())?;
        Ok(qp
            .into_init_with(&self.init_qp_attr(QpStateKind::Init)?)
            .map_err(|e| e.into_parts().1)?
            .into_rtr(&UdRtrAttr)
            .map_err(|e| e.into_parts().1)?
            .into_rts(&SqPsnRtsAttr::new(0))
            .map_err(|e| e.into_parts().1)?)
    }

    /// The Q_Key of this identifier's datagrams: what [`ready_ud_qp`](Self::ready_ud_qp)
    /// gives its queue pair and what the peer's `Established` event reports
    /// (`RDMA_UDP_QKEY`, 0x01234567, in the UDP port space).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an identifier not of [`PortSpace::Udp`] or when the
    /// connection manager gives no Q_Key; as [`init_qp_attr`](Self::init_qp_attr).
    pub fn qkey(&self) -> Result<u32> {
        self.require_udp()?;
        let init = self.init_qp_attr(QpStateKind::Init)?;
        if init.mask() & ffi::IBV_QP_QKEY == 0 {
            return Err(Error::InvalidArgument(
                "the connection manager gave no Q_Key",
            ));
        }
        Ok(init.attr().qkey)
    }

    /// The client's side of UD over the connection manager: `rdma_connect` (a SIDR request
    /// with `param`'s private data) for `qp` (from [`ready_ud_qp`](Self::ready_ud_qp), after
    /// [`resolve`](Self::resolve)), then waits (at most `timeout`) for `Established`. Returns
    /// where the server's datagrams go and the private data of its answer.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an identifier not of [`PortSpace::Udp`] or a queue pair
    /// of another device; as [`connect`](Self::connect) and [`wait_event`](Self::wait_event): a refusal is
    /// [`Error::Event`] (`Rejected`, `Unreachable` when no server answers).
    pub fn connect_ud(
        &self,
        qp: &QueuePair<Ud, Rts>,
        param: &ConnParam,
        timeout: Duration,
    ) -> Result<(UdParam, Vec<u8>)> {
        self.require_udp()?;
        self.check_device(qp.pd().context())?;
        self.connect(&param.clone().qp_num(qp.qp_num()))?;
        let established = self.wait_event(EventKind::Established, timeout)?;
        let peer = established.ud_param().ok_or(Error::InvalidArgument(
            "an Established event without UD parameters",
        ))?;
        Ok((peer, established.private_data().to_vec()))
    }

    /// The server's side: `rdma_accept` of the connect request this identifier came with, on
    /// `qp` (from [`ready_ud_qp`](Self::ready_ud_qp)); the client's `Established` event tells
    /// it `qp`'s number and Q_Key. No event follows on this side. Post the receives first:
    /// the client may send as soon as it has the answer.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an identifier not of [`PortSpace::Udp`] or a queue pair
    /// of another device; as [`accept`](Self::accept).
    pub fn accept_ud(&self, qp: &QueuePair<Ud, Rts>, param: &ConnParam) -> Result<()> {
        self.require_udp()?;
        self.check_device(qp.pd().context())?;
        self.accept(&param.clone().qp_num(qp.qp_num()))
    }

    pub(crate) fn require_udp(&self) -> Result<()> {
        if self.port_space() == PortSpace::Udp {
            Ok(())
        } else {
            Err(Error::InvalidArgument(
                "UD over the connection manager needs an identifier of PortSpace::Udp",
            ))
        }
    }
}
