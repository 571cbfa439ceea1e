//! Bindings for RecoverSSM commits (`crate::commit`, `crate::kernels::CommitLaunch`): the commit
//! planner of a layout and pool, the commit kernel's per-layer table (made from the tensors
//! themselves), and the kernel's launch builder of one state cache.

use super::buffer::RawBuffer;
use super::conversion::{arg_error, args, instance, kwargs, Arg, DeviceOf, Ints, Table, Tensor};
use super::launch::{cuda_index, KernelLaunch};
use super::layout::Layout;
use crate::commit::{
    check_block_size, check_cache_sizes, check_index, check_state_blocks, check_workspace_rows, commit_meta, plan_commit, plan_device_commit,
    AlignInputs, CommitConfig, CommitMeta, CommitStep, CommitTensors, DeviceCommit, DeviceCounts, GateKind,
};
use crate::error::{Error, ErrorKind};
use crate::kernels::{self, args, constants};
use crate::layout::ConvLayout;
use crate::tensor::{Device, TensorDesc};
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;

/// Commit planning for one RecoverSSM layout over a pool of `num_blocks` blocks: which requests
/// fold how many verified tokens into which block and, in align mode, which prefix-cache block
/// receives the state at the crossed block boundary. Every input is checked before anything moves.
#[pyclass(module = "recoverssm_rs._core", frozen)]
pub struct CommitPlanner {
    backend: String,
    num_blocks: u64,
    /// The speculative window `Q = num_spec + 1`.
    window: u32,
}

kwargs! {
    /// A commit step's inputs; align mode takes `seq_lens`, `block_table` and `block_size`
    /// together; `max_requests`: the workspace rows, when the caller has a workspace.
    pub(crate) struct CommitArgs (Plan) {
        state_blocks: Ints,
        num_accepted: Ints,
        query_lens: Ints,
        seq_lens: Option<Ints>,
        block_table: Option<Table>,
        block_size: Option<i64>,
        max_requests: Option<u64>,
    }
}

#[pymethods]
impl CommitPlanner {
    #[new]
    #[pyo3(signature = (layout: "Layout", num_blocks: "int"))]
    fn new(layout: &Bound<'_, PyAny>, num_blocks: &Bound<'_, PyAny>) -> PyResult<Self> {
        let layout = instance::<Layout>(layout, "layout", ErrorKind::Binding, "Layout")?;
        let layout = layout.borrow();
        // A host integer (a bool, a float or a string refused), at least 1.
        let num_blocks = u64::arg(num_blocks, "num_blocks", ErrorKind::Binding)
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| Error::binding(format!("num_blocks must be a positive integer, got {num_blocks}")))?;
        let core = layout.core();
        Ok(CommitPlanner { backend: core.backend().to_string(), num_blocks, window: core.num_spec() + 1 })
    }

    #[getter]
    fn num_blocks(&self) -> u64 {
        self.num_blocks
    }
    #[getter]
    fn window(&self) -> u32 {
        self.window
    }

    /// A commit plan (`CommitRow` records): per request the tokens to fold in, its state block
    /// and, in align mode, the boundary block.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (
        *, state_blocks: "_IntArray", num_accepted: "_IntArray", query_lens: "_IntArray", seq_lens: "_IntArray | None" = None,
        block_table: "_IntArray | None" = None, block_size: "int | None" = None, max_requests: "int | None" = None,
    ) -> "RawBuffer")]
    fn plan(
        &self,
        py: Python<'_>,
        state_blocks: Option<&Bound<'_, PyAny>>,
        num_accepted: Option<&Bound<'_, PyAny>>,
        query_lens: Option<&Bound<'_, PyAny>>,
        seq_lens: Option<&Bound<'_, PyAny>>,
        block_table: Option<&Bound<'_, PyAny>>,
        block_size: Option<&Bound<'_, PyAny>>,
        max_requests: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<RawBuffer> {
        let a = args!(CommitArgs { state_blocks, num_accepted, query_lens, seq_lens, block_table, block_size, max_requests })?;
        if let Some(m) = a.max_requests {
            check_workspace_rows(a.state_blocks.0.len(), &self.backend, m)?;
        }
        let align = match (&a.seq_lens, &a.block_table, a.block_size) {
            (None, None, None) => None,
            (Some(s), Some(b), Some(bs)) => {
                Some(AlignInputs { seq_lens: &s.0, block_table: &b.ids, cols: b.cols, block_size: check_block_size(bs)? })
            }
            _ => return Err(Error::plan("align mode needs seq_lens, block_table and block_size together; pass all three or none").into()),
        };
        let step = CommitStep { state_blocks: &a.state_blocks.0, num_accepted: &a.num_accepted.0, query_lens: &a.query_lens.0, align };
        let rows = py.detach(|| plan_commit(&step, &self.backend, self.num_blocks, self.window))?;
        Ok(RawBuffer::new(rows))
    }

    /// Checks running-state blocks (`<= 0` padding): in range, one request per block, and at most
    /// `max_requests` requests when given (the workspace rows). Returns the number of requests.
    #[pyo3(signature = (state_blocks: "_IntArray", max_requests: "int | None" = None) -> "int")]
    fn check_state_blocks(&self, state_blocks: &Bound<'_, PyAny>, max_requests: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
        let sb = Ints::arg(state_blocks, "state_blocks", ErrorKind::Plan)?;
        let max_requests = max_requests.map(|m| Option::<u64>::arg(m, "max_requests", ErrorKind::Plan)).transpose()?.flatten();
        if let Some(m) = max_requests {
            check_workspace_rows(sb.0.len(), &self.backend, m)?;
        }
        check_state_blocks(&sb.0, &self.backend, self.num_blocks)?;
        Ok(sb.0.len())
    }

    fn __repr__(&self) -> String {
        format!("CommitPlanner({:?}, blocks={}, window={})", self.backend, self.num_blocks, self.window)
    }
}

