//! The launch of the RecoverSSM commit kernel `rs_recover_commit`: the grid follows the layers'
//! table (one CTA per (head, value tile) of the largest layer, plus the conv CTAs), the rows and the
//! optional device-side accepted counts are checked per launch.

use super::abi::Launch;
use super::args::{check_commit_rows, int_vector, IntType};
use super::constants::{COMMIT_CONV_CHUNK_BYTES, MAX_GRID_YZ, RC_NO_CONV, RC_ROWS, THREADS};
use super::records::{CommitMeta, MutPtr, Ptr, RecoverCommitParams};
use crate::error::{Error, ErrorKind, Result};
use crate::tensor::Device;
use crate::tensor::TensorDesc;

/// CTAs per (layer, row) of the commit kernel with `threads` threads per CTA: `(rec_ctas,
/// conv_ctas)`.
pub fn commit_grid(table: &[CommitMeta], threads: u32) -> (u32, u32) {
    let (mut rec, mut conv) = (1u64, 0u64);
    for m in table {
        let groups = (m.head_k as u64).div_ceil(4).max(1);
        let per_cta = (threads as u64 / groups).max(1) * RC_ROWS as u64;
        rec = rec.max(m.heads as u64 * (m.head_v as u64).div_ceil(per_cta));
        if m.conv_layout != RC_NO_CONV {
            let nbytes = m.conv_width as u64 * m.conv_dim as u64 * m.conv_elem as u64;
            conv = conv.max(nbytes.div_ceil(COMMIT_CONV_CHUNK_BYTES).max(1));
        }
    }
    (rec.min(u32::MAX as u64) as u32, conv.min(u32::MAX as u64) as u32)
}

/// The commit kernel of one state cache: the device copy of its table and the launch constants,
/// checked once; [`CommitLaunch::launch`] checks and packs each commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitLaunch {
    pub device: Device,
    pub metas: u64,
    pub num_layers: u32,
    pub num_blocks: i64,
    pub max_requests: u32,
    pub rec_ctas: u32,
    pub conv_ctas: u32,
    /// Threads per CTA (the grid follows it).
    pub threads: u32,
    /// The cache's own error word, used when a commit brings none (0: none).
    pub err: u64,
}

impl CommitLaunch {
    /// `metas` is the device address of `table` (the same records, uploaded); `threads` per CTA in
    /// `1 ..= 256` (the launch layer uses [`THREADS`]).
    pub fn new(device: Device, metas: u64, table: &[CommitMeta], num_blocks: i64, max_requests: i64, err: u64, threads: u32) -> Result<CommitLaunch> {
        if !(1..=THREADS).contains(&threads) {
            return Err(Error::plan(format!("threads must be in 1 ..= {THREADS}, got {threads}")));
        }
        if !device.is_cuda() {
            return Err(Error::plan(format!("the commit kernel reads CUDA memory; got {device}")));
        }
        let num_layers = u32::try_from(table.len()).map_err(|_| Error::plan(format!("{} layers exceed 2**32 - 1", table.len())))?;
        if num_blocks < 1 || !(0..1 << 32).contains(&max_requests) {
            return Err(Error::plan(format!("bad num_blocks {num_blocks} / max_requests {max_requests}")));
        }
        let (rec_ctas, conv_ctas) = commit_grid(table, threads);
        if rec_ctas as u64 + conv_ctas as u64 >= 1 << 31 {
            return Err(Error::plan(format!("bad commit grid ({rec_ctas}, {conv_ctas})")));
        }
        Ok(CommitLaunch { device, metas, num_layers, num_blocks, max_requests: max_requests as u32, rec_ctas, conv_ctas, threads, err })
    }

