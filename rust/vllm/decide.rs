//! An engine step's align-mode decisions, vectorised over requests and taken once for every
//! recurrent group: the pre-copy before the forward pass (which column the running state moves
//! from and to, and the accepted-token offset it carries) and the post-process after sampling
//! (where the state after the last accepted token must be saved when it crosses a block
//! boundary). The formulas are vLLM 0.33's (`preprocess_mamba`, `postprocess_mamba_fused_kernel`),
//! with the consistency checks an engine needs added: every input is checked before a decision
//! is returned, and an error names the request.
//!
//! Columns index each group's own block table; the decision itself is the same for every group.

use crate::error::{Error, Result};
use crate::plan::GroupTable;

/// The null block: a block-table entry that holds no state.
pub const NULL_BLOCK: i64 = 0;

/// Scheduling parameters shared by every recurrent group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepConfig {
    /// Tokens per block (`>= 1`).
    pub block_size: i64,
    /// Speculative blocks after the running column (= draft tokens per step).
    pub num_spec_blocks: i64,
}

/// Per-request inputs of the pre-copy, one entry per scheduled request (request row).
pub struct PreInputs<'a> {
    /// Tokens already computed before this step.
    pub num_computed: &'a [i64],
    /// Tokens scheduled this step, drafts included (`>= 1`).
    pub num_scheduled: &'a [i64],
    /// Accepted tokens of the previous step (`1..=1 + num_spec_blocks`).
    pub num_accepted: &'a [i64],
    /// vLLM's `mamba_state_idx`: the stored running-state column, `-1` for none (a new, resumed
    /// or preempted request).
    pub mamba_state_idx: &'a [i64],
    /// Optional: which rows are new or resumed this step; such a row must hold no running column.
    pub fresh: Option<&'a [bool]>,
}

/// The pre-copy decision of every request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PreDecision {
    /// Column the running state is read from (`-1`: none, a fresh state).
    pub prev: Vec<i64>,
    /// The new running column, `(computed + scheduled - 1) // block_size`; store it per request.
    pub curr: Vec<i64>,
    /// `prev` where the state moves (`prev != -1 && prev != curr`), else `-1`.
    pub src_col: Vec<i64>,
    /// Accepted-token offset of the move (`num_accepted - 1`), 0 where nothing moves.
    pub bias: Vec<i64>,
    /// `num_accepted` after the step's reset: 1 where the state moved, unchanged elsewhere.
    pub num_accepted: Vec<i64>,
}

impl PreDecision {
    /// Requests whose state moves.
    pub fn num_copies(&self) -> usize {
        self.src_col.iter().filter(|&&c| c >= 0).count()
    }
}

/// Per-request inputs of the post-process (after sampling).
pub struct PostInputs<'a> {
    /// The running column the pre-copy stored for this step (`PreDecision::curr`).
    pub state_col: &'a [i64],
    /// Tokens computed before this step (the pre-copy's `num_computed`).
    pub num_computed: &'a [i64],
    pub num_scheduled: &'a [i64],
    /// Draft tokens among the scheduled ones.
    pub num_draft: &'a [i64],
    /// Tokens accepted this step, the bonus token included (`1..=1 + num_draft`).
    pub num_accepted: &'a [i64],
}

/// The post-process decision of every request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PostDecision {
    /// Tokens the running state covers (`computed + scheduled - drafts`).
    pub running: Vec<i64>,
    /// Tokens after acceptance rounded down to a block boundary.
    pub aligned: Vec<i64>,
    /// Column that must hold the state after `aligned` tokens (`aligned // block_size - 1`).
    pub dest: Vec<i64>,
    /// Accepted-token offset of the save (`aligned - running`), 0 where nothing is saved.
    pub bias: Vec<i64>,
    /// `state_col` where a save copies anything, else `-1`.
    pub src_col: Vec<i64>,
    /// `num_accepted` for the next step: 1 where the state was shifted in place, else unchanged.
    pub num_accepted: Vec<i64>,
}

impl PostDecision {
    pub fn num_copies(&self) -> usize {
        self.src_col.iter().filter(|&&c| c >= 0).count()
    }
}

