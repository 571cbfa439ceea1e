//! HiCache's host copy of an SGLang pool's slots (`SglangPool.host_copy`, documented there): a
//! get gathers the slots' states into one buffer, a load writes them from SGLang's host copies
//! (`mamba_cache_cpu`), on the host by the core itself or on CUDA staged by the core for the
//! caller's `run`. Its arguments (the slots, a load's host copies, the buffer) and the pool's
//! tensors are checked before anything is copied.

use super::conversion::{items, Arg, Tensor};
use super::launch::KernelLaunch;
use super::sglang::check_held;
use super::sglang_pool::SglangPool;
use crate::error::{Error, ErrorKind};
use crate::sglang;
use crate::sglang::hicache::Direction;
use crate::sglang::host;
use crate::sglang::Repeats;
use crate::tensor::TensorDesc;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

impl SglangPool {
    /// `SglangPool.host_copy`: the copy `op` of the slots `indices` (see its docstring).
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    pub(super) fn run_host_copy<'py>(
        &self,
        py: Python<'py>,
        op: &Bound<'py, PyAny>,
        indices: &Bound<'py, PyAny>,
        alloc: &Bound<'py, PyAny>,
        run: Option<&Bound<'py, PyAny>>,
        err: Option<&Bound<'py, PyAny>>,
        mamba_cache_cpu: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<(Bound<'py, PyAny>, Vec<(u64, u64, Vec<i64>, String)>)>> {
        let op = String::arg(op, "host_copy: op", ErrorKind::Plan)?;
        let op = op.as_str();
        // The host copies' objects are held until the call returns (their memory is read then).
        let (direction, ids, held, host) = match op {
            "get_cpu_copy" => (Direction::Get, self.slot_ids(op, "indices", indices, Repeats::Allowed)?, Vec::new(), Vec::new()),
            "load_cpu_copy" => {
                let none = py.None().into_bound(py);
                let (ids, held, descs) = self.load_args(py, mamba_cache_cpu.unwrap_or(&none), indices)?;
                (Direction::Load, ids, held, descs)
            }
            _ => return Err(Error::plan(format!("host_copy: op {op:?} is neither get_cpu_copy nor load_cpu_copy")).into()),
        };
        let call = self.inner.host_copy(direction, ids.clone())?;
        let dtype = |k: usize| self.inner.states[k].dtype_name().to_string();
        let blocks = || call.blocks.iter().enumerate().map(|(k, b)| (b.offset, b.bytes, b.shape.clone(), dtype(k))).collect();
        if !self.device.is_cuda() {
            if direction == Direction::Load {
                let load = || {
                    Self::check_host_copies(&held, &host)?;
                    Ok(host::load(&call, &self.inner.states, &ids, &host)?)
                };
                return self.write(py, load).map(|_| None);
            }
            let (buffer, out) = self.copy_buffer(op, alloc, call.total)?;
            let bytes: &mut [u8] = if call.total == 0 {
                &mut [] // an empty tensor's address may be null, which no slice may have
            } else {
                // SAFETY: the buffer is a writable host vector of `call.total` bytes that its
                // storage holds, apart from the pool's tensors, which were checked too (by
                // `copy_buffer`; no Python code of the caller's has run since), alive while
                // `buffer` is held.
                unsafe { std::slice::from_raw_parts_mut(out.data_ptr as *mut u8, call.total as usize) }
            };
            host::get(&call, &self.inner.states, &ids, bytes)?;
            return Ok(Some((buffer, blocks())));
        }
        let (Some(run), Some(err)) = (run, err) else {
            return Err(Error::plan(format!("{op}: run and err are needed on CUDA")).into());
        };
        let err_desc = Tensor::arg(err, &format!("{op}: err"), ErrorKind::Plan)?.0;
        if call.total == 0 {
            return Ok(None);
        }
        let (buffer, out) = self.copy_buffer(op, alloc, call.total)?;
        self.write(py, || {
            Self::check_host_copies(&held, &host)?;
            let bytes = call.stage(out.data_ptr, &host)?;
            let launch = call.launch(out.data_ptr, &err_desc)?.map(KernelLaunch::new);
            check_held(err, &format!("{op}: err"), err_desc.data_ptr, 12, ErrorKind::Plan)?;
            sglang::checks::check_apart(&format!("{op}: err is"), &err_desc, 12, &self.inner.tensors())?;
            run.call1((&buffer, PyBytes::new(py, &bytes), call.staged_at / 4, launch, ids.len()))?;
            Ok(())
        })?;
        Ok((direction == Direction::Get).then(|| (buffer, blocks())))
    }

