//! Connect requests taken off a listener, each identifier moved to an event channel of its
//! own: the server side of the blocking and the async API.

use std::time::Duration;

use crate::c_enum::EventKind;
use crate::channel::EventChannel;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::id::CmId;
use crate::param::PeerParam;

/// A connect request, taken off its listener: the new identifier, alone on an event channel
/// of its own (so [`accept_qp`](CmId::accept_qp), [`wait_event`](CmId::wait_event) and its
/// later events concern it alone), and what the request carried. The request event itself is
/// acknowledged already.
///
/// Accept it ([`CmId::accept_qp`], [`CmId::accept_ud`]) or [`reject`](CmId::reject) it;
/// dropped, the identifier is destroyed and the client is refused by its connection manager.
#[derive(Debug)]
#[must_use = "a connect request is refused when dropped"]
#[non_exhaustive]
pub struct ConnectRequest {
    /// The request's identifier, on a channel of its own.
    pub id: CmId,
    /// The private data of the request (the whole field of the message: see
    /// [`Event::private_data`]).
    pub private_data: Vec<u8>,
    /// The client's connection parameters (connected port spaces).
    pub peer: Option<PeerParam>,
}

impl ConnectRequest {
    /// Takes the request out of `event` (a `ConnectRequest` event whose identifier was not
    /// taken yet): copies what it carried, acknowledges it, and migrates the identifier to a
    /// new event channel.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for another kind of event or one whose identifier was
    /// taken; as [`EventChannel::new`] and [`CmId::migrate`] (the identifier is destroyed
    /// then, refusing the client).
    pub fn from_event(mut event: Event) -> Result<Self> {
        if event.kind() != EventKind::ConnectRequest {
            return Err(Error::InvalidArgument("not a connect request event"));
        }
        let id = event.take_id().ok_or(Error::InvalidArgument(
            "the connect request's identifier was taken already",
        ))?;
        let private_data = event.private_data().to_vec();
        let peer = event.peer_param();
        // Acknowledged first: an identifier with an event held is not migrated.
        drop(event);
        id.migrate(&EventChannel::new()?)?;
        Ok(Self {
            id,
            private_data,
            peer,
        })
    }
}

impl CmId {
    /// For a listener alone on its channel: waits (at most `timeout`) for the next connect
    /// request and takes it ([`ConnectRequest::from_event`]), its identifier on a channel of
    /// its own.
    ///
    /// # Errors
    ///
    /// As [`wait_event`](Self::wait_event) (another event than a connect request is an
    /// [`Error::Event`]) and [`ConnectRequest::from_event`].
    pub fn get_request(&self, timeout: Duration) -> Result<ConnectRequest> {
        ConnectRequest::from_event(self.wait_event(EventKind::ConnectRequest, timeout)?)
    }
}
