//! Where recurrent checkpoints are kept: placement and eviction policies over a prefix tree, and a
//! replay simulator.
//!
//! Attention KV can be reused at any block boundary, a recurrent layer's state only where a
//! checkpoint was saved. A [`CheckpointCache`] decides, per request, which saved state to start
//! from ([`CheckpointCache::plan`]: the longest usable checkpoint and the positions to save during
//! prefill) and, when the request ends ([`CheckpointCache::finish`]), which checkpoints to write
//! and which to evict to stay within the budget. Four policies ([`PolicyKind`]) share the index
//! ([`tree::PrefixTree`]) and differ in placement ([`policy`]) and eviction order (`evict`). The
//! [`sim`] module replays a trace through one cache and counts what was reused.
//!
//! The model keeps attention KV unbounded (every sequence seen stays in the index); the budget
//! counts recurrent checkpoints only.

mod evict;
pub mod policy;
pub mod sim;
pub mod trace;
pub mod tree;

use crate::error::{Error, Result};
pub use policy::CheckpointCache;
pub use sim::{simulate, RequestOutcome, Stats};
pub use trace::TraceRequest;
pub use tree::Handle;

/// The largest chunk or block size accepted, in tokens.
pub const MAX_UNIT: usize = 1 << 20;
/// The largest budget accepted, in checkpoints.
pub const MAX_BUDGET: usize = 1 << 32;

named_enum! {
    /// A placement and eviction policy.
    ///
    /// - `vllm`: vLLM 0.33 in align mode with `prefix_cache_retention_interval=0` — states at
    ///   block boundaries only: the prompt's replay boundary (`len - 1` floored to the block) and
    ///   the shared-prefix junction (the attention hit floored to the block, when no state is
    ///   there); hits at the deepest block holding a state; eviction in least-recently-freed order.
    /// - `sglang-lru`: SGLang 0.5.23's mamba radix cache — one state where each request's
    ///   computed tokens end; hits at the deepest state on the prompt's path; LRU eviction of
    ///   states (a hit refreshes only the state used), made when a request is admitted (it takes a
    ///   state slot of its own from the budget; the plan names them) and, past that, when it ends.
    /// - `marconi`: Marconi (MLSys 2025) — states at the exact branch point a new prompt creates in
    ///   the radix tree and at each request's end; eviction among states whose node has at most one
    ///   child by recency plus FLOP efficiency (both min-max normalised, weight 1).
    /// - `recoverssm`: states at chunk granularity — the junction with earlier sequences (where
    ///   one goes on past it), the replay boundary and the tail two chunks before the prompt's
    ///   end (all floored to the chunk), and the request's end; eviction by value (greedy-dual:
    ///   expected uses x tokens saved over the next shallower state, aged by a clock; an end not
    ///   used yet expects the share of ends that were used).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum PolicyKind { Vllm = "vllm", SglangLru = "sglang-lru", Marconi = "marconi", Recoverssm = "recoverssm" }
    parse: exact, |s| Error::plan(format!("policy must be one of vllm, sglang-lru, marconi, recoverssm; got '{s}'"))
}

/// A numeric parameter of a cache's configuration, each refused at 0 as well as below:
/// [`refused`](Self::refused) states its rule, whatever the refused value (a caller's negative
/// number included, which never reaches a `usize`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    BlockSize,
    Granularity,
    Budget,
    BudgetBytes,
    StateBytes,
}

impl Param {
    /// The parameter's name, as the API spells it.
    pub fn name(self) -> &'static str {
        match self {
            Param::BlockSize => "block_size",
            Param::Granularity => "granularity",
            Param::Budget => "budget",
            Param::BudgetBytes => "budget_bytes",
            Param::StateBytes => "state_bytes",
        }
    }

    /// The error for the parameter given as `value` (shown as given): its rule.
    pub fn refused(self, value: impl std::fmt::Display) -> Error {
        let name = self.name();
        Error::plan(match self {
            Param::BlockSize | Param::Granularity => format!("{name} = {value} tokens must be in 1..={MAX_UNIT}"),
            Param::Budget => format!("{name} = {value} checkpoints must be in 1..={MAX_BUDGET}"),
            Param::BudgetBytes => format!("{name} = {value} holds no checkpoint; it must be >= state_bytes (the bytes of one)"),
            Param::StateBytes => format!("{name} = {value}: one checkpoint's size must be >= 1 byte"),
        })
    }
}

/// A cache's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    pub policy: PolicyKind,
    /// The engine's block size in tokens (what `vllm` places states on).
    pub block_size: usize,
    /// The scan's chunk size in tokens (where `recoverssm` may place states).
    pub granularity: usize,
    /// The most checkpoints held at once; None: unlimited.
    pub budget: Option<usize>,
}

impl Config {
    /// A checked configuration: block size and granularity in `1..=MAX_UNIT`, a budget (when
    /// given) in `1..=MAX_BUDGET`.
    pub fn new(policy: PolicyKind, block_size: usize, granularity: usize, budget: Option<usize>) -> Result<Self> {
        check_unit(Param::BlockSize, block_size)?;
        check_unit(Param::Granularity, granularity)?;
        if let Some(b) = budget {
            if b == 0 || b > MAX_BUDGET {
                return Err(Param::Budget.refused(b));
            }
        }
        Ok(Self { policy, block_size, granularity, budget })
    }

    /// The budget in checkpoints that `budget_bytes` holds at `state_bytes` per checkpoint.
    pub fn budget_from_bytes(budget_bytes: u64, state_bytes: u64) -> Result<usize> {
        if state_bytes == 0 {
            return Err(Param::StateBytes.refused(0));
        }
        let n = budget_bytes / state_bytes;
        if n == 0 {
            return Err(Error::plan(format!(
                "budget_bytes = {budget_bytes} holds no checkpoint of state_bytes = {state_bytes}; it must be >= state_bytes"
            )));
        }
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= MAX_BUDGET)
            .ok_or_else(|| Error::plan(format!("budget_bytes / state_bytes = {n} checkpoints is more than {MAX_BUDGET}")))
    }
}

fn check_unit(p: Param, v: usize) -> Result<()> {
    if v == 0 || v > MAX_UNIT {
        return Err(p.refused(v));
    }
    Ok(())
}

/// The budget in checkpoints from the ways a caller may give it: a count, or a byte budget with
/// one checkpoint's size — not both; none means unlimited.
pub fn resolve_budget(checkpoints: Option<usize>, budget_bytes: Option<u64>, state_bytes: Option<u64>) -> Result<Option<usize>> {
    match (checkpoints, budget_bytes, state_bytes) {
        (None, None, None) => Ok(None),
        (Some(n), None, None) => Ok(Some(n)),
        (None, Some(b), Some(s)) => Config::budget_from_bytes(b, s).map(Some),
        (Some(_), _, _) => Err(Error::plan("give the budget as a count of checkpoints or as budget_bytes with state_bytes, not both")),
        (None, Some(_), None) => Err(Error::plan("budget_bytes needs state_bytes (the bytes of one checkpoint)")),
        (None, None, Some(_)) => Err(Error::plan("state_bytes needs budget_bytes (the bytes the checkpoints may use)")),
    }
}
