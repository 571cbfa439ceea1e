//! Copy plans: validated, hazard-ordered, coalesced state copies for one engine step.
//!
//! A [`Planner`] owns a [`Binding`] (the layout bound to real state tensors). Each step it turns
//! vectorised inputs into [`Moves`] (block-level, shared by all layers), orders them into waves,
//! and emits byte-level [`Segment`]s for every layer and persistent state. Segment buffers are
//! pooled: in steady state a step allocates nothing.

pub mod emit;
pub mod hazard;
pub mod segment;
pub mod step;
pub mod tiles;

use crate::binding::Binding;
use crate::error::Result;
use crate::kernels::constants::{KIND_CONV_DS, KIND_CONV_SD, KIND_TEMPORAL};
use crate::layout::CopyKind;
use segment::{MoveRow, Segment, StateMeta};
use std::sync::{Arc, Mutex};
pub use step::{AlignStep, Move, Moves};

/// Buffers reused across steps.
#[derive(Default, Debug)]
struct Scratch {
    moves: Moves,
    conv_waves: Vec<u16>,
    temporal_waves: Vec<u16>,
    hazard: hazard::Scratch,
    /// Per kind (conv, temporal): move indices sorted by wave, and where each wave starts.
    conv_order: Vec<u32>,
    conv_starts: Vec<u32>,
    temporal_order: Vec<u32>,
    temporal_starts: Vec<u32>,
}

/// Counting sort of move indices by wave.
fn by_wave(waves: &[u16], num_waves: usize, order: &mut Vec<u32>, starts: &mut Vec<u32>) {
    starts.clear();
    starts.resize(num_waves + 1, 0);
    for &w in waves {
        starts[w as usize + 1] += 1;
    }
    for w in 0..num_waves {
        starts[w + 1] += starts[w];
    }
    order.clear();
    order.resize(waves.len(), 0);
    let mut fill: Vec<u32> = starts[..num_waves].to_vec();
    for (i, &w) in waves.iter().enumerate() {
        order[fill[w as usize] as usize] = i as u32;
        fill[w as usize] += 1;
    }
}

#[derive(Default, Debug)]
struct Pool {
    segments: Vec<Vec<Segment>>,
    rows: Vec<Vec<MoveRow>>,
    scratch: Vec<Scratch>,
}

const POOL_KEEP: usize = 4;

/// Plans state copies for a bound layout.
#[derive(Debug)]
pub struct Planner {
    binding: Arc<Binding>,
    pool: Arc<Mutex<Pool>>,
    conv_state: Option<usize>,
    temporal_state: Option<usize>,
}

/// The plan of one step: segments grouped by wave, plus the compact per-request form.
#[derive(Debug)]
pub struct CopyPlan {
    segments: Vec<Segment>,
    /// `wave_starts[w]..wave_starts[w + 1]` are the segments of wave `w`.
    wave_starts: Vec<u32>,
    rows: Vec<MoveRow>,
    num_copies: u64,
    bytes: u64,
    binding: Arc<Binding>,
    pool: Option<Arc<Mutex<Pool>>>,
}

impl Planner {
    pub fn new(binding: Binding) -> Planner {
        let states = binding.layout().persistent();
        let conv_state = states.iter().position(|s| matches!(s.copy, Some(CopyKind::Conv(_))));
        let temporal_state = states.iter().position(|s| s.copy == Some(CopyKind::Temporal));
        Planner { binding: Arc::new(binding), pool: Arc::default(), conv_state, temporal_state }
    }

    pub fn binding(&self) -> &Binding {
        &self.binding
    }

