use super::*;
use crate::tensor::TensorDesc;

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
    assert!(e.message.contains("src_indices[1] = 9: the scratch row is outside 0 ..= 3"), "{}", e.message);
}

#[test]
fn refusals_name_the_request() {
    for (slots, steps, want) in [
        (&[1i64, 2][..], &[3i64, 0][..], "last_correct_step_indices[0] = 3 is past the draft (0 ..= 2)"),
        (&[1, 8], &[0, 0], "state_indices[1] = 8 is outside the pool's slots 0 ..= 7"),
        (&[4, 4], &[0, 1], "two requests write one slot"),
        (&[1, 2], &[0], "one length"),
        (&[1, -2], &[0, 0], "state_indices[1] = -2: the only negative value allowed is -1"),
        (&[1, 2], &[0, -7], "last_correct_step_indices[1] = -7: the only negative value allowed is -1"),
    ] {
        let e = commit_selection(&[pass(slots, steps)], None, SIZES).unwrap_err();
        assert!(e.message.starts_with("commit_after_verify: "), "{}", e.message);
        assert!(e.message.contains(want), "{} / {want}", e.message);
    }
}

#[test]
fn padded_rows_may_repeat_the_dummy_slot_and_write_nothing() {
    // Three padded rows on the dummy slot 0 with accepted steps: none writes, none is a duplicate.
    let got = commit_selection(&[pass(&[3, 0, 0, 0, 2], &[1, 0, 2, 1, 0])], Some(&[0, 1, 2, 3, 3]), SIZES).unwrap();
    assert_eq!(got, vec![vec![0, 4]]);
    // A real slot named twice is still refused.
    let e = commit_selection(&[pass(&[3, 0, 3], &[1, 0, 0])], None, SIZES).unwrap_err();
    assert!(e.message.contains("state_indices[2] = 3 is written by an earlier request too"), "{}", e.message);
}

#[test]
fn each_pass_is_checked_on_its_own() {
    let track = CommitPass { name: "track", slots: &[1, 2], steps: &[0, 0] };
    let got = commit_selection(&[pass(&[1, 2], &[1, -1]), track], None, SIZES).unwrap();
    assert_eq!(got, vec![vec![0], vec![0, 1]]);
    let track = CommitPass { name: "track", slots: &[1, -3], steps: &[0, 0] };
    let e = commit_selection(&[pass(&[1, 2], &[1, -1]), track], None, SIZES).unwrap_err();
    assert!(e.message.contains("track_indices[1] = -3"), "{}", e.message);
}

fn host(dtype: &str, shape: &[i64], device: &str) -> TensorDesc {
    TensorDesc::dense(4096, dtype, shape, device)
}

#[test]
fn host_copies_keep_the_pool_dtype_and_shape() {
    let pool = host("torch.float32", &[2, 9, 4], "cpu");
    check_host_copy("temporal", &pool, &host("torch.float32", &[2, 3, 4], "cpu"), 3).unwrap();
    let e = check_host_copy("temporal", &pool, &host("torch.bfloat16", &[2, 3, 4], "cpu"), 3).unwrap_err();
    assert!(e.message.contains("the host copy is bfloat16 [2, 3, 4], the pool needs float32 [2, 3, 4]"), "{}", e.message);
    assert!(check_host_copy("conv[0]", &pool, &host("float32", &[2, 2, 4], "cpu"), 3).is_err());
    let e = check_host_copy("conv[0]", &pool, &host("float32", &[2, 3, 4], "meta"), 3).unwrap_err();
    assert!(e.message.contains("load_cpu_copy: conv[0]: the host copy is on meta"), "{}", e.message);
}

