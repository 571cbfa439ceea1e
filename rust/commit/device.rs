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
            let min_len = plan.iter().map(|r| u64::from(r.request) + 1).max().unwrap_or(1);
            check_commit_counts(device, checked, min_len)?;
            Some(launched)
        }
        None => None,
    };
    let launch = kernel.launch(rows, Some(plan.len() as u64), counts, None)?;
    Ok((plan, launch))
}
