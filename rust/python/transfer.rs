//! Bindings for the transfer core: layout fingerprints, the compatibility check and transfer
//! plans (returned as packed little-endian u64 rows for numpy).

use super::layout::Layout;
use crate::transfer::{self, Fingerprint, PoolGeometry, StateKind};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// What one rank's pool holds, as a transfer sees it: family, model dims, persistent-state
/// dtypes and conv geometry, TP size and rank, block size. Exchanged at handshake in its text
/// form (`encode` / `decode`).
#[pyclass(module = "recoverssm_rs", frozen, eq, skip_from_py_object)]
#[derive(Clone, PartialEq)]
pub struct LayoutFingerprint {
    inner: Fingerprint,
}

#[pymethods]
impl LayoutFingerprint {
    #[new]
    #[pyo3(signature = (layout, *, tp_rank = 0, block_size = 0))]
    fn new(layout: PyRef<'_, Layout>, tp_rank: u64, block_size: u64) -> PyResult<Self> {
        Ok(Self { inner: Fingerprint::new(layout.core(), tp_rank, block_size)? })
    }
    /// Parses the text form of `encode`.
    #[staticmethod]
    fn decode(text: &str) -> PyResult<Self> {
        Ok(Self { inner: Fingerprint::decode(text)? })
    }
    fn encode(&self) -> String {
        self.inner.encode()
    }
    #[getter]
    fn family(&self) -> &str {
        &self.inner.family
    }
    #[getter]
    fn tp_size(&self) -> u64 {
        self.inner.tp_size
    }
    #[getter]
    fn tp_rank(&self) -> u64 {
        self.inner.tp_rank
    }
    #[getter]
    fn num_spec(&self) -> u32 {
        self.inner.num_spec
    }
    #[getter]
    fn block_size(&self) -> u64 {
        self.inner.block_size
    }
    #[getter]
    fn conv_layout(&self) -> Option<&'static str> {
        self.inner.conv_layout().map(|l| l.name())
    }
    #[getter]
    fn conv_kernel_size(&self) -> Option<u64> {
        self.inner.conv_kernel_size()
    }
    /// Names of the persistent states, in order.
    #[getter]
    fn state_names(&self) -> Vec<String> {
        self.inner.states.iter().map(|s| s.name.clone()).collect()
    }
    /// Bytes of each persistent state in one block.
    #[getter]
    fn state_nbytes(&self) -> Vec<u64> {
        self.inner.states.iter().map(|s| s.nbytes()).collect()
    }
    /// `(layout, width, dim)` of each conv state, None for head-sliced states.
    #[getter]
    fn conv_geometry(&self) -> Vec<Option<(&'static str, u64, u64)>> {
        self.inner
            .states
            .iter()
            .map(|s| match s.kind {
                StateKind::Conv { layout, width, dim, .. } => Some((layout.name(), width, dim)),
                StateKind::Heads { .. } => None,
            })
            .collect()
    }
    /// This fingerprint with another TP rank (the same pool layout on a sibling rank).
    fn with_rank(&self, tp_rank: u64) -> PyResult<Self> {
        let mut inner = self.inner.clone();
        inner.tp_rank = tp_rank;
        inner.check()?;
        Ok(Self { inner })
    }
    /// Raises LayoutError, naming every incompatible state with both values, unless states can
    /// move from this (source) rank to `destination`.
    fn check_compatible(&self, destination: PyRef<'_, Self>) -> PyResult<()> {
        Ok(transfer::check_compatible(&self.inner, &destination.inner)?)
    }
    fn __repr__(&self) -> String {
        format!(
            "LayoutFingerprint(family='{}', tp={}/{}, num_spec={}, conv_layout={}, block_size={}, states=[{}])",
            self.inner.family,
            self.inner.tp_rank,
            self.inner.tp_size,
            self.inner.num_spec,
            self.inner.conv_layout().map(|l| format!("'{}'", l.name())).unwrap_or_else(|| "None".into()),
            self.inner.block_size,
            self.state_names().join(", ")
        )
    }
}

