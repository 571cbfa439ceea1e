//! Bindings for the checkpoint policies: a cache an engine can drive request by request
//! (`CheckpointCache`), and the trace replay (`simulate_checkpoints`).

use super::conversion::{arg_error, type_name, Arg};
use super::planner::Planner;
use crate::checkpoint::policy::Plan;
use crate::checkpoint::{self, trace, CheckpointCache as Core, Config, Param, PolicyKind, TraceRequest};
use crate::error::{Error, ErrorKind};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::sync::atomic::{AtomicBool, Ordering};

/// Token ids: a list, a tuple or any other sequence (a numpy array, a range) of ints in
/// `0 ..= 2**32 - 1`. A bool is not a token id, and neither is a `str`, `bytes` or `bytearray`
/// (read item by item they would be characters or bytes, not the engine's ids); a refused item is
/// named by its index.
fn tokens(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u32>> {
    use pyo3::types::{PyBool, PyByteArray, PyBytes, PySequence, PyString, PyTuple};
    let refused = |detail: String| arg_error(ErrorKind::Plan, format!("{what} must be a list of token ids (ints in 0 ..= 2**32 - 1){detail}"));
    let item = |i: usize, x: Bound<'_, PyAny>| -> PyResult<u32> {
        match x.extract::<u32>() {
            Ok(t) if !x.is_instance_of::<PyBool>() => Ok(t),
            _ => Err(refused(format!("; item {i} is {}", x.repr().map(|r| r.to_string()).unwrap_or_default()))),
        }
    };
    if let Ok(list) = obj.cast::<PyList>() {
        return list.iter().enumerate().map(|(i, x)| item(i, x)).collect();
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        return tuple.iter().enumerate().map(|(i, x)| item(i, x)).collect();
    }
    let text = obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() || obj.is_instance_of::<PyByteArray>();
    // An ordered run of items: a sequence, an array or tensor (array interface, DLPack), an
    // iterator (a generator); not text, and not an unordered collection (a set, a dict's keys).
    let has = |name: &str| obj.hasattr(name).unwrap_or(false);
    let sequence = !text && (obj.cast::<PySequence>().is_ok() || has("__array_interface__") || has("__dlpack__") || has("__next__"));
    let Some(items) = sequence.then(|| obj.try_iter().ok()).flatten() else { return Err(refused(format!(", got {}", type_name(obj)))) };
    items.enumerate().map(|(i, x)| item(i, x?)).collect()
}

/// The default block size: vLLM's hybrid block for Qwen3-Next-80B at TP=2.
const DEFAULT_BLOCK: usize = 1056;
/// The default granularity: the chunk of GDN's chunked scan.
const DEFAULT_GRANULARITY: usize = 64;

type Opt<'a, 'py> = Option<&'a Bound<'py, PyAny>>;

fn opt_int<T: Arg>(obj: Opt<'_, '_>, name: &str) -> PyResult<Option<T>> {
    obj.map(|o| Option::<T>::arg(o, name, ErrorKind::Plan)).transpose().map(Option::flatten)
}

/// The configuration parameter `p` (None: not given) as a `T`. A negative int is refused with the
/// core's rule for `p` (it is refused at 0 too, so the conversion's "must be >= 0" would mislead);
/// anything else the conversion refuses keeps its error (not an int, too large).
fn param<T: Arg>(obj: Opt<'_, '_>, p: Param) -> PyResult<Option<T>> {
    let Some(obj) = obj else { return Ok(None) };
    Option::<T>::arg(obj, p.name(), ErrorKind::Plan).map_err(|e| match negative_int(obj) {
        Some(shown) => p.refused(shown).into(),
        None => e,
    })
}

/// `obj` as Python shows it when it is a negative host integer (a Python or numpy int; a bool is
/// none), else None: an argument whose rule refuses 0 as well says so for a negative value, which
/// the unsigned conversion would answer with "must be >= 0".
fn negative_int(obj: &Bound<'_, PyAny>) -> Option<String> {
    use pyo3::types::{PyBool, PyInt};
    // An int past i64 is compared as a Python int.
    let negative = i64::arg(obj, "value", ErrorKind::Plan).is_ok_and(|v| v < 0)
        || (obj.is_instance_of::<PyInt>() && !obj.is_instance_of::<PyBool>() && obj.lt(0).unwrap_or(false));
    negative.then(|| obj.str().map_or_else(|_| "<a negative int too long to print>".to_owned(), |s| s.to_string()))
}

