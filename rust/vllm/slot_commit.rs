//! The RecoverSSM commit of a GPU-resident post-process (vLLM's `commit_step`), planned on the host
//! when the step's metadata is built and run inside the post-process's one launch.
//!
//! [`plan_stage`] checks the step's commit inputs and plans its rows (each spec-decode request for
//! its whole window: the kernel clamps the device's sampled count to it, so nothing waits for the
//! sampler) into the bytes of the adapter's **stage buffer**, one int32 vector of
//! [`stage_len`]`(slots)` elements:
//!
//! | int32 elements                  | what                                                        |
//! |---------------------------------|-------------------------------------------------------------|
//! | `[0]`                           | rows staged (the kernel reads the count here)               |
//! | `[1]`                           | the stage's generation (the adapter's count of stages)      |
//! | `[2 .. 2 + slots]`              | per request row, the tokens before this step's window (`-1`: no commit) |
//! | from [`rows_offset`] bytes on   | the staged `CommitRow` records (32 bytes each, `slots` at most) |
//!
//! The launch's arguments are fixed addresses inside that buffer, so a captured post-process
//! replays whatever was staged before the replay; the kernel commits a stage once (a generation
//! it has seen commits nothing, see `kernels/state_copy_slots.cu`).

use crate::commit::{check_workspace_rows, plan_commit, AlignInputs, CommitRow, CommitStep};
use crate::error::{Error, Result};

/// The int32 element of the stage where the per-batch-row computed tokens start.
pub const COMPUTED_AT: u64 = 2;

/// Bytes from the stage buffer's start to its first `CommitRow` (32-byte aligned).
pub fn rows_offset(slots: u64) -> u64 {
    (4 * (COMPUTED_AT + slots)).div_ceil(32) * 32
}

/// The stage buffer's length in int32 elements for `slots` request-state slots.
pub fn stage_len(slots: u64) -> u64 {
    rows_offset(slots) / 4 + 8 * slots
}

/// One step's commit inputs (host values): per spec-decode request `i`, its request row
/// `request_indices[i]`, running block `state_blocks[i]`, block table row `i` of
/// `block_table` (`cols` wide) and tokens verified `query_lens[i]` (default: the whole window);
/// `computed` per request row, the tokens in its state before this step's window.
pub struct SlotCommitInputs<'a> {
    pub request_indices: &'a [i64],
    pub state_blocks: &'a [i64],
    pub computed: &'a [i64],
    pub block_table: &'a [i64],
    pub cols: usize,
    pub query_lens: Option<&'a [i64]>,
}

/// The cache a commit runs on: its speculative window, blocks and workspace rows.
#[derive(Clone, Copy, Debug)]
pub struct CacheShape {
    pub window: u32,
    pub num_blocks: u64,
    pub max_requests: u64,
}

/// A planned commit: the bytes to copy into the front of the stage buffer, the rows staged, the
/// request rows the post-process must have (one past the largest of `request_indices`) and the table width.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedCommit {
    pub bytes: Vec<u8>,
    pub rows: u32,
    pub request_rows: u64,
    pub cols: i32,
}

