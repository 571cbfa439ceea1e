//! Bindings for the layout model, the copy-function check and the family calculators.

use super::conversion::{args, instance, items, kwargs, Arg, DtypeName, Ints};
use crate::copy_funcs::{validate_copy_funcs as core_validate, GroupSpec};
use crate::dtype::DType;
use crate::error::{Error, ErrorKind};
use crate::families::{self, Common};
use crate::layout::{ConvLayout, CopyKind, Layout as CoreLayout, StateSpec as CoreSpec};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// One state tensor of a layer: its per-block (persistent) or per-request (workspace) shape, dtype,
/// role and, for persistent states, how it is copied between cache blocks.
#[pyclass(module = "recoverssm_rs", frozen, eq, skip_from_py_object)]
#[derive(Clone, PartialEq)]
pub struct StateSpec {
    pub(crate) inner: CoreSpec,
}

#[pymethods]
impl StateSpec {
    #[new]
    #[pyo3(
        signature = (
            name: "str", shape: "Sequence[int]", dtype: "str | _DType", role: "_Role" = None, copy: "_CopyKindName | None" = None,
            conv_layout: "_ConvLayoutName | None" = None,
        ),
        text_signature = "(name, shape, dtype, role='persistent', copy=None, conv_layout=None)"
    )]
    fn new(
        name: &Bound<'_, PyAny>,
        shape: &Bound<'_, PyAny>,
        dtype: &Bound<'_, PyAny>,
        role: Option<&Bound<'_, PyAny>>,
        copy: Option<&Bound<'_, PyAny>>,
        conv_layout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let name: String = Arg::arg(name, "state name", ErrorKind::Layout)?;
        let name = name.as_str();
        let text = |v: Option<&Bound<'_, PyAny>>, what: &str| -> PyResult<Option<String>> {
            v.map_or(Ok(None), |v| Arg::arg(v, &format!("state '{name}': {what}"), ErrorKind::Layout))
        };
        let role = text(role, "role")?.unwrap_or_else(|| "persistent".into());
        let (copy, conv_layout) = (text(copy, "copy")?, text(conv_layout, "conv_layout")?);
        let (role, copy, conv_layout) = (role.as_str(), copy.as_deref(), conv_layout.as_deref());
        let shape = Ints::arg(shape, &format!("state '{name}': shape"), ErrorKind::Layout)?.0;
        let dtype = DtypeName::arg(dtype, &format!("state '{name}': dtype"), ErrorKind::Layout)?.0;
        let inner = CoreSpec::from_parts(name, &shape, &dtype, role, copy, conv_layout)?;
        Ok(Self { inner })
    }
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }
    // stub: -> tuple[int, ...]
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.inner.shape)
    }
    #[getter]
    fn dtype(&self) -> &'static str {
        self.inner.dtype.name()
    }
    #[getter]
    fn itemsize(&self) -> u64 {
        self.inner.dtype.itemsize()
    }
    // stub: -> _Role
    #[getter]
    fn role(&self) -> &'static str {
        self.inner.role.name()
    }
    // stub: -> _CopyKindName | None
    #[getter]
    fn copy(&self) -> Option<&'static str> {
        self.inner.copy.map(|c| c.name())
    }
    // stub: -> _ConvLayoutName | None
    #[getter]
    fn conv_layout(&self) -> Option<&'static str> {
        match self.inner.copy {
            Some(CopyKind::Conv(l)) => Some(l.name()),
            _ => None,
        }
    }
    /// Bytes per block (persistent) or per request (workspace); None if it overflows 64 bits.
    #[getter]
    fn nbytes(&self) -> Option<u64> {
        self.inner.nbytes()
    }
    #[pyo3(signature = () -> "dict[str, Any]")]
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("name", self.name())?;
        d.set_item("role", self.role())?;
        d.set_item("copy", self.copy())?;
        d.set_item("conv_layout", self.conv_layout())?;
        d.set_item("shape", self.inner.shape.clone())?;
        d.set_item("dtype", self.dtype())?;
        d.set_item("nbytes", self.nbytes())?;
        Ok(d)
    }
    fn __repr__(&self) -> String {
        let shape: Vec<String> = self.inner.shape.iter().map(|d| d.to_string()).collect();
        let shape = if shape.len() == 1 { format!("({},)", shape[0]) } else { format!("({})", shape.join(", ")) };
        let copy = match self.inner.copy {
            Some(CopyKind::Conv(l)) => format!(", copy='conv', conv_layout='{}'", l.name()),
            Some(CopyKind::Temporal) => ", copy='temporal'".to_string(),
            None => String::new(),
        };
        format!("StateSpec('{}', {shape}, '{}', role='{}'{copy})", self.inner.name, self.inner.dtype.name(), self.inner.role.name())
    }
}

