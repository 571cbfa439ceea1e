//! HiCache's host copies of an SGLang pool on CUDA (`get_cpu_copy`, `load_cpu_copy`), staged by
//! the core. One device buffer holds, at 16-byte aligned offsets, the call's blocks (per state
//! tensor, its slots as one dense `[layers, n, ...]` block: what the host sees), the slot table
//! that moves them ([`kernel::slot_table`]) and the index vectors; the package fills it with one
//! host-to-device copy of [`HostCopy::stage`]'s bytes and launches the slot kernel once
//! ([`HostCopy::launch`]). `get_cpu_copy` gathers the slots into the blocks (the pool tensor,
//! viewed `[layers, slots, 1, ...]`, is the "scratch": block slot `r` gets row `ids[r]`, step 0);
//! `load_cpu_copy` stages the host copies as the blocks and scatters row `r` into slot `ids[r]`.

use super::checks::{check_host_copy, state_label};
use super::host::read_host;
use super::kernel::{self, SlotCall, SlotPool};
use crate::error::{Error, Result};
use crate::kernels::abi::Launch;
use crate::tensor::{Device, TensorDesc};

/// Which way a host copy goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// `get_cpu_copy`: the pool's slots into the blocks (read back by the host).
    Get,
    /// `load_cpu_copy`: the host copies (staged as the blocks) into the pool's slots.
    Load,
}

/// One state tensor's block of the buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    pub offset: u64,
    pub bytes: u64,
    /// `[layers, n, ...]`.
    pub shape: Vec<i64>,
}

/// One host copy on CUDA: where everything lies in its buffer, and what moves.
#[derive(Clone, Debug)]
pub struct HostCopy {
    pub direction: Direction,
    /// One block per state tensor, in the pool's order (every conv tensor, then the temporal state).
    pub blocks: Vec<Block>,
    /// Where [`HostCopy::stage`]'s bytes go in the buffer: after the blocks (get), or 0 (load: the
    /// host copies are staged too).
    pub staged_at: u64,
    /// The buffer's bytes (a multiple of 16); 0 when nothing moves (no slot, no state byte).
    pub total: u64,
    states: Vec<TensorDesc>,
    ids: Vec<i64>,
    num_slots: u64,
    /// The state tensors with bytes (the others have no record).
    live: Vec<usize>,
    table_at: u64,
    records: u64,
    /// `slots`, `steps`, `rows`.
    vectors_at: [u64; 3],
}

fn align(n: u64) -> u64 {
    n.div_ceil(16) * 16
}

fn bytes_of(t: &TensorDesc) -> Result<u64> {
    Ok(t.state_dtype()?.itemsize())
}

impl HostCopy {
    /// The host copy of slots `ids` (checked by the caller: [`super::check_slots`]) of a pool of
    /// `num_slots` slots whose state tensors are `states` (`[layers, slots, ...]`, on one CUDA
    /// device).
    pub fn new(direction: Direction, states: Vec<TensorDesc>, ids: Vec<i64>, num_slots: u64) -> Result<HostCopy> {
        let n = ids.len() as i64;
        let (mut blocks, mut at, mut live, mut records) = (Vec::new(), 0u64, Vec::new(), 0u64);
        for (k, t) in states.iter().enumerate() {
            if t.shape.len() < 2 {
                return Err(Error::plan(format!("state tensor {k}: expected [layers, slots, ...], got shape {:?}", t.shape)));
            }
            let mut shape = t.shape.clone();
            shape[1] = n;
            let bytes = shape.iter().map(|&d| d.max(0) as u64).product::<u64>() * bytes_of(t)?;
            if bytes > 0 {
                live.push(k);
                records += t.shape[0] as u64;
            }
            blocks.push(Block { offset: at, bytes, shape });
            at += align(bytes);
        }
        let blocks_end = at.max(16);
        let table_at = if direction == Direction::Get { blocks_end } else { at };
        let table = align(records * std::mem::size_of::<kernel::SlotCopy>() as u64);
        let vec = align(8 * n as u64);
        let vectors_at = [table_at + table, table_at + table + vec, table_at + table + 2 * vec];
        let total = if ids.is_empty() || live.is_empty() {
            if direction == Direction::Get {
                blocks_end
            } else {
                0
            }
        } else {
            vectors_at[2] + vec
        };
        let staged_at = if direction == Direction::Get { blocks_end } else { 0 };
        Ok(HostCopy { direction, blocks, staged_at, total, states, ids, num_slots, live, table_at, records, vectors_at })
    }

    /// Whether the call moves anything (a launch follows [`HostCopy::stage`]).
    pub fn moves(&self) -> bool {
        !self.ids.is_empty() && !self.live.is_empty()
    }

