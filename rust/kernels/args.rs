//! Arguments of the CUDA kernel launches, checked on the host before anything is launched: the
//! device tensors a step reads (block table, per-request vectors, accepted counts, error word). The
//! launch layer in Python only describes its arguments; it reads no device memory and keeps no rule
//! of its own. The launch builders (`copy`, `commit`) turn checked arguments into a packed launch.

use crate::error::{Error, ErrorKind, Result};
use crate::tensor::{Device, TensorDesc};

/// An integer element type a launch argument may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntType {
    I32,
    I64,
}

impl IntType {
    pub fn name(self) -> &'static str {
        match self {
            IntType::I32 => "int32",
            IntType::I64 => "int64",
        }
    }
    fn bytes(self) -> i64 {
        match self {
            IntType::I32 => 4,
            IntType::I64 => 8,
        }
    }
}

/// The element type of `a` if it is one of the `allowed` integer types.
fn int_type_among(a: &TensorDesc, allowed: &[IntType]) -> Option<IntType> {
    let name = a.dtype_name();
    allowed.iter().copied().find(|t| t.name() == name)
}

/// The element type of `a` among the `allowed` integer types.
fn int_type(a: &TensorDesc, what: &str, allowed: &[IntType], kind: ErrorKind) -> Result<IntType> {
    int_type_among(a, allowed).ok_or_else(|| {
        let names: Vec<&str> = allowed.iter().map(|t| t.name()).collect();
        err(kind, format!("{what}: expected {}, got {}", names.join(" or "), a.dtype.trim()))
    })
}

fn err(kind: ErrorKind, message: String) -> Error {
    Error { kind, message }
}

/// The argument lives in CUDA memory.
pub fn require_cuda(a: &TensorDesc, what: &str, kind: ErrorKind) -> Result<()> {
    match Device::parse(&a.device) {
        Ok(Device::Cuda(_)) => Ok(()),
        _ => Err(err(kind, format!("{what}: expected a CUDA tensor, got a tensor on {}", a.device))),
    }
}

/// A checked 1-D device vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceVector {
    pub ptr: u64,
    pub len: u64,
    pub dtype: IntType,
}

/// A checked 2-D device block table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceTable {
    pub ptr: u64,
    pub rows: u64,
    pub cols: u64,
    /// Elements between consecutive rows.
    pub row_stride: i64,
    /// Elements between consecutive groups' tables (a `[groups, requests, cols]` table; 0 for one
    /// group).
    pub group_stride: i64,
    pub dtype: IntType,
}

/// A 1-D integer vector of at least `min_len` elements (contiguous when longer than one element),
/// of one of the `allowed` types.
pub fn int_vector(a: &TensorDesc, what: &str, min_len: u64, allowed: &[IntType], kind: ErrorKind) -> Result<DeviceVector> {
    require_cuda(a, what, kind)?;
    let dtype = int_type(a, what, allowed, kind)?;
    let (&[n], &[stride]) = (&a.shape[..], &a.strides[..]) else {
        return Err(err(kind, format!("{what}: expected a 1-D vector of at least {min_len} elements, got shape {:?}", a.shape)));
    };
    let len = u64::try_from(n).map_err(|_| err(kind, format!("{what}: negative length {n}")))?;
    if len < min_len {
        return Err(err(kind, format!("{what}: expected a 1-D vector of at least {min_len} elements, got shape {:?}", a.shape)));
    }
    if len > 1 && stride != dtype.bytes() {
        return Err(err(kind, format!("{what}: must be contiguous (byte stride {stride}, element {})", dtype.bytes())));
    }
    if a.data_ptr % dtype.bytes() as u64 != 0 {
        return Err(err(kind, format!("{what}: address {:#x} is not {}-byte aligned", a.data_ptr, dtype.bytes())));
    }
    Ok(DeviceVector { ptr: a.data_ptr, len, dtype })
}

