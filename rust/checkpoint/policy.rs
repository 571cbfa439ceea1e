//! The cache: one policy's placement (what to save) and when it evicts (what to drop) over a
//! [`PrefixTree`]; which checkpoint goes first is the eviction order's (`evict`).

use super::evict::{Evictor, Kind};
use super::tree::{Handle, PrefixTree, Walk};
use super::{Config, PolicyKind};
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};

/// The next cache's [`CheckpointCache::id`].
static NEXT_CACHE: AtomicU64 = AtomicU64::new(1);

/// The checkpoint a request starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hit {
    /// Tokens of the prompt not recomputed.
    pub position: usize,
    pub handle: Handle,
}

/// What a request does before it runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// The longest usable checkpoint, if any.
    pub hit: Option<Hit>,
    /// Positions (ascending, beyond the hit, at most the prompt length) whose state the prefill
    /// saves.
    pub saves: Vec<usize>,
    /// The saves among `saves` that are speculative (no earlier sequence branches there: the
    /// replay boundary, kept for a resend of the same prompt, and the prompt's tail, kept for a
    /// prompt sharing all but its last tokens): `recoverssm` values them by how often such saves
    /// were used.
    pub speculative: Vec<usize>,
    /// Checkpoints evicted when the request was admitted (`sglang-lru` at a full budget: the
    /// request takes a state slot of its own), in eviction order; already gone from the cache, so
    /// the caller frees their storage now. [`finish`](CheckpointCache::finish) does not report
    /// them again.
    pub evicted: Vec<Handle>,
    /// Where the plan's walk left the tree: (node, depth in chunks), so that
    /// [`finish`](CheckpointCache::finish) resumes there instead of hashing the prompt's shared
    /// chunks again (it checks the node stands for the prompt's prefix first).
    walked: Option<(u32, usize)>,
    /// The cache that made the plan ([`CheckpointCache::id`]; 0: none) and the prompt's length:
    /// [`finish`](CheckpointCache::finish) refuses a plan of another cache or another prompt.
    cache: u64,
    prompt_len: usize,
}

/// `recoverssm`'s tail save sits this many chunks before the prompt's last token: a prompt that
/// ends with a short question of its own (retrieval, few-shot) shares everything before it.
const TAIL_CHUNKS: usize = 2;

/// What a request's end changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Finished {
    /// Checkpoints written: (position, handle), ascending positions.
    pub written: Vec<(usize, Handle)>,
    /// Checkpoints evicted by the request's end, in eviction order (may include ones written by
    /// this request when the budget cannot hold them all); those evicted at admission are the
    /// plan's ([`Plan::evicted`]).
    pub evicted: Vec<Handle>,
}

/// A checkpoint cache under one policy.
#[derive(Debug)]
pub struct CheckpointCache {
    /// Unique among the process's caches (>= 1): a plan carries it.
    id: u64,
    cfg: Config,
    tree: PrefixTree,
    /// The live checkpoints' records and eviction order.
    evictor: Evictor,
    next_handle: Handle,
    peak: usize,
}

