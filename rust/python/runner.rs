//! The readers of vLLM's runner objects: `VllmMambaStep.from_runner`'s ([`crate::vllm::runner`]:
//! the package's plain record of vLLM's mamba groups in, the step's groups, checked and with their
//! layouts, out) and `VllmMambaStep.preprocess`'s per-request values.

use super::buffer::RawBuffer;
use super::conversion::{arg_error, items, reading, type_name, Arg};
use super::layout::Layout;
use crate::error::ErrorKind;
use crate::vllm::runner::{self, RunnerSpec};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyTuple};

/// A spec's fields as vLLM's spec holds them: `(mamba_type, mamba_cache_mode, shapes, dtypes,
/// num_speculative_blocks, block_size)`; the last four read by [`spec_of`], named in its errors.
type SpecRecord<'py> = (String, String, Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>);
/// A group: `(group id, spec, copy function names, [(layer name, its kv_cache tensors or None)])`.
type GroupRecord<'py> = (i64, SpecRecord<'py>, Vec<String>, Vec<(Bound<'py, PyAny>, Option<Vec<Bound<'py, PyAny>>>)>);
/// A mamba group of vLLM's config: `(group id, spec, layer names)`.
type MambaGroup<'py> = (usize, Bound<'py, PyAny>, Vec<Bound<'py, PyAny>>);
/// A step group: `(group id, layout, per layer the tensors of its copy functions)`.
type StepGroup<'py> = (i64, Layout, Vec<Vec<Bound<'py, PyAny>>>);

/// A spec's fields read: the names, the shapes, the dtypes (`str()` of each), the speculative
/// blocks and the block size.
struct Spec {
    mamba_type: String,
    mamba_cache_mode: String,
    shapes: Vec<Vec<i64>>,
    dtypes: Vec<String>,
    num_speculative_blocks: u32,
    block_size: i64,
}

/// The spec's fields converted; a field of another type or out of range is a `LayoutError` naming
/// the backend and the field.
fn spec_of(s: &SpecRecord<'_>) -> PyResult<Spec> {
    let kind = ErrorKind::Layout;
    let at = |field: &str| format!("{}: {field}", s.0);
    let shapes = items(&s.2, &at("shapes"), kind, "shapes")?
        .iter()
        .enumerate()
        .map(|(i, shape)| {
            let dims = items(shape, &at(&format!("shapes[{i}]")), kind, "integers")?;
            dims.iter().enumerate().map(|(j, d)| i64::arg(d, &at(&format!("shapes[{i}][{j}]")), kind)).collect()
        })
        .collect::<PyResult<Vec<Vec<i64>>>>()?;
    let dtypes = items(&s.3, &at("dtypes"), kind, "dtypes")?.iter().map(|d| Ok(d.str()?.to_string())).collect::<PyResult<Vec<String>>>()?;
    Ok(Spec {
        mamba_type: s.0.clone(),
        mamba_cache_mode: s.1.clone(),
        shapes,
        dtypes,
        num_speculative_blocks: u32::arg(&s.4, &at("num_speculative_blocks"), kind)?,
        block_size: i64::arg(&s.5, &at("block_size"), kind)?,
    })
}

