//! vLLM's align-mode step (`crate::vllm`): the decisions alone, the decisions with their plan over
//! a planner's groups (host path, one call per half-step), and a half-step staged and packed for
//! the fused kernel (device path, one call and one launch per half-step). Decisions come back as
//! int64 rows in one buffer that numpy views without a copy.

use super::buffer::RawBuffer;
use super::conversion::{arg_error, args, items, kwargs, Arg, DeviceOf, Ints, RequestNames, Tables, Tensor};
use super::launch::KernelLaunch;
use super::params::with_params;
use super::plan::CopyPlan;
use super::planner::Planner;
use super::tensor::{describe, Described};
use crate::error::{Error, ErrorKind};
use crate::kernels::StepInputs;
use crate::plan::GroupTable;
use crate::tensor::TensorDesc;
use crate::vllm::device_step::{self, StagedStep, Tables as TableSource};
use crate::vllm::slots::{self, SlotTable};
use crate::vllm::{self, decide, PostInputs, PreInputs, StepConfig};
use pyo3::prelude::*;
use pyo3::types::PyString;

/// Accepted counts: a host vector (checked by the host decision) or a device tensor (read only by
/// the kernel).
pub(crate) enum Counts {
    Host(Vec<i64>),
    Device(TensorDesc),
}

impl Arg for Counts {
    fn arg(obj: &Bound<'_, PyAny>, name: &str, kind: ErrorKind) -> PyResult<Self> {
        if let Described::Tensor(t) = describe(obj)? {
            if t.device().is_ok_and(|d| d.is_cuda()) {
                return Ok(Counts::Device(t));
            }
        }
        Ints::arg(obj, name, kind).map(|v| Counts::Host(v.0))
    }
}

impl Counts {
    fn host(&self) -> Option<&[i64]> {
        match self {
            Counts::Host(v) => Some(v),
            Counts::Device(_) => None,
        }
    }
}

fn fresh_mask(f: &Option<Ints>) -> Option<Vec<bool>> {
    f.as_ref().map(|v| v.0.iter().map(|&x| x != 0).collect())
}

fn rows(rows: &[&[i64]]) -> RawBuffer {
    RawBuffer::new(rows.iter().flat_map(|r| r.iter().copied()).collect::<Vec<i64>>())
}

fn pre_rows(d: &decide::PreDecision) -> RawBuffer {
    rows(&[&d.prev, &d.curr, &d.src_col, &d.bias, &d.num_accepted])
}

fn post_rows(d: &decide::PostDecision) -> RawBuffer {
    rows(&[&d.running, &d.aligned, &d.dest, &d.bias, &d.src_col, &d.num_accepted])
}

kwargs! {
    /// The pre-copy's inputs (vLLM's `preprocess_mamba`).
    pub(crate) struct PreArgs (Plan) {
        tables: Tables,
        num_computed: Ints,
        num_scheduled: Ints,
        num_accepted: Ints,
        mamba_state_idx: Ints,
        fresh: Option<Ints>,
        req_ids: RequestNames,
        block_size: Option<i64>,
        num_spec_blocks: Option<i64>,
    }
}

kwargs! {
    /// The post-process's inputs (vLLM's `postprocess_mamba_align_gpu`).
    pub(crate) struct PostArgs (Plan) {
        tables: Tables,
        state_col: Ints,
        num_computed: Ints,
        num_scheduled: Ints,
        num_draft: Ints,
        num_accepted: Ints,
        req_ids: RequestNames,
        block_size: Option<i64>,
        num_spec_blocks: Option<i64>,
    }
}

/// The step configuration of a decision without a planner.
fn config(block_size: Option<i64>, num_spec_blocks: Option<i64>) -> PyResult<StepConfig> {
    match (block_size, num_spec_blocks) {
        (Some(block_size), Some(num_spec_blocks)) => Ok(StepConfig { block_size, num_spec_blocks }),
        _ => Err(arg_error(ErrorKind::Plan, "block_size and num_spec_blocks are required".into())),
    }
}

impl PreArgs {
    fn inputs<'a>(&'a self, fresh: &'a Option<Vec<bool>>) -> PreInputs<'a> {
        PreInputs {
            num_computed: &self.num_computed.0,
            num_scheduled: &self.num_scheduled.0,
            num_accepted: &self.num_accepted.0,
            mamba_state_idx: &self.mamba_state_idx.0,
            fresh: fresh.as_deref(),
        }
    }
}

