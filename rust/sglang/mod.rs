//! SGLang's mamba pool: the checks of the operations the package runs over it that no planner
//! covers. Slot ids are SGLang's (slot 0 is its dummy); copies between slots go through the
//! planner ([`crate::plan::Planner::plan_copy`]), which checks them.
//!
//! The speculative commit after verify moves, per request `r` whose accepted step is not
//! negative, the states its verify recorded at that step in scratch row `rows[r]` into slot
//! `slots[r]`; [`commit_selection`] checks every index of every pass before anything moves.

use crate::error::{Error, Result};

pub use checks::{check_host_copy, check_pool, check_slots, Repeats};

pub mod checks;
pub mod hicache;
pub mod host;
pub mod kernel;
pub mod layout;
pub mod pool;
#[cfg(test)]
mod tests;

/// The "no slot" marker of the commit's index vectors (a padded row).
pub const NO_SLOT: i64 = -1;
/// SGLang's dummy slot, which padded batches read and write; the package never writes it.
pub const DUMMY_SLOT: i64 = 0;

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

/// Per pass, the requests that write, after checking them: a row whose slot or step is the
/// marker [`NO_SLOT`], or whose slot is the dummy slot 0 (several padded rows may name it), is
/// padding and writes nothing; any other negative value is refused; one length for every vector,
/// steps inside the draft, slots inside the pool, scratch rows (`rows`, default the request's own
/// index) inside the scratch, and no slot written twice within a pass.
pub fn commit_selection(passes: &[CommitPass<'_>], rows: Option<&[i64]>, sizes: CommitSizes) -> Result<Vec<Vec<u32>>> {
    passes.iter().map(|p| select(p, rows, sizes)).collect()
}

fn select(p: &CommitPass<'_>, rows: Option<&[i64]>, sizes: CommitSizes) -> Result<Vec<u32>> {
    let name = p.name;
    let (slot_arg, step_arg) = if name == "track" { ("track_indices", "steps_to_track") } else { ("state_indices", "last_correct_step_indices") };
    let op = "commit_after_verify";
    let n = p.slots.len();
    let nrows = rows.map_or(n, <[i64]>::len);
    if p.steps.len() != n || nrows != n {
        return Err(Error::plan(format!(
            "{op}: {name}: {slot_arg}, {step_arg} and src_indices must have one length; got {n}, {}, {nrows}",
            p.steps.len()
        )));
    }
    if n > u32::MAX as usize {
        return Err(Error::plan(format!("{op}: {name}: too many requests ({n})")));
    }
    let mut take = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for r in 0..n {
        let (slot, step) = (p.slots[r], p.steps[r]);
        for (arg, v) in [(slot_arg, slot), (step_arg, step)] {
            if v < NO_SLOT {
                return Err(Error::plan(format!(
                    "{op}: {arg}[{r}] = {v}: the only negative value allowed is {NO_SLOT} (a padded row, which writes nothing)"
                )));
            }
        }
        // Padding: no slot, no accepted step, or the dummy slot 0 (several padded rows may name
        // it): the row writes nothing.
        if slot == NO_SLOT || step == NO_SLOT || slot == DUMMY_SLOT {
            continue;
        }
        let row = rows.map_or(r as i64, |v| v[r]);
        if step as u64 >= sizes.draft {
            return Err(Error::plan(format!("{op}: {step_arg}[{r}] = {step} is past the draft (0 ..= {})", sizes.draft.saturating_sub(1))));
        }
        if slot as u64 >= sizes.num_slots {
            return Err(Error::plan(format!(
                "{op}: {slot_arg}[{r}] = {slot} is outside the pool's slots 0 ..= {}",
                sizes.num_slots.saturating_sub(1)
            )));
        }
        if row < 0 || row as u64 >= sizes.num_rows {
            return Err(Error::plan(format!(
                "{op}: src_indices[{r}] = {row}: the scratch row is outside 0 ..= {}",
                sizes.num_rows.saturating_sub(1)
            )));
        }
        if !seen.insert(slot) {
            return Err(Error::plan(format!("{op}: {slot_arg}[{r}] = {slot} is written by an earlier request too; two requests write one slot")));
        }
        take.push(r as u32);
    }
    Ok(take)
}