    fn limits(&self) -> step::Limits<'_> {
        let states = self.binding.layout().states();
        step::Limits {
            backend: self.binding.layout().backend(),
            num_blocks: self.binding.num_blocks(),
            num_spec: self.binding.layout().num_spec(),
            num_layers: self.binding.num_layers(),
            conv_state: self.conv_state.map(|i| states[i].name.as_str()),
            temporal_state: self.temporal_state.map(|i| states[i].name.as_str()),
        }
    }

    /// Plans an align-mode step (docs/design.md section 3).
    pub fn plan_align(&self, step: &AlignStep<'_>) -> Result<CopyPlan> {
        let mut scratch = self.take_scratch();
        let r = step::align_moves(step, &self.limits(), &mut scratch.moves).and_then(|_| self.build(&mut scratch));
        self.give_scratch(scratch);
        r
    }

    /// Plans whole-block copies `dst_blocks[i] <- src_blocks[i]` of every persistent state.
    pub fn plan_copy(&self, src_blocks: &[i64], dst_blocks: &[i64]) -> Result<CopyPlan> {
        let mut scratch = self.take_scratch();
        let r = step::copy_moves(src_blocks, dst_blocks, &self.limits(), &mut scratch.moves).and_then(|_| self.build(&mut scratch));
        self.give_scratch(scratch);
        r
    }

    fn take_scratch(&self) -> Scratch {
        self.pool.lock().map(|mut p| p.scratch.pop()).ok().flatten().unwrap_or_default()
    }

    fn give_scratch(&self, s: Scratch) {
        if let Ok(mut p) = self.pool.lock() {
            if p.scratch.len() < POOL_KEEP {
                p.scratch.push(s);
            }
        }
    }

    fn build(&self, s: &mut Scratch) -> Result<CopyPlan> {
        let b = &*self.binding;
        let layout = b.layout();
        let backend = layout.backend();
        let names = layout.states();
        let conv_name = self.conv_state.map(|i| names[i].name.as_str()).unwrap_or("conv");
        let temporal_name = self.temporal_state.map(|i| names[i].name.as_str()).unwrap_or("temporal");
        let nb = b.num_blocks();
        let nc = hazard::waves(&s.moves.conv, nb, backend, conv_name, &mut s.hazard, &mut s.conv_waves)?;
        let nt = hazard::waves(&s.moves.temporal, nb, backend, temporal_name, &mut s.hazard, &mut s.temporal_waves)?;
        let num_waves = nc.max(nt);

        let (mut segments, mut rows) = {
            let mut p = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            (p.segments.pop().unwrap_or_default(), p.rows.pop().unwrap_or_default())
        };
        segments.clear();
        rows.clear();
        let ns = b.num_states();
        let per_layer = s.moves.conv.len() * self.count_kind(true) + s.moves.temporal.len() * self.count_kind(false);
        segments.reserve(per_layer * b.num_layers());
        let mut wave_starts = Vec::with_capacity(num_waves + 1);
        let mut num_copies = 0u64;
        let mut bytes = 0u64;
        if num_waves > 1 {
            by_wave(&s.conv_waves, num_waves, &mut s.conv_order, &mut s.conv_starts);
            by_wave(&s.temporal_waves, num_waves, &mut s.temporal_order, &mut s.temporal_starts);
        }
        // Whether consecutive moves of a kind continue each other block-wise: only then can
        // segments inside one tensor's run merge (and only for dense tensors).
        let consecutive = |ms: &[Move]| ms.windows(2).any(|w| w[1].src == w[0].src + 1 && w[1].dst == w[0].dst + 1);
        let (conv_consec, temporal_consec) = (consecutive(&s.moves.conv), consecutive(&s.moves.temporal));
        let conv_shift_sum: u64 = s.moves.conv.iter().map(|m| m.shift as u64).sum();
        for w in 0..num_waves {
            wave_starts.push(segments.len() as u32);
            for layer in 0..b.num_layers() {
                for st in 0..ns {
                    let t = b.tensor(layer, st);
                    let (moves, order, starts, consec) = if t.conv.is_some() {
                        (&s.moves.conv, &s.conv_order, &s.conv_starts, conv_consec)
                    } else {
                        (&s.moves.temporal, &s.temporal_order, &s.temporal_starts, temporal_consec)
                    };
                    let from = segments.len();
                    bytes += if num_waves == 1 {
                        // The common case: no ordering needed, moves in request order.
                        let shifts = if t.conv.is_some() { conv_shift_sum } else { 0 };
                        emit::emit(&mut segments, t, moves.iter().copied(), shifts, 0)
                    } else {
                        let wave = &order[starts[w] as usize..starts[w + 1] as usize];
                        let shifts = wave.iter().map(|&i| moves[i as usize].shift as u64).sum();
                        emit::emit(&mut segments, t, wave.iter().map(|&i| moves[i as usize]), shifts, w as u16)
                    };
                    num_copies += (segments.len() - from) as u64;
                    emit::coalesce(&mut segments, from, consec && t.block_stride == t.state_bytes);
                }
            }
        }
        wave_starts.push(segments.len() as u32);
        self.compact_rows(s, &mut rows);
        Ok(CopyPlan { segments, wave_starts, rows, num_copies, bytes, binding: Arc::clone(&self.binding), pool: Some(Arc::clone(&self.pool)) })
    }

    fn count_kind(&self, conv: bool) -> usize {
        self.binding.tensors()[..self.binding.num_states()].iter().filter(|t| t.conv.is_some() == conv).count()
    }

    /// One row per request that moves anything, merging its conv and temporal moves.
    fn compact_rows(&self, s: &mut Scratch, rows: &mut Vec<MoveRow>) {
        let (c, t) = (&s.moves.conv, &s.moves.temporal);
        let (mut i, mut j) = (0, 0);
        while i < c.len() || j < t.len() {
            let rc = c.get(i).map(|m| m.request).unwrap_or(u32::MAX);
            let rt = t.get(j).map(|m| m.request).unwrap_or(u32::MAX);
            let req = rc.min(rt);
            let mut row = MoveRow { request: req, shift: 0, conv_src: -1, temporal_src: -1, dst: -1, conv_wave: 0, temporal_wave: 0, reserved: 0 };
            if rc == req {
                row.conv_src = c[i].src as i64;
                row.dst = c[i].dst as i64;
                row.shift = c[i].shift;
                row.conv_wave = s.conv_waves[i];
                i += 1;
            }
            if rt == req {
                row.temporal_src = t[j].src as i64;
                row.dst = t[j].dst as i64;
                row.temporal_wave = s.temporal_waves[j];
                j += 1;
            }
            rows.push(row);
        }
    }

    /// The per-(layer, persistent state) metadata table for the fused device kernel.
    pub fn state_meta(&self) -> Vec<StateMeta> {
        self.binding
            .tensors()
            .iter()
            .map(|t| {
                let (kind, width, dim) = match t.conv {
                    None => (KIND_TEMPORAL, 0, 0),
                    Some(g) => (if g.layout == crate::layout::ConvLayout::SD { KIND_CONV_SD } else { KIND_CONV_DS }, g.width as u32, g.dim as u32),
                };
                StateMeta {
                    base: t.base,
                    block_stride: t.block_stride,
                    state_bytes: t.state_bytes,
                    kind,
                    elem_bytes: t.elem_bytes,
                    width,
                    dim,
                    layer: t.layer,
                    state: t.state,
                    num_blocks: t.num_blocks,
                    group: 0,
                    reserved: 0,
                }
            })
            .collect()
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
    /// Compact per-request rows (sorted by request).
    pub fn rows(&self) -> &[MoveRow] {
        &self.rows
    }
    /// (layer, state, request) copies planned, before coalescing.
    pub fn num_copies(&self) -> u64 {
        self.num_copies
    }
    /// Bytes the plan moves.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
    pub fn binding(&self) -> &Binding {
        &self.binding
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
