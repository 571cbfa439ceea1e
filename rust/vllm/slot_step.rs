//! vLLM's GPU-resident runner (`MambaHybridModelState`, docs/design.md section 3.9) as one launch
//! per half-step: `rs_state_copy_slots` reads the runner's device tensors (`idx_mapping`, the
//! per-slot `num_computed_tokens`, `query_start_loc` or the sampled counts) and the adapter's
//! per-slot buffers, takes vLLM's state advance or count scatter itself and moves the states of
//! every group. [`SlotStep`] checks the adapter's buffers once and each half-step's inputs, and
//! packs the launch; the group tables travel as [`TableRef`] records in a device buffer of the
//! adapter's, rewritten only when a table moves.

use super::slot_commit::{rows_offset, stage_len, COMPUTED_AT};
use super::slots::check_capacity;
use crate::commit::plan::check_index;
use crate::error::{Error, Result};
use crate::kernels::abi::Launch;
use crate::kernels::args::{block_table, check_group_tables, IntType};
use crate::kernels::constants::{FLAG_DECIDE, FLAG_HAS_TEMPORAL, FLAG_PRE_COPY, THREADS};
pub use crate::kernels::records::slots::TableRef;
use crate::kernels::records::{MutPtr, Ptr, StateCopySlotsParams};
use crate::kernels::CommitLaunch;
use crate::kernels::{state_copy_grid, FusedCopy};
use crate::tensor::{Device, TensorDesc};

impl TableRef {
    /// The record's bytes (little-endian, as the kernel reads it).
    pub fn bytes(refs: &[TableRef]) -> Vec<u8> {
        refs.iter().flat_map(TableRef::to_le_bytes).collect()
    }
}

/// The control words of the adapter: the stamp (post-processes so far), the commit generation the
/// last pre-copy took over, the generation the last post-process with a stage saw.
pub const CTL_WORDS: u64 = 3;

/// The error words of the adapter: the pre-copy's two words (by stamp parity), the
/// post-process's, then the stamp of the last pre-copy (which pre-copy word is the step's).
pub const ERR_WORDS: u64 = 10;

/// One of the adapter's device buffers as the adapter allocates it: its initial value, its
/// elements and whether it is int64 (else int32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferSpec {
    pub fill: i64,
    pub len: u64,
    pub int64: bool,
}

/// The adapter's buffers for `slots` slots and `groups` groups, in [`SlotBuffers`]' order: the
/// running column (`-1`: none) and the accepted count (1) per slot, the scratch (`-1`), the
/// control and error words (0), the tables' [`TableRef`] records (0) and the commit stage (`-1`).
pub fn buffer_specs(slots: u64, groups: usize) -> [BufferSpec; 7] {
    let b = |fill, len, int64| BufferSpec { fill, len, int64 };
    [
        b(-1, slots, false),
        b(1, slots, false),
        b(-1, 3 * slots, false),
        b(0, CTL_WORDS, false),
        b(0, ERR_WORDS, false),
        b(0, 2 * groups as u64, true),
        b(-1, stage_len(slots), false),
    ]
}

/// The step's error word from a host copy of the error buffer ([`ERR_WORDS`] elements): the
/// pre-copy word of the step's stamp parity (as the last pre-copy recorded it) merged with the
/// post-process's (bits OR-ed, request bounds the larger).
pub fn step_word(words: &[i64]) -> Result<[i64; 3]> {
    if words.len() != ERR_WORDS as usize {
        return Err(Error::plan(format!("the error buffer has {} words, expected {ERR_WORDS}", words.len())));
    }
    let pre = 3 * (words[9] & 1) as usize;
    Ok([words[pre] | words[6], words[pre + 1].max(words[7]), words[pre + 2].max(words[8])])
}

/// A new or resumed request at slot `slot` of `slots` with `num_computed_tokens` in its state
/// (`vLLM's add_request`): the slot and the running column it is seeded with,
/// `(num_computed_tokens - 1) // block_size` (`-1` for a fresh request).
pub fn new_request(slot: i64, num_computed_tokens: i64, slots: u64, block_size: i64) -> Result<(usize, i64)> {
    let s = check_index("slot", slot, slots)?;
    let nct = check_index(&format!("request index {s}: num_computed_tokens"), num_computed_tokens, 1 << 31)?;
    if block_size < 1 {
        return Err(Error::plan(format!("block_size must be >= 1, got {block_size}")));
    }
    Ok((s, (nct as i64 - 1).div_euclid(block_size)))
}

