//! The pool's operations on host states, run by the core (the host counterpart of the slot kernel,
//! [`super::kernel`]): zeroing slots, the commit's moves, and HiCache's copies between the slots
//! and dense blocks. Every operation checks every index against the extent of the tensor it indexes
//! (a layer below its layer count, a slot, row or step below its axis) and every tensor (on the
//! host, writable where written, non-negative strides) before it moves the first byte; each
//! address is then the tensor's address plus in-extent indices times its strides, inside the
//! memory it describes (which the caller keeps alive and checked: the pool's guard).

use super::hicache::HostCopy;
use crate::error::{Error, Result};
use crate::tensor::TensorDesc;

/// Host memory described by an address, a shape and byte strides: one slot (or scratch entry) of a
/// host tensor, or a whole host tensor; its elements are walked in C order.
struct Entry<'a> {
    at: u64,
    shape: &'a [i64],
    strides: &'a [i64],
    elem: i64,
}

/// Checks `t`, the tensor `what`: on the host, writable when `write`, at least `axes` axes (the
/// indexed ones), non-negative strides.
fn check(t: &TensorDesc, what: &str, axes: usize, write: bool) -> Result<()> {
    if t.device.trim() != "cpu" || t.data_ptr == 0 {
        return Err(Error::plan(format!("{what}: expected host memory, got a tensor on {}", t.device)));
    }
    if write && !t.writable {
        return Err(Error::plan(format!("{what}: the tensor is read-only")));
    }
    if t.shape.len() < axes || t.strides.len() != t.shape.len() || t.strides.iter().any(|&s| s < 0) {
        return Err(Error::plan(format!("{what}: expected {axes} leading axes and non-negative strides, got {:?} / {:?}", t.shape, t.strides)));
    }
    t.state_dtype()?;
    Ok(())
}

/// Checks that `index` lies inside axis `axis` of `t` (`what` names the tensor, `name` the index).
fn check_index(t: &TensorDesc, what: &str, axis: usize, name: &str, index: i64) -> Result<()> {
    if index < 0 || index >= t.shape[axis] {
        return Err(Error::plan(format!("{what}: {name} {index} is outside 0 ..= {}", t.shape[axis] - 1)));
    }
    Ok(())
}

/// The bytes of one element of `t` (checked by [`check`]: a state dtype).
fn itemsize(t: &TensorDesc) -> i64 {
    t.state_dtype().map_or(1, |d| d.itemsize() as i64)
}

/// The entry of `t` (checked by [`check`]; its elements `elem` bytes, [`itemsize`]) at the leading
/// indices `index` (checked by [`check_index`]).
fn entry<'a>(t: &'a TensorDesc, elem: i64, index: &[i64]) -> Entry<'a> {
    let offset: i64 = index.iter().zip(&t.strides).map(|(i, s)| i * s).sum();
    Entry { at: t.data_ptr + offset as u64, shape: &t.shape[index.len()..], strides: &t.strides[index.len()..], elem }
}

impl Entry<'_> {
    fn bytes(&self) -> usize {
        (self.shape.iter().map(|&n| n.max(0)).product::<i64>() * self.elem) as usize
    }

    /// Calls `f(address, bytes)` for each contiguous run of the entry's elements, in C order (a
    /// negative stride walks down from `at`).
    fn runs(&self, mut f: impl FnMut(u64, usize)) {
        if self.bytes() == 0 {
            return;
        }
        let (mut k, mut run) = (self.shape.len(), self.elem);
        while k > 0 && (self.shape[k - 1] == 1 || self.strides[k - 1] == run) {
            run *= self.shape[k - 1];
            k -= 1;
        }
        let mut index = vec![0i64; k];
        loop {
            let offset: i64 = index.iter().zip(self.strides).map(|(i, s)| i * s).sum();
            f((self.at as i64 + offset) as u64, run as usize);
            let mut d = k;
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                index[d] += 1;
                if index[d] < self.shape[d] {
                    break;
                }
                index[d] = 0;
            }
        }
    }

    /// Copies the entry's bytes, in C order, into `out` (as many bytes: another length is a bug
    /// of the caller's, a panic before any byte is copied).
    fn read_into(&self, mut out: &mut [u8]) {
        assert_eq!(out.len(), self.bytes(), "a host read of an entry of {} bytes into {}", self.bytes(), out.len());
        self.runs(|at, n| {
            // SAFETY: every run lies inside the entry's memory (in-extent indices, the strides of
            // the tensor it is part of); `out` is not that memory.
            unsafe { std::ptr::copy_nonoverlapping(at as *const u8, out.as_mut_ptr(), n) };
            out = &mut std::mem::take(&mut out)[n..];
        });
    }

    /// Writes `data` (the entry's bytes in C order) over the entry. A `data` of another length is
    /// a bug of the caller's: a panic, before any byte is read past its end.
    fn write(&self, mut data: &[u8]) {
        assert_eq!(data.len(), self.bytes(), "a host write of {} bytes over an entry of {}", data.len(), self.bytes());
        self.runs(|at, n| {
            // SAFETY: as `read`; the tensor is writable (checked) and `data` is not its memory.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), at as *mut u8, n) };
            data = &data[n..];
        });
    }
}

