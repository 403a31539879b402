//! Memory windows: remote access to part of a memory region, granted and revoked by the queue
//! pair, without registering anything.
//!
//! A window is allocated in a protection domain ([`ProtectionDomain::alloc_mw`]) and bound to a
//! byte range of a [`MemoryRegion`] registered with [`AccessFlags::MW_BIND`]. Binding gives the
//! window a new remote key; peers use that key for RDMA reads, writes and atomics inside the
//! range, with the window's rights.
//!
//! - **Type 1** windows are bound, re-bound and unbound (bound with an empty range) with
//!   [`QueuePair::bind_mw`], which wraps `ibv_bind_mw`. Any queue pair of the domain carries the
//!   peer's accesses.
//! - **Type 2** windows are bound by a send work request, [`SendRequest::bind_mw`], posted on a
//!   queue pair of the window's protection domain; only that queue pair carries the peer's
//!   accesses. They are invalidated by [`SendRequest::local_invalidate`] or by a peer's
//!   [`SendRequest::send_with_invalidate`], and can then be bound again.
//!
//! A device must refuse a peer's access through a window outside the window's range. Soft-RoCE
//! (rxe, as of Linux 6.1) checks such accesses against the bounds of the region only.
//!
//! [`SendRequest::bind_mw`]: crate::SendRequest::bind_mw
//! [`SendRequest::local_invalidate`]: crate::SendRequest::local_invalidate
//! [`SendRequest::send_with_invalidate`]: crate::SendRequest::send_with_invalidate

use std::fmt;
use std::ops::{Bound, RangeBounds};
use std::ptr::NonNull;

use crate::error::{Errno, Error, Result};
use crate::ffi;
use crate::flags::AccessFlags;
use crate::mr::MemoryRegion;
use crate::pd::ProtectionDomain;
use crate::qp::{QueuePair, Rts, Transport};
use crate::wr::op;

/// The type of a memory window (`enum ibv_mw_type`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum MwType {
    /// `IBV_MW_TYPE_1`: bound with [`QueuePair::bind_mw`] (`ibv_bind_mw`); usable through any
    /// queue pair of its protection domain.
    Type1,
    /// `IBV_MW_TYPE_2`: bound with a send work request
    /// ([`SendRequest::bind_mw`](crate::SendRequest::bind_mw)) to the queue pair that posts it;
    /// invalidated by a work request.
    Type2,
}

impl MwType {
    fn as_raw(self) -> ffi::ibv_mw_type {
        match self {
            Self::Type1 => ffi::IBV_MW_TYPE_1,
            Self::Type2 => ffi::IBV_MW_TYPE_2,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Type1 => "memory windows of type 1",
            Self::Type2 => "memory windows of type 2",
        }
    }
}

/// A memory window (`struct ibv_mw`), made by [`ProtectionDomain::alloc_mw`].
///
/// Dropping it deallocates it (`ibv_dealloc_mw`), which also revokes any binding. It keeps its
/// protection domain alive. Not `Clone`: binding changes its key, which needs `&mut self`.
///
/// # The remote key
///
/// [`rkey`](Self::rkey) is the key of the window's latest bind: a bind gives the window a new
/// key (`ibv_inc_rkey` of the old one) and the old key stops working once the bind executes.
/// Hand the new key to the peer after the bind's completion. If a bind completes with an error,
/// the device keeps the old key and the window is best deallocated.
///
/// Drop (or unbind, or invalidate) a window before the region it is bound to: while a window is
/// bound, some devices (rxe among them) refuse to deregister the region, which then leaks its
/// memory.
///
/// # Thread safety
///
/// `Send` and `Sync`: the window is a kernel object that may be used and deallocated from any
/// thread. Through `&self` the crate only reads fields of `ibv_mw` that never change, and the
/// provider only reads the key while posting a request that borrows the window. The key in
/// `ibv_mw` is written only under `&mut self` (by the crate before a type 2 bind, by the
/// provider in `ibv_bind_mw`), when no request borrows the window.
pub struct MemoryWindow {
    raw: NonNull<ffi::ibv_mw>,
    kind: MwType,
    /// The key of the latest bind (or of the allocation).
    rkey: u32,
    pd: ProtectionDomain,
}

