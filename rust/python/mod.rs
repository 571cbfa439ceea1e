//! The Python bindings: a thin layer over the core. Arguments are converted once
//! ([`conversion`]: integers, integer arrays, block tables, tensors, keyword-argument structs),
//! core errors become the package's exception classes (created here, in [`errors`]) through
//! `From<Error> for PyErr`, and heavy work runs with the GIL released.
//!
//! One class per core concept: `Planner` / `CopyPlan` ([`planner`], [`plan`]), the vLLM step
//! ([`vllm`]), the kernels' launches ([`launch`]), RecoverSSM commits ([`commit`]), layouts
//! ([`layout`]) and transfers ([`transfer`]).

use pyo3::prelude::*;

mod buffer;
mod commit;
pub(crate) mod conversion;
mod errors;
mod guard;
mod launch;
mod layout;
mod plan;
mod planner;
mod tensor;
mod transfer;
mod vllm;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    buffer::register(m)?;
    layout::register(m)?;
    guard::register(m)?;
    planner::register(m)?;
    plan::register(m)?;
    vllm::register(m)?;
    launch::register(m)?;
    commit::register(m)?;
    transfer::register(m)?;
    Ok(())
}
