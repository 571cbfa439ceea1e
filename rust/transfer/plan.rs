//! Transfer plans: the reads that rebuild, in a destination pool's blocks, exactly the
//! destination rank's shard of every persistent state of a source instance, for a batch of
//! requests (one source block -> one destination block each).
//!
//! Conv channels are re-sharded per sub-projection and temporal states sliced by heads, in both
//! TP directions. When the two sides' conv windows have the same width the whole window moves;
//! otherwise only the valid columns (the first `conv_kernel_size - 1`: a running state's window
//! starts at column 0) and the destination's other columns are left as they were. A conv window
//! that changes orientation (SD <-> DS), or a DS window whose width changes, cannot be rebuilt by
//! plain reads: its reads land in a staging buffer and a [`StagedCopy`] finishes it locally.
//! Workspace states are never part of a plan.

use super::compat::check_compatible;
use super::fingerprint::{add_bytes, mul_bytes, Fingerprint, Segment, StateKind, MAX_BYTES};
use crate::error::{Error, Result};
use crate::layout::ConvLayout;
use crate::sharding::{owned_units, unit_owners};

pub use crate::kernels::records::transfer::{Read, StagedCopy, STAGING};
/// Staging areas start on this many bytes.
const STAGING_ALIGN: u64 = 64;

/// Where one side's persistent state tensors are: per (layer, persistent state), layer-major, a
/// tensor `[num_blocks, *state_shape]` whose blocks are `block_strides[i]` bytes apart. Block 0 is
/// the null block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolGeometry {
    pub num_layers: u64,
    pub num_blocks: u64,
    pub block_strides: Vec<u64>,
}

/// The reads (and local copies) of one transfer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransferPlan {
    pub reads: Vec<Read>,
    pub staged: Vec<StagedCopy>,
    /// Bytes of staging buffer the plan needs (0 when every state is rebuilt by plain reads).
    pub staging_bytes: u64,
    pub num_requests: u64,
    /// The source ranks the destination rank reads from, ascending.
    pub source_ranks: Vec<u64>,
}

impl TransferPlan {
    /// Bytes read over the transport.
    pub fn bytes(&self) -> u64 {
        self.reads.iter().fold(0u64, |a, r| a.saturating_add(r.len))
    }
}

/// A read inside one block: offsets relative to the block's state.
#[derive(Clone, Copy, Debug)]
struct Local {
    rank: u64,
    src: u64,
    staged: bool,
    dst: u64,
    len: u64,
}

/// A staged copy inside one block; `src` is relative to the state's staging area.
#[derive(Clone, Copy, Debug)]
struct LocalStaged {
    src: u64,
    src_row: u64,
    src_col: u64,
    dst_row: u64,
    dst_col: u64,
    rows: u64,
    cols: u64,
    elem: u64,
}

/// The per-block recipe of one state.
struct StateRecipe {
    reads: Vec<Local>,
    staged: Option<LocalStaged>,
    staging: u64,
}

/// A run of units (channels or heads) the destination rank takes from one source rank.
#[derive(Clone, Copy, Debug)]
struct Piece {
    rank: u64,
    src: u64,
    dst: u64,
    n: u64,
}

fn push_piece(out: &mut Vec<Piece>, p: Piece) {
    if let Some(l) = out.last_mut() {
        if l.rank == p.rank && l.src + l.n == p.src && l.dst + l.n == p.dst {
            l.n += p.n;
            return;
        }
    }
    out.push(p);
}

fn push_read(out: &mut Vec<Local>, r: Local) {
    if r.len == 0 {
        return;
    }
    if let Some(l) = out.last_mut() {
        if l.rank == r.rank && l.staged == r.staged && l.src + l.len == r.src && l.dst + l.len == r.dst {
            l.len += r.len;
            return;
        }
    }
    out.push(r);
}

/// Whether source rank `p` of `ps` covers part of the model that destination rank `d` of `ds`
/// covers: the ranks a destination rank naturally reads from.
fn natural(p: u64, ps: u64, d: u64, ds: u64) -> bool {
    p * ds < (d + 1) * ps && (p + 1) * ds > d * ps
}

