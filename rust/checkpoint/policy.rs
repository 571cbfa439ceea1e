//! The cache: one policy's placement (what to save) and eviction (what to drop) over a
//! [`PrefixTree`].

use super::tree::{Handle, PrefixTree, Seeded, Walk};
use super::{Config, PolicyKind};
use crate::error::{Error, Result};
use std::collections::{BTreeSet, HashMap};
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

/// Why `recoverssm` keeps a checkpoint: its value model differs by kind.
/// `recoverssm`'s tail save sits this many chunks before the prompt's last token: a prompt that
/// ends with a short question of its own (retrieval, few-shot) shares everything before it.
const TAIL_CHUNKS: usize = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Where the prompt leaves a prefix shared with earlier sequences: worth its tokens per use.
    Junction,
    /// The prompt's last chunk boundary: worth something only once a resend uses it.
    Replay,
    /// Where a request's computed tokens end: worth its tokens until a later turn that started
    /// from it saves its own end (the conversation moved on).
    End,
}

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

#[derive(Clone, Copy, Debug)]
struct Meta {
    last_use: u64,
    uses: u64,
    /// Tokens this checkpoint saves over the deepest shallower one on its path, when written.
    marginal: usize,
    /// The eviction key (smallest first) for ordered policies.
    key: u64,
    kind: Kind,
    superseded: bool,
    /// Greedy-dual's clock when the value was last set.
    base: f64,
    /// Which use estimate applies (`key_of`): 0 junction, 1 replay boundary, 2 end.
    class: usize,
}