/// A 2-D integer block table `[rows, cols]` whose column axis is contiguous.
pub fn block_table(a: &TensorDesc, allowed: &[IntType], kind: ErrorKind) -> Result<DeviceTable> {
    let what = "block_table";
    require_cuda(a, what, kind)?;
    let dtype = int_type(a, what, allowed, kind)?;
    let (&[rows, cols], &[row_stride, col_stride]) = (&a.shape[..], &a.strides[..]) else {
        return Err(err(kind, format!("{what}: expected a 2-D [requests, cols] tensor, got shape {:?}", a.shape)));
    };
    if rows < 0 || cols < 0 {
        return Err(err(kind, format!("{what}: negative shape {:?}", a.shape)));
    }
    if rows > 0 && cols > 1 && col_stride != dtype.bytes() {
        return Err(err(kind, format!("{what}: the column axis must be contiguous (byte stride {col_stride})")));
    }
    if cols >= 1 << 31 || rows >= 1 << 31 {
        return Err(err(kind, format!("{what}: shape {:?} exceeds the kernels' 32-bit request / column counts", a.shape)));
    }
    if row_stride % dtype.bytes() != 0 || a.data_ptr % dtype.bytes() as u64 != 0 {
        return Err(err(kind, format!("{what}: address {:#x} / row stride {row_stride} are not element-aligned", a.data_ptr)));
    }
    Ok(DeviceTable { ptr: a.data_ptr, rows: rows as u64, cols: cols as u64, row_stride: row_stride / dtype.bytes(), group_stride: 0, dtype })
}

/// The block tables of `groups` recurrent groups: a 2-D `[requests, cols]` table for one group, a
/// 3-D `[groups, requests, cols]` one (each group's table a slice, any element-aligned group
/// stride) for several.
pub fn group_block_tables(a: &TensorDesc, groups: u32, allowed: &[IntType], kind: ErrorKind) -> Result<DeviceTable> {
    if groups <= 1 && a.shape.len() != 3 {
        return block_table(a, allowed, kind);
    }
    let what = "block_table";
    let (&[g, rows, cols], &[group_stride, row_stride, col_stride]) = (&a.shape[..], &a.strides[..]) else {
        return Err(err(kind, format!("{what}: expected a 3-D [groups = {groups}, requests, cols] tensor, got shape {:?}", a.shape)));
    };
    if g != groups as i64 {
        return Err(err(kind, format!("{what}: {g} group tables for {groups} recurrent groups")));
    }
    let inner = TensorDesc { shape: vec![rows, cols], strides: vec![row_stride, col_stride], ..a.clone() };
    let mut t = block_table(&inner, allowed, kind)?;
    let es = t.dtype.bytes();
    if group_stride % es != 0 {
        return Err(err(kind, format!("{what}: group stride {group_stride} is not element-aligned")));
    }
    t.group_stride = group_stride / es;
    Ok(t)
}

/// The argument lives on `device` (a device string that does not parse lives nowhere).
pub fn on_same_device(a: &TensorDesc, device: &Device) -> bool {
    Device::parse(&a.device).is_ok_and(|d| d == *device)
}

/// Whether `a` is on `device` and that is a CUDA device ([`on_device`]'s rule, without a message).
fn on_cuda_device(a: &TensorDesc, device: &Device) -> bool {
    device.is_cuda() && on_same_device(a, device)
}

/// Where the planner's states live, for the step checks.
fn on_device(a: &TensorDesc, what: &str, device: &Device) -> Result<()> {
    if on_cuda_device(a, device) {
        return Ok(());
    }
    let host_alternative = "the device path reads its inputs in device memory; for host inputs use planner.plan_align(...) and CopyPlan.execute()";
    let Device::Cuda(index) = device else {
        return Err(Error::plan(format!("{what}: the planner's states are on the host; {host_alternative}")));
    };
    match Device::parse(&a.device) {
        Ok(Device::Cuda(_)) => Err(Error::plan(format!("{what} is on {} but the planner's states are on cuda:{index}", a.device))),
        _ => Err(Error::plan(format!("{what}: expected a CUDA tensor on cuda:{index}, got a tensor on {}; {host_alternative}", a.device))),
    }
}

