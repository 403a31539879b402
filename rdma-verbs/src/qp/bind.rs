//! Binding type 1 memory windows (`ibv_bind_mw`): a work request on the send queue, posted by
//! its own verb.

use std::ops::RangeBounds;

use super::{QueuePair, Rts, Transport};
use crate::error::{Errno, Error, Result};
use crate::ffi;
use crate::flags::AccessFlags;
use crate::mr::MemoryRegion;
use crate::mw::{MemoryWindow, MwType, check_bind};
use crate::wr::{check_wr_id, op};

impl<T: Transport> QueuePair<T, Rts> {
    /// `ibv_bind_mw`: binds type 1 window `mw` to bytes `range` of `mr` with rights `access`,
    /// and returns the window's new key (also [`mw.rkey()`](MemoryWindow::rkey) from now on).
    ///
    /// The bind is a work request on this queue pair's send queue: it executes in order with
    /// the requests posted before it, and the new key works (and the old one stops working)
    /// once it has. With `signaled`, it completes with
    /// [`WcOpcode::BindMw`](crate::cq::WcOpcode::BindMw) and `wr_id`.
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
    /// use rdma_verbs::{QueuePair, mr::AccessFlags, mw::MwType, qp::{Rc, Rts}};
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
        check_wr_id(wr_id, false)?;
        let range = check_bind(mw, MwType::Type1, mr, range, access)?;
        // `ibv_bind_mw` calls the window's provider with this queue pair: one of another
        // context would be read as that provider's own.
        if mw.pd().as_raw() != self.pd().as_raw() {
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
        let ret = unsafe { ffi::ibv_bind_mw(self.as_raw(), mw.as_raw(), &mut bind) };
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
        Ok(mw.refresh_rkey())
    }
}
