//! The slot kernel of SGLang's pool (`rs_slot_scatter`, `kernels/slot_scatter.cu`): one launch
//! zeroes slots (`clear_slots`) or moves accepted verify states into slots (the speculative commit,
//! commit and track passes together), for every layer and state tensor, reading the engine's index
//! vectors in device memory (no host synchronisation). [`slot_table`] describes each (layer, state
//! tensor) as a [`SlotCopy`] record, checked once; [`slot_launch`] checks and packs each call.

use crate::error::{Error, Result};
use crate::kernels::abi::Launch;
use crate::kernels::args::{int_vector, DeviceVector, IntType};
use crate::kernels::constants::{MAX_GRID_YZ, MAX_STATE_CHUNKS, STATE_CHUNK_BYTES, THREADS};
pub use crate::kernels::records::slots::SlotCopy;
use crate::kernels::records::{MutPtr, Ptr, SlotScatterParams};
use crate::tensor::{Device, TensorDesc};

/// Merges adjacent dims that continue each other and drops size-1 dims: `(size, byte stride)`.
fn merged(shape: &[i64], strides: &[i64]) -> Vec<(i64, i64)> {
    let mut out: Vec<(i64, i64)> = Vec::new();
    for (&n, &s) in shape.iter().zip(strides) {
        if n == 1 {
            continue;
        }
        match out.last_mut() {
            Some(last) if last.1 == n * s => *last = (last.0 * n, s),
            _ => out.push((n, s)),
        }
    }
    out
}

fn itemsize(t: &TensorDesc, what: &str) -> Result<u64> {
    Ok(t.state_dtype().map_err(|e| Error::plan(format!("{what}: {}", e.message)))?.itemsize())
}

