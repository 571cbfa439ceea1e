//! The host integer arrays a call reads (`conversion.rs` re-exports them): a 1-D vector
//! ([`Ints`]), a 2-D table ([`Table`]) and one table per group ([`Tables`]), each read from a
//! buffer (numpy array, memoryview) of int32 or int64, a CPU tensor of those (only what its storage
//! holds), or a (nested) list of host integers. Every error names the argument (and the entry).

use super::conversion::{arg_error, int_in, items, storage_shortfall, type_name, Arg};
use crate::error::ErrorKind;
use pyo3::buffer::PyBuffer;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

/// An integer array's values and shape: a buffer (numpy array, memoryview) of int32 or int64, a
/// CPU tensor of those, or a (nested) list of Python integers.
fn int_array(obj: &Bound<'_, PyAny>, name: &str, kind: ErrorKind) -> PyResult<(Vec<i64>, Vec<usize>)> {
    let py = obj.py();
    let what = || {
        let dtype = obj.getattr(intern!(py, "dtype")).and_then(|d| d.str()).map(|s| s.to_string());
        match dtype {
            Ok(d) => format!("{} of {d}", type_name(obj)),
            Err(_) => type_name(obj),
        }
    };
    let refused = || arg_error(kind, format!("{name} must be an int32 or int64 array (numpy array, CPU tensor or list of ints), got {}", what()));
    if let Ok(b) = PyBuffer::<i64>::get(obj) {
        return native(&b, name, kind).and_then(|_| Ok((b.to_vec(py)?, b.shape().to_vec())));
    }
    if let Ok(b) = PyBuffer::<i32>::get(obj) {
        native(&b, name, kind)?;
        let v: Vec<i32> = b.to_vec(py)?;
        return Ok((v.into_iter().map(i64::from).collect(), b.shape().to_vec()));
    }
    if obj.hasattr(intern!(py, "numpy"))? && obj.hasattr(intern!(py, "device"))? {
        // A torch tensor: a host view of CPU memory; device memory is never read here.
        let device = obj.getattr(intern!(py, "device"))?.str()?.to_string();
        if device != "cpu" {
            return Err(arg_error(
                kind,
                format!(
                    "{name} is on {device}; host plans read host inputs (copying them to the host would synchronise the device): pass \
                     CPU arrays, or launch the device path, which reads its inputs in device memory"
                ),
            ));
        }
        let host = obj.call_method0(intern!(py, "detach"))?.call_method0(intern!(py, "numpy")).map_err(|_| refused())?;
        // Read only what the tensor's storage holds: `numpy()` views a shrunk storage past its
        // end, and over a freed one (a null address) hands out a new uninitialised buffer.
        if let Ok(b) = PyBuffer::<i64>::get(&host) {
            held_by_storage(obj, &b, name, kind)?;
        } else if let Ok(b) = PyBuffer::<i32>::get(&host) {
            held_by_storage(obj, &b, name, kind)?;
        }
        return int_array(&host, name, kind).map_err(|_| refused());
    }
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        return nested_ints(obj, name, kind)?.ok_or_else(refused);
    }
    Err(refused())
}

/// Refuses a host view `b` of the CPU tensor `obj` (the argument `name`) that its storage does not
/// hold: a storage freed (`untyped_storage().resize_(0)`) or shrunk since the tensor was made
/// ([`storage_shortfall`]); nothing is read.
fn held_by_storage<T: pyo3::buffer::Element>(obj: &Bound<'_, PyAny>, b: &PyBuffer<T>, name: &str, kind: ErrorKind) -> PyResult<()> {
    // The bytes the view spans, from its lowest to its highest element (strides may be negative).
    let shape = b.shape().iter().map(|&n| n as i64).collect();
    let view = crate::tensor::TensorDesc::new(b.buf_ptr() as usize as u64, "", shape, b.strides().iter().map(|&s| s as i64).collect(), "cpu");
    let Some((lo, hi)) = crate::memory::extent(&view, b.item_size() as u64) else {
        return Ok(()); // nothing to read
    };
    match storage_shortfall(obj, lo.into(), hi.into(), "read")? {
        Some(why) => Err(arg_error(kind, format!("{name}: {why}"))),
        None => Ok(()),
    }
}