/// Zeroes the slots `ids` of every layer of every tensor of `states` (`[layers, slots, ...]`).
pub fn clear(states: &[TensorDesc], ids: &[i64]) -> Result<()> {
    check_states("clear_slots", states, ids, true)?;
    let mut zeros = Vec::new();
    for t in states.iter().filter(|t| holds_bytes(t)) {
        let elem = itemsize(t);
        for layer in 0..t.shape[0] {
            for &s in ids {
                let e = entry(t, elem, &[layer, s]);
                zeros.resize(e.bytes(), 0); // zeros only: nothing ever writes into it
                e.write(&zeros);
            }
        }
    }
    Ok(())
}

/// The commit's `moves` (`(slot, row, step)`, in order) for each `(state, scratch)` pair: slot
/// `slot` of the state (`[layers, slots, ...]`) gets entry `(row, step)` of its scratch
/// (`[layers, rows, draft, ...]`, the state's dtype and per-slot shape), layer by layer.
pub fn commit(pairs: &[(&TensorDesc, &TensorDesc)], moves: &[(i64, i64, i64)]) -> Result<()> {
    for (k, (st, sc)) in pairs.iter().enumerate() {
        let (what, w) = (format!("commit_after_verify: state tensor {k}"), format!("commit_after_verify: the verify scratch of state tensor {k}"));
        check(st, &what, 2, true)?;
        check(sc, &w, 3, false)?;
        if sc.dtype_name() != st.dtype_name() || sc.shape[0] != st.shape[0] || sc.shape[3..] != st.shape[2..] {
            return Err(Error::plan(format!(
                "{w}: {} {:?} does not match the state's {} {:?}",
                sc.dtype_name(),
                sc.shape,
                st.dtype_name(),
                st.shape
            )));
        }
        for &(slot, row, step) in moves {
            check_index(st, &what, 1, "slot", slot)?;
            check_index(sc, &w, 1, "row", row)?;
            check_index(sc, &w, 2, "step", step)?;
        }
    }
    let mut buf = Vec::new();
    for (st, sc) in pairs {
        let (es, ec) = (itemsize(st), itemsize(sc));
        for layer in 0..st.shape[0] {
            for &(slot, row, step) in moves {
                // Through a buffer: a scratch entry may share memory with the slot it is written to.
                let from = entry(sc, ec, &[layer, row, step]);
                buf.resize(from.bytes(), 0);
                from.read_into(&mut buf);
                entry(st, es, &[layer, slot]).write(&buf);
            }
        }
    }
    Ok(())
}

/// For each state tensor `k` with bytes: `block(k, layer, r)` is the slot `ids[r]` of layer `layer`
/// in its dense block (`[layers, len(ids), ...]`): its byte range in the call's buffer.
fn block_range(call: &HostCopy, states: &[TensorDesc], k: usize, layer: i64, r: usize, n: usize) -> std::ops::Range<usize> {
    let slot = (call.blocks[k].bytes / (states[k].shape[0] as u64 * n as u64)) as usize;
    let at = call.blocks[k].offset as usize + (layer as usize * n + r) * slot;
    at..at + slot
}

