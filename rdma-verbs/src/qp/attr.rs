//! Transition attributes, one type per transition per transport, with the defaults of
//! rdma-core's example programs.

use crate::ah::AddressVector;
use crate::device::Mtu;
use crate::ffi;
use crate::flags::AccessFlags;

/// Fills the `ibv_qp_attr` fields a transition sets and returns their mask bits.
pub trait ModifyAttr: sealed::Sealed {
    #[doc(hidden)]
    fn fill(&self, attr: &mut ffi::ibv_qp_attr) -> u32;
}

pub(crate) mod sealed {
    pub trait Sealed {}
}

/// RESET → INIT for RC and UC: `IBV_QP_STATE | PKEY_INDEX | PORT | ACCESS_FLAGS`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[must_use = "attributes do nothing until a transition uses them"]
#[non_exhaustive]
pub struct ConnectedInitAttr {
    /// Partition key index (0).
    pub pkey_index: u16,
    /// Port (1-based).
    pub port: u8,
    /// What the peer may do to this side's memory through this queue pair (nothing by
    /// default): remote write, read and atomic must also be allowed by each memory region.
    pub access: AccessFlags,
}

impl ConnectedInitAttr {
    /// Port `port`, partition key index 0, no remote access.
    pub fn new(port: u8) -> Self {
        Self {
            pkey_index: 0,
            port,
            access: AccessFlags::empty(),
        }
    }

    /// Sets the remote access rights.
    pub fn access(mut self, access: AccessFlags) -> Self {
        self.access = access;
        self
    }
}

/// RESET → INIT for UD: `IBV_QP_STATE | PKEY_INDEX | PORT | QKEY`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[must_use = "attributes do nothing until a transition uses them"]
#[non_exhaustive]
pub struct UdInitAttr {
    /// Partition key index (0).
    pub pkey_index: u16,
    /// Port (1-based).
    pub port: u8,
    /// The Q_Key incoming datagrams must carry.
    pub qkey: u32,
}

impl UdInitAttr {
    /// Port `port`, partition key index 0, Q_Key `qkey`.
    pub fn new(port: u8, qkey: u32) -> Self {
        Self {
            pkey_index: 0,
            port,
            qkey,
        }
    }
}

/// INIT → RTR for RC: `STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC |
/// MIN_RNR_TIMER`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[must_use = "attributes do nothing until a transition uses them"]
#[non_exhaustive]
pub struct RcRtrAttr {
    /// Path to the peer.
    pub av: AddressVector,
    /// Path MTU (1024).
    pub path_mtu: Mtu,
    /// The peer's queue pair number.
    pub dest_qp_num: u32,
    /// The peer's first packet sequence number.
    pub rq_psn: u32,
    /// RDMA reads and atomics the peer may have outstanding here (1).
    pub max_dest_rd_atomic: u8,
    /// Receiver-not-ready NAK timer code (12: 0.64 ms).
    pub min_rnr_timer: u8,
}

impl RcRtrAttr {
    /// To queue pair `dest_qp_num` at `av`, starting at `rq_psn`, with the C defaults: MTU
    /// 1024, one outstanding read/atomic, RNR timer 12.
    pub fn new(av: AddressVector, dest_qp_num: u32, rq_psn: u32) -> Self {
        Self {
            av,
            path_mtu: Mtu::Mtu1024,
            dest_qp_num,
            rq_psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
        }
    }
}

/// INIT → RTR for UC: `STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[must_use = "attributes do nothing until a transition uses them"]
#[non_exhaustive]
pub struct UcRtrAttr {
    /// Path to the peer.
    pub av: AddressVector,
    /// Path MTU (1024).
    pub path_mtu: Mtu,
    /// The peer's queue pair number.
    pub dest_qp_num: u32,
    /// The peer's first packet sequence number.
    pub rq_psn: u32,
}

impl UcRtrAttr {
    /// To queue pair `dest_qp_num` at `av`, starting at `rq_psn`, MTU 1024.
    pub fn new(av: AddressVector, dest_qp_num: u32, rq_psn: u32) -> Self {
        Self {
            av,
            path_mtu: Mtu::Mtu1024,
            dest_qp_num,
            rq_psn,
        }
    }
}

