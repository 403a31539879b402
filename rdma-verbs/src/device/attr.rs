//! What a device and its ports report: `ibv_query_device(_ex)` and `ibv_query_port`, and the
//! C enums they use.

use super::fixed_c_str;
use crate::c_enum::{c_enum, static_name};
use crate::ffi;

c_enum! {
    /// Node type of a device (`enum ibv_node_type`).
    NodeType: i32 {
        /// `IBV_NODE_CA`: channel adapter (InfiniBand and RoCE HCAs, Soft-RoCE).
        Ca = ffi::IBV_NODE_CA,
        /// `IBV_NODE_SWITCH`.
        Switch = ffi::IBV_NODE_SWITCH,
        /// `IBV_NODE_ROUTER`.
        Router = ffi::IBV_NODE_ROUTER,
        /// `IBV_NODE_RNIC`: iWARP NIC.
        Rnic = ffi::IBV_NODE_RNIC,
        /// `IBV_NODE_USNIC`.
        Usnic = ffi::IBV_NODE_USNIC,
        /// `IBV_NODE_USNIC_UDP`.
        UsnicUdp = ffi::IBV_NODE_USNIC_UDP,
        /// `IBV_NODE_UNSPECIFIED`.
        Unspecified = ffi::IBV_NODE_UNSPECIFIED,
    }
}

c_enum! {
    /// Transport of a device (`enum ibv_transport_type`).
    DeviceTransport: i32 {
        /// `IBV_TRANSPORT_IB`: InfiniBand, and RoCE.
        Ib = ffi::IBV_TRANSPORT_IB,
        /// `IBV_TRANSPORT_IWARP`.
        Iwarp = ffi::IBV_TRANSPORT_IWARP,
        /// `IBV_TRANSPORT_USNIC`.
        Usnic = ffi::IBV_TRANSPORT_USNIC,
        /// `IBV_TRANSPORT_USNIC_UDP`.
        UsnicUdp = ffi::IBV_TRANSPORT_USNIC_UDP,
        /// `IBV_TRANSPORT_UNSPECIFIED`.
        Unspecified = ffi::IBV_TRANSPORT_UNSPECIFIED,
    }
}

c_enum! {
    /// State of a port (`enum ibv_port_state`).
    PortState: u32 {
        /// `IBV_PORT_NOP`.
        Nop = ffi::IBV_PORT_NOP,
        /// `IBV_PORT_DOWN`.
        Down = ffi::IBV_PORT_DOWN,
        /// `IBV_PORT_INIT`.
        Init = ffi::IBV_PORT_INIT,
        /// `IBV_PORT_ARMED`.
        Armed = ffi::IBV_PORT_ARMED,
        /// `IBV_PORT_ACTIVE`: the port can carry traffic.
        Active = ffi::IBV_PORT_ACTIVE,
        /// `IBV_PORT_ACTIVE_DEFER`.
        ActiveDefer = ffi::IBV_PORT_ACTIVE_DEFER,
    }
}

impl NodeType {
    /// `ibv_node_type_str`: libibverbs' name of the node type, for example
    /// `InfiniBand channel adapter`; `unknown` for a value it does not know.
    ///
    /// # References
    ///
    /// [`ibv_node_type_str(3)`](https://man7.org/linux/man-pages/man3/ibv_node_type_str.3.html)
    #[doc(alias = "ibv_node_type_str")]
    pub fn name(self) -> &'static str {
        // SAFETY: the call takes any value and returns a static string.
        unsafe { static_name(ffi::ibv_node_type_str(self.as_raw())) }
    }
}

impl PortState {
    /// `ibv_port_state_str`: libibverbs' name of the state, for example `active`; `unknown`
    /// for a value it does not know. (`ibv_devinfo` prints its own names, `PORT_ACTIVE`.)
    ///
    /// # References
    ///
    /// [`ibv_port_state_str(3)`](https://man7.org/linux/man-pages/man3/ibv_port_state_str.3.html)
    #[doc(alias = "ibv_port_state_str")]
    pub fn name(self) -> &'static str {
        // SAFETY: the call takes any value and returns a static string.
        unsafe { static_name(ffi::ibv_port_state_str(self.as_raw())) }
    }
}

