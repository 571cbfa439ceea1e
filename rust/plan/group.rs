//! One recurrent group of a [`Planner`](super::Planner): a layout bound to its state tensors, and
//! what a step makes of it: checked moves, their hazard waves, and the segments of each wave.

use super::emit;
use super::hazard;
use super::segment::{MoveRow, Segment, StateMeta};
use super::step::{self, Move, Moves};
use crate::binding::Binding;
use crate::error::Result;
use crate::kernels::constants::{KIND_CONV_DS, KIND_CONV_SD, KIND_TEMPORAL};
use crate::layout::{ConvLayout, CopyKind};
use std::sync::Arc;

/// Buffers one group reuses across steps.
#[derive(Default, Debug)]
pub(super) struct Scratch {
    pub moves: Moves,
    conv_waves: Vec<u16>,
    temporal_waves: Vec<u16>,
    hazard: hazard::Scratch,
    /// Per kind (conv, temporal): move indices sorted by wave, and where each wave starts.
    conv_order: Vec<u32>,
    conv_starts: Vec<u32>,
    temporal_order: Vec<u32>,
    temporal_starts: Vec<u32>,
    /// Waves of this group's moves in the current step.
    pub num_waves: usize,
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

/// A bound group and the positions of its conv and temporal states.
#[derive(Debug)]
pub(super) struct Group {
    pub binding: Arc<Binding>,
    conv_state: Option<usize>,
    temporal_state: Option<usize>,
}

impl Group {
    pub fn new(binding: Binding) -> Group {
        let states = binding.layout().persistent();
        let conv_state = states.iter().position(|s| matches!(s.copy, Some(CopyKind::Conv(_))));
        let temporal_state = states.iter().position(|s| s.copy == Some(CopyKind::Temporal));
        Group { binding: Arc::new(binding), conv_state, temporal_state }
    }

    pub fn limits(&self) -> step::Limits<'_> {
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

    /// Orders the step's moves (in `s.moves`) into hazard waves; returns their number.
    pub fn order(&self, s: &mut Scratch) -> Result<usize> {
        let names = self.binding.layout().states();
        let conv_name = self.conv_state.map(|i| names[i].name.as_str()).unwrap_or("conv");
        let temporal_name = self.temporal_state.map(|i| names[i].name.as_str()).unwrap_or("temporal");
        let (nb, backend) = (self.binding.num_blocks(), self.binding.layout().backend());
        let nc = hazard::waves(&s.moves.conv, nb, backend, conv_name, &mut s.hazard, &mut s.conv_waves)?;
        let nt = hazard::waves(&s.moves.temporal, nb, backend, temporal_name, &mut s.hazard, &mut s.temporal_waves)?;
        s.num_waves = nc.max(nt);
        if s.num_waves > 1 {
            by_wave(&s.conv_waves, s.num_waves, &mut s.conv_order, &mut s.conv_starts);
            by_wave(&s.temporal_waves, s.num_waves, &mut s.temporal_order, &mut s.temporal_starts);
        }
        Ok(s.num_waves)
    }

    /// Segments this group's moves would need per layer (a capacity hint).
    pub fn segments_hint(&self, s: &Scratch) -> usize {
        let b = &*self.binding;
        let conv = b.tensors()[..b.num_states()].iter().filter(|t| t.conv.is_some()).count();
        (s.moves.conv.len() * conv + s.moves.temporal.len() * (b.num_states() - conv)) * b.num_layers()
    }

    /// Emits this group's wave `w` of every layer and state into `out`, as the plan's wave
    /// `plan_wave`; returns `(copies, bytes)`.
    pub fn emit_wave(&self, s: &Scratch, w: usize, plan_wave: usize, out: &mut Vec<Segment>) -> (u64, u64) {
        if w >= s.num_waves {
            return (0, 0);
        }
        let b = &*self.binding;
        // Whether consecutive moves of a kind continue each other block-wise: only then can
        // segments inside one tensor's run merge (and only for dense tensors).
        let consecutive = |ms: &[Move]| ms.windows(2).any(|w| w[1].src == w[0].src + 1 && w[1].dst == w[0].dst + 1);
        let (conv_consec, temporal_consec) = (consecutive(&s.moves.conv), consecutive(&s.moves.temporal));
        let (mut copies, mut bytes) = (0u64, 0u64);
        for layer in 0..b.num_layers() {
            for st in 0..b.num_states() {
                let t = b.tensor(layer, st);
                let (moves, order, starts, consec) = if t.conv.is_some() {
                    (&s.moves.conv, &s.conv_order, &s.conv_starts, conv_consec)
                } else {
                    (&s.moves.temporal, &s.temporal_order, &s.temporal_starts, temporal_consec)
                };
                let from = out.len();
                bytes += if s.num_waves == 1 {
                    // The common case: no ordering needed, moves in request order.
                    let shifts = if t.conv.is_some() { moves.iter().map(|m| m.shift as u64).sum() } else { 0 };
                    emit::emit(out, t, moves.iter().copied(), shifts, plan_wave as u16)
                } else {
                    let wave = &order[starts[w] as usize..starts[w + 1] as usize];
                    let shifts = wave.iter().map(|&i| moves[i as usize].shift as u64).sum();
                    emit::emit(out, t, wave.iter().map(|&i| moves[i as usize]), shifts, plan_wave as u16)
                };
                copies += (out.len() - from) as u64;
                emit::coalesce(out, from, consec && t.block_stride == t.state_bytes);
            }
        }
        (copies, bytes)
    }

    /// One row per request that moves anything, merging its conv and temporal moves.
    pub fn compact_rows(s: &Scratch, group: u32, rows: &mut Vec<MoveRow>) {
        let (c, t) = (&s.moves.conv, &s.moves.temporal);
        let (mut i, mut j) = (0, 0);
        while i < c.len() || j < t.len() {
            let rc = c.get(i).map(|m| m.request).unwrap_or(u32::MAX);
            let rt = t.get(j).map(|m| m.request).unwrap_or(u32::MAX);
            let req = rc.min(rt);
            let mut row = MoveRow { request: req, shift: 0, conv_src: -1, temporal_src: -1, dst: -1, conv_wave: 0, temporal_wave: 0, group };
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

    /// The fused device kernel's metadata of every (layer, persistent state), tagged `group`.
    pub fn state_meta(&self, group: u32) -> impl Iterator<Item = StateMeta> + '_ {
        self.binding.tensors().iter().map(move |t| {
            let (kind, width, dim) = match t.conv {
                None => (KIND_TEMPORAL, 0, 0),
                Some(g) => (if g.layout == ConvLayout::SD { KIND_CONV_SD } else { KIND_CONV_DS }, g.width as u32, g.dim as u32),
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
                group,
                reserved: 0,
            }
        })
    }
}
