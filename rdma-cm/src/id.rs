//! Identifiers (`rdma_cm_id`): the connection manager's sockets.

use std::mem::ManuallyDrop;
use std::net::SocketAddr;
use std::num::NonZeroU16;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rdma_verbs::qp::Ece;
use rdma_verbs::{
    Context,
    async_event::AsyncEvent,
    qp::{QpStateKind, RawModifyAttr},
};
use rdma_verbs_sys as ffi;

use crate::addr;
use crate::channel::EventChannel;
use crate::error::{Error, Result};
use crate::group::Groups;
use crate::param::ConnParam;

/// The port space of an identifier: what kind of service it connects to.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PortSpace {
    /// `RDMA_PS_TCP`: reliable connections (RC queue pairs), like TCP.
    Tcp,
    /// `RDMA_PS_UDP`: unreliable datagrams (UD queue pairs), like UDP.
    Udp,
    /// `RDMA_PS_IB`: any queue pair type, InfiniBand service IDs.
    Ib,
}

impl PortSpace {
    pub(crate) fn raw(self) -> ffi::rdma_port_space {
        match self {
            PortSpace::Tcp => ffi::RDMA_PS_TCP,
            PortSpace::Udp => ffi::RDMA_PS_UDP,
            PortSpace::Ib => ffi::RDMA_PS_IB,
        }
    }

    pub(crate) fn qp_type(self) -> ffi::ibv_qp_type {
        match self {
            PortSpace::Udp => ffi::IBV_QPT_UD,
            PortSpace::Tcp | PortSpace::Ib => ffi::IBV_QPT_RC,
        }
    }
}

/// An identifier (`rdma_create_id`): bound to an address, it listens or connects, and the
/// connection manager reports what happens to it on its [`EventChannel`].
///
/// Handles are reference-counted: the identifier is destroyed (`rdma_destroy_id`) when the
/// last of them is gone — this handle, its clones, every [`Event`](crate::Event) about it, and
/// every verbs object made from its [`context`](Self::context). So no drop order can destroy it
/// under an event that is not acknowledged (librdmacm would wait forever) or under its
/// device's queue pairs, and its channel lives as long as it.
///
/// # References
///
/// [`rdma_create_id(3)`](https://man7.org/linux/man-pages/man3/rdma_create_id.3.html)
#[derive(Clone, Debug)]
#[doc(alias = "rdma_create_id")]
pub struct CmId(pub(crate) Arc<IdInner>);

#[derive(Debug)]
pub(crate) struct IdInner {
    raw: NonNull<ffi::rdma_cm_id>,
    /// The channel it reports on now (`rdma_migrate_id` changes it).
    channel: Mutex<EventChannel>,
    /// Events about it that are not acknowledged yet.
    pub(crate) held: AtomicUsize,
    /// Whether `rdma_listen` succeeded on it (a listener is not migrated).
    listening: std::sync::atomic::AtomicBool,
    pub(crate) ps: PortSpace,
    /// The multicast groups it joined and not left yet.
    pub(crate) groups: Mutex<Groups>,
}

// SAFETY: librdmacm's calls on an identifier may come from any thread; the ones that read or
// write its fields are serialised by its channel's lock (`IdInner::with`), and event reading
// takes the same lock.
unsafe impl Send for IdInner {}
// SAFETY: as above.
unsafe impl Sync for IdInner {}

impl IdInner {
    /// Wraps `raw`, created on (or handed over to) `channel`, and records a weak pointer to
    /// the wrapper in its `context`, where events find it.
    ///
    /// # Safety
    ///
    /// `raw` is a live identifier on `channel` that nothing else wraps or destroys, and the
    /// caller holds `channel`'s lock.
    pub(crate) unsafe fn register(
        raw: NonNull<ffi::rdma_cm_id>,
        ps: PortSpace,
        channel: EventChannel,
    ) -> Arc<Self> {
        let inner = Arc::new(IdInner {
            raw,
            channel: Mutex::new(channel),
            held: AtomicUsize::new(0),
            listening: std::sync::atomic::AtomicBool::new(false),
            ps,
            groups: Mutex::new(Groups::default()),
        });
        let weak = Weak::into_raw(Arc::downgrade(&inner));
        // SAFETY: a live identifier; only this crate writes `context`, under the channel
        // lock, and librdmacm only copies it (into identifiers of connect requests).
        unsafe { (*raw.as_ptr()).context = weak.cast_mut().cast() };
        inner
    }

