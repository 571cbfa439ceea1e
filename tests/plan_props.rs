//! Property tests: random layouts, bindings (separate tensors and interleaved pages), block tables
//! and steps; the plan, run by the host executor, must equal a naive reference written directly
//! from the align-mode semantics, byte for byte. Rejected steps must leave every byte unchanged.

use proptest::prelude::*;
use recoverssm_rs::layout::{ConvLayout, CopyKind, Layout, StateSpec};
use recoverssm_rs::{executor, AlignStep, Binding, DType, Planner, TensorDesc};

#[derive(Clone, Debug)]
struct Case {
    conv: Option<(ConvLayout, u64, u64, DType)>, // layout, width, dim, dtype
    temporal: Option<(Vec<u64>, DType)>,
    num_spec: u32,
    layers: usize,
    blocks: u64,
    interleaved: bool,
    pad: u64,
    // per request: (row, src_col, dst_col, num_accepted)
    reqs: Vec<(Vec<i64>, i64, i64, i64)>,
    seed: u64,
}

fn dtype() -> impl Strategy<Value = DType> {
    prop_oneof![Just(DType::UInt8), Just(DType::BFloat16), Just(DType::Float32), Just(DType::Float64)]
}

fn case() -> impl Strategy<Value = Case> {
    (
        0u32..4,
        prop::option::of((prop_oneof![Just(ConvLayout::SD), Just(ConvLayout::DS)], 1u64..5, 1u64..9, dtype())),
        prop::option::of((prop::collection::vec(1u64..5, 1..4), dtype())),
        1usize..4,
        3u64..24,
        any::<bool>(),
        0u64..3,
        any::<u64>(),
    )
        .prop_filter("a layout needs a persistent state", |(_, c, t, ..)| c.is_some() || t.is_some())
        .prop_flat_map(|(num_spec, conv, temporal, layers, blocks, interleaved, pad, seed)| {
            let conv = conv.map(|(l, w, d, dt)| (l, w + num_spec as u64, d, dt));
            let cols = 1 + num_spec as usize + 2;
            let req = (
                prop::collection::vec(prop_oneof![12 => 1i64..blocks as i64, 1 => Just(0i64)], cols),
                -1i64..cols as i64,
                -1i64..cols as i64,
                1i64..(num_spec as i64 + 2),
            );
            (Just((conv, temporal, num_spec, layers, blocks, interleaved, pad, seed)), prop::collection::vec(req, 0..12))
        })
        .prop_map(|((conv, temporal, num_spec, layers, blocks, interleaved, pad, seed), reqs)| Case {
            conv,
            temporal,
            num_spec,
            layers,
            blocks,
            interleaved,
            pad,
            reqs,
            seed,
        })
}

fn layout(c: &Case) -> Layout {
    let mut states = Vec::new();
    if let Some((l, w, d, dt)) = c.conv {
        let shape = if l == ConvLayout::SD { [w, d] } else { [d, w] };
        states.push(StateSpec::persistent("conv", &shape, dt, CopyKind::Conv(l)));
    }
    if let Some((shape, dt)) = &c.temporal {
        states.push(StateSpec::persistent("temporal", shape, *dt, CopyKind::Temporal));
    }
    states.push(StateSpec::workspace("records", &[3], DType::Float32));
    Layout::new("TEST", states, c.num_spec).unwrap()
}

/// Memory for the states and the tensor descriptors pointing into it.
struct Memory {
    buf: Vec<u64>, // u64 for 8-byte alignment
    descs: Vec<Vec<TensorDesc>>,
    /// (offset in bytes, block stride, state bytes) per [layer][state]
    geo: Vec<Vec<(usize, usize, usize)>>,
}

fn memory(c: &Case, l: &Layout) -> Memory {
    let states = l.persistent();
    let sizes: Vec<usize> = states.iter().map(|s| s.nbytes().unwrap() as usize).collect();
    let round = |x: usize| x.div_ceil(8) * 8;
    let mut geo = vec![vec![(0, 0, 0); states.len()]; c.layers];
    let total;
    if c.interleaved {
        // One page per block holding every layer's states, like an engine's shared buffer.
        let mut off = 0;
        for g in geo.iter_mut() {
            for (s, sz) in sizes.iter().enumerate() {
                g[s] = (off, 0, *sz);
                off += round(*sz + c.pad as usize * 8);
            }
        }
        let page = off;
        for g in geo.iter_mut() {
            for e in g.iter_mut() {
                e.1 = page;
            }
        }
        total = page * c.blocks as usize;
    } else {
        let mut off = 0;
        for g in geo.iter_mut() {
            for (s, sz) in sizes.iter().enumerate() {
                let stride = round(*sz + c.pad as usize * 8);
                g[s] = (off, stride, *sz);
                off += stride * c.blocks as usize;
            }
        }
        total = off;
    }
    let mut x = c.seed | 1;
    let buf: Vec<u64> = (0..total / 8 + 1)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        })
        .collect();
    let base = buf.as_ptr() as u64;
    let descs = geo
        .iter()
        .map(|g| {
            g.iter()
                .zip(states)
                .map(|(&(off, stride, _), spec)| {
                    let mut shape = vec![c.blocks as i64];
                    shape.extend(spec.shape.iter().map(|&d| d as i64));
                    let mut t = TensorDesc::dense(base + off as u64, spec.dtype.name(), &shape, "cpu");
                    t.strides[0] = stride as i64;
                    t
                })
                .collect()
        })
        .collect();
    Memory { buf, descs, geo }
}

