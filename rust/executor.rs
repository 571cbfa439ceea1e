//! The host executor: runs a plan over CPU memory. Every segment is checked to lie inside the
//! bound tensors before the first byte moves, so either the whole plan runs or nothing does.

use crate::error::{Error, Result};
use crate::plan::segment::{Mode, Segment};
use crate::plan::CopyPlan;
use crate::tensor::Device;
use rayon::prelude::*;
use std::sync::Mutex;

/// Waves of at least this many bytes use several threads (where the machine has them); below it,
/// starting threads costs more than it saves.
const PARALLEL_BYTES: u64 = 2 << 20;

/// Checks that every segment of `plan` stays inside the bound tensors' memory.
pub fn check(plan: &CopyPlan) -> Result<()> {
    let bindings = plan.bindings();
    if let Some(b) = bindings.iter().find(|b| *b.device() != Device::Cpu) {
        return Err(Error::plan(format!(
            "{}: the host executor runs plans over CPU tensors, but the states are on {}; use the CUDA executor",
            b.layout().backend(),
            b.device()
        )));
    }
    for (i, s) in plan.segments().iter().enumerate() {
        let ext = s.extent();
        // Each segment lies in one group's tensors (groups never share memory).
        if !bindings.iter().any(|b| b.contains(s.src, ext) && b.contains(s.dst, ext)) {
            return Err(Error::plan(format!(
                "segment {i} ({:#x} -> {:#x}, {ext} bytes) leaves the bound state tensors; the plan does not belong to these states",
                s.src, s.dst
            )));
        }
    }
    Ok(())
}

/// The executor's own thread pool, owned by the process that made it. A child of `fork()` inherits
/// the pool's state but none of its threads: waiting on such a pool never returns. So the pool is
/// tagged with the id of the process that built it, and a process that finds another id builds its
/// own (the inherited one is leaked, never dropped: dropping would wait for threads that do not
/// exist). Without a pool (one that cannot be built), large waves run on the calling thread.
struct Pool {
    pid: u32,
    pool: Option<&'static rayon::ThreadPool>,
}

fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: Mutex<Option<Pool>> = Mutex::new(None);
    let pid = std::process::id();
    let mut guard = POOL.lock().unwrap_or_else(|e| e.into_inner());
    match &*guard {
        Some(p) if p.pid == pid => p.pool,
        _ => {
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8);
            let pool =
                if threads > 1 { rayon::ThreadPoolBuilder::new().num_threads(threads).build().ok().map(|p| &*Box::leak(Box::new(p))) } else { None };
            *guard = Some(Pool { pid, pool });
            pool
        }
    }
}

/// Executes `plan` on the CPU tensors it was planned for.
pub fn execute(plan: &CopyPlan) -> Result<()> {
    check(plan)?;
    for w in 0..plan.num_waves() {
        let segs = plan.wave(w);
        let bytes: u64 = segs.iter().map(|s| s.bytes()).sum();
        let pool = if bytes >= PARALLEL_BYTES { pool() } else { None };
        if let Some(pool) = pool {
            // Equal byte shares on the process's pool (threads started once per process).
            let threads = pool.current_num_threads() as u64;
            let share = bytes.div_ceil(threads);
            pool.install(|| {
                (0..threads).into_par_iter().for_each(|t| {
                    // SAFETY: as below; the byte ranges of the shares are disjoint.
                    unsafe { copy_range(segs, t * share, (t + 1) * share) }
                })
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
