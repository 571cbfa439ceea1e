//! The core's record table: every packed record it shares, described from its own `#[repr(C)]`
//! struct (field names, offsets from `offset_of!`, scalar types) -- the kernels' records (plan
//! segments and tiles, state metas, commit rows and commit metas), the compact `MoveRow`, and the
//! transfer plan's rows (`Read`, `StagedCopy`). The Python package builds its numpy dtypes from
//! these descriptions (`_core.kernel_abi()`, `plan_format.py`) and the generated CUDA header
//! declares them as C structs ([`super::header`]), so the Rust struct is the one owner of each layout.

pub mod commit;
pub mod plan;
pub mod slots;
pub mod transfer;

pub use commit::{CommitMeta, CommitRow};
pub use plan::{Mode, MoveRow, Segment, StateMeta, Tile};
pub use slots::{SlotCopy, TableRef};
pub use transfer::{Read, StagedCopy, STAGING};

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

/// A record of the table: a `#[repr(C)]` struct declared through [`record!`], which describes it.
pub trait Record {
    /// The record's layout, from its own declaration.
    fn spec() -> RecordSpec;
}

/// Declares a packed record shared with the CUDA sources: the struct itself (`#[repr(C)]` added),
/// and its [`Record`] description from the same tokens -- the name, the struct's doc as the
/// record's doc, each field's name, `offset_of!`, scalar type and doc, and the file that declares
/// it. The field list is written once, in the struct, where its owner defines it; the compiler
/// refuses a record with padding. The table's `sizes` test pins each record's size.
macro_rules! record {
    (
        $(#[doc = $doc:literal])*
        #[derive($($derive:ident),* $(,)?)]
        pub struct $name:ident {
            $($(#[doc = $fdoc:literal])* pub $field:ident : $ty:ty),* $(,)?
        }
    ) => {
        $(#[doc = $doc])*
        #[repr(C)]
        #[derive($($derive),*)]
        pub struct $name {
            $($(#[doc = $fdoc])* pub $field: $ty),*
        }

        // Every byte is a field: no padding, so the C struct of the same fields has this layout.
        const _: () = assert!(std::mem::size_of::<$name>() == 0 $(+ std::mem::size_of::<$ty>())*);

        impl $name {
            /// The record's bytes as the kernels read them (each field little-endian at its offset).
            #[allow(dead_code)]
            pub fn to_le_bytes(&self) -> Vec<u8> {
                let mut out = vec![0u8; std::mem::size_of::<$name>()];
                $(
                    let b = self.$field.to_le_bytes();
                    let at = std::mem::offset_of!($name, $field);
                    out[at..at + b.len()].copy_from_slice(&b);
                )*
                out
            }
        }

        impl $crate::kernels::records::Record for $name {
            fn spec() -> $crate::kernels::records::RecordSpec {
                use $crate::kernels::records::{Field, RecordSpec, Scalar};
                RecordSpec {
                    name: stringify!($name),
                    source: file!(),
                    doc: concat!($($doc),*).trim(),
                    size: std::mem::size_of::<$name>(),
                    fields: vec![$(Field {
                        name: stringify!($field),
                        offset: std::mem::offset_of!($name, $field),
                        ty: <$ty as Scalar>::TYPE,
                        doc: concat!("" $(, $fdoc)*).trim(),
                    }),*],
                }
            }
        }
    };
}
pub(crate) use record;

/// Every record layout the core shares, one line a record: the kernels' records, the compact
/// `MoveRow` of the Python views, and the transfer plan's rows (`Read`, `StagedCopy`).
pub fn record_specs() -> Vec<RecordSpec> {
    vec![
        Segment::spec(),
        Tile::spec(),
        MoveRow::spec(),
        StateMeta::spec(),
        CommitRow::spec(),
        CommitMeta::spec(),
        SlotCopy::spec(),
        TableRef::spec(),
        Read::spec(),
        StagedCopy::spec(),
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
