//! An SGLang pool's tensors held by the core (`crate::sglang::pool`) for `recoverssm_rs.sglang`:
//! checked and guarded once when the adapter is built; every write of an operation is one call
//! here (the guard checked, the write built, run and recorded).

use super::conversion::{address_int, args, items, kwargs, Arg, Ints, Tensor};
use super::guard::Guard;
use super::launch::KernelLaunch;
use super::layout::Layout;
use crate::error::{Error, ErrorKind};
use crate::layout::ConvLayout;
use crate::sglang;
use crate::sglang::hicache::Direction;
use crate::sglang::kernel::{self, SlotCall, SlotCopy, SlotPool};
use crate::sglang::pool::Pool;
use crate::tensor::{Device, TensorDesc};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::OnceLock;

kwargs! {
    /// The keyword arguments of `SglangPool`.
    pub(crate) struct PoolArgs(Binding) {
        conv: Vec<Tensor>,
        temporal: Tensor,
        intermediate_ssm: Option<Tensor>,
        intermediate_conv_window: Option<Vec<Tensor>>,
        conv_layout: String = "DS".to_string(),
    }
}

/// A slot table on the device: its buffer (kept alive) and what a launch over it needs.
struct DeviceTable {
    _buffer: Py<PyAny>,
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
    inner: Pool,
    guard: Guard,
    device: Device,
    /// The slot kernel's tables on the device: clearing, the commit.
    tables: [OnceLock<DeviceTable>; 2],
}

kwargs! {
    /// The keyword arguments of `SglangPool.slot_launch`.
    pub(crate) struct SlotArgs(Plan) {
        slots: Tensor,
        steps: Option<Tensor>,
        rows: Option<Tensor>,
        track_slots: Option<Tensor>,
        track_steps: Option<Tensor>,
        err: Tensor,
    }
}

kwargs! {
    /// The keyword arguments of `SglangPool.commit_moves`.
    pub(crate) struct MovesArgs(Plan) {
        slots: Ints,
        steps: Ints,
        rows: Option<Ints>,
        track_slots: Option<Ints>,
        track_steps: Option<Ints>,
    }
}

impl SglangPool {
    /// The guard of the pool's tensors (also checked by the planner over their layers before each
    /// of its writes and launches).
    pub(crate) fn guard(&self) -> &Guard {
        &self.guard
    }

