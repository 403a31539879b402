//! Queue pairs the connection manager makes (`rdma_create_qp`, or `rdma_create_qp_ex` for the
//! extended send path) and then moves through their states itself while connecting, as
//! rdma-core's endpoint examples use them; destroyed as `rdma_destroy_qp` would, with its
//! failure reported.

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_verbs::qp::{QpBuilder, QpMaker};
use rdma_verbs::{
    QueuePair,
    qp::{Init, Rc},
};
use rdma_verbs_sys as ffi;

use crate::error::{Error, Result};
use crate::id::{CmId, IdInner, PortSpace};

/// An identifier whose calls take a lock: a [`CmId`]'s (its channel's) or an
/// [`Endpoint`](crate::Endpoint)'s (its own).
pub(crate) trait IdHandle: Send + Sync + 'static {
    /// Runs `f` on the live identifier, under its lock.
    fn with_id<R>(&self, f: impl FnOnce(*mut ffi::rdma_cm_id) -> R) -> R;
}

impl IdHandle for IdInner {
    fn with_id<R>(&self, f: impl FnOnce(*mut ffi::rdma_cm_id) -> R) -> R {
        self.with(f)
    }
}

/// Makes and destroys the queue pair of one identifier.
struct IdQpMaker<H: IdHandle>(Arc<H>);

// SAFETY: `rdma_create_qp_ex` creates the queue pair with `ibv_create_qp_ex` on the
// identifier's device from the attributes given (its PD must be of that device, checked by
// librdmacm; the CQs and SRQ are the attributes' own, as librdmacm creates none when both CQs
// are given), writing back the capacities, and records it in the identifier; it then moves it
// to INIT (or, for a failure, destroys it). `destroy` destroys it with `ibv_destroy_qp` once
// the identifier no longer names it (what `rdma_destroy_qp` does, except that a failure
// leaves it named and alive). In between librdmacm only moves it through its states while
// connecting (RTR, RTS) and disconnecting (ERR).
unsafe impl<H: IdHandle> QpMaker for IdQpMaker<H> {
    fn create(&self, attr: &mut ffi::ibv_qp_init_attr_ex) -> *mut ffi::ibv_qp {
        let (qp, errno) = self.0.with_id(|raw| {
            let ret = if attr.comp_mask == ffi::IBV_QP_INIT_ATTR_PD {
                // No extension: the classic call, whose attributes are the extended ones'
                // prefix.
                // SAFETY: a live identifier, under its lock; `attr` is valid and writable,
                // `ibv_qp_init_attr` is its prefix, and it names live objects (the builder's).
                unsafe { ffi::rdma_create_qp(raw, attr.pd, std::ptr::from_mut(attr).cast()) }
            } else {
                // SAFETY: as above.
                unsafe { ffi::rdma_create_qp_ex(raw, attr) }
            };
            let qp = if ret == 0 {
                // SAFETY: as above; read under the same lock.
                unsafe { (*raw).qp }
            } else {
                std::ptr::null_mut()
            };
            (
                qp,
                std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
            )
        });
        if qp.is_null() {
            // The errno of the call, not of the unlock after it.
            // SAFETY: this thread's errno.
            unsafe { *libc::__errno_location() = errno };
        }
        qp
    }

    fn destroy(&self, qp: NonNull<ffi::ibv_qp>) -> i32 {
        // `rdma_destroy_qp` ignores a failing `ibv_destroy_qp` and forgets the queue pair
        // anyway, and it would run under the identifier's lock, while the provider may take a
        // completion queue's lock that a poll session holds (mlx5): the identifier forgets
        // its queue pair under the lock, the destroy runs outside it, and a failure gives it
        // back.
        let taken = self.0.with_id(|raw| {
            // SAFETY: a live identifier, under its lock.
            unsafe {
                if (*raw).qp != qp.as_ptr() {
                    return false;
                }
                (*raw).qp = std::ptr::null_mut();
            }
            true
        });
        if !taken {
            // Not this identifier's queue pair (cannot happen: the maker is per queue pair);
            // refused rather than destroying another one.
            return libc::EINVAL;
        }
        // SAFETY: the identifier's queue pair, which it no longer names; destroyed once (the
        // queue pair's owner calls this once on success).
        let ret = unsafe { ffi::ibv_destroy_qp(qp.as_ptr()) };
        if ret != 0 {
            self.0.with_id(|raw| {
                // SAFETY: a live identifier, under its lock; the queue pair still exists.
                unsafe {
                    if (*raw).qp.is_null() {
                        (*raw).qp = qp.as_ptr();
                    }
                }
            });
        }
        ret
    }
}

