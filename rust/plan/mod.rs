//! Copy plans: validated, hazard-ordered, coalesced state copies for one engine step.
//!
//! A [`Planner`] owns one or more recurrent groups (vLLM's mamba groups: each a layout bound to its
//! own layers' state tensors and indexed by its own block table; one layout is one group). Each
//! step it turns vectorised inputs into block-level [`Moves`] per group (shared by the group's
//! layers), orders them into waves, and emits byte-level [`Segment`]s for every layer and
//! persistent state of every group: one [`CopyPlan`], checked whole before any byte moves.
//! Buffers are pooled: in steady state a step allocates nothing.

pub mod emit;
mod fused;
mod group;
pub mod hazard;
pub mod published;
pub mod segment;
pub mod step;
pub mod tiles;

use crate::binding::Binding;
use crate::error::{Error, Result};
use crate::tensor::Device;
use group::{Group, Scratch};
use published::Published;
use segment::{MoveRow, Segment, StateMeta};
use std::sync::{Arc, Mutex, RwLock};
pub use step::{AlignStep, Move, Moves};

named_enum! {
    /// How a request whose source and destination columns are equal is treated: `PreCopy`
    /// (vLLM's pre-copy) moves nothing whatever the accepted count (the state is already in place;
    /// the kernels find it through `num_accepted`); `PostProcess` (vLLM's post-process, and
    /// [`Planner::plan_align`]) with `num_accepted > 1` shifts the conv window in place and takes
    /// the temporal state from the accepted column.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Semantics { PreCopy = "pre_copy", PostProcess = "post_process" }
    parse: exact, |s| Error::plan(format!("semantics must be 'pre_copy' or 'post_process', got '{s}'"))
}

/// One group's block table, row-major `[rows >= requests, cols]`.
#[derive(Clone, Copy, Debug)]
pub struct GroupTable<'a> {
    pub ids: &'a [i64],
    pub cols: usize,
}

/// A step's moves over every group: per request `dst_col <- src_col` carrying `num_accepted`
/// (conv shift `num_accepted - 1`, temporal source `src_col + num_accepted - 1`), columns indexing
/// each group's own table. A negative column is a request that moves nothing.
pub struct Step<'a> {
    /// One table per group, in group order.
    pub tables: &'a [GroupTable<'a>],
    pub src_col: &'a [i64],
    pub dst_col: &'a [i64],
    pub num_accepted: &'a [i64],
    pub semantics: Semantics,
}

/// Per group: `(copies, segments, waves, bytes)` of a plan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupStats {
    pub copies: u64,
    pub segments: usize,
    pub waves: usize,
    pub bytes: u64,
}

#[derive(Default, Debug)]
struct Pool {
    segments: Vec<Vec<Segment>>,
    rows: Vec<Vec<MoveRow>>,
    scratch: Vec<Vec<Scratch>>,
}

const POOL_KEEP: usize = 4;

/// Plans state copies for one or more recurrent groups sharing one device and one `num_spec`.
#[derive(Debug)]
pub struct Planner {
    groups: Vec<Group>,
    pool: Arc<Mutex<Pool>>,
    /// Per group, the blocks no plan may write ([`published`]).
    published: RwLock<Vec<Published>>,
}

/// The plan of one step: segments grouped by wave (group 0's waves first, then group 1's, ...),
/// plus the compact per-request form.
#[derive(Debug)]
pub struct CopyPlan {
    segments: Vec<Segment>,
    /// `wave_starts[w]..wave_starts[w + 1]` are the segments of wave `w`.
    wave_starts: Vec<u32>,
    rows: Vec<MoveRow>,
    stats: Vec<GroupStats>,
    bindings: Vec<Arc<Binding>>,
    pool: Option<Arc<Mutex<Pool>>>,
}

