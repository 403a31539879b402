//! The devices the connection manager uses (`rdma_get_devices`).

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_verbs::Context;
use rdma_verbs_sys as ffi;

use crate::error::{Error, Result};

/// The array `rdma_get_devices` returned, freed with `rdma_free_devices` when the last
/// context of it is gone.
struct DeviceArray(NonNull<*mut ffi::ibv_context>);

// SAFETY: the array is only freed (once, on drop); librdmacm's device list is locked inside
// librdmacm.
unsafe impl Send for DeviceArray {}
// SAFETY: as above; nothing is reached through `&DeviceArray`.
unsafe impl Sync for DeviceArray {}

impl Drop for DeviceArray {
    fn drop(&mut self) {
        // SAFETY: returned by `rdma_get_devices`, freed once, after every context borrowed
        // from it (each holds this array) is gone.
        unsafe { ffi::rdma_free_devices(self.0.as_ptr()) };
    }
}

/// `rdma_get_devices`: the device contexts the connection manager opened, one per RDMA
/// device, the same contexts its identifiers bind to ([`CmId::context`](crate::CmId::context)).
///
/// Each [`Context`] keeps librdmacm's list alive; protection domains, queues and regions made
/// from one can serve any identifier bound to that device.
///
/// # Errors
///
/// [`Error::Call`] with `rdma_get_devices` and its errno (`ENODEV` without RDMA devices, as
/// librdmacm reports it).
///
/// # References
///
/// [`rdma_get_devices(3)`](https://man7.org/linux/man-pages/man3/rdma_get_devices.3.html)
#[doc(alias = "rdma_get_devices")]
#[doc(alias = "rdma_free_devices")]
pub fn devices() -> Result<Vec<Context>> {
    let mut count = 0;
    // SAFETY: `count` is writable; the array is freed by `DeviceArray`.
    let raw = unsafe { ffi::rdma_get_devices(&mut count) };
    let Some(raw) = NonNull::new(raw) else {
        return Err(Error::last("rdma_get_devices"));
    };
    let array = Arc::new(DeviceArray(raw));
    let count = usize::try_from(count).unwrap_or(0);
    let mut contexts = Vec::with_capacity(count);
    for i in 0..count {
        // SAFETY: the array holds `count` entries (then a null one).
        let context = unsafe { *raw.as_ptr().add(i) };
        let Some(context) = NonNull::new(context) else {
            break;
        };
        let keep: Arc<dyn Send + Sync> = array.clone();
        // SAFETY: librdmacm keeps the contexts of its list open until the list is freed;
        // `keep` holds the list for as long as the context and everything made from it.
        contexts.push(unsafe { Context::from_raw_borrowed(context, keep) });
    }
    Ok(contexts)
}
