//! The layout fingerprint of one rank's pool: everything a peer needs to decide whether states
//! can move between the two pools and how to re-shard them, in a small text form for handshakes.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::{ConvLayout, CopyKind, Layout};
use crate::sharding::{owned_units, StateShard};
use std::fmt::Write;

const MAGIC: &str = "recoverssm-transfer-fingerprint 1";

/// The largest byte size or offset a pool, a state or a plan may have: sizes from a peer's
/// fingerprint are computed with checked arithmetic and must fit numpy's and torch's signed
/// 64-bit indices.
pub const MAX_BYTES: u64 = i64::MAX as u64;

/// `a * b`, or `None` past [`MAX_BYTES`].
pub fn mul_bytes(a: u64, b: u64) -> Option<u64> {
    a.checked_mul(b).filter(|&x| x <= MAX_BYTES)
}

/// `a + b`, or `None` past [`MAX_BYTES`].
pub fn add_bytes(a: u64, b: u64) -> Option<u64> {
    a.checked_add(b).filter(|&x| x <= MAX_BYTES)
}

/// One sub-projection of the conv channels (see [`crate::sharding::ConvSegment`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub name: String,
    pub units: u64,
    pub unit_dim: u64,
}

/// What a persistent state is, on this rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateKind {
    /// A conv window of `dim` local channels and `width` columns, whose channels are `segments`.
    Conv { layout: ConvLayout, width: u64, dim: u64, kernel_size: u64, segments: Vec<Segment> },
    /// A state sliced by its outermost axis (`units` heads across ranks); `shape` is local.
    Heads { units: u64, shape: Vec<u64> },
}

/// One persistent state of the fingerprint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FingerprintState {
    pub name: String,
    pub dtype: DType,
    pub kind: StateKind,
}

impl FingerprintState {
    /// Bytes of this state in one block; a layout error when the size does not fit
    /// [`MAX_BYTES`] (a fingerprint that passed [`Fingerprint::check`] never has one).
    pub fn nbytes(&self) -> Result<u64> {
        let numel = match &self.kind {
            StateKind::Conv { width, dim, .. } => mul_bytes(*width, *dim),
            StateKind::Heads { shape, .. } => shape.iter().try_fold(1u64, |a, &d| mul_bytes(a, d)),
        };
        numel
            .and_then(|n| mul_bytes(n, self.dtype.itemsize()))
            .ok_or_else(|| Error::layout(format!("state '{}': its size in bytes overflows (more than {MAX_BYTES} bytes per block)", self.name)))
    }
}

/// One rank's pool, as the transfer sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    pub family: String,
    pub model_dims: Vec<(String, u64)>,
    pub tp_size: u64,
    pub tp_rank: u64,
    pub num_spec: u32,
    /// Tokens per cache block (informational: state blocks transfer one to one).
    pub block_size: u64,
    pub states: Vec<FingerprintState>,
}

impl Fingerprint {
    /// The fingerprint of rank `tp_rank` of a pool laid out as `layout` (built by a family
    /// calculator, which knows the tensor-parallel split).
    pub fn new(layout: &Layout, tp_rank: u64, block_size: u64) -> Result<Fingerprint> {
        let sh = layout.sharding().ok_or_else(|| {
            Error::layout(format!(
                "{}: the layout carries no tensor-parallel split (it was not built by a family \
                 calculator); build it with recoverssm_rs.layouts.<family>(...) to transfer its states",
                layout.backend()
            ))
        })?;
        let mut states = Vec::with_capacity(sh.states.len());
        for (spec, shard) in layout.persistent().iter().zip(&sh.states) {
            let kind = match (shard, spec.copy) {
                (StateShard::Conv { segments, kernel_size }, Some(CopyKind::Conv(_))) => {
                    let g = spec.conv_geometry().expect("a validated conv state has a geometry");
                    StateKind::Conv {
                        layout: g.layout,
                        width: g.width,
                        dim: g.dim,
                        kernel_size: *kernel_size,
                        segments: segments.iter().map(|s| Segment { name: s.name.to_string(), units: s.units, unit_dim: s.unit_dim }).collect(),
                    }
                }
                (StateShard::Heads { units }, _) => StateKind::Heads { units: *units, shape: spec.shape.clone() },
                (StateShard::Conv { .. }, _) => {
                    return Err(Error::layout(format!(
                        "{}: state '{}' is split as a conv window but is not conv-copied",
                        layout.backend(),
                        spec.name
                    )))
                }
            };
            states.push(FingerprintState { name: spec.name.clone(), dtype: spec.dtype, kind });
        }
        let fp = Fingerprint {
            family: sh.family.to_string(),
            model_dims: sh.model_dims.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
            tp_size: sh.tp_size,
            tp_rank,
            num_spec: layout.num_spec(),
            block_size,
            states,
        };
        fp.check()?;
        Ok(fp)
    }