// SAFETY: see "Thread safety" above: the handle is usable from any thread, and its one mutable
// field is written only through `&mut self`.
unsafe impl Send for MemoryWindow {}
// SAFETY: as above; `&self` methods read immutable state only.
unsafe impl Sync for MemoryWindow {}

impl ProtectionDomain {
    /// `ibv_alloc_mw`: allocates a memory window of type `kind`, unbound.
    ///
    /// # Errors
    ///
    /// - [`Error::Unsupported`] if the device has no memory windows of that type (see
    ///   [`DeviceAttr::supports_mw_type1`](crate::DeviceAttr::supports_mw_type1) and
    ///   [`supports_mw_type2`](crate::DeviceAttr::supports_mw_type2));
    /// - [`Error::Verb`] with the errno of `ibv_alloc_mw` (`ENOMEM` past `max_mw`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use rdma_verbs::{Context, MwType};
    ///
    /// let context = Context::open("rxe0")?;
    /// let pd = context.alloc_pd()?;
    /// let mw = pd.alloc_mw(MwType::Type2)?;
    /// println!("window key {:#x}", mw.rkey());
    /// # Ok::<(), rdma_verbs::Error>(())
    /// ```
    ///
    /// # References
    ///
    /// [`ibv_alloc_mw(3)`](https://man7.org/linux/man-pages/man3/ibv_alloc_mw.3.html)
    #[doc(alias = "ibv_alloc_mw")]
    pub fn alloc_mw(&self, kind: MwType) -> Result<MemoryWindow> {
        // SAFETY: live PD.
        let raw = unsafe { ffi::ibv_alloc_mw(self.as_raw(), kind.as_raw()) };
        let Some(raw) = NonNull::new(raw) else {
            let error = Error::last("ibv_alloc_mw");
            if matches!(error, Error::Unsupported(_)) {
                return Err(Error::Unsupported(kind.name()));
            }
            // Providers report a type they lack with various errnos: ask the device.
            return match self.context().query_device() {
                Ok(attr)
                    if !(match kind {
                        MwType::Type1 => attr.supports_mw_type1(),
                        MwType::Type2 => attr.supports_mw_type2(),
                    }) =>
                {
                    Err(Error::Unsupported(kind.name()))
                }
                _ => Err(error),
            };
        };
        // SAFETY: a live window returned by the provider.
        let rkey = unsafe { (*raw.as_ptr()).rkey };
        Ok(MemoryWindow {
            raw,
            kind,
            rkey,
            pd: self.clone(),
        })
    }
}

impl MemoryWindow {
    /// The remote key of the latest bind (before any bind: the key from `ibv_alloc_mw`, which
    /// grants nothing).
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The window's type.
    pub fn mw_type(&self) -> MwType {
        self.kind
    }

    /// The protection domain it belongs to.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The raw `ibv_mw`, valid while the window lives. Its `rkey` field is the provider's copy
    /// of the key, which may lag [`rkey`](Self::rkey) for type 2 windows.
    pub fn as_raw(&self) -> *mut ffi::ibv_mw {
        self.raw.as_ptr()
    }

    /// Prepares a type 2 bind: records the current key in `ibv_mw` (where providers read the
    /// key being replaced) and takes the next one, which the bind request carries.
    pub(crate) fn next_type2_rkey(&mut self) -> u32 {
        // SAFETY: live window; `&mut self` means no request borrowing it is being posted.
        unsafe { (*self.raw.as_ptr()).rkey = self.rkey };
        // SAFETY: `ibv_inc_rkey` only computes on its argument.
        self.rkey = unsafe { ffi::ibv_inc_rkey(self.rkey) };
        self.rkey
    }
}

impl fmt::Debug for MemoryWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryWindow")
            .field("type", &self.kind)
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .finish()
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        // SAFETY: live window, deallocated once; no request borrows it any more.
        let ret = unsafe { ffi::ibv_dealloc_mw(self.raw.as_ptr()) };
        // Drop cannot report a failure and must not panic (see "Resource cleanup" in the
        // crate documentation).
        let _ = ret;
    }
}

