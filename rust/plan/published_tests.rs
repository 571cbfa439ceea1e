//! Copy-on-write: a published block's bytes never change until its last holder retracts it, and a
//! plan that would write one is refused before anything is planned.

use super::tests::{binding, mem, NB};
use super::*;
use proptest::prelude::*;

/// Block `b`'s bytes: its conv window (6 floats) and temporal state (4 floats).
fn block(m: &[f32], b: usize) -> Vec<f32> {
    let mut v = m[b * 6..b * 6 + 6].to_vec();
    v.extend_from_slice(&m[NB * 6 + b * 4..NB * 6 + b * 4 + 4]);
    v
}

#[test]
fn a_plan_writing_a_published_block_is_refused_and_names_it() {
    let mut m = mem();
    let p = Planner::new(vec![binding(&mut m, "A", 2)]).unwrap();
    p.publish(0, &[3, 3, 5]).unwrap();
    assert_eq!((p.published(0).unwrap(), p.holders(0, 3).unwrap()), (vec![3, 5], 2));
    let e = p.plan_copy(&[1, 2], &[2, 5]).unwrap_err();
    assert!(e.message.contains("A: request 1, state 'conv' (all 1 layers): the destination block 5 holds a published state"), "{}", e.message);
    let e = p.plan_align(&AlignStep { block_table: &[1, 3], cols: 2, src_col: &[0], dst_col: &[1], num_accepted: &[1] }).unwrap_err();
    assert!(e.message.contains("request 0") && e.message.contains("block 3") && e.message.contains("copy-on-write"), "{}", e.message);
    // Reading a published block is fine: the copy-first path.
    run_ok(&p, &[3], &[4]);
    // Two holders: one retract leaves it published; a retract too many changes nothing.
    p.retract(0, &[3]).unwrap();
    assert!(p.plan_copy(&[1], &[3]).is_err());
    let e = p.retract(0, &[5, 3, 3]).unwrap_err();
    assert!(e.message.contains("blocks[2] = 3: retracts block 3 2 time(s) but it has 1 publisher(s)"), "{}", e.message);
    assert_eq!(p.published(0).unwrap(), vec![3, 5]);
    p.retract(0, &[3, 5]).unwrap();
    run_ok(&p, &[1], &[3]);
    assert!(p.publish(0, &[2, 0]).unwrap_err().message.contains("blocks[1] = 0 is outside 1 ..= 7"));
    assert!(p.publish(0, &[8]).is_err() && p.published(0).unwrap().is_empty(), "a refused publish changes nothing");
    assert!(p.publish(1, &[2]).unwrap_err().message.contains("group 1 does not exist"));
}

fn run_ok(p: &Planner, src: &[i64], dst: &[i64]) {
    crate::executor::execute(&p.plan_copy(src, dst).unwrap()).unwrap();
}

#[test]
fn groups_publish_their_own_blocks() {
    let (mut m0, mut m1) = (mem(), mem());
    let p = Planner::new(vec![binding(&mut m0, "A", 2), binding(&mut m1, "B", 2)]).unwrap();
    p.publish(1, &[2]).unwrap();
    let (t0, t1): (Vec<i64>, Vec<i64>) = (vec![1, 2], vec![1, 2]);
    let tables = [GroupTable { ids: &t0, cols: 2 }, GroupTable { ids: &t1, cols: 2 }];
    let step = Step { tables: &tables, src_col: &[0], dst_col: &[1], num_accepted: &[1], semantics: Semantics::PostProcess };
    let e = p.plan(&step).unwrap_err();
    assert!(e.message.starts_with("group 1: B: request 0"), "{}", e.message);
    p.retract(1, &[2]).unwrap();
    p.publish(0, &[1]).unwrap();
    p.plan(&step).unwrap(); // group 0's block 1 is only read
}

#[derive(Clone, Debug)]
enum Op {
    Publish(i64),
    Retract(i64),
    Copy(i64, i64),
    Align([i64; 4], i64, i64, i64),
}

fn op() -> impl Strategy<Value = Op> {
    let b = 0i64..NB as i64;
    prop_oneof![
        b.clone().prop_map(Op::Publish),
        b.clone().prop_map(Op::Retract),
        (b.clone(), b.clone()).prop_map(|(s, d)| Op::Copy(s, d)),
        (prop::array::uniform4(b), 0i64..4, 0i64..4, 1i64..4).prop_map(|(r, s, d, a)| Op::Align(r, s, d, a)),
    ]
}

proptest! {
    /// Random publish / retract / fork (whole-block copy) / commit (align step) sequences: every
    /// published block keeps the bytes it had when published until its last holder retracts it; a
    /// copy onto a published block is refused; a refusal writes nothing.
    #[test]
    fn published_bytes_never_change_until_retracted(ops in prop::collection::vec(op(), 1..40)) {
        let mut m = mem();
        let p = Planner::new(vec![binding(&mut m, "A", 2)]).unwrap();
        let mut holders = [0u32; NB];
        let mut snap: std::collections::HashMap<usize, Vec<f32>> = Default::default();
        for op in ops {
            match op {
                Op::Publish(b) => {
                    let r = p.publish(0, &[b]);
                    prop_assert_eq!(r.is_ok(), b > 0);
                    if b > 0 {
                        holders[b as usize] += 1;
                        snap.entry(b as usize).or_insert_with(|| block(&m, b as usize));
                    }
                }
                Op::Retract(b) => {
                    let r = p.retract(0, &[b]);
                    prop_assert_eq!(r.is_ok(), holders[b as usize] > 0);
                    if r.is_ok() {
                        holders[b as usize] -= 1;
                        if holders[b as usize] == 0 {
                            snap.remove(&(b as usize));
                        }
                    }
                }
                Op::Copy(s, d) => match p.plan_copy(&[s], &[d]) {
                    Ok(plan) => {
                        prop_assert!(s == d || holders[d as usize] == 0);
                        crate::executor::execute(&plan).unwrap();
                    }
                    Err(e) => prop_assert!(s == 0 || d == 0 || holders[d as usize] > 0, "{}", e.message),
                },
                Op::Align(row, s, d, a) => match p.plan_align(&AlignStep { block_table: &row, cols: 4, src_col: &[s], dst_col: &[d], num_accepted: &[a] }) {
                    Ok(plan) => crate::executor::execute(&plan).unwrap(),
                    Err(e) if e.message.contains("published") => prop_assert!(holders[row[d as usize] as usize] > 0, "{}", e.message),
                    Err(_) => {}
                },
            }
            for (&b, bytes) in &snap {
                prop_assert_eq!(&block(&m, b), bytes, "published block {} changed", b);
            }
            prop_assert_eq!(p.published(0).unwrap(), (0..NB as u64).filter(|&b| holders[b as usize] > 0).collect::<Vec<_>>());
        }
    }
}
