//! Bindings for the disk side of the transfer tiers: saved-states files (encoded, written,
//! read and checked by the core: `rust/transfer/saved.rs`, `rust/transfer/files.rs`) and the
//! host tier's index (`HostCacheIndex`: capacity, LRU order, spill directory, the keys of its
//! spill files).

use super::conversion::{instance, items, type_name, Arg};
use super::transfer::LayoutFingerprint;
use crate::error::{Error, ErrorKind};
use crate::transfer::{self, saved};
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFrozenSet, PyInt, PyList, PyTuple};
use std::path::PathBuf;

/// `(name, safetensors dtype, shape, begin, end)` of one tensor of a saved-states file.
type SavedTensorTuple = (String, String, Vec<u64>, u64, u64);

/// What a checked saved-states file holds: `(fingerprint, num_layers, num_requests,
/// source_blocks, byte range of each tensor)`.
type SavedStatesTuple = (LayoutFingerprint, u64, u64, Vec<u64>, Vec<(u64, u64)>);

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

/// The argument `what` as a byte buffer (BindingError naming it otherwise).
fn buffer_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<PyBuffer<u8>> {
    PyBuffer::<u8>::get(obj).map_err(|_| Error::binding(format!("{what} must be a bytes-like buffer, got {}", type_name(obj))).into())
}

/// The argument `what` as a file system path (a str or an `os.PathLike`).
fn path_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<PathBuf> {
    obj.extract::<PathBuf>().map_err(|_| Error::binding(format!("{what} must be a path (a str or os.PathLike), got {}", type_name(obj))).into())
}

/// The spill binding `(tier, entry id)` of a call, checked: both or neither.
fn spill_binding<'a>(tier: Option<&'a PyRef<'_, HostCacheIndex>>, entry: Option<u64>) -> PyResult<Option<(&'a saved::Sealer, u64)>> {
    match (tier, entry) {
        (Some(t), Some(id)) => Ok(Some((t.inner.sealer(), id))),
        (None, None) => Ok(None),
        _ => Err(Error::binding("tier and entry are given together (a spill file of one entry of one tier) or not at all").into()),
    }
}

/// The header of a saved-states file of `num_requests` requests saved from `source_blocks` of a
/// pool of `fingerprint` with `num_layers` layers, whose data section is `data`: its metadata
/// (string pairs: checksums and the record digest filled in; with `tier` and `entry`, bound to
/// that entry of that host tier and sealed with its keys) and its tensors `(name, safetensors
/// dtype, shape, begin, end)`.
#[pyfunction]
#[allow(clippy::too_many_arguments)] // the header's fields, the data and the spill binding, by name
#[pyo3(signature = (
    fingerprint: "LayoutFingerprint", num_layers: "int", num_requests: "int", source_blocks: "Sequence[int]", data: "_Buffer", *,
    tier: "HostCacheIndex | None" = None, entry: "int | None" = None,
) -> "tuple[list[tuple[str, str]], list[tuple[str, str, list[int], int, int]]]")]
pub(crate) fn encode_saved_states(
    py: Python<'_>,
    fingerprint: PyRef<'_, LayoutFingerprint>,
    num_layers: &Bound<'_, PyAny>,
    num_requests: &Bound<'_, PyAny>,
    source_blocks: &Bound<'_, PyAny>,
    data: &Bound<'_, PyAny>,
    tier: Option<PyRef<'_, HostCacheIndex>>,
    entry: Option<u64>,
) -> PyResult<(saved::Metadata, Vec<SavedTensorTuple>)> {
    let num_layers = u64::arg(num_layers, "num_layers", ErrorKind::Plan)?;
    let num_requests = u64::arg(num_requests, "num_requests", ErrorKind::Plan)?;
    let source_blocks = items(source_blocks, "source_blocks", ErrorKind::Plan, "block ids")?
        .iter()
        .enumerate()
        .map(|(i, b)| u64::arg(b, &format!("source_blocks[{i}]"), ErrorKind::Plan))
        .collect::<PyResult<Vec<u64>>>()?;
    let data = buffer_arg(data, "data")?;
    let mut h = saved::SavedHeader::new(fingerprint.inner.clone(), num_layers, num_requests, source_blocks);
    let sealer = spill_binding(tier.as_ref(), entry)?;
    let h = with_bytes(py, &data, |d| saved::seal_header(&mut h, d, sealer).map(|()| h))??;
    let tensors = saved::header_tensors(&h)?.into_iter().map(|t| (t.name, t.dtype, t.shape, t.begin, t.end)).collect();
    Ok((saved::header_metadata(&h), tensors))
}

