//! Bindings for a transport endpoint's arguments (the NIXL endpoint of the Python package):
//! converted and checked by the core (`transfer::endpoint`) before an agent is created or a pull
//! posts anything; each error is the package's, naming the argument.

use super::conversion::{arg_error, instance, items, type_name, Arg};
use super::transfer::TransferPlan;
use crate::error::ErrorKind;
use crate::transfer::endpoint;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyString, PyTuple};

/// A list of strings (or one comma-separated string when `split`), the argument `name`.
fn strings(obj: &Bound<'_, PyAny>, name: &str, split: bool) -> PyResult<Vec<String>> {
    if obj.is_instance_of::<PyString>() {
        let s: String = obj.extract()?;
        return Ok(if split { s.split(',').map(str::to_string).collect() } else { vec![s.to_string()] });
    }
    items(obj, name, ErrorKind::Binding, "strings")?
        .iter()
        .enumerate()
        .map(|(i, x)| String::arg(x, &format!("{name}[{i}]"), ErrorKind::Binding))
        .collect()
}

/// An endpoint's arguments, checked: `name` (a string: the agent's name, as a handshake checks
/// it), `backends` (a list of backend names), `progress_thread` (a bool) and `interfaces` (a
/// comma-separated string or a list of interface names or addresses). Returns them converted,
/// the interfaces without blank items (BindingError naming the argument otherwise).
#[pyfunction]
#[pyo3(signature = (name: "str", backends: "Sequence[str]", progress_thread: "bool", interfaces: "str | Sequence[str]") -> "tuple[str, list[str], bool, list[str]]")]
pub(crate) fn endpoint_args(
    name: &Bound<'_, PyAny>,
    backends: &Bound<'_, PyAny>,
    progress_thread: &Bound<'_, PyAny>,
    interfaces: &Bound<'_, PyAny>,
) -> PyResult<(String, Vec<String>, bool, Vec<String>)> {
    let name = String::arg(name, "name", ErrorKind::Binding)?;
    let backends = strings(backends, "backends", false)?;
    let progress_thread = bool::arg(progress_thread, "progress_thread", ErrorKind::Binding)?;
    let interfaces = strings(interfaces, "interfaces", true)?;
    let interfaces = endpoint::check_endpoint(&name, &backends, &interfaces)?;
    Ok((name, backends, progress_thread, interfaces))
}

/// Whether `obj` is a real number: a Python int or float, or a numpy integer or floating scalar
/// (a bool, numpy's included, is not).
fn real_number(obj: &Bound<'_, PyAny>) -> bool {
    if obj.is_instance_of::<PyBool>() {
        return false;
    }
    if obj.is_instance_of::<PyFloat>() || obj.is_instance_of::<PyInt>() {
        return true;
    }
    let py = obj.py();
    let numpy = NUMPY_REALS.get_or_init(py, || {
        let np = py.import("numpy").ok()?;
        PyTuple::new(py, [np.getattr("integer").ok()?, np.getattr("floating").ok()?]).ok().map(Bound::unbind)
    });
    numpy.as_ref().is_some_and(|t| obj.is_instance(t.bind(py)).unwrap_or(false))
}

/// `(numpy.integer, numpy.floating)`, imported once; `None` without numpy.
static NUMPY_REALS: pyo3::sync::PyOnceLock<Option<Py<PyTuple>>> = pyo3::sync::PyOnceLock::new();

/// A pull's arguments, checked: `timeout` (seconds: a Python or numpy int or float, finite, > 0,
/// at most a week),
/// `per_request` and `restore_failed` (bools). Returns them converted (PlanError naming the
/// argument otherwise).
#[pyfunction]
#[pyo3(signature = (timeout: "float", per_request: "bool", restore_failed: "bool") -> "tuple[float, bool, bool]")]
pub(crate) fn pull_args(
    timeout: &Bound<'_, PyAny>,
    per_request: &Bound<'_, PyAny>,
    restore_failed: &Bound<'_, PyAny>,
) -> PyResult<(f64, bool, bool)> {
    let seconds = if real_number(timeout) { timeout.extract::<f64>().ok() } else { None };
    let seconds = seconds.ok_or_else(|| arg_error(ErrorKind::Plan, format!("timeout must be a number of seconds, got {}", type_name(timeout))))?;
    endpoint::check_timeout(seconds)?;
    let per_request = bool::arg(per_request, "per_request", ErrorKind::Plan)?;
    let restore_failed = bool::arg(restore_failed, "restore_failed", ErrorKind::Plan)?;
    Ok((seconds, per_request, restore_failed))
}

/// `plan` (the argument `what`) as a TransferPlan (PlanError naming it otherwise).
#[pyfunction]
#[pyo3(signature = (plan: "object", what: "str" = "plan") -> "TransferPlan")]
pub(crate) fn transfer_plan_arg<'py>(plan: &Bound<'py, PyAny>, what: &str) -> PyResult<Bound<'py, TransferPlan>> {
    instance::<TransferPlan>(plan, what, ErrorKind::Plan, "TransferPlan")
}