/// The adapter's device buffers (int32 except `tables`, int64 `[2 * groups]`).
#[derive(Clone, Copy, Debug)]
pub struct SlotBuffers<'a> {
    pub state_idx: &'a TensorDesc,
    pub num_accepted: &'a TensorDesc,
    /// `[3 * slots]`: old column, old count, stamp of the slots a pre-copy moved.
    pub scratch: &'a TensorDesc,
    /// [`CTL_WORDS`]: the stamp and the commit generations.
    pub ctl: &'a TensorDesc,
    pub err: &'a TensorDesc,
    pub tables: &'a TensorDesc,
    /// The RecoverSSM commit's stage buffer (int32 [`stage_len`]`(slots)`, see
    /// [`super::slot_commit`]).
    pub commit: &'a TensorDesc,
}

/// A post-process's RecoverSSM commit, staged into the stage buffer: the staged plan's request rows
/// and table width ([`super::slot_commit::StagedCommit`]), and the cache's commit kernel when the
/// commit runs in this launch (`None`: it ran before; the launch sets the committed rows' columns
/// and counts only).
#[derive(Clone, Copy, Debug)]
pub struct Commit<'a> {
    pub request_rows: u64,
    pub cols: i32,
    pub kernel: Option<&'a CommitLaunch>,
}

/// A post-process's sampled counts: one per request row, or one for every row.
#[derive(Clone, Copy, Debug)]
pub enum Sampled<'a> {
    Each(&'a TensorDesc),
    All(i64),
}

/// One half's own launch values: `query_start_loc`, the sampled counts (pointer, or one count), the
/// RecoverSSM commit, and which half.
#[derive(Clone, Copy, Debug)]
struct Half<'a> {
    qsl: u64,
    sampled: (u64, i32),
    commit: Option<Commit<'a>>,
    post: bool,
}

/// The checked launch constants of one adapter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotStep {
    fused: FusedCopy,
    slots: u64,
    block_size: i32,
    state_idx: u64,
    num_accepted: u64,
    scratch: u64,
    ctl: u64,
    err: u64,
    tables: u64,
    commit: u64,
}

/// A contiguous vector of `dtype` on `device` with at least `min_len` elements.
fn vector(a: &TensorDesc, what: &str, device: &Device, dtype: IntType, min_len: u64) -> Result<u64> {
    if !Device::parse(&a.device).is_ok_and(|d| d == *device) {
        return Err(Error::plan(format!("{what} is on {}, the states on {device}", a.device)));
    }
    let v = crate::kernels::args::int_vector(a, what, min_len, &[dtype], crate::error::ErrorKind::Plan)?;
    Ok(if v.len == 0 { 0 } else { v.ptr })
}

/// The order of an adapter's half-steps: a step begins with its pre-copy (which may repeat: a
/// step whose post-process the engine skipped) and takes one post-process. A second post-process
/// without a pre-copy between would save the windows again from already-advanced columns, so it
/// is refused. A post-process of request rows before the first pre-copy is refused too: vLLM's V2
/// runner runs `preprocess_state`, the forward, then `postprocess_state` in every step with
/// requests; its dummy runs (profiling, CUDA graph capture) call neither half, a step with no
/// scheduled tokens returns before both, and a pipeline-parallel rank's deferred post-process
/// belongs to an earlier step that ran its pre-copy; a CUDA graph replay of the half-steps calls
/// no half here. A post-process of no rows is taken before the first pre-copy: it writes nothing
/// of any request, and an engine that skips an empty batch's pre-copy (vLLM's own returns early
/// there) may still call it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HalfOrder {
    /// No pre-copy has run yet.
    #[default]
    Fresh,
    /// A pre-copy ran since the last post-process.
    PrePending,
    /// A post-process ran since the last pre-copy.
    Posted,
}

impl HalfOrder {
    /// Records a pre-copy that ran.
    pub fn pre_ran(&mut self) {
        *self = HalfOrder::PrePending;
    }

