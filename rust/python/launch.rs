//! Bindings for the launch-argument checks (`crate::launch`): the Python launch layer describes
//! its device arguments as `(data_ptr, dtype, shape, byte_strides, device)` tuples and its scalars
//! as Python ints; the rules and messages are the core's.

use super::{to_py, IntoPyResult};
use crate::binding::Device;
use crate::error::{Error, ErrorKind};
use crate::launch::{self, CommitParams, DeviceArg, FusedParams, IntType, StepArgs};
use pyo3::prelude::*;

/// `(data_ptr, dtype, shape, byte_strides, device)` of one device argument.
type ArgTuple = (u64, String, Vec<i64>, Vec<i64>, String);

fn arg(t: ArgTuple) -> DeviceArg {
    let (data_ptr, dtype, shape, strides, device) = t;
    DeviceArg { data_ptr, dtype, shape, strides, device }
}

/// A Python int as i64, or a plan error naming the parameter.
fn int(py: Python<'_>, obj: &Bound<'_, PyAny>, name: &str) -> PyResult<i64> {
    obj.extract::<i64>()
        .map_err(|_| to_py(py, Error::plan(format!("{name} = {obj} is not an integer in the 64-bit range"))))
}

fn device(py: Python<'_>, s: &str) -> PyResult<Device> {
    Device::parse(s).map_err(|e| Error::plan(e.message)).py_err(py)
}

/// Checks that a described argument lives in CUDA memory.
#[pyfunction]
fn check_device_address(py: Python<'_>, a: ArgTuple, what: &str) -> PyResult<()> {
    launch::require_cuda(&arg(a), what, ErrorKind::Binding).py_err(py)
}

/// `(ptr, len)` of a 1-D int32 device vector of at least `min_len` elements (contiguous).
#[pyfunction]
fn device_vector(py: Python<'_>, a: ArgTuple, what: &str, min_len: u64) -> PyResult<(u64, u64)> {
    let v = launch::int_vector(&arg(a), what, min_len, &[IntType::I32], ErrorKind::Binding).py_err(py)?;
    Ok((v.ptr, v.len))
}

/// `(ptr, rows, cols, row_stride_elements)` of a 2-D int32 device block table.
#[pyfunction]
fn device_block_table(py: Python<'_>, a: ArgTuple) -> PyResult<(u64, u64, u64, i64)> {
    let t = launch::block_table(&arg(a), &[IntType::I32], ErrorKind::Binding).py_err(py)?;
    Ok((t.ptr, t.rows, t.cols, t.row_stride))
}

/// The number of requests of a fused-kernel step whose device inputs pass the core's checks.
#[pyfunction]
#[pyo3(signature = (device_name, block_table, vectors, err = None, block_size = None))]
fn check_step_args(
    py: Python<'_>,
    device_name: &str,
    block_table: ArgTuple,
    vectors: Vec<(String, ArgTuple)>,
    err: Option<ArgTuple>,
    block_size: Option<&Bound<'_, PyAny>>,
) -> PyResult<u64> {
    let block_size = block_size.map(|b| int(py, b, "block_size")).transpose()?;
    let dev = device(py, device_name)?;
    let bt = arg(block_table);
    let vs: Vec<(String, DeviceArg)> = vectors.into_iter().map(|(n, a)| (n, arg(a))).collect();
    let err = err.map(arg);
    let step = StepArgs { block_table: &bt, vectors: vs.iter().map(|(n, a)| (n.as_str(), a)).collect(), err: err.as_ref(), block_size };
    launch::check_step_args(&dev, &step).py_err(py)
}

/// Checks the accepted counts of a device commit.
#[pyfunction]
fn check_commit_counts(py: Python<'_>, device_name: &str, a: ArgTuple, min_len: u64) -> PyResult<()> {
    let dev = device(py, device_name)?;
    launch::check_commit_counts(&dev, &arg(a), min_len).py_err(py)
}

/// The number of commit rows in a device row buffer that passes the core's checks.
#[pyfunction]
#[pyo3(signature = (device_name, a, num_rows = None))]
fn check_commit_rows(py: Python<'_>, device_name: &str, a: ArgTuple, num_rows: Option<u64>) -> PyResult<u64> {
    let dev = device(py, device_name)?;
    launch::check_commit_rows(&dev, &arg(a), num_rows).py_err(py)
}

/// Checks the scalar parameters of a fused state-copy launch.
#[pyfunction]
#[pyo3(signature = (num_meta, num_requests, max_accepted, num_blocks, chunks, block_size, bt_rows))]
#[allow(clippy::too_many_arguments)]
fn check_fused_launch(
    py: Python<'_>,
    num_meta: &Bound<'_, PyAny>,
    num_requests: &Bound<'_, PyAny>,
    max_accepted: &Bound<'_, PyAny>,
    num_blocks: &Bound<'_, PyAny>,
    chunks: &Bound<'_, PyAny>,
    block_size: Option<&Bound<'_, PyAny>>,
    bt_rows: u64,
) -> PyResult<()> {
    let p = FusedParams {
        num_meta: int(py, num_meta, "num_meta")?,
        num_requests: int(py, num_requests, "num_requests")?,
        max_accepted: int(py, max_accepted, "max_accepted")?,
        num_blocks: int(py, num_blocks, "num_blocks")?,
        chunks: int(py, chunks, "chunks")?,
        block_size: block_size.map(|b| int(py, b, "block_size")).transpose()?,
        bt_rows,
    };
    launch::check_fused(&p).py_err(py)
}

/// Checks a wave's tile range of `rs_copy_tiles`.
#[pyfunction]
fn check_tile_range(py: Python<'_>, first_tile: &Bound<'_, PyAny>, num_tiles: &Bound<'_, PyAny>) -> PyResult<()> {
    launch::check_tile_range(int(py, first_tile, "first_tile")?, int(py, num_tiles, "num_tiles")?).py_err(py)
}

/// Checks the scalar parameters of a commit launch.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn check_commit_launch(
    py: Python<'_>,
    num_layers: &Bound<'_, PyAny>,
    num_rows: &Bound<'_, PyAny>,
    num_blocks: &Bound<'_, PyAny>,
    max_requests: &Bound<'_, PyAny>,
    rec_ctas: &Bound<'_, PyAny>,
    conv_ctas: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let p = CommitParams {
        num_layers: int(py, num_layers, "num_layers")?,
        num_rows: int(py, num_rows, "num_rows")?,
        num_blocks: int(py, num_blocks, "num_blocks")?,
        max_requests: int(py, max_requests, "max_requests")?,
        rec_ctas: int(py, rec_ctas, "rec_ctas")?,
        conv_ctas: int(py, conv_ctas, "conv_ctas")?,
    };
    launch::check_commit_launch(&p).py_err(py)
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(check_device_address, m)?)?;
    m.add_function(wrap_pyfunction!(device_vector, m)?)?;
    m.add_function(wrap_pyfunction!(device_block_table, m)?)?;
    m.add_function(wrap_pyfunction!(check_step_args, m)?)?;
    m.add_function(wrap_pyfunction!(check_commit_counts, m)?)?;
    m.add_function(wrap_pyfunction!(check_commit_rows, m)?)?;
    m.add_function(wrap_pyfunction!(check_fused_launch, m)?)?;
    m.add_function(wrap_pyfunction!(check_tile_range, m)?)?;
    m.add_function(wrap_pyfunction!(check_commit_launch, m)?)?;
    Ok(())
}