    /// The launch of one commit over the first `num_rows` rows of `rows` (a device buffer of
    /// `CommitRow` records; default: all it holds). With `num_accepted` (an int32 device vector
    /// indexed by `row.count_index`) the count becomes `clamp(num_accepted[count_index], 0, row.count)` on
    /// the device. `None` when there is nothing to launch.
    pub fn launch(
        &self,
        rows: &TensorDesc,
        num_rows: Option<u64>,
        num_accepted: Option<&TensorDesc>,
        err: Option<&TensorDesc>,
    ) -> Result<Option<Launch>> {
        let n = check_commit_rows(&self.device, rows, num_rows)?;
        let counts = match num_accepted {
            Some(a) => {
                same_device(a, "num_accepted", &self.device)?;
                let v = int_vector(a, "num_accepted", 1, &[IntType::I32], ErrorKind::Plan)?;
                (v.ptr, u32::try_from(v.len).map_err(|_| Error::plan("num_accepted has more than 2**32 - 1 counts"))?)
            }
            None => (0, 0),
        };
        let err = match err {
            Some(e) => {
                same_device(e, "err", &self.device)?;
                int_vector(e, "err", 3, &[IntType::I32], ErrorKind::Plan)?.ptr
            }
            None => self.err,
        };
        if n == 0 || self.num_layers == 0 {
            return Ok(None);
        }
        let params = RecoverCommitParams {
            metas: Ptr::at(self.metas),
            rows: Ptr::at(rows.data_ptr),
            num_accepted: Ptr::at(counts.0),
            err: MutPtr::at(err),
            num_blocks: self.num_blocks,
            num_layers: self.num_layers,
            num_rows: n as u32,
            num_counts: counts.1,
            max_requests: self.max_requests,
            rec_ctas: self.rec_ctas,
            reserved: 0,
        };
        let fold = |x: u64| x.clamp(1, MAX_GRID_YZ as u64) as u32;
        let grid = [self.rec_ctas + self.conv_ctas, fold(n), fold(self.num_layers as u64)];
        Ok(Some(Launch::new(&params, grid, [self.threads, 1, 1])))
    }
}

fn same_device(a: &TensorDesc, what: &str, device: &Device) -> Result<()> {
    match Device::parse(&a.device) {
        Ok(d) if d == *device => Ok(()),
        _ => Err(Error::plan(format!("{what} is on {}, the cache on {device}", a.device))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(heads: u32, head_v: u32, head_k: u32, conv: Option<(u32, u32, u16)>) -> CommitMeta {
        let mut m = CommitMeta { heads, head_v, head_k, ..Default::default() };
        if let Some((w, d, e)) = conv {
            (m.conv_layout, m.conv_width, m.conv_dim, m.conv_elem) = (2, w, d, e);
        }
        m
    }

    fn arg(ptr: u64, dtype: &str, shape: &[i64], device: &str) -> TensorDesc {
        TensorDesc::dense(ptr, dtype, shape, device)
    }

    #[test]
    fn grid_follows_the_largest_layer() {
        // 128 key channels: 32 groups of 4, 8 threads per row group, 64 rows per CTA.
        assert_eq!(commit_grid(&[meta(4, 128, 128, None)], 256), (8, 0));
        assert_eq!(commit_grid(&[meta(4, 128, 128, None)], 128), (16, 0));
        assert_eq!(commit_grid(&[meta(4, 128, 128, None), meta(16, 128, 128, Some((6, 8192, 2)))], 256), (32, 6));
        assert_eq!(commit_grid(&[], 256), (1, 0));
    }

    #[test]
    fn commit_launch_packs_and_checks() {
        let table = [meta(4, 128, 128, Some((6, 1024, 2)))];
        let c = CommitLaunch::new(Device::Cuda(0), 100, &table, 50, 8, 900, THREADS).unwrap();
        let rows = arg(200, "torch.uint8", &[5 * 32], "cuda:0");
        let l = c.launch(&rows, None, None, None).unwrap().unwrap();
        assert_eq!((l.kernel.name, l.grid), ("rs_recover_commit", [9, 5, 1]));
        let v = l.named(&["metas", "num_layers", "rows", "num_rows", "num_accepted", "num_counts", "num_blocks", "max_requests", "rec_ctas", "err"]);
        assert_eq!(v, vec![100, 1, 200, 5, 0, 0, 50, 8, 8, 900]);
        let acc = arg(300, "torch.int32", &[8], "cuda:0");
        let l = c.launch(&rows, Some(2), Some(&acc), None).unwrap().unwrap();
        assert_eq!(l.named(&["num_rows", "num_accepted", "num_counts"]), vec![2, 300, 8]);
        let e = c.launch(&rows, None, Some(&arg(300, "torch.int64", &[8], "cuda:0")), None).unwrap_err();
        assert_eq!(e.message, "num_accepted: expected int32, got torch.int64");
        let e = c.launch(&rows, None, Some(&arg(300, "torch.int32", &[8], "cuda:1")), None).unwrap_err();
        assert_eq!(e.message, "num_accepted is on cuda:1, the cache on cuda:0");
        assert!(c.launch(&rows, Some(6), None, None).unwrap_err().message.contains("at least 6 commit rows"));
        assert_eq!(c.launch(&rows, Some(0), None, None), Ok(None));
        assert!(CommitLaunch::new(Device::Cuda(0), 100, &table, 0, 8, 0, THREADS).is_err());
        assert!(CommitLaunch::new(Device::Cuda(0), 100, &table, 10, 8, 0, 512).is_err());
    }
}