/// The policy's name as a `PolicyKind`; anything but one of the names (a non-string included) is a
/// `PlanError` listing them.
fn policy_arg(policy: &Bound<'_, PyAny>) -> PyResult<PolicyKind> {
    let name = match policy.cast::<pyo3::types::PyString>() {
        Ok(name) => name.to_cow()?.into_owned(),
        // Never a policy's name: the parse error lists the names and shows what was given.
        Err(_) => format!("<{} {}>", type_name(policy), policy.repr().map(|r| r.to_string()).unwrap_or_default()),
    };
    Ok(PolicyKind::parse(&name)?)
}

/// The configuration from the binding's arguments; every integer is converted naming its argument
/// (a negative one refused with the core's rule for it), and the core checks the values.
fn config(
    policy: &Bound<'_, PyAny>,
    block_size: Opt<'_, '_>,
    granularity: Opt<'_, '_>,
    budget: Opt<'_, '_>,
    budget_bytes: Opt<'_, '_>,
    state_bytes: Opt<'_, '_>,
) -> PyResult<Config> {
    let policy = policy_arg(policy)?;
    let block_size = param::<usize>(block_size, Param::BlockSize)?.unwrap_or(DEFAULT_BLOCK);
    let granularity = param::<usize>(granularity, Param::Granularity)?.unwrap_or(DEFAULT_GRANULARITY);
    let budget =
        checkpoint::resolve_budget(param(budget, Param::Budget)?, param(budget_bytes, Param::BudgetBytes)?, param(state_bytes, Param::StateBytes)?)?;
    Ok(Config::new(policy, block_size, granularity, budget)?)
}

/// An optional value as Python writes it: the value, or `None`.
fn shown<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "None".to_owned(), |v| v.to_string())
}

/// Refuses `block` (named `name`) as a destination the caller writes outside the planner's plans:
/// outside group `g`'s blocks, the null block, or published; `why` says who writes it.
fn writable(planner: &crate::plan::Planner, g: usize, block: u64, name: &str, why: &str) -> PyResult<()> {
    let holders = planner.holders(g, block)?;
    let blocks = planner.bindings().nth(g).map_or(0, |b| b.num_blocks());
    if block == 0 || block >= blocks {
        return Err(outside(planner, g, block, name).into());
    }
    if holders > 0 {
        return Err(Error::plan(format!(
            "{name} = {block} holds a published state ({holders} holder(s): a checkpoint, the one a request would start from \
             included, or a block shared by requests); {why}"
        ))
        .into());
    }
    Ok(())
}

/// The error for the block id `block` (shown as given; the argument `name`) outside group `g`'s
/// writable blocks.
fn outside(planner: &crate::plan::Planner, g: usize, block: impl std::fmt::Display, name: &str) -> Error {
    let last = planner.bindings().nth(g).map_or(0, |b| b.num_blocks()).saturating_sub(1);
    Error::plan(format!("{name} = {block} is outside 1 ..= {last} of group {g} (the null block 0 holds no state and is never written)"))
}

/// The block id `obj` (the argument `name`) of group `g`, for [`writable`]: a negative int is
/// outside the group's blocks like any other (the null block 0 is refused too, so the
/// conversion's "must be >= 0" would mislead); a group that does not exist is named first.
fn block_arg(planner: &crate::plan::Planner, g: usize, obj: &Bound<'_, PyAny>, name: &str) -> PyResult<u64> {
    match u64::arg(obj, name, ErrorKind::Plan) {
        Ok(block) => Ok(block),
        Err(e) => {
            let Some(shown) = negative_int(obj) else { return Err(e) };
            planner.holders(g, 0)?;
            Err(outside(planner, g, shown, name).into())
        }
    }
}

/// The plan of one request: the checkpoint to start from and the positions its prefill saves.
#[pyclass(module = "recoverssm_rs._core", frozen)]
pub struct CheckpointPlan {
    inner: Plan,
    /// Set once `finish` accepted the plan: a request ends once.
    finished: AtomicBool,
}

#[pymethods]
impl CheckpointPlan {
    /// Prompt tokens covered by the checkpoint started from (0 on a miss).
    #[getter]
    fn hit_position(&self) -> usize {
        self.inner.hit.map_or(0, |h| h.position)
    }
    /// The checkpoint's handle, or None on a miss.
    #[getter]
    fn hit_handle(&self) -> Option<u64> {
        self.inner.hit.map(|h| h.handle)
    }
    /// Positions (ascending) whose state the prefill saves.
    #[getter]
    fn saves(&self) -> Vec<usize> {
        self.inner.saves.clone()
    }
    /// Checkpoints the cache evicted when it planned the request (`sglang-lru` at a full budget:
    /// the request takes a state slot of its own), in eviction order: they are no longer live, so
    /// their storage is free now; `finish` does not report them again.
    #[getter]
    fn evicted(&self) -> Vec<u64> {
        self.inner.evicted.clone()
    }
    fn __repr__(&self) -> String {
        format!(
            "CheckpointPlan(hit_position={}, hit_handle={}, saves={:?}, evicted={:?})",
            self.hit_position(),
            shown(self.hit_handle()),
            self.inner.saves,
            self.inner.evicted
        )
    }
}