/// `rdma_create_qp_ex` on `id` with `builder`'s attributes: an RC queue pair in INIT.
pub(crate) fn make_qp<H: IdHandle>(
    id: Arc<H>,
    builder: QpBuilder<'_, Rc>,
) -> Result<QueuePair<Rc, Init>> {
    let maker: Arc<dyn QpMaker> = Arc::new(IdQpMaker(id));
    // SAFETY: `IdQpMaker` keeps the maker's contract (above), and `rdma_create_qp_ex` leaves
    // an RC queue pair in INIT.
    Ok(unsafe { builder.build_by::<Init>(maker) }?)
}

impl CmId {
    /// `rdma_create_qp_ex`: the identifier's own queue pair, made by the connection manager
    /// from `builder` (its protection domain on this identifier's device) and moved to INIT.
    /// The connection manager then moves it on itself:
    /// [`connect_init_qp`](Self::connect_init_qp) and [`accept_init_qp`](Self::accept_init_qp)
    /// return it in RTS. It keeps the identifier alive, and is destroyed with
    /// `rdma_destroy_qp`.
    ///
    /// Post its first receives before connecting or accepting: the peer may send as soon as
    /// the connection is established.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`] for an identifier of another port space than TCP (RC).
    /// - [`Error::Verbs`] with `rdma_create_qp_ex` and its errno: `EINVAL` where the
    ///   identifier has a queue pair already or no device yet, or the protection domain is
    ///   not of the identifier's own [`context`](Self::context) (librdmacm compares the
    ///   context itself: one opened with `Context::open` on the same device is another);
    ///   as [`QpBuilder::build`] otherwise (with `ibv_create_qp_ex` for
    ///   `SendPath::Extended`'s refusals).
    ///
    /// # References
    ///
    /// [`rdma_create_qp(3)`](https://man7.org/linux/man-pages/man3/rdma_create_qp.3.html)
    #[doc(alias = "rdma_create_qp_ex")]
    #[doc(alias = "rdma_create_qp")]
    #[doc(alias = "rdma_destroy_qp")]
    pub fn create_qp(&self, builder: QpBuilder<'_, Rc>) -> Result<QueuePair<Rc, Init>> {
        if self.port_space() != PortSpace::Tcp {
            return Err(Error::InvalidArgument(
                "rdma_create_qp_ex: an RC queue pair needs an identifier of the TCP port space",
            ));
        }
        make_qp(self.0.clone(), builder)
    }

    /// Whether `qp` is the queue pair this identifier made ([`create_qp`](Self::create_qp)),
    /// which the connection manager moves through its states itself.
    pub(crate) fn made(&self, qp: &QueuePair<Rc, Init>) -> bool {
        // SAFETY: a live identifier, read under its channel's lock.
        self.0.with(|raw| unsafe { (*raw).qp }) == qp.as_raw()
    }

    /// Refuses `qp` on the paths where the caller moves the queue pair: one of another device
    /// than the identifier's (the connection manager would announce a queue pair number that
    /// does not exist there), one another identifier made, or any other than the identifier's
    /// own while it has one (librdmacm would connect that one, whatever the parameters say).
    pub(crate) fn check_qp<S: rdma_verbs::qp::QpState>(&self, qp: &QueuePair<Rc, S>) -> Result<()> {
        self.check_device(qp.pd().context())?;
        // SAFETY: a live identifier, read under its channel's lock.
        let own = self.0.with(|raw| unsafe { (*raw).qp });
        if !own.is_null() && own != qp.as_raw() {
            return Err(Error::InvalidArgument(
                "the identifier has a queue pair of its own (create_qp): connect that one",
            ));
        }
        if own.is_null() && qp.has_maker() {
            return Err(Error::InvalidArgument(
                "the queue pair belongs to another identifier (create_qp)",
            ));
        }
        Ok(())
    }
}
