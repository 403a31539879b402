//! Devices and device contexts: listing, opening, and querying device, port and GID table.
//! The context is in `context`, the attribute types in `attr`, GIDs in `gid`, fork support in
//! `fork`.

mod attr;
mod context;
mod fork;
mod gid;

use std::fmt;
use std::ptr::NonNull;

pub use attr::{
    AtomicCap, DeviceAttr, DeviceTransport, GidType, LinkLayer, Mtu, NodeType, PortAttr, PortState,
};
pub use context::Context;
pub use fork::{ForkStatus, fork_init, fork_status};
pub use gid::{Gid, GidEntry};

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
    transport: DeviceTransport,
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
                transport: DeviceTransport::from_raw((*raw.as_ptr()).transport_type),
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

    /// `ibv_get_device_index`: the kernel's index of the device (what `rdma dev` and netlink
    /// name it by), or `None` where the kernel does not report one (kernels before 5.4).
    ///
    /// # References
    ///
    /// [`ibv_get_device_index(3)`](https://man7.org/linux/man-pages/man3/ibv_get_device_index.3.html)
    #[doc(alias = "ibv_get_device_index")]
    pub fn index(&self) -> Option<u32> {
        // SAFETY: `raw` is a device of a live list (it borrows `self`).
        let index = unsafe { ffi::ibv_get_device_index(self.raw.as_ptr()) };
        u32::try_from(index).ok()
    }

    /// The node type (channel adapter, RNIC, ...).
    pub fn node_type(&self) -> NodeType {
        self.node_type
    }

    /// The transport (InfiniBand, which RoCE also reports, or iWARP, ...).
    pub fn transport(&self) -> DeviceTransport {
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
        Ok(Context::opened(raw))
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
