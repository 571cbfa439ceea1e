//! The slot kernels' records: SGLang's pool `SlotCopy` (built by `crate::sglang::kernel`) and vLLM's
//! per-group `TableRef` (built by `crate::vllm::slot_step`).

super::record! {
    /// One (layer, state tensor) of `rs_slot_scatter`. The pool's slot is dense (`bytes` contiguous
    /// bytes at `dst + slot * dst_slot_stride`); the verify scratch's entry of (row, step) is a
    /// `rows x cols` matrix of `elem_bytes` elements at `src + row * src_row_stride + step *
    /// src_step_stride`, `src_pitch` bytes between rows and `src_col_stride` between columns (the
    /// deduplicated conv-window view is strided), read in row-major order.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct SlotCopy {
        /// Address of slot 0 of this layer in the pool tensor.
        pub dst: u64,
        /// Bytes between slots.
        pub dst_slot_stride: u64,
        /// Address of scratch row 0, step 0 of this layer (0: no scratch).
        pub src: u64,
        pub src_row_stride: u64,
        pub src_step_stride: u64,
        /// Bytes of one slot (dense).
        pub bytes: u64,
        /// Rows of a scratch entry.
        pub rows: u64,
        /// Elements per row of a scratch entry.
        pub cols: u64,
        /// Bytes between rows of a scratch entry.
        pub src_pitch: u64,
        /// Bytes between elements of a row of a scratch entry.
        pub src_col_stride: u64,
        /// Element size.
        pub elem_bytes: u32,
        /// Informational.
        pub tensor: u32,
    }
}

super::record! {
    /// One recurrent group's per-slot block table, as rs_state_copy_slots reads it.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct TableRef {
        /// Device address of row 0 (int32 block ids).
        pub addr: u64,
        /// Elements between rows.
        pub row_stride: i64,
    }
}
