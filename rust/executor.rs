//! The host executor: runs a plan over CPU memory. Every segment is checked to lie inside the
//! bound tensors before the first byte moves, so either the whole plan runs or nothing does.

use crate::binding::Device;
use crate::error::{Error, Result};
use crate::plan::segment::{Mode, Segment};
use crate::plan::CopyPlan;
use rayon::prelude::*;
use std::sync::OnceLock;

/// Waves of at least this many bytes use several threads (where the machine has them); below it,
/// starting threads costs more than it saves.
const PARALLEL_BYTES: u64 = 2 << 20;

/// Checks that every segment of `plan` stays inside the bound tensors' memory.
pub fn check(plan: &CopyPlan) -> Result<()> {
    let b = plan.binding();
    if *b.device() != Device::Cpu {
        return Err(Error::plan(format!(
            "{}: the host executor runs plans over CPU tensors, but the states are on {}; use the CUDA executor",
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

/// Shares for large waves: the size of rayon's pool, asked once.
fn threads() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| rayon::current_num_threads().clamp(1, 8))
}

/// Executes `plan` on the CPU tensors it was planned for.
pub fn execute(plan: &CopyPlan) -> Result<()> {
    check(plan)?;
    for w in 0..plan.num_waves() {
        let segs = plan.wave(w);
        let bytes: u64 = segs.iter().map(|s| s.bytes()).sum();
        let threads = if bytes >= PARALLEL_BYTES { threads() } else { 1 };
        if threads > 1 {
            // Equal byte shares on rayon's pool (threads started once per process).
            let share = bytes.div_ceil(threads as u64);
            (0..threads as u64).into_par_iter().for_each(|t| {
                // SAFETY: as below; the byte ranges of the shares are disjoint.
                unsafe { copy_range(segs, t * share, (t + 1) * share) }
            });
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

/// Copies the bytes `[lo, hi)` of the concatenation of a wave's segments. Single-row disjoint
/// segments are split at the range ends; any other segment is copied whole by the range holding
/// its first byte, so no overlapping copy is ever split.
///
/// # Safety
/// As for [`copy_segment`], for every segment of `segs`; concurrent calls must use disjoint ranges
/// of one hazard-free wave.
unsafe fn copy_range(segs: &[Segment], lo: u64, hi: u64) {
    let mut pos = 0u64;
    for s in segs {
        let (start, end) = (pos, pos + s.bytes());
        pos = end;
        if end <= lo {
            continue;
        }
        if start >= hi {
            break;
        }
        if s.rows == 1 && s.mode() == Mode::Disjoint {
            let from = (lo.max(start) - start) as usize;
            let to = (hi.min(end) - start) as usize;
            let (src, dst) = (s.src as usize as *const u8, s.dst as usize as *mut u8);
            std::ptr::copy_nonoverlapping(src.add(from), dst.add(from), to - from);
        } else if start >= lo {
            copy_segment(s);
        }
    }
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
