//! What crosses the boundary, converted once: integers, integer vectors and block tables (read by
//! `int_arrays.rs`, re-exported here), tensors (described by `tensor.rs`), dtype names, and the
//! argument structs of the calls that take a step's vectors. Every conversion names the argument
//! it converts in its error, which is one of the package's exception classes (the call's error
//! kind): a float, bool or object where an integer array belongs is refused, never truncated.

pub(crate) use super::int_arrays::{Ints, Table, Tables};
use super::tensor::{describe, Described};
use crate::error::{Error, ErrorKind};
use crate::tensor::TensorDesc;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyString, PyTuple};

/// An error of `kind` naming the argument.
pub(crate) fn arg_error(kind: ErrorKind, message: String) -> PyErr {
    Error { kind, message }.into()
}

/// An address or a byte count a tensor returned (`data_ptr()`, `nbytes()`, an array interface's
/// data address): read as a C `long` first (CPython converts a two-digit int to a `long` directly,
/// but to an `unsigned long long` through its generic byte-array path, the larger part of the
/// conversion's cost), as a `u64` above `2**63 - 1`.
pub(crate) fn address_int(x: &Bound<'_, PyAny>) -> PyResult<u64> {
    match x.extract::<i64>() {
        Ok(v) if v >= 0 => Ok(v as u64),
        _ => x.extract(),
    }
}

/// A value converted from one argument of a call.
pub(crate) trait Arg: Sized {
    /// Converts `obj`, the argument `name` of a call whose errors are of `kind`.
    fn arg(obj: &Bound<'_, PyAny>, name: &str, kind: ErrorKind) -> PyResult<Self>;
    /// The value of a required argument the binding received as `None`: a parameter the binding's
    /// signature declares without a default reaches here only when the caller passed `None` (Python
    /// itself refuses a call that leaves it out), so the error is the one converting `None` gives
    /// (`tp_size must be a host integer ..., got NoneType`), which names the argument and the value.
    fn absent(name: &str, kind: ErrorKind) -> PyResult<Self> {
        Python::attach(|py| match Self::arg(py.None().bind(py), name, kind) {
            Err(e) => Err(e),
            Ok(_) => Err(arg_error(kind, format!("{name} must be given, got None"))),
        })
    }
}

impl<T: Arg> Arg for Option<T> {
    fn arg(obj: &Bound<'_, PyAny>, name: &str, kind: ErrorKind) -> PyResult<Self> {
        if obj.is_none() {
            Ok(None)
        } else {
            T::arg(obj, name, kind).map(Some)
        }
    }
    fn absent(_: &str, _: ErrorKind) -> PyResult<Self> {
        Ok(None)
    }
}

/// The type name of `obj` for messages: a builtin's bare name (`float`, `list`, `NoneType`), any
/// other type's module-qualified name (`numpy.ndarray`, `numpy.bool`, `torch.Tensor`), so that
/// numpy's bool or a class that calls itself `int` is not reported as Python's own.
pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    let t = obj.get_type();
    let name = t.qualname().or_else(|_| t.name()).map(|n| n.to_string()).unwrap_or_else(|_| "object".into());
    match t.module() {
        Ok(m) if m.to_str().is_ok_and(|m| m != "builtins" && m != "__main__") => format!("{m}.{name}"),
        _ => name,
    }
}

/// The error for the host integer `obj` (the argument `name`) outside `[min, max]`: its value (a
/// number too long for Python to print in decimal, past a few thousand digits, by its bit length)
/// and the bound it crosses.
fn out_of_range(obj: &Bound<'_, PyAny>, name: &str, kind: ErrorKind, min: i128, max: u128) -> PyErr {
    let negative = obj.lt(0).unwrap_or(false);
    let message = match obj.str() {
        Ok(v) if negative => format!("{name} = {v} must be >= {min}"),
        Ok(v) => format!("{name} = {v} is too large (at most {max})"),
        Err(_) => {
            let bits = obj.call_method0(intern!(obj.py(), "bit_length")).map(|b| b.to_string()).unwrap_or_else(|_| "?".into());
            if negative {
                format!("{name} is a negative integer of {bits} bits; it must be >= {min}")
            } else {
                format!("{name} is an integer of {bits} bits, too large (at most {max})")
            }
        }
    };
    arg_error(kind, message)
}

