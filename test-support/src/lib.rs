//! Conventions every device test of this workspace follows.
//!
//! A device test starts with
//!
//! ```no_run
//! # fn main() {
//! let Some(device) = rdma_test_support::device() else { return };
//! // ... open `device.name`, use `device.port` and `device.gid_index` ...
//! # }
//! ```
//!
//! [`device`] picks the device:
//!
//! - `RDMA_TEST_DEVICE` names it (with `RDMA_TEST_PORT`, default 1, `RDMA_TEST_GID_INDEX` and
//!   `RDMA_TEST_ADDR` optional);
//! - otherwise the first active port of any device with a routable GID: on Ethernet (RoCE) an
//!   IPv4-mapped GID, RoCE v2 first; on InfiniBand GID index 0 of a port with a LID.
//!
//! With no device it returns `None` after printing a visible `SKIPPED` line, unless
//! `RDMA_TEST_REQUIRE_DEVICE=1` (the harness sets it): then the test fails with a one-line
//! message. Each outcome is also appended to the file named by `RDMA_TEST_REPORT`, which the
//! harness (`cargo xtask test`) reads to prove that device tests ran and none were skipped.
//!
//! Inside the harness a skip must be justified: [`unsupported`] fails the test unless
//! [`device_lacks`] confirms that the device lacks the capability. [`second_device`] names the
//! second device for tests that need two, and [`repeat`] gives `cargo xtask test --repeat N`.
//!
//! Multi-node tests (`cargo xtask test --nodes N`) also call [`cluster()`] for their role, the
//! nodes' addresses, barriers and values exchanged between nodes: see [`mod@cluster`].
//!
//! Without features this crate uses only the raw bindings, so every crate's tests can depend
//! on it. Feature `verbs` adds [`verbs`] (the helpers of `rdma-verbs`' tests: fixtures,
//! connected pairs, bounded waits) and feature `cm` adds [`cm`] (those of `rdma-cm`'s).
//! [`note`] and [`pattern`] serve every crate's tests.

#![deny(missing_docs)]

pub mod cluster;
#[cfg(feature = "cm")]
pub mod cm;
#[cfg(feature = "verbs")]
pub mod verbs;

pub use cluster::{Cluster, cluster};

use std::ffi::CStr;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;

use rdma_verbs_sys as ffi;

/// Environment variable naming the device to test on (for example `rxe0`).
pub const ENV_DEVICE: &str = "RDMA_TEST_DEVICE";
/// Environment variable naming the port (default 1) when [`ENV_DEVICE`] is set.
pub const ENV_PORT: &str = "RDMA_TEST_PORT";
/// Environment variable naming the GID index to use.
pub const ENV_GID_INDEX: &str = "RDMA_TEST_GID_INDEX";
/// Environment variable naming the IP address of the device's network interface (for rdma_cm).
pub const ENV_ADDR: &str = "RDMA_TEST_ADDR";
/// Environment variable that turns a missing device from a skip into a failure when set to `1`.
pub const ENV_REQUIRE: &str = "RDMA_TEST_REQUIRE_DEVICE";
/// Environment variable naming the file the harness reads test outcomes from.
pub const ENV_REPORT: &str = "RDMA_TEST_REPORT";
/// Environment variable naming a second device, for tests that need two (see
/// [`second_device`]).
pub const ENV_DEVICE2: &str = "RDMA_TEST_DEVICE2";
/// Environment variable with a repeat count for repeatable tests (see [`repeat`]).
pub const ENV_REPEAT: &str = "RDMA_TEST_REPEAT";

/// The device, port and addressing a device test runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestDevice {
    /// Device name, as `ibv_get_device_name` gives it (for example `rxe0`).
    pub name: String,
    /// Port number (1-based).
    pub port: u8,
    /// GID index to address the port with.
    pub gid_index: u32,
    /// The GID at [`gid_index`](Self::gid_index), in network byte order.
    pub gid: [u8; 16],
    /// The port's LID (0 on RoCE).
    pub lid: u16,
    /// Whether the port's link layer is Ethernet (RoCE) rather than InfiniBand.
    pub is_ethernet: bool,
    /// IP address of the port's network interface, when known (RoCE: from the GID).
    pub addr: Option<IpAddr>,
}

