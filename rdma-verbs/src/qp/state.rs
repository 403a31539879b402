//! Queue-pair states and transports as types.

use std::fmt;

mod sealed {
    pub trait Sealed {}
}

/// A queue-pair state known at compile time: [`Reset`], [`Init`], [`Rtr`], [`Rts`] or
/// [`ErrorState`].
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
/// The ERR state: outstanding and new requests complete with a flush error. (Named so that it
/// shadows neither the prelude's `Err` nor the crate's [`Error`](crate::Error).)
#[derive(Debug)]
pub enum ErrorState {}

macro_rules! states {
    ($($state:ident => $kind:ident),*) => {$(
        impl sealed::Sealed for $state {}
        impl QpState for $state {
            const KIND: QpStateKind = QpStateKind::$kind;
        }
    )*};
}
states!(Reset => Reset, Init => Init, Rtr => Rtr, Rts => Rts, ErrorState => Error);
impl CanPostRecv for Init {}
impl CanPostRecv for Rtr {}
impl CanPostRecv for Rts {}

pub use crate::c_enum::QpStateKind;

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