/// The [`SlotCopy`] records of every layer of every state tensor, in tensor order then layer order.
/// `states[i]` is a pool tensor `[layers, slots, ...]` whose slots are dense; `scratch[i]` its
/// verify scratch `[layers, rows, draft, ...]` (same dtype, layers and per-slot shape) or `None`
/// (the records then only serve clearing). All tensors on one CUDA device.
pub fn slot_table(states: &[TensorDesc], scratch: &[Option<TensorDesc>]) -> Result<Vec<SlotCopy>> {
    if states.len() != scratch.len() {
        return Err(Error::plan(format!("{} state tensors but {} scratch entries", states.len(), scratch.len())));
    }
    let mut out = Vec::new();
    let device = states.first().map(|t| t.device.clone());
    let first = scratch.iter().flatten().next().map(|s| (s.shape.get(1).copied(), s.shape.get(2).copied()));
    for (i, (st, sc)) in states.iter().zip(scratch).enumerate() {
        let what = format!("state tensor {i}");
        if Device::parse(&st.device).map_or(true, |d| !d.is_cuda()) || Some(&st.device) != device.as_ref() {
            return Err(Error::plan(format!("{what}: expected a CUDA tensor on {}, got {}", device.unwrap_or_default(), st.device)));
        }
        if !st.writable {
            return Err(Error::plan(format!("{what}: the tensor is read-only")));
        }
        let elem = itemsize(st, &what)?;
        if st.shape.len() < 2 || st.shape.iter().any(|&n| n < 0) {
            return Err(Error::plan(format!("{what}: expected [layers, slots, ...], got shape {:?}", st.shape)));
        }
        let inner = &st.shape[2..];
        let count: i64 = inner.iter().product();
        let dense = merged(inner, &st.strides[2..]);
        if !(dense.is_empty() || (dense.len() == 1 && dense[0].1 == elem as i64)) {
            return Err(Error::plan(format!("{what}: a slot's state must be dense (shape {:?}, byte strides {:?})", st.shape, st.strides)));
        }
        let bytes = count as u64 * elem;
        let mut rec = SlotCopy {
            bytes,
            rows: 1,
            cols: count as u64,
            src_pitch: 0,
            src_col_stride: elem,
            elem_bytes: elem as u32,
            tensor: i as u32,
            ..Default::default()
        };
        rec.dst_slot_stride = st.strides[1] as u64;
        if let Some(sc) = sc {
            let w = format!("the verify scratch of {what}");
            if sc.device != st.device
                || sc.dtype_name() != st.dtype_name()
                || sc.shape.len() != st.shape.len() + 1
                || sc.shape[0] != st.shape[0]
                || sc.shape[3..] != *inner
            {
                return Err(Error::plan(format!(
                    "{w}: expected {} [{}, rows, draft, {:?}] on {}, got {} {:?} on {}",
                    st.dtype_name(),
                    st.shape[0],
                    inner,
                    st.device,
                    sc.dtype_name(),
                    sc.shape,
                    sc.device
                )));
            }
            if Some((sc.shape.get(1).copied(), sc.shape.get(2).copied())) != first {
                return Err(Error::plan(format!("{w}: {:?} rows and draft differ from the first scratch's {:?}", &sc.shape[1..3], first)));
            }
            if sc.strides.iter().any(|&s| s < 0) {
                return Err(Error::plan(format!("{w}: negative strides {:?}", sc.strides)));
            }
            let m = merged(inner, &sc.strides[3..]);
            let (rows, pitch, cols, col) = match m.as_slice() {
                [] => (1, 0, 1, elem as i64),
                [(c, cs)] => (1, 0, *c, *cs),
                [(r, p), (c, cs)] => (*r, *p, *c, *cs),
                _ => {
                    return Err(Error::plan(format!(
                        "{w}: a scratch entry of more than two strided axes (shape {:?}, byte strides {:?})",
                        sc.shape, sc.strides
                    )))
                }
            };
            if pitch as u64 % elem != 0 || col as u64 % elem != 0 || sc.data_ptr % elem != 0 || sc.strides.iter().any(|&s| s as u64 % elem != 0) {
                return Err(Error::plan(format!("{w}: strides {:?} are not multiples of the element size {elem}", sc.strides)));
            }
            rec = SlotCopy {
                rows: rows as u64,
                cols: cols as u64,
                src_pitch: pitch as u64,
                src_col_stride: col as u64,
                src_row_stride: sc.strides[1] as u64,
                src_step_stride: sc.strides[2] as u64,
                ..rec
            };
        }
        if st.data_ptr % elem != 0 || st.strides[..2].iter().any(|&s| s < 0 || s as u64 % elem != 0) {
            return Err(Error::plan(format!("{what}: layer and slot strides {:?} must be non-negative multiples of {elem}", &st.strides[..2])));
        }
        for layer in 0..st.shape[0] as u64 {
            let mut r = rec;
            r.dst = st.data_ptr + layer * st.strides[0] as u64;
            if let Some(sc) = sc {
                r.src = sc.data_ptr + layer * sc.strides[0] as u64;
            }
            out.push(r);
        }
    }
    Ok(out)
}

/// One call of the slot kernel: `slots` (and, for the commit, `steps`, optional `rows` and the
/// optional track pass) as device vectors of int64.
#[derive(Clone, Copy, Debug)]
pub struct SlotCall<'a> {
    pub slots: &'a TensorDesc,
    /// `None`: clear the slots (zero every byte); otherwise the commit's accepted steps.
    pub steps: Option<&'a TensorDesc>,
    pub rows: Option<&'a TensorDesc>,
    pub track_slots: Option<&'a TensorDesc>,
    pub track_steps: Option<&'a TensorDesc>,
    pub err: &'a TensorDesc,
    /// What errors name: the operation (`""`: none) and its vectors, in the order `slots`,
    /// `steps`, `rows`, `track_slots`, `track_steps` (the engine's names; [`KERNEL_NAMES`]: the
    /// kernel's own).
    pub names: (&'a str, [&'a str; 5]),
}

/// The kernel's own names of a [`SlotCall`]'s vectors (what its errors name without an engine's).
pub const KERNEL_NAMES: (&str, [&str; 5]) = ("", ["slots", "steps", "rows", "track_slots", "track_steps"]);

