//! Bindings for the transfer core: layout fingerprints, handshake messages, the compatibility
//! and source-rank checks, transfer plans (returned as packed little-endian u64 rows for
//! numpy), the transfer tiers' arguments (pools, sources, block lists) and their one guarded
//! call (check the bound tensors, copy, record the write). The disk side is `transfer_disk.rs`.

use super::conversion::{instance, items, type_name, Arg, Ints, Table};
use super::guard::BoundTensors;
use super::layout::Layout;
use crate::error::{Error, ErrorKind};
use crate::transfer::{self, Fingerprint, PoolGeometry, StateKind};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// What one rank's pool holds, as a transfer sees it: family, model dims, persistent-state
/// dtypes and conv geometry, TP size and rank, block size. Exchanged at handshake in its text
/// form (`encode` / `decode`).
#[pyclass(module = "recoverssm_rs", frozen, eq, skip_from_py_object)]
#[derive(Clone, PartialEq)]
pub struct LayoutFingerprint {
    pub(super) inner: Fingerprint,
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
    #[pyo3(signature = (layout: "Layout", *, tp_rank: "int | None" = None, block_size: "int | None" = None))]
    fn new(layout: &Bound<'_, PyAny>, tp_rank: Option<&Bound<'_, PyAny>>, block_size: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let layout = instance::<Layout>(layout, "layout", ErrorKind::Binding, "Layout")?;
        let int = |v: Option<&Bound<'_, PyAny>>, name: &str| v.map_or(Ok(0), |v| u64::arg(v, name, ErrorKind::Binding));
        let (tp_rank, block_size) = (int(tp_rank, "tp_rank")?, int(block_size, "block_size")?);
        Ok(Fingerprint::new(layout.get().core(), tp_rank, block_size)?.into())
    }
    /// Parses the text form of `encode` (LayoutError for any defect, sizes checked for overflow).
    #[staticmethod]
    #[pyo3(signature = (text: "str") -> "LayoutFingerprint")]
    fn decode(text: &Bound<'_, PyAny>) -> PyResult<Self> {
        let text = String::arg(text, "text", ErrorKind::Layout)?;
        Ok(Fingerprint::decode(&text)?.into())
    }
    fn encode(&self) -> String {
        self.inner.encode()
    }
    // stub: -> _ConvLayoutName | None
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
    // stub: -> list[tuple[_ConvLayoutName, int, int] | None]
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
    #[pyo3(signature = (tp_rank: "int") -> "LayoutFingerprint")]
    fn with_rank(&self, tp_rank: &Bound<'_, PyAny>) -> PyResult<Self> {
        let tp_rank = u64::arg(tp_rank, "tp_rank", ErrorKind::Layout)?;
        let inner = Fingerprint { tp_rank, ..self.inner.clone() };
        inner.check()?;
        Ok(inner.into())
    }
    /// Bytes one request's persistent states take in a pool of `num_layers` layers (what the
    /// host tier and saved states count); LayoutError on overflow.
    #[pyo3(signature = (num_layers: "int") -> "int")]
    fn request_nbytes(&self, num_layers: &Bound<'_, PyAny>) -> PyResult<u64> {
        let num_layers = u64::arg(num_layers, "num_layers", ErrorKind::Layout)?;
        Ok(transfer::cache::request_bytes(&self.inner, num_layers)?)
    }
    /// Raises LayoutError, naming every incompatible state with both values, unless states can
    /// move from this (source) rank to `destination`.
    #[pyo3(signature = (destination: "LayoutFingerprint") -> "None")]
    fn check_compatible(&self, destination: &Bound<'_, PyAny>) -> PyResult<()> {
        let destination = instance::<Self>(destination, "destination", ErrorKind::Layout, "LayoutFingerprint")?;
        Ok(transfer::check_compatible(&self.inner, &destination.get().inner)?)
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
    /// The batch's `(source block, destination block)` pairs, in request order.
    blocks: Vec<(u64, u64)>,
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
            blocks: Vec::new(),
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
    // stub: -> list[tuple[int, int]]
    /// The batch's `(source block, destination block)` pairs, in request order, as the core read
    /// them (plain ints, whatever integer table the requests were given as).
    #[getter]
    fn blocks(&self) -> Vec<(u64, u64)> {
        self.blocks.clone()
    }
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

/// A pool geometry argument `(num_layers, num_blocks, block_strides)` (BindingError naming `what`).
fn geometry_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<PoolGeometry> {
    let parts = items(obj, what, ErrorKind::Binding, "three items, (num_layers, num_blocks, block_strides)")?;
    let [layers, blocks, strides] = &parts[..] else {
        return Err(Error::binding(format!("{what} must be (num_layers, num_blocks, block_strides), got {} items", parts.len())).into());
    };
    let block_strides = items(strides, &format!("{what}: block_strides"), ErrorKind::Binding, "byte strides")?
        .iter()
        .map(|x| u64::arg(x, &format!("{what}: a block stride"), ErrorKind::Binding))
        .collect::<PyResult<Vec<_>>>()?;
    Ok(PoolGeometry {
        num_layers: u64::arg(layers, &format!("{what}: num_layers"), ErrorKind::Binding)?,
        num_blocks: u64::arg(blocks, &format!("{what}: num_blocks"), ErrorKind::Binding)?,
        block_strides,
    })
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
#[pyo3(signature = (
    source: "LayoutFingerprint", source_pools: "Sequence[tuple[int, int, Sequence[int]]]", destination: "LayoutFingerprint",
    destination_pool: "tuple[int, int, Sequence[int]]", requests: "Sequence[tuple[int, int]] | _IntArray",
) -> "TransferPlan")]
pub(crate) fn plan_transfer(
    py: Python<'_>,
    source: &Bound<'_, PyAny>,
    source_pools: &Bound<'_, PyAny>,
    destination: &Bound<'_, PyAny>,
    destination_pool: &Bound<'_, PyAny>,
    requests: &Bound<'_, PyAny>,
) -> PyResult<TransferPlan> {
    let fp = |o: &Bound<'_, PyAny>, what: &str| -> PyResult<Fingerprint> {
        Ok(instance::<LayoutFingerprint>(o, what, ErrorKind::Binding, "LayoutFingerprint")?.get().inner.clone())
    };
    let (s, d) = (fp(source, "source")?, fp(destination, "destination")?);
    let sp = items(source_pools, "source_pools", ErrorKind::Binding, "(num_layers, num_blocks, block_strides) geometries")?
        .iter()
        .enumerate()
        .map(|(i, g)| geometry_arg(g, &format!("source_pools[{i}]")))
        .collect::<PyResult<Vec<_>>>()?;
    let dp = geometry_arg(destination_pool, "destination_pool")?;
    let requests = block_pairs(requests)?;
    let (plan, blocks) = py.detach(move || transfer::plan_transfer(&s, &sp, &d, &dp, &requests).map(|p| (p, requests)))?;
    Ok(TransferPlan { blocks, ..plan.into() })
}