#[test]
fn slot_ids_are_refused_negative_dummy_outside_or_repeated() {
    check_slots("clear_slots", "indices", &[1, 7, 7], 8, Repeats::Allowed).unwrap();
    for (ids, repeats, want) in [
        (&[3i64, -1][..], Repeats::Allowed, "clear_slots: indices[1] = -1: a negative slot id is refused"),
        (&[0], Repeats::Allowed, "clear_slots: indices[0] = 0 is the dummy slot"),
        (&[8], Repeats::Allowed, "clear_slots: indices[0] = 8 is outside the pool's slots 1 ..= 7"),
        (&[2, 2], Repeats::Refused, "clear_slots: indices[1] = 2 is named twice"),
    ] {
        let e = check_slots("clear_slots", "indices", ids, 8, repeats).unwrap_err();
        assert!(e.message.contains(want), "{} / {want}", e.message);
    }
}

#[test]
fn pool_tensors_share_one_layer_count_and_no_memory() {
    let conv = TensorDesc::dense(0x1000, "float32", &[2, 9, 4], "cpu");
    let temporal = TensorDesc::dense(0x10000, "float32", &[2, 9, 8], "cpu");
    let ok = [("conv[0]".to_string(), &conv), ("temporal".to_string(), &temporal)];
    check_pool(&ok).unwrap();
    let three = TensorDesc::dense(0x10000, "float32", &[3, 9, 8], "cpu");
    let e = check_pool(&[("conv[0]".into(), &conv), ("temporal".into(), &three)]).unwrap_err();
    assert!(e.message.contains("temporal has 3 layers, conv[0] has 2"), "{}", e.message);
    let e = check_pool(&[("conv[0]".into(), &conv), ("conv[1]".into(), &conv)]).unwrap_err();
    assert!(e.message.contains("conv[1] and conv[0] share memory"), "{}", e.message);
    // The same addresses on another device are other memory; an empty tensor spans nothing.
    let other = TensorDesc::dense(0x1000, "float32", &[2, 9, 4], "cuda:0");
    let empty = TensorDesc::dense(0x1000, "float32", &[0], "cpu");
    check_pool(&[("conv[0]".into(), &conv), ("conv[1]".into(), &other), ("temporal".into(), &empty)]).unwrap();
}

mod slot_kernel {
    use crate::sglang::kernel::{slot_launch, slot_table, SlotCall, SlotPool, KERNEL_NAMES};
    use crate::tensor::{Device, TensorDesc};

    fn t(ptr: u64, dtype: &str, shape: &[i64], strides: &[i64]) -> TensorDesc {
        TensorDesc::new(ptr, dtype, shape.to_vec(), strides.to_vec(), "cuda:0")
    }

    /// A bf16 conv pool [2 layers, 9 slots, 8 dim, 3 cols] and SGLang's deduplicated window view of
    /// a [2, 5 rows, 4 + 2, 8] buffer: [2, 5, 4, 8, 3] with strides (.., .., dim, 1, dim) elements.
    fn conv_and_dedup() -> (TensorDesc, TensorDesc) {
        let conv = t(4096, "bfloat16", &[2, 9, 8, 3], &[9 * 48, 48, 6, 2]);
        let (s2, s1) = (16, 6 * 16);
        let win = t(1 << 20, "bfloat16", &[2, 5, 4, 8, 3], &[5 * s1, s1, s2, 2, s2]);
        (conv, win)
    }

    #[test]
    fn one_record_per_layer_with_the_scratch_entry_as_a_strided_matrix() {
        let (conv, win) = conv_and_dedup();
        let recs = slot_table(std::slice::from_ref(&conv), &[Some(win)]).unwrap();
        assert_eq!(recs.len(), 2);
        let r = recs[1];
        assert_eq!((r.dst, r.dst_slot_stride, r.bytes, r.elem_bytes), (4096 + 9 * 48, 48, 48, 2));
        assert_eq!((r.src, r.src_row_stride, r.src_step_stride), ((1 << 20) + 5 * 96, 96, 16));
        assert_eq!((r.rows, r.cols, r.src_pitch, r.src_col_stride), (8, 3, 2, 16));
        let clear = slot_table(&[conv], &[None]).unwrap();
        assert_eq!((clear[0].src, clear[0].rows, clear[0].cols), (0, 1, 24));
    }

