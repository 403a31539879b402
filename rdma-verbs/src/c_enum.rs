//! Integer-backed C enums as Rust enums with an `Unknown` arm: the macro every verbs module
//! declares its enums with, and the enums that several modules name (a leaf module, so that
//! naming them adds no edge between those modules).

use crate::ffi;

/// Declares an integer-backed enum with an `Unknown` arm, and its conversions.
macro_rules! c_enum {
    (
        $(#[$meta:meta])*
        $name:ident: $raw:ty {
            $( $(#[$vmeta:meta])* $variant:ident = $value:path, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )*
            /// A value this crate does not know (from a newer rdma-core or kernel).
            Unknown($raw),
        }

        impl $name {
            /// Converts the C value.
            #[inline]
            pub fn from_raw(raw: $raw) -> Self {
                #[allow(non_upper_case_globals)] // matching on the C constants by name
                match raw {
                    $( x if x == $value as $raw => Self::$variant, )*
                    other => Self::Unknown(other),
                }
            }

            /// The C value.
            #[inline]
            pub fn as_raw(self) -> $raw {
                match self {
                    $( Self::$variant => $value as $raw, )*
                    Self::Unknown(raw) => raw,
                }
            }
        }
    };
}
pub(crate) use c_enum;

c_enum! {
    /// A queue-pair state at run time (`enum ibv_qp_state`), as
    /// [`query_state`](crate::QueuePair::query_state) reports it and errors name it.
    QpStateKind: u32 {
        /// `IBV_QPS_RESET`.
        Reset = ffi::IBV_QPS_RESET,
        /// `IBV_QPS_INIT`.
        Init = ffi::IBV_QPS_INIT,
        /// `IBV_QPS_RTR`.
        Rtr = ffi::IBV_QPS_RTR,
        /// `IBV_QPS_RTS`.
        Rts = ffi::IBV_QPS_RTS,
        /// `IBV_QPS_SQD`: send queue drained.
        Sqd = ffi::IBV_QPS_SQD,
        /// `IBV_QPS_SQE`: send queue error.
        Sqe = ffi::IBV_QPS_SQE,
        /// `IBV_QPS_ERR`.
        Error = ffi::IBV_QPS_ERR,
    }
}