/// INIT → RTR for UD: `STATE` only.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
#[must_use = "attributes do nothing until a transition uses them"]
pub struct UdRtrAttr;

/// RTR → RTS for RC: `STATE | TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[must_use = "attributes do nothing until a transition uses them"]
#[non_exhaustive]
pub struct RcRtsAttr {
    /// This side's first packet sequence number.
    pub sq_psn: u32,
    /// Local ack timeout code (14: about 67 ms).
    pub timeout: u8,
    /// Transport retries (7).
    pub retry_cnt: u8,
    /// Receiver-not-ready retries (7: infinite).
    pub rnr_retry: u8,
    /// RDMA reads and atomics this side may have outstanding (1).
    pub max_rd_atomic: u8,
}

impl RcRtsAttr {
    /// Starting at `sq_psn`, with the C defaults: timeout 14, retry 7, RNR retry 7, one
    /// outstanding read/atomic.
    pub fn new(sq_psn: u32) -> Self {
        Self {
            sq_psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
        }
    }
}

/// RTR → RTS for UC and UD: `STATE | SQ_PSN`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[must_use = "attributes do nothing until a transition uses them"]
#[non_exhaustive]
pub struct SqPsnRtsAttr {
    /// This side's first packet sequence number.
    pub sq_psn: u32,
}

impl SqPsnRtsAttr {
    /// Starting at `sq_psn`.
    pub fn new(sq_psn: u32) -> Self {
        Self { sq_psn }
    }
}

/// Attributes prepared elsewhere, for example by `rdma_init_qp_attr` in the connection
/// manager: a raw `ibv_qp_attr` and its mask, for the transition to the state they name.
#[derive(Copy, Clone)]
#[must_use = "attributes do nothing until a transition uses them"]
pub struct RawModifyAttr {
    attr: ffi::ibv_qp_attr,
    mask: u32,
}

impl std::fmt::Debug for RawModifyAttr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawModifyAttr")
            .field("qp_state", &self.attr.qp_state)
            .field("mask", &format_args!("{:#x}", self.mask))
            .finish()
    }
}

impl RawModifyAttr {
    /// Wraps `attr` and `mask`.
    ///
    /// # Safety
    ///
    /// `attr` must be valid for `ibv_modify_qp` with `mask` (no dangling pointers: the
    /// structure holds none that verbs reads, but its values go to the provider unchecked).
    pub unsafe fn from_raw(attr: ffi::ibv_qp_attr, mask: u32) -> Self {
        Self { attr, mask }
    }

    /// The state these attributes move a queue pair to.
    pub fn target(&self) -> super::QpStateKind {
        super::QpStateKind::from_raw(self.attr.qp_state)
    }

    /// The wrapped structure, to read a value the attributes carry (for example the Q_Key
    /// of a UD queue pair's INIT attributes, when [`mask`](Self::mask) has `IBV_QP_QKEY`).
    pub fn attr(&self) -> &ffi::ibv_qp_attr {
        &self.attr
    }

    /// The `IBV_QP_*` mask saying which fields of [`attr`](Self::attr) are set.
    pub fn mask(&self) -> u32 {
        self.mask
    }

    pub(crate) fn raw(&self) -> (ffi::ibv_qp_attr, u32) {
        (self.attr, self.mask)
    }
}

impl sealed::Sealed for ConnectedInitAttr {}
impl ModifyAttr for ConnectedInitAttr {
    fn fill(&self, attr: &mut ffi::ibv_qp_attr) -> u32 {
        attr.pkey_index = self.pkey_index;
        attr.port_num = self.port;
        attr.qp_access_flags = self.access.bits();
        ffi::IBV_QP_PKEY_INDEX | ffi::IBV_QP_PORT | ffi::IBV_QP_ACCESS_FLAGS
    }
}

impl sealed::Sealed for UdInitAttr {}
impl ModifyAttr for UdInitAttr {
    fn fill(&self, attr: &mut ffi::ibv_qp_attr) -> u32 {
        attr.pkey_index = self.pkey_index;
        attr.port_num = self.port;
        attr.qkey = self.qkey;
        ffi::IBV_QP_PKEY_INDEX | ffi::IBV_QP_PORT | ffi::IBV_QP_QKEY
    }
}

