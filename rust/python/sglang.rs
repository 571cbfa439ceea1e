//! SGLang's mamba pool (`crate::sglang`): the speculative commit's checked selection and the
//! host-copy check, for `recoverssm_rs.sglang`.

use super::conversion::{args, instance, items, kwargs, Arg, DeviceOf, DtypeName, Ints, Tensor};
use super::guard::BoundTensors;
use super::launch::KernelLaunch;
use super::layout::Layout;
use super::params::with_params;
use crate::dtype::DType;
use crate::error::{Error, ErrorKind};
use crate::layout::ConvLayout;
use crate::sglang::hicache::{Direction, HostCopy};
use crate::sglang::kernel::{self, SlotCall, SlotCopy};
use crate::sglang::{self, CommitPass, CommitSizes};
use crate::tensor::TensorDesc;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

kwargs! {
    /// The keyword arguments of `sglang_commit_selection`.
    pub(crate) struct SelectArgs(Plan) {
        slots: Ints,
        steps: Ints,
        track_slots: Option<Ints>,
        track_steps: Option<Ints>,
        rows: Option<Ints>,
        num_slots: u64,
        num_rows: u64,
        draft: u64,
    }
}

/// The moves of the commit, `(slot, row, step)` per request that writes, the commit pass then the
/// track pass (when `track_slots` is given), after the core has checked every index (a `PlanError`
/// naming the request otherwise). `rows` defaults to each request's own index.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (
    *, slots: "_IntArray", steps: "_IntArray", track_slots: "_IntArray | None" = None, track_steps: "_IntArray | None" = None,
    rows: "_IntArray | None" = None, num_slots: "int", num_rows: "int", draft: "int",
) -> "list[tuple[int, int, int]]")]
pub(crate) fn sglang_commit_selection(
    slots: Option<&Bound<'_, PyAny>>,
    steps: Option<&Bound<'_, PyAny>>,
    track_slots: Option<&Bound<'_, PyAny>>,
    track_steps: Option<&Bound<'_, PyAny>>,
    rows: Option<&Bound<'_, PyAny>>,
    num_slots: Option<&Bound<'_, PyAny>>,
    num_rows: Option<&Bound<'_, PyAny>>,
    draft: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<(i64, i64, i64)>> {
    let a = args!(SelectArgs { slots, steps, track_slots, track_steps, rows, num_slots, num_rows, draft })?;
    let mut passes = vec![CommitPass { name: "commit", slots: &a.slots.0, steps: &a.steps.0 }];
    match (&a.track_slots, &a.track_steps) {
        (Some(slots), Some(steps)) => passes.push(CommitPass { name: "track", slots: &slots.0, steps: &steps.0 }),
        (Some(_), None) => return Err(Error::plan("commit_after_verify: track_indices given without steps_to_track").into()),
        _ => {}
    }
    let sizes = CommitSizes { num_slots: a.num_slots, num_rows: a.num_rows, draft: a.draft };
    let rows = a.rows.as_ref().map(|r| r.0.as_slice());
    let selected = sglang::commit_selection(&passes, rows, sizes)?;
    let row = |r: usize| rows.map_or(r as i64, |v| v[r]);
    Ok(selected
        .iter()
        .zip(&passes)
        .flat_map(|(take, p)| take.iter().map(move |&r| (p.slots[r as usize], row(r as usize), p.steps[r as usize])))
        .collect())
}

/// The host copies of `mamba_cache_cpu` (SGLang's `(conv_cpu, temporal_cpu)`, or a historical
/// triple whose third element is ignored) in the order of `pool` (every conv tensor, then the
/// temporal state), each checked against its pool tensor for a load into `num_slots` slots: on the
/// host, the pool tensor's dtype, shape `[layers, num_slots, ...]` (`PlanError` naming the state).
#[pyfunction]
#[pyo3(signature = (pool: "Sequence[_Tensor]", mamba_cache_cpu: "Sequence[Sequence[_Tensor] | _Tensor]", num_slots: "int") -> "list[_Tensor]")]
pub(crate) fn sglang_host_copies<'py>(
    pool: &Bound<'py, PyAny>,
    mamba_cache_cpu: &Bound<'py, PyAny>,
    num_slots: u64,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let kind = ErrorKind::Plan;
    let pool = items(pool, "pool", kind, "tensors")?;
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
        let what = format!("load_cpu_copy: {state}");
        let (d, h) = (Tensor::arg(dst, &what, kind)?.0, Tensor::arg(src, &format!("{what} (host copy)"), kind)?.0);
        sglang::check_host_copy(&state, &d, &h, num_slots as usize)?;
    }
    Ok(host)
}

