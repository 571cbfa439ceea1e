//! recoverssm_rs: the state-layout contract, copy plans and RecoverSSM commit plans for the
//! recurrent layers of hybrid SSM / linear-attention models.
//!
//! The core is plain Rust: `cargo test` and `cargo bench` need no Python. The `python` feature adds
//! the PyO3 bindings (a thin layer in `rust/python/`) that maturin builds into `recoverssm_rs._core`.

pub mod binding;
pub mod commit;
pub mod copy_funcs;
pub mod device_step;
pub mod dtype;
pub mod engine_step;
pub mod error;
pub mod executor;
pub mod families;
pub mod group_plan;
pub mod kernels;
pub mod layout;
pub mod plan;
pub mod sharding;
pub mod transfer;

#[cfg(feature = "python")]
mod python;

pub use binding::{Binding, Device, StateTensor, TensorDesc};
pub use commit::{commit_meta, CommitConfig, CommitMeta, CommitTensors};
pub use copy_funcs::{validate_copy_funcs, CopyFuncKind, CopyPrefix, GroupSpec};
pub use dtype::DType;
pub use error::{Error, ErrorKind, Result};
pub use kernels::{KernelSpec, Launch, KERNELS};
pub use layout::{ConvGeometry, ConvLayout, CopyKind, Layout, Role, StateSpec};
pub use plan::segment::{Mode, MoveRow, Segment, StateMeta, Tile};
pub use plan::{AlignStep, CopyPlan, Planner};
