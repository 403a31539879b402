//! The Rust layouts of the bindings against the installed C headers, checked at run time.
//!
//! The checked-in bindings carry bindgen's compile-time layout assertions, but those only prove
//! that the Rust types have the layout bindgen computed on the machine that generated them.
//! This test asks the C compiler of the machine running it: it writes a small C program that
//! includes `<infiniband/verbs.h>` and `<rdma/rdma_cma.h>` and prints the size, alignment and
//! field offsets of the structures below, compiles it with `$CC` (default `cc`), runs it, and
//! compares every number with `size_of`, `align_of` and `offset_of!`. A header that drifted from
//! the bindings (another rdma-core release, another ABI) fails here with every difference listed.
//!
//! A missing C compiler is a failure, not a skip: without one, nothing would be checked.

use std::collections::HashMap;
use std::mem::{align_of, offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};
use std::{env, fs};

use rdma_verbs_sys as ffi;

/// A structure's size, alignment and field offsets, as the Rust bindings have them.
struct TypeLayout {
    /// The C structure tag (`struct <name>`), also the Rust type name.
    name: &'static str,
    size: usize,
    align: usize,
    /// `(Rust field path, offset)`; paths may go through named inner unions and structures
    /// (`wr.rdma.rkey`) and through bindgen's `__bindgen_anon_N` for anonymous C members.
    fields: &'static [(&'static str, usize)],
}

/// Builds the table: `type { field, inner.field, ... }` for each structure.
macro_rules! layouts {
    ($( $ty:ident { $( $($field:ident).+ ),* $(,)? } )*) => {
        &[$(
            TypeLayout {
                name: stringify!($ty),
                size: size_of::<ffi::$ty>(),
                align: align_of::<ffi::$ty>(),
                fields: &[$( (stringify!($($field).+), offset_of!(ffi::$ty, $($field).+)) ),*],
            }
        ),*]
    };
}

