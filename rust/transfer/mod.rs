//! Moving persistent states beyond one block pool: between the tensor-parallel ranks of two
//! instances (disaggregated prefill / decode) and to host memory and back.
//!
//! - [`fingerprint`]: what one rank's pool holds (family, model dims, dtypes, conv geometry, TP
//!   size and rank), built from a family layout and exchanged at handshake;
//! - [`handshake`]: one rank's handshake message (agent, fingerprint, geometry, addresses),
//!   decoded and checked before anything is registered or read;
//! - [`cache`]: the host tier's rules (bytes per request, capacity, LRU eviction, spill);
//! - [`compat`]: which source / destination pairs can exchange states;
//! - [`endpoint`]: a transport endpoint's arguments (agent name, backends, interfaces, timeout);
//! - [`files`]: how the disk tier writes and reads files (exclusive temporaries, atomic
//!   renames, the directories it accepts);
//! - [`saved`]: the file format of states saved to disk (safetensors framing, fingerprint, block
//!   map, per-request checksums) and its checks;
//! - [`plan`]: the reads that rebuild, in the destination's blocks, exactly the destination rank's
//!   shard of every persistent state.

pub mod cache;
pub mod compat;
pub mod endpoint;
pub mod files;
pub mod fingerprint;
pub mod handshake;
pub mod plan;
pub mod saved;

pub use compat::{check_compatible, check_sources};
pub use fingerprint::{Fingerprint, FingerprintState, Segment, StateKind, MAX_BYTES};
pub use handshake::PeerInfo;
pub use plan::{plan_transfer, PoolGeometry, Read, StagedCopy, TransferPlan, STAGING};

/// A small GDN rank's fingerprint for the transfer tests: `tp_size` ranks, `num_spec` draft tokens,
/// the conv window in `conv_layout`, rank `tp_rank`, 16 tokens a block.
#[cfg(test)]
pub(crate) fn test_gdn(tp_size: u64, tp_rank: u64, num_spec: u32, conv_layout: crate::layout::ConvLayout) -> Fingerprint {
    use crate::dtype::DType;
    use crate::families::{self, Common};
    let p = families::Gdn { num_k_heads: 4, num_v_heads: 8, head_k_dim: 4, head_v_dim: 2, conv_kernel_size: 4, recover_ssm: false };
    let c = Common { tp_size, num_spec, conv_layout, dtype: DType::BFloat16, ssm_dtype: DType::Float32 };
    Fingerprint::new(&families::gdn(&p, &c).unwrap(), tp_rank, 16).unwrap()
}
