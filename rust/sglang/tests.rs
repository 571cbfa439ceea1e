use super::*;

const SIZES: CommitSizes = CommitSizes { num_slots: 8, num_rows: 4, draft: 3 };

fn pass<'a>(slots: &'a [i64], steps: &'a [i64]) -> CommitPass<'a> {
    CommitPass { name: "commit", slots, steps }
}

#[test]
fn padding_rows_are_skipped() {
    let got = commit_selection(&[pass(&[3, -1, 5, 6], &[2, 1, -1, 0])], None, SIZES).unwrap();
    assert_eq!(got, vec![vec![0, 3]]);
}

#[test]
fn source_rows_are_checked() {
    let rows = [1, 9];
    let e = commit_selection(&[pass(&[1, 2], &[0, 0])], Some(&rows), SIZES).unwrap_err();
    assert!(e.message.contains("request 1: scratch row 9 is outside 0..3"), "{}", e.message);
}

#[test]
fn refusals_name_the_request() {
    for (slots, steps, want) in [
        (&[1i64, 2][..], &[3i64, 0][..], "request 0: step 3 is past the draft (0..2)"),
        (&[1, 8], &[0, 0], "request 1: slot 8 is outside 0..7"),
        (&[4, 4], &[0, 1], "two requests write one slot"),
        (&[1, 2], &[0], "one length"),
    ] {
        let e = commit_selection(&[pass(slots, steps)], None, SIZES).unwrap_err();
        assert!(e.message.contains(want), "{} / {want}", e.message);
    }
}

#[test]
fn each_pass_is_checked_on_its_own() {
    let track = CommitPass { name: "track", slots: &[1, 2], steps: &[0, 0] };
    let got = commit_selection(&[pass(&[1, 2], &[1, -1]), track], None, SIZES).unwrap();
    assert_eq!(got, vec![vec![0], vec![0, 1]]);
}

#[test]
fn host_copies_keep_the_pool_dtype_and_shape() {
    check_host_copy("temporal", "float32", &[2, 9, 4], "float32", &[2, 3, 4], 3).unwrap();
    let e = check_host_copy("temporal", "float32", &[2, 9, 4], "bfloat16", &[2, 3, 4], 3).unwrap_err();
    assert!(e.message.contains("the host copy is bfloat16 [2, 3, 4], the pool needs float32 [2, 3, 4]"), "{}", e.message);
    assert!(check_host_copy("conv[0]", "bfloat16", &[2, 9, 4], "bfloat16", &[2, 2, 4], 3).is_err());
}
