//! Bindings for the kernels' calling convention (`crate::kernels`): the ABI description the Python
//! package builds its record dtypes from, and the launches. A [`KernelLaunch`] carries the grid,
//! the block and the packed argument buffer; the launch layer hands its `extra_ptr` to
//! `cuLaunchKernel` and does nothing else.

use super::conversion::{args, kwargs, DeviceOf, Tensor};
use super::planner::device_step_params;
use crate::error::Error;
use crate::kernels::{self, abi, args, constants, records, FusedCopy, Launch};
use crate::tensor::Device;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

/// `cuLaunchKernel`'s `extra` markers (cuda.h).
const CU_LAUNCH_PARAM_END: usize = 0x00;
const CU_LAUNCH_PARAM_BUFFER_POINTER: usize = 0x01;
const CU_LAUNCH_PARAM_BUFFER_SIZE: usize = 0x02;

/// One ready launch: kernel, grid, block and the argument buffer (the kernel's parameter record).
#[pyclass(module = "recoverssm_rs._core", frozen)]
pub struct KernelLaunch {
    launch: Launch,
    /// The size `extra` points to (boxed: its address must not move).
    size: Box<usize>,
    /// `{BUFFER_POINTER, args, BUFFER_SIZE, &size, END}` for `cuLaunchKernel(..., extra)`.
    extra: Box<[usize; 5]>,
}

impl KernelLaunch {
    pub(crate) fn new(launch: Launch) -> KernelLaunch {
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
    /// `(field, value)` of the parameter record, in declaration order, read from the buffer.
    fn values(&self) -> Vec<(&'static str, i128)> {
        self.launch.values()
    }
    fn __repr__(&self) -> String {
        format!("KernelLaunch({}, grid={:?}, block={:?}, {} argument bytes)", self.launch.kernel.name, self.launch.grid, self.launch.block, self.size)
    }
}

kwargs! {
    /// The launch constants of a fused copy whose state metas are at device address `metas`.
    pub(crate) struct FusedArgs (Plan) {
        device: DeviceOf,
        metas: u64,
        num_meta: u32,
        max_accepted: i32,
        num_blocks: i64,
        has_temporal: bool,
        chunks: u32,
        err: u64,
        groups: u32 = 1,
    }
}

/// The fused state copy over a table of state metas the caller built (tools and tests; a planner
/// builds its own, `Planner.bind_device`).
#[pyclass(module = "recoverssm_rs._core", name = "FusedCopy", frozen)]
pub struct PyFusedCopy {
    inner: FusedCopy,
    /// The CUDA device index of the states.
    #[pyo3(get)]
    device_index: u32,
}

device_step_params! {
#[pymethods]
impl PyFusedCopy {
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (
        *, device: "str | _Tensor", metas: "int", num_meta: "int", max_accepted: "int", num_blocks: "int", has_temporal: "bool",
        chunks: "int", err: "int", groups: "int" = None,
    ))]
    fn new(
        device: Option<&Bound<'_, PyAny>>,
        metas: Option<&Bound<'_, PyAny>>,
        num_meta: Option<&Bound<'_, PyAny>>,
        max_accepted: Option<&Bound<'_, PyAny>>,
        num_blocks: Option<&Bound<'_, PyAny>>,
        has_temporal: Option<&Bound<'_, PyAny>>,
        chunks: Option<&Bound<'_, PyAny>>,
        err: Option<&Bound<'_, PyAny>>,
        groups: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let a = args!(FusedArgs { device, metas, num_meta, max_accepted, num_blocks, has_temporal, chunks, err, groups })?;
        let device = a.device.0;
        let inner = FusedCopy {
            device,
            metas: a.metas,
            num_meta: a.num_meta,
            max_accepted: a.max_accepted,
            num_blocks: a.num_blocks,
            has_temporal: a.has_temporal,
            chunks: a.chunks,
            err: a.err,
            groups: a.groups,
        };
        let inner = inner.checked()?;
        Ok(PyFusedCopy { device_index: cuda_index(&inner.device), inner })
    }

    #[signature(() ..a -> "KernelLaunch | None")]
    /// The launch of one step (arguments as `Planner.device_step`; int32 inputs).
    fn launch(&self,) -> PyResult<Option<KernelLaunch>> {
        Ok(self.inner.launch(&a.inputs(), a.pre_copy)?.map(KernelLaunch::new))
    }

    fn __repr__(&self) -> String {
        let f = &self.inner;
        format!("FusedCopy({}, states={}, max_accepted={}, blocks={}, chunks={})", f.device, f.num_meta, f.max_accepted, f.num_blocks, f.chunks)
    }
}
}