/// The index vector `ids`, the argument `arg` of operation `op`, as host int64 values: an int32 or
/// int64 array, CPU tensor or list of ints (a float, bool or other array is refused, never cast,
/// naming `op` and `arg`). With `num_slots`, every id is checked as a slot of the pool other than
/// the dummy slot 0 (negative ids refused), and with `unique` no slot twice.
#[pyfunction]
#[pyo3(signature = (op: "str", arg: "str", ids: "_IntArray", num_slots: "int | None" = None, unique: "bool" = false) -> "list[int]")]
pub(crate) fn sglang_ids(op: &str, arg: &str, ids: &Bound<'_, PyAny>, num_slots: Option<u64>, unique: bool) -> PyResult<Vec<i64>> {
    let v = Ints::arg(ids, &format!("{op}: {arg}"), ErrorKind::Plan)?.0;
    if let Some(n) = num_slots {
        let repeats = if unique { sglang::Repeats::Refused } else { sglang::Repeats::Allowed };
        sglang::check_slots(op, arg, &v, n, repeats)?;
    }
    Ok(v)
}

kwargs! {
    /// The keyword arguments of `sglang_check_pool`.
    pub(crate) struct PoolArgs(Binding) {
        conv: Vec<Tensor>,
        temporal: Tensor,
        intermediate_ssm: Option<Tensor>,
        intermediate_conv_window: Option<Vec<Tensor>>,
        conv_layout: String = "DS".to_string(),
    }
}

