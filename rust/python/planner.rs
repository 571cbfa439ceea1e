//! `Planner`: the core planner bound to the tensors themselves. It describes and binds every
//! group's state tensors, owns their guard (checked before every execute and launch), plans host
//! steps into one `CopyPlan`, and builds the fused kernel's launches for the device path.

use super::buffer::RawBuffer;
use super::conversion::{arg_error, args, instance, items, kwargs, Arg, Ints, Table, Tables, Tensor};
use super::guard::Guard;
use super::launch::KernelLaunch;
use super::layout::Layout;
use super::plan::CopyPlan;
use super::sglang_pool::SglangPool;
use super::tensor::{describe, Described};
use crate::binding::Binding;
use crate::error::{Error, ErrorKind};
use crate::kernels::args::StepCheck;
use crate::kernels::{self, FusedCopy, StepInputs};
use crate::memory;
use crate::plan::{AlignStep, Planner as CorePlanner, Semantics, Step};
use crate::tensor::TensorDesc;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use std::sync::{Arc, OnceLock};

/// The core planner over one or more recurrent groups, bound to their state tensors.
#[pyclass(module = "recoverssm_rs._core", frozen)]
pub struct Planner {
    pub(crate) inner: Arc<CorePlanner>,
    guard: Guard,
    /// The adapter's object whose tensors the planner binds by layer (an SGLang pool's
    /// layer-stacked tensors): its guard is checked before the planner's own on every write and
    /// launch, so a stacked tensor re-pointed under the views the planner keeps is refused too.
    also_guard: Option<Py<SglangPool>>,
    /// `states[group][layer][state]`: the bound persistent tensors (an immutable copy).
    // stub: -> tuple[tuple[tuple[_Tensor, ...], ...], ...]
    #[pyo3(get)]
    states: Py<PyTuple>,
    /// Tokens per block, for vLLM's step decisions.
    #[pyo3(get)]
    pub(crate) block_size: Option<i64>,
    #[pyo3(get)]
    num_groups: usize,
    /// Layers of every group.
    #[pyo3(get)]
    num_layers: usize,
    /// Blocks of the largest pool.
    #[pyo3(get)]
    num_blocks: u64,
    /// `cpu` or `cuda:N`.
    #[pyo3(get)]
    device: String,
    /// Speculative blocks after the running column, shared by every group.
    #[pyo3(get)]
    num_spec: u32,
    /// The device path's launch builder, once the state metas and error word are on the device.
    fused: OnceLock<FusedCopy>,
}

/// One group as the constructor takes it: its layout and, per layer, its tensors.
type GroupArg<'py> = (Bound<'py, Layout>, Vec<Vec<Bound<'py, PyAny>>>);

/// The constructor's `groups`: per group a `(layout, states)` pair, `states[layer]` a list of
/// tensors (with `persistent_only`, each layer's leading persistent tensors; the rest are left
/// alone). Anything else is a `BindingError` naming the group and layer.
fn group_args<'py>(groups: &Bound<'py, PyAny>, persistent_only: bool) -> PyResult<Vec<GroupArg<'py>>> {
    let kind = ErrorKind::Binding;
    let groups = items(groups, "groups", kind, "(layout, states) pairs")?;
    let n = groups.len();
    let mut out = Vec::with_capacity(n);
    for (g, pair) in groups.iter().enumerate() {
        let at = if n == 1 { String::new() } else { format!("group {g}: ") };
        let parts = items(pair, &format!("{at}group"), kind, "two items, (layout, states)")?;
        let [layout, states] = &parts[..] else {
            return Err(arg_error(kind, format!("{at}a group is a (layout, states) pair, got {} items", parts.len())));
        };
        let layout = instance::<Layout>(layout, &format!("{at}layout"), kind, "Layout")?;
        let keep = if persistent_only { layout.get().core().persistent().len() } else { usize::MAX };
        let layers = items(states, &format!("{at}states"), kind, "layers (each a list of tensors)")?
            .iter()
            .enumerate()
            .map(|(li, l)| Ok(items(l, &format!("{at}states[{li}]"), kind, "tensors")?.into_iter().take(keep).collect()))
            .collect::<PyResult<Vec<_>>>()?;
        out.push((layout, layers));
    }
    Ok(out)
}