impl PostArgs {
    fn inputs(&self) -> PostInputs<'_> {
        PostInputs {
            state_col: &self.state_col.0,
            num_computed: &self.num_computed.0,
            num_scheduled: &self.num_scheduled.0,
            num_draft: &self.num_draft.0,
            num_accepted: &self.num_accepted.0,
        }
    }
}

with_params! {
    (PreArgs {
        tables: "Sequence[_IntArray] | _IntArray", num_computed: "_IntArray", num_scheduled: "_IntArray", num_accepted: "_IntArray",
        mamba_state_idx: "_IntArray", fresh: "_IntArray | None" = None, req_ids: "Sequence[str] | None" = None,
        block_size: "int | None" = None, num_spec_blocks: "int | None" = None,
    })
    #[signature((*,) ..a -> "RawBuffer")]
    /// vLLM's pre-copy decision (no copies): int64 rows `prev, curr, src_col, bias, num_accepted`.
    #[pyfunction]
    fn align_pre_copy() -> PyResult<RawBuffer> {
        let fresh = fresh_mask(&a.fresh);
        let d = decide::pre_copy(&a.inputs(&fresh), &a.tables.views(), &config(a.block_size, a.num_spec_blocks)?, &|i| a.req_ids.name(i))?;
        Ok(pre_rows(&d))
    }

    #[signature((planner: "Planner", *,) ..a -> "tuple[RawBuffer, CopyPlan]")]
    /// The pre-copy decision (rows as `align_pre_copy`) and its plan over every group of `planner`.
    #[pyfunction]
    #[pyo3(name = "vllm_pre_copy")]
    fn pre_copy(planner: Bound<'_, Planner>,) -> PyResult<(RawBuffer, CopyPlan)> {
        let fresh = fresh_mask(&a.fresh);
        let p = planner.get();
        let step = vllm::HostStep { tables: &a.tables.views(), block_size: p.block_size()?, name: &|i| a.req_ids.name(i) };
        let (d, plan) = vllm::pre_copy(&p.inner, &a.inputs(&fresh), &step)?;
        Ok((pre_rows(&d), CopyPlan::new(plan, planner.unbind())))
    }
}

with_params! {
    (PostArgs {
        tables: "Sequence[_IntArray] | _IntArray", state_col: "_IntArray", num_computed: "_IntArray", num_scheduled: "_IntArray",
        num_draft: "_IntArray", num_accepted: "_IntArray", req_ids: "Sequence[str] | None" = None, block_size: "int | None" = None,
        num_spec_blocks: "int | None" = None,
    })
    #[signature((*,) ..a -> "RawBuffer")]
    /// vLLM's post-process decision (no copies): int64 rows `running, aligned, dest, bias, src_col,
    /// num_accepted`.
    #[pyfunction]
    fn align_post_process() -> PyResult<RawBuffer> {
        let d = decide::post_process(&a.inputs(), &a.tables.views(), &config(a.block_size, a.num_spec_blocks)?, &|i| a.req_ids.name(i))?;
        Ok(post_rows(&d))
    }

    #[signature((planner: "Planner", *,) ..a -> "tuple[RawBuffer, CopyPlan]")]
    /// The post-process decision (rows as `align_post_process`) and its plan.
    #[pyfunction]
    #[pyo3(name = "vllm_post_process")]
    fn post_process(planner: Bound<'_, Planner>,) -> PyResult<(RawBuffer, CopyPlan)> {
        let p = planner.get();
        let step = vllm::HostStep { tables: &a.tables.views(), block_size: p.block_size()?, name: &|i| a.req_ids.name(i) };
        let (d, plan) = vllm::post_process(&p.inner, &a.inputs(), &step)?;
        Ok((post_rows(&d), CopyPlan::new(plan, planner.unbind())))
    }
}