/// A validated per-layer state layout: persistent states (copied between cache blocks) first,
/// workspace states (rewritten every step, never copied) after.
#[pyclass(module = "recoverssm_rs", frozen, eq, skip_from_py_object)]
#[derive(Clone, PartialEq)]
pub struct Layout {
    pub(crate) inner: CoreLayout,
    /// Draft tokens per step.
    #[pyo3(get)]
    num_spec: u32,
    /// Number of leading states that are copied between blocks.
    #[pyo3(get)]
    copyable_prefix_len: usize,
    /// Bytes of one layer's persistent states in one cache block.
    #[pyo3(get)]
    persistent_bytes_per_block: u64,
    /// Bytes of one layer's workspace states for one request.
    #[pyo3(get)]
    workspace_bytes_per_request: u64,
}

impl From<CoreLayout> for Layout {
    fn from(inner: CoreLayout) -> Layout {
        Layout {
            num_spec: inner.num_spec(),
            copyable_prefix_len: inner.copyable_prefix_len(),
            persistent_bytes_per_block: inner.persistent_bytes_per_block(),
            workspace_bytes_per_request: inner.workspace_bytes_per_request(),
            inner,
        }
    }
}

impl Layout {
    pub(crate) fn core(&self) -> &CoreLayout {
        &self.inner
    }
}

fn specs_tuple<'py>(py: Python<'py>, specs: &[CoreSpec]) -> PyResult<Bound<'py, PyTuple>> {
    let items: Vec<StateSpec> = specs.iter().map(|s| StateSpec { inner: s.clone() }).collect();
    PyTuple::new(py, items)
}

