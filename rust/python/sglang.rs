//! SGLang's mamba pool (`crate::sglang`): the host-copy check, the slot ids and the family layout,
//! for `recoverssm_rs.sglang` (the pool's tensors and its writes: `sglang_pool.rs`).

use super::conversion::{items, kwargs, Arg, DtypeName, Ints, Tensor};
use super::layout::Layout;
use super::params::with_params;
use crate::dtype::DType;
use crate::error::{Error, ErrorKind};
use crate::sglang;
use pyo3::prelude::*;

/// The host copies of `mamba_cache_cpu` (SGLang's `(conv_cpu, temporal_cpu)`, or a historical
/// triple whose third element is ignored) in the order of `pool` (every conv tensor, then the
/// temporal state), each checked against its pool tensor for a load into `num_slots` slots: on the
/// host, the pool tensor's dtype, shape `[layers, num_slots, ...]` (`PlanError` naming the state).
#[pyfunction]
#[pyo3(signature = (pool: "Sequence[_Tensor]", mamba_cache_cpu: "Sequence[Sequence[_Tensor] | _Tensor]", num_slots: "int") -> "list[_Tensor]")]
pub(crate) fn sglang_host_copies<'py>(
    pool: &Bound<'py, PyAny>,
    mamba_cache_cpu: &Bound<'py, PyAny>,
    num_slots: u64,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let kind = ErrorKind::Plan;
    let pool = items(pool, "pool", kind, "tensors")?;
    let parts = items(mamba_cache_cpu, "load_cpu_copy: mamba_cache_cpu", kind, "(conv_cpu, temporal_cpu)")?;
    if !(2..=3).contains(&parts.len()) {
        return Err(Error::plan(format!("load_cpu_copy: mamba_cache_cpu has {} parts; expected (conv_cpu, temporal_cpu)", parts.len())).into());
    }
    let conv = items(&parts[0], "load_cpu_copy: mamba_cache_cpu[0] (conv_cpu)", kind, "host tensors")?;
    if conv.len() + 1 != pool.len() {
        return Err(Error::plan(format!("load_cpu_copy: conv_cpu has {} tensors, the pool {}", conv.len(), pool.len() - 1)).into());
    }
    let mut host = conv;
    host.push(parts[1].clone());
    for (k, (dst, src)) in pool.iter().zip(&host).enumerate() {
        let state = if k + 1 == pool.len() { "temporal".to_string() } else { format!("conv[{k}]") };
        let what = format!("load_cpu_copy: {state}");
        let (d, h) = (Tensor::arg(dst, &what, kind)?.0, Tensor::arg(src, &format!("{what} (host copy)"), kind)?.0);
        sglang::check_host_copy(&state, &d, &h, num_slots as usize)?;
    }
    Ok(host)
}

/// The index vector `ids`, the argument `arg` of operation `op`, as host int64 values: an int32 or
/// int64 array, CPU tensor or list of ints (a float, bool or other array is refused, never cast,
/// naming `op` and `arg`). With `num_slots`, every id is checked as a slot of the pool other than
/// the dummy slot 0 (negative ids refused), and with `unique` no slot twice.
#[pyfunction]
#[pyo3(signature = (op: "str", arg: "str", ids: "_IntArray", num_slots: "int | None" = None, unique: "bool" = false) -> "list[int]")]
pub(crate) fn sglang_ids(op: &str, arg: &str, ids: &Bound<'_, PyAny>, num_slots: Option<u64>, unique: bool) -> PyResult<Vec<i64>> {
    let v = Ints::arg(ids, &format!("{op}: {arg}"), ErrorKind::Plan)?.0;
    if let Some(n) = num_slots {
        let repeats = if unique { sglang::Repeats::Refused } else { sglang::Repeats::Allowed };
        sglang::check_slots(op, arg, &v, n, repeats)?;
    }
    Ok(v)
}

kwargs! {
    /// `sglang_layout`'s arguments: the rank count, the dtypes and SGLang's cache shape fields.
    pub(crate) struct LayoutArgs (Layout) {
        tp_size: u64,
        dtype: DtypeName,
        ssm_dtype: DtypeName,
        num_heads: u64,
        head_dim: u64,
        conv_kernel: u64,
        state_size: Option<u64>,
        intermediate_size: Option<u64>,
        conv_dim: Option<u64>,
        num_k_heads: Option<u64>,
        head_k_dim: Option<u64>,
        conv_shard_groups: Option<Ints>,
    }
}

with_params! {
    (LayoutArgs {
        tp_size: "int", dtype: "str | _DType", ssm_dtype: "str | _DType", num_heads: "int", head_dim: "int", conv_kernel: "int",
        state_size: "int | None" = None, intermediate_size: "int | None" = None, conv_dim: "int | None" = None,
        num_k_heads: "int | None" = None, head_k_dim: "int | None" = None, conv_shard_groups: "Sequence[int] | None" = None,
    })
    #[signature((*,) ..a -> "Layout")]
    /// The family layout of one rank of `tp_size` for SGLang's cache parameters: `dtype` and
    /// `ssm_dtype` its `dtype.conv` / `dtype.temporal`, the rest its `shape`'s fields of the same
    /// names (`None` where the shape has none). Kimi-Linear (`num_k_heads`) is KDA, three
    /// `conv_shard_groups` GDN, any other Mamba2.
    #[pyfunction]
    pub(crate) fn sglang_layout() -> PyResult<Layout> {
        let shape = sglang::layout::CacheShape {
            num_heads: a.num_heads,
            head_dim: a.head_dim,
            conv_kernel: a.conv_kernel,
            state_size: a.state_size,
            intermediate_size: a.intermediate_size,
            conv_dim: a.conv_dim,
            num_k_heads: a.num_k_heads,
            head_k_dim: a.head_k_dim,
            conv_shard_groups: a.conv_shard_groups.map(|g| g.0),
        };
        let (dtype, ssm_dtype) = (DType::parse(&a.dtype.0)?, DType::parse(&a.ssm_dtype.0)?);
        Ok(sglang::layout::family_layout(&shape, a.tp_size, dtype, ssm_dtype)?.into())
    }
}
