//! The kernels' parameter records: each kernel entry point takes exactly one of them, by value
//! (`rs_state_copy(StateCopyParams p)`), and reads its arguments by field name. The launch builders
//! (`kernels::copy`, `kernels::commit`, `crate::sglang::kernel`, `crate::vllm::slot_step`) fill them
//! by field name, and a launch's argument buffer is the record's bytes ([`super::Record::bytes`]):
//! the generated header declares the same struct, its size and every field offset checked by
//! `static_assert`, so no argument is ever placed by position. Each record lists its pointers
//! first, then its 8-byte and 4-byte integers (no padding; `reserved` evens a record out).

use super::{CommitMeta, CommitRow, MutPtr, Ptr, Segment, SlotCopy, StateMeta, TableRef, Tile};

super::record! {
    /// The parameters of `rs_copy_tiles`: one wave of a planned batched copy.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct CopyTilesParams {
        /// The wave's segments.
        pub segments: Ptr<Segment>,
        /// The plan's tiles (the wave's start at `first_tile`).
        pub tiles: Ptr<Tile>,
        pub first_tile: u32,
        pub num_tiles: u32,
    }
}

super::record! {
    /// The parameters of `rs_state_copy`: the fused align-mode copy of every state of every layer
    /// for one step (see `state_copy.cu`).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct StateCopyParams {
        pub metas: Ptr<StateMeta>,
        /// `[groups, requests, bt_cols]` int32 block ids (one group: `[requests, bt_cols]`).
        pub block_table: Ptr<i32>,
        pub src_col: Ptr<i32>,
        /// `dst_col`, or `running` with `RS_FLAG_DECIDE`.
        pub dst_or_running: Ptr<i32>,
        pub num_accepted: Ptr<i32>,
        /// Each request's accepted count after the step (null: not written).
        pub num_accepted_out: MutPtr<i32>,
        /// The error word (`int32[3]`).
        pub err: MutPtr<i32>,
        /// Elements between rows of the block table.
        pub bt_row_stride: i64,
        /// Elements between groups' tables.
        pub bt_group_stride: i64,
        pub num_blocks: i64,
        pub num_meta: u32,
        pub bt_cols: i32,
        pub block_size: i32,
        pub num_requests: i32,
        pub max_accepted: i32,
        /// `RS_FLAG_*`.
        pub flags: u32,
    }
}

super::record! {
    /// The parameters of `rs_state_copy_slots`: one half-step of vLLM's GPU-resident runner, with
    /// the RecoverSSM commit fused in when `commit_rows` is set (see `state_copy_slots.cu`).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct StateCopySlotsParams {
        pub metas: Ptr<StateMeta>,
        /// One record per group.
        pub tables: Ptr<TableRef>,
        pub idx_mapping: Ptr<i32>,
        /// Per slot.
        pub num_computed: Ptr<i32>,
        /// Pre-copy only (null in a post-process).
        pub query_start_loc: Ptr<i32>,
        /// Per batch row (null: `sampled_fill` for every row).
        pub num_sampled: Ptr<i32>,
        /// The staged commit's computed tokens (null: no commit staged).
        pub commit_computed: Ptr<i32>,
        /// The commit stage buffer.
        pub commit_stage: Ptr<i32>,
        /// The staged commit rows (null: the commit kernel does not run in this launch).
        pub commit_rows: Ptr<CommitRow>,
        pub commit_metas: Ptr<CommitMeta>,
        pub state_idx: MutPtr<i32>,
        pub num_accepted: MutPtr<i32>,
        pub scratch: MutPtr<i32>,
        pub ctl: MutPtr<i32>,
        /// The error words.
        pub err: MutPtr<i32>,
        pub commit_blocks: i64,
        pub num_blocks: i64,
        pub num_meta: u32,
        pub num_tables: u32,
        pub bt_cols: i32,
        pub num_rows: i32,
        pub sampled_fill: i32,
        pub commit_cols: i32,
        pub commit_cap: u32,
        pub commit_layers: u32,
        pub commit_workspace: u32,
        pub rec_ctas: u32,
        pub conv_ctas: u32,
        pub num_slots: i32,
        pub block_size: i32,
        pub max_accepted: i32,
        /// `RS_FLAG_*`.
        pub flags: u32,
        /// 0.
        pub reserved: u32,
    }
}

super::record! {
    /// The parameters of `rs_recover_commit`: one RecoverSSM commit over `num_rows` rows.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct RecoverCommitParams {
        pub metas: Ptr<CommitMeta>,
        pub rows: Ptr<CommitRow>,
        /// Device counts indexed by `CommitRow.count_index` (null: the rows' own counts).
        pub num_accepted: Ptr<i32>,
        /// The error word (`int32[3]`).
        pub err: MutPtr<i32>,
        pub num_blocks: i64,
        pub num_layers: u32,
        pub num_rows: u32,
        pub num_counts: u32,
        pub max_requests: u32,
        /// CTAs of the recurrent part (the conv part's follow on grid x).
        pub rec_ctas: u32,
        /// 0.
        pub reserved: u32,
    }
}

super::record! {
    /// The parameters of `rs_slot_scatter`: one clear or commit of SGLang's pool slots.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct SlotScatterParams {
        pub metas: Ptr<SlotCopy>,
        pub slots: Ptr<i64>,
        /// Null: clear the slots.
        pub steps: Ptr<i64>,
        pub rows: Ptr<i64>,
        pub track_slots: Ptr<i64>,
        pub track_steps: Ptr<i64>,
        /// The error word (`int32[3]`).
        pub err: MutPtr<i32>,
        pub num_slots: i64,
        pub num_rows: i64,
        pub draft: i64,
        pub num_meta: u32,
        pub num_requests: i32,
    }
}
