//! Launches of the copy kernels: `rs_copy_tiles` (one wave of a planned batched copy) and
//! `rs_state_copy` (the fused align-mode copy of every persistent state of every layer, with the
//! columns given or the align decision taken on the device).

use super::abi::Launch;
use super::args::{check_step_args, CheckedStep, StepArgs, StepCheck};
use super::constants::{FLAG_DECIDE, FLAG_HAS_TEMPORAL, FLAG_PRE_COPY, MAX_GRID_X, MAX_GRID_YZ, MAX_STATE_CHUNKS, STATE_CHUNK_BYTES, THREADS};
use super::records::{CopyTilesParams, MutPtr, Ptr, StateCopyParams};
use crate::error::{Error, Result};
use crate::tensor::Device;
use crate::tensor::TensorDesc;

const BLOCK: [u32; 3] = [THREADS, 1, 1];

/// The launch of one wave of `rs_copy_tiles`: tiles `[first_tile, first_tile + num_tiles)` of the
/// device arrays of `Segment` and `Tile` records at `segments` / `tiles`; grid `min(num_tiles,
/// max_ctas)` CTAs (the kernel walks the tiles grid-stride). `None` when there is nothing to copy.
pub fn copy_tiles_launch(segments: u64, tiles: u64, first_tile: i64, num_tiles: i64, max_ctas: Option<i64>) -> Result<Option<Launch>> {
    if first_tile < 0 || num_tiles < 0 || !first_tile.checked_add(num_tiles).is_some_and(|s| s < 1 << 32) {
        return Err(Error::plan(format!("bad tile range: first_tile={first_tile}, num_tiles={num_tiles}")));
    }
    if let Some(m) = max_ctas {
        if m < 1 {
            return Err(Error::plan(format!("max_ctas must be >= 1, got {m}")));
        }
    }
    if num_tiles == 0 {
        return Ok(None);
    }
    let grid_x = max_ctas.map_or(num_tiles, |m| m.min(num_tiles)).min(MAX_GRID_X as i64) as u32;
    let params = CopyTilesParams { segments: Ptr::at(segments), tiles: Ptr::at(tiles), first_tile: first_tile as u32, num_tiles: num_tiles as u32 };
    Ok(Some(Launch::new(&params, [grid_x, 1, 1], BLOCK)))
}

/// CTAs per state copy of `rs_state_copy` for states of at most `max_state_bytes` bytes: one per
/// [`STATE_CHUNK_BYTES`], between 1 and [`MAX_STATE_CHUNKS`].
pub fn state_chunks(max_state_bytes: u64) -> u32 {
    max_state_bytes.div_ceil(STATE_CHUNK_BYTES).clamp(1, MAX_STATE_CHUNKS as u64) as u32
}

/// The grid of `rs_state_copy`: `(chunks, min(R, 65535), min(num_meta, 65535))` (requests and
/// states are walked grid-stride, so the folded grid stays correct).
pub fn state_copy_grid(num_requests: u64, num_meta: u64, chunks: u32) -> [u32; 3] {
    let fold = |n: u64| n.clamp(1, MAX_GRID_YZ as u64) as u32;
    [chunks.max(1), fold(num_requests), fold(num_meta)]
}

/// One fused step's device inputs, as the caller gives them.
#[derive(Clone, Copy, Debug)]
pub struct StepInputs<'a> {
    pub block_table: &'a TensorDesc,
    pub src_col: &'a TensorDesc,
    /// `dst_col`, or `running` with a `block_size` (the post-process decision on the device).
    pub second: &'a TensorDesc,
    pub num_accepted: &'a TensorDesc,
    /// Where the kernel writes each request's accepted count after the step (see
    /// [`FusedCopy::launch`]).
    pub num_accepted_out: Option<&'a TensorDesc>,
    pub err: Option<&'a TensorDesc>,
    pub block_size: Option<i64>,
}

/// Checks one fused step's inputs for states on `device` (see [`check_step_args`]).
pub fn check_step(device: &Device, inp: &StepInputs<'_>, groups: u32, check: StepCheck) -> Result<CheckedStep> {
    let second_name = if inp.block_size.is_some() { "running" } else { "dst_col" };
    let vectors = vec![("src_col", inp.src_col), (second_name, inp.second), ("num_accepted", inp.num_accepted)];
    let step = StepArgs { block_table: inp.block_table, vectors, err: inp.err, out: inp.num_accepted_out, block_size: inp.block_size, groups };
    check_step_args(device, &step, check)
}