    /// Checks that a post-process of `rows` request rows may run now (nothing changes).
    pub fn check_post(&self, rows: u64) -> Result<()> {
        match self {
            HalfOrder::Fresh if rows == 0 => Ok(()),
            HalfOrder::Fresh => Err(Error::plan(
                "postprocess_state: no preprocess_state has run yet (the first step's post-process needs that step's pre-copy before it; nothing was written)",
            )),
            HalfOrder::Posted => Err(Error::plan(
                "postprocess_state: no preprocess_state since the last post-process (a repeated post-process for one step is refused; nothing was written)",
            )),
            HalfOrder::PrePending => Ok(()),
        }
    }

    /// Records a post-process that ran.
    pub fn post_ran(&mut self) {
        if *self == HalfOrder::PrePending {
            *self = HalfOrder::Posted;
        }
    }
}

/// The block size as the slot kernel reads it (int32): `1 ..= 2**31 - 1`.
pub fn check_block_size(block_size: i64) -> Result<i32> {
    i32::try_from(block_size).ok().filter(|&b| b >= 1).ok_or_else(|| Error::plan(format!("block_size must be in 1 ..= 2**31 - 1, got {block_size}")))
}

/// Checks the engine's KV-cache group id of each planner group: one per group, each `>= 0`, no
/// id twice.
pub fn check_group_ids(ids: &[i64], groups: usize) -> Result<Vec<usize>> {
    if ids.len() != groups {
        return Err(Error::plan(format!("{} group ids for a planner of {groups} groups", ids.len())));
    }
    let mut out: Vec<usize> = Vec::with_capacity(ids.len());
    for (i, &g) in ids.iter().enumerate() {
        let g = usize::try_from(g).map_err(|_| Error::plan(format!("group_ids[{i}] = {g} is not a KV-cache group id (>= 0)")))?;
        if let Some(j) = out.iter().position(|&x| x == g) {
            return Err(Error::plan(format!("group_ids[{j}] and group_ids[{i}] are both KV-cache group {g}")));
        }
        out.push(g);
    }
    Ok(out)
}

impl SlotStep {
    /// Checks the adapter's buffers against `fused`'s device and groups: `state_idx` and
    /// `num_accepted` of `num_slots` elements, `scratch` of `3 * num_slots`, `ctl` of 1, `err` of
    /// [`ERR_WORDS`] (int32, contiguous), `tables` int64 of `2 * groups`; a block size in
    /// `1 ..= 2**31 - 1`.
    pub fn new(fused: FusedCopy, block_size: i64, num_slots: i64, b: &SlotBuffers<'_>) -> Result<SlotStep> {
        let slots = check_capacity(num_slots)? as u64;
        let block_size = check_block_size(block_size)?;
        let d = &fused.device;
        let i32v = |a: &TensorDesc, what: &str, n: u64| -> Result<u64> {
            let p = vector(a, what, d, IntType::I32, n)?;
            if a.shape != [n as i64] {
                return Err(Error::plan(format!("{what}: expected {n} elements, got shape {:?}", a.shape)));
            }
            Ok(p)
        };
        let step = SlotStep {
            slots,
            block_size,
            state_idx: i32v(b.state_idx, "state_idx", slots)?,
            num_accepted: i32v(b.num_accepted, "num_accepted", slots)?,
            scratch: i32v(b.scratch, "scratch", 3 * slots)?,
            ctl: i32v(b.ctl, "ctl", CTL_WORDS)?,
            err: i32v(b.err, "err", ERR_WORDS)?,
            tables: vector(b.tables, "tables", d, IntType::I64, 2 * fused.groups as u64)?,
            commit: i32v(b.commit, "commit stage", stage_len(slots))?,
            fused,
        };
        if step.commit % 8 != 0 {
            return Err(Error::plan(format!("commit stage: the buffer at {:#x} is not 8-byte aligned (its CommitRow records are)", step.commit)));
        }
        let extents = [
            (step.state_idx, slots),
            (step.num_accepted, slots),
            (step.scratch, 3 * slots),
            (step.ctl, CTL_WORDS),
            (step.err, ERR_WORDS),
            (step.commit, stage_len(slots)),
            (step.tables, 4 * step.fused.groups as u64), // int64 records: counted in int32 words
        ];
        for (i, &(a, n)) in extents.iter().enumerate() {
            for &(c, m) in &extents[i + 1..] {
                if a < c + 4 * m && c < a + 4 * n {
                    return Err(Error::plan("the adapter's buffers overlap; each needs memory of its own"));
                }
            }
        }
        Ok(step)
    }

