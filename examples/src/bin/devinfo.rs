//! `devinfo`: rdma-core's `ibv_devinfo` with rdma-verbs. Same options and the same
//! tab-aligned report, so the two can be compared line by line.
//!
//! `devinfo` prints every device and port; `-d rxe0 -i 1` narrows it, `-v` adds the device
//! limits, capability flags and GID tables, `-l` only lists the device names.

#![forbid(unsafe_code)] // the examples show the safe API: no `unsafe` anywhere

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::Ipv6Addr;

use clap::Parser;
use rdma_examples::pingpong::fail;
use rdma_verbs::ffi;
use rdma_verbs::{
    Context, Device,
    device::{
        AtomicCap, DeviceAttr, DeviceTransport, Gid, GidEntry, GidType, LinkLayer, Mtu, PortAttr,
        PortState,
    },
};

const PROGRAM: &str = "devinfo";

/// Print the attributes of RDMA devices (rdma-core's ibv_devinfo).
#[derive(Parser, Debug)]
#[command(name = PROGRAM)]
struct Options {
    /// Use this IB device (default: all devices).
    #[arg(short = 'd', long = "ib-dev", value_name = "dev")]
    ib_dev: Option<String>,
    /// Use this port of the IB device (default: all ports).
    #[arg(short = 'i', long = "ib-port", value_name = "port",
          value_parser = clap::value_parser!(u8).range(1..))]
    ib_port: Option<u8>,
    /// Print only the IB devices' names.
    #[arg(short = 'l', long = "list")]
    list: bool,
    /// Print all the attributes of the IB device(s).
    #[arg(short = 'v', long = "verbose")]
    verbose: bool,
}

/// Appends one formatted line to a `String` (which cannot fail).
macro_rules! put {
    ($out:expr, $($arg:tt)*) => {{
        let _ = writeln!($out, $($arg)*);
    }};
}

fn main() {
    let options = Options::parse();
    let devices = rdma_verbs::devices()
        .unwrap_or_else(|e| fail(PROGRAM, format!("Failed to get IB devices list: {e}")));

    if options.list {
        let mut out = String::new();
        let n = devices.len();
        put!(out, "{n} HCA{} found:", if n == 1 { "" } else { "s" });
        for device in &devices {
            put!(out, "\t{}", device.name());
        }
        put!(out, "");
        emit(&out);
        return;
    }

    let chosen: Vec<&Device> = match &options.ib_dev {
        Some(name) => vec![
            devices
                .find(name)
                .unwrap_or_else(|| fail(PROGRAM, format!("IB device '{name}' wasn't found"))),
        ],
        None if devices.is_empty() => fail(PROGRAM, "No IB devices found"),
        None => devices.iter().collect(),
    };

    // As the C program: a device that fails is reported and the others are still printed.
    let mut failed = false;
    for device in chosen {
        let mut out = String::new();
        let result = describe(device, &options, &mut out);
        emit(&out);
        if let Err(message) = result {
            eprintln!("{PROGRAM}: {message}");
            failed = true;
        }
    }
    if failed {
        std::process::exit(1);
    }
}

/// Writes `text` to stdout; a reader that went away ends the program.
fn emit(text: &str) {
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        drop(stdout);
        fail(PROGRAM, format!("cannot write to stdout: {e}"));
    }
}

