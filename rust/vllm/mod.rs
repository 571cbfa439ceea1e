//! vLLM's align-mode recurrent-state step (`mamba_cache_mode == "align"`): the decisions
//! ([`decide`]: which column each request's running state moves from and to, and where the state
//! at a crossed block boundary is saved), the same decisions turned into one [`CopyPlan`] over
//! every group of a [`Planner`] (the host path), and a step's host half staged for the fused
//! kernel ([`device_step`]: the device path, where the kernel applies the accepted counts).

pub mod decide;
pub mod device_step;
pub mod slots;

pub use decide::{row_name, PostDecision, PostInputs, PreColumns, PreDecision, PreInputs, StepConfig, NULL_BLOCK};

use crate::error::{Error, Result};
use crate::plan::{CopyPlan, GroupTable, Planner, Semantics, Step};

/// Checks a step's scheduling parameters against its planner's groups: vLLM's block size is
/// required (`>= 1`, the planner checked its range), and `num_spec_blocks` must be the groups'
/// shared `num_spec`.
pub fn check_step(planner: &Planner, block_size: Option<i64>, num_spec_blocks: i64) -> Result<StepConfig> {
    let Some(block_size) = block_size else {
        return Err(Error::plan("block_size is required: vLLM's step decisions need the groups' tokens per block"));
    };
    if num_spec_blocks < 0 {
        return Err(Error::plan(format!("num_spec_blocks = {num_spec_blocks} must be >= 0")));
    }
    if num_spec_blocks != planner.num_spec() as i64 {
        return Err(Error::layout(format!(
            "the groups' layouts have num_spec = {}, but num_spec_blocks is {num_spec_blocks}; every group shares the step's speculative blocks",
            planner.num_spec()
        )));
    }
    Ok(StepConfig { block_size, num_spec_blocks })
}

/// The step configuration of `planner`'s groups: their shared `num_spec` and vLLM's block size.
pub fn config(planner: &Planner, block_size: i64) -> StepConfig {
    StepConfig { block_size, num_spec_blocks: planner.num_spec() as i64 }
}

/// The pre-copy decision ([`decide::pre_copy`]) and its copies, pre-copy semantics, in one plan.
pub fn pre_copy(
    planner: &Planner,
    inp: &PreInputs<'_>,
    tables: &[GroupTable<'_>],
    block_size: i64,
    name: &dyn Fn(usize) -> String,
) -> Result<(PreDecision, CopyPlan)> {
    let d = decide::pre_copy(inp, tables, &config(planner, block_size), name)?;
    let accepted: Vec<i64> = d.bias.iter().map(|b| b + 1).collect();
    let step = Step { tables, src_col: &d.src_col, dst_col: &d.curr, num_accepted: &accepted, semantics: Semantics::PreCopy };
    let plan = planner.plan(&step)?;
    Ok((d, plan))
}

/// The post-process decision ([`decide::post_process`]) and its copies, post-process semantics,
/// in one plan.
pub fn post_process(
    planner: &Planner,
    inp: &PostInputs<'_>,
    tables: &[GroupTable<'_>],
    block_size: i64,
    name: &dyn Fn(usize) -> String,
) -> Result<(PostDecision, CopyPlan)> {
    let d = decide::post_process(inp, tables, &config(planner, block_size), name)?;
    let accepted: Vec<i64> = d.bias.iter().map(|b| b + 1).collect();
    let step = Step { tables, src_col: &d.src_col, dst_col: &d.dest, num_accepted: &accepted, semantics: Semantics::PostProcess };
    let plan = planner.plan(&step)?;
    Ok((d, plan))
}
