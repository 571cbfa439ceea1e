//! Layout calculators for the recurrent-state families serving engines run, per tensor-parallel
//! rank, with the shape formulas and the parameter names of vLLM 0.33's state-shape calculators
//! (`MambaStateShapeCalculator`); the shared settings (`tp_size`, `num_spec`, the conv layout and
//! the dtypes) live in [`Common`]. docs/design.md section 4 lists the formulas and the few places
//! where these calculators are stricter than vLLM's.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::{ConvLayout, CopyKind, Layout, StateSpec};
use crate::sharding::{ConvSegment, Sharding, StateShard};

fn seg(name: &'static str, units: u64, unit_dim: u64) -> ConvSegment {
    ConvSegment { name, units, unit_dim }
}

fn sharding(family: &'static str, c: &Common, dims: &[(&'static str, u64)], states: Vec<StateShard>) -> Sharding {
    Sharding { family, tp_size: c.tp_size, model_dims: dims.to_vec(), states }
}

/// Settings shared by every family: the rank split, the speculative window and the storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Common {
    /// Tensor-parallel ranks (vLLM's `tp_world_size`; `tp_size` in its linear-attention calculator).
    pub tp_size: u64,
    pub num_spec: u32,
    pub conv_layout: ConvLayout,
    /// dtype of conv windows (the cache / model dtype).
    pub dtype: DType,
    /// dtype of temporal / recurrent states (`ssm_cache_dtype`).
    pub ssm_dtype: DType,
}

impl Common {
    fn check(&self, family: &str) -> Result<()> {
        if self.tp_size == 0 {
            return Err(Error::layout(format!("{family}: tp_size must be >= 1, got 0")));
        }
        Ok(())
    }
}

/// `value / tp_size`, or an error naming the parameter when it does not divide.
fn divide(family: &str, what: &str, value: u64, tp: u64) -> Result<u64> {
    if value == 0 {
        return Err(Error::layout(format!("{family}: {what} must be > 0")));
    }
    if value % tp != 0 {
        return Err(Error::layout(format!(
            "{family}: {what} = {value} is not divisible by tp_size = {tp}; choose a tp_size that \
             divides it"
        )));
    }
    Ok(value / tp)
}

fn positive(family: &str, what: &str, value: u64) -> Result<u64> {
    if value == 0 {
        return Err(Error::layout(format!("{family}: {what} must be > 0")));
    }
    Ok(value)
}

fn checked(family: &str, what: &str, v: Option<u64>) -> Result<u64> {
    v.ok_or_else(|| Error::layout(format!("{family}: {what} overflows 64 bits")))
}

fn conv_state(c: &Common, width: u64, dim: u64) -> StateSpec {
    let shape = match c.conv_layout {
        ConvLayout::SD => [width, dim],
        ConvLayout::DS => [dim, width],
    };
    StateSpec::persistent("conv", &shape, c.dtype, CopyKind::Conv(c.conv_layout))
}

/// Conv window width `kernel - 1 + num_spec`; `what` is the family's name for the kernel size
/// (vLLM calls it `conv_kernel` for Mamba1, Mamba2 and short conv, `conv_kernel_size` for GDN and
/// KDA).
fn conv_width(family: &str, what: &str, c: &Common, kernel: u64) -> Result<u64> {
    if kernel < 2 {
        return Err(Error::layout(format!("{family}: {what} must be >= 2 (the window keeps {what} - 1 columns), got {kernel}")));
    }
    checked(
        family,
        &format!("the conv window width {what} - 1 + num_spec = {kernel} - 1 + {}", c.num_spec),
        (kernel - 1).checked_add(c.num_spec as u64),
    )
}

