//! The host executor: runs a plan over CPU memory. Every segment is checked to lie inside the
//! bound tensors before the first byte moves, so either the whole plan runs or nothing does.

use crate::binding::Device;
use crate::error::{Error, Result};
use crate::plan::segment::{Mode, Segment};
use crate::plan::CopyPlan;
use std::sync::OnceLock;

/// Plans above this many bytes use two threads per wave (where the machine has them).
const PARALLEL_BYTES: u64 = 4 << 20;

/// Checks that every segment of `plan` stays inside the bound tensors' memory.
pub fn check(plan: &CopyPlan) -> Result<()> {
    let b = plan.binding();
    if *b.device() != Device::Cpu {
        return Err(Error::plan(format!(
            "{}: the host executor runs plans over CPU tensors, but the states are on {:?}; use the CUDA executor",
            b.layout().backend(),
            b.device()
        )));
    }
    for (i, s) in plan.segments().iter().enumerate() {
        let ext = s.extent();
        if !b.contains(s.src, ext) || !b.contains(s.dst, ext) {
            return Err(Error::plan(format!(
                "segment {i} ({:#x} -> {:#x}, {ext} bytes) leaves the bound state tensors; the plan does not belong to these states",
                s.src, s.dst
            )));
        }
    }
    Ok(())
}

/// Worker threads for large waves: the machine's parallelism, asked once (the query reads cgroup
/// files, far too slow to repeat per step).
fn threads() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(8))
}

/// Executes `plan` on the CPU tensors it was planned for.
pub fn execute(plan: &CopyPlan) -> Result<()> {
    check(plan)?;
    for w in 0..plan.num_waves() {
        let segs = plan.wave(w);
        let bytes: u64 = segs.iter().map(|s| s.bytes()).sum();
        if bytes >= PARALLEL_BYTES && segs.len() > 1 && threads() > 1 {
            run_parallel(segs, bytes, threads());
        } else {
            for s in segs {
                // SAFETY: `check` proved both extents lie inside live bound tensors (the plan holds
                // the binding, whose owner keeps the tensors alive); overlap inside a segment is
                // handled by `copy_segment`, and segments of one wave are disjoint by construction.
                unsafe { copy_segment(s) };
            }
        }
    }
    Ok(())
}

/// Splits a wave's segments into `threads` runs of about equal bytes.
fn run_parallel(segs: &[Segment], bytes: u64, threads: usize) {
    let share = bytes.div_ceil(threads as u64);
    let mut cuts = vec![0usize];
    let mut acc = 0u64;
    for (i, s) in segs.iter().enumerate() {
        acc += s.bytes();
        if acc >= share * cuts.len() as u64 && cuts.len() < threads {
            cuts.push(i + 1);
        }
    }
    cuts.push(segs.len());
    cuts.dedup();
    std::thread::scope(|scope| {
        for w in cuts.windows(2) {
            let part = &segs[w[0]..w[1]];
            scope.spawn(move || {
                for s in part {
                    // SAFETY: as in `execute`; the runs are disjoint slices of one hazard-free wave.
                    unsafe { copy_segment(s) };
                }
            });
        }
    });
}

/// Copies one segment.
///
/// # Safety
/// `[src, src + extent)` and `[dst, dst + extent)` must be valid, live memory, and no other thread
/// may access the destination bytes concurrently.
unsafe fn copy_segment(s: &Segment) {
    let (src, dst) = (s.src as usize as *const u8, s.dst as usize as *mut u8);
    let n = s.row_bytes as usize;
    match s.mode() {
        Mode::Disjoint if s.rows == 1 => std::ptr::copy_nonoverlapping(src, dst, n),
        Mode::Disjoint => {
            for r in 0..s.rows as usize {
                let off = r * s.pitch as usize;
                std::ptr::copy_nonoverlapping(src.add(off), dst.add(off), n);
            }
        }
        // Left shifts: rows (or bytes within a row) are moved in ascending order, each with
        // memmove semantics, which never reads a byte after overwriting it.
        Mode::RowsAscending | Mode::WithinRow => {
            for r in 0..s.rows as usize {
                let off = r * s.pitch as usize;
                std::ptr::copy(src.add(off), dst.add(off), n);
            }
        }
    }
}