/// Plans one step's commit for an adapter of `slots` slots and `block_size` tokens per block, as
/// stage `generation`. Errors name the request; nothing is staged when one is raised.
pub fn plan_stage(c: &SlotCommitInputs<'_>, slots: u64, block_size: u64, cache: CacheShape, generation: i32) -> Result<StagedCommit> {
    let backend = "RecoverSSM commit";
    let s = c.request_indices.len();
    if c.state_blocks.len() != s {
        return Err(Error::plan(format!("{backend}: {s} request_indices for {} state_blocks; one per spec-decode request", c.state_blocks.len())));
    }
    check_workspace_rows(s, backend, cache.max_requests)?;
    let cols = i32::try_from(c.cols).ok().filter(|&w| w >= 1);
    let cols = cols.ok_or_else(|| Error::plan(format!("{backend}: the block table has {} columns (1 ..= 2**31 - 1)", c.cols)))?;
    let rows_bound = (c.computed.len() as u64).min(slots);
    let mut seen = vec![false; rows_bound as usize];
    let mut seq_lens = Vec::with_capacity(s);
    let mut count_index = Vec::with_capacity(s);
    for (i, &r) in c.request_indices.iter().enumerate() {
        if r < 0 || r as u64 >= rows_bound {
            return Err(Error::plan(format!(
                "{backend}: request_indices[{i}] = {r} is not a request row (0 ..= {}: num_computed_tokens has {} rows, max_num_reqs = {slots})",
                rows_bound as i64 - 1,
                c.computed.len()
            )));
        }
        if std::mem::replace(&mut seen[r as usize], true) {
            return Err(Error::plan(format!("{backend}: request row {r} is in request_indices twice")));
        }
        let l0 = c.computed[r as usize];
        if !(0..1 << 31).contains(&l0) {
            return Err(Error::plan(format!("{backend}: request row {r}: num_computed_tokens = {l0} is outside 0 ..= 2**31 - 1")));
        }
        seq_lens.push(l0);
        count_index.push(r as u32);
    }
    let full;
    let query_lens = match c.query_lens {
        Some(q) => q,
        None => {
            full = vec![i64::from(cache.window); s];
            &full
        }
    };
    let align = AlignInputs { seq_lens: &seq_lens, block_table: c.block_table, cols: c.cols, block_size };
    // Each row planned for its whole window (the cap): the kernel reads the sampled count.
    let step = CommitStep { state_blocks: c.state_blocks, num_accepted: query_lens, query_lens, align: Some(align) };
    let mut plan: Vec<CommitRow> = plan_commit(&step, backend, cache.num_blocks, cache.window)?;
    for row in &mut plan {
        row.count_index = count_index[row.request as usize];
    }
    let mut words = vec![-1i32; rows_offset(slots) as usize / 4];
    words[0] = plan.len() as i32;
    words[1] = generation;
    for (&r, &l0) in c.request_indices.iter().zip(&seq_lens) {
        words[COMPUTED_AT as usize + r as usize] = l0 as i32;
    }
    let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    bytes.extend(plan.iter().flat_map(CommitRow::to_le_bytes));
    let request_rows = c.request_indices.iter().map(|&r| r as u64 + 1).max().unwrap_or(0);
    Ok(StagedCommit { bytes, rows: plan.len() as u32, request_rows, cols })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CACHE: CacheShape = CacheShape { window: 3, num_blocks: 64, max_requests: 4 };

    fn i32s(b: &[u8]) -> Vec<i32> {
        b.chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect()
    }

    #[test]
    fn stages_count_computed_and_rows() {
        assert_eq!((rows_offset(8), stage_len(8)), (64, 16 + 64));
        assert_eq!((rows_offset(6), rows_offset(7)), (32, 64));
        // Two spec rows (request rows 2 and 0) of a 4-row batch; block size 4, window 3.
        let table = [10, 11, 12, 20, 21, 22];
        let c = SlotCommitInputs {
            request_indices: &[2, 0],
            state_blocks: &[5, 6],
            computed: &[7, 1, 2, 9],
            block_table: &table,
            cols: 3,
            query_lens: None,
        };
        let st = plan_stage(&c, 8, 4, CACHE, 5).unwrap();
        assert_eq!((st.rows, st.request_rows, st.cols), (2, 3, 3));
        let head = i32s(&st.bytes[..64]);
        assert_eq!(&head[..10], &[2, 5, 7, -1, 2, -1, -1, -1, -1, -1]);
        let rows: Vec<&[u8]> = st.bytes[64..].chunks(32).collect();
        assert_eq!(rows.len(), 2);
        // Row 0: workspace row 0, count read from request row 2; seq 2 + 3 tokens crosses 4: column 0.
        let r0 = i32s(rows[0]);
        assert_eq!((r0[0], r0[1], r0[2], r0[4], r0[6], r0[7]), (0, 3, 5, 10, 2, 2));
        // Row 1: request row 0, seq 7 + 3 crosses 8: column 1 of its row, 1 token in.
        let r1 = i32s(rows[1]);
        assert_eq!((r1[0], r1[2], r1[4], r1[6], r1[7]), (1, 6, 21, 1, 0));
    }

    #[test]
    fn inputs_are_checked_by_request() {
        let table = [10, 11, 12, 20, 21, 22];
        let ok = SlotCommitInputs {
            request_indices: &[2, 0],
            state_blocks: &[5, 6],
            computed: &[7, 1, 2],
            block_table: &table,
            cols: 3,
            query_lens: None,
        };
        let msg = |c: &SlotCommitInputs<'_>, slots: u64| plan_stage(c, slots, 4, CACHE, 1).unwrap_err().message;
        assert!(msg(&SlotCommitInputs { request_indices: &[3, 0], ..ok }, 8).contains("request_indices[0] = 3 is not a request row (0 ..= 2"));
        assert!(msg(&ok, 2).contains("request_indices[0] = 2 is not a request row (0 ..= 1"));
        assert!(msg(&SlotCommitInputs { request_indices: &[2, 2], ..ok }, 8).contains("request row 2 is in request_indices twice"));
        assert!(msg(&SlotCommitInputs { state_blocks: &[5], ..ok }, 8).contains("2 request_indices for 1 state_blocks"));
        assert!(msg(&SlotCommitInputs { computed: &[7, 1, -2], ..ok }, 8).contains("request row 2: num_computed_tokens = -2"));
        assert!(msg(&SlotCommitInputs { state_blocks: &[5, 5], ..ok }, 8).contains("both write block 5"));
        assert!(msg(&SlotCommitInputs { query_lens: Some(&[4, 1]), ..ok }, 8).contains("query_len = 4 is outside 0 ..= 3"));
        assert!(msg(&SlotCommitInputs { cols: 0, block_table: &[], ..ok }, 8).contains("0 columns"));
        let many = SlotCommitInputs {
            request_indices: &[0, 1, 2, 3, 4],
            state_blocks: &[1, 2, 3, 4, 5],
            computed: &[0; 5],
            block_table: &[1; 5],
            cols: 1,
            query_lens: None,
        };
        assert!(msg(&many, 8).contains("exceed the workspace"));
    }
}