c_enum! {
    /// Path MTU (`enum ibv_mtu`).
    Mtu: u32 {
        /// 256 bytes.
        Mtu256 = ffi::IBV_MTU_256,
        /// 512 bytes.
        Mtu512 = ffi::IBV_MTU_512,
        /// 1024 bytes.
        Mtu1024 = ffi::IBV_MTU_1024,
        /// 2048 bytes.
        Mtu2048 = ffi::IBV_MTU_2048,
        /// 4096 bytes.
        Mtu4096 = ffi::IBV_MTU_4096,
    }
}

impl Mtu {
    /// The MTU in bytes, or `None` for an unknown value.
    pub fn bytes(self) -> Option<u32> {
        match self {
            Self::Mtu256 => Some(256),
            Self::Mtu512 => Some(512),
            Self::Mtu1024 => Some(1024),
            Self::Mtu2048 => Some(2048),
            Self::Mtu4096 => Some(4096),
            Self::Unknown(_) => None,
        }
    }

    /// The MTU of `bytes` bytes (256, 512, 1024, 2048 or 4096).
    pub fn from_bytes(bytes: u32) -> Option<Self> {
        match bytes {
            256 => Some(Self::Mtu256),
            512 => Some(Self::Mtu512),
            1024 => Some(Self::Mtu1024),
            2048 => Some(Self::Mtu2048),
            4096 => Some(Self::Mtu4096),
            _ => None,
        }
    }
}

c_enum! {
    /// Link layer of a port.
    LinkLayer: u8 {
        /// `IBV_LINK_LAYER_UNSPECIFIED` (old kernels; means InfiniBand).
        Unspecified = ffi::IBV_LINK_LAYER_UNSPECIFIED,
        /// `IBV_LINK_LAYER_INFINIBAND`.
        InfiniBand = ffi::IBV_LINK_LAYER_INFINIBAND,
        /// `IBV_LINK_LAYER_ETHERNET`: RoCE.
        Ethernet = ffi::IBV_LINK_LAYER_ETHERNET,
    }
}

c_enum! {
    /// Type of a GID table entry (`enum ibv_gid_type`).
    GidType: u32 {
        /// `IBV_GID_TYPE_IB`.
        Ib = ffi::IBV_GID_TYPE_IB,
        /// `IBV_GID_TYPE_ROCE_V1`.
        RoceV1 = ffi::IBV_GID_TYPE_ROCE_V1,
        /// `IBV_GID_TYPE_ROCE_V2`: RoCE over UDP/IP.
        RoceV2 = ffi::IBV_GID_TYPE_ROCE_V2,
    }
}

c_enum! {
    /// Atomic operation guarantees of a device (`enum ibv_atomic_cap`).
    AtomicCap: u32 {
        /// `IBV_ATOMIC_NONE`: no atomics.
        None = ffi::IBV_ATOMIC_NONE,
        /// `IBV_ATOMIC_HCA`: atomic among this HCA's operations.
        Hca = ffi::IBV_ATOMIC_HCA,
        /// `IBV_ATOMIC_GLOB`: atomic with respect to the CPU too.
        Global = ffi::IBV_ATOMIC_GLOB,
    }
}

