//! An SGLang pool as the core holds it: the descriptions of its tensors (checked once, when the
//! adapter is built: [`check_pool`]), the planner's groups over them, and what each operation
//! needs of them -- the state tensors that hold bytes, each with its verify scratch, the slot
//! kernel's records, the commit's moves and the HiCache host copies.

use super::checks::{check_pool, check_slot_counts};
use super::hicache::{Direction, HostCopy};
use super::kernel::{slot_table, SlotCopy};
use super::layout::pool_groups;
use super::{commit_selection, CommitPass, CommitSizes};
use crate::error::{Error, Result};
use crate::layout::{ConvLayout, Layout};
use crate::tensor::TensorDesc;

/// An SGLang pool's tensors.
#[derive(Clone, Debug)]
pub struct Pool {
    /// Every conv tensor, then the temporal state (`[layers, slots, ...]` each).
    pub states: Vec<TensorDesc>,
    /// The verify scratch: `intermediate_ssm`, then every `intermediate_conv_window`.
    scratch: Vec<Option<TensorDesc>>,
    /// Whether the pool has `intermediate_conv_window` (one per conv tensor).
    windows: Option<usize>,
    /// The planner's groups: each one's layout and the indices of its tensors in `states`.
    pub groups: Vec<(Layout, Vec<usize>)>,
    /// Slots, the dummy slot 0 included (the planner's blocks).
    pub num_slots: u64,
    /// The names of the states, then of the verify scratch present (what errors call them).
    labels: Vec<String>,
}

/// The slot kernel's records of a pool for one use, and its scratch's rows and draft.
#[derive(Clone, Debug)]
pub struct SlotTable {
    pub records: Vec<SlotCopy>,
    pub rows: i64,
    pub draft: i64,
}

/// The moves of a commit (`(slot, scratch row, step)`), the commit pass then the track pass.
pub type Moves = Vec<(i64, i64, i64)>;

impl Pool {
    /// Checks the pool's tensors (one layer count, no two sharing memory: `BindingError` naming
    /// them) and forms the planner's groups, the conv windows in `conv_layout`.
    pub fn new(
        conv: Vec<TensorDesc>,
        temporal: TensorDesc,
        ssm: Option<TensorDesc>,
        windows: Option<Vec<TensorDesc>>,
        conv_layout: ConvLayout,
    ) -> Result<Pool> {
        let all = labelled(&conv, &temporal, ssm.as_ref(), windows.as_deref());
        check_pool(&all)?;
        check_slot_counts(&all[..=conv.len()])?;
        let labels = all.into_iter().map(|(label, _)| label).collect();
        let groups = pool_groups(&conv.iter().collect::<Vec<_>>(), &temporal, conv_layout)?;
        let mut states = conv;
        states.push(temporal);
        let num_slots = groups.iter().flat_map(|(_, ks)| ks).map(|&k| states[k].shape[1].max(0) as u64).max().unwrap_or(0);
        let count = windows.as_ref().map(Vec::len);
        let scratch = std::iter::once(ssm).chain(windows.into_iter().flatten().map(Some)).collect();
        Ok(Pool { states, scratch, windows: count, groups, num_slots, labels })
    }

    /// Every tensor of the pool with its name: every conv tensor, the temporal state, the verify
    /// scratch.
    pub fn tensors(&self) -> Vec<(&str, &TensorDesc)> {
        let scratch = self.scratch.iter().flatten();
        self.labels.iter().map(String::as_str).zip(self.states.iter().chain(scratch)).collect()
    }

    /// The state tensors that hold bytes, in SGLang's order (every such conv tensor, then the
    /// temporal state): indices in `states`.
    pub fn live(&self) -> Vec<usize> {
        let temporal = self.states.len() - 1;
        let mut live: Vec<usize> = self.groups.iter().map(|(_, ks)| ks[0]).filter(|&k| k < temporal).collect();
        if self.groups.iter().any(|(_, ks)| ks.last() == Some(&temporal)) {
            live.push(temporal);
        }
        live
    }