/// What a launch of `rs_slot_scatter` runs over: `num_meta` records at device address `metas` on
/// `device`, whose largest slot is `max_bytes` bytes, for a pool of `num_slots` slots (the dummy
/// slot 0 included) and a scratch of `num_rows` rows of `draft` steps.
#[derive(Clone, Copy, Debug)]
pub struct SlotPool<'a> {
    pub device: &'a Device,
    pub metas: u64,
    pub num_meta: u32,
    pub max_bytes: u64,
    pub num_slots: i64,
    pub num_rows: i64,
    pub draft: i64,
}

/// The launch of `rs_slot_scatter` for call `c` over `pool`. Every vector is int64, one length
/// (`err`: int32, 3 elements); `None` when nothing is to launch.
pub fn slot_launch(pool: &SlotPool<'_>, c: &SlotCall<'_>) -> Result<Option<Launch>> {
    let SlotPool { device, metas, num_meta, max_bytes, num_slots, num_rows, draft } = *pool;
    let (op, names) = c.names;
    let op = if op.is_empty() { String::new() } else { format!("{op}: ") };
    let vector = |t: &TensorDesc, what: &str| -> Result<DeviceVector> {
        let v = int_vector(t, &format!("{op}{what}"), 0, &[IntType::I64], crate::error::ErrorKind::Plan)?;
        if Device::parse(&t.device).ok().as_ref() != Some(device) {
            return Err(Error::plan(format!("{op}{what} is on {}, the pool on {device}", t.device)));
        }
        Ok(v)
    };
    let slots = vector(c.slots, names[0])?;
    let n = slots.len;
    let mut ptrs = [0u64; 4];
    let named = [(names[1], c.steps), (names[2], c.rows), (names[3], c.track_slots), (names[4], c.track_steps)];
    for (k, (what, t)) in named.into_iter().enumerate() {
        if let Some(t) = t {
            let v = vector(t, what)?;
            if v.len != n {
                return Err(Error::plan(format!("{op}{what} has {} elements, {} has {n}", v.len, names[0])));
            }
            ptrs[k] = v.ptr;
        }
    }
    if c.steps.is_none() && (c.rows.is_some() || c.track_slots.is_some()) {
        return Err(Error::plan(format!("{op}clearing slots takes no rows or track slots")));
    }
    if c.track_slots.is_some() != c.track_steps.is_some() {
        return Err(Error::plan(format!("{op}{} and {} go together (the track pass)", names[3], names[4])));
    }
    let err = int_vector(c.err, &format!("{op}err"), 3, &[IntType::I32], crate::error::ErrorKind::Plan)?;
    if Device::parse(&c.err.device).ok().as_ref() != Some(device) {
        return Err(Error::plan(format!("{op}err is on {}, the pool on {device}: the kernel writes its error word there", c.err.device)));
    }
    if num_slots < 1 || num_rows < 0 || draft < 0 {
        return Err(Error::plan(format!("bad sizes: slots {num_slots}, rows {num_rows}, draft {draft}")));
    }
    let n32 = i32::try_from(n).map_err(|_| Error::plan(format!("too many requests ({n})")))?;
    if n == 0 || num_meta == 0 {
        return Ok(None);
    }
    let passes: u64 = if c.track_slots.is_some() { 2 } else { 1 };
    let chunks = max_bytes.div_ceil(STATE_CHUNK_BYTES).clamp(1, MAX_STATE_CHUNKS as u64) as u32;
    let fold = |x: u64| x.clamp(1, MAX_GRID_YZ as u64) as u32;
    let grid = [chunks, fold(n), fold(num_meta as u64 * passes)];
    let [steps, rows, track_slots, track_steps] = ptrs.map(Ptr::at);
    let params = SlotScatterParams {
        metas: Ptr::at(metas),
        slots: Ptr::at(slots.ptr),
        steps,
        rows,
        track_slots,
        track_steps,
        err: MutPtr::at(err.ptr),
        num_slots,
        num_rows,
        draft,
        num_meta,
        num_requests: n32,
    };
    Ok(Some(Launch::new(&params, grid, [THREADS, 1, 1])))
}