/// The device inputs of one fused-kernel step, as the caller gives them.
#[derive(Clone, Debug)]
pub struct StepArgs<'a> {
    pub block_table: &'a TensorDesc,
    /// Per-request vectors (`src_col`, `dst_col` or `running`, `num_accepted`), with their names.
    pub vectors: Vec<(&'a str, &'a TensorDesc)>,
    /// The caller's error word, if any.
    pub err: Option<&'a TensorDesc>,
    /// Where the kernel writes each request's accepted count for what follows (int32 `[R]`,
    /// sharing no byte with any input), if anywhere.
    pub out: Option<&'a TensorDesc>,
    /// Tokens per block, for the device-side align decision.
    pub block_size: Option<i64>,
    /// Recurrent groups the block table covers (1: a 2-D table; more: `[groups, requests, cols]`).
    pub groups: u32,
}

/// A step's device inputs, checked: the block table, the per-request vectors in the order given,
/// the caller's error word (if any) and the number of requests `R`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckedStep {
    pub table: DeviceTable,
    pub vectors: Vec<DeviceVector>,
    pub err: Option<DeviceVector>,
    /// The accepted counts' output vector.
    pub out: Option<DeviceVector>,
    pub requests: u64,
}

/// What a step check is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepCheck {
    /// The caller's inputs, before the launch layer narrows int64 inputs to int32 and makes strided
    /// ones contiguous on the device: int32 or int64, any strides.
    BeforeNarrowing,
    /// The inputs the kernel reads: int32, contiguous vectors and column axis, aligned addresses.
    ForLaunch,
}

/// Checks a step's device inputs against the planner's device: every input an integer tensor on
/// that CUDA device, vectors of one length `R`, a block table of at least `R` rows, an int32 error
/// word of 3 contiguous elements, a block size in `1 ..= 2**31 - 1`, and for
/// [`StepCheck::ForLaunch`] int32 inputs laid out as the kernel reads them. Errors are
/// [`ErrorKind::Plan`].
pub fn check_step_args(device: &Device, s: &StepArgs<'_>, check: StepCheck) -> Result<CheckedStep> {
    const I32: [IntType; 1] = [IntType::I32];
    const INTS: [IntType; 2] = [IntType::I32, IntType::I64];
    let allowed: &[IntType] = if check == StepCheck::ForLaunch { &I32 } else { &INTS };
    if let Some(bs) = s.block_size {
        if !(1..1 << 31).contains(&bs) {
            return Err(Error::plan(format!("block_size must be in [1, 2**31), got {bs}")));
        }
    }
    let mut first: Option<(&str, u64)> = None;
    let mut vectors = Vec::with_capacity(s.vectors.len());
    for (name, a) in &s.vectors {
        on_device(a, name, device)?;
        int_type(a, name, allowed, ErrorKind::Plan)?;
        let &[n] = &a.shape[..] else {
            return Err(Error::plan(format!("{name}: expected a 1-D [requests] tensor, got shape {:?}", a.shape)));
        };
        let n = n.max(0) as u64;
        match first {
            None => first = Some((name, n)),
            Some((f, r)) if r != n => {
                return Err(Error::plan(format!("{name} has {n} elements but {f} has {r}")));
            }
            _ => {}
        }
        if check == StepCheck::ForLaunch {
            vectors.push(int_vector(a, name, n, allowed, ErrorKind::Plan)?);
        }
    }
    let r = first.map_or(0, |(_, r)| r);
    on_device(s.block_table, "block_table", device)?;
    int_type(s.block_table, "block_table", allowed, ErrorKind::Plan)?;
    let (rows, cols) = match (&s.block_table.shape[..], s.groups) {
        (&[rows, cols], 0 | 1) => (rows, cols),
        (&[g, rows, cols], groups) if g == groups as i64 => (rows, cols),
        (_, 0 | 1) => {
            return Err(Error::plan(format!("block_table: expected a 2-D [requests, cols] tensor, got shape {:?}", s.block_table.shape)));
        }
        (_, groups) => {
            return Err(Error::plan(format!(
                "block_table: expected a 3-D [groups = {groups}, requests, cols] tensor, got shape {:?}",
                s.block_table.shape
            )));
        }
    };
    if (rows.max(0) as u64) < r {
        return Err(Error::plan(format!("block_table has {rows} rows for {r} requests")));
    }
    let table = match check {
        StepCheck::ForLaunch => group_block_tables(s.block_table, s.groups, allowed, ErrorKind::Plan)?,
        StepCheck::BeforeNarrowing => {
            DeviceTable { ptr: 0, rows: rows.max(0) as u64, cols: cols.max(0) as u64, row_stride: 0, group_stride: 0, dtype: IntType::I32 }
        }
    };
    if r >= 1 << 31 {
        return Err(Error::plan(format!("{r} requests exceed the kernels' 32-bit request count")));
    }
    let err = match s.err {
        Some(e) => {
            on_device(e, "err", device)?;
            Some(int_vector(e, "err", 3, &I32, ErrorKind::Plan)?)
        }
        None => None,
    };
    let out = match s.out {
        Some(o) => Some(check_output(o, device, r, s)?),
        None => None,
    };
    Ok(CheckedStep { table, vectors, err, out, requests: r })
}

