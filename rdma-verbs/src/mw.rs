//! Memory windows: remote access to part of a memory region, granted and revoked by the queue
//! pair, without registering anything.
//!
//! A window is allocated in a protection domain ([`ProtectionDomain::alloc_mw`]) and bound to a
//! byte range of a [`MemoryRegion`] registered with [`AccessFlags::MW_BIND`]. Binding gives the
//! window a new remote key; peers use that key for RDMA reads, writes and atomics inside the
//! range, with the window's rights.
//!
//! - **Type 1** windows are bound, re-bound and unbound (bound with an empty range) with
//!   [`QueuePair::bind_mw`](crate::QueuePair::bind_mw), which wraps `ibv_bind_mw`. Any queue
//!   pair of the domain carries the peer's accesses.
//! - **Type 2** windows are bound by a send work request, [`SendRequest::bind_mw`], posted on a
//!   queue pair of the window's protection domain; only that queue pair carries the peer's
//!   accesses. They are invalidated by [`SendRequest::local_invalidate`] or by a peer's
//!   [`SendRequest::send_with_invalidate`], and can then be bound again.
//!
//! A device must refuse a peer's access through a window outside the window's range. Soft-RoCE
//! (rxe, as of Linux 6.1) checks such accesses against the bounds of the region only.
//!
//! [`SendRequest::bind_mw`]: crate::wr::SendRequest::bind_mw
//! [`SendRequest::local_invalidate`]: crate::wr::SendRequest::local_invalidate
//! [`SendRequest::send_with_invalidate`]: crate::wr::SendRequest::send_with_invalidate

use std::fmt;
use std::ops::RangeBounds;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::error::{Errno, Error, Result};
use crate::ffi;
use crate::flags::AccessFlags;
use crate::mr::{MemoryRegion, range_bounds};
use crate::pd::ProtectionDomain;

/// The type of a memory window (`enum ibv_mw_type`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum MwType {
    /// `IBV_MW_TYPE_1`: bound with [`QueuePair::bind_mw`](crate::QueuePair::bind_mw)
    /// (`ibv_bind_mw`); usable through any queue pair of its protection domain.
    Type1,
    /// `IBV_MW_TYPE_2`: bound with a send work request
    /// ([`SendRequest::bind_mw`](crate::wr::SendRequest::bind_mw)) to the queue pair that posts it;
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
/// # Destroying the queue pair a window is bound to
///
/// A type 2 window an owned bind ([`SendRequest::bind_mw`] given an `&Arc<MemoryRegion>`) of a
/// queue pair handed to the
/// provider is deallocated by that queue pair's destruction ([`QueuePair::close`] or drop),
/// before `ibv_destroy_qp`, even if it was bound elsewhere since: a window bound through the
/// owned path belongs with its queue pair (allocate one per queue pair). rxe holds a queue
/// pair's destruction for about 50 s while a window is bound to it, then frees the queue pair
/// under the window; deallocating the window first ends the binding. Afterwards the window's
/// key grants nothing, [`is_allocated`](Self::is_allocated) says `false`, and a bind of it is
/// refused, when the request is made or when it is posted: allocate a new window.
///
/// A window bound by a borrowed bind ([`SendRequest::bind_mw`] given a `&MemoryRegion`) is not
/// recorded by the queue pair: invalidate it (or drop it) before its queue pair is destroyed.
/// Its `unsafe` post requires the window to stay allocated until the post returns, which the
/// destruction (on any thread, before or during the post) of a queue pair that bound it
/// through the owned path breaks; a scope's post ([`PostScope::send`](crate::scope::PostScope::send))
/// holds the window's lock across the verb, as an owned post does.
///
/// # Thread safety
///
/// `Send` and `Sync`: the window is a kernel object that may be used and deallocated from any
/// thread. Through `&self` the crate only reads fields of `ibv_mw` that never change, and the
/// provider only reads the key while posting a request that borrows the window. The key in
/// `ibv_mw` is written only under `&mut self` (by the crate before a type 2 bind, by the
/// provider in `ibv_bind_mw`), when no request borrows the window. Another thread may
/// deallocate the window (the destruction of a queue pair that bound it through the owned
/// path) while its owner holds it, even `&mut`: always under the window's lock, which an owned
/// or scoped post of a bind holds from its check that the window is allocated until the post verb
/// returns, and which a bind request's construction holds while it writes `ibv_mw`.
///
/// [`SendRequest::bind_mw`]: crate::wr::SendRequest::bind_mw
/// [`QueuePair::close`]: crate::QueuePair::close
pub struct MemoryWindow {
    shared: Arc<MwShared>,
    kind: MwType,
    /// The key of the latest bind (or of the allocation).
    rkey: u32,
}

/// What a window shares with the queue pairs it was bound through by the owned path: its
/// `ibv_mw` and domain, and whether it is still allocated.
pub(crate) struct MwShared {
    raw: NonNull<ffi::ibv_mw>,
    /// Kept alive while anything may deallocate the window.
    pd: ProtectionDomain,
    state: Mutex<MwState>,
}