fn bytes(m: &Memory) -> Vec<u8> {
    m.buf.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// The semantics of docs/design.md section 3, applied to a snapshot: every copy reads the state as it
/// was before the step.
fn reference(c: &Case, l: &Layout, m: &Memory, before: &[u8]) -> Vec<u8> {
    let mut after = before.to_vec();
    let states = l.persistent();
    for (row, sc, dc, a) in &c.reqs {
        if *sc < 0 || *dc < 0 {
            continue;
        }
        let (sc, dc, a) = (*sc as usize, *dc as usize, *a as usize);
        if (row[sc] == 0 && row[dc] == 0) || (sc == dc && a == 1) {
            continue; // padding / null rows and no-ops move nothing
        }
        for layer in 0..c.layers {
            for (si, spec) in states.iter().enumerate() {
                let (off, stride, _) = m.geo[layer][si];
                let e = spec.dtype.itemsize() as usize;
                let blk = |b: i64| off + b as usize * stride;
                match spec.copy.unwrap() {
                    CopyKind::Temporal => {
                        let (s, d) = (blk(row[sc + a - 1]), blk(row[dc]));
                        if s == d {
                            continue; // copying a block onto itself moves nothing
                        }
                        let n = spec.nbytes().unwrap() as usize;
                        after[d..d + n].copy_from_slice(&before[s..s + n]);
                    }
                    CopyKind::Conv(cl) => {
                        let (s, d) = (blk(row[sc]), blk(row[dc]));
                        let k = a - 1;
                        if s == d && k == 0 {
                            continue;
                        }
                        let (w, dim) = match cl {
                            ConvLayout::SD => (spec.shape[0] as usize, spec.shape[1] as usize),
                            ConvLayout::DS => (spec.shape[1] as usize, spec.shape[0] as usize),
                        };
                        for col in 0..w - k {
                            for ch in 0..dim {
                                let idx = |col: usize| match cl {
                                    ConvLayout::SD => (col * dim + ch) * e,
                                    ConvLayout::DS => (ch * w + col) * e,
                                };
                                let (si_, di_) = (s + idx(col + k), d + idx(col));
                                after[di_..di_ + e].copy_from_slice(&before[si_..si_ + e]);
                            }
                        }
                    }
                }
            }
        }
    }
    after
}

fn step_arrays(c: &Case) -> (Vec<i64>, usize, Vec<i64>, Vec<i64>, Vec<i64>) {
    let cols = c.reqs.first().map(|r| r.0.len()).unwrap_or(1 + c.num_spec as usize + 2);
    let bt: Vec<i64> = c.reqs.iter().flat_map(|r| r.0.iter().copied()).collect();
    (bt, cols, c.reqs.iter().map(|r| r.1).collect(), c.reqs.iter().map(|r| r.2).collect(), c.reqs.iter().map(|r| r.3).collect())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    #[test]
    fn plan_executes_exactly_the_reference(c in case()) {
        let l = layout(&c);
        let mut m = memory(&c, &l);
        let binding = Binding::new(&l, &m.descs).unwrap();
        let planner = Planner::new(vec![binding]).unwrap();
        let before = bytes(&m);
        let (bt, cols, sc, dc, na) = step_arrays(&c);
        let step = AlignStep { block_table: &bt, cols, src_col: &sc, dst_col: &dc, num_accepted: &na };
        match planner.plan_align(&step) {
            Ok(plan) => {
                executor::execute(&plan).unwrap();
                let got = bytes(&m);
                let want = reference(&c, &l, &m, &before);
                prop_assert!(got == want, "plan result differs from the reference; waves {}", plan.num_waves());
                for w in 0..plan.num_waves() { prop_assert!(!plan.wave(w).is_empty()); }
            }
            Err(e) => {
                // Rejected: nothing moved, and the message says why.
                prop_assert_eq!(bytes(&m), before);
                let msg = e.message;
                prop_assert!(
                    msg.contains("null block") || msg.contains("same bytes") || msg.contains("cycle") || msg.contains("is outside the block-table row"),
                    "unexpected rejection: {}", msg
                );
            }
        }
        m.buf.clear();
    }
}

/// Waves above the executor's parallel threshold are split across threads (single-row copies
/// inside, other segments whole): the result must still be exact.
#[test]
fn large_waves_split_across_threads_are_exact() {
    let c = Case {
        conv: Some((ConvLayout::DS, 4 + 2, 4096, DType::BFloat16)),
        temporal: Some((vec![64, 64, 64], DType::Float32)), // 1 MiB per block
        num_spec: 2,
        layers: 2,
        blocks: 24,
        interleaved: false,
        pad: 1,
        reqs: (0..6)
            .map(|r| {
                let base = 1 + 3 * r as i64;
                // window columns: [running, spec 1, spec 2, destination] with distinct blocks
                (vec![base, base + 1, base + 2, 19 + (r as i64 % 5)], 0, 3, 1 + (r as i64 % 3))
            })
            .filter(|(row, ..)| row[3] < 24)
            .take(5)
            .collect(),
        seed: 99,
    };
    let l = layout(&c);
    let m = memory(&c, &l);
    let planner = Planner::new(vec![Binding::new(&l, &m.descs).unwrap()]).unwrap();
    let before = bytes(&m);
    let (bt, cols, sc, dc, na) = step_arrays(&c);
    let plan = planner.plan_align(&AlignStep { block_table: &bt, cols, src_col: &sc, dst_col: &dc, num_accepted: &na }).unwrap();
    assert!(plan.bytes() > 4 << 20, "the wave must be large enough to run in parallel");
    executor::execute(&plan).unwrap();
    assert!(bytes(&m) == reference(&c, &l, &m, &before));
}
