//! The Python bindings: a thin layer that converts arguments, calls the core, and raises core
//! errors as the package's exception classes (created here, in `errors`).

use crate::error::Error;
use pyo3::prelude::*;

mod buffer;
mod commit;
mod commit_launch;
mod describe;
mod errors;
mod group_plan;
mod guard;
mod kernels;
mod layout;
mod plan;
mod transfer;

pub(crate) use errors::to_py;

/// Extension trait: `core_result.py_err(py)?`.
pub(crate) trait IntoPyResult<T> {
    fn py_err(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for crate::error::Result<T> {
    fn py_err(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e: Error| to_py(py, e))
    }
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    buffer::register(m)?;
    layout::register(m)?;
    plan::register(m)?;
    commit::register(m)?;
    describe::register(m)?;
    kernels::register(m)?;
    commit_launch::register(m)?;
    guard::register(m)?;
    group_plan::register(m)?;
    transfer::register(m)?;
    Ok(())
}
