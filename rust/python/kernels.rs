//! Bindings for the kernels' calling convention (`crate::kernels`): the ABI description the Python
//! package builds its record dtypes from, and the launch builders. A [`KernelLaunch`] carries the
//! grid, the block and the packed argument buffer; the launch layer hands its `extra_ptr` to
//! `cuLaunchKernel` and does nothing else.

use super::{to_py, IntoPyResult};
use crate::binding::Device;
use crate::error::Error;
use crate::kernels::{self, abi, args, constants, records, DeviceArg, Launch};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

/// The described device argument `obj` (a tensor, a CuPy array, or a description tuple), or a
/// plan error naming `what`.
pub(super) fn arg(py: Python<'_>, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<DeviceArg> {
    super::describe::describe(py, obj)?.ok_or_else(|| {
        let ty = obj.get_type().name().map(|n| n.to_string()).unwrap_or_default();
        to_py(py, Error::plan(format!("{what}: expected a CUDA tensor or a CuPy array, got a {ty}")))
    })
}

pub(super) fn opt_arg(py: Python<'_>, obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<DeviceArg>> {
    obj.filter(|o| !o.is_none()).map(|o| arg(py, o, what)).transpose()
}

/// A fused step's arguments, described: block table, `src_col`, `dst_col` or `running`,
/// `num_accepted`, the optional output of the accepted counts and error word, and the block size
/// of the device decision.
struct Step {
    bt: DeviceArg,
    s: DeviceArg,
    x: DeviceArg,
    a: DeviceArg,
    out: Option<DeviceArg>,
    err: Option<DeviceArg>,
    block_size: Option<i64>,
}

impl Step {
    #[allow(clippy::too_many_arguments)]
    fn describe(
        py: Python<'_>,
        block_table: &Bound<'_, PyAny>,
        src_col: &Bound<'_, PyAny>,
        second: &Bound<'_, PyAny>,
        num_accepted: &Bound<'_, PyAny>,
        err: Option<&Bound<'_, PyAny>>,
        block_size: Option<&Bound<'_, PyAny>>,
        num_accepted_out: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Step> {
        let block_size = block_size.map(|b| int(py, b, "block_size")).transpose()?;
        let second_name = if block_size.is_some() { "running" } else { "dst_col" };
        Ok(Step {
            bt: arg(py, block_table, "block_table")?,
            s: arg(py, src_col, "src_col")?,
            x: arg(py, second, second_name)?,
            a: arg(py, num_accepted, "num_accepted")?,
            out: opt_arg(py, num_accepted_out, "num_accepted_out")?,
            err: opt_arg(py, err, "err")?,
            block_size,
        })
    }

    fn inputs(&self) -> kernels::StepInputs<'_> {
        kernels::StepInputs {
            block_table: &self.bt,
            src_col: &self.s,
            second: &self.x,
            num_accepted: &self.a,
            num_accepted_out: self.out.as_ref(),
            err: self.err.as_ref(),
            block_size: self.block_size,
        }
    }
}

/// A Python int as i64, or a plan error naming the parameter.
pub(super) fn int(py: Python<'_>, obj: &Bound<'_, PyAny>, name: &str) -> PyResult<i64> {
    if obj.is_instance_of::<pyo3::types::PyBool>() {
        return Err(to_py(py, Error::plan(format!("{name} must be an integer, got a bool"))));
    }
    obj.extract::<i64>().map_err(|_| to_py(py, Error::plan(format!("{name} = {obj} is not an integer in the 64-bit range"))))
}

pub(super) fn device(py: Python<'_>, s: &str) -> PyResult<Device> {
    Device::parse(s).map_err(|e| Error::plan(e.message)).py_err(py)
}

/// `cuLaunchKernel`'s `extra` markers (cuda.h).
const CU_LAUNCH_PARAM_END: usize = 0x00;
const CU_LAUNCH_PARAM_BUFFER_POINTER: usize = 0x01;
const CU_LAUNCH_PARAM_BUFFER_SIZE: usize = 0x02;