/// `e`, raised while reading `what` (an engine's or a caller's object, by attribute, key or
/// iteration), as an error of `kind` naming `what` and the reason when it says the object is of the
/// wrong kind (Python's `AttributeError`, `TypeError`, `KeyError`, `IndexError`, `ValueError`);
/// any other error (the package's own included) unchanged.
pub(crate) fn reading(kind: ErrorKind, what: &str, e: PyErr) -> PyErr {
    use pyo3::exceptions::{PyAttributeError, PyIndexError, PyKeyError, PyTypeError, PyValueError};
    Python::attach(|py| {
        let wrong_kind = [
            e.is_instance_of::<PyAttributeError>(py),
            e.is_instance_of::<PyTypeError>(py),
            e.is_instance_of::<PyKeyError>(py),
            e.is_instance_of::<PyIndexError>(py),
            e.is_instance_of::<PyValueError>(py),
        ];
        if !wrong_kind.contains(&true) || super::errors::is_package_error(py, &e) {
            return e;
        }
        let name = e.get_type(py).name().map_or_else(|_| "Exception".into(), |n| n.to_string());
        let out = arg_error(kind, format!("{what}: {name}: {}", e.value(py)));
        out.set_cause(py, Some(e));
        out
    })
}

/// The items of the argument `name`, a list (or tuple, or any iterable but a string, bytes or a
/// mapping) of `of`: anything else, or an iterable that fails, is an error of `kind` naming it.
pub(crate) fn items<'py>(obj: &Bound<'py, PyAny>, name: &str, kind: ErrorKind, of: &str) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let refused = || arg_error(kind, format!("{name} must be a list of {of}, got {}", type_name(obj)));
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() || obj.is_instance_of::<PyDict>() {
        return Err(refused());
    }
    obj.try_iter().and_then(|it| it.collect::<PyResult<Vec<_>>>()).map_err(|_| refused())
}

/// The argument `name` as an instance of the extension class `T` (an error of `kind` naming it
/// otherwise).
pub(crate) fn instance<'py, T: pyo3::PyClass>(obj: &Bound<'py, PyAny>, name: &str, kind: ErrorKind, of: &str) -> PyResult<Bound<'py, T>> {
    obj.cast::<T>().cloned().map_err(|_| arg_error(kind, format!("{name} must be a {of}, got {}", type_name(obj))))
}

/// `(numpy.integer, numpy.ndarray)` and `numpy.generic` (every numpy scalar), imported once;
/// `None` without numpy.
static NUMPY_TYPES: pyo3::sync::PyOnceLock<Option<(Py<PyTuple>, Py<PyAny>)>> = pyo3::sync::PyOnceLock::new();

fn numpy_types(py: Python<'_>) -> Option<&(Py<PyTuple>, Py<PyAny>)> {
    NUMPY_TYPES
        .get_or_init(py, || {
            let np = py.import("numpy").ok()?;
            let ints = PyTuple::new(py, [np.getattr("integer").ok()?, np.getattr("ndarray").ok()?]).ok()?;
            Some((ints.unbind(), np.getattr("generic").ok()?.unbind()))
        })
        .as_ref()
}

