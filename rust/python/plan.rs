//! Bindings for state binding, copy plans, tiles and the host executor. Plans are built and
//! executed with the GIL released; their records are exposed as read-only buffers (zero-copy
//! numpy views, see `recoverssm_rs/planner.py`).

use super::buffer::RawBuffer;
use super::layout::{dtype_name, Layout};
use super::{to_py, IntoPyResult};
use crate::binding::{Binding, TensorDesc};
use crate::dtype::DType;
use crate::error::Error;
use crate::executor;
use crate::plan::{tiles, AlignStep, CopyPlan, Planner as CorePlanner};
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use std::sync::Arc;

/// The core planner bound to state tensors, keeping the tensors alive.
#[pyclass(module = "recoverssm_rs._core", frozen)]
pub struct Planner {
    inner: Arc<CorePlanner>,
    /// The caller's state tensors: referenced for as long as any plan may copy into them.
    _keepalive: Py<PyAny>,
}

/// Whether a buffer's struct format names a non-native (big-endian) byte order.
fn foreign_order<T: pyo3::buffer::Element>(b: &PyBuffer<T>) -> bool {
    let f = b.format().to_bytes();
    cfg!(target_endian = "little") && matches!(f.first(), Some(b'>') | Some(b'!'))
}

pub(super) fn int_array(py: Python<'_>, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<(Vec<i64>, Vec<usize>)> {
    let foreign = || to_py(py, Error::plan(format!("{what} must be in native byte order, got a byte-swapped array")));
    if let Ok(b) = PyBuffer::<i64>::get(obj) {
        if foreign_order(&b) {
            return Err(foreign());
        }
        return Ok((b.to_vec(py)?, b.shape().to_vec()));
    }
    if let Ok(b) = PyBuffer::<i32>::get(obj) {
        if foreign_order(&b) {
            return Err(foreign());
        }
        let v: Vec<i32> = b.to_vec(py)?;
        return Ok((v.into_iter().map(i64::from).collect(), b.shape().to_vec()));
    }
    Err(to_py(py, Error::plan(format!("{what} must be an int32 or int64 array (numpy array or CPU tensor), got {}", obj.get_type().name()?))))
}

/// A 1-D integer vector (one entry per request).
pub(super) fn int_vector(py: Python<'_>, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<i64>> {
    let (v, shape) = int_array(py, obj, what)?;
    if shape.len() != 1 {
        return Err(to_py(py, Error::plan(format!("{what} must be 1-D (one entry per request), got shape {shape:?}"))));
    }
    Ok(v)
}

/// `(data_ptr, dtype, shape, byte_strides, device, writable, requires_grad)` of one tensor, as
/// `tensors.describe_tensor` gives it.
pub(super) type DescTuple<'py> = (u64, Bound<'py, PyAny>, Vec<i64>, Vec<i64>, String, bool, bool);

/// A [`TensorDesc`] from its Python tuple; an unknown dtype is a binding error naming `what()`.
pub(super) fn tensor_desc(py: Python<'_>, t: &DescTuple<'_>, what: impl Fn() -> String) -> PyResult<TensorDesc> {
    let (ptr, dtype, shape, strides, device, writable, requires_grad) = t;
    crate::binding::check_not_tracked(*requires_grad, &what()).py_err(py)?;
    let dtype = DType::parse(&dtype_name(dtype)?).map_err(|e| to_py(py, Error::binding(format!("{}: {}", what(), e.message))))?;
    Ok(TensorDesc { data_ptr: *ptr, dtype, shape: shape.clone(), strides: strides.clone(), device: device.clone(), writable: *writable })
}

#[pymethods]
impl Planner {
    /// `states[layer]` holds `(data_ptr, dtype, shape, byte_strides, device, writable, requires_grad)` per state tensor;
    /// `keepalive` is the object owning those tensors.
    #[new]
    #[allow(clippy::type_complexity)]
    fn new(py: Python<'_>, layout: PyRef<'_, Layout>, states: Vec<Vec<DescTuple<'_>>>, keepalive: Py<PyAny>) -> PyResult<Self> {
        let mut descs = Vec::with_capacity(states.len());
        let core = layout.core();
        for (li, layer) in states.iter().enumerate() {
            let mut l = Vec::with_capacity(layer.len());
            for (si, t) in layer.iter().enumerate() {
                l.push(tensor_desc(py, t, || {
                    let name = core.states().get(si).map(|s| s.name.as_str()).unwrap_or("?");
                    format!("{}: layer {li}, state {si} ('{name}')", core.backend())
                })?);
            }
            descs.push(l);
        }
        let binding = Binding::new(layout.core(), &descs).py_err(py)?;
        Ok(Planner { inner: Arc::new(CorePlanner::new(binding)), _keepalive: keepalive })
    }