/// One ready launch: kernel, grid, block and the packed arguments.
#[pyclass(module = "recoverssm_rs._core", frozen)]
pub struct KernelLaunch {
    launch: Launch,
    /// The size `extra` points to (boxed: its address must not move).
    size: Box<usize>,
    /// `{BUFFER_POINTER, args, BUFFER_SIZE, &size, END}` for `cuLaunchKernel(..., extra)`.
    extra: Box<[usize; 5]>,
}

impl KernelLaunch {
    fn new(launch: Launch) -> KernelLaunch {
        let size = Box::new(launch.args().len());
        let extra = Box::new([
            CU_LAUNCH_PARAM_BUFFER_POINTER,
            launch.args().as_ptr() as usize,
            CU_LAUNCH_PARAM_BUFFER_SIZE,
            &*size as *const usize as usize,
            CU_LAUNCH_PARAM_END,
        ]);
        KernelLaunch { launch, size, extra }
    }
}

#[pymethods]
impl KernelLaunch {
    /// The kernel's entry point name.
    #[getter]
    fn kernel(&self) -> &'static str {
        self.launch.kernel.name
    }
    #[getter]
    fn grid(&self) -> (u32, u32, u32) {
        let [x, y, z] = self.launch.grid;
        (x, y, z)
    }
    #[getter]
    fn block(&self) -> (u32, u32, u32) {
        let [x, y, z] = self.launch.block;
        (x, y, z)
    }
    /// The packed argument buffer (a copy).
    #[getter]
    fn args<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.launch.args())
    }
    /// Address of the packed arguments (valid while this object lives).
    #[getter]
    fn args_ptr(&self) -> usize {
        self.launch.args().as_ptr() as usize
    }
    /// Bytes of the packed arguments.
    #[getter]
    fn args_size(&self) -> usize {
        *self.size
    }
    /// Address of the `extra` array for `cuLaunchKernel` (valid while this object lives).
    #[getter]
    fn extra_ptr(&self) -> usize {
        self.extra.as_ptr() as usize
    }
    /// `(parameter name, value)` in declaration order, unpacked from the buffer.
    fn values(&self) -> Vec<(&'static str, i128)> {
        self.launch.values()
    }
    fn __repr__(&self) -> String {
        format!("KernelLaunch({}, grid={:?}, block={:?}, {} argument bytes)", self.launch.kernel.name, self.launch.grid, self.launch.block, self.size)
    }
}

pub(super) fn launched(l: crate::Result<Option<Launch>>, py: Python<'_>) -> PyResult<Option<KernelLaunch>> {
    Ok(l.py_err(py)?.map(KernelLaunch::new))
}

/// The fused state copy of one bound planner (constants checked once).
#[pyclass(module = "recoverssm_rs._core", name = "FusedCopy", frozen)]
pub struct PyFusedCopy {
    inner: kernels::FusedCopy,
}

