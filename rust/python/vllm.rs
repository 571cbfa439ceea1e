//! vLLM's align-mode step (`crate::vllm`): the decisions alone, the decisions with their plan over
//! a planner's groups (host path, one call per half-step), and a half-step staged and packed for
//! the fused kernel (device path, one call and one launch per half-step). Decisions come back as
//! int64 rows in one buffer that numpy views without a copy.

use super::buffer::RawBuffer;
use super::conversion::{arg_error, args, items, kwargs, type_name, Arg, DeviceOf, Ints, RequestNames, Tables, Tensor};
use super::launch::KernelLaunch;
use super::params::with_params;
use super::plan::CopyPlan;
use super::planner::Planner;
use super::tensor::{describe, Described};
use crate::error::{Error, ErrorKind};
use crate::kernels::args::{check_group_tables, int_vector, IntType};
use crate::kernels::StepInputs;
use crate::plan::GroupTable;
use crate::tensor::TensorDesc;
use crate::vllm::device_step::{self, StagedStep, Tables as TableSource};
use crate::vllm::slots::{self, SlotTable};
use crate::vllm::{self, decide, PostInputs, PreInputs, StepConfig};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

/// Accepted counts: a host vector (checked by the host decision) or a device tensor (read only by
/// the kernel).
pub(crate) enum Counts {
    Host(Vec<i64>),
    Device(TensorDesc, Py<PyAny>),
}

impl Arg for Counts {
    fn arg(obj: &Bound<'_, PyAny>, name: &str, kind: ErrorKind) -> PyResult<Self> {
        match describe(obj)? {
            Described::Tensor(t) if t.device().is_ok_and(|d| d.is_cuda()) => return Ok(Counts::Device(t, obj.clone().unbind())),
            // A tensor that cannot be used (sparse, or its storage no longer holds it), wherever it is.
            Described::Dense(why) => return Err(arg_error(kind, format!("{name}: {why}"))),
            _ => {}
        }
        Ints::arg(obj, name, kind).map(|v| Counts::Host(v.0))
    }
}