    /// A load's slots `indices` (none twice), then the pool's tensors, then its host copies
    /// `mamba_cache_cpu`, checked: the slots, and the host copies in the order of `[*conv,
    /// temporal]` (each object with its description).
    #[allow(clippy::type_complexity)]
    fn load_args<'py>(
        &self,
        py: Python<'py>,
        mamba_cache_cpu: &Bound<'py, PyAny>,
        indices: &Bound<'py, PyAny>,
    ) -> PyResult<(Vec<i64>, Vec<Bound<'py, PyAny>>, Vec<TensorDesc>)> {
        let ids = self.slot_ids("load_cpu_copy", "indices", indices, Repeats::Refused)?;
        self.guard().check(py)?;
        let kind = ErrorKind::Plan;
        let pool = &self.inner.states;
        let parts = items(mamba_cache_cpu, "load_cpu_copy: mamba_cache_cpu", kind, "(conv_cpu, temporal_cpu)")?;
        if !(2..=3).contains(&parts.len()) {
            return Err(Error::plan(format!("load_cpu_copy: mamba_cache_cpu has {} parts; expected (conv_cpu, temporal_cpu)", parts.len())).into());
        }
        let conv = items(&parts[0], "load_cpu_copy: mamba_cache_cpu[0] (conv_cpu)", kind, "host tensors")?;
        if conv.len() + 1 != pool.len() {
            return Err(Error::plan(format!("load_cpu_copy: conv_cpu has {} tensors, the pool {}", conv.len(), pool.len() - 1)).into());
        }
        let mut host = conv;
        host.push(parts[1].clone());
        let mut descs = Vec::with_capacity(host.len());
        for (k, (dst, src)) in pool.iter().zip(&host).enumerate() {
            let state = sglang::checks::state_label(k, pool.len());
            let h = Tensor::arg(src, &format!("load_cpu_copy: {state} (host copy)"), kind)?.0;
            sglang::check_host_copy(&state, dst, &h, ids.len())?;
            descs.push(h);
        }
        Ok((ids, host, descs))
    }

    /// Checks that each of a load's host copies (`objs`, described as `descs`) is still held by its
    /// storage (read next: right before the read).
    fn check_host_copies(objs: &[Bound<'_, PyAny>], descs: &[TensorDesc]) -> PyResult<()> {
        for (k, (obj, d)) in objs.iter().zip(descs).enumerate() {
            if let Some((lo, hi)) = sglang::checks::span(d) {
                let what = format!("load_cpu_copy: {} (host copy)", sglang::checks::state_label(k, descs.len()));
                check_held(obj, &what, lo, hi - lo, ErrorKind::Plan)?;
            }
        }
        Ok(())
    }

    /// The buffer of HiCache's host copy `op` of `total` bytes: `alloc(total / 4)`, then the pool's
    /// tensors checked (a pool tensor freed since it was bound is reported as such, not as a
    /// buffer over its old memory), then the buffer ([`sglang::checks::check_copy_buffer`]: a
    /// writable, contiguous int32 vector on the pool's device, apart from the pool's tensors; held
    /// by its storage, as every tensor is checked when it is described). Returns it and its
    /// description.
    fn copy_buffer<'py>(&self, op: &str, alloc: &Bound<'py, PyAny>, total: u64) -> PyResult<(Bound<'py, PyAny>, TensorDesc)> {
        let n = total / 4;
        let buffer = alloc.call1((n,))?;
        let what = format!("{op}: alloc({n}) returned");
        let out = Tensor::arg(&buffer, &what, ErrorKind::Plan)?.0;
        self.guard().check(buffer.py())?;
        sglang::checks::check_copy_buffer(op, &out, &self.device, total, &self.inner.tensors())?;
        Ok((buffer, out))
    }
}