/// The index of a CUDA device (0 for the host, which the launch builders refuse before this is asked).
pub(crate) fn cuda_index(device: &Device) -> u32 {
    match device {
        Device::Cuda(i) => *i,
        Device::Cpu => 0,
    }
}

/// A launch of kernel `name` whose parameter record is given field by field (`fields`: every field
/// of the record, each range-checked against its C type) with the given grid and block; for
/// tools and tests that launch with arguments of their own.
#[pyfunction]
#[pyo3(signature = (name: "str", grid: "tuple[int, int, int]", block: "tuple[int, int, int]", fields: "Mapping[str, int]") -> "KernelLaunch")]
pub(crate) fn pack_launch(
    name: &str,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    fields: std::collections::HashMap<String, i128>,
) -> PyResult<KernelLaunch> {
    let k = abi::kernel(name)?;
    let fields: Vec<(&str, i128)> = fields.iter().map(|(n, v)| (n.as_str(), *v)).collect();
    Ok(KernelLaunch::new(abi::pack(k, [grid.0, grid.1, grid.2], [block.0, block.1, block.2], &fields)?))
}

kwargs! {
    /// One wave of `rs_copy_tiles`: segment and tile records at device addresses.
    pub(crate) struct TilesArgs (Plan) {
        segments: u64,
        tiles: u64,
        first_tile: i64,
        num_tiles: i64,
        max_ctas: Option<i64>,
    }
}

/// The launch of one wave of `rs_copy_tiles`, or `None` when it has no tile.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (*, segments: "int", tiles: "int", first_tile: "int", num_tiles: "int", max_ctas: "int | None" = None) -> "KernelLaunch | None")]
pub(crate) fn copy_tiles_launch(
    segments: Option<&Bound<'_, PyAny>>,
    tiles: Option<&Bound<'_, PyAny>>,
    first_tile: Option<&Bound<'_, PyAny>>,
    num_tiles: Option<&Bound<'_, PyAny>>,
    max_ctas: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<KernelLaunch>> {
    let a = args!(TilesArgs { segments, tiles, first_tile, num_tiles, max_ctas })?;
    Ok(kernels::copy_tiles_launch(a.segments, a.tiles, a.first_tile, a.num_tiles, a.max_ctas)?.map(KernelLaunch::new))
}

/// CTAs per state copy of the fused kernel for states of at most `max_state_bytes` bytes.
#[pyfunction]
pub(crate) fn state_chunks(max_state_bytes: u64) -> u32 {
    kernels::state_chunks(max_state_bytes)
}

kwargs! {
    /// The engine's device block tables of a multi-group step.
    pub(crate) struct DeviceTablesArgs (Plan) {
        device: DeviceOf,
        tables: Vec<Tensor>,
        groups: u32,
        rows: u64,
    }
}

/// Checks the engine's device block tables of a multi-group step (`args::check_group_tables`).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (*, device: "str | _Tensor", tables: "Sequence[_Tensor]", groups: "int", rows: "int") -> "None")]
pub(crate) fn check_device_tables(
    device: Option<&Bound<'_, PyAny>>,
    tables: Option<&Bound<'_, PyAny>>,
    groups: Option<&Bound<'_, PyAny>>,
    rows: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let a = args!(DeviceTablesArgs { device, tables, groups, rows })?;
    let device = a.device.0;
    let tables: Vec<_> = a.tables.into_iter().map(|t| t.0).collect();
    Ok(args::check_group_tables(&device, &tables, a.groups, a.rows)?)
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
    fn new(words: Vec<i64>, num_requests: i64) -> PyResult<Self> {
        let [bits, from_end, last, ..] = words[..] else {
            return Err(Error::plan(format!("an error word has 3 elements, got {}", words.len())).into());
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
/// `{"kernels": [{"name", "file", "record", "params": [(field, c_type)]}], "kernel_files": [...],
/// "records": {name: {"size", "fields": [(name, offset, numpy_type, c_type)]}},
/// "constants": {name: value}, "error_bits": [(bit, name, meaning)]}`.
#[pyfunction]
#[pyo3(signature = () -> "dict[str, Any]")]
pub(crate) fn kernel_abi(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let out = PyDict::new(py);
    let ks = PyList::empty(py);
    for k in abi::KERNELS {
        let d = PyDict::new(py);
        d.set_item("name", k.name)?;
        d.set_item("file", k.file)?;
        d.set_item("record", k.params)?;
        let fields: Vec<(&str, &str)> = k.params_spec().fields.iter().map(|f| (f.name, f.ty.c_name())).collect();
        d.set_item("params", fields)?;
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
