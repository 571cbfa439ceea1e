//! The RecoverSSM commit as vLLM's Kimi-K3 model drives it, over the model's own tensors: each KDA
//! layer's conv state and recurrent state (its two KV-cache tensors), the verify records vLLM keeps
//! beside them (fp32 corrections `[R, H, Q, V]` and the raw key + gate `[R, H, Q, 2K]`, row `b`
//! for row `b` of the step's speculative batch) and the gate parameters (`A_log [H]`,
//! `dt_bias [H * K]`). [`kimi_k3_geometry`] checks the layers once; [`plan_kimi_k3_commit`] turns
//! one step's metadata (vLLM's `KDARecoverSSMCommitMetadata` and the sampler's accepted counts)
//! into the rows that write, with the rules of vLLM's commit-plan kernel, and refuses what that
//! kernel would read out of bounds or write twice.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{Device, TensorDesc};

/// vLLM's null block: a state index `<= 0` is padding, a block-table entry `<= 0` is no block.
pub const NULL_BLOCK: i64 = 0;

/// One KDA layer's tensors. `conv` is the conv state viewed dim-first, `[N, D, L]` with
/// `L = history + Q - 1` (vLLM's `kv_cache[0]`, transposed when its layout is token-first).
#[derive(Clone, Copy, Debug)]
pub struct KimiK3Layer<'a> {
    pub conv: &'a TensorDesc,
    pub state: &'a TensorDesc,
    pub correction: &'a TensorDesc,
    pub key_gate: &'a TensorDesc,
    pub a_log: &'a TensorDesc,
    pub dt_bias: &'a TensorDesc,
}

/// What every layer shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KimiK3Geometry {
    pub layers: usize,
    /// Blocks of the state and conv pools.
    pub num_blocks: u64,
    pub heads: u64,
    pub head_v_dim: u64,
    pub head_k_dim: u64,
    /// Rows of the verify records (vLLM's `max_num_reqs`): the most rows a commit may have.
    pub record_rows: u64,
    /// The speculative window `Q`.
    pub window: u64,
    pub conv_dim: u64,
    /// Conv columns kept after a commit (`L - Q + 1`).
    pub conv_history: u64,
}

fn shape(t: &TensorDesc, what: &str, rank: usize, expect: &str) -> Result<Vec<u64>> {
    if t.shape.len() != rank {
        return Err(Error::binding(format!("{what} must be {expect}, got shape {:?}", t.shape)));
    }
    t.shape.iter().map(|&n| u64::try_from(n).map_err(|_| Error::binding(format!("{what}: negative dimension in shape {:?}", t.shape)))).collect()
}

fn floating(t: &TensorDesc, what: &str, allowed: &[DType]) -> Result<DType> {
    let d = t.state_dtype().map_err(|e| Error::binding(format!("{what}: {}", e.message)))?;
    if !allowed.contains(&d) {
        let names: Vec<String> = allowed.iter().map(|a| a.to_string()).collect();
        return Err(Error::binding(format!("{what} must be {}, got {d}", names.join(" or "))));
    }
    Ok(d)
}

const FLOATS: [DType; 3] = [DType::Float32, DType::BFloat16, DType::Float16];

/// The gate's lower bound every layer shares (`None`: the softplus gate), or an error naming the
/// first layer that differs.
pub fn kimi_k3_lower_bound(bounds: &[Option<f64>]) -> Result<Option<f64>> {
    let first = *bounds.first().ok_or_else(|| Error::binding("Kimi-K3 commit: at least one KDA layer is needed, got none"))?;
    if let Some(b) = first {
        // The gate is `lower_bound * sigmoid(..)`, a log-decay: a positive bound would make every
        // decay a growth, and the states would blow up.
        if !b.is_finite() || b > 0.0 {
            return Err(Error::binding(format!("layer 0: gate_lower_bound must be finite and <= 0 (the lowest log-decay of the gate), got {b}")));
        }
    }
    match bounds.iter().position(|b| b.map(f64::to_bits) != first.map(f64::to_bits)) {
        Some(l) => Err(Error::binding(format!(
            "layer {l}: gate_lower_bound {:?}, layer 0's {first:?}; the layers of a commit need one gate bound",
            bounds[l]
        ))),
        None => Ok(first),
    }
}