/// One host integer: a Python int or a numpy integer (a numpy scalar, or a 0-d array, of an integer
/// dtype; an array of one or more dimensions is not one), as an `i128`, or `None` when it does not
/// fit one (a Python int of more than 127 bits). A bool (Python's or numpy's), a float or a tensor
/// (reading a device tensor would synchronise) is refused, the message naming its type and, for a
/// scalar, its value. numpy is told by type: since numpy 2 its scalars have a `device` too
/// (`"cpu"`).
fn int_of(obj: &Bound<'_, PyAny>, name: &str, kind: ErrorKind) -> PyResult<Option<i128>> {
    let py = obj.py();
    let numpy = numpy_types(py);
    let numpy_int = || {
        numpy.is_some_and(|(t, _)| obj.is_instance(t.bind(py)).unwrap_or(false))
            && obj.getattr(intern!(py, "ndim")).is_ok_and(|n| n.eq(0).unwrap_or(false))
            && obj
                .getattr(intern!(py, "dtype"))
                .and_then(|d| d.getattr(intern!(py, "kind")))
                .is_ok_and(|k| k.eq("i").unwrap_or(false) || k.eq("u").unwrap_or(false))
    };
    let host_int = (obj.is_instance_of::<PyInt>() && !obj.is_instance_of::<PyBool>()) || numpy_int();
    if !host_int {
        let scalar = obj.is_instance_of::<PyBool>()
            || obj.is_instance_of::<PyFloat>()
            || numpy.is_some_and(|(_, g)| obj.is_instance(g.bind(py)).unwrap_or(false));
        let shown = match obj.repr().map(|r| r.to_string()) {
            Ok(r) if scalar && r.len() <= 64 => format!(" {r}"),
            _ => String::new(),
        };
        return Err(arg_error(kind, format!("{name} must be a host integer (a Python or numpy int), got {}{shown}", type_name(obj))));
    }
    Ok(obj.extract::<i128>().ok())
}

/// The host integer `obj` (the argument `name`) as a `T`; out of `T`'s range, an error naming its
/// value.
pub(super) fn int_in<T: TryFrom<i128>>(obj: &Bound<'_, PyAny>, name: &str, kind: ErrorKind, min: i128, max: u128) -> PyResult<T> {
    int_of(obj, name, kind)?.and_then(|v| T::try_from(v).ok()).ok_or_else(|| out_of_range(obj, name, kind, min, max))
}

macro_rules! int_arg {
    ($($t:ty),*) => {$(
        impl Arg for $t {
            fn arg(obj: &Bound<'_, PyAny>, name: &str, kind: ErrorKind) -> PyResult<Self> {
                int_in(obj, name, kind, <$t>::MIN as i128, <$t>::MAX as u128)
            }
        }
    )*};
}
int_arg!(i64, i32, u64, u32, usize);

impl Arg for bool {
    fn arg(obj: &Bound<'_, PyAny>, name: &str, kind: ErrorKind) -> PyResult<Self> {
        obj.cast::<PyBool>().map(|b| b.is_true()).map_err(|_| arg_error(kind, format!("{name} must be a bool, got {}", type_name(obj))))
    }
}

impl Arg for String {
    fn arg(obj: &Bound<'_, PyAny>, name: &str, kind: ErrorKind) -> PyResult<Self> {
        obj.extract::<String>().map_err(|_| arg_error(kind, format!("{name} must be a string, got {}", type_name(obj))))
    }
}

/// Why the storage of the torch tensor `obj` does not hold the bytes at addresses `[lo, hi)` that
/// are about to be read or written, ending "nothing was {did}"; `None` when it does (or `obj` has
/// no storage to ask). A storage freed (`untyped_storage().resize_(0)`: a null address) or shrunk
/// after the tensor was made keeps the tensor's shape: what is sized by that shape would reach past
/// the allocation. Three torch calls: the storage, its address, its size. The one wording of this
/// refusal, whoever checks.
pub(crate) fn storage_shortfall(obj: &Bound<'_, PyAny>, lo: i128, hi: i128, did: &str) -> PyResult<Option<String>> {
    let py = obj.py();
    let Ok(storage) = obj.call_method0(intern!(py, "untyped_storage")) else {
        return Ok(None); // not a torch tensor: no storage to ask
    };
    let start = address_int(&storage.call_method0(intern!(py, "data_ptr"))?)?;
    let held = address_int(&storage.call_method0(intern!(py, "nbytes"))?)?;
    if lo >= start as i128 && hi <= start as i128 + held as i128 {
        return Ok(None);
    }
    let n = hi - lo;
    Ok(Some(if start == 0 {
        format!("its storage was freed (untyped_storage().resize_(0)): the {n} bytes it spans are gone; nothing was {did}")
    } else {
        format!(
            "its storage holds {held} bytes at {start:#x}, not the {n} bytes at {lo:#x} (shrunk since, or the tensor re-pointed: \
             untyped_storage().resize_()); nothing was {did}"
        )
    }))
}

