//! Fork support: whether memory registered before a `fork()` stays safe for the parent
//! (`ibv_fork_init`, `ibv_is_fork_initialized`).
//!
//! Kernels since 5.13 copy registered pages for the child on fork, so libibverbs has nothing to
//! do ([`ForkStatus::Unneeded`]). On older kernels `fork_init` must run before any memory is
//! registered: it then marks every registered range `MADV_DONTFORK`, so that the child does not
//! share (and the parent does not lose) pages the device uses.

use crate::c_enum::c_enum;
use crate::error::{Error, Result};
use crate::ffi;

c_enum! {
    /// Whether libibverbs protects registered memory across `fork()` (`enum ibv_fork_status`).
    ForkStatus: u32 {
        /// Not protected: `fork_init` was not called, and the kernel does not copy registered
        /// pages on fork. A child may then break the parent's registrations.
        Disabled = ffi::IBV_FORK_DISABLED,
        /// Protected: `fork_init` ran, and registered ranges are `MADV_DONTFORK`.
        Enabled = ffi::IBV_FORK_ENABLED,
        /// Nothing needed: the kernel copies registered pages on fork.
        Unneeded = ffi::IBV_FORK_UNNEEDED,
    }
}

/// `ibv_fork_init`: makes registered memory safe across `fork()` where the kernel needs
/// libibverbs' help; does nothing once done, or (before any registration) where the kernel
/// does not need it ([`ForkStatus::Unneeded`]). Call it first thing in `main`, before opening
/// a device: after memory was registered it is refused (`EINVAL`), even where unneeded
/// (rdma-core 44 checks that first). The environment variables
/// `RDMAV_FORK_SAFE` and `IBV_FORK_SAFE` do the same when a device is opened.
///
/// Protection is by page: registering memory marks every page it touches `MADV_DONTFORK`, so
/// a child also lacks whatever else shares those pages (other heap allocations beside a
/// region that does not fill its last page).
///
/// # Safety
///
/// No other thread uses libibverbs, librdmacm or a provider during the call (registering or
/// deregistering memory, creating queues, [`fork_status`]): libibverbs updates the state this
/// sets up without a lock, and those calls read it.
///
/// # Errors
///
/// [`Error::Verb`]: `EINVAL` when it is too late (memory was registered first, whatever the
/// kernel), `ENOMEM`;
/// [`Error::Unsupported`] when the kernel lacks `MADV_DONTFORK` (`ENOSYS`).
///
/// # References
///
/// [`ibv_fork_init(3)`](https://man7.org/linux/man-pages/man3/ibv_fork_init.3.html)
#[doc(alias = "ibv_fork_init")]
pub unsafe fn fork_init() -> Result<()> {
    // SAFETY: no arguments; the caller keeps every other libibverbs call out of the way.
    Error::check("ibv_fork_init", unsafe { ffi::ibv_fork_init() })
}

/// `ibv_is_fork_initialized`: whether registered memory is protected across `fork()`. It
/// reads the state [`fork_init`] sets up, which is why that one is `unsafe` to call beside
/// it.
///
/// # References
///
/// [`ibv_is_fork_initialized(3)`](https://man7.org/linux/man-pages/man3/ibv_is_fork_initialized.3.html)
#[doc(alias = "ibv_is_fork_initialized")]
pub fn fork_status() -> ForkStatus {
    // libibverbs' first initialisation calls `ibv_fork_init` itself when `RDMAV_FORK_SAFE` or
    // `IBV_FORK_SAFE` is set, under the device-list lock: taking the list once first orders
    // that write before the read below, whichever thread listed devices first.
    // SAFETY: a null count pointer is allowed; the list, if any, is freed once, unused.
    unsafe {
        let list = ffi::ibv_get_device_list(std::ptr::null_mut());
        if !list.is_null() {
            ffi::ibv_free_device_list(list);
        }
    }
    // SAFETY: no arguments; it reads the state libibverbs' initialisation (ordered above) and
    // `fork_init` (whose contract excludes this call running beside it) write, and asks the
    // kernel over netlink whether it copies registered pages on fork.
    ForkStatus::from_raw(unsafe { ffi::ibv_is_fork_initialized() })
}
