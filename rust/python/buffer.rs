//! Read-only byte buffers over the core's records (plan segments, rows, tiles, state metas, commit
//! rows and metas) and integer vectors: numpy views them without copying.

use crate::plan::CopyPlan;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use std::os::raw::c_int;
use std::sync::Arc;

/// Memory a buffer exports: `(address, bytes)` of plain `#[repr(C)]` values it owns (or holds
/// alive), never mutated while the buffer lives.
pub(crate) trait Exported: Send + Sync {
    fn span(&self) -> (*const u8, usize);
}

impl<T: Copy + Send + Sync> Exported for Vec<T> {
    fn span(&self) -> (*const u8, usize) {
        (self.as_ptr() as *const u8, std::mem::size_of_val(self.as_slice()))
    }
}

/// A plan's segment records, viewed in place.
pub(crate) struct Segments(pub Arc<CopyPlan>);
/// A plan's compact per-request rows, viewed in place.
pub(crate) struct Rows(pub Arc<CopyPlan>);

impl Exported for Segments {
    fn span(&self) -> (*const u8, usize) {
        let s = self.0.segments();
        (s.as_ptr() as *const u8, std::mem::size_of_val(s))
    }
}

impl Exported for Rows {
    fn span(&self) -> (*const u8, usize) {
        let r = self.0.rows();
        (r.as_ptr() as *const u8, std::mem::size_of_val(r))
    }
}

/// A read-only byte buffer over core records; numpy views it without copying.
#[pyclass(module = "recoverssm_rs._core", frozen)]
pub struct RawBuffer {
    owner: Box<dyn Exported>,
}

impl RawBuffer {
    pub(crate) fn new(owner: impl Exported + 'static) -> RawBuffer {
        RawBuffer { owner: Box::new(owner) }
    }
    fn bytes(&self) -> (*const u8, usize) {
        self.owner.span()
    }
}

#[pymethods]
impl RawBuffer {
    fn __len__(&self) -> usize {
        self.bytes().1
    }

    fn __repr__(&self) -> String {
        format!("RawBuffer({} bytes)", self.bytes().1)
    }

    /// # Safety
    /// Called by the interpreter with a valid `view`. The exported memory is owned by `slf` (or by
    /// an immutable plan it holds), never mutated, and `view.obj` keeps `slf` alive.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("view is null"));
        }
        if (flags & ffi::PyBUF_WRITABLE) == ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err("plan buffers are read-only"));
        }
        let (ptr, len) = slf.get().bytes();
        let rc = ffi::PyBuffer_FillInfo(view, slf.as_ptr(), ptr as *mut _, len as ffi::Py_ssize_t, 1, flags);
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }
}