/// Appends the report of one device to `out`; on failure `out` keeps what was gathered.
fn describe(device: &Device, options: &Options, out: &mut String) -> Result<(), String> {
    let context = device
        .open()
        .map_err(|e| format!("Failed to open device {}: {e}", device.name()))?;
    let attr = context
        .query_device()
        .map_err(|e| format!("Failed to query device props: {e}"))?;
    if options.ib_port.is_some_and(|p| p > attr.phys_port_cnt) {
        return Err("Invalid port requested for device".into());
    }

    let transport = device.transport();
    put!(out, "hca_id:\t{}", device.name());
    put!(
        out,
        "\ttransport:\t\t\t{} ({})",
        transport_str(transport),
        transport.as_raw()
    );
    if !attr.fw_ver.is_empty() {
        put!(out, "\tfw_ver:\t\t\t\t{}", attr.fw_ver);
    }
    put!(out, "\tnode_guid:\t\t\t{}", guid_str(attr.node_guid));
    put!(
        out,
        "\tsys_image_guid:\t\t\t{}",
        guid_str(attr.sys_image_guid)
    );
    put!(out, "\tvendor_id:\t\t\t0x{:04x}", attr.vendor_id);
    put!(out, "\tvendor_part_id:\t\t\t{}", attr.vendor_part_id);
    put!(out, "\thw_ver:\t\t\t\t0x{:X}", attr.hw_ver);
    if let Some(board_id) = board_id(device) {
        put!(out, "\tboard_id:\t\t\t{board_id}");
    }
    put!(out, "\tphys_port_cnt:\t\t\t{}", attr.phys_port_cnt);
    if options.verbose {
        describe_limits(&attr, &context, out);
    }

    for port in 1..=attr.phys_port_cnt {
        if options.ib_port.is_some_and(|p| p != port) {
            continue;
        }
        let port_attr = context
            .query_port(port)
            .map_err(|e| format!("Failed to query port {port} props: {e}"))?;
        describe_port(&context, transport, port, &port_attr, options.verbose, out)?;
        put!(out, "");
    }
    Ok(())
}

