//! Which (source rank, destination rank) pairs can exchange persistent states: the same family
//! and model dims, the same states with the same dtypes and conv kernel size. TP size and rank,
//! conv layout (SD / DS), `num_spec` (the conv width), block size and pool size may differ.

use super::fingerprint::{Fingerprint, StateKind};
use crate::error::{Error, Result};

/// Checks that states can move from `src` to `dst`; the error lists every incompatibility, each
/// naming the state (or setting) and both values.
pub fn check_compatible(src: &Fingerprint, dst: &Fingerprint) -> Result<()> {
    src.check()?;
    dst.check()?;
    let mut bad: Vec<String> = Vec::new();
    if src.family != dst.family {
        bad.push(format!("family: source '{}' vs destination '{}'", src.family, dst.family));
    }
    if src.model_dims != dst.model_dims {
        for (n, v) in &src.model_dims {
            match dst.model_dims.iter().find(|(m, _)| m == n) {
                Some((_, w)) if w != v => bad.push(format!("model dim {n}: source {v} vs destination {w}")),
                None => bad.push(format!("model dim {n}: source {v} vs destination (absent)")),
                _ => {}
            }
        }
        for (n, w) in &dst.model_dims {
            if !src.model_dims.iter().any(|(m, _)| m == n) {
                bad.push(format!("model dim {n}: source (absent) vs destination {w}"));
            }
        }
    }
    if src.states.len() != dst.states.len() {
        let names = |f: &Fingerprint| f.states.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ");
        bad.push(format!("persistent states: source has {} ({}) vs destination {} ({})", src.states.len(), names(src), dst.states.len(), names(dst)));
    }
    for (s, d) in src.states.iter().zip(&dst.states) {
        let name = &s.name;
        if s.name != d.name {
            bad.push(format!("state name: source '{}' vs destination '{}'", s.name, d.name));
        }
        if s.dtype != d.dtype {
            bad.push(format!("state '{name}' dtype: source {} vs destination {}", s.dtype, d.dtype));
        }
        match (&s.kind, &d.kind) {
            (StateKind::Conv { kernel_size: ks, segments: sg, .. }, StateKind::Conv { kernel_size: kd, segments: dg, .. }) => {
                if ks != kd {
                    bad.push(format!("state '{name}' conv_kernel_size: source {ks} vs destination {kd}"));
                }
                if sg != dg {
                    let show = |g: &[super::fingerprint::Segment]| {
                        g.iter().map(|x| format!("{}={}x{}", x.name, x.units, x.unit_dim)).collect::<Vec<_>>().join(" ")
                    };
                    bad.push(format!("state '{name}' conv sub-projections: source [{}] vs destination [{}]", show(sg), show(dg)));
                }
            }
            (StateKind::Heads { units: us, shape: ss }, StateKind::Heads { units: ud, shape: sd }) => {
                if us != ud {
                    bad.push(format!("state '{name}' heads: source {us} vs destination {ud}"));
                }
                if ss[1..] != sd[1..] {
                    bad.push(format!("state '{name}' per-head shape: source {:?} vs destination {:?}", &ss[1..], &sd[1..]));
                }
            }
            (a, b) => bad.push(format!("state '{name}' kind: source {} vs destination {}", kind_name(a), kind_name(b))),
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(Error::layout(format!(
            "states cannot move from {} rank {}/{} to {} rank {}/{}: {}",
            src.family,
            src.tp_rank,
            src.tp_size,
            dst.family,
            dst.tp_rank,
            dst.tp_size,
            bad.join("; ")
        )))
    }
}

/// Checks the source ranks an executor was given, as `(rank it is used as, its fingerprint)`:
/// each pool's fingerprint names the rank it is used as (swapped shards are refused), and all
/// are ranks of one instance (the same fingerprint but for the rank: an SD pool with a DS pool,
/// or two TP sizes, are refused). Returns the instance's fingerprint (of the first rank given).
pub fn check_sources(sources: &[(u64, &Fingerprint)]) -> Result<Fingerprint> {
    let Some(&(_, first)) = sources.first() else {
        return Err(Error::binding("no source rank given; pass the source instance's pools by rank"));
    };
    let instance = |f: &Fingerprint| Fingerprint { tp_rank: 0, ..f.clone() };
    let base = instance(first);
    let mut seen = Vec::with_capacity(sources.len());
    for &(rank, fp) in sources {
        fp.check()?;
        if fp.tp_rank != rank {
            return Err(Error::binding(format!(
                "source rank {rank}: the pool given for it holds rank {} of {} (shards swapped?); give each pool as its own rank",
                fp.tp_rank, fp.tp_size
            )));
        }
        if seen.contains(&rank) {
            return Err(Error::binding(format!("source rank {rank} is given twice")));
        }
        seen.push(rank);
        if instance(fp) != base {
            let show = |f: &Fingerprint| {
                format!("{} tp_size {} conv layout {} num_spec {}", f.family, f.tp_size, f.conv_layout().map_or("-", |l| l.name()), f.num_spec)
            };
            return Err(Error::binding(format!(
                "source rank {rank} ({}) is not a rank of the same instance as source rank {} ({}): every source pool must have the \
                 same layout but for its rank",
                show(fp),
                first.tp_rank,
                show(first)
            )));
        }
    }
    Ok(first.clone())
}

fn kind_name(k: &StateKind) -> &'static str {
    match k {
        StateKind::Conv { .. } => "conv window",
        StateKind::Heads { .. } => "head-sliced state",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::families::{self, Common};
    use crate::layout::ConvLayout;

    fn kda(tp: u64, ns: u32, l: ConvLayout, ssm: DType, k: u64) -> Fingerprint {
        let p = families::Kda { num_heads: 4, head_dim: 8, num_k_heads: 4, head_k_dim: 8, conv_kernel_size: k, recover_ssm: false };
        let c = Common { tp_size: tp, num_spec: ns, conv_layout: l, dtype: DType::BFloat16, ssm_dtype: ssm };
        Fingerprint::new(&families::kda(&p, &c).unwrap(), 0, 16).unwrap()
    }

    #[test]
    fn tp_layout_and_width_may_differ() {
        let a = kda(1, 0, ConvLayout::SD, DType::Float32, 4);
        let b = kda(4, 7, ConvLayout::DS, DType::Float32, 4);
        check_compatible(&a, &b).unwrap();
        check_compatible(&b, &a).unwrap();
    }

    #[test]
    fn source_ranks_must_be_one_instance_each_in_its_place() {
        let a = kda(2, 0, ConvLayout::SD, DType::Float32, 4);
        let b = Fingerprint { tp_rank: 1, ..a.clone() };
        assert_eq!(check_sources(&[(0, &a), (1, &b)]).unwrap(), a);
        let m = check_sources(&[(0, &b), (1, &a)]).unwrap_err().message;
        assert!(m.contains("source rank 0: the pool given for it holds rank 1 of 2"), "{m}");
        let ds = Fingerprint { tp_rank: 1, ..kda(2, 0, ConvLayout::DS, DType::Float32, 4) };
        let m = check_sources(&[(0, &a), (1, &ds)]).unwrap_err().message;
        assert!(m.contains("source rank 1 (kda tp_size 2 conv layout DS num_spec 0) is not a rank of the same instance"), "{m}");
        assert!(check_sources(&[(0, &a), (0, &a)]).unwrap_err().message.contains("given twice"));
        assert!(check_sources(&[]).is_err());
    }

    #[test]
    fn every_incompatibility_is_named_with_both_values() {
        let a = kda(1, 0, ConvLayout::SD, DType::Float32, 4);
        let m = check_compatible(&a, &kda(2, 0, ConvLayout::SD, DType::BFloat16, 4)).unwrap_err().message;
        assert!(m.contains("state 'recurrent' dtype: source float32 vs destination bfloat16"), "{m}");
        let m = check_compatible(&a, &kda(1, 0, ConvLayout::SD, DType::Float32, 3)).unwrap_err().message;
        assert!(m.contains("state 'conv' conv_kernel_size: source 4 vs destination 3"), "{m}");
        assert!(m.contains("model dim conv_kernel_size: source 4 vs destination 3"), "{m}");
        let p = families::Gdn { num_k_heads: 4, num_v_heads: 4, head_k_dim: 8, head_v_dim: 8, conv_kernel_size: 4, recover_ssm: false };
        let c = Common { tp_size: 1, num_spec: 0, conv_layout: ConvLayout::SD, dtype: DType::BFloat16, ssm_dtype: DType::Float32 };
        let g = Fingerprint::new(&families::gdn(&p, &c).unwrap(), 0, 16).unwrap();
        let m = check_compatible(&a, &g).unwrap_err().message;
        assert!(m.contains("family: source 'kda' vs destination 'gdn'"), "{m}");
    }
}