#[pymethods]
impl Layout {
    #[new]
    #[pyo3(signature = (backend: "str", states: "Sequence[StateSpec]", num_spec: "int | None" = None))]
    fn new(backend: &Bound<'_, PyAny>, states: &Bound<'_, PyAny>, num_spec: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let backend: String = Arg::arg(backend, "backend", ErrorKind::Layout)?;
        let states = items(states, &format!("{backend}: states"), ErrorKind::Layout, "StateSpec")?
            .iter()
            .enumerate()
            .map(|(i, s)| instance::<StateSpec>(s, &format!("{backend}: states[{i}]"), ErrorKind::Layout, "StateSpec"))
            .collect::<PyResult<Vec<_>>>()?;
        let num_spec: u32 = match num_spec {
            Some(n) => Arg::arg(n, "num_spec", ErrorKind::Layout)?,
            None => 0,
        };
        let specs = states.iter().map(|s| s.get().inner.clone()).collect();
        Ok(CoreLayout::new(&backend, specs, num_spec)?.into())
    }
    #[getter]
    fn backend(&self) -> &str {
        self.inner.backend()
    }
    // stub: -> tuple[StateSpec, ...]
    #[getter]
    fn states<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        specs_tuple(py, self.inner.states())
    }
    // stub: -> tuple[StateSpec, ...]
    #[getter]
    fn persistent<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        specs_tuple(py, self.inner.persistent())
    }
    // stub: -> tuple[StateSpec, ...]
    #[getter]
    fn workspace<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        specs_tuple(py, self.inner.workspace())
    }
    fn __len__(&self) -> usize {
        self.inner.states().len()
    }
    /// The state called `name`.
    #[pyo3(signature = (name: "str") -> "StateSpec")]
    fn state(&self, name: &Bound<'_, PyAny>) -> PyResult<StateSpec> {
        let name: String = Arg::arg(name, &format!("{}: state name", self.inner.backend()), ErrorKind::Layout)?;
        let name = name.as_str();
        match self.inner.index_of(name) {
            Some(i) => Ok(StateSpec { inner: self.inner.states()[i].clone() }),
            None => {
                let names: Vec<&str> = self.inner.states().iter().map(|s| s.name.as_str()).collect();
                Err(crate::Error::layout(format!("{}: no state named '{name}'; the layout has {}", self.inner.backend(), names.join(", "))).into())
            }
        }
    }
    /// The RecoverSSM geometry of this layout (state indices, heads, head dims, window, gate
    /// kind, conv geometry); raises LayoutError when the layout cannot serve RecoverSSM.
    #[pyo3(signature = () -> "dict[str, Any]")]
    fn recover_geometry<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let g = crate::commit::recover_geometry(&self.inner)?;
        let d = PyDict::new(py);
        d.set_item("conv_state", g.conv_state)?;
        d.set_item("recurrent_state", g.recurrent_state)?;
        d.set_item("corrections", g.corrections)?;
        d.set_item("keygate", g.keygate)?;
        d.set_item("kind", g.kind.name())?;
        d.set_item("heads", g.heads)?;
        d.set_item("head_v_dim", g.head_v_dim)?;
        d.set_item("head_k_dim", g.head_k_dim)?;
        d.set_item("window", g.window)?;
        d.set_item("conv_layout", g.conv.layout.name())?;
        d.set_item("conv_width", g.conv.width)?;
        d.set_item("conv_dim", g.conv.dim)?;
        d.set_item("conv_kernel_size", g.conv_kernel_size)?;
        Ok(d)
    }
    #[pyo3(signature = () -> "dict[str, Any]")]
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("backend", self.backend())?;
        d.set_item("num_spec", self.num_spec)?;
        d.set_item("copyable_prefix_len", self.copyable_prefix_len)?;
        d.set_item("persistent_bytes_per_block", self.persistent_bytes_per_block)?;
        d.set_item("workspace_bytes_per_request", self.workspace_bytes_per_request)?;
        let states: Vec<Bound<'py, PyDict>> =
            self.inner.states().iter().map(|s| StateSpec { inner: s.clone() }.to_dict(py)).collect::<PyResult<_>>()?;
        d.set_item("states", states)?;
        Ok(d)
    }
    fn __repr__(&self) -> String {
        let states: Vec<String> = self.inner.states().iter().map(|s| StateSpec { inner: s.clone() }.__repr__()).collect();
        format!("Layout('{}', [{}], num_spec={})", self.inner.backend(), states.join(", "), self.inner.num_spec())
    }
}

/// The copy kind (`"conv"` or `"temporal"`) a copy function's name or kind names (the core's
/// table of vLLM's copy-spec functions); `LayoutError` for any other name.
#[pyfunction]
#[pyo3(signature = (name: "str") -> "Literal['conv', 'temporal']")]
pub(crate) fn copy_func_kind(name: &Bound<'_, PyAny>) -> PyResult<&'static str> {
    let name = String::arg(name, "copy function name", ErrorKind::Layout)?;
    crate::copy_funcs::CopyFuncKind::parse(&name)
        .map(|k| k.name())
        .ok_or_else(|| Error::layout(format!("copy function {name:?} is neither a conv nor a temporal copy")).into())
}

/// `(backend, shapes, dtypes, block_size, num_speculative_blocks, cache_mode)` of one group.
type GroupTuple<'py> = (String, Vec<Bound<'py, PyAny>>, Option<Vec<String>>, Option<Bound<'py, PyAny>>, Option<Bound<'py, PyAny>>, Option<String>);

