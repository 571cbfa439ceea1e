//! Bindings for the RecoverSSM commit kernel's launches (`crate::kernels::CommitLaunch`): the launch
//! builder of one state cache, its grid, and the check of a device commit's accepted counts.

use super::kernels::{arg, device, int, launched, opt_arg, KernelLaunch};
use super::{to_py, IntoPyResult};
use crate::binding::Device;
use crate::commit::CommitMeta;
use crate::error::Error;
use crate::kernels::{self, args, constants};
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;

/// The commit kernel of one state cache (constants and grid checked once).
#[pyclass(module = "recoverssm_rs._core", name = "CommitLaunch", frozen)]
pub struct PyCommitLaunch {
    inner: kernels::CommitLaunch,
}

#[pymethods]
impl PyCommitLaunch {
    /// `metas`: the device address of the table whose bytes `table` holds (`CommitMeta` records).
    #[new]
    #[pyo3(signature = (device_name, metas, table, num_blocks, max_requests, err = 0, threads = constants::THREADS))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        device_name: &str,
        metas: u64,
        table: &Bound<'_, PyAny>,
        num_blocks: &Bound<'_, PyAny>,
        max_requests: &Bound<'_, PyAny>,
        err: u64,
        threads: u32,
    ) -> PyResult<Self> {
        let t = commit_table(py, table)?;
        let inner = kernels::CommitLaunch::new(
            device(py, device_name)?,
            metas,
            &t,
            int(py, num_blocks, "num_blocks")?,
            int(py, max_requests, "max_requests")?,
            err,
            threads,
        )
        .py_err(py)?;
        Ok(PyCommitLaunch { inner })
    }

    /// The launch of one commit over the first `num_rows` rows of `rows` (default: all).
    #[pyo3(signature = (rows, num_rows = None, num_accepted = None, err = None))]
    fn launch(
        &self,
        py: Python<'_>,
        rows: &Bound<'_, PyAny>,
        num_rows: Option<u64>,
        num_accepted: Option<&Bound<'_, PyAny>>,
        err: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<KernelLaunch>> {
        let rows = arg(py, rows, "rows")?;
        let (acc, err) = (opt_arg(py, num_accepted, "num_accepted")?, opt_arg(py, err, "err")?);
        launched(self.inner.launch(&rows, num_rows, acc.as_ref(), err.as_ref()), py)
    }

    /// `(rec_ctas, conv_ctas)`: CTAs per (layer, row).
    #[getter]
    fn ctas(&self) -> (u32, u32) {
        (self.inner.rec_ctas, self.inner.conv_ctas)
    }
    #[getter]
    fn num_layers(&self) -> u32 {
        self.inner.num_layers
    }
    /// The CUDA device index of the cache.
    #[getter]
    fn device_index(&self) -> u32 {
        match self.inner.device {
            Device::Cuda(i) => i,
            Device::Cpu => unreachable!("CommitLaunch::new refuses host states"),
        }
    }
    fn __repr__(&self) -> String {
        let c = &self.inner;
        format!(
            "CommitLaunch({}, layers={}, blocks={}, max_requests={}, ctas=({}, {}))",
            c.device, c.num_layers, c.num_blocks, c.max_requests, c.rec_ctas, c.conv_ctas
        )
    }
}

/// `CommitMeta` records from a byte buffer (`uint8` numpy view, bytes, or a core buffer).
fn commit_table(py: Python<'_>, table: &Bound<'_, PyAny>) -> PyResult<Vec<CommitMeta>> {
    let bytes: Vec<u8> = PyBuffer::<u8>::get(table)
        .and_then(|b| b.to_vec(py))
        .map_err(|_| to_py(py, Error::binding("table: expected the commit table's bytes (a uint8 buffer of CommitMeta records)")))?;
    CommitMeta::from_bytes(&bytes).py_err(py)
}

/// `(rec_ctas, conv_ctas)`: CTAs per (layer, row) of the commit kernel for a table's bytes, with
/// `threads` threads per CTA.
#[pyfunction]
#[pyo3(signature = (table, threads = constants::THREADS))]
fn commit_grid(py: Python<'_>, table: &Bound<'_, PyAny>, threads: u32) -> PyResult<(u32, u32)> {
    Ok(kernels::commit_grid(&commit_table(py, table)?, threads))
}

/// Checks the accepted counts of a device commit: an integer vector on the cache's device with at
/// least `min_len` counts.
#[pyfunction]
fn check_commit_counts(py: Python<'_>, device_name: &str, a: &Bound<'_, PyAny>, min_len: u64) -> PyResult<()> {
    let dev = device(py, device_name)?;
    args::check_commit_counts(&dev, &arg(py, a, "num_accepted")?, min_len).py_err(py)
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCommitLaunch>()?;
    m.add_function(wrap_pyfunction!(commit_grid, m)?)?;
    m.add_function(wrap_pyfunction!(check_commit_counts, m)?)?;
    Ok(())
}
