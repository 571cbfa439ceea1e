//! Binding of the Kimi-K3 RecoverSSM commit over vLLM's own tensors (`crate::commit::kimi_k3`):
//! the KDA layers' tensors checked once, then each step's metadata planned.

use super::conversion::{arg_error, items, type_name, Arg, Ints, Table, Tensor};
use crate::commit::kimi_k3::{kimi_k3_geometry, kimi_k3_lower_bound, plan_kimi_k3_commit, KimiK3Align, KimiK3Geometry, KimiK3Layer, KimiK3Step};
use crate::error::{Error, ErrorKind};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyString};

/// The columns of a commit plan: per row that writes, its records' row, request, source block,
/// tokens folded, destination block, boundary block (0: none) and the tokens before the boundary.
type PlanColumns = (Vec<i64>, Vec<i64>, Vec<i64>, Vec<i64>, Vec<i64>, Vec<i64>, Vec<i64>);

/// The KDA layers of one Kimi-K3 model (each layer's dim-first conv state, recurrent state,
/// verify records and gate parameters), checked once; [`Self::plan`] plans one step's commit.
#[pyclass(module = "recoverssm_rs._core", frozen)]
pub struct KimiK3CommitPlanner {
    geo: KimiK3Geometry,
    lower_bound: Option<f64>,
}