/// Writes `parts` (byte buffers) back to back to `path`, atomically: a temporary that cannot be
/// pre-placed (random name, exclusive create, mode 0600), synced, renamed over `path`. The
/// directory must exist and not be world-writable without the sticky bit. Returns the bytes
/// written; BindingError naming the path for any failure (the target is then unchanged).
#[pyfunction]
#[pyo3(signature = (path: "str | os.PathLike[str]", parts: "Sequence[_Buffer]") -> "int")]
pub(crate) fn write_file(py: Python<'_>, path: &Bound<'_, PyAny>, parts: &Bound<'_, PyAny>) -> PyResult<u64> {
    let path = path_arg(path, "path")?;
    let bufs = items(parts, "parts", ErrorKind::Binding, "byte buffers")?
        .iter()
        .enumerate()
        .map(|(i, b)| buffer_arg(b, &format!("parts[{i}]")))
        .collect::<PyResult<Vec<_>>>()?;
    let mut slices: Vec<(usize, usize)> = Vec::with_capacity(bufs.len());
    for b in &bufs {
        if !b.is_c_contiguous() {
            return Err(Error::binding("parts: every buffer must be C-contiguous bytes").into());
        }
        slices.push((b.buf_ptr() as usize, b.len_bytes()));
    }
    py.detach(move || {
        // SAFETY: each `bufs` entry holds its exporter's C-contiguous buffer, valid and exported
        // until `bufs` is dropped after this call; the slices are only read.
        let parts: Vec<&[u8]> =
            slices.iter().map(|&(p, n)| if n == 0 || p == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(p as *const u8, n) } }).collect();
        transfer::files::write_atomic(&path, &parts, "path")
    })
    .map_err(Into::into)
}

/// `load_states`' arguments other than the file's, checked before the file is read:
/// `pin_memory` (a bool; PlanError naming it otherwise). Returns it converted.
#[pyfunction]
#[pyo3(signature = (pin_memory: "bool") -> "bool")]
pub(crate) fn load_args(pin_memory: &Bound<'_, PyAny>) -> PyResult<bool> {
    bool::arg(pin_memory, "pin_memory", ErrorKind::Plan)
}

/// Reads a saved-states file: `(header, data)`, the JSON header's bytes (the framing checked: a
/// length inside the file, no deeper nesting than a header has) and the data section's.
/// BindingError naming the path when it cannot be read; LayoutError for bad framing.
#[pyfunction]
#[pyo3(signature = (path: "str | os.PathLike[str]") -> "tuple[bytes, bytes]")]
pub(crate) fn read_saved_file<'py>(py: Python<'py>, path: &Bound<'_, PyAny>) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
    let path = path_arg(path, "path")?;
    let (raw, span) = py.detach(|| -> crate::error::Result<_> {
        let raw = transfer::files::read(&path, "path")?;
        let named = format!("saved states file {}:", path.display());
        let span = saved::header_span(&raw).map_err(|e| Error::layout(e.message.replacen("saved states file:", &named, 1)))?;
        Ok((raw, span))
    })?;
    Ok((PyBytes::new(py, &raw[span.clone()]), PyBytes::new(py, &raw[span.end..])))
}