/// Mamba1: conv `dim = intermediate_size / tp`, `width = conv_kernel - 1`; temporal
/// `(intermediate_size / tp, state_size)`. Parameter names as vLLM's `mamba1_state_shape`.
pub fn mamba1(intermediate_size: u64, state_size: u64, conv_kernel: u64, c: &Common) -> Result<Layout> {
    const F: &str = "mamba1";
    c.check(F)?;
    if c.num_spec != 0 {
        return Err(Error::layout(format!(
            "{F}: speculative decoding is not supported by Mamba1 state (its conv window keeps no \
             speculative columns); use num_spec = 0, got {}",
            c.num_spec
        )));
    }
    let dim = divide(F, "intermediate_size", intermediate_size, c.tp_size)?;
    let n = positive(F, "state_size", state_size)?;
    let width = conv_width(F, "conv_kernel", c, conv_kernel)?;
    let k = conv_kernel;
    let shards =
        vec![StateShard::Conv { segments: vec![seg("x", intermediate_size, 1)], kernel_size: k }, StateShard::Heads { units: intermediate_size }];
    let dims = [("intermediate_size", intermediate_size), ("state_size", n), ("conv_kernel", k)];
    Layout::new("MAMBA1", vec![conv_state(c, width, dim), StateSpec::persistent("temporal", &[dim, n], c.ssm_dtype, CopyKind::Temporal)], c.num_spec)
        .map(|l| l.with_sharding(sharding(F, c, &dims, shards)))
}