fn tensors(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<Tensor>> {
    Vec::<Tensor>::arg(obj, name, ErrorKind::Binding)
}

/// Per layer, the gate's lower bound: a real number or `None` (a bool or a string is refused, not
/// read as a number).
fn lower_bounds(obj: &Bound<'_, PyAny>) -> PyResult<Vec<Option<f64>>> {
    let name = "gate_lower_bound";
    items(obj, name, ErrorKind::Binding, "floats or None (one per layer)")?
        .iter()
        .enumerate()
        .map(|(l, x)| {
            if x.is_none() {
                return Ok(None);
            }
            let refused = || arg_error(ErrorKind::Binding, format!("{name}[{l}] must be a real number or None, got {}", type_name(x)));
            if x.is_instance_of::<PyBool>() || x.is_instance_of::<PyString>() {
                return Err(refused());
            }
            x.extract::<f64>().map(Some).map_err(|_| refused())
        })
        .collect()
}

#[pymethods]
impl KimiK3CommitPlanner {
    #[new]
    #[pyo3(signature = (
        *,
        conv: "Sequence[_Tensor]",
        state: "Sequence[_Tensor]",
        correction: "Sequence[_Tensor]",
        key_gate: "Sequence[_Tensor]",
        a_log: "Sequence[_Tensor]",
        dt_bias: "Sequence[_Tensor]",
        gate_lower_bound: "Sequence[float | None]",
        spec_query_len: "int",
    ) -> "KimiK3CommitPlanner")]
    #[allow(clippy::too_many_arguments)]
    fn new(
        conv: &Bound<'_, PyAny>,
        state: &Bound<'_, PyAny>,
        correction: &Bound<'_, PyAny>,
        key_gate: &Bound<'_, PyAny>,
        a_log: &Bound<'_, PyAny>,
        dt_bias: &Bound<'_, PyAny>,
        gate_lower_bound: &Bound<'_, PyAny>,
        spec_query_len: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let gate_lower_bound = lower_bounds(gate_lower_bound)?;
        let spec_query_len = i64::arg(spec_query_len, "spec_query_len", ErrorKind::Binding)?;
        let lists = [
            tensors(conv, "conv")?,
            tensors(state, "state")?,
            tensors(correction, "correction")?,
            tensors(key_gate, "key_gate")?,
            tensors(a_log, "A_log")?,
            tensors(dt_bias, "dt_bias")?,
        ];
        let n = lists[1].len();
        if let Some(i) = lists.iter().position(|l| l.len() != n) {
            let names = ["conv", "state", "correction", "key_gate", "A_log", "dt_bias"];
            return Err(Error::binding(format!("{}: {} tensors for {n} layers (one per layer in every list)", names[i], lists[i].len())).into());
        }
        let layers: Vec<KimiK3Layer<'_>> = (0..n)
            .map(|l| KimiK3Layer {
                conv: &lists[0][l].0,
                state: &lists[1][l].0,
                correction: &lists[2][l].0,
                key_gate: &lists[3][l].0,
                a_log: &lists[4][l].0,
                dt_bias: &lists[5][l].0,
            })
            .collect();
        if gate_lower_bound.len() != n {
            return Err(Error::binding(format!("gate_lower_bound: {} values for {n} layers", gate_lower_bound.len())).into());
        }
        let lower_bound = kimi_k3_lower_bound(&gate_lower_bound)?;
        Ok(KimiK3CommitPlanner { geo: kimi_k3_geometry(&layers, spec_query_len)?, lower_bound })
    }

    #[getter]
    fn num_layers(&self) -> usize {
        self.geo.layers
    }
    #[getter]
    fn num_blocks(&self) -> u64 {
        self.geo.num_blocks
    }
    #[getter]
    fn max_num_reqs(&self) -> u64 {
        self.geo.record_rows
    }
    #[getter]
    fn spec_query_len(&self) -> u64 {
        self.geo.window
    }
    /// The gate's lower bound (`None`: the softplus gate).
    #[getter]
    fn gate_lower_bound(&self) -> Option<f64> {
        self.lower_bound
    }
    #[getter]
    fn conv_history_len(&self) -> u64 {
        self.geo.conv_history
    }

    /// One step's plan (the rows that write), every input checked: a `PlanError` naming the row,
    /// its request and the value otherwise. Align mode takes `block_table`, `num_computed_tokens`
    /// and `block_size` together.
    #[pyo3(signature = (
        num_accepted_tokens: "_IntArray",
        state_indices: "_IntArray",
        query_start_loc: "_IntArray",
        request_indices: "_IntArray | None" = None,
        block_table: "_IntArray | None" = None,
        num_computed_tokens: "_IntArray | None" = None,
        block_size: "int | None" = None,
    ) -> "tuple[list[int], list[int], list[int], list[int], list[int], list[int], list[int]]")]
    #[allow(clippy::too_many_arguments)]
    fn plan(
        &self,
        py: Python<'_>,
        num_accepted_tokens: &Bound<'_, PyAny>,
        state_indices: &Bound<'_, PyAny>,
        query_start_loc: &Bound<'_, PyAny>,
        request_indices: Option<&Bound<'_, PyAny>>,
        block_table: Option<&Bound<'_, PyAny>>,
        num_computed_tokens: Option<&Bound<'_, PyAny>>,
        block_size: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PlanColumns> {
        let block_size = block_size.map(|o| Option::<i64>::arg(o, "block_size", ErrorKind::Plan)).transpose()?.flatten();
        let ints = |o: &Bound<'_, PyAny>, name: &str| Ints::arg(o, name, ErrorKind::Plan).map(|i| i.0);
        let na = ints(num_accepted_tokens, "num_accepted_tokens")?;
        let si = ints(state_indices, "state_indices")?;
        let qsl = ints(query_start_loc, "query_start_loc")?;
        let ri = request_indices.map(|o| ints(o, "request_indices")).transpose()?;
        let table = block_table.map(|o| Table::arg(o, "block_table", ErrorKind::Plan)).transpose()?;
        let computed = num_computed_tokens.map(|o| ints(o, "num_computed_tokens")).transpose()?;
        let align = match (&table, &computed, block_size) {
            (None, None, None) => None,
            (Some(t), Some(c), Some(bs)) => Some(KimiK3Align { block_table: &t.ids, cols: t.cols, num_computed: c, block_size: bs }),
            _ => {
                return Err(Error::plan("Kimi-K3 commit: align mode needs block_table, num_computed_tokens and block_size together").into());
            }
        };
        let step = KimiK3Step { num_accepted: &na, state_indices: &si, query_start_loc: &qsl, request_indices: ri.as_deref(), align };
        let rows = py.detach(|| plan_kimi_k3_commit(&step, &self.geo))?;
        let col = |f: fn(&crate::commit::kimi_k3::KimiK3Row) -> i64| rows.iter().map(f).collect::<Vec<i64>>();
        Ok((col(|r| r.row), col(|r| r.request), col(|r| r.source), col(|r| r.count), col(|r| r.dest), col(|r| r.boundary), col(|r| r.boundary_len)))
    }

    fn __repr__(&self) -> String {
        let g = &self.geo;
        format!(
            "KimiK3CommitPlanner(layers={}, blocks={}, heads={}, V={}, K={}, Q={}, max_num_reqs={})",
            g.layers, g.num_blocks, g.heads, g.head_v_dim, g.head_k_dim, g.window, g.record_rows
        )
    }
}