/// Checks the source ranks an executor was given, `(rank it is used as, its fingerprint)`: each
/// fingerprint holds that rank (BindingError for swapped shards) and all are ranks of one
/// instance (BindingError for an SD pool with a DS pool, or two TP sizes). Returns the first.
#[pyfunction]
#[pyo3(signature = (sources: "Sequence[tuple[int, LayoutFingerprint]]") -> "LayoutFingerprint")]
pub(crate) fn check_sources(sources: &Bound<'_, PyAny>) -> PyResult<LayoutFingerprint> {
    let mut given: Vec<(u64, Fingerprint)> = Vec::new();
    for (i, pair) in items(sources, "sources", ErrorKind::Binding, "(rank, LayoutFingerprint) pairs")?.iter().enumerate() {
        let what = format!("sources[{i}]");
        let parts = items(pair, &what, ErrorKind::Binding, "(rank, LayoutFingerprint)")?;
        let [rank, fp] = &parts[..] else {
            return Err(Error::binding(format!("{what} must be a (rank, LayoutFingerprint) pair, got {} items", parts.len())).into());
        };
        let rank = u64::arg(rank, &format!("{what}: rank"), ErrorKind::Binding)?;
        let fp = instance::<LayoutFingerprint>(fp, &format!("{what}: fingerprint"), ErrorKind::Binding, "LayoutFingerprint")?;
        given.push((rank, fp.get().inner.clone()));
    }
    let v: Vec<(u64, &Fingerprint)> = given.iter().map(|(r, f)| (*r, f)).collect();
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
    #[pyo3(signature = (
        name: "str", metadata: "bytes", fingerprint: "LayoutFingerprint", geometry: "tuple[int, int, Sequence[int]]",
        addresses: "Sequence[int]",
    ))]
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
    #[pyo3(signature = (data: "bytes") -> "PeerInfo")]
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
    // stub: -> tuple[int, int, list[int]]
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

