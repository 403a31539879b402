//! Endpoints (`rdma_create_ep`): synchronous identifiers, whose calls return once the
//! connection manager has answered, as rdma-core's `rdma_server` and `rdma_client` use them.
//! The queue pair is the endpoint's own, made by the connection manager
//! ([`Endpoint::create_qp`]) and moved by it while connecting.

use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdma_verbs::qp::QpBuilder;
use rdma_verbs::{
    Context, QueuePair,
    qp::{Init, Rc, Rts},
};
use rdma_verbs_sys as ffi;

use crate::addr;
use crate::addrinfo::AddrInfo;
use crate::error::{Error, Result};
use crate::id::{PortSpace, check};
use crate::managed::{IdHandle, make_qp};
use crate::param::ConnParam;

pub(crate) struct EpInner {
    raw: NonNull<ffi::rdma_cm_id>,
    /// Serialises the calls on the identifier (librdmacm's synchronous calls read its
    /// channel), and holds what the endpoint is doing: a synchronous call waits for an event
    /// only the right state brings.
    lock: Mutex<EpState>,
    /// For an endpoint of a connect request: the listening endpoint, whose destruction waits
    /// for the request's event to be acknowledged, which this endpoint does.
    _listener: Option<Arc<EpInner>>,
}

// SAFETY: every call on the identifier takes `lock`; librdmacm's synchronous calls use only
// the identifier and its own channel.
unsafe impl Send for EpInner {}
// SAFETY: as above.
unsafe impl Sync for EpInner {}

/// What an endpoint is doing, which decides the synchronous calls it may make: each waits for
/// an event, and one the state cannot bring would be waited for forever.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum EpState {
    /// Made (an active endpoint, resolved), or its connection refused or ended.
    Idle,
    /// Listening: `get_request` waits for a connect request.
    Listening,
    /// A connect request's endpoint, not accepted yet.
    Requested,
    /// Connected: `disconnect` waits for the peer's answer.
    Connected,
}

impl IdHandle for EpInner {
    fn with_id<R>(&self, f: impl FnOnce(*mut ffi::rdma_cm_id) -> R) -> R {
        self.with_state(|raw, _| f(raw))
    }
}

impl EpInner {
    /// Runs `f` on the live identifier and the endpoint's state, under its lock.
    fn with_state<R>(&self, f: impl FnOnce(*mut ffi::rdma_cm_id, &mut EpState) -> R) -> R {
        let mut state = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        f(self.raw.as_ptr(), &mut state)
    }
}

/// The error of a synchronous call the endpoint's state cannot answer.
fn not_now(call: &'static str) -> Error {
    Error::Call {
        call,
        errno: rdma_verbs::Errno::from_raw(libc::EINVAL),
    }
}

impl Drop for EpInner {
    fn drop(&mut self) {
        // SAFETY: a live identifier, destroyed once; its queue pair (which holds this inner)
        // is gone, so `rdma_destroy_ep` destroys no queue pair, and the events it holds are
        // acknowledged by the destroy.
        unsafe { ffi::rdma_destroy_ep(self.raw.as_ptr()) };
    }
}

/// A synchronous connection-manager identifier (`rdma_create_ep`): resolving, connecting and
/// accepting return once the connection manager answered (within its own timeouts), with no
/// event channel to wait on. Each endpoint connects one queue pair of its own
/// ([`create_qp`](Self::create_qp)).
///
/// ```no_run
/// # use std::time::Duration;
/// # use rdma_cm::*;
/// # fn f() -> Result<()> {
/// let info = &getaddrinfo(Some("192.0.2.1"), Some("7471"), &AddrHints::default())?[0];
/// let ep = Endpoint::new(info)?;
/// let context = ep.context()?;
/// let pd = context.alloc_pd()?;
/// let cq = context.create_cq(16)?;
/// let qp = ep.create_qp(pd.qp_builder(&cq, &cq))?;
/// // ... post the first receives on `qp` ...
/// let (qp, _accepted) = ep.connect(qp, &ConnParam::new())?;
/// # drop(qp); Ok(()) }
/// ```
///
/// `Send` and `Sync`: calls on one endpoint take turns.
#[derive(Clone)]
pub struct Endpoint(Arc<EpInner>);

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("local", &self.local_addr())
            .field("peer", &self.peer_addr())
            .finish()
    }
}