/// A checkpoint cache under one policy; see the core's `checkpoint` module.
#[pyclass(module = "recoverssm_rs._core")]
pub struct CheckpointCache {
    inner: Core,
}

#[pymethods]
impl CheckpointCache {
    #[new]
    #[pyo3(signature = (
        policy: "str", *, block_size: "int | None" = None, granularity: "int | None" = None, budget: "int | None" = None,
        budget_bytes: "int | None" = None, state_bytes: "int | None" = None,
    ))]
    fn new(
        policy: &Bound<'_, PyAny>,
        block_size: Opt<'_, '_>,
        granularity: Opt<'_, '_>,
        budget: Opt<'_, '_>,
        budget_bytes: Opt<'_, '_>,
        state_bytes: Opt<'_, '_>,
    ) -> PyResult<Self> {
        Ok(Self { inner: Core::new(config(policy, block_size, granularity, budget, budget_bytes, state_bytes)?) })
    }
    /// The checkpoint to start `prompt` from and the positions to save during its prefill; the
    /// checkpoints evicted to admit it (`sglang-lru`) are the plan's `evicted`.
    #[pyo3(signature = (prompt: "Sequence[int]") -> "CheckpointPlan")]
    fn plan(&mut self, prompt: &Bound<'_, PyAny>) -> PyResult<CheckpointPlan> {
        let p = tokens(prompt, "prompt")?;
        Ok(CheckpointPlan { inner: self.inner.plan(&p)?, finished: AtomicBool::new(false) })
    }
    /// The handle of the checkpoint `plan(prompt)` would start from, or None; changes nothing (no
    /// use is counted, nothing is evicted), so an engine can prepare the hit's copy and plan only
    /// once the copy is accepted.
    #[pyo3(signature = (prompt: "Sequence[int]") -> "int | None")]
    fn peek(&self, prompt: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
        let p = tokens(prompt, "prompt")?;
        Ok(self.inner.peek(&p)?.map(|h| h.handle))
    }
    /// Ends a request planned by `plan`: returns `(written, evicted)`, `written` as
    /// `[(position, handle)]`, `evicted` as the handles the request's end evicted (those evicted
    /// when it was planned are the plan's `evicted`). A plan is finished once, by the cache that
    /// made it, with the prompt it was made for (its length is checked); anything else is a
    /// PlanError and nothing changes.
    #[allow(clippy::type_complexity)]
    #[pyo3(signature = (prompt: "Sequence[int]", output: "Sequence[int]", plan: "CheckpointPlan") -> "tuple[list[tuple[int, int]], list[int]]")]
    fn finish(
        &mut self,
        prompt: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        plan: PyRef<'_, CheckpointPlan>,
    ) -> PyResult<(Vec<(usize, u64)>, Vec<u64>)> {
        let p = tokens(prompt, "prompt")?;
        let o = tokens(output, "output")?;
        if plan.finished.load(Ordering::Acquire) {
            return Err(Error::plan("this plan was already finished: a request ends once (plan it again to run it again)").into());
        }
        let f = self.inner.finish(&p, &o, &plan.inner)?;
        plan.finished.store(true, Ordering::Release);
        Ok((f.written, f.evicted))
    }
    /// The position of a live checkpoint, or None. A handle that is not an int in
    /// `0 ..= 2**64 - 1` is a PlanError naming it.
    #[pyo3(signature = (handle: "int") -> "int | None")]
    fn position(&self, handle: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
        Ok(self.inner.position(u64::arg(handle, "handle", ErrorKind::Plan)?))
    }
    /// Forgets live checkpoints that `finish` placed but the engine could not materialise (its
    /// copy of their state failed): as if they had not been written. A handle that is not live
    /// is a PlanError naming it, and nothing changes.
    #[pyo3(signature = (handles: "Sequence[int]") -> "None")]
    fn discard(&mut self, handles: &Bound<'_, PyAny>) -> PyResult<()> {
        let mut hs = Vec::new();
        let items = handles
            .try_iter()
            .map_err(|_| arg_error(ErrorKind::Plan, format!("handles must be a list of checkpoint handles (ints), got {}", type_name(handles))))?;
        for (i, h) in items.enumerate() {
            hs.push(u64::arg(&h?, &format!("handles[{i}]"), ErrorKind::Plan)?);
        }
        Ok(self.inner.discard(&hs)?)
    }
    /// Checks the block a request is to run in before a checkpoint store starts it: an int naming
    /// a block of `planner`'s group `group` (default 0) other than the null block 0, and not
    /// published. The request's prefill writes its running block, so a published block (another
    /// checkpoint, a block shared by requests, or the very checkpoint the request starts from:
    /// copied onto itself it would then be written in place) is refused, and so is one of
    /// `reserved` (a store's free reserved blocks: the next checkpoint would be copied into the
    /// block the request is writing). Returns the block.
    #[staticmethod]
    #[pyo3(signature = (planner: "Planner", running_block: "int", *, group: "int" = None, reserved: "Sequence[int] | None" = None) -> "int")]
    fn check_running_block(
        planner: PyRef<'_, Planner>,
        running_block: &Bound<'_, PyAny>,
        group: Opt<'_, '_>,
        reserved: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        let g = opt_int::<usize>(group, "group")?.unwrap_or(0);
        let block = block_arg(&planner.inner, g, running_block, "running_block")?;
        if let Some(reserved) = reserved.filter(|r| !r.is_none()) {
            let ids = super::conversion::Ints::arg(reserved, "reserved", ErrorKind::Plan)?.0;
            if ids.contains(&(block as i64)) {
                return Err(arg_error(
                    ErrorKind::Plan,
                    format!(
                        "running_block = {block} is one of the checkpoint store's free reserved blocks (the next checkpoint would be \
                         copied into the block the request writes): give the request a block of its own"
                    ),
                ));
            }
        }
        writable(
            &planner.inner,
            g,
            block,
            "running_block",
            "a request's prefill writes its running block: give it a block of its own, where the checkpoint is copied (copy-on-write)",
        )?;
        Ok(block)
    }
    /// Checks the blocks a checkpoint store reserves for its checkpoints (any iterable of block
    /// ids): each an int naming a block of `planner`'s group `group` (default 0) other than the
    /// null block 0, none twice, none published (the store copies checkpoints into them). Returns
    /// them as a list.
    #[staticmethod]
    #[pyo3(signature = (planner: "Planner", blocks: "Iterable[int]", *, group: "int" = None) -> "list[int]")]
    fn check_reserved_blocks(planner: PyRef<'_, Planner>, blocks: &Bound<'_, PyAny>, group: Opt<'_, '_>) -> PyResult<Vec<u64>> {
        let g = opt_int::<usize>(group, "group")?.unwrap_or(0);
        let items = blocks
            .try_iter()
            .map_err(|_| arg_error(ErrorKind::Plan, format!("blocks must be a sequence of block ids (ints), got {}", type_name(blocks))))?;
        let mut out = Vec::new();
        let mut first = std::collections::HashMap::new();
        for (i, b) in items.enumerate() {
            let name = format!("blocks[{i}]");
            let block = block_arg(&planner.inner, g, &b?, &name)?;
            if let Some(j) = first.insert(block, i) {
                return Err(Error::plan(format!("{name} = {block} repeats blocks[{j}]: each reserved block holds one checkpoint")).into());
            }
            writable(&planner.inner, g, block, &name, "the store copies checkpoints into its reserved blocks: reserve free blocks")?;
            out.push(block);
        }
        Ok(out)
    }
    /// The most checkpoints held at once so far.
    #[getter]
    fn peak(&self) -> usize {
        self.inner.peak()
    }
    fn __len__(&self) -> usize {
        self.inner.len()
    }
    fn __repr__(&self) -> String {
        let c = self.inner.config();
        format!(
            "CheckpointCache(policy='{}', block_size={}, granularity={}, budget={}, live={})",
            c.policy.name(),
            c.block_size,
            c.granularity,
            shown(c.budget),
            self.inner.len()
        )
    }
}

