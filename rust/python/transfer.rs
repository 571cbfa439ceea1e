//! Bindings for the transfer core: layout fingerprints, handshake messages, the compatibility
//! and source-rank checks, and transfer plans (returned as packed little-endian u64 rows for
//! numpy).

use super::conversion::{Arg, Table};
use super::layout::Layout;
use crate::error::{Error, ErrorKind};
use crate::transfer::{self, saved, Fingerprint, PoolGeometry, StateKind};
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// What one rank's pool holds, as a transfer sees it: family, model dims, persistent-state
/// dtypes and conv geometry, TP size and rank, block size. Exchanged at handshake in its text
/// form (`encode` / `decode`).
#[pyclass(module = "recoverssm_rs", frozen, eq, skip_from_py_object)]
#[derive(Clone, PartialEq)]
pub struct LayoutFingerprint {
    inner: Fingerprint,
    #[pyo3(get)]
    family: String,
    #[pyo3(get)]
    tp_size: u64,
    #[pyo3(get)]
    tp_rank: u64,
    #[pyo3(get)]
    num_spec: u32,
    /// Tokens per cache block (informational).
    #[pyo3(get)]
    block_size: u64,
    /// Bytes of each persistent state in one block.
    #[pyo3(get)]
    state_nbytes: Vec<u64>,
}

impl From<Fingerprint> for LayoutFingerprint {
    fn from(inner: Fingerprint) -> Self {
        // A checked fingerprint's state sizes fit (`Fingerprint::check`).
        let state_nbytes = inner.states.iter().map(|s| s.nbytes().unwrap_or(u64::MAX)).collect();
        LayoutFingerprint {
            family: inner.family.clone(),
            tp_size: inner.tp_size,
            tp_rank: inner.tp_rank,
            num_spec: inner.num_spec,
            block_size: inner.block_size,
            state_nbytes,
            inner,
        }
    }
}

