//! Published blocks: states no plan may write (copy-on-write).
//!
//! A recurrent state that is published — reachable from a prefix index as a checkpoint, or shared
//! by two requests — must keep its bytes until it is retracted (vLLM #57908: align kernels wrote
//! in place into a cached state another request was reading). The [`Planner`](super::Planner)
//! keeps, per group, a count of the holders of each published block (the checkpoint index is one
//! holder, each request sharing the block another); [`Published::check`] refuses a step whose
//! moves would write one, before anything is ordered or emitted. The check costs one hash lookup
//! per destination and nothing when no block of the group is published.
//!
//! The check runs when a plan is built, and when a device step decided on the host is staged
//! ([`Published::check_writes`], through `Planner::check_device_writes`): a plan built before its
//! destination was published may still write it (that is how a checkpoint is written before it is
//! published).

use super::step::{Limits, Moves};
use crate::checkpoint::tree::Seeded;
use crate::error::{Error, Result};
use std::collections::HashMap;

/// One group's published blocks: block id -> holders (>= 1).
#[derive(Debug, Default)]
pub struct Published {
    holders: HashMap<u64, u32, Seeded>,
}

impl Published {
    /// Whether `block` is published.
    pub fn contains(&self, block: u64) -> bool {
        self.holders.contains_key(&block)
    }

    /// The holders of `block` (0 when it is not published).
    pub fn holders(&self, block: u64) -> u32 {
        self.holders.get(&block).copied().unwrap_or(0)
    }

    /// The published blocks, ascending.
    pub fn blocks(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.holders.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// The number of published blocks.
    pub fn len(&self) -> usize {
        self.holders.len()
    }

    /// Whether no block is published.
    pub fn is_empty(&self) -> bool {
        self.holders.is_empty()
    }

    /// Adds one holder to each of `blocks` (a block listed twice gets two). Every id must lie in
    /// `1..num_blocks` (the null block 0 holds no state); on an error nothing changes.
    pub fn publish(&mut self, blocks: &[i64], lim: &Limits<'_>) -> Result<()> {
        for (i, &b) in blocks.iter().enumerate() {
            check_id(i, b, lim)?;
        }
        for &b in blocks {
            *self.holders.entry(b as u64).or_insert(0) += 1;
        }
        Ok(())
    }

    /// Drops one holder of each of `blocks`; a block whose last holder is dropped may be written
    /// again. Every block must be published (as often as it is listed); on an error nothing
    /// changes.
    pub fn retract(&mut self, blocks: &[i64], lim: &Limits<'_>) -> Result<()> {
        let mut wanted: HashMap<u64, u32, Seeded> = HashMap::default();
        for (i, &b) in blocks.iter().enumerate() {
            check_id(i, b, lim)?;
            let w = wanted.entry(b as u64).or_insert(0);
            *w += 1;
            let have = self.holders(b as u64);
            if *w > have {
                return Err(Error::plan(format!(
                    "{}: blocks[{i}] = {b}: retracts block {b} {w} time(s) but it has {have} publisher(s); retract only what was published",
                    lim.backend
                )));
            }
        }
        for (b, w) in wanted {
            let h = self.holders.get_mut(&b).expect("checked above");
            *h -= w;
            if *h == 0 {
                self.holders.remove(&b);
            }
        }
        Ok(())
    }

    /// Refuses `moves` when one writes a published block: the error names the request, the
    /// state, its layers and the block.
    pub fn check(&self, moves: &Moves, lim: &Limits<'_>) -> Result<()> {
        if self.holders.is_empty() {
            return Ok(());
        }
        for (list, state) in [(&moves.conv, lim.conv_state), (&moves.temporal, lim.temporal_state)] {
            if let Some(m) = list.iter().find(|m| self.holders.contains_key(&m.dst)) {
                return Err(self.refused(lim, &format!("request {}", m.request), state.unwrap_or("?"), m.dst, ""));
            }
        }
        Ok(())
    }

    /// Refuses a device step's host-decided writes when one lands on a published block: `writes`
    /// are (request, column) pairs into `table` (`[requests, cols]` row-major; a negative or
    /// out-of-row column writes nothing, the null block holds no state), `name` names a request.
    /// One lookup per write; nothing when no block is published.
    pub fn check_writes(&self, table: &[i64], cols: usize, writes: &[(usize, i64)], lim: &Limits<'_>, name: &dyn Fn(usize) -> String) -> Result<()> {
        if self.holders.is_empty() {
            return Ok(());
        }
        for &(i, c) in writes {
            let Some(&id) = usize::try_from(c).ok().filter(|&c| c < cols).and_then(|c| table.get(i * cols + c)) else { continue };
            if id > 0 && self.holders.contains_key(&(id as u64)) {
                let state = lim.conv_state.or(lim.temporal_state).unwrap_or("?");
                return Err(self.refused(lim, &name(i), state, id as u64, &format!(" (column {c})")));
            }
        }
        Ok(())
    }

    fn refused(&self, lim: &Limits<'_>, who: &str, state: &str, block: u64, at: &str) -> Error {
        Error::plan(format!(
            "{}: {who}, state '{state}' (all {} layers): the destination block {block}{at} holds a published state ({} holder(s): a \
             checkpoint in the prefix index or a block shared by requests); a published state is never written: copy it to a \
             free block and write there (copy-on-write), or retract it first",
            lim.backend,
            lim.num_layers,
            self.holders(block)
        ))
    }
}

fn check_id(i: usize, b: i64, lim: &Limits<'_>) -> Result<()> {
    if b <= 0 || b as u64 >= lim.num_blocks {
        return Err(Error::plan(format!(
            "{}: blocks[{i}] = {b} is outside 1 ..= {} (the null block 0 holds no state and is never published)",
            lim.backend,
            lim.num_blocks.saturating_sub(1)
        )));
    }
    Ok(())
}