/// The owner of `unit` on the source side, preferring one of the destination rank's natural
/// source ranks among replicas.
fn source_owner(units: u64, src: &Fingerprint, dst: &Fingerprint, unit: u64) -> u64 {
    let owners = unit_owners(units, src.tp_size, unit);
    owners.clone().find(|&p| natural(p, src.tp_size, dst.tp_rank, dst.tp_size)).unwrap_or(owners.start)
}

/// Channel pieces of a conv window: which source rank and local channel each destination channel
/// comes from, sub-projection by sub-projection.
fn conv_pieces(src: &Fingerprint, dst: &Fingerprint, segments: &[Segment]) -> Result<Vec<Piece>> {
    let mut out = Vec::new();
    let mut dst_ch = 0u64;
    for (j, g) in segments.iter().enumerate() {
        let (df, dn) = owned_units(g.units, dst.tp_size, dst.tp_rank)?;
        for unit in df..df + dn {
            let p = source_owner(g.units, src, dst, unit);
            let mut seg_off = 0u64;
            for h in &segments[..j] {
                seg_off += owned_units(h.units, src.tp_size, p)?.1 * h.unit_dim;
            }
            let (pf, _) = owned_units(g.units, src.tp_size, p)?;
            let src_ch = seg_off + (unit - pf) * g.unit_dim;
            push_piece(&mut out, Piece { rank: p, src: src_ch, dst: dst_ch, n: g.unit_dim });
            dst_ch += g.unit_dim;
        }
    }
    Ok(out)
}

/// Head pieces of a head-sliced state.
fn head_pieces(src: &Fingerprint, dst: &Fingerprint, units: u64) -> Result<Vec<Piece>> {
    let (df, dn) = owned_units(units, dst.tp_size, dst.tp_rank)?;
    let mut out = Vec::new();
    for h in df..df + dn {
        let p = source_owner(units, src, dst, h);
        let (pf, _) = owned_units(units, src.tp_size, p)?;
        push_piece(&mut out, Piece { rank: p, src: h - pf, dst: h - df, n: 1 });
    }
    Ok(out)
}

fn recipe(src: &Fingerprint, dst: &Fingerprint, i: usize) -> Result<StateRecipe> {
    let (s, d) = (&src.states[i], &dst.states[i]);
    let es = s.dtype.itemsize();
    let mut reads = Vec::new();
    match (&s.kind, &d.kind) {
        (StateKind::Heads { units, shape }, StateKind::Heads { .. }) => {
            let ub = shape[1..].iter().product::<u64>() * es;
            for p in head_pieces(src, dst, *units)? {
                push_read(&mut reads, Local { rank: p.rank, src: p.src * ub, staged: false, dst: p.dst * ub, len: p.n * ub });
            }
            Ok(StateRecipe { reads, staged: None, staging: 0 })
        }
        (StateKind::Conv { layout: lp, width: wp, dim: dp, kernel_size, segments }, StateKind::Conv { layout: ld, width: wd, dim: dd, .. }) => {
            let (wp, dp, wd, dd) = (*wp, *dp, *wd, *dd);
            let cols = if wp == wd { wd } else { kernel_size - 1 };
            let pieces = conv_pieces(src, dst, segments)?;
            let direct = |staged: bool, reads: &mut Vec<Local>| {
                for c in 0..cols {
                    for p in &pieces {
                        push_read(reads, Local { rank: p.rank, src: (c * dp + p.src) * es, staged, dst: (c * dd + p.dst) * es, len: p.n * es });
                    }
                }
            };
            let rows_ds = |reads: &mut Vec<Local>, staged: bool| {
                for p in &pieces {
                    push_read(reads, Local { rank: p.rank, src: p.src * wp * es, staged, dst: p.dst * wp * es, len: p.n * wp * es });
                }
            };
            let (dst_row, dst_col) = match ld {
                ConvLayout::DS => (wd * es, es),
                ConvLayout::SD => (es, dd * es),
            };
            match (lp, ld) {
                (ConvLayout::SD, ConvLayout::SD) => {
                    direct(false, &mut reads);
                    Ok(StateRecipe { reads, staged: None, staging: 0 })
                }
                (ConvLayout::DS, ConvLayout::DS) if wp == wd => {
                    rows_ds(&mut reads, false);
                    Ok(StateRecipe { reads, staged: None, staging: 0 })
                }
                (ConvLayout::SD, ConvLayout::DS) => {
                    // Staging holds (cols, dd) in SD order; the local copy transposes it.
                    direct(true, &mut reads);
                    let st = LocalStaged { src: 0, src_row: es, src_col: dd * es, dst_row, dst_col, rows: dd, cols, elem: es };
                    Ok(StateRecipe { reads, staged: Some(st), staging: cols * dd * es })
                }
                (ConvLayout::DS, _) => {
                    // Staging holds (dd, wp) in DS order: whole source rows (few large reads);
                    // the local copy keeps the valid columns.
                    rows_ds(&mut reads, true);
                    let st = LocalStaged { src: 0, src_row: wp * es, src_col: es, dst_row, dst_col, rows: dd, cols, elem: es };
                    Ok(StateRecipe { reads, staged: Some(st), staging: dd * wp * es })
                }
            }
        }
        _ => Err(Error::layout(format!("state '{}': source and destination kinds differ", s.name))),
    }
}

