//! Bindings for the engine-step decisions and the multi-group planner. Per-request vectors are
//! C-contiguous int64 buffers (the Python layer converts); decisions come back as one bytes object
//! of int64 rows that numpy views without a copy. Plans are built and run with the GIL released.

use super::buffer::RawBuffer;
use super::layout::Layout;
use super::plan::{tensor_desc, DescTuple};
use super::{to_py, IntoPyResult};
use crate::binding::Binding;
use crate::device_step::{self, StagedStep, Tables};
use crate::engine_step::{self, GroupTable, PostDecision, PostInputs, PreDecision, PreInputs, StepConfig};
use crate::error::Error;
use crate::group_plan::{GroupPlan as CoreGroupPlan, GroupPlanner as CoreGroupPlanner, Semantics};
use crate::plan::Planner as CorePlanner;
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use std::sync::Arc;

/// A 1-D int64 vector (the Python layer passes C-contiguous int64 arrays).
fn vec_i64(py: Python<'_>, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<i64>> {
    let b = PyBuffer::<i64>::get(obj).map_err(|_| to_py(py, Error::plan(format!("{what} must be an int64 array"))))?;
    if b.dimensions() != 1 {
        return Err(to_py(py, Error::plan(format!("{what} must be 1-D (one entry per request), got shape {:?}", b.shape()))));
    }
    b.to_vec(py)
}

/// The block tables, one `[rows, cols]` int64 array per group.
fn tables(py: Python<'_>, objs: &Bound<'_, PyList>) -> PyResult<Vec<(Vec<i64>, usize)>> {
    let mut out = Vec::with_capacity(objs.len());
    for (g, o) in objs.iter().enumerate() {
        let b = PyBuffer::<i64>::get(&o).map_err(|_| to_py(py, Error::plan(format!("group {g}: the block table must be an int64 array"))))?;
        let cols = match b.shape() {
            [_, c] => *c,
            s => return Err(to_py(py, Error::plan(format!("group {g}: the block table must be 2-D [requests, cols], got shape {s:?}")))),
        };
        out.push((b.to_vec(py)?, cols));
    }
    Ok(out)
}

fn views(t: &[(Vec<i64>, usize)]) -> Vec<GroupTable<'_>> {
    t.iter().map(|(ids, cols)| GroupTable { ids, cols: *cols }).collect()
}

/// Request names for messages: `req_ids[i]` when given, else the batch row. Looked up only when
/// a message is built (under the GIL, which the decisions hold).
fn namer<'a>(req_ids: Option<&'a Bound<'a, PyAny>>) -> impl Fn(usize) -> String + 'a {
    move |i| match req_ids.and_then(|ids| ids.get_item(i).ok()).and_then(|x| x.str().ok()) {
        Some(s) => format!("request {} (row {i})", s.to_string_lossy()),
        None => engine_step::row_name(i),
    }
}

fn rows_bytes<'py>(py: Python<'py>, rows: &[&[i64]]) -> Bound<'py, PyBytes> {
    let mut v: Vec<u8> = Vec::with_capacity(rows.iter().map(|r| r.len() * 8).sum());
    for r in rows {
        for x in r.iter() {
            v.extend_from_slice(&x.to_ne_bytes());
        }
    }
    PyBytes::new(py, &v)
}

fn pre_bytes<'py>(py: Python<'py>, d: &PreDecision) -> Bound<'py, PyBytes> {
    rows_bytes(py, &[&d.prev, &d.curr, &d.src_col, &d.bias, &d.num_accepted])
}

fn post_bytes<'py>(py: Python<'py>, d: &PostDecision) -> Bound<'py, PyBytes> {
    rows_bytes(py, &[&d.running, &d.aligned, &d.dest, &d.bias, &d.src_col, &d.num_accepted])
}

/// `(decided vectors, staged step, table shape)` of a device half-step.
type StagedPre<'py> = (Bound<'py, PyBytes>, Bound<'py, PyBytes>, (usize, usize, usize));

fn staged_bytes<'py>(py: Python<'py>, s: &StagedStep) -> Bound<'py, PyBytes> {
    let mut v: Vec<u8> = Vec::with_capacity(s.data.len() * 4);
    for x in &s.data {
        v.extend_from_slice(&x.to_ne_bytes());
    }
    PyBytes::new(py, &v)
}