/// The `-v` part of the device section: limits, capability flags, extended capabilities.
fn describe_limits(a: &DeviceAttr, context: &Context, out: &mut String) {
    put!(out, "\tmax_mr_size:\t\t\t0x{:x}", a.max_mr_size);
    put!(out, "\tpage_size_cap:\t\t\t0x{:x}", a.page_size_cap);
    put!(out, "\tmax_qp:\t\t\t\t{}", a.max_qp);
    put!(out, "\tmax_qp_wr:\t\t\t{}", a.max_qp_wr);
    put!(out, "\tdevice_cap_flags:\t\t0x{:08x}", a.device_cap_flags);
    flag_lines(
        out,
        u64::from(a.device_cap_flags),
        DEVICE_CAP_FLAGS,
        u64::from(u32::MAX),
    );
    put!(out, "\tmax_sge:\t\t\t{}", a.max_sge);
    put!(out, "\tmax_sge_rd:\t\t\t{}", a.max_sge_rd);
    put!(out, "\tmax_cq:\t\t\t\t{}", a.max_cq);
    put!(out, "\tmax_cqe:\t\t\t{}", a.max_cqe);
    put!(out, "\tmax_mr:\t\t\t\t{}", a.max_mr);
    put!(out, "\tmax_pd:\t\t\t\t{}", a.max_pd);
    put!(out, "\tmax_qp_rd_atom:\t\t\t{}", a.max_qp_rd_atom);
    put!(out, "\tmax_ee_rd_atom:\t\t\t{}", a.max_ee_rd_atom);
    put!(out, "\tmax_res_rd_atom:\t\t{}", a.max_res_rd_atom);
    put!(out, "\tmax_qp_init_rd_atom:\t\t{}", a.max_qp_init_rd_atom);
    put!(out, "\tmax_ee_init_rd_atom:\t\t{}", a.max_ee_init_rd_atom);
    put!(
        out,
        "\tatomic_cap:\t\t\t{} ({})",
        atomic_cap_str(a.atomic_cap),
        a.atomic_cap.as_raw()
    );
    put!(out, "\tmax_ee:\t\t\t\t{}", a.max_ee);
    put!(out, "\tmax_rdd:\t\t\t{}", a.max_rdd);
    put!(out, "\tmax_mw:\t\t\t\t{}", a.max_mw);
    put!(out, "\tmax_raw_ipv6_qp:\t\t{}", a.max_raw_ipv6_qp);
    put!(out, "\tmax_raw_ethy_qp:\t\t{}", a.max_raw_ethy_qp);
    put!(out, "\tmax_mcast_grp:\t\t\t{}", a.max_mcast_grp);
    put!(out, "\tmax_mcast_qp_attach:\t\t{}", a.max_mcast_qp_attach);
    put!(
        out,
        "\tmax_total_mcast_qp_attach:\t{}",
        a.max_total_mcast_qp_attach
    );
    put!(out, "\tmax_ah:\t\t\t\t{}", a.max_ah);
    put!(out, "\tmax_fmr:\t\t\t{}", a.max_fmr);
    if a.max_fmr != 0 {
        put!(out, "\tmax_map_per_fmr:\t\t{}", a.max_map_per_fmr);
    }
    put!(out, "\tmax_srq:\t\t\t{}", a.max_srq);
    if a.max_srq != 0 {
        put!(out, "\tmax_srq_wr:\t\t\t{}", a.max_srq_wr);
        put!(out, "\tmax_srq_sge:\t\t\t{}", a.max_srq_sge);
    }
    put!(out, "\tmax_pkeys:\t\t\t{}", a.max_pkeys);
    put!(out, "\tlocal_ca_ack_delay:\t\t{}", a.local_ca_ack_delay);

    put!(out, "\tgeneral_odp_caps:");
    flag_lines(out, a.odp_general_caps, ODP_GENERAL_CAPS, u64::MAX);
    for (name, caps) in [
        ("rc", a.rc_odp_caps),
        ("uc", a.uc_odp_caps),
        ("ud", a.ud_odp_caps),
        ("xrc", a.xrc_odp_caps),
    ] {
        put!(out, "\t{name}_odp_caps:");
        if caps == 0 {
            put!(out, "\t\t\t\t\tNO SUPPORT");
        } else {
            flag_lines(
                out,
                u64::from(caps),
                ODP_TRANSPORT_CAPS,
                u64::from(u32::MAX),
            );
        }
    }

    if a.completion_timestamp_mask != 0 {
        put!(
            out,
            "\tcompletion timestamp_mask:\t\t\t0x{:016x}",
            a.completion_timestamp_mask
        );
    } else {
        put!(out, "\tcompletion_timestamp_mask not supported");
    }
    if a.hca_core_clock != 0 {
        put!(out, "\thca_core_clock:\t\t\t{}kHZ", a.hca_core_clock);
    } else {
        put!(out, "\tcore clock not supported");
    }
    if a.raw_packet_caps != 0 {
        put!(out, "\traw packet caps:");
        for &(bit, name) in RAW_PACKET_CAPS {
            if u64::from(a.raw_packet_caps) & bit != 0 {
                put!(out, "\t\t\t\t\t{name}");
            }
        }
    }

    put!(
        out,
        "\tdevice_cap_flags_ex:\t\t0x{:X}",
        a.device_cap_flags_ex
    );
    // The low half repeats `device_cap_flags`; only the extended bits are named here.
    flag_lines(
        out,
        a.device_cap_flags_ex & !u64::from(u32::MAX),
        DEVICE_CAP_FLAGS_EX,
        u64::MAX,
    );

    put!(out, "\ttso_caps:");
    put!(out, "\t\tmax_tso:\t\t\t{}", a.max_tso);
    if a.max_tso != 0 {
        supported_qp_lines(out, a.tso_supported_qpts);
    }
    put!(out, "\trss_caps:");
    put!(
        out,
        "\t\tmax_rwq_indirection_tables:\t\t\t{}",
        a.max_rwq_indirection_tables
    );
    put!(
        out,
        "\t\tmax_rwq_indirection_table_size:\t\t\t{}",
        a.max_rwq_indirection_table_size
    );
    put!(
        out,
        "\t\trx_hash_function:\t\t\t\t0x{:x}",
        a.rx_hash_function
    );
    put!(
        out,
        "\t\trx_hash_fields_mask:\t\t\t\t0x{:X}",
        a.rx_hash_fields_mask
    );
    if a.rss_supported_qpts != 0 {
        supported_qp_lines(out, a.rss_supported_qpts);
    }
    put!(out, "\tmax_wq_type_rq:\t\t\t{}", a.max_wq_type_rq);
    put!(out, "\tpacket_pacing_caps:");
    put!(out, "\t\tqp_rate_limit_min:\t{}kbps", a.qp_rate_limit_min);
    put!(out, "\t\tqp_rate_limit_max:\t{}kbps", a.qp_rate_limit_max);
    if a.qp_rate_limit_max != 0 {
        supported_qp_lines(out, a.packet_pacing_supported_qpts);
    }
    if a.tm_max_num_tags != 0 {
        put!(out, "\tmax_rndv_hdr_size:\t\t{}", a.tm_max_rndv_hdr_size);
        put!(out, "\tmax_num_tags:\t\t\t{}", a.tm_max_num_tags);
        put!(out, "\tmax_ops:\t\t\t{}", a.tm_max_ops);
        put!(out, "\tmax_sge:\t\t\t{}", a.tm_max_sge);
        put!(out, "\tflags:");
        if u64::from(a.tm_flags) & u64::from(ffi::IBV_TM_CAP_RC) != 0 {
            put!(out, "\t\t\t\t\tIBV_TM_CAP_RC");
        }
    } else {
        put!(out, "\ttag matching not supported");
    }
    if a.max_cq_moderation_count != 0 && a.max_cq_moderation_period != 0 {
        put!(out, "\n\tcq moderation caps:");
        put!(out, "\t\tmax_cq_count:\t{}", a.max_cq_moderation_count);
        put!(
            out,
            "\t\tmax_cq_period:\t{} us\n",
            a.max_cq_moderation_period
        );
    }
    if a.max_dm_size != 0 {
        put!(
            out,
            "\tmaximum available device memory:\t{}Bytes\n",
            a.max_dm_size
        );
    }
    put!(out, "\tnum_comp_vectors:\t\t{}", context.num_comp_vectors());
}

