//! The core's [`TensorDesc`] of a Python object, made from the object itself without reading its
//! memory: a torch tensor, a `__cuda_array_interface__` object (a CuPy array) or a numpy array.

use crate::tensor::TensorDesc;
use pyo3::exceptions::PyAttributeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple};
use std::sync::Mutex;

/// What an object turned out to be.
pub(crate) enum Described {
    Tensor(TensorDesc),
    /// A tensor the core cannot use, and why (a sparse or nested torch tensor, or one whose storage
    /// no longer holds the bytes it spans).
    Dense(String),
    /// Not a tensor or array.
    Unknown,
}

/// numpy's dtype name of an array-interface type string (`"<i4"` -> `"int32"`).
fn typestr_name(typestr: &str) -> String {
    let code = typestr.trim_start_matches(['<', '>', '|', '=']);
    let name = match code {
        "i1" => "int8",
        "i2" => "int16",
        "i4" => "int32",
        "i8" => "int64",
        "u1" => "uint8",
        "u2" => "uint16",
        "u4" => "uint32",
        "u8" => "uint64",
        "f2" => "float16",
        "f4" => "float32",
        "f8" => "float64",
        "b1" => "bool",
        other => other,
    };
    name.to_string()
}

/// A description from an array interface dict (`__array_interface__` or
/// `__cuda_array_interface__`): C-order strides where it gives none.
fn from_interface(iface: &Bound<'_, PyDict>, device: &str, writable: bool) -> PyResult<TensorDesc> {
    let get = |k: &str| iface.get_item(k).ok().flatten();
    let data = get("data");
    let data_ptr: u64 = data.as_ref().map(|d| d.get_item(0)).transpose()?.map(|p| p.extract()).transpose()?.unwrap_or(0);
    // A read-only array interface marks its memory `(ptr, True)`.
    let read_only: bool = data.map(|d| d.get_item(1)).transpose()?.map(|p| p.extract()).transpose()?.unwrap_or(false);
    let typestr: String = get("typestr").map(|t| t.extract()).transpose()?.unwrap_or_default();
    let shape: Vec<i64> = get("shape").map(|s| s.extract()).transpose()?.unwrap_or_default();
    let dtype = typestr_name(&typestr);
    let mut t = TensorDesc::dense(data_ptr, &dtype, &shape, device);
    if let Some(s) = get("strides").filter(|s| !s.is_none()) {
        t.strides = s.extract()?;
    }
    t.writable = writable && !read_only;
    Ok(t)
}

/// `torch.strided`, looked up once (torch's layouts are singletons: compared by identity).
fn strided(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static STRIDED: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    STRIDED.get_or_try_init(py, || Ok::<_, PyErr>(py.import("torch")?.getattr("strided")?.unbind())).map(|s| s.bind(py))
}

/// torch's tensor, dtype and device types, once a torch tensor has been described (torch is never
/// imported for a numpy array).
struct TorchTypes {
    tensor: Py<PyAny>,
    dtype: Py<PyAny>,
    device: Py<PyAny>,
}

static TORCH: PyOnceLock<TorchTypes> = PyOnceLock::new();

/// Remembers torch's types once torch is imported.
fn note_torch(py: Python<'_>) {
    if TORCH.get(py).is_some() {
        return;
    }
    let found = || -> PyResult<TorchTypes> {
        let torch = py.import("sys")?.getattr("modules")?.get_item("torch")?;
        Ok(TorchTypes {
            tensor: torch.getattr("Tensor")?.unbind(),
            dtype: torch.getattr("dtype")?.unbind(),
            device: torch.getattr("device")?.unbind(),
        })
    };
    if let Ok(t) = found() {
        let _ = TORCH.set(py, t);
    }
}

/// The spellings of the devices launches describe again and again (`str(device)`), keyed by the
/// device (devices compare equal): a handful of entries per process.
static SPELLED: PyOnceLock<Py<PyDict>> = PyOnceLock::new();

