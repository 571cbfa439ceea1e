//! The checks of the SGLang pool's operations that no planner covers: slot ids of the operations
//! without a "no slot" marker (`copy_from`, `clear_slots`, `get_cpu_copy`, `load_cpu_copy`), the
//! pool's tensors when the adapter is built (one layer count, no two tensors sharing memory), a
//! host copy loaded back into the pool (dtype, shape, host memory), and the slot vectors of a
//! `copy_from` on CUDA (and the constants its launch reads).

use crate::error::{Error, ErrorKind, Result};
use crate::kernels::args::{int_vector, on_same_device, IntType};
use crate::tensor::{Device, TensorDesc};

/// How an operation may name a slot twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repeats {
    /// Reading or zeroing a slot twice is harmless (`get_cpu_copy`, `clear_slots`).
    Allowed,
    /// Two writes of one slot in one call (`load_cpu_copy`) would leave one of them.
    Refused,
}

/// Checks the slot ids `ids`, the argument `arg` of operation `op`: every id is a slot of the pool
/// other than the dummy slot 0 (`1 ..= num_slots - 1`; a negative id is refused, never wrapped), and with
/// [`Repeats::Refused`] no slot is named twice.
pub fn check_slots(op: &str, arg: &str, ids: &[i64], num_slots: u64, repeats: Repeats) -> Result<()> {
    let last = num_slots.saturating_sub(1);
    let mut seen = std::collections::HashSet::new();
    for (i, &slot) in ids.iter().enumerate() {
        if slot < 0 {
            return Err(Error::plan(format!(
                "{op}: {arg}[{i}] = {slot}: a negative slot id is refused (it would wrap to a slot from the end); slots are 1 ..= {last}"
            )));
        }
        if slot == 0 {
            return Err(Error::plan(format!("{op}: {arg}[{i}] = 0 is the dummy slot (padded batches only); slots are 1 ..= {last}")));
        }
        if slot as u64 >= num_slots {
            return Err(Error::plan(format!("{op}: {arg}[{i}] = {slot} is outside the pool's slots 1 ..= {last}")));
        }
        if repeats == Repeats::Refused && !seen.insert(slot) {
            return Err(Error::plan(format!("{op}: {arg}[{i}] = {slot} is named twice; one call writes a slot once")));
        }
    }
    Ok(())
}

/// The bytes `[start, end)` a tensor's elements span (`None` when it has none).
pub fn span(t: &TensorDesc) -> Option<(u64, u64)> {
    crate::memory::extent(t, t.itemsize())
}

/// Checks the tensors of an SGLang pool (`(label, tensor)`: every conv tensor, the temporal state,
/// the verify scratch): each non-empty one is layer-stacked (`[layers, ...]`) with one layer
/// count for all, and no two of them span common memory (the same tensor passed twice would make
/// two layers alias one buffer).
pub fn check_pool(tensors: &[(String, &TensorDesc)]) -> Result<()> {
    let live: Vec<&(String, &TensorDesc)> = tensors.iter().filter(|(_, t)| t.shape.iter().all(|&n| n > 0) && !t.shape.is_empty()).collect();
    let stacked = live.iter().map(|(label, t)| match t.shape.len() {
        0 | 1 => Err(Error::binding(format!("SglangMambaPool: {label} has shape {:?}, not [layers, slots, ...]", t.shape))),
        _ => Ok((label.as_str(), *t)),
    });
    one_count(stacked, 0, "layers", "every tensor of the pool has one layer count")?;
    for (i, (a, ta)) in live.iter().enumerate() {
        for (b, tb) in &live[..i] {
            if ta.device != tb.device {
                continue;
            }
            if let (Some((a0, a1)), Some((b0, b1))) = (span(ta), span(tb)) {
                if a0 < b1 && b0 < a1 {
                    return Err(Error::binding(format!(
                        "SglangMambaPool: {a} and {b} share memory (the same tensor twice, or views of one buffer): two layers or states would alias one slot"
                    )));
                }
            }
        }
    }
    Ok(())
}

/// Checks that the state tensors of a pool (`(label, tensor)`: every conv tensor, then the temporal
/// state) that hold bytes have one slot count (`[layers, slots, ...]`, SGLang's `size + 1` for
/// every one): the slot kernel moves every tensor's slots below the pool's count, which for a
/// smaller tensor would run past its end.
pub fn check_slot_counts(states: &[(String, &TensorDesc)]) -> Result<()> {
    let holds = |t: &TensorDesc| t.shape.len() >= 2 && t.shape.iter().all(|&n| n > 0);
    let held = states.iter().filter(|(_, t)| holds(t)).map(|(l, t)| Ok((l.as_str(), *t)));
    one_count(held, 1, "slots", "every state tensor of the pool has one slot count")
}

/// Refuses the first of `tensors` (`(label, tensor)`, each with a dimension `dim`, or the error
/// that tensor is refused with, in order) whose size along `dim` (its `what`: layers, slots)
/// differs from the first one's, saying `rule`.
fn one_count<'a>(tensors: impl Iterator<Item = Result<(&'a str, &'a TensorDesc)>>, dim: usize, what: &str, rule: &str) -> Result<()> {
    let mut first: Option<(&str, i64)> = None;
    for tensor in tensors {
        let (label, t) = tensor?;
        match first {
            None => first = Some((label, t.shape[dim])),
            Some((name, n)) if n != t.shape[dim] => {
                return Err(Error::binding(format!("SglangMambaPool: {label} has {} {what}, {name} has {n}: {rule}", t.shape[dim])))
            }
            _ => {}
        }
    }
    Ok(())
}

