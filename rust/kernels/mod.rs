//! The CUDA kernels as the core sees them, the bottom layer of the core: each kernel's calling
//! convention ([`abi`]: one parameter record per entry point), every record layout the kernels and
//! the host share, the parameter records included ([`records`]), the constants they share
//! ([`constants`]), the checks of device arguments ([`args`]), and the launch builders that fill a
//! parameter record by field name from described arguments ([`copy`], [`commit`]). The modules
//! above (plan, commit, vllm, sglang, transfer) build these records; nothing here names them
//! ([`layering`] checks it). The CUDA sources ship in the Python package
//! (`recoverssm_rs/kernels/*.cu`) and include the header [`header`] generates from this module
//! (`kernels/rs_abi.cuh`): records, constants and entry prototypes.

pub mod abi;
pub mod args;
pub mod commit;
pub mod constants;
pub mod copy;
pub mod header;
pub mod layering;
pub mod records;

pub use abi::{KernelParams, KernelSpec, Launch, KERNELS, KERNEL_FILES};
pub use commit::{commit_grid, CommitLaunch};
pub use copy::{check_step, copy_tiles_launch, state_chunks, state_copy_grid, FusedCopy, StepInputs};
