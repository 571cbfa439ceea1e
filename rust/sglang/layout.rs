//! The family layout of one tensor-parallel rank of an SGLang mamba pool, from SGLang's cache
//! parameters (`Mamba2CacheParams` / `KimiLinearCacheParams`, the full model's): Kimi-Linear
//! (`num_k_heads` given) is KDA with `SD` conv slots (SGLang's `(K-1, channels)`); a pool with
//! three conv shard groups (Qwen3-Next's GDN: q, k, v) is GDN and any other Mamba2, both `DS`.
//! No speculative columns: SGLang keeps its verify windows apart from the conv state.
//!
//! [`pool_groups`]: how a pool's layer-stacked tensors form the planner's groups.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::families::{self, Common, Gdn, Kda, Mamba2, MambaBackend};
use crate::layout::{ConvLayout, CopyKind, Layout, StateSpec};
use crate::tensor::TensorDesc;

/// SGLang's cache shape (`cache_params.shape`), each field as SGLang names it (`None`: the
/// shape has no such field).
#[derive(Clone, Debug, Default)]
pub struct CacheShape {
    pub num_heads: u64,
    pub head_dim: u64,
    pub conv_kernel: u64,
    pub state_size: Option<u64>,
    pub intermediate_size: Option<u64>,
    pub conv_dim: Option<u64>,
    pub num_k_heads: Option<u64>,
    pub head_k_dim: Option<u64>,
    pub conv_shard_groups: Option<Vec<i64>>,
}

fn field(v: Option<u64>, name: &str, family: &str) -> Result<u64> {
    v.ok_or_else(|| Error::layout(format!("sglang {family} cache shape: {name} is missing")))
}

/// The layout of one rank of `tp_size` for `shape`, conv windows in `dtype` and temporal states in
/// `ssm_dtype` (SGLang's `cache_params.dtype.conv` / `.temporal`).
pub fn family_layout(shape: &CacheShape, tp_size: u64, dtype: DType, ssm_dtype: DType) -> Result<Layout> {
    let common = |conv_layout| Common { tp_size, num_spec: 0, conv_layout, dtype, ssm_dtype };
    let s = shape;
    if let Some(num_k_heads) = s.num_k_heads {
        let k = Kda {
            num_heads: s.num_heads,
            head_dim: s.head_dim,
            num_k_heads,
            head_k_dim: s.head_k_dim.unwrap_or(s.head_dim),
            conv_kernel_size: s.conv_kernel,
            recover_ssm: false,
        };
        return families::kda(&k, &common(ConvLayout::SD));
    }
    if let Some(&[q, _, _]) = s.conv_shard_groups.as_deref() {
        let state_size = field(s.state_size, "state_size", "gdn")?;
        if state_size == 0 {
            return Err(Error::layout("sglang gdn cache shape: state_size is 0; it must be > 0"));
        }
        let q = u64::try_from(q).map_err(|_| Error::layout(format!("sglang gdn cache shape: conv_shard_groups[0] = {q} is negative")))?;
        let g = Gdn {
            num_k_heads: q / state_size,
            head_k_dim: state_size,
            num_v_heads: s.num_heads,
            head_v_dim: s.head_dim,
            conv_kernel_size: s.conv_kernel,
            recover_ssm: false,
        };
        return families::gdn(&g, &common(ConvLayout::DS));
    }
    let (state_size, inter) = (field(s.state_size, "state_size", "mamba2")?, field(s.intermediate_size, "intermediate_size", "mamba2")?);
    let conv_dim = field(s.conv_dim, "conv_dim", "mamba2")?;
    let groups = conv_dim.checked_sub(inter).zip(state_size.checked_mul(2).filter(|&d| d > 0)).map(|(x, d)| x / d);
    let n_groups = groups.ok_or_else(|| {
        Error::layout(format!(
            "sglang mamba2 cache shape: conv_dim = {conv_dim}, intermediate_size = {inter}, state_size = {state_size} give no \
             n_groups = (conv_dim - intermediate_size) / (2 * state_size)"
        ))
    })?;
    let m = Mamba2 {
        intermediate_size: inter,
        n_groups,
        num_heads: s.num_heads,
        head_dim: s.head_dim,
        state_size,
        conv_kernel: s.conv_kernel,
        logical_window: None,
        mamba_backend: MambaBackend::Triton,
    };
    families::mamba2(&m, &common(ConvLayout::DS))
}

