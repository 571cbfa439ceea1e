//! The CUDA kernels as the core sees them: each kernel's calling convention ([`abi`]), the record
//! layouts it reads ([`records`]), the constants it shares with the core ([`constants`]), the checks
//! of its device arguments ([`args`]), and the launch builders that turn described arguments into a
//! grid, a block and a packed argument buffer ([`copy`], [`commit`]). The CUDA sources themselves
//! ship in the Python package (`recoverssm_rs/kernels/*.cu`) and include the header [`header`]
//! generates from this module (`kernels/rs_abi.cuh`): records, constants and entry prototypes.

pub mod abi;
pub mod args;
pub mod commit;
pub mod constants;
pub mod copy;
pub mod header;
pub mod layering;
pub mod records;

pub use abi::{Arg, KernelSpec, Launch, ParamType, KERNELS, KERNEL_FILES};
pub use commit::{commit_grid, CommitLaunch};
pub use copy::{check_step, copy_tiles_launch, state_chunks, state_copy_grid, FusedCopy, StepInputs};