/// The device to test on, or `None` (after a visible skip) when there is none and
/// `RDMA_TEST_REQUIRE_DEVICE` is not `1`.
///
/// # Panics
///
/// When no device is found and `RDMA_TEST_REQUIRE_DEVICE=1`: that is the test's failure.
#[track_caller]
pub fn device() -> Option<TestDevice> {
    match found_device() {
        Ok(device) => {
            report(&format!("ran {} {}", test_name(), device.name));
            Some(device.clone())
        }
        Err(reason) => {
            skip(reason);
            None
        }
    }
}

/// Records that the running test cannot run because the device lacks `capability`, and prints
/// a visible line; the test then returns early.
///
/// Outside the harness this is a skip. Inside it (`RDMA_TEST_REQUIRE_DEVICE=1`) a skip must be
/// justified: this panics, so the test fails, unless `capability` is one [`device_lacks`] can
/// check and the device truly lacks it. A justified skip is counted as skipped, and a run with
/// any skip is not green: the capabilities the suite uses are all on rxe.
///
/// # Panics
///
/// Inside the harness, when the device has `capability` or this crate cannot check it.
#[track_caller]
pub fn unsupported(capability: &str) {
    let name = test_name();
    if require_device() {
        let refusal = match device_lacks(capability) {
            Some(true) => None,
            Some(false) => Some(format!(
                "the device has {capability}: a test must not skip what the device supports"
            )),
            None => Some(format!(
                "cannot check that the device lacks {capability:?} (checkable: {}); \
                 add a check to rdma_test_support::device_lacks or make the test run",
                CAPABILITIES.join(", ")
            )),
        };
        if let Some(refusal) = refusal {
            report(&format!(
                "failed {name} unsupported({capability:?}) refused: {refusal}"
            ));
            panic!(
                "{ENV_REQUIRE}=1 and the test called unsupported({capability:?}), but {refusal}"
            );
        }
    }
    visible(&format!(
        "UNSUPPORTED {name}: the device lacks {capability}"
    ));
    report(&format!("unsupported {name} {capability}"));
}

/// The capabilities [`device_lacks`] can check, by the names tests pass to [`unsupported`].
pub const CAPABILITIES: &[&str] = &[
    "memory windows type 1",
    "memory windows type 2",
    "XRC",
    "atomics",
    "SRQ",
];

/// Whether the test device lacks `capability` (one of [`CAPABILITIES`], compared ignoring
/// case), from its own `ibv_query_device`; `None` if the capability is not one of them or no
/// device is found.
pub fn device_lacks(capability: &str) -> Option<bool> {
    let known = CAPABILITIES
        .iter()
        .find(|c| c.eq_ignore_ascii_case(capability))?;
    let name = match found_device() {
        Ok(device) => device.name.clone(),
        Err(_) => return None,
    };
    let devices = DeviceList::get().ok()?;
    let index = devices.names.iter().position(|n| *n == name)?;
    // SAFETY: `list[index]` is a device of the live list.
    let context = unsafe { ffi::ibv_open_device(devices.list[index]) };
    if context.is_null() {
        return None;
    }
    let mut attr = ffi::ibv_device_attr::default();
    // SAFETY: live context, writable attribute struct.
    let rc = unsafe { ffi::ibv_query_device(context, &mut attr) };
    // SAFETY: `context` was opened above and is closed once.
    unsafe { ffi::ibv_close_device(context) };
    if rc != 0 {
        return None;
    }
    let flags = attr.device_cap_flags;
    let has = match *known {
        "memory windows type 1" => flags & ffi::IBV_DEVICE_MEM_WINDOW != 0,
        "memory windows type 2" => {
            flags & (ffi::IBV_DEVICE_MEM_WINDOW_TYPE_2A | ffi::IBV_DEVICE_MEM_WINDOW_TYPE_2B) != 0
        }
        "XRC" => flags & ffi::IBV_DEVICE_XRC != 0,
        "atomics" => attr.atomic_cap != ffi::IBV_ATOMIC_NONE,
        "SRQ" => attr.max_srq > 0,
        _ => return None,
    };
    Some(!has)
}