    /// `(state, scratch)` for every state tensor that holds bytes, the temporal state first:
    /// indices in `states` and in `[intermediate_ssm, *intermediate_conv_window]`. A `PlanError`
    /// for a pool without the scratch the commit needs.
    pub fn verify_scratch(&self) -> Result<Vec<(usize, usize)>> {
        let temporal = self.states.len() - 1;
        let live = self.live();
        let mut pairs = Vec::new();
        if live.contains(&temporal) {
            if self.scratch[0].is_none() {
                return Err(Error::plan("commit_after_verify: the pool has no intermediate_ssm (not a speculative pool)"));
            }
            pairs.push((temporal, 0));
        }
        let convs: Vec<usize> = live.into_iter().filter(|&k| k < temporal).collect();
        if !convs.is_empty() && self.windows != Some(temporal) {
            return Err(Error::plan("commit_after_verify: the pool has no intermediate_conv_window per conv tensor"));
        }
        Ok(pairs.into_iter().chain(convs.into_iter().map(|k| (k, k + 1))).collect())
    }

    /// [`Pool::verify_scratch`]'s pairs as the tensors themselves.
    pub fn verify_pairs(&self) -> Result<Vec<(&TensorDesc, &TensorDesc)>> {
        Ok(self.verify_scratch()?.into_iter().map(|(k, x)| (&self.states[k], self.scratch_of(x))).collect())
    }

    fn scratch_of(&self, s: usize) -> &TensorDesc {
        self.scratch[s].as_ref().expect("verify_scratch pairs name present scratch")
    }

    /// The scratch's rows and draft (`[layers, rows, draft, ...]` of the first pair).
    fn scratch_sizes(pairs: &[(usize, usize)], pool: &Pool) -> (i64, i64) {
        pairs.first().map_or((0, 0), |&(_, s)| {
            let t = pool.scratch_of(s);
            (t.shape.get(1).copied().unwrap_or(0), t.shape.get(2).copied().unwrap_or(0))
        })
    }

    /// The slot kernel's records for clearing (`commit` false) or for the commit (each state
    /// tensor with its verify scratch).
    pub fn slot_table(&self, commit: bool) -> Result<SlotTable> {
        let live = self.live();
        let pairs = if commit { self.verify_scratch()? } else { Vec::new() };
        let states: Vec<TensorDesc> = live.iter().map(|&k| self.states[k].clone()).collect();
        let scratch: Vec<Option<TensorDesc>> =
            live.iter().map(|k| pairs.iter().find(|(s, _)| s == k).map(|&(_, x)| self.scratch_of(x).clone())).collect();
        let (rows, draft) = Self::scratch_sizes(&pairs, self);
        Ok(SlotTable { records: slot_table(&states, &scratch)?, rows, draft })
    }

    /// The commit's moves on the host, every index checked first ([`commit_selection`]): `rows`
    /// defaults to each request's own index; `track` is the track pass's slots and steps.
    pub fn commit_moves(&self, slots: &[i64], steps: &[i64], rows: Option<&[i64]>, track: (Option<&[i64]>, Option<&[i64]>)) -> Result<Moves> {
        let pairs = self.verify_scratch()?;
        let (num_rows, draft) = Self::scratch_sizes(&pairs, self);
        let mut passes = vec![CommitPass { name: "commit", slots, steps }];
        match track {
            (Some(track), Some(_)) if track.len() != slots.len() => {
                // Per request, as on CUDA (the slot kernel's launch refuses them too).
                return Err(Error::plan(format!(
                    "commit_after_verify: track_indices has {} elements, state_indices {}: one per request",
                    track.len(),
                    slots.len()
                )));
            }
            (Some(slots), Some(steps)) => passes.push(CommitPass { name: "track", slots, steps }),
            (Some(_), None) => return Err(Error::plan("commit_after_verify: track_indices given without steps_to_track")),
            (None, Some(_)) => return Err(Error::plan("commit_after_verify: steps_to_track given without track_indices")),
            (None, None) => {}
        }
        let sizes = CommitSizes { num_slots: self.num_slots, num_rows: num_rows.max(0) as u64, draft: draft.max(0) as u64 };
        let selected = commit_selection(&passes, rows, sizes)?;
        let row = |r: usize| rows.map_or(r as i64, |v| v[r]);
        Ok(selected
            .iter()
            .zip(&passes)
            .flat_map(|(take, p)| take.iter().map(move |&r| (p.slots[r as usize], row(r as usize), p.steps[r as usize])))
            .collect())
    }

