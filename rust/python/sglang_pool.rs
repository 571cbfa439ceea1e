//! An SGLang pool's tensors held by the core (`crate::sglang::pool`) for `recoverssm_rs.sglang`:
//! checked and guarded once when the adapter is built, with the objects the shell reads (each
//! group's layer views, the live states, their verify scratch). Every operation is one call here:
//! its arguments checked (slot ids, a load's host copies, the commit's vectors), then the guard,
//! then the write built, run and recorded. HiCache's host copy: `sglang_host_copy.rs`.

use super::conversion::{args, instance, items, kwargs, Arg, Tensor, TensorList};
use super::guard::Guard;
use super::launch::KernelLaunch;
use super::layout::Layout;
use super::planner::Planner;
use super::sglang::{check_held, host_ints, uploaded};
use crate::error::{Error, ErrorKind};
use crate::executor;
use crate::kernels::StepInputs;
use crate::layout::ConvLayout;
use crate::sglang;
use crate::sglang::host;
use crate::sglang::kernel::{self, SlotCall, SlotCopy, SlotPool};
use crate::sglang::pool::Pool;
use crate::sglang::Repeats;
use crate::tensor::{Device, TensorDesc};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use std::sync::{Arc, OnceLock};

kwargs! {
    /// The keyword arguments of `SglangPool`.
    pub(crate) struct PoolArgs(Binding) {
        conv: TensorList,
        temporal: Tensor,
        intermediate_ssm: Option<Tensor>,
        intermediate_conv_window: Option<TensorList>,
        conv_layout: String = "DS".to_string(),
    }
}

/// A slot table on the device: its buffer (kept alive, and checked before each launch that reads
/// it) and what a launch over it needs.
struct DeviceTable {
    buffer: Py<PyAny>,
    bytes: u64,
    metas: u64,
    num_meta: u32,
    max_bytes: u64,
    rows: i64,
    draft: i64,
}

/// The tensors of an SGLang pool, checked and guarded: SGLang's `mamba_cache.conv` (a list of
/// tensors), `temporal` and the optional verify scratch (`intermediate_ssm`, a list
/// `intermediate_conv_window`), every one a tensor, with one layer count and no two sharing
/// memory (`BindingError` naming them); `conv_layout` the conv windows' layout (`"DS"`, `"SD"`).
#[pyclass(module = "recoverssm_rs._core", frozen)]
pub struct SglangPool {
    pub(super) inner: Pool,
    guard: Guard,
    /// The objects of `inner.states` (every conv tensor, then the temporal state).
    states: Vec<Py<PyAny>>,
    /// The objects of the verify scratch (`intermediate_ssm`, then every `intermediate_conv_window`).
    scratch: Vec<Option<Py<PyAny>>>,
    pub(super) device: Device,
    /// The slot kernel's tables on the device: clearing, the commit.
    tables: [OnceLock<DeviceTable>; 2],
    /// `copy_from`'s constants on the device: int32 slot ids `0..num_slots`, then `num_slots`
    /// ones (the buffer kept alive, and checked before each launch that reads it; its description).
    copy_consts: OnceLock<(Py<PyAny>, TensorDesc)>,
}

impl SglangPool {
    /// The guard of the pool's tensors (also checked by the planner over their layers before each
    /// of its writes and launches).
    pub(crate) fn guard(&self) -> &Guard {
        &self.guard
    }

    pub(super) fn write<T>(&self, py: Python<'_>, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
        self.guard.check(py)?;
        let out = f()?;
        self.guard.mark_written(py)?;
        Ok(out)
    }

    /// Checks that `groups` (what a planner guarded by this pool binds) are the pool's own layer
    /// views ([`Pool::check_layer_views`]).
    pub(crate) fn check_layer_views(&self, groups: &[Vec<Vec<TensorDesc>>]) -> PyResult<()> {
        Ok(self.inner.check_layer_views(groups)?)
    }