/// Whether `obj` is a torch dtype (`is_dtype`) or a torch device.
fn torch_kind(obj: &Bound<'_, PyAny>, is_dtype: bool) -> bool {
    let py = obj.py();
    let ty = obj.get_type();
    TORCH.get(py).is_some_and(|t| ty.is(if is_dtype { t.dtype.bind(py) } else { t.device.bind(py) }))
}

/// `str(device)`; remembered when `device` is a torch device.
fn spelled(device: &Bound<'_, PyAny>) -> PyResult<String> {
    if !torch_kind(device, false) {
        return Ok(device.str()?.to_string());
    }
    let cache = SPELLED.get_or_init(device.py(), || PyDict::new(device.py()).unbind()).bind(device.py());
    if let Some(s) = cache.get_item(device)? {
        return s.extract();
    }
    let s = device.str()?;
    cache.set_item(device, &s)?;
    Ok(s.to_string())
}

/// The torch dtypes described so far, by identity (a torch dtype is a singleton; each entry holds
/// its dtype, so the address names that dtype for as long as the entry lives), with the spelling
/// and element size [`dtype_of`] gives: found without hashing, a dictionary look-up or a conversion
/// of the remembered values. At most [`DTYPE_ENTRIES`] entries (torch has a few dozen dtypes); a
/// dtype found past that is spelled every time.
static DTYPES: Mutex<Vec<(Py<PyAny>, String, i64)>> = Mutex::new(Vec::new());

const DTYPE_ENTRIES: usize = 64;

/// `str(tensor.dtype)` and the tensor's element size. The element size of a torch dtype is the
/// dtype's own (`dtype.itemsize`, the element size of every tensor of that dtype), remembered with
/// its spelling, so a tensor is asked for its dtype only; another kind of dtype is spelled and the
/// tensor asked (`element_size()`) every time.
fn dtype_of(tensor: &Bound<'_, PyAny>) -> PyResult<(String, i64)> {
    let py = tensor.py();
    let dtype = tensor.getattr(intern!(py, "dtype"))?;
    if !torch_kind(&dtype, true) {
        return Ok((dtype.str()?.to_string(), tensor.call_method0(intern!(py, "element_size"))?.extract()?));
    }
    // No Python code runs while the lock is held (a poisoned lock only means a panic elsewhere:
    // the entries are whole either way).
    let known = |d: &Bound<'_, PyAny>| {
        let entries = DTYPES.lock().unwrap_or_else(|e| e.into_inner());
        entries.iter().find(|(k, _, _)| k.as_ptr() == d.as_ptr()).map(|(_, s, es)| (s.clone(), *es))
    };
    if let Some(found) = known(&dtype) {
        return Ok(found);
    }
    let (spelling, es): (String, i64) = (dtype.str()?.to_string(), dtype.getattr(intern!(py, "itemsize"))?.extract()?);
    let mut entries = DTYPES.lock().unwrap_or_else(|e| e.into_inner());
    if entries.len() < DTYPE_ENTRIES && !entries.iter().any(|(k, _, _)| k.as_ptr() == dtype.as_ptr()) {
        entries.push((dtype.unbind(), spelling.clone(), es));
    }
    Ok((spelling, es))
}

/// The integers of a tuple (`torch.Size`, `stride()`), read as a tuple; any other sequence through
/// the generic conversion.
fn ints(obj: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    match obj.cast::<PyTuple>() {
        Ok(t) => t.iter().map(|x| x.extract()).collect(),
        Err(_) => obj.extract(),
    }
}

