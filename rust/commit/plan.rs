//! RecoverSSM commit plans: after sampling, which requests fold how many verified tokens into
//! which block, and — in align mode — which prefix-cache block receives the state at the block
//! boundary crossed inside the window. Every input is checked before anything moves.

use crate::error::{Error, Result};
pub use crate::kernels::records::commit::CommitRow;

/// Align-mode inputs: where the request stands and its block table.
pub struct AlignInputs<'a> {
    /// Tokens already folded into each request's running state before this window.
    pub seq_lens: &'a [i64],
    /// Row-major `[requests, cols]` block ids.
    pub block_table: &'a [i64],
    pub cols: usize,
    pub block_size: u64,
}

/// The step's inputs.
pub struct CommitStep<'a> {
    pub state_blocks: &'a [i64],
    pub num_accepted: &'a [i64],
    pub query_lens: &'a [i64],
    pub align: Option<AlignInputs<'a>>,
}

/// Builds the commit rows for one step. `window` is the speculative window `Q = num_spec + 1`.
/// A request with a negative or null state block, or a query length of 0, is padding.
pub fn plan_commit(step: &CommitStep<'_>, backend: &str, num_blocks: u64, window: u32) -> Result<Vec<CommitRow>> {
    let r = step.state_blocks.len();
    if step.num_accepted.len() != r || step.query_lens.len() != r {
        return Err(Error::plan(format!(
            "{backend}: state_blocks, num_accepted and query_lens need one entry per request; got {}, {} and {}",
            r,
            step.num_accepted.len(),
            step.query_lens.len()
        )));
    }
    if r > u32::MAX as usize {
        return Err(Error::plan(format!("{backend}: too many requests ({r})")));
    }
    if let Some(a) = &step.align {
        if a.seq_lens.len() != r {
            return Err(Error::plan(format!("{backend}: seq_lens needs one entry per request; got {} for {r} requests", a.seq_lens.len())));
        }
        if a.cols == 0 || a.block_table.len() != r * a.cols {
            return Err(Error::plan(format!(
                "{backend}: block_table must be [requests = {r}, cols >= 1]; got {} ids for {} columns",
                a.block_table.len(),
                a.cols
            )));
        }
        if a.block_size < window as u64 {
            return Err(Error::plan(format!(
                "{backend}: block_size = {} is smaller than the speculative window ({window} tokens): a window could cross two block boundaries; use block_size >= num_spec + 1",
                a.block_size
            )));
        }
    }
    let mut rows = Vec::with_capacity(r);
    for i in 0..r {
        let (sb, na, ql) = (step.state_blocks[i], step.num_accepted[i], step.query_lens[i]);
        if ql < 0 || ql > window as i64 {
            return Err(Error::plan(format!("{backend}: request {i}: query_len = {ql} is outside 0 ..= {window} (the speculative window)")));
        }
        if sb <= 0 || ql == 0 {
            continue; // padding
        }
        if sb as u64 >= num_blocks {
            return Err(Error::plan(format!("{backend}: request {i}: state block {sb} is outside 0 ..= {}", num_blocks.saturating_sub(1))));
        }
        let count = na.clamp(0, ql) as u32;
        let mut row = CommitRow { request: i as u32, count, state_block: sb, boundary_block: -1, boundary_len: 0, count_index: i as u32 };
        if let Some(a) = &step.align {
            let l0 = a.seq_lens[i];
            if l0 < 0 {
                return Err(Error::plan(format!("{backend}: request {i}: seq_len = {l0} is negative")));
            }
            let end = l0 as u64 + count as u64;
            let boundary = end / a.block_size * a.block_size;
            if boundary > l0 as u64 && count > 0 {
                let col = boundary / a.block_size - 1;
                if col >= a.cols as u64 {
                    return Err(Error::plan(format!(
                        "{backend}: request {i}: the boundary at token {boundary} needs block-table column {col}, outside the row ({} columns)",
                        a.cols
                    )));
                }
                let bb = a.block_table[i * a.cols + col as usize];
                if bb <= 0 || bb as u64 >= num_blocks {
                    return Err(Error::plan(format!(
                        "{backend}: request {i}: the boundary block (column {col}) is {bb}; it must be a real block in 1 ..= {}",
                        num_blocks.saturating_sub(1)
                    )));
                }
                if bb == sb {
                    return Err(Error::plan(format!(
                        "{backend}: request {i}: the boundary block (column {col}) is the request's running state block {sb}; the prefix cache needs its own block"
                    )));
                }
                row.boundary_block = bb;
                row.boundary_len = (boundary - l0 as u64) as u32;
            }
        }
        rows.push(row);
    }
    // Every block written (running states and boundary blocks) belongs to exactly one writer.
    let mut written: Vec<(i64, u32, bool)> = Vec::with_capacity(rows.len() * 2);
    for row in &rows {
        written.push((row.state_block, row.request, false));
        if row.boundary_block >= 0 {
            written.push((row.boundary_block, row.request, true));
        }
    }
    written.sort_unstable();
    for w in written.windows(2) {
        if w[0].0 == w[1].0 {
            let what = |b: bool| if b { "boundary block" } else { "state block" };
            return Err(Error::plan(format!(
                "{backend}: requests {} and {} both write block {} (as {} and {}); every running state and boundary block must belong to one request",
                w[0].1,
                w[1].1,
                w[0].0,
                what(w[0].2),
                what(w[1].2)
            )));
        }
    }
    Ok(rows)
}

