//! Flag sets: memory access, send options and work-completion flags.

use bitflags::bitflags;

use crate::ffi;

bitflags! {
    /// Access rights of a memory region or memory window (`IBV_ACCESS_*`).
    ///
    /// The local HCA may always read a region. Remote access is an explicit choice: a region
    /// that allows [`REMOTE_WRITE`](Self::REMOTE_WRITE) or
    /// [`REMOTE_ATOMIC`](Self::REMOTE_ATOMIC) is only read and written by copying, because a peer
    /// may change it at any moment. Verbs require `LOCAL_WRITE` whenever `REMOTE_WRITE` or
    /// `REMOTE_ATOMIC` is set.
    #[repr(transparent)]
    #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
    pub struct AccessFlags: u32 {
        /// `IBV_ACCESS_LOCAL_WRITE`: the HCA may write the region (receives, RDMA read results).
        const LOCAL_WRITE = ffi::IBV_ACCESS_LOCAL_WRITE;
        /// `IBV_ACCESS_REMOTE_WRITE`: peers may RDMA-write the region.
        const REMOTE_WRITE = ffi::IBV_ACCESS_REMOTE_WRITE;
        /// `IBV_ACCESS_REMOTE_READ`: peers may RDMA-read the region.
        const REMOTE_READ = ffi::IBV_ACCESS_REMOTE_READ;
        /// `IBV_ACCESS_REMOTE_ATOMIC`: peers may run atomics on the region.
        const REMOTE_ATOMIC = ffi::IBV_ACCESS_REMOTE_ATOMIC;
        /// `IBV_ACCESS_MW_BIND`: memory windows may be bound to the region.
        const MW_BIND = ffi::IBV_ACCESS_MW_BIND;
        /// `IBV_ACCESS_ZERO_BASED`: remote addresses of a type 2 window start at 0.
        const ZERO_BASED = ffi::IBV_ACCESS_ZERO_BASED;
        /// `IBV_ACCESS_ON_DEMAND`: on-demand paging.
        const ON_DEMAND = ffi::IBV_ACCESS_ON_DEMAND;
        /// `IBV_ACCESS_RELAXED_ORDERING`: relaxed PCIe ordering (optional; ignored where
        /// unsupported).
        const RELAXED_ORDERING = ffi::IBV_ACCESS_RELAXED_ORDERING;
        // Bits a newer rdma-core may define are kept, not dropped.
        const _ = !0;
    }
}

impl AccessFlags {
    /// Whether a peer may change memory with these rights.
    pub fn remotely_writable(self) -> bool {
        self.intersects(Self::REMOTE_WRITE | Self::REMOTE_ATOMIC)
    }
}

bitflags! {
    /// Options of a send work request (`IBV_SEND_*`).
    #[repr(transparent)]
    #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// `IBV_SEND_FENCE`: wait for earlier RDMA reads and atomics to complete first.
        const FENCE = ffi::IBV_SEND_FENCE;
        /// `IBV_SEND_SIGNALED`: generate a completion even if the queue pair does not signal
        /// every request.
        const SIGNALED = ffi::IBV_SEND_SIGNALED;
        /// `IBV_SEND_SOLICITED`: raise a solicited event at the receiver.
        const SOLICITED = ffi::IBV_SEND_SOLICITED;
        /// `IBV_SEND_INLINE`: copy the payload into the work request during the post.
        const INLINE = ffi::IBV_SEND_INLINE;
        /// `IBV_SEND_IP_CSUM`: offload IP checksums (raw packet queue pairs).
        const IP_CSUM = ffi::IBV_SEND_IP_CSUM;
        const _ = !0;
    }
}

bitflags! {
    /// Flags of a work completion (`IBV_WC_*` flags).
    #[repr(transparent)]
    #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        /// `IBV_WC_GRH`: the first 40 bytes of the receive buffer hold a GRH (UD).
        const GRH = ffi::IBV_WC_GRH;
        /// `IBV_WC_WITH_IMM`: the completion carries immediate data.
        const WITH_IMM = ffi::IBV_WC_WITH_IMM;
        /// `IBV_WC_IP_CSUM_OK`: the IP checksum was verified.
        const IP_CSUM_OK = ffi::IBV_WC_IP_CSUM_OK;
        /// `IBV_WC_WITH_INV`: the completion carries an invalidated rkey.
        const WITH_INV = ffi::IBV_WC_WITH_INV;
        /// `IBV_WC_TM_SYNC_REQ`: tag matching sync request.
        const TM_SYNC_REQ = ffi::IBV_WC_TM_SYNC_REQ;
        /// `IBV_WC_TM_MATCH`: tag matching match.
        const TM_MATCH = ffi::IBV_WC_TM_MATCH;
        /// `IBV_WC_TM_DATA_VALID`: tag matching data valid.
        const TM_DATA_VALID = ffi::IBV_WC_TM_DATA_VALID;
        const _ = !0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_keep_the_c_values_and_unknown_bits() {
        assert_eq!(AccessFlags::LOCAL_WRITE.bits(), 1);
        assert_eq!(AccessFlags::REMOTE_WRITE.bits(), 2);
        assert_eq!(SendFlags::SIGNALED.bits(), 2);
        let unknown = AccessFlags::from_bits_retain(1 << 30);
        assert_eq!(unknown.bits(), 1 << 30);
        assert!(AccessFlags::REMOTE_ATOMIC.remotely_writable());
        assert!(!AccessFlags::REMOTE_READ.remotely_writable());
    }
}