fn fresh_mask(py: Python<'_>, fresh: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Vec<bool>>> {
    fresh.map(|f| vec_i64(py, f, "fresh").map(|v| v.into_iter().map(|x| x != 0).collect())).transpose()
}

/// vLLM's align-mode pre-copy decision (no copies): int64 rows `prev, curr, src_col, bias,
/// num_accepted`, as bytes.
#[pyfunction]
#[pyo3(signature = (block_tables, num_computed, num_scheduled, num_accepted, running_col, block_size, num_spec_blocks, fresh = None, req_ids = None))]
#[allow(clippy::too_many_arguments)]
fn align_pre_copy<'py>(
    py: Python<'py>,
    block_tables: &Bound<'py, PyList>,
    num_computed: &Bound<'py, PyAny>,
    num_scheduled: &Bound<'py, PyAny>,
    num_accepted: &Bound<'py, PyAny>,
    running_col: &Bound<'py, PyAny>,
    block_size: i64,
    num_spec_blocks: i64,
    fresh: Option<&Bound<'py, PyAny>>,
    req_ids: Option<&'py Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let t = tables(py, block_tables)?;
    let (c, n, a, r) = (
        vec_i64(py, num_computed, "num_computed")?,
        vec_i64(py, num_scheduled, "num_scheduled")?,
        vec_i64(py, num_accepted, "num_accepted")?,
        vec_i64(py, running_col, "running_col")?,
    );
    let f = fresh_mask(py, fresh)?;
    let inp = PreInputs { num_computed: &c, num_scheduled: &n, num_accepted: &a, running_col: &r, fresh: f.as_deref() };
    let cfg = StepConfig { block_size, num_spec_blocks };
    let d = engine_step::pre_copy(&inp, &views(&t), &cfg, &namer(req_ids)).py_err(py)?;
    Ok(pre_bytes(py, &d))
}

/// vLLM's align-mode post-process decision (no copies): int64 rows `running, aligned, dest, bias,
/// src_col, num_accepted`, as bytes.
#[pyfunction]
#[pyo3(signature = (block_tables, state_col, num_computed, num_scheduled, num_draft, num_accepted, block_size, num_spec_blocks, req_ids = None))]
#[allow(clippy::too_many_arguments)]
fn align_post_process<'py>(
    py: Python<'py>,
    block_tables: &Bound<'py, PyList>,
    state_col: &Bound<'py, PyAny>,
    num_computed: &Bound<'py, PyAny>,
    num_scheduled: &Bound<'py, PyAny>,
    num_draft: &Bound<'py, PyAny>,
    num_accepted: &Bound<'py, PyAny>,
    block_size: i64,
    num_spec_blocks: i64,
    req_ids: Option<&'py Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let t = tables(py, block_tables)?;
    let (s, c, n, dr, a) = (
        vec_i64(py, state_col, "state_col")?,
        vec_i64(py, num_computed, "num_computed")?,
        vec_i64(py, num_scheduled, "num_scheduled")?,
        vec_i64(py, num_draft, "num_draft")?,
        vec_i64(py, num_accepted, "num_accepted")?,
    );
    let inp = PostInputs { state_col: &s, num_computed: &c, num_scheduled: &n, num_draft: &dr, num_accepted: &a };
    let cfg = StepConfig { block_size, num_spec_blocks };
    let d = engine_step::post_process(&inp, &views(&t), &cfg, &namer(req_ids)).py_err(py)?;
    Ok(post_bytes(py, &d))
}

/// One planner per recurrent group, keeping every group's tensors alive.
#[pyclass(module = "recoverssm_rs._core", frozen)]
pub struct GroupPlanner {
    inner: Arc<CoreGroupPlanner>,
    _keepalive: Py<PyAny>,
}

