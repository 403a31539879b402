//! Devices and device contexts: listing, opening, and querying device, port and GID table.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::ffi;

/// The devices present when [`devices`] was called (`ibv_get_device_list`).
///
/// The list must stay alive while a [`Device`] of it is used; opening a device gives a
/// [`Context`] that does not need the list any more.
pub struct DeviceList {
    raw: NonNull<*mut ffi::ibv_device>,
    devices: Vec<Device>,
}

// SAFETY: the list is an immutable array of device descriptors owned by this value; libibverbs
// allows reading it and opening its devices from any thread.
unsafe impl Send for DeviceList {}
// SAFETY: as above; nothing in it is mutated after creation.
unsafe impl Sync for DeviceList {}

/// `ibv_get_device_list`: lists the RDMA devices of this machine.
///
/// # Errors
///
/// [`Error::Verb`] when libibverbs cannot read the device list (for example `ENOSYS` when the
/// kernel has no RDMA support). An empty list is not an error.
///
/// # References
///
/// [`ibv_get_device_list(3)`](https://man7.org/linux/man-pages/man3/ibv_get_device_list.3.html)
#[doc(alias = "ibv_get_device_list")]
pub fn devices() -> Result<DeviceList> {
    let mut count = 0;
    // SAFETY: `count` is a valid out-pointer; the list is freed in DeviceList's Drop.
    let raw = unsafe { ffi::ibv_get_device_list(&mut count) };
    let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_get_device_list"))?;
    let mut devices = Vec::new();
    for i in 0..usize::try_from(count).unwrap_or(0) {
        // SAFETY: the array holds `count` device pointers.
        let device = unsafe { *raw.as_ptr().add(i) };
        if let Some(device) = NonNull::new(device) {
            devices.push(Device::describe(device));
        }
    }
    Ok(DeviceList { raw, devices })
}

impl DeviceList {
    /// The devices, in libibverbs' order.
    pub fn iter(&self) -> std::slice::Iter<'_, Device> {
        self.devices.iter()
    }

    /// The number of devices.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// Whether there are no devices.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// The device named `name`.
    pub fn find(&self, name: &str) -> Option<&Device> {
        self.devices.iter().find(|d| d.name == name)
    }
}

impl<'a> IntoIterator for &'a DeviceList {
    type Item = &'a Device;
    type IntoIter = std::slice::Iter<'a, Device>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl fmt::Debug for DeviceList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.devices).finish()
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: `raw` came from ibv_get_device_list and is freed once; opened contexts stay
        // valid after the list is freed.
        unsafe { ffi::ibv_free_device_list(self.raw.as_ptr()) };
    }
}

/// One RDMA device of a [`DeviceList`].
pub struct Device {
    raw: NonNull<ffi::ibv_device>,
    name: String,
    guid: u64,
    node_type: NodeType,
    transport: Transport,
}

impl Device {
    fn describe(raw: NonNull<ffi::ibv_device>) -> Self {
        // SAFETY: `raw` is a listed device, alive as long as the list; its fields are plain
        // values and fixed-size arrays.
        unsafe {
            // What `ibv_get_device_name` returns: the device's fixed-size name array, read no
            // further than its end.
            let name = fixed_c_str(&(*raw.as_ptr()).name);
            Self {
                name,
                guid: u64::from_be(ffi::ibv_get_device_guid(raw.as_ptr())),
                node_type: NodeType::from_raw((*raw.as_ptr()).node_type),
                transport: Transport::from_raw((*raw.as_ptr()).transport_type),
                raw,
            }
        }
    }

    /// `ibv_get_device_name`: the device's name, for example `mlx5_0` or `rxe0`.
    ///
    /// # References
    ///
    /// [`ibv_get_device_name(3)`](https://man7.org/linux/man-pages/man3/ibv_get_device_name.3.html)
    #[doc(alias = "ibv_get_device_name")]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ibv_get_device_guid`: the node GUID, in host byte order.
    ///
    /// # References
    ///
    /// [`ibv_get_device_guid(3)`](https://man7.org/linux/man-pages/man3/ibv_get_device_guid.3.html)
    #[doc(alias = "ibv_get_device_guid")]
    pub fn guid(&self) -> u64 {
        self.guid
    }

