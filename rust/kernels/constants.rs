//! Every constant the CUDA kernels and the core share, defined once here. [`DEFINES`] lists the
//! ones the CUDA sources use, with their `#define RS_*` names; the generated header
//! (`kernels/rs_abi.cuh`, [`super::header`]) defines them for the sources.

use crate::plan::segment::Mode;

/// Threads per CTA of every launch (`RS_THREADS`).
pub const THREADS: u32 = 256;

/// Segment modes of `rs_copy_tiles` (`RS_MODE_*`), the values of [`Mode`].
pub const MODE_DISJOINT: u32 = Mode::Disjoint as u32;
pub const MODE_ROWS_ASCENDING: u32 = Mode::RowsAscending as u32;
pub const MODE_WITHIN_ROW: u32 = Mode::WithinRow as u32;

/// State kinds of a `StateMeta` record (`RS_KIND_*`).
pub const KIND_TEMPORAL: u32 = 0;
pub const KIND_CONV_SD: u32 = 1;
pub const KIND_CONV_DS: u32 = 2;

/// Error bits of the fused kernels' error word (`RS_ERR_*`).
pub const ERR_ACCEPTED: u32 = 1;
pub const ERR_COLUMN: u32 = 2;
pub const ERR_BLOCK: u32 = 4;
pub const ERR_META: u32 = 8;
pub const ERR_ARGS: u32 = 16;

/// Every error bit with its name and meaning.
pub const ERROR_BITS: [(u32, &str, &str); 5] = [
    (ERR_ACCEPTED, "accepted", "num_accepted outside [1, max_accepted]"),
    (ERR_COLUMN, "column", "a block-table column outside [0, cols)"),
    (ERR_BLOCK, "block", "a block id outside [1, num_blocks) (destination) or [0, num_blocks) (source)"),
    (ERR_META, "meta", "a state cannot take the request (window shorter than the shift, block beyond the tensor)"),
    (ERR_ARGS, "args", "a bad scalar or per-request input (block_size < 1, running < 0, workspace row)"),
];

/// `flags` bits of `rs_state_copy` (`RS_FLAG_*`): some state is temporal (validate the temporal
/// source column for the whole request); the copy decision is taken on the device (the second
/// per-request vector is `running`, and `block_size` is used).
pub const FLAG_HAS_TEMPORAL: u32 = 1;
pub const FLAG_DECIDE: u32 = 2;
/// vLLM's pre-copy semantics: `src_col == dst_col` is a no-op whatever the accepted count.
pub const FLAG_PRE_COPY: u32 = 4;

/// Bytes of one state copy per CTA of `rs_state_copy` (`RS_STATE_CHUNK_BYTES`).
pub const STATE_CHUNK_BYTES: u64 = 32 * 1024;
/// Most CTAs per state copy (grid x) of `rs_state_copy`. Measured on an H200 (2026-11-29,
/// Kimi-K3-like 2 MiB fp32 states, 48 layers): 16 CTAs per state reached 81.8% of device-to-device
/// bandwidth at 1 request and 91.5% at 16+, 32 reached 86.0% / 92.7%, 64 reached 88.0% / 94.3%.
pub const MAX_STATE_CHUNKS: u32 = 64;

/// Element-type codes of the commit kernel's table (`RS_DT_*`).
pub const DT_F32: u32 = 0;
pub const DT_BF16: u32 = 1;
pub const DT_F16: u32 = 2;
/// Recurrence kinds of the commit kernel (`RS_RC_GDN` / `RS_RC_KDA`).
pub const RC_GDN: u32 = 0;
pub const RC_KDA: u32 = 1;
/// Value rows of the recurrent state each commit thread keeps in registers, times 4 key channels
/// (`RS_RC_ROWS`): a CTA of 256 threads covers 64 rows of a 128-channel head.
pub const RC_ROWS: u32 = 8;
/// `CommitMeta.conv_layout` of a layer without a conv state (`RS_RC_NO_CONV`); otherwise
/// [`KIND_CONV_SD`] or [`KIND_CONV_DS`].
pub const RC_NO_CONV: u32 = 0;
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

const fn define(name: &'static str, value: u64, doc: &'static str) -> Define {
    Define { name, value, doc }
}

