//! The state-layout contract: a backend's per-layer recurrent states, persistent states first,
//! temporary workspace after, with every rule checked on construction and explained on failure.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::sharding::Sharding;
use std::collections::HashSet;
use std::fmt;

named_enum! {
    /// Whether a state survives across steps (and is copied between cache blocks) or is scratch that
    /// every step rewrites (and is never copied).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum Role { Persistent = "persistent", Workspace = "workspace" }
    parse: any_case, |s| Error::layout(format!("unknown state role '{s}'; expected 'persistent' or 'workspace'"))
}

named_enum! {
    /// Orientation of a conv window within one block: `SD` is `(width, dim)` with `dim` contiguous,
    /// `DS` is `(dim, width)` with the window contiguous per channel.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum ConvLayout { SD = "SD", DS = "DS" }
    parse: any_case, |s| Error::layout(format!("unknown conv layout '{s}'; expected 'SD' (width, dim) or 'DS' (dim, width)"))
}

/// How a persistent state is copied between cache blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CopyKind {
    /// A conv window, shifted left by the accepted tokens minus one.
    Conv(ConvLayout),
    /// The whole state, taken from the accepted token's spec block.
    Temporal,
}

impl CopyKind {
    /// `"conv"` or `"temporal"`.
    pub fn name(self) -> &'static str {
        match self {
            CopyKind::Conv(_) => "conv",
            CopyKind::Temporal => "temporal",
        }
    }
}

/// Geometry of a conv window inside one block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvGeometry {
    pub layout: ConvLayout,
    /// Columns in the window (one per kept input position).
    pub width: u64,
    /// Channels.
    pub dim: u64,
}

/// One state tensor of a layer, per cache block (persistent) or per request (workspace).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateSpec {
    pub name: String,
    pub shape: Vec<u64>,
    pub dtype: DType,
    pub role: Role,
    pub copy: Option<CopyKind>,
}

impl StateSpec {
    pub fn persistent(name: &str, shape: &[u64], dtype: DType, copy: CopyKind) -> Self {
        Self { name: name.into(), shape: shape.to_vec(), dtype, role: Role::Persistent, copy: Some(copy) }
    }
    pub fn workspace(name: &str, shape: &[u64], dtype: DType) -> Self {
        Self { name: name.into(), shape: shape.to_vec(), dtype, role: Role::Workspace, copy: None }
    }

    /// Builds a spec from loosely typed parts (as a binding receives them), checking each part:
    /// the role, the copy kind and its conv orientation, the dtype name and non-negative dims.
    pub fn from_parts(name: &str, shape: &[i64], dtype: &str, role: &str, copy: Option<&str>, conv_layout: Option<&str>) -> Result<StateSpec> {
        let at = |m: String| Error::layout(format!("state '{name}': {m}"));
        let role = Role::parse(role).map_err(|e| at(e.message))?;
        let dtype = DType::parse(dtype).map_err(|e| at(e.message))?;
        let mut dims = Vec::with_capacity(shape.len());
        for (axis, &d) in shape.iter().enumerate() {
            if d <= 0 {
                return Err(at(format!("dimension {axis} of shape {shape:?} is {d}; every dimension must be > 0")));
            }
            dims.push(d as u64);
        }
        let copy = match (copy.map(|c| c.trim().to_ascii_lowercase()), conv_layout) {
            (None, None) => None,
            (None, Some(l)) => {
                return Err(at(format!("conv_layout '{l}' is given without the 'conv' copy kind; pass copy='conv' or drop conv_layout")))
            }
            (Some(c), l) if c == "conv" => Some(CopyKind::Conv(ConvLayout::parse(l.unwrap_or("SD")).map_err(|e| at(e.message))?)),
            (Some(c), None) if c == "temporal" => Some(CopyKind::Temporal),
            (Some(c), Some(l)) if c == "temporal" => {
                return Err(at(format!("conv_layout '{l}' applies to conv copies only, but the copy kind is 'temporal'")))
            }
            (Some(c), _) => return Err(at(format!("unknown copy kind '{c}'; expected 'conv', 'temporal' or None"))),
        };
        Ok(StateSpec { name: name.to_string(), shape: dims, dtype, role, copy })
    }

    /// Elements per block (persistent) or per request (workspace); `None` on overflow.
    pub fn numel(&self) -> Option<u64> {
        self.shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
    }

    /// Bytes per block (persistent) or per request (workspace); `None` on overflow.
    pub fn nbytes(&self) -> Option<u64> {
        self.numel()?.checked_mul(self.dtype.itemsize())
    }