    /// The node type (channel adapter, RNIC, ...).
    pub fn node_type(&self) -> NodeType {
        self.node_type
    }

    /// The transport (InfiniBand, which RoCE also reports, or iWARP, ...).
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// `ibv_open_device`: opens the device.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with the errno of `ibv_open_device` (for example `EPERM` without access to
    /// `/dev/infiniband`).
    ///
    /// # References
    ///
    /// [`ibv_open_device(3)`](https://man7.org/linux/man-pages/man3/ibv_open_device.3.html)
    #[doc(alias = "ibv_open_device")]
    pub fn open(&self) -> Result<Context> {
        // SAFETY: `raw` is a device of a live list (it borrows `self`).
        let raw = unsafe { ffi::ibv_open_device(self.raw.as_ptr()) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_open_device"))?;
        Ok(Context(Arc::new(ContextInner {
            raw,
            owner: Owner::Owned,
        })))
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name)
            .field("guid", &format_args!("{:016x}", self.guid))
            .field("node_type", &self.node_type)
            .field("transport", &self.transport)
            .finish()
    }
}

/// Declares an integer-backed enum with an `Unknown` arm, and its conversions.
macro_rules! c_enum {
    (
        $(#[$meta:meta])*
        $name:ident: $raw:ty {
            $( $(#[$vmeta:meta])* $variant:ident = $value:path, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )*
            /// A value this crate does not know (from a newer rdma-core or kernel).
            Unknown($raw),
        }

        impl $name {
            /// Converts the C value.
            pub fn from_raw(raw: $raw) -> Self {
                #[allow(non_upper_case_globals)] // matching on the C constants by name
                match raw {
                    $( x if x == $value as $raw => Self::$variant, )*
                    other => Self::Unknown(other),
                }
            }

            /// The C value.
            pub fn as_raw(self) -> $raw {
                match self {
                    $( Self::$variant => $value as $raw, )*
                    Self::Unknown(raw) => raw,
                }
            }
        }
    };
}
pub(crate) use c_enum;

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
    Transport: i32 {
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

/// A 128-bit global identifier, in network byte order.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// Whether the GID is all zeroes.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`, RoCE).
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        Ipv6Addr::from(self.0).to_ipv4_mapped()
    }

    /// The GID's interface identifier: its lower 64 bits, in host order. pingpong-style
    /// programs use a GRH only when it is non-zero.
    pub fn interface_id(&self) -> u64 {
        let mut bytes = [0; 8];
        bytes.copy_from_slice(&self.0[8..]);
        u64::from_be_bytes(bytes)
    }

    pub(crate) fn from_raw(raw: &ffi::ibv_gid) -> Self {
        // SAFETY: `raw` is the byte view of the union; every bit pattern is valid.
        Self(unsafe { raw.raw })
    }

    pub(crate) fn to_raw(self) -> ffi::ibv_gid {
        ffi::ibv_gid { raw: self.0 }
    }
}

impl From<Ipv6Addr> for Gid {
    fn from(addr: Ipv6Addr) -> Self {
        Self(addr.octets())
    }
}

impl From<Gid> for Ipv6Addr {
    fn from(gid: Gid) -> Self {
        Ipv6Addr::from(gid.0)
    }
}

impl fmt::Display for Gid {
    /// Formats as an IPv6 address, as `ibv_devinfo` does.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&Ipv6Addr::from(self.0), f)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// One entry of a port's GID table (`struct ibv_gid_entry`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// The GID.
    pub gid: Gid,
    /// Its index in the port's table.
    pub index: u32,
    /// The port.
    pub port: u32,
    /// Its type.
    pub gid_type: GidType,
    /// The interface index of the network device behind it (RoCE), or 0.
    pub netdev_index: u32,
}

impl GidEntry {
    fn from_raw(raw: &ffi::ibv_gid_entry) -> Self {
        Self {
            gid: Gid::from_raw(&raw.gid),
            index: raw.gid_index,
            port: raw.port_num,
            gid_type: GidType::from_raw(raw.gid_type),
            netdev_index: raw.ndev_ifindex,
        }
    }

    /// The name of the network device behind the GID (RoCE), for example `eth0`.
    pub fn netdev(&self) -> Option<String> {
        if self.netdev_index == 0 {
            return None;
        }
        let mut name = [0 as libc::c_char; libc::IF_NAMESIZE];
        // SAFETY: `name` has the IF_NAMESIZE bytes if_indextoname writes at most.
        let ret = unsafe { libc::if_indextoname(self.netdev_index, name.as_mut_ptr()) };
        if ret.is_null() {
            return None;
        }
        Some(fixed_c_str(&name))
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

    fn from_raw(ex: &ffi::ibv_device_attr_ex) -> Self {
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
    fn from_raw(a: &ffi::ibv_port_attr) -> Self {
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

/// What keeps the `ibv_context` of a [`Context`] open.
enum Owner {
    /// Opened by [`Device::open`]; closed on drop.
    Owned,
    /// Borrowed (for example from an `rdma_cm_id`); `_keep` keeps its real owner alive and the
    /// context is not closed here.
    Borrowed { _keep: Arc<dyn Send + Sync> },
}

pub(crate) struct ContextInner {
    raw: NonNull<ffi::ibv_context>,
    owner: Owner,
}

// SAFETY: libibverbs contexts are thread-safe: every verb on them may be called from any thread
// (the provider locks what it shares), and the pointer is only freed on drop.
unsafe impl Send for ContextInner {}
// SAFETY: as above.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        if let Owner::Owned = self.owner {
            // SAFETY: every child object holds an Arc to this context, so none is left; the
            // context is closed once.
            let ret = unsafe { ffi::ibv_close_device(self.raw.as_ptr()) };
            // Drop cannot report a failure and must not panic (see "Resource cleanup" in the
            // crate documentation).
            let _ = ret;
        }
    }
}

/// An open device context (`struct ibv_context`).
///
/// Cloning is cheap (a reference count); the device is closed when the last clone and the last
/// object created from it are gone. `Context` is `Send` and `Sync`: libibverbs allows its verbs
/// from any thread.
#[derive(Clone)]
pub struct Context(pub(crate) Arc<ContextInner>);

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.device_name())
            .finish()
    }
}