/// The requests of a trace, converted and checked (at least one, fields, unique ids, arrival
/// order); `source` names the trace in errors (a path), when given.
fn trace_requests(requests: &Bound<'_, PyAny>, source: Option<&str>) -> PyResult<Vec<TraceRequest>> {
    let mut reqs = Vec::new();
    let mut lines = Vec::new();
    for (i, item) in requests.try_iter()?.enumerate() {
        let item = item?;
        let (line, id, arrival, prompt, output): (usize, Bound<'_, PyAny>, Bound<'_, PyAny>, Bound<'_, PyAny>, Bound<'_, PyAny>) =
            item.extract().map_err(|_| arg_error(ErrorKind::Plan, format!("requests[{i}] must be a tuple (line, id, arrival, prompt, output)")))?;
        let at = |field: &str| format!("trace line {line}: \"{field}\"");
        for (field, v) in [("id", &id), ("arrival", &arrival), ("prompt", &prompt), ("output", &output)] {
            if v.is_none() {
                return Err(arg_error(ErrorKind::Plan, format!("{} is missing (each line needs id, arrival, prompt and output)", at(field))));
            }
        }
        let id: String = id.extract().map_err(|_| arg_error(ErrorKind::Plan, format!("{} must be a string, got {}", at("id"), type_name(&id))))?;
        let arrival_ok = !arrival.is_instance_of::<pyo3::types::PyBool>();
        let arrival: f64 = arrival
            .extract()
            .ok()
            .filter(|_| arrival_ok)
            .ok_or_else(|| arg_error(ErrorKind::Plan, format!("{} must be a number, got {}", at("arrival"), type_name(&arrival))))?;
        let prompt = tokens(&prompt, &at("prompt"))?;
        let output = tokens(&output, &at("output"))?;
        reqs.push(TraceRequest::new(line, id, arrival, prompt, output)?);
        lines.push(line);
    }
    trace::check_trace(&reqs, &lines, &source.map(|s| format!("'{s}'")).unwrap_or_default())?;
    Ok(reqs)
}