    /// The wrapper of identifier `raw`, if it is one of this crate's and still alive. A
    /// wrapper found but not `raw`'s goes to `discard`, for the caller to drop after it let go
    /// of the channel lock (dropping the last handle takes that lock).
    ///
    /// # Safety
    ///
    /// `raw` is a live identifier (one an unacknowledged event names), and the caller holds
    /// the lock of the channel the event came from.
    pub(crate) unsafe fn lookup(
        raw: *mut ffi::rdma_cm_id,
        discard: &mut Vec<Arc<Self>>,
    ) -> Option<Arc<Self>> {
        if raw.is_null() {
            return None;
        }
        // SAFETY: a live identifier (the caller's contract).
        let context = unsafe { (*raw).context }.cast::<IdInner>().cast_const();
        if context.is_null() {
            return None;
        }
        // SAFETY: every identifier of this crate's channels has in `context` a pointer from
        // `Weak::into_raw` of its wrapper (or, for a connect request's new identifier not
        // claimed yet, of its listener's), and that weak reference is only given up after
        // `rdma_destroy_id`, which cannot have returned while an event names the identifier.
        // The weak count is not touched here (ManuallyDrop); `upgrade` fails once the wrapper
        // is being dropped.
        let weak = ManuallyDrop::new(unsafe { Weak::from_raw(context) });
        let inner = weak.upgrade()?;
        if inner.raw.as_ptr() == raw {
            Some(inner)
        } else {
            discard.push(inner);
            None
        }
    }

    /// Runs `f` on the raw identifier with its channel's lock held, after checking that it is
    /// bound to a device: librdmacm dereferences the device in `rdma_resolve_route`,
    /// `rdma_connect` and `rdma_accept` without checking.
    pub(crate) fn with_device<R>(
        &self,
        f: impl FnOnce(*mut ffi::rdma_cm_id) -> Result<R>,
    ) -> Result<R> {
        self.with(|raw| {
            // SAFETY: a live identifier, read under its channel's lock.
            if unsafe { (*raw).verbs }.is_null() {
                return Err(Error::NoDevice);
            }
            f(raw)
        })
    }