    /// A transfer binds the first conv tensor and the temporal state of every layer: a
    /// `LayoutError` for a pool with more than one conv tensor holding bytes (binding one would
    /// leave the others stale on the destination).
    pub fn check_transfer(&self) -> Result<()> {
        let convs = self.live().into_iter().filter(|&k| k + 1 < self.states.len()).count();
        if convs > 1 {
            return Err(Error::layout(format!("state_pool binds one conv tensor per layer; this pool has {convs}: its transfer is not supported")));
        }
        Ok(())
    }

    /// HiCache's host copy of the (checked) slots `ids` on CUDA.
    /// Checks that `groups` (per group, per layer, the described tensors a planner binds) are
    /// exactly this pool's layer views ([`Pool::groups`]: `state[layer]` of each of a group's
    /// states, in order): a planner guarded by the pool (`also_guard`) writes the pool's memory
    /// and no other (`BindingError` naming the first view that is not the pool's).
    pub fn check_layer_views(&self, groups: &[Vec<Vec<TensorDesc>>]) -> Result<()> {
        if groups.len() != self.groups.len() {
            return Err(Error::binding(format!(
                "also_guard: {} groups given, the pool has {} (its layer_groups())",
                groups.len(),
                self.groups.len()
            )));
        }
        for (g, ((_, ks), layers)) in self.groups.iter().zip(groups).enumerate() {
            let count = self.states[ks[0]].shape[0];
            if layers.len() as i64 != count {
                return Err(Error::binding(format!("also_guard: group {g} has {} layers, the pool {count}", layers.len())));
            }
            for (l, row) in layers.iter().enumerate() {
                if row.len() != ks.len() {
                    return Err(Error::binding(format!("also_guard: group {g}, layer {l} has {} states, the pool's {}", row.len(), ks.len())));
                }
                for (j, (&k, v)) in ks.iter().zip(row).enumerate() {
                    let st = &self.states[k];
                    let at = (st.data_ptr as i128 + l as i128 * st.strides[0] as i128) as u64;
                    if v.data_ptr != at
                        || v.shape[..] != st.shape[1..]
                        || v.strides[..] != st.strides[1..]
                        || v.dtype_name() != st.dtype_name()
                        || v.device != st.device
                    {
                        let label = super::checks::state_label(k, self.states.len());
                        return Err(Error::binding(format!(
                            "also_guard: group {g}, layer {l}, state {j} is not the pool's {label}[{l}]: a planner guarded by a pool binds its layer_groups()"
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    pub fn host_copy(&self, direction: Direction, ids: Vec<i64>) -> Result<HostCopy> {
        HostCopy::new(direction, self.states.clone(), ids, self.num_slots)
    }
}

/// The pool's tensors with their names, in the order the pool holds them.
fn labelled<'a>(
    conv: &'a [TensorDesc],
    temporal: &'a TensorDesc,
    ssm: Option<&'a TensorDesc>,
    windows: Option<&'a [TensorDesc]>,
) -> Vec<(String, &'a TensorDesc)> {
    let mut all: Vec<(String, &TensorDesc)> = conv.iter().enumerate().map(|(i, t)| (format!("conv[{i}]"), t)).collect();
    all.push(("temporal".into(), temporal));
    all.extend(ssm.map(|t| ("intermediate_ssm".to_string(), t)));
    all.extend(windows.into_iter().flatten().enumerate().map(|(i, t)| (format!("intermediate_conv_window[{i}]"), t)));
    all
}
