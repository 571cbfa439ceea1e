//! The vLLM-compatible start-up check: does every group's backend register copy functions for a
//! non-empty copyable prefix of its states, each applicable to the state at its index, and do the
//! groups agree on the settings that copies depend on?

use crate::error::{Error, Result};

/// The kind of a registered copy function, without orientation (engines register a conv copy
/// function without saying which way the window is stored).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyFuncKind {
    Conv,
    Temporal,
}

impl CopyFuncKind {
    /// Recognises a copy kind (`"conv"`, `"temporal"`) or the name of one of vLLM's copy-spec
    /// functions (`get_conv_copy_spec`, `get_temporal_copy_spec`, ...).
    pub fn parse(name: &str) -> Option<CopyFuncKind> {
        match name.trim() {
            "conv" | "get_conv_copy_spec" | "conv_copy" | "conv_state_copy" => Some(CopyFuncKind::Conv),
            "temporal" | "get_temporal_copy_spec" | "get_full_copy_spec" | "temporal_copy" | "ssm_state_copy" | "full" => {
                Some(CopyFuncKind::Temporal)
            }
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            CopyFuncKind::Conv => "conv",
            CopyFuncKind::Temporal => "temporal",
        }
    }
}

/// What an engine knows about one group of recurrent layers (vLLM's `MambaSpec`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupSpec {
    pub backend: String,
    pub shapes: Vec<Vec<u64>>,
    /// Optional per-state dtype names (one per state), only used in messages.
    pub dtypes: Option<Vec<String>>,
    pub block_size: Option<u64>,
    pub num_speculative_blocks: Option<u64>,
    pub cache_mode: Option<String>,
}

/// The outcome for one backend: how many leading states its copy functions cover.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyPrefix {
    pub backend: String,
    pub num_states: usize,
    pub prefix_len: usize,
}

fn shape_str(shape: &[u64]) -> String {
    let d: Vec<String> = shape.iter().map(|x| x.to_string()).collect();
    format!("({})", d.join(", "))
}

/// Applies the copyable-prefix contract to every group. `copy_funcs` holds, per backend, the names
/// of the copy functions it registers, in state order.
pub fn validate_copy_funcs(groups: &[GroupSpec], copy_funcs: &[(String, Vec<String>)]) -> Result<Vec<CopyPrefix>> {
    for (i, (backend, _)) in copy_funcs.iter().enumerate() {
        if copy_funcs[..i].iter().any(|(b, _)| b == backend) {
            return Err(Error::layout(format!(
                "copy_funcs registers backend {backend} twice (by name and by enum member?); register each backend's copy \
                 functions once"
            )));
        }
    }
    let mut out: Vec<CopyPrefix> = Vec::new();
    for (gi, g) in groups.iter().enumerate() {
        let backend = g.backend.as_str();
        let funcs = copy_funcs.iter().find(|(b, _)| b == backend).map(|(_, f)| f).ok_or_else(|| {
            Error::layout(format!(
                "missing state copy funcs for {backend} (group {gi}): register one copy function \
                 per persistent state of this backend, in state order"
            ))
        })?;
        if let Some(n) = g.dtypes.as_ref().map(Vec::len).filter(|&n| n != g.shapes.len()) {
            return Err(Error::layout(format!(
                "group {gi} ({backend}): {n} dtypes for {} states; give one dtype per state, in state order",
                g.shapes.len()
            )));
        }
        if g.block_size == Some(0) {
            return Err(Error::layout(format!("group {gi} ({backend}): block_size = 0: a block holds at least one token")));
        }
        if funcs.is_empty() || funcs.len() > g.shapes.len() {
            return Err(Error::layout(format!(
                "{backend} declares {} states, but provides {} state copy funcs; expected a \
                 non-empty copyable prefix (1 to {} copy functions covering the leading persistent \
                 states)",
                g.shapes.len(),
                funcs.len(),
                g.shapes.len()
            )));
        }
        for (i, f) in funcs.iter().enumerate() {
            let state_name = |i: usize| -> String {
                match g.dtypes.as_ref().and_then(|d| d.get(i)) {
                    Some(dt) => format!("state {i} {} {dt}", shape_str(&g.shapes[i])),
                    None => format!("state {i} {}", shape_str(&g.shapes[i])),
                }
            };
            let kind = CopyFuncKind::parse(f).ok_or_else(|| {
                Error::layout(format!(
                    "{backend}: {}: unrecognised copy function '{f}'; pass 'conv' or 'temporal' (or \
                     vLLM's get_conv_copy_spec / get_temporal_copy_spec)",
                    state_name(i)
                ))
            })?;
            let shape = &g.shapes[i];
            if shape.is_empty() || shape.contains(&0) {
                return Err(Error::layout(format!("{backend}: {}: every state needs at least one dimension and no zero dimension", state_name(i))));
            }
            if kind == CopyFuncKind::Conv && shape.len() != 2 {
                return Err(Error::layout(format!(
                    "{backend}: {}: copy function {i} is a conv copy, which needs a 2-D conv window, \
                     but the state is {}-D; the copy functions must cover the leading states in \
                     order (persistent states first, workspace after) — is a workspace or temporal \
                     state placed before the conv state?",
                    state_name(i),
                    shape.len()
                )));
            }
        }
        out.push(CopyPrefix { backend: backend.to_string(), num_states: g.shapes.len(), prefix_len: funcs.len() });
    }
    if let Some(first) = groups.first() {
        for (gi, g) in groups.iter().enumerate().skip(1) {
            let check = |what: &str, a: String, b: String| -> Result<()> {
                if a != b {
                    return Err(Error::layout(format!(
                        "group {gi} ({}) has {what} {b} but group 0 ({}) has {a}; all recurrent \
                         groups must share the {what} because copies are planned on one block grid",
                        g.backend, first.backend
                    )));
                }
                Ok(())
            };
            check("block size", fmt_opt(&first.block_size), fmt_opt(&g.block_size))?;
            check("number of speculative blocks", fmt_opt(&first.num_speculative_blocks), fmt_opt(&g.num_speculative_blocks))?;
            check("cache mode", fmt_opt(&first.cache_mode), fmt_opt(&g.cache_mode))?;
        }
    }
    out.dedup_by(|a, b| a.backend == b.backend && a.prefix_len == b.prefix_len && a.num_states == b.num_states);
    Ok(out)
}