impl Context {
    /// Opens the device named `name`.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchDevice`] if no device has that name, else as [`devices`] and
    /// [`Device::open`].
    pub fn open(name: &str) -> Result<Self> {
        let list = devices()?;
        let device = list
            .find(name)
            .ok_or_else(|| Error::NoSuchDevice(name.to_string()))?;
        device.open()
    }

    /// Wraps a context this crate did not open, without taking over its closing.
    ///
    /// The context's descriptors stay the owner's, with one exception the owner must accept:
    /// [`get_async_event`](Self::get_async_event), [`wait_async_event`](Self::wait_async_event)
    /// and `AsyncContextEvents::new` (feature `tokio`) set `O_NONBLOCK` on its asynchronous
    /// event descriptor (`async_fd`) and leave it set, since a read that may block cannot be
    /// made safe otherwise. The crate changes no other flag of a borrowed context, and its
    /// completion channels are its own.
    ///
    /// # Safety
    ///
    /// `raw` must be an open `ibv_context` that stays open for as long as `keep` (or any clone
    /// of it) is alive; `keep` is held by the returned context and everything created from it.
    pub unsafe fn from_raw_borrowed(
        raw: NonNull<ffi::ibv_context>,
        keep: Arc<dyn Send + Sync>,
    ) -> Self {
        Self(Arc::new(ContextInner {
            raw,
            owner: Owner::Borrowed { _keep: keep },
        }))
    }

    /// The raw `ibv_context`, valid while this context (or a clone) is alive.
    pub fn as_raw(&self) -> *mut ffi::ibv_context {
        self.0.raw.as_ptr()
    }