#[pymethods]
impl PyFusedCopy {
    #[new]
    #[pyo3(signature = (device_name, metas, num_meta, max_accepted, num_blocks, has_temporal, chunks, err, groups = 1))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        device_name: &str,
        metas: u64,
        num_meta: &Bound<'_, PyAny>,
        max_accepted: &Bound<'_, PyAny>,
        num_blocks: &Bound<'_, PyAny>,
        has_temporal: bool,
        chunks: &Bound<'_, PyAny>,
        err: u64,
        groups: u32,
    ) -> PyResult<Self> {
        let inner = kernels::FusedCopy::new(
            device(py, device_name)?,
            metas,
            int(py, num_meta, "num_meta")?,
            int(py, max_accepted, "max_accepted")?,
            int(py, num_blocks, "num_blocks")?,
            has_temporal,
            int(py, chunks, "chunks")?,
            err,
        )
        .and_then(|f| f.with_groups(groups))
        .py_err(py)?;
        Ok(PyFusedCopy { inner })
    }

    /// The launch of one step (`second`: `dst_col`, or `running` with a `block_size`; `pre_copy`:
    /// equal columns are a no-op whatever the accepted count; `num_accepted_out`: where the kernel
    /// writes each request's accepted count after the step).
    #[pyo3(signature = (block_table, src_col, second, num_accepted, err = None, block_size = None, pre_copy = false, num_accepted_out = None))]
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        py: Python<'_>,
        block_table: &Bound<'_, PyAny>,
        src_col: &Bound<'_, PyAny>,
        second: &Bound<'_, PyAny>,
        num_accepted: &Bound<'_, PyAny>,
        err: Option<&Bound<'_, PyAny>>,
        block_size: Option<&Bound<'_, PyAny>>,
        pre_copy: bool,
        num_accepted_out: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<KernelLaunch>> {
        let step = Step::describe(py, block_table, src_col, second, num_accepted, err, block_size, num_accepted_out)?;
        launched(self.inner.launch(&step.inputs(), pre_copy), py)
    }

    /// One step from the caller's tensors: `(launch, requests, narrow)`. With `narrow` false the
    /// launch is ready (`None`: nothing to launch); with `narrow` true every input passed the checks
    /// but some must first be narrowed to int32 or made contiguous on the device (then call
    /// `launch` with the converted tensors).
    #[pyo3(signature = (block_table, src_col, second, num_accepted, err = None, block_size = None, pre_copy = false, num_accepted_out = None))]
    #[allow(clippy::too_many_arguments)]
    fn step(
        &self,
        py: Python<'_>,
        block_table: &Bound<'_, PyAny>,
        src_col: &Bound<'_, PyAny>,
        second: &Bound<'_, PyAny>,
        num_accepted: &Bound<'_, PyAny>,
        err: Option<&Bound<'_, PyAny>>,
        block_size: Option<&Bound<'_, PyAny>>,
        pre_copy: bool,
        num_accepted_out: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(Option<KernelLaunch>, u64, bool)> {
        let step = Step::describe(py, block_table, src_col, second, num_accepted, err, block_size, num_accepted_out)?;
        match self.inner.launch(&step.inputs(), pre_copy) {
            Ok(l) => {
                let n = step.s.shape.first().copied().unwrap_or(0).max(0) as u64;
                Ok((l.map(KernelLaunch::new), n, false))
            }
            Err(_) => {
                let n = self.inner.check(&step.inputs()).py_err(py)?;
                Ok((None, n, true))
            }
        }
    }

    /// The CUDA device index of the states.
    #[getter]
    fn device_index(&self) -> u32 {
        match self.inner.device {
            Device::Cuda(i) => i,
            Device::Cpu => unreachable!("FusedCopy::new refuses host states"),
        }
    }
    /// Checks a step whose inputs may be int32 or int64; returns the number of requests.
    #[pyo3(signature = (block_table, src_col, second, num_accepted, err = None, block_size = None, num_accepted_out = None))]
    #[allow(clippy::too_many_arguments)]
    fn check(
        &self,
        py: Python<'_>,
        block_table: &Bound<'_, PyAny>,
        src_col: &Bound<'_, PyAny>,
        second: &Bound<'_, PyAny>,
        num_accepted: &Bound<'_, PyAny>,
        err: Option<&Bound<'_, PyAny>>,
        block_size: Option<&Bound<'_, PyAny>>,
        num_accepted_out: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        let step = Step::describe(py, block_table, src_col, second, num_accepted, err, block_size, num_accepted_out)?;
        self.inner.check(&step.inputs()).py_err(py)
    }

    /// Recurrent groups the state metas span.
    #[getter]
    fn groups(&self) -> u32 {
        self.inner.groups
    }
    #[getter]
    fn chunks(&self) -> u32 {
        self.inner.chunks
    }
    #[getter]
    fn num_meta(&self) -> u32 {
        self.inner.num_meta
    }
    #[getter]
    fn has_temporal(&self) -> bool {
        self.inner.has_temporal
    }
    fn __repr__(&self) -> String {
        let f = &self.inner;
        format!("FusedCopy({}, states={}, max_accepted={}, blocks={}, chunks={})", f.device, f.num_meta, f.max_accepted, f.num_blocks, f.chunks)
    }
}

