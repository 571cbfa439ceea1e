//! Property tests of the checkpoint policies against a brute-force replay on small random traces.
//!
//! For every policy, request by request: a hit names a checkpoint that is live in an independent
//! store (a plain map from handle to the exact token prefix it holds), at that exact position, for a
//! prefix of the prompt, within the prompt's last token and the budget — and it is the longest such
//! checkpoint (the index never misses one). Writes hold the prefix the request computed, never
//! duplicate a live prefix, and the live count never passes the budget. For `vllm` and
//! `sglang-lru`, a naive reference written from their rules (linear scans over lists) must reuse
//! exactly the same tokens request by request.

use proptest::prelude::*;
use recoverssm_rs::checkpoint::policy::Plan;
use recoverssm_rs::checkpoint::{CheckpointCache, Config, PolicyKind};
use std::collections::HashMap;

type Req = (Vec<u32>, Vec<u32>);

/// Requests over a 3-token alphabet (so prefixes collide often); about a third extend an earlier
/// request's prompt + output, as a later turn does.
fn trace() -> impl Strategy<Value = Vec<Req>> {
    prop::collection::vec(
        (any::<bool>(), any::<prop::sample::Index>(), prop::collection::vec(0u32..3, 1..30), prop::collection::vec(0u32..3, 0..6)),
        1..14,
    )
    .prop_map(|raw| {
        let mut out: Vec<Req> = Vec::new();
        for (extend, which, tail, output) in raw {
            let mut prompt = Vec::new();
            if extend && !out.is_empty() {
                let (p, o) = &out[which.index(out.len())];
                prompt.extend(p);
                prompt.extend(o);
            }
            prompt.extend(tail);
            out.push((prompt, output));
        }
        out
    })
}