impl Planner {
    /// A planner over `bindings`, one per group. Every group shares the device and the layout's
    /// `num_spec` (one accepted count per request applies to all of them).
    pub fn new(bindings: Vec<Binding>) -> Result<Planner> {
        let Some(first) = bindings.first() else {
            return Err(Error::binding("a planner needs at least one recurrent group"));
        };
        let (device, num_spec) = (first.device().clone(), first.layout().num_spec());
        for (g, b) in bindings.iter().enumerate().skip(1) {
            if b.layout().num_spec() != num_spec {
                return Err(Error::binding(format!(
                    "group {g} ({}): its layout has num_spec = {}, but group 0's has {num_spec}; every group shares the step's \
                     speculative blocks",
                    b.layout().backend(),
                    b.layout().num_spec()
                )));
            }
            if *b.device() != device {
                return Err(Error::binding(format!(
                    "group {g} ({}) is on {}, group 0 on {device}: one planner's groups share one device",
                    b.layout().backend(),
                    b.device()
                )));
            }
        }
        let published = RwLock::new(bindings.iter().map(|_| Published::default()).collect());
        Ok(Planner { groups: bindings.into_iter().map(Group::new).collect(), pool: Arc::default(), published })
    }

    pub fn num_groups(&self) -> usize {
        self.groups.len()
    }
    /// Group `g`'s binding.
    pub fn binding(&self, g: usize) -> &Binding {
        &self.groups[g].binding
    }
    pub fn bindings(&self) -> impl Iterator<Item = &Binding> + '_ {
        self.groups.iter().map(|g| &*g.binding)
    }
    pub fn device(&self) -> &Device {
        self.groups[0].binding.device()
    }
    /// Speculative blocks after the running column, shared by every group.
    pub fn num_spec(&self) -> u32 {
        self.groups[0].binding.layout().num_spec()
    }
    /// The largest pool of any group (the fused kernel's global block bound; each state meta
    /// carries its own).
    pub fn max_blocks(&self) -> u64 {
        self.groups.iter().map(|g| g.binding.num_blocks()).max().unwrap_or(0)
    }

    /// An error of group `g`, named when the planner has several groups.
    fn in_group(&self, g: usize, e: Error) -> Error {
        if self.groups.len() == 1 {
            e
        } else {
            Error { message: format!("group {g}: {}", e.message), ..e }
        }
    }

    /// Plans an align-mode step of a one-group planner (docs/design.md section 3): post-process
    /// semantics, the table exactly `[requests, cols]`.
    pub fn plan_align(&self, step: &AlignStep<'_>) -> Result<CopyPlan> {
        if self.groups.len() != 1 {
            return Err(Error::plan(format!(
                "plan_align plans one group; this planner has {}: use plan with one table per group",
                self.groups.len()
            )));
        }
        self.with_scratch(|planner, scratch| {
            step::align_moves(step, &planner.groups[0].limits(), &mut scratch[0].moves)?;
            planner.build(scratch)
        })
    }

    /// Plans a step over every group (see [`Step`]).
    pub fn plan(&self, step: &Step<'_>) -> Result<CopyPlan> {
        if step.tables.len() != self.groups.len() {
            return Err(Error::plan(format!("one block table per group: {} groups bound, {} tables given", self.groups.len(), step.tables.len())));
        }
        let r = step.src_col.len();
        let masked;
        let src = match step.semantics {
            Semantics::PostProcess => step.src_col,
            Semantics::PreCopy => {
                masked = step.src_col.iter().zip(step.dst_col).map(|(&s, &d)| if s == d { -1 } else { s }).collect::<Vec<i64>>();
                &masked
            }
        };
        self.with_scratch(|planner, scratch| {
            for (g, (group, t)) in planner.groups.iter().zip(step.tables).enumerate() {
                if t.cols == 0 || t.ids.len() % t.cols != 0 || t.ids.len() / t.cols < r {
                    return Err(planner.in_group(
                        g,
                        Error::plan(format!("block table must be [rows >= {r} requests, cols >= 1]; got {} ids for {} columns", t.ids.len(), t.cols)),
                    ));
                }
                let align = AlignStep {
                    block_table: &t.ids[..r * t.cols],
                    cols: t.cols,
                    src_col: src,
                    dst_col: step.dst_col,
                    num_accepted: step.num_accepted,
                };
                step::align_moves(&align, &group.limits(), &mut scratch[g].moves).map_err(|e| planner.in_group(g, e))?;
            }
            planner.build(scratch)
        })
    }

    /// Plans whole-block copies `dst_blocks[i] <- src_blocks[i]` of every persistent state of
    /// every group.
    pub fn plan_copy(&self, src_blocks: &[i64], dst_blocks: &[i64]) -> Result<CopyPlan> {
        self.with_scratch(|planner, scratch| {
            for (g, group) in planner.groups.iter().enumerate() {
                step::copy_moves(src_blocks, dst_blocks, &group.limits(), &mut scratch[g].moves).map_err(|e| planner.in_group(g, e))?;
            }
            planner.build(scratch)
        })
    }

    /// Publishes `blocks` of group `g` (one more holder each): until retracted, a plan that would
    /// write one is refused ([`published`]). On an error nothing changes.
    pub fn publish(&self, g: usize, blocks: &[i64]) -> Result<()> {
        let group = self.group(g)?;
        let mut p = self.published.write().unwrap_or_else(|e| e.into_inner());
        p[g].publish(blocks, &group.limits()).map_err(|e| self.in_group(g, e))
    }

    /// Drops one holder of each of `blocks` of group `g`; a block without holders may be written
    /// again. On an error (a block not published that often) nothing changes.
    pub fn retract(&self, g: usize, blocks: &[i64]) -> Result<()> {
        let group = self.group(g)?;
        let mut p = self.published.write().unwrap_or_else(|e| e.into_inner());
        p[g].retract(blocks, &group.limits()).map_err(|e| self.in_group(g, e))
    }

    /// Whether any group has a published block (a device step's check costs nothing when none
    /// has).
    pub fn has_published(&self) -> bool {
        self.published.read().unwrap_or_else(|e| e.into_inner()).iter().any(|p| !p.is_empty())
    }

    /// Refuses a device step whose host-decided writes land on a published block, as a host plan
    /// is refused: `writes` are (request, column) pairs, the column indexing each group's own
    /// table in `tables` (one per group; see [`Published::check_writes`]), `name` names a
    /// request. One hash lookup per write in each group that has published blocks; nothing when
    /// none has.
    pub fn check_device_writes(&self, tables: &[GroupTable<'_>], writes: &[(usize, i64)], name: &dyn Fn(usize) -> String) -> Result<()> {
        let published = self.published.read().unwrap_or_else(|e| e.into_inner());
        if published.iter().all(Published::is_empty) {
            return Ok(());
        }
        if tables.len() != self.groups.len() {
            return Err(Error::plan(format!("one block table per group: {} groups bound, {} tables given", self.groups.len(), tables.len())));
        }
        for (g, ((group, t), p)) in self.groups.iter().zip(tables).zip(published.iter()).enumerate() {
            p.check_writes(t.ids, t.cols, writes, &group.limits(), name).map_err(|e| self.in_group(g, e))?;
        }
        Ok(())
    }

    /// The published blocks of group `g`, ascending.
    pub fn published(&self, g: usize) -> Result<Vec<u64>> {
        self.group(g)?;
        Ok(self.published.read().unwrap_or_else(|e| e.into_inner())[g].blocks())
    }

    /// The holders of `block` in group `g` (0: not published, writable).
    pub fn holders(&self, g: usize, block: u64) -> Result<u32> {
        self.group(g)?;
        Ok(self.published.read().unwrap_or_else(|e| e.into_inner())[g].holders(block))
    }

    fn group(&self, g: usize) -> Result<&Group> {
        self.groups.get(g).ok_or_else(|| Error::plan(format!("group {g} does not exist: this planner has {} group(s)", self.groups.len())))
    }

    /// Runs `f` with one pooled scratch per group.
    fn with_scratch(&self, f: impl FnOnce(&Planner, &mut [Scratch]) -> Result<CopyPlan>) -> Result<CopyPlan> {
        let n = self.groups.len();
        let mut scratch = self.pool.lock().map(|mut p| p.scratch.pop()).ok().flatten().unwrap_or_default();
        scratch.resize_with(n, Scratch::default);
        let r = f(self, &mut scratch);
        if let Ok(mut p) = self.pool.lock() {
            if p.scratch.len() < POOL_KEEP {
                p.scratch.push(scratch);
            }
        }
        r
    }

    /// Orders every group's moves into waves and emits the plan group by group: group 0's waves,
    /// then group 1's, ... Groups may share tensors (vLLM lays every group's layers over the same
    /// pages and gives each group its own blocks), so one group's copies never run beside
    /// another's.
    fn build(&self, scratch: &mut [Scratch]) -> Result<CopyPlan> {
        {
            let published = self.published.read().unwrap_or_else(|e| e.into_inner());
            for (g, (group, s)) in self.groups.iter().zip(scratch.iter()).enumerate() {
                published[g].check(&s.moves, &group.limits()).map_err(|e| self.in_group(g, e))?;
            }
        }
        let mut num_waves = 0;
        for (g, (group, s)) in self.groups.iter().zip(scratch.iter_mut()).enumerate() {
            num_waves += group.order(s).map_err(|e| self.in_group(g, e))?;
        }
        let (mut segments, mut rows) = {
            let mut p = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            (p.segments.pop().unwrap_or_default(), p.rows.pop().unwrap_or_default())
        };
        segments.clear();
        rows.clear();
        segments.reserve(self.groups.iter().zip(scratch.iter()).map(|(g, s)| g.segments_hint(s)).sum());
        let mut stats = vec![GroupStats::default(); self.groups.len()];
        let mut wave_starts = Vec::with_capacity(num_waves + 1);
        let mut first = 0;
        for ((group, s), st) in self.groups.iter().zip(scratch.iter()).zip(&mut stats) {
            let from = segments.len();
            for w in 0..s.num_waves {
                wave_starts.push(segments.len() as u32);
                let (copies, bytes) = group.emit_wave(s, w, first + w, &mut segments);
                st.copies += copies;
                st.bytes += bytes;
            }
            st.segments = segments.len() - from;
            first += s.num_waves;
        }
        if num_waves > u16::MAX as usize {
            return Err(Error::plan(format!("the step needs {num_waves} waves; at most {} are supported", u16::MAX)));
        }
        wave_starts.push(segments.len() as u32);
        for (g, (s, st)) in scratch.iter().zip(&mut stats).enumerate() {
            st.waves = s.num_waves;
            Group::compact_rows(s, g as u32, &mut rows);
        }
        Ok(CopyPlan {
            segments,
            wave_starts,
            rows,
            stats,
            bindings: self.groups.iter().map(|g| Arc::clone(&g.binding)).collect(),
            pool: Some(Arc::clone(&self.pool)),
        })
    }

    /// The fused device kernel's metadata of every (group, layer, persistent state).
    pub fn state_meta(&self) -> Vec<StateMeta> {
        self.groups.iter().enumerate().flat_map(|(g, group)| group.state_meta(g as u32)).collect()
    }
}