struct MwState {
    /// Cleared once `ibv_dealloc_mw` succeeded.
    allocated: bool,
}

/// The window's lock, held by an owned post of a bind of it from the check that the window is
/// allocated until the post verb returns: no queue pair's destruction deallocates it meanwhile.
pub(crate) struct PostGuard<'a>(
    #[allow(dead_code, reason = "held for its drop")] MutexGuard<'a, MwState>,
);

/// The type 2 windows a queue pair's owned binds handed to the provider: each is deallocated
/// before the queue pair's destruction, so that no binding holds it.
#[derive(Default)]
pub(crate) struct BoundWindows(Mutex<Vec<Arc<MwShared>>>);

impl BoundWindows {
    fn lock(&self) -> MutexGuard<'_, Vec<Arc<MwShared>>> {
        // Nothing panics while holding it; a poisoned lock's list is still whole.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records `window`; forgets the windows deallocated meanwhile.
    pub(crate) fn keep(&self, window: Arc<MwShared>) {
        let mut windows = self.lock();
        windows.retain(|kept| kept.is_allocated());
        if !windows.iter().any(|kept| Arc::ptr_eq(kept, &window)) {
            windows.push(window);
        }
    }

    /// Deallocates every recorded window (before the queue pair's destruction); keeps those
    /// whose deallocation failed, for the next try.
    pub(crate) fn release_all(&self) {
        self.lock().retain(|window| window.release());
    }
}

impl fmt::Debug for BoundWindows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundWindows")
            .field("count", &self.lock().len())
            .finish()
    }
}

// SAFETY: the handle is usable from any thread (see "Thread safety" on `MemoryWindow`); the
// state is behind its lock.
unsafe impl Send for MwShared {}
// SAFETY: as above.
unsafe impl Sync for MwShared {}

impl MwShared {
    fn lock(&self) -> MutexGuard<'_, MwState> {
        // Nothing panics while holding it; a poisoned lock's state is still whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `ibv_dealloc_mw`, once, by the window's owner.
    fn dealloc(&self) -> Result<()> {
        let mut state = self.lock();
        if !state.allocated {
            return Ok(());
        }
        // SAFETY: a live window (allocated, checked under the lock every deallocation takes),
        // deallocated once; its owner is dropping or closing it, so no request borrows it.
        let ret = unsafe { ffi::ibv_dealloc_mw(self.raw.as_ptr()) };
        Errno::result(ret).map_err(|errno| Error::verb("ibv_dealloc_mw", errno))?;
        state.allocated = false;
        Ok(())
    }

    /// Called by a queue pair that handed an owned bind of the window to the provider, before
    /// it is destroyed: deallocates the window. Whether it is allocated after (a failure leaves
    /// it so; the destroy may then wait on the binding).
    pub(crate) fn release(&self) -> bool {
        let mut state = self.lock();
        if !state.allocated {
            return false;
        }
        // SAFETY: allocated, checked under the lock every deallocation takes; no owned post of
        // a bind of the window is running (it holds the lock from its own check to the end of
        // the post verb), and a `SendRequest` bind's post requires the window to stay
        // allocated until it returns (its `unsafe` contract).
        let ret = unsafe { ffi::ibv_dealloc_mw(self.raw.as_ptr()) };
        if ret == 0 {
            state.allocated = false;
        }
        state.allocated
    }

    /// Whether the window is still allocated.
    pub(crate) fn is_allocated(&self) -> bool {
        self.lock().allocated
    }

    /// Locks the window for an owned post of a bind of it, if it is still allocated.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if it was deallocated (by the destruction of a queue pair
    /// that bound it through the owned path).
    pub(crate) fn lock_for_post(&self) -> Result<PostGuard<'_>> {
        let state = self.lock();
        if !state.allocated {
            return Err(deallocated());
        }
        Ok(PostGuard(state))
    }
}

/// The refusal of a bind of a window a queue pair's destruction deallocated.
fn deallocated() -> Error {
    Error::InvalidArgument(
        "the window was deallocated when a queue pair it was bound through was destroyed: \
         allocate a new one"
            .into(),
    )
}