/// Checks every layer's tensors against the first layer's and against each other (shapes, dtypes,
/// one device, writable destinations, untracked by autograd) for a window of `window` tokens.
pub fn kimi_k3_geometry(layers: &[KimiK3Layer<'_>], window: i64) -> Result<KimiK3Geometry> {
    if layers.is_empty() {
        return Err(Error::binding("Kimi-K3 commit: at least one KDA layer is needed, got none"));
    }
    if !(1..=1024).contains(&window) {
        return Err(Error::binding(format!("Kimi-K3 commit: spec_query_len must be in 1 ..= 1024, got {window}")));
    }
    let q = window as u64;
    let device: Device = layers[0].state.device()?;
    let mut geo: Option<KimiK3Geometry> = None;
    let mut dtypes: Option<[DType; 3]> = None;
    for (l, t) in layers.iter().enumerate() {
        let what = |name: &str| format!("layer {l}: {name}");
        let [n, h, v, k] = shape(t.state, &what("state"), 4, "[num_blocks, heads, head_v_dim, head_k_dim]")?[..] else { unreachable!() };
        let [cn, d, len] = shape(t.conv, &what("conv state"), 3, "[num_blocks, conv_dim, conv_len] (dim-first)")?[..] else { unreachable!() };
        let [r, ch, cq, cv] = shape(t.correction, &what("correction"), 4, "[max_num_reqs, heads, Q, head_v_dim]")?[..] else { unreachable!() };
        let [kr, kh, kq, kw] = shape(t.key_gate, &what("key_gate"), 4, "[max_num_reqs, heads, Q, 2 * head_k_dim]")?[..] else { unreachable!() };
        let sd = floating(t.state, &what("state"), &FLOATS)?;
        let cd = floating(t.conv, &what("conv state"), &FLOATS)?;
        floating(t.correction, &what("correction"), &[DType::Float32])?;
        let kd = floating(t.key_gate, &what("key_gate"), &FLOATS)?;
        floating(t.a_log, &what("A_log"), &FLOATS)?;
        floating(t.dt_bias, &what("dt_bias"), &FLOATS)?;
        if cn != n {
            return Err(Error::binding(format!("{}: {cn} blocks, the state {n}", what("conv state"))));
        }
        if [ch, cq, cv] != [h, q, v] {
            return Err(Error::binding(format!("{} must be [max_num_reqs, H={h}, Q={q}, V={v}], got {:?}", what("correction"), t.correction.shape)));
        }
        if [kr, kh, kq, kw] != [r, h, q, 2 * k] {
            return Err(Error::binding(format!("{} must be [R={r}, H={h}, Q={q}, 2K={}], got {:?}", what("key_gate"), 2 * k, t.key_gate.shape)));
        }
        if t.a_log.shape.iter().product::<i64>() != h as i64 {
            return Err(Error::binding(format!("{} must hold H = {h} values, got shape {:?}", what("A_log"), t.a_log.shape)));
        }
        if t.dt_bias.shape.iter().product::<i64>() != (h * k) as i64 {
            return Err(Error::binding(format!("{} must hold H * K = {} values, got shape {:?}", what("dt_bias"), h * k, t.dt_bias.shape)));
        }
        if len < q {
            return Err(Error::binding(format!(
                "{}: {len} columns cannot hold a window of {q} tokens and a history (conv_len - Q + 1 must be >= 1)",
                what("conv state")
            )));
        }
        for (name, x) in [
            ("state", t.state),
            ("conv state", t.conv),
            ("correction", t.correction),
            ("key_gate", t.key_gate),
            ("A_log", t.a_log),
            ("dt_bias", t.dt_bias),
        ] {
            if x.device()? != device {
                return Err(Error::binding(format!("{}: on {}, layer 0's state on {}", what(name), x.device, layers[0].state.device)));
            }
        }
        for (name, x) in [("state", t.state), ("conv state", t.conv)] {
            if !x.writable {
                return Err(Error::binding(format!("{}: read-only memory, the commit writes it", what(name))));
            }
            x.check_not_tracked(&what(name))?;
        }
        let g = KimiK3Geometry {
            layers: layers.len(),
            num_blocks: n,
            heads: h,
            head_v_dim: v,
            head_k_dim: k,
            record_rows: r,
            window: q,
            conv_dim: d,
            conv_history: len + 1 - q,
        };
        match (&geo, &dtypes) {
            (Some(g0), Some(d0)) => {
                if *g0 != g || *d0 != [sd, cd, kd] {
                    return Err(Error::binding(format!(
                        "layer {l}: its tensors differ from layer 0's (state {:?} {sd}, conv {:?} {cd}, records {r} rows, key_gate {kd}); every KDA layer of a commit must match",
                        t.state.shape, t.conv.shape
                    )));
                }
            }
            _ => {
                geo = Some(g);
                dtypes = Some([sd, cd, kd]);
            }
        }
    }
    check_no_shared_memory(layers)?;
    Ok(geo.expect("one layer at least"))
}

/// Where a tensor's elements lie: the byte range `[lo, hi)` of all of them, and its blocks (the
/// first axis): their count, byte stride, and the range `[blo, bhi)` of one block's elements
/// relative to the block's address.
struct Extent {
    lo: i128,
    hi: i128,
    stride0: i128,
    block_lo: i128,
    block_hi: i128,
}

impl Extent {
    /// `None` for a tensor without elements.
    fn of(t: &TensorDesc) -> Option<Extent> {
        if t.shape.iter().any(|&n| n <= 0) || t.strides.len() != t.shape.len() {
            return None;
        }
        let item = t.state_dtype().map_or(1, |d| d.itemsize()) as i128;
        let (mut block_lo, mut block_hi) = (0i128, item);
        for (&n, &st) in t.shape.iter().zip(&t.strides).skip(1) {
            let reach = (n as i128 - 1) * st as i128;
            if reach < 0 {
                block_lo += reach;
            } else {
                block_hi += reach;
            }
        }
        let (n0, stride0) = match (t.shape.first(), t.strides.first()) {
            (Some(&n), Some(&st)) => (n as i128, st as i128),
            _ => (1, 0),
        };
        let base = t.data_ptr as i128;
        let reach0 = (n0 - 1) * stride0;
        Some(Extent {
            lo: base + block_lo + reach0.min(0),
            hi: base + block_hi + reach0.max(0),
            stride0,
            block_lo: base + block_lo,
            block_hi: base + block_hi,
        })
    }

    /// Whether some element of `self` may be an element of `other`. Exact for disjoint ranges and
    /// for blocks interleaved with one stride (vLLM's pages hold a layer's conv state and state side
    /// by side); any other overlap of the ranges counts as shared.
    fn may_share(&self, other: &Extent) -> bool {
        if self.hi <= other.lo || other.hi <= self.lo {
            return false;
        }
        let s = self.stride0;
        let (wa, wb) = (self.block_hi - self.block_lo, other.block_hi - other.block_lo);
        if s > 0 && s == other.stride0 && wa <= s && wb <= s {
            let d = (other.block_lo - self.block_lo).rem_euclid(s);
            return !(d >= wa && d + wb <= s);
        }
        true
    }
}

/// Whether two elements of `t` may be one memory location (an expanded view, a stride of 0, axes
/// that overlap): a write of one block would then write others.
fn overlaps_itself(t: &TensorDesc) -> bool {
    let item = t.state_dtype().map_or(1, |d| d.itemsize()) as i128;
    let mut axes: Vec<(i128, i128)> =
        t.shape.iter().zip(&t.strides).filter(|(&n, _)| n > 1).map(|(&n, &st)| ((st as i128).abs(), n as i128)).collect();
    axes.sort_unstable();
    let mut extent = item;
    for (stride, n) in axes {
        if stride < extent {
            return true;
        }
        extent += (n - 1) * stride;
    }
    false
}

/// The tensors a commit writes (every layer's state and conv state) must not share memory with
/// each other, with themselves (one block written would write another) or with any tensor a commit
/// reads (records, gate parameters): a layer's write would change what another layer then reads,
/// or a block another row owns.
fn check_no_shared_memory(layers: &[KimiK3Layer<'_>]) -> Result<()> {
    let mut all: Vec<(String, &TensorDesc, bool)> = Vec::with_capacity(layers.len() * 6);
    for (l, t) in layers.iter().enumerate() {
        all.push((format!("layer {l}: state"), t.state, true));
        all.push((format!("layer {l}: conv state"), t.conv, true));
        all.push((format!("layer {l}: correction"), t.correction, false));
        all.push((format!("layer {l}: key_gate"), t.key_gate, false));
        all.push((format!("layer {l}: A_log"), t.a_log, false));
        all.push((format!("layer {l}: dt_bias"), t.dt_bias, false));
    }
    for (name, t, written) in &all {
        if *written && overlaps_itself(t) {
            return Err(Error::binding(format!(
                "{name}: its elements overlap (shape {:?}, byte strides {:?}: an expanded view, or a stride of 0); a commit writing one block would write others",
                t.shape, t.strides
            )));
        }
    }
    let extents: Vec<Option<Extent>> = all.iter().map(|(_, t, _)| Extent::of(t)).collect();
    for (i, (name, _, written)) in all.iter().enumerate() {
        let Some(a) = &extents[i] else { continue };
        if !written {
            continue;
        }
        for (j, (other, _, other_written)) in all.iter().enumerate() {
            if j == i || (*other_written && j < i) {
                continue; // each pair of written tensors once
            }
            if extents[j].as_ref().is_some_and(|b| a.may_share(b)) {
                return Err(Error::binding(format!(
                    "{name} and {other} share memory (the same tensor twice, or overlapping views); the commit writes the first, which would change the other: give every layer its own tensors"
                )));
            }
        }
    }
    Ok(())
}

/// Align mode: the block table (row-major `[rows, cols]`, indexed by request), the tokens each
/// request had computed before the window, and the block size.
#[derive(Clone, Copy, Debug)]
pub struct KimiK3Align<'a> {
    pub block_table: &'a [i64],
    pub cols: usize,
    pub num_computed: &'a [i64],
    pub block_size: i64,
}

/// One step's commit: the batch rows' state indices and query start offsets, the accepted counts
/// (indexed by request), the row -> request map (`None`: row `b` is request `b`).
#[derive(Clone, Copy, Debug)]
pub struct KimiK3Step<'a> {
    pub num_accepted: &'a [i64],
    pub state_indices: &'a [i64],
    pub query_start_loc: &'a [i64],
    pub request_indices: Option<&'a [i64]>,
    pub align: Option<KimiK3Align<'a>>,
}

