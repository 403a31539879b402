//! C enums that several modules name: the kind of a connection-manager event (the error type
//! names it as well as the events).

use std::fmt;

use rdma_verbs_sys as ffi;

/// The kind of a connection-manager event (`enum rdma_cm_event_type`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EventKind {
    /// `RDMA_CM_EVENT_ADDR_RESOLVED`
    AddrResolved,
    /// `RDMA_CM_EVENT_ADDR_ERROR`
    AddrError,
    /// `RDMA_CM_EVENT_ROUTE_RESOLVED`
    RouteResolved,
    /// `RDMA_CM_EVENT_ROUTE_ERROR`
    RouteError,
    /// `RDMA_CM_EVENT_CONNECT_REQUEST`: carries a new identifier ([`Event::take_id`](crate::Event::take_id)).
    ConnectRequest,
    /// `RDMA_CM_EVENT_CONNECT_RESPONSE`: the peer accepted a connect whose queue pair the
    /// caller manages.
    ConnectResponse,
    /// `RDMA_CM_EVENT_CONNECT_ERROR`
    ConnectError,
    /// `RDMA_CM_EVENT_UNREACHABLE`: the peer did not answer.
    Unreachable,
    /// `RDMA_CM_EVENT_REJECTED`: the peer (or its connection manager) refused.
    Rejected,
    /// `RDMA_CM_EVENT_ESTABLISHED`
    Established,
    /// `RDMA_CM_EVENT_DISCONNECTED`
    Disconnected,
    /// `RDMA_CM_EVENT_DEVICE_REMOVAL`
    DeviceRemoval,
    /// `RDMA_CM_EVENT_MULTICAST_JOIN`
    MulticastJoin,
    /// `RDMA_CM_EVENT_MULTICAST_ERROR`
    MulticastError,
    /// `RDMA_CM_EVENT_ADDR_CHANGE`
    AddrChange,
    /// `RDMA_CM_EVENT_TIMEWAIT_EXIT`
    TimewaitExit,
    /// A kind this crate does not know (a newer librdmacm).
    Unknown(u32),
}

impl EventKind {
    /// The kind of C value `raw`.
    pub fn from_raw(raw: ffi::rdma_cm_event_type) -> Self {
        match raw {
            ffi::RDMA_CM_EVENT_ADDR_RESOLVED => Self::AddrResolved,
            ffi::RDMA_CM_EVENT_ADDR_ERROR => Self::AddrError,
            ffi::RDMA_CM_EVENT_ROUTE_RESOLVED => Self::RouteResolved,
            ffi::RDMA_CM_EVENT_ROUTE_ERROR => Self::RouteError,
            ffi::RDMA_CM_EVENT_CONNECT_REQUEST => Self::ConnectRequest,
            ffi::RDMA_CM_EVENT_CONNECT_RESPONSE => Self::ConnectResponse,
            ffi::RDMA_CM_EVENT_CONNECT_ERROR => Self::ConnectError,
            ffi::RDMA_CM_EVENT_UNREACHABLE => Self::Unreachable,
            ffi::RDMA_CM_EVENT_REJECTED => Self::Rejected,
            ffi::RDMA_CM_EVENT_ESTABLISHED => Self::Established,
            ffi::RDMA_CM_EVENT_DISCONNECTED => Self::Disconnected,
            ffi::RDMA_CM_EVENT_DEVICE_REMOVAL => Self::DeviceRemoval,
            ffi::RDMA_CM_EVENT_MULTICAST_JOIN => Self::MulticastJoin,
            ffi::RDMA_CM_EVENT_MULTICAST_ERROR => Self::MulticastError,
            ffi::RDMA_CM_EVENT_ADDR_CHANGE => Self::AddrChange,
            ffi::RDMA_CM_EVENT_TIMEWAIT_EXIT => Self::TimewaitExit,
            other => Self::Unknown(other),
        }
    }

    /// The C value.
    pub fn as_raw(self) -> ffi::rdma_cm_event_type {
        match self {
            Self::AddrResolved => ffi::RDMA_CM_EVENT_ADDR_RESOLVED,
            Self::AddrError => ffi::RDMA_CM_EVENT_ADDR_ERROR,
            Self::RouteResolved => ffi::RDMA_CM_EVENT_ROUTE_RESOLVED,
            Self::RouteError => ffi::RDMA_CM_EVENT_ROUTE_ERROR,
            Self::ConnectRequest => ffi::RDMA_CM_EVENT_CONNECT_REQUEST,
            Self::ConnectResponse => ffi::RDMA_CM_EVENT_CONNECT_RESPONSE,
            Self::ConnectError => ffi::RDMA_CM_EVENT_CONNECT_ERROR,
            Self::Unreachable => ffi::RDMA_CM_EVENT_UNREACHABLE,
            Self::Rejected => ffi::RDMA_CM_EVENT_REJECTED,
            Self::Established => ffi::RDMA_CM_EVENT_ESTABLISHED,
            Self::Disconnected => ffi::RDMA_CM_EVENT_DISCONNECTED,
            Self::DeviceRemoval => ffi::RDMA_CM_EVENT_DEVICE_REMOVAL,
            Self::MulticastJoin => ffi::RDMA_CM_EVENT_MULTICAST_JOIN,
            Self::MulticastError => ffi::RDMA_CM_EVENT_MULTICAST_ERROR,
            Self::AddrChange => ffi::RDMA_CM_EVENT_ADDR_CHANGE,
            Self::TimewaitExit => ffi::RDMA_CM_EVENT_TIMEWAIT_EXIT,
            Self::Unknown(raw) => raw,
        }
    }

    /// `rdma_event_str`: librdmacm's name of the kind, for example `RDMA_CM_EVENT_REJECTED`
    /// (what the C tools print, and what `Display` writes); `UNKNOWN EVENT` for a kind it
    /// does not know.
    ///
    /// # References
    ///
    /// [`rdma_event_str(3)`](https://man7.org/linux/man-pages/man3/rdma_event_str.3.html)
    #[doc(alias = "rdma_event_str")]
    pub fn name(self) -> &'static str {
        // SAFETY: the call takes any value and returns a pointer to a static string literal.
        let name = unsafe { ffi::rdma_event_str(self.as_raw()) };
        if name.is_null() {
            return "UNKNOWN EVENT";
        }
        // SAFETY: non-null, NUL-terminated and static (librdmacm's table of literals).
        unsafe { std::ffi::CStr::from_ptr(name) }
            .to_str()
            .unwrap_or("UNKNOWN EVENT")
    }

    /// Whether events of this kind carry connection parameters (and private data) in their
    /// `conn` or `ud` part.
    pub(crate) fn has_param(self) -> bool {
        matches!(
            self,
            Self::ConnectRequest
                | Self::ConnectResponse
                | Self::Established
                | Self::Rejected
                | Self::Unreachable
                | Self::ConnectError
        )
    }
}

impl fmt::Display for EventKind {
    /// librdmacm's name ([`name`](Self::name)).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