#[pymethods]
impl LayoutFingerprint {
    #[new]
    #[pyo3(signature = (layout, *, tp_rank = 0, block_size = 0))]
    fn new(layout: PyRef<'_, Layout>, tp_rank: u64, block_size: u64) -> PyResult<Self> {
        Ok(Fingerprint::new(layout.core(), tp_rank, block_size)?.into())
    }
    /// Parses the text form of `encode` (LayoutError for any defect, sizes checked for overflow).
    #[staticmethod]
    fn decode(text: &str) -> PyResult<Self> {
        Ok(Fingerprint::decode(text)?.into())
    }
    fn encode(&self) -> String {
        self.inner.encode()
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
        let inner = Fingerprint { tp_rank, ..self.inner.clone() };
        inner.check()?;
        Ok(inner.into())
    }
    /// Bytes one request's persistent states take in a pool of `num_layers` layers (what the
    /// host tier and saved states count); LayoutError on overflow.
    fn request_nbytes(&self, num_layers: u64) -> PyResult<u64> {
        Ok(transfer::cache::request_bytes(&self.inner, num_layers)?)
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
    #[pyo3(get)]
    num_reads: usize,
    #[pyo3(get)]
    num_staged: usize,
    #[pyo3(get)]
    num_requests: u64,
    /// Bytes of staging buffer the plan needs.
    #[pyo3(get)]
    staging_bytes: u64,
    /// Bytes read over the transport.
    #[pyo3(get)]
    nbytes: u64,
    /// The source ranks the destination rank reads from, ascending.
    #[pyo3(get)]
    source_ranks: Vec<u64>,
}

impl From<transfer::TransferPlan> for TransferPlan {
    fn from(inner: transfer::TransferPlan) -> Self {
        TransferPlan {
            num_reads: inner.reads.len(),
            num_staged: inner.staged.len(),
            num_requests: inner.num_requests,
            staging_bytes: inner.staging_bytes,
            nbytes: inner.bytes(),
            source_ranks: inner.source_ranks.clone(),
            inner,
        }
    }
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
    fn __repr__(&self) -> String {
        format!(
            "TransferPlan(requests={}, reads={}, staged={}, bytes={}, staging_bytes={}, source_ranks={:?})",
            self.num_requests, self.num_reads, self.num_staged, self.nbytes, self.staging_bytes, self.source_ranks
        )
    }
}

/// `(num_layers, num_blocks, block_strides)` of one pool.
type GeometryTuple = (u64, u64, Vec<u64>);

fn geometry((num_layers, num_blocks, block_strides): GeometryTuple) -> PoolGeometry {
    PoolGeometry { num_layers, num_blocks, block_strides }
}

/// The `(source block, destination block)` pairs of a batch: a `[n, 2]` table of host integers
/// (a list of pairs, a numpy array); a negative or non-integer block is a PlanError naming the
/// request.
fn block_pairs(obj: &Bound<'_, PyAny>) -> PyResult<Vec<(u64, u64)>> {
    if obj.len().ok() == Some(0) {
        return Ok(Vec::new());
    }
    let t = Table::arg(obj, "requests", ErrorKind::Plan)?;
    if t.cols != 2 {
        return Err(Error::plan(format!("requests must be (source block, destination block) pairs, got rows of {} entries", t.cols)).into());
    }
    let block = |r: usize, side: &str, b: i64| u64::try_from(b).map_err(|_| Error::plan(format!("request {r}: {side} block {b} must be >= 0")));
    Ok(t.ids
        .chunks_exact(2)
        .enumerate()
        .map(|(r, p)| Ok((block(r, "source", p[0])?, block(r, "destination", p[1])?)))
        .collect::<Result<_, Error>>()?)
}

/// Plans moving `requests` (source block, destination block) from the source instance (`source`:
/// any of its ranks) to the destination rank `destination`. `source_pools`: one geometry
/// `(num_layers, num_blocks, block_strides)` shared by every source rank, or one per rank.
#[pyfunction]
pub(crate) fn plan_transfer(
    py: Python<'_>,
    source: PyRef<'_, LayoutFingerprint>,
    source_pools: Vec<GeometryTuple>,
    destination: PyRef<'_, LayoutFingerprint>,
    destination_pool: GeometryTuple,
    requests: &Bound<'_, PyAny>,
) -> PyResult<TransferPlan> {
    let requests = block_pairs(requests)?;
    let (s, d) = (source.inner.clone(), destination.inner.clone());
    let sp: Vec<PoolGeometry> = source_pools.into_iter().map(geometry).collect();
    let dp = geometry(destination_pool);
    let plan = py.detach(move || transfer::plan_transfer(&s, &sp, &d, &dp, &requests))?;
    Ok(plan.into())
}

/// Checks the source ranks an executor was given, `(rank it is used as, its fingerprint)`: each
/// fingerprint holds that rank (BindingError for swapped shards) and all are ranks of one
/// instance (BindingError for an SD pool with a DS pool, or two TP sizes). Returns the first.
#[pyfunction]
pub(crate) fn check_sources(sources: Vec<(u64, PyRef<'_, LayoutFingerprint>)>) -> PyResult<LayoutFingerprint> {
    let v: Vec<(u64, &Fingerprint)> = sources.iter().map(|(r, f)| (*r, &f.inner)).collect();
    Ok(transfer::check_sources(&v)?.into())
}

/// One rank's handshake message: its transport agent's name and metadata, its layout
/// fingerprint, its pool geometry `(num_layers, num_blocks, block_strides)` and the address of
/// block 0 of each (layer, state) tensor. `to_bytes` / `from_bytes` give its wire form;
/// `from_bytes` checks every field (LayoutError for a malformed, truncated or overflowing message).
#[pyclass(module = "recoverssm_rs", frozen)]
pub struct PeerInfo {
    inner: transfer::PeerInfo,
    #[pyo3(get)]
    name: String,
    #[pyo3(get)]
    fingerprint: Py<LayoutFingerprint>,
    #[pyo3(get)]
    addresses: Vec<u64>,
}

impl PeerInfo {
    fn wrap(py: Python<'_>, inner: transfer::PeerInfo) -> PyResult<Self> {
        Ok(PeerInfo {
            name: inner.name.clone(),
            fingerprint: Py::new(py, LayoutFingerprint::from(inner.fingerprint.clone()))?,
            addresses: inner.addresses.clone(),
            inner,
        })
    }
}

#[pymethods]
impl PeerInfo {
    #[new]
    fn new(
        py: Python<'_>,
        name: String,
        metadata: &[u8],
        fingerprint: PyRef<'_, LayoutFingerprint>,
        geometry: GeometryTuple,
        addresses: Vec<u64>,
    ) -> PyResult<Self> {
        let inner = transfer::PeerInfo::new(name, metadata.to_vec(), fingerprint.inner.clone(), self::geometry(geometry), addresses)?;
        Self::wrap(py, inner)
    }
    /// Reads and checks a peer's message (LayoutError naming the defect).
    #[staticmethod]
    fn from_bytes(py: Python<'_>, data: &[u8]) -> PyResult<Self> {
        Self::wrap(py, transfer::PeerInfo::decode(data)?)
    }
    /// The wire form, for a pipe, a queue or a side channel.
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.encode())
    }
    /// The transport agent's metadata.
    #[getter]
    fn metadata<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.metadata)
    }
    /// `(num_layers, num_blocks, block_strides)` of the peer's pool.
    #[getter]
    fn geometry(&self) -> GeometryTuple {
        let g = &self.inner.geometry;
        (g.num_layers, g.num_blocks, g.block_strides.clone())
    }
    fn __repr__(&self) -> String {
        let f = &self.inner.fingerprint;
        format!("PeerInfo('{}', {} rank {}/{}, tensors={})", self.name, f.family, f.tp_rank, f.tp_size, self.addresses.len())
    }
}

