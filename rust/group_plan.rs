//! Several recurrent groups planned as one step: each group has its own layout, layers, state
//! tensors and block table (vLLM's mamba groups), and one decision per request applies to all of
//! them. A [`GroupPlanner`] owns one [`Planner`] per group; a step gives one [`GroupPlan`] that is
//! checked whole before any byte moves.

use crate::engine_step::{self, GroupTable, PostDecision, PostInputs, PreDecision, PreInputs, StepConfig};
use crate::error::{Error, Result};
use crate::executor;
use crate::plan::segment::StateMeta;
use crate::plan::{AlignStep, CopyPlan, Planner};

/// How a request whose source and destination columns are equal is treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Semantics {
    /// vLLM's pre-copy: equal columns are a no-op whatever the accepted count (the state is
    /// already in place; the kernels find it through `num_accepted`).
    PreCopy,
    /// vLLM's post-process (and `Planner::plan_align`): equal columns with `num_accepted > 1`
    /// shift the conv window in place and take the temporal state from the accepted column.
    PostProcess,
}

impl Semantics {
    pub fn parse(s: &str) -> Result<Semantics> {
        match s {
            "pre_copy" => Ok(Semantics::PreCopy),
            "post_process" => Ok(Semantics::PostProcess),
            _ => Err(Error::plan(format!("semantics must be 'pre_copy' or 'post_process', got '{s}'"))),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Semantics::PreCopy => "pre_copy",
            Semantics::PostProcess => "post_process",
        }
    }
}

/// One planner per recurrent group, sharing the step's scheduling parameters.
#[derive(Debug)]
pub struct GroupPlanner {
    groups: Vec<Planner>,
    cfg: StepConfig,
}

/// One step's copies over every group: a plan per group (possibly empty), run as one.
#[derive(Debug)]
pub struct GroupPlan {
    plans: Vec<CopyPlan>,
}

impl GroupPlanner {
    /// Every group's layout must have `num_spec == cfg.num_spec_blocks` (the accepted counts of
    /// one decision apply to all groups).
    pub fn new(groups: Vec<Planner>, cfg: StepConfig) -> Result<GroupPlanner> {
        if groups.is_empty() {
            return Err(Error::binding("a group planner needs at least one recurrent group"));
        }
        if cfg.block_size < 1 || cfg.num_spec_blocks < 0 {
            return Err(Error::binding(format!(
                "block_size must be >= 1 and num_spec_blocks >= 0; got {} and {}",
                cfg.block_size, cfg.num_spec_blocks
            )));
        }
        for (g, p) in groups.iter().enumerate() {
            let l = p.binding().layout();
            if l.num_spec() as i64 != cfg.num_spec_blocks {
                return Err(Error::binding(format!(
                    "group {g} ({}): its layout has num_spec = {}, but the step's num_spec_blocks is {}; \
                     every group shares the step's speculative blocks",
                    l.backend(),
                    l.num_spec(),
                    cfg.num_spec_blocks
                )));
            }
        }
        Ok(GroupPlanner { groups, cfg })
    }

    pub fn groups(&self) -> &[Planner] {
        &self.groups
    }

    /// The fused kernel's state metas of every group, each naming its group (one launch copies
    /// every group's states); `None` when the groups' states are not all on one CUDA device.
    pub fn state_meta(&self) -> Result<Vec<StateMeta>> {
        let device = self.groups[0].binding().device();
        let mut out = Vec::new();
        for (g, p) in self.groups.iter().enumerate() {
            if p.binding().device() != device {
                return Err(Error::binding(format!("group {g} is on {}, group 0 on {device}: one launch needs one device", p.binding().device())));
            }
            out.extend(p.state_meta().into_iter().map(|m| StateMeta { group: g as u32, ..m }));
        }
        Ok(out)
    }

    /// The largest pool of any group (the fused kernel's global block bound; each state meta
    /// carries its own).
    pub fn max_blocks(&self) -> u64 {
        self.groups.iter().map(|p| p.binding().num_blocks()).max().unwrap_or(0)
    }
    pub fn config(&self) -> StepConfig {
        self.cfg
    }

