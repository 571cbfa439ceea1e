//! SGLang's mamba pool (`crate::sglang`): the slot ids and the family layout, for
//! `recoverssm_rs.sglang`, and the checks of the tensors its calls are handed that need Python (a
//! storage that still holds a tensor's bytes); the pool's tensors and its writes:
//! `sglang_pool.rs`; HiCache's host copies: `sglang_host_copy.rs`.

use super::conversion::{kwargs, storage_shortfall, Arg, DtypeName, Ints, Tensor};
use super::layout::Layout;
use super::params::with_params;
use crate::dtype::DType;
use crate::error::{Error, ErrorKind};
use crate::sglang;
use crate::tensor::{Device, TensorDesc};
use pyo3::intern;
use pyo3::prelude::*;

/// Refuses `obj` (the object `what` of a call, described at `at`) when its storage does not hold
/// the `bytes` bytes from `at` that the core or a kernel reads or writes there: a storage freed
/// (`untyped_storage().resize_(0)`) or shrunk, or a tensor re-pointed at other memory, since the
/// tensor was made or checked (an error of `kind` naming `what`; nothing has been written).
pub(crate) fn check_held(obj: &Bound<'_, PyAny>, what: &str, at: u64, bytes: u64, kind: ErrorKind) -> PyResult<()> {
    if bytes == 0 {
        return Ok(());
    }
    match storage_shortfall(obj, at as i128, at as i128 + bytes as i128, "written")? {
        Some(why) => Err(Error { kind, message: format!("{what}: {why}") }.into()),
        None => Ok(()),
    }
}

/// What `upload` returned for `op` (`bytes` bytes), checked: on the pool's `device`, contiguous
/// uint8 of that size ([`sglang::checks::check_uploaded`]), apart from the pool's tensors `pool`
/// ([`sglang::checks::check_apart`]), held by its storage (checked as it is described).
pub(crate) fn uploaded(op: &str, buffer: &Bound<'_, PyAny>, device: &Device, bytes: u64, pool: &[(&str, &TensorDesc)]) -> PyResult<TensorDesc> {
    let what = format!("{op}: upload returned");
    let d = Tensor::arg(buffer, &what, ErrorKind::Plan)?.0;
    sglang::checks::check_uploaded(op, &d, device, bytes)?;
    sglang::checks::check_apart(&what, &d, bytes, pool)?;
    Ok(d)
}

/// The index vector `ids`, the argument `arg` of operation `op`, as host int64 values: an int32 or
/// int64 array, tensor or list of ints (a float, bool or other array is refused, never cast, naming
/// `op` and `arg`); a device tensor is copied to the host as it is (never cast; one whose values
/// cannot be read there, as a `meta` tensor's, is a `PlanError` naming `op`, `arg` and the device).
pub(crate) fn host_ints(ids: &Bound<'_, PyAny>, op: &str, arg: &str) -> PyResult<Vec<i64>> {
    let py = ids.py();
    let device = ids.getattr(intern!(py, "device")).and_then(|d| d.getattr(intern!(py, "type")));
    let device = device.ok().filter(|t| !t.eq("cpu").unwrap_or(true));
    let host = match device {
        Some(device) if ids.hasattr(intern!(py, "detach")).unwrap_or(false) => ids
            .call_method0(intern!(py, "detach"))
            .and_then(|t| t.call_method1(intern!(py, "to"), ("cpu",)))
            .map_err(|e| Error::plan(format!("{op}: {arg}: a tensor on {device} whose values cannot be read to the host ({})", e.value(py))))?,
        _ => ids.clone(),
    };
    Ok(Ints::arg(&host, &format!("{op}: {arg}"), ErrorKind::Plan)?.0)
}

/// The index vector `ids`, the argument `arg` of operation `op`, as host int64 values
/// ([`host_ints`]). With `num_slots`, every id is checked as a slot of the pool other than the
/// dummy slot 0 (negative ids refused), and with `unique` no slot twice.
#[pyfunction]
#[pyo3(signature = (op: "str", arg: "str", ids: "_IntArray", num_slots: "int | None" = None, unique: "bool | None" = None) -> "list[int]")]
pub(crate) fn sglang_ids(
    op: &Bound<'_, PyAny>,
    arg: &Bound<'_, PyAny>,
    ids: &Bound<'_, PyAny>,
    num_slots: Option<&Bound<'_, PyAny>>,
    unique: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<i64>> {
    let kind = ErrorKind::Plan;
    let (op, arg) = (String::arg(op, "sglang_ids: op", kind)?, String::arg(arg, "sglang_ids: arg", kind)?);
    let num_slots = num_slots.map(|n| Option::<u64>::arg(n, "sglang_ids: num_slots", kind)).transpose()?.flatten();
    let unique = unique.map(|u| Option::<bool>::arg(u, "sglang_ids: unique", kind)).transpose()?.flatten().unwrap_or(false);
    let v = host_ints(ids, &op, &arg)?;
    if let Some(n) = num_slots {
        let repeats = if unique { sglang::Repeats::Refused } else { sglang::Repeats::Allowed };
        sglang::check_slots(&op, &arg, &v, n, repeats)?;
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