/// `(name, safetensors dtype, shape, begin, end)` of one tensor of a saved-states file.
type SavedTensorTuple = (String, String, Vec<u64>, u64, u64);

fn saved_header(fp: &LayoutFingerprint, num_layers: u64, num_requests: u64, source_blocks: Vec<u64>, checksums: Vec<u64>) -> saved::SavedHeader {
    saved::SavedHeader { fingerprint: fp.inner.clone(), num_layers, num_requests, source_blocks, checksums }
}

/// A C-contiguous byte buffer's bytes, borrowed for `f` (run with the GIL released).
fn with_bytes<T: Send>(py: Python<'_>, data: &PyBuffer<u8>, f: impl FnOnce(&[u8]) -> T + Send) -> PyResult<T> {
    if !data.is_c_contiguous() {
        return Err(Error::binding("data: the buffer must be C-contiguous bytes").into());
    }
    let (ptr, len) = (data.buf_ptr() as usize, data.len_bytes());
    if len == 0 || ptr == 0 {
        return Ok(f(&[]));
    }
    // SAFETY: `data` holds the exporter's buffer (its memory stays valid and exported) until it
    // is dropped after this call; it is C-contiguous, so its `len_bytes()` bytes from the
    // non-null `buf_ptr()` are the whole buffer; the slice is only read.
    Ok(py.detach(move || f(unsafe { std::slice::from_raw_parts(ptr as *const u8, len) })))
}

/// The header of a saved-states file: its metadata (string pairs) and its tensors
/// `(name, safetensors dtype, shape, begin, end)`, for `num_requests` requests saved from
/// `source_blocks` of a pool of `fingerprint` with `num_layers` layers.
#[pyfunction]
pub(crate) fn saved_states_header(
    fingerprint: PyRef<'_, LayoutFingerprint>,
    num_layers: u64,
    num_requests: u64,
    source_blocks: Vec<u64>,
    checksums: Vec<u64>,
) -> PyResult<(saved::Metadata, Vec<SavedTensorTuple>)> {
    let h = saved_header(&fingerprint, num_layers, num_requests, source_blocks, checksums);
    let tensors = saved::header_tensors(&h)?.into_iter().map(|t| (t.name, t.dtype, t.shape, t.begin, t.end)).collect();
    Ok((saved::header_metadata(&h), tensors))
}

/// Per request, the checksum of its bytes in the data section `data` of a saved-states file.
#[pyfunction]
pub(crate) fn saved_states_checksums(
    py: Python<'_>,
    fingerprint: PyRef<'_, LayoutFingerprint>,
    num_layers: u64,
    num_requests: u64,
    data: PyBuffer<u8>,
) -> PyResult<Vec<u64>> {
    let h = saved_header(&fingerprint, num_layers, num_requests, vec![], vec![]);
    Ok(with_bytes(py, &data, |d| saved::request_checksums(&h, d))??)
}

/// Checks a saved-states file: its metadata and tensor entries against the fingerprint it names,
/// and every request's bytes in `data` (the data section) against its checksum. Returns
/// `(fingerprint, num_layers, num_requests, source_blocks)`; LayoutError names the defect.
#[pyfunction]
pub(crate) fn check_saved_states(
    py: Python<'_>,
    metadata: std::collections::HashMap<String, String>,
    tensors: Vec<SavedTensorTuple>,
    data: PyBuffer<u8>,
) -> PyResult<(LayoutFingerprint, u64, u64, Vec<u64>)> {
    let tensors: Vec<saved::SavedTensor> =
        tensors.into_iter().map(|(name, dtype, shape, begin, end)| saved::SavedTensor { name, dtype, shape, begin, end }).collect();
    let h = saved::decode_header(&|k| metadata.get(k).cloned(), &tensors, data.len_bytes() as u64)?;
    with_bytes(py, &data, |d| saved::verify(&h, d))??;
    Ok((h.fingerprint.into(), h.num_layers, h.num_requests, h.source_blocks))
}