/// The step's groups from the record of vLLM's mamba groups (one per group id and spec, as the
/// package reads them): every spec in align mode, every layer in the forward context with a
/// tensor per copy function (the leading ones kept), the layouts in `conv_layout` (`"SD"` /
/// `"DS"`). Returns the groups and the first spec's `block_size` and `num_speculative_blocks`.
/// A spec's field or a layer name of the wrong type is a `LayoutError` naming it.
#[pyfunction]
#[pyo3(signature = (
    groups: "Sequence[tuple[int, tuple[str, str, Sequence[Sequence[int]], Sequence[object], int, int], Sequence[str], Sequence[tuple[str, Sequence[_Tensor] | None]]]]",
    conv_layout: "str",
) -> "tuple[list[tuple[int, Layout, list[list[_Tensor]]]], int, int]")]
pub(crate) fn vllm_runner_groups<'py>(groups: Vec<GroupRecord<'py>>, conv_layout: &str) -> PyResult<(Vec<StepGroup<'py>>, i64, u32)> {
    let specs = groups.iter().map(|(_, s, _, _)| spec_of(s)).collect::<PyResult<Vec<Spec>>>()?;
    for ((_, _, funcs, _), s) in groups.iter().zip(&specs) {
        runner::check_align(&as_spec(s, funcs))?;
    }
    let first = specs.first().map_or((0, 0), |s| (s.block_size, s.num_speculative_blocks));
    let mut out = Vec::with_capacity(groups.len());
    for ((gid, _, funcs, layers), s) in groups.into_iter().zip(&specs) {
        let n = funcs.len();
        let mut states = Vec::with_capacity(layers.len());
        for (layer, kv) in layers {
            let layer: String = layer.extract().map_err(|_| {
                let shown = layer.repr().map_or_else(|_| "?".into(), |r| r.to_string());
                arg_error(ErrorKind::Layout, format!("group {gid}: layer name {shown} must be a string, got {}", type_name(&layer)))
            })?;
            runner::check_layer(gid, &layer, kv.as_ref().map(Vec::len), n)?;
            states.push(kv.unwrap_or_default().into_iter().take(n).collect());
        }
        let layout = runner::runner_layout(&as_spec(s, &funcs), runner::check_conv_layout(conv_layout)?)?;
        out.push((gid, layout.into(), states));
    }
    Ok((out, first.0, first.1))
}

/// vLLM's mamba groups in `kv_cache_config` (its `KVCacheConfig`, read by attribute) as `(group
/// id, spec, layer names)` in group order; a group whose layers use several specs
/// (`UniformTypeKVCacheSpecs.kv_cache_specs`) gives one entry per spec, compared by value (vLLM's
/// are frozen dataclasses; plain objects by identity). A spec is one with `mamba_type` and
/// `shapes`; attention groups are skipped. No mamba group, or a config that cannot be read, is a
/// `LayoutError`.
#[pyfunction]
#[pyo3(signature = (kv_cache_config: "Any") -> "list[tuple[int, Any, list[str]]]")]
pub(crate) fn vllm_mamba_groups<'py>(kv_cache_config: &Bound<'py, PyAny>) -> PyResult<Vec<MambaGroup<'py>>> {
    let py = kv_cache_config.py();
    let mut out: Vec<MambaGroup<'py>> = Vec::new();
    let mut read = || -> PyResult<()> {
        for (gid, group) in kv_cache_config.getattr(intern!(py, "kv_cache_groups"))?.try_iter()?.enumerate() {
            let group = group?;
            let spec = group.getattr(intern!(py, "kv_cache_spec"))?;
            let per_layer = match spec.getattr(intern!(py, "kv_cache_specs")) {
                Ok(specs) if !specs.is_none() => Some(specs),
                Ok(_) => None,
                Err(e) if e.is_instance_of::<pyo3::exceptions::PyAttributeError>(py) => None,
                Err(e) => return Err(e),
            };
            for layer in group.getattr(intern!(py, "layer_names"))?.try_iter()? {
                let layer = layer?;
                let spec = per_layer.as_ref().map_or_else(|| Ok(spec.clone()), |s| s.get_item(&layer))?;
                if !(spec.hasattr(intern!(py, "mamba_type"))? && spec.hasattr(intern!(py, "shapes"))?) {
                    continue;
                }
                let mut entry = None;
                for (i, e) in out.iter().enumerate() {
                    if e.0 == gid && (e.1.is(&spec) || e.1.eq(&spec)?) {
                        entry = Some(i);
                        break;
                    }
                }
                match entry {
                    Some(i) => out[i].2.push(layer),
                    None => out.push((gid, spec, vec![layer])),
                }
            }
        }
        Ok(())
    };
    read().map_err(|e| reading(ErrorKind::Layout, "kv_cache_config (vLLM's KVCacheConfig)", e))?;
    if out.is_empty() {
        return Err(arg_error(ErrorKind::Layout, "the KV-cache config has no mamba group (no spec with mamba_type and shapes)".into()));
    }
    Ok(out)
}