    /// `ibv_get_device_name` of the context's device: its name.
    ///
    /// # References
    ///
    /// [`ibv_get_device_name(3)`](https://man7.org/linux/man-pages/man3/ibv_get_device_name.3.html)
    #[doc(alias = "ibv_get_device_name")]
    pub fn device_name(&self) -> String {
        // SAFETY: a live context points at its device, which lives as long as it.
        unsafe {
            let device = (*self.as_raw()).device;
            if device.is_null() {
                return String::new();
            }
            // What `ibv_get_device_name` returns, read no further than the array's end.
            fixed_c_str(&(*device).name)
        }
    }

    /// The number of completion vectors of the device (`num_comp_vectors`): the vectors a
    /// completion queue may be assigned to.
    pub fn num_comp_vectors(&self) -> u32 {
        // SAFETY: a live context; `num_comp_vectors` is a plain integer set when it was opened
        // and never changed afterwards.
        let n = unsafe { (*self.as_raw()).num_comp_vectors };
        u32::try_from(n).unwrap_or(0)
    }

    /// `ibv_query_device_ex`: the device's attributes (the classic ones, plus the extended
    /// ones where the provider has them).
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with the errno of the query.
    ///
    /// # References
    ///
    /// [`ibv_query_device(3)`](https://man7.org/linux/man-pages/man3/ibv_query_device.3.html)
    /// [`ibv_query_device_ex(3)`](https://man7.org/linux/man-pages/man3/ibv_query_device_ex.3.html)
    #[doc(alias = "ibv_query_device")]
    #[doc(alias = "ibv_query_device_ex")]
    pub fn query_device(&self) -> Result<DeviceAttr> {
        let mut attr = ffi::ibv_device_attr_ex::default();
        // SAFETY: live context; null input is allowed; `attr` is writable. The port falls back
        // to the classic query where the provider lacks the extended one.
        let ret = unsafe { ffi::ibv_query_device_ex(self.as_raw(), std::ptr::null(), &mut attr) };
        Error::check("ibv_query_device_ex", ret)?;
        Ok(DeviceAttr::from_raw(&attr))
    }