fn check_config(cfg: &StepConfig) -> Result<()> {
    if cfg.block_size < 1 {
        return Err(Error::plan(format!("block_size must be >= 1, got {}", cfg.block_size)));
    }
    if cfg.num_spec_blocks < 0 {
        return Err(Error::plan(format!("num_spec_blocks must be >= 0, got {}", cfg.num_spec_blocks)));
    }
    Ok(())
}

fn check_lengths(r: usize, named: &[(&str, usize)]) -> Result<()> {
    if let Some((name, n)) = named.iter().find(|(_, n)| *n != r) {
        let all: Vec<String> = named.iter().map(|(k, n)| format!("{k} = {n}")).collect();
        return Err(Error::plan(format!("every per-request input needs one entry per request ({r}); {name} has {n} ({})", all.join(", "))));
    }
    Ok(())
}

fn check_tables(tables: &[GroupTable<'_>], r: usize) -> Result<()> {
    if tables.is_empty() {
        return Err(Error::plan("no recurrent group: pass one block table per group"));
    }
    for (g, t) in tables.iter().enumerate() {
        if t.cols == 0 || t.ids.len() % t.cols != 0 || t.ids.len() / t.cols < r {
            return Err(Error::plan(format!(
                "group {g}: block table must be [rows >= {r} requests, cols >= 1]; got {} ids for {} columns",
                t.ids.len(),
                t.cols
            )));
        }
    }
    Ok(())
}

/// Checks that column `col` (and the `extra` columns after it) of request `i` lie inside every
/// group's row and hold live (non-null, in-range) blocks; `what` names the columns in the error.
#[inline]
fn check_live(tables: &[GroupTable<'_>], i: usize, col: i64, extra: i64, what: &dyn Fn() -> String, name: &dyn Fn(usize) -> String) -> Result<()> {
    // Saturated: a column at the int64 limit is outside every row, not a wrapped negative end.
    let last = col.saturating_add(extra);
    for (g, t) in tables.iter().enumerate() {
        if col < 0 || last >= t.cols as i64 {
            return Err(outside_row(tables, g, i, col, last, what, name));
        }
        let row = &t.ids[i * t.cols..(i + 1) * t.cols];
        if row[col as usize..=last as usize].iter().any(|&id| id <= NULL_BLOCK) {
            return Err(not_live(tables, g, i, col, last, what, name));
        }
    }
    Ok(())
}

#[cold]
fn outside_row(
    tables: &[GroupTable<'_>],
    g: usize,
    i: usize,
    col: i64,
    last: i64,
    what: &dyn Fn() -> String,
    name: &dyn Fn(usize) -> String,
) -> Error {
    Error::plan(format!("{}: {}: columns {col} ..= {last} are outside group {g}'s block-table row ({} columns)", name(i), what(), tables[g].cols))
}

#[cold]
fn not_live(tables: &[GroupTable<'_>], g: usize, i: usize, col: i64, last: i64, what: &dyn Fn() -> String, name: &dyn Fn(usize) -> String) -> Error {
    let t = &tables[g];
    let (c, id) = (col..=last).map(|c| (c, t.ids[i * t.cols + c as usize])).find(|&(_, id)| id <= NULL_BLOCK).unwrap_or((col, NULL_BLOCK));
    let held = if id == NULL_BLOCK { "the null block 0".to_string() } else { format!("block id {id}") };
    Error::plan(format!("{}: {}: group {g}'s block table holds {held} at column {c}, not a live state block", name(i), what()))
}

/// The pre-copy's columns of every request, decided without the accepted counts: what the host
/// decides when the counts stay in device memory and the kernel applies them (see
/// [`pre_copy_columns`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PreColumns {
    /// Column the running state is read from (`-1`: none, a fresh state).
    pub prev: Vec<i64>,
    /// The new running column; store it per request.
    pub curr: Vec<i64>,
    /// `prev` where the state moves (`prev != -1 && prev != curr`), else `-1`: with `curr` as the
    /// destination, the explicit columns of the fused kernel's pre-copy.
    pub src_col: Vec<i64>,
}

/// Request `i`'s `(prev, curr)` after the checks that need no accepted count.
fn pre_columns_of(i: usize, inp: &PreInputs<'_>, tables: &[GroupTable<'_>], cfg: &StepConfig, name: &dyn Fn(usize) -> String) -> Result<(i64, i64)> {
    let (c, n, run) = (inp.num_computed[i], inp.num_scheduled[i], inp.mamba_state_idx[i]);
    let fresh = inp.fresh.is_some_and(|f| f[i]);
    let (bs, nsb) = (cfg.block_size, cfg.num_spec_blocks);
    if c < 0 {
        return Err(Error::plan(format!("{}: num_computed = {c} is negative", name(i))));
    }
    if n < 1 {
        return Err(Error::plan(format!("{}: num_scheduled = {n}; a request in the step schedules at least one token", name(i))));
    }
    if run < -1 {
        return Err(Error::plan(format!("{}: mamba_state_idx = {run}; use -1 for none", name(i))));
    }
    if run >= 0 && fresh {
        return Err(Error::plan(format!(
            "{}: new or resumed this step but still holds running column {run}: a stale column \
             of a finished or preempted request (clear it when the request finishes or is preempted)",
            name(i)
        )));
    }
    let prev = if run >= 0 { run } else { (c - 1).div_euclid(bs) };
    // ceil((c + n) / bs) - 1, with c + n >= 1
    let curr = (tokens(c, n, i, name)? - 1).div_euclid(bs);
    check_live(tables, i, curr, nsb, &|| "the step's running and speculative columns".into(), name)?;
    if run < 0 && c > 0 {
        let what =
            || format!("prefix-cache hit of {c} computed tokens without a recurrent state at column {prev} ((num_computed - 1) // block_size)");
        check_live(tables, i, prev, 0, &what, name)?;
    }
    Ok((prev, curr))
}

/// The pre-copy's columns without the accepted counts (they stay in device memory; the fused
/// kernel checks them and the moved state's source columns, and resets them): every check of
/// [`pre_copy`] but those two. `inp.num_accepted` is ignored (pass `&[]`).
pub fn pre_copy_columns(inp: &PreInputs<'_>, tables: &[GroupTable<'_>], cfg: &StepConfig, name: &dyn Fn(usize) -> String) -> Result<PreColumns> {
    check_config(cfg)?;
    let r = inp.num_computed.len();
    let mut lens = vec![("num_computed", r), ("num_scheduled", inp.num_scheduled.len()), ("mamba_state_idx", inp.mamba_state_idx.len())];
    if let Some(f) = inp.fresh {
        lens.push(("fresh", f.len()));
    }
    check_lengths(r, &lens)?;
    check_tables(tables, r)?;
    let mut d = PreColumns { prev: Vec::with_capacity(r), curr: Vec::with_capacity(r), src_col: Vec::with_capacity(r) };
    for i in 0..r {
        let (prev, curr) = pre_columns_of(i, inp, tables, cfg, name)?;
        d.prev.push(prev);
        d.curr.push(curr);
        d.src_col.push(if prev != -1 && prev != curr { prev } else { -1 });
    }
    Ok(d)
}

/// The pre-copy decision (vLLM's `preprocess_mamba`).
///
/// Per request: `prev` = the stored running column, or `(computed - 1) // block_size` (floor,
/// `-1` for a request without computed tokens) when there is none; `curr =
/// ceil((computed + scheduled) / block_size) - 1`; the state moves from `prev` to `curr` with
/// offset `num_accepted - 1` iff `prev != -1 && prev != curr`, and then `num_accepted` resets to 1.
///
/// Checks (errors name the request via `name`): input lengths; `computed >= 0`,
/// `scheduled >= 1`, `num_accepted` in `1..=1 + num_spec_blocks`, `mamba_state_idx >= -1`; a fresh row
/// holding a running column (stale: left by a finished or preempted request); the step's columns
/// `curr..=curr + num_spec_blocks` inside every group's row and live; a moved state's source
/// columns `prev..=prev + bias` inside every row and live; a request with computed tokens but no
/// running column (a prefix-cache hit) whose column `(computed - 1) // block_size` holds no live
/// block in some group (the attention hit is longer than the recurrent state's).
pub fn pre_copy(inp: &PreInputs<'_>, tables: &[GroupTable<'_>], cfg: &StepConfig, name: &dyn Fn(usize) -> String) -> Result<PreDecision> {
    check_config(cfg)?;
    let r = inp.num_computed.len();
    check_lengths(r, &[("num_computed", r), ("num_accepted", inp.num_accepted.len())])?;
    let nsb = cfg.num_spec_blocks;
    if let Some(i) = inp.num_accepted.iter().position(|&a| a < 1 || a > nsb + 1) {
        let a = inp.num_accepted[i];
        return Err(Error::plan(format!("{}: num_accepted = {a} is outside 1 ..= {} (1 + num_spec_blocks)", name(i), nsb + 1)));
    }
    let cols = pre_copy_columns(inp, tables, cfg, name)?;
    let mut d =
        PreDecision { prev: cols.prev, curr: cols.curr, src_col: cols.src_col, bias: Vec::with_capacity(r), num_accepted: Vec::with_capacity(r) };
    for i in 0..r {
        let (a, prev) = (inp.num_accepted[i], d.src_col[i]);
        let copy = prev >= 0;
        let bias = if copy { a - 1 } else { 0 };
        if copy {
            check_live(tables, i, prev, bias, &|| "the running state's source columns (prev ..= prev + num_accepted - 1)".into(), name)?;
        }
        d.bias.push(bias);
        d.num_accepted.push(if copy { 1 } else { a });
    }
    Ok(d)
}