    /// Checks that the rank holds what its split says: the rank is in range and every state's
    /// local dims equal the units this rank owns.
    pub fn check(&self) -> Result<()> {
        let f = &self.family;
        if self.tp_size == 0 || self.tp_rank >= self.tp_size {
            return Err(Error::layout(format!("{f}: tp_rank {} is out of range for tp_size {}", self.tp_rank, self.tp_size)));
        }
        if self.states.is_empty() {
            return Err(Error::layout(format!("{f}: the fingerprint lists no persistent state")));
        }
        for (i, s) in self.states.iter().enumerate() {
            let at = |m: String| Error::layout(format!("{f}: state '{}': {m}", s.name));
            if s.name.trim().is_empty() {
                return Err(Error::layout(format!("{f}: state {i} has an empty name")));
            }
            if self.states[..i].iter().any(|o| o.name == s.name) {
                return Err(at("the name is used by an earlier state; state names must be unique".into()));
            }
            match &s.kind {
                StateKind::Conv { width, dim, kernel_size, segments, .. } => {
                    if let Some(g) = segments.iter().find(|g| g.units == 0 || g.unit_dim == 0) {
                        return Err(at(format!("segment '{}' has {} units of {} channels; both must be > 0", g.name, g.units, g.unit_dim)));
                    }
                    if segments.is_empty() || *dim == 0 {
                        return Err(at(format!("the conv window has {dim} channels in {} segments; it needs at least one of each", segments.len())));
                    }
                    if *kernel_size < 2 {
                        return Err(at(format!("conv_kernel_size must be >= 2, got {kernel_size}")));
                    }
                    let want = (kernel_size - 1).checked_add(u64::from(self.num_spec));
                    if want != Some(*width) {
                        return Err(at(format!(
                            "conv window width {width} is not conv_kernel_size - 1 + num_spec = {} - 1 + {}",
                            kernel_size, self.num_spec
                        )));
                    }
                    let mut local = 0u64;
                    for g in segments {
                        let (_, n) =
                            owned_units(g.units, self.tp_size, self.tp_rank).map_err(|e| at(format!("segment '{}': {}", g.name, e.message)))?;
                        local = mul_bytes(n, g.unit_dim)
                            .and_then(|c| add_bytes(local, c))
                            .ok_or_else(|| at(format!("segment '{}': the channel count overflows ({} units x {})", g.name, g.units, g.unit_dim)))?;
                    }
                    if local != *dim {
                        return Err(at(format!(
                            "the conv window has {dim} channels but its segments give rank {} of \
                             tp_size {} {local} channels",
                            self.tp_rank, self.tp_size
                        )));
                    }
                }
                StateKind::Heads { units, shape } => {
                    if *units == 0 || shape.contains(&0) {
                        return Err(at(format!("{units} heads of local shape {shape:?}: every dimension must be > 0")));
                    }
                    if units % self.tp_size != 0 {
                        return Err(at(format!("{units} heads are not divisible by tp_size {}", self.tp_size)));
                    }
                    if shape.is_empty() || shape[0] != units / self.tp_size {
                        return Err(at(format!("local shape {shape:?} does not hold {units} / {} heads on its outermost axis", self.tp_size)));
                    }
                }
            }
            s.nbytes().map_err(|e| Error::layout(format!("{f}: {}", e.message)))?;
        }
        Ok(())
    }

    /// The conv kernel size of the first conv state, if any.
    pub fn conv_kernel_size(&self) -> Option<u64> {
        self.states.iter().find_map(|s| match s.kind {
            StateKind::Conv { kernel_size, .. } => Some(kernel_size),
            _ => None,
        })
    }

    /// The conv layout of the first conv state, if any.
    pub fn conv_layout(&self) -> Option<ConvLayout> {
        self.states.iter().find_map(|s| match s.kind {
            StateKind::Conv { layout, .. } => Some(layout),
            _ => None,
        })
    }