/// Applies the copyable-prefix contract to an engine's groups; returns `{backend: prefix_len}`.
/// `layout.recover_geometry()` of any object: a `LayoutError` naming `layout` when it is not a
/// `Layout`.
#[pyfunction]
#[pyo3(signature = (layout: "object") -> "dict[str, Any]")]
pub(crate) fn recover_geometry<'py>(layout: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
    instance::<Layout>(layout, "layout", ErrorKind::Layout, "Layout")?.get().recover_geometry(layout.py())
}

#[pyfunction]
#[pyo3(signature = (
    groups: "Sequence[tuple[str, Sequence[Sequence[int]], Sequence[str] | None, int | None, int | None, str | None]]",
    copy_funcs: "Sequence[tuple[str, Sequence[str]]]",
) -> "dict[str, int]")]
pub(crate) fn _validate_copy_funcs<'py>(
    py: Python<'py>,
    groups: Vec<GroupTuple<'py>>,
    copy_funcs: Vec<(String, Vec<String>)>,
) -> PyResult<Bound<'py, PyDict>> {
    let kind = ErrorKind::Layout;
    let groups: Vec<GroupSpec> = groups
        .into_iter()
        .map(|(backend, shapes, dtypes, block_size, num_speculative_blocks, cache_mode)| {
            let at = |what: &str| format!("{backend}: {what}");
            let shapes = shapes
                .iter()
                .enumerate()
                .map(|(i, shape)| {
                    let dims = shape.try_iter().map_err(|_| {
                        super::conversion::arg_error(kind, format!("{}: must be a sequence of integers", at(&format!("shapes[{i}]"))))
                    })?;
                    dims.enumerate().map(|(j, d)| u64::arg(&d?, &at(&format!("shapes[{i}][{j}]")), kind)).collect::<PyResult<Vec<u64>>>()
                })
                .collect::<PyResult<Vec<_>>>()?;
            Ok(GroupSpec {
                shapes,
                dtypes,
                block_size: block_size.map(|b| u64::arg(&b, &at("block_size"), kind)).transpose()?,
                num_speculative_blocks: num_speculative_blocks.map(|b| u64::arg(&b, &at("num_speculative_blocks"), kind)).transpose()?,
                cache_mode,
                backend,
            })
        })
        .collect::<PyResult<_>>()?;
    let out = core_validate(&groups, &copy_funcs)?;
    let d = PyDict::new(py);
    for p in out {
        d.set_item(p.backend, p.prefix_len)?;
    }
    Ok(d)
}

kwargs! {
    /// The settings every calculator shares.
    pub(crate) struct CommonArgs (Layout) {
        tp_size: u64,
        num_spec: u32,
        conv_layout: String,
        dtype: Option<DtypeName>,
        ssm_dtype: Option<DtypeName>,
    }
}

/// `CommonArgs`' parameters ([`super::params`]): every calculator's shared settings (keyword-only:
/// each calculator's own come first, after `*`).
macro_rules! layout_params {
    ($($items:tt)*) => {
        $crate::python::params::with_params! {
            ($crate::python::layout::CommonArgs {
                tp_size: "int", num_spec: "int", conv_layout: "str", dtype: "str | _DType | None" = None, ssm_dtype: "str | _DType | None" = None,
            })
            $($items)*
        }
    };
}

/// The shared settings of calculator `family` (`tp_size`, `num_spec`, `conv_layout`, `dtype`,
/// `ssm_dtype`; unset dtypes take the family's defaults: `dtype` bfloat16, `ssm_dtype` `ssm_default`).
/// A name the core does not know is an error naming the family and the parameter.
fn common(family: &str, a: CommonArgs, ssm_default: DType) -> PyResult<Common> {
    let at = |what: &str, e: Error| Error::layout(format!("{family}: {what}: {}", e.message));
    let dtype = |d: Option<DtypeName>, default: DType, what: &str| d.map_or(Ok(default), |n| DType::parse(&n.0).map_err(|e| at(what, e)));
    Ok(Common {
        tp_size: a.tp_size,
        num_spec: a.num_spec,
        conv_layout: ConvLayout::parse(&a.conv_layout).map_err(|e| at("conv_layout", e))?,
        dtype: dtype(a.dtype, DType::BFloat16, "dtype")?,
        ssm_dtype: dtype(a.ssm_dtype, ssm_default, "ssm_dtype")?,
    })
}

