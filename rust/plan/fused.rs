//! The fused state copy of a bound planner: the kernel layer's [`FusedCopy`] constants taken from
//! the planner's states (the kernels know no planner; the planner fills their launch constants).

use super::Planner;
use crate::error::{Error, Result};
use crate::kernels::constants::KIND_TEMPORAL;
use crate::kernels::{state_chunks, FusedCopy};

impl FusedCopy {
    /// The fused copy of `planner`'s states, its table of [`Planner::state_meta`] records at
    /// device address `metas` and its own error word at `err`.
    pub fn for_planner(planner: &Planner, metas: u64, err: u64) -> Result<FusedCopy> {
        let meta = planner.state_meta();
        let max_bytes = meta.iter().map(|m| m.state_bytes).max().unwrap_or(0);
        let num_meta = u32::try_from(meta.len()).map_err(|_| Error::plan(format!("{} state metas exceed 2**32 - 1", meta.len())))?;
        FusedCopy {
            device: planner.device().clone(),
            metas,
            num_meta,
            max_accepted: planner.num_spec() as i32 + 1,
            num_blocks: planner.max_blocks() as i64,
            has_temporal: meta.iter().any(|m| m.kind == KIND_TEMPORAL),
            chunks: state_chunks(max_bytes),
            err,
            groups: planner.num_groups() as u32,
        }
        .checked()
    }
}