/// A tensor or array the core describes without reading it (`tensor.rs`).
pub(crate) struct Tensor(pub TensorDesc);

impl Arg for Tensor {
    fn arg(obj: &Bound<'_, PyAny>, name: &str, kind: ErrorKind) -> PyResult<Self> {
        match describe(obj)? {
            Described::Tensor(t) => Ok(Tensor(t)),
            Described::Dense(reason) => Err(arg_error(kind, format!("{name}: {reason}"))),
            Described::Unknown => {
                Err(arg_error(kind, format!("{name}: expected a CUDA tensor, a CuPy array or a host array, got {}", type_name(obj))))
            }
        }
    }
}

impl Arg for Vec<Tensor> {
    fn arg(obj: &Bound<'_, PyAny>, name: &str, kind: ErrorKind) -> PyResult<Self> {
        tensor_list(obj, name, kind, |i| format!("layer {i}: {name}"))
    }
}

/// A list of tensors that is not one per layer, each named by its index (`conv[1]`).
pub(crate) struct TensorList(pub Vec<TensorDesc>);

impl Arg for TensorList {
    fn arg(obj: &Bound<'_, PyAny>, name: &str, kind: ErrorKind) -> PyResult<Self> {
        let list = tensor_list(obj, name, kind, |i| format!("{name}[{i}]"))?;
        Ok(TensorList(list.into_iter().map(|t| t.0).collect()))
    }
}

/// The tensors of the list `obj` (the argument `name`), the `i`-th named `label(i)` in errors.
fn tensor_list(obj: &Bound<'_, PyAny>, name: &str, kind: ErrorKind, label: impl Fn(usize) -> String) -> PyResult<Vec<Tensor>> {
    let items = obj.try_iter().map_err(|_| arg_error(kind, format!("{name} must be a list of tensors, got {}", type_name(obj))))?;
    items.enumerate().map(|(i, t)| Tensor::arg(&t?, &label(i), kind)).collect()
}

/// A device given by name (`"cuda:0"`) or as the device of a tensor or array.
pub(crate) struct DeviceOf(pub crate::tensor::Device);

impl Arg for DeviceOf {
    fn arg(obj: &Bound<'_, PyAny>, name: &str, kind: ErrorKind) -> PyResult<Self> {
        let spelled = match obj.extract::<String>() {
            Ok(s) => s,
            Err(_) => Tensor::arg(obj, name, kind)?.0.device,
        };
        crate::tensor::Device::parse(&spelled).map(DeviceOf).map_err(|e| arg_error(kind, format!("{name}: {}", e.message)))
    }
}

/// A dtype given by name or as a torch / numpy dtype object (its `str`).
pub(crate) struct DtypeName(pub String);

impl Arg for DtypeName {
    fn arg(obj: &Bound<'_, PyAny>, name: &str, kind: ErrorKind) -> PyResult<Self> {
        match obj.extract::<String>() {
            Ok(s) => Ok(DtypeName(s)),
            Err(_)
                if obj.hasattr(intern!(obj.py(), "itemsize")).unwrap_or(false)
                    || obj.get_type().name().is_ok_and(|n| n.to_string().contains("dtype")) =>
            {
                Ok(DtypeName(obj.str()?.to_string()))
            }
            Err(_) => Err(arg_error(kind, format!("{name} must be a dtype name or a torch / numpy dtype, got {}", type_name(obj)))),
        }
    }
}

/// Request names for messages: `req_ids[i]` when given, else the request row. Looked up only when a
/// message is built.
pub(crate) struct RequestNames(pub Option<Py<PyAny>>);

impl Arg for RequestNames {
    fn arg(obj: &Bound<'_, PyAny>, _: &str, _: ErrorKind) -> PyResult<Self> {
        Ok(RequestNames(if obj.is_none() { None } else { Some(obj.clone().unbind()) }))
    }
    fn absent(_: &str, _: ErrorKind) -> PyResult<Self> {
        Ok(RequestNames(None))
    }
}

