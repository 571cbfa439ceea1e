//! Cutting a plan's segments into fixed-size, alignment-aware tiles: the work items of the GPU
//! batched-copy kernel (one CTA per tile, one launch per wave).

use super::segment::{Mode, Segment, Tile};
use super::CopyPlan;
use crate::error::{Error, Result};

/// Default bytes per tile: 64 KiB, so a 2 MiB temporal state spreads over 32 CTAs.
pub const DEFAULT_TILE_BYTES: u32 = 64 * 1024;

/// Tiles of a plan, grouped by wave like its segments.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TileTable {
    pub tiles: Vec<Tile>,
    /// `wave_starts[w]..wave_starts[w + 1]` are the tiles of wave `w`.
    pub wave_starts: Vec<u32>,
    pub tile_bytes: u32,
}

/// Cuts every segment of `plan` into tiles of about `tile_bytes` bytes. Byte ranges are cut where
/// the destination address is 16-byte aligned, so every tile but a segment's first has an aligned
/// start; row ranges are cut at row boundaries.
pub fn cut(plan: &CopyPlan, tile_bytes: u32) -> Result<TileTable> {
    if tile_bytes < 16 || tile_bytes % 16 != 0 {
        return Err(Error::plan(format!("tile_bytes must be a positive multiple of 16, got {tile_bytes}")));
    }
    let mut t = TileTable { tiles: Vec::new(), wave_starts: Vec::with_capacity(plan.num_waves() + 1), tile_bytes };
    t.tiles.reserve(plan.segments().len());
    for w in 0..plan.num_waves() {
        t.wave_starts.push(t.tiles.len() as u32);
        let first = plan.wave_starts()[w];
        for (k, s) in plan.wave(w).iter().enumerate() {
            cut_segment(first + k as u32, s, tile_bytes, &mut t.tiles);
        }
    }
    t.wave_starts.push(t.tiles.len() as u32);
    Ok(t)
}

fn cut_segment(index: u32, s: &Segment, tile_bytes: u32, out: &mut Vec<Tile>) {
    let by_bytes = s.rows == 1 || s.mode() == Mode::RowsAscending;
    if s.rows == 1 && s.mode() == Mode::WithinRow {
        // A single row shifted in place: one worker must copy it whole, so one tile.
        out.push(Tile { segment: index, begin: 0, count: s.row_bytes, reserved: 0 });
    } else if by_bytes {
        let len = s.row_bytes as u64;
        // Bytes per row covered by one tile: the tile's work is that times the rows.
        let unit = ((tile_bytes as u64 / s.rows as u64) & !15).max(16);
        let mut off = 0u64;
        while off < len {
            let aligned_end = ((s.dst + off + unit) & !15) - s.dst;
            let end = if aligned_end > off { aligned_end.min(len) } else { (off + unit).min(len) };
            out.push(Tile { segment: index, begin: off as u32, count: (end - off) as u32, reserved: 0 });
            off = end;
        }
    } else {
        let per = (tile_bytes / s.row_bytes.max(1)).max(1);
        let mut r = 0u32;
        while r < s.rows {
            let n = per.min(s.rows - r);
            out.push(Tile { segment: index, begin: r, count: n, reserved: 0 });
            r += n;
        }
    }
}