impl ProtectionDomain {
    /// `ibv_alloc_mw`: allocates a memory window of type `kind`, unbound.
    ///
    /// # Errors
    ///
    /// - [`Error::Unsupported`] if the device has no memory windows of that type (see
    ///   [`DeviceAttr::supports_mw_type1`](crate::device::DeviceAttr::supports_mw_type1) and
    ///   [`supports_mw_type2`](crate::device::DeviceAttr::supports_mw_type2));
    /// - [`Error::Verb`] with the errno of `ibv_alloc_mw` (`ENOMEM` past `max_mw`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use rdma_verbs::{Context, mw::MwType};
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
            shared: Arc::new(MwShared {
                raw,
                pd: self.clone(),
                state: Mutex::new(MwState { allocated: true }),
            }),
            kind,
            rkey,
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
        &self.shared.pd
    }

    /// Whether the window is still allocated: `false` once a queue pair that handed an owned
    /// bind of it to the provider was destroyed (see "Destroying the queue pair a window is
    /// bound to").
    pub fn is_allocated(&self) -> bool {
        self.shared.is_allocated()
    }

    /// The raw `ibv_mw`, valid while the window is allocated ([`is_allocated`](Self::is_allocated)).
    /// Its `rkey` field is the provider's copy of the key, which may lag [`rkey`](Self::rkey)
    /// for type 2 windows.
    pub fn as_raw(&self) -> *mut ffi::ibv_mw {
        self.shared.raw.as_ptr()
    }

    /// What the owned path registers with the queue pair that posts its bind.
    pub(crate) fn shared(&self) -> &Arc<MwShared> {
        &self.shared
    }

    /// Takes the key the provider stored in the window when a type 1 bind was posted.
    pub(crate) fn refresh_rkey(&mut self) -> u32 {
        // SAFETY: live window (a type 1 window is deallocated only by its owner); reading a
        // field the provider writes only during a bind call, which `&mut self` keeps from
        // running concurrently.
        self.rkey = unsafe { (*self.shared.raw.as_ptr()).rkey };
        self.rkey
    }

    /// The key a type 2 bind of the window gives it (`ibv_inc_rkey` of the current one),
    /// without taking it yet: the owned path takes it ([`commit_rkey`](Self::commit_rkey))
    /// once the bind is posted, so a refused or dropped request leaves the window as the
    /// device knows it. Also stores the current key where the provider reads the key a bind
    /// replaces (`ibv_mw.rkey`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the window was deallocated by the destruction of a queue
    /// pair that bound it through the owned path.
    pub(crate) fn preview_type2_rkey(&mut self) -> Result<u32> {
        let state = self.shared.lock();
        if !state.allocated {
            return Err(deallocated());
        }
        // SAFETY: live window (allocated, checked under the lock every deallocation takes,
        // held here); `&mut self` means no request borrowing it is being posted.
        unsafe { (*self.shared.raw.as_ptr()).rkey = self.rkey };
        drop(state);
        // SAFETY: `ibv_inc_rkey` only computes on its argument.
        Ok(unsafe { ffi::ibv_inc_rkey(self.rkey) })
    }

    /// Takes key `rkey`, from [`preview_type2_rkey`](Self::preview_type2_rkey), once its bind
    /// has been posted.
    pub(crate) fn commit_rkey(&mut self, rkey: u32) {
        self.rkey = rkey;
    }

    /// [`preview_type2_rkey`](Self::preview_type2_rkey) and
    /// [`commit_rkey`](Self::commit_rkey) at once, for [`SendRequest::bind_mw`], whose caller
    /// keeps the request and posts it (`unsafe`) when it likes.
    ///
    /// [`SendRequest::bind_mw`]: crate::wr::SendRequest::bind_mw
    pub(crate) fn next_type2_rkey(&mut self) -> Result<u32> {
        let rkey = self.preview_type2_rkey()?;
        self.commit_rkey(rkey);
        Ok(rkey)
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

impl MemoryWindow {
    /// `ibv_dealloc_mw`: what dropping does, with the failure reported. On failure the window
    /// is handed back; dropping it tries again.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with `ibv_dealloc_mw`'s errno (or [`Error::Unsupported`]).
    ///
    /// # References
    ///
    /// [`ibv_dealloc_mw(3)`](https://man7.org/linux/man-pages/man3/ibv_alloc_mw.3.html)
    #[doc(alias = "ibv_dealloc_mw")]
    pub fn close(self) -> std::result::Result<(), (Self, Error)> {
        match self.shared.dealloc() {
            Ok(()) => Ok(()),
            Err(error) => Err((self, error)),
        }
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        // Drop cannot report a failure and must not panic (see "Resource cleanup" in the crate
        // documentation). No request borrows the window any more.
        let _ = self.shared.dealloc();
    }
}

/// A checked bind: the window's range inside the region, as `ibv_mw_bind_info` wants it.
/// Public only in name (this module is private), for `BindRegion`'s hidden method.
#[derive(Copy, Clone, Debug)]
pub struct BindRange {
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
    if mw.pd().as_raw() != mr.pd().as_raw() {
        return Err(Error::InvalidArgument(
            "the window and the region belong to different protection domains".into(),
        ));
    }
    // A window outlives its bind: it stays bound, and usable by a peer, until it is bound
    // again, invalidated or deallocated, and a region with a window bound cannot be
    // deregistered (rxe refuses with EINVAL, and `Drop` cannot report it). A region that owns
    // its memory then leaks it, which is safe; memory promised by `register_raw` may be freed
    // by its owner once the region is dropped, and the peer would write freed memory.
    if !mr.owns_memory() {
        return Err(Error::InvalidArgument(
            "windows bind only to regions that own their memory (register, not register_raw)"
                .into(),
        ));
    }
    let (start, end) = range_bounds(range, mr.len());
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