    #[test]
    fn scratch_of_another_dtype_or_shape_and_strided_slots_are_refused() {
        let (conv, win) = conv_and_dedup();
        let mut f32win = win.clone();
        f32win.dtype = "float32".into();
        let e = slot_table(std::slice::from_ref(&conv), &[Some(f32win)]).unwrap_err();
        assert!(e.message.contains("verify scratch of state tensor 0"), "{}", e.message);
        let strided = t(4096, "bfloat16", &[2, 9, 8, 3], &[9 * 96, 96, 12, 2]);
        let e = slot_table(&[strided], &[None]).unwrap_err();
        assert!(e.message.contains("must be dense"), "{}", e.message);
        let host = TensorDesc::new(4096, "bfloat16", vec![2, 9, 8, 3], vec![432, 48, 6, 2], "cpu");
        assert!(slot_table(&[host], &[None]).is_err());
    }

    #[test]
    fn launches_check_their_vectors() {
        let dev = Device::Cuda(0);
        let slots = TensorDesc::dense(64, "int64", &[3], "cuda:0");
        let steps = TensorDesc::dense(128, "int64", &[2], "cuda:0");
        let err = TensorDesc::dense(256, "int32", &[3], "cuda:0");
        let call = SlotCall { slots: &slots, steps: Some(&steps), rows: None, track_slots: None, track_steps: None, err: &err, names: KERNEL_NAMES };
        let pool = |num_rows, draft| SlotPool { device: &dev, metas: 8, num_meta: 4, max_bytes: 96, num_slots: 9, num_rows, draft };
        let e = slot_launch(&pool(5, 4), &call).unwrap_err();
        assert!(e.message.contains("steps has 2 elements, slots has 3"), "{}", e.message);
        let clear = SlotCall { steps: None, ..call };
        let l = slot_launch(&pool(0, 0), &clear).unwrap().unwrap();
        assert_eq!((l.grid, l.kernel.name), ([1, 3, 4], "rs_slot_scatter"));
        let i32slots = TensorDesc::dense(64, "int32", &[3], "cuda:0");
        assert!(slot_launch(&pool(0, 0), &SlotCall { slots: &i32slots, ..clear }).is_err());
    }
}

mod host_copy {
    use crate::layout::ConvLayout;
    use crate::sglang::hicache::{Direction, HostCopy};
    use crate::sglang::kernel::SlotCopy;
    use crate::sglang::pool::Pool;
    use crate::tensor::TensorDesc;

    const BUF: u64 = 0x100_0000;

    fn states() -> Vec<TensorDesc> {
        vec![TensorDesc::dense(0x1000, "bfloat16", &[2, 6, 3, 4], "cuda:0"), TensorDesc::dense(0x8000, "float32", &[2, 6, 5], "cuda:0")]
    }

    fn record(bytes: &[u8], at: usize) -> [u64; 6] {
        let word = |i: usize| u64::from_le_bytes(bytes[at + 8 * i..at + 8 * i + 8].try_into().unwrap());
        [word(0), word(1), word(2), word(3), word(4), word(5)] // dst, dst stride, src, row stride, step stride, bytes
    }

    fn ints(bytes: &[u8], at: usize, n: usize) -> Vec<i64> {
        (0..n).map(|i| i64::from_le_bytes(bytes[at + 8 * i..at + 8 * i + 8].try_into().unwrap())).collect()
    }

