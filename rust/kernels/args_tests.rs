//! Tests of the launch-argument checks.
use super::*;

fn arg(dtype: &str, shape: &[i64], device: &str) -> TensorDesc {
    TensorDesc::dense(0x10_0000, dtype, shape, device)
}

const I32: [IntType; 1] = [IntType::I32];

#[test]
fn vectors_and_tables() {
    let v = int_vector(&arg("torch.int32", &[5], "cuda:0"), "src_col", 5, &I32, ErrorKind::Binding).unwrap();
    assert_eq!((v.ptr, v.len, v.dtype), (0x10_0000, 5, IntType::I32));
    let e = int_vector(&arg("int64", &[5], "cuda:0"), "src_col", 5, &I32, ErrorKind::Binding).unwrap_err();
    assert_eq!((e.kind, e.message.as_str()), (ErrorKind::Binding, "src_col: expected int32, got int64"));
    let e = int_vector(&arg("int32", &[2], "cuda:0"), "err", 3, &I32, ErrorKind::Plan).unwrap_err().message;
    assert!(e.contains("err: expected a 1-D vector of at least 3 elements, got shape [2]"), "{e}");
    let mut strided = arg("int32", &[4], "cuda:0");
    strided.strides[0] = 8;
    assert!(int_vector(&strided, "x", 1, &I32, ErrorKind::Plan).unwrap_err().message.contains("contiguous"));
    strided.shape[0] = 1; // one element: the stride does not matter
    assert!(int_vector(&strided, "x", 1, &I32, ErrorKind::Plan).is_ok());
    let e = int_vector(&arg("int32", &[4], "cpu"), "num_accepted", 1, &I32, ErrorKind::Binding).unwrap_err().message;
    assert_eq!(e, "num_accepted: expected a CUDA tensor, got a tensor on cpu");

    let mut t = arg("int32", &[6, 4], "cuda:0");
    t.strides[0] = 4 * 16; // a padded row
    let bt = block_table(&t, &I32, ErrorKind::Binding).unwrap();
    assert_eq!((bt.rows, bt.cols, bt.row_stride), (6, 4, 16));
    t.strides[1] = 8;
    assert!(block_table(&t, &I32, ErrorKind::Binding).unwrap_err().message.contains("column axis must be contiguous"));
    let e = block_table(&arg("int32", &[6], "cuda:0"), &I32, ErrorKind::Binding).unwrap_err().message;
    assert!(e.contains("expected a 2-D [requests, cols] tensor"), "{e}");
}

#[test]
fn group_tables() {
    let dev = Device::Cuda(0);
    let (a, b) = (arg("int32", &[4, 8], "cuda:0"), arg("int32", &[5, 8], "cuda:0"));
    assert!(check_group_tables(&dev, &[a.clone(), b.clone()], 2, 4).is_ok());
    let e = check_group_tables(&dev, std::slice::from_ref(&a), 2, 4).unwrap_err();
    assert_eq!(e.message, "1 device block tables for 2 recurrent groups");
    let e = check_group_tables(&dev, &[a.clone(), b.clone()], 2, 5).unwrap_err();
    assert_eq!(e.message, "group 0's device block table has 4 rows for 5 requests");
    let e = check_group_tables(&dev, &[a.clone(), arg("int32", &[4, 9], "cuda:0")], 2, 4).unwrap_err();
    assert!(e.message.starts_with("group 1's device block table is [.., 9] int32, group 0's [.., 8] int32"), "{}", e.message);
    let e = check_group_tables(&dev, &[a, arg("int32", &[4, 8], "cpu")], 2, 4).unwrap_err();
    assert!(e.message.starts_with("group 1's device block table: expected a CUDA tensor"), "{}", e.message);
}