    /// This identifier's channel now.
    pub(crate) fn channel(&self) -> EventChannel {
        self.channel
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Runs `f` on the raw identifier with its channel's lock held.
    pub(crate) fn with<R>(&self, f: impl FnOnce(*mut ffi::rdma_cm_id) -> R) -> R {
        loop {
            let channel = self.channel();
            let _guard = channel.0.lock();
            // A migration between reading the channel and locking it: lock the new one.
            if self.channel().same_as(&channel) {
                return f(self.raw.as_ptr());
            }
        }
    }

    pub(crate) fn raw(&self) -> *mut ffi::rdma_cm_id {
        self.raw.as_ptr()
    }
}

impl Drop for IdInner {
    fn drop(&mut self) {
        let channel = self
            .channel
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let guard = channel.0.lock();
        // SAFETY: a live identifier; `context` is only written under this lock. It is cleared
        // first, so that if the destroy fails, an event about the identifier finds no wrapper.
        let context = unsafe {
            let context = (*self.raw.as_ptr()).context;
            (*self.raw.as_ptr()).context = std::ptr::null_mut();
            context
        };
        // Groups still joined are left first (librdmacm would leak their records otherwise).
        let groups = self.groups.get_mut().unwrap_or_else(|e| e.into_inner());
        // SAFETY: a live identifier, its channel's lock held; no event about it is held (each
        // holds this wrapper), so no group has one and no leave waits.
        unsafe { groups.leave_all(self.raw.as_ptr()) };
        // SAFETY: no handle, event or verbs object holds the identifier any more (each holds
        // this wrapper), so every event read about it was acknowledged and rdma_destroy_id
        // does not wait; events not read yet are discarded by the kernel.
        let destroyed = unsafe { ffi::rdma_destroy_id(self.raw.as_ptr()) } == 0;
        drop(guard);
        if !context.is_null() && destroyed {
            // SAFETY: the weak reference `register` stored; after rdma_destroy_id no event
            // can name the identifier, so no `lookup` reads it any more. (When the destroy
            // failed, the identifier lives on in librdmacm: the weak reference is leaked, so
            // that its allocation stays valid for anything that still reads the pointer.)
            drop(unsafe { Weak::from_raw(context.cast::<IdInner>().cast_const()) });
        }
    }
}

/// A timeout in whole milliseconds for librdmacm, at least 1.
fn millis(timeout: Duration) -> i32 {
    i32::try_from(timeout.as_millis())
        .unwrap_or(i32::MAX)
        .max(1)
}

/// Refuses parameters naming queue pair `qp_num` (0: none) on an identifier that has a queue
/// pair of its own with another number: librdmacm would announce its own, whatever they say.
///
/// # Safety
///
/// `raw` is a live identifier, under its channel's lock.
unsafe fn check_own_qp(raw: *mut ffi::rdma_cm_id, qp_num: u32) -> Result<()> {
    // SAFETY: the caller's guarantee; the queue pair it names is alive while it names it.
    let own = unsafe { (*raw).qp.as_ref().map(|qp| qp.qp_num) };
    match own {
        Some(own) if qp_num != 0 && qp_num != own => Err(Error::InvalidArgument(
            "the identifier has a queue pair of its own (create_qp): the parameters name another",
        )),
        _ => Ok(()),
    }
}

/// `private_data` as a reject call takes it: a pointer (null when empty) and a length that
/// fits in a byte.
fn private_data_arg(private_data: &[u8]) -> Result<(*const std::ffi::c_void, u8)> {
    let len = u8::try_from(private_data.len()).map_err(|_| Error::PrivateDataTooLong {
        len: private_data.len(),
    })?;
    let data = if private_data.is_empty() {
        std::ptr::null()
    } else {
        private_data.as_ptr().cast()
    };
    Ok((data, len))
}

/// Maps a librdmacm return value (0, or -1 with errno) to a result.
pub(crate) fn check(call: &'static str, ret: i32) -> Result<()> {
    if ret == 0 {
        Ok(())
    } else {
        Err(Error::last(call))
    }
}

impl CmId {
    /// `rdma_create_id`: a new identifier in port space `ps`, reporting on `channel`.
    ///
    /// # Errors
    ///
    /// [`Error::Call`] with `rdma_create_id`.
    ///
    /// # References
    ///
    /// [`rdma_create_id(3)`](https://man7.org/linux/man-pages/man3/rdma_create_id.3.html)
    #[doc(alias = "rdma_create_id")]
    pub fn new(channel: &EventChannel, ps: PortSpace) -> Result<Self> {
        let _guard = channel.0.lock();
        let mut raw = std::ptr::null_mut();
        // SAFETY: a live channel; `raw` is written on success.
        let ret = unsafe {
            ffi::rdma_create_id(channel.as_raw(), &mut raw, std::ptr::null_mut(), ps.raw())
        };
        check("rdma_create_id", ret)?;
        let raw = NonNull::new(raw).ok_or(Error::Call {
            call: "rdma_create_id",
            errno: rdma_verbs::Errno::from_raw(libc::ENOMEM),
        })?;
        // SAFETY: just created on `channel`, whose lock is held.
        Ok(Self(unsafe { IdInner::register(raw, ps, channel.clone()) }))
    }

    /// `rdma_bind_addr`: binds to a local address (port 0: any free port). Binding to an
    /// address of an RDMA device's interface also binds the identifier to that device.
    ///
    /// # Errors
    ///
    /// [`Error::Call`] with `rdma_bind_addr` (`EADDRINUSE`, `EADDRNOTAVAIL`...).
    ///
    /// # References
    ///
    /// [`rdma_bind_addr(3)`](https://man7.org/linux/man-pages/man3/rdma_bind_addr.3.html)
    #[doc(alias = "rdma_bind_addr")]
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        let mut storage = addr::to_storage(addr);
        self.0.with(|raw| {
            // SAFETY: a live identifier; the address is read during the call.
            check("rdma_bind_addr", unsafe {
                ffi::rdma_bind_addr(raw, (&raw mut storage).cast())
            })
        })
    }