/// Refuses a byte-swapped buffer.
fn native<T: pyo3::buffer::Element>(b: &PyBuffer<T>, name: &str, kind: ErrorKind) -> PyResult<()> {
    let swapped = cfg!(target_endian = "little") && matches!(b.format().to_bytes().first(), Some(b'>') | Some(b'!'));
    if swapped {
        return Err(arg_error(kind, format!("{name} must be in native byte order, got a byte-swapped array")));
    }
    Ok(())
}

/// A list of ints (1-D) or a list of equal-length lists of ints (2-D); `None` for any other
/// structure. An entry that is not a host integer, or does not fit an int64, is an error naming
/// it (`name[i]`, `name[i][j]`) and its value.
fn nested_ints(obj: &Bound<'_, PyAny>, name: &str, kind: ErrorKind) -> PyResult<Option<(Vec<i64>, Vec<usize>)>> {
    let Some(items) = obj.try_iter().ok().and_then(|it| it.collect::<PyResult<Vec<_>>>().ok()) else {
        return Ok(None);
    };
    let nested = items.first().is_some_and(|x| x.is_instance_of::<PyList>() || x.is_instance_of::<PyTuple>());
    if !nested {
        if items.iter().any(|x| x.is_instance_of::<PyList>() || x.is_instance_of::<PyTuple>()) {
            return Ok(None); // ragged: a row among ints
        }
        let v = items
            .iter()
            .enumerate()
            .map(|(i, x)| int_in::<i64>(x, &format!("{name}[{i}]"), kind, i64::MIN.into(), i64::MAX as u128))
            .collect::<PyResult<Vec<i64>>>()?;
        let n = v.len();
        return Ok(Some((v, vec![n])));
    }
    let mut out = Vec::new();
    let mut cols = None;
    for (r, row) in items.iter().enumerate() {
        if !(row.is_instance_of::<PyList>() || row.is_instance_of::<PyTuple>()) {
            return Ok(None); // ragged: an int among rows
        }
        let Some((v, shape)) = nested_ints(row, &format!("{name}[{r}]"), kind)? else {
            return Ok(None);
        };
        if shape.len() != 1 || *cols.get_or_insert(shape[0]) != shape[0] {
            return Ok(None);
        }
        out.extend(v);
    }
    Ok(Some((out, vec![items.len(), cols.unwrap_or(0)])))
}

/// A 1-D integer vector (one entry per request, or a list of block ids).
pub(crate) struct Ints(pub Vec<i64>);

impl Arg for Ints {
    fn arg(obj: &Bound<'_, PyAny>, name: &str, kind: ErrorKind) -> PyResult<Self> {
        let (v, shape) = int_array(obj, name, kind)?;
        if shape.len() != 1 {
            return Err(arg_error(kind, format!("{name} must be 1-D, got shape {shape:?}")));
        }
        Ok(Ints(v))
    }
}

/// A 2-D `[rows, cols]` integer table, row-major.
pub(crate) struct Table {
    pub ids: Vec<i64>,
    pub cols: usize,
}

impl Arg for Table {
    fn arg(obj: &Bound<'_, PyAny>, name: &str, kind: ErrorKind) -> PyResult<Self> {
        let (ids, shape) = int_array(obj, name, kind)?;
        match shape[..] {
            [_, cols] => Ok(Table { ids, cols }),
            _ => Err(arg_error(kind, format!("{name} must be 2-D [requests, cols], got shape {shape:?}"))),
        }
    }
}

/// One block table per group: a list of 2-D tables (a single 2-D table for one group).
pub(crate) struct Tables(pub Vec<Table>);

impl Tables {
    pub fn views(&self) -> Vec<crate::plan::GroupTable<'_>> {
        self.0.iter().map(|t| crate::plan::GroupTable { ids: &t.ids, cols: t.cols }).collect()
    }
}

impl Arg for Tables {
    /// An array (anything with a `dtype`) is the table of a one-group step; anything else must be a
    /// list (or tuple, or iterable) of tables, one per group.
    fn arg(obj: &Bound<'_, PyAny>, name: &str, kind: ErrorKind) -> PyResult<Self> {
        if obj.hasattr(intern!(obj.py(), "dtype")).unwrap_or(false) {
            return Ok(Tables(vec![Table::arg(obj, name, kind)?]));
        }
        let tables = items(obj, name, kind, "block tables (one per group)")?;
        Ok(Tables(tables.iter().enumerate().map(|(g, t)| Table::arg(t, &format!("group {g}: {name}"), kind)).collect::<PyResult<_>>()?))
    }
}