/// Every constant the CUDA sources use, in the order the generated header defines them.
pub const DEFINES: [Define; 23] = [
    define("RS_THREADS", THREADS as u64, "threads per CTA of every launch (the kernels work with any blockDim.x in [1, RS_THREADS])"),
    define("RS_MODE_DISJOINT", MODE_DISJOINT as u64, "Segment.mode: no byte of the segment's source is written in the same wave"),
    define("RS_MODE_ROWS_ASCENDING", MODE_ROWS_ASCENDING as u64, "Segment.mode: rows overlap (src = dst + shift*pitch): per-lane row walk"),
    define("RS_MODE_WITHIN_ROW", MODE_WITHIN_ROW as u64, "Segment.mode: overlap inside each row (src = dst + shift*elem): per-row memmove"),
    define("RS_KIND_TEMPORAL", KIND_TEMPORAL as u64, "StateMeta.kind: the whole state is copied"),
    define("RS_KIND_CONV_SD", KIND_CONV_SD as u64, "StateMeta.kind: conv window [width, dim], dim contiguous"),
    define("RS_KIND_CONV_DS", KIND_CONV_DS as u64, "StateMeta.kind: conv window [dim, width], width contiguous"),
    define("RS_ERR_ACCEPTED", ERR_ACCEPTED as u64, ERROR_BITS[0].2),
    define("RS_ERR_COLUMN", ERR_COLUMN as u64, ERROR_BITS[1].2),
    define("RS_ERR_BLOCK", ERR_BLOCK as u64, ERROR_BITS[2].2),
    define("RS_ERR_META", ERR_META as u64, ERROR_BITS[3].2),
    define("RS_ERR_ARGS", ERR_ARGS as u64, ERROR_BITS[4].2),
    define(
        "RS_FLAG_HAS_TEMPORAL",
        FLAG_HAS_TEMPORAL as u64,
        "rs_state_copy flags: some StateMeta is temporal (validate the temporal source column / block for the whole request)",
    ),
    define(
        "RS_FLAG_DECIDE",
        FLAG_DECIDE as u64,
        "rs_state_copy flags: the align decision is taken on the device (the second vector is `running`; block_size is used)",
    ),
    define(
        "RS_FLAG_PRE_COPY",
        FLAG_PRE_COPY as u64,
        "rs_state_copy flags: vLLM's pre-copy semantics (src_col == dst_col is a no-op whatever the accepted count)",
    ),
    define("RS_STATE_CHUNK_BYTES", STATE_CHUNK_BYTES, "rs_state_copy: bytes of one state copy per CTA"),
    define("RS_DT_F32", DT_F32 as u64, "CommitMeta.state_dtype / kg_dtype: float32"),
    define("RS_DT_BF16", DT_BF16 as u64, "CommitMeta.state_dtype / kg_dtype: bfloat16"),
    define("RS_DT_F16", DT_F16 as u64, "CommitMeta.state_dtype / kg_dtype: float16"),
    define("RS_RC_GDN", RC_GDN as u64, "CommitMeta.kind: scalar gate per (head, token); key+gate record [K + 1], gate at [K]"),
    define("RS_RC_KDA", RC_KDA as u64, "CommitMeta.kind: gate per key channel; record [2K], gate in [K, 2K)"),
    define("RS_RC_ROWS", RC_ROWS as u64, "rs_recover_commit: value rows of the state each thread keeps in registers (x 4 key channels)"),
    define("RS_RC_NO_CONV", RC_NO_CONV as u64, "CommitMeta.conv_layout of a layer without a conv state (else RS_KIND_CONV_SD / _DS)"),
];

/// `(name in the CUDA sources, value)` of every constant of [`DEFINES`].
pub const CUDA_DEFINES: [(&str, u64); 23] = name_values(&DEFINES);

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
/// (`crate::transfer::STAGING`; the rows are the record table's `Read` and `StagedCopy`).
pub const HOST_CONSTANTS: [(&str, u64); 5] = [
    ("MAX_STATE_CHUNKS", MAX_STATE_CHUNKS as u64),
    ("COMMIT_CONV_CHUNK_BYTES", COMMIT_CONV_CHUNK_BYTES),
    ("MAX_GRID_YZ", MAX_GRID_YZ as u64),
    ("MAX_GRID_X", MAX_GRID_X as u64),
    ("STAGING", crate::transfer::STAGING),
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