/// Checks one side's pool geometry against its fingerprint: one block stride per (layer, state),
/// each at least the state's bytes, and the tensor's span within [`MAX_BYTES`].
pub(crate) fn check_pool(side: &str, fp: &Fingerprint, g: &PoolGeometry) -> Result<()> {
    let ns = fp.states.len() as u64;
    if g.num_layers == 0 {
        return Err(Error::binding(format!("{side} pool: no layers")));
    }
    if g.num_blocks < 2 {
        return Err(Error::binding(format!("{side} pool: {} blocks; a pool needs the null block 0 and at least one more", g.num_blocks)));
    }
    if g.num_layers.checked_mul(ns) != Some(g.block_strides.len() as u64) {
        return Err(Error::binding(format!(
            "{side} pool: {} block strides for {} layers x {ns} persistent states; give one per (layer, state), layer-major",
            g.block_strides.len(),
            g.num_layers
        )));
    }
    for (t, &stride) in g.block_strides.iter().enumerate() {
        let st = &fp.states[t % ns as usize];
        let nbytes = st.nbytes()?;
        let at = || format!("{side} pool: layer {}, state '{}'", t as u64 / ns, st.name);
        if stride < nbytes {
            return Err(Error::binding(format!("{}: block stride {stride} bytes is smaller than the state's {nbytes} bytes", at())));
        }
        if mul_bytes(g.num_blocks - 1, stride).and_then(|x| add_bytes(x, nbytes)).is_none() {
            return Err(Error::binding(format!(
                "{}: {} blocks of stride {stride} bytes overflow (a tensor spans at most {MAX_BYTES} bytes)",
                at(),
                g.num_blocks
            )));
        }
    }
    Ok(())
}

