//! Bindings for RecoverSSM commit planning (`crate::commit`): the commit planner of a layout and
//! pool, and the commit kernel's per-layer table (the tensors' descriptions in, the checked table
//! out).

use super::buffer::RawBuffer;
use super::layout::Layout;
use super::plan::{int_array, int_vector, tensor_desc, DescTuple};
use super::{to_py, IntoPyResult};
use crate::binding::TensorDesc;
use crate::commit::GateKind;
use crate::commit::{
    check_block_size, check_cache_sizes, check_index, check_state_blocks, check_workspace_rows, plan_commit, AlignInputs, CommitStep,
};
use crate::commit::{commit_meta, CommitConfig, CommitTensors};
use crate::error::Error;
use crate::layout::ConvLayout;
use pyo3::prelude::*;

/// Commit planning for one RecoverSSM layout over a pool of `num_blocks` blocks: which requests
/// fold how many verified tokens into which block and, in align mode, which prefix-cache block
/// receives the state at the crossed block boundary. Every input is checked before anything moves.
#[pyclass(module = "recoverssm_rs._core", frozen)]
pub struct CommitPlanner {
    backend: String,
    num_blocks: u64,
    /// The speculative window `Q = num_spec + 1`.
    window: u32,
}

#[pymethods]
impl CommitPlanner {
    #[new]
    fn new(py: Python<'_>, layout: PyRef<'_, Layout>, num_blocks: &Bound<'_, PyAny>) -> PyResult<Self> {
        let num_blocks = num_blocks
            .extract::<u64>()
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| to_py(py, Error::binding(format!("num_blocks must be a positive integer, got {num_blocks}"))))?;
        let core = layout.core();
        Ok(CommitPlanner { backend: core.backend().to_string(), num_blocks, window: core.num_spec() + 1 })
    }

    #[getter]
    fn num_blocks(&self) -> u64 {
        self.num_blocks
    }
    #[getter]
    fn window(&self) -> u32 {
        self.window
    }

    /// A commit plan (records of `recoverssm_rs.plan_format.COMMIT_ROW_DTYPE`): per
    /// request the tokens to fold in, its state block and, in align mode, the boundary block.
    /// `max_requests`: the workspace rows, when the caller has a workspace (B <= max_requests).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (state_blocks, num_accepted, query_lens, seq_lens = None, block_table = None, block_size = None, max_requests = None))]
    fn plan(
        &self,
        py: Python<'_>,
        state_blocks: &Bound<'_, PyAny>,
        num_accepted: &Bound<'_, PyAny>,
        query_lens: &Bound<'_, PyAny>,
        seq_lens: Option<&Bound<'_, PyAny>>,
        block_table: Option<&Bound<'_, PyAny>>,
        block_size: Option<i64>,
        max_requests: Option<u64>,
    ) -> PyResult<RawBuffer> {
        let sb = int_vector(py, state_blocks, "state_blocks")?;
        if let Some(m) = max_requests {
            check_workspace_rows(sb.len(), &self.backend, m).py_err(py)?;
        }
        let na = int_vector(py, num_accepted, "num_accepted")?;
        let ql = int_vector(py, query_lens, "query_lens")?;
        let align = match (seq_lens, block_table, block_size) {
            (None, None, None) => None,
            (Some(s), Some(b), Some(bs)) => {
                let bs = check_block_size(bs).py_err(py)?;
                let s = int_vector(py, s, "seq_lens")?;
                let (b, shape) = int_array(py, b, "block_table")?;
                let cols = match shape.as_slice() {
                    [_, c] => *c,
                    _ => return Err(to_py(py, Error::plan(format!("block_table must be 2-D [requests, cols], got shape {shape:?}")))),
                };
                Some((s, b, cols, bs))
            }
            _ => return Err(to_py(py, Error::plan("align mode needs seq_lens, block_table and block_size together; pass all three or none"))),
        };
        let step = CommitStep {
            state_blocks: &sb,
            num_accepted: &na,
            query_lens: &ql,
            align: align.as_ref().map(|(s, bt, cols, bs)| AlignInputs { seq_lens: s, block_table: bt, cols: *cols, block_size: *bs }),
        };
        let rows = py.detach(|| plan_commit(&step, &self.backend, self.num_blocks, self.window)).py_err(py)?;
        Ok(RawBuffer::commit_rows(rows))
    }

    /// Checks running-state blocks (`<= 0` padding): in range, one request per block, and at most
    /// `max_requests` requests when given (the workspace rows).
    #[pyo3(signature = (state_blocks, max_requests = None))]
    fn check_state_blocks(&self, py: Python<'_>, state_blocks: &Bound<'_, PyAny>, max_requests: Option<u64>) -> PyResult<()> {
        let sb = int_vector(py, state_blocks, "state_blocks")?;
        if let Some(m) = max_requests {
            check_workspace_rows(sb.len(), &self.backend, m).py_err(py)?;
        }
        check_state_blocks(&sb, &self.backend, self.num_blocks).py_err(py)
    }

    fn __repr__(&self) -> String {
        format!("CommitPlanner({:?}, blocks={}, window={})", self.backend, self.num_blocks, self.window)
    }
}

