//! The copy plan's records, shared bit for bit with the CUDA kernels (declared for them by the
//! generated `python/recoverssm_rs/kernels/rs_abi.cuh`): segments and tiles of a planned wave, the
//! compact `MoveRow`, and the fused copy's per-state `StateMeta`. The planner (`crate::plan`) builds them.

/// How a segment's source and destination may overlap, and so how it must be executed.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Source and destination bytes are disjoint from every other segment of the wave: any order.
    Disjoint = 0,
    /// An in-block conv shift in SD orientation: `src = dst + k * pitch` (k >= 1 rows), rows
    /// overlap, byte lanes are independent. Execute each lane over rows in ascending order.
    RowsAscending = 1,
    /// An in-block conv shift in DS orientation: inside each row `src = dst + k * elem_bytes`
    /// (k >= 1), rows are disjoint. Execute each row by one worker in ascending order.
    WithinRow = 2,
}

super::record! {
    /// One 2-D strided copy inside one state tensor: for `r in 0..rows`, copy `row_bytes` bytes from
    /// `src + r * pitch` to `dst + r * pitch`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct Segment {
        /// Byte address of the first source byte.
        pub src: u64,
        /// Byte address of the first destination byte.
        pub dst: u64,
        /// Bytes per row (>= 1).
        pub row_bytes: u32,
        /// Number of rows (>= 1).
        pub rows: u32,
        /// Bytes between consecutive rows (source and destination); irrelevant when `rows == 1`.
        pub pitch: u32,
        /// Ordering wave.
        pub wave: u16,
        /// `RS_MODE_*`, the values of `Mode`.
        pub mode: u8,
        /// Element size of the state (1, 2, 4 or 8).
        pub elem_bytes: u8,
    }
}

impl Segment {
    /// Bytes from the first to one past the last byte the segment touches on one side.
    #[inline]
    pub fn extent(&self) -> u64 {
        (self.rows as u64 - 1) * self.pitch as u64 + self.row_bytes as u64
    }
    /// Bytes copied.
    #[inline]
    pub fn bytes(&self) -> u64 {
        self.rows as u64 * self.row_bytes as u64
    }
    pub fn mode(&self) -> Mode {
        match self.mode {
            1 => Mode::RowsAscending,
            2 => Mode::WithinRow,
            _ => Mode::Disjoint,
        }
    }
}

super::record! {
    /// A unit of work for one CTA, cut from one segment: bytes `[begin, begin + count)` of every row
    /// when the segment has one row or is `RowsAscending`, rows `[begin, begin + count)` otherwise.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct Tile {
        /// Index into the segment array.
        pub segment: u32,
        /// First unit.
        pub begin: u32,
        /// Number of units.
        pub count: u32,
        /// 0.
        pub reserved: u32,
    }
}

super::record! {
    /// One request's copy in compact form, the same for every layer: the device expands it with the
    /// per-state metadata table. Block ids are -1 where that kind of state is not copied (no kernel
    /// reads it today).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct MoveRow {
        pub request: u32,
        /// Conv columns dropped (accepted tokens - 1).
        pub shift: u32,
        /// Conv source block, or -1.
        pub conv_src: i64,
        /// Temporal source block, or -1.
        pub temporal_src: i64,
        /// Destination block, or -1.
        pub dst: i64,
        pub conv_wave: u16,
        pub temporal_wave: u16,
        /// The recurrent group whose block ids these are.
        pub group: u32,
    }
}

super::record! {
    /// One (layer, persistent state) of the fused state-copy kernel, built at bind time.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct StateMeta {
        /// Address of block 0 of this state tensor.
        pub base: u64,
        /// Bytes between consecutive blocks.
        pub block_stride: u64,
        /// Bytes of one block's state (dense).
        pub state_bytes: u64,
        /// `RS_KIND_*`: 0 temporal, 1 conv SD `[width, dim]`, 2 conv DS `[dim, width]`.
        pub kind: u32,
        /// Element size.
        pub elem_bytes: u32,
        /// Conv window columns (conv kinds).
        pub width: u32,
        /// Conv channels (conv kinds).
        pub dim: u32,
        /// Informational.
        pub layer: u32,
        /// Informational.
        pub state: u32,
        /// Blocks in the tensor.
        pub num_blocks: u64,
        /// The recurrent group whose block table the state follows (0 for a single-group planner).
        pub group: u32,
        pub reserved: u32,
    }
}