/// The reads (and staged local copies) that move a batch of requests' persistent states to one
/// destination rank.
#[pyclass(module = "recoverssm_rs", frozen)]
pub struct TransferPlan {
    inner: transfer::TransferPlan,
}

/// Plan rows made only of u64 fields under `#[repr(C)]`: no padding, every byte initialised.
trait U64Rows: Copy {}
impl U64Rows for transfer::Read {}
impl U64Rows for transfer::StagedCopy {}

fn packed<'py, T: U64Rows>(py: Python<'py>, v: &[T]) -> Bound<'py, PyBytes> {
    // SAFETY: T is one of the U64Rows types above (#[repr(C)], u64 fields only: no padding, every
    // byte initialised); the slice is live for the duration of the copy.
    let bytes = unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) };
    PyBytes::new(py, bytes)
}

#[pymethods]
impl TransferPlan {
    /// Reads as packed u64 rows `(request, src_rank, src_tensor, src_offset, dst_tensor,
    /// dst_offset, len)`; `dst_tensor == 2**64 - 1` is the staging buffer.
    fn reads<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        packed(py, &self.inner.reads)
    }
    /// Staged copies as packed u64 rows `(request, src_offset, src_row_stride, src_col_stride,
    /// dst_tensor, dst_offset, dst_row_stride, dst_col_stride, rows, cols, elem)`.
    fn staged<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        packed(py, &self.inner.staged)
    }
    #[getter]
    fn num_reads(&self) -> usize {
        self.inner.reads.len()
    }
    #[getter]
    fn num_staged(&self) -> usize {
        self.inner.staged.len()
    }
    #[getter]
    fn num_requests(&self) -> u64 {
        self.inner.num_requests
    }
    #[getter]
    fn staging_bytes(&self) -> u64 {
        self.inner.staging_bytes
    }
    /// Bytes read over the transport.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.inner.bytes()
    }
    #[getter]
    fn source_ranks(&self) -> Vec<u64> {
        self.inner.source_ranks.clone()
    }
    fn __repr__(&self) -> String {
        format!(
            "TransferPlan(requests={}, reads={}, staged={}, bytes={}, staging_bytes={}, source_ranks={:?})",
            self.inner.num_requests,
            self.inner.reads.len(),
            self.inner.staged.len(),
            self.inner.bytes(),
            self.inner.staging_bytes,
            self.inner.source_ranks
        )
    }
}

/// `(num_layers, num_blocks, block_strides)` of one pool.
type GeometryTuple = (u64, u64, Vec<u64>);

fn geometry((num_layers, num_blocks, block_strides): GeometryTuple) -> PoolGeometry {
    PoolGeometry { num_layers, num_blocks, block_strides }
}

/// Plans moving `requests` (source block, destination block) from the source instance (`source`:
/// any of its ranks) to the destination rank `destination`. `source_pools`: one geometry
/// `(num_layers, num_blocks, block_strides)` shared by every source rank, or one per rank.
#[pyfunction]
fn plan_transfer(
    py: Python<'_>,
    source: PyRef<'_, LayoutFingerprint>,
    source_pools: Vec<GeometryTuple>,
    destination: PyRef<'_, LayoutFingerprint>,
    destination_pool: GeometryTuple,
    requests: Vec<(u64, u64)>,
) -> PyResult<TransferPlan> {
    let (s, d) = (source.inner.clone(), destination.inner.clone());
    let sp: Vec<PoolGeometry> = source_pools.into_iter().map(geometry).collect();
    let dp = geometry(destination_pool);
    let plan = py.detach(move || transfer::plan_transfer(&s, &sp, &d, &dp, &requests))?;
    Ok(TransferPlan { inner: plan })
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<LayoutFingerprint>()?;
    m.add_class::<TransferPlan>()?;
    m.add_function(wrap_pyfunction!(plan_transfer, m)?)?;
    Ok(())
}