impl sealed::Sealed for RcRtrAttr {}
impl ModifyAttr for RcRtrAttr {
    fn fill(&self, attr: &mut ffi::ibv_qp_attr) -> u32 {
        attr.ah_attr = self.av.to_raw();
        attr.path_mtu = self.path_mtu.as_raw();
        attr.dest_qp_num = self.dest_qp_num;
        attr.rq_psn = self.rq_psn;
        attr.max_dest_rd_atomic = self.max_dest_rd_atomic;
        attr.min_rnr_timer = self.min_rnr_timer;
        ffi::IBV_QP_AV
            | ffi::IBV_QP_PATH_MTU
            | ffi::IBV_QP_DEST_QPN
            | ffi::IBV_QP_RQ_PSN
            | ffi::IBV_QP_MAX_DEST_RD_ATOMIC
            | ffi::IBV_QP_MIN_RNR_TIMER
    }
}

impl sealed::Sealed for UcRtrAttr {}
impl ModifyAttr for UcRtrAttr {
    fn fill(&self, attr: &mut ffi::ibv_qp_attr) -> u32 {
        attr.ah_attr = self.av.to_raw();
        attr.path_mtu = self.path_mtu.as_raw();
        attr.dest_qp_num = self.dest_qp_num;
        attr.rq_psn = self.rq_psn;
        ffi::IBV_QP_AV | ffi::IBV_QP_PATH_MTU | ffi::IBV_QP_DEST_QPN | ffi::IBV_QP_RQ_PSN
    }
}

impl sealed::Sealed for UdRtrAttr {}
impl ModifyAttr for UdRtrAttr {
    fn fill(&self, _attr: &mut ffi::ibv_qp_attr) -> u32 {
        0
    }
}

impl sealed::Sealed for RcRtsAttr {}
impl ModifyAttr for RcRtsAttr {
    fn fill(&self, attr: &mut ffi::ibv_qp_attr) -> u32 {
        attr.sq_psn = self.sq_psn;
        attr.timeout = self.timeout;
        attr.retry_cnt = self.retry_cnt;
        attr.rnr_retry = self.rnr_retry;
        attr.max_rd_atomic = self.max_rd_atomic;
        ffi::IBV_QP_TIMEOUT
            | ffi::IBV_QP_RETRY_CNT
            | ffi::IBV_QP_RNR_RETRY
            | ffi::IBV_QP_SQ_PSN
            | ffi::IBV_QP_MAX_QP_RD_ATOMIC
    }
}

impl sealed::Sealed for SqPsnRtsAttr {}
impl ModifyAttr for SqPsnRtsAttr {
    fn fill(&self, attr: &mut ffi::ibv_qp_attr) -> u32 {
        attr.sq_psn = self.sq_psn;
        ffi::IBV_QP_SQ_PSN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_match_the_transitions_rdma_core_uses() {
        let mut raw = ffi::ibv_qp_attr::default();
        let mask = RcRtrAttr::new(AddressVector::new(1), 5, 6).fill(&mut raw);
        assert_eq!(raw.min_rnr_timer, 12);
        assert_eq!(raw.max_dest_rd_atomic, 1);
        assert_eq!(raw.path_mtu, ffi::IBV_MTU_1024);
        assert_eq!(
            mask,
            ffi::IBV_QP_AV
                | ffi::IBV_QP_PATH_MTU
                | ffi::IBV_QP_DEST_QPN
                | ffi::IBV_QP_RQ_PSN
                | ffi::IBV_QP_MAX_DEST_RD_ATOMIC
                | ffi::IBV_QP_MIN_RNR_TIMER
        );
        let mut raw = ffi::ibv_qp_attr::default();
        RcRtsAttr::new(9).fill(&mut raw);
        assert_eq!(
            (raw.timeout, raw.retry_cnt, raw.rnr_retry, raw.max_rd_atomic),
            (14, 7, 7, 1)
        );
    }
}