/// Plans moving the persistent states of `requests` (source block, destination block) from the
/// source instance (any rank's fingerprint `src`; `src_pools` one geometry shared by its ranks or
/// one per rank) to destination rank `dst` whose pool is `dst_pool`. Checks compatibility, the
/// geometries and every block id before planning anything.
pub fn plan_transfer(
    src: &Fingerprint,
    src_pools: &[PoolGeometry],
    dst: &Fingerprint,
    dst_pool: &PoolGeometry,
    requests: &[(u64, u64)],
) -> Result<TransferPlan> {
    check_compatible(src, dst)?;
    if src_pools.len() != 1 && src_pools.len() as u64 != src.tp_size {
        return Err(Error::binding(format!(
            "{} source pool geometries for tp_size {}; give one shared geometry or one per source rank",
            src_pools.len(),
            src.tp_size
        )));
    }
    for (p, g) in src_pools.iter().enumerate() {
        check_pool(&format!("source rank {p}"), src, g)?;
        if g.num_layers != dst_pool.num_layers {
            return Err(Error::binding(format!(
                "source rank {p} pool has {} layers but the destination pool has {}",
                g.num_layers, dst_pool.num_layers
            )));
        }
    }
    check_pool("destination", dst, dst_pool)?;
    let src_pool = |p: u64| &src_pools[if src_pools.len() == 1 { 0 } else { p as usize }];
    let mut seen = std::collections::HashMap::with_capacity(requests.len());
    for (r, &(sb, db)) in requests.iter().enumerate() {
        for (side, b, n) in [("source", sb, src_pools.iter().map(|g| g.num_blocks).min().unwrap_or(0)), ("destination", db, dst_pool.num_blocks)] {
            if b == 0 {
                return Err(Error::plan(format!("request {r}: the {side} block is the null block 0")));
            }
            if b >= n {
                return Err(Error::plan(format!("request {r}: {side} block {b} is out of range [1, {n})")));
            }
        }
        if let Some(q) = seen.insert(db, r) {
            return Err(Error::plan(format!(
                "requests {q} and {r} both write destination block {db}; each destination block may receive one request"
            )));
        }
    }
    let recipes: Vec<StateRecipe> = (0..dst.states.len()).map(|i| recipe(src, dst, i)).collect::<Result<_>>()?;
    let mut ranks: Vec<u64> = recipes.iter().flat_map(|r| r.reads.iter().map(|x| x.rank)).collect();
    ranks.sort_unstable();
    ranks.dedup();
    let ns = dst.states.len() as u64;
    let per_block: usize = recipes.iter().map(|r| r.reads.len()).sum();
    let mut reads = Vec::with_capacity(per_block * requests.len() * dst_pool.num_layers as usize);
    let mut staged = Vec::new();
    let mut staging = 0u64;
    for (r, &(sb, db)) in requests.iter().enumerate() {
        for layer in 0..dst_pool.num_layers {
            for (si, rc) in recipes.iter().enumerate() {
                let t = layer * ns + si as u64;
                let dbase = db * dst_pool.block_strides[t as usize];
                let sbase = staging;
                for x in &rc.reads {
                    let src_off = sb * src_pool(x.rank).block_strides[t as usize] + x.src;
                    let (dt, doff) = if x.staged { (STAGING, sbase + x.dst) } else { (t, dbase + x.dst) };
                    reads.push(Read {
                        request: r as u64,
                        src_rank: x.rank,
                        src_tensor: t,
                        src_offset: src_off,
                        dst_tensor: dt,
                        dst_offset: doff,
                        len: x.len,
                    });
                }
                if let Some(st) = &rc.staged {
                    staged.push(StagedCopy {
                        request: r as u64,
                        src_offset: sbase + st.src,
                        src_row_stride: st.src_row,
                        src_col_stride: st.src_col,
                        dst_tensor: t,
                        dst_offset: dbase,
                        dst_row_stride: st.dst_row,
                        dst_col_stride: st.dst_col,
                        rows: st.rows,
                        cols: st.cols,
                        elem: st.elem,
                    });
                    staging = add_bytes(staging, rc.staging.div_ceil(STAGING_ALIGN) * STAGING_ALIGN)
                        .ok_or_else(|| Error::plan(format!("the staging area of {} requests overflows {MAX_BYTES} bytes", requests.len())))?;
                }
            }
        }
    }
    Ok(TransferPlan { reads, staged, staging_bytes: staging, num_requests: requests.len() as u64, source_ranks: ranks })
}

/// A read of a plan that writes memory another request's read reads: `(writer, reader,
/// dst_tensor)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overlap {
    pub writer: u64,
    pub reader: u64,
    pub dst_tensor: u64,
}