kwargs! {
    /// Mamba1's own parameters.
    pub(crate) struct Mamba1Args (Layout) { intermediate_size: u64, state_size: u64, conv_kernel: u64 }
}
impl Arg for families::MambaBackend {
    fn arg(obj: &Bound<'_, PyAny>, name: &str, kind: ErrorKind) -> PyResult<Self> {
        Ok(families::MambaBackend::parse(&String::arg(obj, name, kind)?)?)
    }
}

// Mamba2's own parameters are the core's struct.
kwargs!(impl families::Mamba2 as Layout {
    intermediate_size: u64,
    n_groups: u64,
    num_heads: u64,
    head_dim: u64,
    state_size: u64,
    conv_kernel: u64,
    logical_window: Option<u64>,
    mamba_backend: families::MambaBackend = families::MambaBackend::Triton,
});
kwargs! {
    /// Short conv's own parameters.
    pub(crate) struct ShortConvArgs (Layout) { intermediate_size: u64, conv_kernel: u64 }
}
kwargs! {
    /// Linear attention's own parameters.
    pub(crate) struct LinearArgs (Layout) { num_heads: u64, head_dim: u64 }
}
// Gated DeltaNet's own parameters are the core's struct.
kwargs!(impl families::Gdn as Layout {
    num_k_heads: u64,
    num_v_heads: u64,
    head_k_dim: u64,
    head_v_dim: u64,
    conv_kernel_size: u64,
    recover_ssm: bool = false,
});
kwargs! {
    /// Kimi Delta Attention's own parameters.
    pub(crate) struct KdaArgs (Layout) {
        num_heads: u64,
        head_dim: u64,
        num_k_heads: Option<u64>,
        head_k_dim: Option<u64>,
        conv_kernel_size: u64 = 4,
        recover_ssm: bool = false,
    }
}

