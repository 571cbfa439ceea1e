//! What RecoverSSM needs to know about a layout: which states are the conv window, the recurrent
//! state and the two verify-record workspaces, and their geometry. A layout that cannot serve
//! RecoverSSM is rejected with the reason.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::{ConvGeometry, CopyKind, Layout, Role};

named_enum! {
    /// Gate granularity of the recurrence: `Gdn` (Gated DeltaNet) one scalar gate per head and
    /// token (key+gate records `K + 1` wide), `Kda` (Kimi Delta Attention) one gate per key channel
    /// (key+gate records `2K` wide).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum GateKind { Gdn = "gdn", Kda = "kda" }
    parse: any_case, |s| Error::binding(format!("kind: expected 'gdn' or 'kda', got '{s}'"))
}

/// Indices and sizes of a RecoverSSM layout's states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecoverGeometry {
    pub conv_state: usize,
    pub recurrent_state: usize,
    pub corrections: usize,
    pub keygate: usize,
    pub kind: GateKind,
    pub heads: u64,
    pub head_v_dim: u64,
    pub head_k_dim: u64,
    /// Speculative window `Q = num_spec + 1`.
    pub window: u64,
    pub conv: ConvGeometry,
    pub conv_kernel_size: u64,
}

/// Recognises a RecoverSSM layout: a conv window and a `[H, V, K]` recurrent state (persistent),
/// followed by corrections `[H, Q, V]` float32 and key+gate `[H, Q, 2K | K + 1]` (workspace).
pub fn recover_geometry(layout: &Layout) -> Result<RecoverGeometry> {
    let b = layout.backend();
    let states = layout.states();
    let err = |m: String| Error::layout(format!("{b}: not a RecoverSSM layout: {m}"));
    let conv_state =
        layout.persistent().iter().position(|s| matches!(s.copy, Some(CopyKind::Conv(_)))).ok_or_else(|| err("no persistent conv state".into()))?;
    let recurrent_state = layout
        .persistent()
        .iter()
        .position(|s| s.copy == Some(CopyKind::Temporal))
        .ok_or_else(|| err("no persistent recurrent (temporal) state".into()))?;
    if layout.persistent().len() != 2 {
        return Err(err(format!("expected exactly 2 persistent states (conv, recurrent), found {}", layout.persistent().len())));
    }
    let rec = &states[recurrent_state];
    let [h, v, k] = rec.shape[..] else {
        return Err(err(format!("state {recurrent_state} ('{}') must be [heads, head_v_dim, head_k_dim], got {}-D", rec.name, rec.shape.len())));
    };
    let ws: Vec<usize> = (0..states.len()).filter(|&i| states[i].role == Role::Workspace).collect();
    if ws.len() < 2 {
        return Err(err(format!(
            "expected the verify records (corrections [H, Q, V] float32, key+gate [H, Q, 2K or K+1]) as the first two workspace states, found {} workspace states",
            ws.len()
        )));
    }
    let (ci, gi) = (ws[0], ws[1]);
    let q = layout.num_spec() as u64 + 1;
    let corr = &states[ci];
    if corr.shape != [h, q, v] || corr.dtype != DType::Float32 {
        return Err(err(format!(
            "state {ci} ('{}') must be the corrections [H={h}, Q={q}, V={v}] float32, got {:?} {}",
            corr.name, corr.shape, corr.dtype
        )));
    }
    let kg = &states[gi];
    let kind = match kg.shape[..] {
        [kh, kq, w] if kh == h && kq == q && w == 2 * k => GateKind::Kda,
        [kh, kq, w] if kh == h && kq == q && w == k + 1 => GateKind::Gdn,
        _ => {
            return Err(err(format!(
                "state {gi} ('{}') must be the key+gate records [H={h}, Q={q}, 2K={}] (KDA) or [H={h}, Q={q}, K+1={}] (GDN), got {:?}",
                kg.name,
                2 * k,
                k + 1,
                kg.shape
            )))
        }
    };
    if !matches!(kg.dtype, DType::Float32 | DType::Float16 | DType::BFloat16 | DType::Float64) {
        return Err(err(format!("state {gi} ('{}') must be a floating dtype, got {}", kg.name, kg.dtype)));
    }
    let conv = states[conv_state].conv_geometry().expect("a conv-copied state has a 2-D geometry");
    let conv_kernel_size = conv.width + 1 - layout.num_spec() as u64;
    if conv_kernel_size < 2 {
        return Err(err(format!(
            "the conv window has width {} for num_spec = {}: it must hold conv_kernel_size - 1 + num_spec columns with conv_kernel_size >= 2",
            conv.width,
            layout.num_spec()
        )));
    }
    Ok(RecoverGeometry {
        conv_state,
        recurrent_state,
        corrections: ci,
        keygate: gi,
        kind,
        heads: h,
        head_v_dim: v,
        head_k_dim: k,
        window: q,
        conv,
        conv_kernel_size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::{self, Common};
    use crate::layout::ConvLayout;

    fn common(l: ConvLayout) -> Common {
        Common { tp_size: 1, num_spec: 3, conv_layout: l, dtype: DType::BFloat16, ssm_dtype: DType::Float32 }
    }

    #[test]
    fn recognises_kda_and_gdn_recoverssm_layouts() {
        let p = families::Kda { num_heads: 4, head_dim: 32, num_k_heads: 4, head_k_dim: 32, conv_kernel_size: 4, recover_ssm: true };
        let g = recover_geometry(&families::kda(&p, &common(ConvLayout::DS)).unwrap()).unwrap();
        assert_eq!((g.kind, g.heads, g.head_k_dim, g.window, g.conv_kernel_size), (GateKind::Kda, 4, 32, 4, 4));
        assert_eq!((g.conv_state, g.recurrent_state, g.corrections, g.keygate), (0, 1, 2, 3));
        let p = families::Gdn { num_k_heads: 2, num_v_heads: 4, head_k_dim: 16, head_v_dim: 32, conv_kernel_size: 4, recover_ssm: true };
        let g = recover_geometry(&families::gdn(&p, &common(ConvLayout::SD)).unwrap()).unwrap();
        assert_eq!((g.kind, g.head_v_dim, g.head_k_dim), (GateKind::Gdn, 32, 16));
    }

    #[test]
    fn rejects_layouts_without_records() {
        let p = families::Kda { num_heads: 4, head_dim: 32, num_k_heads: 4, head_k_dim: 32, conv_kernel_size: 4, recover_ssm: false };
        let m = recover_geometry(&families::kda(&p, &common(ConvLayout::DS)).unwrap()).unwrap_err().message;
        assert!(m.contains("not a RecoverSSM layout") && m.contains("found 0 workspace"), "{m}");
    }
}
