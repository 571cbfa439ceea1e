//! Bindings for the layout model, the copy-function check and the family calculators.

use super::IntoPyResult;
use crate::copy_funcs::{validate_copy_funcs as core_validate, GroupSpec};
use crate::dtype::DType;
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
    #[pyo3(signature = (name, shape, dtype, role = "persistent", copy = None, conv_layout = None))]
    fn new(
        py: Python<'_>,
        name: &str,
        shape: Vec<i64>,
        dtype: &Bound<'_, PyAny>,
        role: &str,
        copy: Option<&str>,
        conv_layout: Option<&str>,
    ) -> PyResult<Self> {
        let dtype = dtype_name(dtype)?;
        let inner = CoreSpec::from_parts(name, &shape, &dtype, role, copy, conv_layout).py_err(py)?;
        Ok(Self { inner })
    }
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }
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
    #[getter]
    fn role(&self) -> &'static str {
        self.inner.role.name()
    }
    #[getter]
    fn copy(&self) -> Option<&'static str> {
        self.inner.copy.map(|c| c.name())
    }
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
    #[pyo3(signature = (backend, states, num_spec = 0))]
    fn new(py: Python<'_>, backend: &str, states: Vec<PyRef<'_, StateSpec>>, num_spec: u32) -> PyResult<Self> {
        let specs = states.iter().map(|s| s.inner.clone()).collect();
        Ok(Self { inner: CoreLayout::new(backend, specs, num_spec).py_err(py)? })
    }
    #[getter]
    fn backend(&self) -> &str {
        self.inner.backend()
    }
    #[getter]
    fn states<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        specs_tuple(py, self.inner.states())
    }
    #[getter]
    fn persistent<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        specs_tuple(py, self.inner.persistent())
    }
    #[getter]
    fn workspace<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        specs_tuple(py, self.inner.workspace())
    }
    #[getter]
    fn num_spec(&self) -> u32 {
        self.inner.num_spec()
    }
    /// Number of leading states that are copied between blocks.
    #[getter]
    fn copyable_prefix_len(&self) -> usize {
        self.inner.copyable_prefix_len()
    }
    /// Bytes of one layer's persistent states in one cache block.
    #[getter]
    fn persistent_bytes_per_block(&self) -> u64 {
        self.inner.persistent_bytes_per_block()
    }
    /// Bytes of one layer's workspace states for one request.
    #[getter]
    fn workspace_bytes_per_request(&self) -> u64 {
        self.inner.workspace_bytes_per_request()
    }
    fn __len__(&self) -> usize {
        self.inner.states().len()
    }
    /// The state called `name`.
    fn state(&self, py: Python<'_>, name: &str) -> PyResult<StateSpec> {
        match self.inner.index_of(name) {
            Some(i) => Ok(StateSpec { inner: self.inner.states()[i].clone() }),
            None => {
                let names: Vec<&str> = self.inner.states().iter().map(|s| s.name.as_str()).collect();
                Err(super::to_py(
                    py,
                    crate::Error::layout(format!("{}: no state named '{name}'; the layout has {}", self.inner.backend(), names.join(", "))),
                ))
            }
        }
    }
    /// The RecoverSSM geometry of this layout (state indices, heads, head dims, window, gate
    /// kind, conv geometry); raises LayoutError when the layout cannot serve RecoverSSM.
    fn recover_geometry<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let g = crate::commit::recover_geometry(&self.inner).py_err(py)?;
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
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("backend", self.backend())?;
        d.set_item("num_spec", self.num_spec())?;
        d.set_item("copyable_prefix_len", self.copyable_prefix_len())?;
        d.set_item("persistent_bytes_per_block", self.persistent_bytes_per_block())?;
        d.set_item("workspace_bytes_per_request", self.workspace_bytes_per_request())?;
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

/// A dtype given as a string or as a torch / numpy dtype object.
pub(crate) fn dtype_name(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(s) = obj.extract::<String>() {
        return Ok(s);
    }
    Ok(obj.str()?.to_string())
}

/// `(backend, shapes, dtypes, block_size, num_speculative_blocks, cache_mode)` of one group.
type GroupTuple = (String, Vec<Vec<u64>>, Option<Vec<String>>, Option<u64>, Option<u64>, Option<String>);