/// The structures checked: those of the data path and the inline ports, the op tables the
/// ports read, and the librdmacm structures the safe crates use. Every field is listed.
const LAYOUTS: &[TypeLayout] = layouts! {
    ibv_sge {
        addr, length, lkey,
    }
    ibv_send_wr {
        wr_id, next, sg_list, num_sge, opcode, send_flags, __bindgen_anon_1.imm_data,
        __bindgen_anon_1.invalidate_rkey, wr, wr.rdma, wr.rdma.remote_addr, wr.rdma.rkey,
        wr.atomic, wr.atomic.remote_addr, wr.atomic.compare_add, wr.atomic.swap, wr.atomic.rkey,
        wr.ud, wr.ud.ah, wr.ud.remote_qpn, wr.ud.remote_qkey, qp_type, qp_type.xrc,
        qp_type.xrc.remote_srqn, __bindgen_anon_2.bind_mw, __bindgen_anon_2.bind_mw.mw,
        __bindgen_anon_2.bind_mw.rkey, __bindgen_anon_2.bind_mw.bind_info, __bindgen_anon_2.tso,
        __bindgen_anon_2.tso.hdr, __bindgen_anon_2.tso.hdr_sz, __bindgen_anon_2.tso.mss,
    }
    ibv_recv_wr {
        wr_id, next, sg_list, num_sge,
    }
    ibv_wc {
        wr_id, status, opcode, vendor_err, byte_len, __bindgen_anon_1.imm_data,
        __bindgen_anon_1.invalidated_rkey, qp_num, src_qp, wc_flags, pkey_index, slid, sl,
        dlid_path_bits,
    }
    ibv_qp_attr {
        qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn, dest_qp_num,
        qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index, alt_pkey_index,
        en_sqd_async_notify, sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer,
        port_num, timeout, retry_cnt, rnr_retry, alt_port_num, alt_timeout, rate_limit,
    }
    ibv_qp_cap {
        max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data,
    }
    ibv_qp_init_attr {
        qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all,
    }
    ibv_qp_init_attr_ex {
        qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all, comp_mask, pd, xrcd,
        create_flags, max_tso_header, rwq_ind_tbl, rx_hash_conf, source_qpn, send_ops_flags,
    }
    ibv_port_attr {
        state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz, bad_pkey_cntr,
        qkey_viol_cntr, pkey_tbl_len, lid, sm_lid, lmc, max_vl_num, sm_sl, subnet_timeout,
        init_type_reply, active_width, active_speed, phys_state, link_layer, flags,
        port_cap_flags2,
    }
    ibv_device_attr {
        fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap, vendor_id, vendor_part_id,
        hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge, max_sge_rd, max_cq, max_cqe, max_mr,
        max_pd, max_qp_rd_atom, max_ee_rd_atom, max_res_rd_atom, max_qp_init_rd_atom,
        max_ee_init_rd_atom, atomic_cap, max_ee, max_rdd, max_mw, max_raw_ipv6_qp, max_raw_ethy_qp,
        max_mcast_grp, max_mcast_qp_attach, max_total_mcast_qp_attach, max_ah, max_fmr,
        max_map_per_fmr, max_srq, max_srq_wr, max_srq_sge, max_pkeys, local_ca_ack_delay,
        phys_port_cnt,
    }
    ibv_device_attr_ex {
        orig_attr, comp_mask, odp_caps, completion_timestamp_mask, hca_core_clock,
        device_cap_flags_ex, tso_caps, rss_caps, max_wq_type_rq, packet_pacing_caps,
        raw_packet_caps, tm_caps, cq_mod_caps, max_dm_size, pci_atomic_caps, xrc_odp_caps,
        phys_port_cnt_ex,
    }
    ibv_gid_entry {
        gid, gid_index, port_num, gid_type, ndev_ifindex,
    }
    ibv_ah_attr {
        grh, dlid, sl, src_path_bits, static_rate, is_global, port_num,
    }
    ibv_global_route {
        dgid, flow_label, sgid_index, hop_limit, traffic_class,
    }
    ibv_context {
        device, ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat,
    }
    ibv_context_ops {
        _compat_query_device, _compat_query_port, _compat_alloc_pd, _compat_dealloc_pd,
        _compat_reg_mr, _compat_rereg_mr, _compat_dereg_mr, alloc_mw, bind_mw, dealloc_mw,
        _compat_create_cq, poll_cq, req_notify_cq, _compat_cq_event, _compat_resize_cq,
        _compat_destroy_cq, _compat_create_srq, _compat_modify_srq, _compat_query_srq,
        _compat_destroy_srq, post_srq_recv, _compat_create_qp, _compat_query_qp, _compat_modify_qp,
        _compat_destroy_qp, post_send, post_recv, _compat_create_ah, _compat_destroy_ah,
        _compat_attach_mcast, _compat_detach_mcast, _compat_async_event,
    }
    verbs_context {
        query_port, advise_mr, alloc_null_mr, read_counters, attach_counters_point_flow,
        create_counters, destroy_counters, reg_dm_mr, alloc_dm, free_dm, modify_flow_action_esp,
        destroy_flow_action, create_flow_action_esp, modify_qp_rate_limit, alloc_parent_domain,
        dealloc_td, alloc_td, modify_cq, post_srq_ops, destroy_rwq_ind_table, create_rwq_ind_table,
        destroy_wq, modify_wq, create_wq, query_rt_values, create_cq_ex, priv_, query_device_ex,
        ibv_destroy_flow, ABI_placeholder2, ibv_create_flow, ABI_placeholder1, open_qp,
        create_qp_ex, get_srq_num, create_srq_ex, open_xrcd, close_xrcd, _ABI_placeholder3, sz,
        context,
    }
    ibv_qp_ex {
        qp_base, comp_mask, wr_id, wr_flags, wr_atomic_cmp_swp, wr_atomic_fetch_add, wr_bind_mw,
        wr_local_inv, wr_rdma_read, wr_rdma_write, wr_rdma_write_imm, wr_send, wr_send_imm,
        wr_send_inv, wr_send_tso, wr_set_ud_addr, wr_set_xrc_srqn, wr_set_inline_data,
        wr_set_inline_data_list, wr_set_sge, wr_set_sge_list, wr_start, wr_complete, wr_abort,
        wr_atomic_write,
    }
    ibv_cq_ex {
        context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
        async_events_completed, comp_mask, status, wr_id, start_poll, next_poll, end_poll,
        read_opcode, read_vendor_err, read_byte_len, read_imm_data, read_qp_num, read_src_qp,
        read_wc_flags, read_slid, read_sl, read_dlid_path_bits, read_completion_ts, read_cvlan,
        read_flow_tag, read_tm_info, read_completion_wallclock_ns,
    }
    ibv_mr {
        context, pd, addr, length, handle, lkey, rkey,
    }
    ibv_pd {
        context, handle,
    }
    ibv_cq {
        context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
        async_events_completed,
    }
    ibv_qp {
        context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type, mutex,
        cond, events_completed,
    }
    ibv_srq {
        context, srq_context, pd, handle, mutex, cond, events_completed,
    }
    ibv_async_event {
        element, element.cq, element.qp, element.srq, element.wq, element.port_num, event_type,
    }
    ibv_mw_bind {
        wr_id, send_flags, bind_info,
    }
    ibv_mw_bind_info {
        mr, addr, length, mw_access_flags,
    }
    ibv_mw {
        context, pd, rkey, handle, type_,
    }
    ibv_wq {
        context, wq_context, pd, cq, wq_num, handle, state, wq_type, post_recv, mutex, cond,
        events_completed, comp_mask,
    }
    ibv_dm {
        context, memcpy_to_dm, memcpy_from_dm, comp_mask, handle,
    }
    ibv_ah {
        context, pd, handle,
    }
    ibv_comp_channel {
        context, fd, refcnt,
    }
    ibv_xrcd {
        context,
    }
    ibv_td {
        context,
    }
    ibv_flow {
        comp_mask, context, handle,
    }
    ibv_flow_action {
        context,
    }
    ibv_counters {
        context,
    }
    ibv_rwq_ind_table {
        context, ind_tbl_handle, ind_tbl_num, comp_mask,
    }
    ibv_cq_init_attr_ex {
        cqe, cq_context, channel, comp_vector, wc_flags, comp_mask, flags, parent_domain,
    }
    ibv_srq_init_attr {
        srq_context, attr,
    }
    ibv_srq_init_attr_ex {
        srq_context, attr, comp_mask, srq_type, pd, xrcd, cq, tm_cap,
    }
    ibv_srq_attr {
        max_wr, max_sge, srq_limit,
    }
    ibv_wq_init_attr {
        wq_context, wq_type, max_wr, max_sge, pd, cq, comp_mask, create_flags,
    }
    ibv_wq_attr {
        attr_mask, wq_state, curr_wq_state, flags, flags_mask,
    }
    ibv_ops_wr {
        wr_id, next, opcode, flags, tm, tm.unexpected_cnt, tm.handle, tm.add, tm.add.recv_wr_id,
        tm.add.sg_list, tm.add.num_sge, tm.add.tag, tm.add.mask,
    }
    ibv_poll_cq_attr {
        comp_mask,
    }
    ibv_wc_tm_info {
        tag, priv_,
    }
    ibv_qp_open_attr {
        comp_mask, qp_num, xrcd, qp_context, qp_type,
    }
    ibv_xrcd_init_attr {
        comp_mask, fd, oflags,
    }
    ibv_query_device_ex_input {
        comp_mask,
    }
    ibv_values_ex {
        comp_mask, raw_clock,
    }
    ibv_modify_cq_attr {
        attr_mask, moderate,
    }
    ibv_data_buf {
        addr, length,
    }
    ibv_parent_domain_init_attr {
        pd, td, comp_mask, alloc, free, pd_context,
    }
    ibv_rwq_ind_table_init_attr {
        log_ind_tbl_size, ind_tbl, comp_mask,
    }
    ibv_alloc_dm_attr {
        length, log_align_req, comp_mask,
    }
    ibv_counters_init_attr {
        comp_mask,
    }
    ibv_counter_attach_attr {
        counter_desc, index, comp_mask,
    }
    ibv_qp_rate_limit_attr {
        rate_limit, max_burst_sz, typical_pkt_sz, comp_mask,
    }
    ibv_td_init_attr {
        comp_mask,
    }
    ibv_flow_attr {
        comp_mask, type_, size, priority, num_of_specs, port, flags,
    }
    rdma_cm_id {
        verbs, channel, context, qp, route, ps, port_num, event, send_cq_channel, send_cq,
        recv_cq_channel, recv_cq, srq, pd, qp_type,
    }
    rdma_cm_event {
        id, listen_id, event, status, param, param.conn, param.ud,
    }
    rdma_conn_param {
        private_data, private_data_len, responder_resources, initiator_depth, flow_control,
        retry_count, rnr_retry_count, srq, qp_num,
    }
    rdma_ud_param {
        private_data, private_data_len, ah_attr, qp_num, qkey,
    }
    rdma_addrinfo {
        ai_flags, ai_family, ai_qp_type, ai_port_space, ai_src_len, ai_dst_len, ai_src_addr,
        ai_dst_addr, ai_src_canonname, ai_dst_canonname, ai_route_len, ai_route, ai_connect_len,
        ai_connect, ai_next,
    }
    rdma_event_channel {
        fd,
    }
    rdma_route {
        addr, path_rec, num_paths,
    }
    rdma_addr {
        __bindgen_anon_1.src_addr, __bindgen_anon_1.src_sin, __bindgen_anon_1.src_sin6,
        __bindgen_anon_1.src_storage, __bindgen_anon_2.dst_addr, __bindgen_anon_2.dst_sin,
        __bindgen_anon_2.dst_sin6, __bindgen_anon_2.dst_storage, addr, addr.ibaddr,
    }
};