/// A checked bind: the window's range inside the region, as `ibv_mw_bind_info` wants it.
#[derive(Copy, Clone, Debug)]
pub(crate) struct BindRange {
    pub(crate) addr: u64,
    pub(crate) length: u64,
}

/// Checks a bind of `mw` (which must be of type `kind`) to bytes `range` of `mr` with rights
/// `access`. An empty range (an unbind) is allowed only for type 1.
pub(crate) fn check_bind(
    mw: &MemoryWindow,
    kind: MwType,
    mr: &MemoryRegion,
    range: impl RangeBounds<usize>,
    access: AccessFlags,
) -> Result<BindRange> {
    if mw.kind != kind {
        return Err(Error::InvalidArgument(match mw.kind {
            MwType::Type1 => "a type 1 window is bound with QueuePair::bind_mw".into(),
            MwType::Type2 => "a type 2 window is bound with SendRequest::bind_mw".into(),
        }));
    }
    if mw.pd.as_raw() != mr.pd().as_raw() {
        return Err(Error::InvalidArgument(
            "the window and the region belong to different protection domains".into(),
        ));
    }
    // A window outlives its bind: it stays bound, and usable by a peer, until it is bound
    // again, invalidated or deallocated, and a region with a window bound cannot be
    // deregistered (rxe refuses with EBUSY, and `Drop` cannot report it). A region that owns
    // its memory then leaks it, which is safe; memory promised by `register_raw` may be freed
    // by its owner once the region is dropped, and the peer would write freed memory.
    if !mr.owns_memory() {
        return Err(Error::InvalidArgument(
            "windows bind only to regions that own their memory (register, not register_raw)"
                .into(),
        ));
    }
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => mr.len(),
    };
    if start > end || end > mr.len() {
        return Err(Error::InvalidArgument(format!(
            "window range {start}..{end} is not inside the {}-byte region",
            mr.len()
        )));
    }
    let range = BindRange {
        addr: mr.addr() + start as u64,
        length: (end - start) as u64,
    };
    if range.length == 0 {
        if kind == MwType::Type2 {
            return Err(Error::InvalidArgument(
                "a type 2 window cannot be bound to an empty range: invalidate it instead".into(),
            ));
        }
        // Unbinding grants nothing: the region's rights do not matter.
        return Ok(range);
    }
    if !mr.access().contains(AccessFlags::MW_BIND) {
        return Err(Error::InvalidArgument(
            "the region was not registered with AccessFlags::MW_BIND".into(),
        ));
    }
    // A window must not let peers write memory that the region hands out references to.
    let writes = access & (AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC);
    if !mr.access().contains(writes) {
        return Err(Error::InvalidArgument(format!(
            "the window grants {writes:?}, which the region was not registered with"
        )));
    }
    if kind == MwType::Type1 && access.contains(AccessFlags::ZERO_BASED) {
        return Err(Error::InvalidArgument(
            "type 1 windows cannot be zero-based".into(),
        ));
    }
    Ok(range)
}

