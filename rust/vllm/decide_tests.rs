//! Tests of the engine-step decisions.
use super::*;

const CFG: StepConfig = StepConfig { block_size: 4, num_spec_blocks: 2 };

/// A table where every column holds a distinct live block.
fn dense(r: usize, cols: usize) -> Vec<i64> {
    (0..r * cols).map(|k| k as i64 + 1).collect()
}

fn pre(c: &[i64], n: &[i64], a: &[i64], run: &[i64], bt: &[i64], cols: usize) -> Result<PreDecision> {
    let inp = PreInputs { num_computed: c, num_scheduled: n, num_accepted: a, mamba_state_idx: run, fresh: None };
    pre_copy(&inp, &[GroupTable { ids: bt, cols }], &CFG, &row_name)
}

#[test]
fn pre_copy_matches_the_formulas() {
    // new (C=0); prefix hit at 8 tokens scheduling 4 (prev 1 -> curr 2); running col 2 with
    // A=3 moving to 3; running col 3 staying in column 3 (C+N = 14 -> col 3); backwards 4 -> 3.
    let c = [0, 8, 10, 12, 12];
    let n = [5, 4, 3, 2, 1];
    let a = [1, 1, 3, 2, 2];
    let run = [-1, -1, 2, 3, 4];
    let bt = dense(5, 8);
    let d = pre(&c, &n, &a, &run, &bt, 8).unwrap();
    assert_eq!(d.prev, vec![-1, 1, 2, 3, 4]);
    assert_eq!(d.curr, vec![1, 2, 3, 3, 3]);
    assert_eq!(d.src_col, vec![-1, 1, 2, -1, 4]);
    assert_eq!(d.bias, vec![0, 0, 2, 0, 1]);
    assert_eq!(d.num_accepted, vec![1, 1, 1, 2, 1]);
    assert_eq!(d.num_copies(), 3);
}

#[test]
fn pre_copy_rejects_a_prefix_hit_without_state() {
    let mut bt = dense(1, 8);
    bt[1] = 0; // column (8 - 1) // 4 = 1 is the null block
    let e = pre(&[8], &[4], &[1], &[-1], &bt, 8).unwrap_err();
    assert!(e.message.contains("request 0: prefix-cache hit of 8 computed tokens"), "{}", e.message);
    assert!(e.message.contains("group 0") && e.message.contains("column 1"), "{}", e.message);
}

#[test]
fn pre_copy_rejects_stale_columns_and_bad_counts() {
    let bt = dense(1, 8);
    let inp = PreInputs { num_computed: &[0], num_scheduled: &[4], num_accepted: &[1], mamba_state_idx: &[3], fresh: Some(&[true]) };
    let e = pre_copy(&inp, &[GroupTable { ids: &bt, cols: 8 }], &CFG, &|i| format!("request 'r{i}'")).unwrap_err();
    assert!(e.message.starts_with("request 'r0': new or resumed") && e.message.contains("stale"), "{}", e.message);
    let e = pre(&[4], &[1], &[4], &[1], &bt, 8).unwrap_err();
    assert!(e.message.contains("num_accepted = 4 is outside 1 ..= 3"), "{}", e.message);
    let e = pre(&[4], &[0], &[1], &[1], &bt, 8).unwrap_err();
    assert!(e.message.contains("num_scheduled = 0"), "{}", e.message);
    let e = pre(&[4, 4], &[1], &[1, 1], &[1, 1], &dense(2, 8), 8).unwrap_err();
    assert!(e.message.contains("num_scheduled has 1"), "{}", e.message);
}

