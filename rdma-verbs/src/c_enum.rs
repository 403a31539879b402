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

c_enum! {
    /// The operation of a send work request (`enum ibv_wr_opcode`), as
    /// [`data_in_order`](crate::QueuePair::data_in_order) asks about it.
    SendOpcode: u32 {
        /// `IBV_WR_RDMA_WRITE`.
        Write = ffi::IBV_WR_RDMA_WRITE,
        /// `IBV_WR_RDMA_WRITE_WITH_IMM`.
        WriteWithImm = ffi::IBV_WR_RDMA_WRITE_WITH_IMM,
        /// `IBV_WR_SEND`.
        Send = ffi::IBV_WR_SEND,
        /// `IBV_WR_SEND_WITH_IMM`.
        SendWithImm = ffi::IBV_WR_SEND_WITH_IMM,
        /// `IBV_WR_RDMA_READ`.
        Read = ffi::IBV_WR_RDMA_READ,
        /// `IBV_WR_ATOMIC_CMP_AND_SWP`.
        CompareSwap = ffi::IBV_WR_ATOMIC_CMP_AND_SWP,
        /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
        FetchAdd = ffi::IBV_WR_ATOMIC_FETCH_AND_ADD,
        /// `IBV_WR_LOCAL_INV`.
        LocalInvalidate = ffi::IBV_WR_LOCAL_INV,
        /// `IBV_WR_BIND_MW`.
        BindWindow = ffi::IBV_WR_BIND_MW,
        /// `IBV_WR_SEND_WITH_INV`.
        SendWithInvalidate = ffi::IBV_WR_SEND_WITH_INV,
        /// `IBV_WR_TSO`.
        Tso = ffi::IBV_WR_TSO,
        /// `IBV_WR_ATOMIC_WRITE`.
        AtomicWrite = ffi::IBV_WR_ATOMIC_WRITE,
    }
}

/// The text of a name that libibverbs keeps as a static string literal (what
/// `ibv_port_state_str`, `ibv_node_type_str` and `ibv_event_type_str` return), or `"unknown"`
/// for a null pointer or text that is not UTF-8 (neither happens with rdma-core's tables).
///
/// # Safety
///
/// `ptr` is null or points to a NUL-terminated string that lives for the whole program.
pub(crate) unsafe fn static_name(ptr: *const libc::c_char) -> &'static str {
    if ptr.is_null() {
        return "unknown";
    }
    // SAFETY: NUL-terminated and static (the contract).
    unsafe { std::ffi::CStr::from_ptr(ptr) }
        .to_str()
        .unwrap_or("unknown")
}