/// Device attributes (`struct ibv_device_attr`, with the extended fields of
/// `ibv_device_attr_ex` the safe API uses).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceAttr {
    /// Firmware version.
    pub fw_ver: String,
    /// Node GUID, host byte order.
    pub node_guid: u64,
    /// System image GUID, host byte order.
    pub sys_image_guid: u64,
    /// Largest memory region, in bytes.
    pub max_mr_size: u64,
    /// Supported page sizes (bit mask).
    pub page_size_cap: u64,
    /// Vendor ID (IEEE OUI).
    pub vendor_id: u32,
    /// Vendor part ID.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// Maximum number of queue pairs.
    pub max_qp: u32,
    /// Maximum work requests per queue.
    pub max_qp_wr: u32,
    /// `IBV_DEVICE_*` capability flags.
    pub device_cap_flags: u32,
    /// Extended capability flags (`device_cap_flags_ex`; 0 where the query is unsupported).
    pub device_cap_flags_ex: u64,
    /// Maximum scatter/gather entries per send or receive request.
    pub max_sge: u32,
    /// Maximum scatter/gather entries per RDMA read request.
    pub max_sge_rd: u32,
    /// Maximum number of completion queues.
    pub max_cq: u32,
    /// Maximum entries per completion queue.
    pub max_cqe: u32,
    /// Maximum number of memory regions.
    pub max_mr: u32,
    /// Maximum number of protection domains.
    pub max_pd: u32,
    /// Maximum outstanding RDMA reads and atomics a queue pair accepts as target.
    pub max_qp_rd_atom: u32,
    /// Maximum outstanding RDMA reads and atomics a queue pair issues as initiator.
    pub max_qp_init_rd_atom: u32,
    /// Atomic operation guarantees.
    pub atomic_cap: AtomicCap,
    /// Maximum number of memory windows.
    pub max_mw: u32,
    /// Maximum number of address handles.
    pub max_ah: u32,
    /// Maximum number of shared receive queues.
    pub max_srq: u32,
    /// Maximum work requests per shared receive queue.
    pub max_srq_wr: u32,
    /// Maximum scatter/gather entries per shared receive queue request.
    pub max_srq_sge: u32,
    /// Number of partition keys.
    pub max_pkeys: u16,
    /// Local CA ack delay.
    pub local_ca_ack_delay: u8,
    /// Number of physical ports.
    pub phys_port_cnt: u8,
    /// Completion timestamp mask (0 if the device has no completion timestamps).
    pub completion_timestamp_mask: u64,
    /// HCA core clock, kHz (0 if unknown).
    pub hca_core_clock: u64,
    /// Maximum device memory, bytes (0 if none).
    pub max_dm_size: u64,
    /// Maximum outstanding RDMA reads and atomics per end-to-end context (`max_ee_rd_atom`).
    pub max_ee_rd_atom: u32,
    /// Maximum outstanding RDMA reads and atomics the device accepts as target, in total
    /// (`max_res_rd_atom`).
    pub max_res_rd_atom: u32,
    /// Maximum outstanding RDMA reads and atomics per end-to-end context as initiator
    /// (`max_ee_init_rd_atom`).
    pub max_ee_init_rd_atom: u32,
    /// Maximum number of end-to-end contexts (`max_ee`).
    pub max_ee: u32,
    /// Maximum number of reliable datagram domains (`max_rdd`).
    pub max_rdd: u32,
    /// Maximum number of raw IPv6 datagram queue pairs (`max_raw_ipv6_qp`).
    pub max_raw_ipv6_qp: u32,
    /// Maximum number of raw Ethertype datagram queue pairs (`max_raw_ethy_qp`).
    pub max_raw_ethy_qp: u32,
    /// Maximum number of multicast groups (`max_mcast_grp`).
    pub max_mcast_grp: u32,
    /// Maximum queue pairs attached to one multicast group (`max_mcast_qp_attach`).
    pub max_mcast_qp_attach: u32,
    /// Maximum queue pairs attached to multicast groups, in total
    /// (`max_total_mcast_qp_attach`).
    pub max_total_mcast_qp_attach: u32,
    /// Maximum number of fast memory regions (`max_fmr`; 0 on current devices).
    pub max_fmr: u32,
    /// Maximum remaps per fast memory region (`max_map_per_fmr`).
    pub max_map_per_fmr: u32,
    /// On-demand paging: `IBV_ODP_SUPPORT*` general capability bits (`odp_caps.general_caps`;
    /// 0 where the extended query is unsupported).
    pub odp_general_caps: u64,
    /// On-demand paging: `IBV_ODP_SUPPORT_*` bits of RC queue pairs
    /// (`odp_caps.per_transport_caps.rc_odp_caps`).
    pub rc_odp_caps: u32,
    /// On-demand paging: `IBV_ODP_SUPPORT_*` bits of UC queue pairs.
    pub uc_odp_caps: u32,
    /// On-demand paging: `IBV_ODP_SUPPORT_*` bits of UD queue pairs.
    pub ud_odp_caps: u32,
    /// On-demand paging: `IBV_ODP_SUPPORT_*` bits of XRC queue pairs (`xrc_odp_caps`).
    pub xrc_odp_caps: u32,
    /// `IBV_RAW_PACKET_CAP_*` offloads of raw packet queue pairs (`raw_packet_caps`).
    pub raw_packet_caps: u32,
    /// Largest TCP segmentation offload, bytes (`tso_caps.max_tso`; 0 without TSO).
    pub max_tso: u32,
    /// Queue pair types with TSO, as a bit mask of `1 << IBV_QPT_*` (`tso_caps.supported_qpts`).
    pub tso_supported_qpts: u32,
    /// Receive-side scaling: maximum indirection tables
    /// (`rss_caps.max_rwq_indirection_tables`).
    pub max_rwq_indirection_tables: u32,
    /// Receive-side scaling: maximum indirection table size
    /// (`rss_caps.max_rwq_indirection_table_size`).
    pub max_rwq_indirection_table_size: u32,
    /// Receive-side scaling: supported hash functions (`rss_caps.rx_hash_function`).
    pub rx_hash_function: u8,
    /// Receive-side scaling: fields the hash may cover (`rss_caps.rx_hash_fields_mask`).
    pub rx_hash_fields_mask: u64,
    /// Queue pair types with receive-side scaling, as a bit mask of `1 << IBV_QPT_*`
    /// (`rss_caps.supported_qpts`).
    pub rss_supported_qpts: u32,
    /// Maximum number of receive work queues (`max_wq_type_rq`).
    pub max_wq_type_rq: u32,
    /// Packet pacing: lowest rate limit, kbit/s (`packet_pacing_caps.qp_rate_limit_min`).
    pub qp_rate_limit_min: u32,
    /// Packet pacing: highest rate limit, kbit/s (0 without packet pacing).
    pub qp_rate_limit_max: u32,
    /// Queue pair types with packet pacing, as a bit mask of `1 << IBV_QPT_*`
    /// (`packet_pacing_caps.supported_qpts`).
    pub packet_pacing_supported_qpts: u32,
    /// Tag matching: largest rendezvous header, bytes (`tm_caps.max_rndv_hdr_size`).
    pub tm_max_rndv_hdr_size: u32,
    /// Tag matching: maximum tags (`tm_caps.max_num_tags`; 0 without tag matching).
    pub tm_max_num_tags: u32,
    /// Tag matching: `IBV_TM_CAP_*` flags (`tm_caps.flags`).
    pub tm_flags: u32,
    /// Tag matching: maximum outstanding list operations (`tm_caps.max_ops`).
    pub tm_max_ops: u32,
    /// Tag matching: maximum scatter/gather entries per tagged receive (`tm_caps.max_sge`).
    pub tm_max_sge: u32,
    /// CQ moderation: largest completion count (`cq_mod_caps.max_cq_count`; 0 without
    /// moderation).
    pub max_cq_moderation_count: u16,
    /// CQ moderation: longest period, microseconds (`cq_mod_caps.max_cq_period`).
    pub max_cq_moderation_period: u16,
}

