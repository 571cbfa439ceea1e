//! SGLang's mamba pool: the checks of the operations the package runs over it that no planner
//! covers. Slot ids are SGLang's (slot 0 is its dummy); copies between slots go through the
//! planner ([`crate::plan::Planner::plan_copy`]), which checks them.
//!
//! The speculative commit after verify moves, per request `r` whose accepted step is not
//! negative, the states its verify recorded at that step in scratch row `rows[r]` into slot
//! `slots[r]`; [`commit_selection`] checks every index of every pass before anything moves.

use crate::error::{Error, Result};

pub mod kernel;
#[cfg(test)]
mod tests;

/// One pass of the commit: the slots written and the step read per request.
#[derive(Clone, Copy, Debug)]
pub struct CommitPass<'a> {
    /// `"commit"` (the request's own slot) or `"track"` (the radix-tracking slot).
    pub name: &'a str,
    pub slots: &'a [i64],
    pub steps: &'a [i64],
}

/// The pool's sizes the commit is checked against.
#[derive(Clone, Copy, Debug)]
pub struct CommitSizes {
    /// Slots of the pool, the dummy slot 0 included (SGLang's `size + 1`).
    pub num_slots: u64,
    /// Rows of the verify scratch.
    pub num_rows: u64,
    /// Draft tokens per row (steps `0..draft`).
    pub draft: u64,
}

/// Per pass, the requests that write (step and slot not negative: SGLang's padding), after
/// checking them: one length for every vector, steps inside the draft, slots inside the pool,
/// scratch rows (`rows`, default the request's own index) inside the scratch, and no slot written
/// twice within a pass.
pub fn commit_selection(passes: &[CommitPass<'_>], rows: Option<&[i64]>, sizes: CommitSizes) -> Result<Vec<Vec<u32>>> {
    passes.iter().map(|p| select(p, rows, sizes)).collect()
}

fn select(p: &CommitPass<'_>, rows: Option<&[i64]>, sizes: CommitSizes) -> Result<Vec<u32>> {
    let name = p.name;
    let n = p.slots.len();
    let nrows = rows.map_or(n, <[i64]>::len);
    if p.steps.len() != n || nrows != n {
        return Err(Error::plan(format!("{name}: slots, steps and rows must have one length; got {n}, {}, {nrows}", p.steps.len())));
    }
    if n > u32::MAX as usize {
        return Err(Error::plan(format!("{name}: too many requests ({n})")));
    }
    let mut take = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for r in 0..n {
        let (slot, step) = (p.slots[r], p.steps[r]);
        if slot < 0 || step < 0 {
            continue;
        }
        let row = rows.map_or(r as i64, |v| v[r]);
        if step as u64 >= sizes.draft {
            return Err(Error::plan(format!("{name}: request {r}: step {step} is past the draft (0..{})", sizes.draft.saturating_sub(1))));
        }
        if slot as u64 >= sizes.num_slots {
            return Err(Error::plan(format!("{name}: request {r}: slot {slot} is outside 0..{}", sizes.num_slots.saturating_sub(1))));
        }
        if row < 0 || row as u64 >= sizes.num_rows {
            return Err(Error::plan(format!("{name}: request {r}: scratch row {row} is outside 0..{}", sizes.num_rows.saturating_sub(1))));
        }
        if !seen.insert(slot) {
            return Err(Error::plan(format!("{name}: request {r}: slot {slot} is written by an earlier request too; two requests write one slot")));
        }
        take.push(r as u32);
    }
    Ok(take)
}

/// A host copy of one layer-stacked state (`[layers, len(slots), ...]`) may be loaded into the
/// pool's tensor `[layers, slots + 1, ...]` only with the pool's dtype and shape (SGLang would
/// cast a mismatched dtype silently).
pub fn check_host_copy(state: &str, pool_dtype: &str, pool_shape: &[i64], host_dtype: &str, host_shape: &[i64], num_slots: usize) -> Result<()> {
    let mut want = pool_shape.to_vec();
    if want.len() < 2 {
        return Err(Error::plan(format!("load_cpu_copy: {state}: the pool tensor has shape {pool_shape:?}, not [layers, slots, ...]")));
    }
    want[1] = num_slots as i64;
    if pool_dtype != host_dtype || host_shape != want.as_slice() {
        return Err(Error::plan(format!(
            "load_cpu_copy: {state}: the host copy is {host_dtype} {host_shape:?}, the pool needs {pool_dtype} {want:?}"
        )));
    }
    Ok(())
}