/// A positive block size (tokens per block) as the planner takes it.
pub fn check_block_size(block_size: i64) -> Result<u64> {
    if block_size < 1 {
        return Err(Error::plan(format!("block_size must be >= 1 (tokens per block), got {block_size}")));
    }
    Ok(block_size as u64)
}

/// The sizes of a state cache: at least one layer, two blocks (the null block 0 and one more) and
/// one workspace row, each within the 32-bit counts the kernels take.
pub fn check_cache_sizes(num_layers: i64, num_blocks: i64, max_requests: i64) -> Result<()> {
    for (name, value, min) in [("num_layers", num_layers, 1), ("num_blocks", num_blocks, 2), ("max_requests", max_requests, 1)] {
        if value < min || value >= 1 << 31 {
            return Err(Error::binding(format!("{name} must be in {min} ..= 2**31 - 1, got {value}")));
        }
    }
    Ok(())
}

/// An index into `len` items (layers, say), named `what` in the error.
pub fn check_index(what: &str, index: i64, len: u64) -> Result<usize> {
    if index < 0 || index as u64 >= len {
        return Err(Error::plan(format!("{what} {index} is out of range: there are {len} (0 ..= {})", len as i64 - 1)));
    }
    Ok(index as usize)
}

/// A step of `requests` requests fits a workspace of `max_requests` rows (one row per request).
pub fn check_workspace_rows(requests: usize, backend: &str, max_requests: u64) -> Result<()> {
    if requests as u64 > max_requests {
        return Err(Error::plan(format!(
            "{backend}: {requests} requests exceed the workspace (max_requests = {max_requests}): state_blocks must be [B] with B <= max_requests"
        )));
    }
    Ok(())
}

