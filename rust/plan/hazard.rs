//! Hazards between the moves of one kind of state, shared by every layer: two moves writing the
//! same block, and moves that read a block another move overwrites (ordered into waves). In-block
//! shifts (source block == destination block) are not hazards: their segments are memmove-safe.
//! O(n) with a block-indexed table (kept between steps, reset after use) for pools of up to
//! 16M blocks; O(n log n) by sorting for larger pools.

use super::step::Move;
use crate::error::{Error, Result};

/// Reusable buffers for the wave computation.
#[derive(Default, Debug)]
pub struct Scratch {
    /// `writer[block]` = 1 + index of the move writing `block`, 0 for none. All zero between calls.
    writer: Vec<u32>,
    by_dst: Vec<(u64, u32)>,
    next: Vec<u32>,
    indeg: Vec<u32>,
    queue: Vec<u32>,
    wave32: Vec<u32>,
}

const NONE: u32 = u32::MAX;

/// Pools up to this many blocks use the O(n) block-indexed table (4 bytes per block).
const DENSE_BLOCKS: u64 = 1 << 24;

fn duplicate(moves: &[Move], i: usize, j: usize, backend: &str, state: &str) -> Error {
    let (a, b) = (moves[i].request.min(moves[j].request), moves[i].request.max(moves[j].request));
    Error::plan(format!(
        "{backend}: requests {a} and {b} both write block {} of state '{state}' (all layers): two copies would write the same bytes; give each request its own destination block",
        moves[i].dst
    ))
}