#[test]
fn pre_copy_rejects_a_window_outside_or_null() {
    // curr = 5, window 5..=7 needs 8 columns.
    let e = pre(&[20], &[4], &[1], &[4], &dense(1, 7), 7).unwrap_err();
    assert!(e.message.contains("columns 5 ..= 7 are outside group 0"), "{}", e.message);
    let mut bt = dense(1, 8);
    bt[6] = 0;
    let e = pre(&[20], &[4], &[1], &[4], &bt, 8).unwrap_err();
    assert!(e.message.contains("null block 0 at column 6"), "{}", e.message);
    // The moved state's source columns (prev 1 ..= prev + bias = 3) must be live.
    let mut bt = dense(1, 8);
    bt[2] = 0;
    let e = pre(&[10], &[3], &[3], &[1], &bt, 8).unwrap_err();
    assert!(e.message.contains("source columns") && e.message.contains("column 2"), "{}", e.message);
    // The first dead column of the window is named, in the first group holding one.
    let (g0, mut g1) = (dense(1, 8), dense(1, 8));
    (g1[6], g1[7]) = (-3, 0);
    let inp = PreInputs { num_computed: &[20], num_scheduled: &[4], num_accepted: &[1], mamba_state_idx: &[4], fresh: None };
    let e = pre_copy(&inp, &[GroupTable { ids: &g0, cols: 8 }, GroupTable { ids: &g1, cols: 8 }], &CFG, &row_name).unwrap_err();
    assert_eq!(
        e.message,
        "request 0: the step's running and speculative columns: group 1's block table holds block id -3 at column 6, not a live state block"
    );
}

fn post(s: &[i64], c: &[i64], n: &[i64], dr: &[i64], a: &[i64]) -> Result<PostDecision> {
    let bt = dense(s.len(), 10);
    let inp = PostInputs { state_col: s, num_computed: c, num_scheduled: n, num_draft: dr, num_accepted: a };
    post_process(&inp, &[GroupTable { ids: &bt, cols: 10 }], &CFG, &row_name)
}

#[test]
fn post_process_matches_the_formulas() {
    // 0: C=5,N=3,D=2: running 6, A=3 -> new 8, aligned 8 >= 6: bias 2, dest 1, S=(7)//4=1 -> in place.
    // 1: C=6,N=3,D=2: running 7, A=2 -> new 8: bias 1, dest 1, S=2 -> copy 2 -> 1, A stays 2.
    // 2: C=4,N=3,D=2: running 5, A=3 -> new 7, aligned 4 < 5: nothing.
    // 3: C=5,N=3,D=2: running 6, A=1 -> new 6, aligned 4: nothing.
    // 4: C=4,N=4,D=0 (prefill): running 8, A=1: aligned 8 == running, dest 1 == S -> bias 0, no copy, A=1.
    let d = post(&[1, 2, 1, 1, 1], &[5, 6, 4, 5, 4], &[3, 3, 3, 3, 4], &[2, 2, 2, 2, 0], &[3, 2, 3, 1, 1]).unwrap();
    assert_eq!(d.running, vec![6, 7, 5, 6, 8]);
    assert_eq!(d.aligned, vec![8, 8, 4, 4, 8]);
    assert_eq!(d.dest, vec![1, 1, 0, 0, 1]);
    assert_eq!(d.bias, vec![2, 1, 0, 0, 0]);
    assert_eq!(d.src_col, vec![1, 2, -1, -1, -1]);
    assert_eq!(d.num_accepted, vec![1, 2, 3, 1, 1]);
}

#[test]
fn post_process_checks_its_inputs() {
    let e = post(&[2], &[5], &[3], &[2], &[1]).unwrap_err();
    assert!(e.message.contains("state_col = 2") && e.message.contains("= 1"), "{}", e.message);
    let e = post(&[1], &[5], &[3], &[1], &[3]).unwrap_err();
    assert!(e.message.contains("num_accepted = 3 is outside 1 ..= 2"), "{}", e.message);
    let e = post(&[1], &[5], &[3], &[3], &[1]).unwrap_err();
    assert!(e.message.contains("num_draft = 3"), "{}", e.message);
}

#[test]
fn decisions_cover_every_group() {
    // Group 1's boundary column is null: the post-process save must be refused naming group 1.
    let g0 = dense(1, 10);
    let mut g1 = dense(1, 10);
    g1[1] = 0;
    let inp = PostInputs { state_col: &[2], num_computed: &[6], num_scheduled: &[3], num_draft: &[2], num_accepted: &[2] };
    let tables = [GroupTable { ids: &g0, cols: 10 }, GroupTable { ids: &g1, cols: 10 }];
    let e = post_process(&inp, &tables, &CFG, &row_name).unwrap_err();
    assert!(e.message.contains("group 1") && e.message.contains("boundary column"), "{}", e.message);
    assert!(post_process(&inp, &tables[..1], &CFG, &row_name).is_ok());
}

