//! A device step's host-decided inputs, narrowed to the int32 the fused kernel reads and laid out
//! in one buffer, so that a step costs one host-to-device copy: the groups' block tables as one
//! `[groups, rows, cols]` table (a group with fewer columns padded with the null block), then the
//! per-request vectors. The kernel reads exactly what the host checked.

use super::decide::{self, PostInputs, PreColumns, PreInputs, StepConfig};
use crate::error::{Error, Result};
use crate::plan::{GroupTable, Planner};
use crate::tensor::{Device, TensorDesc};

/// The layout of a staged step: `table_len = groups * rows * cols` table entries, then one
/// `rows`-long vector per staged vector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedStep {
    pub data: Vec<i32>,
    pub groups: usize,
    pub rows: usize,
    pub cols: usize,
}

impl StagedStep {
    /// Entries of the table part (0 when the table was not staged).
    pub fn table_len(&self) -> usize {
        self.groups * self.rows * self.cols
    }
}

/// Where a device step takes its block tables from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tables {
    /// Staged from the host tables the step was checked against.
    Staged,
    /// Already on the device (the engine's own device tables): only the vectors are staged.
    OnDevice,
}

/// What both halves of a device step stage from: whether the accepted counts are on the host,
/// the groups' host tables, the step's configuration, request names for errors, and where the
/// kernel takes its tables from.
pub struct Stage<'a> {
    pub host_counts: bool,
    pub tables: &'a [GroupTable<'a>],
    pub cfg: &'a StepConfig,
    pub name: &'a dyn Fn(usize) -> String,
    pub from: Tables,
}

/// The host half of a device pre-copy: the columns and the staged step (table, then `src_col`,
/// `curr`, and the accepted counts when they are given on the host). With host counts
/// (`inp.num_accepted` not empty, or any step without requests) the whole host decision runs
/// ([`decide::pre_copy`], every check); without them, every check that needs no count
/// ([`decide::pre_copy_columns`]; the kernel checks the rest).
pub fn stage_pre_copy(inp: &PreInputs<'_>, at: &Stage<'_>) -> Result<(PreColumns, StagedStep)> {
    let Stage { host_counts, tables, cfg, name, from } = *at;
    let cols = if host_counts {
        let d = decide::pre_copy(inp, tables, cfg, name)?;
        PreColumns { prev: d.prev, curr: d.curr, src_col: d.src_col }
    } else {
        decide::pre_copy_columns(inp, tables, cfg, name)?
    };
    let mut vectors: Vec<(&str, &[i64])> = vec![("src_col", &cols.src_col), ("curr", &cols.curr)];
    if host_counts {
        vectors.push(("num_accepted", inp.num_accepted));
    }
    let staged = stage(tables, cols.curr.len(), &vectors, from == Tables::Staged, name)?;
    Ok((cols, staged))
}

/// The host half of a device post-process: `running` and the staged step (table, then
/// `state_col`, `running`, and host counts when given). With host counts the whole host decision
/// runs ([`decide::post_process`], including `num_accepted <= 1 + num_draft` and the saved
/// columns); without them, [`decide::post_process_running`].
pub fn stage_post_process(inp: &PostInputs<'_>, at: &Stage<'_>) -> Result<(Vec<i64>, StagedStep)> {
    let Stage { host_counts, tables, cfg, name, from } = *at;
    let running =
        if host_counts { decide::post_process(inp, tables, cfg, name)?.running } else { decide::post_process_running(inp, tables, cfg, name)? };
    let mut vectors: Vec<(&str, &[i64])> = vec![("state_col", inp.state_col), ("running", &running)];
    if host_counts {
        vectors.push(("num_accepted", inp.num_accepted));
    }
    let staged = stage(tables, inp.state_col.len(), &vectors, from == Tables::Staged, name)?;
    Ok((running, staged))
}

/// [`stage_pre_copy`], then `planner`'s published check ([`Planner::check_device_writes`]) of
/// the blocks the kernel writes: each moving request's `curr` column (pre-copy semantics: whatever
/// the accepted count). Skipped when no block is published.
pub fn stage_pre_copy_checked(planner: &Planner, inp: &PreInputs<'_>, at: &Stage<'_>) -> Result<(PreColumns, StagedStep)> {
    let (cols, staged) = stage_pre_copy(inp, at)?;
    if planner.has_published() {
        planner.check_device_writes(at.tables, &pre_copy_writes(&cols), at.name)?;
    }
    Ok((cols, staged))
}

