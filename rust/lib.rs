//! recoverssm_rs: the state-layout contract, copy plans and RecoverSSM commit plans for the
//! recurrent layers of hybrid SSM / linear-attention models.
//!
//! The core is plain Rust: `cargo test` and `cargo bench` need no Python. The `python` feature adds
//! the PyO3 bindings (a thin layer in `rust/python/`) that maturin builds into `recoverssm_rs._core`.

#[macro_use]
mod named;

pub mod binding;
pub mod checkpoint;
pub mod commit;
pub mod copy_funcs;
pub mod dtype;
pub mod error;
pub mod executor;
pub mod families;
pub mod kernels;
pub mod layout;
pub mod memory;
pub mod plan;
pub mod sglang;
pub mod sharding;
pub mod tensor;
pub mod transfer;
pub mod vllm;

#[cfg(feature = "python")]
mod python;

pub use binding::{Binding, StateTensor};
pub use commit::{commit_meta, CommitConfig, CommitMeta, CommitTensors};
pub use copy_funcs::{validate_copy_funcs, CopyFuncKind, CopyPrefix, GroupSpec};
pub use dtype::DType;
pub use error::{Error, ErrorKind, Result};
pub use kernels::{KernelSpec, Launch, KERNELS};
pub use layout::{ConvGeometry, ConvLayout, CopyKind, Layout, Role, StateSpec};
pub use plan::segment::{Mode, MoveRow, Segment, StateMeta, Tile};
pub use plan::{AlignStep, CopyPlan, GroupTable, Planner, Semantics, Step};
pub use tensor::{Device, TensorDesc};