impl CheckpointCache {
    /// An empty cache.
    pub fn new(cfg: Config) -> Self {
        let g = if cfg.policy == PolicyKind::Vllm { cfg.block_size } else { cfg.granularity };
        Self {
            id: NEXT_CACHE.fetch_add(1, Ordering::Relaxed),
            cfg,
            // Marconi's branch point is exact: its index keeps sequences' partial last chunks.
            tree: if cfg.policy == PolicyKind::Marconi { PrefixTree::with_tails(g) } else { PrefixTree::new(g) },
            evictor: Evictor::new(cfg.policy),
            next_handle: 1,
            peak: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The number of live checkpoints.
    pub fn len(&self) -> usize {
        self.tree.len()
    }

    /// The most checkpoints held at once so far (after each write and the evictions it caused).
    pub fn peak(&self) -> usize {
        self.peak
    }

    /// Whether no checkpoint is live.
    pub fn is_empty(&self) -> bool {
        self.tree.is_empty()
    }

    /// The position of a live checkpoint.
    pub fn position(&self, h: Handle) -> Option<usize> {
        self.tree.position(h)
    }

    /// The checkpoint to start `prompt` from and the positions its prefill saves. A hit is
    /// counted as a use (it refreshes the checkpoint's recency and value). Under `sglang-lru` with
    /// the budget full, the least recently used checkpoint other than the hit is evicted here: the
    /// running request needs a state slot of its own before it runs (SGLang evicts when it
    /// allocates that slot, after the match), whether or not its end later turns out to be cached
    /// already; the plan names it ([`Plan::evicted`]).
    pub fn plan(&mut self, prompt: &[u32]) -> Result<Plan> {
        let (walk, cap) = self.walk(prompt)?;
        let n = prompt.len();
        let hit = walk.checkpoint.map(|(position, handle)| Hit { position, handle });
        if let Some(h) = hit {
            self.evictor.hit(h.handle);
        }
        let mut evicted = Vec::new();
        if let (PolicyKind::SglangLru, Some(budget)) = (self.cfg.policy, self.cfg.budget) {
            let keep = hit.map(|h| h.handle);
            while self.tree.len() >= budget {
                let Some(victim) = self.evictor.oldest_except(keep) else { break };
                self.evict(victim);
                evicted.push(victim);
            }
        }
        let from = hit.map_or(0, |h| h.position);
        let g = self.cfg.granularity;
        let mut speculative = Vec::new();
        let mut saves = match self.cfg.policy {
            PolicyKind::Vllm => {
                let b = self.cfg.block_size;
                // The attention hit (block-aligned, capped like the state hit) is the junction
                // when no state sits there; the replay boundary is the prompt's last full block
                // before its final token.
                vec![walk.shared_chunks.min(cap), cap].into_iter().map(|p| p / b * b).collect::<Vec<_>>()
            }
            PolicyKind::SglangLru => Vec::new(),
            PolicyKind::Marconi => {
                // The exact branch point a speculative insertion of the prompt would create.
                vec![walk.shared_tokens.min(n)]
            }
            PolicyKind::Recoverssm => {
                // The junction, when an earlier sequence goes on past it (a branch); where every
                // earlier sequence on this path ends there instead, it is an earlier request's
                // end, and this request's own end supersedes it.
                // The replay boundary and the tail are speculative: no earlier sequence branches
                // there.
                let junction = walk.shared_chunks.min(n - 1) / g * g;
                let junction = if walk.stop_children > 0 { junction } else { 0 };
                let (replay, tail) = ((n - 1) / g * g, (n - 1).saturating_sub(TAIL_CHUNKS * g) / g * g);
                speculative = [replay, tail].into_iter().filter(|&r| r > from && r != junction).collect();
                vec![junction, replay, tail]
            }
        };
        saves.retain(|&p| p > from);
        saves.sort_unstable();
        saves.dedup();
        Ok(Plan {
            hit,
            saves,
            speculative,
            evicted,
            walked: Some((walk.node, walk.shared_chunks / self.tree.chunk())),
            cache: self.id,
            prompt_len: n,
        })
    }

    /// The checkpoint [`plan`](Self::plan) would start `prompt` from, changing nothing: no use is
    /// counted and nothing is evicted. An engine that must prepare the hit's copy before it commits
    /// to the request looks here first, then plans once the copy is accepted.
    pub fn peek(&self, prompt: &[u32]) -> Result<Option<Hit>> {
        Ok(self.walk(prompt)?.0.checkpoint.map(|(position, handle)| Hit { position, handle }))
    }

    /// The prompt's walk through the index, and the deepest position a hit may have.
    fn walk(&self, prompt: &[u32]) -> Result<(Walk, usize)> {
        if prompt.is_empty() {
            return Err(Error::plan("a request's prompt must hold at least one token"));
        }
        let n = prompt.len();
        let cap = match self.cfg.policy {
            PolicyKind::Vllm => (n - 1) / self.cfg.block_size * self.cfg.block_size,
            _ => n - 1,
        };
        Ok((self.tree.walk_with(prompt, cap, self.cfg.policy == PolicyKind::Marconi), cap))
    }

    /// Records the end of a request that ran `prompt` (planned by [`plan`](Self::plan)) and
    /// produced `output`: the sequence joins the index, the plan's saves and the policy's
    /// end-of-request save are written (a position whose prefix already has a live checkpoint
    /// refreshes it instead), and checkpoints are evicted down to the budget. `evicted` starts
    /// with the evictions the plan made at admission (`sglang-lru`).
    ///
    /// A plan made by another cache, or for a prompt of another length, is an error and nothing
    /// changes (its hit and saves name another cache's checkpoints or another prompt's
    /// positions). Finishing one plan twice is the caller's to refuse (the bindings do).
    pub fn finish(&mut self, prompt: &[u32], output: &[u32], plan: &Plan) -> Result<Finished> {
        let n = prompt.len();
        if plan.cache != self.id {
            return Err(Error::plan("the plan was made by another cache: finish a request on the cache that planned it"));
        }
        if plan.prompt_len != n {
            return Err(Error::plan(format!(
                "the plan was made for a prompt of {} tokens; this one has {n}: finish a request with the prompt it was planned with",
                plan.prompt_len
            )));
        }
        if let Some(&bad) = plan.saves.iter().find(|&&p| p == 0 || p > n) {
            return Err(Error::plan(format!("a planned save at position {bad} lies outside the prompt's 1..={n} tokens")));
        }
        let mut seq = Vec::with_capacity(n + output.len());
        seq.extend_from_slice(prompt);
        seq.extend_from_slice(output);
        // The tokens whose forward pass ran: the last sampled token is never fed back.
        let computed = n + output.len().max(1) - 1;
        let seq = &seq[..computed];
        let path = self.tree.insert_path_from(seq, plan.walked);
        let mut positions = plan.saves.clone();
        if matches!(self.cfg.policy, PolicyKind::SglangLru | PolicyKind::Marconi | PolicyKind::Recoverssm) {
            positions.push(computed);
        }
        positions.sort_unstable();
        positions.dedup();
        let mut done = Finished::default();
        for p in positions {
            let kind = if p == computed && !plan.saves.contains(&p) {
                Kind::End
            } else if plan.speculative.contains(&p) {
                Kind::Replay
            } else {
                Kind::Junction
            };
            if let Some(h) = self.tree.find_exact_on(&path, seq, p) {
                self.evictor.touch(h);
                continue;
            }
            let h = self.next_handle;
            self.next_handle += 1;
            self.tree.add_checkpoint_on(&path, seq, p, h);
            // What evicting it would cost a request on its path: the tokens back to the deepest
            // shallower checkpoint (for an end, the deepest one that is not itself an end: a
            // conversation's earlier ends are superseded by this one).
            let marginal = if kind == Kind::End && self.cfg.policy == PolicyKind::Recoverssm {
                p - self.tree.ancestor_position_where(h, |x| self.evictor.get(x).is_some_and(|m| m.kind != Kind::End))
            } else {
                p - self.tree.ancestor_position(h)
            };
            let m = self.evictor.fresh(kind, marginal);
            // Admission by value: at the budget, a checkpoint worth less than every live one is
            // not written (writing it would evict something worth more).
            let full = self.cfg.budget.is_some_and(|b| self.tree.len() > b);
            if full && self.evictor.worth_less_than_all(&m) {
                self.tree.remove_checkpoint(h);
                continue;
            }
            self.evictor.insert(h, m);
            done.written.push((p, h));
            if let Some(budget) = self.cfg.budget {
                while self.tree.len() > budget {
                    let victim = self.evictor.victim(h, &self.tree);
                    self.evict(victim);
                    done.evicted.push(victim);
                }
            }
            self.peak = self.peak.max(self.tree.len());
        }
        // A later turn that started from an earlier end and saved its own: the earlier end is
        // superseded (its conversation continues from the new one).
        if let Some(hit) = plan.hit {
            let wrote_end = self.cfg.policy == PolicyKind::Recoverssm && done.written.iter().any(|&(p, _)| p == computed);
            if wrote_end {
                self.evictor.supersede_end(hit.handle);
            }
        }
        Ok(done)
    }

    /// Forgets live checkpoints that were never materialised (the engine's write of their state
    /// failed after [`finish`](Self::finish) placed them): as if they had not been written, so
    /// they count in no eviction floor and no use estimate. A handle that is not live is an error
    /// naming it, and nothing changes.
    pub fn discard(&mut self, hs: &[Handle]) -> Result<()> {
        if let Some(h) = hs.iter().find(|&&h| self.tree.position(h).is_none()) {
            return Err(Error::plan(format!("checkpoint handle {h} is not a live checkpoint of this cache")));
        }
        for &h in hs {
            self.evictor.discard(h);
            self.tree.remove_checkpoint(h);
        }
        Ok(())
    }

    fn evict(&mut self, h: Handle) {
        self.evictor.evict(h);
        self.tree.remove_checkpoint(h);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::Param;

    fn run(policy: PolicyKind, b: usize, g: usize, reqs: &[(Vec<u32>, Vec<u32>)]) -> Vec<usize> {
        let mut c = CheckpointCache::new(Config::new(policy, b, g, None).unwrap());
        reqs.iter()
            .map(|(p, o)| {
                let plan = c.plan(p).unwrap();
                c.finish(p, o, &plan).unwrap();
                plan.hit.map_or(0, |h| h.position)
            })
            .collect()
    }

    fn shared_prefix(shared: usize, suffix: usize, k: u32) -> Vec<(Vec<u32>, Vec<u32>)> {
        (0..k)
            .map(|i| {
                let mut p: Vec<u32> = (0..shared as u32).collect();
                p.extend((0..suffix as u32).map(|t| 1_000_000 * (i + 1) + t));
                (p, vec![7, 7])
            })
            .collect()
    }

    #[test]
    fn vllm_hits_the_junction_from_the_third_request_at_block_granularity() {
        // The table of vLLM 0.33's behaviour: B = 1,056, 1,500 shared tokens, 800 more each.
        assert_eq!(run(PolicyKind::Vllm, 1056, 64, &shared_prefix(1500, 800, 3)), vec![0, 0, 1056]);
        // A prefix shorter than one block never hits.
        assert_eq!(run(PolicyKind::Vllm, 1056, 64, &shared_prefix(400, 800, 3)), vec![0, 0, 0]);
        // The same prompt twice: the replay boundary.
        let p: Vec<u32> = (0..2212).collect();
        assert_eq!(run(PolicyKind::Vllm, 1056, 64, &[(p.clone(), vec![1]), (p, vec![1])]), vec![0, 2112]);
    }

    #[test]
    fn recoverssm_hits_at_chunk_granularity_and_at_request_ends() {
        assert_eq!(run(PolicyKind::Recoverssm, 1056, 64, &shared_prefix(1500, 800, 3)), vec![0, 0, 1472]);
        assert_eq!(run(PolicyKind::Recoverssm, 1056, 64, &shared_prefix(400, 800, 3)), vec![0, 0, 384]);
        // A second turn starts from the first turn's end (prompt + output - 1 tokens).
        let t1: Vec<u32> = (0..2612).collect();
        let out: Vec<u32> = (5000..5100).collect();
        let mut t2 = t1.clone();
        t2.extend(&out);
        t2.extend(9000..9050);
        assert_eq!(run(PolicyKind::Recoverssm, 1056, 64, &[(t1.clone(), out.clone()), (t2.clone(), vec![1])]), vec![0, 2711]);
        assert_eq!(run(PolicyKind::Vllm, 1056, 64, &[(t1, out), (t2, vec![1])]), vec![0, 2112]);
    }

    #[test]
    fn a_budget_is_never_exceeded() {
        for policy in PolicyKind::ALL {
            let mut c = CheckpointCache::new(Config::new(*policy, 64, 16, Some(2)).unwrap());
            for (p, o) in shared_prefix(100, 90, 6) {
                let plan = c.plan(&p).unwrap();
                let f = c.finish(&p, &o, &plan).unwrap();
                assert!(c.len() <= 2, "{policy:?}: {} live after {f:?}", c.len());
            }
        }
    }

    #[test]
    fn sglang_lrus_admission_evictions_are_the_plans_and_reported_once() {
        let mut c = CheckpointCache::new(Config::new(PolicyKind::SglangLru, 4, 2, Some(1)).unwrap());
        let first = c.plan(&[1, 1, 1]).unwrap();
        let fin = c.finish(&[1, 1, 1], &[5], &first).unwrap();
        assert!(first.evicted.is_empty() && fin.evicted.is_empty());
        let kept = fin.written[0].1;
        let second = c.plan(&[2, 2, 2]).unwrap();
        assert_eq!((second.evicted.clone(), c.position(kept)), (vec![kept], None), "the slot is taken at admission");
        let fin = c.finish(&[2, 2, 2], &[5], &second).unwrap();
        assert!(fin.evicted.is_empty(), "finish reports the admission's eviction again: {fin:?}");
        for policy in [PolicyKind::Vllm, PolicyKind::Marconi, PolicyKind::Recoverssm] {
            let mut c = CheckpointCache::new(Config::new(policy, 4, 2, Some(1)).unwrap());
            for (p, o) in shared_prefix(6, 5, 3) {
                let plan = c.plan(&p).unwrap();
                assert!(plan.evicted.is_empty(), "{policy:?} evicts at the end only");
                c.finish(&p, &o, &plan).unwrap();
            }
        }
    }

    #[test]
    fn peek_finds_plans_hit_and_changes_nothing() {
        for policy in PolicyKind::ALL {
            let mut c = CheckpointCache::new(Config::new(*policy, 64, 16, Some(2)).unwrap());
            for (p, o) in shared_prefix(100, 90, 6) {
                let (len, tick, used) = (c.len(), c.evictor.tick, c.evictor.used_of);
                let seen = c.peek(&p).unwrap();
                assert_eq!((c.len(), c.evictor.tick, c.evictor.used_of), (len, tick, used), "{policy:?}: peek changed the cache");
                let plan = c.plan(&p).unwrap();
                assert_eq!(seen, plan.hit, "{policy:?}");
                c.finish(&p, &o, &plan).unwrap();
            }
        }
        let c = CheckpointCache::new(Config::new(PolicyKind::Vllm, 64, 16, None).unwrap());
        assert!(c.peek(&[]).is_err());
    }

    #[test]
    fn bad_input_is_refused() {
        let mut c = CheckpointCache::new(Config::new(PolicyKind::Vllm, 64, 16, None).unwrap());
        assert!(c.plan(&[]).unwrap_err().message.contains("at least one token"));
        let bad = Plan { saves: vec![9], ..c.plan(&[1, 2]).unwrap() };
        assert!(c.finish(&[1, 2], &[3], &bad).unwrap_err().message.contains("position 9"));
        assert!(c.is_empty(), "a refused finish changes nothing");
        let other = CheckpointCache::new(Config::new(PolicyKind::Vllm, 64, 16, None).unwrap());
        assert!(c.finish(&[1, 2], &[3], &Plan::default()).unwrap_err().message.contains("another cache"));
        let two = c.plan(&[1, 2]).unwrap();
        assert!(c.finish(&[1], &[3], &two).unwrap_err().message.contains("prompt of 2 tokens; this one has 1"));
        assert_ne!(other.id, c.id);
        assert!(c.is_empty());
        assert!(Config::new(PolicyKind::Vllm, 0, 16, None).unwrap_err().message.contains("block_size = 0"));
        assert!(Config::new(PolicyKind::Vllm, 64, 16, Some(0)).unwrap_err().message.contains("budget = 0"));
        assert!(PolicyKind::parse("lru").unwrap_err().message.contains("'lru'"));
        assert!(Config::budget_from_bytes(10, 0).is_err());
        // A negative value (a caller's, before any usize) gets the same rule as 0.
        for p in [Param::BlockSize, Param::Granularity, Param::Budget, Param::StateBytes] {
            let (zero, negative) = (p.refused(0).message, p.refused(-5).message);
            assert_eq!(negative, zero.replacen(" 0", " -5", 1), "{p:?}");
            assert!(!negative.contains(">= 0"), "{negative}");
        }
        assert!(Param::BudgetBytes.refused(-5).message.contains("budget_bytes = -5 holds no checkpoint; it must be >= state_bytes"));
        assert_eq!(Config::budget_from_bytes(10, 3).unwrap(), 3);
    }

    #[test]
    fn discarded_checkpoints_are_gone_and_a_dead_handle_changes_nothing() {
        let mut c = CheckpointCache::new(Config::new(PolicyKind::Recoverssm, 8, 4, None).unwrap());
        let p: Vec<u32> = (0..12).collect();
        let plan = c.plan(&p).unwrap();
        let w = c.finish(&p, &[5, 6], &plan).unwrap().written;
        assert_eq!(w.len(), 2);
        assert!(c.discard(&[w[0].1, 999]).unwrap_err().message.contains("handle 999"));
        assert_eq!(c.len(), 2, "a refused discard changes nothing");
        c.discard(&[w[1].1]).unwrap();
        assert_eq!((c.len(), c.position(w[1].1), c.position(w[0].1)), (1, None, Some(w[0].0)));
        let again: Vec<u32> = p.iter().copied().chain([5, 9]).collect();
        assert_eq!(c.plan(&again).unwrap().hit.map(|h| h.handle), Some(w[0].1), "never a hit on a discarded checkpoint");
    }
}
