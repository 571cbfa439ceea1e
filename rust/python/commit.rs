//! Bindings for the RecoverSSM commit kernel's per-layer table: the tensors' descriptions in, the
//! checked table out (the rules live in `crate::commit_meta`).

use super::plan::{tensor_desc, DescTuple, RawBuffer};
use super::IntoPyResult;
use crate::binding::TensorDesc;
use crate::commit_meta::{commit_meta, CommitConfig, CommitTensors};
use crate::error::Error;
use crate::layout::ConvLayout;
use crate::recover::GateKind;
use pyo3::prelude::*;

fn descs(py: Python<'_>, ts: &[DescTuple<'_>], name: &str) -> PyResult<Vec<TensorDesc>> {
    ts.iter().enumerate().map(|(l, t)| tensor_desc(py, t, || format!("layer {l}: {name}"))).collect()
}

/// The commit kernel's table (`CommitMeta` records, 128 bytes per layer) for per-layer tensor
/// descriptions; `conv` / `conv_window` both `None` for layers without a conv state.
#[pyfunction]
#[pyo3(signature = (recurrent, corrections, keygate, conv, conv_window, kind, conv_layout, conv_kernel_size))]
#[allow(clippy::too_many_arguments)]
fn commit_meta_table(
    py: Python<'_>,
    recurrent: Vec<DescTuple<'_>>,
    corrections: Vec<DescTuple<'_>>,
    keygate: Vec<DescTuple<'_>>,
    conv: Option<Vec<DescTuple<'_>>>,
    conv_window: Option<Vec<DescTuple<'_>>>,
    kind: &str,
    conv_layout: &str,
    conv_kernel_size: &Bound<'_, PyAny>,
) -> PyResult<RawBuffer> {
    let kind = GateKind::parse(kind).py_err(py)?;
    let conv_layout = ConvLayout::parse(conv_layout)
        .map_err(|e| Error::binding(format!("conv_layout: {}", e.message)))
        .py_err(py)?;
    let conv_kernel_size = conv_kernel_size
        .extract::<u64>()
        .map_err(|_| Error::binding(format!("conv_kernel_size must be in 1 ..= 65536, got {conv_kernel_size}")))
        .py_err(py)?;
    let (rec, corr, kg) = (descs(py, &recurrent, "recurrent")?, descs(py, &corrections, "corrections")?, descs(py, &keygate, "keygate")?);
    let pair = match (conv, conv_window) {
        (None, None) => None,
        (Some(c), Some(w)) => Some((descs(py, &c, "conv")?, descs(py, &w, "conv_window")?)),
        _ => return Err(Error::binding("conv and conv_window: give both or neither")).py_err(py),
    };
    let tensors = CommitTensors {
        recurrent: &rec,
        corrections: &corr,
        keygate: &kg,
        conv: pair.as_ref().map(|(c, w)| (c.as_slice(), w.as_slice())),
    };
    let meta = commit_meta(&tensors, &CommitConfig { kind, conv_layout, conv_kernel_size }).py_err(py)?;
    Ok(RawBuffer::commit_meta(meta))
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(commit_meta_table, m)?)?;
    Ok(())
}