    /// `rdma_resolve_addr`: starts resolving `dst` (and binds to `src` or a local address
    /// that reaches it); [`EventKind::AddrResolved`](crate::EventKind::AddrResolved) or
    /// `AddrError` follows within about `timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::Call`] with `rdma_resolve_addr`.
    ///
    /// # References
    ///
    /// [`rdma_resolve_addr(3)`](https://man7.org/linux/man-pages/man3/rdma_resolve_addr.3.html)
    #[doc(alias = "rdma_resolve_addr")]
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        let mut src = src.map(addr::to_storage);
        let mut dst = addr::to_storage(dst);
        let src_ptr = src
            .as_mut()
            .map_or(std::ptr::null_mut(), |s| std::ptr::from_mut(s).cast());
        self.0.with(|raw| {
            // SAFETY: a live identifier; both addresses are read during the call.
            check("rdma_resolve_addr", unsafe {
                ffi::rdma_resolve_addr(raw, src_ptr, (&raw mut dst).cast(), millis(timeout))
            })
        })
    }

    /// `rdma_resolve_route`: starts resolving the route to the resolved address;
    /// `RouteResolved` or `RouteError` follows.
    ///
    /// # Errors
    ///
    /// [`Error::NoDevice`] before an address is resolved; [`Error::Call`] with
    /// `rdma_resolve_route`.
    ///
    /// # References
    ///
    /// [`rdma_resolve_route(3)`](https://man7.org/linux/man-pages/man3/rdma_resolve_route.3.html)
    #[doc(alias = "rdma_resolve_route")]
    pub fn resolve_route(&self, timeout: Duration) -> Result<()> {
        self.0.with_device(|raw| {
            // SAFETY: a live identifier.
            check("rdma_resolve_route", unsafe {
                ffi::rdma_resolve_route(raw, millis(timeout))
            })
        })
    }

    /// `rdma_listen`: listens for connect requests (bind first); each comes as a
    /// `ConnectRequest` event carrying a new identifier.
    ///
    /// # Errors
    ///
    /// [`Error::Call`] with `rdma_listen`.
    ///
    /// # References
    ///
    /// [`rdma_listen(3)`](https://man7.org/linux/man-pages/man3/rdma_listen.3.html)
    #[doc(alias = "rdma_listen")]
    pub fn listen(&self, backlog: i32) -> Result<()> {
        self.0.with(|raw| {
            // SAFETY: a live identifier.
            check("rdma_listen", unsafe { ffi::rdma_listen(raw, backlog) })
        })?;
        self.0.listening.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// `rdma_connect`: sends a connect request (after the route is resolved) for the queue
    /// pair `param` names. With a queue pair this crate does not associate with the
    /// identifier, the answer is a `ConnectResponse` event, after which the caller moves the
    /// queue pair to RTR and RTS and calls [`establish`](Self::establish);
    /// [`connect_qp`](Self::connect_qp) does all of it.
    ///
    /// # Errors
    ///
    /// [`Error::NoDevice`] before the route is resolved; [`Error::Call`] with
    /// `rdma_connect`.
    ///
    /// # References
    ///
    /// [`rdma_connect(3)`](https://man7.org/linux/man-pages/man3/rdma_connect.3.html)
    #[doc(alias = "rdma_connect")]
    pub fn connect(&self, param: &ConnParam) -> Result<()> {
        let mut raw_param = param.to_raw();
        self.0.with_device(|raw| {
            // SAFETY: a live identifier, under its channel's lock.
            unsafe { check_own_qp(raw, raw_param.qp_num) }?;
            // SAFETY: a live identifier bound to a device; the parameters (and the private
            // data they point at, in `param`) are read during the call.
            check("rdma_connect", unsafe {
                ffi::rdma_connect(raw, &mut raw_param)
            })
        })
    }

    /// `rdma_accept`: accepts the connect request this identifier came with (its queue pair
    /// in RTR or RTS already); `Established` follows.
    ///
    /// # Errors
    ///
    /// [`Error::NoDevice`] on an identifier that did not come with a connect request (or is
    /// not bound to a device); [`Error::Call`] with `rdma_accept`.
    ///
    /// # References
    ///
    /// [`rdma_accept(3)`](https://man7.org/linux/man-pages/man3/rdma_accept.3.html)
    #[doc(alias = "rdma_accept")]
    pub fn accept(&self, param: &ConnParam) -> Result<()> {
        let mut raw_param = param.to_raw();
        self.0.with_device(|raw| {
            // SAFETY: a live identifier, under its channel's lock.
            unsafe { check_own_qp(raw, raw_param.qp_num) }?;
            // SAFETY: as in `connect`.
            check("rdma_accept", unsafe {
                ffi::rdma_accept(raw, &mut raw_param)
            })
        })
    }

    /// `rdma_reject`: refuses the connect request this identifier came with; the peer gets a
    /// `Rejected` event (status 28, consumer defined) with `private_data`.
    ///
    /// # Errors
    ///
    /// [`Error::PrivateDataTooLong`] beyond 255 bytes; [`Error::Call`] with `rdma_reject`
    /// (`EINVAL` beyond what the wire carries, 148 bytes on InfiniBand and RoCE).
    ///
    /// # References
    ///
    /// [`rdma_reject(3)`](https://man7.org/linux/man-pages/man3/rdma_reject.3.html)
    #[doc(alias = "rdma_reject")]
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        let (data, len) = private_data_arg(private_data)?;
        self.0.with(|raw| {
            // SAFETY: a live identifier; the private data is read during the call.
            check("rdma_reject", unsafe { ffi::rdma_reject(raw, data, len) })
        })
    }

    /// `rdma_reject_ece`: refuses the connect request this identifier came with because its
    /// enhanced connection establishment options ([`remote_ece`](Self::remote_ece)) are not
    /// acceptable; the peer gets a `Rejected` event with status 35 (the InfiniBand reject
    /// reason "vendor option not supported") and `private_data`.
    ///
    /// # Errors
    ///
    /// As [`reject`](Self::reject), with `rdma_reject_ece`.
    ///
    /// # References
    ///
    /// [`rdma_reject_ece(3)`](https://man7.org/linux/man-pages/man3/rdma_reject_ece.3.html)
    #[doc(alias = "rdma_reject_ece")]
    pub fn reject_ece(&self, private_data: &[u8]) -> Result<()> {
        let (data, len) = private_data_arg(private_data)?;
        self.0.with(|raw| {
            // SAFETY: a live identifier; the private data is read during the call.
            check("rdma_reject_ece", unsafe {
                ffi::rdma_reject_ece(raw, data, len)
            })
        })
    }

    /// `rdma_set_local_ece`: the enhanced connection establishment options this side offers,
    /// set before [`connect`](Self::connect) (sent in the request) or
    /// [`accept`](Self::accept) (the options accepted, sent back under the requester's
    /// vendor). The queue pair is the caller's: on the active side
    /// [`connect_qp`](Self::connect_qp) sets the options the peer accepted on it before RTR;
    /// on the passive side the caller sets the ones it accepts
    /// ([`QueuePair::set_ece`](rdma_verbs::QueuePair::set_ece)) before the queue pair leaves
    /// INIT, where its device has ECE.
    ///
    /// # Errors
    ///
    /// [`Error::Call`] with `rdma_set_local_ece` and `EINVAL` for vendor 0. InfiniBand and
    /// RoCE carry 24 bits of vendor identifier.
    ///
    /// # References
    ///
    /// [`rdma_set_local_ece(3)`](https://man7.org/linux/man-pages/man3/rdma_set_local_ece.3.html)
    #[doc(alias = "rdma_set_local_ece")]
    pub fn set_local_ece(&self, ece: Ece) -> Result<()> {
        let mut raw_ece = ece.to_raw();
        self.0.with(|raw| {
            // SAFETY: a live identifier; the structure is read during the call.
            check("rdma_set_local_ece", unsafe {
                ffi::rdma_set_local_ece(raw, &mut raw_ece)
            })
        })
    }

    /// `rdma_get_remote_ece`: the enhanced connection establishment options the peer sent:
    /// on a passive identifier, those of its connect request; on an active one, once the
    /// connection is accepted, those of the reply. Zero where the peer sent none.
    ///
    /// # Errors
    ///
    /// [`Error::Call`] with `rdma_get_remote_ece`.
    ///
    /// # References
    ///
    /// [`rdma_get_remote_ece(3)`](https://man7.org/linux/man-pages/man3/rdma_get_remote_ece.3.html)
    #[doc(alias = "rdma_get_remote_ece")]
    pub fn remote_ece(&self) -> Result<Ece> {
        let mut raw_ece = ffi::ibv_ece::default();
        self.0.with(|raw| {
            // SAFETY: a live identifier; the structure is writable.
            check("rdma_get_remote_ece", unsafe {
                ffi::rdma_get_remote_ece(raw, &mut raw_ece)
            })
        })?;
        Ok(Ece::from_raw(&raw_ece))
    }

    /// `rdma_notify`: tells the connection manager of an event of the connection's queue
    /// pair. The one it acts on is [`AsyncEvent::CommunicationEstablished`]
    /// (`IBV_EVENT_COMM_EST`): the queue pair received a message before the connection
    /// manager's ready-to-use message arrived, which establishes the connection now.
    ///
    /// # Errors
    ///
    /// [`Error::Call`] with `rdma_notify` and the kernel's errno: `EISCONN` on a connection
    /// that is established already, `EINVAL` on one that is not being established.
    ///
    /// # References
    ///
    /// [`rdma_notify(3)`](https://man7.org/linux/man-pages/man3/rdma_notify.3.html)
    #[doc(alias = "rdma_notify")]
    pub fn notify(&self, event: &AsyncEvent) -> Result<()> {
        let kind = event.raw_type();
        self.0.with(|raw| {
            // SAFETY: a live identifier, under its channel's lock.
            check("rdma_notify", unsafe { ffi::rdma_notify(raw, kind) })
        })
    }

    /// `rdma_establish`: completes an active connection whose queue pair the caller moved to
    /// RTR and RTS after the `ConnectResponse` event.
    ///
    /// # Errors
    ///
    /// [`Error::Call`] with `rdma_establish`.
    ///
    /// # References
    ///
    /// [`rdma_establish(3)`](https://man7.org/linux/man-pages/man3/rdma_establish.3.html)
    #[doc(alias = "rdma_establish")]
    pub fn establish(&self) -> Result<()> {
        self.0.with(|raw| {
            // SAFETY: a live identifier.
            check("rdma_establish", unsafe { ffi::rdma_establish(raw) })
        })
    }

    /// `rdma_set_option(RDMA_OPTION_ID, RDMA_OPTION_ID_TOS)`: the type of service of this
    /// identifier's traffic (the IP traffic class on RoCE), before resolving the route.
    ///
    /// # Errors
    ///
    /// [`Error::Call`] with `rdma_set_option`.
    ///
    /// # References
    ///
    /// [`rdma_set_option(3)`](https://man7.org/linux/man-pages/man3/rdma_set_option.3.html)
    #[doc(alias = "rdma_set_option")]
    pub fn set_tos(&self, tos: u8) -> Result<()> {
        let mut value = tos;
        self.0.with(|raw| {
            // SAFETY: a live identifier; the option's value is one readable byte, the size
            // given, read during the call.
            check("rdma_set_option", unsafe {
                ffi::rdma_set_option(
                    raw,
                    ffi::RDMA_OPTION_ID as i32,
                    ffi::RDMA_OPTION_ID_TOS as i32,
                    (&raw mut value).cast(),
                    std::mem::size_of::<u8>(),
                )
            })
        })
    }

    /// `rdma_disconnect`: ends the connection; both sides get `Disconnected`. The caller's
    /// queue pair should be moved to ERR (or destroyed) to flush what is outstanding.
    ///
    /// # Errors
    ///
    /// [`Error::Call`] with `rdma_disconnect` (`EINVAL` when not connected).
    ///
    /// # References
    ///
    /// [`rdma_disconnect(3)`](https://man7.org/linux/man-pages/man3/rdma_disconnect.3.html)
    #[doc(alias = "rdma_disconnect")]
    pub fn disconnect(&self) -> Result<()> {
        self.0.with(|raw| {
            // SAFETY: a live identifier.
            check("rdma_disconnect", unsafe { ffi::rdma_disconnect(raw) })
        })
    }

    /// `rdma_migrate_id`: moves the identifier to `channel`: its later events (and those not
    /// read yet) are reported there.
    ///
    /// # Errors
    ///
    /// [`Error::EventsHeld`] while events about it are held (librdmacm would wait for them
    /// forever); [`Error::InvalidArgument`] for a listener (the kernel would leave the
    /// identifiers of its queued requests on the old channel, unusable); [`Error::Call`] with
    /// `rdma_migrate_id`.
    ///
    /// # References
    ///
    /// [`rdma_migrate_id(3)`](https://man7.org/linux/man-pages/man3/rdma_migrate_id.3.html)
    #[doc(alias = "rdma_migrate_id")]
    pub fn migrate(&self, channel: &EventChannel) -> Result<()> {
        if self.0.listening.load(Ordering::SeqCst) {
            // The kernel would move the listener's queued connect requests to the new channel
            // but leave their identifiers on the old one, where no call on them works.
            return Err(Error::InvalidArgument(
                "a listening identifier is not migrated: create the listener on the channel \
                 it should report on",
            ));
        }
        loop {
            let current = self.0.channel();
            if current.same_as(channel) {
                return Ok(());
            }
            // The channels' locks first (in address order, so that two migrations cannot
            // deadlock), then the identifier's record of its channel: the order `with` takes
            // them in.
            let (first, second) = if Arc::as_ptr(&current.0) < Arc::as_ptr(&channel.0) {
                (current.0.clone(), channel.0.clone())
            } else {
                (channel.0.clone(), current.0.clone())
            };
            let _a = first.lock();
            let _b = second.lock();
            let mut record = self.0.channel.lock().unwrap_or_else(|e| e.into_inner());
            if !record.same_as(&current) {
                // Migrated meanwhile by another thread: start again from where it is now.
                continue;
            }
            let held = self.0.held.load(Ordering::SeqCst);
            if held > 0 {
                return Err(Error::EventsHeld {
                    call: "rdma_migrate_id",
                    count: held,
                });
            }
            // SAFETY: a live identifier and channel; no event about it is unacknowledged
            // (every event read holds a count in `held`, and reading takes the old channel's
            // lock, held here), so librdmacm does not wait.
            let ret = unsafe { ffi::rdma_migrate_id(self.0.raw(), channel.as_raw()) };
            check("rdma_migrate_id", ret)?;
            *record = channel.clone();
            return Ok(());
        }
    }

    /// `rdma_init_qp_attr`: the attributes that move this connection's queue pair to `state`
    /// (INIT, RTR or RTS), for [`QueuePair::into_init_with`](rdma_verbs::QueuePair) and its
    /// siblings.
    ///
    /// # Errors
    ///
    /// [`Error::Call`] with `rdma_init_qp_attr` (`EINVAL` before the route is known).
    ///
    /// # References
    ///
    /// [`rdma_init_qp_attr(3)`](https://man7.org/linux/man-pages/man3/rdma_init_qp_attr.3.html)
    #[doc(alias = "rdma_init_qp_attr")]
    pub fn init_qp_attr(&self, state: QpStateKind) -> Result<RawModifyAttr> {
        let mut attr = ffi::ibv_qp_attr {
            qp_state: state.as_raw(),
            ..Default::default()
        };
        let mut mask = 0;
        self.0.with(|raw| {
            // SAFETY: a live identifier; `attr` and `mask` are written.
            check("rdma_init_qp_attr", unsafe {
                ffi::rdma_init_qp_attr(raw, &mut attr, &mut mask)
            })
        })?;
        // SAFETY: librdmacm filled the attributes for `mask` from the connection's own path
        // and parameters; they hold no pointers.
        Ok(unsafe { RawModifyAttr::from_raw(attr, mask as u32) })
    }

    /// The verbs context of the device this identifier is bound to (after an address is
    /// resolved or bound, or from a connect request), for the protection domain, completion
    /// queues and queue pair of the connection. The context keeps this identifier alive.
    ///
    /// # Errors
    ///
    /// [`Error::NoDevice`] before the identifier is bound to a device.
    pub fn context(&self) -> Result<Context> {
        let verbs = self.0.with(|raw| {
            // SAFETY: a live identifier, read under its channel's lock.
            unsafe { (*raw).verbs }
        });
        let verbs = NonNull::new(verbs).ok_or(Error::NoDevice)?;
        let keep: Arc<dyn Send + Sync> = self.0.clone();
        // SAFETY: librdmacm keeps the device context of a bound identifier open while the
        // identifier exists; `keep` holds the identifier for as long as the context and
        // everything made from it.
        Ok(unsafe { Context::from_raw_borrowed(verbs, keep) })
    }

    /// The local address (`rdma_get_local_addr`), once bound or resolved.
    #[doc(alias = "rdma_get_local_addr")]
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.0
            .with(|raw| {
                // SAFETY: a live identifier, read under its channel's lock; the storage is large
                // enough for any family.
                unsafe { addr::from_raw(ffi::rdma_get_local_addr(raw).cast()) }
            })
            .filter(|a| !a.ip().is_unspecified() || a.port() != 0)
    }

    /// The peer's address (`rdma_get_peer_addr`), once resolved or connected.
    #[doc(alias = "rdma_get_peer_addr")]
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.0
            .with(|raw| {
                // SAFETY: as in `local_addr`.
                unsafe { addr::from_raw(ffi::rdma_get_peer_addr(raw).cast()) }
            })
            .filter(|a| !a.ip().is_unspecified() || a.port() != 0)
    }

    /// `rdma_get_src_port`: the local port (host byte order), once bound or resolved; `None`
    /// before. Unlike [`local_addr`](Self::local_addr) it also answers for `AF_IB` addresses,
    /// whose port is part of the service ID.
    ///
    /// # References
    ///
    /// [`rdma_get_src_port(3)`](https://man7.org/linux/man-pages/man3/rdma_get_src_port.3.html)
    #[doc(alias = "rdma_get_src_port")]
    pub fn local_port(&self) -> Option<u16> {
        // SAFETY: a live identifier, read under its channel's lock.
        let port = self.0.with(|raw| unsafe { ffi::rdma_get_src_port(raw) });
        NonZeroU16::new(u16::from_be(port)).map(NonZeroU16::get)
    }

    /// `rdma_get_dst_port`: the peer's port (host byte order), once resolved or connected;
    /// `None` before. Answers for every address family, as [`local_port`](Self::local_port).
    ///
    /// # References
    ///
    /// [`rdma_get_dst_port(3)`](https://man7.org/linux/man-pages/man3/rdma_get_dst_port.3.html)
    #[doc(alias = "rdma_get_dst_port")]
    pub fn peer_port(&self) -> Option<u16> {
        // SAFETY: a live identifier, read under its channel's lock.
        let port = self.0.with(|raw| unsafe { ffi::rdma_get_dst_port(raw) });
        NonZeroU16::new(u16::from_be(port)).map(NonZeroU16::get)
    }

    /// The device port the identifier is bound to (0 before).
    pub fn port_num(&self) -> u8 {
        // SAFETY: a live identifier, read under its channel's lock.
        self.0.with(|raw| unsafe { (*raw).port_num })
    }

    /// The port space it was created in.
    pub fn port_space(&self) -> PortSpace {
        self.0.ps
    }

    /// The queue pair type of its port space (RC for TCP, UD for UDP).
    pub fn qp_type(&self) -> ffi::ibv_qp_type {
        self.0.ps.qp_type()
    }

    /// The channel it reports on.
    pub fn channel(&self) -> EventChannel {
        self.0.channel()
    }

    /// Whether `self` and `other` are handles to the same identifier.
    pub fn same_as(&self, other: &CmId) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// The raw identifier, valid while a handle lives. Calls on it bypass the channel lock
    /// this crate takes around its own calls.
    pub fn as_raw(&self) -> *mut ffi::rdma_cm_id {
        self.0.raw()
    }
}