impl Endpoint {
    /// `rdma_create_ep`: an endpoint for `info` (from [`getaddrinfo`](crate::getaddrinfo)):
    /// with [`AddrHints::passive`](crate::AddrHints::passive), bound to its source address to
    /// [`listen`](Self::listen); otherwise with the address and route to its destination
    /// resolved (librdmacm allows each 2 s).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an `info` without the address its use needs;
    /// [`Error::Call`] with `rdma_create_ep` and its errno (`ETIMEDOUT`, `EADDRNOTAVAIL`,
    /// `ENODEV`, ...).
    ///
    /// # References
    ///
    /// [`rdma_create_ep(3)`](https://man7.org/linux/man-pages/man3/rdma_create_ep.3.html)
    #[doc(alias = "rdma_create_ep")]
    pub fn new(info: &AddrInfo) -> Result<Self> {
        let passive = info.passive;
        if (passive && info.src.is_none()) || (!passive && info.dst.is_none()) {
            return Err(Error::InvalidArgument(
                "rdma_create_ep: the address information lacks the address to bind or resolve",
            ));
        }
        let mut src = info.src.map(addr::to_storage);
        let mut dst = info.dst.map(addr::to_storage);
        let len = |a: Option<SocketAddr>| match a {
            Some(SocketAddr::V4(_)) => std::mem::size_of::<libc::sockaddr_in>() as u32,
            Some(SocketAddr::V6(_)) => std::mem::size_of::<libc::sockaddr_in6>() as u32,
            None => 0,
        };
        let as_sockaddr = |s: &mut Option<ffi::sockaddr_storage>| {
            s.as_mut()
                .map_or(std::ptr::null_mut(), |s| std::ptr::from_mut(s).cast())
        };
        let mut res = ffi::rdma_addrinfo {
            ai_flags: if passive { ffi::RAI_PASSIVE as i32 } else { 0 },
            ai_qp_type: info.port_space.qp_type() as i32,
            ai_port_space: info.port_space.raw() as i32,
            ai_src_len: len(info.src),
            ai_dst_len: len(info.dst),
            ai_src_addr: as_sockaddr(&mut src),
            ai_dst_addr: as_sockaddr(&mut dst),
            ..Default::default()
        };
        let mut raw = std::ptr::null_mut();
        // SAFETY: `res` and the addresses it points at live through the call; no protection
        // domain or queue-pair attributes (the queue pair is made later, by `create_qp`).
        let ret = unsafe {
            ffi::rdma_create_ep(
                &mut raw,
                &mut res,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        check("rdma_create_ep", ret)?;
        let raw = NonNull::new(raw).ok_or(Error::Call {
            call: "rdma_create_ep",
            errno: rdma_verbs::Errno::INVAL,
        })?;
        Ok(Self(Arc::new(EpInner {
            raw,
            lock: Mutex::new(EpState::Idle),
            _listener: None,
        })))
    }

    /// `rdma_listen`: listens for connect requests on the bound address.
    ///
    /// # Errors
    ///
    /// [`Error::Call`] with `rdma_listen` (`EADDRINUSE`, ...).
    #[doc(alias = "rdma_listen")]
    pub fn listen(&self, backlog: i32) -> Result<()> {
        self.0.with_state(|raw, state| {
            // SAFETY: a live identifier, under its lock.
            check("rdma_listen", unsafe { ffi::rdma_listen(raw, backlog) })?;
            *state = EpState::Listening;
            Ok(())
        })
    }

    /// `rdma_get_request`: the next connect request of a listening endpoint, as an endpoint
    /// of its own (with the request's private data, [`private_data`](Self::private_data)).
    /// Waits at most `timeout` for one to arrive (`None`: as long as it takes; a request
    /// librdmacm discards on arrival makes it wait for the next).
    ///
    /// # Errors
    ///
    /// [`Error::Call`] with `rdma_get_request`: `EINVAL`, without the call, on an endpoint
    /// that does not [`listen`](Self::listen); `ETIMEDOUT` when none came within `timeout`;
    /// else its errno.
    ///
    /// # References
    ///
    /// [`rdma_get_request(3)`](https://man7.org/linux/man-pages/man3/rdma_get_request.3.html)
    #[doc(alias = "rdma_get_request")]
    pub fn get_request(&self, timeout: Option<Duration>) -> Result<Endpoint> {
        let raw = self.0.with_state(|raw, state| {
            if *state != EpState::Listening {
                // Another endpoint's `rdma_get_request` would wait forever, or take the
                // events of its connection.
                return Err(not_now("rdma_get_request"));
            }
            // SAFETY: a live identifier under its lock; a synchronous one has its own channel,
            // open while it lives.
            let fd = unsafe { BorrowedFd::borrow_raw((*(*raw).channel).fd) };
            if let Some(timeout) = timeout {
                if !crate::channel::readable_within(fd, timeout)? {
                    return Err(Error::Call {
                        call: "rdma_get_request",
                        errno: rdma_verbs::Errno::TIMEDOUT,
                    });
                }
            }
            let mut new = std::ptr::null_mut();
            // SAFETY: as above; `new` is written on success.
            check("rdma_get_request", unsafe {
                ffi::rdma_get_request(raw, &mut new)
            })?;
            NonNull::new(new).ok_or(Error::Call {
                call: "rdma_get_request",
                errno: rdma_verbs::Errno::INVAL,
            })
        })?;
        Ok(Endpoint(Arc::new(EpInner {
            raw,
            lock: Mutex::new(EpState::Requested),
            _listener: Some(self.0.clone()),
        })))
    }

    /// The device context the endpoint is bound to (borrowed from librdmacm; it keeps the
    /// endpoint alive).
    ///
    /// # Errors
    ///
    /// [`Error::NoDevice`] before the endpoint is bound to a device.
    pub fn context(&self) -> Result<Context> {
        // SAFETY: a live identifier, under its lock.
        let verbs = self.0.with_id(|raw| unsafe { (*raw).verbs });
        let verbs = NonNull::new(verbs).ok_or(Error::NoDevice)?;
        let keep: Arc<dyn Send + Sync> = self.0.clone();
        // SAFETY: librdmacm keeps the device context of a bound identifier open while the
        // identifier exists; `keep` holds it for as long as the context and all made from it.
        Ok(unsafe { Context::from_raw_borrowed(verbs, keep) })
    }

    /// `rdma_create_qp_ex`: the endpoint's RC queue pair, made by the connection manager from
    /// `builder` and moved to INIT; [`connect`](Self::connect) and [`accept`](Self::accept)
    /// move it on. As [`CmId::create_qp`](crate::CmId::create_qp).
    ///
    /// # Errors
    ///
    /// As [`CmId::create_qp`](crate::CmId::create_qp).
    #[doc(alias = "rdma_create_qp_ex")]
    pub fn create_qp(&self, builder: QpBuilder<'_, Rc>) -> Result<QueuePair<Rc, Init>> {
        if self.port_space() != Some(PortSpace::Tcp) {
            return Err(Error::InvalidArgument(
                "rdma_create_qp_ex: an RC queue pair needs an endpoint of the TCP port space",
            ));
        }
        make_qp(self.0.clone(), builder)
    }

    /// `rdma_connect`: connects with the endpoint's queue pair (from
    /// [`create_qp`](Self::create_qp), its first receives posted), which the connection
    /// manager moves to RTS; returns once the connection is established (within the
    /// connection manager's response timeout and retries), with the private data of the
    /// peer's accept.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a queue pair that is not the endpoint's; [`Error::Call`]
    /// with `rdma_connect`: `EINVAL`, without the call, on an endpoint that listens, came from
    /// a connect request or is connected; else its errno (`ECONNREFUSED` when the peer
    /// rejected, `ETIMEDOUT`, ...); the queue pair is destroyed then.
    ///
    /// # References
    ///
    /// [`rdma_connect(3)`](https://man7.org/linux/man-pages/man3/rdma_connect.3.html)
    #[doc(alias = "rdma_connect")]
    pub fn connect(
        &self,
        qp: QueuePair<Rc, Init>,
        param: &ConnParam,
    ) -> Result<(QueuePair<Rc, Rts>, Vec<u8>)> {
        self.check_own(&qp)?;
        let mut raw_param = param.to_raw();
        let private_data = self.0.with_state(|raw, state| {
            if *state != EpState::Idle {
                return Err(not_now("rdma_connect"));
            }
            // SAFETY: a live identifier under its lock; the parameters (and their private
            // data) live through the call.
            check("rdma_connect", unsafe {
                ffi::rdma_connect(raw, &mut raw_param)
            })?;
            *state = EpState::Connected;
            // SAFETY: as above; a synchronous identifier keeps the event its call ended with.
            Ok::<_, Error>(unsafe { event_private_data(raw) })
        })?;
        // SAFETY: `rdma_connect` on an identifier with its queue pair moved it to RTR and RTS
        // before the connection was established.
        Ok((unsafe { qp.assume_state::<Rts>() }, private_data))
    }

    /// `rdma_accept`: accepts the connect request this endpoint came with, on the endpoint's
    /// queue pair (its first receives posted), which the connection manager moves to RTS;
    /// returns once the connection is established.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect), with `rdma_accept` (`EINVAL`, without the call, on an
    /// endpoint that did not come from [`get_request`](Self::get_request) or accepted
    /// already).
    ///
    /// # References
    ///
    /// [`rdma_accept(3)`](https://man7.org/linux/man-pages/man3/rdma_accept.3.html)
    #[doc(alias = "rdma_accept")]
    pub fn accept(&self, qp: QueuePair<Rc, Init>, param: &ConnParam) -> Result<QueuePair<Rc, Rts>> {
        self.check_own(&qp)?;
        let mut raw_param = param.to_raw();
        self.0.with_state(|raw, state| {
            if *state != EpState::Requested {
                return Err(not_now("rdma_accept"));
            }
            // SAFETY: as in `connect`.
            check("rdma_accept", unsafe {
                ffi::rdma_accept(raw, &mut raw_param)
            })?;
            *state = EpState::Connected;
            Ok(())
        })?;
        // SAFETY: `rdma_accept` on an identifier with its queue pair moved it to RTR and RTS.
        Ok(unsafe { qp.assume_state::<Rts>() })
    }

    /// `rdma_disconnect`: ends the connection (the queue pair moves to the error state on
    /// InfiniBand and RoCE) and returns once the peer answered or the connection manager gave
    /// up.
    ///
    /// # Errors
    ///
    /// [`Error::Call`] with `rdma_disconnect`: `EINVAL`, without the call, without a
    /// connection (never made, refused, or ended already: the call would wait for an answer
    /// nobody sends); else its errno.
    #[doc(alias = "rdma_disconnect")]
    pub fn disconnect(&self) -> Result<()> {
        self.0.with_state(|raw, state| {
            if *state != EpState::Connected {
                return Err(not_now("rdma_disconnect"));
            }
            *state = EpState::Idle;
            // SAFETY: a live identifier, under its lock.
            check("rdma_disconnect", unsafe { ffi::rdma_disconnect(raw) })
        })
    }

    /// The private data of the event the endpoint's last call ended with: the connect
    /// request of an endpoint from [`get_request`](Self::get_request), empty otherwise.
    pub fn private_data(&self) -> Vec<u8> {
        // SAFETY: a live identifier, under its lock.
        self.0.with_id(|raw| unsafe { event_private_data(raw) })
    }

    /// The local address, once bound.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: a live identifier, under its lock; the address is in the identifier.
        self.0
            .with_id(|raw| unsafe { addr::from_raw(ffi::rdma_get_local_addr(raw).cast()) })
            .filter(|a| !a.ip().is_unspecified() || a.port() != 0)
    }

    /// The peer's address, once resolved or connected.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as in `local_addr`.
        self.0
            .with_id(|raw| unsafe { addr::from_raw(ffi::rdma_get_peer_addr(raw).cast()) })
            .filter(|a| !a.ip().is_unspecified() || a.port() != 0)
    }

