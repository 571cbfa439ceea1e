//! The bound tensors of a planner, a state cache or a transfer pool, kept alive and checked before
//! every write: a tensor re-pointed (`set_()`, `.data = x`, `resize_()` to a larger size) or a
//! storage resized or freed (`untyped_storage().resize_(0)`), or a numpy (or CuPy) array made
//! read-only after it was bound (`flags.writeable = False`: its array interface says so), is a
//! binding error naming the tensor, and nothing is written. A torch tensor over memory meant to be
//! immutable (`torch.frombuffer` of `bytes`, `torch.from_numpy` of a read-only array) carries no
//! such mark that torch exposes, and cannot be told apart. After a write, autograd's version counter of what was written is bumped,
//! as torch's own in-place operations do.
//!
//! The guard holds strong references to every bound tensor and every distinct storage (an
//! immutable list: nothing it checked can be freed between the check and the copy by dropping the
//! caller's references). It cannot stop another Python thread from resizing a storage while a host
//! copy runs with the GIL released: that is a data race in the caller's program.

use super::conversion::address_int as addr;
use crate::error::Error;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTuple;

struct Entry {
    obj: Py<PyAny>,
    /// The bound `data_ptr` method that gives `obj`'s address: a tensor's own; for a storage, that
    /// of a one-byte tensor over it (a tensor's `data_ptr()` costs less than a storage's; the
    /// storage's own when no such tensor can be made); `None` for a numpy or CuPy array (its array
    /// interface is read instead).
    data_ptr: Option<Py<PyAny>>,
    /// How a storage's size is read: `len(storage)` (its byte count, through the type's slot) or
    /// its bound `nbytes` method; `None` for tensors.
    size: Option<Size>,
    ptr: u64,
    /// Bytes of a storage (`nbytes()`); `None` for tensors.
    nbytes: Option<u64>,
    label: String,
}

/// How a storage entry's byte count is read.
enum Size {
    Len,
    Method(Py<PyAny>),
}

/// A one-byte `uint8` tensor over the start of `storage` (it follows the storage's memory when
/// the storage is resized or freed), whose `data_ptr()` is the storage's address; `None` when
/// `storage` holds no byte (`nbytes`: torch's `set_` would grow it to one) or is not one torch
/// can view.
fn storage_probe<'py>(storage: &Bound<'py, PyAny>, nbytes: u64) -> Option<Bound<'py, PyAny>> {
    if nbytes == 0 {
        return None;
    }
    let py = storage.py();
    let torch = py.import("torch").ok()?;
    let kw = pyo3::types::PyDict::new(py);
    kw.set_item("dtype", torch.getattr("uint8").ok()?).ok()?;
    kw.set_item("device", storage.getattr(intern!(py, "device")).ok()?).ok()?;
    let empty = torch.call_method("empty", ((0,),), Some(&kw)).ok()?;
    empty.call_method1("set_", (storage, 0, (1,), (1,))).ok()
}

/// Bound tensors and storages with the addresses (and storage sizes) they were bound at.
pub(crate) struct Guard {
    entries: Vec<Entry>,
    /// The torch tensors (bases of views) whose version counters a write bumps (a tuple, made
    /// once: each write passes it as is).
    roots: Option<Py<PyTuple>>,
}

/// The data address an array interface (`__array_interface__` or `__cuda_array_interface__`)
/// gives, and whether it marks the memory read-only (`data = (ptr, True)`).
fn interface_address(obj: &Bound<'_, PyAny>) -> PyResult<(u64, bool)> {
    let py = obj.py();
    let iface = match obj.getattr(intern!(py, "__cuda_array_interface__")) {
        Ok(i) => i,
        Err(_) => obj.getattr(intern!(py, "__array_interface__"))?,
    };
    let data = iface.get_item("data")?;
    Ok((addr(&data.get_item(0)?)?, data.get_item(1)?.is_truthy()?))
}

fn address(py: Python<'_>, e: &Entry) -> PyResult<(u64, bool)> {
    match &e.data_ptr {
        // A storage whose address cannot be read any more (a torch that refuses `data_ptr()` of
        // a tensor over freed memory) reads as freed: address 0.
        Some(f) if e.size.is_some() => Ok((f.bind(py).call0().and_then(|p| addr(&p)).unwrap_or(0), false)),
        Some(f) => Ok((addr(&f.bind(py).call0()?)?, false)),
        None => interface_address(e.obj.bind(py)),
    }
}