kwargs! {
    /// The commit kernel's tensors, one per layer (`conv` / `conv_window` both absent for layers
    /// without a conv state), and its configuration.
    pub(crate) struct MetaArgs (Binding) {
        recurrent: Vec<Tensor>,
        corrections: Vec<Tensor>,
        keygate: Vec<Tensor>,
        conv: Option<Vec<Tensor>>,
        conv_window: Option<Vec<Tensor>>,
        kind: String,
        conv_layout: String = "DS".to_string(),
        conv_kernel_size: u64 = 1,
    }
}

fn descs(v: Vec<Tensor>) -> Vec<TensorDesc> {
    v.into_iter().map(|t| t.0).collect()
}

/// The commit kernel's table (`CommitMeta` records, 128 bytes per layer).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (
    *, recurrent: "Sequence[_Tensor]", corrections: "Sequence[_Tensor]", keygate: "Sequence[_Tensor]",
    conv: "Sequence[_Tensor] | None" = None, conv_window: "Sequence[_Tensor] | None" = None, kind: "str", conv_layout: "str" = None,
    conv_kernel_size: "int" = None,
) -> "RawBuffer")]
pub(crate) fn commit_meta_table(
    recurrent: Option<&Bound<'_, PyAny>>,
    corrections: Option<&Bound<'_, PyAny>>,
    keygate: Option<&Bound<'_, PyAny>>,
    conv: Option<&Bound<'_, PyAny>>,
    conv_window: Option<&Bound<'_, PyAny>>,
    kind: Option<&Bound<'_, PyAny>>,
    conv_layout: Option<&Bound<'_, PyAny>>,
    conv_kernel_size: Option<&Bound<'_, PyAny>>,
) -> PyResult<RawBuffer> {
    let a = args!(MetaArgs { recurrent, corrections, keygate, conv, conv_window, kind, conv_layout, conv_kernel_size })?;
    let kind = GateKind::parse(&a.kind)?;
    let conv_layout = ConvLayout::parse(&a.conv_layout).map_err(|e| Error::binding(format!("conv_layout: {}", e.message)))?;
    if !(1..=65536).contains(&a.conv_kernel_size) {
        return Err(arg_error(ErrorKind::Binding, format!("conv_kernel_size must be in 1 ..= 65536, got {}", a.conv_kernel_size)));
    }
    let (rec, corr, kg) = (descs(a.recurrent), descs(a.corrections), descs(a.keygate));
    let pair = match (a.conv, a.conv_window) {
        (None, None) => None,
        (Some(c), Some(w)) => Some((descs(c), descs(w))),
        _ => return Err(Error::binding("conv and conv_window: give both or neither").into()),
    };
    let tensors = CommitTensors { recurrent: &rec, corrections: &corr, keygate: &kg, conv: pair.as_ref().map(|(c, w)| (c.as_slice(), w.as_slice())) };
    let meta = commit_meta(&tensors, &CommitConfig { kind, conv_layout, conv_kernel_size: a.conv_kernel_size })?;
    Ok(RawBuffer::new(meta))
}