    #[getter]
    fn num_layers(&self) -> usize {
        self.inner.binding().num_layers()
    }
    #[getter]
    fn num_blocks(&self) -> u64 {
        self.inner.binding().num_blocks()
    }
    #[getter]
    fn device(&self) -> String {
        self.inner.binding().device().to_string()
    }
    #[getter]
    fn layout(&self) -> Layout {
        Layout { inner: self.inner.binding().layout().clone() }
    }

    /// Plans an align-mode step. Inputs: `block_table` `[R, cols]`, `src_col`, `dst_col`,
    /// `num_accepted` `[R]` (int32 or int64).
    fn plan_align(
        slf: Bound<'_, Self>,
        block_table: &Bound<'_, PyAny>,
        src_col: &Bound<'_, PyAny>,
        dst_col: &Bound<'_, PyAny>,
        num_accepted: &Bound<'_, PyAny>,
    ) -> PyResult<Plan> {
        let py = slf.py();
        let (bt, shape) = int_array(py, block_table, "block_table")?;
        let sc = int_vector(py, src_col, "src_col")?;
        let dc = int_vector(py, dst_col, "dst_col")?;
        let na = int_vector(py, num_accepted, "num_accepted")?;
        let cols = match shape.as_slice() {
            [_, c] => *c,
            _ => return Err(to_py(py, Error::plan(format!("block_table must be 2-D [requests, cols], got shape {shape:?}")))),
        };
        let planner = Arc::clone(&slf.get().inner);
        let plan = py.detach(move || planner.plan_align(&AlignStep { block_table: &bt, cols, src_col: &sc, dst_col: &dc, num_accepted: &na }));
        Ok(Plan { inner: Arc::new(plan.py_err(py)?), planner: slf.unbind() })
    }

    /// Plans whole-block copies `dst_blocks[i] <- src_blocks[i]` of every persistent state.
    fn plan_copy(slf: Bound<'_, Self>, src_blocks: &Bound<'_, PyAny>, dst_blocks: &Bound<'_, PyAny>) -> PyResult<Plan> {
        let py = slf.py();
        let s = int_vector(py, src_blocks, "src_blocks")?;
        let d = int_vector(py, dst_blocks, "dst_blocks")?;
        let planner = Arc::clone(&slf.get().inner);
        let plan = py.detach(move || planner.plan_copy(&s, &d));
        Ok(Plan { inner: Arc::new(plan.py_err(py)?), planner: slf.unbind() })
    }

    /// The per-(layer, persistent state) metadata table of the fused device kernel.
    fn state_meta(&self) -> RawBuffer {
        RawBuffer::state_meta(self.inner.state_meta())
    }
}

/// One step's plan. Holds its planner, and so the state tensors, alive.
#[pyclass(module = "recoverssm_rs._core", frozen)]
pub struct Plan {
    inner: Arc<CopyPlan>,
    planner: Py<Planner>,
}

#[pymethods]
impl Plan {
    /// Segment records (32 bytes each) as a read-only buffer.
    fn segments(&self) -> RawBuffer {
        RawBuffer::segments(Arc::clone(&self.inner))
    }
    /// Compact per-request records (40 bytes each).
    fn rows(&self) -> RawBuffer {
        RawBuffer::rows(Arc::clone(&self.inner))
    }
    /// Segment index where each wave starts, plus the total (`num_waves + 1` u32 values).
    fn wave_starts(&self) -> RawBuffer {
        RawBuffer::u32s(self.inner.wave_starts().to_vec())
    }
    /// Tiles of about `tile_bytes` bytes and where each wave's tiles start.
    #[pyo3(signature = (tile_bytes = tiles::DEFAULT_TILE_BYTES))]
    fn tiles(&self, py: Python<'_>, tile_bytes: u32) -> PyResult<(RawBuffer, RawBuffer)> {
        let plan = Arc::clone(&self.inner);
        let t = py.detach(move || tiles::cut(&plan, tile_bytes)).py_err(py)?;
        Ok((RawBuffer::tiles(t.tiles), RawBuffer::u32s(t.wave_starts)))
    }
    #[getter]
    fn num_waves(&self) -> usize {
        self.inner.num_waves()
    }
    #[getter]
    fn num_segments(&self) -> usize {
        self.inner.segments().len()
    }
    #[getter]
    fn num_copies(&self) -> u64 {
        self.inner.num_copies()
    }
    #[getter]
    fn num_requests(&self) -> usize {
        self.inner.rows().len()
    }
    #[getter]
    fn nbytes(&self) -> u64 {
        self.inner.bytes()
    }
    #[getter]
    fn planner(&self, py: Python<'_>) -> Py<Planner> {
        self.planner.clone_ref(py)
    }
    /// Runs the plan over CPU tensors with the host executor (GIL released). Checks every segment
    /// against the bound tensors first: either all of it runs or nothing does.
    fn execute_host(&self, py: Python<'_>) -> PyResult<()> {
        let plan = Arc::clone(&self.inner);
        py.detach(move || executor::execute(&plan)).py_err(py)
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Planner>()?;
    m.add_class::<Plan>()?;
    Ok(())
}
