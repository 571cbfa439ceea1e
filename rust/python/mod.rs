//! The Python bindings: a thin layer over the core. Arguments are converted once
//! ([`conversion`]: integers, integer arrays, block tables, tensors, argument structs),
//! core errors become the package's exception classes (created here, in [`errors`]) through
//! `From<Error> for PyErr`, and heavy work runs with the GIL released.
//!
//! One class per core concept: `Planner` / `CopyPlan` ([`planner`], [`plan`]), the vLLM step
//! ([`vllm`]), the kernels' launches ([`launch`]), RecoverSSM commits ([`commit`]), layouts
//! ([`layout`]), transfers ([`transfer`]) and SGLang's mamba pool ([`sglang`]).

mod buffer;
mod checkpoint;
mod commit;
pub(crate) mod conversion;
mod endpoint;
mod errors;
mod guard;
mod int_arrays;
mod kimi_k3;
mod launch;
mod layout;
mod params;
mod plan;
mod planner;
mod runner;
mod sglang;
mod sglang_host_copy;
mod sglang_pool;
mod slot_step;
mod tensor;
mod transfer;
mod transfer_disk;
mod vllm;

#[pyo3::pymodule]
mod _core {
    #[pymodule_export]
    use super::buffer::RawBuffer;
    #[pymodule_export]
    use super::checkpoint::{check_checkpoint_trace, simulate_checkpoints, CheckpointCache, CheckpointPlan};
    #[pymodule_export]
    use super::commit::{check_cache_sizes_py, check_commit_counts, check_index_py, commit_grid, commit_meta_table, CommitPlanner, PyCommitLaunch};
    #[pymodule_export]
    use super::endpoint::{endpoint_args, pull_args, transfer_plan_arg};
    #[pymodule_export]
    use super::guard::BoundTensors;
    #[pymodule_export]
    use super::kimi_k3::KimiK3CommitPlanner;
    #[pymodule_export]
    use super::launch::{check_device_tables, copy_tiles_launch, kernel_abi, pack_launch, state_chunks, ErrorWord, KernelLaunch, PyFusedCopy};
    #[pymodule_export]
    use super::layout::{
        _validate_copy_funcs, copy_func_kind, gdn_layout, kda_layout, linear_attention_layout, mamba1_layout, mamba2_layout, recover_geometry,
        short_conv_layout, Layout, StateSpec,
    };
    #[pymodule_export]
    use super::plan::CopyPlan;
    #[pymodule_export]
    use super::planner::Planner;
    #[pymodule_export]
    use super::runner::{vllm_mamba_groups, vllm_request_values, vllm_runner_groups};
    #[pymodule_export]
    use super::sglang::{sglang_ids, sglang_layout};
    #[pymodule_export]
    use super::sglang_pool::SglangPool;
    #[pymodule_export]
    use super::slot_step::VllmSlotStep;
    #[pymodule_export]
    use super::transfer::{
        block_list, check_pool, check_sources, guarded_transfer, guarded_write, plan_transfer, restore_sources, saved_request_blocks, source_pools,
        LayoutFingerprint, PeerInfo, TransferPlan,
    };
    #[pymodule_export]
    use super::transfer_disk::{check_saved_states, encode_saved_states, load_args, read_saved_file, write_file, CacheCounters, HostCacheIndex};

    use pyo3::prelude::*;

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        super::errors::register(m)?;
        super::vllm::register(m)?;
        Ok(())
    }
}