/// The bound tensors of `what`, checked to be a `BoundTensors` (a pool's guard).
fn guards<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Vec<Bound<'py, BoundTensors>>> {
    items(obj, what, ErrorKind::Binding, "BoundTensors")?
        .iter()
        .map(|g| instance::<BoundTensors>(g, what, ErrorKind::Binding, "BoundTensors"))
        .collect()
}

/// A guarded write of a transfer tier, in one call: checks every guard of `reads` (the pools
/// read) and `writes` (the pools written) -- BindingError naming the first tensor freed, resized
/// or re-pointed, before anything runs --, runs `run()` (the copies), then bumps the version
/// counters of what `writes` holds. Returns what `run` returns.
#[pyfunction]
#[pyo3(signature = (
    run: "Callable[[], _T]", *, reads: "Sequence[BoundTensors] | None" = None, writes: "Sequence[BoundTensors] | None" = None,
) -> "_T")]
pub(crate) fn guarded_write(
    py: Python<'_>,
    run: &Bound<'_, PyAny>,
    reads: Option<&Bound<'_, PyAny>>,
    writes: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    fn listed<'py>(o: Option<&Bound<'py, PyAny>>, what: &str) -> PyResult<Vec<Bound<'py, BoundTensors>>> {
        o.filter(|o| !o.is_none()).map_or(Ok(Vec::new()), |o| guards(o, what))
    }
    let (reads, writes) = (listed(reads, "reads")?, listed(writes, "writes")?);
    for g in reads.iter().chain(&writes) {
        g.get().guard().check(py)?;
    }
    let out = run.call0()?;
    for g in &writes {
        g.get().guard().mark_written(py)?;
    }
    Ok(out.unbind())
}

/// [`guarded_write`] of a transfer plan between pools of this process: `sources` (rank ->
/// guard of that source pool) must hold every source rank `plan` reads (BindingError naming
/// the missing ranks, of `tp_size`, otherwise); the guards of those ranks and of `destination`
/// are checked, a plan in which one request writes memory another reads (pools sharing memory)
/// is a PlanError, `run()` moves the bytes, and the destination's writes are recorded.
#[pyfunction]
#[pyo3(signature = (
    plan: "TransferPlan", sources: "Mapping[int, BoundTensors]", tp_size: "int", destination: "BoundTensors", run: "Callable[[], _T]",
) -> "_T")]
pub(crate) fn guarded_transfer(
    py: Python<'_>,
    plan: PyRef<'_, TransferPlan>,
    sources: std::collections::BTreeMap<u64, Py<BoundTensors>>,
    tp_size: u64,
    destination: PyRef<'_, BoundTensors>,
    run: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let missing: Vec<u64> = plan.source_ranks.iter().copied().filter(|r| !sources.contains_key(r)).collect();
    if !missing.is_empty() {
        let given: Vec<u64> = sources.keys().copied().collect();
        return Err(Error::binding(format!(
            "LocalTransfer: the plan reads source ranks {missing:?} of tp_size {tp_size}, which were not given (given: {given:?})"
        ))
        .into());
    }
    for r in &plan.source_ranks {
        sources[r].get().guard().check(py)?;
    }
    destination.guard().check(py)?;
    // Pools that share memory (one pool, or two over the same tensors): no request may write
    // what another reads, or the result would depend on the order of the copies.
    let bases = plan.source_ranks.iter().map(|r| (*r, sources[r].get().guard().tensors().map(|(p, _)| p).collect())).collect();
    let dst: Vec<(u64, &str)> = destination.guard().tensors().collect();
    let dst_bases: Vec<u64> = dst.iter().map(|&(p, _)| p).collect();
    if let Some(o) = transfer::plan::first_overlap(&plan.inner, &bases, &dst_bases) {
        let label = usize::try_from(o.dst_tensor).ok().and_then(|t| dst.get(t)).map_or("the destination", |&(_, l)| l);
        return Err(Error::plan(format!(
            "LocalTransfer: request {} writes {label} where request {} reads (the source and destination share memory): \
             a block may not be both a destination and another request's source in one transfer; nothing was written",
            o.writer, o.reader
        ))
        .into());
    }
    let out = run.call0()?;
    destination.guard().mark_written(py)?;
    Ok(out.unbind())
}