kwargs! {
    /// A device half-step: the host vectors the host decides with, the accepted counts (host or
    /// device), and where the kernel reads and writes: `staging` (the device int32 buffer the
    /// returned staged step is copied into before the launch), optionally the engine's own
    /// `[groups, R, cols]` device table, the error word and the counts' output; `step_rows`
    /// (`(R, max_num_reqs)`), when given, checked first.
    pub(crate) struct DeviceArgs (Plan) {
        step_rows: Option<StepRows>,
        tables: Tables,
        num_computed: Ints,
        num_scheduled: Ints,
        mamba_state_idx: Option<Ints>,
        state_col: Option<Ints>,
        num_draft: Option<Ints>,
        num_accepted: Counts,
        fresh: Option<Ints>,
        req_ids: RequestNames,
        staging: Tensor,
        device_table: Option<Tensor>,
        err: Tensor,
        num_accepted_out: Tensor,
    }
}

/// A device half-step's `(requests, max_num_reqs)`: the step's rows against its buffers', checked
/// (`device_step::check_rows`) before any other argument is read.
pub(crate) struct StepRows {
    max_num_reqs: u64,
}

impl Arg for StepRows {
    fn arg(obj: &Bound<'_, PyAny>, name: &str, kind: ErrorKind) -> PyResult<Self> {
        let (rows, max): (u64, u64) =
            obj.extract().map_err(|_| arg_error(kind, format!("{name} must be (requests, max_num_reqs), two integers >= 0")))?;
        device_step::check_rows(rows, max)?;
        Ok(StepRows { max_num_reqs: max })
    }
}

/// `DeviceArgs`' parameters ([`super::params`]), keyword-only (after the planner and `run`).
macro_rules! device_half_params {
    ($($items:tt)*) => {
        $crate::python::params::with_params! {
            ($crate::python::vllm::DeviceArgs {
                step_rows: "tuple[int, int] | None" = None, tables: "Sequence[_IntArray] | _IntArray", num_computed: "_IntArray",
                num_scheduled: "_IntArray", mamba_state_idx: "_IntArray | None" = None, state_col: "_IntArray | None" = None,
                num_draft: "_IntArray | None" = None, num_accepted: "_IntArray | _Tensor", fresh: "_IntArray | None" = None,
                req_ids: "Sequence[str] | None" = None, staging: "_Tensor", device_table: "_Tensor | None" = None,
                err: "_Tensor", num_accepted_out: "_Tensor",
            })
            $($items)*
        }
    };
}

/// A dense int32 view of `len` elements at element `offset` of the staging buffer.
fn staged_view(staging: &TensorDesc, offset: usize, shape: &[i64]) -> TensorDesc {
    TensorDesc::dense(staging.data_ptr + 4 * offset as u64, "int32", shape, &staging.device)
}

/// The staged step's launch: the table (staged, or the engine's device table), then the vectors.
fn launch(p: &Planner, a: &DeviceArgs, st: &StagedStep, pre_copy: bool) -> PyResult<Option<KernelLaunch>> {
    let s = &a.staging.0;
    let need = st.data.len();
    if s.dtype_name() != "int32" || s.shape.len() != 1 || s.shape[0] < need as i64 || (s.shape[0] > 1 && s.strides[0] != 4) {
        return Err(Error::plan(format!(
            "staging must be a contiguous int32 vector of at least {need} elements, got {} {:?}",
            s.dtype_name(),
            s.shape
        ))
        .into());
    }
    let (r, n) = (st.rows as i64, st.table_len());
    let table = match &a.device_table {
        Some(t) => t.0.clone(),
        None => staged_view(s, 0, &[st.groups as i64, r, st.cols as i64]),
    };
    let (first, second) = (staged_view(s, n, &[r]), staged_view(s, n + st.rows, &[r]));
    let staged_counts;
    let counts = match &a.num_accepted {
        Counts::Device(t) => t,
        Counts::Host(_) => {
            staged_counts = staged_view(s, n + 2 * st.rows, &[r]);
            &staged_counts
        }
    };
    let block_size = if pre_copy { None } else { Some(p.block_size()?) };
    let inputs = StepInputs {
        block_table: &table,
        src_col: &first,
        second: &second,
        num_accepted: counts,
        num_accepted_out: Some(&a.num_accepted_out.0),
        err: Some(&a.err.0),
        block_size,
    };
    p.fused_launch(&inputs, pre_copy)
}

/// `(vector, staged step, launch)` of a device half-step.
type DeviceHalf = (RawBuffer, Py<RawBuffer>, Option<Py<KernelLaunch>>);

