//! The transfer plan's rows (built by `crate::transfer::plan`): a `Read` of a peer's bytes and the
//! `StagedCopy` that finishes a staged state locally. The Python package views them by field name.

/// `dst_tensor` of a read that lands in the staging buffer (exported with the core's constants,
/// `kernels::constants::HOST_CONSTANTS`).
pub const STAGING: u64 = u64::MAX;

super::record! {
    /// One read of a transfer plan: `len` bytes from `src_offset` of the source rank's tensor
    /// `src_tensor` (offsets from the tensor's block 0) to `dst_offset` of the destination tensor
    /// `dst_tensor`, or of the staging buffer when `dst_tensor == STAGING`. The Python package views
    /// the packed rows by these fields.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Read {
        pub request: u64,
        pub src_rank: u64,
        pub src_tensor: u64,
        /// Bytes from the source tensor's block 0.
        pub src_offset: u64,
        /// Destination tensor, or `STAGING` (the staging buffer).
        pub dst_tensor: u64,
        /// Bytes from the destination tensor's block 0 (or the staging buffer's start).
        pub dst_offset: u64,
        /// Bytes.
        pub len: u64,
    }
}

super::record! {
    /// A local copy that finishes a staged state: a `rows x cols` matrix of `elem`-byte items from
    /// the staging buffer to a destination tensor, both sides given by byte offset and strides.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct StagedCopy {
        pub request: u64,
        /// Bytes from the staging buffer's start.
        pub src_offset: u64,
        pub src_row_stride: u64,
        pub src_col_stride: u64,
        pub dst_tensor: u64,
        /// Bytes from the destination tensor's block 0.
        pub dst_offset: u64,
        pub dst_row_stride: u64,
        pub dst_col_stride: u64,
        pub rows: u64,
        pub cols: u64,
        /// Bytes per item.
        pub elem: u64,
    }
}
