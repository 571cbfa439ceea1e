//! The core's record table: every packed record it shares, described from its own `#[repr(C)]`
//! struct (field names, offsets from `offset_of!`, scalar types) -- the kernels' records (plan
//! segments and tiles, state metas, commit rows and commit metas), the compact `MoveRow`, and the
//! transfer plan's rows (`Read`, `StagedCopy`). The Python package builds its numpy dtypes from
//! these descriptions (`_core.kernel_abi()`, `plan_format.py`) and the generated CUDA header
//! declares them as C structs ([`super::header`]), so the Rust struct is the one owner of each layout.

use crate::commit::{CommitMeta, CommitRow};
use crate::plan::segment::{MoveRow, Segment, StateMeta, Tile};
use crate::sglang::kernel::SlotCopy;
use crate::transfer::{Read, StagedCopy};
use crate::vllm::slot_step::TableRef;

/// A field's scalar type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldType {
    U8,
    U16,
    U32,
    U64,
    I64,
}

impl FieldType {
    /// The numpy type string (little-endian).
    pub fn numpy(self) -> &'static str {
        match self {
            FieldType::U8 => "u1",
            FieldType::U16 => "<u2",
            FieldType::U32 => "<u4",
            FieldType::U64 => "<u8",
            FieldType::I64 => "<i8",
        }
    }
    /// The type as the CUDA sources spell it.
    pub fn c_name(self) -> &'static str {
        match self {
            FieldType::U8 => "uint8_t",
            FieldType::U16 => "uint16_t",
            FieldType::U32 => "uint32_t",
            FieldType::U64 => "uint64_t",
            FieldType::I64 => "int64_t",
        }
    }
    pub fn size(self) -> usize {
        match self {
            FieldType::U8 => 1,
            FieldType::U16 => 2,
            FieldType::U32 => 4,
            FieldType::U64 | FieldType::I64 => 8,
        }
    }
}

/// Scalars a record field may have.
pub trait Scalar {
    const TYPE: FieldType;
}
impl Scalar for u8 {
    const TYPE: FieldType = FieldType::U8;
}
impl Scalar for u16 {
    const TYPE: FieldType = FieldType::U16;
}
impl Scalar for u32 {
    const TYPE: FieldType = FieldType::U32;
}
impl Scalar for u64 {
    const TYPE: FieldType = FieldType::U64;
}
impl Scalar for i64 {
    const TYPE: FieldType = FieldType::I64;
}

/// One field of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: &'static str,
    pub offset: usize,
    pub ty: FieldType,
    /// What the field holds (a comment of the generated CUDA header; empty when the name says it).
    pub doc: &'static str,
}

/// One record layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordSpec {
    /// The struct's name (in the CUDA header and for `plan_format.record_dtype`).
    pub name: &'static str,
    /// The Rust file that defines the struct.
    pub source: &'static str,
    /// What one record is.
    pub doc: &'static str,
    pub size: usize,
    pub fields: Vec<Field>,
}

/// Describes a `#[repr(C)]` struct from its fields; the closure `|r| r.field` makes the compiler
/// check each field's declared scalar type.
macro_rules! record {
    ($ty:ty, $cname:literal, $source:literal, $doc:literal, [$($field:ident : $rt:ty $(= $fdoc:literal)?),* $(,)?]) => {
        RecordSpec {
            name: $cname,
            source: $source,
            doc: $doc,
            size: std::mem::size_of::<$ty>(),
            fields: vec![$({
                let _typed = |r: &$ty| -> $rt { r.$field };
                Field {
                    name: stringify!($field),
                    offset: std::mem::offset_of!($ty, $field),
                    ty: <$rt as Scalar>::TYPE,
                    doc: concat!("" $(, $fdoc)?),
                }
            }),*],
        }
    };
}

