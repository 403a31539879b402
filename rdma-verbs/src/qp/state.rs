//! Queue-pair states and transports as types.

use std::fmt;

use crate::ffi;

mod sealed {
    pub trait Sealed {}
}

/// A queue-pair state known at compile time: [`Reset`], [`Init`], [`Rtr`], [`Rts`] or
/// [`Error`].
pub trait QpState: sealed::Sealed + 'static {
    /// The state's run-time name.
    const KIND: QpStateKind;
}

/// States in which receive requests may be posted: [`Init`], [`Rtr`] and [`Rts`].
pub trait CanPostRecv: QpState {}

/// The RESET state: just created, or reset. Nothing may be posted.
#[derive(Debug)]
pub enum Reset {}
/// The INIT state: receives may be posted; nothing is sent or received yet.
#[derive(Debug)]
pub enum Init {}
/// The RTR (ready to receive) state: incoming messages are accepted.
#[derive(Debug)]
pub enum Rtr {}
/// The RTS (ready to send) state: sends may be posted.
#[derive(Debug)]
pub enum Rts {}
/// The ERR state: outstanding and new requests complete with a flush error.
#[derive(Debug)]
pub enum Error {}

macro_rules! states {
    ($($state:ident => $kind:ident),*) => {$(
        impl sealed::Sealed for $state {}
        impl QpState for $state {
            const KIND: QpStateKind = QpStateKind::$kind;
        }
    )*};
}
states!(Reset => Reset, Init => Init, Rtr => Rtr, Rts => Rts, Error => Error);
impl CanPostRecv for Init {}
impl CanPostRecv for Rtr {}
impl CanPostRecv for Rts {}

/// A queue-pair state at run time (`enum ibv_qp_state`), as [`query_state`] reports it and
/// errors name it.
///
/// [`query_state`]: crate::QueuePair::query_state
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum QpStateKind {
    /// `IBV_QPS_RESET`.
    Reset,
    /// `IBV_QPS_INIT`.
    Init,
    /// `IBV_QPS_RTR`.
    Rtr,
    /// `IBV_QPS_RTS`.
    Rts,
    /// `IBV_QPS_SQD`: send queue drained.
    Sqd,
    /// `IBV_QPS_SQE`: send queue error.
    Sqe,
    /// `IBV_QPS_ERR`.
    Error,
    /// A value this crate does not know.
    Unknown(u32),
}

impl QpStateKind {
    /// Converts the C value.
    pub fn from_raw(raw: u32) -> Self {
        match raw {
            ffi::IBV_QPS_RESET => Self::Reset,
            ffi::IBV_QPS_INIT => Self::Init,
            ffi::IBV_QPS_RTR => Self::Rtr,
            ffi::IBV_QPS_RTS => Self::Rts,
            ffi::IBV_QPS_SQD => Self::Sqd,
            ffi::IBV_QPS_SQE => Self::Sqe,
            ffi::IBV_QPS_ERR => Self::Error,
            other => Self::Unknown(other),
        }
    }

    /// The C value.
    pub fn as_raw(self) -> u32 {
        match self {
            Self::Reset => ffi::IBV_QPS_RESET,
            Self::Init => ffi::IBV_QPS_INIT,
            Self::Rtr => ffi::IBV_QPS_RTR,
            Self::Rts => ffi::IBV_QPS_RTS,
            Self::Sqd => ffi::IBV_QPS_SQD,
            Self::Sqe => ffi::IBV_QPS_SQE,
            Self::Error => ffi::IBV_QPS_ERR,
            Self::Unknown(raw) => raw,
        }
    }
}

impl fmt::Display for QpStateKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Reset => f.write_str("RESET"),
            Self::Init => f.write_str("INIT"),
            Self::Rtr => f.write_str("RTR"),
            Self::Rts => f.write_str("RTS"),
            Self::Sqd => f.write_str("SQD"),
            Self::Sqe => f.write_str("SQE"),
            Self::Error => f.write_str("ERR"),
            Self::Unknown(raw) => write!(f, "state {raw}"),
        }
    }
}
