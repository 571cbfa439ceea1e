//! From an engine's per-step inputs to block-level moves, with every input checked.

use crate::error::{Error, Result};

/// One block-level move of one kind of state, shared by every layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    pub request: u32,
    pub src: u64,
    pub dst: u64,
    /// Conv columns dropped (0 for temporal moves).
    pub shift: u32,
}

/// The moves of one step, split by kind of state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Moves {
    pub conv: Vec<Move>,
    pub temporal: Vec<Move>,
}

/// Align-mode inputs (docs/design.md section 3): per request a block-table row and
/// `(src_col, dst_col, num_accepted)`. A row with a negative column is padding.
pub struct AlignStep<'a> {
    /// Row-major `[requests, cols]`.
    pub block_table: &'a [i64],
    pub cols: usize,
    pub src_col: &'a [i64],
    pub dst_col: &'a [i64],
    pub num_accepted: &'a [i64],
}

/// What the checks need to know about the bound states.
pub struct Limits<'a> {
    pub backend: &'a str,
    pub num_blocks: u64,
    pub num_spec: u32,
    pub num_layers: usize,
    /// Name of the first conv / temporal state, if the layout has one (for messages, and whether
    /// that kind is copied at all).
    pub conv_state: Option<&'a str>,
    pub temporal_state: Option<&'a str>,
}

impl Limits<'_> {
    fn block_of_copy(&self, copy: usize, what: &str, id: i64) -> Result<u64> {
        if id < 0 || id as u64 >= self.num_blocks {
            return Err(Error::plan(format!(
                "{}: copy {copy}: {what} block id {id} is outside 0 ..= {}",
                self.backend,
                self.num_blocks.saturating_sub(1)
            )));
        }
        Ok(id as u64)
    }
    fn block(&self, request: usize, what: &str, col: usize, id: i64, state: &str) -> Result<u64> {
        if id < 0 || id as u64 >= self.num_blocks {
            return Err(Error::plan(format!(
                "{}: request {request}, state '{state}' (all {} layers): {what} block id {id} (column {col}) is outside 0 ..= {}",
                self.backend,
                self.num_layers,
                self.num_blocks.saturating_sub(1)
            )));
        }
        Ok(id as u64)
    }
}

