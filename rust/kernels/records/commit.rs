//! The RecoverSSM commit's records: one request's `CommitRow` (planned by `crate::commit::plan`) and
//! one layer's `CommitMeta` of the commit kernel's table (built by `crate::commit::meta`).

super::record! {
    /// One request's commit, shared by every layer.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct CommitRow {
        /// Index of the request in the step's batch (its workspace row).
        pub request: u32,
        /// Tokens folded into the state: `clamp(num_accepted, 0, query_len)` (with a `num_accepted`
        /// vector on the device: the cap).
        pub count: u32,
        /// Block holding the request's running state (read and written in place); <= 0: padding row.
        pub state_block: i64,
        /// Prefix-cache block that receives the state at the crossed block boundary, or -1.
        pub boundary_block: i64,
        /// Tokens of the window up to the boundary (1..=count), 0 without a boundary.
        pub boundary_len: u32,
        /// The entry of the device counts (`num_accepted`) holding this row's count: `request` as
        /// planned; an engine whose counts are indexed otherwise (vLLM's per-batch-row sampled
        /// counts) sets its own.
        pub count_index: u32,
    }
}

super::record! {
    /// One layer of the commit kernel's table (128 bytes): byte addresses and byte strides; every
    /// tensor is dense inside a block / workspace row (`cuda.COMMIT_META_DTYPE` in Python).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct CommitMeta {
        /// Recurrent pool, block 0: `[num_blocks, H, V, K]`.
        pub rec_base: u64,
        /// Bytes between blocks.
        pub rec_block_stride: u64,
        /// Corrections, row 0: `[max_requests, H, Q, V]` float32.
        pub corr_base: u64,
        pub corr_row_stride: u64,
        /// Key+gate records, row 0: `[max_requests, H, Q, kg_width]`.
        pub kg_base: u64,
        pub kg_row_stride: u64,
        /// Conv pool, block 0: `[num_blocks, W, D]` (SD) or `[num_blocks, D, W]` (DS).
        pub conv_base: u64,
        pub conv_block_stride: u64,
        /// Verified conv windows, row 0: `[max_requests, same as a block]`.
        pub win_base: u64,
        pub win_row_stride: u64,
        /// H.
        pub heads: u32,
        /// V.
        pub head_v: u32,
        /// K.
        pub head_k: u32,
        /// Q (tokens per verified window).
        pub window: u32,
        /// K + 1 (GDN) or 2K (KDA).
        pub kg_width: u32,
        /// `RS_RC_GDN` / `RS_RC_KDA`.
        pub kind: u32,
        /// `RS_DT_*`.
        pub state_dtype: u32,
        /// `RS_DT_*`.
        pub kg_dtype: u32,
        /// `RS_RC_NO_CONV`, `RS_KIND_CONV_SD`, `RS_KIND_CONV_DS`.
        pub conv_layout: u32,
        /// W = conv_kernel_size - 1 + Q - 1.
        pub conv_width: u32,
        /// D.
        pub conv_dim: u32,
        /// conv_kernel_size - 1.
        pub conv_hist: u16,
        /// Bytes per conv element (1, 2, 4 or 8).
        pub conv_elem: u16,
    }
}

const _: () = assert!(std::mem::size_of::<CommitMeta>() == 128);
const _: () = assert!(
    std::mem::offset_of!(CommitMeta, win_row_stride) == 72
        && std::mem::offset_of!(CommitMeta, heads) == 80
        && std::mem::offset_of!(CommitMeta, conv_dim) == 120
        && std::mem::offset_of!(CommitMeta, conv_hist) == 124
        && std::mem::offset_of!(CommitMeta, conv_elem) == 126
);