fn lcp(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

fn computed(p: &[u32], o: &[u32]) -> Vec<u32> {
    let mut s = p.to_vec();
    s.extend(o);
    s.truncate(p.len() + o.len().max(1) - 1);
    s
}

/// A naive LRU store of exact prefixes: what `vllm` and `sglang-lru` are specified to do.
struct NaiveLru {
    states: Vec<(Vec<u32>, u64)>,
    seen: Vec<Vec<u32>>,
    tick: u64,
    budget: Option<usize>,
}

impl NaiveLru {
    fn touch_or_add(&mut self, prefix: Vec<u32>) {
        self.tick += 1;
        if let Some(s) = self.states.iter_mut().find(|s| s.0 == prefix) {
            s.1 = self.tick;
            return;
        }
        self.states.push((prefix, self.tick));
        if let Some(b) = self.budget {
            while self.states.len() > b {
                let newest = self.states.len() - 1;
                let i = (0..newest).min_by_key(|&i| self.states[i].1).unwrap_or(newest);
                self.states.remove(i);
            }
        }
    }

    /// One request; returns its reuse.
    fn step(&mut self, policy: PolicyKind, b: usize, p: &[u32], o: &[u32]) -> usize {
        let n = p.len();
        let cap = if policy == PolicyKind::Vllm { (n - 1) / b * b } else { n - 1 };
        let hit =
            self.states.iter().enumerate().filter(|(_, s)| s.0.len() <= cap && p.starts_with(&s.0)).max_by_key(|(_, s)| s.0.len()).map(|(i, _)| i);
        let reused = hit.map_or(0, |i| self.states[i].0.len());
        if let Some(i) = hit {
            self.tick += 1;
            self.states[i].1 = self.tick;
        }
        // sglang-lru: the request's own state slot is taken at admission, evicting the least
        // recently used state other than the hit when the budget is full.
        if let (PolicyKind::SglangLru, Some(budget)) = (policy, self.budget) {
            let hit_prefix = hit.map(|i| self.states[i].0.clone());
            while self.states.len() >= budget {
                let Some(i) = (0..self.states.len()).filter(|&i| Some(&self.states[i].0) != hit_prefix.as_ref()).min_by_key(|&i| self.states[i].1)
                else {
                    break;
                };
                self.states.remove(i);
            }
        }
        let seq = computed(p, o);
        let mut saves = Vec::new();
        if policy == PolicyKind::Vllm {
            let attention = self.seen.iter().map(|s| lcp(p, s).min(s.len()) / b * b).max().unwrap_or(0).min(cap);
            saves.extend([attention, cap].into_iter().filter(|&x| x > reused));
        } else {
            saves.push(seq.len());
        }
        saves.sort_unstable();
        saves.dedup();
        for pos in saves {
            self.touch_or_add(seq[..pos].to_vec());
        }
        self.seen.push(seq);
        reused
    }
}

fn check(policy: PolicyKind, b: usize, g: usize, budget: Option<usize>, reqs: &[Req]) -> Result<(), TestCaseError> {
    let mut cache = CheckpointCache::new(Config::new(policy, b, g, budget).unwrap());
    let mut store: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut naive = NaiveLru { states: Vec::new(), seen: Vec::new(), tick: 0, budget };
    for (i, (p, o)) in reqs.iter().enumerate() {
        let n = p.len();
        let plan: Plan = cache.plan(p).unwrap();
        // sglang-lru's evictions at admission: named by the plan, gone from the cache already.
        for h in &plan.evicted {
            prop_assert!(policy == PolicyKind::SglangLru, "request {i}: {policy:?} evicted {h} at admission");
            prop_assert!(store.remove(h).is_some(), "request {i}: evicted {h} at admission, which is not live");
        }
        let cap = if policy == PolicyKind::Vllm { (n - 1) / b * b } else { n - 1 };
        let longest = store.values().filter(|s| s.len() <= cap && p.starts_with(s)).map(Vec::len).max();
        match plan.hit {
            Some(h) => {
                let prefix = store.get(&h.handle);
                prop_assert!(prefix.is_some(), "request {i}: hit on checkpoint {} that is not live", h.handle);
                let prefix = prefix.unwrap();
                prop_assert_eq!(prefix.len(), h.position, "request {}: the hit's position is not where its checkpoint was saved", i);
                prop_assert!(h.position <= cap && p.starts_with(prefix), "request {i}: checkpoint {prefix:?} is not usable for prompt {p:?}");
                prop_assert_eq!(Some(h.position), longest, "request {}: not the longest usable checkpoint", i);
            }
            None => prop_assert_eq!(longest, None, "request {}: a usable checkpoint was missed", i),
        }
        let reused = plan.hit.map_or(0, |h| h.position);
        if matches!(policy, PolicyKind::Vllm | PolicyKind::SglangLru) {
            let want = naive.step(policy, b, p, o);
            prop_assert_eq!(reused, want, "request {}: the naive {:?} reference reuses differently", i, policy);
        }
        for &s in &plan.saves {
            prop_assert!(s > reused && s <= n, "request {i}: save at {s} outside ({reused}, {n}]");
        }
        let fin = cache.finish(p, o, &plan).unwrap();
        let seq = computed(p, o);
        // Evictions of checkpoints live before this request's end (an older checkpoint of a prefix
        // it writes again may be evicted by one of its earlier writes) leave the store first; the
        // rest were written by this request.
        let mut evicted_now: Vec<u64> = Vec::new();
        for h in &fin.evicted {
            if store.remove(h).is_none() {
                evicted_now.push(*h);
            }
        }
        for &(pos, h) in &fin.written {
            prop_assert!(pos >= 1 && pos <= seq.len(), "request {i}: wrote position {pos} beyond the {} computed tokens", seq.len());
            if policy == PolicyKind::Vllm {
                prop_assert_eq!(pos % b, 0, "vllm writes at block boundaries only");
            }
            prop_assert!(!store.values().any(|s| *s == seq[..pos]), "request {i}: a second checkpoint for a live prefix");
            prop_assert!(store.insert(h, seq[..pos].to_vec()).is_none(), "handle {h} reused");
        }
        for h in &evicted_now {
            prop_assert!(store.remove(h).is_some(), "request {i}: evicted {h}, which is not live");
        }
        prop_assert_eq!(store.len(), cache.len());
        if let Some(bud) = budget {
            prop_assert!(store.len() <= bud, "request {i}: {} live over a budget of {bud}", store.len());
        }
        if matches!(policy, PolicyKind::Vllm | PolicyKind::SglangLru) {
            let mut a: Vec<&Vec<u32>> = store.values().collect();
            let mut z: Vec<&Vec<u32>> = naive.states.iter().map(|s| &s.0).collect();
            a.sort();
            z.sort();
            prop_assert_eq!(a, z, "request {}: the live checkpoints differ from the naive reference's", i);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn never_an_impossible_reuse(reqs in trace(), b in 1usize..7, g in 1usize..5, budget in prop::option::of(1usize..6)) {
        for policy in PolicyKind::ALL {
            check(*policy, b, g, budget, &reqs)?;
        }
    }
}
