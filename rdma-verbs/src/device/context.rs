//! Device contexts: opening, borrowing, and the queries of a device, its ports and GIDs.

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, IntoRawFd};
use std::ptr::NonNull;
use std::sync::Arc;

use super::{DeviceAttr, GidEntry, GidType, PortAttr, devices, fixed_c_str};
use crate::error::{Errno, Error, Result};
use crate::ffi;

/// What keeps the `ibv_context` of a [`Context`] open.
enum Owner {
    /// Opened by [`Device::open`](crate::Device::open); closed on drop.
    Owned,
    /// Borrowed (for example from an `rdma_cm_id`); `_keep` keeps its real owner alive and the
    /// context is not closed here.
    Borrowed { _keep: Arc<dyn Send + Sync> },
}

pub(crate) struct ContextInner {
    raw: NonNull<ffi::ibv_context>,
    owner: Owner,
    /// Set once `ibv_close_device` succeeded (or, for a borrowed context, once closed).
    closed: bool,
}

// SAFETY: libibverbs contexts are thread-safe: every verb on them may be called from any thread
// (the provider locks what it shares), and the pointer is only freed on drop.
unsafe impl Send for ContextInner {}
// SAFETY: as above.
unsafe impl Sync for ContextInner {}

impl ContextInner {
    /// `ibv_close_device`, once, for a context this crate opened (a borrowed one is only let
    /// go). rdma-core frees the context whatever the call returns, so it is never called
    /// twice: a failure is reported, and the context is gone all the same.
    fn close(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        if let Owner::Owned = self.owner {
            // SAFETY: every child object holds an Arc to this context, so none is left; the
            // context is open (the flag was clear) and closed once.
            let ret = unsafe { ffi::ibv_close_device(self.raw.as_ptr()) };
            if ret != 0 {
                // Documented as -1 with errno set; a provider's positive errno is taken as is.
                let errno = if ret < 0 {
                    Errno::last()
                } else {
                    Errno::from_raw(ret)
                };
                return Err(Error::verb("ibv_close_device", errno));
            }
        }
        Ok(())
    }
}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // Drop cannot report a failure and must not panic (see "Resource cleanup" in the crate
        // documentation).
        let _ = self.close();
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
    /// A context `ibv_open_device` just opened, closed when its last clone goes.
    pub(super) fn opened(raw: NonNull<ffi::ibv_context>) -> Self {
        Context(Arc::new(ContextInner {
            raw,
            owner: Owner::Owned,
            closed: false,
        }))
    }
}

impl Context {
    /// `ibv_close_device`: what dropping the last handle does, with the failure reported. A
    /// context borrowed with [`from_raw_borrowed`](Self::from_raw_borrowed) is only let go.
    ///
    /// # Errors
    ///
    /// - `(Some(context), error)`: [`Error::Verb`] with `ibv_close_device` and `EBUSY`,
    ///   without calling it, while another handle or an object made from the context still
    ///   holds it; the context is handed back, open.
    /// - `(None, error)`: `ibv_close_device` failed. rdma-core releases the context whatever
    ///   it returns, so there is nothing to hand back or to retry.
    ///
    /// # References
    ///
    /// [`ibv_close_device(3)`](https://man7.org/linux/man-pages/man3/ibv_open_device.3.html)
    #[doc(alias = "ibv_close_device")]
    pub fn close(mut self) -> std::result::Result<(), (Option<Self>, Error)> {
        match Arc::get_mut(&mut self.0) {
            Some(inner) => inner.close().map_err(|error| (None, error)),
            None => Err((Some(self), Error::verb("ibv_close_device", Errno::BUSY))),
        }
    }
}

impl Context {
    /// Opens the device named `name`.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchDevice`] if no device has that name, else as [`devices`] and
    /// [`Device::open`](super::Device::open).
    pub fn open(name: &str) -> Result<Self> {
        let list = devices()?;
        let device = list
            .find(name)
            .ok_or_else(|| Error::NoSuchDevice(name.to_string()))?;
        device.open()
    }