impl Guard {
    /// The bound tensors' addresses (as bound, so as checked) and labels, in binding order.
    pub(crate) fn tensors(&self) -> impl Iterator<Item = (u64, &str)> {
        self.entries.iter().filter(|e| e.nbytes.is_none()).map(|e| (e.ptr, e.label.as_str()))
    }

    /// Guards `tensors` (torch tensors or numpy arrays), each with the label its errors use.
    pub(crate) fn new(py: Python<'_>, tensors: &[(Bound<'_, PyAny>, String)]) -> PyResult<Guard> {
        let mut storages: Vec<Entry> = Vec::new();
        let mut entries: Vec<Entry> = Vec::new();
        let mut roots: Vec<Py<PyAny>> = Vec::new();
        let mut seen: Vec<(String, u64)> = Vec::new();
        for (t, label) in tensors {
            if !t.hasattr(intern!(py, "data_ptr"))? {
                // A numpy array or a `__cuda_array_interface__` object (a CuPy array).
                let (ptr, _) = interface_address(t)?;
                entries.push(Entry { obj: t.clone().unbind(), data_ptr: None, size: None, ptr, nbytes: None, label: label.clone() });
                continue;
            }
            let data_ptr = t.getattr(intern!(py, "data_ptr"))?;
            let ptr = data_ptr.call0()?.extract()?;
            entries.push(Entry { obj: t.clone().unbind(), data_ptr: Some(data_ptr.unbind()), size: None, ptr, nbytes: None, label: label.clone() });
            if let Ok(storage) = t.call_method0(intern!(py, "untyped_storage")) {
                let (sp, nb) = (storage.getattr(intern!(py, "data_ptr"))?, storage.getattr(intern!(py, "nbytes"))?);
                let (ptr, nbytes): (u64, u64) = (sp.call0()?.extract()?, nb.call0()?.extract()?);
                let key = (t.getattr(intern!(py, "device"))?.str()?.to_string(), ptr);
                if !seen.contains(&key) {
                    seen.push(key);
                    // The cheaper readers, each used only where it reads what the storage's own
                    // methods read at binding.
                    let probe = storage_probe(&storage, nbytes).map(|p| p.getattr(intern!(py, "data_ptr"))).transpose()?;
                    let probe = probe.filter(|f| f.call0().and_then(|p| addr(&p)).is_ok_and(|p| p == ptr));
                    let size = match storage.len() {
                        Ok(n) if n as u64 == nbytes => Size::Len,
                        _ => Size::Method(nb.unbind()),
                    };
                    storages.push(Entry {
                        obj: storage.unbind(),
                        data_ptr: Some(probe.unwrap_or(sp).unbind()),
                        size: Some(size),
                        ptr,
                        nbytes: Some(nbytes),
                        label: label.clone(),
                    });
                }
            }
            // Views share their base's version counter: bump one tensor per base. Inference
            // tensors have no version counter.
            let inference = t.call_method0(intern!(py, "is_inference")).and_then(|x| x.extract::<bool>()).unwrap_or(true);
            if !inference {
                let base = t.getattr(intern!(py, "_base"))?;
                let root = if base.is_none() { t.clone() } else { base };
                if !roots.iter().any(|r| r.bind(py).is(&root)) {
                    roots.push(root.unbind());
                }
            }
        }
        // Storages first: a freed storage is reported as such, not as the tensor it left empty.
        storages.extend(entries);
        let roots = if roots.is_empty() { None } else { Some(PyTuple::new(py, roots)?.unbind()) };
        Ok(Guard { entries: storages, roots })
    }

    /// Raises `BindingError` naming the first bound tensor or storage whose memory changed, or
    /// the first array made read-only since it was bound.
    pub(crate) fn check(&self, py: Python<'_>) -> PyResult<()> {
        for e in &self.entries {
            let (ptr, read_only) = address(py, e)?;
            if read_only {
                return Err(Error::binding(format!(
                    "{}: the array was made read-only after it was bound (flags.writeable = False); nothing was written",
                    e.label
                ))
                .into());
            }
            let nbytes = match &e.size {
                Some(Size::Len) => Some(e.obj.bind(py).len()? as u64),
                Some(Size::Method(f)) => Some(addr(&f.bind(py).call0()?)?),
                None => None,
            };
            if ptr != e.ptr || nbytes != e.nbytes {
                let what = match (e.nbytes, nbytes) {
                    (Some(old), Some(new)) => {
                        format!("its storage was resized or freed ({old} bytes at {:#x} when bound, now {new} bytes at {ptr:#x})", e.ptr)
                    }
                    _ => format!(
                        "the tensor no longer points at the memory it was bound with ({:#x} when bound, now {ptr:#x}: set_(), resize_() or .data = ...)",
                        e.ptr
                    ),
                };
                return Err(Error::binding(format!("{}: {what}; nothing was written: bind the tensors again", e.label)).into());
            }
        }
        Ok(())
    }

    /// Bumps autograd's version counters of the bound torch tensors (after a write).
    pub(crate) fn mark_written(&self, py: Python<'_>) -> PyResult<()> {
        let Some(roots) = &self.roots else {
            return Ok(());
        };
        // torch's C function (what `torch.autograd.graph.increment_version` calls, without its
        // Python frame), over the tuple where it takes a sequence (an empty one is its probe);
        // else one call per tensor, of it or, where it is absent, of that function.
        static INCREMENT: PyOnceLock<(Py<PyAny>, bool)> = PyOnceLock::new();
        let (f, sequence) = INCREMENT.get_or_try_init(py, || -> PyResult<(Py<PyAny>, bool)> {
            match py.import("torch._C").and_then(|c| c.getattr("_increment_version")) {
                Ok(f) => {
                    let sequence = f.call1((PyTuple::empty(py),)).is_ok();
                    Ok((f.unbind(), sequence))
                }
                Err(_) => Ok((py.import("torch.autograd.graph")?.getattr("increment_version")?.unbind(), false)),
            }
        })?;
        if *sequence {
            f.bind(py).call1((roots.bind(py),))?;
        } else {
            for t in roots.bind(py).iter() {
                f.bind(py).call1((t,))?;
            }
        }
        Ok(())
    }

    /// Storages and tensors guarded.
    pub(crate) fn counts(&self) -> (usize, usize) {
        let storages = self.entries.iter().filter(|e| e.nbytes.is_some()).count();
        (self.entries.len() - storages, storages)
    }
}

