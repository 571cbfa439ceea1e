//! Moving persistent states beyond one block pool: between the tensor-parallel ranks of two
//! instances (disaggregated prefill / decode) and to host memory and back.
//!
//! - [`fingerprint`]: what one rank's pool holds (family, model dims, dtypes, conv geometry, TP
//!   size and rank), built from a family layout and exchanged at handshake;
//! - [`compat`]: which source / destination pairs can exchange states;
//! - [`plan`]: the reads that rebuild, in the destination's blocks, exactly the destination rank's
//!   shard of every persistent state.

pub mod compat;
pub mod fingerprint;
pub mod plan;

pub use compat::check_compatible;
pub use fingerprint::{Fingerprint, FingerprintState, Segment, StateKind};
pub use plan::{plan_transfer, PoolGeometry, Read, StagedCopy, TransferPlan, STAGING};
