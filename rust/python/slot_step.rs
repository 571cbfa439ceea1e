//! `VllmSlotStep`: the half-steps of vLLM's GPU-resident runner (`crate::vllm::slot_step`), one
//! launch each. The constructor checks the adapter's buffers and group ids once; each half-step
//! converts the runner's tensors, checks them in the core and returns the launch (and, when a
//! group's table moved, the table records to upload first).

use super::commit::PyCommitLaunch;
use super::conversion::{arg_error, args, instance, items, kwargs, Arg, Ints, Table, Tensor};
use super::guard::Guard;
use super::launch::KernelLaunch;
use super::planner::Planner;
use crate::error::{Error, ErrorKind};
use crate::tensor::TensorDesc;
use crate::vllm::slot_commit::{plan_stage, CacheShape, SlotCommitInputs};
use crate::vllm::slot_step::{
    buffer_specs, check_block_size, check_group_ids, new_request, step_word, Commit, HalfOrder, Sampled, SlotBuffers, SlotStep, TableRef,
};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyInt};
use std::cell::Cell;
use std::sync::Mutex;

kwargs! {
    /// The adapter's group ids and slots.
    pub(crate) struct SlotStepArgs (Plan) {
        group_ids: Ints,
        num_slots: i64,
    }
}

kwargs! {
    /// The adapter's buffers, bound by the step (a buffer the core cannot use, or whose storage no
    /// longer holds it, is a `BindingError` naming it).
    pub(crate) struct SlotBufferArgs (Binding) {
        state_idx: Tensor,
        num_accepted: Tensor,
        scratch: Tensor,
        ctl: Tensor,
        err: Tensor,
        tables: Tensor,
        commit: Tensor,
    }
}

kwargs! {
    /// One step's RecoverSSM commit (host values) and its cache's shape.
    pub(crate) struct StageArgs (Plan) {
        request_indices: Ints,
        state_blocks: Ints,
        num_computed_tokens: Ints,
        block_table: Table,
        query_lens: Option<Ints>,
        window: u32,
        num_blocks: u64,
        max_requests: u64,
        generation: i32,
    }
}

/// The commit staged for the next post-process: its request rows, table width, and with its kernel
/// the cache's bound tensors (checked before the launch is built, marked written after).
struct Staged {
    request_rows: u64,
    cols: i32,
    kernel: Option<(Py<PyCommitLaunch>, Py<PyAny>)>,
    /// Without a kernel: the caller's commit, `reference(num_sampled)`, run inside the
    /// post-process's guarded write, before its launch.
    reference: Option<Py<PyAny>>,
}

/// The half-steps of one `ModelStateV2` as launches of `rs_state_copy_slots`.
#[pyclass(module = "recoverssm_rs._core", frozen)]
pub struct VllmSlotStep {
    planner: Py<Planner>,
    inner: SlotStep,
    /// The adapter's buffers, held and checked before every launch: the kernel writes them at the
    /// addresses `inner` was built with, so one resized (`state_idx.resize_()`: the views the
    /// adapter hands to the engine share the buffers' storages), re-pointed or freed since is
    /// refused.
    buffers: Guard,
    /// The KV-cache group id of each planner group.
    #[pyo3(get)]
    group_ids: Vec<usize>,
    /// `block_tables[g]` for each group id, as errors name the tables (made once).
    table_names: Vec<String>,
    /// The table records the buffer holds now (what the last step returned).
    uploaded: Mutex<Vec<TableRef>>,
    /// The RecoverSSM commit staged for the next post-process.
    staged: Mutex<Option<Staged>>,
    /// Which half may run next (a post-process needs a pre-copy of its own).
    order: Mutex<HalfOrder>,
}

/// `VllmSlotStep.buffers`' answer: the group ids, the slots, the block size, each buffer's
/// `(fill, elements, int64)`.
type BufferSizes = (Vec<usize>, usize, i64, Vec<(i64, u64, bool)>);

/// A launch and, when the tables moved, their records to upload before it.
type HalfStep<'py> = (Py<KernelLaunch>, Option<Bound<'py, PyBytes>>);