    /// `ibv_query_port`: the attributes of port `port` (1-based).
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] (`EINVAL` for a port the device does not have).
    ///
    /// # References
    ///
    /// [`ibv_query_port(3)`](https://man7.org/linux/man-pages/man3/ibv_query_port.3.html)
    #[doc(alias = "ibv_query_port")]
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        let mut attr = ffi::ibv_port_attr::default();
        // SAFETY: live context; `attr` is writable.
        let ret = unsafe { ffi::ibv_query_port(self.as_raw(), port, &mut attr) };
        Error::check("ibv_query_port", ret)?;
        Ok(PortAttr::from_raw(&attr))
    }

    /// `ibv_query_gid_ex`: GID table entry `index` of port `port`, with its type.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`]: `ENODATA` for an empty entry, `EINVAL` for an index out of range.
    ///
    /// # References
    ///
    /// [`ibv_query_gid(3)`](https://man7.org/linux/man-pages/man3/ibv_query_gid.3.html)
    /// [`ibv_query_gid_ex(3)`](https://man7.org/linux/man-pages/man3/ibv_query_gid_ex.3.html)
    #[doc(alias = "ibv_query_gid")]
    #[doc(alias = "ibv_query_gid_ex")]
    pub fn query_gid(&self, port: u8, index: u32) -> Result<GidEntry> {
        let mut entry = ffi::ibv_gid_entry::default();
        // SAFETY: live context; `entry` is writable and its size is passed by the port.
        let ret =
            unsafe { ffi::ibv_query_gid_ex(self.as_raw(), u32::from(port), index, &mut entry, 0) };
        Error::check("ibv_query_gid_ex", ret)?;
        Ok(GidEntry::from_raw(&entry))
    }

    /// `ibv_query_gid_table`: the valid entries of every port's GID table.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with the errno of the query.
    ///
    /// # References
    ///
    /// [`ibv_query_gid_table(3)`](https://man7.org/linux/man-pages/man3/ibv_query_gid_table.3.html)
    #[doc(alias = "ibv_query_gid_table")]
    pub fn gid_table(&self) -> Result<Vec<GidEntry>> {
        let attr = self.query_device()?;
        let mut total = 0usize;
        for port in 1..=attr.phys_port_cnt {
            // Sizes from the provider: added without overflowing.
            total = total.saturating_add(self.query_port(port)?.gid_tbl_len as usize);
        }
        let mut entries = vec![ffi::ibv_gid_entry::default(); total.max(1)];
        // SAFETY: live context; `entries` has room for `entries.len()` entries.
        let n = unsafe {
            ffi::ibv_query_gid_table(self.as_raw(), entries.as_mut_ptr(), entries.len(), 0)
        };
        let n = usize::try_from(n).map_err(|_| {
            Error::verb(
                "ibv_query_gid_table",
                crate::Errno::from_raw(
                    n.checked_neg()
                        .and_then(|e| i32::try_from(e).ok())
                        .unwrap_or(libc::EINVAL),
                ),
            )
        })?;
        Ok(entries[..n.min(entries.len())]
            .iter()
            .map(GidEntry::from_raw)
            .collect())
    }

    /// The GID a connection on `port` should use by default: on Ethernet (RoCE) the first
    /// IPv4-mapped RoCE v2 GID, else the first IPv4-mapped RoCE v1 GID, else the first RoCE v2
    /// GID; on InfiniBand GID 0.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the port has no usable GID, else as [`Self::query_port`].
    pub fn routable_gid(&self, port: u8) -> Result<GidEntry> {
        let port_attr = self.query_port(port)?;
        if !port_attr.is_ethernet() {
            return self.query_gid(port, 0);
        }
        let entries: Vec<GidEntry> = self
            .gid_table()?
            .into_iter()
            .filter(|e| e.port == u32::from(port) && !e.gid.is_zero())
            .collect();
        let rank = |e: &GidEntry| match (e.gid.ipv4().is_some(), e.gid_type) {
            (true, GidType::RoceV2) => 0,
            (true, _) => 1,
            (false, GidType::RoceV2) => 2,
            _ => 3,
        };
        entries
            .into_iter()
            .min_by_key(|e| (rank(e), e.index))
            .ok_or_else(|| Error::InvalidArgument(format!("port {port} has no usable GID")))
    }
}

impl AsFd for Context {
    /// The context's asynchronous event file descriptor (`async_fd`), readable when
    /// [`Context::get_async_event`] has an event.
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: `async_fd` is open for the life of the context, which `self` borrows.
        unsafe { BorrowedFd::borrow_raw((*self.as_raw()).async_fd) }
    }
}

/// The text of a fixed-size C character array from a provider or the kernel: up to its first
/// NUL, or the whole array if it has none (never read past its end); bytes that are not UTF-8
/// become U+FFFD.
pub(crate) fn fixed_c_str(chars: &[libc::c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
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

    #[test]
    fn gids_format_like_ibv_devinfo() {
        let gid = Gid::from("::ffff:169.254.7.1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(gid.to_string(), "::ffff:169.254.7.1");
        assert_eq!(gid.ipv4(), Some(Ipv4Addr::new(169, 254, 7, 1)));
        assert_ne!(gid.interface_id(), 0);
        assert!(Gid::default().is_zero());
    }

    #[test]
    fn provider_strings_are_read_within_their_array() {
        /// A name array without a NUL, followed by more text in the same structure: a read
        /// that looks for the NUL instead of stopping at the array's end would take it too.
        #[repr(C)]
        struct Unterminated {
            name: [libc::c_char; 4],
            after: [libc::c_char; 4],
        }
        let c = |b: &[u8; 4]| b.map(|x| x as libc::c_char);
        let raw = Unterminated {
            name: c(b"rxe0"),
            after: c(b"XYZ\0"),
        };
        assert_eq!(fixed_c_str(&raw.name), "rxe0");
        assert_eq!(raw.after[3], 0);
        assert_eq!(fixed_c_str(&c(b"ab\0d")), "ab");
        assert_eq!(fixed_c_str(&c(b"\0\0\0\0")), "");
        assert_eq!(fixed_c_str(&c(b"a\xffb\0")), "a\u{fffd}b");
    }
}
