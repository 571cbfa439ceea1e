//! Read-only byte buffers over the core's records (plan segments, rows, tiles, state metas, commit
//! rows and metas) and integer vectors: numpy views them without copying.

use crate::commit::{CommitMeta, CommitRow};
use crate::plan::segment::{StateMeta, Tile};
use crate::plan::CopyPlan;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use std::os::raw::c_int;
use std::sync::Arc;

enum Owner {
    Segments(Arc<CopyPlan>),
    Rows(Arc<CopyPlan>),
    Tiles(Vec<Tile>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    Meta(Vec<StateMeta>),
    Commit(Vec<CommitRow>),
    CommitMeta(Vec<CommitMeta>),
}

/// A read-only byte buffer over core records; numpy views it without copying.
#[pyclass(module = "recoverssm_rs._core", frozen)]
pub struct RawBuffer {
    owner: Owner,
}

fn as_bytes<T>(v: &[T]) -> (*const u8, usize) {
    (v.as_ptr() as *const u8, std::mem::size_of_val(v))
}

impl RawBuffer {
    pub(super) fn segments(p: Arc<CopyPlan>) -> RawBuffer {
        RawBuffer { owner: Owner::Segments(p) }
    }
    pub(super) fn rows(p: Arc<CopyPlan>) -> RawBuffer {
        RawBuffer { owner: Owner::Rows(p) }
    }
    pub(super) fn tiles(v: Vec<Tile>) -> RawBuffer {
        RawBuffer { owner: Owner::Tiles(v) }
    }
    pub(super) fn u32s(v: Vec<u32>) -> RawBuffer {
        RawBuffer { owner: Owner::U32(v) }
    }
    pub(super) fn i32s(v: Vec<i32>) -> RawBuffer {
        RawBuffer { owner: Owner::I32(v) }
    }
    pub(super) fn i64s(v: Vec<i64>) -> RawBuffer {
        RawBuffer { owner: Owner::I64(v) }
    }
    pub(super) fn state_meta(v: Vec<StateMeta>) -> RawBuffer {
        RawBuffer { owner: Owner::Meta(v) }
    }
    pub(super) fn commit_rows(v: Vec<CommitRow>) -> RawBuffer {
        RawBuffer { owner: Owner::Commit(v) }
    }
    pub(super) fn commit_meta(v: Vec<CommitMeta>) -> RawBuffer {
        RawBuffer { owner: Owner::CommitMeta(v) }
    }
    fn bytes(&self) -> (*const u8, usize) {
        match &self.owner {
            Owner::Segments(p) => as_bytes(p.segments()),
            Owner::Rows(p) => as_bytes(p.rows()),
            Owner::Tiles(t) => as_bytes(t),
            Owner::U32(v) => as_bytes(v),
            Owner::I32(v) => as_bytes(v),
            Owner::I64(v) => as_bytes(v),
            Owner::Meta(m) => as_bytes(m),
            Owner::Commit(c) => as_bytes(c),
            Owner::CommitMeta(m) => as_bytes(m),
        }
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

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RawBuffer>()?;
    Ok(())
}