/// Checks a trace's requests (`[(line, id, arrival, prompt, output)]`) as `simulate_checkpoints`
/// does; returns their number. `source`: the trace's name in errors (its path), when given.
#[pyfunction]
#[pyo3(signature = (requests: "Iterable[tuple[int, str, float, Sequence[int], Sequence[int]]]", *, source: "str | None" = None) -> "int")]
pub fn check_checkpoint_trace(requests: &Bound<'_, PyAny>, source: Option<&str>) -> PyResult<usize> {
    Ok(trace_requests(requests, source)?.len())
}

/// Replays a trace. `requests`: `[(line, id, arrival, prompt, output)]` in arrival order (`line`
/// names the request in errors; `source`, when given, the trace). Returns a dict of totals plus per-request lists `reused`,
/// `bound` and `writes`.
#[pyfunction]
#[pyo3(signature = (
    requests: "Iterable[tuple[int, str, float, Sequence[int], Sequence[int]]]", policy: "str", *, block_size: "int | None" = None,
    granularity: "int | None" = None, budget: "int | None" = None, budget_bytes: "int | None" = None, state_bytes: "int | None" = None,
    source: "str | None" = None,
) -> "dict[str, Any]")]
#[allow(clippy::too_many_arguments)]
pub fn simulate_checkpoints<'py>(
    py: Python<'py>,
    requests: &Bound<'py, PyAny>,
    policy: &Bound<'py, PyAny>,
    block_size: Opt<'_, 'py>,
    granularity: Opt<'_, 'py>,
    budget: Opt<'_, 'py>,
    budget_bytes: Opt<'_, 'py>,
    state_bytes: Opt<'_, 'py>,
    source: Option<&str>,
) -> PyResult<Bound<'py, PyDict>> {
    let cfg = config(policy, block_size, granularity, budget, budget_bytes, state_bytes)?;
    let reqs = trace_requests(requests, source)?;
    let (stats, outcomes) = py.detach(|| checkpoint::simulate(&reqs, cfg))?;
    let d = PyDict::new(py);
    d.set_item("policy", cfg.policy.name())?;
    d.set_item("block_size", cfg.block_size)?;
    d.set_item("granularity", cfg.granularity)?;
    d.set_item("budget_checkpoints", cfg.budget)?;
    d.set_item("requests", stats.requests)?;
    d.set_item("prompt_tokens", stats.prompt_tokens)?;
    d.set_item("reused_tokens", stats.reused_tokens)?;
    d.set_item("hit_requests", stats.hit_requests)?;
    d.set_item("checkpoint_writes", stats.checkpoint_writes)?;
    d.set_item("evictions", stats.evictions)?;
    d.set_item("peak_checkpoints", stats.peak_checkpoints)?;
    d.set_item("upper_bound_tokens", stats.upper_bound_tokens)?;
    d.set_item("reused", outcomes.iter().map(|o| o.reused).collect::<Vec<_>>())?;
    d.set_item("bound", outcomes.iter().map(|o| o.bound).collect::<Vec<_>>())?;
    d.set_item("writes", outcomes.iter().map(|o| o.written.len()).collect::<Vec<_>>())?;
    Ok(d)
}