fn fmt_opt<T: std::fmt::Display>(v: &Option<T>) -> String {
    match v {
        Some(x) => format!("{x}"),
        None => "unset".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(backend: &str, shapes: &[&[u64]]) -> GroupSpec {
        GroupSpec {
            backend: backend.into(),
            shapes: shapes.iter().map(|s| s.to_vec()).collect(),
            dtypes: None,
            block_size: Some(16),
            num_speculative_blocks: Some(3),
            cache_mode: Some("align".into()),
        }
    }
    fn funcs(backend: &str, f: &[&str]) -> (String, Vec<String>) {
        (backend.into(), f.iter().map(|s| s.to_string()).collect())
    }
    const K3: [&[u64]; 4] = [&[8192, 10], &[32, 128, 128], &[32, 8, 128], &[32, 8, 256]];

    #[test]
    fn recoverssm_four_states_two_funcs_is_accepted() {
        let r = validate_copy_funcs(&[group("GDN_ATTN", &K3)], &[funcs("GDN_ATTN", &["conv", "temporal"])]).unwrap();
        assert_eq!(r[0].prefix_len, 2);
        assert_eq!(r[0].num_states, 4);
    }

    #[test]
    fn equal_length_and_vllm_names_are_accepted() {
        let g = group("MAMBA2", &[&[4, 8192], &[128, 64, 128]]);
        let r = validate_copy_funcs(&[g], &[funcs("MAMBA2", &["get_conv_copy_spec", "get_temporal_copy_spec"])]).unwrap();
        assert_eq!(r[0].prefix_len, 2);
    }

    #[test]
    fn missing_empty_and_too_many_are_rejected() {
        let g = group("GDN_ATTN", &K3);
        let m = validate_copy_funcs(std::slice::from_ref(&g), &[]).unwrap_err().message;
        assert!(m.contains("missing state copy funcs for GDN_ATTN"), "{m}");
        let m = validate_copy_funcs(std::slice::from_ref(&g), &[funcs("GDN_ATTN", &[])]).unwrap_err().message;
        assert!(m.contains("declares 4 states, but provides 0") && m.contains("expected a non-empty copyable prefix"), "{m}");
        let g2 = group("LINEAR", &[&[16, 128, 128]]);
        let m = validate_copy_funcs(&[g2], &[funcs("LINEAR", &["temporal", "temporal"])]).unwrap_err().message;
        assert!(m.contains("declares 1 states, but provides 2"), "{m}");
    }

    #[test]
    fn conv_copy_on_3d_state_names_the_state() {
        // Workspace placed first: the conv copy function lands on a 3-D record tensor.
        let g = group("GDN_ATTN", &[&[32, 8, 128], &[32, 8, 256], &[8192, 10], &[32, 128, 128]]);
        let m = validate_copy_funcs(&[g], &[funcs("GDN_ATTN", &["conv", "temporal"])]).unwrap_err().message;
        assert!(m.contains("state 0 (32, 8, 128)") && m.contains("3-D"), "{m}");
    }

    #[test]
    fn a_backend_registered_twice_is_rejected() {
        let f = [funcs("GDN_ATTN", &["conv"]), funcs("GDN_ATTN", &["conv", "temporal"])];
        let m = validate_copy_funcs(&[group("GDN_ATTN", &K3)], &f).unwrap_err().message;
        assert!(m.contains("registers backend GDN_ATTN twice"), "{m}");
    }

    #[test]
    fn unknown_copy_function_is_rejected() {
        let m = validate_copy_funcs(&[group("GDN_ATTN", &K3)], &[funcs("GDN_ATTN", &["conv", "magic"])]).unwrap_err().message;
        assert!(m.contains("unrecognised copy function 'magic'") && m.contains("state 1"), "{m}");
    }

    #[test]
    fn groups_must_agree() {
        let a = group("GDN_ATTN", &K3);
        let mut b = group("MAMBA2", &[&[4, 8192], &[128, 64, 128]]);
        let f = [funcs("GDN_ATTN", &["conv", "temporal"]), funcs("MAMBA2", &["conv", "temporal"])];
        assert!(validate_copy_funcs(&[a.clone(), b.clone()], &f).is_ok());
        b.block_size = Some(32);
        let m = validate_copy_funcs(&[a.clone(), b.clone()], &f).unwrap_err().message;
        assert!(m.contains("block size 32") && m.contains("has 16"), "{m}");
        b.block_size = Some(16);
        b.num_speculative_blocks = Some(1);
        assert!(validate_copy_funcs(&[a.clone(), b.clone()], &f).unwrap_err().message.contains("speculative blocks"));
        b.num_speculative_blocks = Some(3);
        b.cache_mode = Some("all".into());
        assert!(validate_copy_funcs(&[a, b], &f).unwrap_err().message.contains("cache mode"));
    }
}