#[test]
fn step_args() {
    let dev = Device::Cuda(0);
    let (bt, src, dst, acc, err) = (
        arg("torch.int32", &[8, 5], "cuda:0"),
        arg("torch.int32", &[6], "cuda:0"),
        arg("torch.int32", &[6], "cuda:0"),
        arg("torch.int32", &[6], "cuda:0"),
        arg("torch.int32", &[3], "cuda:0"),
    );
    let step = |bt: &TensorDesc, vs: Vec<(&'static str, TensorDesc)>, err: Option<&TensorDesc>| {
        let vectors: Vec<(&str, &TensorDesc)> = vs.iter().map(|(n, a)| (*n, a)).collect();
        check_step_args(&dev, &StepArgs { block_table: bt, vectors, err, out: None, block_size: None, groups: 1 }, StepCheck::ForLaunch)
            .map(|c| c.requests)
            .map_err(|e| e.message)
    };
    let ok = vec![("src_col", src.clone()), ("dst_col", dst.clone()), ("num_accepted", acc.clone())];
    assert_eq!(step(&bt, ok.clone(), Some(&err)), Ok(6));
    let short = vec![("src_col", src.clone()), ("dst_col", arg("int32", &[5], "cuda:0"))];
    assert_eq!(step(&bt, short, None), Err("dst_col has 5 elements but src_col has 6".into()));
    let e = step(&arg("int32", &[4, 5], "cuda:0"), ok.clone(), None).unwrap_err();
    assert_eq!(e, "block_table has 4 rows for 6 requests");
    let e = step(&bt, vec![("src_col", arg("int32", &[6], "cpu"))], None).unwrap_err();
    assert!(e.starts_with("src_col: expected a CUDA tensor on cuda:0, got a tensor on cpu;"), "{e}");
    let e = step(&bt, vec![("src_col", arg("int32", &[6], "cuda:1"))], None).unwrap_err();
    assert_eq!(e, "src_col is on cuda:1 but the planner's states are on cuda:0");
    let e = step(&bt, vec![("num_accepted", arg("torch.bfloat16", &[6], "cuda:0"))], None).unwrap_err();
    assert_eq!(e, "num_accepted: expected int32, got torch.bfloat16");
    let e = step(&bt, vec![("num_accepted", arg("torch.int64", &[6], "cuda:0"))], None).unwrap_err();
    assert_eq!(e, "num_accepted: expected int32, got torch.int64");
    let mut strided = arg("torch.int32", &[6], "cuda:0");
    strided.strides = vec![8];
    assert!(step(&bt, vec![("src_col", strided)], None).unwrap_err().contains("contiguous"));
    let e = step(&bt, ok.clone(), Some(&arg("int64", &[3], "cuda:0"))).unwrap_err();
    assert_eq!(e, "err: expected int32, got int64");
    let e = check_step_args(
        &Device::Cpu,
        &StepArgs { block_table: &bt, vectors: vec![], err: None, out: None, block_size: None, groups: 1 },
        StepCheck::BeforeNarrowing,
    )
    .unwrap_err();
    assert!(e.message.contains("on the host"), "{}", e.message);
    let e = check_step_args(
        &dev,
        &StepArgs { block_table: &bt, vectors: vec![], err: None, out: None, block_size: Some(0), groups: 1 },
        StepCheck::BeforeNarrowing,
    )
    .unwrap_err();
    assert_eq!(e.message, "block_size must be in [1, 2**31), got 0");
    let c = check_step_args(
        &dev,
        &StepArgs { block_table: &bt, vectors: vec![("src_col", &src)], err: Some(&err), out: None, block_size: None, groups: 1 },
        StepCheck::ForLaunch,
    )
    .unwrap();
    let wide = arg("torch.int64", &[6], "cuda:0");
    let step = StepArgs { block_table: &bt, vectors: vec![("src_col", &wide)], err: None, out: None, block_size: None, groups: 1 };
    assert_eq!(check_step_args(&dev, &step, StepCheck::BeforeNarrowing).map(|c| c.requests), Ok(6));
    let mut strided = arg("torch.int64", &[6], "cuda:0");
    strided.strides = vec![16];
    let before = StepArgs { vectors: vec![("src_col", &strided)], ..step.clone() };
    assert_eq!(check_step_args(&dev, &before, StepCheck::BeforeNarrowing).map(|c| c.requests), Ok(6));
    let e = check_step_args(&dev, &StepArgs { vectors: vec![("x", &arg("torch.float32", &[6], "cuda:0"))], ..step }, StepCheck::BeforeNarrowing)
        .unwrap_err();
    assert_eq!(e.message, "x: expected int32 or int64, got torch.float32");
    assert_eq!((c.table.rows, c.table.cols, c.vectors.len(), c.err.map(|e| e.len)), (8, 5, 1, Some(3)));
}

#[test]
fn commit_rows() {
    let dev = Device::Cuda(0);
    let bytes = arg("torch.uint8", &[6 * 32], "cuda:0");
    let mut bytes = bytes;
    bytes.strides = vec![1];
    assert_eq!(check_commit_rows(&dev, &bytes, None), Ok(6));
    assert_eq!(check_commit_rows(&dev, &bytes, Some(4)), Ok(4));
    let e = check_commit_rows(&dev, &bytes, Some(7)).unwrap_err().message;
    assert_eq!(e, "rows: expected at least 7 commit rows (32 bytes each), got a tensor of 192 bytes");
    assert_eq!(check_commit_rows(&dev, &arg("torch.int64", &[6, 4], "cuda:0"), None), Ok(6));
    let mut strided = arg("torch.int64", &[6, 4], "cuda:0");
    strided.strides = vec![64, 8];
    assert!(check_commit_rows(&dev, &strided, None).unwrap_err().message.contains("contiguous"));
    let e = check_commit_rows(&dev, &arg("torch.int64", &[6, 4], "cuda:1"), None).unwrap_err().message;
    assert_eq!(e, "rows are on cuda:1, the cache on cuda:0");
    let e = check_commit_rows(&dev, &arg("torch.complex64", &[6], "cuda:0"), None).unwrap_err().message;
    assert_eq!(e, "rows: expected a byte or integer tensor, got torch.complex64");
}

#[test]
fn commit_counts() {
    let dev = Device::Cuda(0);
    assert!(check_commit_counts(&dev, &arg("torch.int64", &[8], "cuda:0"), 6).is_ok());
    assert!(check_commit_counts(&dev, &arg("torch.int16", &[8], "cuda:0"), 6).is_ok());
    let e = check_commit_counts(&dev, &arg("torch.int32", &[8], "cpu"), 6).unwrap_err().message;
    assert_eq!(e, "num_accepted is on cpu, the cache on cuda:0");
    let e = check_commit_counts(&dev, &arg("torch.int32", &[5], "cuda:0"), 6).unwrap_err().message;
    assert!(e.starts_with("num_accepted must be [B] with one count per request (6 at least)"), "{e}");
    let e = check_commit_counts(&dev, &arg("torch.float32", &[8], "cuda:0"), 6).unwrap_err().message;
    assert_eq!(e, "num_accepted: expected an integer tensor, got torch.float32");
}
