//! The core's record table: every packed record it shares, described from its own `#[repr(C)]`
//! struct (field names, offsets from `offset_of!`, scalar types) -- the kernels' records (plan
//! segments and tiles, state metas, commit rows and commit metas), the compact `MoveRow`, and the
//! transfer plan's rows (`Read`, `StagedCopy`). The Python package builds its numpy dtypes from
//! these descriptions (`_core.kernel_abi()`, `plan_format.py`) and the generated CUDA header
//! declares them as C structs ([`super::header`]), so the Rust struct is the one owner of each layout.

pub mod commit;
pub mod params;
pub mod plan;
pub mod slots;
pub mod transfer;

use crate::error::{Error, Result};
pub use commit::{CommitMeta, CommitRow};
pub use params::{CopyTilesParams, RecoverCommitParams, SlotScatterParams, StateCopyParams, StateCopySlotsParams};
pub use plan::{Mode, MoveRow, Segment, StateMeta, Tile};
pub use slots::{SlotCopy, TableRef};
pub use transfer::{Read, StagedCopy, STAGING};

/// A field's type: an integer, or a device pointer (8 bytes) with the C type the kernels see.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldType {
    U8,
    U16,
    U32,
    I32,
    U64,
    I64,
    /// A device address, declared in C as the given pointer type (`"const StateMeta*"`).
    Ptr(&'static str),
}

