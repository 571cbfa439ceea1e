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

/// One group's block table, row-major `[rows >= requests, cols]`.
#[derive(Clone, Copy, Debug)]
pub struct GroupTable<'a> {
    pub ids: &'a [i64],
    pub cols: usize,
}

/// Per-request inputs of the pre-copy, one entry per scheduled request (batch row).
pub struct PreInputs<'a> {
    /// Tokens already computed before this step.
    pub num_computed: &'a [i64],
    /// Tokens scheduled this step, drafts included (`>= 1`).
    pub num_scheduled: &'a [i64],
    /// Accepted tokens of the previous step (`1..=1 + num_spec_blocks`).
    pub num_accepted: &'a [i64],
    /// The stored running-state column, `-1` for none (a new, resumed or preempted request).
    pub running_col: &'a [i64],
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
/// group's row and hold live (non-null, in-range) blocks.
fn check_live(tables: &[GroupTable<'_>], i: usize, col: i64, extra: i64, what: &str, name: &dyn Fn(usize) -> String) -> Result<()> {
    for (g, t) in tables.iter().enumerate() {
        let last = col + extra;
        if col < 0 || last >= t.cols as i64 {
            return Err(Error::plan(format!(
                "{}: {what}: columns {col}..={last} are outside group {g}'s block-table row ({} columns)",
                name(i),
                t.cols
            )));
        }
        for c in col..=last {
            let id = t.ids[i * t.cols + c as usize];
            if id <= NULL_BLOCK {
                return Err(Error::plan(format!(
                    "{}: {what}: group {g}'s block table holds {} at column {c}, not a live state block",
                    name(i),
                    if id == NULL_BLOCK { "the null block 0".to_string() } else { format!("block id {id}") }
                )));
            }
        }
    }
    Ok(())
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
#[allow(clippy::too_many_arguments)]
fn pre_columns_of(
    i: usize,
    c: i64,
    n: i64,
    run: i64,
    fresh: bool,
    tables: &[GroupTable<'_>],
    cfg: &StepConfig,
    name: &dyn Fn(usize) -> String,
) -> Result<(i64, i64)> {
    let (bs, nsb) = (cfg.block_size, cfg.num_spec_blocks);
    if c < 0 {
        return Err(Error::plan(format!("{}: num_computed = {c} is negative", name(i))));
    }
    if n < 1 {
        return Err(Error::plan(format!("{}: num_scheduled = {n}; a request in the step schedules at least one token", name(i))));
    }
    if run < -1 {
        return Err(Error::plan(format!("{}: running_col = {run}; use -1 for none", name(i))));
    }
    if run >= 0 && fresh {
        return Err(Error::plan(format!(
            "{}: new or resumed this step but still holds running column {run}: a stale column \
             of a finished or preempted request (clear it when the request finishes or is preempted)",
            name(i)
        )));
    }
    let prev = if run >= 0 { run } else { (c - 1).div_euclid(bs) };
    let curr = (c + n + bs - 1).div_euclid(bs) - 1;
    check_live(tables, i, curr, nsb, "the step's running and speculative columns", name)?;
    if run < 0 && c > 0 {
        check_live(
            tables,
            i,
            prev,
            0,
            &format!(
                "prefix-cache hit of {c} computed tokens without a recurrent state at column {prev} \
                 ((num_computed - 1) // block_size)"
            ),
            name,
        )?;
    }
    Ok((prev, curr))
}

/// The pre-copy's columns without the accepted counts (they stay in device memory; the fused
/// kernel checks them and the moved state's source columns, and resets them): every check of
/// [`pre_copy`] but those two. `inp.num_accepted` is ignored (pass `&[]`).
pub fn pre_copy_columns(inp: &PreInputs<'_>, tables: &[GroupTable<'_>], cfg: &StepConfig, name: &dyn Fn(usize) -> String) -> Result<PreColumns> {
    check_config(cfg)?;
    let r = inp.num_computed.len();
    let mut lens = vec![("num_computed", r), ("num_scheduled", inp.num_scheduled.len()), ("running_col", inp.running_col.len())];
    if let Some(f) = inp.fresh {
        lens.push(("fresh", f.len()));
    }
    check_lengths(r, &lens)?;
    check_tables(tables, r)?;
    let mut d = PreColumns { prev: Vec::with_capacity(r), curr: Vec::with_capacity(r), src_col: Vec::with_capacity(r) };
    for i in 0..r {
        let fresh = inp.fresh.is_some_and(|f| f[i]);
        let (prev, curr) = pre_columns_of(i, inp.num_computed[i], inp.num_scheduled[i], inp.running_col[i], fresh, tables, cfg, name)?;
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
/// `scheduled >= 1`, `num_accepted` in `1..=1 + num_spec_blocks`, `running_col >= -1`; a fresh row
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
        return Err(Error::plan(format!("{}: num_accepted = {a} is outside 1..={} (1 + num_spec_blocks)", name(i), nsb + 1)));
    }
    let cols = pre_copy_columns(inp, tables, cfg, name)?;
    let mut d =
        PreDecision { prev: cols.prev, curr: cols.curr, src_col: cols.src_col, bias: Vec::with_capacity(r), num_accepted: Vec::with_capacity(r) };
    for i in 0..r {
        let (a, prev) = (inp.num_accepted[i], d.src_col[i]);
        let copy = prev >= 0;
        let bias = if copy { a - 1 } else { 0 };
        if copy {
            check_live(tables, i, prev, bias, "the running state's source columns (prev ..= prev + num_accepted - 1)", name)?;
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
            "{}: num_draft = {dr} is outside 0..={} (fewer than num_scheduled = {n}, at most num_spec_blocks = {nsb})",
            name(i),
            (n - 1).min(nsb)
        )));
    }
    let expect = (c + n - 1).div_euclid(bs);
    if s != expect {
        return Err(Error::plan(format!(
            "{}: state_col = {s}, but this step's running column is (num_computed + num_scheduled - 1) // block_size = {expect}; \
             pass the column the pre-copy returned for this step",
            name(i)
        )));
    }
    Ok(c + n - dr)
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
            return Err(Error::plan(format!("{}: num_accepted = {a} is outside 1..={} (1 + num_draft = {dr})", name(i), dr + 1)));
        }
        let new = running + a - 1;
        let aligned = new.div_euclid(bs) * bs;
        let dest = aligned.div_euclid(bs) - 1;
        let need = aligned >= running;
        let bias = if need { aligned - running } else { 0 };
        let in_place = need && s == dest;
        let copy = need && !(in_place && bias == 0);
        if copy {
            check_live(tables, i, s, bias, "the running state's columns (state_col ..= state_col + bias)", name)?;
            check_live(tables, i, dest, 0, "the boundary column that saves the aligned state", name)?;
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

/// The default request name in messages: its batch row.
pub fn row_name(i: usize) -> String {
    format!("request {i}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: StepConfig = StepConfig { block_size: 4, num_spec_blocks: 2 };

    /// A table where every column holds a distinct live block.
    fn dense(r: usize, cols: usize) -> Vec<i64> {
        (0..r * cols).map(|k| k as i64 + 1).collect()
    }

    fn pre(c: &[i64], n: &[i64], a: &[i64], run: &[i64], bt: &[i64], cols: usize) -> Result<PreDecision> {
        let inp = PreInputs { num_computed: c, num_scheduled: n, num_accepted: a, running_col: run, fresh: None };
        pre_copy(&inp, &[GroupTable { ids: bt, cols }], &CFG, &row_name)
    }

    #[test]
    fn pre_copy_matches_the_formulas() {
        // new (C=0); prefix hit at 8 tokens scheduling 4 (prev 1 -> curr 2); running col 2 with
        // A=3 moving to 3; running col 3 staying in column 3 (C+N = 14 -> col 3); backwards 4 -> 3.
        let c = [0, 8, 10, 12, 12];
        let n = [5, 4, 3, 2, 1];
        let a = [1, 1, 3, 2, 2];
        let run = [-1, -1, 2, 3, 4];
        let bt = dense(5, 8);
        let d = pre(&c, &n, &a, &run, &bt, 8).unwrap();
        assert_eq!(d.prev, vec![-1, 1, 2, 3, 4]);
        assert_eq!(d.curr, vec![1, 2, 3, 3, 3]);
        assert_eq!(d.src_col, vec![-1, 1, 2, -1, 4]);
        assert_eq!(d.bias, vec![0, 0, 2, 0, 1]);
        assert_eq!(d.num_accepted, vec![1, 1, 1, 2, 1]);
        assert_eq!(d.num_copies(), 3);
    }

    #[test]
    fn pre_copy_rejects_a_prefix_hit_without_state() {
        let mut bt = dense(1, 8);
        bt[1] = 0; // column (8 - 1) // 4 = 1 is the null block
        let e = pre(&[8], &[4], &[1], &[-1], &bt, 8).unwrap_err();
        assert!(e.message.contains("request 0: prefix-cache hit of 8 computed tokens"), "{}", e.message);
        assert!(e.message.contains("group 0") && e.message.contains("column 1"), "{}", e.message);
    }

    #[test]
    fn pre_copy_rejects_stale_columns_and_bad_counts() {
        let bt = dense(1, 8);
        let inp = PreInputs { num_computed: &[0], num_scheduled: &[4], num_accepted: &[1], running_col: &[3], fresh: Some(&[true]) };
        let e = pre_copy(&inp, &[GroupTable { ids: &bt, cols: 8 }], &CFG, &|i| format!("request 'r{i}'")).unwrap_err();
        assert!(e.message.starts_with("request 'r0': new or resumed") && e.message.contains("stale"), "{}", e.message);
        let e = pre(&[4], &[1], &[4], &[1], &bt, 8).unwrap_err();
        assert!(e.message.contains("num_accepted = 4 is outside 1..=3"), "{}", e.message);
        let e = pre(&[4], &[0], &[1], &[1], &bt, 8).unwrap_err();
        assert!(e.message.contains("num_scheduled = 0"), "{}", e.message);
        let e = pre(&[4, 4], &[1], &[1, 1], &[1, 1], &dense(2, 8), 8).unwrap_err();
        assert!(e.message.contains("num_scheduled has 1"), "{}", e.message);
    }

    #[test]
    fn pre_copy_rejects_a_window_outside_or_null() {
        // curr = 5, window 5..=7 needs 8 columns.
        let e = pre(&[20], &[4], &[1], &[4], &dense(1, 7), 7).unwrap_err();
        assert!(e.message.contains("columns 5..=7 are outside group 0"), "{}", e.message);
        let mut bt = dense(1, 8);
        bt[6] = 0;
        let e = pre(&[20], &[4], &[1], &[4], &bt, 8).unwrap_err();
        assert!(e.message.contains("null block 0 at column 6"), "{}", e.message);
        // The moved state's source columns (prev 1 ..= prev + bias = 3) must be live.
        let mut bt = dense(1, 8);
        bt[2] = 0;
        let e = pre(&[10], &[3], &[3], &[1], &bt, 8).unwrap_err();
        assert!(e.message.contains("source columns") && e.message.contains("column 2"), "{}", e.message);
    }

    fn post(s: &[i64], c: &[i64], n: &[i64], dr: &[i64], a: &[i64]) -> Result<PostDecision> {
        let bt = dense(s.len(), 10);
        let inp = PostInputs { state_col: s, num_computed: c, num_scheduled: n, num_draft: dr, num_accepted: a };
        post_process(&inp, &[GroupTable { ids: &bt, cols: 10 }], &CFG, &row_name)
    }

    #[test]
    fn post_process_matches_the_formulas() {
        // 0: C=5,N=3,D=2: running 6, A=3 -> new 8, aligned 8 >= 6: bias 2, dest 1, S=(7)//4=1 -> in place.
        // 1: C=6,N=3,D=2: running 7, A=2 -> new 8: bias 1, dest 1, S=2 -> copy 2 -> 1, A stays 2.
        // 2: C=4,N=3,D=2: running 5, A=3 -> new 7, aligned 4 < 5: nothing.
        // 3: C=5,N=3,D=2: running 6, A=1 -> new 6, aligned 4: nothing.
        // 4: C=4,N=4,D=0 (prefill): running 8, A=1: aligned 8 == running, dest 1 == S -> bias 0, no copy, A=1.
        let d = post(&[1, 2, 1, 1, 1], &[5, 6, 4, 5, 4], &[3, 3, 3, 3, 4], &[2, 2, 2, 2, 0], &[3, 2, 3, 1, 1]).unwrap();
        assert_eq!(d.running, vec![6, 7, 5, 6, 8]);
        assert_eq!(d.aligned, vec![8, 8, 4, 4, 8]);
        assert_eq!(d.dest, vec![1, 1, 0, 0, 1]);
        assert_eq!(d.bias, vec![2, 1, 0, 0, 0]);
        assert_eq!(d.src_col, vec![1, 2, -1, -1, -1]);
        assert_eq!(d.num_accepted, vec![1, 2, 3, 1, 1]);
    }

    #[test]
    fn post_process_checks_its_inputs() {
        let e = post(&[2], &[5], &[3], &[2], &[1]).unwrap_err();
        assert!(e.message.contains("state_col = 2") && e.message.contains("= 1"), "{}", e.message);
        let e = post(&[1], &[5], &[3], &[1], &[3]).unwrap_err();
        assert!(e.message.contains("num_accepted = 3 is outside 1..=2"), "{}", e.message);
        let e = post(&[1], &[5], &[3], &[3], &[1]).unwrap_err();
        assert!(e.message.contains("num_draft = 3"), "{}", e.message);
    }

    #[test]
    fn decisions_cover_every_group() {
        // Group 1's boundary column is null: the post-process save must be refused naming group 1.
        let g0 = dense(1, 10);
        let mut g1 = dense(1, 10);
        g1[1] = 0;
        let inp = PostInputs { state_col: &[2], num_computed: &[6], num_scheduled: &[3], num_draft: &[2], num_accepted: &[2] };
        let tables = [GroupTable { ids: &g0, cols: 10 }, GroupTable { ids: &g1, cols: 10 }];
        let e = post_process(&inp, &tables, &CFG, &row_name).unwrap_err();
        assert!(e.message.contains("group 1") && e.message.contains("boundary column"), "{}", e.message);
        assert!(post_process(&inp, &tables[..1], &CFG, &row_name).is_ok());
    }

    #[test]
    fn the_device_halves_take_the_same_columns_without_the_counts() {
        // Every row of a random batch: the columns decided without the accepted counts equal the
        // full decision's, and the full decision's counts are the only difference.
        let cfg = StepConfig { block_size: 3, num_spec_blocks: 2 };
        let r = 64;
        let mut seed = 7u64;
        let mut next = |m: i64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 33) % m as u64) as i64
        };
        let c: Vec<i64> = (0..r).map(|_| next(30)).collect();
        let n: Vec<i64> = (0..r).map(|_| 1 + next(6)).collect();
        let a: Vec<i64> = (0..r).map(|_| 1 + next(3)).collect();
        let run: Vec<i64> = (0..r).map(|i| if next(3) == 0 { -1 } else { ((c[i] + n[i] - 1) / 3 + next(3) - 1).max(0) }).collect();
        let bt = dense(r, 20);
        let tables = [GroupTable { ids: &bt, cols: 20 }];
        let full =
            pre_copy(&PreInputs { num_computed: &c, num_scheduled: &n, num_accepted: &a, running_col: &run, fresh: None }, &tables, &cfg, &row_name)
                .unwrap();
        let cols = pre_copy_columns(
            &PreInputs { num_computed: &c, num_scheduled: &n, num_accepted: &[], running_col: &run, fresh: None },
            &tables,
            &cfg,
            &row_name,
        )
        .unwrap();
        assert_eq!((cols.prev, cols.curr, cols.src_col), (full.prev.clone(), full.curr.clone(), full.src_col.clone()));
        assert!(full.src_col.iter().any(|&s| s >= 0) && full.src_col.iter().any(|&s| s < 0));
        // Counts out of range are the device's to report: the columns do not look at them.
        let bad = vec![9; r];
        assert!(pre_copy(
            &PreInputs { num_computed: &c, num_scheduled: &n, num_accepted: &bad, running_col: &run, fresh: None },
            &tables,
            &cfg,
            &row_name
        )
        .is_err());
        let dr: Vec<i64> = n.iter().map(|&k| next(k.min(3))).collect();
        let acc: Vec<i64> = dr.iter().map(|&d| 1 + next(d + 1)).collect();
        let inp = PostInputs { state_col: &full.curr, num_computed: &c, num_scheduled: &n, num_draft: &dr, num_accepted: &acc };
        let post = post_process(&inp, &tables, &cfg, &row_name).unwrap();
        assert_eq!(post_process_running(&PostInputs { num_accepted: &[], ..inp }, &tables, &cfg, &row_name).unwrap(), post.running);
        let e = post_process_running(&PostInputs { num_accepted: &[], state_col: &c, ..inp }, &tables, &cfg, &row_name).unwrap_err();
        assert!(e.message.contains("state_col ="), "{}", e.message);
    }
}