/// Checks a state cache's sizes (layers, blocks, workspace rows) before anything is allocated.
#[pyfunction(name = "check_cache_sizes")]
#[pyo3(signature = (num_layers: "int", num_blocks: "int", max_requests: "int") -> "None")]
pub(crate) fn check_cache_sizes_py(num_layers: &Bound<'_, PyAny>, num_blocks: &Bound<'_, PyAny>, max_requests: &Bound<'_, PyAny>) -> PyResult<()> {
    let get = |o: &Bound<'_, PyAny>, name: &str| -> PyResult<i64> { super::conversion::Arg::arg(o, name, ErrorKind::Binding) };
    Ok(check_cache_sizes(get(num_layers, "num_layers")?, get(num_blocks, "num_blocks")?, get(max_requests, "max_requests")?)?)
}

/// `index` as an index into `len` items named `what` (a `PlanError` otherwise).
#[pyfunction(name = "check_index")]
#[pyo3(signature = (what: "str", index: "int", len: "int") -> "int")]
pub(crate) fn check_index_py(what: &str, index: &Bound<'_, PyAny>, len: &Bound<'_, PyAny>) -> PyResult<usize> {
    let i: i64 = super::conversion::Arg::arg(index, what, ErrorKind::Plan)?;
    let len = u64::arg(len, "len", ErrorKind::Plan)?;
    Ok(check_index(what, i, len)?)
}

/// `CommitMeta` records from a byte buffer (`uint8` numpy view, bytes, or a core buffer).
fn commit_table(py: Python<'_>, table: &Bound<'_, PyAny>) -> PyResult<Vec<CommitMeta>> {
    let bytes: Vec<u8> = PyBuffer::<u8>::get(table)
        .and_then(|b| b.to_vec(py))
        .map_err(|_| Error::binding("table: expected the commit table's bytes (a uint8 buffer of CommitMeta records)"))?;
    Ok(CommitMeta::from_bytes(&bytes)?)
}

kwargs! {
    /// The commit kernel of one state cache: the table's device address and bytes, the pool.
    pub(crate) struct CommitLaunchArgs (Plan) {
        device: DeviceOf,
        metas: u64,
        num_blocks: i64,
        max_requests: i64,
        err: u64 = 0,
        threads: u32 = constants::THREADS,
    }
}

kwargs! {
    /// One commit launch over the first `num_rows` device rows (default: all).
    pub(crate) struct CommitStepArgs (Plan) {
        rows: Tensor,
        num_rows: Option<u64>,
        num_accepted: Option<Tensor>,
        err: Option<Tensor>,
    }
}

kwargs! {
    /// One device commit: the step (as `CommitPlanner.plan` takes it; `num_accepted` host counts,
    /// or `device_counts` that the host never reads with `launch_counts`, their dense int32 copy
    /// when they are not one already), the row buffer `rows` and the cache's `device`.
    pub(crate) struct DeviceCommitArgs (Plan) {
        state_blocks: Ints,
        num_accepted: Option<Ints>,
        device_counts: Option<Tensor>,
        launch_counts: Option<Tensor>,
        query_lens: Option<Ints>,
        seq_lens: Option<Ints>,
        block_table: Option<Table>,
        block_size: Option<i64>,
        max_requests: u64,
        rows: Tensor,
        device: DeviceOf,
    }
}