impl CopyPlan {
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }
    pub fn wave_starts(&self) -> &[u32] {
        &self.wave_starts
    }
    pub fn num_waves(&self) -> usize {
        self.wave_starts.len() - 1
    }
    /// Segments of wave `w`.
    pub fn wave(&self, w: usize) -> &[Segment] {
        &self.segments[self.wave_starts[w] as usize..self.wave_starts[w + 1] as usize]
    }
    /// Compact per-request rows (by group, then request).
    pub fn rows(&self) -> &[MoveRow] {
        &self.rows
    }
    /// Per group: copies, segments, waves and bytes.
    pub fn group_stats(&self) -> &[GroupStats] {
        &self.stats
    }
    /// (group, layer, state, request) copies planned, before coalescing.
    pub fn num_copies(&self) -> u64 {
        self.stats.iter().map(|s| s.copies).sum()
    }
    /// Bytes the plan moves.
    pub fn bytes(&self) -> u64 {
        self.stats.iter().map(|s| s.bytes).sum()
    }
    /// The bindings the plan's segments lie in (one per group).
    pub fn bindings(&self) -> &[Arc<Binding>] {
        &self.bindings
    }
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }
}

impl Drop for CopyPlan {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            if let Ok(mut p) = pool.lock() {
                if p.segments.len() < POOL_KEEP {
                    p.segments.push(std::mem::take(&mut self.segments));
                }
                if p.rows.len() < POOL_KEEP {
                    p.rows.push(std::mem::take(&mut self.rows));
                }
            }
        }
    }
}

#[cfg(test)]
mod published_tests;
#[cfg(test)]
pub(crate) mod tests;
