//! `VllmMambaStep.from_runner`'s core reader ([`crate::vllm::runner`]): the package's plain record
//! of vLLM's mamba groups in, the step's groups (checked, with their layouts) out.

use super::layout::Layout;
use crate::vllm::runner::{self, RunnerSpec};
use pyo3::prelude::*;

/// A spec's fields: `(mamba_type, mamba_cache_mode, shapes, dtypes, num_speculative_blocks,
/// block_size)`.
type SpecRecord = (String, String, Vec<Vec<i64>>, Vec<String>, u32, i64);
/// A group: `(group id, spec, copy function names, [(layer, its kv_cache tensors or None)])`.
type GroupRecord<'py> = (i64, SpecRecord, Vec<String>, Vec<(String, Option<Vec<Bound<'py, PyAny>>>)>);
/// A step group: `(group id, layout, per layer the tensors of its copy functions)`.
type StepGroup<'py> = (i64, Layout, Vec<Vec<Bound<'py, PyAny>>>);

/// The step's groups from the record of vLLM's mamba groups (one per group id and spec, as the
/// package reads them): every spec in align mode, every layer in the forward context with a
/// tensor per copy function (the leading ones kept), the layouts in `conv_layout` (`"SD"` /
/// `"DS"`). Returns the groups and the first spec's `block_size` and `num_speculative_blocks`.
#[pyfunction]
#[pyo3(signature = (
    groups: "Sequence[tuple[int, tuple[str, str, Sequence[Sequence[int]], Sequence[str], int, int], Sequence[str], Sequence[tuple[str, Sequence[_Tensor] | None]]]]",
    conv_layout: "str",
) -> "tuple[list[tuple[int, Layout, list[list[_Tensor]]]], int, int]")]
pub(crate) fn vllm_runner_groups<'py>(groups: Vec<GroupRecord<'py>>, conv_layout: &str) -> PyResult<(Vec<StepGroup<'py>>, i64, u32)> {
    for (_, s, funcs, _) in &groups {
        runner::check_align(&as_spec(s, funcs))?;
    }
    let first = groups.first().map_or((0, 0), |(_, s, _, _)| (s.5, s.4));
    let mut out = Vec::with_capacity(groups.len());
    for (gid, s, funcs, layers) in groups {
        let n = funcs.len();
        let mut states = Vec::with_capacity(layers.len());
        for (layer, kv) in layers {
            runner::check_layer(gid, &layer, kv.as_ref().map(Vec::len), n)?;
            states.push(kv.unwrap_or_default().into_iter().take(n).collect());
        }
        let layout = runner::runner_layout(&as_spec(&s, &funcs), runner::check_conv_layout(conv_layout)?)?;
        out.push((gid, layout.into(), states));
    }
    Ok((out, first.0, first.1))
}

fn as_spec<'a>(s: &'a SpecRecord, funcs: &'a [String]) -> RunnerSpec<'a> {
    RunnerSpec { mamba_type: &s.0, mamba_cache_mode: &s.1, shapes: &s.2, dtypes: &s.3, num_speculative_blocks: s.4, copy_funcs: funcs }
}
