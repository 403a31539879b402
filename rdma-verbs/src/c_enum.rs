//! Integer-backed C enums as Rust enums with an `Unknown` arm, for every verbs module.

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
            pub fn from_raw(raw: $raw) -> Self {
                #[allow(non_upper_case_globals)] // matching on the C constants by name
                match raw {
                    $( x if x == $value as $raw => Self::$variant, )*
                    other => Self::Unknown(other),
                }
            }

            /// The C value.
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
