//! Descriptions of the launch layer's device arguments, made by the core from the objects
//! themselves: a torch tensor, a `__cuda_array_interface__` object (a CuPy array) or a numpy array
//! become `(data_ptr, dtype, shape, byte_strides, device)` without reading their memory. A 5-tuple
//! in that form passes as it is (tests describe host arrays as device ones).

use crate::kernels::DeviceArg;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// `(data_ptr, dtype, shape, byte_strides, device)` of one device argument.
pub(super) type ArgTuple = (u64, String, Vec<i64>, Vec<i64>, String);

fn from_tuple(t: ArgTuple) -> DeviceArg {
    let (data_ptr, dtype, shape, strides, device) = t;
    DeviceArg { data_ptr, dtype, shape, strides, device }
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

/// C-order byte strides of `shape` with `itemsize`-byte elements.
fn c_strides(shape: &[i64], itemsize: i64) -> Vec<i64> {
    let mut strides = vec![0; shape.len()];
    let mut acc = itemsize;
    for i in (0..shape.len()).rev() {
        strides[i] = acc;
        acc *= shape[i].max(1);
    }
    strides
}

fn itemsize_of(typestr: &str) -> i64 {
    typestr.trim_start_matches(['<', '>', '|', '=']).get(1..).and_then(|n| n.parse().ok()).unwrap_or(1)
}

fn from_interface(py: Python<'_>, iface: &Bound<'_, PyDict>, device: String) -> PyResult<DeviceArg> {
    let get = |k: &str| iface.get_item(k).ok().flatten();
    let data_ptr: u64 = get("data").map(|d| d.get_item(0)).transpose()?.map(|p| p.extract()).transpose()?.unwrap_or(0);
    let typestr: String = get("typestr").map(|t| t.extract()).transpose()?.unwrap_or_default();
    let shape: Vec<i64> = get("shape").map(|s| s.extract()).transpose()?.unwrap_or_default();
    let strides = match get("strides").filter(|s| !s.is_none()) {
        Some(s) => s.extract()?,
        None => c_strides(&shape, itemsize_of(&typestr)),
    };
    let _ = py;
    Ok(DeviceArg { data_ptr, dtype: typestr_name(&typestr), shape, strides, device })
}

/// The description of `obj`, or `None` when it is none of the kinds described.
pub(super) fn describe(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Option<DeviceArg>> {
    if let Ok(t) = obj.cast::<PyTuple>() {
        if t.len() == 5 {
            return Ok(Some(from_tuple(t.extract()?)));
        }
        return Ok(None);
    }
    if obj.hasattr(intern!(py, "data_ptr"))? && obj.hasattr(intern!(py, "element_size"))? {
        // A torch tensor.
        let es: i64 = obj.call_method0(intern!(py, "element_size"))?.extract()?;
        let strides: Vec<i64> = obj.call_method0(intern!(py, "stride"))?.extract()?;
        return Ok(Some(DeviceArg {
            data_ptr: obj.call_method0(intern!(py, "data_ptr"))?.extract()?,
            dtype: obj.getattr(intern!(py, "dtype"))?.str()?.to_string(),
            shape: obj.getattr(intern!(py, "shape"))?.extract()?,
            strides: strides.into_iter().map(|s| s * es).collect(),
            device: obj.getattr(intern!(py, "device"))?.str()?.to_string(),
        }));
    }
    if let Ok(iface) = obj.getattr(intern!(py, "__cuda_array_interface__")) {
        let device = match obj.getattr(intern!(py, "device")).and_then(|d| d.getattr(intern!(py, "id"))) {
            Ok(id) => format!("cuda:{}", id.extract::<i64>()?),
            Err(_) => "cuda".to_string(),
        };
        return from_interface(py, iface.cast::<PyDict>()?, device).map(Some);
    }
    if obj.hasattr(intern!(py, "__array_interface__"))? && obj.hasattr(intern!(py, "ctypes"))? {
        // A numpy array: host memory.
        let iface = obj.getattr(intern!(py, "__array_interface__"))?;
        return from_interface(py, iface.cast::<PyDict>()?, "cpu".to_string()).map(Some);
    }
    Ok(None)
}

/// `(data_ptr, dtype, shape, byte_strides, device)` of a torch tensor, a CuPy array (or any
/// `__cuda_array_interface__` object) or a numpy array; `None` for anything else.
#[pyfunction]
pub(super) fn describe_arg(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Option<ArgTuple>> {
    Ok(describe(py, obj)?.map(|a| (a.data_ptr, a.dtype, a.shape, a.strides, a.device)))
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(describe_arg, m)?)?;
    Ok(())
}