/// The output vector of a step's accepted counts: int32 (an output cannot be narrowed), exactly
/// `r` contiguous elements on the states' device, sharing no byte with an input or the error word
/// (every CTA of a request reads its count while one of them writes the output).
fn check_output(o: &TensorDesc, device: &Device, r: u64, s: &StepArgs<'_>) -> Result<DeviceVector> {
    const WHAT: &str = "num_accepted_out";
    on_device(o, WHAT, device)?;
    let v = int_vector(o, WHAT, 0, &[IntType::I32], ErrorKind::Plan)?;
    if v.len != r {
        return Err(Error::plan(format!("{WHAT} has {} elements for {r} requests", v.len)));
    }
    let mine = byte_extent(o);
    let inputs = s.vectors.iter().map(|(n, a)| (*n, *a)).chain([("block_table", s.block_table)]).chain(s.err.map(|e| ("err", e)));
    for (name, a) in inputs {
        let theirs = byte_extent(a);
        if mine.0 < mine.1 && theirs.0 < theirs.1 && mine.0 < theirs.1 && theirs.0 < mine.1 {
            return Err(Error::plan(format!("{WHAT} overlaps {name}: the kernel reads {name} while it writes {WHAT}; pass a separate buffer")));
        }
    }
    Ok(v)
}

/// The bytes `[lo, hi)` an integer argument spans (empty for an empty tensor).
fn byte_extent(a: &TensorDesc) -> (u64, u64) {
    let es: i64 = if a.dtype_name().ends_with("64") { 8 } else { 4 };
    if a.shape.iter().any(|&n| n <= 0) {
        return (a.data_ptr, a.data_ptr);
    }
    let (mut lo, mut hi) = (0i64, 0i64);
    for (&n, &st) in a.shape.iter().zip(&a.strides) {
        let span = (n - 1).saturating_mul(st);
        if span < 0 {
            lo = lo.saturating_add(span);
        } else {
            hi = hi.saturating_add(span);
        }
    }
    let base = a.data_ptr as i64;
    (base.saturating_add(lo) as u64, base.saturating_add(hi).saturating_add(es) as u64)
}

