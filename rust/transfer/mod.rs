//! Moving persistent states beyond one block pool: between the tensor-parallel ranks of two
//! instances (disaggregated prefill / decode) and to host memory and back.
//!
//! - [`fingerprint`]: what one rank's pool holds (family, model dims, dtypes, conv geometry, TP
//!   size and rank), built from a family layout and exchanged at handshake;
//! - [`handshake`]: one rank's handshake message (agent, fingerprint, geometry, addresses),
//!   decoded and checked before anything is registered or read;
//! - [`cache`]: the host tier's rules (bytes per request, capacity, LRU eviction, spill);
//! - [`compat`]: which source / destination pairs can exchange states;
//! - [`saved`]: the file format of states saved to disk (safetensors framing, fingerprint, block
//!   map, per-request checksums) and its checks;
//! - [`plan`]: the reads that rebuild, in the destination's blocks, exactly the destination rank's
//!   shard of every persistent state.

pub mod cache;
pub mod compat;
pub mod fingerprint;
pub mod handshake;
pub mod plan;
pub mod saved;

pub use compat::{check_compatible, check_sources};
pub use fingerprint::{Fingerprint, FingerprintState, Segment, StateKind, MAX_BYTES};
pub use handshake::PeerInfo;
pub use plan::{plan_transfer, PoolGeometry, Read, StagedCopy, TransferPlan, STAGING};
