//! Parameter lists that several bindings share, each declared once.
//!
//! A shared list is a macro (`device_step_params!`, `device_half_params!`, `layout_params!`)
//! that hands the bindings it wraps to [`with_params!`] with the list: the argument struct (a
//! [`kwargs!`](super::conversion::kwargs) struct) and each parameter's Python annotation and
//! default, in the struct's field order, those after `*` keyword-only. The list macro wraps free
//! `#[pyfunction]`s or a whole `#[pymethods]` block (PyO3 registers no method that a macro inside
//! the block emits).
//!
//! A binding takes the list with `#[signature((before) ..a (after) -> "R")]` as its first
//! attribute: `before` and `after` are the rest of its PyO3 signature (annotated as usual, `before`
//! with its trailing comma), and `a` names the converted struct in its body. Its Rust parameters
//! are written the same way, `fn f(before,) (after) -> T { .. }`: the list's parameters go
//! between, each an `Option<&Bound<PyAny>>`, converted into `a` before the body runs.
//! `scripts/gen_stubs.py` expands the lists the same way for the stub.

/// Emits the items after the list, each `#[signature(...)]` binding with the list spliced in
/// (see the module's documentation).
macro_rules! with_params {
    // Done: the items, inside their impl block when they came in one.
    (@items $l:tt [] [$($done:tt)*]) => { $($done)* };
    (@items $l:tt [$($h:tt)+] [$($done:tt)*]) => { $($h)+ { $($done)* } };
    // A binding that takes the list.
    (@items ($S:path { $($n:ident : $na:literal $(= $nd:tt)?),* $(,)? } $(* { $($k:ident : $ka:literal $(= $kd:tt)?),* $(,)? })?)
        $h:tt [$($done:tt)*]
        #[signature(($($pre:tt)*) .. $a:ident $(($($post:tt)*))? -> $ret:literal)]
        $(#[$m:meta])*
        $v:vis fn $f:ident ($($p:tt)*) $(($($q:tt)*))? -> $rt:ty $b:block
        $($rest:tt)*
    ) => {
        $crate::python::params::with_params!(@items ($S { $($n : $na $(= $nd)?),* } $(* { $($k : $ka $(= $kd)?),* })?) $h [
            $($done)*
            $(#[$m])*
            #[allow(clippy::too_many_arguments)]
            #[pyo3(signature = ($($pre)* $($n : $na $(= $nd)?,)* $(*, $($k : $ka $(= $kd)?,)*)? $($($post)*)?) -> $ret)]
            $v fn $f(
                $($p)*
                $($n: Option<&pyo3::Bound<'_, pyo3::PyAny>>,)*
                $($($k: Option<&pyo3::Bound<'_, pyo3::PyAny>>,)*)?
                $($($q)*)?
            ) -> $rt {
                let $a = $crate::python::conversion::args!($S { $($n,)* $($($k,)*)? })?;
                $b
            }
        ] $($rest)*);
    };
    // Any other item, as it is.
    (@items $l:tt $h:tt [$($done:tt)*] $(#[$m:meta])* $v:vis fn $f:ident ($($p:tt)*) $(-> $rt:ty)? $b:block $($rest:tt)*) => {
        $crate::python::params::with_params!(@items $l $h [$($done)* $(#[$m])* $v fn $f($($p)*) $(-> $rt)? $b] $($rest)*);
    };
    // Entry: an impl block, or free functions.
    ($l:tt $(#[$im:meta])* impl $t:ident { $($body:tt)* }) => {
        $crate::python::params::with_params!(@items $l [$(#[$im])* impl $t] [] $($body)*);
    };
    ($l:tt $($items:tt)*) => {
        $crate::python::params::with_params!(@items $l [] [] $($items)*);
    };
}
pub(crate) use with_params;