/// Checks the engine's device block tables of a multi-group step before they are stacked into one
/// `[groups, rows, cols]` table: one per group, each an integer `[>= rows, cols]` tensor on the
/// states' `device`, all of one width and dtype. Errors are [`ErrorKind::Plan`] naming the group.
pub fn check_group_tables(device: &Device, tables: &[TensorDesc], groups: u32, rows: u64) -> Result<()> {
    if tables.len() != groups as usize {
        return Err(Error::plan(format!("{} device block tables for {groups} recurrent groups", tables.len())));
    }
    let mut first: Option<(i64, &str)> = None;
    for (g, t) in tables.iter().enumerate() {
        // The group's name, spelled only for an error (this runs at every half-step).
        let what = || format!("group {g}'s device block table");
        if !on_cuda_device(t, device) {
            on_device(t, &what(), device)?;
        }
        const TABLE_TYPES: [IntType; 2] = [IntType::I32, IntType::I64];
        if int_type_among(t, &TABLE_TYPES).is_none() {
            int_type(t, &what(), &TABLE_TYPES, ErrorKind::Plan)?;
        }
        let &[r, cols] = &t.shape[..] else {
            return Err(Error::plan(format!("{}: expected a 2-D [requests, cols] tensor, got shape {:?}", what(), t.shape)));
        };
        if r < rows as i64 {
            return Err(Error::plan(format!("{} has {r} rows for {rows} requests", what())));
        }
        match first {
            None => first = Some((cols, t.dtype_name())),
            Some((c, d)) if c != cols || d != t.dtype_name() => {
                return Err(Error::plan(format!(
                    "{} is [.., {cols}] {}, group 0's [.., {c}] {d}: the groups' device tables must share a width and dtype \
                     (or let the step stage the host tables)",
                    what(),
                    t.dtype_name()
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Checks the accepted counts of a kernel commit: an integer vector on the cache's `device`
/// with one count per request, `min_len` at least. Errors are [`ErrorKind::Plan`].
pub fn check_commit_counts(device: &Device, a: &TensorDesc, min_len: u64) -> Result<()> {
    if !on_same_device(a, device) {
        return Err(Error::plan(format!("num_accepted is on {}, the cache on {device}", a.device)));
    }
    // Any integer type: the caller narrows the counts to int32 on the device.
    const INTEGER: [&str; 8] = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"];
    if !INTEGER.contains(&a.dtype_name()) {
        return Err(Error::plan(format!("num_accepted: expected an integer tensor, got {}", a.dtype.trim())));
    }
    match a.shape[..] {
        [n] if n >= 0 && n as u64 >= min_len => Ok(()),
        _ => Err(Error::plan(format!("num_accepted must be [B] with one count per request ({min_len} at least); got shape {:?}", a.shape))),
    }
}

/// Bytes per element of the dtype names a raw byte buffer may be viewed as.
fn itemsize_of(name: &str) -> Option<i64> {
    Some(match name {
        "int8" | "uint8" | "bool" => 1,
        "int16" | "uint16" | "float16" | "bfloat16" => 2,
        "int32" | "uint32" | "float32" => 4,
        "int64" | "uint64" | "float64" => 8,
        _ => return None,
    })
}

/// Bytes of one commit row (`CommitRow`, `COMMIT_ROW_DTYPE`).
pub const COMMIT_ROW_BYTES: u64 = 32;

/// Checks the commit rows a kernel commit reads from device memory: a C-contiguous tensor on the
/// cache's `device` holding at least `num_rows` 32-byte records (default: as many as it holds).
/// Returns the number of rows. Errors are [`ErrorKind::Plan`].
pub fn check_commit_rows(device: &Device, a: &TensorDesc, num_rows: Option<u64>) -> Result<u64> {
    if !on_same_device(a, device) {
        return Err(Error::plan(format!("rows are on {}, the cache on {device}", a.device)));
    }
    let es = itemsize_of(a.dtype_name()).ok_or_else(|| Error::plan(format!("rows: expected a byte or integer tensor, got {}", a.dtype.trim())))?;
    let mut expect = es;
    let mut numel: u64 = 1;
    for (&n, &st) in a.shape.iter().zip(&a.strides).rev() {
        if n < 0 || (n > 1 && st != expect) {
            return Err(Error::plan(format!("rows: expected a contiguous tensor, got shape {:?} with byte strides {:?}", a.shape, a.strides)));
        }
        expect = expect.saturating_mul(n);
        numel = numel.saturating_mul(n as u64);
    }
    let nbytes = numel.saturating_mul(es as u64);
    let n = num_rows.unwrap_or(nbytes / COMMIT_ROW_BYTES);
    if !n.checked_mul(COMMIT_ROW_BYTES).is_some_and(|b| b <= nbytes) || n >= 1 << 32 {
        return Err(Error::plan(format!("rows: expected at least {n} commit rows ({COMMIT_ROW_BYTES} bytes each), got a tensor of {nbytes} bytes")));
    }
    Ok(n)
}

#[cfg(test)]
#[path = "args_tests.rs"]
mod tests;