/// The commit kernel of one state cache (constants and grid checked once).
#[pyclass(module = "recoverssm_rs._core", name = "CommitLaunch", frozen)]
pub struct PyCommitLaunch {
    inner: kernels::CommitLaunch,
    /// The CUDA device index of the cache.
    #[pyo3(get)]
    device_index: u32,
}

impl PyCommitLaunch {
    /// The core's launch builder.
    pub(crate) fn core(&self) -> &kernels::CommitLaunch {
        &self.inner
    }
}

#[pymethods]
impl PyCommitLaunch {
    /// `table`: the bytes of the `CommitMeta` records at device address `metas`.
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (
        table: "_Buffer", *, device: "str | _Tensor", metas: "int", num_blocks: "int", max_requests: "int", err: "int" = None,
        threads: "int" = None,
    ))]
    fn new(
        py: Python<'_>,
        table: &Bound<'_, PyAny>,
        device: Option<&Bound<'_, PyAny>>,
        metas: Option<&Bound<'_, PyAny>>,
        num_blocks: Option<&Bound<'_, PyAny>>,
        max_requests: Option<&Bound<'_, PyAny>>,
        err: Option<&Bound<'_, PyAny>>,
        threads: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let a = args!(CommitLaunchArgs { device, metas, num_blocks, max_requests, err, threads })?;
        let device = a.device.0;
        let t = commit_table(py, table)?;
        let inner = kernels::CommitLaunch::new(device, a.metas, &t, a.num_blocks, a.max_requests, a.err, a.threads)?;
        Ok(PyCommitLaunch { device_index: cuda_index(&inner.device), inner })
    }

    /// The launch of one commit (`None`: no rows).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (
        *, rows: "_Tensor", num_rows: "int | None" = None, num_accepted: "_Tensor | None" = None, err: "_Tensor | None" = None,
    ) -> "KernelLaunch | None")]
    fn launch(
        &self,
        rows: Option<&Bound<'_, PyAny>>,
        num_rows: Option<&Bound<'_, PyAny>>,
        num_accepted: Option<&Bound<'_, PyAny>>,
        err: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<KernelLaunch>> {
        let a = args!(CommitStepArgs { rows, num_rows, num_accepted, err })?;
        let l = self.inner.launch(&a.rows.0, a.num_rows, a.num_accepted.as_ref().map(|t| &t.0), a.err.as_ref().map(|t| &t.0))?;
        Ok(l.map(KernelLaunch::new))
    }

    /// A whole device commit in one call: the bound tensors' check, the plan, the device counts'
    /// check and the launch over `rows`. Returns the plan's rows (to stage into `rows` before the
    /// launch) and the launch (`None`: nothing to commit). `bound`: the cache's `BoundTensors`,
    /// checked first and marked written once a launch is packed. Nothing is written when it raises.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (
        planner: "CommitPlanner", bound: "BoundTensors | None" = None, *, state_blocks: "_IntArray",
        num_accepted: "_IntArray | None" = None, device_counts: "_Tensor | None" = None, launch_counts: "_Tensor | None" = None,
        query_lens: "_IntArray | None" = None, seq_lens: "_IntArray | None" = None, block_table: "_IntArray | None" = None,
        block_size: "int | None" = None, max_requests: "int", rows: "_Tensor", device: "str | _Tensor",
    ) -> "tuple[RawBuffer, KernelLaunch | None]")]
    fn commit(
        &self,
        planner: PyRef<'_, CommitPlanner>,
        bound: Option<&Bound<'_, PyAny>>,
        state_blocks: Option<&Bound<'_, PyAny>>,
        num_accepted: Option<&Bound<'_, PyAny>>,
        device_counts: Option<&Bound<'_, PyAny>>,
        launch_counts: Option<&Bound<'_, PyAny>>,
        query_lens: Option<&Bound<'_, PyAny>>,
        seq_lens: Option<&Bound<'_, PyAny>>,
        block_table: Option<&Bound<'_, PyAny>>,
        block_size: Option<&Bound<'_, PyAny>>,
        max_requests: Option<&Bound<'_, PyAny>>,
        rows: Option<&Bound<'_, PyAny>>,
        device: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(RawBuffer, Option<KernelLaunch>)> {
        if let Some(b) = bound {
            b.call_method0("check")?;
        }
        let a = args!(DeviceCommitArgs {
            state_blocks,
            num_accepted,
            device_counts,
            launch_counts,
            query_lens,
            seq_lens,
            block_table,
            block_size,
            max_requests,
            rows,
            device
        })?;
        let counts = match (&a.num_accepted, &a.device_counts) {
            (Some(h), None) => DeviceCounts::Host(&h.0),
            (None, Some(d)) => DeviceCounts::Device { checked: &d.0, launched: &a.launch_counts.as_ref().unwrap_or(d).0, device: &a.device.0 },
            (None, None) => {
                // The host counts' own error (as `CommitPlanner.plan` gives it for `None`).
                let none = planner.py().None().into_bound(planner.py());
                let _: Ints = super::conversion::Arg::arg(&none, "num_accepted", ErrorKind::Plan)?;
                return Err(Error::plan("num_accepted: expected the counts").into());
            }
            (Some(_), Some(_)) => return Err(Error::plan("give num_accepted (host counts) or device_counts, not both").into()),
        };
        let align = match (&a.seq_lens, &a.block_table, a.block_size) {
            (None, None, None) => None,
            (Some(s), Some(b), Some(bs)) => {
                Some(AlignInputs { seq_lens: &s.0, block_table: &b.ids, cols: b.cols, block_size: check_block_size(bs)? })
            }
            _ => return Err(Error::plan("align mode needs seq_lens, block_table and block_size together; pass all three or none").into()),
        };
        let step = DeviceCommit {
            state_blocks: &a.state_blocks.0,
            counts,
            query_lens: a.query_lens.as_ref().map(|q| q.0.as_slice()),
            align,
            max_requests: a.max_requests,
        };
        let (rows, launch) = plan_device_commit(&step, &planner.backend, planner.num_blocks, planner.window, &self.inner, &a.rows.0)?;
        if !rows.is_empty() {
            if let Some(b) = bound {
                b.call_method0("mark_written")?;
            }
        }
        Ok((RawBuffer::new(rows), launch.map(KernelLaunch::new)))
    }

    fn __repr__(&self) -> String {
        let c = &self.inner;
        format!(
            "CommitLaunch({}, layers={}, blocks={}, max_requests={}, ctas=({}, {}))",
            c.device, c.num_layers, c.num_blocks, c.max_requests, c.rec_ctas, c.conv_ctas
        )
    }
}