    fn check_tables(&self, tables: &[GroupTable<'_>]) -> Result<()> {
        if tables.len() != self.groups.len() {
            return Err(Error::plan(format!("one block table per group: {} groups bound, {} tables given", self.groups.len(), tables.len())));
        }
        Ok(())
    }

    /// Plans `dst_col <- src_col` moves carrying `num_accepted` (the accepted count: conv shift
    /// `num_accepted - 1`, temporal source `src_col + num_accepted - 1`) in every group, under
    /// `semantics`. A negative `src_col` or `dst_col` is a request that moves nothing.
    pub fn plan(&self, tables: &[GroupTable<'_>], src_col: &[i64], dst_col: &[i64], num_accepted: &[i64], semantics: Semantics) -> Result<GroupPlan> {
        self.check_tables(tables)?;
        let r = src_col.len();
        let masked;
        let src = match semantics {
            Semantics::PostProcess => src_col,
            Semantics::PreCopy => {
                masked = src_col.iter().zip(dst_col).map(|(&s, &d)| if s == d { -1 } else { s }).collect::<Vec<i64>>();
                &masked
            }
        };
        let mut plans = Vec::with_capacity(self.groups.len());
        for (g, (p, t)) in self.groups.iter().zip(tables).enumerate() {
            if t.cols == 0 || t.ids.len() % t.cols != 0 || t.ids.len() / t.cols < r {
                return Err(Error::plan(format!(
                    "group {g}: block table must be [rows >= {r} requests, cols >= 1]; got {} ids for {} columns",
                    t.ids.len(),
                    t.cols
                )));
            }
            let step = AlignStep { block_table: &t.ids[..r * t.cols], cols: t.cols, src_col: src, dst_col, num_accepted };
            plans.push(p.plan_align(&step).map_err(|e| Error::plan(format!("group {g}: {}", e.message)))?);
        }
        Ok(GroupPlan { plans })
    }

    /// The pre-copy decision and its copies (pre-copy semantics) in one call.
    pub fn pre_copy(&self, inp: &PreInputs<'_>, tables: &[GroupTable<'_>], name: &dyn Fn(usize) -> String) -> Result<(PreDecision, GroupPlan)> {
        self.check_tables(tables)?;
        let d = engine_step::pre_copy(inp, tables, &self.cfg, name)?;
        let accepted: Vec<i64> = d.bias.iter().map(|b| b + 1).collect();
        let plan = self.plan(tables, &d.src_col, &d.curr, &accepted, Semantics::PreCopy)?;
        Ok((d, plan))
    }

    /// The post-process decision and its copies (post-process semantics) in one call.
    pub fn post_process(&self, inp: &PostInputs<'_>, tables: &[GroupTable<'_>], name: &dyn Fn(usize) -> String) -> Result<(PostDecision, GroupPlan)> {
        self.check_tables(tables)?;
        let d = engine_step::post_process(inp, tables, &self.cfg, name)?;
        let accepted: Vec<i64> = d.bias.iter().map(|b| b + 1).collect();
        let plan = self.plan(tables, &d.src_col, &d.dest, &accepted, Semantics::PostProcess)?;
        Ok((d, plan))
    }
}