/// Checks the tensors of an SGLang pool as the adapter is built: a list of conv tensors, the
/// temporal state and the optional verify scratch, every one a tensor, with one layer count and
/// no two sharing memory (`BindingError` naming them). Returns the planner's groups over them,
/// one per non-empty conv tensor with the temporal state riding on the first: each one's layout
/// (conv windows in `conv_layout`) and the indices of its tensors in `[*conv, temporal]`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (
    *, conv: "Sequence[_Tensor]", temporal: "_Tensor", intermediate_ssm: "_Tensor | None" = None,
    intermediate_conv_window: "Sequence[_Tensor] | None" = None, conv_layout: "_ConvLayoutName" = None,
) -> "list[tuple[Layout, list[int]]]")]
pub(crate) fn sglang_check_pool(
    conv: Option<&Bound<'_, PyAny>>,
    temporal: Option<&Bound<'_, PyAny>>,
    intermediate_ssm: Option<&Bound<'_, PyAny>>,
    intermediate_conv_window: Option<&Bound<'_, PyAny>>,
    conv_layout: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<(Layout, Vec<usize>)>> {
    let a = args!(PoolArgs { conv, temporal, intermediate_ssm, intermediate_conv_window, conv_layout })?;
    let mut all: Vec<(String, &TensorDesc)> = a.conv.iter().enumerate().map(|(i, t)| (format!("conv[{i}]"), &t.0)).collect();
    all.push(("temporal".into(), &a.temporal.0));
    if let Some(t) = &a.intermediate_ssm {
        all.push(("intermediate_ssm".into(), &t.0));
    }
    for (i, t) in a.intermediate_conv_window.iter().flatten().enumerate() {
        all.push((format!("intermediate_conv_window[{i}]"), &t.0));
    }
    sglang::check_pool(&all)?;
    let conv: Vec<&TensorDesc> = a.conv.iter().map(|t| &t.0).collect();
    let layout = ConvLayout::parse(&a.conv_layout).map_err(|e| Error::layout(format!("SglangMambaPool: {}", e.message)))?;
    let groups = sglang::layout::pool_groups(&conv, &a.temporal.0, layout)?;
    Ok(groups.into_iter().map(|(l, t)| (l.into(), t)).collect())
}

/// A list whose entries are tensors or `None`.
pub(crate) struct OptTensors(Vec<Option<TensorDesc>>);

impl Arg for OptTensors {
    fn arg(obj: &Bound<'_, PyAny>, name: &str, kind: ErrorKind) -> PyResult<Self> {
        let items = obj.try_iter()?;
        let out: PyResult<Vec<Option<TensorDesc>>> =
            items.enumerate().map(|(i, t)| Ok(Option::<Tensor>::arg(&t?, &format!("{name}[{i}]"), kind)?.map(|t| t.0))).collect();
        Ok(OptTensors(out?))
    }
}

kwargs! {
    /// The keyword arguments of `sglang_slot_table`.
    pub(crate) struct SlotTableArgs(Plan) {
        states: Vec<Tensor>,
        scratch: OptTensors,
    }
}

/// The slot kernel's records of a pool (`SlotCopy`, one per layer of each state tensor, tensor
/// order then layer order) as bytes, with their count and the largest slot's bytes. `scratch[i]`
/// is `states[i]`'s verify scratch or `None`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (*, states: "Sequence[_Tensor]", scratch: "Sequence[_Tensor | None]") -> "tuple[bytes, int, int]")]
pub(crate) fn sglang_slot_table<'py>(
    py: Python<'py>,
    states: Option<&Bound<'py, PyAny>>,
    scratch: Option<&Bound<'py, PyAny>>,
) -> PyResult<(Bound<'py, PyBytes>, u32, u64)> {
    let a = args!(SlotTableArgs { states, scratch })?;
    let states: Vec<TensorDesc> = a.states.into_iter().map(|t| t.0).collect();
    let recs = kernel::slot_table(&states, &a.scratch.0)?;
    let max_bytes = recs.iter().map(|r| r.bytes).max().unwrap_or(0);
    let n = u32::try_from(recs.len()).map_err(|_| Error::plan("too many slot records"))?;
    let bytes: Vec<u8> = recs.iter().flat_map(SlotCopy::to_le_bytes).collect();
    Ok((PyBytes::new(py, &bytes), n, max_bytes))
}

kwargs! {
    /// The keyword arguments of `sglang_slot_launch`.
    pub(crate) struct SlotLaunchArgs(Plan) {
        device: DeviceOf,
        metas: u64,
        num_meta: u32,
        max_bytes: u64,
        num_slots: i64,
        num_rows: i64 = 0,
        draft: i64 = 0,
        slots: Tensor,
        steps: Option<Tensor>,
        rows: Option<Tensor>,
        track_slots: Option<Tensor>,
        track_steps: Option<Tensor>,
        err: Tensor,
    }
}