    fn write<T>(&self, py: Python<'_>, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
        self.guard.check(py)?;
        let out = f()?;
        self.guard.mark_written(py)?;
        Ok(out)
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
        let a = args!(PoolArgs { conv, temporal, intermediate_ssm, intermediate_conv_window, conv_layout })?;
        let layout = ConvLayout::parse(&a.conv_layout).map_err(|e| Error::layout(format!("SglangMambaPool: {}", e.message)))?;
        let windows = a.intermediate_conv_window.map(|w| w.into_iter().map(|t| t.0).collect());
        let conv_descs = a.conv.into_iter().map(|t| t.0).collect();
        let inner = Pool::new(conv_descs, a.temporal.0, a.intermediate_ssm.map(|t| t.0), windows, layout)?;
        // The guard: every tensor with the name its errors use (the objects converted above).
        let kind = ErrorKind::Binding;
        let mut labelled: Vec<(Bound<'_, PyAny>, String)> = Vec::new();
        for (i, t) in items(conv.expect("converted"), "conv", kind, "tensors")?.into_iter().enumerate() {
            labelled.push((t, format!("conv[{i}]")));
        }
        labelled.push((temporal.expect("converted").clone(), "temporal".into()));
        if let Some(t) = intermediate_ssm.filter(|t| !t.is_none()) {
            labelled.push((t.clone(), "intermediate_ssm".into()));
        }
        if let Some(w) = intermediate_conv_window.filter(|w| !w.is_none()) {
            for (i, t) in items(w, "intermediate_conv_window", kind, "tensors")?.into_iter().enumerate() {
                labelled.push((t, format!("intermediate_conv_window[{i}]")));
            }
        }
        let first = inner.live().first().copied().unwrap_or(inner.states.len() - 1);
        let device = Device::parse(&inner.states[first].device)?;
        Ok(SglangPool { guard: Guard::new(py, &labelled)?, inner, device, tables: [OnceLock::new(), OnceLock::new()] })
    }

    /// The planner's groups: one per conv tensor that holds bytes, the temporal state riding on
    /// the first; each one's layout and the indices of its tensors in `[*conv, temporal]`.
    #[getter]
    fn groups(&self) -> Vec<(Layout, Vec<usize>)> {
        self.inner.groups.iter().map(|(l, t)| (l.clone().into(), t.clone())).collect()
    }

    /// The state tensors that hold bytes, in SGLang's order (every such conv tensor, then the
    /// temporal state): indices in `[*conv, temporal]`.
    #[getter]
    fn live(&self) -> Vec<usize> {
        self.inner.live()
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

    /// `(state, scratch)` for every state tensor that holds bytes, the temporal state first:
    /// indices in `[*conv, temporal]` and in `[intermediate_ssm, *intermediate_conv_window]`
    /// (`PlanError` for a pool without the verify scratch).
    #[pyo3(signature = () -> "list[tuple[int, int]]")]
    fn verify_scratch(&self) -> PyResult<Vec<(usize, usize)>> {
        Ok(self.inner.verify_scratch()?)
    }

    /// The commit's moves on the host, `(slot, row, step)` per request that writes, the commit
    /// pass then the track pass (with `track_slots`), after every index is checked (`PlanError`
    /// naming the request otherwise); `rows` defaults to each request's own index.
    #[pyo3(signature = (
        *, slots: "_IntArray", steps: "_IntArray", rows: "_IntArray | None" = None, track_slots: "_IntArray | None" = None,
        track_steps: "_IntArray | None" = None,
    ) -> "list[tuple[int, int, int]]")]
    fn commit_moves(
        &self,
        slots: Option<&Bound<'_, PyAny>>,
        steps: Option<&Bound<'_, PyAny>>,
        rows: Option<&Bound<'_, PyAny>>,
        track_slots: Option<&Bound<'_, PyAny>>,
        track_steps: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<(i64, i64, i64)>> {
        let a = args!(MovesArgs { slots, steps, rows, track_slots, track_steps })?;
        let track = (a.track_slots.as_ref().map(|v| v.0.as_slice()), a.track_steps.as_ref().map(|v| v.0.as_slice()));
        Ok(self.inner.commit_moves(&a.slots.0, &a.steps.0, a.rows.as_ref().map(|v| v.0.as_slice()), track)?)
    }

    /// One guarded launch of the slot kernel, in one call: clear `slots` (`commit` false) or the
    /// commit (`steps`, optional `rows` and track pair), every vector checked by the core (int64,
    /// one length, on the pool's device; `err` an int32 error word of 3). The first launch of
    /// each use builds its records and hands them to `upload(bytes)`, which returns them on the
    /// device. Then: the pool's tensors checked, `run(launch)` (`None`: nothing to launch), the
    /// write recorded.
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
        commit: bool,
        upload: &Bound<'_, PyAny>,
        slots: Option<&Bound<'_, PyAny>>,
        steps: Option<&Bound<'_, PyAny>>,
        rows: Option<&Bound<'_, PyAny>>,
        track_slots: Option<&Bound<'_, PyAny>>,
        track_steps: Option<&Bound<'_, PyAny>>,
        err: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let cell = &self.tables[usize::from(commit)];
        let table = match cell.get() {
            Some(t) => t,
            None => {
                let t = self.inner.slot_table(commit)?;
                let bytes: Vec<u8> = t.records.iter().flat_map(SlotCopy::to_le_bytes).collect();
                let buffer = upload.call1((PyBytes::new(py, &bytes),))?;
                let metas = address_int(&buffer.call_method0("data_ptr")?)?;
                let num_meta = u32::try_from(t.records.len()).map_err(|_| Error::plan("too many slot records"))?;
                let max_bytes = t.records.iter().map(|r| r.bytes).max().unwrap_or(0);
                let dt = DeviceTable { _buffer: buffer.unbind(), metas, num_meta, max_bytes, rows: t.rows, draft: t.draft };
                let _ = cell.set(dt);
                cell.get().expect("just set")
            }
        };
        let a = args!(SlotArgs { slots, steps, rows, track_slots, track_steps, err })?;
        self.write(py, || {
            let call = SlotCall {
                slots: &a.slots.0,
                steps: a.steps.as_ref().map(|t| &t.0),
                rows: a.rows.as_ref().map(|t| &t.0),
                track_slots: a.track_slots.as_ref().map(|t| &t.0),
                track_steps: a.track_steps.as_ref().map(|t| &t.0),
                err: &a.err.0,
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
            run.call1((kernel::slot_launch(&pool, &call)?.map(KernelLaunch::new),))?;
            Ok(())
        })
    }

    /// Checks that a transfer pool over the first conv tensor and the temporal state covers the
    /// pool (`LayoutError` for several conv tensors holding bytes).
    fn check_transfer(&self) -> PyResult<()> {
        Ok(self.inner.check_transfer()?)
    }

    /// The host copies of `mamba_cache_cpu` (SGLang's `(conv_cpu, temporal_cpu)`, or a historical
    /// triple whose third element is ignored) in the order of `[*conv, temporal]`, for a load into
    /// `num_slots` slots: first the pool's tensors are checked (`BindingError` naming the one that
    /// moved), then each copy against its pool tensor as bound: on the host, the pool tensor's
    /// dtype, shape `[layers, num_slots, ...]` (`PlanError` naming the state).
    #[pyo3(signature = (mamba_cache_cpu: "Sequence[Sequence[_Tensor] | _Tensor]", num_slots: "int") -> "list[_Tensor]")]
    fn host_copies<'py>(&self, py: Python<'py>, mamba_cache_cpu: &Bound<'py, PyAny>, num_slots: u64) -> PyResult<Vec<Bound<'py, PyAny>>> {
        self.guard.check(py)?;
        let kind = ErrorKind::Plan;
        let pool = &self.inner.states;
        let parts = items(mamba_cache_cpu, "load_cpu_copy: mamba_cache_cpu", kind, "(conv_cpu, temporal_cpu)")?;
        if !(2..=3).contains(&parts.len()) {
            return Err(Error::plan(format!("load_cpu_copy: mamba_cache_cpu has {} parts; expected (conv_cpu, temporal_cpu)", parts.len())).into());
        }
        let conv = items(&parts[0], "load_cpu_copy: mamba_cache_cpu[0] (conv_cpu)", kind, "host tensors")?;
        if conv.len() + 1 != pool.len() {
            return Err(Error::plan(format!("load_cpu_copy: conv_cpu has {} tensors, the pool {}", conv.len(), pool.len() - 1)).into());
        }
        let mut host = conv;
        host.push(parts[1].clone());
        for (k, (dst, src)) in pool.iter().zip(&host).enumerate() {
            let state = if k + 1 == pool.len() { "temporal".to_string() } else { format!("conv[{k}]") };
            let h = Tensor::arg(src, &format!("load_cpu_copy: {state} (host copy)"), kind)?.0;
            sglang::check_host_copy(&state, dst, &h, num_slots as usize)?;
        }
        Ok(host)
    }

    /// HiCache's host copy `op` (`"get_cpu_copy"` or `"load_cpu_copy"`) of the slots `ids`
    /// (checked slots of the pool) on CUDA, in one call: the core lays out one device buffer for
    /// it (`alloc(n)` returns an int32 device vector of `n` elements), checks the pool's tensors,
    /// stages the call (a load's host copies `host`, the slot table, the index vectors) and hands
    /// `run(buffer, staged, at, launch)` the bytes to copy into the buffer from int32 element `at`
    /// and the slot kernel's launch reporting into `err` (`None`: nothing to launch); then the write
    /// is recorded. Returns the buffer and, per state tensor, its block `(offset, bytes, shape)`;
    /// `None` for a load that moves nothing (no buffer, no launch).
    #[pyo3(signature = (
        op: "str", ids: "_IntArray", *, alloc: "Callable[[int], _Tensor]", run: "Callable[[_Tensor, bytes, int, KernelLaunch | None], object]",
        err: "_Tensor", host: "Sequence[_Tensor] | None" = None,
    ) -> "tuple[_Tensor, list[tuple[int, int, list[int]]]] | None")]
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn host_copy<'py>(
        &self,
        py: Python<'py>,
        op: &str,
        ids: &Bound<'py, PyAny>,
        alloc: &Bound<'py, PyAny>,
        run: &Bound<'py, PyAny>,
        err: &Bound<'py, PyAny>,
        host: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<(Bound<'py, PyAny>, Vec<(u64, u64, Vec<i64>)>)>> {
        let direction = match op {
            "get_cpu_copy" => Direction::Get,
            "load_cpu_copy" => Direction::Load,
            _ => return Err(Error::plan(format!("host_copy: unknown op {op:?}")).into()),
        };
        let kind = ErrorKind::Plan;
        let ids = Ints::arg(ids, &format!("{op}: indices"), kind)?.0;
        let err = Tensor::arg(err, "err", kind)?.0;
        let host: Vec<TensorDesc> = match host.filter(|h| !h.is_none()) {
            Some(h) => Vec::<Tensor>::arg(h, "host", kind)?.into_iter().map(|t| t.0).collect(),
            None => Vec::new(),
        };
        let call = self.inner.host_copy(direction, ids)?;
        if call.total == 0 {
            return Ok(None);
        }
        let buffer = alloc.call1((call.total / 4,))?;
        let address = address_int(&buffer.call_method0("data_ptr")?)?;
        self.write(py, || {
            let bytes = call.stage(address, &host)?;
            let launch = call.launch(address, &err)?.map(KernelLaunch::new);
            run.call1((&buffer, PyBytes::new(py, &bytes), call.staged_at / 4, launch))?;
            Ok(())
        })?;
        Ok(Some((buffer, call.blocks.iter().map(|b| (b.offset, b.bytes, b.shape.clone())).collect())))
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