fn descs(py: Python<'_>, ts: &[DescTuple<'_>], name: &str) -> PyResult<Vec<TensorDesc>> {
    ts.iter().enumerate().map(|(l, t)| tensor_desc(py, t, || format!("layer {l}: {name}"))).collect()
}

/// The commit kernel's table (`CommitMeta` records, 128 bytes per layer) for per-layer tensor
/// descriptions; `conv` / `conv_window` both `None` for layers without a conv state.
#[pyfunction]
#[pyo3(signature = (recurrent, corrections, keygate, conv, conv_window, kind, conv_layout, conv_kernel_size))]
#[allow(clippy::too_many_arguments)]
fn commit_meta_table(
    py: Python<'_>,
    recurrent: Vec<DescTuple<'_>>,
    corrections: Vec<DescTuple<'_>>,
    keygate: Vec<DescTuple<'_>>,
    conv: Option<Vec<DescTuple<'_>>>,
    conv_window: Option<Vec<DescTuple<'_>>>,
    kind: &str,
    conv_layout: &str,
    conv_kernel_size: &Bound<'_, PyAny>,
) -> PyResult<RawBuffer> {
    let kind = GateKind::parse(kind).py_err(py)?;
    let conv_layout = ConvLayout::parse(conv_layout).map_err(|e| Error::binding(format!("conv_layout: {}", e.message))).py_err(py)?;
    let conv_kernel_size = conv_kernel_size
        .extract::<u64>()
        .map_err(|_| Error::binding(format!("conv_kernel_size must be in 1 ..= 65536, got {conv_kernel_size}")))
        .py_err(py)?;
    let (rec, corr, kg) = (descs(py, &recurrent, "recurrent")?, descs(py, &corrections, "corrections")?, descs(py, &keygate, "keygate")?);
    let pair = match (conv, conv_window) {
        (None, None) => None,
        (Some(c), Some(w)) => Some((descs(py, &c, "conv")?, descs(py, &w, "conv_window")?)),
        _ => return Err(Error::binding("conv and conv_window: give both or neither")).py_err(py),
    };
    let tensors = CommitTensors { recurrent: &rec, corrections: &corr, keygate: &kg, conv: pair.as_ref().map(|(c, w)| (c.as_slice(), w.as_slice())) };
    let meta = commit_meta(&tensors, &CommitConfig { kind, conv_layout, conv_kernel_size }).py_err(py)?;
    Ok(RawBuffer::commit_meta(meta))
}

/// Checks a state cache's sizes (layers, blocks, workspace rows) before anything is allocated.
#[pyfunction(name = "check_cache_sizes")]
fn check_cache_sizes_py(
    py: Python<'_>,
    num_layers: &Bound<'_, PyAny>,
    num_blocks: &Bound<'_, PyAny>,
    max_requests: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let get = |o: &Bound<'_, PyAny>, name: &str| -> PyResult<i64> {
        o.extract::<i64>().map_err(|_| to_py(py, Error::binding(format!("{name} must be an integer, got {o}"))))
    };
    check_cache_sizes(get(num_layers, "num_layers")?, get(num_blocks, "num_blocks")?, get(max_requests, "max_requests")?).py_err(py)
}

/// `index` as an index into `len` items named `what` (a `PlanError` otherwise).
#[pyfunction(name = "check_index")]
fn check_index_py(py: Python<'_>, what: &str, index: &Bound<'_, PyAny>, len: u64) -> PyResult<usize> {
    let i = index.extract::<i64>().map_err(|_| to_py(py, Error::plan(format!("{what} must be an integer, got {index}"))))?;
    check_index(what, i, len).py_err(py)
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<CommitPlanner>()?;
    m.add_function(wrap_pyfunction!(check_cache_sizes_py, m)?)?;
    m.add_function(wrap_pyfunction!(check_index_py, m)?)?;
    m.add_function(wrap_pyfunction!(commit_meta_table, m)?)?;
    Ok(())
}