/// One guarded launch of the slot kernel (clear without `steps`, the commit with them), in one
/// call: the pool's tensors `guard` checked, the launch built (every argument checked by the core:
/// int64 vectors of one length on the pool's device, an int32 error word of 3), `run(launch)`
/// (`None`: nothing to launch), the write recorded.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (
    run: "Callable[[KernelLaunch | None], object]", *, guard: "BoundTensors", device: "str | _Tensor", metas: "int", num_meta: "int", max_bytes: "int", num_slots: "int", num_rows: "int" = None,
    draft: "int" = None, slots: "_Tensor", steps: "_Tensor | None" = None, rows: "_Tensor | None" = None,
    track_slots: "_Tensor | None" = None, track_steps: "_Tensor | None" = None, err: "_Tensor",
) -> "None")]
pub(crate) fn sglang_slot_launch(
    py: Python<'_>,
    run: &Bound<'_, PyAny>,
    guard: &Bound<'_, PyAny>,
    device: Option<&Bound<'_, PyAny>>,
    metas: Option<&Bound<'_, PyAny>>,
    num_meta: Option<&Bound<'_, PyAny>>,
    max_bytes: Option<&Bound<'_, PyAny>>,
    num_slots: Option<&Bound<'_, PyAny>>,
    num_rows: Option<&Bound<'_, PyAny>>,
    draft: Option<&Bound<'_, PyAny>>,
    slots: Option<&Bound<'_, PyAny>>,
    steps: Option<&Bound<'_, PyAny>>,
    rows: Option<&Bound<'_, PyAny>>,
    track_slots: Option<&Bound<'_, PyAny>>,
    track_steps: Option<&Bound<'_, PyAny>>,
    err: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let guard = instance::<BoundTensors>(guard, "guard", ErrorKind::Binding, "BoundTensors")?;
    guard.get().guard().check(py)?;
    let a =
        args!(SlotLaunchArgs { device, metas, num_meta, max_bytes, num_slots, num_rows, draft, slots, steps, rows, track_slots, track_steps, err })?;
    let call = SlotCall {
        slots: &a.slots.0,
        steps: a.steps.as_ref().map(|t| &t.0),
        rows: a.rows.as_ref().map(|t| &t.0),
        track_slots: a.track_slots.as_ref().map(|t| &t.0),
        track_steps: a.track_steps.as_ref().map(|t| &t.0),
        err: &a.err.0,
    };
    let pool = kernel::SlotPool {
        device: &a.device.0,
        metas: a.metas,
        num_meta: a.num_meta,
        max_bytes: a.max_bytes,
        num_slots: a.num_slots,
        num_rows: a.num_rows,
        draft: a.draft,
    };
    let launch = kernel::slot_launch(&pool, &call)?.map(KernelLaunch::new);
    run.call1((launch,))?;
    guard.get().guard().mark_written(py)
}

kwargs! {
    /// `sglang_layout`'s arguments: the rank count, the dtypes and SGLang's cache shape fields.
    pub(crate) struct LayoutArgs (Layout) {
        tp_size: u64,
        dtype: DtypeName,
        ssm_dtype: DtypeName,
        num_heads: u64,
        head_dim: u64,
        conv_kernel: u64,
        state_size: Option<u64>,
        intermediate_size: Option<u64>,
        conv_dim: Option<u64>,
        num_k_heads: Option<u64>,
        head_k_dim: Option<u64>,
        conv_shard_groups: Option<Ints>,
    }
}

with_params! {
    (LayoutArgs {
        tp_size: "int", dtype: "str | _DType", ssm_dtype: "str | _DType", num_heads: "int", head_dim: "int", conv_kernel: "int",
        state_size: "int | None" = None, intermediate_size: "int | None" = None, conv_dim: "int | None" = None,
        num_k_heads: "int | None" = None, head_k_dim: "int | None" = None, conv_shard_groups: "Sequence[int] | None" = None,
    })
    #[signature((*,) ..a -> "Layout")]
    /// The family layout of one rank of `tp_size` for SGLang's cache parameters: `dtype` and
    /// `ssm_dtype` its `dtype.conv` / `dtype.temporal`, the rest its `shape`'s fields of the same
    /// names (`None` where the shape has none). Kimi-Linear (`num_k_heads`) is KDA, three
    /// `conv_shard_groups` GDN, any other Mamba2.
    #[pyfunction]
    pub(crate) fn sglang_layout() -> PyResult<Layout> {
        let shape = sglang::layout::CacheShape {
            num_heads: a.num_heads,
            head_dim: a.head_dim,
            conv_kernel: a.conv_kernel,
            state_size: a.state_size,
            intermediate_size: a.intermediate_size,
            conv_dim: a.conv_dim,
            num_k_heads: a.num_k_heads,
            head_k_dim: a.head_k_dim,
            conv_shard_groups: a.conv_shard_groups.map(|g| g.0),
        };
        let (dtype, ssm_dtype) = (DType::parse(&a.dtype.0)?, DType::parse(&a.ssm_dtype.0)?);
        Ok(sglang::layout::family_layout(&shape, a.tp_size, dtype, ssm_dtype)?.into())
    }
}

