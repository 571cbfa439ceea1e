//! Checkpoint-policy decisions: one request's `plan` + `finish` (lookup, placement, writes,
//! evictions) against a cache already holding 1,000 (and 10,000) checkpoints, for each policy.
//! Requests share a 1,500-token prefix and carry 300 tokens of their own plus 64 of output, so
//! every request writes and, at the budget, evicts (block size 256, so that vLLM's replay boundary lies
//! past the shared prefix). No Python involved.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use recoverssm_rs::checkpoint::{CheckpointCache, Config, PolicyKind};
use std::hint::black_box;

/// A small deterministic generator (xorshift), so the bench needs no extra crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 32) as u32
    }
    fn text(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| self.next() % 150_000).collect()
    }
}

fn request(rng: &mut Rng, system: &[u32]) -> (Vec<u32>, Vec<u32>) {
    let mut p = system.to_vec();
    p.extend(rng.text(300));
    (p, rng.text(64))
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("checkpoint_request");
    for &cached in &[1_000usize, 10_000] {
        for &policy in PolicyKind::ALL {
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
            let system = rng.text(1500);
            let cfg = Config::new(policy, 256, 64, Some(cached)).unwrap();
            let mut cache = CheckpointCache::new(cfg);
            let mut i = 0;
            while cache.len() < cached {
                let (p, o) = request(&mut rng, &system);
                let plan = cache.plan(&p).unwrap();
                cache.finish(&p, &o, &plan).unwrap();
                i += 1;
                assert!(i < cached * 4, "{policy:?} never filled its budget");
            }
            let reqs: Vec<_> = (0..256).map(|_| request(&mut rng, &system)).collect();
            let mut k = 0usize;
            g.bench_with_input(BenchmarkId::new(policy.name(), cached), &cached, |b, _| {
                b.iter(|| {
                    let (p, o) = &reqs[k % reqs.len()];
                    k += 1;
                    let plan = cache.plan(black_box(p)).unwrap();
                    black_box(cache.finish(p, o, &plan).unwrap());
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