/// `(rec_ctas, conv_ctas)`: CTAs per (layer, row) of the commit kernel for a table's bytes, with
/// `threads` threads per CTA.
#[pyfunction]
#[pyo3(signature = (table: "_Buffer", threads: "int" = None) -> "tuple[int, int]")]
pub(crate) fn commit_grid(py: Python<'_>, table: &Bound<'_, PyAny>, threads: Option<&Bound<'_, PyAny>>) -> PyResult<(u32, u32)> {
    let threads = match threads {
        Some(t) => u32::arg(t, "threads", ErrorKind::Binding)?,
        None => constants::THREADS,
    };
    Ok(kernels::commit_grid(&commit_table(py, table)?, threads))
}

/// Checks the accepted counts of a device commit: an integer vector on the cache's device with at
/// least `min_len` counts.
#[pyfunction]
#[pyo3(signature = (device: "str", num_accepted: "_Tensor", min_len: "int") -> "None")]
pub(crate) fn check_commit_counts(device: &str, num_accepted: &Bound<'_, PyAny>, min_len: &Bound<'_, PyAny>) -> PyResult<()> {
    let min_len = u64::arg(min_len, "min_len", ErrorKind::Plan)?;
    let device = Device::parse(device).map_err(|e| Error::plan(e.message))?;
    let a: Tensor = super::conversion::Arg::arg(num_accepted, "num_accepted", ErrorKind::Plan)?;
    Ok(args::check_commit_counts(&device, &a.0, min_len)?)
}
