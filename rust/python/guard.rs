//! The check that a planner's or a state cache's bound tensors still own the memory they were bound
//! with, run before every execute and every launch: a tensor re-pointed (`set_()`, `.data = x`,
//! `resize_()` to a larger size) or a storage resized or freed (`untyped_storage().resize_(0)`)
//! is a binding error naming the layer and state, and nothing is written.
//!
//! The guard holds strong references to every bound tensor and every distinct storage, so nothing
//! it checked can be freed between the check and the copy by dropping the caller's references
//! (`planner.states` is a copy). It cannot stop another Python thread from resizing a storage while
//! a host copy runs with the GIL released: that is a data race in the caller's program.

use super::to_py;
use crate::error::Error;
use pyo3::intern;
use pyo3::prelude::*;

/// How the guard reads an object's current data address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A torch tensor or storage: `data_ptr()`.
    DataPtr,
    /// A numpy array: `__array_interface__["data"][0]`.
    ArrayInterface,
}

struct Entry {
    obj: Py<PyAny>,
    /// `obj.data_ptr` and `obj.nbytes`, bound once (a call is then one C call, no lookup).
    data_ptr: Option<Py<PyAny>>,
    nbytes_fn: Option<Py<PyAny>>,
    kind: Kind,
    ptr: u64,
    /// Bytes of a storage (`nbytes()`); `None` for tensors.
    nbytes: Option<u64>,
    label: String,
}

/// Bound tensors and storages with the addresses (and storage sizes) they were bound at.
#[pyclass(module = "recoverssm_rs._core", frozen)]
pub struct StorageGuard {
    entries: Vec<Entry>,
}

fn address(py: Python<'_>, e: &Entry) -> PyResult<u64> {
    match (&e.data_ptr, e.kind) {
        (Some(f), _) => f.bind(py).call0()?.extract(),
        (None, _) => e.obj.bind(py).getattr(intern!(py, "__array_interface__"))?.get_item("data")?.get_item(0)?.extract(),
    }
}

fn bound_method(py: Python<'_>, obj: &Py<PyAny>, kind: Kind, name: &str) -> PyResult<Option<Py<PyAny>>> {
    match kind {
        Kind::DataPtr => Ok(Some(obj.bind(py).getattr(name)?.unbind())),
        Kind::ArrayInterface => Ok(None),
    }
}

#[pymethods]
impl StorageGuard {
    /// `tensors`: `(tensor, kind, data_ptr, label)` with kind `"data_ptr"` (torch) or
    /// `"array_interface"` (numpy); `storages`: `(storage, data_ptr, nbytes, label)` (torch).
    #[new]
    fn new(py: Python<'_>, tensors: Vec<(Py<PyAny>, String, u64, String)>, storages: Vec<(Py<PyAny>, u64, u64, String)>) -> PyResult<Self> {
        let mut entries = Vec::with_capacity(tensors.len() + storages.len());
        // Storages first: a freed storage is reported as such, not as the tensor it left empty.
        for (obj, ptr, nbytes, label) in storages {
            let data_ptr = bound_method(py, &obj, Kind::DataPtr, "data_ptr")?;
            let nbytes_fn = bound_method(py, &obj, Kind::DataPtr, "nbytes")?;
            entries.push(Entry { obj, data_ptr, nbytes_fn, kind: Kind::DataPtr, ptr, nbytes: Some(nbytes), label });
        }
        for (obj, kind, ptr, label) in tensors {
            let kind = match kind.as_str() {
                "data_ptr" => Kind::DataPtr,
                "array_interface" => Kind::ArrayInterface,
                other => return Err(to_py(py, Error::binding(format!("{label}: unknown tensor kind {other:?}")))),
            };
            let data_ptr = bound_method(py, &obj, kind, "data_ptr")?;
            entries.push(Entry { obj, data_ptr, nbytes_fn: None, kind, ptr, nbytes: None, label });
        }
        Ok(StorageGuard { entries })
    }

    /// Raises `BindingError` naming the first bound tensor or storage whose memory changed.
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        for e in &self.entries {
            let ptr = address(py, e)?;
            let nbytes = match &e.nbytes_fn {
                Some(f) => Some(f.bind(py).call0()?.extract::<u64>()?),
                None => None,
            };
            if ptr != e.ptr || nbytes != e.nbytes {
                let what = match (e.nbytes, nbytes) {
                    (Some(old), Some(new)) => format!(
                        "its storage was resized or freed ({old} bytes at {:#x} when bound, now {new} bytes at {ptr:#x})",
                        e.ptr
                    ),
                    _ => format!(
                        "the tensor no longer points at the memory it was bound with ({:#x} when bound, now {ptr:#x}: set_(), resize_() or .data = ...)",
                        e.ptr
                    ),
                };
                return Err(to_py(py, Error::binding(format!("{}: {what}; nothing was written: bind the tensors again", e.label))));
            }
        }
        Ok(())
    }

    fn __len__(&self) -> usize {
        self.entries.len()
    }

    fn __repr__(&self) -> String {
        let storages = self.entries.iter().filter(|e| e.nbytes.is_some()).count();
        format!("StorageGuard({} tensors, {storages} storages)", self.entries.len() - storages)
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<StorageGuard>()?;
    Ok(())
}
