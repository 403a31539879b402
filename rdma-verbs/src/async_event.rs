//! Asynchronous events of a device context (`ibv_get_async_event`).

use std::os::fd::AsRawFd;
use std::time::Duration;

use crate::c_enum::static_name;
use crate::channel::{is_nonblocking, poll_readable, set_nonblocking};
use crate::cq::CompletionQueue;
use crate::device::Context;
use crate::error::{Errno, Error, Result};
use crate::ffi;
use crate::srq::SharedReceiveQueue;

/// An asynchronous event (`struct ibv_async_event`), already acknowledged.
///
/// Objects are named by what identifies them after the event is acknowledged: a queue pair by
/// its number, a CQ or SRQ by its kernel handle (compare with
/// [`CompletionQueue::handle`] and [`SharedReceiveQueue::handle`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// `IBV_EVENT_CQ_ERR`: a completion queue overran or failed; it is unusable.
    CqError {
        /// The CQ's handle.
        cq_handle: u32,
    },
    /// `IBV_EVENT_QP_FATAL`: the queue pair entered the error state.
    QpFatal {
        /// Queue pair number.
        qp_num: u32,
    },
    /// `IBV_EVENT_QP_REQ_ERR`: invalid request on the queue pair (error state).
    QpRequestError {
        /// Queue pair number.
        qp_num: u32,
    },
    /// `IBV_EVENT_QP_ACCESS_ERR`: access violation on the queue pair (error state).
    QpAccessError {
        /// Queue pair number.
        qp_num: u32,
    },
    /// `IBV_EVENT_COMM_EST`: the first message arrived on a queue pair in RTR.
    CommunicationEstablished {
        /// Queue pair number.
        qp_num: u32,
    },
    /// `IBV_EVENT_SQ_DRAINED`.
    SqDrained {
        /// Queue pair number.
        qp_num: u32,
    },
    /// `IBV_EVENT_PATH_MIG`.
    PathMigrated {
        /// Queue pair number.
        qp_num: u32,
    },
    /// `IBV_EVENT_PATH_MIG_ERR`.
    PathMigrationError {
        /// Queue pair number.
        qp_num: u32,
    },
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: a queue pair on an SRQ consumed its last request.
    QpLastWqeReached {
        /// Queue pair number.
        qp_num: u32,
    },
    /// `IBV_EVENT_SRQ_ERR`.
    SrqError {
        /// The SRQ's handle.
        srq_handle: u32,
    },
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`: fewer receives than the armed limit remain.
    SrqLimitReached {
        /// The SRQ's handle.
        srq_handle: u32,
    },
    /// `IBV_EVENT_DEVICE_FATAL`: the device failed; the context is unusable.
    DeviceFatal,
    /// `IBV_EVENT_PORT_ACTIVE`.
    PortActive {
        /// Port number.
        port: u8,
    },
    /// `IBV_EVENT_PORT_ERR`: the port went down.
    PortError {
        /// Port number.
        port: u8,
    },
    /// `IBV_EVENT_LID_CHANGE`.
    LidChange {
        /// Port number.
        port: u8,
    },
    /// `IBV_EVENT_PKEY_CHANGE`.
    PkeyChange {
        /// Port number.
        port: u8,
    },
    /// `IBV_EVENT_SM_CHANGE`.
    SmChange {
        /// Port number.
        port: u8,
    },
    /// `IBV_EVENT_CLIENT_REREGISTER`.
    ClientReregister {
        /// Port number.
        port: u8,
    },
    /// `IBV_EVENT_GID_CHANGE`.
    GidChange {
        /// Port number.
        port: u8,
    },
    /// `IBV_EVENT_WQ_FATAL`.
    WqFatal,
    /// An event type this crate does not know.
    Unknown(u32),
}

impl AsyncEvent {
    /// The name of the C event type's constant, for example `IBV_EVENT_PORT_ACTIVE`
    /// ([`description`](Self::description) is libibverbs' text for it).
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::CqError { .. } => "IBV_EVENT_CQ_ERR",
            Self::QpFatal { .. } => "IBV_EVENT_QP_FATAL",
            Self::QpRequestError { .. } => "IBV_EVENT_QP_REQ_ERR",
            Self::QpAccessError { .. } => "IBV_EVENT_QP_ACCESS_ERR",
            Self::CommunicationEstablished { .. } => "IBV_EVENT_COMM_EST",
            Self::SqDrained { .. } => "IBV_EVENT_SQ_DRAINED",
            Self::PathMigrated { .. } => "IBV_EVENT_PATH_MIG",
            Self::PathMigrationError { .. } => "IBV_EVENT_PATH_MIG_ERR",
            Self::QpLastWqeReached { .. } => "IBV_EVENT_QP_LAST_WQE_REACHED",
            Self::SrqError { .. } => "IBV_EVENT_SRQ_ERR",
            Self::SrqLimitReached { .. } => "IBV_EVENT_SRQ_LIMIT_REACHED",
            Self::DeviceFatal => "IBV_EVENT_DEVICE_FATAL",
            Self::PortActive { .. } => "IBV_EVENT_PORT_ACTIVE",
            Self::PortError { .. } => "IBV_EVENT_PORT_ERR",
            Self::LidChange { .. } => "IBV_EVENT_LID_CHANGE",
            Self::PkeyChange { .. } => "IBV_EVENT_PKEY_CHANGE",
            Self::SmChange { .. } => "IBV_EVENT_SM_CHANGE",
            Self::ClientReregister { .. } => "IBV_EVENT_CLIENT_REREGISTER",
            Self::GidChange { .. } => "IBV_EVENT_GID_CHANGE",
            Self::WqFatal => "IBV_EVENT_WQ_FATAL",
            Self::Unknown(_) => "unknown",
        }
    }

    /// `ibv_event_type_str`: libibverbs' description of the event type, for example
    /// `port active` or `local work queue catastrophic error`; `unknown` for a type it does
    /// not know.
    ///
    /// # References
    ///
    /// [`ibv_event_type_str(3)`](https://man7.org/linux/man-pages/man3/ibv_event_type_str.3.html)
    #[doc(alias = "ibv_event_type_str")]
    pub fn description(&self) -> &'static str {
        // SAFETY: the call takes any value and returns a static string.
        unsafe { static_name(ffi::ibv_event_type_str(self.raw_type())) }
    }

    /// The C event type value.
    pub fn raw_type(&self) -> u32 {
        match self {
            Self::CqError { .. } => ffi::IBV_EVENT_CQ_ERR,
            Self::QpFatal { .. } => ffi::IBV_EVENT_QP_FATAL,
            Self::QpRequestError { .. } => ffi::IBV_EVENT_QP_REQ_ERR,
            Self::QpAccessError { .. } => ffi::IBV_EVENT_QP_ACCESS_ERR,
            Self::CommunicationEstablished { .. } => ffi::IBV_EVENT_COMM_EST,
            Self::SqDrained { .. } => ffi::IBV_EVENT_SQ_DRAINED,
            Self::PathMigrated { .. } => ffi::IBV_EVENT_PATH_MIG,
            Self::PathMigrationError { .. } => ffi::IBV_EVENT_PATH_MIG_ERR,
            Self::QpLastWqeReached { .. } => ffi::IBV_EVENT_QP_LAST_WQE_REACHED,
            Self::SrqError { .. } => ffi::IBV_EVENT_SRQ_ERR,
            Self::SrqLimitReached { .. } => ffi::IBV_EVENT_SRQ_LIMIT_REACHED,
            Self::DeviceFatal => ffi::IBV_EVENT_DEVICE_FATAL,
            Self::PortActive { .. } => ffi::IBV_EVENT_PORT_ACTIVE,
            Self::PortError { .. } => ffi::IBV_EVENT_PORT_ERR,
            Self::LidChange { .. } => ffi::IBV_EVENT_LID_CHANGE,
            Self::PkeyChange { .. } => ffi::IBV_EVENT_PKEY_CHANGE,
            Self::SmChange { .. } => ffi::IBV_EVENT_SM_CHANGE,
            Self::ClientReregister { .. } => ffi::IBV_EVENT_CLIENT_REREGISTER,
            Self::GidChange { .. } => ffi::IBV_EVENT_GID_CHANGE,
            Self::WqFatal => ffi::IBV_EVENT_WQ_FATAL,
            Self::Unknown(raw) => *raw,
        }
    }

    /// Converts a raw event, reading what identifies its object.
    ///
    /// # Safety
    ///
    /// `event` must be an event from `ibv_get_async_event` that is not yet acknowledged.
    unsafe fn from_raw(event: &ffi::ibv_async_event) -> Self {
        // SAFETY: until acknowledged, the object the event names is alive; the union member
        // read is the one the event type selects.
        unsafe {
            let element = event.element;
            let qp_num = || (*element.qp).qp_num;
            let cq_handle = || (*element.cq).handle;
            let srq_handle = || (*element.srq).handle;
            let port = || u8::try_from(element.port_num).unwrap_or(0);
            match event.event_type {
                ffi::IBV_EVENT_CQ_ERR => Self::CqError {
                    cq_handle: cq_handle(),
                },
                ffi::IBV_EVENT_QP_FATAL => Self::QpFatal { qp_num: qp_num() },
                ffi::IBV_EVENT_QP_REQ_ERR => Self::QpRequestError { qp_num: qp_num() },
                ffi::IBV_EVENT_QP_ACCESS_ERR => Self::QpAccessError { qp_num: qp_num() },
                ffi::IBV_EVENT_COMM_EST => Self::CommunicationEstablished { qp_num: qp_num() },
                ffi::IBV_EVENT_SQ_DRAINED => Self::SqDrained { qp_num: qp_num() },
                ffi::IBV_EVENT_PATH_MIG => Self::PathMigrated { qp_num: qp_num() },
                ffi::IBV_EVENT_PATH_MIG_ERR => Self::PathMigrationError { qp_num: qp_num() },
                ffi::IBV_EVENT_QP_LAST_WQE_REACHED => Self::QpLastWqeReached { qp_num: qp_num() },
                ffi::IBV_EVENT_SRQ_ERR => Self::SrqError {
                    srq_handle: srq_handle(),
                },
                ffi::IBV_EVENT_SRQ_LIMIT_REACHED => Self::SrqLimitReached {
                    srq_handle: srq_handle(),
                },
                ffi::IBV_EVENT_DEVICE_FATAL => Self::DeviceFatal,
                ffi::IBV_EVENT_PORT_ACTIVE => Self::PortActive { port: port() },
                ffi::IBV_EVENT_PORT_ERR => Self::PortError { port: port() },
                ffi::IBV_EVENT_LID_CHANGE => Self::LidChange { port: port() },
                ffi::IBV_EVENT_PKEY_CHANGE => Self::PkeyChange { port: port() },
                ffi::IBV_EVENT_SM_CHANGE => Self::SmChange { port: port() },
                ffi::IBV_EVENT_CLIENT_REREGISTER => Self::ClientReregister { port: port() },
                ffi::IBV_EVENT_GID_CHANGE => Self::GidChange { port: port() },
                ffi::IBV_EVENT_WQ_FATAL => Self::WqFatal,
                other => Self::Unknown(other),
            }
        }
    }
}

impl Context {
    /// `ibv_get_async_event` + `ibv_ack_async_event`: the next asynchronous event, or
    /// `Ok(None)` when none is pending. Never blocks.
    ///
    /// # Errors
    ///
    /// [`Error::Verb`] with the errno of `ibv_get_async_event`.
    ///
    /// # References
    ///
    /// [`ibv_get_async_event(3)`](https://man7.org/linux/man-pages/man3/ibv_get_async_event.3.html)
    /// [`ibv_ack_async_event(3)`](https://man7.org/linux/man-pages/man3/ibv_ack_async_event.3.html)
    #[doc(alias = "ibv_get_async_event")]
    #[doc(alias = "ibv_ack_async_event")]
    pub fn get_async_event(&self) -> Result<Option<AsyncEvent>> {
        let fd = self.as_raw_fd_async();
        if !is_nonblocking(fd)? {
            set_nonblocking(fd, true)?;
        }
        let mut raw = ffi::ibv_async_event {
            element: ffi::ibv_async_event__bindgen_ty_1 { port_num: 0 },
            event_type: 0,
        };
        // SAFETY: live context; writable event.
        let ret = unsafe { ffi::ibv_get_async_event(self.as_raw(), &mut raw) };
        if ret != 0 {
            let errno = Errno::last();
            if errno == Errno::AGAIN {
                return Ok(None);
            }
            return Err(Error::verb("ibv_get_async_event", errno));
        }
        // SAFETY: a fresh, unacknowledged event.
        let event = unsafe { AsyncEvent::from_raw(&raw) };
        // SAFETY: acknowledged once, after everything needed was copied out.
        unsafe { ffi::ibv_ack_async_event(&mut raw) };
        Ok(Some(event))
    }

    /// Waits up to `timeout` for the next asynchronous event; [`Duration::MAX`] (or any
    /// time-out too long to represent) waits without a deadline.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when none arrives in time, else as
    /// [`get_async_event`](Self::get_async_event).
    pub fn wait_async_event(&self, timeout: Duration) -> Result<AsyncEvent> {
        // No representable deadline (for example `Duration::MAX`): wait without one.
        let deadline = std::time::Instant::now().checked_add(timeout);
        loop {
            if let Some(event) = self.get_async_event()? {
                return Ok(event);
            }
            if !poll_readable(self.as_raw_fd_async(), deadline)? {
                return Err(Error::Timeout(timeout));
            }
        }
    }

    fn as_raw_fd_async(&self) -> i32 {
        use std::os::fd::AsFd;
        self.as_fd().as_raw_fd()
    }
}

impl CompletionQueue {
    /// The kernel's handle of the queue, as [`AsyncEvent::CqError`] names it.
    pub fn handle(&self) -> u32 {
        // SAFETY: live CQ.
        unsafe { (*self.as_raw()).handle }
    }
}

impl SharedReceiveQueue {
    /// The kernel's handle of the queue, as SRQ events name it.
    pub fn handle(&self) -> u32 {
        // SAFETY: live SRQ.
        unsafe { (*self.as_raw()).handle }
    }
}
