//! Blocking helpers for an identifier alone on its channel: resolve, connect and accept a
//! typestate queue pair of `rdma-verbs`.

use std::net::SocketAddr;
use std::time::Duration;

use rdma_verbs::{
    QueuePair,
    qp::{Init, QpStateKind, Rc, Reset, Rts},
};

use crate::c_enum::EventKind;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::id::CmId;
use crate::param::ConnParam;

impl CmId {
    /// Waits (at most `timeout`) for the next event of this identifier's channel, which must
    /// be a `kind` event about this identifier.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`]; [`Error::Event`] when another kind came (a rejection, an error:
    /// its status and private data are in the error); [`Error::OtherIdentifier`] when the
    /// event was about another identifier of the channel (it is acknowledged and lost: these
    /// helpers are for an identifier alone on its channel).
    pub fn wait_event(&self, kind: EventKind, timeout: Duration) -> Result<Event> {
        let event = self
            .channel()
            .get_event(Some(timeout))?
            .ok_or(Error::Timeout {
                expected: kind,
                waited: timeout,
            })?;
        self.expect_event(event, kind)
    }

    /// Refuses a queue pair of another device than the identifier's: the connection manager
    /// would announce a queue pair number that does not exist where the connection goes.
    pub(crate) fn check_device(&self, qp_context: &rdma_verbs::Context) -> Result<()> {
        let own = self.context()?;
        if own.as_raw() == qp_context.as_raw() || own.device_name() == qp_context.device_name() {
            Ok(())
        } else {
            Err(Error::InvalidArgument(
                "the queue pair is on another device than the identifier",
            ))
        }
    }

    /// `event` if it is a `kind` event about this identifier; the error a wait reports
    /// otherwise.
    pub(crate) fn expect_event(&self, event: Event, kind: EventKind) -> Result<Event> {
        if !event.is_for(self) {
            return Err(Error::OtherIdentifier {
                expected: kind,
                event: event.kind(),
            });
        }
        if event.kind() != kind {
            return Err(event.into_error(kind));
        }
        Ok(event)
    }

    /// Resolves `dst`'s address and the route to it: [`resolve_addr`](Self::resolve_addr),
    /// `AddrResolved`, [`resolve_route`](Self::resolve_route), `RouteResolved`, each bounded
    /// by `timeout`.
    ///
    /// # Errors
    ///
    /// As the calls and [`wait_event`](Self::wait_event) (an unreachable address is an
    /// [`Error::Event`] with `AddrError` and a negative errno).
    pub fn resolve(&self, dst: SocketAddr, timeout: Duration) -> Result<()> {
        self.resolve_addr(None, dst, timeout)?;
        // librdmacm's own timer ends the resolution; the wait allows it a margin.
        let bound = timeout.saturating_add(MARGIN);
        drop(self.wait_event(EventKind::AddrResolved, bound)?);
        self.resolve_route(timeout)?;
        drop(self.wait_event(EventKind::RouteResolved, bound)?);
        Ok(())
    }

    /// Connects `qp` (an RC queue pair in RESET, made on this identifier's
    /// [`context`](Self::context), after [`resolve`](Self::resolve)): INIT, `rdma_connect`
    /// with `param`, the `ConnectResponse`, INIT again (now with the remote access the
    /// connection negotiated), RTR and RTS with the connection's attributes, and
    /// `rdma_establish`. Returns the queue pair in RTS and the private data of the peer's
    /// accept.
    ///
    /// # Errors
    ///
    /// As the calls; a refusal is [`Error::Event`] (`Rejected` with the peer's private data,
    /// `Unreachable`, `ConnectError`), within `timeout`. The queue pair is destroyed on
    /// failure.
    pub fn connect_qp(
        &self,
        qp: QueuePair<Rc, Reset>,
        param: &ConnParam,
        timeout: Duration,
    ) -> Result<(QueuePair<Rc, Rts>, Vec<u8>)> {
        self.connect_init_qp(self.init_rc_qp(qp)?, param, timeout)
    }