    /// Slots of the buffers (`max_num_reqs`).
    pub fn slots(&self) -> u64 {
        self.slots
    }

    /// The groups' per-slot tables as the kernel reads them, and their width: one int32 `[>=
    /// slots, cols]` table per group on the states' device (column axis contiguous, one width for
    /// every group).
    pub fn table_refs(&self, tables: &[TensorDesc]) -> Result<(Vec<TableRef>, i32)> {
        check_group_tables(&self.fused.device, tables, self.fused.groups, self.slots)?;
        let mut cols = 0;
        let refs = tables
            .iter()
            .enumerate()
            .map(|(g, t)| {
                let d = block_table(t, &[IntType::I32], crate::error::ErrorKind::Plan)
                    .map_err(|e| Error::plan(format!("group {g}'s device block table: {}", e.message)))?;
                cols = d.cols as i32; // < 2**31, one width for every group (checked above)
                Ok(TableRef { addr: d.ptr, row_stride: d.row_stride })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((refs, cols))
    }

    /// The request rows of `idx_mapping` (int32 `[R]`, `R <= slots`).
    fn rows(&self, idx: &TensorDesc) -> Result<(u64, u64)> {
        let p = vector(idx, "idx_mapping", &self.fused.device, IntType::I32, 0)?;
        let n = idx.shape[0] as u64;
        if n > self.slots {
            return Err(Error::plan(format!("idx_mapping has {n} request rows, more than max_num_reqs = {}", self.slots)));
        }
        Ok((p, n))
    }

    fn launch(&self, cols: i32, rows: (u64, u64), computed: Option<&TensorDesc>, h: Half<'_>) -> Result<Launch> {
        // No counts (a post-process of a pipeline-parallel rank that is not the last): no aligned save.
        let nct = match computed {
            Some(c) => vector(c, "num_computed_tokens", &self.fused.device, IntType::I32, self.slots)?,
            None => 0,
        };
        let f = &self.fused;
        let mut flags = if f.has_temporal { FLAG_HAS_TEMPORAL } else { 0 };
        flags |= if h.post { FLAG_DECIDE } else { FLAG_PRE_COPY };
        // The commit's values: the stage, its computed tokens and width; its rows and kernel when fused.
        let (stage_at, computed_at, commit_cols) = h.commit.map_or((0, 0, 0), |c| (self.commit, self.commit + 4 * COMPUTED_AT, c.cols));
        let kernel = h.commit.and_then(|c| c.kernel);
        let rows_at = kernel.map_or(0, |_| self.commit + rows_offset(self.slots));
        let (metas, layers, blocks, workspace, rec, conv) =
            kernel.map_or((0, 0, 0, 0, 0, 0), |k| (k.metas, k.num_layers, k.num_blocks, k.max_requests, k.rec_ctas, k.conv_ctas));
        let params = StateCopySlotsParams {
            metas: Ptr::at(f.metas),
            tables: Ptr::at(self.tables),
            idx_mapping: Ptr::at(rows.0),
            num_computed: Ptr::at(nct),
            query_start_loc: Ptr::at(h.qsl),
            num_sampled: Ptr::at(h.sampled.0),
            commit_computed: Ptr::at(computed_at),
            commit_stage: Ptr::at(stage_at),
            commit_rows: Ptr::at(rows_at),
            commit_metas: Ptr::at(metas),
            state_idx: MutPtr::at(self.state_idx),
            num_accepted: MutPtr::at(self.num_accepted),
            scratch: MutPtr::at(self.scratch),
            ctl: MutPtr::at(self.ctl),
            err: MutPtr::at(self.err),
            commit_blocks: blocks,
            num_blocks: f.num_blocks,
            num_meta: f.num_meta,
            num_tables: f.groups,
            bt_cols: cols,
            num_rows: rows.1 as i32,
            sampled_fill: h.sampled.1,
            commit_cols,
            commit_cap: self.slots as u32,
            commit_layers: layers,
            commit_workspace: workspace,
            rec_ctas: rec,
            conv_ctas: conv,
            num_slots: self.slots as i32,
            block_size: self.block_size,
            max_accepted: f.max_accepted,
            flags,
            reserved: 0,
        };
        // With a commit the grid also spans its CTAs per (layer, row), before the copy's, and its layers.
        let x = u64::from(f.chunks) + u64::from(rec) + u64::from(conv);
        let x = u32::try_from(x).ok().filter(|&x| x <= i32::MAX as u32).ok_or_else(|| {
            Error::plan(format!("{} copy CTAs and {} commit CTAs exceed the grid's 2**31 - 1", f.chunks, u64::from(rec) + u64::from(conv)))
        })?;
        Ok(Launch::new(&params, state_copy_grid(rows.1, (f.num_meta).max(layers) as u64, x), [THREADS, 1, 1]))
    }

    /// The pre-copy's launch over tables `cols` wide: `idx_mapping` int32 `[R]`, `num_computed`
    /// int32 `[>= slots]` (per slot, before this step), `query_start_loc` int32 `[>= R + 1]`.
    pub fn pre(&self, cols: i32, idx: &TensorDesc, num_computed: &TensorDesc, query_start_loc: &TensorDesc) -> Result<Launch> {
        let rows = self.rows(idx)?;
        let qsl = vector(query_start_loc, "query_start_loc", &self.fused.device, IntType::I32, rows.1 + 1)?;
        self.launch(cols, rows, Some(num_computed), Half { qsl, sampled: (0, 0), commit: None, post: false })
    }

    /// The post-process's launch: `num_computed` per slot after this step (`None`, as vLLM's
    /// non-last pipeline-parallel ranks pass it: the counts are scattered, a staged commit runs, and
    /// no aligned save is made), the sampled counts per request row (int32 `[>= R]`) or one count for
    /// every row (`>= 0`, 0 counting as 1 as in vLLM; a negative one is refused: the per-row counts
    /// are the kernel's alone, which reads a negative one as 1, as vLLM's scatter does).
    /// With a RecoverSSM `commit` staged (counts per row only, a batch of at least its rows), the
    /// committed rows' columns and counts are set as vLLM's `commit_step` does before the aligned
    /// save, and with its `kernel` (the cache's, on the states' device, [`THREADS`] per CTA) the
    /// commit itself runs in this launch.
    pub fn post(
        &self,
        cols: i32,
        idx: &TensorDesc,
        num_computed: Option<&TensorDesc>,
        sampled: Sampled<'_>,
        commit: Option<Commit<'_>>,
    ) -> Result<Launch> {
        let rows = self.rows(idx)?;
        let sampled = match sampled {
            Sampled::Each(t) => (vector(t, "num_sampled", &self.fused.device, IntType::I32, rows.1)?, 0),
            Sampled::All(n) => {
                // vLLM counts 0 as 1 (a chunked prefill samples nothing) and never passes a
                // negative count: one would be read as 1 for every row.
                if n < 0 {
                    return Err(Error::plan(format!("num_sampled = {n} (one count for every row) must be >= 0 (tokens sampled; 0 counts as 1)")));
                }
                let n = i32::try_from(n).map_err(|_| Error::plan(format!("num_sampled = {n} does not fit int32")))?;
                (0, n)
            }
        };
        if let Some(c) = commit {
            if sampled.0 == 0 {
                return Err(Error::plan("a RecoverSSM commit needs the sampled counts per row, not one integer"));
            }
            if c.request_rows > rows.1 {
                return Err(Error::plan(format!(
                    "the staged RecoverSSM commit names request row {}, but this post-process has {} rows",
                    c.request_rows - 1,
                    rows.1
                )));
            }
            if let Some(k) = c.kernel {
                if k.device != self.fused.device || k.threads != THREADS {
                    return Err(Error::plan(format!(
                        "the commit kernel runs on {} with {} threads per CTA; the post-process launches on {} with {THREADS}",
                        k.device, k.threads, self.fused.device
                    )));
                }
            }
        }
        self.launch(cols, rows, num_computed, Half { qsl: 0, sampled, commit, post: true })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::kernels::copy::tests::{arg as t, BASE};
    use crate::tensor::Device;

    const FUSED: FusedCopy = FusedCopy { max_accepted: 3, num_blocks: 64, chunks: 2, err: 0, groups: 2, ..BASE };

    /// The adapter's buffers for 8 slots and 2 groups: state_idx, num_accepted, scratch, ctl, err,
    /// tables, the commit stage.
    fn buffers() -> [TensorDesc; 7] {
        [
            t(10_000, "int32", &[8]),
            t(11_000, "int32", &[8]),
            t(12_000, "int32", &[24]),
            t(13_000, "int32", &[3]),
            t(14_000, "int32", &[10]),
            t(15_000, "int64", &[4]),
            t(16_000, "int32", &[80]),
        ]
    }

    fn step() -> SlotStep {
        let [s, a, sc, c, e, tb, cm] = buffers();
        SlotStep::new(FUSED, 4, 8, &SlotBuffers { state_idx: &s, num_accepted: &a, scratch: &sc, ctl: &c, err: &e, tables: &tb, commit: &cm })
            .unwrap()
    }

    /// The record's fields in the order the expected values below list them.
    const FIELDS: [&str; 32] = [
        "metas",
        "num_meta",
        "tables",
        "num_tables",
        "bt_cols",
        "idx_mapping",
        "num_rows",
        "num_computed",
        "query_start_loc",
        "num_sampled",
        "sampled_fill",
        "commit_computed",
        "commit_cols",
        "commit_stage",
        "commit_rows",
        "commit_cap",
        "commit_metas",
        "commit_layers",
        "commit_blocks",
        "commit_workspace",
        "rec_ctas",
        "conv_ctas",
        "state_idx",
        "num_accepted",
        "scratch",
        "ctl",
        "num_slots",
        "block_size",
        "max_accepted",
        "num_blocks",
        "flags",
        "err",
    ];

    #[test]
    fn launches_fill_the_slot_record_by_name() {
        let st = step();
        let (idx, nct, qsl) = (t(20_000, "int32", &[3]), t(21_000, "int32", &[8]), t(22_000, "int32", &[9]));
        let l = st.pre(5, &idx, &nct, &qsl).unwrap();
        assert_eq!((l.kernel.name, l.grid), ("rs_state_copy_slots", [2, 3, 3]));
        let v = l.named(&FIELDS);
        let pre = (FLAG_HAS_TEMPORAL | FLAG_PRE_COPY) as i128;
        let none = [0; 9];
        let head = [1000, 3, 15_000, 2, 5, 20_000, 3, 21_000, 22_000, 0, 0, 0, 0];
        let tail = [10_000, 11_000, 12_000, 13_000, 8, 4, 3, 64, pre, 14_000];
        assert_eq!(v, [&head[..], &[0, 0, 8], &none[3..], &tail[..]].concat());
        let ns = t(23_000, "int32", &[3]);
        let v = st.post(5, &idx, Some(&nct), Sampled::Each(&ns), None).unwrap().named(&["query_start_loc", "num_sampled", "flags"]);
        assert_eq!(v, [0, 23_000, (FLAG_HAS_TEMPORAL | FLAG_DECIDE) as i128]);
        let v = st.post(5, &idx, Some(&nct), Sampled::All(2), None).unwrap().named(&["num_sampled", "sampled_fill"]);
        assert_eq!(v, [0, 2]);
        // No counts (a non-last pipeline-parallel rank): the launch has a null num_computed.
        let v = st.post(5, &idx, None, Sampled::All(0), None).unwrap().named(&["num_computed", "num_sampled", "sampled_fill"]);
        assert_eq!(v, [0, 0, 0]);
        // A staged commit that ran before: the computed tokens and the width, nothing of the kernel.
        let ran = Commit { request_rows: 3, cols: 7, kernel: None };
        let l = st.post(5, &idx, Some(&nct), Sampled::Each(&ns), Some(ran)).unwrap();
        let v = l.named(&FIELDS);
        assert_eq!((&v[11..13], &v[13..22], l.grid), (&[16_008, 7][..], &[16_000, 0, 8, 0, 0, 0, 0, 0, 0][..], [2, 3, 3]));
        // The commit in this launch: the stage's count and rows, the kernel's table and grid.
        let table = [crate::commit::CommitMeta { heads: 2, head_v: 16, head_k: 16, ..Default::default() }; 5];
        let k = CommitLaunch::new(Device::Cuda(0), 900, &table, 64, 4, 0, THREADS).unwrap();
        let l = st.post(5, &idx, Some(&nct), Sampled::Each(&ns), Some(Commit { kernel: Some(&k), ..ran })).unwrap();
        let v = l.named(&FIELDS);
        let (rec, conv) = (k.rec_ctas as i128, k.conv_ctas as i128);
        assert_eq!(&v[11..22], &[16_008, 7, 16_000, 16_000 + 64, 8, 900, 5, 64, 4, rec, conv][..]);
        assert_eq!(l.grid, [(2 + rec + conv) as u32, 3, 5]);
        let e = st.post(5, &idx, Some(&nct), Sampled::All(2), Some(ran)).unwrap_err();
        assert!(e.message.contains("needs the sampled counts per row"), "{}", e.message);
        let e = st.post(5, &idx, Some(&nct), Sampled::Each(&ns), Some(Commit { request_rows: 4, ..ran })).unwrap_err();
        assert_eq!(e.message, "the staged RecoverSSM commit names request row 3, but this post-process has 3 rows");
        let far = CommitLaunch::new(Device::Cuda(1), 900, &table, 64, 4, 0, THREADS).unwrap();
        let e = st.post(5, &idx, Some(&nct), Sampled::Each(&ns), Some(Commit { kernel: Some(&far), ..ran })).unwrap_err();
        assert!(e.message.contains("the commit kernel runs on cuda:1"), "{}", e.message);
        // An empty batch still launches (the stamp and the words advance).
        assert_eq!(st.pre(5, &t(20_000, "int32", &[0]), &nct, &t(22_000, "int32", &[1])).unwrap().grid, [2, 1, 3]);
    }

    #[test]
    fn inputs_are_checked() {
        let st = step();
        let (idx, nct, qsl) = (t(20_000, "int32", &[3]), t(21_000, "int32", &[8]), t(22_000, "int32", &[9]));
        let msg = |r: Result<Launch>| r.unwrap_err().message;
        assert_eq!(msg(st.pre(5, &t(20_000, "int32", &[9]), &nct, &qsl)), "idx_mapping has 9 request rows, more than max_num_reqs = 8");
        assert!(msg(st.pre(5, &t(20_000, "int64", &[3]), &nct, &qsl)).contains("idx_mapping: expected int32, got int64"));
        assert!(msg(st.pre(5, &idx, &t(21_000, "int32", &[7]), &qsl)).contains("num_computed_tokens: expected a 1-D vector of at least 8"));
        assert!(msg(st.pre(5, &idx, &nct, &t(22_000, "int32", &[3]))).contains("query_start_loc: expected a 1-D vector of at least 4"));
        let mut far = idx.clone();
        far.device = "cuda:1".into();
        assert_eq!(msg(st.pre(5, &far, &nct, &qsl)), "idx_mapping is on cuda:1, the states on cuda:0");
        assert!(
            msg(st.post(5, &idx, Some(&nct), Sampled::Each(&t(1, "int32", &[2])), None)).contains("num_sampled: expected a 1-D vector of at least 3")
        );
        assert!(msg(st.post(5, &idx, Some(&nct), Sampled::All(1 << 40), None)).contains("does not fit int32"));
        for n in [-1, -(1 << 40)] {
            assert!(
                msg(st.post(5, &idx, None, Sampled::All(n), None)).starts_with(&format!("num_sampled = {n} (one count for every row) must be >= 0"))
            );
        }
    }

    #[test]
    fn a_new_request_is_seeded_with_its_running_column() {
        assert_eq!(new_request(2, 0, 4, 4), Ok((2, -1)));
        assert_eq!(new_request(3, 9, 4, 4), Ok((3, 2)));
        assert!(new_request(4, 1, 4, 4).unwrap_err().message.starts_with("slot 4 is out of range"));
        assert!(new_request(0, -1, 4, 4).unwrap_err().message.contains("num_computed_tokens -1 is out of range"));
    }

    #[test]
    fn the_buffers_and_the_step_word() {
        let specs = buffer_specs(4, 2);
        assert_eq!(specs.map(|b| b.len), [4, 4, 12, CTL_WORDS, ERR_WORDS, 4, stage_len(4)]);
        assert_eq!(specs.map(|b| b.fill), [-1, 1, -1, 0, 0, 0, -1]);
        assert_eq!(specs.iter().filter(|b| b.int64).count(), 1);
        // Stamp 1: the pre-copy word at 3..6 is the step's, merged with the post-process's.
        let words = [7, 7, 7, 1, 2, 3, 4, 1, 9, 1];
        assert_eq!(step_word(&words), Ok([5, 2, 9]));
        assert_eq!(step_word(&[0, 0, 0, 9, 9, 9, 0, 0, 0, 0]), Ok([0, 0, 0]));
        assert!(step_word(&[0; 3]).unwrap_err().message.contains("3 words, expected 10"));
    }

    #[test]
    fn a_post_process_needs_a_pre_copy_of_its_own() {
        let mut o = HalfOrder::default();
        // before any pre-copy, a post-process of request rows is refused; one of no rows is taken
        assert!(o.check_post(1).unwrap_err().message.contains("no preprocess_state has run yet"));
        assert_eq!(o.check_post(0), Ok(()));
        o.post_ran();
        assert_eq!(o, HalfOrder::Fresh);
        o.pre_ran();
        o.pre_ran(); // a pre-copy may repeat
        assert_eq!(o.check_post(2), Ok(()));
        o.post_ran();
        assert!(o.check_post(2).unwrap_err().message.contains("no preprocess_state since the last post-process"));
        o.pre_ran();
        assert_eq!(o.check_post(2), Ok(()));
    }

    #[test]
    fn tables_and_group_ids_are_checked() {
        let st = step();
        let mut a = t(30_000, "int32", &[8, 5]);
        let b = t(40_000, "int32", &[10, 5]);
        let refs = st.table_refs(&[a.clone(), b.clone()]).unwrap();
        assert_eq!(refs, (vec![TableRef { addr: 30_000, row_stride: 5 }, TableRef { addr: 40_000, row_stride: 5 }], 5));
        assert_eq!(TableRef::bytes(&refs.0).len(), 32);
        assert!(st.table_refs(&[a.clone()]).unwrap_err().message.contains("1 device block tables for 2"));
        assert!(st.table_refs(&[t(1, "int32", &[7, 5]), b.clone()]).unwrap_err().message.contains("has 7 rows for 8 requests"));
        a.dtype = "int64".into();
        assert!(st.table_refs(&[a.clone(), t(1, "int64", &[8, 5])]).unwrap_err().message.contains("expected int32"));
        assert_eq!(check_group_ids(&[3, 0], 2), Ok(vec![3, 0]));
        assert_eq!(check_group_ids(&[1], 2).unwrap_err().message, "1 group ids for a planner of 2 groups");
        assert!(check_group_ids(&[1, -1], 2).unwrap_err().message.contains("group_ids[1] = -1"));
        assert!(check_group_ids(&[1, 1], 2).unwrap_err().message.contains("both KV-cache group 1"));
    }

    #[test]
    fn buffers_are_checked_once() {
        let [s, a, sc, c, e, tb, cm] = buffers();
        let b = SlotBuffers { state_idx: &s, num_accepted: &a, scratch: &sc, ctl: &c, err: &e, tables: &tb, commit: &cm };
        assert!(SlotStep::new(FUSED, 0, 8, &b).unwrap_err().message.contains("block_size"));
        assert!(SlotStep::new(FUSED, 4, 0, &b).unwrap_err().message.contains("max_num_reqs"));
        let short = t(14_000, "int32", &[3]);
        assert!(SlotStep::new(FUSED, 4, 8, &SlotBuffers { err: &short, ..b }).unwrap_err().message.contains("err"));
        let over = t(10_016, "int32", &[8]);
        assert!(SlotStep::new(FUSED, 4, 8, &SlotBuffers { num_accepted: &over, ..b }).unwrap_err().message.contains("overlap"));
        let short = t(16_000, "int32", &[79]);
        assert!(SlotStep::new(FUSED, 4, 8, &SlotBuffers { commit: &short, ..b })
            .unwrap_err()
            .message
            .contains("commit stage: expected a 1-D vector of at least 80"));
        let odd = t(16_004, "int32", &[80]);
        assert!(SlotStep::new(FUSED, 4, 8, &SlotBuffers { commit: &odd, ..b }).unwrap_err().message.contains("not 8-byte aligned"));
        let over_tables = t(15_008, "int32", &[80]);
        assert!(SlotStep::new(FUSED, 4, 8, &SlotBuffers { commit: &over_tables, ..b }).unwrap_err().message.contains("overlap"));
        let inside = t(14_016, "int32", &[80]);
        assert!(SlotStep::new(FUSED, 4, 8, &SlotBuffers { commit: &inside, ..b }).unwrap_err().message.contains("overlap"));
    }
}