/// Request `i`'s `running` after the checks that need no accepted count.
fn post_running_of(i: usize, s: i64, c: i64, n: i64, dr: i64, cfg: &StepConfig, name: &dyn Fn(usize) -> String) -> Result<i64> {
    let (bs, nsb) = (cfg.block_size, cfg.num_spec_blocks);
    if c < 0 || n < 1 {
        return Err(Error::plan(format!("{}: num_computed = {c}, num_scheduled = {n}; need num_computed >= 0 and num_scheduled >= 1", name(i))));
    }
    if dr < 0 || dr >= n || dr > nsb {
        return Err(Error::plan(format!(
            "{}: num_draft = {dr} is outside 0 ..= {} (fewer than num_scheduled = {n}, at most num_spec_blocks = {nsb})",
            name(i),
            (n - 1).min(nsb)
        )));
    }
    let end = tokens(c, n, i, name)?;
    let expect = (end - 1).div_euclid(bs);
    if s != expect {
        return Err(Error::plan(format!(
            "{}: state_col = {s}, but this step's running column is (num_computed + num_scheduled - 1) // block_size = {expect}; \
             pass the column the pre-copy returned for this step",
            name(i)
        )));
    }
    Ok(end - dr)
}

/// `num_computed + num_scheduled` of request `i` (both checked non-negative), refused past
/// `2**63 - 1` rather than wrapped.
fn tokens(c: i64, n: i64, i: usize, name: &dyn Fn(usize) -> String) -> Result<i64> {
    c.checked_add(n).ok_or_else(|| Error::plan(format!("{}: num_computed = {c} and num_scheduled = {n} add up past 2**63 - 1 tokens", name(i))))
}