    #[test]
    fn a_get_gathers_each_state_into_its_aligned_block_after_which_the_table_and_indices_follow() {
        let c = HostCopy::new(Direction::Get, states(), vec![4, 1, 5], 6).unwrap();
        let sizes: Vec<(u64, u64, Vec<i64>)> = c.blocks.iter().map(|b| (b.offset, b.bytes, b.shape.clone())).collect();
        assert_eq!(sizes, vec![(0, 2 * 3 * 24, vec![2, 3, 3, 4]), (144, 2 * 3 * 20, vec![2, 3, 5])]);
        assert_eq!(c.staged_at, 272, "the blocks end 16-byte aligned");
        let rec = std::mem::size_of::<SlotCopy>();
        let vectors = c.staged_at as usize + (4 * rec).div_ceil(16) * 16;
        assert_eq!(c.total as usize, vectors + 3 * 32);
        let staged = c.stage(BUF, &[]).unwrap();
        assert_eq!(staged.len() as u64, c.total - c.staged_at);
        // Layer 1 of the temporal state: into its block (3 slots of 20 bytes), from the pool's slots.
        let [dst, dst_stride, src, row_stride, _, bytes] = record(&staged, 3 * rec);
        assert_eq!((dst, dst_stride, src, row_stride, bytes), (BUF + 144 + 60, 20, 0x8000 + 6 * 20, 20, 20));
        let at = vectors - c.staged_at as usize;
        assert_eq!([ints(&staged, at, 3), ints(&staged, at + 32, 3), ints(&staged, at + 64, 3)], [vec![0, 1, 2], vec![0, 0, 0], vec![4, 1, 5]]);
        let err = TensorDesc::dense(0x9_0000, "int32", &[3], "cuda:0");
        let l = c.launch(BUF, &err).unwrap().expect("a launch");
        let v: std::collections::HashMap<_, _> = l.values().into_iter().collect();
        assert_eq!(
            (v["metas"], v["slots"], v["num_slots"], v["num_rows"], v["num_meta"]),
            ((BUF + 272) as i128, (BUF as usize + vectors) as i128, 3, 6, 4)
        );
    }

    #[test]
    fn a_load_stages_the_host_copies_dense_or_strided() {
        let n = 2;
        let conv: Vec<u16> = (0..2 * n * 12).map(|i| i as u16).collect();
        // The temporal host copy as a transposed view of a [5, 2, 2] buffer: element (l, s, k) is k * 4 + l * 2 + s.
        let buf: Vec<f32> = (0..20).map(|i| i as f32).collect();
        let host_conv = TensorDesc::dense(conv.as_ptr() as u64, "bfloat16", &[2, 2, 3, 4], "cpu");
        let host_temporal = TensorDesc::new(buf.as_ptr() as u64, "float32", vec![2, 2, 5], vec![8, 4, 16], "cpu");
        let c = HostCopy::new(Direction::Load, states(), vec![3, 2], 6).unwrap();
        assert_eq!(c.staged_at, 0);
        let staged = c.stage(BUF, &[host_conv, host_temporal]).unwrap();
        let conv_bytes: Vec<u8> = conv.iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(&staged[..96], &conv_bytes[..]);
        let want: Vec<u8> =
            (0..2).flat_map(|l| (0..2).flat_map(move |s| (0..5).map(move |k| (k * 4 + l * 2 + s) as f32))).flat_map(f32::to_le_bytes).collect();
        assert_eq!(&staged[96..176], &want[..], "the strided host copy in C order");
        let bad = TensorDesc::dense(conv.as_ptr() as u64, "bfloat16", &[2, 2, 3, 4], "cuda:0");
        assert!(c.stage(BUF, &[bad, TensorDesc::dense(0, "float32", &[2, 2, 5], "cpu")]).is_err());
        assert_eq!(HostCopy::new(Direction::Load, states(), vec![], 6).unwrap().total, 0, "nothing moves");
    }

    #[test]
    fn a_load_refuses_host_copies_of_the_right_bytes_but_another_dtype_or_shape() {
        // Each refused copy spans exactly its block's bytes: only its dtype or shape is wrong.
        let conv: Vec<u16> = vec![0; 2 * 2 * 12];
        let temporal: Vec<f32> = vec![0.0; 2 * 2 * 5];
        let (c_at, t_at) = (conv.as_ptr() as u64, temporal.as_ptr() as u64);
        let c = HostCopy::new(Direction::Load, states(), vec![3, 2], 6).unwrap();
        let good_temporal = TensorDesc::dense(t_at, "float32", &[2, 2, 5], "cpu");
        let refused = |host: [TensorDesc; 2]| c.stage(BUF, &host).unwrap_err().message;
        let m = refused([TensorDesc::dense(c_at, "float16", &[2, 2, 3, 4], "cpu"), good_temporal.clone()]);
        assert_eq!(m, "load_cpu_copy: conv[0]: the host copy is float16 [2, 2, 3, 4], the pool needs bfloat16 [2, 2, 3, 4]");
        let m = refused([TensorDesc::dense(c_at, "bfloat16", &[2, 2, 4, 3], "cpu"), good_temporal]);
        assert!(m.contains("conv[0]: the host copy is bfloat16 [2, 2, 4, 3]"), "{m}");
        let m = refused([TensorDesc::dense(c_at, "bfloat16", &[2, 2, 3, 4], "cpu"), TensorDesc::dense(t_at, "int32", &[2, 2, 5], "cpu")]);
        assert!(m.contains("temporal: the host copy is int32 [2, 2, 5], the pool needs float32 [2, 2, 5]"), "{m}");
        let m = refused([TensorDesc::dense(c_at, "bfloat16", &[2, 2, 3, 4], "cpu"), TensorDesc::dense(t_at, "float32", &[2, 5, 2], "cpu")]);
        assert!(m.contains("temporal: the host copy is float32 [2, 5, 2]"), "{m}");
    }