fn required<'a>(v: &'a Option<Ints>, name: &str) -> PyResult<&'a [i64]> {
    v.as_ref().map(|v| v.0.as_slice()).ok_or_else(|| arg_error(ErrorKind::Plan, format!("missing argument '{name}'")))
}

/// One device half-step: `stage` decides and stages it from the core's [`device_step::Stage`]
/// (the host tables, the planner's configuration), then the bound tensors are checked and the
/// launch is packed (`pre_copy`: pre-copy semantics). With `run`, the guarded write happens here
/// too: `run(staged, launch)` (copy the staged step to the device, launch) and the states recorded
/// as written, in this call.
fn device_half<T>(
    planner: &Bound<'_, Planner>,
    a: &DeviceArgs,
    pre_copy: bool,
    run: Option<&Bound<'_, PyAny>>,
    stage: impl FnOnce(&device_step::Stage<'_>) -> crate::error::Result<(T, StagedStep)>,
) -> PyResult<(T, Py<RawBuffer>, Option<Py<KernelLaunch>>)> {
    let p = planner.get();
    let py = planner.py();
    let tables: Vec<GroupTable<'_>> = a.tables.views();
    let from = if a.device_table.is_some() { TableSource::OnDevice } else { TableSource::Staged };
    let cfg = vllm::config(&p.inner, p.block_size()?);
    let name = |i| a.req_ids.name(i);
    let (out, st) = stage(&device_step::Stage { host_counts: a.num_accepted.host().is_some(), tables: &tables, cfg: &cfg, name: &name, from })?;
    if let Some(limit) = &a.step_rows {
        device_step::check_rows(st.rows as u64, limit.max_num_reqs)?; // the rows the core staged, too
    }
    let mut st = st;
    let mut build = || -> PyResult<(Py<RawBuffer>, Option<Py<KernelLaunch>>)> {
        let l = launch(p, a, &st, pre_copy)?.map(|l| Py::new(py, l)).transpose()?;
        Ok((Py::new(py, RawBuffer::new(std::mem::take(&mut st.data)))?, l))
    };
    let (staged, l) = match run {
        None => {
            p.check(py)?;
            build()?
        }
        Some(run) => p.write(py, || {
            let (staged, l) = build()?;
            run.call1((staged.clone_ref(py), l.as_ref().map(|l| l.clone_ref(py))))?;
            Ok((staged, l))
        })?,
    };
    Ok((out, staged, l))
}

device_half_params! {
#[signature((planner: "Planner", run: "Callable[[RawBuffer, KernelLaunch | None], object] | None" = None, *,) ..a -> "tuple[RawBuffer, RawBuffer, KernelLaunch | None]")]
/// The pre-copy for the device: the host decides the columns (every check that needs no count;
/// with host counts every check), stages the step as int32 and packs the launch that reads it from
/// `staging`. Returns `curr` (store it per request), the staged step (copy it into `staging`, then
/// launch), and the launch (`None` without requests). With `run`, one guarded write in this call:
/// after every check, `run(staged, launch)` queues the copy and the launch, and the states are
/// recorded as written.
#[pyfunction]
#[pyo3(name = "vllm_device_pre_copy")]
fn device_pre_copy(planner: Bound<'_, Planner>, run: Option<Bound<'_, PyAny>>,) -> PyResult<DeviceHalf> {
    let fresh = fresh_mask(&a.fresh);
    let host = a.num_accepted.host();
    let inp = PreInputs {
        num_computed: &a.num_computed.0,
        num_scheduled: &a.num_scheduled.0,
        num_accepted: host.unwrap_or(&[]),
        mamba_state_idx: required(&a.mamba_state_idx, "mamba_state_idx")?,
        fresh: fresh.as_deref(),
    };
    let (cols, st, l) = device_half(&planner, &a, true, run.as_ref(), |at| device_step::stage_pre_copy_checked(&planner.get().inner, &inp, at))?;
    Ok((RawBuffer::new(cols.curr), st, l))
}

#[signature((planner: "Planner", run: "Callable[[RawBuffer, KernelLaunch | None], object] | None" = None, *,) ..a -> "tuple[RawBuffer, RawBuffer, KernelLaunch | None]")]
/// The post-process for the device (decided by the kernel from the counts): returns `running`,
/// the staged step and the launch, as `device_pre_copy`.
#[pyfunction]
#[pyo3(name = "vllm_device_post_process")]
fn device_post_process(planner: Bound<'_, Planner>, run: Option<Bound<'_, PyAny>>,) -> PyResult<DeviceHalf> {
    let host = a.num_accepted.host();
    let inp = PostInputs {
        state_col: required(&a.state_col, "state_col")?,
        num_computed: &a.num_computed.0,
        num_scheduled: &a.num_scheduled.0,
        num_draft: required(&a.num_draft, "num_draft")?,
        num_accepted: host.unwrap_or(&[]),
    };
    let (running, st, l) = device_half(&planner, &a, false, run.as_ref(), |at| device_step::stage_post_process_checked(&planner.get().inner, &inp, at))?;
    Ok((RawBuffer::new(running), st, l))
}
}

kwargs! {
    /// A device remap of last step's counts to this step's rows.
    pub(crate) struct PrevRowsArgs (Plan) {
        device: DeviceOf,
        prev_rows: Tensor,
        rows: u64,
        num_accepted_given: bool,
    }
}

/// Checks `prev_rows` of a device pre-copy (`device_step::check_prev_rows`).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(name = "vllm_check_prev_rows", signature = (
    *, device: "str | _Tensor", prev_rows: "_Tensor", rows: "int", num_accepted_given: "bool",
) -> "None")]
fn check_prev_rows(
    device: Option<&Bound<'_, PyAny>>,
    prev_rows: Option<&Bound<'_, PyAny>>,
    rows: Option<&Bound<'_, PyAny>>,
    num_accepted_given: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let a = args!(PrevRowsArgs { device, prev_rows, rows, num_accepted_given })?;
    Ok(device_step::check_prev_rows(&a.device.0, &a.prev_rows.0, a.rows, a.num_accepted_given)?)
}

