//! Enums whose variants have one spelling each (roles, conv layouts, gate kinds, backends,
//! semantics): the spelling is written once, and `name` and `parse` both come from it.

/// Declares an enum whose variants each have one spelling: `name()` gives it, `ALL` lists the
/// variants, and `parse(s)` reads it back -- `exact`ly, or `any_case` (trimmed, ASCII case
/// ignored) -- refusing anything else with the error `$err(s)` builds.
macro_rules! named_enum {
    (
        $(#[$m:meta])*
        pub enum $name:ident { $($(#[$vm:meta])* $variant:ident = $spelling:literal),+ $(,)? }
        parse: $mode:ident, $err:expr
    ) => {
        $(#[$m])*
        pub enum $name {
            $($(#[$vm])* $variant),+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The variant's spelling.
            pub fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $spelling),+
                }
            }

            /// The variant spelled `s`.
            pub fn parse(s: &str) -> $crate::error::Result<$name> {
                let err: fn(&str) -> $crate::error::Error = $err;
                $name::ALL.iter().copied().find(|v| named_enum!(@eq $mode, s, v.name())).ok_or_else(|| err(s))
            }
        }
    };
    (@eq exact, $s:expr, $n:expr) => {
        $s == $n
    };
    (@eq any_case, $s:expr, $n:expr) => {
        $s.trim().eq_ignore_ascii_case($n)
    };
}