fn as_spec<'a>(s: &'a Spec, funcs: &'a [String]) -> RunnerSpec<'a> {
    RunnerSpec {
        mamba_type: &s.mamba_type,
        mamba_cache_mode: &s.mamba_cache_mode,
        shapes: &s.shapes,
        dtypes: &s.dtypes,
        num_speculative_blocks: s.num_speculative_blocks,
        copy_funcs: funcs,
    }
}

/// A step's per-request values, read from vLLM's objects for each request id `r` of `req_ids` (a
/// list of strings) in row order: `requests[r].num_computed_tokens`, `num_scheduled_tokens[r]` and
/// the draft tokens `len(spec_tokens.get(r, ()))`; `int64 [3, R]` in that order. A request missing
/// from `requests` or `num_scheduled_tokens`, or a value that is not an integer, is a `PlanError`
/// naming the request and its row.
#[pyfunction]
#[pyo3(signature = (
    req_ids: "Sequence[str]", requests: "Mapping[str, Any]", num_scheduled_tokens: "Mapping[str, int]",
    spec_tokens: "Mapping[str, Sequence[Any]]",
) -> "RawBuffer")]
pub(crate) fn vllm_request_values(
    req_ids: &Bound<'_, PyAny>,
    requests: &Bound<'_, PyAny>,
    num_scheduled_tokens: &Bound<'_, PyAny>,
    spec_tokens: &Bound<'_, PyAny>,
) -> PyResult<RawBuffer> {
    let kind = ErrorKind::Plan;
    let ids = items(req_ids, "input_batch.req_ids", kind, "request ids")?;
    let n = ids.len();
    let mut out = vec![0i64; 3 * n];
    let py = req_ids.py();
    let (computed, empty) = (intern!(py, "num_computed_tokens"), PyTuple::empty(py));
    for (i, r) in ids.iter().enumerate() {
        let name = || format!("request {} (row {i})", r.str().map_or_else(|_| "?".into(), |s| s.to_string_lossy().into_owned()));
        let missing = |what: &str| arg_error(kind, format!("{}: not in {what}", name()));
        let req = requests.get_item(r).map_err(|_| missing("requests"))?;
        // A Python int converts directly; anything else through the checked conversion, named.
        let int = |v: &Bound<'_, PyAny>, what: &str| match v.is_exact_instance_of::<PyInt>().then(|| v.extract::<i64>()) {
            Some(Ok(x)) => Ok(x),
            _ => i64::arg(v, &format!("{}: {what}", name()), kind),
        };
        let c = req.getattr(computed).map_err(|e| arg_error(kind, format!("{}: requests: {e}", name())))?;
        out[i] = int(&c, "num_computed_tokens")?;
        let s = num_scheduled_tokens.get_item(r).map_err(|_| missing("scheduler_output.num_scheduled_tokens"))?;
        out[n + i] = int(&s, "num_scheduled_tokens")?;
        let drafts = match spec_tokens.cast::<PyDict>() {
            Ok(d) => d.get_item(r).and_then(|x| x.map_or(Ok(0), |x| x.len())),
            Err(_) => spec_tokens.call_method1(intern!(py, "get"), (r, &empty)).and_then(|d| d.len()),
        };
        out[2 * n + i] = drafts.map_err(|e| arg_error(kind, format!("{}: scheduled_spec_decode_tokens: {e}", name())))? as i64;
    }
    Ok(RawBuffer::new(out))
}