#[pymethods]
impl GroupPlanner {
    /// `states[group][layer]`: `(data_ptr, dtype, shape, byte_strides, device, writable, requires_grad)` per
    /// persistent state tensor of that layer; `keepalive` owns the tensors.
    #[new]
    fn new(
        py: Python<'_>,
        layouts: Vec<PyRef<'_, Layout>>,
        states: Vec<Vec<Vec<DescTuple<'_>>>>,
        keepalive: Py<PyAny>,
        block_size: i64,
        num_spec_blocks: i64,
    ) -> PyResult<Self> {
        if layouts.len() != states.len() {
            return Err(to_py(py, Error::binding(format!("one layout per group: {} layouts, {} groups of states", layouts.len(), states.len()))));
        }
        let mut planners = Vec::with_capacity(layouts.len());
        for (g, (layout, group)) in layouts.iter().zip(&states).enumerate() {
            let core = layout.core();
            let mut descs = Vec::with_capacity(group.len());
            for (li, layer) in group.iter().enumerate() {
                let mut l = Vec::with_capacity(layer.len());
                for (si, t) in layer.iter().enumerate() {
                    l.push(tensor_desc(py, t, || {
                        let name = core.states().get(si).map(|s| s.name.as_str()).unwrap_or("?");
                        format!("group {g} ({}): layer {li}, state {si} ('{name}')", core.backend())
                    })?);
                }
                descs.push(l);
            }
            let binding = Binding::new(core, &descs).map_err(|e| Error::binding(format!("group {g}: {}", e.message))).py_err(py)?;
            planners.push(CorePlanner::new(binding));
        }
        let cfg = StepConfig { block_size, num_spec_blocks };
        Ok(GroupPlanner { inner: Arc::new(CoreGroupPlanner::new(planners, cfg).py_err(py)?), _keepalive: keepalive })
    }

    #[getter]
    fn num_groups(&self) -> usize {
        self.inner.groups().len()
    }
    #[getter]
    fn block_size(&self) -> i64 {
        self.inner.config().block_size
    }
    #[getter]
    fn num_spec_blocks(&self) -> i64 {
        self.inner.config().num_spec_blocks
    }
    #[getter]
    fn device(&self) -> String {
        self.inner.groups()[0].binding().device().to_string()
    }
    /// Per group: `(layers, blocks)`.
    fn group_sizes(&self) -> Vec<(usize, u64)> {
        self.inner.groups().iter().map(|p| (p.binding().num_layers(), p.binding().num_blocks())).collect()
    }
    fn layouts(&self) -> Vec<Layout> {
        self.inner.groups().iter().map(|p| Layout { inner: p.binding().layout().clone() }).collect()
    }
    /// The fused kernel's state metas of every group, each naming its group.
    fn state_meta(&self, py: Python<'_>) -> PyResult<RawBuffer> {
        Ok(RawBuffer::state_meta(self.inner.state_meta().py_err(py)?))
    }
    /// The largest pool of any group.
    #[getter]
    fn max_blocks(&self) -> u64 {
        self.inner.max_blocks()
    }

    /// Plans explicit moves in every group under `semantics` (`"pre_copy"` or `"post_process"`).
    fn plan(
        slf: Bound<'_, Self>,
        block_tables: &Bound<'_, PyList>,
        src_col: &Bound<'_, PyAny>,
        dst_col: &Bound<'_, PyAny>,
        num_accepted: &Bound<'_, PyAny>,
        semantics: &str,
    ) -> PyResult<GroupPlan> {
        let py = slf.py();
        let sem = Semantics::parse(semantics).py_err(py)?;
        let t = tables(py, block_tables)?;
        let (s, d, a) = (vec_i64(py, src_col, "src_col")?, vec_i64(py, dst_col, "dst_col")?, vec_i64(py, num_accepted, "num_accepted")?);
        let p = Arc::clone(&slf.get().inner);
        let plan = py.detach(move || p.plan(&views(&t), &s, &d, &a, sem)).py_err(py)?;
        Ok(GroupPlan { inner: plan, _planner: slf.unbind() })
    }