/// [`stage_post_process`], then `planner`'s published check of the blocks the kernel may write:
/// each request's boundary column where it saves ([`decide::post_save`]); with the accepted counts
/// on the device, every boundary column one of `1 ..= 1 + num_draft` accepted tokens would save
/// at. Skipped when no block is published.
pub fn stage_post_process_checked(planner: &Planner, inp: &PostInputs<'_>, at: &Stage<'_>) -> Result<(Vec<i64>, StagedStep)> {
    let (running, staged) = stage_post_process(inp, at)?;
    if planner.has_published() {
        let counts = if at.host_counts { Some(inp.num_accepted) } else { None };
        planner.check_device_writes(at.tables, &post_process_writes(inp, &running, at.cfg, counts), at.name)?;
    }
    Ok((running, staged))
}

/// The (request, column) pairs a device pre-copy writes: `curr` where the running state moves.
pub fn pre_copy_writes(cols: &PreColumns) -> Vec<(usize, i64)> {
    cols.src_col.iter().zip(&cols.curr).enumerate().filter(|(_, (&s, _))| s >= 0).map(|(i, (_, &c))| (i, c)).collect()
}

/// The (request, column) pairs a device post-process may write (`running` from its host half):
/// with `counts`, where each request saves; without, where any count it may accept would save.
pub fn post_process_writes(inp: &PostInputs<'_>, running: &[i64], cfg: &StepConfig, counts: Option<&[i64]>) -> Vec<(usize, i64)> {
    let mut out = Vec::new();
    for (i, &run) in running.iter().enumerate() {
        let accepted = match counts {
            Some(a) => a[i]..=a[i],
            None => 1..=1 + inp.num_draft[i],
        };
        for a in accepted {
            let save = decide::post_save(inp.state_col[i], run, a, cfg.block_size);
            if save.copy && out.last() != Some(&(i, save.dest)) {
                out.push((i, save.dest));
            }
        }
    }
    out
}

fn narrow(x: i64, what: &dyn Fn() -> String) -> Result<i32> {
    i32::try_from(x).map_err(|_| Error::plan(format!("{} = {x} does not fit the kernel's int32", what())))
}

/// Appends `v` narrowed to int32 to `data`: one pass that checks every value fits, then a plain
/// copy; the first value that does not fit (in order) is the error, `what(index)` naming it.
fn push_narrowed(data: &mut Vec<i32>, v: &[i64], what: &dyn Fn(usize) -> String) -> Result<()> {
    if let Some(k) = v.iter().position(|&x| i32::try_from(x).is_err()) {
        return narrow(v[k], &|| what(k)).map(|_| ());
    }
    data.extend(v.iter().map(|&x| x as i32));
    Ok(())
}