    /// The pool tensors and the blocks as the slot table's "pool" and "scratch" (one step each),
    /// for a buffer at device address `buffer`.
    fn table_tensors(&self, buffer: u64) -> (Vec<TensorDesc>, Vec<Option<TensorDesc>>) {
        let (mut dst, mut src) = (Vec::new(), Vec::new());
        for &k in &self.live {
            let t = &self.states[k];
            let block =
                TensorDesc { writable: true, ..TensorDesc::dense(buffer + self.blocks[k].offset, &t.dtype, &self.blocks[k].shape, &t.device) };
            let (to, from) = if self.direction == Direction::Get { (block, t.clone()) } else { (t.clone(), block) };
            let mut scratch = from;
            scratch.shape.insert(2, 1);
            scratch.strides.insert(2, scratch.strides[1]);
            dst.push(to);
            src.push(Some(scratch));
        }
        (dst, src)
    }

    /// The bytes to copy into the buffer (at device address `buffer`) at [`HostCopy::staged_at`]:
    /// for a load the host copies `host` (one per state tensor, each checked here by
    /// [`check_host_copy`]: on the host, the state's dtype and shape `[layers, len(ids), ...]`),
    /// then the slot table and the index vectors.
    pub fn stage(&self, buffer: u64, host: &[TensorDesc]) -> Result<Vec<u8>> {
        let mut out = vec![0u8; (self.total - self.staged_at) as usize];
        if !self.moves() {
            return Ok(out);
        }
        let base = self.staged_at;
        if self.direction == Direction::Load {
            if host.len() != self.states.len() {
                return Err(Error::plan(format!("load_cpu_copy: {} host copies for {} state tensors", host.len(), self.states.len())));
            }
            for (k, (state, copy)) in self.states.iter().zip(host).enumerate() {
                check_host_copy(&state_label(k, self.states.len()), state, copy, self.ids.len())?;
            }
            for &k in &self.live {
                let at = (self.blocks[k].offset - base) as usize;
                read_host(&host[k], &mut out[at..at + self.blocks[k].bytes as usize])?;
            }
        }
        let (dst, src) = self.table_tensors(buffer);
        let recs = kernel::slot_table(&dst, &src)?;
        let mut at = (self.table_at - base) as usize;
        for r in &recs {
            let b = r.to_le_bytes();
            out[at..at + b.len()].copy_from_slice(&b);
            at += b.len();
        }
        let n = self.ids.len() as i64;
        let (iota, zeros): (Vec<i64>, Vec<i64>) = ((0..n).collect(), vec![0; n as usize]);
        let (slots, rows) = if self.direction == Direction::Get { (&iota, &self.ids) } else { (&self.ids, &iota) };
        for (v, &off) in [slots, &zeros, rows].into_iter().zip(&self.vectors_at) {
            let at = (off - base) as usize;
            for (i, x) in v.iter().enumerate() {
                out[at + 8 * i..at + 8 * i + 8].copy_from_slice(&x.to_le_bytes());
            }
        }
        Ok(out)
    }

    /// The launch of the slot kernel over the staged buffer at device address `buffer`, reporting
    /// into `err` (int32[3] on the pool's device); `None` when nothing moves.
    pub fn launch(&self, buffer: u64, err: &TensorDesc) -> Result<Option<Launch>> {
        if !self.moves() {
            return Ok(None);
        }
        let t = &self.states[self.live[0]];
        let device = Device::parse(&t.device)?;
        let slot_bytes = |k: usize| self.blocks[k].bytes / (self.ids.len() as u64 * self.states[k].shape[0] as u64);
        let max_bytes = self.live.iter().map(|&k| slot_bytes(k)).max().unwrap_or(0);
        let n = self.ids.len() as i64;
        let (num_slots, num_rows) = if self.direction == Direction::Get { (n, self.num_slots as i64) } else { (self.num_slots as i64, n) };
        let records = u32::try_from(self.records).map_err(|_| Error::plan("too many slot records"))?;
        let pool = SlotPool { device: &device, metas: buffer + self.table_at, num_meta: records, max_bytes, num_slots, num_rows, draft: 1 };
        let [slots, steps, rows] = self.vectors_at.map(|at| TensorDesc::dense(buffer + at, "int64", &[n], &t.device));
        let call = SlotCall {
            slots: &slots,
            steps: Some(&steps),
            rows: Some(&rows),
            track_slots: None,
            track_steps: None,
            err,
            names: (if self.direction == Direction::Get { "get_cpu_copy" } else { "load_cpu_copy" }, kernel::KERNEL_NAMES.1),
        };
        kernel::slot_launch(&pool, &call)
    }
}
