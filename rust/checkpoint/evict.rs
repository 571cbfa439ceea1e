//! Eviction scoring: each live checkpoint's record (recency, uses, value) and the order one
//! policy evicts in — recency for the LRU policies, Marconi's utility, `recoverssm`'s
//! greedy-dual value.

use super::tree::{Handle, PrefixTree, Seeded};
use super::PolicyKind;
use std::collections::{BTreeSet, HashMap};

/// Why `recoverssm` keeps a checkpoint: its value model differs by kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// Where the prompt leaves a prefix shared with earlier sequences: worth its tokens per use.
    Junction,
    /// The prompt's last chunk boundary: worth something only once a resend uses it.
    Replay,
    /// Where a request's computed tokens end: worth its tokens until a later turn that started
    /// from it saves its own end (the conversation moved on).
    End,
}

/// A live checkpoint's record.
#[derive(Clone, Copy, Debug)]
pub(super) struct Meta {
    last_use: u64,
    uses: u64,
    /// Tokens this checkpoint saves over the deepest shallower one on its path, when written.
    marginal: usize,
    /// The eviction key (smallest first) for ordered policies.
    key: u64,
    pub(super) kind: Kind,
    superseded: bool,
    /// Greedy-dual's clock when the value was last set.
    base: f64,
    /// Which use estimate applies (`key_of`): 0 junction, 1 replay boundary, 2 end.
    class: usize,
}

/// The live checkpoints' records under one policy, and the order they are evicted in.
#[derive(Debug)]
pub(super) struct Evictor {
    policy: PolicyKind,
    meta: HashMap<Handle, Meta, Seeded>,
    order: BTreeSet<(u64, Handle)>,
    /// The clock of writes and uses (recency).
    pub(super) tick: u64,
    /// Greedy-dual's inflation value (the priority of the last eviction).
    floor: f64,
    /// `recoverssm`'s estimate of how often a checkpoint of each kind is used, per [`Kind`]:
    /// checkpoints written, and those a later request started from (each counted once).
    written_of: [u64; 3],
    pub(super) used_of: [u64; 3],
}

impl Evictor {
    /// No checkpoint recorded.
    pub(super) fn new(policy: PolicyKind) -> Self {
        Self { policy, meta: HashMap::default(), order: BTreeSet::new(), tick: 0, floor: 0.0, written_of: [0; 3], used_of: [0; 3] }
    }

    /// The record of a live checkpoint.
    pub(super) fn get(&self, h: Handle) -> Option<&Meta> {
        self.meta.get(&h)
    }

    /// Counts a request starting from `h`: its first use counts towards its kind's use estimate,
    /// and every use refreshes its recency and value.
    pub(super) fn hit(&mut self, h: Handle) {
        if let Some(m) = self.meta.get(&h).filter(|m| m.uses == 0) {
            self.used_of[m.class] += 1;
        }
        self.touch(h);
    }

    /// Refreshes `h`'s recency and value (the clock advances even when `h` has no record).
    pub(super) fn touch(&mut self, h: Handle) {
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

    /// The least recently used checkpoint other than `keep` (`sglang-lru`'s admission).
    pub(super) fn oldest_except(&self, keep: Option<Handle>) -> Option<Handle> {
        self.order.iter().map(|&(_, h)| h).find(|&h| Some(h) != keep)
    }

    /// A new checkpoint's record, not recorded yet: written now, saving `marginal` tokens.
    pub(super) fn fresh(&mut self, kind: Kind, marginal: usize) -> Meta {
        self.tick += 1;
        let class = match kind {
            Kind::Junction => 0,
            Kind::Replay => 1,
            Kind::End => 2,
        };
        let mut m = Meta { last_use: self.tick, uses: 0, marginal, key: 0, kind, superseded: false, base: self.floor, class };
        m.key = self.key_of(&m);
        m
    }

    /// Whether `m` is worth less than every recorded checkpoint (`recoverssm`'s admission by
    /// value at a full budget).
    pub(super) fn worth_less_than_all(&self, m: &Meta) -> bool {
        self.policy == PolicyKind::Recoverssm && self.order.first().is_some_and(|&(k, _)| m.key < k)
    }

    /// Records `m` ([`fresh`](Self::fresh)) as checkpoint `h`'s, written.
    pub(super) fn insert(&mut self, h: Handle, m: Meta) {
        self.meta.insert(h, m);
        self.order.insert((m.key, h));
        self.written_of[m.class] += 1;
    }

    /// Marks the end `h` superseded (a later turn that started from it saved its own end), when
    /// it is an end.
    pub(super) fn supersede_end(&mut self, h: Handle) {
        if let Some(mut m) = self.meta.get(&h).copied().filter(|m| m.kind == Kind::End) {
            self.order.remove(&(m.key, h));
            m.superseded = true;
            m.base = self.floor;
            m.key = self.key_of(&m);
            self.order.insert((m.key, h));
            self.meta.insert(h, m);
        }
    }

    /// Forgets `h` as if it had never been written: no eviction floor, no use estimate.
    pub(super) fn discard(&mut self, h: Handle) {
        if let Some(m) = self.meta.remove(&h) {
            self.order.remove(&(m.key, h));
            self.written_of[m.class] = self.written_of[m.class].saturating_sub(1);
        }
    }

    /// Forgets `h`, evicted: under `recoverssm` its priority raises the clock.
    pub(super) fn evict(&mut self, h: Handle) {
        if let Some(m) = self.meta.remove(&h) {
            self.order.remove(&(m.key, h));
            if self.policy == PolicyKind::Recoverssm {
                self.floor = self.floor.max(f64::from_bits(m.key));
            }
        }
    }

    /// The ordered key: recency for the LRU policies, greedy-dual priority for `recoverssm`:
    /// the clock when the value was set plus the value, tokens saved over the next shallower
    /// checkpoint times the uses expected (non-negative f64 bits order like the values).
    fn key_of(&self, m: &Meta) -> u64 {
        match self.policy {
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
    /// `tree` holds the checkpoints (Marconi scores only those whose node has at most one child).
    pub(super) fn victim(&self, keep: Handle, tree: &PrefixTree) -> Handle {
        if self.policy == PolicyKind::Marconi {
            if let Some(v) = self.marconi_victim(keep, tree) {
                return v;
            }
        }
        self.order.iter().map(|&(_, h)| h).find(|&h| h != keep).unwrap_or(keep)
    }

    /// Marconi's utility: among checkpoints whose node has at most one child, the smallest
    /// min-max-normalised recency + FLOP efficiency (tokens saved per state). A scan of the
    /// candidates, as the paper does.
    fn marconi_victim(&self, keep: Handle, tree: &PrefixTree) -> Option<Handle> {
        let cands: Vec<(Handle, &Meta)> = self.meta.iter().filter(|(&h, _)| h != keep && tree.children_of(h) <= 1).map(|(&h, m)| (h, m)).collect();
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
}