/// A row that writes: its records' row, its request, the block its state and conv window are read
/// from, the tokens folded in, the block the result goes to and, in align mode, the block of the
/// crossed boundary (`NULL_BLOCK`: none) with the tokens before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KimiK3Row {
    pub row: i64,
    pub request: i64,
    pub source: i64,
    pub count: i64,
    pub dest: i64,
    pub boundary: i64,
    pub boundary_len: i64,
}

fn block(b: i64, who: &str, what: &str, n: u64) -> Result<i64> {
    if b >= n as i64 {
        return Err(Error::plan(format!("Kimi-K3 commit: {who}: {what} {b} is outside 0 ..= {}", n.saturating_sub(1))));
    }
    Ok(b)
}

/// The rows of one step that write (rows of padding, of no accepted token or of no destination
/// write nothing, as in vLLM), every input checked first: a bad input is a `PlanError` naming the
/// row, its request and the value.
pub fn plan_kimi_k3_commit(step: &KimiK3Step<'_>, geo: &KimiK3Geometry) -> Result<Vec<KimiK3Row>> {
    let batch = step.state_indices.len();
    if step.query_start_loc.len() != batch + 1 {
        return Err(Error::plan(format!(
            "Kimi-K3 commit: query_start_loc needs batch + 1 = {} entries, got {}",
            batch + 1,
            step.query_start_loc.len()
        )));
    }
    if batch as u64 > geo.record_rows {
        return Err(Error::plan(format!("Kimi-K3 commit: {batch} rows, the verify records hold {}", geo.record_rows)));
    }
    if let Some(ri) = step.request_indices {
        if ri.len() < batch {
            return Err(Error::plan(format!("Kimi-K3 commit: request_indices has {} entries for {batch} rows", ri.len())));
        }
    }
    if let Some(a) = &step.align {
        if a.block_size < geo.window as i64 {
            return Err(Error::plan(format!(
                "Kimi-K3 commit: block_size {} must cover one speculative window ({} tokens)",
                a.block_size, geo.window
            )));
        }
        if a.cols == 0 {
            return Err(Error::plan("Kimi-K3 commit: the block table has no column"));
        }
    }
    let mut out = Vec::new();
    for b in 0..batch {
        let req = step.request_indices.map_or(b as i64, |ri| ri[b]);
        let who = format!("row {b} (request {req})");
        let (q0, q1) = (step.query_start_loc[b], step.query_start_loc[b + 1]);
        if q0 < 0 || q1 < q0 {
            return Err(Error::plan(format!("Kimi-K3 commit: {who}: query_start_loc [{q0}, {q1}) is not a token range")));
        }
        if req < 0 || req as usize >= step.num_accepted.len() {
            return Err(Error::plan(format!(
                "Kimi-K3 commit: {who}: request {req} is outside 0 ..= {} (num_accepted_tokens)",
                step.num_accepted.len() as i64 - 1
            )));
        }
        let source = block(step.state_indices[b], &who, "state index", geo.num_blocks)?;
        let count = step.num_accepted[req as usize].max(0).min(q1 - q0).min(geo.window as i64);
        if source <= NULL_BLOCK || count == 0 {
            continue;
        }
        let (mut dest, mut boundary, mut boundary_len) = (source, NULL_BLOCK, 0);
        if let Some(a) = &step.align {
            let rows = a.block_table.len() / a.cols;
            if req as usize >= rows || req as usize >= a.num_computed.len() {
                return Err(Error::plan(format!(
                    "Kimi-K3 commit: {who}: request {req} is outside the block table ({rows} rows) or num_computed_tokens ({})",
                    a.num_computed.len()
                )));
            }
            let computed = a.num_computed[req as usize];
            if computed < 0 {
                return Err(Error::plan(format!("Kimi-K3 commit: {who}: num_computed_tokens {computed} is negative")));
            }
            let at = |col: i64| a.block_table[req as usize * a.cols + col as usize];
            // The token positions must be 64-bit integers: a count past 2**63 - 1 would wrap.
            let positions = computed.checked_add(count).zip((computed / a.block_size + 1).checked_mul(a.block_size));
            let Some((last, next)) = positions else {
                return Err(Error::plan(format!(
                    "Kimi-K3 commit: {who}: num_computed_tokens {computed} with {count} accepted tokens (block size {}) is past the largest token position (2**63 - 1)",
                    a.block_size
                )));
            };
            let col = ((last - 1).max(0) / a.block_size).min(a.cols as i64 - 1);
            dest = block(at(col), &who, &format!("block table column {col}: block"), geo.num_blocks)?;
            if last >= next {
                let bcol = next / a.block_size - 1;
                if bcol >= a.cols as i64 {
                    return Err(Error::plan(format!(
                        "Kimi-K3 commit: {who}: the boundary at token {next} needs block table column {bcol}, the table has {}",
                        a.cols
                    )));
                }
                boundary = block(at(bcol), &who, &format!("block table column {bcol}: boundary block"), geo.num_blocks)?.max(NULL_BLOCK);
                boundary_len = next - computed;
            }
            if dest <= NULL_BLOCK {
                continue;
            }
        }
        out.push(KimiK3Row {
            row: b as i64,
            request: req,
            source,
            count,
            dest,
            boundary,
            boundary_len: if boundary > NULL_BLOCK { boundary_len } else { 0 },
        });
    }
    check_disjoint(&out)?;
    Ok(out)
}