/// The fused state copy of one bound planner: its device table of `StateMeta` records and the
/// launch constants, checked once; [`FusedCopy::launch`] checks and packs each step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FusedCopy {
    pub device: Device,
    pub metas: u64,
    pub num_meta: u32,
    pub max_accepted: i32,
    pub num_blocks: i64,
    pub has_temporal: bool,
    pub chunks: u32,
    /// The planner's own error word, used when a step brings none.
    pub err: u64,
    /// Recurrent groups the state metas span (their `group` fields are below it); a step's block
    /// table is `[groups, requests, cols]` when there are several.
    pub groups: u32,
}

impl FusedCopy {
    /// Checks the constants: `num_meta < 2**32`, `max_accepted` (`1 + num_spec`) and `chunks` in
    /// `1 ..= 2**31 - 1`, `num_blocks >= 1`, `groups >= 1`, a CUDA device.
    pub fn checked(self) -> Result<FusedCopy> {
        if !self.device.is_cuda() {
            return Err(Error::plan(format!("the fused state copy reads CUDA memory; got {}", self.device)));
        }
        if self.max_accepted < 1 {
            return Err(Error::plan(format!("max_accepted must be >= 1 (1 + num_spec), got {}", self.max_accepted)));
        }
        if self.num_blocks < 1 {
            return Err(Error::plan(format!("num_blocks must be >= 1, got {}", self.num_blocks)));
        }
        if !(1..1 << 31).contains(&self.chunks) {
            return Err(Error::plan(format!("chunks must be in 1 ..= 2**31 - 1, got {}", self.chunks)));
        }
        if self.groups < 1 {
            return Err(Error::plan("groups must be >= 1"));
        }
        Ok(self)
    }

    /// Checks a step whose inputs may still be int64 (the launch layer narrows them on the device
    /// afterwards, then calls [`FusedCopy::launch`]); returns the number of requests.
    pub fn check(&self, inp: &StepInputs<'_>) -> Result<u64> {
        Ok(check_step(&self.device, inp, self.groups, StepCheck::BeforeNarrowing)?.requests)
    }