    /// The active side's queue pair to INIT with this identifier's port and partition (no
    /// remote access yet): post the first receives on it, then
    /// [`connect_init_qp`](Self::connect_init_qp), so that they are there before the peer
    /// can send.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a queue pair of another device than the identifier's;
    /// as [`init_qp_attr`](Self::init_qp_attr) (`EINVAL` before the route is resolved) and
    /// the transition; the queue pair is destroyed on failure.
    pub fn init_rc_qp(&self, qp: QueuePair<Rc, Reset>) -> Result<QueuePair<Rc, Init>> {
        self.check_qp(&qp)?;
        Ok(qp
            .into_init_with(&self.init_qp_attr(QpStateKind::Init)?)
            .map_err(|e| e.into_parts().1)?)
    }

    /// [`connect_qp`](Self::connect_qp) for a queue pair in INIT already, its first receives
    /// posted: from [`init_rc_qp`](Self::init_rc_qp), or the identifier's own from
    /// [`create_qp`](Self::create_qp), which the connection manager moves to RTR and RTS
    /// itself (then the wait is for `Established`, which carries the accept's private data).
    ///
    /// # Errors
    ///
    /// As [`connect_qp`](Self::connect_qp).
    pub fn connect_init_qp(
        &self,
        qp: QueuePair<Rc, Init>,
        param: &ConnParam,
        timeout: Duration,
    ) -> Result<(QueuePair<Rc, Rts>, Vec<u8>)> {
        if self.made(&qp) {
            self.connect(param)?;
            let established = self.wait_event(EventKind::Established, timeout)?;
            let private_data = established.private_data().to_vec();
            drop(established);
            // SAFETY: the connection manager moved its queue pair to RTS before reporting
            // `Established` (`rdma_connect` with `id->qp` set).
            return Ok((unsafe { qp.assume_state::<Rts>() }, private_data));
        }
        self.check_qp(&qp)?;
        self.connect(&param.clone().qp_num(qp.qp_num()))?;
        let response = self.wait_event(EventKind::ConnectResponse, timeout)?;
        let private_data = response.private_data().to_vec();
        drop(response);
        Ok((self.connect_finish(qp)?, private_data))
    }

    /// The active side's steps after the `ConnectResponse`: the enhanced connection
    /// establishment options the peer accepted onto the queue pair (where both sides set
    /// some; a device without ECE ignores them), INIT again, RTR, RTS, `rdma_establish`; on
    /// failure the connection is refused.
    pub(crate) fn connect_finish(&self, mut qp: QueuePair<Rc, Init>) -> Result<QueuePair<Rc, Rts>> {
        let ready = self
            .apply_remote_ece(&mut qp)
            .and_then(|()| self.init_qp_attr(QpStateKind::Init))
            .and_then(|init| {
                // INIT again: now that the connection is known, its attributes carry the
                // remote access the connection negotiated (the first ones allow none).
                qp.update_init_with(&init)?;
                self.init_qp_attr(QpStateKind::Rtr)
            })
            .and_then(|rtr| {
                let qp = qp.into_rtr_with(&rtr).map_err(|e| e.into_parts().1)?;
                let rts = self.init_qp_attr(QpStateKind::Rts)?;
                Ok(qp.into_rts_with(&rts).map_err(|e| e.into_parts().1)?)
            });
        match ready {
            Ok(qp) => {
                self.establish()?;
                Ok(qp)
            }
            Err(error) => {
                // The peer accepted and waits for the connection: refuse it rather than leave
                // it waiting for its timeout (best effort: the error above is the one to report).
                let _ = self.reject(&[]);
                Err(error)
            }
        }
    }