    #[test]
    fn the_pool_pairs_each_state_with_its_scratch_and_refuses_what_it_lacks() {
        let [conv, temporal] = <[TensorDesc; 2]>::try_from(states()).unwrap();
        let ssm = TensorDesc::dense(0x10_0000, "float32", &[2, 3, 4, 5], "cuda:0");
        let pool = Pool::new(vec![conv.clone()], temporal.clone(), None, None, ConvLayout::DS).unwrap();
        assert_eq!((pool.live(), pool.num_slots), (vec![0, 1], 6));
        assert!(pool.verify_scratch().unwrap_err().message.contains("no intermediate_ssm"));
        let pool = Pool::new(vec![conv.clone()], temporal.clone(), Some(ssm.clone()), None, ConvLayout::DS).unwrap();
        assert!(pool.verify_scratch().unwrap_err().message.contains("no intermediate_conv_window per conv tensor"));
        let window = TensorDesc::dense(0x20_0000, "bfloat16", &[2, 3, 4, 3, 4], "cuda:0");
        let pool = Pool::new(vec![conv.clone()], temporal.clone(), Some(ssm), Some(vec![window]), ConvLayout::DS).unwrap();
        assert_eq!(pool.verify_scratch().unwrap(), vec![(1, 0), (0, 1)]);
        assert_eq!(pool.commit_moves(&[2, 0, 5], &[3, 1, -1], Some(&[1, 0, 2]), (None, None)).unwrap(), vec![(2, 1, 3)]);
        assert!(pool.commit_moves(&[2], &[4], None, (None, None)).unwrap_err().message.contains("past the draft (0 ..= 3)"));
        assert_eq!(pool.slot_table(true).unwrap().records.len(), 4);
        let two =
            Pool::new(vec![conv.clone(), TensorDesc::dense(0x30_0000, "bfloat16", &[2, 6, 3, 4], "cuda:0")], temporal, None, None, ConvLayout::DS)
                .unwrap();
        assert!(two.check_transfer().unwrap_err().message.contains("this pool has 2"));
        assert!(pool.check_transfer().is_ok());
    }
}

mod host_states {
    use crate::sglang::hicache::{Direction, HostCopy};
    use crate::sglang::host;
    use crate::tensor::TensorDesc;

    /// A host tensor over `v` (f32).
    fn over(v: &mut [f32], shape: &[i64]) -> TensorDesc {
        TensorDesc::dense(v.as_mut_ptr() as u64, "float32", shape, "cpu")
    }

    #[test]
    fn clear_zeroes_the_slots_of_every_layer_and_refuses_before_writing() {
        // [layers 2, slots 4, 3]
        let mut v: Vec<f32> = (1..=24).map(|x| x as f32).collect();
        let t = over(&mut v, &[2, 4, 3]);
        let before = v.clone();
        assert!(host::clear(std::slice::from_ref(&t), &[1, 4]).unwrap_err().message.contains("slot 4 is outside 0 ..= 3"));
        let read_only = TensorDesc { writable: false, ..t.clone() };
        assert!(host::clear(&[read_only], &[1]).unwrap_err().message.contains("read-only"));
        assert_eq!(v, before, "a refused clear writes nothing");
        host::clear(&[t], &[1, 3, 1]).unwrap();
        let zeroed: Vec<usize> = (0..24).filter(|&i| v[i] == 0.0).collect();
        assert_eq!(zeroed, vec![3, 4, 5, 9, 10, 11, 15, 16, 17, 21, 22, 23]);
    }