/// A launch of kernel `name` with raw argument `values` (one per parameter, range-checked against
/// its C type) and the given grid and block; for tools and tests that launch with arguments of
/// their own.
#[pyfunction]
fn pack_launch(py: Python<'_>, name: &str, grid: (u32, u32, u32), block: (u32, u32, u32), values: Vec<i128>) -> PyResult<KernelLaunch> {
    let k = abi::kernel(name).py_err(py)?;
    let l = abi::pack(k, [grid.0, grid.1, grid.2], [block.0, block.1, block.2], &values).py_err(py)?;
    Ok(KernelLaunch::new(l))
}

/// The launch of one wave of `rs_copy_tiles`, or `None` when it has no tile.
#[pyfunction]
#[pyo3(signature = (segments, tiles, first_tile, num_tiles, max_ctas = None))]
fn copy_tiles_launch(
    py: Python<'_>,
    segments: u64,
    tiles: u64,
    first_tile: &Bound<'_, PyAny>,
    num_tiles: &Bound<'_, PyAny>,
    max_ctas: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<KernelLaunch>> {
    let max_ctas = max_ctas.map(|m| int(py, m, "max_ctas")).transpose()?;
    launched(kernels::copy_tiles_launch(segments, tiles, int(py, first_tile, "first_tile")?, int(py, num_tiles, "num_tiles")?, max_ctas), py)
}

/// Checks a fused step's inputs (int32 or int64) for states on `device_name` before anything is
/// bound or uploaded; returns the number of requests.
#[pyfunction]
#[pyo3(signature = (device_name, block_table, src_col, second, num_accepted, err = None, block_size = None, groups = 1, num_accepted_out = None))]
#[allow(clippy::too_many_arguments)]
fn check_fused_step(
    py: Python<'_>,
    device_name: &str,
    block_table: &Bound<'_, PyAny>,
    src_col: &Bound<'_, PyAny>,
    second: &Bound<'_, PyAny>,
    num_accepted: &Bound<'_, PyAny>,
    err: Option<&Bound<'_, PyAny>>,
    block_size: Option<&Bound<'_, PyAny>>,
    groups: u32,
    num_accepted_out: Option<&Bound<'_, PyAny>>,
) -> PyResult<u64> {
    let step = Step::describe(py, block_table, src_col, second, num_accepted, err, block_size, num_accepted_out)?;
    let dev = device(py, device_name)?;
    kernels::check_step(&dev, &step.inputs(), groups, args::StepCheck::BeforeNarrowing).map(|c| c.requests).py_err(py)
}

/// CTAs per state copy of the fused kernel for states of at most `max_state_bytes` bytes.
#[pyfunction]
fn state_chunks(max_state_bytes: u64) -> u32 {
    kernels::state_chunks(max_state_bytes)
}

/// Checks the engine's device block tables of a multi-group step (`args::check_group_tables`).
#[pyfunction]
fn check_device_tables(py: Python<'_>, device_name: &str, tables: Vec<Bound<'_, PyAny>>, groups: u32, rows: u64) -> PyResult<()> {
    let dev = device(py, device_name)?;
    let described = tables.iter().enumerate().map(|(g, t)| arg(py, t, &format!("group {g}'s device block table"))).collect::<PyResult<Vec<_>>>()?;
    args::check_group_tables(&dev, &described, groups, rows).py_err(py)
}

/// The decoded error word (`int32[3]`) of a kernel launch.
#[pyclass(module = "recoverssm_rs._core", frozen, eq)]
#[derive(PartialEq, Eq)]
pub struct ErrorWord {
    /// The OR of the error bits of every rejected request (or row).
    #[pyo3(get)]
    bits: u32,
    /// The first rejected request, `None` when nothing was rejected.
    #[pyo3(get)]
    first_request: Option<i64>,
    /// The last rejected request.
    #[pyo3(get)]
    last_request: Option<i64>,
}

#[pymethods]
impl ErrorWord {
    /// Decodes a host copy of the word: `err[0]` the OR of the bits, `err[1]` the maximum of
    /// `num_requests - r`, `err[2]` the maximum of `r + 1` over the rejected requests `r`.
    #[new]
    fn new(py: Python<'_>, words: Vec<i64>, num_requests: i64) -> PyResult<Self> {
        let [bits, from_end, last, ..] = words[..] else {
            return Err(to_py(py, Error::plan(format!("an error word has 3 elements, got {}", words.len()))));
        };
        if bits == 0 {
            return Ok(ErrorWord { bits: 0, first_request: None, last_request: None });
        }
        Ok(ErrorWord { bits: bits as u32, first_request: Some(num_requests - from_end), last_request: Some(last - 1) })
    }
    /// True when no request was rejected.
    #[getter]
    fn ok(&self) -> bool {
        self.bits == 0
    }
    /// Names of the error kinds seen.
    #[getter]
    fn names(&self) -> Vec<&'static str> {
        constants::error_names(self.bits)
    }
    fn __repr__(&self) -> String {
        match self.first_request {
            None => "ErrorWord(ok)".into(),
            Some(f) => format!("ErrorWord({}, requests {f}..={})", self.names().join("|"), self.last_request.unwrap_or(f)),
        }
    }
}

