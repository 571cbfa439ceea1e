//! RecoverSSM commit planning: which requests fold how many verified tokens into which block
//! ([`plan`]), the geometry a RecoverSSM layout gives the commit ([`recover`]), and the commit
//! kernel's per-layer table ([`meta`]), and a device commit in one pass ([`device`]). The kernel's launch is built in `crate::kernels::commit`.

pub mod device;
pub mod kimi_k3;
pub mod meta;
pub mod plan;
pub mod recover;

pub use device::{plan_device_commit, DeviceCommit, DeviceCounts};
pub use meta::{commit_meta, CommitConfig, CommitMeta, CommitTensors, COMMIT_DTYPE_PAIRS};
pub use plan::{
    check_block_size, check_cache_sizes, check_index, check_state_blocks, check_workspace_rows, plan_commit, AlignInputs, CommitRow, CommitStep,
};
pub use recover::{recover_geometry, GateKind, RecoverGeometry};