/// The first source's fingerprint and the `(rank, pool)` pairs of a transfer's sources.
type SourcePools<'py> = (LayoutFingerprint, Vec<(u64, Bound<'py, PyAny>)>);

/// The fingerprint of the pool `obj` (the argument `what`): a `StatePool`, recognised by its
/// `fingerprint` (a LayoutFingerprint) and `guard` (its BoundTensors); BindingError otherwise.
fn pool_fingerprint(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Fingerprint> {
    let py = obj.py();
    let refused = || -> PyErr { Error::binding(format!("{what} must be a StatePool, got {}", type_name(obj))).into() };
    let fp = obj.getattr(pyo3::intern!(py, "fingerprint")).map_err(|_| refused())?;
    let fp = fp.cast::<LayoutFingerprint>().map_err(|_| refused())?;
    let guard = obj.getattr(pyo3::intern!(py, "guard")).map_err(|_| refused())?;
    guard.cast::<BoundTensors>().map_err(|_| refused())?;
    Ok(fp.get().inner.clone())
}

/// Checks that `pool` (the argument `what`) is a StatePool; returns its fingerprint.
#[pyfunction]
#[pyo3(signature = (pool: "object", what: "str" = "pool") -> "LayoutFingerprint")]
pub(crate) fn check_pool(pool: &Bound<'_, PyAny>, what: &str) -> PyResult<LayoutFingerprint> {
    Ok(pool_fingerprint(pool, what)?.into())
}

/// The source pools of a transfer, checked: `sources` is a mapping rank -> StatePool or a list of
/// StatePools (each used as the rank it holds); every pool holds the rank it is given as, no rank
/// is given twice, and all are ranks of one instance (BindingError naming the defect). Returns
/// the first source's fingerprint and the `(rank, pool)` pairs.
#[pyfunction]
#[pyo3(signature = (sources: "object") -> "tuple[LayoutFingerprint, list[tuple[int, Any]]]")]
pub(crate) fn source_pools<'py>(sources: &Bound<'py, PyAny>) -> PyResult<SourcePools<'py>> {
    let mut pairs: Vec<(u64, Bound<'py, PyAny>, Fingerprint)> = Vec::new();
    if let Ok(map) = sources.cast::<pyo3::types::PyMapping>() {
        let entries = map.items().map_err(|_| {
            Error::binding(format!("sources must be a mapping rank -> StatePool or a list of StatePools, got {}", type_name(sources)))
        })?;
        for kv in entries.iter() {
            let (k, v) = (kv.get_item(0)?, kv.get_item(1)?);
            let rank = u64::arg(&k, "sources: a rank", ErrorKind::Binding)?;
            let fp = pool_fingerprint(&v, &format!("sources[{rank}]"))?;
            pairs.push((rank, v, fp));
        }
    } else {
        for (i, v) in items(sources, "sources", ErrorKind::Binding, "StatePools (or a mapping rank -> StatePool)")?.into_iter().enumerate() {
            let fp = pool_fingerprint(&v, &format!("sources[{i}]"))?;
            pairs.push((fp.tp_rank, v, fp));
        }
    }
    let refs: Vec<(u64, &Fingerprint)> = pairs.iter().map(|(r, _, f)| (*r, f)).collect();
    let first = transfer::check_sources(&refs)?;
    Ok((first.into(), pairs.into_iter().map(|(r, p, _)| (r, p)).collect()))
}

/// The block ids `blocks` (the argument `what`): a 1-D list or array of host integers (PlanError
/// naming the argument otherwise). Their values are the plan's to check (a negative block is
/// refused naming its request). `offload`: the blocks of an offload, which must name at least
/// one (PlanError otherwise: an offload of no request holds nothing).
#[pyfunction]
#[pyo3(signature = (blocks: "_IntArray", what: "str" = "blocks", *, offload: "bool" = false) -> "list[int]")]
pub(crate) fn block_list(blocks: &Bound<'_, PyAny>, what: &str, offload: bool) -> PyResult<Vec<i64>> {
    let ids = if blocks.len().ok() == Some(0) && !blocks.is_instance_of::<pyo3::types::PyString>() {
        Vec::new()
    } else {
        Ints::arg(blocks, what, ErrorKind::Plan)?.0
    };
    if offload && ids.is_empty() {
        return Err(Error::plan(format!("{what} is empty: offload at least one block (one per request)")).into());
    }
    Ok(ids)
}