    /// Sets the ECE options of the peer's reply on `qp` before RTR, as librdmacm does for a
    /// queue pair it manages: nothing where the reply carried none, and a device without ECE
    /// ([`rdma_verbs::Error::Unsupported`]) keeps none.
    fn apply_remote_ece(&self, qp: &mut QueuePair<Rc, Init>) -> Result<()> {
        let ece = self.remote_ece()?;
        if ece.vendor_id == 0 {
            return Ok(());
        }
        match qp.set_ece(ece) {
            Ok(()) | Err(rdma_verbs::Error::Unsupported(_)) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    /// Accepts the connect request this identifier came with (from
    /// [`Event::take_id`](crate::Event::take_id)) on `qp` (an RC queue pair in RESET, made on
    /// this identifier's [`context`](Self::context)): INIT, RTR and RTS with the connection's
    /// attributes, `rdma_accept` with `param`, then waits for `Established`.
    ///
    /// # Errors
    ///
    /// As the calls and [`wait_event`](Self::wait_event); the queue pair is destroyed on
    /// failure.
    pub fn accept_qp(
        &self,
        qp: QueuePair<Rc, Reset>,
        param: &ConnParam,
        timeout: Duration,
    ) -> Result<QueuePair<Rc, Rts>> {
        let qp = self.ready_rc_qp(qp)?;
        self.accept(&param.clone().qp_num(qp.qp_num()))?;
        self.wait_established(qp, timeout)
    }

    /// [`accept_qp`](Self::accept_qp) for a queue pair in INIT already, its first receives
    /// posted: the identifier's own from [`create_qp`](Self::create_qp), which the connection
    /// manager moves to RTR and RTS itself within `rdma_accept`, or one moved to INIT with
    /// [`init_qp_attr`](Self::init_qp_attr), which this moves on with the connection's
    /// attributes first.
    ///
    /// # Errors
    ///
    /// As [`accept_qp`](Self::accept_qp).
    pub fn accept_init_qp(
        &self,
        qp: QueuePair<Rc, Init>,
        param: &ConnParam,
        timeout: Duration,
    ) -> Result<QueuePair<Rc, Rts>> {
        let qp = if self.made(&qp) {
            self.accept(param)?;
            // SAFETY: `rdma_accept` with `id->qp` set moved the queue pair to RTR and RTS
            // before sending the accept, and returned 0.
            unsafe { qp.assume_state::<Rts>() }
        } else {
            self.check_qp(&qp)?;
            let mut qp = qp;
            qp.update_init_with(&self.init_qp_attr(QpStateKind::Init)?)?;
            let qp = qp
                .into_rtr_with(&self.init_qp_attr(QpStateKind::Rtr)?)
                .map_err(|e| e.into_parts().1)?
                .into_rts_with(&self.init_qp_attr(QpStateKind::Rts)?)
                .map_err(|e| e.into_parts().1)?;
            self.accept(&param.clone().qp_num(qp.qp_num()))?;
            qp
        };
        self.wait_established(qp, timeout)
    }

    /// Waits for the `Established` event of an accepted connection; on failure the connection
    /// ends with the queue pair.
    fn wait_established(
        &self,
        qp: QueuePair<Rc, Rts>,
        timeout: Duration,
    ) -> Result<QueuePair<Rc, Rts>> {
        match self.wait_event(EventKind::Established, timeout) {
            Ok(established) => {
                drop(established);
                Ok(qp)
            }
            Err(error) => {
                // The queue pair goes with the error: end the connection too, should it still
                // be completing (best effort).
                let _ = self.disconnect();
                Err(error)
            }
        }
    }

    /// The passive side's queue pair: moves `qp` (RC, RESET, on this identifier's
    /// [`context`](Self::context)) to INIT, RTR and RTS with the attributes of the connect
    /// request this identifier came with. Post the first receives on it, then
    /// [`accept`](Self::accept) with its number ([`ConnParam::qp_num`]) and wait for
    /// `Established`: the client cannot send before the accept. [`accept_qp`](Self::accept_qp)
    /// does it all, without the receives.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a queue pair of another device than the identifier's;
    /// as [`init_qp_attr`](Self::init_qp_attr) (`EINVAL` on an identifier that did not come
    /// with a connect request) and the transitions; the queue pair is destroyed on failure.
    pub fn ready_rc_qp(&self, qp: QueuePair<Rc, Reset>) -> Result<QueuePair<Rc, Rts>> {
        self.check_qp(&qp)?;
        let qp = qp
            .into_init_with(&self.init_qp_attr(QpStateKind::Init)?)
            .map_err(|e| e.into_parts().1)?
            .into_rtr_with(&self.init_qp_attr(QpStateKind::Rtr)?)
            .map_err(|e| e.into_parts().1)?
            .into_rts_with(&self.init_qp_attr(QpStateKind::Rts)?)
            .map_err(|e| e.into_parts().1)?;
        Ok(qp)
    }
}

/// What a wait allows beyond librdmacm's own timeout.
const MARGIN: Duration = Duration::from_secs(5);
