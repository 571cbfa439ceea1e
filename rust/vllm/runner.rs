//! vLLM's model-runner objects as the step's groups: the core reader behind
//! `VllmMambaStep.from_runner`. The package translates vLLM's mamba specs, copy functions and
//! forward context into plain records ([`RunnerSpec`], one per group); this module checks them
//! (align mode, the conv orientation, each layer's tensors against its copy functions) and builds
//! each group's layout.

use crate::copy_funcs::CopyFuncKind;
use crate::error::{Error, Result};
use crate::layout::{Layout, StateSpec};

/// One mamba spec of vLLM's KV-cache config (a `MambaSpec`, by its fields), with the names of
/// its backend's copy functions in state order.
#[derive(Clone, Debug)]
pub struct RunnerSpec<'a> {
    pub mamba_type: &'a str,
    pub mamba_cache_mode: &'a str,
    pub shapes: &'a [Vec<i64>],
    pub dtypes: &'a [String],
    pub num_speculative_blocks: u32,
    pub copy_funcs: &'a [String],
}

/// The conv orientation the step's layouts use (`VLLM_SSM_CONV_STATE_LAYOUT`).
pub fn check_conv_layout(conv_layout: &str) -> Result<&str> {
    match conv_layout {
        "SD" | "DS" => Ok(conv_layout),
        other => Err(Error::layout(format!("conv_layout must be 'SD' or 'DS' (VLLM_SSM_CONV_STATE_LAYOUT), got '{other}'"))),
    }
}

/// Checks the spec's cache mode (the step copies states in align mode only).
pub fn check_align(spec: &RunnerSpec<'_>) -> Result<()> {
    if spec.mamba_cache_mode != "align" {
        return Err(Error::layout(format!(
            "{}: mamba_cache_mode is '{}'; the step copies states only in 'align' mode",
            spec.mamba_type, spec.mamba_cache_mode
        )));
    }
    Ok(())
}

/// Checks one layer of group `gid`: present in the forward context (`kv_cache`: its number of
/// tensors, `None` when absent) with a tensor per copy function.
pub fn check_layer(gid: i64, layer: &str, kv_cache: Option<usize>, copy_funcs: usize) -> Result<()> {
    let at = format!("group {gid}, layer '{layer}'");
    match kv_cache {
        None => Err(Error::binding(format!("{at}: not in the forward context"))),
        Some(n) if n < copy_funcs => Err(Error::binding(format!("{at}: {n} kv_cache tensors, but {copy_funcs} copy functions"))),
        Some(_) => Ok(()),
    }
}

/// The layout of a group: one persistent state per copy function (`conv{i}` / `temporal{i}`, the
/// spec's shape and dtype at that index), conv windows in `conv_layout`.
pub fn runner_layout(spec: &RunnerSpec<'_>, conv_layout: &str) -> Result<Layout> {
    let mut states = Vec::with_capacity(spec.copy_funcs.len());
    for (i, f) in spec.copy_funcs.iter().enumerate() {
        let kind = CopyFuncKind::parse(f).ok_or_else(|| Error::layout(format!("copy function {f:?} is neither a conv nor a temporal copy")))?;
        let (shape, dtype) = match (spec.shapes.get(i), spec.dtypes.get(i)) {
            (Some(s), Some(d)) => (s, d),
            _ => return Err(Error::layout(format!("{}: copy function {i} has no state shape and dtype", spec.mamba_type))),
        };
        let orient = (kind == CopyFuncKind::Conv).then_some(conv_layout);
        states.push(StateSpec::from_parts(&format!("{}{i}", kind.name()), shape, dtype, "persistent", Some(kind.name()), orient)?);
    }
    Layout::new(spec.mamba_type, states, spec.num_speculative_blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_becomes_a_layout_after_its_checks() {
        let shapes = [vec![6, 4], vec![2, 3, 3]];
        let dtypes = ["torch.bfloat16".to_string(), "torch.float32".to_string()];
        let funcs = ["get_conv_copy_spec".to_string(), "get_temporal_copy_spec".to_string()];
        let spec = RunnerSpec {
            mamba_type: "gdn_attention",
            mamba_cache_mode: "align",
            shapes: &shapes,
            dtypes: &dtypes,
            num_speculative_blocks: 2,
            copy_funcs: &funcs,
        };
        let l = runner_layout(&spec, "DS").unwrap();
        assert_eq!((l.backend(), l.num_spec(), l.states().len()), ("gdn_attention", 2, 2));
        assert_eq!(l.states()[1].name, "temporal1");
        assert!(check_align(&RunnerSpec { mamba_cache_mode: "all", ..spec.clone() }).unwrap_err().message.contains("'all'"));
        assert!(check_conv_layout("XY").unwrap_err().message.contains("got 'XY'"));
        assert_eq!(check_layer(1, "l0", None, 2).unwrap_err().message, "group 1, layer 'l0': not in the forward context");
        assert_eq!(check_layer(1, "l0", Some(1), 2).unwrap_err().message, "group 1, layer 'l0': 1 kv_cache tensors, but 2 copy functions");
        let bad = ["other".to_string()];
        assert!(runner_layout(&RunnerSpec { copy_funcs: &bad, ..spec }, "SD").unwrap_err().message.contains("neither"));
    }
}