    /// The pre-copy decision (bytes, as `align_pre_copy`) and its plan.
    #[pyo3(signature = (block_tables, num_computed, num_scheduled, num_accepted, running_col, fresh = None, req_ids = None))]
    #[allow(clippy::too_many_arguments)]
    fn pre_copy<'py>(
        slf: Bound<'py, Self>,
        block_tables: &Bound<'py, PyList>,
        num_computed: &Bound<'py, PyAny>,
        num_scheduled: &Bound<'py, PyAny>,
        num_accepted: &Bound<'py, PyAny>,
        running_col: &Bound<'py, PyAny>,
        fresh: Option<&Bound<'py, PyAny>>,
        req_ids: Option<&'py Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, PyBytes>, GroupPlan)> {
        let py = slf.py();
        let t = tables(py, block_tables)?;
        let (c, n, a, r) = (
            vec_i64(py, num_computed, "num_computed")?,
            vec_i64(py, num_scheduled, "num_scheduled")?,
            vec_i64(py, num_accepted, "num_accepted")?,
            vec_i64(py, running_col, "running_col")?,
        );
        let f = fresh_mask(py, fresh)?;
        let inp = PreInputs { num_computed: &c, num_scheduled: &n, num_accepted: &a, running_col: &r, fresh: f.as_deref() };
        let tv = views(&t);
        // The decision needs the request names only on error (under the GIL); the plan is built
        // without it.
        let d = engine_step::pre_copy(&inp, &tv, &slf.get().inner.config(), &namer(req_ids)).py_err(py)?;
        let accepted: Vec<i64> = d.bias.iter().map(|b| b + 1).collect();
        let p = Arc::clone(&slf.get().inner);
        let plan = py.detach(|| p.plan(&tv, &d.src_col, &d.curr, &accepted, Semantics::PreCopy)).py_err(py)?;
        Ok((pre_bytes(py, &d), GroupPlan { inner: plan, _planner: slf.unbind() }))
    }

    /// The post-process decision (bytes, as `align_post_process`) and its plan.
    #[pyo3(signature = (block_tables, state_col, num_computed, num_scheduled, num_draft, num_accepted, req_ids = None))]
    #[allow(clippy::too_many_arguments)]
    fn post_process<'py>(
        slf: Bound<'py, Self>,
        block_tables: &Bound<'py, PyList>,
        state_col: &Bound<'py, PyAny>,
        num_computed: &Bound<'py, PyAny>,
        num_scheduled: &Bound<'py, PyAny>,
        num_draft: &Bound<'py, PyAny>,
        num_accepted: &Bound<'py, PyAny>,
        req_ids: Option<&'py Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, PyBytes>, GroupPlan)> {
        let py = slf.py();
        let t = tables(py, block_tables)?;
        let (s, c, n, dr, a) = (
            vec_i64(py, state_col, "state_col")?,
            vec_i64(py, num_computed, "num_computed")?,
            vec_i64(py, num_scheduled, "num_scheduled")?,
            vec_i64(py, num_draft, "num_draft")?,
            vec_i64(py, num_accepted, "num_accepted")?,
        );
        let inp = PostInputs { state_col: &s, num_computed: &c, num_scheduled: &n, num_draft: &dr, num_accepted: &a };
        let tv = views(&t);
        let d = engine_step::post_process(&inp, &tv, &slf.get().inner.config(), &namer(req_ids)).py_err(py)?;
        let accepted: Vec<i64> = d.bias.iter().map(|b| b + 1).collect();
        let p = Arc::clone(&slf.get().inner);
        let plan = py.detach(|| p.plan(&tv, &d.src_col, &d.dest, &accepted, Semantics::PostProcess)).py_err(py)?;
        Ok((post_bytes(py, &d), GroupPlan { inner: plan, _planner: slf.unbind() }))
    }

    /// The host half of a device pre-copy (`device_step::stage_pre_copy`): int64 rows `prev,
    /// curr, src_col` as bytes, the int32 staged step as bytes, and the staged table's shape
    /// (`(0, R, 0)` when `stage_table` is false: the engine's device tables are used).
    #[pyo3(signature = (block_tables, num_computed, num_scheduled, running_col, fresh = None, req_ids = None, num_accepted = None, stage_table = true))]
    #[allow(clippy::too_many_arguments)]
    fn device_pre_copy<'py>(
        &self,
        py: Python<'py>,
        block_tables: &Bound<'py, PyList>,
        num_computed: &Bound<'py, PyAny>,
        num_scheduled: &Bound<'py, PyAny>,
        running_col: &Bound<'py, PyAny>,
        fresh: Option<&Bound<'py, PyAny>>,
        req_ids: Option<&'py Bound<'py, PyAny>>,
        num_accepted: Option<&Bound<'py, PyAny>>,
        stage_table: bool,
    ) -> PyResult<StagedPre<'py>> {
        let t = tables(py, block_tables)?;
        let (c, n, r) =
            (vec_i64(py, num_computed, "num_computed")?, vec_i64(py, num_scheduled, "num_scheduled")?, vec_i64(py, running_col, "running_col")?);
        let f = fresh_mask(py, fresh)?;
        let a = num_accepted.map(|a| vec_i64(py, a, "num_accepted")).transpose()?;
        let inp = PreInputs { num_computed: &c, num_scheduled: &n, num_accepted: a.as_deref().unwrap_or(&[]), running_col: &r, fresh: f.as_deref() };
        let from = if stage_table { Tables::Staged } else { Tables::OnDevice };
        let (d, st) = device_step::stage_pre_copy(&inp, a.is_some(), &views(&t), &self.inner.config(), &namer(req_ids), from).py_err(py)?;
        Ok((rows_bytes(py, &[&d.prev, &d.curr, &d.src_col]), staged_bytes(py, &st), (st.groups, st.rows, st.cols)))
    }

    /// The host half of a device post-process (`device_step::stage_post_process`): int64
    /// `running` as bytes, the int32 staged step as bytes, and the staged table's shape.
    #[pyo3(signature = (block_tables, state_col, num_computed, num_scheduled, num_draft, req_ids = None, num_accepted = None, stage_table = true))]
    #[allow(clippy::too_many_arguments)]
    fn device_post_process<'py>(
        &self,
        py: Python<'py>,
        block_tables: &Bound<'py, PyList>,
        state_col: &Bound<'py, PyAny>,
        num_computed: &Bound<'py, PyAny>,
        num_scheduled: &Bound<'py, PyAny>,
        num_draft: &Bound<'py, PyAny>,
        req_ids: Option<&'py Bound<'py, PyAny>>,
        num_accepted: Option<&Bound<'py, PyAny>>,
        stage_table: bool,
    ) -> PyResult<StagedPre<'py>> {
        let t = tables(py, block_tables)?;
        let (s, c, n, dr) = (
            vec_i64(py, state_col, "state_col")?,
            vec_i64(py, num_computed, "num_computed")?,
            vec_i64(py, num_scheduled, "num_scheduled")?,
            vec_i64(py, num_draft, "num_draft")?,
        );
        let a = num_accepted.map(|a| vec_i64(py, a, "num_accepted")).transpose()?;
        let inp = PostInputs { state_col: &s, num_computed: &c, num_scheduled: &n, num_draft: &dr, num_accepted: a.as_deref().unwrap_or(&[]) };
        let from = if stage_table { Tables::Staged } else { Tables::OnDevice };
        let (running, st) = device_step::stage_post_process(&inp, a.is_some(), &views(&t), &self.inner.config(), &namer(req_ids), from).py_err(py)?;
        Ok((rows_bytes(py, &[&running]), staged_bytes(py, &st), (st.groups, st.rows, st.cols)))
    }
}