/// `group G (backend): ` before a tensor's place when there are several groups, `backend: ` else.
fn place(groups: usize, g: usize, backend: &str) -> String {
    if groups == 1 {
        format!("{backend}: ")
    } else {
        format!("group {g} ({backend}): ")
    }
}

impl Planner {
    /// Whether this planner was built over `pool`'s layers (`also_guard`).
    pub(crate) fn guards_pool(&self, pool: &Bound<'_, SglangPool>) -> bool {
        self.also_guard.as_ref().is_some_and(|g| g.as_ptr() == pool.as_ptr())
    }

    /// Checks the adapter's guard (`also_guard`), then the planner's own.
    fn check_guards(&self, py: Python<'_>) -> PyResult<()> {
        if let Some(pool) = &self.also_guard {
            pool.get().guard().check(py)?;
        }
        self.guard.check(py)
    }

    /// Checks the guards, runs `f`, and bumps the version counters of what was written.
    pub(crate) fn write<T>(&self, py: Python<'_>, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
        self.check_guards(py)?;
        let out = f()?;
        self.guard.mark_written(py)?;
        Ok(out)
    }

    /// The block size of vLLM's step decisions.
    pub(crate) fn block_size(&self) -> PyResult<i64> {
        self.block_size.ok_or_else(|| Error::plan("this planner was made without a block_size; vLLM's step decisions need one").into())
    }

    pub(crate) fn fused(&self) -> PyResult<&FusedCopy> {
        self.fused.get().ok_or_else(|| Error::plan("the device path is not prepared: call bind_device(metas, err) first").into())
    }

    /// The fused kernel's launch of a step (the inputs the kernel reads, int32).
    pub(crate) fn fused_launch(&self, inp: &StepInputs<'_>, pre_copy: bool) -> PyResult<Option<KernelLaunch>> {
        Ok(self.fused()?.launch(inp, pre_copy)?.map(KernelLaunch::new))
    }
}

kwargs! {
    /// The inputs of `Planner.plan`: one block table per group (`tables`), or the one table of a
    /// one-group planner (`block_table`, exactly `[requests, cols]`).
    pub(crate) struct PlanArgs (Plan) {
        tables: Option<Tables>,
        block_table: Option<Table>,
        src_col: Ints,
        dst_col: Ints,
        num_accepted: Ints,
        semantics: String = "post_process".to_string(),
    }
}

kwargs! {
    /// The inputs of `Planner.plan_copy`.
    pub(crate) struct CopyArgs (Plan) {
        src_blocks: Ints,
        dst_blocks: Ints,
    }
}

kwargs! {
    /// A fused step's device inputs: `second` is `dst_col`, or `running` with a `block_size`.
    pub(crate) struct DeviceStepArgs (Plan) {
        block_table: Tensor,
        src_col: Tensor,
        second: Tensor,
        num_accepted: Tensor,
        err: Option<Tensor>,
        num_accepted_out: Option<Tensor>,
        block_size: Option<i64>,
        pre_copy: bool = false,
    }
}

/// `DeviceStepArgs`' parameters ([`super::params`]): the launch inputs, positional or keyword, then
/// the keyword options.
macro_rules! device_step_params {
    ($($items:tt)*) => {
        $crate::python::params::with_params! {
            ($crate::python::planner::DeviceStepArgs {
                block_table: "_Tensor", src_col: "_Tensor", second: "_Tensor", num_accepted: "_Tensor",
                err: "_Tensor | None" = None, num_accepted_out: "_Tensor | None" = None,
            } * { block_size: "int | None" = None, pre_copy: "bool" = None })
            $($items)*
        }
    };
}
pub(crate) use device_step_params;