/// One planner group: its layout and states, as the caller gave them.
type GroupPair<'py> = (Bound<'py, PyAny>, Bound<'py, PyAny>);

/// The step's groups `(vLLM group id, layout, states)` split into the ids and the planner's
/// `(layout, states)` pairs (the planner checks those); anything else is a `BindingError` naming
/// the group.
#[pyfunction]
#[pyo3(signature = (groups: "Sequence[tuple[int, Layout, Sequence[Sequence[_Tensor]]]]") -> "tuple[list[int], list[tuple[Layout, Sequence[Sequence[_Tensor]]]]]")]
fn vllm_step_groups<'py>(groups: &Bound<'py, PyAny>) -> PyResult<(Vec<i64>, Vec<GroupPair<'py>>)> {
    let kind = ErrorKind::Binding;
    let mut ids = Vec::new();
    let mut pairs = Vec::new();
    for (g, group) in items(groups, "groups", kind, "(group id, layout, states) triples")?.iter().enumerate() {
        let parts = items(group, &format!("groups[{g}]"), kind, "three items, (group id, layout, states)")?;
        let [id, layout, states] = &parts[..] else {
            return Err(arg_error(kind, format!("groups[{g}] must be a (group id, layout, states) triple, got {} items", parts.len())));
        };
        ids.push(Arg::arg(id, &format!("groups[{g}]: group id"), kind)?);
        pairs.push((layout.clone(), states.clone()));
    }
    Ok((ids, pairs))
}

/// Checks a step's scheduling parameters against its planner (`vllm::check_step`): `block_size`
/// given to the planner, `num_spec_blocks` its groups' `num_spec`.
#[pyfunction]
#[pyo3(signature = (planner: "Planner", num_spec_blocks: "int") -> "None")]
fn check_vllm_step(planner: Bound<'_, Planner>, num_spec_blocks: &Bound<'_, PyAny>) -> PyResult<()> {
    let n: i64 = Arg::arg(num_spec_blocks, "num_spec_blocks", ErrorKind::Plan)?;
    let p = planner.get();
    vllm::check_step(&p.inner, p.block_size, n)?;
    Ok(())
}

/// Request ids as Python strings (`str(id)` for anything else), in order.
fn request_ids<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Vec<Bound<'py, PyString>>> {
    items(obj, name, ErrorKind::Plan, "request ids")?
        .into_iter()
        .map(|r| match r.cast_into::<PyString>() {
            Ok(s) => Ok(s),
            Err(e) => e.into_inner().str(),
        })
        .collect()
}