/// Applies the copyable-prefix contract to an engine's groups; returns `{backend: prefix_len}`.
#[pyfunction]
fn _validate_copy_funcs<'py>(py: Python<'py>, groups: Vec<GroupTuple>, copy_funcs: Vec<(String, Vec<String>)>) -> PyResult<Bound<'py, PyDict>> {
    let groups: Vec<GroupSpec> = groups
        .into_iter()
        .map(|(backend, shapes, dtypes, block_size, num_speculative_blocks, cache_mode)| GroupSpec {
            backend,
            shapes,
            dtypes,
            block_size,
            num_speculative_blocks,
            cache_mode,
        })
        .collect();
    let out = core_validate(&groups, &copy_funcs).py_err(py)?;
    let d = PyDict::new(py);
    for p in out {
        d.set_item(p.backend, p.prefix_len)?;
    }
    Ok(d)
}

fn common(
    py: Python<'_>,
    tp_size: u64,
    num_spec: u32,
    conv_layout: &str,
    dtype: &Bound<'_, PyAny>,
    ssm_dtype: &Bound<'_, PyAny>,
) -> PyResult<Common> {
    Ok(Common {
        tp_size,
        num_spec,
        conv_layout: ConvLayout::parse(conv_layout).py_err(py)?,
        dtype: DType::parse(&dtype_name(dtype)?).py_err(py)?,
        ssm_dtype: DType::parse(&dtype_name(ssm_dtype)?).py_err(py)?,
    })
}

fn wrap(py: Python<'_>, l: crate::Result<CoreLayout>) -> PyResult<Layout> {
    Ok(Layout { inner: l.py_err(py)? })
}

/// Mamba1 layout: conv window + temporal state.
#[pyfunction]
#[pyo3(signature = (*, intermediate_size, state_size, conv_kernel, tp_size = 1, num_spec = 0,
    conv_layout = "SD", dtype = None, ssm_dtype = None))]
#[allow(clippy::too_many_arguments)]
fn mamba1_layout(
    py: Python<'_>,
    intermediate_size: u64,
    state_size: u64,
    conv_kernel: u64,
    tp_size: u64,
    num_spec: u32,
    conv_layout: &str,
    dtype: Option<&Bound<'_, PyAny>>,
    ssm_dtype: Option<&Bound<'_, PyAny>>,
) -> PyResult<Layout> {
    let (dt, sdt) = dtypes(py, dtype, ssm_dtype, "bfloat16");
    let c = common(py, tp_size, num_spec, conv_layout, &dt, &sdt)?;
    wrap(py, families::mamba1(intermediate_size, state_size, conv_kernel, &c))
}

/// Mamba2 layout: conv window + temporal state (+ the three ReplaySSM rings as workspace).
#[pyfunction]
#[pyo3(signature = (*, intermediate_size, n_groups, num_heads, head_dim, state_size, conv_kernel,
    tp_size = 1, num_spec = 0, conv_layout = "SD", dtype = None, ssm_dtype = None, logical_window = None,
    mamba_backend = "triton"))]
#[allow(clippy::too_many_arguments)]
fn mamba2_layout(
    py: Python<'_>,
    intermediate_size: u64,
    n_groups: u64,
    num_heads: u64,
    head_dim: u64,
    state_size: u64,
    conv_kernel: u64,
    tp_size: u64,
    num_spec: u32,
    conv_layout: &str,
    dtype: Option<&Bound<'_, PyAny>>,
    ssm_dtype: Option<&Bound<'_, PyAny>>,
    logical_window: Option<u64>,
    mamba_backend: &str,
) -> PyResult<Layout> {
    let (dt, sdt) = dtypes(py, dtype, ssm_dtype, "bfloat16");
    let c = common(py, tp_size, num_spec, conv_layout, &dt, &sdt)?;
    let mamba_backend = families::MambaBackend::parse(mamba_backend).py_err(py)?;
    let p = families::Mamba2 { intermediate_size, n_groups, num_heads, head_dim, state_size, conv_kernel, logical_window, mamba_backend };
    wrap(py, families::mamba2(&p, &c))
}

/// Short-conv layout: one conv window.
#[pyfunction]
#[pyo3(signature = (*, intermediate_size, conv_kernel, tp_size = 1, num_spec = 0, conv_layout = "SD", dtype = None))]
fn short_conv_layout(
    py: Python<'_>,
    intermediate_size: u64,
    conv_kernel: u64,
    tp_size: u64,
    num_spec: u32,
    conv_layout: &str,
    dtype: Option<&Bound<'_, PyAny>>,
) -> PyResult<Layout> {
    let (dt, sdt) = dtypes(py, dtype, None, "bfloat16");
    let c = common(py, tp_size, num_spec, conv_layout, &dt, &sdt)?;
    wrap(py, families::short_conv(intermediate_size, conv_kernel, &c))
}