/// Checks an align step and turns it into moves. Skips padding rows, rows whose source and
/// destination are both the null block, and no-ops (nothing to move for that kind).
pub fn align_moves(step: &AlignStep<'_>, lim: &Limits<'_>, out: &mut Moves) -> Result<()> {
    let r = step.src_col.len();
    let b = lim.backend;
    if step.dst_col.len() != r || step.num_accepted.len() != r {
        return Err(Error::plan(format!(
            "{b}: src_col, dst_col and num_accepted must have one entry per request; got {}, {} and {}",
            r,
            step.dst_col.len(),
            step.num_accepted.len()
        )));
    }
    if step.cols == 0 || step.block_table.len() != r * step.cols {
        return Err(Error::plan(format!(
            "{b}: block_table must be [requests = {r}, cols >= 1]; got {} ids for {} columns",
            step.block_table.len(),
            step.cols
        )));
    }
    if r > u32::MAX as usize {
        return Err(Error::plan(format!("{b}: {r} requests exceed the supported 2^32 - 1")));
    }
    out.conv.clear();
    out.temporal.clear();
    let max_a = lim.num_spec as i64 + 1;
    let cols = step.cols as i64;
    let first_state = lim.conv_state.or(lim.temporal_state).unwrap_or("?");
    for i in 0..r {
        let (sc, dc, a) = (step.src_col[i], step.dst_col[i], step.num_accepted[i]);
        if sc < 0 || dc < 0 {
            continue;
        }
        let row = &step.block_table[i * step.cols..(i + 1) * step.cols];
        for (what, c) in [("src_col", sc), ("dst_col", dc)] {
            if c >= cols {
                return Err(Error::plan(format!("{b}: request {i}: {what} = {c} is outside the block-table row ({cols} columns)")));
            }
        }
        let (src_id, dst_id) = (row[sc as usize], row[dc as usize]);
        if src_id == 0 && dst_id == 0 {
            continue; // a null-block row
        }
        if a < 1 || a > max_a {
            return Err(Error::plan(format!(
                "{b}: request {i}: num_accepted = {a} is outside 1 ..= {max_a} (1 + num_spec, num_spec = {})",
                lim.num_spec
            )));
        }
        if sc == dc && a == 1 {
            continue; // nothing moves
        }
        let dst = lim.block(i, "destination", dc as usize, dst_id, first_state)?;
        if dst == 0 {
            return Err(Error::plan(format!(
                "{b}: request {i}, state '{first_state}' (all {} layers): the destination (column {dc}) is the null block 0; the null block is never written",
                lim.num_layers
            )));
        }
        if let Some(state) = lim.conv_state {
            let src = lim.block(i, "source", sc as usize, src_id, state)?;
            if src == 0 {
                return Err(null_source(lim, i, state, sc));
            }
            let shift = (a - 1) as u32;
            if !(src == dst && shift == 0) {
                out.conv.push(Move { request: i as u32, src, dst, shift });
            }
        }
        if let Some(state) = lim.temporal_state {
            let tc = sc + a - 1;
            if tc >= cols {
                return Err(Error::plan(format!(
                    "{b}: request {i}, state '{state}' (all {} layers): the accepted token's column src_col + num_accepted - 1 = {sc} + {a} - 1 = {tc} is outside the block-table row ({cols} columns)",
                    lim.num_layers
                )));
            }
            let src = lim.block(i, "source", tc as usize, row[tc as usize], state)?;
            if src == 0 {
                return Err(null_source(lim, i, state, tc));
            }
            if src != dst {
                out.temporal.push(Move { request: i as u32, src, dst, shift: 0 });
            }
        }
    }
    Ok(())
}

fn null_source(lim: &Limits<'_>, i: usize, state: &str, col: i64) -> Error {
    Error::plan(format!(
        "{}: request {i}, state '{state}' (all {} layers): the source (column {col}) is the null block 0, which holds no state",
        lim.backend, lim.num_layers
    ))
}

/// Whole-block copies (forks, cache hits): `dst_blocks[i] <- src_blocks[i]` for every persistent
/// state. Pairs with equal ids are no-ops; a negative id marks a padding pair.
pub fn copy_moves(src: &[i64], dst: &[i64], lim: &Limits<'_>, out: &mut Moves) -> Result<()> {
    let b = lim.backend;
    if src.len() != dst.len() {
        return Err(Error::plan(format!("{b}: src_blocks and dst_blocks must have the same length; got {} and {}", src.len(), dst.len())));
    }
    if src.len() > u32::MAX as usize {
        return Err(Error::plan(format!("{b}: too many copies ({})", src.len())));
    }
    out.conv.clear();
    out.temporal.clear();
    for i in 0..src.len() {
        let (s, d) = (src[i], dst[i]);
        if s < 0 || d < 0 {
            continue;
        }
        let d = lim.block_of_copy(i, "destination", d)?;
        let s = lim.block_of_copy(i, "source", s)?;
        if d == 0 {
            return Err(Error::plan(format!("{b}: copy {i}: the destination is the null block 0; the null block is never written")));
        }
        if s == 0 {
            return Err(Error::plan(format!("{b}: copy {i}: the source is the null block 0, which holds no state")));
        }
        if s == d {
            continue;
        }
        let m = Move { request: i as u32, src: s, dst: d, shift: 0 };
        if lim.conv_state.is_some() {
            out.conv.push(m);
        }
        if lim.temporal_state.is_some() {
            out.temporal.push(m);
        }
    }
    Ok(())
}
