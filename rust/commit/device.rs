//! A RecoverSSM commit on the device in one pass: the plan (every input checked), the device
//! counts' check and the kernel's launch over the cache's fixed row buffer. Nothing is written
//! when any check fails; the caller stages the returned rows into the row buffer and launches.

use super::plan::{check_state_blocks, check_workspace_rows, plan_commit, AlignInputs, CommitRow, CommitStep};
use crate::error::Result;
use crate::kernels::{args::check_commit_counts, CommitLaunch, Launch};
use crate::tensor::{Device, TensorDesc};

/// Where a device commit's accepted counts are.
pub enum DeviceCounts<'a> {
    /// Host counts: the plan holds them.
    Host(&'a [i64]),
    /// Counts the host never reads: `checked` is the caller's vector (any integer type), the
    /// kernel reads `launched` (the same counts as a dense int32 vector); `checked` must live on
    /// `device` (the cache's). Each request is planned for its whole window and the kernel clamps
    /// its count to it.
    Device { checked: &'a TensorDesc, launched: &'a TensorDesc, device: &'a Device },
}

/// One device commit's inputs (`query_lens`: the full window for every request when absent).
pub struct DeviceCommit<'a> {
    pub state_blocks: &'a [i64],
    pub counts: DeviceCounts<'a>,
    pub query_lens: Option<&'a [i64]>,
    pub align: Option<AlignInputs<'a>>,
    /// The workspace rows (the row buffer holds as many).
    pub max_requests: u64,
}

/// Plans and checks a device commit and packs its launch over `rows` (the row buffer on the
/// device). Returns the rows to stage into the buffer before the launch, and the launch (`None`:
/// nothing to commit). The rules, and their order, are those of a host plan followed by a launch.
pub fn plan_device_commit(
    c: &DeviceCommit<'_>,
    backend: &str,
    num_blocks: u64,
    window: u32,
    kernel: &CommitLaunch,
    rows: &TensorDesc,
) -> Result<(Vec<CommitRow>, Option<Launch>)> {
    let full;
    let query_lens = match c.query_lens {
        Some(q) => q,
        None => {
            check_workspace_rows(c.state_blocks.len(), backend, c.max_requests)?;
            check_state_blocks(c.state_blocks, backend, num_blocks)?;
            full = vec![i64::from(window); c.state_blocks.len()];
            &full
        }
    };
    check_workspace_rows(c.state_blocks.len(), backend, c.max_requests)?;
    let (num_accepted, device) = match &c.counts {
        DeviceCounts::Host(a) => (*a, None),
        DeviceCounts::Device { checked, launched, device } => (query_lens, Some((*checked, *launched, *device))),
    };
    let align = c.align.as_ref().map(|a| AlignInputs { seq_lens: a.seq_lens, block_table: a.block_table, cols: a.cols, block_size: a.block_size });
    let step = CommitStep { state_blocks: c.state_blocks, num_accepted, query_lens, align };
    let plan = plan_commit(&step, backend, num_blocks, window)?;
    if plan.is_empty() {
        return Ok((plan, None));
    }
    let counts = match device {
        Some((checked, launched, device)) => {
            let min_len = plan.iter().map(|r| u64::from(r.count_index) + 1).max().unwrap_or(1);
            check_commit_counts(device, checked, min_len)?;
            Some(launched)
        }
        None => None,
    };
    let launch = kernel.launch(rows, Some(plan.len() as u64), counts, None)?;
    Ok((plan, launch))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commit::CommitMeta;
    use crate::kernels::constants::THREADS;

    #[test]
    fn one_pass_plans_checks_and_packs() {
        let table = [CommitMeta { heads: 2, head_v: 16, head_k: 16, ..Default::default() }];
        let k = CommitLaunch::new(Device::Cuda(0), 100, &table, 16, 4, 900, THREADS).unwrap();
        let rows = TensorDesc::dense(200, "torch.uint8", &[4 * 32], "cuda:0");
        let blocks = [3, -1, 5];
        let host = DeviceCommit { state_blocks: &blocks, counts: DeviceCounts::Host(&[1, 0, 9]), query_lens: None, align: None, max_requests: 4 };
        let (plan, launch) = plan_device_commit(&host, "GDN_ATTN", 16, 4, &k, &rows).unwrap();
        assert_eq!(plan.iter().map(|r| (r.request, r.count, r.state_block)).collect::<Vec<_>>(), vec![(0, 1, 3), (2, 4, 5)]);
        let l = launch.unwrap();
        assert_eq!(l.named(&["rows", "num_rows", "num_accepted", "num_counts"]), vec![200, 2, 0, 0]);
        // Device counts: planned for the whole window, checked against the cache's device.
        let cpu = Device::parse("cpu").unwrap();
        let acc = TensorDesc::dense(300, "torch.int64", &[3], "cpu");
        let acc32 = TensorDesc::dense(400, "torch.int32", &[3], "cuda:0");
        let dev = DeviceCommit { counts: DeviceCounts::Device { checked: &acc, launched: &acc32, device: &cpu }, ..host };
        let (plan, launch) = plan_device_commit(&dev, "GDN_ATTN", 16, 4, &k, &rows).unwrap();
        assert_eq!(plan.iter().map(|r| r.count).collect::<Vec<_>>(), vec![4, 4]);
        assert_eq!(launch.unwrap().named(&["num_accepted", "num_counts"]), vec![400, 3]);
        let short = TensorDesc::dense(300, "torch.int64", &[2], "cpu");
        let dev = DeviceCommit { counts: DeviceCounts::Device { checked: &short, launched: &acc32, device: &cpu }, ..dev };
        let e = plan_device_commit(&dev, "GDN_ATTN", 16, 4, &k, &rows).unwrap_err();
        assert!(e.message.contains("one count per request (3 at least)"), "{}", e.message);
        // A refused plan: the planner's error, nothing packed.
        let twice = DeviceCommit { state_blocks: &[3, 3], counts: DeviceCounts::Host(&[1, 1]), query_lens: None, align: None, max_requests: 4 };
        let e = plan_device_commit(&twice, "GDN_ATTN", 16, 4, &k, &rows).unwrap_err();
        assert!(e.message.contains("both use state block 3"), "{}", e.message);
        let many =
            DeviceCommit { state_blocks: &[1, 2, 3, 4, 5], counts: DeviceCounts::Host(&[1; 5]), query_lens: None, align: None, max_requests: 4 };
        assert!(plan_device_commit(&many, "GDN_ATTN", 16, 4, &k, &rows).is_err());
    }
}