/// The name of the second device (`RDMA_TEST_DEVICE2`; the harness's VM makes `rxe1`), for
/// tests that need two devices; `None` after a visible skip when it is not set.
///
/// # Panics
///
/// When it is not set and `RDMA_TEST_REQUIRE_DEVICE=1`: that is the test's failure.
#[track_caller]
pub fn second_device() -> Option<String> {
    match std::env::var(ENV_DEVICE2) {
        Ok(name) if !name.is_empty() => Some(name),
        _ => {
            skip(&format!("{ENV_DEVICE2} names no second device"));
            None
        }
    }
}

/// The running kernel's version as (major, minor), from `/proc/sys/kernel/osrelease`
/// (`6.12.115+deb12-amd64` gives (6, 12)); `None` when it cannot be read. Soft-RoCE lives in
/// the kernel, so where its answers changed between versions a test asks which it runs on.
pub fn kernel_version() -> Option<(u32, u32)> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    let mut numbers = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(str::parse::<u32>);
    match (numbers.next(), numbers.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => Some((major, minor)),
        _ => None,
    }
}

/// How many times to repeat a repeatable test (`RDMA_TEST_REPEAT`, set by
/// `cargo xtask test --repeat N`); 1 when unset.
///
/// # Panics
///
/// When `RDMA_TEST_REPEAT` is set but not a positive integer.
pub fn repeat() -> usize {
    match std::env::var(ENV_REPEAT) {
        Ok(text) => match text.trim().parse::<usize>() {
            Ok(count) if count > 0 => count,
            _ => panic!("{ENV_REPEAT}={text:?} is not a positive integer"),
        },
        Err(_) => 1,
    }
}

fn require_device() -> bool {
    std::env::var(ENV_REQUIRE).as_deref() == Ok("1")
}

#[track_caller]
fn skip(reason: &str) {
    let name = test_name();
    if require_device() {
        report(&format!("failed {name} {reason}"));
        panic!("{ENV_REQUIRE}=1 but {reason}");
    }
    visible(&format!(
        "SKIPPED {name}: {reason} (set {ENV_REQUIRE}=1 to make this a failure)"
    ));
    report(&format!("skipped {name} {reason}"));
}

/// Writes a line to the real standard error: libtest captures `eprintln!` of passing tests, and
/// a skip must be seen.
fn visible(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The running test's name: libtest names each test's thread after the test.
fn test_name() -> String {
    let exe = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|s| {
            s.rsplit_once('-')
                .map_or(s.clone(), |(name, _hash)| name.to_string())
        })
        .unwrap_or_default();
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("main");
    format!("{exe}::{test}")
}

fn report(line: &str) {
    let Some(path) = std::env::var_os(ENV_REPORT) else {
        return;
    };
    // One `write` of one line to a file opened for appending: lines from concurrent tests and
    // processes do not interleave.
    let line = format!("{line}\n");
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| file.write_all(line.as_bytes()));
    if let Err(error) = written {
        eprintln!("warning: cannot append to {ENV_REPORT} file {path:?}: {error}");
    }
}

/// The device search's result, made once per process.
fn found_device() -> &'static Result<TestDevice, String> {
    static FOUND: OnceLock<Result<TestDevice, String>> = OnceLock::new();
    FOUND.get_or_init(find_device)
}

fn find_device() -> Result<TestDevice, String> {
    let wanted = std::env::var(ENV_DEVICE).ok().filter(|s| !s.is_empty());
    let devices = DeviceList::get()?;
    if devices.names.is_empty() {
        return Err("no RDMA device found (ibv_get_device_list returned none)".to_string());
    }
    let mut tried = Vec::new();
    for (index, name) in devices.names.iter().enumerate() {
        if wanted.as_ref().is_some_and(|w| w != name) {
            continue;
        }
        match probe(devices.list[index], name, wanted.is_some()) {
            Ok(Some(device)) => return Ok(apply_overrides(device)),
            Ok(None) => tried.push(format!("{name}: no active port with a routable GID")),
            Err(error) => tried.push(format!("{name}: {error}")),
        }
    }
    if let Some(wanted) = wanted {
        if tried.is_empty() {
            return Err(format!(
                "{ENV_DEVICE}={wanted} names no device (devices: {})",
                devices.names.join(", ")
            ));
        }
    }
    Err(format!("no usable RDMA device ({})", tried.join("; ")))
}