/// The calling convention of every kernel, the record layouts and the shared constants:
/// `{"kernels": [{"name", "file", "params": [(name, c_type)]}], "kernel_files": [...],
/// "records": {name: {"size", "fields": [(name, offset, numpy_type, c_type)]}},
/// "constants": {name: value}, "error_bits": [(bit, name, meaning)]}`.
#[pyfunction]
fn kernel_abi(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let out = PyDict::new(py);
    let ks = PyList::empty(py);
    for k in abi::KERNELS {
        let d = PyDict::new(py);
        d.set_item("name", k.name)?;
        d.set_item("file", k.file)?;
        d.set_item("params", k.params.to_vec())?;
        ks.append(d)?;
    }
    out.set_item("kernels", ks)?;
    out.set_item("kernel_files", abi::KERNEL_FILES.to_vec())?;
    let recs = PyDict::new(py);
    for r in records::record_specs() {
        let d = PyDict::new(py);
        d.set_item("size", r.size)?;
        let fields: Vec<(&str, usize, &str, &str)> = r.fields.iter().map(|f| (f.name, f.offset, f.ty.numpy(), f.ty.c_name())).collect();
        d.set_item("fields", fields)?;
        recs.set_item(r.name, d)?;
    }
    out.set_item("records", recs)?;
    let consts = PyDict::new(py);
    for (name, v) in constants::CUDA_DEFINES.iter().chain(constants::HOST_CONSTANTS.iter()) {
        consts.set_item(*name, *v)?;
    }
    out.set_item("constants", consts)?;
    out.set_item("cuda_defines", constants::CUDA_DEFINES.iter().map(|(n, _)| *n).collect::<Vec<_>>())?;
    out.set_item("error_bits", constants::ERROR_BITS.to_vec())?;
    let pairs: Vec<(&str, &str)> = crate::commit::COMMIT_DTYPE_PAIRS.iter().map(|(s, k)| (s.name(), k.name())).collect();
    out.set_item("commit_dtype_pairs", pairs)?;
    Ok(out)
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<KernelLaunch>()?;
    m.add_class::<PyFusedCopy>()?;
    m.add_class::<ErrorWord>()?;
    m.add_function(wrap_pyfunction!(copy_tiles_launch, m)?)?;
    m.add_function(wrap_pyfunction!(state_chunks, m)?)?;
    m.add_function(wrap_pyfunction!(check_fused_step, m)?)?;
    m.add_function(wrap_pyfunction!(check_device_tables, m)?)?;
    m.add_function(wrap_pyfunction!(pack_launch, m)?)?;
    m.add_function(wrap_pyfunction!(kernel_abi, m)?)?;
    Ok(())
}