/// Assigns a wave to every move (written into `waves`) so that a move that reads block X runs in
/// an earlier wave than the move that overwrites X. Returns the number of waves.
pub fn waves(moves: &[Move], num_blocks: u64, backend: &str, state: &str, scratch: &mut Scratch, waves: &mut Vec<u16>) -> Result<usize> {
    let n = moves.len();
    waves.clear();
    waves.resize(n, 0);
    if n == 0 {
        return Ok(0);
    }
    let s = scratch;
    // next[i]: the move that overwrites the block move i reads (it must run after i).
    s.next.clear();
    s.indeg.clear();
    s.indeg.resize(n, 0);
    let mut any = false;
    if num_blocks <= DENSE_BLOCKS {
        if s.writer.len() < num_blocks as usize {
            s.writer.resize(num_blocks as usize, 0);
        }
        let mut dup = None;
        for (i, m) in moves.iter().enumerate() {
            let w = &mut s.writer[m.dst as usize];
            if *w != 0 && dup.is_none() {
                dup = Some((*w as usize - 1, i));
            }
            *w = i as u32 + 1;
        }
        if dup.is_none() {
            for (i, m) in moves.iter().enumerate() {
                let w = s.writer[m.src as usize];
                let j = if w != 0 && w as usize - 1 != i { w - 1 } else { NONE };
                if j != NONE {
                    s.indeg[j as usize] += 1;
                    any = true;
                }
                s.next.push(j);
            }
        }
        for m in moves {
            s.writer[m.dst as usize] = 0;
        }
        if let Some((a, b)) = dup {
            return Err(duplicate(moves, a, b, backend, state));
        }
    } else {
        s.by_dst.clear();
        s.by_dst.extend(moves.iter().enumerate().map(|(i, m)| (m.dst, i as u32)));
        s.by_dst.sort_unstable();
        for w in s.by_dst.windows(2) {
            if w[0].0 == w[1].0 {
                return Err(duplicate(moves, w[0].1 as usize, w[1].1 as usize, backend, state));
            }
        }
        for (i, m) in moves.iter().enumerate() {
            let j = match s.by_dst.binary_search_by_key(&m.src, |&(d, _)| d) {
                Ok(k) if s.by_dst[k].1 as usize != i => s.by_dst[k].1,
                _ => NONE,
            };
            if j != NONE {
                s.indeg[j as usize] += 1;
                any = true;
            }
            s.next.push(j);
        }
    }
    if !any {
        return Ok(1);
    }
    s.queue.clear();
    s.queue.extend((0..n as u32).filter(|&i| s.indeg[i as usize] == 0));
    let mut head = 0;
    let mut max_wave = 0u32;
    let wave32 = &mut s.wave32;
    wave32.clear();
    wave32.resize(n, 0);
    while head < s.queue.len() {
        let i = s.queue[head] as usize;
        head += 1;
        let j = s.next[i];
        if j != NONE {
            let j = j as usize;
            wave32[j] = wave32[j].max(wave32[i] + 1);
            max_wave = max_wave.max(wave32[j]);
            s.indeg[j] -= 1;
            if s.indeg[j] == 0 {
                s.queue.push(j as u32);
            }
        }
    }
    if s.queue.len() < n {
        // Every unprocessed move lies on or behind a cycle; walk from one to find the cycle.
        let start = (0..n).find(|&i| s.indeg[i] > 0).expect("a move left unprocessed");
        let mut cyc = vec![start];
        let mut k = s.next[start] as usize;
        while k != start && cyc.len() <= n {
            cyc.push(k);
            k = s.next[k] as usize;
        }
        let desc: Vec<String> = cyc.iter().map(|&i| format!("request {} ({} -> {})", moves[i].request, moves[i].src, moves[i].dst)).collect();
        return Err(Error::plan(format!(
            "{backend}: state '{state}' (all layers): copies form a cycle that cannot be ordered without staging: {}; each reads a block another overwrites. Route one copy through a free block in a separate step",
            desc.join(", ")
        )));
    }
    if max_wave >= u16::MAX as u32 {
        return Err(Error::plan(format!("{backend}: state '{state}': the copies need {} ordered waves; at most 65534 are supported", max_wave + 1)));
    }
    for (w, &v) in waves.iter_mut().zip(wave32.iter()) {
        *w = v as u16;
    }
    Ok(max_wave as usize + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mv(request: u32, src: u64, dst: u64) -> Move {
        Move { request, src, dst, shift: 0 }
    }
    fn run(moves: &[Move]) -> Result<(usize, Vec<u16>)> {
        let mut s = Scratch::default();
        let mut w = Vec::new();
        let n = waves(moves, 64, "B", "conv", &mut s, &mut w)?;
        // The sorting path (huge pools) must agree with the table path.
        let mut w2 = Vec::new();
        let n2 = waves(moves, DENSE_BLOCKS + 1, "B", "conv", &mut s, &mut w2);
        assert_eq!(n2.as_ref().ok(), Some(&n));
        assert_eq!(w, w2);
        Ok((n, w))
    }

    #[test]
    fn independent_moves_are_one_wave() {
        assert_eq!(run(&[mv(0, 1, 2), mv(1, 3, 4)]).unwrap(), (1, vec![0, 0]));
        assert_eq!(run(&[]).unwrap().0, 0);
    }

    #[test]
    fn reader_runs_before_writer() {
        // request 1 reads block 2, which request 0 writes: 1 first.
        let (n, w) = run(&[mv(0, 1, 2), mv(1, 2, 3)]).unwrap();
        assert_eq!(n, 2);
        assert!(w[1] < w[0]);
        // chain 3 <- 2 <- 1 <- 0 (each reads what the previous writes)
        let (n, w) = run(&[mv(0, 5, 1), mv(1, 1, 2), mv(2, 2, 3)]).unwrap();
        assert_eq!(n, 3);
        assert!(w[2] < w[1] && w[1] < w[0]);
    }

    #[test]
    fn in_block_shift_is_not_a_hazard_with_itself() {
        let (n, _) = run(&[Move { request: 0, src: 4, dst: 4, shift: 2 }]).unwrap();
        assert_eq!(n, 1);
    }

    #[test]
    fn duplicate_destination_is_rejected() {
        let m = run(&[mv(3, 1, 9), mv(7, 2, 9)]).unwrap_err().message;
        assert!(m.contains("requests 3 and 7 both write block 9 of state 'conv'"), "{m}");
    }

    #[test]
    fn swap_cycle_is_rejected() {
        let m = run(&[mv(0, 1, 2), mv(1, 2, 1), mv(2, 7, 8)]).unwrap_err().message;
        assert!(m.contains("cycle") && m.contains("request 0 (1 -> 2)") && m.contains("request 1 (2 -> 1)"), "{m}");
    }
}