/// One step's copies over every group. Holds its planner (and so the state tensors) alive.
#[pyclass(module = "recoverssm_rs._core", frozen)]
pub struct GroupPlan {
    inner: CoreGroupPlan,
    _planner: Py<GroupPlanner>,
}

#[pymethods]
impl GroupPlan {
    #[getter]
    fn num_copies(&self) -> u64 {
        self.inner.num_copies()
    }
    #[getter]
    fn nbytes(&self) -> u64 {
        self.inner.bytes()
    }
    #[getter]
    fn num_segments(&self) -> usize {
        self.inner.num_segments()
    }
    /// Per group: `(copies, segments, waves, bytes)`.
    fn group_stats(&self) -> Vec<(u64, usize, usize, u64)> {
        self.inner.plans().iter().map(|p| (p.num_copies(), p.segments().len(), p.num_waves(), p.bytes())).collect()
    }
    /// Runs every group's copies over CPU tensors (GIL released); checked whole first.
    fn execute_host(&self, py: Python<'_>) -> PyResult<()> {
        let plan = &self.inner;
        py.detach(|| plan.execute_host()).py_err(py)
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<GroupPlanner>()?;
    m.add_class::<GroupPlan>()?;
    m.add_function(wrap_pyfunction!(align_pre_copy, m)?)?;
    m.add_function(wrap_pyfunction!(align_post_process, m)?)?;
    Ok(())
}