impl FieldType {
    /// The numpy type string (little-endian; a pointer is its address, `<u8`).
    pub fn numpy(self) -> &'static str {
        match self {
            FieldType::U8 => "u1",
            FieldType::U16 => "<u2",
            FieldType::U32 => "<u4",
            FieldType::I32 => "<i4",
            FieldType::U64 | FieldType::Ptr(_) => "<u8",
            FieldType::I64 => "<i8",
        }
    }
    /// The type as the CUDA sources spell it.
    pub fn c_name(self) -> &'static str {
        match self {
            FieldType::U8 => "uint8_t",
            FieldType::U16 => "uint16_t",
            FieldType::U32 => "uint32_t",
            FieldType::I32 => "int32_t",
            FieldType::U64 => "uint64_t",
            FieldType::I64 => "int64_t",
            FieldType::Ptr(c) => c,
        }
    }
    pub fn size(self) -> usize {
        match self {
            FieldType::U8 => 1,
            FieldType::U16 => 2,
            FieldType::U32 | FieldType::I32 => 4,
            FieldType::U64 | FieldType::I64 | FieldType::Ptr(_) => 8,
        }
    }
    /// Whether `v` is a value of this type (a pointer: any 64-bit address).
    pub fn holds(self, v: i128) -> bool {
        let (lo, hi): (i128, i128) = match self {
            FieldType::U8 => (0, u8::MAX.into()),
            FieldType::U16 => (0, u16::MAX.into()),
            FieldType::U32 => (0, u32::MAX.into()),
            FieldType::I32 => (i32::MIN.into(), i32::MAX.into()),
            FieldType::U64 | FieldType::Ptr(_) => (0, u64::MAX.into()),
            FieldType::I64 => (i64::MIN.into(), i64::MAX.into()),
        };
        (lo..=hi).contains(&v)
    }
    /// `v` (a value this type [`holds`](Self::holds)) as little-endian bytes, [`size`](Self::size) of them.
    fn encode(self, v: i128, out: &mut [u8]) {
        out.copy_from_slice(&v.to_le_bytes()[..self.size()]);
    }
    /// The value of little-endian `bytes` ([`size`](Self::size) of them).
    fn decode(self, bytes: &[u8]) -> i128 {
        let mut w = [0u8; 16];
        w[..bytes.len()].copy_from_slice(bytes);
        let unsigned = i128::from_le_bytes(w);
        match self {
            FieldType::I32 => i32::from_le_bytes(bytes.try_into().expect("4 bytes")).into(),
            FieldType::I64 => i64::from_le_bytes(bytes.try_into().expect("8 bytes")).into(),
            _ => unsigned,
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
impl Scalar for i32 {
    const TYPE: FieldType = FieldType::I32;
}
impl Scalar for u64 {
    const TYPE: FieldType = FieldType::U64;
}
impl Scalar for i64 {
    const TYPE: FieldType = FieldType::I64;
}

/// A type a device pointer may point to, with the C spellings of its pointer types (every record
/// of [`record!`] is one; so are the integer element types).
pub trait Pointee {
    /// `const T*`.
    const CONST_PTR: &'static str;
    /// `T*`.
    const MUT_PTR: &'static str;
}
impl Pointee for i32 {
    const CONST_PTR: &'static str = "const int32_t*";
    const MUT_PTR: &'static str = "int32_t*";
}
impl Pointee for i64 {
    const CONST_PTR: &'static str = "const int64_t*";
    const MUT_PTR: &'static str = "int64_t*";
}

macro_rules! device_pointer {
    ($(#[doc = $doc:literal])* $name:ident, $c:ident) => {
        $(#[doc = $doc])*
        #[repr(transparent)]
        pub struct $name<T>(pub u64, std::marker::PhantomData<fn() -> T>);

        impl<T> $name<T> {
            /// The pointer to device address `addr` (0: null).
            pub const fn at(addr: u64) -> Self {
                $name(addr, std::marker::PhantomData)
            }
            /// The address.
            pub const fn addr(self) -> u64 {
                self.0
            }
            pub fn to_le_bytes(self) -> [u8; 8] {
                self.0.to_le_bytes()
            }
        }
        impl<T> Clone for $name<T> {
            fn clone(&self) -> Self {
                *self
            }
        }
        impl<T> Copy for $name<T> {}
        impl<T> Default for $name<T> {
            fn default() -> Self {
                Self::at(0)
            }
        }
        impl<T> PartialEq for $name<T> {
            fn eq(&self, other: &Self) -> bool {
                self.0 == other.0
            }
        }
        impl<T> Eq for $name<T> {}
        impl<T> std::fmt::Debug for $name<T> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{:#x}", self.0)
            }
        }
        impl<T: Pointee> Scalar for $name<T> {
            const TYPE: FieldType = FieldType::Ptr(T::$c);
        }
    };
}

device_pointer! {
    /// A device address the kernel reads through (`const T*` in C); 8 bytes.
    Ptr, CONST_PTR
}
device_pointer! {
    /// A device address the kernel writes through (`T*` in C); 8 bytes.
    MutPtr, MUT_PTR
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

impl RecordSpec {
    /// The bytes of a record whose fields are given by name (each field exactly once, its value in
    /// its type's range): for tools and tests that fill a record of their own.
    pub fn encode(&self, values: &[(&str, i128)]) -> Result<Vec<u8>> {
        if let Some((name, _)) = values.iter().find(|(n, _)| !self.fields.iter().any(|f| f.name == *n)) {
            let names: Vec<&str> = self.fields.iter().map(|f| f.name).collect();
            return Err(Error::plan(format!("{} has no field {name:?}; its fields: {}", self.name, names.join(", "))));
        }
        let mut out = vec![0u8; self.size];
        for f in &self.fields {
            let mut given = values.iter().filter(|(n, _)| *n == f.name);
            let (Some(&(_, v)), None) = (given.next(), given.next()) else {
                return Err(Error::plan(format!("{}.{}: give every field exactly once", self.name, f.name)));
            };
            if !f.ty.holds(v) {
                return Err(Error::plan(format!("{}.{} = {v} does not fit {}", self.name, f.name, f.ty.c_name())));
            }
            f.ty.encode(v, &mut out[f.offset..f.offset + f.ty.size()]);
        }
        Ok(out)
    }

    /// `(field, value)` of every field of the record in `bytes` (at least [`RecordSpec::size`]
    /// bytes), in declaration order.
    pub fn decode(&self, bytes: &[u8]) -> Vec<(&'static str, i128)> {
        self.fields.iter().map(|f| (f.name, f.ty.decode(&bytes[f.offset..f.offset + f.ty.size()]))).collect()
    }
}

/// A record of the table: a `#[repr(C)]` struct declared through [`record!`], which describes it.
pub trait Record {
    /// The record's layout, from its own declaration.
    fn spec() -> RecordSpec;
    /// The record's bytes as the kernels read them.
    fn bytes(&self) -> Vec<u8>;
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

        impl $crate::kernels::records::Pointee for $name {
            const CONST_PTR: &'static str = concat!("const ", stringify!($name), "*");
            const MUT_PTR: &'static str = concat!(stringify!($name), "*");
        }

        impl $crate::kernels::records::Record for $name {
            fn bytes(&self) -> Vec<u8> {
                self.to_le_bytes()
            }
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
/// `MoveRow` of the Python views, the transfer plan's rows (`Read`, `StagedCopy`), and each kernel's
/// parameter record ([`params`]), after the records its pointers name.
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
        CopyTilesParams::spec(),
        StateCopyParams::spec(),
        RecoverCommitParams::spec(),
        SlotScatterParams::spec(),
        StateCopySlotsParams::spec(),
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
                ("StagedCopy", 88),
                ("CopyTilesParams", 24),
                ("StateCopyParams", 104),
                ("RecoverCommitParams", 64),
                ("SlotScatterParams", 88),
                ("StateCopySlotsParams", 200)
            ]
        );
    }
}