/// The post-process's `running` (`computed + scheduled - drafts`) of every request when the
/// accepted counts stay in device memory (the fused kernel decides with them, checks the saved
/// state's columns and resets the counts): every check of [`post_process`] but the accepted counts'
/// and the saved columns'. `inp.num_accepted` is ignored (pass `&[]`).
pub fn post_process_running(inp: &PostInputs<'_>, tables: &[GroupTable<'_>], cfg: &StepConfig, name: &dyn Fn(usize) -> String) -> Result<Vec<i64>> {
    check_config(cfg)?;
    let r = inp.state_col.len();
    check_lengths(
        r,
        &[("state_col", r), ("num_computed", inp.num_computed.len()), ("num_scheduled", inp.num_scheduled.len()), ("num_draft", inp.num_draft.len())],
    )?;
    check_tables(tables, r)?;
    (0..r).map(|i| post_running_of(i, inp.state_col[i], inp.num_computed[i], inp.num_scheduled[i], inp.num_draft[i], cfg, name)).collect()
}

/// The post-process decision (vLLM's `postprocess_mamba_fused_kernel`).
///
/// Per request: `running = computed + scheduled - drafts`, `new = running + accepted - 1`,
/// `aligned = new // block_size * block_size`. When `aligned >= running` a block boundary was
/// crossed: the state after `aligned` tokens (offset `bias = aligned - running` from the running
/// state) is saved at column `dest = aligned // block_size - 1`; when `dest == state_col` that is a
/// shift in place and `num_accepted` resets to 1, and with `bias == 0` nothing moves at all.
///
/// Checks: input lengths; `num_draft` in `0..scheduled`; `num_accepted` in `1..=1 + num_draft`
/// and `<= 1 + num_spec_blocks`; `state_col == (computed + scheduled - 1) // block_size` (the
/// pre-copy's column for this step); a saved state's columns (`state_col..=state_col + bias`,
/// `dest`) inside every group's row and live.
pub fn post_process(inp: &PostInputs<'_>, tables: &[GroupTable<'_>], cfg: &StepConfig, name: &dyn Fn(usize) -> String) -> Result<PostDecision> {
    check_config(cfg)?;
    let r = inp.state_col.len();
    check_lengths(
        r,
        &[
            ("state_col", r),
            ("num_computed", inp.num_computed.len()),
            ("num_scheduled", inp.num_scheduled.len()),
            ("num_draft", inp.num_draft.len()),
            ("num_accepted", inp.num_accepted.len()),
        ],
    )?;
    check_tables(tables, r)?;
    let bs = cfg.block_size;
    let mut d = PostDecision {
        running: Vec::with_capacity(r),
        aligned: Vec::with_capacity(r),
        dest: Vec::with_capacity(r),
        bias: Vec::with_capacity(r),
        src_col: Vec::with_capacity(r),
        num_accepted: Vec::with_capacity(r),
    };
    for i in 0..r {
        let (s, c, n, dr, a) = (inp.state_col[i], inp.num_computed[i], inp.num_scheduled[i], inp.num_draft[i], inp.num_accepted[i]);
        let running = post_running_of(i, s, c, n, dr, cfg, name)?;
        if a < 1 || a > dr + 1 {
            return Err(Error::plan(format!("{}: num_accepted = {a} is outside 1 ..= {} (1 + num_draft = {dr})", name(i), dr + 1)));
        }
        let PostSave { aligned, dest, bias, in_place, copy } = post_save(s, running, a, bs);
        if copy {
            check_live(tables, i, s, bias, &|| "the running state's columns (state_col ..= state_col + bias)".into(), name)?;
            check_live(tables, i, dest, 0, &|| "the boundary column that saves the aligned state".into(), name)?;
        }
        d.running.push(running);
        d.aligned.push(aligned);
        d.dest.push(dest);
        d.bias.push(bias);
        d.src_col.push(if copy { s } else { -1 });
        d.num_accepted.push(if in_place { 1 } else { a });
    }
    Ok(d)
}

/// Where one request's post-process saves (see [`post_process`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PostSave {
    pub aligned: i64,
    /// The boundary column that saves the aligned state.
    pub dest: i64,
    pub bias: i64,
    /// The save is a shift of the running state in place (`state_col == dest`).
    pub in_place: bool,
    /// The kernel writes block `dest` (a boundary was crossed, and not in place with bias 0).
    pub copy: bool,
}

/// The post-process's save of a request at `state_col` and `running` with `accepted` tokens and
/// `block_size` tokens per block (unchecked: the callers check the inputs).
pub fn post_save(state_col: i64, running: i64, accepted: i64, block_size: i64) -> PostSave {
    let new = running + accepted - 1;
    let aligned = new.div_euclid(block_size) * block_size;
    let dest = aligned.div_euclid(block_size) - 1;
    let need = aligned >= running;
    let bias = if need { aligned - running } else { 0 };
    let in_place = need && state_col == dest;
    PostSave { aligned, dest, bias, in_place, copy: need && !(in_place && bias == 0) }
}

/// The default request name in messages: its request row.
pub fn row_name(i: usize) -> String {
    format!("request {i}")
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