impl Counts {
    fn host(&self) -> Option<&[i64]> {
        match self {
            Counts::Host(v) => Some(v),
            Counts::Device(..) => None,
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

    #[signature((planner: "Planner", *, host_only: "str | None" = None,) ..a -> "tuple[RawBuffer, CopyPlan]")]
    /// The pre-copy decision (rows as `align_pre_copy`) and its plan over every group of `planner`.
    /// `host_only`: the caller's name for a call of the host path, refused on CUDA states.
    #[pyfunction]
    #[pyo3(name = "vllm_pre_copy")]
    fn pre_copy(planner: Bound<'_, Planner>, host_only: Option<String>,) -> PyResult<(RawBuffer, CopyPlan)> {
        let fresh = fresh_mask(&a.fresh);
        let p = planner.get();
        if let Some(what) = &host_only {
            device_step::check_host_path(p.inner.device(), what)?;
        }
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

    #[signature((planner: "Planner", *, host_only: "str | None" = None,) ..a -> "tuple[RawBuffer, CopyPlan]")]
    /// The post-process decision (rows as `align_post_process`) and its plan; `host_only` as for
    /// `vllm_pre_copy`.
    #[pyfunction]
    #[pyo3(name = "vllm_post_process")]
    fn post_process(planner: Bound<'_, Planner>, host_only: Option<String>,) -> PyResult<(RawBuffer, CopyPlan)> {
        let p = planner.get();
        if let Some(what) = &host_only {
            device_step::check_host_path(p.inner.device(), what)?;
        }
        let step = vllm::HostStep { tables: &a.tables.views(), block_size: p.block_size()?, name: &|i| a.req_ids.name(i) };
        let (d, plan) = vllm::post_process(&p.inner, &a.inputs(), &step)?;
        Ok((post_rows(&d), CopyPlan::new(plan, planner.unbind())))
    }
}

kwargs! {
    /// A device pre-copy's vectors, read from its `PreCopyInputs` by position.
    pub(crate) struct PreStep (Plan) {
        tables: Tables,
        num_computed: Ints,
        num_scheduled: Ints,
        num_accepted: Option<Counts>,
        mamba_state_idx: Ints,
        fresh: Option<Ints>,
        req_ids: RequestNames,
    }
}

kwargs! {
    /// A device post-process's vectors, read from its `PostProcessInputs` by position.
    pub(crate) struct PostStep (Plan) {
        tables: Tables,
        state_col: Ints,
        num_computed: Ints,
        num_scheduled: Ints,
        num_draft: Ints,
        num_accepted: Option<Counts>,
        req_ids: RequestNames,
    }
}

/// An object passed through as it is (a half-step's inputs, a callback).
pub(crate) struct Object(Py<PyAny>);

impl Arg for Object {
    fn arg(obj: &Bound<'_, PyAny>, _: &str, _: ErrorKind) -> PyResult<Self> {
        Ok(Object(obj.clone().unbind()))
    }
}

kwargs! {
    /// A device half-step: its inputs (`step`, a `PreCopyInputs` / `PostProcessInputs`), the rows of
    /// the step's buffers (`max_num_reqs`), and where the kernel reads and writes: `buffers(n, rows)`
    /// returns the device int32 staging buffer (at least `n` elements) and the engine's device tables
    /// stacked (`[groups, rows, cols]`, when `device_tables` are given), `err` the error word, `out`
    /// the `int32 [3 * max_num_reqs]` counts (the pre-copy's, the post-process's, the remapped), and
    /// `prev_rows` a pre-copy's alternative to `num_accepted` (remapped into `out`).
    pub(crate) struct DeviceArgs (Plan) {
        max_num_reqs: u64,
        step: Object,
        buffers: Object,
        err: Tensor,
        out: Tensor,
        device_tables: Option<Vec<Tensor>>,
        prev_rows: Option<Tensor>,
    }
}

/// `DeviceArgs`' parameters ([`super::params`]), keyword-only (after the planner and `run`).
macro_rules! device_half_params {
    ($($items:tt)*) => {
        $crate::python::params::with_params! {
            ($crate::python::vllm::DeviceArgs {
                max_num_reqs: "int", step: "Any", buffers: "Callable[[int, int], tuple[_Tensor, _Tensor | None]]", err: "_Tensor",
                out: "_Tensor", device_tables: "Sequence[_Tensor] | None" = None, prev_rows: "_Tensor | None" = None,
            })
            $($items)*
        }
    };
}

/// A dense int32 view of `len` elements at element `offset` of a device buffer.
fn staged_view(buf: &TensorDesc, offset: usize, shape: &[i64]) -> TensorDesc {
    TensorDesc::dense(buf.data_ptr + 4 * offset as u64, "int32", shape, &buf.device)
}

/// The half-step's inputs (`step`) by position: `len(fields)` items, its class named in the error.
fn step_items<'py>(step: &Bound<'py, PyAny>, fields: &[&str], of: &str) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let items = step.cast::<PyTuple>().ok().filter(|t| t.len() == fields.len()).map(|t| t.iter().collect());
    items.ok_or_else(|| arg_error(ErrorKind::Plan, format!("step must be a {of} ({} fields), got {}", fields.len(), type_name(step))))
}

/// The requests of a half-step (`len` of its first vector, `first`), checked against the step's
/// `max_num_reqs` before anything else of the step is read.
fn step_rows(first: &Bound<'_, PyAny>, name: &str, max_num_reqs: u64) -> PyResult<usize> {
    let rows = first.len().map_err(|e| arg_error(ErrorKind::Plan, format!("{name}: {e}")))?;
    device_step::check_rows(rows as u64, max_num_reqs)?;
    Ok(rows)
}

/// A half-step's vectors for [`device_half`]: the host tables, the accepted counts (host, device,
/// or `None` for a pre-copy remapping `prev_rows`) and the request names.
struct HalfInputs<'a> {
    rows: usize,
    tables: &'a Tables,
    counts: Option<&'a Counts>,
    req_ids: &'a RequestNames,
}