/// The request count and source blocks of `states` (HostStates) for a save, checked: a StatePool
/// `pool` holding `num_requests >= 1` requests in its blocks `1..=num_requests`, and
/// `source_blocks` None (then `1..=num_requests`) or one block id `>= 0` per request (PlanError
/// naming the field otherwise).
#[pyfunction]
#[pyo3(signature = (states: "object") -> "tuple[int, list[int]]")]
pub(crate) fn saved_request_blocks(states: &Bound<'_, PyAny>) -> PyResult<(u64, Vec<u64>)> {
    let py = states.py();
    let field = |name: &str| {
        states
            .getattr(name)
            .map_err(|_| PyErr::from(Error::plan(format!("states must be HostStates (from HostOffload.offload), got {}", type_name(states)))))
    };
    let pool = field("pool")?;
    pool_fingerprint(&pool, "states.pool")?;
    let n = u64::arg(&field("num_requests")?, "states.num_requests", ErrorKind::Plan)?;
    if n == 0 {
        return Err(Error::plan("states.num_requests = 0 must be >= 1: a saved file holds at least one request").into());
    }
    let held = u64::arg(&pool.getattr(pyo3::intern!(py, "num_blocks"))?, "states.pool.num_blocks", ErrorKind::Binding)?.saturating_sub(1);
    if n > held {
        return Err(Error::plan(format!("states.num_requests = {n} but states.pool holds {held} (blocks 1 ..= {held})")).into());
    }
    let given = field("source_blocks")?;
    if given.is_none() {
        return Ok((n, (1..=n).collect()));
    }
    let items = items(&given, "states.source_blocks", ErrorKind::Plan, "block ids (one per request) or None")?;
    let blocks =
        items.iter().enumerate().map(|(i, b)| u64::arg(b, &format!("states.source_blocks[{i}]"), ErrorKind::Plan)).collect::<PyResult<Vec<u64>>>()?;
    if blocks.len() as u64 != n {
        return Err(Error::plan(format!("states.source_blocks has {} entries for states.num_requests = {n}", blocks.len())).into());
    }
    Ok((n, blocks))
}

/// The saved states of a restore, checked: `states` is one HostStates or a list of them (one
/// per source rank), each with a StatePool `pool` and `num_requests` equal to `num_blocks`
/// (PlanError otherwise); returns their `(rank, pool)` pairs after the source checks of
/// [`source_pools`] (BindingError).
#[pyfunction]
#[pyo3(signature = (states: "object", num_blocks: "int") -> "tuple[LayoutFingerprint, list[tuple[int, Any]]]")]
pub(crate) fn restore_sources<'py>(states: &Bound<'py, PyAny>, num_blocks: u64) -> PyResult<SourcePools<'py>> {
    let py = states.py();
    let one = states.hasattr(pyo3::intern!(py, "pool")).unwrap_or(false);
    let list = if one { vec![states.clone()] } else { items(states, "states", ErrorKind::Plan, "HostStates (one per source rank)")? };
    let mut pools = Vec::with_capacity(list.len());
    let mut counts = Vec::with_capacity(list.len());
    for (i, s) in list.iter().enumerate() {
        let what = if one { "states".to_string() } else { format!("states[{i}]") };
        let refused = || -> PyErr { Error::plan(format!("{what} must be HostStates (from HostOffload.offload), got {}", type_name(s))).into() };
        let pool = s.getattr(pyo3::intern!(py, "pool")).map_err(|_| refused())?;
        pool_fingerprint(&pool, &format!("{what}.pool"))?;
        let n = s.getattr(pyo3::intern!(py, "num_requests")).map_err(|_| refused())?;
        counts.push(u64::arg(&n, &format!("{what}.num_requests"), ErrorKind::Plan)?);
        pools.push(pool);
    }
    counts.sort_unstable();
    counts.dedup();
    if counts != [num_blocks] {
        return Err(Error::plan(format!("restore: offloaded requests {counts:?} (per source rank) but {num_blocks} blocks given")).into());
    }
    source_pools(&pyo3::types::PyList::new(py, pools)?.into_any())
}