/// One port's section.
fn describe_port(
    context: &Context,
    transport: DeviceTransport,
    port: u8,
    p: &PortAttr,
    verbose: bool,
    out: &mut String,
) -> Result<(), String> {
    put!(out, "\t\tport:\t{port}");
    put!(
        out,
        "\t\t\tstate:\t\t\t{} ({})",
        port_state_str(p.state),
        p.state.as_raw()
    );
    put!(
        out,
        "\t\t\tmax_mtu:\t\t{} ({})",
        mtu_str(p.max_mtu),
        p.max_mtu.as_raw()
    );
    put!(
        out,
        "\t\t\tactive_mtu:\t\t{} ({})",
        mtu_str(p.active_mtu),
        p.active_mtu.as_raw()
    );
    put!(out, "\t\t\tsm_lid:\t\t\t{}", p.sm_lid);
    put!(out, "\t\t\tport_lid:\t\t{}", p.lid);
    put!(out, "\t\t\tport_lmc:\t\t0x{:02x}", p.lmc);
    put!(out, "\t\t\tlink_layer:\t\t{}", link_layer_str(p.link_layer));
    if !verbose {
        return Ok(());
    }
    put!(out, "\t\t\tmax_msg_sz:\t\t0x{:x}", p.max_msg_sz);
    put!(out, "\t\t\tport_cap_flags:\t\t0x{:08x}", p.port_cap_flags);
    put!(out, "\t\t\tport_cap_flags2:\t0x{:04x}", p.port_cap_flags2);
    put!(
        out,
        "\t\t\tmax_vl_num:\t\t{} ({})",
        vl_str(p.max_vl_num),
        p.max_vl_num
    );
    put!(out, "\t\t\tbad_pkey_cntr:\t\t0x{:x}", p.bad_pkey_cntr);
    put!(out, "\t\t\tqkey_viol_cntr:\t\t0x{:x}", p.qkey_viol_cntr);
    put!(out, "\t\t\tsm_sl:\t\t\t{}", p.sm_sl);
    put!(out, "\t\t\tpkey_tbl_len:\t\t{}", p.pkey_tbl_len);
    put!(out, "\t\t\tgid_tbl_len:\t\t{}", p.gid_tbl_len);
    put!(out, "\t\t\tsubnet_timeout:\t\t{}", p.subnet_timeout);
    put!(out, "\t\t\tinit_type_reply:\t{}", p.init_type_reply);
    put!(
        out,
        "\t\t\tactive_width:\t\t{}X ({})",
        width_str(p.active_width),
        p.active_width
    );
    put!(
        out,
        "\t\t\tactive_speed:\t\t{} ({})",
        speed_str(p.active_speed),
        p.active_speed
    );
    if transport == DeviceTransport::Ib {
        put!(
            out,
            "\t\t\tphys_state:\t\t{} ({})",
            phys_state_str(p.phys_state),
            p.phys_state
        );
    }

    let mut gids: Vec<GidEntry> = context
        .gid_table()
        .map_err(|e| format!("Failed to query the GID table of port {port}: {e}"))?
        .into_iter()
        .filter(|e| e.port == u32::from(port))
        .collect();
    gids.sort_by_key(|e| e.index);
    let ethernet = p.link_layer == LinkLayer::Ethernet;
    for entry in gids {
        // Like ibv_devinfo: an entry whose interface identifier is zero is empty.
        if entry.gid.0[8..] == [0; 8] {
            continue;
        }
        let (text, kind) = match entry.gid_type {
            GidType::Ib | GidType::RoceV1 => (gid_hex(&entry.gid), "RoCE v1"),
            GidType::RoceV2 => (gid_ntop(&entry.gid), "RoCE v2"),
            // ibv_devinfo prints nothing for a GID type it does not know.
            _ => continue,
        };
        let suffix = if ethernet {
            format!(", {kind}")
        } else {
            String::new()
        };
        put!(out, "\t\t\tGID[{:3}]:\t\t{text}{suffix}", entry.index);
    }
    Ok(())
}

