//! Moves to segments: per wave, layer, state and move, the byte-level copy, with adjacent
//! segments coalesced. O(moves x layers x states), no allocation beyond the output. The hot loop
//! is specialised per kind of state and closes over plain locals only, so each segment costs a
//! few multiply-adds and one 32-byte store; coalescing runs only where it can merge anything.

use super::segment::{Mode, Segment};
use super::step::Move;
use crate::binding::StateTensor;
use crate::layout::ConvLayout;

/// Appends the segments of `moves` (all of one wave) on tensor `t`. `shift_sum` is the sum of the
/// moves' shifts; returns the bytes the segments copy.
pub fn emit(out: &mut Vec<Segment>, t: &StateTensor, moves: impl ExactSizeIterator<Item = Move>, shift_sum: u64, wave: u16) -> u64 {
    let (base, stride, e) = (t.base, t.block_stride, t.elem_bytes as u64);
    let n = moves.len() as u64;
    let eb = e as u8;
    match t.conv {
        None => {
            // Whole states: only the addresses vary.
            let bytes = t.state_bytes as u32;
            let template = Segment { src: 0, dst: 0, row_bytes: bytes, rows: 1, pitch: bytes, wave, mode: Mode::Disjoint as u8, elem_bytes: eb };
            out.extend(moves.map(move |m| Segment { src: base + m.src * stride, dst: base + m.dst * stride, ..template }));
            n * t.state_bytes
        }
        Some(g) if g.layout == ConvLayout::SD => {
            // [width, dim]: drop the first k rows of dim elements.
            let row = g.dim * e;
            let width = g.width;
            out.extend(moves.map(move |m| {
                let k = m.shift as u64;
                let src = base + m.src * stride + k * row;
                let dst = base + m.dst * stride;
                if m.src == m.dst {
                    // In place, rows overlap: walk each lane over rows in ascending order.
                    let rows = (width - k) as u32;
                    Segment { src, dst, row_bytes: row as u32, rows, pitch: row as u32, wave, mode: Mode::RowsAscending as u8, elem_bytes: eb }
                } else {
                    let len = ((width - k) * row) as u32;
                    Segment { src, dst, row_bytes: len, rows: 1, pitch: len, wave, mode: Mode::Disjoint as u8, elem_bytes: eb }
                }
            }));
            (n * width - shift_sum) * row
        }
        Some(g) => {
            // [dim, width]: in every row drop the first k elements.
            let (width, dim) = (g.width, g.dim as u32);
            let pitch = (width * e) as u32;
            let whole = t.state_bytes as u32;
            out.extend(moves.map(move |m| {
                let k = m.shift as u64;
                let src = base + m.src * stride + k * e;
                let dst = base + m.dst * stride;
                if k == 0 {
                    Segment { src, dst, row_bytes: whole, rows: 1, pitch: whole, wave, mode: Mode::Disjoint as u8, elem_bytes: eb }
                } else {
                    // In place, each row is a left shift: one worker per row, ascending.
                    let mode = if m.src == m.dst { Mode::WithinRow } else { Mode::Disjoint } as u8;
                    let row_bytes = ((width - k) * e) as u32;
                    Segment { src, dst, row_bytes, rows: dim, pitch, wave, mode, elem_bytes: eb }
                }
            }));
            (n * width - shift_sum) * g.dim * e
        }
    }
}

/// Whether `s` continues `p` on both sides, so the two can be one segment.
#[inline]
fn continues(p: &Segment, s: &Segment) -> bool {
    p.rows == 1
        && s.rows == 1
        && p.mode == 0
        && s.mode == 0
        && p.wave == s.wave
        && p.elem_bytes == s.elem_bytes
        && p.src + p.row_bytes as u64 == s.src
        && p.dst + p.row_bytes as u64 == s.dst
        && (p.row_bytes as u64 + s.row_bytes as u64) <= u32::MAX as u64
}

/// Merges runs of continuing segments in `out[from..]` (and the segment before `from`) in place.
/// `may_merge_inside` says whether segments inside the range can continue each other at all;
/// when false only the boundary with the previous segment is checked.
pub fn coalesce(out: &mut Vec<Segment>, from: usize, may_merge_inside: bool) {
    if from >= out.len() {
        return;
    }
    if !may_merge_inside {
        if from > 0 && continues(&out[from - 1], &out[from]) {
            let s = out.remove(from);
            let p = &mut out[from - 1];
            p.row_bytes += s.row_bytes;
            p.pitch = p.row_bytes;
        }
        return;
    }
    let mut w = from.saturating_sub(1);
    for r in w + 1..out.len() {
        let s = out[r];
        if continues(&out[w], &s) {
            let p = &mut out[w];
            p.row_bytes += s.row_bytes;
            p.pitch = p.row_bytes;
        } else {
            w += 1;
            out[w] = s;
        }
    }
    out.truncate(w + 1);
}
