//! The first device test: raw verbs calls against a real device, proving the bindings and the
//! harness end to end. Runs on the device `rdma_test_support::device` picks (Soft-RoCE in the
//! harness VM).

use std::ffi::CStr;
use std::mem::size_of;
use std::ptr;

use rdma_verbs_sys as ffi;

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Opens the named device from a fresh device list; the list is freed before returning.
fn open(name: &str) -> *mut ffi::ibv_context {
    let mut count = 0;
    // SAFETY: valid out-pointer; the list is freed below.
    let list = unsafe { ffi::ibv_get_device_list(&mut count) };
    assert!(!list.is_null(), "ibv_get_device_list: errno {}", errno());
    assert!(count > 0, "the device list is empty");
    let mut names = Vec::new();
    let mut context = ptr::null_mut();
    for i in 0..count as usize {
        // SAFETY: the list holds `count` valid devices with NUL-terminated names.
        let (device, device_name) = unsafe {
            let device = *list.add(i);
            (device, CStr::from_ptr(ffi::ibv_get_device_name(device)))
        };
        let device_name = device_name.to_str().expect("device names are ASCII");
        // SAFETY: a listed device.
        let guid = unsafe { ffi::ibv_get_device_guid(device) };
        names.push(format!("{device_name} (GUID {:016x})", u64::from_be(guid)));
        if device_name == name {
            // SAFETY: a listed device; the context outlives the list (verbs.h allows this).
            context = unsafe { ffi::ibv_open_device(device) };
            assert!(!context.is_null(), "ibv_open_device: errno {}", errno());
        }
    }
    // SAFETY: the list from above, freed once; opened contexts stay valid.
    unsafe { ffi::ibv_free_device_list(list) };
    println!("devices: {}", names.join(", "));
    assert!(!context.is_null(), "{name} is not in the device list");
    context
}