impl RequestNames {
    /// `request <id> (row i)`, or `request i` (needs the GIL: called while building a message).
    pub fn name(&self, i: usize) -> String {
        let found = self
            .0
            .as_ref()
            .and_then(|ids| Python::attach(|py| ids.bind(py).get_item(i).ok().and_then(|x| x.str().ok()).map(|s| s.to_string_lossy().into_owned())));
        match found {
            Some(s) => format!("request {s} (row {i})"),
            None => crate::vllm::row_name(i),
        }
    }
}

/// Declares the arguments of a call as a struct: each field converted by its [`Arg`] impl with
/// the field's name (an optional field, `Option<T>`, may be absent; `= default` gives a default),
/// every error of the call's `kind`. The `impl` form converts into an existing struct of the core
/// (its fields listed the same way). The binding declares the same names as its (typed, keyword)
/// parameters, each an `Option<&Bound<PyAny>>` (`None`: not given), and converts them with
/// [`args!`], which checks at compile time that it passes every field, by name, in order.
macro_rules! kwargs {
    ($(#[$meta:meta])* pub(crate) struct $name:ident ($kind:ident) { $($(#[$fm:meta])* $field:ident : $ty:ty $(= $default:expr)?),* $(,)? }) => {
        $(#[$meta])*
        pub(crate) struct $name { $($(#[$fm])* pub $field: $ty),* }

        kwargs!(impl $name as $kind { $($field : $ty $(= $default)?),* });
    };
    (impl $name:path as $kind:ident { $($field:ident : $ty:ty $(= $default:expr)?),* $(,)? }) => {
        impl $crate::python::conversion::CallArgs for $name {
            const FIELDS: &'static [&'static str] = &[$(stringify!($field)),*];
        }

        impl $name {
            /// Converts the call's arguments, given in field order (through [`args!`]).
            #[allow(clippy::too_many_arguments)]
            pub(crate) fn convert($($field: Option<&pyo3::Bound<'_, pyo3::PyAny>>),*) -> pyo3::PyResult<Self> {
                use $crate::python::conversion::Arg;
                let kind = $crate::error::ErrorKind::$kind;
                Ok(Self {
                    $($field: match $field {
                        Some(v) => <$ty as Arg>::arg(v, stringify!($field), kind)?,
                        None => kwargs!(@absent $ty, $field, kind $(, $default)?),
                    }),*
                })
            }
        }
    };
    (@absent $ty:ty, $field:ident, $kind:ident, $default:expr) => { $default };
    (@absent $ty:ty, $field:ident, $kind:ident) => { <$ty as $crate::python::conversion::Arg>::absent(stringify!($field), $kind)? };
}
pub(crate) use kwargs;

/// Converts a call's parameters into the struct `$name` declared by [`kwargs!`]: the parameters
/// of the same names as its fields, listed in field order (a compile error otherwise).
macro_rules! args {
    ($name:path { $($field:ident),* $(,)? }) => {{
        const _: () = assert!(
            $crate::python::conversion::same_names(<$name as $crate::python::conversion::CallArgs>::FIELDS, &[$(stringify!($field)),*]),
            "args!: list the struct's fields, in order"
        );
        <$name>::convert($($field),*)
    }};
}
pub(crate) use args;

/// A struct converted from a call's arguments (see [`kwargs!`]).
pub(crate) trait CallArgs {
    /// The arguments the call takes, in field order.
    const FIELDS: &'static [&'static str];
}

/// Whether two lists of names are equal (in a constant: [`args!`]'s check).
pub(crate) const fn same_names(a: &[&str], b: &[&str]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        let (x, y) = (a[i].as_bytes(), b[i].as_bytes());
        if x.len() != y.len() {
            return false;
        }
        let mut j = 0;
        while j < x.len() {
            if x[j] != y[j] {
                return false;
            }
            j += 1;
        }
        i += 1;
    }
    true
}