    #[test]
    fn commit_copies_strided_scratch_entries_in_c_order() {
        // State [layers 2, slots 3, 2, 2]; scratch [2, rows 2, draft 2, 2, 2] seen transposed in its last two axes.
        let mut state = vec![0f32; 2 * 3 * 4];
        let mut scratch: Vec<f32> = (0..2 * 2 * 2 * 4).map(|x| x as f32).collect();
        let st = over(&mut state, &[2, 3, 2, 2]);
        let sc = TensorDesc::new(scratch.as_mut_ptr() as u64, "float32", vec![2, 2, 2, 2, 2], vec![64, 32, 16, 4, 8], "cpu");
        host::commit(&[(&st, &sc)], &[(2, 1, 0)]).unwrap();
        // Layer l, row 1, step 0 starts at element l * 16 + 8; element (a, b) of the entry is at a + 2 * b.
        let want: Vec<f32> = (0..2).flat_map(|l| [0, 2, 1, 3].map(|d| (l * 16 + 8 + d) as f32)).collect();
        assert_eq!([&state[8..12], &state[20..24]].concat(), want);
        assert!(state[..8].iter().chain(&state[12..20]).all(|&x| x == 0.0));
        let m = host::commit(&[(&st, &sc)], &[(1, 2, 0)]).unwrap_err().message;
        assert!(m.contains("row 2 is outside 0 ..= 1"), "{m}");
    }

    #[test]
    fn get_then_load_moves_the_slots_through_dense_blocks() {
        let mut v: Vec<f32> = (0..2 * 4 * 3).map(|x| x as f32).collect();
        let t = over(&mut v, &[2, 4, 3]);
        let get = HostCopy::new(Direction::Get, vec![t.clone()], vec![3, 1], 4).unwrap();
        let mut buf = vec![0u8; get.total as usize];
        host::get(&get, std::slice::from_ref(&t), &[3, 1], &mut buf).unwrap();
        let got: Vec<f32> = buf[..48].chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        assert_eq!(got, [9., 10., 11., 3., 4., 5., 21., 22., 23., 15., 16., 17.]);
        // The same block loaded into slots 2 and 3 (slot 3 is read before it is written).
        let host_copy = TensorDesc::dense(buf.as_ptr() as u64, "float32", &[2, 2, 3], "cpu");
        let load = HostCopy::new(Direction::Load, vec![t.clone()], vec![2, 3], 4).unwrap();
        host::load(&load, std::slice::from_ref(&t), &[2, 3], &[host_copy]).unwrap();
        assert_eq!(&v[6..12], &[9., 10., 11., 3., 4., 5.]);
        assert_eq!(&v[18..24], &[21., 22., 23., 15., 16., 17.]);
        assert!(host::get(&get, &[t], &[3, 1], &mut buf[..16]).is_err(), "a buffer shorter than the call");
    }
}

