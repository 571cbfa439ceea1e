//! vLLM's align-mode recurrent-state step (`mamba_cache_mode == "align"`): the decisions
//! ([`decide`]: which column each request's running state moves from and to, and where the state
//! at a crossed block boundary is saved), the same decisions turned into one [`CopyPlan`] over
//! every group of a [`Planner`] (the host path), and a step's host half staged for the fused
//! kernel ([`device_step`]: the device path, where the kernel applies the accepted counts).

pub mod decide;
pub mod device_step;
pub mod runner;
pub mod slot_commit;
pub mod slot_step;
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

/// What a host half-step is decided against: the groups' block tables, vLLM's block size and the
/// requests' names for errors.
pub struct HostStep<'a> {
    pub tables: &'a [GroupTable<'a>],
    pub block_size: i64,
    pub name: &'a dyn Fn(usize) -> String,
}

/// The moves `dst_col <- src_col` carrying `bias + 1` accepted tokens, planned over every group.
fn plan_moves(planner: &Planner, at: &HostStep<'_>, src_col: &[i64], dst_col: &[i64], bias: &[i64], semantics: Semantics) -> Result<CopyPlan> {
    let accepted: Vec<i64> = bias.iter().map(|b| b + 1).collect();
    planner.plan(&Step { tables: at.tables, src_col, dst_col, num_accepted: &accepted, semantics })
}

/// The pre-copy decision ([`decide::pre_copy`]) and its copies, pre-copy semantics, in one plan.
pub fn pre_copy(planner: &Planner, inp: &PreInputs<'_>, at: &HostStep<'_>) -> Result<(PreDecision, CopyPlan)> {
    let d = decide::pre_copy(inp, at.tables, &config(planner, at.block_size), at.name)?;
    let plan = plan_moves(planner, at, &d.src_col, &d.curr, &d.bias, Semantics::PreCopy)?;
    Ok((d, plan))
}

/// The post-process decision ([`decide::post_process`]) and its copies, post-process semantics,
/// in one plan.
pub fn post_process(planner: &Planner, inp: &PostInputs<'_>, at: &HostStep<'_>) -> Result<(PostDecision, CopyPlan)> {
    let d = decide::post_process(inp, at.tables, &config(planner, at.block_size), at.name)?;
    let plan = plan_moves(planner, at, &d.src_col, &d.dest, &d.bias, Semantics::PostProcess)?;
    Ok((d, plan))
}