/// Stages the first `rows` rows of every group's table (when `with_table`) and the `vectors`
/// (each `rows` long) as int32. Errors name the group, request (`name`) and column, or the vector
/// and request, of a value outside int32, and a vector of another length.
pub fn stage(
    tables: &[GroupTable<'_>],
    rows: usize,
    vectors: &[(&str, &[i64])],
    with_table: bool,
    name: &dyn Fn(usize) -> String,
) -> Result<StagedStep> {
    if let Some((name, v)) = vectors.iter().find(|(_, v)| v.len() != rows) {
        return Err(Error::plan(format!("{name} has {} entries for {rows} requests", v.len())));
    }
    let (groups, cols) = if with_table { (tables.len(), tables.iter().map(|t| t.cols).max().unwrap_or(0)) } else { (0, 0) };
    let mut data = Vec::with_capacity(groups * rows * cols + vectors.len() * rows);
    for (g, t) in tables.iter().enumerate().take(groups) {
        if t.cols == 0 || t.ids.len() < rows * t.cols {
            return Err(Error::plan(format!("group {g}: the block table has {} ids, fewer than {rows} rows of {} columns", t.ids.len(), t.cols)));
        }
        let what = |k: usize| format!("{}: group {g}'s block table, column {}: block id", name(k / t.cols), k % t.cols);
        let ids = &t.ids[..rows * t.cols];
        if t.cols == cols {
            push_narrowed(&mut data, ids, &what)?;
            continue;
        }
        for (r, row) in ids.chunks_exact(t.cols).enumerate() {
            push_narrowed(&mut data, row, &|c| what(r * t.cols + c))?;
            data.resize(data.len() + (cols - t.cols), 0);
        }
    }
    for (vec_name, v) in vectors {
        push_narrowed(&mut data, v, &|r| format!("{}: {vec_name}", name(r)))?;
    }
    Ok(StagedStep { data, groups, rows, cols })
}

/// Checks that a host-path call (`what`, the caller's name for it) has host states: on CUDA states
/// the step runs on the device (`preprocess` / `postprocess`, or the device half-steps).
pub fn check_host_path(device: &Device, what: &str) -> Result<()> {
    if device.is_cuda() {
        return Err(Error::plan(format!(
            "{what} runs the host path, but the states are on {device}: use preprocess / postprocess, or device_step.launch"
        )));
    }
    Ok(())
}

/// Checks a device half-step's `rows` requests against the step's `max_num_reqs` (the rows of its
/// buffers).
pub fn check_rows(rows: u64, max_num_reqs: u64) -> Result<()> {
    if rows > max_num_reqs {
        return Err(Error::plan(format!("{rows} requests in the step, more than max_num_reqs = {max_num_reqs}")));
    }
    Ok(())
}

/// Checks a device remap of last step's counts to this step's rows: `prev_rows`, each row's row
/// in the previous step (`-1` for a row new to the batch), must be an int32 or int64 `[>= rows]`
/// CUDA vector on the states' `device`, given instead of `num_accepted` (the remap produces the
/// counts). Its values are the device's to read: an index outside the previous step's rows reads
/// as a new row. Errors are [`crate::error::ErrorKind::Plan`] naming `prev_rows`.
pub fn check_prev_rows(device: &Device, prev_rows: &TensorDesc, rows: u64, num_accepted_given: bool) -> Result<()> {
    if num_accepted_given {
        return Err(Error::plan("pass num_accepted or prev_rows (last step's counts remapped on the device), not both"));
    }
    let Device::Cuda(index) = device else {
        return Err(Error::plan("prev_rows: the planner's states are on the host; the remap runs on the device only"));
    };
    if Device::parse(&prev_rows.device).ok() != Some(Device::Cuda(*index)) {
        return Err(Error::plan(format!("prev_rows is on {}, the planner's states on cuda:{index}", prev_rows.device)));
    }
    if !matches!(prev_rows.dtype_name(), "int32" | "int64") {
        return Err(Error::plan(format!("prev_rows: expected an int32 or int64 tensor, got {}", prev_rows.dtype.trim())));
    }
    match prev_rows.shape[..] {
        [n] if n >= 0 && n as u64 >= rows => Ok(()),
        _ => Err(Error::plan(format!("prev_rows must be [R] with one previous row per request ({rows} at least); got shape {:?}", prev_rows.shape))),
    }
}

#[cfg(test)]
mod tests {
    use super::super::decide::row_name;
    use super::*;

    #[test]
    fn the_host_path_needs_host_states() {
        assert_eq!(check_host_path(&Device::Cpu, "pre_copy"), Ok(()));
        let e = check_host_path(&Device::Cuda(1), "post_process").unwrap_err();
        assert_eq!(e.message, "post_process runs the host path, but the states are on cuda:1: use preprocess / postprocess, or device_step.launch");
    }

    #[test]
    fn a_step_fits_its_buffers() {
        assert_eq!(check_rows(4, 4), Ok(()));
        assert_eq!(check_rows(5, 4).unwrap_err().message, "5 requests in the step, more than max_num_reqs = 4");
    }

    #[test]
    fn host_counts_get_every_host_check() {
        let cfg = StepConfig { block_size: 4, num_spec_blocks: 2 };
        let bt: Vec<i64> = (1..=16).collect();
        let t = [GroupTable { ids: &bt, cols: 8 }];
        // Request 0 moves from column 0 to column 1 carrying 3 accepted tokens: source columns 0..=2.
        let inp = PreInputs { num_computed: &[4, 0], num_scheduled: &[3, 1], num_accepted: &[3, 1], mamba_state_idx: &[0, -1], fresh: None };
        let at = |host_counts, from| Stage { host_counts, tables: &t, cfg: &cfg, name: &row_name, from };
        let (cols, st) = stage_pre_copy(&inp, &at(true, Tables::Staged)).unwrap();
        assert_eq!((cols.src_col, cols.curr), (vec![0, -1], vec![1, 0]));
        assert_eq!(&st.data[st.table_len()..], &[0, -1, 1, 0, 3, 1]);
        let (_, st) = stage_pre_copy(&PreInputs { num_accepted: &[], ..inp }, &at(false, Tables::OnDevice)).unwrap();
        assert_eq!(st.data, vec![0, -1, 1, 0]);
        // A count out of range is the host's to refuse when the host holds it.
        let bad = PreInputs { num_accepted: &[4, 1], ..inp };
        let e = stage_pre_copy(&bad, &at(true, Tables::Staged)).unwrap_err();
        assert!(e.message.contains("request 0: num_accepted = 4"), "{}", e.message);
        assert!(stage_pre_copy(&PreInputs { num_accepted: &[], ..bad }, &at(false, Tables::Staged)).is_ok());
        // The post-process: a count above 1 + num_draft is refused with host counts.
        let post = PostInputs { state_col: &[1], num_computed: &[4], num_scheduled: &[3], num_draft: &[1], num_accepted: &[3] };
        let e = stage_post_process(&post, &at(true, Tables::Staged)).unwrap_err();
        assert!(e.message.contains("num_accepted = 3 is outside 1 ..= 2"), "{}", e.message);
        let (running, st) = stage_post_process(&PostInputs { num_accepted: &[], ..post }, &at(false, Tables::Staged)).unwrap();
        assert_eq!((running, st.table_len(), &st.data[8..]), (vec![6], 8, &[1, 6][..]));
    }

    #[test]
    fn a_device_step_writing_a_published_block_is_refused() {
        use crate::plan::tests::{binding, mem};
        let mut m = mem();
        let planner = Planner::new(vec![binding(&mut m, "A", 2)]).unwrap();
        let cfg = StepConfig { block_size: 4, num_spec_blocks: 2 };
        let bt: Vec<i64> = vec![1, 2, 3, 4, 0, 0, 5, 6, 7, 0, 0, 0];
        let t = [GroupTable { ids: &bt, cols: 6 }];
        let at = |host_counts| Stage { host_counts, tables: &t, cfg: &cfg, name: &row_name, from: Tables::Staged };
        // Request 0's running state moves from column 0 (block 1) to column 1 (block 2).
        let pre = PreInputs { num_computed: &[4, 0], num_scheduled: &[3, 1], num_accepted: &[3, 1], mamba_state_idx: &[0, -1], fresh: None };
        let no_counts = PreInputs { num_accepted: &[], ..pre };
        assert!(stage_pre_copy_checked(&planner, &pre, &at(true)).is_ok(), "nothing published");
        planner.publish(0, &[2]).unwrap();
        for (inp, host) in [(&pre, true), (&no_counts, false)] {
            assert!(stage_pre_copy(inp, &at(host)).is_ok(), "the staging alone does not look at published blocks");
            let e = stage_pre_copy_checked(&planner, inp, &at(host)).unwrap_err();
            assert!(
                e.message.contains("A: request 0, state 'conv' (all 1 layers): the destination block 2 (column 1) holds a published state"),
                "{}",
                e.message
            );
        }
        planner.retract(0, &[2]).unwrap();
        planner.publish(0, &[1, 5]).unwrap(); // read, or not touched: fine
        stage_pre_copy_checked(&planner, &pre, &at(true)).unwrap();
        planner.retract(0, &[1, 5]).unwrap();
        // The post-process of request 0 at column 1 (block 2), running = 6: one accepted token
        // saves nothing; three would shift the running state in place (block 2).
        let post = PostInputs { state_col: &[1], num_computed: &[5], num_scheduled: &[3], num_draft: &[2], num_accepted: &[1] };
        planner.publish(0, &[2]).unwrap();
        stage_post_process_checked(&planner, &post, &at(true)).unwrap();
        let e = stage_post_process_checked(&planner, &PostInputs { num_accepted: &[3], ..post }, &at(true)).unwrap_err();
        assert!(e.message.contains("request 0") && e.message.contains("block 2 (column 1)"), "{}", e.message);
        let e = stage_post_process_checked(&planner, &PostInputs { num_accepted: &[], ..post }, &at(false)).unwrap_err();
        assert!(e.message.contains("block 2 (column 1)"), "counts on the device: any count it may accept: {}", e.message);
        assert_eq!(post_process_writes(&post, &[6], &cfg, None), vec![(0, 1)]);
    }

    #[test]
    fn tables_then_vectors_padded_to_the_widest_group() {
        let g0: Vec<i64> = vec![1, 2, 3, 4, 5, 6, 7, 8, 9]; // 3 rows x 3 cols
        let g1: Vec<i64> = vec![10, 11, 12, 13, 14, 15]; // 3 rows x 2 cols
        let t = [GroupTable { ids: &g0, cols: 3 }, GroupTable { ids: &g1, cols: 2 }];
        let s = stage(&t, 2, &[("src_col", &[0, -1]), ("dst_col", &[1, 2])], true, &row_name).unwrap();
        assert_eq!((s.groups, s.rows, s.cols, s.table_len()), (2, 2, 3, 12));
        assert_eq!(s.data, vec![1, 2, 3, 4, 5, 6, 10, 11, 0, 12, 13, 0, 0, -1, 1, 2]);
        let v = stage(&t, 2, &[("running", &[5, 6])], false, &row_name).unwrap();
        assert_eq!((v.table_len(), v.data), (0, vec![5, 6]));
        // A value beyond int32 in a padded (narrower) group is named by its own row and column.
        let g1: Vec<i64> = vec![10, 11, 12, 1 << 40, 14, 15];
        let t = [GroupTable { ids: &g0, cols: 3 }, GroupTable { ids: &g1, cols: 2 }];
        let e = stage(&t, 2, &[], true, &row_name).unwrap_err();
        assert_eq!(e.message, "request 1: group 1's block table, column 1: block id = 1099511627776 does not fit the kernel's int32");
    }

    #[test]
    fn values_beyond_int32_are_named() {
        let g0: Vec<i64> = vec![1, 1 << 31];
        let t = [GroupTable { ids: &g0, cols: 2 }];
        let e = stage(&t, 1, &[], true, &row_name).unwrap_err();
        assert_eq!(e.message, "request 0: group 0's block table, column 1: block id = 2147483648 does not fit the kernel's int32");
        let e = stage(&t, 1, &[("running", &[-(1 << 33)])], false, &|i| format!("request 'x{i}'")).unwrap_err();
        assert_eq!(e.message, "request 'x0': running = -8589934592 does not fit the kernel's int32");
        let e = stage(&t, 2, &[], true, &row_name).unwrap_err();
        assert!(e.message.contains("fewer than 2 rows"), "{}", e.message);
        let e = stage(&t, 2, &[("running", &[1])], false, &row_name).unwrap_err();
        assert_eq!(e.message, "running has 1 entries for 2 requests");
    }

    #[test]
    fn prev_rows_are_a_cuda_index_vector() {
        let dev = Device::Cuda(0);
        let t = |dtype: &str, shape: &[i64], device: &str| TensorDesc::dense(0x1000, dtype, shape, device);
        assert!(check_prev_rows(&dev, &t("int64", &[4], "cuda:0"), 3, false).is_ok());
        assert!(check_prev_rows(&dev, &t("int32", &[3], "cuda:0"), 3, false).is_ok());
        let e = |d: &Device, a: &TensorDesc, rows, given| check_prev_rows(d, a, rows, given).unwrap_err().message;
        assert!(e(&dev, &t("int32", &[3], "cuda:0"), 3, true).contains("not both"));
        assert!(e(&Device::Cpu, &t("int32", &[3], "cpu"), 3, false).contains("on the host"));
        assert_eq!(e(&dev, &t("int32", &[3], "cuda:1"), 3, false), "prev_rows is on cuda:1, the planner's states on cuda:0");
        assert!(e(&dev, &t("float32", &[3], "cuda:0"), 3, false).starts_with("prev_rows: expected an int32 or int64 tensor"));
        assert!(e(&dev, &t("int32", &[2], "cuda:0"), 3, false).contains("3 at least"));
        assert!(e(&dev, &t("int32", &[3, 1], "cuda:0"), 3, false).contains("[3, 1]"));
    }
}