fn apply_overrides(mut device: TestDevice) -> TestDevice {
    if let Some(addr) = std::env::var(ENV_ADDR).ok().and_then(|a| a.parse().ok()) {
        device.addr = Some(addr);
    }
    device
}

/// The list from `ibv_get_device_list`, freed on drop.
struct DeviceList {
    list: Vec<*mut ffi::ibv_device>,
    names: Vec<String>,
    raw: *mut *mut ffi::ibv_device,
}

impl DeviceList {
    fn get() -> Result<Self, String> {
        let mut count = 0;
        // SAFETY: `count` is a valid out-pointer; the returned array is freed in Drop.
        let raw = unsafe { ffi::ibv_get_device_list(&mut count) };
        if raw.is_null() {
            return Err(format!(
                "ibv_get_device_list failed: {}",
                std::io::Error::last_os_error()
            ));
        }
        let mut list = Vec::new();
        let mut names = Vec::new();
        for i in 0..usize::try_from(count).unwrap_or(0) {
            // SAFETY: the array holds `count` valid device pointers.
            let device = unsafe { *raw.add(i) };
            // SAFETY: a listed device has a NUL-terminated name that lives as long as the list.
            let name = unsafe { CStr::from_ptr(ffi::ibv_get_device_name(device)) };
            list.push(device);
            names.push(name.to_string_lossy().into_owned());
        }
        Ok(Self { list, names, raw })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: `raw` came from ibv_get_device_list and is freed once.
        unsafe { ffi::ibv_free_device_list(self.raw) };
    }
}

/// Looks for an active port with a routable GID on one device.
fn probe(
    device: *mut ffi::ibv_device,
    name: &str,
    named: bool,
) -> Result<Option<TestDevice>, String> {
    // SAFETY: `device` is from a live device list.
    let context = unsafe { ffi::ibv_open_device(device) };
    if context.is_null() {
        return Err(format!(
            "ibv_open_device failed: {}",
            std::io::Error::last_os_error()
        ));
    }
    let result = probe_ports(context, name, named);
    // SAFETY: `context` was opened above and is closed once.
    unsafe { ffi::ibv_close_device(context) };
    result
}

fn probe_ports(
    context: *mut ffi::ibv_context,
    name: &str,
    named: bool,
) -> Result<Option<TestDevice>, String> {
    let mut device_attr = ffi::ibv_device_attr::default();
    // SAFETY: live context, writable attribute struct.
    let rc = unsafe { ffi::ibv_query_device(context, &mut device_attr) };
    if rc != 0 {
        return Err(format!(
            "ibv_query_device failed: {}",
            std::io::Error::from_raw_os_error(rc)
        ));
    }
    let wanted_port = if named {
        std::env::var(ENV_PORT)
            .ok()
            .and_then(|p| p.parse::<u8>().ok())
    } else {
        None
    };
    let wanted_gid = std::env::var(ENV_GID_INDEX)
        .ok()
        .and_then(|g| g.parse::<u32>().ok());
    for port in 1..=device_attr.phys_port_cnt {
        if wanted_port.is_some_and(|p| p != port) {
            continue;
        }
        let mut port_attr = ffi::ibv_port_attr::default();
        // SAFETY: live context, writable attribute struct.
        let rc = unsafe { ffi::ibv_query_port(context, port, &mut port_attr) };
        if rc != 0 || port_attr.state != ffi::IBV_PORT_ACTIVE {
            continue;
        }
        let is_ethernet = u32::from(port_attr.link_layer) == ffi::IBV_LINK_LAYER_ETHERNET;
        let gid_index = match wanted_gid {
            Some(index) => Some(index),
            None if is_ethernet => routable_roce_gid(context, port, port_attr.gid_tbl_len),
            None if port_attr.lid != 0 => Some(0),
            None => None,
        };
        let Some(gid_index) = gid_index else { continue };
        let gid = query_gid(context, port, gid_index)
            .ok_or_else(|| format!("cannot read GID {gid_index} of port {port}"))?;
        return Ok(Some(TestDevice {
            name: name.to_string(),
            port,
            gid_index,
            gid,
            lid: port_attr.lid,
            is_ethernet,
            addr: gid_to_ip(&gid),
        }));
    }
    Ok(None)
}

