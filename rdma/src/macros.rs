//! Internal macros.

/// A `#[non_exhaustive]` enum over a C enum whose values come from the kernel
/// or a provider: every known value has a variant, and any other value is kept
/// in `Unknown(raw)`, so a newer kernel can never produce an invalid enum.
macro_rules! c_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident: $raw:ty {
            $( $(#[$vmeta:meta])* $variant:ident = $value:expr, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )*
            /// A value this version of the crate does not know.
            Unknown($raw),
        }

        impl $name {
            /// Converts the C value; unknown values are kept in `Unknown`.
            pub fn from_raw(raw: $raw) -> Self {
                $( if raw == ($value) as $raw { return $name::$variant; } )*
                $name::Unknown(raw)
            }

            /// The C value.
            pub fn to_raw(self) -> $raw {
                match self {
                    $( $name::$variant => ($value) as $raw, )*
                    $name::Unknown(raw) => raw,
                }
            }
        }

        impl From<$raw> for $name {
            fn from(raw: $raw) -> Self {
                Self::from_raw(raw)
            }
        }
    };
}

pub(crate) use c_enum;
