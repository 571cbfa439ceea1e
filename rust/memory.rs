//! What the process's memory map says about host memory: a tensor whose bytes lie over pages the
//! process maps read-only (a read-only `np.memmap`, a mapped file opened for reading) would fault
//! on the first copy into it, so a binding marks it read-only and refuses it.
//!
//! The map is Linux's `/proc/self/maps` text, parsed once per binding. Only what the map shows is
//! detected: a private writable mapping (the heap holding a Python `bytes` object that
//! `torch.frombuffer` wraps, say) reads as writable even when the bytes are meant to be immutable.

use crate::tensor::TensorDesc;

/// One mapping: `[start, end)` and whether the process may write it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub writable: bool,
}

/// The mappings of a `/proc/<pid>/maps` text (`start-end perms offset dev inode [path]` per line),
/// sorted by start. Lines that do not parse are skipped.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    let mut out: Vec<Mapping> = text
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_ascii_whitespace();
            let (range, perms) = (fields.next()?, fields.next()?);
            let (s, e) = range.split_once('-')?;
            let start = u64::from_str_radix(s, 16).ok()?;
            let end = u64::from_str_radix(e, 16).ok()?;
            (start < end).then(|| Mapping { start, end, writable: perms.as_bytes().get(1) == Some(&b'w') })
        })
        .collect();
    out.sort_unstable_by_key(|m| m.start);
    out
}

/// The current process's mappings (`/proc/self/maps`); `None` where the file cannot be read (not
/// Linux, or a restricted `/proc`): nothing can then be detected.
pub fn own_maps() -> Option<Vec<Mapping>> {
    std::fs::read_to_string("/proc/self/maps").ok().map(|t| parse_maps(&t))
}

/// Whether `[addr, addr + len)` is fully covered by contiguous writable mappings (`maps` sorted by
/// start, as [`parse_maps`] returns them). An empty range is writable.
pub fn range_writable(maps: &[Mapping], addr: u64, len: u64) -> bool {
    if len == 0 {
        return true;
    }
    let Some(end) = addr.checked_add(len) else { return false };
    // The last mapping starting at or before `addr`.
    let pos = maps.partition_point(|m| m.start <= addr);
    if pos == 0 {
        return false;
    }
    let mut at = addr;
    for m in &maps[pos - 1..] {
        if m.start > at || m.end <= at || !m.writable {
            return false;
        }
        at = m.end;
        if at >= end {
            return true;
        }
    }
    false
}

/// The bytes `[start, end)` a strided tensor's elements may touch (strides in bytes), or `None`
/// when it has no elements or its extent overflows.
pub fn extent(t: &TensorDesc, itemsize: u64) -> Option<(u64, u64)> {
    if t.shape.iter().any(|&d| d <= 0) {
        return None;
    }
    let (mut lo, mut hi) = (0i128, 0i128);
    for (&d, &s) in t.shape.iter().zip(&t.strides) {
        let reach = (d as i128 - 1) * s as i128;
        if reach < 0 {
            lo += reach;
        } else {
            hi += reach;
        }
    }
    let start = t.data_ptr as i128 + lo;
    let end = t.data_ptr as i128 + hi + itemsize as i128;
    (start >= 0 && end <= u64::MAX as i128).then_some((start as u64, end as u64))
}

/// Marks a host tensor read-only when the bytes it spans are not all mapped writable. Device
/// tensors, empty tensors and a missing map are left as they are.
pub fn mark_read_only(maps: Option<&[Mapping]>, t: &mut TensorDesc, itemsize: u64) {
    let Some(maps) = maps else { return };
    if !t.writable || t.device.trim() != "cpu" {
        return;
    }
    if let Some((start, end)) = extent(t, itemsize) {
        if !range_writable(maps, start, end - start) {
            t.writable = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/python3
00651000-00652000 rw-p 00051000 08:02 173521      /usr/bin/python3
00652000-00655000 rw-p 00000000 00:00 0           [heap]
7f0000000000-7f0000001000 r--s 00000000 08:02 1   /tmp/data.bin
7f0000001000-7f0000002000 rw-s 00000000 08:02 2   /tmp/other.bin
garbage line
";

    #[test]
    fn parses_ranges_and_write_permission() {
        let m = parse_maps(MAPS);
        assert_eq!(m.len(), 5);
        assert_eq!(m[0], Mapping { start: 0x400000, end: 0x452000, writable: false });
        assert!(m[1].writable && m[2].writable && !m[3].writable && m[4].writable);
    }

    #[test]
    fn writable_only_over_contiguous_writable_mappings() {
        let m = parse_maps(MAPS);
        // Inside one writable mapping, and across two adjacent writable ones.
        assert!(range_writable(&m, 0x651000, 0x1000));
        assert!(range_writable(&m, 0x651800, 0x2000));
        // Read-only pages, in whole or in part; unmapped memory; a gap; an overflowing range.
        assert!(!range_writable(&m, 0x400000, 8));
        assert!(!range_writable(&m, 0x7f0000000800, 0x1000));
        assert!(!range_writable(&m, 0x100, 8));
        assert!(!range_writable(&m, 0x654000, 0x2000));
        assert!(!range_writable(&m, u64::MAX - 4, 8));
        assert!(range_writable(&m, 0x7f0000001000, 0x1000));
        assert!(range_writable(&m, 0, 0));
    }

    #[test]
    fn marks_host_tensors_over_read_only_pages() {
        let m = parse_maps(MAPS);
        let mut ro = TensorDesc::dense(0x7f0000000000, "float32", &[4, 8], "cpu");
        mark_read_only(Some(&m), &mut ro, 4);
        assert!(!ro.writable);
        let mut rw = TensorDesc::dense(0x652000, "float32", &[4, 8], "cpu");
        mark_read_only(Some(&m), &mut rw, 4);
        assert!(rw.writable);
        // A device tensor's address is not in the host map; no map detects nothing.
        let mut dev = TensorDesc::dense(0x7f0000000000, "float32", &[4, 8], "cuda:0");
        mark_read_only(Some(&m), &mut dev, 4);
        let mut unknown = TensorDesc::dense(0x7f0000000000, "float32", &[4, 8], "cpu");
        mark_read_only(None, &mut unknown, 4);
        assert!(dev.writable && unknown.writable);
        // A strided view: its extent ends past the last element's first byte by one element.
        let view = TensorDesc::new(0x652000, "float32", vec![2, 3], vec![64, 4], "cpu");
        assert_eq!(extent(&view, 4), Some((0x652000, 0x652000 + 64 + 8 + 4)));
    }
}