    /// `planner` as the planner built over this pool's layers (`Planner(..., also_guard=pool)`):
    /// another planner's states are not the pool's (`PlanError` naming `op`).
    fn own_planner<'py>(slf: &Bound<'py, Self>, planner: &Bound<'py, PyAny>, op: &str) -> PyResult<Bound<'py, Planner>> {
        let planner = instance::<Planner>(planner, &format!("{op}: planner"), ErrorKind::Plan, "Planner")?;
        if !planner.get().guards_pool(slf) {
            return Err(Error::plan(format!("{op}: the planner is not this pool's (one built with also_guard=pool)")).into());
        }
        Ok(planner)
    }

    /// `ids`, the argument `arg` of `op`, as slots of the pool ([`sglang::check_slots`]).
    pub(super) fn slot_ids(&self, op: &str, arg: &str, ids: &Bound<'_, PyAny>, repeats: Repeats) -> PyResult<Vec<i64>> {
        let v = host_ints(ids, op, arg)?;
        sglang::check_slots(op, arg, &v, self.inner.num_slots, repeats)?;
        Ok(v)
    }
}

#[pymethods]
impl SglangPool {
    #[new]
    #[pyo3(signature = (
        *, conv: "Sequence[_Tensor]", temporal: "_Tensor", intermediate_ssm: "_Tensor | None" = None,
        intermediate_conv_window: "Sequence[_Tensor] | None" = None, conv_layout: "_ConvLayoutName" = None,
    ))]
    fn new(
        py: Python<'_>,
        conv: Option<&Bound<'_, PyAny>>,
        temporal: Option<&Bound<'_, PyAny>>,
        intermediate_ssm: Option<&Bound<'_, PyAny>>,
        intermediate_conv_window: Option<&Bound<'_, PyAny>>,
        conv_layout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        // Each list read once: the tensors described are the ones guarded and held (a generator, or
        // a sequence yielding other tensors when iterated again, would leave them apart).
        let kind = ErrorKind::Binding;
        fn listed<'py>(x: Option<&Bound<'py, PyAny>>, name: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
            let list = |x: &Bound<'py, PyAny>| Ok(PyList::new(x.py(), items(x, name, ErrorKind::Binding, "tensors")?)?.into_any());
            x.filter(|x| !x.is_none()).map(list).transpose()
        }
        let conv = listed(conv, "conv")?.or_else(|| conv.cloned());
        let intermediate_conv_window = listed(intermediate_conv_window, "intermediate_conv_window")?.or_else(|| intermediate_conv_window.cloned());
        let (conv, intermediate_conv_window) = (conv.as_ref(), intermediate_conv_window.as_ref());
        let a = args!(PoolArgs { conv, temporal, intermediate_ssm, intermediate_conv_window, conv_layout })?;
        let layout = ConvLayout::parse(&a.conv_layout).map_err(|e| Error::layout(format!("SglangMambaPool: {}", e.message)))?;
        let windows = a.intermediate_conv_window.map(|w| w.0);
        let inner = Pool::new(a.conv.0, a.temporal.0, a.intermediate_ssm.map(|t| t.0), windows, layout)?;
        // The guard: every tensor with the name its errors use (the objects converted above).
        let mut labelled: Vec<(Bound<'_, PyAny>, String)> = Vec::new();
        for (i, t) in items(conv.expect("converted"), "conv", kind, "tensors")?.into_iter().enumerate() {
            labelled.push((t, format!("conv[{i}]")));
        }
        labelled.push((temporal.expect("converted").clone(), "temporal".into()));
        let states = labelled.iter().map(|(t, _)| t.clone().unbind()).collect();
        let ssm = intermediate_ssm.filter(|t| !t.is_none());
        let mut scratch = vec![ssm.map(|t| t.clone().unbind())];
        if let Some(t) = ssm {
            labelled.push((t.clone(), "intermediate_ssm".into()));
        }
        if let Some(w) = intermediate_conv_window.filter(|w| !w.is_none()) {
            for (i, t) in items(w, "intermediate_conv_window", kind, "tensors")?.into_iter().enumerate() {
                scratch.push(Some(t.clone().unbind()));
                labelled.push((t, format!("intermediate_conv_window[{i}]")));
            }
        }
        let first = inner.live().first().copied().unwrap_or(inner.states.len() - 1);
        let device = Device::parse(&inner.states[first].device)?;
        let guard = Guard::new(py, &labelled)?;
        let tables = [OnceLock::new(), OnceLock::new()];
        Ok(SglangPool { guard, inner, states, scratch, device, tables, copy_consts: OnceLock::new() })
    }

    /// The planner's groups: one per conv tensor that holds bytes, the temporal state riding on
    /// the first; each one's layout and, per layer, the views of its tensors (`[conv[k][layer],
    /// temporal[layer]]` or `[conv[k][layer]]`).
    #[pyo3(signature = () -> "list[tuple[Layout, list[list[_Tensor]]]]")]
    #[allow(clippy::type_complexity)]
    fn layer_groups<'py>(&self, py: Python<'py>) -> PyResult<Vec<(Layout, Vec<Vec<Bound<'py, PyAny>>>)>> {
        let layers = self.inner.groups.first().map_or(0, |(_, ks)| self.inner.states[ks[0]].shape[0]); // one count (checked)
        let view = |k: usize, layer: i64| self.states[k].bind(py).get_item(layer);
        let per_layer = |ks: &[usize]| (0..layers).map(|i| ks.iter().map(|&k| view(k, i)).collect()).collect::<PyResult<Vec<Vec<_>>>>();
        self.inner.groups.iter().map(|(l, ks)| Ok((l.clone().into(), per_layer(ks)?))).collect()
    }

    /// The state tensors that hold bytes, in SGLang's order (every such conv tensor, then the
    /// temporal state).
    #[pyo3(signature = () -> "list[_Tensor]")]
    fn state_tensors<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, PyAny>> {
        self.inner.live().into_iter().map(|k| self.states[k].bind(py).clone()).collect()
    }

    /// Slots, the dummy slot 0 included (SGLang's `size + 1`).
    #[getter]
    fn num_slots(&self) -> u64 {
        self.inner.num_slots
    }

    /// Raises `BindingError` naming the first tensor of the pool that moved (re-pointed, its
    /// storage resized or freed).
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        self.guard.check(py)
    }

    /// One guarded write: the pool's tensors checked (`write` not called when one moved),
    /// `write()` run, the write recorded (autograd's version counters). Returns what `write` returns.
    #[pyo3(signature = (write: "Callable[[], _T]") -> "_T")]
    fn guarded(&self, py: Python<'_>, write: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.write(py, || Ok(write.call0()?.unbind()))
    }

    /// `(state, its verify scratch)` for every state tensor that holds bytes, the temporal state
    /// first (`PlanError` for a pool without the verify scratch).
    #[pyo3(signature = () -> "list[tuple[_Tensor, _Tensor]]")]
    fn verify_scratch<'py>(&self, py: Python<'py>) -> PyResult<Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>> {
        let scratch = |x: usize| self.scratch[x].as_ref().expect("verify_scratch pairs name present scratch").bind(py).clone();
        Ok(self.inner.verify_scratch()?.into_iter().map(|(k, x)| (self.states[k].bind(py).clone(), scratch(x))).collect())
    }

    /// The commit on host states, one guarded write run by the core: its moves, `(slot, row, step)`
    /// per request that writes, the commit pass then the track pass (with `track_slots`), after
    /// every index is checked (`PlanError` naming the argument by SGLang's name, or the request):
    /// `slots` (SGLang's `state_indices`), `steps` (`last_correct_step_indices`), `rows`
    /// (`src_indices`, default each request's own index), `track_slots` (`track_indices`) and
    /// `track_steps` (`steps_to_track`), as `slot_launch` takes them on CUDA; then the pool's
    /// tensors checked, each state's slots written from its verify scratch, the write recorded.
    #[pyo3(signature = (
        *, slots: "_IntArray", steps: "_IntArray", rows: "_IntArray | None" = None,
        track_slots: "_IntArray | None" = None, track_steps: "_IntArray | None" = None,
    ) -> "None")]
    fn commit(
        &self,
        py: Python<'_>,
        slots: &Bound<'_, PyAny>,
        steps: &Bound<'_, PyAny>,
        rows: Option<&Bound<'_, PyAny>>,
        track_slots: Option<&Bound<'_, PyAny>>,
        track_steps: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let op = "commit_after_verify";
        let ints = |x: Option<&Bound<'_, PyAny>>, arg: &str| x.filter(|x| !x.is_none()).map(|x| host_ints(x, op, arg)).transpose();
        let steps = host_ints(steps, op, "last_correct_step_indices")?;
        let slots = host_ints(slots, op, "state_indices")?;
        let rows = ints(rows, "src_indices")?;
        let track = (ints(track_slots, "track_indices")?, ints(track_steps, "steps_to_track")?);
        let moves = self.inner.commit_moves(&slots, &steps, rows.as_deref(), (track.0.as_deref(), track.1.as_deref()))?;
        let pairs = self.inner.verify_pairs()?;
        self.write(py, || Ok(host::commit(&pairs, &moves)?))
    }

    /// One guarded launch of the slot kernel, in one call: clear `slots` (`commit` false) or the
    /// commit (`steps`, optional `rows` and track pair), every vector checked by the core (int64,
    /// one length, on the pool's device; `err` an int32 error word of 3). The first launch of
    /// each use builds its records and hands them to `upload(bytes)`, which returns them on the
    /// device (contiguous uint8 of that size on the pool's device, held by its storage: a
    /// `PlanError` otherwise). Then: the pool's tensors checked, the uploaded records, the vectors
    /// and `err` (still held by their storage: `BindingError`, `PlanError`), `run(launch)`
    /// (`None`: nothing to launch), the write recorded.
    #[pyo3(signature = (
        run: "Callable[[KernelLaunch | None], object]", commit: "bool", upload: "Callable[[bytes], _Tensor]", *, slots: "_Tensor",
        steps: "_Tensor | None" = None, rows: "_Tensor | None" = None, track_slots: "_Tensor | None" = None,
        track_steps: "_Tensor | None" = None, err: "_Tensor",
    ) -> "None")]
    #[allow(clippy::too_many_arguments)]
    fn slot_launch(
        &self,
        py: Python<'_>,
        run: &Bound<'_, PyAny>,
        commit: &Bound<'_, PyAny>,
        upload: &Bound<'_, PyAny>,
        slots: Option<&Bound<'_, PyAny>>,
        steps: Option<&Bound<'_, PyAny>>,
        rows: Option<&Bound<'_, PyAny>>,
        track_slots: Option<&Bound<'_, PyAny>>,
        track_steps: Option<&Bound<'_, PyAny>>,
        err: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let commit = bool::arg(commit, "slot_launch: commit", ErrorKind::Plan)?;
        let op = if commit { "commit_after_verify" } else { "clear_slots" };
        let cell = &self.tables[usize::from(commit)];
        let table = match cell.get() {
            Some(t) => t,
            None => {
                let t = self.inner.slot_table(commit)?;
                let bytes: Vec<u8> = t.records.iter().flat_map(SlotCopy::to_le_bytes).collect();
                let buffer = upload.call1((PyBytes::new(py, &bytes),))?;
                let metas = uploaded(op, &buffer, &self.device, bytes.len() as u64, &self.inner.tensors())?.data_ptr;
                let num_meta = u32::try_from(t.records.len()).map_err(|_| Error::plan("too many slot records"))?;
                let max_bytes = t.records.iter().map(|r| r.bytes).max().unwrap_or(0);
                let (buffer, bytes) = (buffer.unbind(), bytes.len() as u64);
                let dt = DeviceTable { buffer, bytes, metas, num_meta, max_bytes, rows: t.rows, draft: t.draft };
                let _ = cell.set(dt);
                cell.get().expect("just set")
            }
        };
        // The vectors described under SGLang's names (each checked to lie inside its storage).
        let names = if commit {
            ["state_indices", "last_correct_step_indices", "src_indices", "track_indices", "steps_to_track"]
        } else {
            ["indices", "steps", "rows", "track_slots", "track_steps"]
        };
        let kind = ErrorKind::Plan;
        let vector =
            |obj: Option<&Bound<'_, PyAny>>, i: usize| obj.map(|t| Tensor::arg(t, &format!("{op}: {}", names[i]), kind).map(|t| t.0)).transpose();
        let slots = match vector(slots, 0)? {
            Some(t) => t,
            None => Tensor::absent(&format!("{op}: {}", names[0]), kind)?.0,
        };
        let (steps, rows, track_slots, track_steps) = (vector(steps, 1)?, vector(rows, 2)?, vector(track_slots, 3)?, vector(track_steps, 4)?);
        let err = match err {
            Some(e) => Tensor::arg(e, &format!("{op}: err"), kind)?.0,
            None => Tensor::absent(&format!("{op}: err"), kind)?.0,
        };
        self.write(py, || {
            let call = SlotCall {
                slots: &slots,
                steps: steps.as_ref(),
                rows: rows.as_ref(),
                track_slots: track_slots.as_ref(),
                track_steps: track_steps.as_ref(),
                err: &err,
                names: (op, names),
            };
            let pool = SlotPool {
                device: &self.device,
                metas: table.metas,
                num_meta: table.num_meta,
                max_bytes: table.max_bytes,
                num_slots: self.inner.num_slots as i64,
                num_rows: table.rows,
                draft: table.draft,
            };
            let launch = kernel::slot_launch(&pool, &call)?;
            // What the kernel reads (the records, uploaded once; the index vectors, int64 of one
            // length: checked) and writes (the error word), each held by its storage (the vectors and
            // the error word were checked as they were described).
            let records = format!("{op}: the slot records upload returned");
            check_held(table.buffer.bind(py), &records, table.metas, table.bytes, ErrorKind::Binding)?;
            sglang::checks::check_apart(&format!("{op}: err is"), &err, 12, &self.inner.tensors())?;
            run.call1((launch.map(KernelLaunch::new),))?;
            Ok(())
        })
    }

    /// What a transfer pool binds, per layer: `[conv[k][layer], temporal[layer]]`, `conv[k]` the
    /// conv tensor that holds bytes (`conv[0]` when none does), after checking that they cover the
    /// pool (`LayoutError` for several conv tensors holding bytes) and that the pool's tensors have
    /// not moved (`BindingError` naming the one that did: the views are of the memory bound).
    #[pyo3(signature = () -> "list[list[_Tensor]]")]
    fn transfer_layers<'py>(&self, py: Python<'py>) -> PyResult<Vec<Vec<Bound<'py, PyAny>>>> {
        self.inner.check_transfer()?;
        let temporal_k = self.states.len() - 1;
        if temporal_k == 0 {
            return Err(Error::layout("state_pool binds one conv tensor per layer; this pool has none").into());
        }
        self.guard.check(py)?;
        let k = self.inner.live().into_iter().find(|&k| k < temporal_k).unwrap_or(0);
        let (conv, temporal) = (self.states[k].bind(py), self.states[temporal_k].bind(py));
        let layers = self.inner.states[k].shape.first().copied().unwrap_or(0);
        (0..layers).map(|i| Ok(vec![conv.get_item(i)?, temporal.get_item(i)?])).collect()
    }

    /// `copy_from` on host states, one call: `src_indices` and `dst_indices` checked as slots of
    /// the pool (`PlanError` naming the argument), then `planner`'s (the planner built over the
    /// pool's layers, as for `copy_launch`) copy plan of them run by the
    /// host executor (the pool's tensors checked first; every copy checked before the first byte).
    #[pyo3(signature = (planner: "Planner", src_indices: "_IntArray", dst_indices: "_IntArray") -> "None")]
    fn copy_from(slf: &Bound<'_, Self>, planner: &Bound<'_, PyAny>, src_indices: &Bound<'_, PyAny>, dst_indices: &Bound<'_, PyAny>) -> PyResult<()> {
        let this = slf.get();
        let src = this.slot_ids("copy_from", "src_indices", src_indices, Repeats::Allowed)?;
        let dst = this.slot_ids("copy_from", "dst_indices", dst_indices, Repeats::Allowed)?;
        let planner = Self::own_planner(slf, planner, "copy_from")?;
        let (py, p) = (planner.py(), planner.get());
        let core = Arc::clone(&p.inner);
        let plan = py.detach(|| core.plan_copy(&src, &dst))?;
        // As `CopyPlan.execute_host`: the planner's guards (the pool's with them), then the host
        // executor with the GIL released, then the write recorded.
        p.write(py, || Ok(py.detach(move || executor::execute(&plan))?))
    }

    /// `copy_from` on CUDA, one guarded launch of the fused copy of `planner` (the planner built
    /// over the pool's layers, with `also_guard` the pool; another is a `PlanError`) in one call: the copy of
    /// slot `src_indices[i]` into `dst_indices[i]` in every layer, over a block table whose every
    /// row is the slot ids (each request's columns are its slots), with pre-copy semantics.
    /// `src_indices` and `dst_indices` are int32 vectors of one length on the pool's device
    /// (`PlanError` naming them; more copies than the pool has slots past the dummy slot 0 would
    /// write one slot twice). Only then `runner("copy_from")` (`Planner.launch_runner`: makes the
    /// planner's device path on first use) gives the `run(launch, requests)` of the launch, and the
    /// first call hands the slot ids and ones to `upload(bytes)`, which returns them on the device
    /// (checked as `slot_launch`'s records): a refused call prepares nothing. Then the guards,
    /// the uploaded constants and the slot ids (still held by their storage: `BindingError`,
    /// `PlanError`), `run`, the write recorded. The kernel
    /// checks each slot and skips a bad one (the planner's error word).
    #[pyo3(signature = (
        planner: "Planner", runner: "Callable[[str], Callable[[KernelLaunch | None, int], object]]", upload: "Callable[[bytes], _Tensor]",
        src_indices: "_Tensor", dst_indices: "_Tensor",
    ) -> "None")]
    fn copy_launch(
        slf: &Bound<'_, Self>,
        planner: &Bound<'_, PyAny>,
        runner: &Bound<'_, PyAny>,
        upload: &Bound<'_, PyAny>,
        src_indices: &Bound<'_, PyAny>,
        dst_indices: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let (py, this) = (slf.py(), slf.get());
        let planner = Self::own_planner(slf, planner, "copy_from")?;
        let (src, dst) = (
            Tensor::arg(src_indices, "copy_from: src_indices", ErrorKind::Plan)?.0,
            Tensor::arg(dst_indices, "copy_from: dst_indices", ErrorKind::Plan)?.0,
        );
        let n = sglang::checks::copy_count(&src, &dst, &this.device, this.inner.num_slots)?;
        if n == 0 {
            return Ok(());
        }
        // Checked: now the device path (`runner("copy_from")` makes it on first use) and the constants.
        let run = runner.call1(("copy_from",))?;
        let s = this.inner.num_slots as i64;
        let consts = match this.copy_consts.get() {
            Some((_, d)) => d,
            None => {
                let last =
                    i32::try_from(s).map_err(|_| Error::plan(format!("copy_from: the copy kernel reads int32 slot ids; the pool has {s} slots")))?;
                let words: Vec<i32> = (0..last).chain(std::iter::repeat(1).take(s as usize)).collect();
                let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                let buffer = upload.call1((PyBytes::new(py, &bytes),))?;
                let d = uploaded("copy_from", &buffer, &this.device, bytes.len() as u64, &this.inner.tensors())?;
                let _ = this.copy_consts.set((buffer.unbind(), d));
                &this.copy_consts.get().expect("just set").1
            }
        };
        // Every row the slot ids (stride 0 over requests and groups), then the ones.
        let p = planner.get();
        let groups = i64::from(p.fused()?.groups);
        let (shape, strides) = if groups == 1 { (vec![n, s], vec![0, 4]) } else { (vec![groups, n, s], vec![0, 0, 4]) };
        let table = TensorDesc::new(consts.data_ptr, "int32", shape, strides, &consts.device);
        let ones = TensorDesc::dense(consts.data_ptr + 4 * s as u64, "int32", &[n], &consts.device);
        let inputs =
            StepInputs { block_table: &table, src_col: &src, second: &dst, num_accepted: &ones, num_accepted_out: None, err: None, block_size: None };
        p.write(py, || {
            let launch = p.fused_launch(&inputs, true)?;
            // What the kernel reads, each held by its storage: the constants (uploaded once) and
            // the slot ids (int32 vectors of `n`: checked).
            let buffer = this.copy_consts.get().expect("set above").0.bind(py);
            check_held(buffer, "copy_from: the constants upload returned", consts.data_ptr, 8 * s as u64, ErrorKind::Binding)?;
            for (obj, d, name) in [(src_indices, &src, "src_indices"), (dst_indices, &dst, "dst_indices")] {
                check_held(obj, &format!("copy_from: {name}"), d.data_ptr, 4 * n as u64, ErrorKind::Plan)?;
            }
            run.call1((launch, n))?;
            Ok(())
        })
    }

    /// `clear_slots` on host states, one guarded write run by the core: the slots `indices`
    /// checked (slots of the pool other than the dummy slot 0; one may repeat), the pool's tensors
    /// checked, every state's slots zeroed, the write recorded.
    #[pyo3(signature = (indices: "_IntArray") -> "None")]
    fn clear_slots(&self, py: Python<'_>, indices: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = self.slot_ids("clear_slots", "indices", indices, Repeats::Allowed)?;
        let live: Vec<TensorDesc> = self.inner.live().into_iter().map(|k| self.inner.states[k].clone()).collect();
        self.write(py, || Ok(host::clear(&live, &ids)?))
    }

    /// HiCache's host copy `op` (`"get_cpu_copy"` or `"load_cpu_copy"`) of the slots `indices`, in
    /// one call: the slots checked (for a load none twice), then the pool's tensors (`BindingError`
    /// naming the one that moved), then a load's host copies `mamba_cache_cpu` (SGLang's
    /// `(conv_cpu, temporal_cpu)`, or a historical triple whose third element is ignored), each
    /// against its pool tensor as bound: on the host, the pool tensor's dtype, shape `[layers,
    /// len(indices), ...]` (`PlanError` naming the state), and held by its storage. A get lays its
    /// states out in one buffer (`alloc(n)` returns a writable, contiguous int32 vector of `n`
    /// elements on the pool's device, of its own and held by its storage: a `PlanError` naming the
    /// operation and the alloc otherwise, nothing run or written; a load on CUDA stages its copies
    /// in one too) and returns it
    /// with, per state tensor, its block `(offset, bytes, shape, dtype)` (the shape and dtype the
    /// pool tensor was bound with, whatever its Python object says now); a load returns `None`.
    ///
    /// Host states: the core gathers (get) or writes (load: every host copy read whole first) the
    /// slots itself. CUDA: the core stages the call (a load's host copies, the slot table, the index
    /// vectors) and hands `run(buffer, staged, at, launch, requests)` the bytes to copy into the
    /// buffer from int32 element `at` and the slot kernel's launch over `requests` slots reporting
    /// into `err` (`None`: nothing to launch). A load's write is recorded.
    #[pyo3(signature = (
        op: "str", indices: "_IntArray", *, alloc: "Callable[[int], _Tensor]",
        run: "Callable[[_Tensor, bytes, int, KernelLaunch | None, int], object] | None" = None, err: "_Tensor | None" = None,
        mamba_cache_cpu: "Sequence[Sequence[_Tensor] | _Tensor] | None" = None,
    ) -> "tuple[_Tensor, list[tuple[int, int, list[int], str]]] | None")]
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn host_copy<'py>(
        &self,
        py: Python<'py>,
        op: &Bound<'py, PyAny>,
        indices: &Bound<'py, PyAny>,
        alloc: &Bound<'py, PyAny>,
        run: Option<&Bound<'py, PyAny>>,
        err: Option<&Bound<'py, PyAny>>,
        mamba_cache_cpu: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<(Bound<'py, PyAny>, Vec<(u64, u64, Vec<i64>, String)>)>> {
        self.run_host_copy(py, op, indices, alloc, run, err, mamba_cache_cpu)
    }

    fn __repr__(&self) -> String {
        format!(
            "SglangPool(states={}, groups={}, slots={}, device={})",
            self.inner.states.len(),
            self.inner.groups.len(),
            self.inner.num_slots,
            self.device
        )
    }
}