    /// The launch of one step: `second` is `dst_col` (explicit columns) or, with a `block_size`,
    /// `running` (the post-process decision on the device); `pre_copy` selects vLLM's pre-copy
    /// semantics (equal columns are a no-op whatever the accepted count). With
    /// `num_accepted_out` the kernel also writes each request's accepted count for what follows:
    /// 1 where the request's running state was moved or shifted (its window now starts at the
    /// accepted token), its `num_accepted` elsewhere (see `rs_state_copy`). Every input is checked
    /// by [`check_step_args`] (int32 only); `None` when there is nothing to launch (no request).
    pub fn launch(&self, inp: &StepInputs<'_>, pre_copy: bool) -> Result<Option<Launch>> {
        let c = check_step(&self.device, inp, self.groups, StepCheck::ForLaunch)?;
        let n = c.requests;
        // Without states the kernel still writes the accepted counts.
        if n == 0 || (self.num_meta == 0 && c.out.is_none()) {
            return Ok(None);
        }
        let mut flags = if self.has_temporal { FLAG_HAS_TEMPORAL } else { 0 };
        if inp.block_size.is_some() {
            flags |= FLAG_DECIDE;
        }
        if pre_copy {
            flags |= FLAG_PRE_COPY;
        }
        let cols = i32::try_from(c.table.cols).map_err(|_| Error::plan(format!("block_table has {} columns (at most 2**31 - 1)", c.table.cols)))?;
        let params = StateCopyParams {
            metas: Ptr::at(self.metas),
            block_table: Ptr::at(c.table.ptr),
            src_col: Ptr::at(c.vectors[0].ptr),
            dst_or_running: Ptr::at(c.vectors[1].ptr),
            num_accepted: Ptr::at(c.vectors[2].ptr),
            num_accepted_out: MutPtr::at(c.out.map_or(0, |o| o.ptr)),
            err: MutPtr::at(c.err.map_or(self.err, |e| e.ptr)),
            bt_row_stride: c.table.row_stride,
            bt_group_stride: c.table.group_stride,
            num_blocks: self.num_blocks,
            num_meta: self.num_meta,
            bt_cols: cols,
            block_size: inp.block_size.unwrap_or(0) as i32,
            num_requests: n as i32,
            max_accepted: self.max_accepted,
            flags,
        };
        Ok(Some(Launch::new(&params, state_copy_grid(n, self.num_meta as u64, self.chunks), BLOCK)))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A dense tensor on `cuda:0` at `ptr` (the fused copy's tests and those of its users).
    pub(crate) fn arg(ptr: u64, dtype: &str, shape: &[i64]) -> TensorDesc {
        TensorDesc::dense(ptr, dtype, shape, "cuda:0")
    }

    /// Three state metas at 1000, 4 accepted at most, 77 blocks, 16 chunks, error word at 5000.
    pub(crate) const BASE: FusedCopy = FusedCopy {
        device: Device::Cuda(0),
        metas: 1000,
        num_meta: 3,
        max_accepted: 4,
        num_blocks: 77,
        has_temporal: true,
        chunks: 16,
        err: 5000,
        groups: 1,
    };

    fn inputs<'a>(bt: &'a TensorDesc, s: &'a TensorDesc, d: &'a TensorDesc, a: &'a TensorDesc) -> StepInputs<'a> {
        StepInputs { block_table: bt, src_col: s, second: d, num_accepted: a, num_accepted_out: None, err: None, block_size: None }
    }

    #[test]
    fn fused_launch_fills_the_record_by_name() {
        let f = BASE.checked().unwrap();
        let (bt, s, d, a) = (arg(9000, "int32", &[5, 6]), arg(2000, "int32", &[5]), arg(3000, "int32", &[5]), arg(4000, "int32", &[5]));
        let l = f.launch(&inputs(&bt, &s, &d, &a), false).unwrap().unwrap();
        assert_eq!((l.kernel.name, l.grid, l.block), ("rs_state_copy", [16, 5, 3], [256, 1, 1]));
        let names = [
            "metas",
            "num_meta",
            "block_table",
            "bt_row_stride",
            "bt_cols",
            "bt_group_stride",
            "src_col",
            "dst_or_running",
            "num_accepted",
            "num_accepted_out",
            "block_size",
            "num_requests",
            "max_accepted",
            "num_blocks",
            "flags",
            "err",
        ];
        assert_eq!(l.named(&names), vec![1000, 3, 9000, 6, 6, 0, 2000, 3000, 4000, 0, 0, 5, 4, 77, FLAG_HAS_TEMPORAL as i128, 5000]);
        let (e, out) = (arg(6000, "int32", &[3]), arg(7000, "int32", &[5]));
        let post = StepInputs { err: Some(&e), num_accepted_out: Some(&out), block_size: Some(16), ..inputs(&bt, &s, &d, &a) };
        let v = f.launch(&post, false).unwrap().unwrap().named(&["num_accepted_out", "block_size", "flags", "err"]);
        assert_eq!(v, [7000, 16, (FLAG_HAS_TEMPORAL | FLAG_DECIDE) as i128, 6000]);
        // Three groups: a [3, R, cols] table, its group stride packed; pre-copy semantics flagged.
        let g3 = FusedCopy { groups: 3, ..BASE }.checked().unwrap();
        let mut t3 = arg(9000, "int32", &[3, 5, 6]);
        t3.strides[0] = 4 * 64;
        let v = g3.launch(&inputs(&t3, &s, &d, &a), true).unwrap().unwrap().named(&["bt_group_stride", "flags"]);
        assert_eq!(v, [64, (FLAG_HAS_TEMPORAL | FLAG_PRE_COPY) as i128]);
        let e = g3.launch(&inputs(&bt, &s, &d, &a), false).unwrap_err();
        assert!(e.message.contains("expected a 3-D [groups = 3, requests, cols] tensor"), "{}", e.message);
        let short = arg(3000, "int32", &[4]);
        let e = f.launch(&StepInputs { block_size: Some(16), ..inputs(&bt, &s, &short, &a) }, false).unwrap_err();
        assert_eq!(e.message, "running has 4 elements but src_col has 5");
        let wide = arg(3000, "int64", &[5]);
        assert_eq!(f.check(&inputs(&bt, &s, &wide, &a)), Ok(5));
        assert_eq!(f.launch(&inputs(&bt, &s, &wide, &a), false).unwrap_err().message, "dst_col: expected int32, got int64");
        let empty = arg(2000, "int32", &[0]);
        assert_eq!(f.launch(&inputs(&bt, &empty, &empty, &empty), false), Ok(None));
    }

    #[test]
    fn the_accepted_output_is_checked() {
        let f = BASE.checked().unwrap();
        let (bt, s, d, a) = (arg(9000, "int32", &[5, 6]), arg(2000, "int32", &[5]), arg(3000, "int32", &[5]), arg(4000, "int32", &[5]));
        let with = |out: &TensorDesc| f.launch(&StepInputs { num_accepted_out: Some(out), ..inputs(&bt, &s, &d, &a) }, false).map(|_| ());
        // Overlapping an input: the num_accepted vector itself, its tail, or a table row.
        for (ptr, name) in [(4000, "num_accepted"), (4016, "num_accepted"), (9000 + 4 * 12, "block_table")] {
            let e = with(&arg(ptr, "int32", &[5])).unwrap_err();
            assert!(e.message.starts_with(&format!("num_accepted_out overlaps {name}")), "{}", e.message);
        }
        assert!(with(&arg(4020, "int32", &[5])).is_ok(), "just after num_accepted");
        assert!(with(&arg(3980, "int32", &[5])).is_ok(), "just before num_accepted");
        assert_eq!(with(&arg(7000, "int32", &[4])).unwrap_err().message, "num_accepted_out has 4 elements for 5 requests");
        assert_eq!(with(&arg(7000, "int64", &[5])).unwrap_err().message, "num_accepted_out: expected int32, got int64");
        let mut other = arg(7000, "int32", &[5]);
        other.device = "cuda:1".into();
        assert!(with(&other).unwrap_err().message.contains("num_accepted_out is on cuda:1"));
        // Even before narrowing (int64 inputs), the output must be int32 and separate.
        let wide = arg(4000, "int64", &[5]);
        let e = f.check(&StepInputs { num_accepted_out: Some(&arg(4024, "int32", &[5])), ..inputs(&bt, &s, &d, &wide) }).unwrap_err();
        assert!(e.message.contains("overlaps num_accepted"), "{}", e.message);
        // No states: the launch still writes the counts.
        let none = FusedCopy { num_meta: 0, has_temporal: false, chunks: 1, ..BASE }.checked().unwrap();
        assert_eq!(none.launch(&inputs(&bt, &s, &d, &a), false), Ok(None));
        let out = arg(7000, "int32", &[5]);
        assert!(none.launch(&StepInputs { num_accepted_out: Some(&out), ..inputs(&bt, &s, &d, &a) }, false).unwrap().is_some());
    }

    #[test]
    fn constants_are_checked_once() {
        let ok = |max_accepted, num_blocks, chunks| FusedCopy { max_accepted, num_blocks, chunks, ..BASE }.checked();
        assert!(ok(4, 100, 16).is_ok());
        assert!(ok(0, 100, 16).unwrap_err().message.contains("max_accepted must be >= 1"));
        assert!(ok(4, 0, 16).unwrap_err().message.contains("num_blocks"));
        assert!(ok(4, 100, 0).unwrap_err().message.contains("chunks"));
        assert!(FusedCopy { groups: 0, ..BASE }.checked().unwrap_err().message.contains("groups must be >= 1"));
        let e = FusedCopy { device: Device::Cpu, ..BASE }.checked().unwrap_err();
        assert!(e.message.contains("reads CUDA memory; got cpu"), "{}", e.message);
    }

    #[test]
    fn tiles_and_grids() {
        let l = copy_tiles_launch(10, 20, 5, 300, Some(128)).unwrap().unwrap();
        assert_eq!(l.grid, [128, 1, 1]);
        assert_eq!(l.named(&["segments", "tiles", "first_tile", "num_tiles"]), vec![10, 20, 5, 300]);
        assert_eq!(copy_tiles_launch(10, 20, 5, 0, None), Ok(None));
        assert!(copy_tiles_launch(1, 2, -1, 3, None).is_err());
        assert!(copy_tiles_launch(1, 2, (1 << 32) - 3, 3, None).is_err());
        assert_eq!(state_chunks(0), 1);
        assert_eq!(state_chunks(2 << 20), 64);
        assert_eq!(state_chunks(40_000), 2);
        assert_eq!(state_copy_grid(100_000, 0, 4), [4, 65535, 1]);
    }
}