#[test]
fn device_port_gid_pd_and_mr() {
    let Some(device) = rdma_test_support::device() else {
        return;
    };
    let context = open(&device.name);

    // Device attributes.
    let mut attr = ffi::ibv_device_attr::default();
    // SAFETY: live context, writable attributes.
    assert_eq!(unsafe { ffi::ibv_query_device(context, &mut attr) }, 0);
    assert!(attr.phys_port_cnt >= device.port);
    assert!(attr.max_qp > 0 && attr.max_cq > 0 && attr.max_mr > 0 && attr.max_pd > 0);
    // SAFETY: `fw_ver` is a NUL-terminated array filled by the query.
    let fw = unsafe { CStr::from_ptr(attr.fw_ver.as_ptr()) };
    println!(
        "{}: fw {:?}, {} ports, max_qp {}, max_cq {}, max_mr_size {}",
        device.name, fw, attr.phys_port_cnt, attr.max_qp, attr.max_cq, attr.max_mr_size
    );

    // Extended device attributes agree with the classic ones.
    let mut attr_ex = ffi::ibv_device_attr_ex::default();
    // SAFETY: live context; null input is allowed; writable attributes.
    let rc = unsafe { ffi::ibv_query_device_ex(context, ptr::null(), &mut attr_ex) };
    assert_eq!(rc, 0, "ibv_query_device_ex");
    assert_eq!(attr_ex.orig_attr.max_qp, attr.max_qp);
    assert_eq!(attr_ex.orig_attr.phys_port_cnt, attr.phys_port_cnt);

    // Port attributes through the ported ibv_query_port.
    let mut port = ffi::ibv_port_attr::default();
    // SAFETY: live context, writable attributes.
    let rc = unsafe { ffi::ibv_query_port(context, device.port, &mut port) };
    assert_eq!(rc, 0, "ibv_query_port");
    assert_eq!(port.state, ffi::IBV_PORT_ACTIVE, "the test port is active");
    assert!(port.active_mtu >= ffi::IBV_MTU_256 && port.active_mtu <= port.max_mtu);
    assert!(port.gid_tbl_len > 0);
    assert_eq!(
        u32::from(port.link_layer) == ffi::IBV_LINK_LAYER_ETHERNET,
        device.is_ethernet
    );

    // A port that does not exist is an error, not a crash.
    let mut bad = ffi::ibv_port_attr::default();
    // SAFETY: live context, writable attributes; the port number is out of range.
    let rc = unsafe { ffi::ibv_query_port(context, attr.phys_port_cnt + 1, &mut bad) };
    assert_ne!(rc, 0, "querying port {} must fail", attr.phys_port_cnt + 1);

    // GID table: the entry the test device uses is in it, with the same bytes.
    let mut gid = ffi::ibv_gid::default();
    // SAFETY: live context, writable GID.
    let rc = unsafe { ffi::ibv_query_gid(context, device.port, device.gid_index as i32, &mut gid) };
    assert_eq!(rc, 0);
    // SAFETY: byte view of the GID union.
    assert_eq!(unsafe { gid.raw }, device.gid);
    let mut entries = vec![ffi::ibv_gid_entry::default(); port.gid_tbl_len as usize];
    // SAFETY: live context, `entries` holds gid_tbl_len writable entries of the given size.
    let n = unsafe {
        ffi::_ibv_query_gid_table(
            context,
            entries.as_mut_ptr(),
            entries.len(),
            0,
            size_of::<ffi::ibv_gid_entry>(),
        )
    };
    assert!(n > 0, "ibv_query_gid_table returned {n}");
    let ours = entries[..n as usize]
        .iter()
        .find(|e| e.gid_index == device.gid_index && e.port_num == u32::from(device.port))
        .expect("the test GID is in the GID table");
    // SAFETY: byte view of the GID union.
    assert_eq!(unsafe { ours.gid.raw }, device.gid);
    if device.is_ethernet {
        assert!(
            ours.gid_type == ffi::IBV_GID_TYPE_ROCE_V2
                || ours.gid_type == ffi::IBV_GID_TYPE_ROCE_V1,
            "a RoCE GID has a RoCE type, got {}",
            ours.gid_type
        );
        assert_ne!(ours.ndev_ifindex, 0, "a RoCE GID names its netdev");
    }
    println!(
        "port {}: LID {}, active MTU enum {}, {} GIDs; GID[{}] = {:02x?}",
        device.port, port.lid, port.active_mtu, n, device.gid_index, device.gid
    );

    // Protection domain and memory region.
    // SAFETY: live context.
    let pd = unsafe { ffi::ibv_alloc_pd(context) };
    assert!(!pd.is_null(), "ibv_alloc_pd: errno {}", errno());
    let mut buffer = vec![0u8; 64 * 1024];
    let access =
        ffi::IBV_ACCESS_LOCAL_WRITE | ffi::IBV_ACCESS_REMOTE_WRITE | ffi::IBV_ACCESS_REMOTE_READ;
    // SAFETY: live PD; the buffer outlives the registration (deregistered below).
    let mr =
        unsafe { ffi::ibv_reg_mr(pd, buffer.as_mut_ptr().cast(), buffer.len(), access as i32) };
    assert!(!mr.is_null(), "ibv_reg_mr: errno {}", errno());
    // SAFETY: `mr` is a live registration.
    let (addr, length, lkey, rkey, mr_pd) =
        unsafe { ((*mr).addr, (*mr).length, (*mr).lkey, (*mr).rkey, (*mr).pd) };
    assert_eq!(addr, buffer.as_mut_ptr().cast());
    assert_eq!(length, buffer.len());
    assert_eq!(mr_pd, pd);
    assert_ne!(lkey, 0);
    assert_ne!(rkey, 0);

    // Registering with remote write but without local write is invalid (verbs: EINVAL).
    // SAFETY: live PD, live buffer; the call must fail and register nothing.
    let bad_mr = unsafe {
        ffi::ibv_reg_mr(
            pd,
            buffer.as_mut_ptr().cast(),
            buffer.len(),
            ffi::IBV_ACCESS_REMOTE_WRITE as i32,
        )
    };
    assert!(
        bad_mr.is_null(),
        "remote write without local write must be refused"
    );
    assert_eq!(errno(), libc::EINVAL);

    // SAFETY: each object is live and destroyed once, children first.
    unsafe {
        assert_eq!(ffi::ibv_dereg_mr(mr), 0);
        assert_eq!(ffi::ibv_dealloc_pd(pd), 0);
        assert_eq!(ffi::ibv_close_device(context), 0);
    }
}