/// The board ID from sysfs, where the driver has one.
fn board_id(device: &Device) -> Option<String> {
    let path = format!("/sys/class/infiniband/{}/board_id", device.name());
    let text = std::fs::read_to_string(path).ok()?;
    let text = text.trim_end_matches('\n');
    (!text.is_empty()).then(|| text.to_string())
}

/// A GUID as four groups of four hex digits.
fn guid_str(guid: u64) -> String {
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        (guid >> 48) & 0xffff,
        (guid >> 32) & 0xffff,
        (guid >> 16) & 0xffff,
        guid & 0xffff
    )
}

/// An InfiniBand or RoCE v1 GID: eight groups of four hex digits, nothing compressed.
fn gid_hex(gid: &Gid) -> String {
    gid.0
        .chunks(2)
        .map(|pair| format!("{:02x}{:02x}", pair[0], pair[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// A RoCE v2 GID as glibc's `inet_ntop` writes it: like Rust's IPv6 formatting, except that
/// an IPv4-compatible address (`::a.b.c.d`) keeps its dotted tail.
fn gid_ntop(gid: &Gid) -> String {
    let b = gid.0;
    if b[..12] == [0; 12] && b[12..14] != [0; 2] {
        return format!("::{}.{}.{}.{}", b[12], b[13], b[14], b[15]);
    }
    Ipv6Addr::from(b).to_string()
}

/// Prints a line per known bit of `value` (`table` order), then the unknown bits of `mask`.
fn flag_lines(out: &mut String, value: u64, table: &[(u64, &str)], mask: u64) {
    let mut known = 0;
    for &(bit, name) in table {
        known |= bit;
        if value & bit != 0 {
            put!(out, "\t\t\t\t\t{name}");
        }
    }
    let unknown = value & !known & mask;
    if unknown != 0 {
        put!(out, "\t\t\t\t\tUnknown flags: 0x{unknown:X}");
    }
}

/// The `supported_qp` block of the TSO, RSS and packet pacing capabilities.
fn supported_qp_lines(out: &mut String, qpts: u32) {
    put!(out, "\t\tsupported_qp:");
    let qpts = u64::from(qpts);
    let raw_packet = 1u64 << ffi::IBV_QPT_RAW_PACKET;
    let ud = 1u64 << ffi::IBV_QPT_UD;
    if qpts & raw_packet != 0 {
        put!(out, "\t\t\t\t\tSUPPORT_RAW_PACKET");
    }
    if qpts & ud != 0 {
        put!(out, "\t\t\t\t\tSUPPORT_UD");
    }
    if qpts & !(raw_packet | ud) != 0 {
        put!(
            out,
            "\t\t\t\t\tUnknown flags: 0x{:X}",
            qpts & !(raw_packet | ud)
        );
    }
}

/// Names of `IBV_DEVICE_*` capability bits, in the order ibv_devinfo prints them.
const DEVICE_CAP_FLAGS: &[(u64, &str)] = &[
    (ffi::IBV_DEVICE_RESIZE_MAX_WR as u64, "RESIZE_MAX_WR"),
    (ffi::IBV_DEVICE_BAD_PKEY_CNTR as u64, "BAD_PKEY_CNTR"),
    (ffi::IBV_DEVICE_BAD_QKEY_CNTR as u64, "BAD_QKEY_CNTR"),
    (ffi::IBV_DEVICE_RAW_MULTI as u64, "RAW_MULTI"),
    (ffi::IBV_DEVICE_AUTO_PATH_MIG as u64, "AUTO_PATH_MIG"),
    (ffi::IBV_DEVICE_CHANGE_PHY_PORT as u64, "CHANGE_PHY_PORT"),
    (
        ffi::IBV_DEVICE_UD_AV_PORT_ENFORCE as u64,
        "UD_AV_PORT_ENFORCE",
    ),
    (
        ffi::IBV_DEVICE_CURR_QP_STATE_MOD as u64,
        "CURR_QP_STATE_MOD",
    ),
    (ffi::IBV_DEVICE_SHUTDOWN_PORT as u64, "SHUTDOWN_PORT"),
    (ffi::IBV_DEVICE_INIT_TYPE as u64, "INIT_TYPE"),
    (
        ffi::IBV_DEVICE_PORT_ACTIVE_EVENT as u64,
        "PORT_ACTIVE_EVENT",
    ),
    (ffi::IBV_DEVICE_SYS_IMAGE_GUID as u64, "SYS_IMAGE_GUID"),
    (ffi::IBV_DEVICE_RC_RNR_NAK_GEN as u64, "RC_RNR_NAK_GEN"),
    (ffi::IBV_DEVICE_SRQ_RESIZE as u64, "SRQ_RESIZE"),
    (ffi::IBV_DEVICE_N_NOTIFY_CQ as u64, "N_NOTIFY_CQ"),
    (ffi::IBV_DEVICE_MEM_WINDOW as u64, "MEM_WINDOW"),
    (ffi::IBV_DEVICE_UD_IP_CSUM as u64, "UD_IP_CSUM"),
    (ffi::IBV_DEVICE_XRC as u64, "XRC"),
    (
        ffi::IBV_DEVICE_MEM_MGT_EXTENSIONS as u64,
        "MEM_MGT_EXTENSIONS",
    ),
    (
        ffi::IBV_DEVICE_MEM_WINDOW_TYPE_2A as u64,
        "MEM_WINDOW_TYPE_2A",
    ),
    (
        ffi::IBV_DEVICE_MEM_WINDOW_TYPE_2B as u64,
        "MEM_WINDOW_TYPE_2B",
    ),
    (ffi::IBV_DEVICE_RC_IP_CSUM as u64, "RC_IP_CSUM"),
    (ffi::IBV_DEVICE_RAW_IP_CSUM as u64, "RAW_IP_CSUM"),
    (
        ffi::IBV_DEVICE_MANAGED_FLOW_STEERING as u64,
        "MANAGED_FLOW_STEERING",
    ),
];

/// Names of the extended (upper 32) bits of `device_cap_flags_ex`.
const DEVICE_CAP_FLAGS_EX: &[(u64, &str)] = &[
    (ffi::IBV_DEVICE_RAW_SCATTER_FCS, "RAW_SCATTER_FCS"),
    (
        ffi::IBV_DEVICE_PCI_WRITE_END_PADDING,
        "PCI_WRITE_END_PADDING",
    ),
];

/// Names of the general on-demand paging bits.
const ODP_GENERAL_CAPS: &[(u64, &str)] = &[
    (ffi::IBV_ODP_SUPPORT as u64, "ODP_SUPPORT"),
    (ffi::IBV_ODP_SUPPORT_IMPLICIT as u64, "ODP_SUPPORT_IMPLICIT"),
];

/// Names of the per-transport on-demand paging bits.
const ODP_TRANSPORT_CAPS: &[(u64, &str)] = &[
    (ffi::IBV_ODP_SUPPORT_SEND as u64, "SUPPORT_SEND"),
    (ffi::IBV_ODP_SUPPORT_RECV as u64, "SUPPORT_RECV"),
    (ffi::IBV_ODP_SUPPORT_WRITE as u64, "SUPPORT_WRITE"),
    (ffi::IBV_ODP_SUPPORT_READ as u64, "SUPPORT_READ"),
    (ffi::IBV_ODP_SUPPORT_ATOMIC as u64, "SUPPORT_ATOMIC"),
    (ffi::IBV_ODP_SUPPORT_SRQ_RECV as u64, "SUPPORT_SRQ"),
];

/// Descriptions of the raw packet offload bits (no "unknown" line, as in ibv_devinfo).
const RAW_PACKET_CAPS: &[(u64, &str)] = &[
    (
        ffi::IBV_RAW_PACKET_CAP_CVLAN_STRIPPING as u64,
        "C-VLAN stripping offload",
    ),
    (
        ffi::IBV_RAW_PACKET_CAP_SCATTER_FCS as u64,
        "Scatter FCS offload",
    ),
    (ffi::IBV_RAW_PACKET_CAP_IP_CSUM as u64, "IP csum offload"),
    (ffi::IBV_RAW_PACKET_CAP_DELAY_DROP as u64, "Delay drop"),
];

fn transport_str(transport: DeviceTransport) -> &'static str {
    match transport {
        DeviceTransport::Ib => "InfiniBand",
        DeviceTransport::Iwarp => "iWARP",
        DeviceTransport::Usnic => "usNIC",
        DeviceTransport::UsnicUdp => "usNIC UDP",
        _ => "invalid transport",
    }
}

fn port_state_str(state: PortState) -> &'static str {
    match state {
        PortState::Down => "PORT_DOWN",
        PortState::Init => "PORT_INIT",
        PortState::Armed => "PORT_ARMED",
        PortState::Active => "PORT_ACTIVE",
        _ => "invalid state",
    }
}

fn mtu_str(mtu: Mtu) -> String {
    mtu.bytes()
        .map_or_else(|| "invalid MTU".to_string(), |b| b.to_string())
}

fn link_layer_str(link_layer: LinkLayer) -> &'static str {
    match link_layer {
        LinkLayer::Unspecified | LinkLayer::InfiniBand => "InfiniBand",
        LinkLayer::Ethernet => "Ethernet",
        _ => "Unknown",
    }
}

fn atomic_cap_str(cap: AtomicCap) -> &'static str {
    match cap {
        AtomicCap::None => "ATOMIC_NONE",
        AtomicCap::Hca => "ATOMIC_HCA",
        AtomicCap::Global => "ATOMIC_GLOB",
        _ => "invalid atomic capability",
    }
}