#[test]
fn a_device_copy_takes_int32_vectors_of_one_length_on_the_pool_s_device_and_no_more_than_its_slots() {
    let dev = crate::tensor::Device::Cuda(0);
    let v = |dtype: &str, n: i64, device: &str| TensorDesc::dense(0x1000, dtype, &[n], device);
    assert_eq!(checks::copy_count(&v("int32", 3, "cuda:0"), &v("int32", 3, "cuda:0"), &dev, 8).unwrap(), 3);
    assert_eq!(checks::copy_count(&v("int32", 7, "cuda:0"), &v("int32", 7, "cuda:0"), &dev, 8).unwrap(), 7);
    for (src, dst, want) in [
        (v("int32", 8, "cuda:0"), v("int32", 8, "cuda:0"), "8 copies into a pool of 7 slots (1 ..= 7): some slot would be written twice"),
        (v("int32", 2, "cuda:0"), v("int32", 3, "cuda:0"), "src_indices has 2 slot ids, dst_indices 3"),
        (v("int64", 2, "cuda:0"), v("int32", 2, "cuda:0"), "copy_from: src_indices: expected int32, got int64"),
        (v("int32", 2, "cuda:0"), v("int32", 2, "cuda:1"), "copy_from: dst_indices is on cuda:1, the pool's states on cuda:0"),
        (v("int32", 2, "cpu"), v("int32", 2, "cuda:0"), "copy_from: src_indices is on cpu"),
        (TensorDesc::new(0x1000, "int32", vec![2], vec![8], "cuda:0"), v("int32", 2, "cuda:0"), "src_indices: must be contiguous"),
    ] {
        let e = checks::copy_count(&src, &dst, &dev, 8).unwrap_err();
        assert!(e.message.contains(want), "{}", e.message);
    }
    let up = |dtype: &str, n: i64, at: u64| TensorDesc::dense(at, dtype, &[n], "cuda:0");
    assert!(checks::check_uploaded("copy_from", &up("uint8", 64, 0x1000), &dev, 64).is_ok());
    for bad in [up("uint8", 60, 0x1000), up("int32", 16, 0x1000), up("uint8", 64, 0x1002)] {
        let e = checks::check_uploaded("copy_from", &bad, &dev, 64).unwrap_err();
        assert!(e.message.contains("expected 64 contiguous, 4-byte aligned uint8 on cuda:0"), "{}", e.message);
    }
}

#[test]
fn a_host_copy_buffer_is_a_writable_int32_vector_of_its_own_on_the_pool_s_device() {
    let dev = crate::tensor::Device::Cuda(0);
    let pool_t = TensorDesc::dense(0x10000, "float32", &[2, 8, 4], "cuda:0");
    let pool = [("temporal", &pool_t)];
    let buf = |dtype: &str, n: i64, at: u64, device: &str| TensorDesc::dense(at, dtype, &[n], device);
    assert!(checks::check_copy_buffer("get_cpu_copy", &buf("int32", 16, 0x1000, "cuda:0"), &dev, 64, &pool).is_ok());
    // the pool's memory on another device is another memory
    assert!(checks::check_copy_buffer("get_cpu_copy", &buf("int32", 16, 0x10000, "cuda:1"), &crate::tensor::Device::Cuda(1), 64, &pool).is_ok());
    let strided = TensorDesc { strides: vec![8], ..buf("int32", 16, 0x1000, "cuda:0") };
    let read_only = TensorDesc { writable: false, ..buf("int32", 16, 0x1000, "cuda:0") };
    for (bad, want) in [
        (buf("int32", 16, 0x1000, "cpu"), "int32 [16] (byte strides [4]) on cpu; expected a writable, contiguous int32 [16] on cuda:0"),
        (buf("int32", 16, 0x1000, "cuda:1"), "on cuda:1; expected"),
        (buf("int64", 16, 0x1000, "cuda:0"), "returned int64 [16]"),
        (buf("int32", 15, 0x1000, "cuda:0"), "returned int32 [15]"),
        (strided, "byte strides [8]"),
        (read_only, "read-only"),
        (buf("int32", 16, 0x10000 + 240, "cuda:0"), "returned memory of the pool's temporal (64 bytes at 0x100f0)"),
        (buf("int32", 16, 0x10000 - 60, "cuda:0"), "returned memory of the pool's temporal"),
    ] {
        let e = checks::check_copy_buffer("load_cpu_copy", &bad, &dev, 64, &pool).unwrap_err();
        assert!(e.message.starts_with("load_cpu_copy: alloc(16) returned "), "{}", e.message);
        assert!(e.message.contains(want), "{}", e.message);
    }
    // just past the pool's last byte (0x10000 + 2 * 8 * 4 * 4): apart
    assert!(checks::check_copy_buffer("get_cpu_copy", &buf("int32", 16, 0x10000 + 256, "cuda:0"), &dev, 64, &pool).is_ok());
}
