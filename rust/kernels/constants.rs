//! Every constant the CUDA kernels and the core share, defined once here. [`DEFINES`] lists the
//! ones the CUDA sources use, with their `#define RS_*` names; the generated header
//! (`kernels/rs_abi.cuh`, [`super::header`]) defines them for the sources.

use super::records::Mode;

/// Declares the constants the CUDA sources share: each one a `pub const` of the core and, under the
/// name after `=>`, a `#define` of the generated header whose comment is the constant's doc; all of
/// them, in order, are [`DEFINES`].
macro_rules! cuda_defines {
    ($($(#[doc = $doc:literal])+ pub const $name:ident: $ty:ty = $value:expr => $define:literal;)+) => {
        $($(#[doc = $doc])+ pub const $name: $ty = $value;)+

        /// Every constant the CUDA sources use, in the order the generated header defines them.
        pub const DEFINES: [Define; [$($define),+].len()] =
            [$(Define { name: $define, value: $name as u64, doc: concat!($($doc),+).trim_ascii() }),+];
    };
}

cuda_defines! {
    /// Threads per CTA of every launch (the kernels work with any blockDim.x in [1, RS_THREADS]).
    pub const THREADS: u32 = 256 => "RS_THREADS";
    /// rs_state_copy: bytes of one state copy per CTA.
    pub const STATE_CHUNK_BYTES: u64 = 32 * 1024 => "RS_STATE_CHUNK_BYTES";
    /// Segment.mode: no byte of the segment's source is written in the same wave.
    pub const MODE_DISJOINT: u32 = Mode::Disjoint as u32 => "RS_MODE_DISJOINT";
    /// Segment.mode: rows overlap (src = dst + shift*pitch): per-lane row walk.
    pub const MODE_ROWS_ASCENDING: u32 = Mode::RowsAscending as u32 => "RS_MODE_ROWS_ASCENDING";
    /// Segment.mode: overlap inside each row (src = dst + shift*elem): per-row memmove.
    pub const MODE_WITHIN_ROW: u32 = Mode::WithinRow as u32 => "RS_MODE_WITHIN_ROW";
    /// StateMeta.kind: the whole state is copied.
    pub const KIND_TEMPORAL: u32 = 0 => "RS_KIND_TEMPORAL";
    /// StateMeta.kind: conv window [width, dim], dim contiguous.
    pub const KIND_CONV_SD: u32 = 1 => "RS_KIND_CONV_SD";
    /// StateMeta.kind: conv window [dim, width], width contiguous.
    pub const KIND_CONV_DS: u32 = 2 => "RS_KIND_CONV_DS";
    /// num_accepted outside [1, max_accepted]
    pub const ERR_ACCEPTED: u32 = 1 => "RS_ERR_ACCEPTED";
    /// a block-table column outside [0, cols)
    pub const ERR_COLUMN: u32 = 2 => "RS_ERR_COLUMN";
    /// a block id outside [1, num_blocks) (destination) or [0, num_blocks) (source)
    pub const ERR_BLOCK: u32 = 4 => "RS_ERR_BLOCK";
    /// a state cannot take the request (window shorter than the shift, block beyond the tensor)
    pub const ERR_META: u32 = 8 => "RS_ERR_META";
    /// a bad scalar or per-request input (block_size < 1, running < 0, workspace row)
    pub const ERR_ARGS: u32 = 16 => "RS_ERR_ARGS";
    /// rs_state_copy flags: some StateMeta is temporal (validate the temporal source column / block
    /// for the whole request).
    pub const FLAG_HAS_TEMPORAL: u32 = 1 => "RS_FLAG_HAS_TEMPORAL";
    /// rs_state_copy flags: the align decision is taken on the device (the second vector is
    /// `running`; block_size is used).
    pub const FLAG_DECIDE: u32 = 2 => "RS_FLAG_DECIDE";
    /// rs_state_copy flags: vLLM's pre-copy semantics (src_col == dst_col is a no-op whatever the
    /// accepted count).
    pub const FLAG_PRE_COPY: u32 = 4 => "RS_FLAG_PRE_COPY";
    /// CommitMeta.state_dtype / kg_dtype: float32.
    pub const DT_F32: u32 = 0 => "RS_DT_F32";
    /// CommitMeta.state_dtype / kg_dtype: bfloat16.
    pub const DT_BF16: u32 = 1 => "RS_DT_BF16";
    /// CommitMeta.state_dtype / kg_dtype: float16.
    pub const DT_F16: u32 = 2 => "RS_DT_F16";
    /// CommitMeta.kind: scalar gate per (head, token); key+gate record [K + 1], gate at [K].
    pub const RC_GDN: u32 = 0 => "RS_RC_GDN";
    /// CommitMeta.kind: gate per key channel; record [2K], gate in [K, 2K).
    pub const RC_KDA: u32 = 1 => "RS_RC_KDA";
    /// rs_recover_commit: value rows of the state each thread keeps in registers (x 4 key
    /// channels): a CTA of 256 threads covers 64 rows of a 128-channel head.
    pub const RC_ROWS: u32 = 8 => "RS_RC_ROWS";
    /// CommitMeta.conv_layout of a layer without a conv state (else RS_KIND_CONV_SD / _DS).
    pub const RC_NO_CONV: u32 = 0 => "RS_RC_NO_CONV";
}

/// Every error bit of the fused kernels' error word (`RS_ERR_*`) with its name and meaning (the
/// constant's doc).
pub const ERROR_BITS: [(u32, &str, &str); 5] = [
    (ERR_ACCEPTED, "accepted", doc_of("RS_ERR_ACCEPTED")),
    (ERR_COLUMN, "column", doc_of("RS_ERR_COLUMN")),
    (ERR_BLOCK, "block", doc_of("RS_ERR_BLOCK")),
    (ERR_META, "meta", doc_of("RS_ERR_META")),
    (ERR_ARGS, "args", doc_of("RS_ERR_ARGS")),
];

/// The doc of the constant of [`DEFINES`] named `name` (at compile time: an unknown name fails the
/// build).
const fn doc_of(name: &str) -> &'static str {
    let mut i = 0;
    while i < DEFINES.len() {
        let (a, b) = (DEFINES[i].name.as_bytes(), name.as_bytes());
        let mut same = a.len() == b.len();
        let mut k = 0;
        while same && k < a.len() {
            same = a[k] == b[k];
            k += 1;
        }
        if same {
            return DEFINES[i].doc;
        }
        i += 1;
    }
    panic!("no such define")
}

/// Most CTAs per state copy (grid x) of `rs_state_copy`. Measured on an H200 (2026-11-29,
/// Kimi-K3-like 2 MiB fp32 states, 48 layers): 16 CTAs per state reached 81.8% of device-to-device
/// bandwidth at 1 request and 91.5% at 16+, 32 reached 86.0% / 92.7%, 64 reached 88.0% / 94.3%.
pub const MAX_STATE_CHUNKS: u32 = 64;
/// Bytes of a conv window per conv CTA of the commit kernel (host side only).
pub const COMMIT_CONV_CHUNK_BYTES: u64 = 16 * 1024;
/// Largest grid y / z (CUDA's limit); the kernels walk those axes grid-stride.
pub const MAX_GRID_YZ: u32 = 65535;
/// Largest grid x.
pub const MAX_GRID_X: u32 = (1 << 31) - 1;

/// One constant of the CUDA sources: its `#define` name, value and meaning (the generated
/// header's comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Define {
    pub name: &'static str,
    pub value: u64,
    pub doc: &'static str,
}

/// `(name in the CUDA sources, value)` of every constant of [`DEFINES`].
pub const CUDA_DEFINES: [(&str, u64); DEFINES.len()] = name_values(&DEFINES);

const fn name_values<const N: usize>(defines: &[Define; N]) -> [(&'static str, u64); N] {
    let mut out = [("", 0u64); N];
    let mut i = 0;
    while i < N {
        out[i] = (defines[i].name, defines[i].value);
        i += 1;
    }
    out
}

/// Constants of the core that the sources do not define (host side only), by name: launch limits,
/// and `STAGING`, the `dst_tensor` of a transfer plan's read that lands in the staging buffer
/// (`super::records::STAGING`; the rows are the record table's `Read` and `StagedCopy`).
pub const HOST_CONSTANTS: [(&str, u64); 5] = [
    ("MAX_STATE_CHUNKS", MAX_STATE_CHUNKS as u64),
    ("COMMIT_CONV_CHUNK_BYTES", COMMIT_CONV_CHUNK_BYTES),
    ("MAX_GRID_YZ", MAX_GRID_YZ as u64),
    ("MAX_GRID_X", MAX_GRID_X as u64),
    ("STAGING", super::records::STAGING),
];

/// The names of the error bits set in `bits`, in bit order.
pub fn error_names(bits: u32) -> Vec<&'static str> {
    ERROR_BITS.iter().filter(|(b, _, _)| bits & b != 0).map(|(_, n, _)| *n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_bits_distinct() {
        let mut names: Vec<&str> = CUDA_DEFINES.iter().chain(HOST_CONSTANTS.iter()).map(|(n, _)| *n).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), CUDA_DEFINES.len() + HOST_CONSTANTS.len());
        let all = ERROR_BITS.iter().fold(0, |acc, (b, _, _)| {
            assert_eq!(acc & b, 0, "bit {b} used twice");
            acc | b
        });
        assert_eq!(all, 31);
        assert_eq!(error_names(ERR_COLUMN | ERR_ARGS), vec!["column", "args"]);
    }

    #[test]
    fn every_error_bit_is_defined_under_its_name() {
        for (bit, name, meaning) in ERROR_BITS {
            let d = DEFINES.iter().find(|d| d.name == format!("RS_ERR_{}", name.to_uppercase())).expect("defined");
            assert_eq!((d.value, d.doc), (bit as u64, meaning), "{}", d.name);
        }
        assert!(DEFINES.iter().all(|d| !d.doc.is_empty() && d.name.starts_with("RS_")));
    }
}