impl<T: Transport> QueuePair<T, Rts> {
    /// `ibv_bind_mw`: binds type 1 window `mw` to bytes `range` of `mr` with rights `access`,
    /// and returns the window's new key (also [`mw.rkey()`](MemoryWindow::rkey) from now on).
    ///
    /// The bind is a work request on this queue pair's send queue: it executes in order with
    /// the requests posted before it, and the new key works (and the old one stops working)
    /// once it has. With `signaled`, it completes with
    /// [`WcOpcode::BindMw`](crate::WcOpcode::BindMw) and `wr_id`.
    ///
    /// An empty `range` unbinds the window: its key then grants nothing. (The region is still
    /// needed: some providers, rxe among them, read it even for an unbind.)
    ///
    /// `access` may hold [`REMOTE_READ`](AccessFlags::REMOTE_READ),
    /// [`REMOTE_WRITE`](AccessFlags::REMOTE_WRITE) and
    /// [`REMOTE_ATOMIC`](AccessFlags::REMOTE_ATOMIC). A window may only grant remote write and
    /// atomic rights that `mr` was registered with, so that the region keeps refusing Rust
    /// references to memory a peer may write.
    ///
    /// # Safety
    ///
    /// `mr` stays registered (is not dropped) until the bind has executed: until its completion
    /// is polled (unsignaled: until a later signaled request of this queue pair completes), or
    /// the queue pair is reset. The device finds the region by its key when the bind executes,
    /// and a key reused by a later registration would bind the window to that region's memory
    /// instead. And before [`QueuePair::scope`] is called on this queue pair, the bind's
    /// completion (if signaled) has been polled: a scope counts the completions of its queue
    /// pair as its own.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`], before posting, if `mw` is not of type 1, the window and
    ///   region belong to different protection domains or the window to another than the queue
    ///   pair, the region does not own its memory (`register_raw`), the range is outside the region, the
    ///   region lacks [`MW_BIND`](AccessFlags::MW_BIND) or a right the window would grant, the
    ///   window would be zero-based, or the transport has no binds (UD);
    /// - [`Error::QueueFull`] if the send queue is full;
    /// - [`Error::Verb`] with the errno of `ibv_bind_mw` (`EINVAL` for rights or ranges the
    ///   provider refuses), [`Error::Unsupported`] if the provider has no binds.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use rdma_verbs::{AccessFlags, MwType, QueuePair, Rc, Rts};
    ///
    /// # fn f(qp: &mut QueuePair<Rc, Rts>, pd: &rdma_verbs::ProtectionDomain) -> rdma_verbs::Result<()> {
    /// let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    /// let mr = pd.register(8192, rights | AccessFlags::MW_BIND)?;
    /// let mut mw = pd.alloc_mw(MwType::Type1)?;
    /// // SAFETY: `mr` outlives the bind's completion (and the window).
    /// let rkey = unsafe {
    ///     qp.bind_mw(&mut mw, 1, &mr, 0..4096, AccessFlags::REMOTE_WRITE, true)?
    /// };
    /// // ... poll the completion, then send `mr.addr()`, 4096 and `rkey` to the peer.
    /// # Ok(()) }
    /// ```
    ///
    /// # References
    ///
    /// [`ibv_bind_mw(3)`](https://man7.org/linux/man-pages/man3/ibv_bind_mw.3.html)
    #[doc(alias = "ibv_bind_mw")]
    pub unsafe fn bind_mw(
        &mut self,
        mw: &mut MemoryWindow,
        wr_id: u64,
        mr: &MemoryRegion,
        range: impl RangeBounds<usize>,
        access: AccessFlags,
        signaled: bool,
    ) -> Result<u32> {
        if T::OPS & op::BIND_MW == 0 {
            return Err(Error::InvalidArgument(format!(
                "{} queue pairs cannot bind memory windows",
                T::NAME
            )));
        }
        crate::wr::check_wr_id(wr_id, false)?;
        let range = check_bind(mw, MwType::Type1, mr, range, access)?;
        // `ibv_bind_mw` calls the window's provider with this queue pair: one of another
        // context would be read as that provider's own.
        if mw.pd.as_raw() != self.pd().as_raw() {
            return Err(Error::InvalidArgument(
                "the window belongs to another protection domain than the queue pair".into(),
            ));
        }
        let mut bind = ffi::ibv_mw_bind {
            wr_id,
            send_flags: if signaled { ffi::IBV_SEND_SIGNALED } else { 0 },
            bind_info: ffi::ibv_mw_bind_info {
                mr: mr.as_raw(),
                addr: range.addr,
                length: range.length,
                mw_access_flags: access.bits(),
            },
        };
        // SAFETY: live queue pair, window and region (borrowed for the call); `bind` is valid
        // and writable. `&mut mw` keeps anyone else from reading the key the provider updates.
        // The caller keeps the region registered until the bind has executed.
        let ret = unsafe { ffi::ibv_bind_mw(self.as_raw(), mw.raw.as_ptr(), &mut bind) };
        match Errno::result(ret) {
            Ok(()) => {}
            Err(Errno::NOMEM) => {
                return Err(Error::QueueFull {
                    verb: "ibv_bind_mw",
                    index: 0,
                });
            }
            Err(errno) => return Err(Error::verb("ibv_bind_mw", errno)),
        }
        // SAFETY: live window; the provider stored the new key in it.
        mw.rkey = unsafe { (*mw.raw.as_ptr()).rkey };
        Ok(mw.rkey)
    }
}