/// A value of a file's JSON header, `what`, as a u64: a JSON integer (a Python int, not a bool) in
/// `[0, 2**64)`; a layout error naming it otherwise (a hostile file's number is never cast).
fn header_u64(x: &Bound<'_, PyAny>, what: &str) -> Result<u64, Error> {
    if !x.is_instance_of::<PyInt>() || x.is_instance_of::<PyBool>() {
        return Err(malformed(format!("{what} must be an integer, got {}", type_name(x))));
    }
    x.extract::<u64>().map_err(|_| {
        // A number's text, when short (a hostile one may have thousands of digits).
        let shown = x.str().map(|s| s.to_string()).ok().filter(|s| s.len() <= 24).map_or(String::new(), |s| format!(" = {s}"));
        malformed(format!("{what}{shown} is not an integer in [0, 2**64)"))
    })
}

fn malformed(m: impl std::fmt::Display) -> Error {
    Error::layout(format!("saved states file: malformed header ({m})"))
}

/// A header's `__metadata__`, checked: a map of strings.
fn header_metadata(obj: &Bound<'_, PyAny>) -> Result<std::collections::HashMap<String, String>, Error> {
    let map = obj.cast::<PyDict>().map_err(|_| malformed(format!("__metadata__ must be a map of strings, got {}", type_name(obj))))?;
    map.iter()
        .map(|(k, v)| match (k.extract::<String>(), v.extract::<String>()) {
            (Ok(k), Ok(v)) => Ok((k, v)),
            (Ok(k), Err(_)) => Err(malformed(format!("__metadata__[{k:?}] must be a string, got {}", type_name(&v)))),
            (Err(_), _) => Err(malformed(format!("__metadata__ has a key that is not a string ({})", type_name(&k)))),
        })
        .collect()
}

/// A header's tensor entries `(name, dtype, shape, begin, end)`, checked (strings and integers in
/// `[0, 2**64)`, each a layout error naming the tensor and the field) and sorted by byte range.
fn header_entries(obj: &Bound<'_, PyAny>) -> Result<Vec<saved::SavedTensor>, Error> {
    let list =
        items(obj, "tensors", ErrorKind::Layout, "(name, dtype, shape, begin, end) entries").map_err(|_| malformed("tensors must be a list"))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let parts = items(t, "tensors", ErrorKind::Layout, "entries").map_err(|_| malformed(format!("tensor entry {i} is not a tuple")))?;
        let [name, dtype, shape, begin, end] = &parts[..] else {
            return Err(malformed(format!("tensor entry {i} has {} fields, not (name, dtype, shape, begin, end)", parts.len())));
        };
        let name =
            name.extract::<String>().map_err(|_| malformed(format!("tensor entry {i}: the name must be a string, got {}", type_name(name))))?;
        let what = format!("tensor '{name}'");
        let dtype = dtype.extract::<String>().map_err(|_| malformed(format!("{what}: dtype must be a string, got {}", type_name(dtype))))?;
        let Ok(shape) = shape.cast::<PyList>() else {
            return Err(malformed(format!("{what}: shape must be a list of integers, got {}", type_name(shape))));
        };
        let shape = shape.iter().enumerate().map(|(d, x)| header_u64(&x, &format!("{what}: shape[{d}]"))).collect::<Result<Vec<u64>, Error>>()?;
        let begin = header_u64(begin, &format!("{what}: data_offsets[0]"))?;
        let end = header_u64(end, &format!("{what}: data_offsets[1]"))?;
        out.push(saved::SavedTensor { name, dtype, shape, begin, end });
    }
    out.sort_by_key(|t| (t.begin, t.end));
    Ok(out)
}