/// A checkpoint cache under one policy.
#[derive(Debug)]
pub struct CheckpointCache {
    /// Unique among the process's caches (>= 1): a plan carries it.
    id: u64,
    cfg: Config,
    tree: PrefixTree,
    meta: HashMap<Handle, Meta, Seeded>,
    order: BTreeSet<(u64, Handle)>,
    next_handle: Handle,
    tick: u64,
    /// Greedy-dual's inflation value (the priority of the last eviction).
    floor: f64,
    peak: usize,
    /// `recoverssm`'s estimate of how often a checkpoint of each kind is used, per [`Kind`]:
    /// checkpoints written, and those a later request started from (each counted once).
    written_of: [u64; 3],
    used_of: [u64; 3],
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
            meta: HashMap::default(),
            order: BTreeSet::new(),
            next_handle: 1,
            tick: 0,
            floor: 0.0,
            peak: 0,
            written_of: [0; 3],
            used_of: [0; 3],
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
            if let Some(m) = self.meta.get(&h.handle).filter(|m| m.uses == 0) {
                self.used_of[m.class] += 1;
            }
            self.touch(h.handle);
        }
        let mut evicted = Vec::new();
        if let (PolicyKind::SglangLru, Some(budget)) = (self.cfg.policy, self.cfg.budget) {
            let keep = hit.map(|h| h.handle);
            while self.tree.len() >= budget {
                let Some(victim) = self.order.iter().map(|&(_, h)| h).find(|&h| Some(h) != keep) else { break };
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
                self.touch(h);
                continue;
            }
            let h = self.next_handle;
            self.next_handle += 1;
            self.tree.add_checkpoint_on(&path, seq, p, h);
            // What evicting it would cost a request on its path: the tokens back to the deepest
            // shallower checkpoint (for an end, the deepest one that is not itself an end: a
            // conversation's earlier ends are superseded by this one).
            let marginal = if kind == Kind::End && self.cfg.policy == PolicyKind::Recoverssm {
                p - self.tree.ancestor_position_where(h, |x| self.meta.get(&x).is_some_and(|m| m.kind != Kind::End))
            } else {
                p - self.tree.ancestor_position(h)
            };
            self.tick += 1;
            let class = match kind {
                Kind::Junction => 0,
                Kind::Replay => 1,
                Kind::End => 2,
            };
            let mut m = Meta { last_use: self.tick, uses: 0, marginal, key: 0, kind, superseded: false, base: self.floor, class };
            m.key = self.key_of(&m);
            // Admission by value: at the budget, a checkpoint worth less than every live one is
            // not written (writing it would evict something worth more).
            let full = self.cfg.budget.is_some_and(|b| self.tree.len() > b);
            if full && self.cfg.policy == PolicyKind::Recoverssm && self.order.first().is_some_and(|&(k, _)| m.key < k) {
                self.tree.remove_checkpoint(h);
                continue;
            }
            self.meta.insert(h, m);
            self.order.insert((m.key, h));
            done.written.push((p, h));
            self.written_of[m.class] += 1;
            if let Some(budget) = self.cfg.budget {
                while self.tree.len() > budget {
                    let victim = self.victim(h);
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
            if let Some(mut m) = self.meta.get(&hit.handle).copied().filter(|m| wrote_end && m.kind == Kind::End) {
                self.order.remove(&(m.key, hit.handle));
                m.superseded = true;
                m.base = self.floor;
                m.key = self.key_of(&m);
                self.order.insert((m.key, hit.handle));
                self.meta.insert(hit.handle, m);
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
            if let Some(m) = self.meta.remove(&h) {
                self.order.remove(&(m.key, h));
                self.written_of[m.class] = self.written_of[m.class].saturating_sub(1);
            }
            self.tree.remove_checkpoint(h);
        }
        Ok(())
    }

    fn touch(&mut self, h: Handle) {
        self.tick += 1;
        let Some(mut m) = self.meta.get(&h).copied() else { return };
        self.order.remove(&(m.key, h));
        m.last_use = self.tick;
        m.uses += 1;
        m.base = self.floor;
        m.key = self.key_of(&m);
        self.order.insert((m.key, h));
        self.meta.insert(h, m);
    }

    /// The ordered key: recency for the LRU policies, greedy-dual priority for `recoverssm`:
    /// the clock when the value was set plus the value, tokens saved over the next shallower
    /// checkpoint times the uses expected (non-negative f64 bits order like the values).
    fn key_of(&self, m: &Meta) -> u64 {
        match self.cfg.policy {
            PolicyKind::Recoverssm => {
                let k = m.class;
                // A checkpoint not used yet is worth the share of its kind that was used
                // (Laplace's estimate): in a chat most ends are, in retrieval almost none.
                let expected = (self.used_of[k] + 1) as f64 / (self.written_of[k] + 2) as f64;
                let uses = match m.kind {
                    Kind::End if m.superseded => 0.0,
                    Kind::Replay if m.uses == 0 => 0.0,
                    Kind::Junction => (m.uses + 1) as f64,
                    Kind::End if m.uses == 0 => expected,
                    Kind::End => (m.uses + 1) as f64,
                    Kind::Replay => m.uses as f64,
                };
                (m.base + uses * m.marginal as f64).to_bits()
            }
            _ => m.last_use,
        }
    }

    /// The checkpoint to evict next; `keep` (just written) only when nothing else is left.
    fn victim(&self, keep: Handle) -> Handle {
        if self.cfg.policy == PolicyKind::Marconi {
            if let Some(v) = self.marconi_victim(keep) {
                return v;
            }
        }
        self.order.iter().map(|&(_, h)| h).find(|&h| h != keep).unwrap_or(keep)
    }

    /// Marconi's utility: among checkpoints whose node has at most one child, the smallest
    /// min-max-normalised recency + FLOP efficiency (tokens saved per state). A scan of the
    /// candidates, as the paper does.
    fn marconi_victim(&self, keep: Handle) -> Option<Handle> {
        let cands: Vec<(Handle, &Meta)> =
            self.meta.iter().filter(|(&h, _)| h != keep && self.tree.children_of(h) <= 1).map(|(&h, m)| (h, m)).collect();
        let (rmin, rmax) = cands.iter().fold((u64::MAX, 0), |(a, b), (_, m)| (a.min(m.last_use), b.max(m.last_use)));
        let (fmin, fmax) = cands.iter().fold((usize::MAX, 0), |(a, b), (_, m)| (a.min(m.marginal), b.max(m.marginal)));
        let norm = |v: f64, lo: f64, hi: f64| if hi > lo { (v - lo) / (hi - lo) } else { 0.0 };
        cands
            .iter()
            .map(|&(h, m)| {
                let s = norm(m.last_use as f64, rmin as f64, rmax as f64) + norm(m.marginal as f64, fmin as f64, fmax as f64);
                (s, m.last_use, h)
            })
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
            .map(|(_, _, h)| h)
    }

    fn evict(&mut self, h: Handle) {
        if let Some(m) = self.meta.remove(&h) {
            self.order.remove(&(m.key, h));
            if self.cfg.policy == PolicyKind::Recoverssm {
                self.floor = self.floor.max(f64::from_bits(m.key));
            }
        }
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
                let (len, tick, used) = (c.len(), c.tick, c.used_of);
                let seen = c.peek(&p).unwrap();
                assert_eq!((c.len(), c.tick, c.used_of), (len, tick, used), "{policy:?}: peek changed the cache");
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