/// Describes a torch tensor (an object with `data_ptr` and `element_size`); `data_ptr`: its
/// `data_ptr` method when the caller has looked it up already (called, not looked up again).
fn describe_torch(obj: &Bound<'_, PyAny>, data_ptr: Option<&Bound<'_, PyAny>>) -> PyResult<Described> {
    let py = obj.py();
    // A dense (strided) tensor only.
    if let Ok(layout) = obj.getattr(intern!(py, "layout")) {
        if !layout.is(strided(py)?) {
            let layout = layout.str()?.to_string();
            return Ok(Described::Dense(format!("a {layout} tensor cannot be used: tensors must be dense (torch.strided)")));
        }
    }
    let strides = ints(&obj.call_method0(intern!(py, "stride"))?)?;
    let (dtype, es) = dtype_of(obj)?;
    // Only a floating or complex tensor can require grad.
    let requires_grad = !dtype.starts_with("torch.int")
        && !dtype.starts_with("torch.uint")
        && dtype != "torch.bool"
        && obj.getattr(intern!(py, "requires_grad")).and_then(|r| r.extract()).unwrap_or(false);
    let t = TensorDesc {
        data_ptr: super::conversion::address_int(&match data_ptr {
            Some(f) => f.call0()?,
            None => obj.call_method0(intern!(py, "data_ptr"))?,
        })?,
        dtype,
        shape: ints(&obj.getattr(intern!(py, "shape"))?)?,
        strides: strides.into_iter().map(|s| s * es).collect(),
        device: spelled(&obj.getattr(intern!(py, "device"))?)?,
        writable: true,
        requires_grad,
    };
    Ok(match unheld(obj, &t, es)? {
        Some(reason) => Described::Dense(reason),
        None => Described::Tensor(t),
    })
}

/// Why the storage of the torch tensor `obj` (described as `t`, elements of `itemsize` bytes) does
/// not hold the bytes the tensor spans, or `None` when it does (or the tensor has no element or no
/// storage to ask): a kernel or a host copy sized by its shape would reach past the allocation.
fn unheld(obj: &Bound<'_, PyAny>, t: &TensorDesc, itemsize: i64) -> PyResult<Option<String>> {
    match crate::memory::extent(t, itemsize.max(1) as u64) {
        Some((lo, hi)) => super::conversion::storage_shortfall(obj, lo.into(), hi.into(), "read or written"),
        None => Ok(None),
    }
}

/// Describes `obj`; reads attributes only, never its memory.
pub(crate) fn describe(obj: &Bound<'_, PyAny>) -> PyResult<Described> {
    let py = obj.py();
    // An object of exactly torch's tensor type is a tensor without asking for its attributes.
    if TORCH.get(py).is_some_and(|t| obj.get_type().is(t.tensor.bind(py))) {
        return describe_torch(obj, None);
    }
    // `hasattr(obj, "data_ptr")`, the method kept for the description's one call of it.
    let data_ptr = match obj.getattr(intern!(py, "data_ptr")) {
        Ok(f) => Some(f),
        Err(e) if e.is_instance_of::<PyAttributeError>(py) => None,
        Err(e) => return Err(e),
    };
    if let Some(data_ptr) = data_ptr {
        if obj.hasattr(intern!(py, "element_size"))? {
            note_torch(py);
            return describe_torch(obj, Some(&data_ptr));
        }
    }
    if let Ok(iface) = obj.getattr(intern!(py, "__cuda_array_interface__")) {
        let device = match obj.getattr(intern!(py, "device")).and_then(|d| d.getattr(intern!(py, "id"))) {
            Ok(id) => format!("cuda:{}", id.extract::<i64>()?),
            Err(_) => "cuda".to_string(),
        };
        return from_interface(iface.cast::<PyDict>()?, &device, true).map(Described::Tensor);
    }
    if obj.hasattr(intern!(py, "__array_interface__"))? && obj.hasattr(intern!(py, "flags"))? {
        // A numpy array: host memory; `flags.writeable` says whether it may be written.
        let writable: bool = obj.getattr(intern!(py, "flags"))?.getattr(intern!(py, "writeable"))?.extract()?;
        let iface = obj.getattr(intern!(py, "__array_interface__"))?;
        return from_interface(iface.cast::<PyDict>()?, "cpu", writable).map(Described::Tensor);
    }
    Ok(Described::Unknown)
}
