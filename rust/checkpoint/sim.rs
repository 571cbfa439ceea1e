//! The replay simulator: requests one at a time, in arrival order, through one cache.

use super::policy::{CheckpointCache, Finished, Plan};
use super::trace::TraceRequest;
use super::tree::{Handle, PrefixTree};
use super::Config;
use crate::error::Result;

/// What one request reused and changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestOutcome {
    /// Prompt tokens not recomputed (the hit's position; 0 on a miss).
    pub reused: usize,
    /// The checkpoint started from.
    pub hit: Option<Handle>,
    /// The bound for this request: the longest prefix it shares with an earlier request's prompt
    /// + output, floored to the granularity, at most its prompt length - 1.
    pub bound: usize,
    pub written: Vec<(usize, Handle)>,
    /// Checkpoints evicted at the request's admission ([`Plan::evicted`]), then at its end.
    pub evicted: Vec<Handle>,
    /// Live checkpoints after the request.
    pub live: usize,
}

/// A trace's totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub requests: usize,
    pub prompt_tokens: u64,
    pub reused_tokens: u64,
    pub hit_requests: usize,
    pub checkpoint_writes: u64,
    pub evictions: u64,
    /// The most checkpoints held at once.
    pub peak_checkpoints: usize,
    /// The sum of the per-request bounds (see [`RequestOutcome::bound`]).
    pub upper_bound_tokens: u64,
}

/// Replays `reqs` through a fresh cache configured by `cfg`.
pub fn simulate(reqs: &[TraceRequest], cfg: Config) -> Result<(Stats, Vec<RequestOutcome>)> {
    let mut cache = CheckpointCache::new(cfg);
    let mut bound_index = PrefixTree::new(cfg.granularity);
    let mut stats = Stats::default();
    let mut outcomes = Vec::with_capacity(reqs.len());
    for r in reqs {
        let n = r.prompt.len();
        let walk = bound_index.walk(&r.prompt, 0);
        let bound = walk.shared_chunks.min(n - 1);
        let plan: Plan = cache.plan(&r.prompt)?;
        let fin: Finished = cache.finish(&r.prompt, &r.output, &plan)?;
        let mut seq = r.prompt.clone();
        seq.extend_from_slice(&r.output);
        bound_index.insert_path_from(&seq, Some((walk.node, walk.shared_chunks / cfg.granularity)));
        let reused = plan.hit.map_or(0, |h| h.position);
        stats.requests += 1;
        stats.prompt_tokens += n as u64;
        stats.reused_tokens += reused as u64;
        stats.hit_requests += usize::from(reused > 0);
        stats.checkpoint_writes += fin.written.len() as u64;
        let mut evicted = plan.evicted.clone();
        evicted.extend_from_slice(&fin.evicted);
        stats.evictions += evicted.len() as u64;
        stats.upper_bound_tokens += bound as u64;
        let live = cache.len();
        stats.peak_checkpoints = cache.peak();
        outcomes.push(RequestOutcome { reused, hit: plan.hit.map(|h| h.handle), bound, written: fin.written, evicted, live });
    }
    Ok((stats, outcomes))
}