#[test]
fn the_device_halves_take_the_same_columns_without_the_counts() {
    // Every row of a random batch: the columns decided without the accepted counts equal the
    // full decision's, and the full decision's counts are the only difference.
    let cfg = StepConfig { block_size: 3, num_spec_blocks: 2 };
    let r = 64;
    let mut seed = 7u64;
    let mut next = |m: i64| {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((seed >> 33) % m as u64) as i64
    };
    let c: Vec<i64> = (0..r).map(|_| next(30)).collect();
    let n: Vec<i64> = (0..r).map(|_| 1 + next(6)).collect();
    let a: Vec<i64> = (0..r).map(|_| 1 + next(3)).collect();
    let run: Vec<i64> = (0..r).map(|i| if next(3) == 0 { -1 } else { ((c[i] + n[i] - 1) / 3 + next(3) - 1).max(0) }).collect();
    let bt = dense(r, 20);
    let tables = [GroupTable { ids: &bt, cols: 20 }];
    let full =
        pre_copy(&PreInputs { num_computed: &c, num_scheduled: &n, num_accepted: &a, mamba_state_idx: &run, fresh: None }, &tables, &cfg, &row_name)
            .unwrap();
    let cols = pre_copy_columns(
        &PreInputs { num_computed: &c, num_scheduled: &n, num_accepted: &[], mamba_state_idx: &run, fresh: None },
        &tables,
        &cfg,
        &row_name,
    )
    .unwrap();
    assert_eq!((cols.prev, cols.curr, cols.src_col), (full.prev.clone(), full.curr.clone(), full.src_col.clone()));
    assert!(full.src_col.iter().any(|&s| s >= 0) && full.src_col.iter().any(|&s| s < 0));
    // Counts out of range are the device's to report: the columns do not look at them.
    let bad = vec![9; r];
    assert!(pre_copy(
        &PreInputs { num_computed: &c, num_scheduled: &n, num_accepted: &bad, mamba_state_idx: &run, fresh: None },
        &tables,
        &cfg,
        &row_name
    )
    .is_err());
    let dr: Vec<i64> = n.iter().map(|&k| next(k.min(3))).collect();
    let acc: Vec<i64> = dr.iter().map(|&d| 1 + next(d + 1)).collect();
    let inp = PostInputs { state_col: &full.curr, num_computed: &c, num_scheduled: &n, num_draft: &dr, num_accepted: &acc };
    let post = post_process(&inp, &tables, &cfg, &row_name).unwrap();
    assert_eq!(post_process_running(&PostInputs { num_accepted: &[], ..inp }, &tables, &cfg, &row_name).unwrap(), post.running);
    let e = post_process_running(&PostInputs { num_accepted: &[], state_col: &c, ..inp }, &tables, &cfg, &row_name).unwrap_err();
    assert!(e.message.contains("state_col ="), "{}", e.message);
}

#[test]
fn columns_and_token_counts_at_the_int64_limit_are_refused() {
    let bt = dense(1, 8);
    // A stored column at the limit moved with an offset, or the step's window past it: outside the row.
    let e = pre(&[4], &[4], &[2], &[i64::MAX], &bt, 8).unwrap_err();
    assert!(e.message.contains("columns 9223372036854775807 ..= 9223372036854775807 are outside"), "{}", e.message);
    let e = pre(&[i64::MAX - 3], &[4], &[1], &[-1], &bt, 8).unwrap_err();
    assert!(e.message.contains("add up past 2**63 - 1"), "{}", e.message);
    let inp = PostInputs { state_col: &[-(1 << 61)], num_computed: &[i64::MAX], num_scheduled: &[2], num_draft: &[0], num_accepted: &[1] };
    let e = post_process(&inp, &[GroupTable { ids: &bt, cols: 8 }], &CFG, &row_name).unwrap_err();
    assert!(e.message.contains("num_computed = 9223372036854775807 and num_scheduled = 2 add up"), "{}", e.message);
}
