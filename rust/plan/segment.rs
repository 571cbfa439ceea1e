//! The plan's output records, shared bit for bit with the CUDA kernels (declared for them by the
//! generated `python/recoverssm_rs/kernels/rs_abi.cuh`).

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

/// One 2-D strided copy inside one state tensor: for `r in 0..rows`, copy `row_bytes` bytes from
/// `src + r * pitch` to `dst + r * pitch`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Segment {
    pub src: u64,
    pub dst: u64,
    pub row_bytes: u32,
    pub rows: u32,
    pub pitch: u32,
    pub wave: u16,
    pub mode: u8,
    pub elem_bytes: u8,
}

const _: () = assert!(std::mem::size_of::<Segment>() == 32);

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

/// A unit of GPU work cut from one segment: bytes `[begin, begin + count)` of every row when the
/// segment has one row or is `RowsAscending`, rows `[begin, begin + count)` otherwise.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tile {
    pub segment: u32,
    pub begin: u32,
    pub count: u32,
    pub reserved: u32,
}

const _: () = assert!(std::mem::size_of::<Tile>() == 16);

/// One request's copy in compact form, the same for every layer: the device expands it with the
/// per-state metadata table. Block ids are -1 where that kind of state is not copied.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MoveRow {
    pub request: u32,
    /// Conv columns dropped (accepted tokens - 1).
    pub shift: u32,
    pub conv_src: i64,
    pub temporal_src: i64,
    pub dst: i64,
    pub conv_wave: u16,
    pub temporal_wave: u16,
    /// The recurrent group whose block ids these are.
    pub group: u32,
}

const _: () = assert!(std::mem::size_of::<MoveRow>() == 40);

/// Per (layer, persistent state) metadata for the fused device kernel, built at bind time.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StateMeta {
    pub base: u64,
    pub block_stride: u64,
    pub state_bytes: u64,
    /// 0 temporal, 1 conv SD `[width, dim]`, 2 conv DS `[dim, width]`.
    pub kind: u32,
    pub elem_bytes: u32,
    pub width: u32,
    pub dim: u32,
    pub layer: u32,
    pub state: u32,
    pub num_blocks: u64,
    /// The recurrent group whose block table the state follows (0 for a single-group planner).
    pub group: u32,
    pub reserved: u32,
}

const _: () = assert!(std::mem::size_of::<StateMeta>() == 64);