/// Every record layout the core shares: the kernels' records, the compact `MoveRow` of the Python
/// views, and the transfer plan's rows (`Read`, `StagedCopy`).
pub fn record_specs() -> Vec<RecordSpec> {
    vec![
        record!(Segment, "Segment", "rust/plan/segment.rs",
            "One 2-D strided copy within one state tensor: for r in [0, rows), row_bytes bytes from src + r*pitch to dst + r*pitch.", [
            src: u64 = "byte address of the first source byte",
            dst: u64 = "byte address of the first destination byte",
            row_bytes: u32 = "bytes per row (>= 1)",
            rows: u32 = "number of rows (>= 1)",
            pitch: u32 = "bytes between consecutive rows (src and dst); irrelevant when rows == 1",
            wave: u16 = "ordering wave",
            mode: u8 = "RS_MODE_*",
            elem_bytes: u8 = "element size of the state (1, 2, 4 or 8)",
        ]),
        record!(Tile, "Tile", "rust/plan/segment.rs",
            "A unit of work for one CTA: bytes of every row when rows == 1 or mode == RS_MODE_ROWS_ASCENDING, rows otherwise.", [
            segment: u32 = "index into the segment array",
            begin: u32 = "first unit",
            count: u32 = "number of units",
            reserved: u32 = "0",
        ]),
        record!(MoveRow, "MoveRow", "rust/plan/segment.rs",
            "One request's copy in compact form, shared by all layers (no kernel reads it today).", [
            request: u32,
            shift: u32 = "conv columns dropped (accepted tokens - 1)",
            conv_src: i64 = "conv source block, or -1",
            temporal_src: i64 = "temporal source block, or -1",
            dst: i64 = "destination block, or -1",
            conv_wave: u16,
            temporal_wave: u16,
            group: u32 = "the recurrent group whose block ids these are",
        ]),
        record!(StateMeta, "StateMeta", "rust/plan/segment.rs", "One (layer, persistent state) of the fused state-copy kernel.", [
            base: u64 = "address of block 0 of this state tensor",
            block_stride: u64 = "bytes between consecutive blocks",
            state_bytes: u64 = "bytes of one block's state (dense)",
            kind: u32 = "RS_KIND_*",
            elem_bytes: u32 = "element size",
            width: u32 = "conv window columns (conv kinds)",
            dim: u32 = "conv channels (conv kinds)",
            layer: u32 = "informational",
            state: u32 = "informational",
            num_blocks: u64 = "blocks in the tensor",
            group: u32 = "the recurrent group whose block table this state follows",
            reserved: u32,
        ]),
        record!(CommitRow, "CommitRow", "rust/commit/plan.rs", "One request's commit, shared by every layer.", [
            request: u32 = "workspace row of the request",
            count: u32 = "tokens to fold in (with a num_accepted vector: the cap)",
            state_block: i64 = "running-state block (read and written in place); <= 0: padding row",
            boundary_block: i64 = "prefix-cache block of the crossed boundary, or -1",
            boundary_len: u32 = "tokens up to the boundary (1 ..= count), 0 without one",
            reserved: u32,
        ]),
        record!(CommitMeta, "CommitMeta", "rust/commit/meta.rs",
            "One layer of the commit kernel's table: byte addresses and byte strides; every tensor is dense inside a block / workspace row.", [
            rec_base: u64 = "recurrent pool, block 0: [num_blocks, H, V, K]",
            rec_block_stride: u64 = "bytes between blocks",
            corr_base: u64 = "corrections, row 0: [max_requests, H, Q, V] float32",
            corr_row_stride: u64,
            kg_base: u64 = "key+gate records, row 0: [max_requests, H, Q, kg_width]",
            kg_row_stride: u64,
            conv_base: u64 = "conv pool, block 0: [num_blocks, W, D] (SD) or [num_blocks, D, W] (DS)",
            conv_block_stride: u64,
            win_base: u64 = "verified conv windows, row 0: [max_requests, same as a block]",
            win_row_stride: u64,
            heads: u32 = "H",
            head_v: u32 = "V",
            head_k: u32 = "K",
            window: u32 = "Q (tokens per verified window)",
            kg_width: u32 = "K + 1 (GDN) or 2K (KDA)",
            kind: u32 = "RS_RC_GDN / RS_RC_KDA",
            state_dtype: u32 = "RS_DT_*",
            kg_dtype: u32 = "RS_DT_*",
            conv_layout: u32 = "RS_RC_NO_CONV, RS_KIND_CONV_SD, RS_KIND_CONV_DS",
            conv_width: u32 = "W = conv_kernel_size - 1 + Q - 1",
            conv_dim: u32 = "D",
            conv_hist: u16 = "conv_kernel_size - 1",
            conv_elem: u16 = "bytes per conv element (1, 2, 4 or 8)",
        ]),
        record!(SlotCopy, "SlotCopy", "rust/sglang/kernel.rs",
            "One (layer, state tensor) of the slot kernel: a dense pool slot and, for the commit, the verify scratch entry of (row, step).", [
            dst: u64 = "address of slot 0 of this layer in the pool tensor",
            dst_slot_stride: u64 = "bytes between slots",
            src: u64 = "address of scratch row 0, step 0 of this layer (0: no scratch)",
            src_row_stride: u64,
            src_step_stride: u64,
            bytes: u64 = "bytes of one slot (dense)",
            rows: u64 = "rows of a scratch entry",
            cols: u64 = "elements per row of a scratch entry",
            src_pitch: u64 = "bytes between rows of a scratch entry",
            src_col_stride: u64 = "bytes between elements of a row of a scratch entry",
            elem_bytes: u32 = "element size",
            tensor: u32 = "informational",
        ]),
        record!(TableRef, "TableRef", "rust/vllm/slot_step.rs", "One recurrent group's per-slot block table, as rs_state_copy_slots reads it.", [
            addr: u64 = "device address of row 0 (int32 block ids)",
            row_stride: i64 = "elements between rows",
        ]),
        record!(Read, "Read", "rust/transfer/plan.rs",
            "One read of a transfer plan: len bytes of the source rank's tensor to a destination tensor or the staging buffer.", [
            request: u64,
            src_rank: u64,
            src_tensor: u64,
            src_offset: u64 = "bytes from the source tensor's block 0",
            dst_tensor: u64 = "destination tensor, or STAGING (the staging buffer)",
            dst_offset: u64 = "bytes from the destination tensor's block 0 (or the staging buffer's start)",
            len: u64 = "bytes",
        ]),
        record!(StagedCopy, "StagedCopy", "rust/transfer/plan.rs",
            "A local copy that finishes a staged state: a rows x cols matrix of elem-byte items from the staging buffer to a destination tensor.", [
            request: u64,
            src_offset: u64 = "bytes from the staging buffer's start",
            src_row_stride: u64,
            src_col_stride: u64,
            dst_tensor: u64,
            dst_offset: u64 = "bytes from the destination tensor's block 0",
            dst_row_stride: u64,
            dst_col_stride: u64,
            rows: u64,
            cols: u64,
            elem: u64 = "bytes per item",
        ]),
    ]
}

/// The record named `name`.
pub fn record_spec(name: &str) -> Option<RecordSpec> {
    record_specs().into_iter().find(|r| r.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_of_every_record_is_a_field() {
        for spec in record_specs() {
            let mut end = 0;
            for f in &spec.fields {
                assert_eq!(f.offset, end, "{}.{} leaves a gap or overlaps", spec.name, f.name);
                assert_eq!(f.offset % f.ty.size(), 0, "{}.{} misaligned", spec.name, f.name);
                end = f.offset + f.ty.size();
            }
            assert_eq!(end, spec.size, "{} has trailing padding", spec.name);
        }
    }

    #[test]
    fn sizes() {
        let sizes: Vec<(&str, usize)> = record_specs().iter().map(|s| (s.name, s.size)).collect();
        assert_eq!(
            sizes,
            [
                ("Segment", 32),
                ("Tile", 16),
                ("MoveRow", 40),
                ("StateMeta", 64),
                ("CommitRow", 32),
                ("CommitMeta", 128),
                ("SlotCopy", 88),
                ("TableRef", 16),
                ("Read", 56),
                ("StagedCopy", 88)
            ]
        );
    }
}
