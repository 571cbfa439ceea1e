//! Copy-plan throughput: requests x layers x {GDN, Mamba2} align steps, reported as copies per
//! second (criterion's "elements"). Inputs mimic an engine step: every request crossed a block
//! boundary and accepted a random number of tokens. No Python involved.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use recoverssm_rs::families::{self, Common};
use recoverssm_rs::layout::{ConvLayout, Layout};
use recoverssm_rs::{AlignStep, Binding, DType, Planner, TensorDesc};
use std::hint::black_box;

fn gdn() -> Layout {
    let p = families::Gdn { num_k_heads: 16, num_v_heads: 32, head_k_dim: 128, head_v_dim: 128, conv_kernel_size: 4, recover_ssm: false };
    families::gdn(&p, &common()).unwrap()
}

fn mamba2() -> Layout {
    let p = families::Mamba2 {
        intermediate_size: 8192,
        n_groups: 8,
        num_heads: 128,
        head_dim: 64,
        state_size: 128,
        conv_kernel: 4,
        logical_window: None,
        mamba_backend: families::MambaBackend::Triton,
    };
    families::mamba2(&p, &common()).unwrap()
}

fn common() -> Common {
    Common { tp_size: 1, num_spec: 3, conv_layout: ConvLayout::SD, dtype: DType::BFloat16, ssm_dtype: DType::Float32 }
}

/// Descriptors of dense, non-overlapping tensors at made-up addresses: planning never touches
/// the memory, so none is allocated.
fn binding(layout: &Layout, layers: usize, num_blocks: u64) -> Binding {
    let mut addr = 1u64 << 40;
    let descs: Vec<Vec<TensorDesc>> = (0..layers)
        .map(|_| {
            layout
                .persistent()
                .iter()
                .map(|s| {
                    let mut shape = vec![num_blocks as i64];
                    shape.extend(s.shape.iter().map(|&d| d as i64));
                    let d = TensorDesc::dense(addr, s.dtype.name(), &shape, "cuda:0");
                    addr += d.strides[0] as u64 * num_blocks + 4096;
                    d
                })
                .collect()
        })
        .collect();
    Binding::new(layout, &descs).unwrap()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("plan_align");
    g.sample_size(30);
    for (name, layout) in [("gdn", gdn()), ("mamba2", mamba2())] {
        for layers in [24usize, 48, 64] {
            for requests in [1usize, 64, 256, 1024] {
                let cols = 5; // 1 + num_spec + 1
                let planner = Planner::new(vec![binding(&layout, layers, (requests * cols + 1) as u64)]).unwrap();
                let bt: Vec<i64> = (0..(requests * cols) as i64).map(|i| i + 1).collect();
                let src = vec![0i64; requests];
                let dst = vec![4i64; requests];
                let mut x = 12345u64;
                let acc: Vec<i64> = (0..requests)
                    .map(|_| {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        1 + ((x >> 33) % 4) as i64
                    })
                    .collect();
                let step = AlignStep { block_table: &bt, cols, src_col: &src, dst_col: &dst, num_accepted: &acc };
                let copies = planner.plan_align(&step).unwrap().num_copies();
                g.throughput(Throughput::Elements(copies));
                g.bench_with_input(BenchmarkId::new(name, format!("{requests}req_x_{layers}layers")), &step, |b, s| {
                    b.iter(|| black_box(planner.plan_align(black_box(s)).unwrap()))
                });
            }
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