/// Whether `t` holds bytes (the others are skipped: an empty tensor may have no address).
fn holds_bytes(t: &TensorDesc) -> bool {
    !t.shape.is_empty() && t.shape.iter().all(|&n| n > 0)
}

/// Checks the states of a host copy of the slots `ids` (those that hold bytes).
fn check_states(op: &str, states: &[TensorDesc], ids: &[i64], write: bool) -> Result<()> {
    for (k, t) in states.iter().enumerate().filter(|(_, t)| holds_bytes(t)) {
        let what = format!("{op}: state tensor {k}");
        check(t, &what, 2, write)?;
        ids.iter().try_for_each(|&s| check_index(t, &what, 1, "slot", s))?;
    }
    Ok(())
}

/// `get_cpu_copy` on host states: the slots `ids` of every state tensor gathered into its block of
/// `call` (laid out by [`HostCopy::new`]) in `out`, the call's buffer (at least `call.total` bytes).
pub fn get(call: &HostCopy, states: &[TensorDesc], ids: &[i64], out: &mut [u8]) -> Result<()> {
    if (out.len() as u64) < call.total {
        return Err(Error::plan(format!("get_cpu_copy: a buffer of {} bytes for {}", out.len(), call.total)));
    }
    check_states("get_cpu_copy", states, ids, false)?;
    for (k, t) in states.iter().enumerate().filter(|(_, t)| holds_bytes(t)) {
        let elem = itemsize(t);
        for layer in 0..t.shape[0] {
            for (r, &s) in ids.iter().enumerate() {
                entry(t, elem, &[layer, s]).read_into(&mut out[block_range(call, states, k, layer, r, ids.len())]);
            }
        }
    }
    Ok(())
}

/// `load_cpu_copy` on host states: every host copy (`host[k]`, `[layers, len(ids), ...]`, checked
/// by [`super::check_host_copy`]) read whole first (a copy that is a view of the pool is read
/// before any slot changes), then row `r` of each written into slot `ids[r]`.
pub fn load(call: &HostCopy, states: &[TensorDesc], ids: &[i64], host: &[TensorDesc]) -> Result<()> {
    if host.len() != states.len() {
        return Err(Error::plan(format!("load_cpu_copy: {} host copies for {} state tensors", host.len(), states.len())));
    }
    check_states("load_cpu_copy", states, ids, true)?;
    let mut staged = vec![0u8; call.blocks.last().map_or(0, |b| (b.offset + b.bytes) as usize)];
    // A load of no slots reads nothing (its host copies are empty, their address may be null).
    for (k, h) in host.iter().enumerate().filter(|&(k, _)| holds_bytes(&states[k]) && call.blocks[k].bytes > 0) {
        let b = &call.blocks[k];
        read_host(h, &mut staged[b.offset as usize..(b.offset + b.bytes) as usize])?;
    }
    for (k, t) in states.iter().enumerate().filter(|(_, t)| holds_bytes(t)) {
        let elem = itemsize(t);
        for layer in 0..t.shape[0] {
            for (r, &s) in ids.iter().enumerate() {
                entry(t, elem, &[layer, s]).write(&staged[block_range(call, states, k, layer, r, ids.len())]);
            }
        }
    }
    Ok(())
}

/// Copies the elements of the host tensor `t` (a load's host copy) in C order into `out` (its
/// bytes): `t` on the host with an address and exactly `out.len()` bytes of elements.
pub(super) fn read_host(t: &TensorDesc, out: &mut [u8]) -> Result<()> {
    let elem = t.state_dtype()?.itemsize() as usize;
    let count: i64 = t.shape.iter().product();
    if t.device.trim() != "cpu" || count as usize * elem != out.len() || t.data_ptr == 0 || t.strides.len() != t.shape.len() {
        return Err(Error::plan(format!(
            "load_cpu_copy: a host copy of {} bytes on {} for a block of {}",
            count as usize * elem,
            t.device,
            out.len()
        )));
    }
    // Every element address lies inside the host tensor, as its shape and strides describe it.
    Entry { at: t.data_ptr, shape: &t.shape, strides: &t.strides, elem: elem as i64 }.read_into(out);
    Ok(())
}