/// Linear-attention layout: one temporal state.
#[pyfunction]
#[pyo3(signature = (*, num_heads, head_dim, tp_size = 1, num_spec = 0, ssm_dtype = None))]
fn linear_attention_layout(
    py: Python<'_>,
    num_heads: u64,
    head_dim: u64,
    tp_size: u64,
    num_spec: u32,
    ssm_dtype: Option<&Bound<'_, PyAny>>,
) -> PyResult<Layout> {
    let (dt, sdt) = dtypes(py, None, ssm_dtype, "float32");
    let c = common(py, tp_size, num_spec, "SD", &dt, &sdt)?;
    wrap(py, families::linear_attention(num_heads, head_dim, &c))
}

/// Gated DeltaNet layout: conv window + temporal state (+ RecoverSSM verify records).
#[pyfunction]
#[pyo3(signature = (*, num_k_heads, num_v_heads, head_k_dim, head_v_dim, conv_kernel_size, tp_size = 1,
    num_spec = 0, conv_layout = "SD", dtype = None, ssm_dtype = None, recover_ssm = false))]
#[allow(clippy::too_many_arguments)]
fn gdn_layout(
    py: Python<'_>,
    num_k_heads: u64,
    num_v_heads: u64,
    head_k_dim: u64,
    head_v_dim: u64,
    conv_kernel_size: u64,
    tp_size: u64,
    num_spec: u32,
    conv_layout: &str,
    dtype: Option<&Bound<'_, PyAny>>,
    ssm_dtype: Option<&Bound<'_, PyAny>>,
    recover_ssm: bool,
) -> PyResult<Layout> {
    let (dt, sdt) = dtypes(py, dtype, ssm_dtype, "bfloat16");
    let c = common(py, tp_size, num_spec, conv_layout, &dt, &sdt)?;
    let p = families::Gdn { num_k_heads, num_v_heads, head_k_dim, head_v_dim, conv_kernel_size, recover_ssm };
    wrap(py, families::gdn(&p, &c))
}

/// Kimi Delta Attention layout: conv window + recurrent state (+ RecoverSSM verify records).
#[pyfunction]
#[pyo3(signature = (*, num_heads, head_dim, num_k_heads = None, head_k_dim = None, conv_kernel_size = 4,
    tp_size = 1, num_spec = 0, conv_layout = "SD", dtype = None, ssm_dtype = None, recover_ssm = false))]
#[allow(clippy::too_many_arguments)]
fn kda_layout(
    py: Python<'_>,
    num_heads: u64,
    head_dim: u64,
    num_k_heads: Option<u64>,
    head_k_dim: Option<u64>,
    conv_kernel_size: u64,
    tp_size: u64,
    num_spec: u32,
    conv_layout: &str,
    dtype: Option<&Bound<'_, PyAny>>,
    ssm_dtype: Option<&Bound<'_, PyAny>>,
    recover_ssm: bool,
) -> PyResult<Layout> {
    let (dt, sdt) = dtypes(py, dtype, ssm_dtype, "float32");
    let c = common(py, tp_size, num_spec, conv_layout, &dt, &sdt)?;
    let p = families::Kda {
        num_heads,
        head_dim,
        num_k_heads: num_k_heads.unwrap_or(num_heads),
        head_k_dim: head_k_dim.unwrap_or(head_dim),
        conv_kernel_size,
        recover_ssm,
    };
    wrap(py, families::kda(&p, &c))
}

/// Defaults: conv / model dtype bfloat16; the SSM dtype defaults to `ssm_default`.
fn dtypes<'py>(
    py: Python<'py>,
    dtype: Option<&Bound<'py, PyAny>>,
    ssm_dtype: Option<&Bound<'py, PyAny>>,
    ssm_default: &str,
) -> (Bound<'py, PyAny>, Bound<'py, PyAny>) {
    let d = dtype.cloned().unwrap_or_else(|| pyo3::types::PyString::new(py, "bfloat16").into_any());
    let s = ssm_dtype.cloned().unwrap_or_else(|| pyo3::types::PyString::new(py, ssm_default).into_any());
    (d, s)
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<StateSpec>()?;
    m.add_class::<Layout>()?;
    m.add_function(wrap_pyfunction!(_validate_copy_funcs, m)?)?;
    m.add_function(wrap_pyfunction!(mamba1_layout, m)?)?;
    m.add_function(wrap_pyfunction!(mamba2_layout, m)?)?;
    m.add_function(wrap_pyfunction!(short_conv_layout, m)?)?;
    m.add_function(wrap_pyfunction!(linear_attention_layout, m)?)?;
    m.add_function(wrap_pyfunction!(gdn_layout, m)?)?;
    m.add_function(wrap_pyfunction!(kda_layout, m)?)?;
    Ok(())
}