/// The first read of `plan` whose destination bytes overlap the source bytes of another
/// request's read, at the addresses the pools' tensors have (`sources[rank][tensor]`,
/// `destination[tensor]`: block 0 of each); None when every read's destination is disjoint from
/// every other request's source. Source and destination pools that share memory (one pool, or two
/// over the same tensors) would otherwise make the result depend on the order of the copies (a
/// block written by one request and read by another). Staged reads write the staging buffer;
/// the staged copies run after every read, so they cannot clobber a source.
pub fn first_overlap(plan: &TransferPlan, sources: &std::collections::BTreeMap<u64, Vec<u64>>, destination: &[u64]) -> Option<Overlap> {
    let at = |base: Option<&u64>, offset: u64, len: u64| base.map(|&b| (b.saturating_add(offset), b.saturating_add(offset).saturating_add(len)));
    let mut reads: Vec<(u64, u64, u64)> = plan
        .reads
        .iter()
        .filter_map(|r| {
            let base = sources.get(&r.src_rank).and_then(|t| t.get(usize::try_from(r.src_tensor).ok()?));
            at(base, r.src_offset, r.len).map(|(a, b)| (a, b, r.request))
        })
        .collect();
    reads.sort_unstable();
    let longest = reads.iter().map(|&(a, b, _)| b - a).max().unwrap_or(0);
    for r in plan.reads.iter().filter(|r| r.dst_tensor != STAGING) {
        let Some((a, b)) = at(usize::try_from(r.dst_tensor).ok().and_then(|t| destination.get(t)), r.dst_offset, r.len) else { continue };
        // Reads starting in [a - longest, b) are the only ones that can overlap [a, b).
        let (lo, hi) = (reads.partition_point(|x| x.0 < a.saturating_sub(longest)), reads.partition_point(|x| x.0 < b));
        if let Some(x) = reads[lo..hi].iter().find(|x| x.1 > a && x.2 != r.request) {
            return Some(Overlap { writer: r.request, reader: x.2, dst_tensor: r.dst_tensor });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::families::{self, Common};
    use crate::transfer::test_gdn as gdn;

    fn pool(fp: &Fingerprint, layers: u64, blocks: u64) -> PoolGeometry {
        let strides = (0..layers).flat_map(|_| fp.states.iter().map(|s| s.nbytes().unwrap())).collect();
        PoolGeometry { num_layers: layers, num_blocks: blocks, block_strides: strides }
    }

    #[test]
    fn equal_tp_and_layout_is_one_read_per_state() {
        let (s, d) = (gdn(2, 1, 3, ConvLayout::DS), gdn(2, 1, 3, ConvLayout::DS));
        let p = plan_transfer(&s, &[pool(&s, 3, 8)], &d, &pool(&d, 3, 8), &[(2, 5), (3, 1)]).unwrap();
        assert_eq!(p.reads.len(), 2 * 3 * 2);
        assert!(p.staged.is_empty());
        assert_eq!(p.source_ranks, vec![1]);
        let conv = s.states[0].nbytes().unwrap();
        assert_eq!(p.reads[0], Read { request: 0, src_rank: 1, src_tensor: 0, src_offset: 2 * conv, dst_tensor: 0, dst_offset: 5 * conv, len: conv });
    }

    #[test]
    fn a_block_written_by_one_request_and_read_by_another_overlaps_in_one_pool() {
        let s = gdn(1, 0, 2, ConvLayout::DS);
        let g = pool(&s, 2, 8);
        let bases: Vec<u64> = (0..g.block_strides.len() as u64).map(|t| 1 << 40 | t << 30).collect();
        let one_pool = std::collections::BTreeMap::from([(0, bases.clone())]);
        let chained = plan_transfer(&s, std::slice::from_ref(&g), &s, &g, &[(1, 2), (2, 3)]).unwrap();
        assert_eq!(first_overlap(&chained, &one_pool, &bases), Some(Overlap { writer: 0, reader: 1, dst_tensor: 0 }));
        let disjoint = plan_transfer(&s, std::slice::from_ref(&g), &s, &g, &[(1, 4), (2, 5), (6, 6)]).unwrap();
        assert_eq!(first_overlap(&disjoint, &one_pool, &bases), None);
        let elsewhere: Vec<u64> = bases.iter().map(|b| b + (1 << 29)).collect();
        assert_eq!(first_overlap(&chained, &one_pool, &elsewhere), None, "pools in separate memory");
    }

    #[test]
    fn gdn_two_to_one_reads_q_k_v_and_heads_from_both_ranks() {
        let s = gdn(2, 0, 0, ConvLayout::DS);
        let d = gdn(1, 0, 0, ConvLayout::DS);
        let p = plan_transfer(&s, &[pool(&s, 1, 4)], &d, &pool(&d, 1, 4), &[(1, 1)]).unwrap();
        assert_eq!(p.source_ranks, vec![0, 1]);
        // q, k, v from each of two ranks, plus the heads of each.
        assert_eq!(p.reads.len(), 6 + 2);
        assert_eq!(p.bytes(), d.states.iter().map(|s| s.nbytes().unwrap()).sum::<u64>());
    }

    #[test]
    fn layout_change_is_staged_and_width_change_carries_kernel_columns() {
        let s = gdn(1, 0, 2, ConvLayout::SD);
        let d = gdn(2, 1, 0, ConvLayout::DS);
        let p = plan_transfer(&s, &[pool(&s, 1, 4)], &d, &pool(&d, 1, 4), &[(1, 2)]).unwrap();
        assert_eq!(p.staged.len(), 1);
        let st = p.staged[0];
        assert_eq!((st.rows, st.cols), (24, 3)); // (2*4*4 + 8*2) / 2 channels, kernel - 1 columns
        assert!(p.reads.iter().any(|r| r.dst_tensor == STAGING));
        assert!(p.staging_bytes >= 3 * 24 * 2);
    }

    #[test]
    fn replicated_groups_are_read_from_a_natural_source_rank() {
        let m = |tp| {
            let p = families::Mamba2 {
                intermediate_size: 16,
                n_groups: 1,
                num_heads: 8,
                head_dim: 2,
                state_size: 4,
                conv_kernel: 4,
                logical_window: None,
                mamba_backend: Default::default(),
            };
            let c = Common { tp_size: tp, num_spec: 0, conv_layout: ConvLayout::SD, dtype: DType::Float16, ssm_dtype: DType::Float32 };
            families::mamba2(&p, &c).unwrap()
        };
        let s = Fingerprint::new(&m(4), 0, 16).unwrap();
        let d = Fingerprint::new(&m(2), 1, 16).unwrap();
        let p = plan_transfer(&s, &[pool(&s, 1, 4)], &d, &pool(&d, 1, 4), &[(1, 1)]).unwrap();
        assert_eq!(p.source_ranks, vec![2, 3], "the replicated B / C group comes from rank 2, not rank 0");
    }

    #[test]
    fn different_widths_carry_kernel_minus_one_columns() {
        let (s, d) = (gdn(1, 0, 3, ConvLayout::SD), gdn(1, 0, 1, ConvLayout::SD));
        let p = plan_transfer(&s, &[pool(&s, 1, 4)], &d, &pool(&d, 1, 4), &[(1, 1)]).unwrap();
        assert!(p.staged.is_empty());
        assert_eq!(p.bytes(), 3 * 48 * 2 + d.states[1].nbytes().unwrap());
        // The first three SD rows are contiguous on both sides: one read.
        assert_eq!(p.reads.len(), 2);
    }

    #[test]
    fn bad_blocks_are_rejected() {
        let s = gdn(1, 0, 0, ConvLayout::SD);
        let (g, h) = (pool(&s, 1, 4), pool(&s, 1, 4));
        let e = |r: &[(u64, u64)]| plan_transfer(&s, std::slice::from_ref(&g), &s, &h, r).unwrap_err().message;
        assert!(e(&[(0, 1)]).contains("request 0: the source block is the null block 0"));
        assert!(e(&[(1, 4)]).contains("destination block 4 is out of range [1, 4)"));
        assert!(e(&[(1, 2), (3, 2)]).contains("requests 0 and 1 both write destination block 2"));
        let mut bad = h.clone();
        bad.block_strides[1] = 4;
        let m = plan_transfer(&s, std::slice::from_ref(&g), &s, &bad, &[(1, 1)]).unwrap_err().message;
        assert!(m.contains("state 'temporal': block stride 4 bytes"), "{m}");
        let huge = PoolGeometry { num_blocks: 1 << 62, ..h.clone() };
        let m = plan_transfer(&s, std::slice::from_ref(&g), &s, &huge, &[(1, 1)]).unwrap_err().message;
        assert!(m.contains("overflow"), "{m}");
    }
}