    /// `ibv_import_device`: a context on the command descriptor of another one (its
    /// `cmd_fd`, passed from another process with `SCM_RIGHTS`, or duplicated here): both
    /// share the device's objects and their handles, so that the unsafe
    /// [`import_pd`](Self::import_pd) can reach a protection domain the other made. The
    /// descriptor is duplicated for the new context, which closes its copy when it closes;
    /// `fd` stays the caller's.
    ///
    /// A descriptor that is not a character device is refused before anything is duplicated.
    /// When the call itself fails the duplicate is left open (one descriptor lost): the
    /// provider may already have closed it, and closing it again could close a descriptor
    /// another thread has just been given the same number.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] where the provider cannot import (Soft-RoCE; mlx5 can);
    /// [`Error::Verb`] with `EINVAL` for a descriptor that is not a character device,
    /// `ENODEV` for one of no RDMA device, or the call's errno; [`Error::Verb`] with `dup`'s
    /// errno when the descriptor cannot be duplicated.
    ///
    /// # References
    ///
    /// [`ibv_import_device(3)`](https://man7.org/linux/man-pages/man3/ibv_import_device.3.html)
    #[doc(alias = "ibv_import_device")]
    pub fn import(fd: BorrowedFd<'_>) -> Result<Self> {
        // libibverbs' own first check, made before the duplicate exists, so that the commonest
        // wrong descriptor loses none.
        // SAFETY: `stat` is plain data the call fills; `fd` is open for the call (borrowed).
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0
            || stat.st_mode & libc::S_IFMT != libc::S_IFCHR
        {
            return Err(Error::verb("ibv_import_device", Errno::INVAL));
        }
        let copy = fd.try_clone_to_owned().map_err(|e| {
            Error::verb(
                "dup",
                Errno::from_raw(e.raw_os_error().unwrap_or(libc::EBADF)),
            )
        })?;
        let raw_fd = copy.into_raw_fd();
        // SAFETY: `raw_fd` is an open descriptor this call owns from here: on success the new
        // context owns it and closes it on `ibv_close_device`; on failure it is never used again
        // by this crate.
        let raw = unsafe { ffi::ibv_import_device(raw_fd) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_import_device"))?;
        Ok(Self::opened(raw))
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
            closed: false,
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

    /// Whether the device may be Soft-RoCE (vendor ID 0xffffff, or a device that cannot be
    /// queried), whose provider has bugs the crate works around (`cq/extended.rs`,
    /// `qp/extended.rs`).
    pub(crate) fn may_be_soft_roce(&self) -> bool {
        self.query_device().map_or(true, |attr| attr.is_soft_roce())
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

    /// `ibv_query_pkey`: entry `index` of port `port`'s P_Key table, in host byte order (the C
    /// call gives it in network byte order). RoCE ports have one entry, the default P_Key
    /// `0xffff`.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`]: `ENOENT` for an index past the table or a port the device lacks
    /// (libibverbs reads the entry from sysfs).
    ///
    /// # References
    ///
    /// [`ibv_query_pkey(3)`](https://man7.org/linux/man-pages/man3/ibv_query_pkey.3.html)
    #[doc(alias = "ibv_query_pkey")]
    pub fn query_pkey(&self, port: u8, index: u16) -> Result<u16> {
        let mut pkey: ffi::__be16 = 0;
        Errno::clear();
        // SAFETY: live context; `pkey` is writable.
        let ret = unsafe { ffi::ibv_query_pkey(self.as_raw(), port, i32::from(index), &mut pkey) };
        if ret != 0 {
            return Err(Error::last_or("ibv_query_pkey", Errno::IO));
        }
        Ok(u16::from_be(pkey))
    }

    /// `ibv_get_pkey_index`: the index of P_Key `pkey` (host byte order) in port `port`'s
    /// table, as a queue pair's `pkey_index` names it.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`]: `ENOENT` when the table has no such P_Key (libibverbs read every entry)
    /// or the device has no such port.
    ///
    /// # References
    ///
    /// [`ibv_get_pkey_index(3)`](https://man7.org/linux/man-pages/man3/ibv_get_pkey_index.3.html)
    #[doc(alias = "ibv_get_pkey_index")]
    pub fn pkey_index(&self, port: u8, pkey: u16) -> Result<u16> {
        Errno::clear();
        // SAFETY: live context.
        let ret = unsafe { ffi::ibv_get_pkey_index(self.as_raw(), port, pkey.to_be()) };
        if ret < 0 {
            return Err(Error::last_or("ibv_get_pkey_index", Errno::IO));
        }
        u16::try_from(ret)
            .map_err(|_| Error::InvalidArgument(format!("ibv_get_pkey_index returned index {ret}")))
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