impl GroupPlan {
    /// The plan of each group, in group order.
    pub fn plans(&self) -> &[CopyPlan] {
        &self.plans
    }
    pub fn num_copies(&self) -> u64 {
        self.plans.iter().map(|p| p.num_copies()).sum()
    }
    pub fn bytes(&self) -> u64 {
        self.plans.iter().map(|p| p.bytes()).sum()
    }
    pub fn num_segments(&self) -> usize {
        self.plans.iter().map(|p| p.segments().len()).sum()
    }
    pub fn is_empty(&self) -> bool {
        self.plans.iter().all(|p| p.is_empty())
    }
    /// Runs every group's plan over CPU tensors. Every group's segments are checked first: either
    /// the whole step runs or nothing does. Groups are independent (disjoint blocks or tensors).
    pub fn execute_host(&self) -> Result<()> {
        for (g, p) in self.plans.iter().enumerate() {
            executor::check(p).map_err(|e| Error::plan(format!("group {g}: {}", e.message)))?;
        }
        for p in &self.plans {
            executor::execute(p)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binding::{Binding, TensorDesc};
    use crate::dtype::DType;
    use crate::layout::{ConvLayout, CopyKind, Layout, StateSpec};

    const NB: usize = 8;

    /// One layer: an SD conv window (3 x 2) and a temporal state (4), f32, over `mem`.
    fn planner(mem: &mut [f32], name: &str) -> Planner {
        let states = vec![
            StateSpec::persistent("conv", &[3, 2], DType::Float32, CopyKind::Conv(ConvLayout::SD)),
            StateSpec::persistent("temporal", &[4], DType::Float32, CopyKind::Temporal),
        ];
        let layout = Layout::new(name, states, 2).unwrap();
        let base = mem.as_mut_ptr() as u64;
        let desc = |off: usize, shape: Vec<i64>, strides: Vec<i64>| TensorDesc {
            data_ptr: base + off as u64 * 4,
            dtype: DType::Float32,
            shape,
            strides,
            device: "cpu".into(),
            writable: true,
        };
        let conv = desc(0, vec![NB as i64, 3, 2], vec![24, 8, 4]);
        let temporal = desc(NB * 6, vec![NB as i64, 4], vec![16, 4]);
        Planner::new(Binding::new(&layout, &[vec![conv, temporal]]).unwrap())
    }

    fn mem() -> Vec<f32> {
        (0..NB * 10).map(|i| i as f32).collect()
    }

    #[test]
    fn equal_columns_follow_the_named_semantics() {
        let cfg = StepConfig { block_size: 4, num_spec_blocks: 2 };
        let table: Vec<i64> = vec![1, 2, 3, 4];
        let t = [GroupTable { ids: &table, cols: 4 }];
        for (sem, moves) in [(Semantics::PreCopy, false), (Semantics::PostProcess, true)] {
            let mut m = mem();
            let before = m.clone();
            let gp = GroupPlanner::new(vec![planner(&mut m, "A")], cfg).unwrap();
            // src == dst == column 1 (block 2), 3 accepted.
            let plan = gp.plan(&t, &[1], &[1], &[3], sem).unwrap();
            plan.execute_host().unwrap();
            assert_eq!(plan.is_empty(), !moves, "{}", sem.name());
            if moves {
                // conv of block 2 shifted left by 2 rows in place; temporal from column 3 (block 4).
                assert_eq!(m[12..14], before[16..18]);
                assert_eq!(m[NB * 6 + 8..NB * 6 + 12], before[NB * 6 + 16..NB * 6 + 20]);
            } else {
                assert_eq!(m, before);
            }
        }
    }

    #[test]
    fn a_bad_group_names_itself_and_nothing_runs() {
        let cfg = StepConfig { block_size: 4, num_spec_blocks: 2 };
        let (mut m0, mut m1) = (mem(), mem());
        let before = (m0.clone(), m1.clone());
        let gp = GroupPlanner::new(vec![planner(&mut m0, "A"), planner(&mut m1, "B")], cfg).unwrap();
        let good: Vec<i64> = vec![1, 2, 3, 4];
        let bad: Vec<i64> = vec![1, 0, 3, 4]; // group 1's destination is the null block
        let e = gp.plan(&[GroupTable { ids: &good, cols: 4 }, GroupTable { ids: &bad, cols: 4 }], &[0], &[1], &[1], Semantics::PreCopy).unwrap_err();
        assert!(e.message.starts_with("group 1: B: request 0"), "{}", e.message);
        assert_eq!((m0, m1), before);
        let e = GroupPlanner::new(vec![planner(&mut mem(), "A")], StepConfig { block_size: 4, num_spec_blocks: 1 }).unwrap_err();
        assert!(e.message.contains("group 0 (A): its layout has num_spec = 2"), "{}", e.message);
    }
}