    /// The conv window geometry, for a conv-copied state with a 2-D shape.
    pub fn conv_geometry(&self) -> Option<ConvGeometry> {
        match (self.copy, self.shape.as_slice()) {
            (Some(CopyKind::Conv(ConvLayout::SD)), [w, d]) => Some(ConvGeometry { layout: ConvLayout::SD, width: *w, dim: *d }),
            (Some(CopyKind::Conv(ConvLayout::DS)), [d, w]) => Some(ConvGeometry { layout: ConvLayout::DS, width: *w, dim: *d }),
            _ => None,
        }
    }

    fn shape_str(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        format!("({})", dims.join(", "))
    }
}

/// The most draft tokens per step a layout takes (`num_spec`): far above any engine's speculative
/// window, low enough that the windows a layout sizes stay small.
pub const MAX_NUM_SPEC: u32 = 256;

/// A backend's validated per-layer state layout.
#[derive(Clone, Debug)]
pub struct Layout {
    backend: String,
    states: Vec<StateSpec>,
    num_spec: u32,
    prefix_len: usize,
    persistent_bytes: u64,
    workspace_bytes: u64,
    /// The tensor-parallel split, when a family calculator built the layout.
    sharding: Option<Sharding>,
}

/// Two layouts are equal when they declare the same states: the sharding a family calculator
/// attaches describes where the states came from, not what they are.
impl PartialEq for Layout {
    fn eq(&self, other: &Self) -> bool {
        self.backend == other.backend && self.states == other.states && self.num_spec == other.num_spec
    }
}
impl Eq for Layout {}

impl Layout {
    /// Validates `states` for `backend` and builds the layout.
    ///
    /// `num_spec` is the number of speculative (draft) tokens per step: a copy may accept up to
    /// `1 + num_spec` tokens, so every conv window must be wider than `num_spec`.
    pub fn new(backend: &str, states: Vec<StateSpec>, num_spec: u32) -> Result<Layout> {
        let backend = backend.trim();
        if backend.is_empty() {
            return Err(Error::layout("layout: the backend name is empty; pass the engine's backend name (e.g. 'GDN_ATTN')"));
        }
        if states.is_empty() {
            return Err(Error::layout(format!("{backend}: the layout declares no states; declare at least one persistent state")));
        }
        if num_spec > MAX_NUM_SPEC {
            return Err(Error::layout(format!("{backend}: num_spec = {num_spec} must be <= {MAX_NUM_SPEC} (draft tokens per step)")));
        }
        let mut seen: HashSet<&str> = HashSet::new();
        let mut persistent_bytes = 0u64;
        let mut workspace_bytes = 0u64;
        let mut first_workspace: Option<usize> = None;
        for (i, s) in states.iter().enumerate() {
            let at = |what: String| Error::layout(format!("{backend}: state {i} ('{}'): {what}", s.name));
            if s.name.trim().is_empty() {
                return Err(Error::layout(format!("{backend}: state {i} has an empty name; give every state a unique, non-empty name")));
            }
            if !seen.insert(s.name.as_str()) {
                return Err(at("the name is used by an earlier state; state names must be unique".into()));
            }
            if s.shape.is_empty() {
                return Err(at("the per-block shape is empty; declare at least one dimension".into()));
            }
            if let Some(axis) = s.shape.iter().position(|&d| d == 0) {
                return Err(at(format!("dimension {axis} of shape {} is 0; every dimension must be > 0", s.shape_str())));
            }
            let bytes = s.nbytes().ok_or_else(|| at(format!("the byte size of shape {} x {} overflows 64 bits", s.shape_str(), s.dtype)))?;
            match s.role {
                Role::Persistent => {
                    if let Some(w) = first_workspace {
                        return Err(at(format!(
                            "persistent state follows workspace state {w} ('{}'); persistent states \
                             must form the copyable prefix: move every persistent state before the \
                             workspace",
                            states[w].name
                        )));
                    }
                    let copy = s.copy.ok_or_else(|| {
                        at("a persistent state needs a copy kind ('conv' or 'temporal') so it can be \
                            migrated between blocks; declare one, or make the state a workspace"
                            .into())
                    })?;
                    if let CopyKind::Conv(cl) = copy {
                        if s.shape.len() != 2 {
                            return Err(at(format!(
                                "a conv copy needs a 2-D per-block shape ({}), got {}-D shape {}; \
                                 use the 'temporal' copy for whole-state copies, or check the state \
                                 order (a non-prefix layout puts the wrong state here)",
                                if cl == ConvLayout::SD { "width, dim" } else { "dim, width" },
                                s.shape.len(),
                                s.shape_str()
                            )));
                        }
                        let g = s.conv_geometry().expect("2-D conv state has a geometry");
                        if g.width < 1 {
                            return Err(at("the conv window has no column".into()));
                        }
                        if g.width <= num_spec as u64 {
                            return Err(at(format!(
                                "the conv window has width {} ({} axis of {}) but a step may accept \
                                 up to {} tokens (num_spec = {num_spec}), which would shift the whole \
                                 window out; the width must exceed num_spec (a conv window holds conv_kernel_size - 1 + num_spec columns)",
                                g.width,
                                if cl == ConvLayout::SD { "first" } else { "second" },
                                s.shape_str(),
                                num_spec as u64 + 1
                            )));
                        }
                    }
                    persistent_bytes =
                        persistent_bytes.checked_add(bytes).ok_or_else(|| at("the persistent bytes per block overflow 64 bits".into()))?;
                }
                Role::Workspace => {
                    if let Some(c) = s.copy {
                        return Err(at(format!(
                            "a workspace state is rewritten every step and never copied, but it \
                             declares the '{}' copy; drop the copy kind or make it persistent",
                            c.name()
                        )));
                    }
                    first_workspace.get_or_insert(i);
                    workspace_bytes =
                        workspace_bytes.checked_add(bytes).ok_or_else(|| at("the workspace bytes per request overflow 64 bits".into()))?;
                }
            }
        }
        let prefix_len = first_workspace.unwrap_or(states.len());
        if prefix_len == 0 {
            return Err(Error::layout(format!(
                "{backend}: state 0 ('{}'): the layout has no persistent state; expected a non-empty \
                 copyable prefix of persistent states before the workspace",
                states[0].name
            )));
        }
        Ok(Layout { backend: backend.to_string(), states, num_spec, prefix_len, persistent_bytes, workspace_bytes, sharding: None })
    }

