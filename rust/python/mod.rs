//! The Python bindings: a thin layer that converts arguments, calls the core, and maps core errors
//! onto the package's exception classes (defined in `recoverssm_rs/errors.py`).

use crate::error::{Error, ErrorKind};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyType;

mod commit;
mod launch;
mod layout;
mod plan;
mod transfer;

/// Converts a core error into the package exception of its kind.
pub(crate) fn to_py(py: Python<'_>, e: Error) -> PyErr {
    let class = match e.kind {
        ErrorKind::Layout => "LayoutError",
        ErrorKind::Binding => "BindingError",
        ErrorKind::Plan => "PlanError",
    };
    let found = py
        .import("recoverssm_rs.errors")
        .and_then(|m| m.getattr(class))
        .and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from));
    match found {
        Ok(ty) => PyErr::from_type(ty, e.message),
        Err(_) => PyValueError::new_err(e.message),
    }
}

/// Extension trait: `core_result.py_err(py)?`.
pub(crate) trait IntoPyResult<T> {
    fn py_err(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for crate::error::Result<T> {
    fn py_err(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_py(py, e))
    }
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    layout::register(m)?;
    plan::register(m)?;
    commit::register(m)?;
    launch::register(m)?;
    transfer::register(m)?;
    Ok(())
}