/// No block written by two rows, none written by one row and read by another (vLLM's kernels
/// would race); a row's own destination and boundary may coincide (the same state).
fn check_disjoint(rows: &[KimiK3Row]) -> Result<()> {
    use std::collections::HashMap;
    let mut written: HashMap<i64, usize> = HashMap::new();
    for (i, r) in rows.iter().enumerate() {
        let mut mine = vec![r.dest];
        if r.boundary > NULL_BLOCK && r.boundary != r.dest {
            mine.push(r.boundary);
        }
        for w in mine {
            if let Some(&j) = written.get(&w) {
                let o = &rows[j];
                return Err(Error::plan(format!(
                    "Kimi-K3 commit: row {} (request {}) and row {} (request {}) both write block {w}",
                    o.row, o.request, r.row, r.request
                )));
            }
            written.insert(w, i);
        }
    }
    for r in rows {
        if let Some(&j) = written.get(&r.source) {
            let o = &rows[j];
            if o.row != r.row {
                return Err(Error::plan(format!(
                    "Kimi-K3 commit: row {} (request {}) writes block {}, which row {} (request {}) reads its state from",
                    o.row, o.request, r.source, r.row, r.request
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> KimiK3Geometry {
        KimiK3Geometry { layers: 1, num_blocks: 16, heads: 2, head_v_dim: 4, head_k_dim: 4, record_rows: 4, window: 3, conv_dim: 8, conv_history: 3 }
    }

    fn step<'a>(na: &'a [i64], si: &'a [i64], qsl: &'a [i64], align: Option<KimiK3Align<'a>>) -> KimiK3Step<'a> {
        KimiK3Step { num_accepted: na, state_indices: si, query_start_loc: qsl, request_indices: None, align }
    }

    #[test]
    fn plans_counts_padding_and_boundaries() {
        let rows = plan_kimi_k3_commit(&step(&[2, 0, 9], &[3, 4, 0], &[0, 3, 6, 9], None), &geo()).unwrap();
        assert_eq!(rows, vec![KimiK3Row { row: 0, request: 0, source: 3, count: 2, dest: 3, boundary: 0, boundary_len: 0 }]);
        // Align: request 0 computed 6 of block size 4, 3 accepted -> tokens 7..9 cross 8.
        let bt = [5, 6, 7, 0, 9, 10, 11, 0];
        let a = KimiK3Align { block_table: &bt, cols: 4, num_computed: &[6, 1], block_size: 4 };
        let rows = plan_kimi_k3_commit(&step(&[3, 1], &[2, 8], &[0, 3, 6], Some(a)), &geo()).unwrap();
        assert_eq!(rows[0], KimiK3Row { row: 0, request: 0, source: 2, count: 3, dest: 7, boundary: 6, boundary_len: 2 });
        assert_eq!(rows[1], KimiK3Row { row: 1, request: 1, source: 8, count: 1, dest: 9, boundary: 0, boundary_len: 0 });
    }

    #[test]
    fn refuses_what_would_be_read_out_of_bounds_or_written_twice() {
        let m = plan_kimi_k3_commit(&step(&[1], &[16], &[0, 3], None), &geo()).unwrap_err().message;
        assert!(m.contains("row 0 (request 0): state index 16 is outside 0 ..= 15"), "{m}");
        let m = plan_kimi_k3_commit(&step(&[1, 1], &[3, 3], &[0, 3, 6], None), &geo()).unwrap_err().message;
        assert!(m.contains("both write block 3"), "{m}");
        let m = plan_kimi_k3_commit(&step(&[1], &[3], &[0, 3], None), &KimiK3Geometry { record_rows: 0, ..geo() }).unwrap_err().message;
        assert!(m.contains("1 rows, the verify records hold 0"), "{m}");
        let bt = [5, 6];
        let a = KimiK3Align { block_table: &bt, cols: 2, num_computed: &[11], block_size: 4 };
        let m = plan_kimi_k3_commit(&step(&[2], &[2], &[0, 3], Some(a)), &geo()).unwrap_err().message;
        assert!(m.contains("the boundary at token 12 needs block table column 2, the table has 2"), "{m}");
        let a = KimiK3Align { block_table: &bt, cols: 2, num_computed: &[0], block_size: 2 };
        let m = plan_kimi_k3_commit(&step(&[2], &[2], &[0, 3], Some(a)), &geo()).unwrap_err().message;
        assert!(m.contains("block_size 2 must cover"), "{m}");
        // A destination that is another row's source.
        let bt = [4, 0, 9, 0];
        let a = KimiK3Align { block_table: &bt, cols: 2, num_computed: &[0, 0], block_size: 4 };
        let m = plan_kimi_k3_commit(&step(&[1, 1], &[2, 4], &[0, 3, 6], Some(a)), &geo()).unwrap_err().message;
        assert!(m.contains("writes block 4, which row 1"), "{m}");
    }

    #[test]
    fn token_positions_past_i64_are_refused() {
        let bt = [5, 6];
        for (computed, bs) in [(i64::MAX, 4), (i64::MAX - 1, 4), (i64::MAX - 1, i64::MAX)] {
            let a = KimiK3Align { block_table: &bt, cols: 2, num_computed: &[computed], block_size: bs };
            let m = plan_kimi_k3_commit(&step(&[2], &[2], &[0, 3], Some(a)), &geo()).unwrap_err().message;
            assert!(m.contains(&format!("row 0 (request 0): num_computed_tokens {computed} with 2 accepted tokens")), "{m}");
        }
    }

    fn dense(addr: u64, shape: &[i64]) -> TensorDesc {
        TensorDesc::dense(addr, "float32", shape, "cpu")
    }

    #[test]
    fn written_tensors_share_no_memory() {
        let (state, conv) = (dense(0x10000, &[8, 2, 4, 4]), dense(0x20000, &[8, 6, 4]));
        let (corr, kg) = (dense(0x30000, &[2, 2, 3, 4]), dense(0x40000, &[2, 2, 3, 8]));
        let (a_log, dt) = (dense(0x50000, &[2]), dense(0x50100, &[2, 4]));
        let reads = (&corr, &kg, &a_log, &dt);
        fn with<'a>(
            state: &'a TensorDesc,
            conv: &'a TensorDesc,
            r: (&'a TensorDesc, &'a TensorDesc, &'a TensorDesc, &'a TensorDesc),
        ) -> KimiK3Layer<'a> {
            KimiK3Layer { conv, state, correction: r.0, key_gate: r.1, a_log: r.2, dt_bias: r.3 }
        }
        let layer = |state, conv| with(state, conv, reads);
        // Layers may share the records and gate parameters they only read.
        let state1 = dense(0x60000, &[8, 2, 4, 4]);
        let conv1 = dense(0x70000, &[8, 6, 4]);
        assert!(kimi_k3_geometry(&[layer(&state, &conv), layer(&state1, &conv1)], 3).is_ok());
        let m = kimi_k3_geometry(&[layer(&state, &conv), layer(&state, &conv1)], 3).unwrap_err().message;
        assert!(m.contains("layer 0: state and layer 1: state share memory"), "{m}");
        // A state overlapping a record it reads.
        let over = dense(0x30000 + 64, &[8, 2, 4, 4]);
        let m = kimi_k3_geometry(&[layer(&over, &conv)], 3).unwrap_err().message;
        assert!(m.contains("layer 0: state and layer 0: correction share memory"), "{m}");
        // An expanded state: every block is one.
        let mut expanded = state.clone();
        expanded.strides[0] = 0;
        let m = kimi_k3_geometry(&[layer(&expanded, &conv)], 3).unwrap_err().message;
        assert!(m.contains("layer 0: state: its elements overlap"), "{m}");
        // vLLM's pages: a layer's conv state and state interleaved with one block stride.
        let page = 6 * 4 * 4 + 2 * 4 * 4 * 4;
        let mut c = dense(0x80000, &[8, 6, 4]);
        c.strides[0] = page;
        let mut st = dense(0x80000 + 6 * 4 * 4, &[8, 2, 4, 4]);
        st.strides[0] = page;
        assert!(kimi_k3_geometry(&[with(&st, &c, reads)], 3).is_ok());
        st.data_ptr -= 4;
        let m = kimi_k3_geometry(&[with(&st, &c, reads)], 3).unwrap_err().message;
        assert!(m.contains("share memory"), "{m}");
    }

    #[test]
    fn one_gate_bound_for_every_layer() {
        assert_eq!(kimi_k3_lower_bound(&[Some(-5.0), Some(-5.0)]).unwrap(), Some(-5.0));
        assert_eq!(kimi_k3_lower_bound(&[None, None]).unwrap(), None);
        let m = kimi_k3_lower_bound(&[None, Some(-5.0)]).unwrap_err().message;
        assert!(m.contains("layer 1: gate_lower_bound Some(-5.0)"), "{m}");
        assert!(kimi_k3_lower_bound(&[Some(f64::NAN)]).is_err());
        let m = kimi_k3_lower_bound(&[Some(5.0), Some(5.0)]).unwrap_err().message;
        assert!(m.contains("layer 0: gate_lower_bound must be finite and <= 0"), "{m}");
        assert_eq!(kimi_k3_lower_bound(&[Some(0.0)]).unwrap(), Some(0.0));
    }
}