kwargs! {
    /// The keyword arguments of `sglang_host_copy`.
    pub(crate) struct HostCopyArgs(Plan) {
        states: Vec<Tensor>,
        ids: Ints,
        num_slots: u64,
    }
}

/// One HiCache host copy of an SGLang pool on CUDA (`crate::sglang::hicache`): the layout of its
/// device buffer, the bytes staged into it and the slot kernel's launch.
#[pyclass(module = "recoverssm_rs._core", frozen)]
pub struct SglangHostCopy {
    inner: HostCopy,
}

/// The host copy `op` (`"get_cpu_copy"` or `"load_cpu_copy"`) of the slots `ids` (checked slots of
/// the pool) of a pool of `num_slots` slots whose state tensors are `states` (every conv tensor,
/// then the temporal state: `[layers, slots, ...]` on one CUDA device).
#[pyfunction]
#[pyo3(signature = (op: "str", *, states: "Sequence[_Tensor]", ids: "_IntArray", num_slots: "int") -> "SglangHostCopy")]
pub(crate) fn sglang_host_copy(
    op: &str,
    states: Option<&Bound<'_, PyAny>>,
    ids: Option<&Bound<'_, PyAny>>,
    num_slots: Option<&Bound<'_, PyAny>>,
) -> PyResult<SglangHostCopy> {
    let a = args!(HostCopyArgs { states, ids, num_slots })?;
    let direction = match op {
        "get_cpu_copy" => Direction::Get,
        "load_cpu_copy" => Direction::Load,
        _ => return Err(Error::plan(format!("sglang_host_copy: unknown op {op:?}")).into()),
    };
    let states = a.states.into_iter().map(|t| t.0).collect();
    Ok(SglangHostCopy { inner: HostCopy::new(direction, states, a.ids.0, a.num_slots)? })
}

#[pymethods]
impl SglangHostCopy {
    /// The buffer's bytes (a multiple of 16; 0 for a load that moves nothing).
    #[getter]
    fn total(&self) -> u64 {
        self.inner.total
    }

    /// Where the staged bytes of `run` go in the buffer (get: after the blocks; load: 0).
    #[getter]
    fn staged_at(&self) -> u64 {
        self.inner.staged_at
    }

    /// Per state tensor, its block of the buffer: `(offset, bytes, shape)`.
    #[getter]
    fn blocks(&self) -> Vec<(u64, u64, Vec<i64>)> {
        self.inner.blocks.iter().map(|b| (b.offset, b.bytes, b.shape.clone())).collect()
    }

    /// One guarded host copy through the buffer at device address `buffer`, in one call: the
    /// pool's tensors `guard` checked, the staging built (a load's host copies `host`, the slot
    /// table, the index vectors), `run(staged, launch)` (copy `staged` into the buffer at
    /// `staged_at`, then the slot kernel's launch reporting into `err`; `None`: nothing moves),
    /// the write recorded.
    #[pyo3(signature = (
        run: "Callable[[bytes, KernelLaunch | None], object]", *, guard: "BoundTensors", buffer: "int", err: "_Tensor",
        host: "Sequence[_Tensor] | None" = None,
    ) -> "None")]
    fn run<'py>(
        &self,
        py: Python<'py>,
        run: &Bound<'py, PyAny>,
        guard: &Bound<'py, PyAny>,
        buffer: u64,
        err: &Bound<'py, PyAny>,
        host: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<()> {
        let kind = ErrorKind::Plan;
        let guard = instance::<BoundTensors>(guard, "guard", ErrorKind::Binding, "BoundTensors")?;
        guard.get().guard().check(py)?;
        let err = Tensor::arg(err, "err", kind)?.0;
        let host: Vec<TensorDesc> = match host {
            Some(h) => Vec::<Tensor>::arg(h, "host", kind)?.into_iter().map(|t| t.0).collect(),
            None => Vec::new(),
        };
        let bytes = self.inner.stage(buffer, &host)?;
        let launch = self.inner.launch(buffer, &err)?.map(KernelLaunch::new);
        run.call1((PyBytes::new(py, &bytes), launch))?;
        guard.get().guard().mark_written(py)
    }
}