    fn port_space(&self) -> Option<PortSpace> {
        // SAFETY: a live identifier, under its lock.
        let ps = self.0.with_id(|raw| unsafe { (*raw).ps });
        match ps {
            ffi::RDMA_PS_TCP => Some(PortSpace::Tcp),
            ffi::RDMA_PS_UDP => Some(PortSpace::Udp),
            ffi::RDMA_PS_IB => Some(PortSpace::Ib),
            _ => None,
        }
    }

    fn check_own(&self, qp: &QueuePair<Rc, Init>) -> Result<()> {
        // SAFETY: a live identifier, under its lock.
        if self.0.with_id(|raw| unsafe { (*raw).qp }) == qp.as_raw() {
            Ok(())
        } else {
            Err(Error::InvalidArgument(
                "the queue pair is not the endpoint's own (Endpoint::create_qp)",
            ))
        }
    }
}

/// The private data of the event a synchronous identifier holds, or nothing.
///
/// # Safety
///
/// `raw` is a live identifier, under its lock.
unsafe fn event_private_data(raw: *mut ffi::rdma_cm_id) -> Vec<u8> {
    // SAFETY: the caller's guarantee; the event stays until the identifier's next call.
    unsafe {
        let event = (*raw).event;
        if event.is_null() {
            return Vec::new();
        }
        let param = &(*event).param.conn;
        if param.private_data.is_null() || param.private_data_len == 0 {
            return Vec::new();
        }
        std::slice::from_raw_parts(
            param.private_data.cast::<u8>(),
            usize::from(param.private_data_len),
        )
        .to_vec()
    }
}