/// Virtual lanes from the `max_vl_num` encoding.
fn vl_str(vl_num: u8) -> &'static str {
    match vl_num {
        1 => "1",
        2 => "2",
        3 => "4",
        4 => "8",
        5 => "15",
        _ => "invalid value",
    }
}

/// Lanes from the `active_width` encoding.
fn width_str(width: u8) -> &'static str {
    match width {
        1 => "1",
        2 => "4",
        4 => "8",
        8 => "12",
        16 => "2",
        _ => "invalid width",
    }
}

/// Per-lane signalling rate from the `active_speed` encoding.
fn speed_str(speed: u8) -> &'static str {
    match speed {
        1 => "2.5 Gbps",
        2 => "5.0 Gbps",
        4 | 8 => "10.0 Gbps",
        16 => "14.0 Gbps",
        32 => "25.0 Gbps",
        64 => "50.0 Gbps",
        128 => "100.0 Gbps",
        _ => "invalid speed",
    }
}

fn phys_state_str(phys_state: u8) -> &'static str {
    match phys_state {
        1 => "SLEEP",
        2 => "POLLING",
        3 => "DISABLED",
        4 => "PORT_CONFIGURATION TRAINNING",
        5 => "LINK_UP",
        6 => "LINK_ERROR_RECOVERY",
        7 => "PHY TEST",
        _ => "invalid physical state",
    }
}