/// Tensors bound by a state cache or a transfer pool, guarded as a planner guards its own.
#[pyclass(module = "recoverssm_rs._core", frozen)]
pub struct BoundTensors {
    guard: Guard,
}

impl BoundTensors {
    /// The guard, for the bindings' own guarded calls (a transfer's check-copy-record).
    pub(crate) fn guard(&self) -> &Guard {
        &self.guard
    }
}

#[pymethods]
impl BoundTensors {
    /// `tensors`: `(tensor, label)` pairs; the label names the tensor in errors.
    #[new]
    #[pyo3(signature = (tensors: "Sequence[tuple[_Tensor, str]]"))]
    fn new(py: Python<'_>, tensors: Vec<(Bound<'_, PyAny>, String)>) -> PyResult<Self> {
        Ok(BoundTensors { guard: Guard::new(py, &tensors)? })
    }
    /// Raises `BindingError` when a bound tensor or storage no longer has the memory it was bound
    /// with (nothing has been written then).
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        self.guard.check(py)
    }
    /// Bumps autograd's version counters of the bound torch tensors (after a write).
    fn mark_written(&self, py: Python<'_>) -> PyResult<()> {
        self.guard.mark_written(py)
    }
    /// One guarded write: `check()`, then `write()`, then `mark_written()`, in one call (`write`
    /// is not called when a tensor moved). Returns what `write` returns.
    #[pyo3(signature = (write: "Callable[[], _T]") -> "_T")]
    fn guarded(&self, py: Python<'_>, write: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.guard.check(py)?;
        let out = write.call0()?.unbind();
        self.guard.mark_written(py)?;
        Ok(out)
    }
    fn __len__(&self) -> usize {
        self.guard.entries.len()
    }
    fn __repr__(&self) -> String {
        let (tensors, storages) = self.guard.counts();
        format!("BoundTensors({tensors} tensors, {storages} storages)")
    }
}
