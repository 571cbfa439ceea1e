//! `CopyPlan`: one step's validated copies over every group of a planner, its records as read-only
//! buffers (zero-copy numpy views), and the host executor (GIL released, the planner's guard
//! checked first).

use super::buffer::{RawBuffer, Rows, Segments};
use super::planner::Planner;
use crate::executor;
use crate::plan::{tiles, CopyPlan as CorePlan};
use pyo3::prelude::*;
use std::sync::Arc;

/// One step's plan. Holds its planner, and so the state tensors, alive.
#[pyclass(module = "recoverssm_rs._core", frozen)]
pub struct CopyPlan {
    inner: Arc<CorePlan>,
    planner: Py<Planner>,
    /// Ordered waves (group 0's first).
    #[pyo3(get)]
    num_waves: usize,
    #[pyo3(get)]
    num_segments: usize,
    /// (group, layer, state, request) copies planned, before coalescing.
    #[pyo3(get)]
    num_copies: u64,
    /// Requests (per group) that move something.
    #[pyo3(get)]
    num_requests: usize,
    /// Bytes the plan moves.
    #[pyo3(get)]
    nbytes: u64,
}

impl CopyPlan {
    pub(crate) fn new(plan: CorePlan, planner: Py<Planner>) -> CopyPlan {
        CopyPlan {
            num_waves: plan.num_waves(),
            num_segments: plan.segments().len(),
            num_copies: plan.num_copies(),
            num_requests: plan.rows().len(),
            nbytes: plan.bytes(),
            inner: Arc::new(plan),
            planner,
        }
    }
}

#[pymethods]
impl CopyPlan {
    /// Segment records (32 bytes each), wave by wave.
    fn segments(&self) -> RawBuffer {
        RawBuffer::new(Segments(Arc::clone(&self.inner)))
    }
    /// Compact per-request records (40 bytes each), by group, then request.
    fn rows(&self) -> RawBuffer {
        RawBuffer::new(Rows(Arc::clone(&self.inner)))
    }
    /// Segment index where each wave starts, plus the total (`num_waves + 1` u32 values).
    fn wave_starts(&self) -> RawBuffer {
        RawBuffer::new(self.inner.wave_starts().to_vec())
    }
    /// Tiles of about `tile_bytes` bytes and where each wave's tiles start.
    #[pyo3(signature = (tile_bytes: "int" = tiles::DEFAULT_TILE_BYTES) -> "tuple[RawBuffer, RawBuffer]")]
    fn tiles(&self, py: Python<'_>, #[pyo3(from_py_with = tile_bytes_arg)] tile_bytes: u32) -> PyResult<(RawBuffer, RawBuffer)> {
        let plan = Arc::clone(&self.inner);
        let t = py.detach(move || tiles::cut(&plan, tile_bytes))?;
        Ok((RawBuffer::new(t.tiles), RawBuffer::new(t.wave_starts)))
    }
    /// Per group: `(copies, segments, waves, bytes)`.
    fn group_stats(&self) -> Vec<(u64, usize, usize, u64)> {
        self.inner.group_stats().iter().map(|s| (s.copies, s.segments, s.waves, s.bytes)).collect()
    }
    #[getter]
    fn planner(&self, py: Python<'_>) -> Py<Planner> {
        self.planner.clone_ref(py)
    }
    /// Runs the plan over CPU tensors with the host executor (GIL released). The planner's guard
    /// and every segment are checked first: either all of it runs or nothing does.
    fn execute_host(&self, py: Python<'_>) -> PyResult<()> {
        let plan = Arc::clone(&self.inner);
        self.planner.get().write(py, || Ok(py.detach(move || executor::execute(&plan))?))
    }
    fn __len__(&self) -> usize {
        self.inner.num_copies() as usize
    }
    fn __repr__(&self) -> String {
        let p = &self.inner;
        format!(
            "CopyPlan(copies={}, segments={}, requests={}, waves={}, bytes={})",
            p.num_copies(),
            p.segments().len(),
            p.rows().len(),
            p.num_waves(),
            p.bytes()
        )
    }
}

/// `tile_bytes` of [`CopyPlan::tiles`]: a host integer that fits in `u32` (a `PlanError` naming it).
fn tile_bytes_arg(obj: &Bound<'_, PyAny>) -> PyResult<u32> {
    super::conversion::Arg::arg(obj, "tile_bytes", crate::error::ErrorKind::Plan)
}