impl VllmSlotStep {
    fn take_staged(&self) -> PyResult<Option<Staged>> {
        Ok(self.staged.lock().map_err(|_| Error::plan("the staged commit's lock is poisoned"))?.take())
    }

    fn uploaded(&self) -> PyResult<std::sync::MutexGuard<'_, Vec<TableRef>>> {
        Ok(self.uploaded.lock().map_err(|_| Error::plan("the table records' lock is poisoned"))?)
    }

    fn order(&self) -> PyResult<std::sync::MutexGuard<'_, HalfOrder>> {
        Ok(self.order.lock().map_err(|_| Error::plan("the half-step order's lock is poisoned"))?)
    }

    fn put_staged(&self, staged: Option<Staged>) -> PyResult<()> {
        *self.staged.lock().map_err(|_| Error::plan("the staged commit's lock is poisoned"))? = staged;
        Ok(())
    }

    /// The groups' tables, `block_tables[g]` for each group id `g` (a sequence or a mapping),
    /// each through the caller's `launch_arg` hook (see [`runner_tensor`]).
    fn tables(&self, block_tables: &Bound<'_, PyAny>, launch_arg: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<TensorDesc>> {
        self.group_ids
            .iter()
            .zip(&self.table_names)
            .map(|(&g, name)| {
                let t =
                    block_tables.get_item(g).map_err(|_| arg_error(ErrorKind::Plan, format!("block_tables has no table for KV-cache group {g}")))?;
                runner_tensor(&t, name, launch_arg)
            })
            .collect()
    }

    /// One guarded write: checks the guard and the tables, builds the launch with `f`, and with
    /// `run` calls `reference(num_sampled)` (a staged host commit, when given) and then
    /// `run(launch, table records or None)` (the upload, the launch) before the states are
    /// recorded as written. Returns the launch and the table records when they differ from the
    /// uploaded ones.
    #[allow(clippy::too_many_arguments)]
    fn half<'py>(
        &self,
        py: Python<'py>,
        block_tables: &Bound<'_, PyAny>,
        launch_arg: Option<&Bound<'_, PyAny>>,
        run: Option<&Bound<'_, PyAny>>,
        reference: Option<(&Py<PyAny>, &Bound<'_, PyAny>, &Cell<bool>)>,
        f: impl FnOnce(&SlotStep, i32) -> crate::error::Result<crate::kernels::Launch>,
    ) -> PyResult<HalfStep<'py>> {
        let tables = self.tables(block_tables, launch_arg)?;
        let planner = self.planner.get();
        planner.write(py, || {
            self.buffers.check(py)?;
            let (refs, cols) = self.inner.table_refs(&tables)?;
            let launch = Py::new(py, KernelLaunch::new(f(&self.inner, cols)?))?;
            let changed = *self.uploaded()? != refs;
            let records = changed.then(|| PyBytes::new(py, &TableRef::bytes(&refs)));
            if let Some(run) = run {
                if let Some((reference, num_sampled, ran)) = reference {
                    reference.bind(py).call1((num_sampled,))?; // the caller's own counts
                    ran.set(true); // written: not run again, whatever follows
                }
                run.call1((launch.clone_ref(py), records.clone()))?;
            }
            // Recorded once uploaded: with `run`, after it returned (a refused reference commit or
            // a failed upload leaves the records to be sent again by the next half-step); without,
            // the caller uploads the records it is given.
            if changed {
                *self.uploaded()? = refs;
            }
            Ok((launch, records))
        })
    }
}

/// A runner tensor described by the core: `launch_arg(obj)` when the caller passes its
/// launch-argument hook (`CudaOps.launch_arg`, which checks off a GPU replace), else `obj`.
fn runner_tensor(obj: &Bound<'_, PyAny>, name: &str, launch_arg: Option<&Bound<'_, PyAny>>) -> PyResult<TensorDesc> {
    Ok(match launch_arg {
        Some(hook) => Tensor::arg(&hook.call1((obj,))?, name, ErrorKind::Plan)?.0,
        None => Tensor::arg(obj, name, ErrorKind::Plan)?.0,
    })
}