impl DeviceAttr {
    /// Whether the device supports memory windows of type 1 (`IBV_DEVICE_MEM_WINDOW`).
    pub fn supports_mw_type1(&self) -> bool {
        self.device_cap_flags & ffi::IBV_DEVICE_MEM_WINDOW != 0
    }

    /// Whether the device supports memory windows of type 2
    /// (`IBV_DEVICE_MEM_WINDOW_TYPE_2A` or `_2B`).
    pub fn supports_mw_type2(&self) -> bool {
        self.device_cap_flags
            & (ffi::IBV_DEVICE_MEM_WINDOW_TYPE_2A | ffi::IBV_DEVICE_MEM_WINDOW_TYPE_2B)
            != 0
    }

    /// Whether the device supports RDMA atomic write (`IB_UVERBS_DEVICE_ATOMIC_WRITE` in
    /// `device_cap_flags_ex`): [`SendRequest::atomic_write`](crate::wr::SendRequest::atomic_write).
    /// Soft-RoCE has it from Linux 6.2.
    pub fn supports_atomic_write(&self) -> bool {
        /// `IB_UVERBS_DEVICE_ATOMIC_WRITE` of the kernel's `ib_user_verbs.h`.
        const ATOMIC_WRITE: u64 = 1 << 40;
        self.device_cap_flags_ex & ATOMIC_WRITE != 0
    }

