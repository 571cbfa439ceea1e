//! SGLang's mamba pool (`crate::sglang`): the speculative commit's checked selection and the
//! host-copy check, for `recoverssm_rs.sglang`.

use super::conversion::{kwargs, DtypeName, FromKwargs, Ints};
use crate::error::Error;
use crate::sglang::{self, CommitPass, CommitSizes};
use pyo3::prelude::*;
use pyo3::types::PyDict;

kwargs! {
    /// The keyword arguments of `sglang_commit_selection`.
    pub(crate) struct SelectArgs(Plan) {
        slots: Ints,
        steps: Ints,
        track_slots: Option<Ints>,
        track_steps: Option<Ints>,
        rows: Option<Ints>,
        num_slots: u64,
        num_rows: u64,
        draft: u64,
    }
}

/// Per pass (the commit, then the track pass when `track_slots` is given), the requests that
/// write, after the core has checked every index (a `PlanError` naming the request otherwise).
#[pyfunction]
#[pyo3(signature = (**kwargs))]
pub(crate) fn sglang_commit_selection(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Vec<Vec<u32>>> {
    let a = SelectArgs::from_kwargs(kwargs)?;
    let mut passes = vec![CommitPass { name: "commit", slots: &a.slots.0, steps: &a.steps.0 }];
    match (&a.track_slots, &a.track_steps) {
        (Some(slots), Some(steps)) => passes.push(CommitPass { name: "track", slots: &slots.0, steps: &steps.0 }),
        (Some(_), None) => return Err(Error::plan("track: track_indices given without steps_to_track").into()),
        _ => {}
    }
    let sizes = CommitSizes { num_slots: a.num_slots, num_rows: a.num_rows, draft: a.draft };
    Ok(sglang::commit_selection(&passes, a.rows.as_ref().map(|r| r.0.as_slice()), sizes)?)
}

kwargs! {
    /// The keyword arguments of `sglang_check_host_copy`.
    pub(crate) struct HostCopyArgs(Plan) {
        state: String,
        pool_dtype: DtypeName,
        pool_shape: Ints,
        host_dtype: DtypeName,
        host_shape: Ints,
        num_slots: u64,
    }
}

/// Refuses a host copy whose dtype or shape differ from the pool tensor's (`PlanError`).
#[pyfunction]
#[pyo3(signature = (**kwargs))]
pub(crate) fn sglang_check_host_copy(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
    let a = HostCopyArgs::from_kwargs(kwargs)?;
    Ok(sglang::check_host_copy(&a.state, &a.pool_dtype.0, &a.pool_shape.0, &a.host_dtype.0, &a.host_shape.0, a.num_slots as usize)?)
}
