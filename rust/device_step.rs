//! A device step's host-decided inputs, narrowed to the int32 the fused kernel reads and laid out
//! in one buffer, so that a step costs one host-to-device copy: the groups' block tables as one
//! `[groups, rows, cols]` table (a group with fewer columns padded with the null block), then the
//! per-request vectors. The kernel reads exactly what the host checked.

use crate::engine_step::GroupTable;
use crate::error::{Error, Result};

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

fn narrow(x: i64, what: &dyn Fn() -> String) -> Result<i32> {
    i32::try_from(x).map_err(|_| Error::plan(format!("{} = {x} does not fit the kernel's int32", what())))
}

/// Stages the first `rows` rows of every group's table (when `with_table`) and the `vectors`
/// (each `rows` long) as int32. Errors name the group, row and column, or the vector and row, of a
/// value outside int32, and a vector of another length.
pub fn stage(tables: &[GroupTable<'_>], rows: usize, vectors: &[(&str, &[i64])], with_table: bool) -> Result<StagedStep> {
    if let Some((name, v)) = vectors.iter().find(|(_, v)| v.len() != rows) {
        return Err(Error::plan(format!("{name} has {} entries for {rows} requests", v.len())));
    }
    let (groups, cols) = if with_table { (tables.len(), tables.iter().map(|t| t.cols).max().unwrap_or(0)) } else { (0, 0) };
    let mut data = Vec::with_capacity(groups * rows * cols + vectors.len() * rows);
    for (g, t) in tables.iter().enumerate().take(groups) {
        if t.cols == 0 || t.ids.len() < rows * t.cols {
            return Err(Error::plan(format!("group {g}: the block table has {} ids, fewer than {rows} rows of {} columns", t.ids.len(), t.cols)));
        }
        for r in 0..rows {
            for (c, &id) in t.ids[r * t.cols..(r + 1) * t.cols].iter().enumerate() {
                data.push(narrow(id, &|| format!("group {g}: block table row {r}, column {c}: block id"))?);
            }
            data.resize(data.len() + (cols - t.cols), 0);
        }
    }
    for (name, v) in vectors {
        for (r, &x) in v.iter().enumerate() {
            data.push(narrow(x, &|| format!("{name}[{r}]"))?);
        }
    }
    Ok(StagedStep { data, groups, rows, cols })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_then_vectors_padded_to_the_widest_group() {
        let g0: Vec<i64> = vec![1, 2, 3, 4, 5, 6, 7, 8, 9]; // 3 rows x 3 cols
        let g1: Vec<i64> = vec![10, 11, 12, 13, 14, 15]; // 3 rows x 2 cols
        let t = [GroupTable { ids: &g0, cols: 3 }, GroupTable { ids: &g1, cols: 2 }];
        let s = stage(&t, 2, &[("src_col", &[0, -1]), ("dst_col", &[1, 2])], true).unwrap();
        assert_eq!((s.groups, s.rows, s.cols, s.table_len()), (2, 2, 3, 12));
        assert_eq!(s.data, vec![1, 2, 3, 4, 5, 6, 10, 11, 0, 12, 13, 0, 0, -1, 1, 2]);
        let v = stage(&t, 2, &[("running", &[5, 6])], false).unwrap();
        assert_eq!((v.table_len(), v.data), (0, vec![5, 6]));
    }

    #[test]
    fn values_beyond_int32_are_named() {
        let g0: Vec<i64> = vec![1, 1 << 31];
        let t = [GroupTable { ids: &g0, cols: 2 }];
        let e = stage(&t, 1, &[], true).unwrap_err();
        assert_eq!(e.message, "group 0: block table row 0, column 1: block id = 2147483648 does not fit the kernel's int32");
        let e = stage(&t, 1, &[("running", &[-(1 << 33)])], false).unwrap_err();
        assert_eq!(e.message, "running[0] = -8589934592 does not fit the kernel's int32");
        let e = stage(&t, 2, &[], true).unwrap_err();
        assert!(e.message.contains("fewer than 2 rows"), "{}", e.message);
        let e = stage(&t, 2, &[("running", &[1])], false).unwrap_err();
        assert_eq!(e.message, "running has 1 entries for 2 requests");
    }
}