    /// Whether the device is Soft-RoCE (vendor ID 0xffffff), whose provider has bugs the crate
    /// works around (`cq/extended.rs`, `qp/extended.rs`).
    pub(crate) fn is_soft_roce(&self) -> bool {
        self.vendor_id == 0x00ff_ffff
    }

    pub(super) fn from_raw(ex: &ffi::ibv_device_attr_ex) -> Self {
        let a = &ex.orig_attr;
        let count = |v: i32| u32::try_from(v).unwrap_or(0);
        let fw_ver = fixed_c_str(&a.fw_ver);
        Self {
            fw_ver,
            node_guid: u64::from_be(a.node_guid),
            sys_image_guid: u64::from_be(a.sys_image_guid),
            max_mr_size: a.max_mr_size,
            page_size_cap: a.page_size_cap,
            vendor_id: a.vendor_id,
            vendor_part_id: a.vendor_part_id,
            hw_ver: a.hw_ver,
            max_qp: count(a.max_qp),
            max_qp_wr: count(a.max_qp_wr),
            device_cap_flags: a.device_cap_flags,
            device_cap_flags_ex: ex.device_cap_flags_ex,
            max_sge: count(a.max_sge),
            max_sge_rd: count(a.max_sge_rd),
            max_cq: count(a.max_cq),
            max_cqe: count(a.max_cqe),
            max_mr: count(a.max_mr),
            max_pd: count(a.max_pd),
            max_qp_rd_atom: count(a.max_qp_rd_atom),
            max_qp_init_rd_atom: count(a.max_qp_init_rd_atom),
            atomic_cap: AtomicCap::from_raw(a.atomic_cap),
            max_mw: count(a.max_mw),
            max_ah: count(a.max_ah),
            max_srq: count(a.max_srq),
            max_srq_wr: count(a.max_srq_wr),
            max_srq_sge: count(a.max_srq_sge),
            max_pkeys: a.max_pkeys,
            local_ca_ack_delay: a.local_ca_ack_delay,
            phys_port_cnt: a.phys_port_cnt,
            completion_timestamp_mask: ex.completion_timestamp_mask,
            hca_core_clock: ex.hca_core_clock,
            max_dm_size: ex.max_dm_size,
            max_ee_rd_atom: count(a.max_ee_rd_atom),
            max_res_rd_atom: count(a.max_res_rd_atom),
            max_ee_init_rd_atom: count(a.max_ee_init_rd_atom),
            max_ee: count(a.max_ee),
            max_rdd: count(a.max_rdd),
            max_raw_ipv6_qp: count(a.max_raw_ipv6_qp),
            max_raw_ethy_qp: count(a.max_raw_ethy_qp),
            max_mcast_grp: count(a.max_mcast_grp),
            max_mcast_qp_attach: count(a.max_mcast_qp_attach),
            max_total_mcast_qp_attach: count(a.max_total_mcast_qp_attach),
            max_fmr: count(a.max_fmr),
            max_map_per_fmr: count(a.max_map_per_fmr),
            odp_general_caps: ex.odp_caps.general_caps,
            rc_odp_caps: ex.odp_caps.per_transport_caps.rc_odp_caps,
            uc_odp_caps: ex.odp_caps.per_transport_caps.uc_odp_caps,
            ud_odp_caps: ex.odp_caps.per_transport_caps.ud_odp_caps,
            xrc_odp_caps: ex.xrc_odp_caps,
            raw_packet_caps: ex.raw_packet_caps,
            max_tso: ex.tso_caps.max_tso,
            tso_supported_qpts: ex.tso_caps.supported_qpts,
            max_rwq_indirection_tables: ex.rss_caps.max_rwq_indirection_tables,
            max_rwq_indirection_table_size: ex.rss_caps.max_rwq_indirection_table_size,
            rx_hash_function: ex.rss_caps.rx_hash_function,
            rx_hash_fields_mask: ex.rss_caps.rx_hash_fields_mask,
            rss_supported_qpts: ex.rss_caps.supported_qpts,
            max_wq_type_rq: ex.max_wq_type_rq,
            qp_rate_limit_min: ex.packet_pacing_caps.qp_rate_limit_min,
            qp_rate_limit_max: ex.packet_pacing_caps.qp_rate_limit_max,
            packet_pacing_supported_qpts: ex.packet_pacing_caps.supported_qpts,
            tm_max_rndv_hdr_size: ex.tm_caps.max_rndv_hdr_size,
            tm_max_num_tags: ex.tm_caps.max_num_tags,
            tm_flags: ex.tm_caps.flags,
            tm_max_ops: ex.tm_caps.max_ops,
            tm_max_sge: ex.tm_caps.max_sge,
            max_cq_moderation_count: ex.cq_mod_caps.max_cq_count,
            max_cq_moderation_period: ex.cq_mod_caps.max_cq_period,
        }
    }
}