named_enum! {
    /// The Mamba selective-state-update backend (vLLM's `MambaConfig.backend`). It matters to the
    /// layout only through the ReplaySSM ring length: FlashInfer keeps the verify window in the ring.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
    pub enum MambaBackend { #[default] Triton = "triton", FlashInfer = "flashinfer", Cpu = "cpu" }
    parse: any_case, |s| Error::layout(format!("mamba2: unknown mamba_backend '{s}'; expected 'triton', 'flashinfer' or 'cpu'"))
}

/// Mamba2 parameters (the names of vLLM's `mamba2_state_shape` and `append_replayssm_ring`).
#[derive(Clone, Copy, Debug)]
pub struct Mamba2 {
    pub intermediate_size: u64,
    pub n_groups: u64,
    pub num_heads: u64,
    pub head_dim: u64,
    pub state_size: u64,
    pub conv_kernel: u64,
    /// ReplaySSM's logical window; `Some(w)` appends the three never-copied rings as workspace.
    pub logical_window: Option<u64>,
    /// Decides the ring length: `w` (Triton, CPU) or `w + 1 + num_spec` (FlashInfer).
    pub mamba_backend: MambaBackend,
}

/// Mamba2: `g' = n_groups + (tp - n_groups if n_groups % tp else 0)`; conv
/// `dim = (intermediate_size + 2 g' state_size) / tp`, `width = conv_kernel - 1 + num_spec`;
/// temporal `(num_heads / tp, head_dim, state_size)`; ReplaySSM rings (ring length `R`)
/// `(num_heads / tp, R, head_dim)` in the model dtype, `(num_heads / tp, R)` fp32 and
/// `(g' / tp, R, state_size)` in the model dtype.
pub fn mamba2(p: &Mamba2, c: &Common) -> Result<Layout> {
    const F: &str = "mamba2";
    c.check(F)?;
    let tp = c.tp_size;
    let g = positive(F, "n_groups", p.n_groups)?;
    // The groups are sharded (tp_size divides n_groups) or replicated, each group on tp_size /
    // n_groups consecutive ranks (n_groups divides tp_size): the split a transfer re-shards by
    // (`sharding::owned_units`). vLLM's calculator computes a shape for any n_groups, but its
    // Mamba2 layer serves only n_groups % tp_size == 0 or n_groups == 1 (`MambaMixer2`), both
    // accepted here; any other n_groups (3 groups on 4 ranks, 6 on 4 or 8) leaves a group split
    // across ranks, which no engine serves and no transfer could re-shard.
    if g % tp != 0 && tp % g != 0 {
        return Err(Error::layout(format!(
            "{F}: n_groups = {g} cannot be split over tp_size = {tp}: neither divides the other \
             (groups are sharded when tp_size divides n_groups, replicated when n_groups divides \
             tp_size)"
        )));
    }
    let g_eff = if g % tp != 0 { g + (tp - g) } else { g };
    let n = positive(F, "state_size", p.state_size)?;
    let total = checked(
        F,
        "intermediate_size + 2 * n_groups * state_size",
        g_eff.checked_mul(n).and_then(|x| x.checked_mul(2)).and_then(|x| x.checked_add(p.intermediate_size)),
    )?;
    positive(F, "intermediate_size", p.intermediate_size)?;
    let dim = divide(F, "intermediate_size + 2 * n_groups * state_size", total, tp)?;
    let heads = divide(F, "num_heads", p.num_heads, tp)?;
    let hd = positive(F, "head_dim", p.head_dim)?;
    let width = conv_width(F, "conv_kernel", c, p.conv_kernel)?;
    let mut states = vec![conv_state(c, width, dim), StateSpec::persistent("temporal", &[heads, hd, n], c.ssm_dtype, CopyKind::Temporal)];
    if let Some(w) = p.logical_window {
        let w = positive(F, "logical_window", w)?;
        let r = match p.mamba_backend {
            MambaBackend::FlashInfer => checked(F, "the ring length", w.checked_add(1 + c.num_spec as u64))?,
            MambaBackend::Triton | MambaBackend::Cpu => w,
        };
        let groups = divide(F, "n_groups (after replication)", g_eff, tp)?;
        states.push(StateSpec::workspace("replay_x_ring", &[heads, r, hd], c.dtype));
        states.push(StateSpec::workspace("replay_dt_ring", &[heads, r], DType::Float32));
        states.push(StateSpec::workspace("replay_B_ring", &[groups, r, n], c.dtype));
    }
    // Channels [x | B | C]; with fewer groups than ranks each group is replicated on
    // tp / n_groups consecutive ranks.
    let shards = vec![
        StateShard::Conv { segments: vec![seg("x", p.intermediate_size, 1), seg("B", g, n), seg("C", g, n)], kernel_size: p.conv_kernel },
        StateShard::Heads { units: p.num_heads },
    ];
    let dims = [
        ("intermediate_size", p.intermediate_size),
        ("n_groups", g),
        ("num_heads", p.num_heads),
        ("head_dim", hd),
        ("state_size", n),
        ("conv_kernel", p.conv_kernel),
    ];
    Layout::new("MAMBA2", states, c.num_spec).map(|l| l.with_sharding(sharding(F, c, &dims, shards)))
}

/// Short conv: conv `dim = intermediate_size / tp`, `width = conv_kernel - 1 + num_spec`.
/// Parameter names as vLLM's `short_conv_state_shape` (its `intermediate_size` is the conv's
/// channel count, e.g. LFM2's `conv_dim`).
pub fn short_conv(intermediate_size: u64, conv_kernel: u64, c: &Common) -> Result<Layout> {
    const F: &str = "short_conv";
    c.check(F)?;
    let dim = divide(F, "intermediate_size", intermediate_size, c.tp_size)?;
    let width = conv_width(F, "conv_kernel", c, conv_kernel)?;
    let shards = vec![StateShard::Conv { segments: vec![seg("x", intermediate_size, 1)], kernel_size: conv_kernel }];
    let dims = [("intermediate_size", intermediate_size), ("conv_kernel", conv_kernel)];
    Layout::new("SHORT_CONV", vec![conv_state(c, width, dim)], c.num_spec).map(|l| l.with_sharding(sharding(F, c, &dims, shards)))
}

/// Linear attention: temporal `(num_heads / tp, head_dim, head_dim)`. vLLM's
/// `linear_attention_state_shape` floors `num_heads // tp_size`; this calculator requires exact
/// division (a remainder would leave heads on no rank).
pub fn linear_attention(num_heads: u64, head_dim: u64, c: &Common) -> Result<Layout> {
    const F: &str = "linear_attention";
    c.check(F)?;
    let h = divide(F, "num_heads", num_heads, c.tp_size)?;
    let d = positive(F, "head_dim", head_dim)?;
    let dims = [("num_heads", num_heads), ("head_dim", d)];
    Layout::new("LINEAR", vec![StateSpec::persistent("temporal", &[h, d, d], c.ssm_dtype, CopyKind::Temporal)], c.num_spec)
        .map(|l| l.with_sharding(sharding(F, c, &dims, vec![StateShard::Heads { units: num_heads }])))
}

/// The RecoverSSM verify records per request and layer: corrections `[H, Q, V]` fp32 and
/// key + gate `[H, Q, key_gate]` in the model dtype, `Q = num_spec + 1`.
/// `key_gate` is `None` when it overflows 64 bits (an error naming `family`).
fn recover_records(family: &str, c: &Common, heads: u64, v: u64, key_gate: Option<u64>) -> Result<[StateSpec; 2]> {
    let q = c.num_spec as u64 + 1;
    let key_gate = checked(family, "the verify_keygate record's last dimension", key_gate)?;
    Ok([
        StateSpec::workspace("verify_corrections", &[heads, q, v], DType::Float32),
        StateSpec::workspace("verify_keygate", &[heads, q, key_gate], c.dtype),
    ])
}

/// Gated DeltaNet parameters (vLLM names).
#[derive(Clone, Copy, Debug)]
pub struct Gdn {
    pub num_k_heads: u64,
    pub num_v_heads: u64,
    pub head_k_dim: u64,
    pub head_v_dim: u64,
    pub conv_kernel_size: u64,
    /// Append the RecoverSSM verify records as workspace.
    pub recover_ssm: bool,
}

/// GDN: conv `dim = (2 num_k_heads head_k_dim + num_v_heads head_v_dim) / tp`,
/// `width = conv_kernel_size - 1 + num_spec`; temporal `(num_v_heads / tp, head_v_dim, head_k_dim)`
/// (V-major); with RecoverSSM, records `[H, Q, V]` fp32 and `[H, Q, K + 1]`. Unlike vLLM's
/// calculator, `num_k_heads` must also divide by `tp_size` (the key heads are sharded too).
pub fn gdn(p: &Gdn, c: &Common) -> Result<Layout> {
    const F: &str = "gdn";
    c.check(F)?;
    let nk = positive(F, "num_k_heads", p.num_k_heads)?;
    let hk = positive(F, "head_k_dim", p.head_k_dim)?;
    let hv = positive(F, "head_v_dim", p.head_v_dim)?;
    let total =
        checked(F, "conv dim", nk.checked_mul(hk).and_then(|x| x.checked_mul(2)).and_then(|x| x.checked_add(p.num_v_heads.checked_mul(hv)?)))?;
    let dim = divide(F, "2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim", total, c.tp_size)?;
    let _ = divide(F, "num_k_heads", nk, c.tp_size)?;
    let h = divide(F, "num_v_heads", p.num_v_heads, c.tp_size)?;
    let width = conv_width(F, "conv_kernel_size", c, p.conv_kernel_size)?;
    let mut states = vec![conv_state(c, width, dim), StateSpec::persistent("temporal", &[h, hv, hk], c.ssm_dtype, CopyKind::Temporal)];
    if p.recover_ssm {
        states.extend(recover_records(F, c, h, hv, hk.checked_add(1))?);
    }
    // Channels [q | k | v], each sharded by heads.
    let shards = vec![
        StateShard::Conv { segments: vec![seg("q", nk, hk), seg("k", nk, hk), seg("v", p.num_v_heads, hv)], kernel_size: p.conv_kernel_size },
        StateShard::Heads { units: p.num_v_heads },
    ];
    let dims =
        [("num_k_heads", nk), ("num_v_heads", p.num_v_heads), ("head_k_dim", hk), ("head_v_dim", hv), ("conv_kernel_size", p.conv_kernel_size)];
    Layout::new("GDN_ATTN", states, c.num_spec).map(|l| l.with_sharding(sharding(F, c, &dims, shards)))
}

/// Kimi Delta Attention parameters (vLLM names).
#[derive(Clone, Copy, Debug)]
pub struct Kda {
    pub num_heads: u64,
    pub head_dim: u64,
    pub num_k_heads: u64,
    pub head_k_dim: u64,
    pub conv_kernel_size: u64,
    pub recover_ssm: bool,
}

/// KDA: conv `dim = (num_heads head_dim + 2 num_k_heads head_k_dim) / tp`,
/// `width = conv_kernel_size - 1 + num_spec`; recurrent `(num_heads / tp, head_dim, head_dim)`;
/// with RecoverSSM, records `[H, Q, V]` fp32 and `[H, Q, 2K]`. KDA is served by the GDN_ATTN
/// backend.
pub fn kda(p: &Kda, c: &Common) -> Result<Layout> {
    const F: &str = "kda";
    c.check(F)?;
    let nh = positive(F, "num_heads", p.num_heads)?;
    let hd = positive(F, "head_dim", p.head_dim)?;
    let nkh = positive(F, "num_k_heads", p.num_k_heads)?;
    let hkd = positive(F, "head_k_dim", p.head_k_dim)?;
    let total = checked(F, "conv dim", nh.checked_mul(hd).and_then(|x| x.checked_add(nkh.checked_mul(hkd)?.checked_mul(2)?)))?;
    let dim = divide(F, "num_heads * head_dim + 2 * num_k_heads * head_k_dim", total, c.tp_size)?;
    let h = divide(F, "num_heads", nh, c.tp_size)?;
    // The q and k channels are sharded by key heads, as GDN's: each rank holds num_k_heads /
    // tp_size of them (the conv dim above counts no replicated heads), the split a transfer
    // re-shards by. vLLM's calculator only needs the whole conv dim to divide, but its KDA layers
    // pass no num_k_heads (it is num_heads, which they require tp_size to divide), so this refuses
    // nothing vLLM serves.
    divide(F, "num_k_heads", nkh, c.tp_size)?;
    let width = conv_width(F, "conv_kernel_size", c, p.conv_kernel_size)?;
    let mut states = vec![conv_state(c, width, dim), StateSpec::persistent("recurrent", &[h, hd, hd], c.ssm_dtype, CopyKind::Temporal)];
    if p.recover_ssm {
        states.extend(recover_records(F, c, h, hd, hd.checked_mul(2))?);
    }
    // Channels [q | k | v] (q and k: num_k_heads x head_k_dim; v: num_heads x head_dim), each
    // sharded by heads.
    let shards = vec![
        StateShard::Conv { segments: vec![seg("q", nkh, hkd), seg("k", nkh, hkd), seg("v", nh, hd)], kernel_size: p.conv_kernel_size },
        StateShard::Heads { units: nh },
    ];
    let dims = [("num_heads", nh), ("head_dim", hd), ("num_k_heads", nkh), ("head_k_dim", hkd), ("conv_kernel_size", p.conv_kernel_size)];
    Layout::new("GDN_ATTN", states, c.num_spec).map(|l| l.with_sharding(sharding(F, c, &dims, shards)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn common(tp: u64, num_spec: u32, l: ConvLayout) -> Common {
        Common { tp_size: tp, num_spec, conv_layout: l, dtype: DType::BFloat16, ssm_dtype: DType::Float32 }
    }

    #[test]
    fn gdn_qwen3_next_shapes() {
        let p = Gdn { num_k_heads: 16, num_v_heads: 32, head_k_dim: 128, head_v_dim: 128, conv_kernel_size: 4, recover_ssm: false };
        let l = gdn(&p, &common(2, 3, ConvLayout::SD)).unwrap();
        assert_eq!(l.states()[0].shape, vec![3 + 3, (2 * 16 * 128 + 32 * 128) / 2]);
        assert_eq!(l.states()[1].shape, vec![16, 128, 128]);
        assert_eq!(l.backend(), "GDN_ATTN");
        let l = gdn(&Gdn { recover_ssm: true, ..p }, &common(1, 3, ConvLayout::DS)).unwrap();
        assert_eq!(l.states()[0].shape, vec![8192, 6]);
        assert_eq!(l.states()[2].shape, vec![32, 4, 128]);
        assert_eq!(l.states()[3].shape, vec![32, 4, 129]);
        assert_eq!(l.copyable_prefix_len(), 2);
    }

    #[test]
    fn kda_recover_shapes() {
        let p = Kda { num_heads: 32, head_dim: 128, num_k_heads: 32, head_k_dim: 128, conv_kernel_size: 4, recover_ssm: true };
        let l = kda(&p, &common(1, 7, ConvLayout::DS)).unwrap();
        assert_eq!(l.states()[0].shape, vec![32 * 128 * 3, 10]);
        assert_eq!(l.states()[1].shape, vec![32, 128, 128]);
        assert_eq!(l.states()[2].shape, vec![32, 8, 128]);
        assert_eq!(l.states()[3].shape, vec![32, 8, 256]);
        assert_eq!(l.states()[3].dtype, DType::BFloat16);
        assert_eq!(l.states()[2].dtype, DType::Float32);
    }

    #[test]
    fn mamba2_group_replication_and_rings() {
        let p = Mamba2 {
            intermediate_size: 8192,
            n_groups: 1,
            num_heads: 128,
            head_dim: 64,
            state_size: 128,
            conv_kernel: 4,
            logical_window: Some(8),
            mamba_backend: MambaBackend::Triton,
        };
        let l = mamba2(&p, &common(4, 0, ConvLayout::SD)).unwrap();
        // g' = 1 + (4 - 1) = 4
        assert_eq!(l.states()[0].shape, vec![3, (8192 + 2 * 4 * 128) / 4]);
        assert_eq!(l.states()[1].shape, vec![32, 64, 128]);
        assert_eq!(l.states()[2].shape, vec![32, 8, 64]);
        assert_eq!(l.states()[3].shape, vec![32, 8]);
        assert_eq!(l.states()[4].shape, vec![1, 8, 128]);
        assert_eq!(l.copyable_prefix_len(), 2);
        // Ring dtypes: x and B in the model dtype, dt in fp32 (whatever the SSM dtype).
        let dtypes: Vec<DType> = l.states()[2..].iter().map(|s| s.dtype).collect();
        assert_eq!(dtypes, vec![DType::BFloat16, DType::Float32, DType::BFloat16]);
        // FlashInfer keeps the verify window in the ring: R = window + 1 + num_spec.
        let f = Mamba2 { mamba_backend: MambaBackend::FlashInfer, ..p };
        let l = mamba2(&f, &common(4, 2, ConvLayout::DS)).unwrap();
        assert_eq!(l.states()[0].shape, vec![(8192 + 2 * 4 * 128) / 4, 3 + 2]);
        assert_eq!(l.states()[2].shape, vec![32, 8 + 1 + 2, 64]);
        assert_eq!(l.states()[4].shape, vec![1, 8 + 1 + 2, 128]);
        assert!(mamba2(&Mamba2 { logical_window: None, ..f }, &common(4, 2, ConvLayout::DS)).unwrap().states().len() == 2);
        assert!(MambaBackend::parse("FlashInfer").unwrap() == MambaBackend::FlashInfer);
        assert!(MambaBackend::parse("cuda").unwrap_err().message.contains("unknown mamba_backend 'cuda'"));
    }

    #[test]
    fn indivisible_dimension_names_the_parameter() {
        let p = Gdn { num_k_heads: 16, num_v_heads: 32, head_k_dim: 128, head_v_dim: 128, conv_kernel_size: 4, recover_ssm: false };
        let m = gdn(&p, &common(3, 0, ConvLayout::SD)).unwrap_err().message;
        assert!(m.contains("not divisible by tp_size = 3"), "{m}");
        let m = linear_attention(6, 64, &common(4, 0, ConvLayout::SD)).unwrap_err().message;
        assert!(m.contains("num_heads = 6"), "{m}");
    }

    #[test]
    fn groups_and_key_heads_split_as_a_transfer_reshards_them() {
        let m = |n_groups, tp| {
            let p = Mamba2 {
                intermediate_size: 4096,
                n_groups,
                num_heads: 64,
                head_dim: 64,
                state_size: 128,
                conv_kernel: 4,
                logical_window: None,
                mamba_backend: MambaBackend::Triton,
            };
            mamba2(&p, &common(tp, 0, ConvLayout::SD))
        };
        // Sharded (8 over 4), replicated (1 or 2 over 4): accepted.
        for (g, tp) in [(8, 4), (1, 4), (2, 4), (4, 8)] {
            assert!(m(g, tp).is_ok(), "n_groups {g}, tp {tp}");
        }
        // Neither divides the other: a group would straddle ranks.
        for (g, tp) in [(3, 4), (6, 4), (6, 8), (2, 3)] {
            let e = m(g, tp).unwrap_err().message;
            assert!(e.contains(&format!("n_groups = {g} cannot be split over tp_size = {tp}")), "{e}");
        }
        let k = |num_k_heads, tp| {
            let p = Kda { num_heads: 8, head_dim: 64, num_k_heads, head_k_dim: 64, conv_kernel_size: 4, recover_ssm: false };
            kda(&p, &common(tp, 0, ConvLayout::SD))
        };
        assert!(k(8, 2).is_ok() && k(4, 4).is_ok());
        let e = k(3, 2).unwrap_err().message;
        assert!(e.contains("kda: num_k_heads = 3 is not divisible by tp_size = 2"), "{e}");
        assert!(k(2, 4).unwrap_err().message.contains("num_k_heads = 2"));
    }

    #[test]
    fn other_families() {
        let l = mamba1(8192, 16, 4, &common(2, 0, ConvLayout::DS)).unwrap();
        assert_eq!(l.states()[0].shape, vec![4096, 3]);
        assert_eq!(l.states()[1].shape, vec![4096, 16]);
        assert!(mamba1(8192, 16, 4, &common(2, 1, ConvLayout::DS)).is_err());
        let l = short_conv(2048, 3, &common(1, 2, ConvLayout::SD)).unwrap();
        assert_eq!(l.states()[0].shape, vec![4, 2048]);
        assert_eq!(short_conv(2048, 3, &common(2, 2, ConvLayout::DS)).unwrap().states()[0].shape, vec![1024, 4]);
        let l = linear_attention(64, 96, &common(8, 0, ConvLayout::SD)).unwrap();
        assert_eq!(l.states()[0].shape, vec![8, 96, 96]);
        let m = short_conv(2048, 1, &common(1, 0, ConvLayout::SD)).unwrap_err().message;
        assert!(m.contains("short_conv: conv_kernel must be >= 2"), "{m}");
        let m = short_conv(2047, 4, &common(2, 0, ConvLayout::SD)).unwrap_err().message;
        assert!(m.contains("intermediate_size = 2047"), "{m}");
        let m = mamba1(8192, 16, 1, &common(1, 0, ConvLayout::SD)).unwrap_err().message;
        assert!(m.contains("mamba1: conv_kernel must be >= 2"), "{m}");
    }

    #[test]
    fn huge_kernels_and_head_dims_overflow_without_wrapping() {
        // conv_kernel - 1 + num_spec and KDA's 2 * head_dim wrapped (a panic in a debug build).
        let m = short_conv(2048, u64::MAX, &common(1, 2, ConvLayout::SD)).unwrap_err().message;
        assert!(m.contains("short_conv: the conv window width conv_kernel - 1 + num_spec") && m.contains("overflows 64 bits"), "{m}");
        let p = Kda { num_heads: 1, head_dim: 1 << 63, num_k_heads: 1, head_k_dim: 1, conv_kernel_size: 4, recover_ssm: true };
        let m = kda(&p, &common(1, 0, ConvLayout::SD)).unwrap_err().message;
        assert!(m.contains("kda: the verify_keygate record's last dimension overflows 64 bits"), "{m}");
    }
}