/// The name of state tensor `k` of a pool's `count` (`conv[k]`, the last one `temporal`).
pub fn state_label(k: usize, count: usize) -> String {
    if k + 1 == count {
        "temporal".to_string()
    } else {
        format!("conv[{k}]")
    }
}

/// A host copy of one layer-stacked state (`[layers, len(slots), ...]`) may be loaded into the
/// pool's tensor `[layers, slots + 1, ...]` only from host memory, with the pool's dtype and shape
/// (SGLang would cast a mismatched dtype silently).
pub fn check_host_copy(state: &str, pool: &TensorDesc, host: &TensorDesc, num_slots: usize) -> Result<()> {
    let mut want = pool.shape.clone();
    if want.len() < 2 {
        return Err(Error::plan(format!("load_cpu_copy: {state}: the pool tensor has shape {:?}, not [layers, slots, ...]", pool.shape)));
    }
    want[1] = num_slots as i64;
    if host.device.trim() != "cpu" {
        return Err(Error::plan(format!("load_cpu_copy: {state}: the host copy is on {}, not on the host (cpu)", host.device)));
    }
    let (pd, hd) = (pool.dtype_name(), host.dtype_name());
    if pd != hd || host.shape != want {
        return Err(Error::plan(format!("load_cpu_copy: {state}: the host copy is {hd} {:?}, the pool needs {pd} {want:?}", host.shape)));
    }
    Ok(())
}

/// The number of copies of a `copy_from` on CUDA: `src` and `dst` (SGLang's `src_indices`,
/// `dst_indices`) are int32 vectors of one length on the pool's `device`, contiguous (the shell
/// narrows int64 ids on the device first); more copies than the pool's `num_slots - 1` slots past
/// the dummy slot 0 would write some slot twice. The slot values are the kernel's to check (it
/// reads them on the device and skips a bad one).
pub fn copy_count(src: &TensorDesc, dst: &TensorDesc, device: &Device, num_slots: u64) -> Result<i64> {
    let mut lens = [0u64; 2];
    for (len, (name, t)) in lens.iter_mut().zip([("src_indices", src), ("dst_indices", dst)]) {
        if !on_same_device(t, device) {
            return Err(Error::plan(format!("copy_from: {name} is on {}, the pool's states on {device}", t.device)));
        }
        *len = int_vector(t, &format!("copy_from: {name}"), 0, &[IntType::I32], ErrorKind::Plan)?.len;
    }
    let [n, m] = lens;
    if n != m {
        return Err(Error::plan(format!("copy_from: src_indices has {n} slot ids, dst_indices {m}: one source per destination")));
    }
    let last = num_slots.saturating_sub(1);
    if n > last {
        return Err(Error::plan(format!("copy_from: {n} copies into a pool of {last} slots (1 ..= {last}): some slot would be written twice")));
    }
    Ok(n as i64)
}

/// What `upload` returned for operation `op` (the records or constants its launches read):
/// `bytes` contiguous, 4-byte aligned bytes (uint8) on the pool's `device`.
pub fn check_uploaded(op: &str, t: &TensorDesc, device: &Device, bytes: u64) -> Result<()> {
    let fits = t.dtype_name() == "uint8" && t.shape == [bytes as i64] && t.strides == [1] && t.data_ptr % 4 == 0;
    if !on_same_device(t, device) || !fits {
        return Err(Error::plan(format!(
            "{op}: upload returned {} {:?} on {}; expected {bytes} contiguous, 4-byte aligned uint8 on {device}",
            t.dtype.trim(),
            t.shape,
            t.device
        )));
    }
    Ok(())
}

/// The buffer of HiCache's host copy `op` (`get_cpu_copy`, `load_cpu_copy`), `t` as `alloc(n)`
/// returned it: a writable, contiguous int32 vector of `total / 4` elements on the pool's `device`
/// (the host for host states), apart from every tensor of the pool (`pool`, labelled), which the
/// copy into the buffer would otherwise overwrite.
pub fn check_copy_buffer(op: &str, t: &TensorDesc, device: &Device, total: u64, pool: &[(&str, &TensorDesc)]) -> Result<()> {
    let n = total / 4;
    let fits = t.dtype_name() == "int32" && t.shape == [n as i64] && (n <= 1 || t.strides == [4]) && t.writable;
    if !on_same_device(t, device) || !fits {
        let read_only = if t.writable { "" } else { ", read-only" };
        return Err(Error::plan(format!(
            "{op}: alloc({n}) returned {} {:?} (byte strides {:?}{read_only}) on {}; expected a writable, contiguous int32 [{n}] on {device}",
            t.dtype_name(),
            t.shape,
            t.strides,
            t.device
        )));
    }
    check_apart(&format!("{op}: alloc({n}) returned"), t, total, pool)
}

/// Checks that the `bytes` bytes at the address of `t` (`what`: a buffer the core or a kernel
/// writes, or reads records from that steer its writes) share no memory with a tensor of the pool
/// (`pool`, labelled) on the same device: a write there would change the pool's states, or the
/// pool's writes the records.
pub fn check_apart(what: &str, t: &TensorDesc, bytes: u64, pool: &[(&str, &TensorDesc)]) -> Result<()> {
    let (lo, hi) = (t.data_ptr as u128, t.data_ptr as u128 + bytes as u128);
    for (label, p) in pool {
        if p.device != t.device || bytes == 0 {
            continue;
        }
        if let Some((a, b)) = span(p) {
            if lo < b as u128 && (a as u128) < hi {
                return Err(Error::plan(format!(
                    "{what} memory of the pool's {label} ({bytes} bytes at {:#x}): it would be written over the pool's states or by them; \
                     it must be a buffer of its own",
                    t.data_ptr
                )));
            }
        }
    }
    Ok(())
}