/// Port attributes (`struct ibv_port_attr`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortAttr {
    /// Logical state.
    pub state: PortState,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU in use.
    pub active_mtu: Mtu,
    /// Number of GID table entries.
    pub gid_tbl_len: u32,
    /// `IBV_PORT_*` capability flags.
    pub port_cap_flags: u32,
    /// Largest message, bytes.
    pub max_msg_sz: u32,
    /// Number of partition keys.
    pub pkey_tbl_len: u16,
    /// Base LID (0 on RoCE).
    pub lid: u16,
    /// LID of the subnet manager.
    pub sm_lid: u16,
    /// LID mask control.
    pub lmc: u8,
    /// Maximum virtual lanes.
    pub max_vl_num: u8,
    /// Service level of the subnet manager.
    pub sm_sl: u8,
    /// Subnet propagation delay.
    pub subnet_timeout: u8,
    /// Active link width (encoded as in `ibv_port_attr`).
    pub active_width: u8,
    /// Active link speed (encoded as in `ibv_port_attr`).
    pub active_speed: u8,
    /// Physical state (encoded as in `ibv_port_attr`; 5 is LinkUp).
    pub phys_state: u8,
    /// Link layer: InfiniBand or Ethernet (RoCE).
    pub link_layer: LinkLayer,
    /// `IBV_PORT_*2` capability flags (`port_cap_flags2`).
    pub port_cap_flags2: u16,
    /// Bad partition key counter (`bad_pkey_cntr`).
    pub bad_pkey_cntr: u32,
    /// Q_Key violation counter (`qkey_viol_cntr`).
    pub qkey_viol_cntr: u32,
    /// Type of initialisation the subnet manager requested (`init_type_reply`).
    pub init_type_reply: u8,
}

impl PortAttr {
    pub(super) fn from_raw(a: &ffi::ibv_port_attr) -> Self {
        Self {
            state: PortState::from_raw(a.state),
            max_mtu: Mtu::from_raw(a.max_mtu),
            active_mtu: Mtu::from_raw(a.active_mtu),
            gid_tbl_len: u32::try_from(a.gid_tbl_len).unwrap_or(0),
            port_cap_flags: a.port_cap_flags,
            max_msg_sz: a.max_msg_sz,
            pkey_tbl_len: a.pkey_tbl_len,
            lid: a.lid,
            sm_lid: a.sm_lid,
            lmc: a.lmc,
            max_vl_num: a.max_vl_num,
            sm_sl: a.sm_sl,
            subnet_timeout: a.subnet_timeout,
            active_width: a.active_width,
            active_speed: a.active_speed,
            phys_state: a.phys_state,
            link_layer: LinkLayer::from_raw(a.link_layer),
            port_cap_flags2: a.port_cap_flags2,
            bad_pkey_cntr: a.bad_pkey_cntr,
            qkey_viol_cntr: a.qkey_viol_cntr,
            init_type_reply: a.init_type_reply,
        }
    }

    /// Whether the port runs over Ethernet (RoCE) and so needs GID addressing.
    pub fn is_ethernet(&self) -> bool {
        self.link_layer == LinkLayer::Ethernet
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enums_map_known_and_unknown_values() {
        assert_eq!(Mtu::from_raw(ffi::IBV_MTU_1024), Mtu::Mtu1024);
        assert_eq!(Mtu::Mtu1024.bytes(), Some(1024));
        assert_eq!(Mtu::from_raw(77), Mtu::Unknown(77));
        assert_eq!(Mtu::Unknown(77).as_raw(), 77);
        assert_eq!(PortState::from_raw(ffi::IBV_PORT_ACTIVE), PortState::Active);
        assert_eq!(Mtu::from_bytes(4096), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::from_bytes(1500), None);
    }
}