/// Checks a saved-states file: its metadata and tensor entries (as the JSON header holds them:
/// types and ranges are checked here) against the fingerprint it names, every request's bytes in
/// `data` (the data section) against its checksum and the whole record's digest; with `tier` and
/// `entry`, that it is that tier's spill file of that entry (named `key` in errors). Returns
/// `(fingerprint, num_layers, num_requests, source_blocks, ranges)`, `ranges` the byte range in
/// `data` of each (layer, persistent state) tensor, layer-major; LayoutError names the defect, and
/// the file by `path` (and `key`) when given.
#[pyfunction]
#[pyo3(signature = (
    metadata: "dict[str, str]", tensors: "Sequence[tuple[str, str, list[int], int, int]]", data: "_Buffer", *,
    tier: "HostCacheIndex | None" = None, entry: "int | None" = None, key: "str" = String::new(),
    path: "str | os.PathLike[str] | None" = None,
) -> "tuple[LayoutFingerprint, int, int, list[int], list[tuple[int, int]]]")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_saved_states(
    py: Python<'_>,
    metadata: &Bound<'_, PyAny>,
    tensors: &Bound<'_, PyAny>,
    data: &Bound<'_, PyAny>,
    tier: Option<PyRef<'_, HostCacheIndex>>,
    entry: Option<u64>,
    key: String,
    path: Option<&Bound<'_, PyAny>>,
) -> PyResult<SavedStatesTuple> {
    let path = path.filter(|p| !p.is_none()).map(|p| path_arg(p, "path")).transpose()?;
    let data = buffer_arg(data, "data")?;
    // Which file (and, for a spill file, which key) a defect is in: the core's messages name
    // only "saved states file".
    let named = |e: Error| -> Error {
        let mut which = String::from("saved states file");
        if let Some(p) = &path {
            which = format!("{which} {}", p.display());
        }
        if !key.is_empty() && !e.message.contains(&format!("key {key}:")) {
            which = format!("{which} (key {key})");
        }
        Error { kind: e.kind, message: e.message.replacen("saved states file", &which, 1) }
    };
    let metadata = header_metadata(metadata).map_err(named)?;
    let tensors = header_entries(tensors).map_err(named)?;
    let h = saved::decode_header(&|k| metadata.get(k).cloned(), &tensors, data.len_bytes() as u64).map_err(named)?;
    let sealer = spill_binding(tier.as_ref(), entry)?;
    with_bytes(py, &data, |d| {
        saved::verify(&h, d)?;
        match sealer {
            Some((s, id)) => saved::verify_entry(&h, d, s, id, &key),
            None => Ok(()),
        }
    })?
    .map_err(named)?;
    let ranges = tensors.iter().map(|t| (t.begin, t.end)).collect();
    Ok((h.fingerprint.into(), h.num_layers, h.num_requests, h.source_blocks, ranges))
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
    /// The directory evicted entries spill to (checked when the tier is made).
    disk_dir: Option<PathBuf>,
    /// This tier's private directory inside `disk_dir`, made at the first spill (removed with
    /// the spill files it holds when the tier is dropped).
    private: Option<transfer::files::PrivateDir>,
}

/// The file name of entry `id`'s spill file in the tier's private directory.
fn spill_name(id: u64) -> String {
    format!("entry-{id}.safetensors")
}

fn location(l: Option<transfer::cache::Location>) -> Option<&'static str> {
    l.map(|l| l.name())
}