/// The ids' text, borrowed from the Python strings.
fn id_texts<'a>(ids: &'a [Bound<'_, PyString>]) -> PyResult<Vec<&'a str>> {
    ids.iter().map(|s| s.to_str()).collect()
}

/// The rows of vLLM's `mamba_state_idx`: one slot per live request (`slots.rs` in the core).
#[pyclass(module = "recoverssm_rs._core", name = "VllmSlots")]
pub struct PySlots {
    inner: SlotTable,
}

#[pymethods]
impl PySlots {
    /// A table of `max_num_reqs` slots (`1 ..= 2**24`).
    #[new]
    #[pyo3(signature = (max_num_reqs: "int"))]
    fn new(max_num_reqs: &Bound<'_, PyAny>) -> PyResult<Self> {
        let n: i64 = Arg::arg(max_num_reqs, "max_num_reqs", ErrorKind::Plan)?;
        Ok(PySlots { inner: SlotTable::new(n)? })
    }
    /// Each request's slot in batch order (new requests get a free one) and the ids given a slot
    /// by this call. Nothing changes on an error (an id listed twice, the table full).
    #[pyo3(signature = (req_ids: "Sequence[str]") -> "tuple[list[int], list[str]]")]
    fn assign(&mut self, req_ids: &Bound<'_, PyAny>) -> PyResult<(Vec<i64>, Vec<String>)> {
        let ids = request_ids(req_ids, "req_ids")?;
        Ok(self.inner.assign(&id_texts(&ids)?)?)
    }
    /// Frees the slots of `req_ids` (ids without one are skipped); returns the freed slots.
    #[pyo3(signature = (req_ids: "Iterable[str]") -> "list[int]")]
    fn release(&mut self, req_ids: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
        let ids = request_ids(req_ids, "req_ids")?;
        Ok(self.inner.release(&id_texts(&ids)?))
    }
    /// Checks one step's slots (each inside the table, one request per slot); `req_ids` name the
    /// requests in errors.
    #[pyo3(signature = (slots: "_IntArray", req_ids: "Sequence[str] | None" = None) -> "list[int]")]
    fn check(&self, slots: &Bound<'_, PyAny>, req_ids: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<i64>> {
        let slots = Ints::arg(slots, "slots", ErrorKind::Plan)?.0;
        let names = RequestNames(req_ids.filter(|r| !r.is_none()).map(|r| r.clone().unbind()));
        slots::check_slots(&slots, self.inner.capacity(), &|i| names.name(i))?;
        Ok(slots)
    }
    /// `max_num_reqs` checked as a table's capacity (`PlanError` outside `1 ..= 2**24`).
    #[staticmethod]
    #[pyo3(signature = (max_num_reqs: "int") -> "int")]
    fn check_capacity(max_num_reqs: &Bound<'_, PyAny>) -> PyResult<usize> {
        let n: i64 = Arg::arg(max_num_reqs, "max_num_reqs", ErrorKind::Plan)?;
        Ok(slots::check_capacity(n)?)
    }
    /// Slots in the table (`max_num_reqs`).
    #[getter]
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }
    /// Requests holding a slot.
    #[getter]
    fn live(&self) -> usize {
        self.inner.live()
    }
    fn __repr__(&self) -> String {
        format!("VllmSlots(max_num_reqs={}, live={})", self.inner.capacity(), self.inner.live())
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySlots>()?;
    m.add_function(wrap_pyfunction!(vllm_step_groups, m)?)?;
    m.add_function(wrap_pyfunction!(check_vllm_step, m)?)?;
    m.add_function(wrap_pyfunction!(align_pre_copy, m)?)?;
    m.add_function(wrap_pyfunction!(align_post_process, m)?)?;
    m.add_function(wrap_pyfunction!(pre_copy, m)?)?;
    m.add_function(wrap_pyfunction!(post_process, m)?)?;
    m.add_function(wrap_pyfunction!(device_pre_copy, m)?)?;
    m.add_function(wrap_pyfunction!(device_post_process, m)?)?;
    m.add_function(wrap_pyfunction!(check_prev_rows, m)?)?;
    Ok(())
}