/// Checks the running-state blocks a verify step reads (or a reset writes): each in range, no two
/// requests on one block. Values `<= 0` are padding.
pub fn check_state_blocks(state_blocks: &[i64], backend: &str, num_blocks: u64) -> Result<()> {
    let mut seen: Vec<(i64, usize)> = Vec::with_capacity(state_blocks.len());
    for (i, &b) in state_blocks.iter().enumerate() {
        if b <= 0 {
            continue;
        }
        if b as u64 >= num_blocks {
            return Err(Error::plan(format!("{backend}: request {i}: state block {b} is outside 0 ..= {}", num_blocks.saturating_sub(1))));
        }
        seen.push((b, i));
    }
    seen.sort_unstable();
    for w in seen.windows(2) {
        if w[0].0 == w[1].0 {
            return Err(Error::plan(format!(
                "{backend}: requests {} and {} both use state block {}; every request needs its own running block",
                w[0].1.min(w[1].1),
                w[0].1.max(w[1].1),
                w[0].0
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod size_tests {
    use super::*;

    #[test]
    fn sizes_blocks_and_indices() {
        assert_eq!(check_block_size(16), Ok(16));
        assert_eq!(check_block_size(-1).unwrap_err().message, "block_size must be >= 1 (tokens per block), got -1");
        assert!(check_cache_sizes(4, 256, 32).is_ok());
        assert_eq!(check_cache_sizes(4, -3, 32).unwrap_err().message, "num_blocks must be in 2 ..= 2**31 - 1, got -3");
        assert!(check_cache_sizes(0, 8, 1).is_err() && check_cache_sizes(1, 8, 0).is_err());
        assert_eq!(check_index("layer", 2, 4), Ok(2));
        assert_eq!(check_index("layer", 4, 4).unwrap_err().message, "layer 4 is out of range: there are 4 (0 ..= 3)");
        assert!(check_index("layer", -1, 4).is_err());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_rows_bound_the_batch() {
        assert!(check_workspace_rows(8, "KDA", 8).is_ok());
        let m = check_workspace_rows(9, "KDA", 8).unwrap_err().message;
        assert!(m.starts_with("KDA: 9 requests exceed the workspace (max_requests = 8)"), "{m}");
    }

    fn plan(sb: &[i64], na: &[i64], ql: &[i64], align: Option<AlignInputs<'_>>) -> Result<Vec<CommitRow>> {
        plan_commit(&CommitStep { state_blocks: sb, num_accepted: na, query_lens: ql, align }, "GDN_ATTN", 32, 4)
    }

    #[test]
    fn counts_are_clamped_and_padding_skipped() {
        let rows = plan(&[3, -1, 5, 0, 7], &[9, 2, -3, 1, 2], &[4, 4, 4, 4, 0], None).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].request, rows[0].count), (0, 4));
        assert_eq!((rows[1].request, rows[1].count), (2, 0));
        assert_eq!(rows[0].boundary_block, -1);
    }

    #[test]
    fn boundary_inside_the_window() {
        // seq 14, block 16: accepting 3 crosses 16 after 2 tokens -> column 0.
        let bt = [20, 21, 22, 23, 24, 25];
        let seq = [14, 30];
        let a = AlignInputs { seq_lens: &seq, block_table: &bt, cols: 3, block_size: 16 };
        let rows = plan(&[3, 4], &[3, 1], &[4, 4], Some(a)).unwrap();
        assert_eq!((rows[0].boundary_block, rows[0].boundary_len), (20, 2));
        // 30 + 1 = 31 < 32: no boundary.
        assert_eq!(rows[1].boundary_block, -1);
        // exactly reaching 32 crosses at the last token -> column 1.
        let a = AlignInputs { seq_lens: &seq, block_table: &bt, cols: 3, block_size: 16 };
        let rows = plan(&[3, 4], &[3, 2], &[4, 4], Some(a)).unwrap();
        assert_eq!((rows[1].boundary_block, rows[1].boundary_len), (24, 2));
    }

    #[test]
    fn bad_inputs_name_the_request() {
        let e = |r: Result<Vec<CommitRow>>| r.unwrap_err().message;
        assert!(e(plan(&[3], &[1], &[5], None)).contains("request 0: query_len = 5"));
        assert!(e(plan(&[40], &[1], &[2], None)).contains("request 0: state block 40"));
        assert!(e(plan(&[3, 3], &[1, 1], &[2, 2], None)).contains("requests 0 and 1 both write block 3"));
        assert!(e(plan(&[3], &[1, 2], &[2], None)).contains("one entry per request"));
        let bt = [0, 21];
        let a = AlignInputs { seq_lens: &[15], block_table: &bt, cols: 2, block_size: 16 };
        assert!(e(plan(&[3], &[2], &[2], Some(a))).contains("boundary block (column 0) is 0"));
        let a = AlignInputs { seq_lens: &[15], block_table: &[3, 4], cols: 2, block_size: 16 };
        assert!(e(plan(&[3], &[2], &[2], Some(a))).contains("running state block 3"));
        let a = AlignInputs { seq_lens: &[15], block_table: &[5, 6], cols: 2, block_size: 2 };
        assert!(e(plan(&[3], &[2], &[2], Some(a))).contains("block_size = 2"));
        let a = AlignInputs { seq_lens: &[31], block_table: &[5], cols: 1, block_size: 16 };
        assert!(e(plan(&[3], &[2], &[2], Some(a))).contains("column 1, outside the row"));
    }

    #[test]
    fn state_block_checks() {
        assert!(check_state_blocks(&[3, -1, 0, 5], "B", 8).is_ok());
        assert!(check_state_blocks(&[3, 9], "B", 8).unwrap_err().message.contains("request 1: state block 9"));
        assert!(check_state_blocks(&[3, 5, 3], "B", 8).unwrap_err().message.contains("requests 0 and 2 both use state block 3"));
    }

    #[test]
    fn boundary_block_shared_with_another_request_is_rejected() {
        let a = AlignInputs { seq_lens: &[15, 0], block_table: &[7, 8, 9, 10], cols: 2, block_size: 16 };
        let m = plan(&[3, 7], &[2, 1], &[2, 2], Some(a)).unwrap_err().message;
        assert!(m.contains("both write block 7"), "{m}");
    }
}