/// `t` narrowed to int32 on its device when it is a torch int64 tensor (`t.to(torch.int32)`,
/// queued on the current stream), else `None`: the kernel reads int32 counts.
fn narrowed(obj: &Bound<'_, PyAny>, t: &TensorDesc) -> PyResult<Option<(Py<PyAny>, TensorDesc)>> {
    if t.dtype != "torch.int64" {
        return Ok(None);
    }
    let py = obj.py();
    let int32 = py.import(intern!(py, "torch"))?.getattr(intern!(py, "int32"))?;
    let n = obj.call_method1(intern!(py, "to"), (int32,))?;
    match describe(&n)? {
        Described::Tensor(d) => Ok(Some((n.unbind(), d))),
        _ => Err(Error::plan("num_accepted: the int32 copy of the counts is not a tensor").into()),
    }
}

/// One device half-step (`pre_copy`: pre-copy semantics): the requests checked against
/// `max_num_reqs`, the step's vectors converted, the engine's device tables and `prev_rows`
/// checked, then `stage` decides and stages it from the core's [`device_step::Stage`]; `buffers`
/// gives the staging buffer (sized for `max_num_reqs`) and the stacked device tables, the counts
/// are narrowed to int32 on the device where needed, and the launch is packed. With `run`, the
/// guarded write happens here too: `run(staged, launch, rows)` (copy the staged step to the
/// device, launch) and the states recorded as written, in this call.
fn device_half<T>(
    planner: &Bound<'_, Planner>,
    a: &DeviceArgs,
    inp: HalfInputs<'_>,
    pre_copy: bool,
    run: Option<&Bound<'_, PyAny>>,
    stage: impl FnOnce(&device_step::Stage<'_>) -> crate::error::Result<(T, StagedStep)>,
) -> PyResult<(T, Py<RawBuffer>, Option<Py<KernelLaunch>>)> {
    let p = planner.get();
    let py = planner.py();
    let device = p.inner.device();
    let (rows, tables): (usize, Vec<GroupTable<'_>>) = (inp.rows, inp.tables.views());
    if let Some(dt) = &a.device_tables {
        let dt: Vec<TensorDesc> = dt.iter().map(|t| t.0.clone()).collect();
        check_group_tables(device, &dt, p.inner.num_groups() as u32, rows as u64)?;
    }
    if let Some(prev) = &a.prev_rows {
        if !pre_copy {
            return Err(Error::plan("prev_rows remaps the counts of a pre-copy; a post-process takes this step's num_accepted").into());
        }
        device_step::check_prev_rows(device, &prev.0, rows as u64, inp.counts.is_some())?;
    }
    let counts = match (inp.counts, &a.prev_rows) {
        (None, None) => {
            let msg = "num_accepted is None: pass the counts (a host vector or a CUDA tensor), or prev_rows to remap last step's";
            return Err(arg_error(ErrorKind::Plan, msg.into()));
        }
        (counts, _) => counts,
    };
    let host_counts = matches!(counts, Some(Counts::Host(_)));
    let from = if a.device_tables.is_some() { TableSource::OnDevice } else { TableSource::Staged };
    let cfg = vllm::config(&p.inner, p.block_size()?);
    let name = |i| inp.req_ids.name(i);
    let (vector, mut st) = stage(&device_step::Stage { host_counts, tables: &tables, cfg: &cfg, name: &name, from })?;
    let m = a.max_num_reqs as usize;
    int_vector(&a.out.0, "out", 3 * m as u64, &[IntType::I32], ErrorKind::Plan)?;
    // The staging buffer holds a step of max_num_reqs requests: its table and three vectors.
    let need = (st.groups * st.cols + 3) * m;
    let (staging, table): (Bound<'_, PyAny>, Bound<'_, PyAny>) = a.buffers.0.bind(py).call1((need, rows))?.extract()?;
    let staging = Tensor::arg(&staging, "staging", ErrorKind::Plan)?.0;
    int_vector(&staging, "staging", need.max(st.data.len()) as u64, &[IntType::I32], ErrorKind::Plan)?;
    let table = match (&a.device_tables, table.is_none()) {
        (Some(_), false) => Tensor::arg(&table, "the stacked device tables", ErrorKind::Plan)?.0,
        (Some(_), true) => return Err(Error::plan("buffers returned no stacked device tables").into()),
        (None, _) => staged_view(&staging, 0, &[st.groups as i64, rows as i64, st.cols as i64]),
    };
    let (r, n) = (rows as i64, st.table_len());
    let (first, second) = (staged_view(&staging, n, &[r]), staged_view(&staging, n + rows, &[r]));
    let mut _keep = None; // the narrowed counts, alive until the launch is queued
    let counts = match counts {
        None => staged_view(&a.out.0, 2 * m, &[r]),
        Some(Counts::Host(_)) => staged_view(&staging, n + 2 * rows, &[r]),
        Some(Counts::Device(t, obj)) => match narrowed(obj.bind(py), t)? {
            Some((keep, d)) => {
                _keep = Some(keep);
                d
            }
            None => t.clone(),
        },
    };
    let counts_out = staged_view(&a.out.0, if pre_copy { 0 } else { m }, &[r]);
    let inputs = StepInputs {
        block_table: &table,
        src_col: &first,
        second: &second,
        num_accepted: &counts,
        num_accepted_out: Some(&counts_out),
        err: Some(&a.err.0),
        block_size: if pre_copy { None } else { Some(p.block_size()?) },
    };
    let mut build = || -> PyResult<(Py<RawBuffer>, Option<Py<KernelLaunch>>)> {
        let l = p.fused_launch(&inputs, pre_copy)?.map(|l| Py::new(py, l)).transpose()?;
        Ok((Py::new(py, RawBuffer::new(std::mem::take(&mut st.data)))?, l))
    };
    let (staged, l) = match run {
        None => {
            p.check(py)?;
            build()?
        }
        Some(run) => p.write(py, || {
            let (staged, l) = build()?;
            run.call1((staged.clone_ref(py), l.as_ref().map(|l| l.clone_ref(py)), rows))?;
            Ok((staged, l))
        })?,
    };
    Ok((vector, staged, l))
}

/// `(vector, staged step, launch)` of a device half-step.
type DeviceHalf = (RawBuffer, Py<RawBuffer>, Option<Py<KernelLaunch>>);

const PRE_FIELDS: [&str; 7] = ["tables", "num_computed", "num_scheduled", "num_accepted", "mamba_state_idx", "fresh", "req_ids"];
const POST_FIELDS: [&str; 7] = ["tables", "state_col", "num_computed", "num_scheduled", "num_draft", "num_accepted", "req_ids"];

device_half_params! {
#[signature((planner: "Planner", run: "Callable[[RawBuffer, KernelLaunch | None, int], object] | None" = None, *,) ..a -> "tuple[RawBuffer, RawBuffer, KernelLaunch | None]")]
/// The pre-copy for the device of `step` (a `PreCopyInputs`): its requests checked against
/// `max_num_reqs` first; the host decides the columns (every check that needs no count; with host
/// counts every check), stages the step as int32 and packs the launch that reads it from the
/// staging buffer `buffers` returns; int64 device counts are narrowed to int32 on the device.
/// Returns `curr` (store it per request), the staged step (copy it into the staging buffer, then
/// launch), and the launch (`None` without requests); the counts after the reset are written to
/// `out[:rows]`. With `run`, one guarded write in this call: after every check,
/// `run(staged, launch, rows)` queues the copy and the launch, and the states are recorded as
/// written.
#[pyfunction]
#[pyo3(name = "vllm_device_pre_copy")]
fn device_pre_copy(planner: Bound<'_, Planner>, run: Option<Bound<'_, PyAny>>,) -> PyResult<DeviceHalf> {
    let step = a.step.0.bind(planner.py());
    let it = step_items(step, &PRE_FIELDS, "PreCopyInputs")?;
    let rows = step_rows(&it[1], "num_computed", a.max_num_reqs)?;
    let s = PreStep::convert(Some(&it[0]), Some(&it[1]), Some(&it[2]), opt(&it[3]), Some(&it[4]), Some(&it[5]), Some(&it[6]))?;
    let fresh = fresh_mask(&s.fresh);
    let host = s.num_accepted.as_ref().and_then(Counts::host);
    let inp = PreInputs {
        num_computed: &s.num_computed.0,
        num_scheduled: &s.num_scheduled.0,
        num_accepted: host.unwrap_or(&[]),
        mamba_state_idx: &s.mamba_state_idx.0,
        fresh: fresh.as_deref(),
    };
    let half = HalfInputs { rows, tables: &s.tables, counts: s.num_accepted.as_ref(), req_ids: &s.req_ids };
    let (cols, st, l) = device_half(&planner, &a, half, true, run.as_ref(), |at| device_step::stage_pre_copy_checked(&planner.get().inner, &inp, at))?;
    Ok((RawBuffer::new(cols.curr), st, l))
}

#[signature((planner: "Planner", run: "Callable[[RawBuffer, KernelLaunch | None, int], object] | None" = None, *,) ..a -> "tuple[RawBuffer, RawBuffer, KernelLaunch | None]")]
/// The post-process for the device of `step` (a `PostProcessInputs`; decided by the kernel from
/// the counts, written to `out[max_num_reqs:][:rows]`): returns `running`, the staged step and the
/// launch, as `vllm_device_pre_copy`.
#[pyfunction]
#[pyo3(name = "vllm_device_post_process")]
fn device_post_process(planner: Bound<'_, Planner>, run: Option<Bound<'_, PyAny>>,) -> PyResult<DeviceHalf> {
    let step = a.step.0.bind(planner.py());
    let it = step_items(step, &POST_FIELDS, "PostProcessInputs")?;
    let rows = step_rows(&it[1], "state_col", a.max_num_reqs)?;
    let s = PostStep::convert(Some(&it[0]), Some(&it[1]), Some(&it[2]), Some(&it[3]), Some(&it[4]), opt(&it[5]), Some(&it[6]))?;
    let host = s.num_accepted.as_ref().and_then(Counts::host);
    let inp = PostInputs {
        state_col: &s.state_col.0,
        num_computed: &s.num_computed.0,
        num_scheduled: &s.num_scheduled.0,
        num_draft: &s.num_draft.0,
        num_accepted: host.unwrap_or(&[]),
    };
    let half = HalfInputs { rows, tables: &s.tables, counts: s.num_accepted.as_ref(), req_ids: &s.req_ids };
    let (running, st, l) = device_half(&planner, &a, half, false, run.as_ref(), |at| device_step::stage_post_process_checked(&planner.get().inner, &inp, at))?;
    Ok((RawBuffer::new(running), st, l))
}
}

/// `Some(obj)`, or `None` for Python's `None` (an optional field left out).
fn opt<'a, 'py>(obj: &'a Bound<'py, PyAny>) -> Option<&'a Bound<'py, PyAny>> {
    (!obj.is_none()).then_some(obj)
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
    /// Frees the slots of several named lists of ids at once (`(name, req_ids)` pairs: vLLM's
    /// finished, preempted and resumed requests): every list is read first, so a malformed one is
    /// a `PlanError` naming it and nothing is freed; returns the freed slots.
    #[pyo3(signature = (lists: "Sequence[tuple[str, Iterable[str]]]") -> "list[int]")]
    fn release_all(&mut self, lists: Vec<(String, Bound<'_, PyAny>)>) -> PyResult<Vec<i64>> {
        let read = lists.iter().map(|(name, ids)| request_ids(ids, name)).collect::<PyResult<Vec<_>>>()?;
        let texts = read.iter().map(|ids| id_texts(ids)).collect::<PyResult<Vec<_>>>()?;
        Ok(texts.iter().flat_map(|ids| self.inner.release(ids)).collect())
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