layout_params! {
#[signature((*, intermediate_size: "int", state_size: "int", conv_kernel: "int",) ..c -> "Layout")]
/// Mamba1 layout: conv window + temporal state.
#[pyfunction]
pub(crate) fn mamba1_layout(
    intermediate_size: Option<&Bound<'_, PyAny>>,
    state_size: Option<&Bound<'_, PyAny>>,
    conv_kernel: Option<&Bound<'_, PyAny>>,
) -> PyResult<Layout> {
    let c = common("mamba1", c, DType::BFloat16)?;
    let p = args!(Mamba1Args { intermediate_size, state_size, conv_kernel })?;
    Ok(families::mamba1(p.intermediate_size, p.state_size, p.conv_kernel, &c)?.into())
}

#[signature((*, intermediate_size: "int", n_groups: "int", num_heads: "int", head_dim: "int", state_size: "int", conv_kernel: "int",) ..c (logical_window: "int | None" = None, mamba_backend: "str" = None) -> "Layout")]
/// Mamba2 layout: conv window + temporal state (+ the three ReplaySSM rings as workspace).
#[pyfunction]
pub(crate) fn mamba2_layout(
    intermediate_size: Option<&Bound<'_, PyAny>>,
    n_groups: Option<&Bound<'_, PyAny>>,
    num_heads: Option<&Bound<'_, PyAny>>,
    head_dim: Option<&Bound<'_, PyAny>>,
    state_size: Option<&Bound<'_, PyAny>>,
    conv_kernel: Option<&Bound<'_, PyAny>>,
) (logical_window: Option<&Bound<'_, PyAny>>, mamba_backend: Option<&Bound<'_, PyAny>>) -> PyResult<Layout> {
    let c = common("mamba2", c, DType::BFloat16)?;
    let m = args!(families::Mamba2 { intermediate_size, n_groups, num_heads, head_dim, state_size, conv_kernel, logical_window, mamba_backend })?;
    Ok(families::mamba2(&m, &c)?.into())
}

#[signature((*, intermediate_size: "int", conv_kernel: "int",) ..c -> "Layout")]
/// Short-conv layout: one conv window.
#[pyfunction]
pub(crate) fn short_conv_layout(
    intermediate_size: Option<&Bound<'_, PyAny>>,
    conv_kernel: Option<&Bound<'_, PyAny>>,
) -> PyResult<Layout> {
    let c = common("short_conv", c, DType::BFloat16)?;
    let p = args!(ShortConvArgs { intermediate_size, conv_kernel })?;
    Ok(families::short_conv(p.intermediate_size, p.conv_kernel, &c)?.into())
}

#[signature((*, num_heads: "int", head_dim: "int",) ..c -> "Layout")]
/// Linear-attention layout: one temporal state.
#[pyfunction]
pub(crate) fn linear_attention_layout(
    num_heads: Option<&Bound<'_, PyAny>>,
    head_dim: Option<&Bound<'_, PyAny>>,
) -> PyResult<Layout> {
    let c = common("linear_attention", c, DType::Float32)?;
    let p = args!(LinearArgs { num_heads, head_dim })?;
    Ok(families::linear_attention(p.num_heads, p.head_dim, &c)?.into())
}

#[signature((*, num_k_heads: "int", num_v_heads: "int", head_k_dim: "int", head_v_dim: "int", conv_kernel_size: "int",) ..c (recover_ssm: "bool" = None) -> "Layout")]
/// Gated DeltaNet layout: conv window + temporal state (+ RecoverSSM verify records).
#[pyfunction]
pub(crate) fn gdn_layout(
    num_k_heads: Option<&Bound<'_, PyAny>>,
    num_v_heads: Option<&Bound<'_, PyAny>>,
    head_k_dim: Option<&Bound<'_, PyAny>>,
    head_v_dim: Option<&Bound<'_, PyAny>>,
    conv_kernel_size: Option<&Bound<'_, PyAny>>,
) (recover_ssm: Option<&Bound<'_, PyAny>>) -> PyResult<Layout> {
    let c = common("gdn", c, DType::BFloat16)?;
    let g = args!(families::Gdn { num_k_heads, num_v_heads, head_k_dim, head_v_dim, conv_kernel_size, recover_ssm })?;
    Ok(families::gdn(&g, &c)?.into())
}

#[signature((*, num_heads: "int", head_dim: "int", num_k_heads: "int | None" = None, head_k_dim: "int | None" = None, conv_kernel_size: "int" = None,) ..c (recover_ssm: "bool" = None) -> "Layout")]
/// Kimi Delta Attention layout: conv window + recurrent state (+ RecoverSSM verify records).
#[pyfunction]
pub(crate) fn kda_layout(
    num_heads: Option<&Bound<'_, PyAny>>,
    head_dim: Option<&Bound<'_, PyAny>>,
    num_k_heads: Option<&Bound<'_, PyAny>>,
    head_k_dim: Option<&Bound<'_, PyAny>>,
    conv_kernel_size: Option<&Bound<'_, PyAny>>,
) (recover_ssm: Option<&Bound<'_, PyAny>>) -> PyResult<Layout> {
    let c = common("kda", c, DType::Float32)?;
    let p = args!(KdaArgs { num_heads, head_dim, num_k_heads, head_k_dim, conv_kernel_size, recover_ssm })?;
    let k = families::Kda {
        num_heads: p.num_heads,
        head_dim: p.head_dim,
        num_k_heads: p.num_k_heads.unwrap_or(p.num_heads),
        head_k_dim: p.head_k_dim.unwrap_or(p.head_dim),
        conv_kernel_size: p.conv_kernel_size,
        recover_ssm: p.recover_ssm,
    };
    Ok(families::kda(&k, &c)?.into())
}
}