    /// The text form exchanged at handshake ([`Fingerprint::decode`] reads it back).
    pub fn encode(&self) -> String {
        let mut o = format!("{MAGIC}\nfamily {}\n", self.family);
        for (n, v) in &self.model_dims {
            let _ = writeln!(o, "dim {n} {v}");
        }
        let _ = writeln!(o, "tp {} {}", self.tp_size, self.tp_rank);
        let _ = writeln!(o, "num_spec {}", self.num_spec);
        let _ = writeln!(o, "block_size {}", self.block_size);
        for s in &self.states {
            match &s.kind {
                StateKind::Conv { layout, width, dim, kernel_size, segments } => {
                    let segs: Vec<String> = segments.iter().map(|g| format!("{}:{}:{}", g.name, g.units, g.unit_dim)).collect();
                    let _ = writeln!(o, "conv {} {} {} {width} {dim} {kernel_size} {}", s.name, s.dtype.name(), layout.name(), segs.join(" "));
                }
                StateKind::Heads { units, shape } => {
                    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
                    let _ = writeln!(o, "heads {} {} {units} {}", s.name, s.dtype.name(), dims.join("x"));
                }
            }
        }
        o
    }

    /// Parses [`Fingerprint::encode`]'s text form and checks it.
    pub fn decode(text: &str) -> Result<Fingerprint> {
        let bad = |n: usize, m: String| Error::layout(format!("fingerprint line {}: {m}", n + 1));
        let num = |n: usize, t: &str| t.parse::<u64>().map_err(|_| bad(n, format!("'{t}' is not a non-negative integer")));
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, l)) if l.trim() == MAGIC => {}
            other => {
                return Err(Error::layout(format!(
                    "not a transfer fingerprint: expected the first line '{MAGIC}', got {:?}",
                    other.map(|(_, l)| l).unwrap_or("")
                )))
            }
        }
        let mut fp = Fingerprint { family: String::new(), model_dims: vec![], tp_size: 0, tp_rank: 0, num_spec: 0, block_size: 0, states: vec![] };
        // The line (index) that set each one-value entry, and each model dim: a second one would
        // silently replace, or contradict, the first.
        let mut set: Vec<(String, usize)> = Vec::new();
        for (n, line) in lines {
            let t: Vec<&str> = line.split_whitespace().collect();
            let key = match t.as_slice() {
                [k @ ("family" | "tp" | "num_spec" | "block_size"), ..] => Some(k.to_string()),
                ["dim", name, ..] => Some(format!("dim {name}")),
                _ => None,
            };
            if let Some(key) = key {
                if let Some((_, first)) = set.iter().find(|(k, _)| *k == key) {
                    return Err(bad(n, format!("'{key}' is given again (first on line {}); each entry is given once", first + 1)));
                }
                set.push((key, n));
            }
            match t.as_slice() {
                [] => {}
                ["family", f] => fp.family = f.to_string(),
                ["dim", name, v] => fp.model_dims.push((name.to_string(), num(n, v)?)),
                ["tp", size, rank] => (fp.tp_size, fp.tp_rank) = (num(n, size)?, num(n, rank)?),
                ["num_spec", v] => fp.num_spec = u32::try_from(num(n, v)?).map_err(|_| bad(n, format!("num_spec {v} is too large")))?,
                ["block_size", v] => fp.block_size = num(n, v)?,
                ["conv", name, dtype, layout, width, dim, k, segs @ ..] => {
                    let mut segments = Vec::with_capacity(segs.len());
                    for g in segs {
                        let p: Vec<&str> = g.split(':').collect();
                        let [gn, u, d] = p.as_slice() else {
                            return Err(bad(n, format!("segment '{g}' is not name:units:unit_dim")));
                        };
                        segments.push(Segment { name: gn.to_string(), units: num(n, u)?, unit_dim: num(n, d)? });
                    }
                    fp.states.push(FingerprintState {
                        name: name.to_string(),
                        dtype: DType::parse(dtype).map_err(|e| bad(n, e.message))?,
                        kind: StateKind::Conv {
                            layout: ConvLayout::parse(layout).map_err(|e| bad(n, e.message))?,
                            width: num(n, width)?,
                            dim: num(n, dim)?,
                            kernel_size: num(n, k)?,
                            segments,
                        },
                    });
                }
                ["heads", name, dtype, units, shape] => {
                    let shape = shape.split('x').map(|d| num(n, d)).collect::<Result<Vec<u64>>>()?;
                    fp.states.push(FingerprintState {
                        name: name.to_string(),
                        dtype: DType::parse(dtype).map_err(|e| bad(n, e.message))?,
                        kind: StateKind::Heads { units: num(n, units)?, shape },
                    });
                }
                _ => return Err(bad(n, format!("unrecognised entry '{line}'"))),
            }
        }
        if fp.family.is_empty() {
            return Err(Error::layout("fingerprint: no 'family' line"));
        }
        fp.check()?;
        Ok(fp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::{self, Common};

    fn gdn(tp: u64, ns: u32, l: ConvLayout) -> Layout {
        let p = families::Gdn { num_k_heads: 4, num_v_heads: 8, head_k_dim: 16, head_v_dim: 32, conv_kernel_size: 4, recover_ssm: true };
        families::gdn(&p, &Common { tp_size: tp, num_spec: ns, conv_layout: l, dtype: DType::BFloat16, ssm_dtype: DType::Float32 }).unwrap()
    }

    #[test]
    fn encode_decode_round_trip() {
        let fp = Fingerprint::new(&gdn(2, 3, ConvLayout::DS), 1, 16).unwrap();
        assert_eq!(fp.states.len(), 2, "workspace records are not part of the fingerprint");
        let back = Fingerprint::decode(&fp.encode()).unwrap();
        assert_eq!(back, fp);
        assert_eq!(back.conv_kernel_size(), Some(4));
    }

    #[test]
    fn bad_rank_and_text_are_rejected() {
        let m = Fingerprint::new(&gdn(2, 0, ConvLayout::SD), 2, 16).unwrap_err().message;
        assert!(m.contains("tp_rank 2 is out of range for tp_size 2"), "{m}");
        let text = Fingerprint::new(&gdn(2, 0, ConvLayout::SD), 0, 16).unwrap().encode();
        let m = Fingerprint::decode(&text.replace("tp 2 0", "tp 4 0")).unwrap_err().message;
        assert!(m.contains("state 'conv'") && m.contains("channels"), "{m}");
        assert!(Fingerprint::decode("hello").unwrap_err().message.contains("not a transfer fingerprint"));
        let m = Fingerprint::decode(&text.replace("block_size 16", "block_size x")).unwrap_err().message;
        assert!(m.contains("'x' is not a non-negative integer"), "{m}");
    }

    /// The conv line of `text` with its width and kernel size replaced.
    fn with_conv(text: &str, width: &str, kernel: &str) -> String {
        text.lines()
            .map(|l| {
                let mut t: Vec<&str> = l.split(' ').collect();
                if t[0] == "conv" {
                    (t[4], t[6]) = (width, kernel);
                }
                t.join(" ")
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn peer_sizes_are_checked_without_wrapping() {
        let text = Fingerprint::new(&gdn(2, 1, ConvLayout::SD), 0, 16).unwrap().encode();
        assert!(text.contains("conv conv bfloat16 SD 4 "), "{text}");
        Fingerprint::decode(&with_conv(&text, "4", "4")).unwrap();
        for w in ["2305843009213693952", "4611686018427387905", "3", "5"] {
            let m = Fingerprint::decode(&with_conv(&text, w, "4")).unwrap_err().message;
            assert!(m.contains(&format!("conv window width {w} is not conv_kernel_size - 1 + num_spec = 4 - 1 + 1")), "{m}");
        }
        // Consistent but too large: the byte size overflows instead of wrapping.
        for (w, k) in [("2305843009213693952", "2305843009213693952"), ("4611686018427387905", "4611686018427387905")] {
            let m = Fingerprint::decode(&with_conv(&text, w, k)).unwrap_err().message;
            assert!(m.contains("state 'conv': its size in bytes overflows"), "{m}");
        }
        let m = Fingerprint::decode(&with_conv(&text, "18446744073709551615", "18446744073709551615")).unwrap_err().message;
        assert!(m.contains("overflows"), "{m}");
        let m = Fingerprint::decode(&with_conv(&text, "0", "18446744073709551615")).unwrap_err().message;
        assert!(m.contains("is not conv_kernel_size - 1 + num_spec"), "{m}");
        let m = Fingerprint::decode(&text.replace("heads temporal float32 8 4x32x16", "heads temporal float32 8 4x4294967296x4294967296"))
            .unwrap_err()
            .message;
        assert!(m.contains("state 'temporal': its size in bytes overflows"), "{m}");
    }

    #[test]
    fn hand_built_layout_has_no_split() {
        let l = gdn(1, 0, ConvLayout::SD);
        let bare = Layout::new(l.backend(), l.states().to_vec(), 0).unwrap();
        assert_eq!(bare, l);
        let m = Fingerprint::new(&bare, 0, 16).unwrap_err().message;
        assert!(m.contains("no tensor-parallel split"), "{m}");
    }
}