/// The first IPv4-mapped GID, RoCE v2 before RoCE v1.
fn routable_roce_gid(context: *mut ffi::ibv_context, port: u8, table_len: i32) -> Option<u32> {
    let mut best: Option<(u32, bool)> = None;
    for index in 0..u32::try_from(table_len).unwrap_or(0) {
        let mut entry = ffi::ibv_gid_entry::default();
        let size = std::mem::size_of::<ffi::ibv_gid_entry>();
        // SAFETY: live context, writable entry of `size` bytes; unset entries give an error.
        let rc =
            unsafe { ffi::_ibv_query_gid_ex(context, u32::from(port), index, &mut entry, 0, size) };
        if rc != 0 {
            continue;
        }
        // SAFETY: `raw` is the byte view of the GID union, valid for any bit pattern.
        let raw = unsafe { entry.gid.raw };
        if !is_ipv4_mapped(&raw) {
            continue;
        }
        let v2 = entry.gid_type == ffi::IBV_GID_TYPE_ROCE_V2;
        match best {
            Some((_, true)) => {}
            Some((_, false)) if !v2 => {}
            _ => best = Some((index, v2)),
        }
        if v2 {
            break;
        }
    }
    best.map(|(index, _)| index)
}

fn query_gid(context: *mut ffi::ibv_context, port: u8, index: u32) -> Option<[u8; 16]> {
    let mut gid = ffi::ibv_gid::default();
    let index = i32::try_from(index).ok()?;
    // SAFETY: live context, writable GID.
    let rc = unsafe { ffi::ibv_query_gid(context, port, index, &mut gid) };
    // SAFETY: `raw` is the byte view of the GID union; any bit pattern is valid.
    let raw = unsafe { gid.raw };
    (rc == 0).then_some(raw)
}

fn is_ipv4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

fn gid_to_ip(gid: &[u8; 16]) -> Option<IpAddr> {
    if is_ipv4_mapped(gid) {
        return Some(IpAddr::V4(Ipv4Addr::new(
            gid[12], gid[13], gid[14], gid[15],
        )));
    }
    let v6 = Ipv6Addr::from(*gid);
    (!v6.is_unspecified() && gid[0] != 0xfe).then_some(IpAddr::V6(v6))
}

/// A line on the real standard error (libtest keeps a passing test's `eprintln!` to itself),
/// for deviations and observations a reader of the run should see.
pub fn note(line: &str) {
    let _ = writeln!(std::io::stderr(), "NOTE: {line}");
}

/// `len` bytes of a recognisable pattern that `seed` shifts: byte `i` is `i * 31 + seed`
/// (wrapping), so a byte out of place or from another message shows.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_known_capabilities_can_be_checked() {
        // Unknown names are refused before any device is looked for.
        assert_eq!(device_lacks("a flux capacitor"), None);
        assert!(CAPABILITIES.contains(&"XRC"));
    }

    #[test]
    fn ipv4_mapped_gids_are_recognised() {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[169, 254, 7, 1]);
        assert!(is_ipv4_mapped(&gid));
        assert_eq!(gid_to_ip(&gid), Some("169.254.7.1".parse().unwrap()));
        let link_local: [u8; 16] = "fe80::1a:feff:fe39:e25a"
            .parse::<Ipv6Addr>()
            .unwrap()
            .octets();
        assert!(!is_ipv4_mapped(&link_local));
        assert_eq!(gid_to_ip(&link_local), None);
    }
}
