//! The record layouts the kernels read (plan segments and tiles, per-request move rows, state
//! metas, commit rows and commit metas), described from the core's own `#[repr(C)]` structs: field
//! names, offsets (`offset_of!`) and types. The Python package builds its numpy dtypes from these
//! descriptions, and a test parses the `struct`s of the CUDA sources and checks them field for
//! field, so the Rust struct is the one owner of each layout.

use crate::commit::{CommitMeta, CommitRow};
use crate::plan::segment::{MoveRow, Segment, StateMeta, Tile};

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
}

/// One record layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordSpec {
    /// The struct's name in the CUDA sources.
    pub name: &'static str,
    pub size: usize,
    pub fields: Vec<Field>,
}

/// Describes a `#[repr(C)]` struct from its fields; the closure `|r| r.field` makes the compiler
/// check each field's declared scalar type.
macro_rules! record {
    ($ty:ty, $cname:literal, [$($field:ident : $rt:ty),* $(,)?]) => {
        RecordSpec {
            name: $cname,
            size: std::mem::size_of::<$ty>(),
            fields: vec![$({
                let _typed = |r: &$ty| -> $rt { r.$field };
                Field { name: stringify!($field), offset: std::mem::offset_of!($ty, $field), ty: <$rt as Scalar>::TYPE }
            }),*],
        }
    };
}

/// Every record layout shared with the kernels (and, for `MoveRow`, with the Python views).
pub fn record_specs() -> Vec<RecordSpec> {
    vec![
        record!(Segment, "Segment", [src: u64, dst: u64, row_bytes: u32, rows: u32, pitch: u32, wave: u16, mode: u8, elem_bytes: u8]),
        record!(Tile, "Tile", [segment: u32, begin: u32, count: u32, reserved: u32]),
        record!(MoveRow, "MoveRow", [request: u32, shift: u32, conv_src: i64, temporal_src: i64, dst: i64, conv_wave: u16, temporal_wave: u16, group: u32]),
        record!(StateMeta, "StateMeta", [
            base: u64, block_stride: u64, state_bytes: u64, kind: u32, elem_bytes: u32, width: u32, dim: u32,
            layer: u32, state: u32, num_blocks: u64, group: u32, reserved: u32,
        ]),
        record!(CommitRow, "CommitRow", [request: u32, count: u32, state_block: i64, boundary_block: i64, boundary_len: u32, reserved: u32]),
        record!(CommitMeta, "CommitMeta", [
            rec_base: u64, rec_block_stride: u64, corr_base: u64, corr_row_stride: u64, kg_base: u64,
            kg_row_stride: u64, conv_base: u64, conv_block_stride: u64, win_base: u64, win_row_stride: u64,
            heads: u32, head_v: u32, head_k: u32, window: u32, kg_width: u32, kind: u32, state_dtype: u32,
            kg_dtype: u32, conv_layout: u32, conv_width: u32, conv_dim: u32, conv_hist: u16, conv_elem: u16,
        ]),
    ]
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
        assert_eq!(sizes, [("Segment", 32), ("Tile", 16), ("MoveRow", 40), ("StateMeta", 64), ("CommitRow", 32), ("CommitMeta", 128)]);
    }
}
