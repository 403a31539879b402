//! The crate's error type.

use std::time::Duration;

use rdma_verbs::Errno;

use crate::c_enum::EventKind;

/// What went wrong in a connection-manager call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A librdmacm call failed.
    #[error("{call} failed: {errno}")]
    Call {
        /// The C function, for example `rdma_resolve_addr`.
        call: &'static str,
        /// Its errno.
        #[source]
        errno: Errno,
    },
    /// A verbs call on the identifier's device failed (creating or moving its queue pair).
    #[error(transparent)]
    Verbs(#[from] rdma_verbs::Error),
    /// The connection manager reported something other than what the call waited for: a
    /// rejection, an unreachable peer, an address or route error. `status` is the event's
    /// status (a negative errno for errors; for [`EventKind::Rejected`] the reject reason, 28
    /// when the peer's application rejected), `private_data` what the peer sent with it.
    #[error("waited for {expected}, the connection manager reported {event} (status {status})")]
    Event {
        /// The event the call waited for.
        expected: EventKind,
        /// The event that came.
        event: EventKind,
        /// Its status.
        status: i32,
        /// The private data it carried (empty if none).
        private_data: Vec<u8>,
    },
    /// No event came within the bound.
    #[error("no {expected} event within {waited:?}")]
    Timeout {
        /// The event waited for.
        expected: EventKind,
        /// How long.
        waited: Duration,
    },
    /// An event came for another identifier of the same channel while a blocking call waited
    /// for one of its own; the event was acknowledged. The blocking helpers are for an
    /// identifier alone on its channel.
    #[error("an event ({event}) for another identifier came while waiting for {expected}")]
    OtherIdentifier {
        /// The event waited for.
        expected: EventKind,
        /// The other identifier's event.
        event: EventKind,
    },
    /// Private data longer than a connection parameter can carry (255 bytes; the wire allows
    /// less: 56 bytes in a connect request, 196 in an accept, 148 in a reject on InfiniBand and
    /// RoCE, which the kernel enforces).
    #[error("{len} bytes of private data; at most 255")]
    PrivateDataTooLong {
        /// The length given.
        len: usize,
    },
    /// The identifier is not bound to a device yet: resolve an address first, or take it from
    /// a connect request.
    #[error("the identifier has no device yet (resolve an address or bind to a local one first)")]
    NoDevice,
    /// The identifier has events that are not acknowledged yet: librdmacm would wait for them
    /// forever (`rdma_migrate_id`).
    #[error("{call}: {count} events of this identifier are still held; drop them first")]
    EventsHeld {
        /// The call refused.
        call: &'static str,
        /// How many events are held.
        count: usize,
    },
    /// A name or service could not be resolved (`rdma_getaddrinfo`).
    #[error("rdma_getaddrinfo failed for {what}: {reason}")]
    AddrInfo {
        /// The node and service asked for.
        what: String,
        /// The resolver's message.
        reason: String,
    },
    /// An argument out of range, named.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
}

impl Error {
    pub(crate) fn last(call: &'static str) -> Self {
        Error::Call {
            call,
            errno: Errno::last(),
        }
    }

    /// For an [`Error::Event`], the event kind that came, else `None`.
    pub fn event(&self) -> Option<EventKind> {
        match self {
            Error::Event { event, .. } => Some(*event),
            _ => None,
        }
    }
}

/// A `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
