//! The core's [`TensorDesc`] of a Python object, made from the object itself without reading its
//! memory: a torch tensor, a `__cuda_array_interface__` object (a CuPy array) or a numpy array.

use crate::tensor::TensorDesc;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;

/// What an object turned out to be.
pub(crate) enum Described {
    Tensor(TensorDesc),
    /// A tensor the core cannot describe, and why (a sparse or nested torch tensor).
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

/// Describes `obj`; reads attributes only, never its memory.
pub(crate) fn describe(obj: &Bound<'_, PyAny>) -> PyResult<Described> {
    let py = obj.py();
    if obj.hasattr(intern!(py, "data_ptr"))? && obj.hasattr(intern!(py, "element_size"))? {
        // A torch tensor: a dense (strided) one.
        if let Ok(layout) = obj.getattr(intern!(py, "layout")) {
            if !layout.is(strided(py)?) {
                let layout = layout.str()?.to_string();
                return Ok(Described::Dense(format!("a {layout} tensor cannot be used: tensors must be dense (torch.strided)")));
            }
        }
        let strides: Vec<i64> = obj.call_method0(intern!(py, "stride"))?.extract()?;
        let es: i64 = obj.call_method0(intern!(py, "element_size"))?.extract()?;
        let dtype = obj.getattr(intern!(py, "dtype"))?.str()?.to_string();
        // Only a floating or complex tensor can require grad.
        let requires_grad = !dtype.starts_with("torch.int")
            && !dtype.starts_with("torch.uint")
            && dtype != "torch.bool"
            && obj.getattr(intern!(py, "requires_grad")).and_then(|r| r.extract()).unwrap_or(false);
        return Ok(Described::Tensor(TensorDesc {
            data_ptr: obj.call_method0(intern!(py, "data_ptr"))?.extract()?,
            dtype,
            shape: obj.getattr(intern!(py, "shape"))?.extract()?,
            strides: strides.into_iter().map(|s| s * es).collect(),
            device: obj.getattr(intern!(py, "device"))?.str()?.to_string(),
            writable: true,
            requires_grad,
        }));
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