#[pymethods]
impl VllmSlotStep {
    /// `planner`: the groups' planner, its device path prepared (`bind_device`); the buffers as
    /// `ModelStateV2` owns them (see `crate::vllm::slot_step::SlotBuffers`).
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (
        planner: "Planner", *, group_ids: "_IntArray", num_slots: "int", state_idx: "_Tensor", num_accepted: "_Tensor", scratch: "_Tensor",
        ctl: "_Tensor", err: "_Tensor", tables: "_Tensor", commit: "_Tensor",
    ))]
    fn new(
        py: Python<'_>,
        planner: &Bound<'_, Planner>,
        group_ids: Option<&Bound<'_, PyAny>>,
        num_slots: Option<&Bound<'_, PyAny>>,
        state_idx: Option<&Bound<'_, PyAny>>,
        num_accepted: Option<&Bound<'_, PyAny>>,
        scratch: Option<&Bound<'_, PyAny>>,
        ctl: Option<&Bound<'_, PyAny>>,
        err: Option<&Bound<'_, PyAny>>,
        tables: Option<&Bound<'_, PyAny>>,
        commit: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let a = args!(SlotStepArgs { group_ids, num_slots })?;
        let bufs = args!(SlotBufferArgs { state_idx, num_accepted, scratch, ctl, err, tables, commit })?;
        let p = planner.get();
        let group_ids = check_group_ids(&a.group_ids.0, p.inner.num_groups())?;
        let fused = p.fused()?.clone();
        let block_size = p.block_size()?;
        let b = SlotBuffers {
            state_idx: &bufs.state_idx.0,
            num_accepted: &bufs.num_accepted.0,
            scratch: &bufs.scratch.0,
            ctl: &bufs.ctl.0,
            err: &bufs.err.0,
            tables: &bufs.tables.0,
            commit: &bufs.commit.0,
        };
        let inner = SlotStep::new(fused, block_size, a.num_slots, &b)?;
        let named = [
            (state_idx, "state_idx"),
            (num_accepted, "num_accepted"),
            (scratch, "scratch"),
            (ctl, "ctl"),
            (err, "err"),
            (tables, "tables"),
            (commit, "commit stage"),
        ];
        // Each buffer's storage holds it (checked as it was described): the guard keeps it so.
        let held: Vec<_> = named.iter().filter_map(|(t, n)| t.map(|t| (t.clone(), format!("ModelStateV2's {n} buffer")))).collect();
        let buffers = Guard::new(py, &held)?;
        let (uploaded, staged) = (Mutex::new(Vec::new()), Mutex::new(None));
        let table_names = group_ids.iter().map(|g| format!("block_tables[{g}]")).collect();
        let order = Mutex::new(HalfOrder::default());
        Ok(VllmSlotStep { planner: planner.clone().unbind(), inner, buffers, group_ids, table_names, uploaded, staged, order })
    }

    /// The error buffer's int32 elements: the pre-copy's two words, the post-process's, the stamp
    /// of the last pre-copy.
    #[classattr]
    const ERR_WORDS: u64 = crate::vllm::slot_step::ERR_WORDS;

    /// The control buffer's int32 elements: the stamp, the commit generations.
    #[classattr]
    const CTL_WORDS: u64 = crate::vllm::slot_step::CTL_WORDS;

    /// Checks `ModelStateV2`'s arguments against `planner` (made with a `block_size` the kernel
    /// takes, `1 ..= 2**31 - 1`; one KV-cache group id per group, each `>= 0`, none twice;
    /// `max_num_reqs` in `1 ..= 2**24`) and sizes its buffers: `(group ids, max_num_reqs,
    /// block_size, buffers)`, each buffer `(fill, elements, int64)` in the constructor's order
    /// (`state_idx`, `num_accepted`, `scratch`, `ctl`, `err`, `tables`, `commit`).
    #[staticmethod]
    #[pyo3(signature = (planner: "Planner", group_ids: "Sequence[int]", max_num_reqs: "int") -> "tuple[list[int], int, int, list[tuple[int, int, bool]]]")]
    fn buffers(planner: &Bound<'_, PyAny>, group_ids: &Bound<'_, PyAny>, max_num_reqs: &Bound<'_, PyAny>) -> PyResult<BufferSizes> {
        let planner = instance::<Planner>(planner, "planner", ErrorKind::Binding, "Planner")?;
        let p = planner.get();
        let block_size = check_block_size(p.block_size()?)?;
        let ids = items(group_ids, "group_ids", ErrorKind::Plan, "integers")?
            .iter()
            .enumerate()
            .map(|(i, x)| i64::arg(x, &format!("group_ids[{i}]"), ErrorKind::Plan))
            .collect::<PyResult<Vec<i64>>>()?;
        let ids = check_group_ids(&ids, p.inner.num_groups())?;
        let slots = crate::vllm::slots::check_capacity(i64::arg(max_num_reqs, "max_num_reqs", ErrorKind::Plan)?)?;
        let specs = buffer_specs(slots as u64, ids.len()).iter().map(|b| (b.fill, b.len, b.int64)).collect();
        Ok((ids, slots, block_size.into(), specs))
    }

    /// `ModelStateV2.add_request`'s slot and the running column it seeds
    /// (`crate::vllm::slot_step::new_request`), for `num_slots` slots of `block_size` tokens.
    #[staticmethod]
    #[pyo3(signature = (slot: "int", num_computed_tokens: "int", num_slots: "int", block_size: "int") -> "tuple[int, int]")]
    fn new_request(slot: &Bound<'_, PyAny>, num_computed_tokens: &Bound<'_, PyAny>, num_slots: u64, block_size: i64) -> PyResult<(usize, i64)> {
        let kind = ErrorKind::Plan;
        let s = crate::commit::plan::check_index("slot", i64::arg(slot, "slot", kind)?, num_slots)?;
        let nct = i64::arg(num_computed_tokens, &format!("request index {s}: num_computed_tokens"), kind)?;
        Ok(new_request(s as i64, nct, num_slots, block_size)?)
    }

    /// The step's error word `[bits, first, last]` (`crate::vllm::slot_step::step_word`) from a
    /// host copy of the error buffer.
    #[staticmethod]
    #[pyo3(signature = (words: "Sequence[int]") -> "list[int]")]
    fn step_word(words: &Bound<'_, PyAny>) -> PyResult<[i64; 3]> {
        Ok(step_word(&Ints::arg(words, "words", ErrorKind::Plan)?.0)?)
    }

    /// The pre-copy over the groups' `block_tables` and the runner's `idx_mapping`,
    /// `num_computed_tokens`, `query_start_loc` (positional: no keyword dict per step):
    /// `(launch, table records or None)`. With `run`, one guarded write: after every check
    /// `run(launch, table records or None)` queues the upload and the launch, and the states are
    /// recorded as written, in this call. `launch_arg`: the adapter's launch-argument hook
    /// (`CudaOps.launch_arg`), applied here to each runner tensor (the tables of the groups only)
    /// before it is described.
    #[pyo3(signature = (
        block_tables: "Sequence[_Tensor] | Mapping[int, _Tensor]", idx_mapping: "_Tensor", num_computed_tokens: "_Tensor", query_start_loc: "_Tensor",
        run: "Callable[[KernelLaunch, bytes | None], object] | None" = None, launch_arg: "Callable[[_Tensor], _Tensor] | None" = None,
    ) -> "tuple[KernelLaunch, bytes | None]")]
    #[allow(clippy::too_many_arguments)]
    fn pre<'py>(
        &self,
        py: Python<'py>,
        block_tables: &Bound<'_, PyAny>,
        idx_mapping: &Bound<'_, PyAny>,
        num_computed_tokens: &Bound<'_, PyAny>,
        query_start_loc: &Bound<'_, PyAny>,
        run: Option<&Bound<'_, PyAny>>,
        launch_arg: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<HalfStep<'py>> {
        let idx = runner_tensor(idx_mapping, "idx_mapping", launch_arg)?;
        let nct = runner_tensor(num_computed_tokens, "num_computed_tokens", launch_arg)?;
        let qsl = runner_tensor(query_start_loc, "query_start_loc", launch_arg)?;
        let out = self.half(py, block_tables, launch_arg, run, None, |s, cols| s.pre(cols, &idx, &nct, &qsl))?;
        self.order()?.pre_ran();
        Ok(out)
    }

    /// Plans one step's RecoverSSM commit (keywords: `request_indices`, `state_blocks`,
    /// `num_computed_tokens` per request row, `block_table`, `query_lens`, the cache's `window`,
    /// `num_blocks`, `max_requests`, and the stage's `generation`) for the next post-process; `kernel`: the cache's commit
    /// kernel, which then runs inside that post-process's launch (`None`: the commit runs before
    /// it, the launch sets the committed rows' columns and counts) and `bound` the cache's
    /// `BoundTensors`; `reference`: without a kernel, the caller's host commit, kept with the stage
    /// and called by the post-process as `reference(num_sampled)` inside its guarded write, before
    /// its `run`.
    /// Returns the bytes to copy into the front of the stage buffer;
    /// nothing is staged when the core refuses the commit.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (
        kernel: "tuple[CommitLaunch, BoundTensors] | None" = None, reference: "Callable[[_Tensor], object] | None" = None, *,
        request_indices: "_IntArray", state_blocks: "_IntArray", num_computed_tokens: "_IntArray", block_table: "_IntArray",
        query_lens: "_IntArray | None" = None, window: "int", num_blocks: "int", max_requests: "int", generation: "int",
    ) -> "bytes")]
    fn stage_commit<'py>(
        &self,
        py: Python<'py>,
        kernel: Option<(Bound<'_, PyCommitLaunch>, Bound<'_, PyAny>)>,
        reference: Option<Bound<'_, PyAny>>,
        request_indices: Option<&Bound<'_, PyAny>>,
        state_blocks: Option<&Bound<'_, PyAny>>,
        num_computed_tokens: Option<&Bound<'_, PyAny>>,
        block_table: Option<&Bound<'_, PyAny>>,
        query_lens: Option<&Bound<'_, PyAny>>,
        window: Option<&Bound<'_, PyAny>>,
        num_blocks: Option<&Bound<'_, PyAny>>,
        max_requests: Option<&Bound<'_, PyAny>>,
        generation: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let a = args!(StageArgs {
            request_indices,
            state_blocks,
            num_computed_tokens,
            block_table,
            query_lens,
            window,
            num_blocks,
            max_requests,
            generation
        })?;
        let inputs = SlotCommitInputs {
            request_indices: &a.request_indices.0,
            state_blocks: &a.state_blocks.0,
            computed: &a.num_computed_tokens.0,
            block_table: &a.block_table.ids,
            cols: a.block_table.cols,
            query_lens: a.query_lens.as_ref().map(|q| &q.0[..]),
        };
        let cache = CacheShape { window: a.window, num_blocks: a.num_blocks, max_requests: a.max_requests };
        let block_size = self.planner.get().block_size()? as u64;
        let st = plan_stage(&inputs, self.inner.slots(), block_size, cache, a.generation)?;
        let kernel = kernel.map(|(k, bound)| (k.unbind(), bound.unbind()));
        let reference = if kernel.is_none() { reference.map(Bound::unbind) } else { None };
        self.put_staged(Some(Staged { request_rows: st.request_rows, cols: st.cols, kernel, reference }))?;
        Ok(PyBytes::new(py, &st.bytes))
    }

    /// The post-process: `num_sampled` a tensor (one count per request row) or a Python int (one
    /// for every row); `num_computed_tokens` `None` (a pipeline-parallel rank that is not the
    /// last): no aligned save; `commit`: run the staged RecoverSSM commit (`stage_commit`).
    /// Refused without a pre-copy since the last post-process (one post-process per step), and
    /// before the first pre-copy unless it has no rows (a step's pre-copy runs before its
    /// post-process). A post-process the core builds forgets the staged commit (with `commit` or
    /// not); a refused one keeps it (a host commit that ran before a failed `run` is kept as run:
    /// the retry launches the stage without calling `reference` again). `(launch, table records or None)`; `run` and `launch_arg` as
    /// `pre`'s; with `run`, a commit staged without a kernel runs first as
    /// `reference(num_sampled)` (the caller's own `num_sampled`), inside the same guarded write.
    #[pyo3(signature = (
        idx_mapping: "_Tensor", num_sampled: "_Tensor | int", num_computed_tokens: "_Tensor | None", block_tables: "Sequence[_Tensor] | Mapping[int, _Tensor]",
        commit: "bool" = false, run: "Callable[[KernelLaunch, bytes | None], object] | None" = None,
        launch_arg: "Callable[[_Tensor], _Tensor] | None" = None,
    ) -> "tuple[KernelLaunch, bytes | None]")]
    #[allow(clippy::too_many_arguments)]
    fn post<'py>(
        &self,
        py: Python<'py>,
        idx_mapping: &Bound<'_, PyAny>,
        num_sampled: &Bound<'_, PyAny>,
        num_computed_tokens: &Bound<'_, PyAny>,
        block_tables: &Bound<'_, PyAny>,
        commit: bool,
        run: Option<&Bound<'_, PyAny>>,
        launch_arg: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<HalfStep<'py>> {
        let idx = runner_tensor(idx_mapping, "idx_mapping", launch_arg)?;
        self.order()?.check_post(idx.shape.first().copied().unwrap_or(0) as u64)?;
        let nct = if num_computed_tokens.is_none() { None } else { Some(runner_tensor(num_computed_tokens, "num_computed_tokens", launch_arg)?) };
        let all = num_sampled.is_instance_of::<PyInt>() && !num_sampled.is_instance_of::<PyBool>();
        let each = if all { None } else { Some(runner_tensor(num_sampled, "num_sampled", launch_arg)?) };
        let fill = if all { i64::arg(num_sampled, "num_sampled", ErrorKind::Plan)? } else { 0 };
        // Taken out of the lock (no lock is held across a Python call); put back when refused.
        let taken = self.take_staged()?;
        if commit && taken.is_none() {
            return Err(Error::plan(
                "no RecoverSSM commit is staged for this step (stage it when the step's metadata is built: ModelStateV2.stage_recoverssm)",
            )
            .into());
        }
        let ran = Cell::new(false);
        let result = (|| {
            let st = if commit { taken.as_ref() } else { None };
            let fused = st.and_then(|s| s.kernel.as_ref());
            if let Some((_, bound)) = fused {
                bound.bind(py).call_method0(intern!(py, "check"))?; // the cache's tensors, before its write
            }
            let kernel = fused.map(|(k, _)| k.get().core());
            let reference = st.and_then(|s| s.reference.as_ref()).map(|r| (r, num_sampled, &ran));
            let out = self.half(py, block_tables, launch_arg, run, reference, |s, cols| {
                let sampled = each.as_ref().map_or(Sampled::All(fill), Sampled::Each);
                s.post(cols, &idx, nct.as_ref(), sampled, st.map(|c| Commit { request_rows: c.request_rows, cols: c.cols, kernel }))
            })?;
            if let Some((_, bound)) = fused {
                bound.bind(py).call_method0(intern!(py, "mark_written"))?;
            }
            Ok(out)
        })();
        if result.is_err() {
            let mut taken = taken;
            if let Some(s) = taken.as_mut().filter(|_| ran.get()) {
                // The host commit wrote the cache before the launch failed: the retry of this step
                // launches the stage (the committed rows' columns and counts) without committing again.
                s.reference = None;
            }
            self.put_staged(taken)?; // refused: the stage stays for this step
        } else {
            self.order()?.post_ran();
        }
        // Launched (with or without it): a later post-process does not commit this stage again.
        result
    }

    /// Forgets the staged commit (the stage buffer is the caller's: e.g. after its copy failed).
    fn clear_commit(&self) -> PyResult<()> {
        self.take_staged().map(|_| ())
    }

    fn __repr__(&self) -> String {
        format!("VllmSlotStep(groups={:?}, slots={})", self.group_ids, self.inner.slots())
    }
}