/// The rules of a host offload tier (see `HostCache`): bytes per request from the fingerprint,
/// capacity accounting, least-recently-used eviction and spill. Entries are named by integer
/// ids; the caller holds the bytes.
/// A host cache at one moment: the host bytes one request's states take (every layer's persistent
/// states), the capacity, whether evicted entries spill to disk, the bytes held, entries pushed out
/// of host memory, restores that found or missed their key, entries in memory and on disk.
#[pyclass(module = "recoverssm_rs", frozen, get_all)]
pub struct CacheCounters {
    bytes_per_request: u64,
    capacity_bytes: u64,
    spill: bool,
    used_bytes: u64,
    evictions: u64,
    hits: u64,
    misses: u64,
    in_memory: usize,
    on_disk: usize,
}

#[pyclass(module = "recoverssm_rs")]
pub struct HostCacheIndex {
    inner: transfer::cache::CacheIndex,
}

fn location(l: Option<transfer::cache::Location>) -> Option<&'static str> {
    l.map(|l| l.name())
}

#[pymethods]
impl HostCacheIndex {
    #[new]
    #[pyo3(signature = (fingerprint, num_layers, capacity_bytes, *, spill = false))]
    fn new(fingerprint: PyRef<'_, LayoutFingerprint>, num_layers: u64, capacity_bytes: i128, spill: bool) -> PyResult<Self> {
        let capacity = u64::try_from(capacity_bytes)
            .ok()
            .filter(|&c| c > 0)
            .ok_or_else(|| Error::plan(format!("HostCache: capacity_bytes must be > 0, got {capacity_bytes}")))?;
        Ok(HostCacheIndex { inner: transfer::cache::CacheIndex::new(&fingerprint.inner, num_layers, capacity, spill)? })
    }
    /// The cache's sizes and counters now.
    fn counters(&self) -> CacheCounters {
        let c = &self.inner;
        CacheCounters {
            bytes_per_request: c.bytes_per_request(),
            capacity_bytes: c.capacity(),
            spill: c.spills(),
            used_bytes: c.used(),
            evictions: c.evictions,
            hits: c.hits,
            misses: c.misses,
            in_memory: c.in_memory(),
            on_disk: c.on_disk(),
        }
    }
    /// Host bytes `num_requests` requests take; PlanError when more than the whole capacity.
    fn need(&self, num_requests: u64) -> PyResult<u64> {
        Ok(self.inner.need(num_requests)?)
    }
    /// Records `id` as a new in-memory entry of `num_requests` requests (replacing one of that
    /// id); returns `(id, spill)` of each entry evicted to make room, least recently used first.
    /// PlanError (nothing changed) when the requests need more than the capacity.
    fn put(&mut self, id: u64, num_requests: u64) -> PyResult<Vec<(u64, bool)>> {
        Ok(self.inner.put(id, num_requests)?.into_iter().map(|e| (e.id, e.spill)).collect())
    }
    /// `"memory"`, `"disk"` or None for a restore of `id`, counting a hit or a miss; an
    /// in-memory entry becomes the most recently used.
    fn lookup(&mut self, id: u64) -> Option<&'static str> {
        location(self.inner.lookup(id))
    }
    /// Marks an in-memory `id` most recently used, no hit counted; False when not in memory.
    fn touch(&mut self, id: u64) -> bool {
        self.inner.touch(id)
    }
    /// Where `id` is held (`"memory"`, `"disk"`, None), without marking it used.
    fn location(&self, id: u64) -> Option<&'static str> {
        location(self.inner.location(id))
    }
    /// Forgets `id`; returns where it was held.
    fn drop(&mut self, id: u64) -> Option<&'static str> {
        location(self.inner.drop(id))
    }
    fn __len__(&self) -> usize {
        self.inner.in_memory() + self.inner.on_disk()
    }
    fn __repr__(&self) -> String {
        let c = &self.inner;
        format!(
            "HostCacheIndex(entries={}, on_disk={}, used={}/{} bytes, evictions={}, hits={}, misses={})",
            c.in_memory(),
            c.on_disk(),
            c.used(),
            c.capacity(),
            c.evictions,
            c.hits,
            c.misses
        )
    }
}