    /// This layout with the tensor-parallel split `sharding` attached (family calculators).
    pub fn with_sharding(mut self, sharding: Sharding) -> Layout {
        self.sharding = Some(sharding);
        self
    }
    /// The tensor-parallel split, for layouts built by a family calculator.
    pub fn sharding(&self) -> Option<&Sharding> {
        self.sharding.as_ref()
    }

    pub fn backend(&self) -> &str {
        &self.backend
    }
    pub fn states(&self) -> &[StateSpec] {
        &self.states
    }
    pub fn num_spec(&self) -> u32 {
        self.num_spec
    }
    /// The persistent states, in order: the states copy plans move.
    pub fn persistent(&self) -> &[StateSpec] {
        &self.states[..self.prefix_len]
    }
    /// The workspace states, in order: rewritten every step, never copied.
    pub fn workspace(&self) -> &[StateSpec] {
        &self.states[self.prefix_len..]
    }
    /// Number of leading states that are copied (the copyable prefix).
    pub fn copyable_prefix_len(&self) -> usize {
        self.prefix_len
    }
    /// Bytes of the persistent states of one layer in one block.
    pub fn persistent_bytes_per_block(&self) -> u64 {
        self.persistent_bytes
    }
    /// Bytes of the workspace states of one layer for one request.
    pub fn workspace_bytes_per_request(&self) -> u64 {
        self.workspace_bytes
    }
    /// Index of the state called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.states.iter().position(|s| s.name == name)
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Layout({}, num_spec={}, states=[", self.backend, self.num_spec)?;
        for (i, s) in self.states.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            let copy = match s.copy {
                Some(CopyKind::Conv(l)) => format!(" conv/{}", l.name()),
                Some(CopyKind::Temporal) => " temporal".to_string(),
                None => String::new(),
            };
            write!(f, "{} {} {}{} {}", s.name, s.role.name(), s.shape_str(), copy, s.dtype)?;
        }
        f.write_str("])")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DType::*;

    fn recover() -> Vec<StateSpec> {
        vec![
            StateSpec::persistent("conv", &[8192, 10], BFloat16, CopyKind::Conv(ConvLayout::DS)),
            StateSpec::persistent("recurrent", &[32, 128, 128], Float32, CopyKind::Temporal),
            StateSpec::workspace("verify_corrections", &[32, 8, 128], Float32),
            StateSpec::workspace("verify_keygate", &[32, 8, 256], BFloat16),
        ]
    }

    fn err(states: Vec<StateSpec>, num_spec: u32) -> String {
        Layout::new("GDN_ATTN", states, num_spec).unwrap_err().message
    }

    #[test]
    fn recoverssm_layout_is_valid_with_derived_values() {
        let l = Layout::new("GDN_ATTN", recover(), 7).unwrap();
        assert_eq!(l.copyable_prefix_len(), 2);
        assert_eq!(l.persistent_bytes_per_block(), 8192 * 10 * 2 + 32 * 128 * 128 * 4);
        assert_eq!(l.workspace_bytes_per_request(), 32 * 8 * 128 * 4 + 32 * 8 * 256 * 2);
        assert_eq!(l.persistent().len(), 2);
        assert_eq!(l.workspace().len(), 2);
        let g = l.states()[0].conv_geometry().unwrap();
        assert_eq!((g.width, g.dim), (10, 8192));
    }

    #[test]
    fn workspace_first_is_rejected_naming_the_state() {
        let mut s = recover();
        s.swap(0, 2);
        let m = err(s, 7);
        assert!(m.contains("state 1 ('recurrent')") && m.contains("workspace state 0"), "{m}");
        assert!(m.contains("copyable prefix"), "{m}");
    }

    #[test]
    fn no_persistent_state_is_rejected() {
        let s = vec![StateSpec::workspace("w", &[4], Float32)];
        let m = err(s, 0);
        assert!(m.contains("non-empty copyable prefix"), "{m}");
        assert!(err(vec![], 0).contains("no states"));
    }

    #[test]
    fn conv_copy_needs_two_dims() {
        let mut s = recover();
        s[0].shape = vec![8192, 10, 2];
        let m = err(s, 7);
        assert!(m.contains("state 0 ('conv')") && m.contains("2-D"), "{m}");
    }

    #[test]
    fn num_spec_is_bounded() {
        let wide = |n: u32| vec![StateSpec::persistent("conv", &[64, u64::from(n) + 3], BFloat16, CopyKind::Conv(ConvLayout::DS))];
        assert!(Layout::new("GDN_ATTN", wide(MAX_NUM_SPEC), MAX_NUM_SPEC).is_ok());
        let m = err(wide(MAX_NUM_SPEC + 1), MAX_NUM_SPEC + 1);
        assert!(m.contains("num_spec = 257") && m.contains("<= 256"), "{m}");
        assert!(err(wide(1), u32::MAX).contains("num_spec = 4294967295"));
    }

    #[test]
    fn conv_width_must_exceed_num_spec() {
        let m = err(recover(), 10);
        assert!(m.contains("width 10") && m.contains("num_spec = 10"), "{m}");
    }

    #[test]
    fn names_unique_and_non_empty() {
        let mut s = recover();
        s[1].name = "conv".into();
        assert!(err(s, 7).contains("state 1 ('conv'): the name is used"));
        let mut s = recover();
        s[3].name = " ".into();
        assert!(err(s, 7).contains("state 3 has an empty name"));
    }

    #[test]
    fn dims_positive_and_no_overflow() {
        let mut s = recover();
        s[1].shape = vec![32, 0, 128];
        assert!(err(s, 7).contains("dimension 1 of shape (32, 0, 128) is 0"));
        let mut s = recover();
        s[1].shape = vec![u64::MAX / 2, 3];
        assert!(err(s, 7).contains("overflows"));
        let mut s = recover();
        s[1].shape = vec![];
        assert!(err(s, 7).contains("shape is empty"));
    }

    #[test]
    fn persistent_needs_copy_and_workspace_has_none() {
        let mut s = recover();
        s[1].copy = None;
        assert!(err(s, 7).contains("needs a copy kind"));
        let mut s = recover();
        s[2].copy = Some(CopyKind::Temporal);
        assert!(err(s, 7).contains("never copied"));
    }

    #[test]
    fn from_parts_checks_each_part() {
        let s = StateSpec::from_parts("conv", &[10, 64], "torch.bfloat16", "persistent", Some("conv"), Some("ds")).unwrap();
        assert_eq!(s.copy, Some(CopyKind::Conv(ConvLayout::DS)));
        let s = StateSpec::from_parts("w", &[3], "fp32", "workspace", None, None).unwrap();
        assert_eq!(s.role, Role::Workspace);
        let e = |r: Result<StateSpec>| r.unwrap_err().message;
        assert!(e(StateSpec::from_parts("x", &[3, -1], "fp32", "persistent", Some("temporal"), None)).contains("dimension 1"));
        assert!(e(StateSpec::from_parts("x", &[3], "fp32", "scratch", None, None)).contains("unknown state role 'scratch'"));
        assert!(e(StateSpec::from_parts("x", &[3], "fp32", "persistent", Some("blob"), None)).contains("unknown copy kind 'blob'"));
        assert!(e(StateSpec::from_parts("x", &[3], "fp32", "persistent", Some("temporal"), Some("SD"))).contains("conv copies only"));
        assert!(e(StateSpec::from_parts("x", &[3], "fp32", "persistent", None, Some("SD"))).contains("without the 'conv'"));
        assert!(e(StateSpec::from_parts("x", &[3, 4], "fp32", "persistent", Some("conv"), Some("XY"))).contains("unknown conv layout"));
        assert!(e(StateSpec::from_parts("x", &[3], "complex", "persistent", Some("temporal"), None)).starts_with("state 'x': unknown dtype"));
    }

    #[test]
    fn empty_backend_is_rejected() {
        assert!(Layout::new(" ", recover(), 7).unwrap_err().message.contains("backend name is empty"));
    }
}
