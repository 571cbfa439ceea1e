//! The package's exception classes, created by the extension itself (safetensors-style): the core's
//! error kinds map onto them with no lookup at raise time. `recoverssm_rs.errors` re-exports them.
//!
//! `RecoverSSMError(Exception)` is the base; `LayoutError`, `BindingError` and `PlanError` are also
//! `ValueError`s (the caller's input is wrong), `BackendUnavailableError` is also a `RuntimeError`.
//! PyO3's `create_exception!` takes one base, so the classes are made with `type(name, bases, ns)`.

use crate::error::{Error, ErrorKind};
use pyo3::exceptions::{PyException, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

/// The classes, in [`NAMES`] order.
pub(crate) struct Classes {
    pub types: Vec<Py<PyType>>,
}

const MODULE: &str = "recoverssm_rs.errors";

/// `(name, base names, docstring)`; a base is an earlier class or a builtin.
const NAMES: [(&str, &[&str], &str); 5] = [
    ("RecoverSSMError", &["Exception"], "Base class of every error raised by recoverssm_rs."),
    (
        "LayoutError",
        &["RecoverSSMError", "ValueError"],
        "A state layout (or an engine's copy-function registration) breaks the layout contract.\n\n\
         The message names the backend, the state (index and name), what is wrong and how to fix it.",
    ),
    (
        "BindingError",
        &["RecoverSSMError", "ValueError"],
        "State tensors do not match the layout they are bound to (dtype, shape, strides, device), or\n\
         no longer own the memory they had when they were bound.",
    ),
    (
        "PlanError",
        &["RecoverSSMError", "ValueError"],
        "A copy or commit step is invalid: bad block ids, columns, accepted counts, or a hazard.\n\n\
         Raised before anything moves: a rejected step leaves every state unchanged.",
    ),
    (
        "BackendUnavailableError",
        &["RecoverSSMError", "RuntimeError"],
        "The tensors need an executor this machine lacks (for example CUDA tensors without CuPy).",
    ),
];

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

fn make(py: Python<'_>) -> PyResult<Classes> {
    let builtin = |name: &str| -> PyResult<Bound<'_, PyType>> {
        Ok(match name {
            "Exception" => py.get_type::<PyException>(),
            "ValueError" => py.get_type::<PyValueError>(),
            "RuntimeError" => py.get_type::<PyRuntimeError>(),
            other => return Err(PyRuntimeError::new_err(format!("unknown base {other}"))),
        })
    };
    let type_ = py.get_type::<PyType>();
    let mut made: Vec<(&str, Bound<'_, PyType>)> = Vec::new();
    for (name, bases, doc) in NAMES {
        let mut bs = Vec::new();
        for b in bases {
            match made.iter().find(|(n, _)| n == b) {
                Some((_, t)) => bs.push(t.clone()),
                None => bs.push(builtin(b)?),
            }
        }
        let ns = PyDict::new(py);
        ns.set_item("__module__", MODULE)?;
        ns.set_item("__doc__", doc)?;
        let cls = type_.call1((name, PyTuple::new(py, bs)?, ns))?.cast_into::<PyType>()?;
        made.push((name, cls));
    }
    Ok(Classes { types: made.into_iter().map(|(_, t)| t.unbind()).collect() })
}

fn classes(py: Python<'_>) -> PyResult<&Classes> {
    CLASSES.get_or_try_init(py, || make(py))
}

/// A core error raised as the package exception of its kind.
impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        Python::attach(|py| to_py(py, e))
    }
}

/// Converts a core error into the package exception of its kind.
fn to_py(py: Python<'_>, e: Error) -> PyErr {
    let index = match e.kind {
        ErrorKind::Layout => 1,
        ErrorKind::Binding => 2,
        ErrorKind::Plan => 3,
    };
    match classes(py) {
        Ok(c) => PyErr::from_type(c.types[index].bind(py).clone(), e.message),
        Err(err) => err,
    }
}

/// Whether `e` is one of the package's exceptions (a `RecoverSSMError`).
pub(crate) fn is_package_error(py: Python<'_>, e: &PyErr) -> bool {
    classes(py).is_ok_and(|c| e.is_instance(py, c.types[0].bind(py)))
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let c = classes(m.py())?;
    for ((name, _, _), t) in NAMES.iter().zip(&c.types) {
        m.add(*name, t.bind(m.py()))?;
    }
    Ok(())
}