impl DeviceStepArgs {
    pub(crate) fn inputs(&self) -> StepInputs<'_> {
        StepInputs {
            block_table: &self.block_table.0,
            src_col: &self.src_col.0,
            second: &self.second.0,
            num_accepted: &self.num_accepted.0,
            num_accepted_out: self.num_accepted_out.as_ref().map(|t| &t.0),
            err: self.err.as_ref().map(|t| &t.0),
            block_size: self.block_size,
        }
    }
}

device_step_params! {
#[pymethods]
impl Planner {
    /// `groups`: per group `(layout, states)`, `states[layer]` that layer's tensors in layout
    /// order (the persistent states, optionally followed by the workspace, which is ignored);
    /// `block_size`: tokens per block, for vLLM's step decisions; `also_guard`: the pool whose
    /// tensors the states are views of (an `SglangPool`), checked before every write and launch.
    #[new]
    #[pyo3(signature = (
        groups: "Sequence[tuple[Layout, Sequence[Sequence[_Tensor]]]]", *, block_size: "int | None" = None, persistent_only: "bool" = false,
        also_guard: "SglangPool | None" = None,
    ))]
    fn new(
        py: Python<'_>,
        groups: &Bound<'_, PyAny>,
        block_size: Option<&Bound<'_, PyAny>>,
        persistent_only: bool,
        also_guard: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let also_guard = match also_guard.filter(|g| !g.is_none()) {
            Some(g) => Some(instance::<SglangPool>(g, "also_guard", ErrorKind::Binding, "SglangPool")?.unbind()),
            None => None,
        };
        let groups = group_args(groups, persistent_only)?;
        let block_size: Option<i64> = match block_size {
            Some(b) => Arg::arg(b, "block_size", ErrorKind::Binding)?,
            None => None,
        };
        let n = groups.len();
        let mut bindings = Vec::with_capacity(n);
        let mut guarded = Vec::new();
        let mut states = Vec::with_capacity(n);
        // The process's memory map, read once (at the first host tensor): tensors over pages it
        // maps read-only are bound as read-only, which the binding refuses.
        let mut maps: Option<Option<Vec<memory::Mapping>>> = None;
        let mut views = Vec::with_capacity(n); // each group's descriptions, for `also_guard`'s check
        for (g, (layout, layers)) in groups.iter().enumerate() {
            let core = layout.get().core();
            let at = place(n, g, core.backend());
            let persistent = core.copyable_prefix_len();
            let mut descs = Vec::with_capacity(layers.len());
            for (li, layer) in layers.iter().enumerate() {
                let mut row: Vec<TensorDesc> = Vec::with_capacity(layer.len());
                for (si, t) in layer.iter().enumerate() {
                    let name = core.states().get(si).map(|s| s.name.as_str()).unwrap_or("?");
                    let label = format!("{at}layer {li}, state {si} ('{name}')");
                    match describe(t)? {
                        Described::Tensor(mut d) => {
                            if d.writable && d.device.trim() == "cpu" {
                                let itemsize = d.state_dtype().map_or(1, |t| t.itemsize());
                                memory::mark_read_only(maps.get_or_insert_with(memory::own_maps).as_deref(), &mut d, itemsize);
                            }
                            row.push(d)
                        }
                        Described::Dense(why) => return Err(Error::binding(format!("{label}: {why}")).into()),
                        Described::Unknown => {
                            let ty = t.get_type().name()?;
                            return Err(Error::binding(format!("{label}: state tensors must be torch tensors or numpy arrays, got {ty}")).into());
                        }
                    }
                    if si < persistent {
                        guarded.push((t.clone(), label));
                    }
                }
                descs.push(row);
            }
            if also_guard.is_some() {
                views.push(descs.iter().map(|row| row.iter().take(persistent).cloned().collect()).collect::<Vec<Vec<TensorDesc>>>());
            }
            let binding = Binding::new(core, &descs).map_err(|e| {
                // A group's errors start with its backend: name the group there too.
                let rest = e.message.strip_prefix(&format!("{}: ", core.backend())).unwrap_or(&e.message);
                Error { message: format!("{at}{rest}"), ..e }
            })?;
            bindings.push(binding);
            let layers = layers.iter().map(|l| PyTuple::new(py, l.iter().take(persistent))).collect::<PyResult<Vec<_>>>()?;
            states.push(PyTuple::new(py, layers)?);
        }
        if let Some(bs) = block_size {
            if bs < 1 {
                return Err(arg_error(ErrorKind::Binding, format!("block_size must be >= 1, got {bs}")));
            }
        }
        if let Some(pool) = &also_guard {
            pool.bind(py).get().check_layer_views(&views)?;
        }
        let inner = CorePlanner::new(bindings)?;
        Ok(Planner {
            num_groups: inner.num_groups(),
            num_layers: inner.bindings().map(|b| b.num_layers()).sum(),
            num_blocks: inner.max_blocks(),
            device: inner.device().to_string(),
            num_spec: inner.num_spec(),
            inner: Arc::new(inner),
            guard: Guard::new(py, &guarded)?,
            also_guard,
            states: PyTuple::new(py, states)?.unbind(),
            block_size,
            fused: OnceLock::new(),
        })
    }

    #[getter]
    fn layouts(&self) -> Vec<Layout> {
        self.inner.bindings().map(|b| Layout::from(b.layout().clone())).collect()
    }
    /// Per group: `(layers, blocks)`.
    fn group_sizes(&self) -> Vec<(usize, u64)> {
        self.inner.bindings().map(|b| (b.num_layers(), b.num_blocks())).collect()
    }

    /// Plans `dst_col <- src_col` moves carrying `num_accepted` in every group (`tables`: one
    /// block table per group, or one table for one group) under `semantics` (`"post_process"`,
    /// the default, or `"pre_copy"`).
    #[pyo3(signature = (
        *, tables: "Sequence[_IntArray] | _IntArray | None" = None, block_table: "_IntArray | None" = None, src_col: "_IntArray",
        dst_col: "_IntArray", num_accepted: "_IntArray", semantics: "Literal['post_process', 'pre_copy']" = None,
    ) -> "CopyPlan")]
    #[allow(clippy::too_many_arguments)]
    fn plan(
        slf: Bound<'_, Self>,
        tables: Option<&Bound<'_, PyAny>>,
        block_table: Option<&Bound<'_, PyAny>>,
        src_col: Option<&Bound<'_, PyAny>>,
        dst_col: Option<&Bound<'_, PyAny>>,
        num_accepted: Option<&Bound<'_, PyAny>>,
        semantics: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<CopyPlan> {
        let a = args!(PlanArgs { tables, block_table, src_col, dst_col, num_accepted, semantics })?;
        let semantics = Semantics::parse(&a.semantics)?;
        let planner = Arc::clone(&slf.get().inner);
        let (src_col, dst_col, num_accepted) = (&a.src_col.0, &a.dst_col.0, &a.num_accepted.0);
        let plan = match (&a.tables, &a.block_table) {
            (Some(tables), None) => slf.py().detach(|| {
                let tables = tables.views();
                planner.plan(&Step { tables: &tables, src_col, dst_col, num_accepted, semantics })
            })?,
            (None, Some(t)) if semantics == Semantics::PostProcess => {
                slf.py().detach(|| planner.plan_align(&AlignStep { block_table: &t.ids, cols: t.cols, src_col, dst_col, num_accepted }))?
            }
            _ => return Err(arg_error(ErrorKind::Plan, "give tables (one per group), or block_table with post-process semantics".into())),
        };
        Ok(CopyPlan::new(plan, slf.unbind()))
    }

    /// Plans whole-block copies `dst_blocks[i] <- src_blocks[i]` of every persistent state.
    #[pyo3(signature = (*, src_blocks: "_IntArray", dst_blocks: "_IntArray") -> "CopyPlan")]
    fn plan_copy(slf: Bound<'_, Self>, src_blocks: Option<&Bound<'_, PyAny>>, dst_blocks: Option<&Bound<'_, PyAny>>) -> PyResult<CopyPlan> {
        let a = args!(CopyArgs { src_blocks, dst_blocks })?;
        let planner = Arc::clone(&slf.get().inner);
        let plan = slf.py().detach(|| planner.plan_copy(&a.src_blocks.0, &a.dst_blocks.0))?;
        Ok(CopyPlan::new(plan, slf.unbind()))
    }

    /// Publishes `blocks` of `group` (one more holder each; a checkpoint in the prefix index is
    /// one holder, each request sharing the block another): until retracted, a plan that would
    /// write one is refused with a `PlanError` naming the request, state and block. Ids in
    /// `1..num_blocks`; on an error nothing changes.
    #[pyo3(signature = (blocks: "_IntArray", *, group: "int" = None) -> "None")]
    fn publish(&self, py: Python<'_>, blocks: &Bound<'_, PyAny>, group: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let group = group_arg(group)?;
        let blocks = Ints::arg(blocks, "blocks", ErrorKind::Plan)?;
        py.detach(|| self.inner.publish(group, &blocks.0)).map_err(Into::into)
    }

    /// Drops one holder of each of `blocks` of `group`; a block left without holders may be
    /// written again. A block not published (as often as listed) is a `PlanError`, and nothing
    /// changes.
    #[pyo3(signature = (blocks: "_IntArray", *, group: "int" = None) -> "None")]
    fn retract(&self, py: Python<'_>, blocks: &Bound<'_, PyAny>, group: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let group = group_arg(group)?;
        let blocks = Ints::arg(blocks, "blocks", ErrorKind::Plan)?;
        py.detach(|| self.inner.retract(group, &blocks.0)).map_err(Into::into)
    }

    /// The published blocks of `group`, ascending.
    #[pyo3(signature = (group: "int" = None) -> "list[int]")]
    fn published(&self, group: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<u64>> {
        Ok(self.inner.published(group_arg(group)?)?)
    }

    /// The holders of `block` in `group` (0: not published).
    #[pyo3(signature = (block: "int", *, group: "int" = None) -> "int")]
    fn holders(&self, block: &Bound<'_, PyAny>, group: Option<&Bound<'_, PyAny>>) -> PyResult<u32> {
        let group = group_arg(group)?;
        Ok(self.inner.holders(group, u64::arg(block, "block", ErrorKind::Plan)?)?)
    }

    /// The fused kernel's table of every (group, layer, persistent state).
    fn state_meta(&self) -> RawBuffer {
        RawBuffer::new(self.inner.state_meta())
    }

    /// Raises `BindingError` when a bound tensor (or one of `also_guard`'s) no longer owns the
    /// memory it was bound with.
    pub(crate) fn check(&self, py: Python<'_>) -> PyResult<()> {
        self.check_guards(py)
    }

    /// Bumps autograd's version counters of the bound tensors (after a write on the device).
    fn mark_written(&self, py: Python<'_>) -> PyResult<()> {
        self.guard.mark_written(py)
    }

    /// One guarded write: the bound tensors are checked (a `BindingError`, and `write` is not
    /// called, when one moved), `write()` runs, and what was written is recorded (autograd's
    /// version counters). Returns what `write` returns.
    #[pyo3(signature = (write: "Callable[[], _T]") -> "_T")]
    fn guarded(&self, py: Python<'_>, write: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.write(py, || Ok(write.call0()?.unbind()))
    }

    /// Prepares the device path: the state metas (`state_meta()`) are at device address `metas`,
    /// the planner's own error word (int32[3]) at `err`. Once per planner.
    fn bind_device(&self, metas: u64, err: u64) -> PyResult<()> {
        let f = FusedCopy::for_planner(&self.inner, metas, err)?;
        self.fused.set(f).map_err(|_| Error::plan("the device path is already prepared").into())
    }

    /// Whether [`bind_device`] has run.
    #[getter]
    fn device_bound(&self) -> bool {
        self.fused.get().is_some()
    }

    #[signature(() ..a -> "int")]
    /// Checks a device step whose inputs may be int32 or int64 (before anything is bound or
    /// narrowed); returns the number of requests. Arguments as [`device_step`].
    fn check_device_step(&self,) -> PyResult<u64> {
        Ok(kernels::check_step(self.inner.device(), &a.inputs(), self.inner.num_groups() as u32, StepCheck::BeforeNarrowing)?.requests)
    }

    #[signature(() ..a -> "tuple[KernelLaunch | None, int, bool]")]
    /// One device step from the caller's tensors: `(launch, requests, narrow)`. With `narrow` false
    /// the launch is ready (`None`: nothing to launch); with `narrow` true every input passed the
    /// checks but some must first be narrowed to int32 or made contiguous on the device (then call
    /// again with the converted tensors). The guard is checked first.
    ///
    /// Arguments: `block_table`, `src_col`, `second` (`dst_col`, or `running` with a
    /// `block_size`), `num_accepted`, optionally `err` and `num_accepted_out` (positionally in this
    /// order, the launch path: no keyword dictionary per step, or by keyword), and the keyword
    /// options `block_size` and `pre_copy`.
    fn device_step(&self, py: Python<'_>,) -> PyResult<(Option<KernelLaunch>, u64, bool)> {
        self.check_guards(py)?;
        let fused = self.fused()?;
        let inputs = a.inputs();
        match fused.launch(&inputs, a.pre_copy) {
            Ok(l) => Ok((l.map(KernelLaunch::new), a.src_col.0.shape.first().copied().unwrap_or(0).max(0) as u64, false)),
            Err(_) => Ok((None, fused.check(&inputs)?, true)),
        }
    }

    #[signature((launch: "Callable[[KernelLaunch | None, int], object]",) ..a -> "tuple[int, bool]")]
    /// One guarded device step: the guard and the inputs are checked as by `device_step`; when the
    /// launch is ready, `launch(kernel_launch_or_None, requests)` runs and the states are recorded
    /// as written, all in this call. Returns `(requests, narrow)`: with `narrow` true nothing ran
    /// (narrow the inputs to int32 on the device and call again). Arguments after `launch` as
    /// `device_step`'s.
    fn launch_step(&self, py: Python<'_>, launch: &Bound<'_, PyAny>,) -> PyResult<(u64, bool)> {
        let fused = self.fused()?;
        let inputs = a.inputs();
        self.check_guards(py)?;
        match fused.launch(&inputs, a.pre_copy) {
            Ok(l) => {
                let n = a.src_col.0.shape.first().copied().unwrap_or(0).max(0) as u64;
                launch.call1((l.map(KernelLaunch::new), n))?;
                self.guard.mark_written(py)?;
                Ok((n, false))
            }
            Err(_) => Ok((fused.check(&inputs)?, true)),
        }
    }

    fn __repr__(&self) -> String {
        let sizes: Vec<String> = self.inner.bindings().map(|b| format!("{} x {} layers", b.layout().backend(), b.num_layers())).collect();
        format!("Planner([{}], blocks={}, device={})", sizes.join(", "), self.inner.max_blocks(), self.inner.device())
    }
}
}

/// The published-block calls' `group` (default 0): a host integer in `0..` (`PlanError` naming
/// it otherwise: negative, past 64 bits, a bool, a float; never PyO3's bare `OverflowError`).
fn group_arg(group: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
    group.map_or(Ok(0), |g| usize::arg(g, "group", ErrorKind::Plan))
}