/// The planner's groups over a pool's layer-stacked tensors `[layers, slots + 1, *state_shape]`:
/// one per non-empty conv tensor (`conv{i}`, windows in `conv_layout`), the temporal state riding
/// on the first, or alone when no conv tensor holds anything. Each group: its layout and the
/// indices of its tensors in `[*conv, temporal]`.
pub fn pool_groups(conv: &[&TensorDesc], temporal: &TensorDesc, conv_layout: ConvLayout) -> Result<Vec<(Layout, Vec<usize>)>> {
    let non_empty = |t: &TensorDesc| t.shape.iter().product::<i64>() > 0;
    let spec = |name: &str, t: &TensorDesc, kind| -> Result<StateSpec> {
        let shape: Vec<u64> = t.shape.iter().skip(2).map(|&d| d as u64).collect();
        Ok(StateSpec::persistent(name, &shape, DType::parse(t.dtype_name())?, kind))
    };
    let temporal_spec = || spec("temporal", temporal, CopyKind::Temporal);
    let mut groups = Vec::new();
    for (i, (k, c)) in conv.iter().enumerate().filter(|(_, c)| non_empty(c)).enumerate() {
        let mut states = vec![spec(&format!("conv{i}"), c, CopyKind::Conv(conv_layout))?];
        let mut tensors = vec![k];
        if i == 0 && non_empty(temporal) {
            states.push(temporal_spec()?);
            tensors.push(conv.len());
        }
        groups.push((Layout::new("sglang", states, 0)?, tensors));
    }
    if groups.is_empty() && non_empty(temporal) {
        groups.push((Layout::new("sglang", vec![temporal_spec()?], 0)?, vec![conv.len()]));
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> CacheShape {
        CacheShape { num_heads: 8, head_dim: 16, conv_kernel: 4, state_size: Some(32), ..CacheShape::default() }
    }

    #[test]
    fn the_family_follows_the_shape() {
        let (bf, f32) = (DType::BFloat16, DType::Float32);
        // Mamba2: n_groups = (conv_dim - intermediate_size) / (2 * state_size) = 2.
        let m = CacheShape { intermediate_size: Some(128), conv_dim: Some(256), ..shape() };
        assert_eq!(family_layout(&m, 1, bf, f32).unwrap(), families::mamba2(&mamba2(2), &common(ConvLayout::DS)).unwrap());
        // Three conv shard groups: GDN with num_k_heads = groups[0] / state_size = 4.
        let g = CacheShape { conv_shard_groups: Some(vec![128, 128, 128]), ..shape() };
        let want = Gdn { num_k_heads: 4, num_v_heads: 8, head_k_dim: 32, head_v_dim: 16, conv_kernel_size: 4, recover_ssm: false };
        assert_eq!(family_layout(&g, 1, bf, f32).unwrap(), families::gdn(&want, &common(ConvLayout::DS)).unwrap());
        // num_k_heads: KDA, SD conv slots.
        let k = CacheShape { num_k_heads: Some(8), head_k_dim: Some(16), ..shape() };
        let want = Kda { num_heads: 8, head_dim: 16, num_k_heads: 8, head_k_dim: 16, conv_kernel_size: 4, recover_ssm: false };
        assert_eq!(family_layout(&k, 1, bf, f32).unwrap(), families::kda(&want, &common(ConvLayout::SD)).unwrap());
        // No n_groups from these sizes, or a missing field: named.
        let bad = CacheShape { intermediate_size: Some(300), conv_dim: Some(256), ..shape() };
        assert!(family_layout(&bad, 1, bf, f32).unwrap_err().message.contains("give no n_groups"));
        assert!(family_layout(&shape(), 1, bf, f32).unwrap_err().message.contains("intermediate_size is missing"));
    }

    #[test]
    fn a_pools_tensors_form_its_groups() {
        let t = |at: u64, dtype: &str, shape: &[i64]| TensorDesc::dense(at, dtype, shape, "cpu");
        let (c0, c1, tp) = (t(0x1000, "bfloat16", &[2, 5, 6, 3]), t(0x8000, "bfloat16", &[2, 5, 4, 3]), t(0x10000, "float32", &[2, 5, 4, 8, 8]));
        let empty = t(0, "bfloat16", &[2, 5, 0, 3]);
        // The temporal state rides on the first non-empty conv tensor; an empty one forms nothing.
        let g = pool_groups(&[&empty, &c0, &c1], &tp, ConvLayout::DS).unwrap();
        assert_eq!(g.iter().map(|(_, k)| k.clone()).collect::<Vec<_>>(), vec![vec![1, 3], vec![2]]);
        let names: Vec<&str> = g[0].0.states().iter().map(|s| s.name.as_str()).collect();
        assert_eq!((names, g[0].0.states()[1].shape.clone()), (vec!["conv0", "temporal"], vec![4, 8, 8]));
        assert_eq!(g[1].0.states()[0].copy, Some(CopyKind::Conv(ConvLayout::DS)));
        // No conv tensor holds anything: the temporal state alone.
        let g = pool_groups(&[&empty], &tp, ConvLayout::SD).unwrap();
        assert_eq!((g.len(), g[0].1.clone(), g[0].0.states()[0].name.as_str()), (1, vec![1], "temporal"));
    }

    fn common(conv_layout: ConvLayout) -> Common {
        Common { tp_size: 1, num_spec: 0, conv_layout, dtype: DType::BFloat16, ssm_dtype: DType::Float32 }
    }

    fn mamba2(n_groups: u64) -> Mamba2 {
        Mamba2 {
            intermediate_size: 128,
            n_groups,
            num_heads: 8,
            head_dim: 16,
            state_size: 32,
            conv_kernel: 4,
            logical_window: None,
            mamba_backend: MambaBackend::Triton,
        }
    }
}