/// The C member designator of a Rust field path: bindgen's anonymous members vanish, and
/// fields renamed from C keywords (`type_`, `priv_`) get their C names back.
fn c_member(rust_path: &str) -> String {
    rust_path
        .split('.')
        .filter(|part| !part.starts_with("__bindgen_anon_"))
        .map(|part| match part.strip_suffix('_') {
            Some(c_name) if !part.starts_with('_') => c_name,
            _ => part,
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// A Rust field path as written in the table, without the spaces `stringify!` may insert.
fn rust_path(path: &str) -> String {
    path.chars().filter(|c| !c.is_whitespace()).collect()
}

/// The C program printing `name size align` for each structure and `name.field offset` for
/// each field (the field named by its Rust path, so the lines key back into `LAYOUTS`).
fn c_program() -> String {
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\n\
         #include <rdma/rdma_cma.h>\n\nint main(void)\n{\n",
    );
    for layout in LAYOUTS {
        let name = layout.name;
        c.push_str(&format!(
            "\tprintf(\"%s %zu %zu\\n\", \"{name}\", sizeof(struct {name}), \
             _Alignof(struct {name}));\n"
        ));
        for (path, _) in layout.fields {
            let path = rust_path(path);
            let member = c_member(&path);
            c.push_str(&format!(
                "\tprintf(\"%s %zu\\n\", \"{name}.{path}\", offsetof(struct {name}, {member}));\n"
            ));
        }
    }
    c.push_str("\treturn 0;\n}\n");
    c
}

/// A fresh temporary directory, removed (with its contents) on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = env::temp_dir().join(format!(
            "rdma-verbs-sys-layout-{}-{nanos}",
            std::process::id()
        ));
        fs::create_dir(&path).unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        Self(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Extra compiler flags from pkg-config, when it knows the libraries (a non-standard prefix);
/// none otherwise, the headers then being in the compiler's default path.
fn pkg_config_cflags() -> Vec<String> {
    Command::new("pkg-config")
        .args(["--cflags", "libibverbs", "librdmacm"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| {
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Compiles and runs the C program; returns its output, one line per item.
fn run_c_program(dir: &Path) -> String {
    let source = dir.join("layout.c");
    let exe = dir.join("layout");
    fs::write(&source, c_program())
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", source.display()));

    let cc = env::var("CC").ok().filter(|cc| !cc.trim().is_empty());
    let cc = cc.as_deref().unwrap_or("cc");
    let mut words = cc.split_whitespace();
    let program = words.next().unwrap_or("cc");
    let mut command = Command::new(program);
    command
        .args(words)
        .args(pkg_config_cflags())
        .arg("-o")
        .arg(&exe)
        .arg(&source);
    let output = command.output().unwrap_or_else(|e| {
        panic!(
            "the layout test needs a C compiler, and running `{cc}` failed: {e}. Install one \
             (Debian/Ubuntu: `apt-get install gcc`) or point the CC environment variable at it."
        )
    });
    assert!(
        output.status.success(),
        "compiling the layout probe with `{cc}` failed ({}); are the rdma-core headers \
         installed (libibverbs-dev, librdmacm-dev)?\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );

    let output = Command::new(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", exe.display()));
    assert!(
        output.status.success(),
        "the layout probe failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("the probe prints ASCII")
}

#[test]
fn layouts_match_the_installed_c_headers() {
    let dir = TempDir::new();
    let stdout = run_c_program(dir.path());

    // name -> numbers, from the C side.
    let mut c_values: HashMap<&str, Vec<usize>> = HashMap::new();
    for line in stdout.lines() {
        let mut words = line.split_whitespace();
        let Some(name) = words.next() else { continue };
        let numbers = words
            .map(|w| {
                w.parse()
                    .unwrap_or_else(|e| panic!("bad probe line {line:?}: {e}"))
            })
            .collect();
        c_values.insert(name, numbers);
    }

    let mut mismatches = Vec::new();
    let mut compared = 0usize;
    let mut check = |key: &str, what: &str, rust: usize, c: Option<usize>| {
        compared += 1;
        match c {
            Some(c) if c == rust => {}
            Some(c) => mismatches.push(format!("{key}: {what} is {rust} in Rust, {c} in C")),
            None => mismatches.push(format!("{key}: {what} missing from the C probe's output")),
        }
    };
    for layout in LAYOUTS {
        let c = c_values.get(layout.name);
        let c_at = |i: usize| c.and_then(|v| v.get(i).copied());
        check(layout.name, "size", layout.size, c_at(0));
        check(layout.name, "align", layout.align, c_at(1));
        for (path, offset) in layout.fields {
            let key = format!("{}.{}", layout.name, rust_path(path));
            let c = c_values.get(key.as_str()).and_then(|v| v.first().copied());
            check(&key, "offset", *offset, c);
        }
    }

    let fields: usize = LAYOUTS.iter().map(|l| l.fields.len()).sum();
    println!(
        "layout: compared {compared} items ({} structures: size and alignment; {fields} field \
         offsets) with the installed C headers",
        LAYOUTS.len()
    );
    assert!(
        mismatches.is_empty(),
        "{} of {compared} layout items differ from the installed C headers:\n  {}",
        mismatches.len(),
        mismatches.join("\n  ")
    );
}

#[test]
fn c_member_names() {
    assert_eq!(c_member("wr.rdma.rkey"), "wr.rdma.rkey");
    assert_eq!(c_member("__bindgen_anon_1.imm_data"), "imm_data");
    assert_eq!(c_member("__bindgen_anon_2.bind_mw.mw"), "bind_mw.mw");
    assert_eq!(c_member("type_"), "type");
    assert_eq!(c_member("priv_"), "priv");
    assert_eq!(c_member("_ABI_placeholder3"), "_ABI_placeholder3");
    assert_eq!(c_member("_compat_query_device"), "_compat_query_device");
    assert_eq!(rust_path("wr . rdma . rkey"), "wr.rdma.rkey");
}
