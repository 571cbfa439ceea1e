//! Tests of the planner over several groups (the single-group rules are in `tests/plan_props.rs`
//! and the Python tests).

use super::*;
use crate::binding::Binding;
use crate::layout::{ConvLayout, CopyKind, Layout, StateSpec};
use crate::tensor::TensorDesc;
use crate::DType;

pub(crate) const NB: usize = 8;

/// One layer: an SD conv window (3 x 2) and a temporal state (4), f32, over `mem`.
pub(crate) fn binding(mem: &mut [f32], name: &str, num_spec: u32) -> Binding {
    let states = vec![
        StateSpec::persistent("conv", &[3, 2], DType::Float32, CopyKind::Conv(ConvLayout::SD)),
        StateSpec::persistent("temporal", &[4], DType::Float32, CopyKind::Temporal),
    ];
    let layout = Layout::new(name, states, num_spec).unwrap();
    let base = mem.as_mut_ptr() as u64;
    let conv = TensorDesc::dense(base, "float32", &[NB as i64, 3, 2], "cpu");
    let temporal = TensorDesc::dense(base + NB as u64 * 6 * 4, "float32", &[NB as i64, 4], "cpu");
    Binding::new(&layout, &[vec![conv, temporal]]).unwrap()
}

pub(crate) fn mem() -> Vec<f32> {
    (0..NB * 10).map(|i| i as f32).collect()
}

fn run(plan: &CopyPlan) {
    crate::executor::execute(plan).unwrap();
}

#[test]
fn equal_columns_follow_the_named_semantics() {
    let table: Vec<i64> = vec![1, 2, 3, 4];
    let t = [GroupTable { ids: &table, cols: 4 }];
    for (sem, moves) in [(Semantics::PreCopy, false), (Semantics::PostProcess, true)] {
        let mut m = mem();
        let before = m.clone();
        let p = Planner::new(vec![binding(&mut m, "A", 2)]).unwrap();
        // src == dst == column 1 (block 2), 3 accepted.
        let plan = p.plan(&Step { tables: &t, src_col: &[1], dst_col: &[1], num_accepted: &[3], semantics: sem }).unwrap();
        run(&plan);
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
fn a_bad_group_names_itself_and_nothing_is_planned() {
    let (mut m0, mut m1) = (mem(), mem());
    let p = Planner::new(vec![binding(&mut m0, "A", 2), binding(&mut m1, "B", 2)]).unwrap();
    let good: Vec<i64> = vec![1, 2, 3, 4];
    let bad: Vec<i64> = vec![1, 0, 3, 4]; // group 1's destination is the null block
    let tables = [GroupTable { ids: &good, cols: 4 }, GroupTable { ids: &bad, cols: 4 }];
    let e = p.plan(&Step { tables: &tables, src_col: &[0], dst_col: &[1], num_accepted: &[1], semantics: Semantics::PreCopy }).unwrap_err();
    assert!(e.message.starts_with("group 1: B: request 0"), "{}", e.message);
    let e = Planner::new(vec![binding(&mut mem(), "A", 2), binding(&mut mem(), "B", 1)]).unwrap_err();
    assert!(e.message.contains("group 1 (B): its layout has num_spec = 1, but group 0's has 2"), "{}", e.message);
    let e = p.plan(&Step { tables: &tables[..1], src_col: &[0], dst_col: &[1], num_accepted: &[1], semantics: Semantics::PreCopy }).unwrap_err();
    assert_eq!(e.message, "one block table per group: 2 groups bound, 1 tables given");
}

#[test]
fn one_plan_holds_every_group_group_by_group_and_runs_whole() {
    let (mut m0, mut m1) = (mem(), mem());
    let (b0, b1) = (m0.clone(), m1.clone());
    let p = Planner::new(vec![binding(&mut m0, "A", 2), binding(&mut m1, "B", 2)]).unwrap();
    // Group 0: request 0 moves block 1 -> 2 while request 1 moves 2 -> 3 (two waves: 2 is read
    // before it is written); group 1: one move, one wave.
    let t0: Vec<i64> = vec![1, 2, 2, 3];
    let t1: Vec<i64> = vec![5, 6, 0, 0];
    let tables = [GroupTable { ids: &t0, cols: 2 }, GroupTable { ids: &t1, cols: 2 }];
    let plan =
        p.plan(&Step { tables: &tables, src_col: &[0, 0], dst_col: &[1, 1], num_accepted: &[1, 1], semantics: Semantics::PostProcess }).unwrap();
    let stats = plan.group_stats();
    assert_eq!((stats[0].waves, stats[1].waves, plan.num_waves()), (2, 1, 3));
    assert_eq!(plan.num_copies(), stats[0].copies + stats[1].copies);
    assert_eq!(plan.rows().iter().map(|r| (r.group, r.request)).collect::<Vec<_>>(), vec![(0, 0), (0, 1), (1, 0)]);
    // Group 1's only wave comes after group 0's two, and is the plan's third.
    let g1 = p.binding(1).tensor(0, 1).base;
    let in_g1 = |w: usize| plan.wave(w).iter().any(|s| s.dst >= g1 && s.dst < g1 + NB as u64 * 16);
    assert_eq!((in_g1(0), in_g1(1), in_g1(2)), (false, false, true));
    assert!(plan.wave(2).iter().all(|s| s.wave == 2));
    run(&plan);
    assert_eq!(m0[NB * 6 + 8..NB * 6 + 12], b0[NB * 6 + 4..NB * 6 + 8]); // block 2 <- block 1
    assert_eq!(m0[NB * 6 + 12..NB * 6 + 16], b0[NB * 6 + 8..NB * 6 + 12]); // block 3 <- old block 2
    assert_eq!(m1[NB * 6 + 24..NB * 6 + 28], b1[NB * 6 + 20..NB * 6 + 24]); // block 6 <- block 5
}

#[test]
fn a_vllm_step_needs_a_block_size_and_the_groups_num_spec() {
    let mut m = mem();
    let p = Planner::new(vec![binding(&mut m, "A", 2)]).unwrap();
    let e = crate::vllm::check_step(&p, None, 2).unwrap_err();
    assert!(e.message.contains("block_size is required"), "{}", e.message);
    let e = crate::vllm::check_step(&p, Some(4), 3).unwrap_err();
    assert_eq!(e.kind, crate::error::ErrorKind::Layout);
    assert!(e.message.contains("num_spec = 2, but num_spec_blocks is 3"), "{}", e.message);
    assert!(crate::vllm::check_step(&p, Some(4), -1).unwrap_err().message.contains(">= 0"));
    let cfg = crate::vllm::check_step(&p, Some(4), 2).unwrap();
    assert_eq!((cfg.block_size, cfg.num_spec_blocks), (4, 2));
}