#[pymethods]
impl HostCacheIndex {
    /// `disk_dir`: where evicted entries spill (None: they are dropped); it must exist and not be
    /// world-writable without the sticky bit (BindingError naming it otherwise).
    #[new]
    #[pyo3(signature = (
        fingerprint: "LayoutFingerprint", num_layers: "int", capacity_bytes: "int", *, disk_dir: "str | os.PathLike[str] | None" = None,
    ))]
    fn new(
        fingerprint: &Bound<'_, PyAny>,
        num_layers: &Bound<'_, PyAny>,
        capacity_bytes: &Bound<'_, PyAny>,
        disk_dir: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let fp = instance::<LayoutFingerprint>(fingerprint, "fingerprint", ErrorKind::Binding, "LayoutFingerprint")?;
        let num_layers = u64::arg(num_layers, "num_layers", ErrorKind::Plan)?;
        let capacity = i64::arg(capacity_bytes, "capacity_bytes", ErrorKind::Plan)
            .map(i128::from)
            .or_else(|e| u64::arg(capacity_bytes, "capacity_bytes", ErrorKind::Plan).map(i128::from).map_err(|_| e))?;
        let capacity = u64::try_from(capacity)
            .ok()
            .filter(|&c| c > 0)
            .ok_or_else(|| Error::plan(format!("HostCache: capacity_bytes must be > 0, got {capacity}")))?;
        let disk_dir = match disk_dir {
            Some(d) if !d.is_none() => {
                let d = path_arg(d, "disk_dir")?;
                transfer::files::check_dir(&d, "disk_dir")?;
                Some(d)
            }
            _ => None,
        };
        let inner = transfer::cache::CacheIndex::new(&fp.get().inner, num_layers, capacity, disk_dir.is_some())?;
        Ok(HostCacheIndex { inner, disk_dir, private: None })
    }
    /// The cache's sizes and counters now.
    fn counters(&self) -> CacheCounters {
        let c = &self.inner;
        let (evictions, hits, misses) = c.counts();
        CacheCounters {
            bytes_per_request: c.bytes_per_request(),
            capacity_bytes: c.capacity(),
            spill: c.spills(),
            used_bytes: c.used(),
            evictions,
            hits,
            misses,
            in_memory: c.in_memory(),
            on_disk: c.on_disk(),
        }
    }
    /// Refuses a key the tier cannot hold (PlanError naming it): a key must be hashable and equal
    /// to itself, and so must each item of a tuple or frozenset in it (a NaN, found by no other
    /// NaN, could be put but never found or dropped by a key built again).
    #[pyo3(signature = (key: "object") -> "None")]
    fn check_key(&self, key: &Bound<'_, PyAny>) -> PyResult<()> {
        key.hash().map_err(|e| Error::plan(format!("key must be hashable (a str, an int, a tuple, ...), got {}: {e}", type_name(key))))?;
        let shown = |x: &Bound<'_, PyAny>| {
            let r = x.repr().map(|r| r.to_string()).unwrap_or_else(|_| format!("<{}>", type_name(x)));
            if r.chars().count() > 120 {
                format!("{}...", r.chars().take(120).collect::<String>())
            } else {
                r
            }
        };
        let refused = |x: &Bound<'_, PyAny>, why: String| {
            let item = if x.is(key) { String::new() } else { format!(": its item {} {why}", shown(x)) };
            let why = if x.is(key) { format!(" {why}") } else { String::new() };
            Error::plan(format!(
                "key {}{item}{why}; the tier could store it but no key built again would find it (a NaN equals nothing, \
                 itself included): use a key that equals itself",
                shown(key)
            ))
        };
        // Iterative, so that a deeply nested key cannot exhaust the stack.
        let mut todo = vec![key.clone()];
        while let Some(x) = todo.pop() {
            if let Ok(t) = x.cast::<PyTuple>() {
                todo.extend(t.iter());
            } else if let Ok(f) = x.cast::<PyFrozenSet>() {
                todo.extend(f.iter());
            } else {
                match x.eq(&x) {
                    Ok(true) => {}
                    Ok(false) => return Err(refused(&x, "does not compare equal to itself".into()).into()),
                    Err(e) => return Err(refused(&x, format!("cannot be compared with itself ({e})")).into()),
                }
            }
        }
        Ok(())
    }
    /// Host bytes `num_requests` requests take; PlanError when more than the whole capacity.
    fn need(&self, num_requests: u64) -> PyResult<u64> {
        Ok(self.inner.need(num_requests)?)
    }
    /// `(id, spill)` of each entry that `put(id, num_requests, replaces=)` would evict, least
    /// recently used first, changing nothing; PlanError when the requests need more than the
    /// capacity.
    #[pyo3(signature = (id: "int", num_requests: "int", *, replaces: "int | None" = None) -> "list[tuple[int, bool]]")]
    fn plan_put(&self, id: u64, num_requests: u64, replaces: Option<u64>) -> PyResult<Vec<(u64, bool)>> {
        Ok(self.inner.plan_put(id, num_requests, replaces)?.into_iter().map(|e| (e.id, e.spill)).collect())
    }
    /// Records `id` as a new in-memory entry of `num_requests` requests (replacing one of that
    /// id, and forgetting entry `replaces` first: a key's previous version, whose prefetch
    /// handles then no longer match); returns `(id, spill)` of each entry evicted to make room,
    /// least recently used first. PlanError (nothing changed) when the requests need more than
    /// the capacity.
    #[pyo3(signature = (id: "int", num_requests: "int", *, replaces: "int | None" = None) -> "list[tuple[int, bool]]")]
    fn put(&mut self, id: u64, num_requests: u64, replaces: Option<u64>) -> PyResult<Vec<(u64, bool)>> {
        Ok(self.inner.put_replacing(id, num_requests, replaces)?.into_iter().map(|e| (e.id, e.spill)).collect())
    }
    /// PlanError unless a prefetch handle of entry `handle_entry` may finish the restore of entry
    /// `id` (None: a key the tier does not hold), named `key` in the error.
    #[pyo3(signature = (id: "int | None", handle_entry: "int | None", key: "str") -> "None")]
    fn check_prefetched(&self, id: Option<u64>, handle_entry: Option<u64>, key: &str) -> PyResult<()> {
        Ok(self.inner.check_prefetched(id, handle_entry, key)?)
    }
    /// The path of entry `id`'s spill file, in this tier's private directory (made on first use:
    /// mode 0700, an exclusive create under a random name inside `disk_dir`; removed with the
    /// spill files in it when the tier is dropped).
    fn spill_path(&mut self, id: u64) -> PyResult<PathBuf> {
        let Some(dir) = &self.disk_dir else {
            return Err(Error::plan("HostCache: this tier has no disk_dir to spill to").into());
        };
        let private = match &mut self.private {
            Some(p) => p,
            None => self.private.insert(transfer::files::PrivateDir::create(dir, "recoverssm-spill", "disk_dir")?),
        };
        Ok(private.file(&spill_name(id))?)
    }
    /// Removes entry `id`'s spill file if it has one (BindingError naming it when it cannot be
    /// removed: then the tier still holds it), and forgets its name, so a tier that spills for as
    /// long as it runs keeps no name of a file it removed.
    #[pyo3(signature = (id: "int") -> "None")]
    fn remove_spill(&mut self, id: u64) -> PyResult<()> {
        match &mut self.private {
            Some(p) => Ok(p.remove_file(&spill_name(id), "disk_dir")?),
            None => Ok(()),
        }
    }
    /// `"memory"`, `"disk"` or None for a restore of `id`, counting a hit or a miss; an
    /// in-memory entry becomes the most recently used.
    #[pyo3(signature = (id: "int") -> "Literal['memory', 'disk'] | None")]
    fn lookup(&mut self, id: u64) -> Option<&'static str> {
        location(self.inner.lookup(id))
    }
    /// Marks an in-memory `id` most recently used, no hit counted; False when not in memory.
    fn touch(&mut self, id: u64) -> bool {
        self.inner.touch(id)
    }
    /// Where `id` is held (`"memory"`, `"disk"`, None), without marking it used.
    #[pyo3(signature = (id: "int") -> "Literal['memory', 'disk'] | None")]
    fn location(&self, id: u64) -> Option<&'static str> {
        location(self.inner.location(id))
    }
    /// Forgets `id`; returns where it was held.
    #[pyo3(signature = (id: "int") -> "Literal['memory', 'disk'] | None")]
    fn drop(&mut self, id: u64) -> Option<&'static str> {
        location(self.inner.drop(id))
    }
    fn __len__(&self) -> usize {
        self.inner.in_memory() + self.inner.on_disk()
    }
    fn __repr__(&self) -> String {
        let c = &self.inner;
        let (evictions, hits, misses) = c.counts();
        format!(
            "HostCacheIndex(entries={}, on_disk={}, used={}/{} bytes, evictions={evictions}, hits={hits}, misses={misses})",
            c.in_memory(),
            c.on_disk(),
            c.used(),
            c.capacity(),
        )
    }
}
