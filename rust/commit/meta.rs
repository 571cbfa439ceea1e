//! The per-layer table of the RecoverSSM commit kernel (`struct CommitMeta` of the generated
//! `kernels/rs_abi.cuh`): each layer's five tensors — recurrent pool, corrections, key+gate
//! records, conv pool and verified conv windows — checked against what the kernel can take and
//! reduced to byte addresses, byte strides and geometry.
//!
//! Every rule the kernel relies on is checked here, before anything is launched: shapes that agree
//! with each other, dtypes the kernel is instantiated for, dense inner axes, element-aligned
//! addresses, one device, writable destinations, sizes that fit the kernel's 32-bit fields.

use crate::commit::recover::GateKind;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::constants::{DT_BF16, DT_F16, DT_F32, KIND_CONV_DS as CONV_DS, KIND_CONV_SD as CONV_SD, RC_GDN, RC_KDA, THREADS};
pub use crate::kernels::records::commit::CommitMeta;
use crate::layout::ConvLayout;
use crate::tensor::{Device, TensorDesc};

/// Threads per CTA of the commit kernel; each thread covers 4 key channels of a row.
const COMMIT_THREADS: u64 = THREADS as u64;

/// (recurrent state dtype, key+gate record dtype) pairs the kernel is instantiated for.
pub const COMMIT_DTYPE_PAIRS: [(DType, DType); 5] = [
    (DType::Float32, DType::Float32),
    (DType::Float32, DType::BFloat16),
    (DType::Float32, DType::Float16),
    (DType::BFloat16, DType::BFloat16),
    (DType::Float16, DType::Float16),
];

impl CommitMeta {
    /// Records from their little-endian bytes (a whole number of 128-byte records), as the kernel
    /// reads them; every byte pattern is a valid record.
    pub fn from_bytes(b: &[u8]) -> Result<Vec<CommitMeta>> {
        const SIZE: usize = std::mem::size_of::<CommitMeta>();
        if b.len() % SIZE != 0 {
            return Err(Error::binding(format!("a commit table is a whole number of {SIZE}-byte records, got {} bytes", b.len())));
        }
        Ok(b.chunks_exact(SIZE)
            .map(|c| {
                // SAFETY: `c` holds exactly size_of::<CommitMeta>() initialised bytes; CommitMeta is
                // `#[repr(C)]` plain integers with no padding (checked by the offset asserts above
                // and the record tests), so any bytes are a valid value; read_unaligned imposes no
                // alignment on `c`.
                unsafe { std::ptr::read_unaligned(c.as_ptr().cast::<CommitMeta>()) }
            })
            .collect())
    }
}

/// The tensors of a commit, one entry per layer in each slice. `conv` holds the conv pools and the
/// verified conv windows (`None`: the layers have no conv state).
#[derive(Clone, Copy, Debug)]
pub struct CommitTensors<'a> {
    pub recurrent: &'a [TensorDesc],
    pub corrections: &'a [TensorDesc],
    pub keygate: &'a [TensorDesc],
    pub conv: Option<(&'a [TensorDesc], &'a [TensorDesc])>,
}

/// The geometry every layer shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitConfig {
    pub kind: GateKind,
    pub conv_layout: ConvLayout,
    pub conv_kernel_size: u64,
}

fn dtype_code(d: DType) -> Option<u32> {
    match d {
        DType::Float32 => Some(DT_F32),
        DType::BFloat16 => Some(DT_BF16),
        DType::Float16 => Some(DT_F16),
        _ => None,
    }
}

/// The element type of `t`, or a binding error naming it.
fn dtype_of(t: &TensorDesc, what: &str) -> Result<DType> {
    t.state_dtype().map_err(|e| Error::binding(format!("{what}: {}", e.message)))
}

/// `[d0, d1, ...]` as non-negative integers, or an error naming the tensor.
fn dims(t: &TensorDesc, what: &str, rank: usize, expect: &str) -> Result<Vec<u64>> {
    if t.shape.len() != rank || t.strides.len() != rank {
        return Err(Error::binding(format!("{what} must be {expect}, got shape {:?}", t.shape)));
    }
    t.shape.iter().map(|&n| u64::try_from(n).map_err(|_| Error::binding(format!("{what}: negative dimension in shape {:?}", t.shape)))).collect()
}

/// Every axis but the first is dense (C order), the first (block / request) axis does not overlap
/// the others, the address and the first stride are element-aligned; returns the first axis' byte
/// stride.
fn dense_rows(t: &TensorDesc, what: &str) -> Result<u64> {
    let es = dtype_of(t, what)?.itemsize() as i64;
    let mut expect = es;
    for (&n, &st) in t.shape[1..].iter().zip(&t.strides[1..]).rev() {
        if n > 1 && st != expect {
            return Err(Error::binding(format!(
                "{what}: every axis but the first must be dense (C order); got shape {:?} with byte strides {:?}",
                t.shape, t.strides
            )));
        }
        expect = expect.saturating_mul(n);
    }
    let stride = t.strides[0];
    if t.shape[0] > 1 && stride < expect {
        return Err(Error::binding(format!("{what}: the first axis must not overlap the others (byte stride {stride} < {expect})")));
    }
    if t.data_ptr % es as u64 != 0 || stride.rem_euclid(es) != 0 {
        return Err(Error::binding(format!(
            "{what}: address {:#x} and first-axis byte stride {stride} must be multiples of the {}-byte element",
            t.data_ptr, es
        )));
    }
    // One past the last byte must be addressable.
    let rows = t.shape[0].max(1) as u64;
    (rows - 1)
        .checked_mul(stride.max(0) as u64)
        .and_then(|x| x.checked_add(expect as u64))
        .and_then(|x| x.checked_add(t.data_ptr))
        .ok_or_else(|| Error::binding(format!("{what}: the tensor's extent overflows the address space")))?;
    Ok(stride.max(0) as u64)
}

fn fits_u32(x: u64, what: &str) -> Result<u32> {
    u32::try_from(x).map_err(|_| Error::binding(format!("{what} = {x} does not fit the commit kernel's 32-bit field")))
}

/// Checks the commit tensors and builds the kernel's table, one [`CommitMeta`] per layer.
///
/// Per layer: `recurrent` `[num_blocks, H, V, K]` (float32, bfloat16 or float16), `corrections`
/// `[max_requests, H, Q, V]` float32, `keygate` `[max_requests, H, Q, K + 1]` (GDN) or `[..., 2K]`
/// (KDA) with a (state, record) dtype pair of [`COMMIT_DTYPE_PAIRS`], and with a conv state `conv`
/// `[num_blocks, W, D]` (SD) or `[num_blocks, D, W]` (DS) with `W = conv_kernel_size - 1 + Q - 1`
/// and `conv_window` `[max_requests, same]` of the conv dtype. Every axis but the first is dense;
/// the first stride is free. All tensors of all layers live on one device; the recurrent and conv
/// pools are writable.
pub fn commit_meta(t: &CommitTensors<'_>, cfg: &CommitConfig) -> Result<Vec<CommitMeta>> {
    let layers = t.recurrent.len();
    let (convs, wins) = match t.conv {
        Some((c, w)) => (Some(c), Some(w)),
        None => (None, None),
    };
    if t.corrections.len() != layers
        || t.keygate.len() != layers
        || convs.is_some_and(|c| c.len() != layers)
        || wins.is_some_and(|w| w.len() != layers)
    {
        return Err(Error::binding(format!(
            "one tensor per layer expected; got {layers} recurrent, {} corrections, {} keygate, {} conv, {} conv_window",
            t.corrections.len(),
            t.keygate.len(),
            convs.map_or(0, |c| c.len()),
            wins.map_or(0, |w| w.len())
        )));
    }
    if !(1..=0x1_0000).contains(&cfg.conv_kernel_size) {
        return Err(Error::binding(format!("conv_kernel_size must be in 1 ..= 65536, got {}", cfg.conv_kernel_size)));
    }
    let hist = cfg.conv_kernel_size - 1;
    let mut device: Option<(&str, Device)> = None;
    let mut out = Vec::with_capacity(layers);
    for l in 0..layers {
        let at = |name: &str| format!("layer {l}: {name}");
        let (rec, corr, kg) = (&t.recurrent[l], &t.corrections[l], &t.keygate[l]);
        let conv = convs.map(|c| (&c[l], &wins.expect("set with convs")[l]));

        let mut tensors = vec![("recurrent", rec), ("corrections", corr), ("keygate", kg)];
        if let Some((cv, win)) = conv {
            tensors.push(("conv", cv));
            tensors.push(("conv_window", win));
        }
        for (name, x) in &tensors {
            x.check_not_tracked(&at(name))?;
            let d = Device::parse(&x.device).map_err(|e| Error::binding(format!("{}: {}", at(name), e.message)))?;
            match &device {
                None => device = Some((&x.device, d)),
                Some((first, fd)) if *fd != d => {
                    return Err(Error::binding(format!(
                        "{}: on {}, but the commit tensors before it are on {first}: all layers must share one device",
                        at(name),
                        x.device
                    )))
                }
                _ => {}
            }
        }

        let (rec_dt, corr_dt, kg_dt) = (dtype_of(rec, &at("recurrent"))?, dtype_of(corr, &at("corrections"))?, dtype_of(kg, &at("keygate"))?);
        let [nb, h, v, k] = dims(rec, &at("recurrent"), 4, "[num_blocks, H, V, K]")?[..] else { unreachable!() };
        let c = dims(corr, &at("corrections"), 4, "float32 [max_requests, H, Q, V]")?;
        if corr_dt != DType::Float32 {
            return Err(Error::binding(format!("{} must be float32 [max_requests, H, Q, V], got {corr_dt}", at("corrections"))));
        }
        let (r, q) = (c[0], c[2]);
        if c != [r, h, q, v] {
            return Err(Error::binding(format!("{} must be [max_requests, H={h}, Q, V={v}], got {:?}", at("corrections"), corr.shape)));
        }
        let (kgw, kg_name) = match cfg.kind {
            GateKind::Kda => (2 * k, "2K"),
            GateKind::Gdn => (k + 1, "K+1"),
        };
        let g = dims(kg, &at("keygate"), 4, "[max_requests, H, Q, K+1 or 2K]")?;
        if g != [r, h, q, kgw] {
            return Err(Error::binding(format!(
                "{} must be [max_requests={r}, H={h}, Q={q}, {kg_name}={kgw}] for {}, got {:?}",
                at("keygate"),
                cfg.kind.name(),
                kg.shape
            )));
        }
        if q < 1 || h < 1 || v < 1 || k < 1 {
            return Err(Error::binding(format!("{}: empty dimensions (H={h}, V={v}, K={k}, Q={q})", at("recurrent"))));
        }
        if k.div_ceil(4) > COMMIT_THREADS {
            return Err(Error::binding(format!("{}: head_k_dim {k} exceeds the commit kernel's {}", at("recurrent"), 4 * COMMIT_THREADS)));
        }
        // The kernel forms byte offsets of a row as 32-bit products (elements x 4 bytes).
        if [v, k, kgw].iter().any(|&n| !n.checked_mul(4).is_some_and(|b| b < 1 << 32)) {
            return Err(Error::binding(format!("{}: head dimensions too large (V={v}, K={k})", at("recurrent"))));
        }
        if !COMMIT_DTYPE_PAIRS.contains(&(rec_dt, kg_dt)) {
            let pairs: Vec<String> = COMMIT_DTYPE_PAIRS.iter().map(|(a, b)| format!("{a}/{b}")).collect();
            return Err(Error::binding(format!(
                "layer {l}: the commit kernel takes (state, key+gate) dtypes {}; got {}/{}",
                pairs.join(", "),
                rec_dt,
                kg_dt
            )));
        }
        if !rec.writable {
            return Err(Error::binding(format!("{}: the commit writes it, but the memory is read-only", at("recurrent"))));
        }
        let rec_stride = dense_rows(rec, &at("recurrent"))?;
        let corr_stride = dense_rows(corr, &at("corrections"))?;
        let kg_stride = dense_rows(kg, &at("keygate"))?;
        let mut m = CommitMeta {
            rec_base: rec.data_ptr,
            rec_block_stride: rec_stride,
            corr_base: corr.data_ptr,
            corr_row_stride: corr_stride,
            kg_base: kg.data_ptr,
            kg_row_stride: kg_stride,
            heads: fits_u32(h, &at("heads"))?,
            head_v: v as u32,
            head_k: k as u32,
            window: fits_u32(q, &at("window Q"))?,
            kg_width: kgw as u32,
            kind: match cfg.kind {
                GateKind::Gdn => RC_GDN,
                GateKind::Kda => RC_KDA,
            },
            state_dtype: dtype_code(rec_dt).expect("a commit dtype pair"),
            kg_dtype: dtype_code(kg_dt).expect("a commit dtype pair"),
            ..CommitMeta::default()
        };
        if let Some((cv, win)) = conv {
            let s = dims(cv, &at("conv"), 3, "3-D")?;
            dims(win, &at("conv_window"), 3, "3-D")?;
            if s[0] != nb {
                return Err(Error::binding(format!("{} has {} blocks, the recurrent pool {nb}", at("conv"), s[0])));
            }
            let (cv_dt, win_dt) = (dtype_of(cv, &at("conv"))?, dtype_of(win, &at("conv_window"))?);
            if win.shape != [r as i64, cv.shape[1], cv.shape[2]] || win_dt != cv_dt {
                return Err(Error::binding(format!(
                    "{} must be [max_requests={r}, {}, {}] {}, got {:?} {}",
                    at("conv_window"),
                    s[1],
                    s[2],
                    cv_dt,
                    win.shape,
                    win_dt
                )));
            }
            let (w, d) = match cfg.conv_layout {
                ConvLayout::SD => (s[1], s[2]),
                ConvLayout::DS => (s[2], s[1]),
            };
            if w != hist + q - 1 {
                return Err(Error::binding(format!(
                    "{}: conv window width {w} != conv_kernel_size - 1 + Q - 1 = {} ({} layout, shape {:?})",
                    at("conv"),
                    hist + q - 1,
                    cfg.conv_layout.name(),
                    cv.shape
                )));
            }
            let es = cv_dt.itemsize();
            if !w.checked_mul(d).is_some_and(|n| n < 1 << 32) {
                return Err(Error::binding(format!("{}: a conv window of {w} x {d} elements is too large", at("conv"))));
            }
            if !cv.writable {
                return Err(Error::binding(format!("{}: the commit writes it, but the memory is read-only", at("conv"))));
            }
            m.conv_base = cv.data_ptr;
            m.conv_block_stride = dense_rows(cv, &at("conv"))?;
            m.win_base = win.data_ptr;
            m.win_row_stride = dense_rows(win, &at("conv_window"))?;
            m.conv_layout = match cfg.conv_layout {
                ConvLayout::SD => CONV_SD,
                ConvLayout::DS => CONV_DS,
            };
            m.conv_width = fits_u32(w, &at("conv window width"))?;
            m.conv_dim = fits_u32(d, &at("conv channels"))?;
            m.conv_hist = hist as u16;
            m.conv_elem = es as u16;
        }
        out.push(m);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(ptr: u64, dtype: DType, shape: &[i64]) -> TensorDesc {
        TensorDesc::dense(ptr, dtype.name(), shape, "cpu")
    }

    struct Case {
        rec: Vec<TensorDesc>,
        corr: Vec<TensorDesc>,
        kg: Vec<TensorDesc>,
        conv: Vec<TensorDesc>,
        win: Vec<TensorDesc>,
    }

    // KDA, H=2, V=K=8, Q=4, kernel 4 (W = 6), DS conv D=16 bf16, 5 blocks, 3 rows, 2 layers.
    fn case() -> Case {
        let mut c = Case { rec: vec![], corr: vec![], kg: vec![], conv: vec![], win: vec![] };
        for l in 0..2u64 {
            let b = 0x10_0000 * (l + 1);
            c.rec.push(dense(b, DType::Float32, &[5, 2, 8, 8]));
            c.corr.push(dense(b + 0x1_0000, DType::Float32, &[3, 2, 4, 8]));
            c.kg.push(dense(b + 0x2_0000, DType::BFloat16, &[3, 2, 4, 16]));
            c.conv.push(dense(b + 0x3_0000, DType::BFloat16, &[5, 16, 6]));
            c.win.push(dense(b + 0x4_0000, DType::BFloat16, &[3, 16, 6]));
        }
        c
    }

    fn cfg() -> CommitConfig {
        CommitConfig { kind: GateKind::Kda, conv_layout: ConvLayout::DS, conv_kernel_size: 4 }
    }

    fn build(c: &Case, cfg: &CommitConfig) -> Result<Vec<CommitMeta>> {
        commit_meta(&CommitTensors { recurrent: &c.rec, corrections: &c.corr, keygate: &c.kg, conv: Some((&c.conv, &c.win)) }, cfg)
    }

    fn err(c: &Case) -> String {
        build(c, &cfg()).unwrap_err().message
    }

    #[test]
    fn builds_the_table() {
        let c = case();
        let m = build(&c, &cfg()).unwrap();
        assert_eq!(m.len(), 2);
        let m1 = &m[1];
        assert_eq!((m1.rec_base, m1.rec_block_stride), (0x20_0000, 2 * 8 * 8 * 4));
        assert_eq!((m1.corr_row_stride, m1.kg_row_stride), (2 * 4 * 8 * 4, 2 * 4 * 16 * 2));
        assert_eq!((m1.heads, m1.head_v, m1.head_k, m1.window, m1.kg_width), (2, 8, 8, 4, 16));
        assert_eq!((m1.kind, m1.state_dtype, m1.kg_dtype), (RC_KDA, DT_F32, DT_BF16));
        assert_eq!((m1.conv_layout, m1.conv_width, m1.conv_dim, m1.conv_hist, m1.conv_elem), (CONV_DS, 6, 16, 3, 2));
        assert_eq!((m1.conv_block_stride, m1.win_row_stride), (16 * 6 * 2, 16 * 6 * 2));
        // Without a conv state the conv fields stay zero.
        let none = commit_meta(&CommitTensors { recurrent: &c.rec, corrections: &c.corr, keygate: &c.kg, conv: None }, &cfg()).unwrap();
        assert_eq!((none[0].conv_layout, none[0].conv_base, none[0].conv_width), (crate::kernels::constants::RC_NO_CONV, 0, 0));
        // GDN records are K + 1 wide; a padded first axis is fine.
        let mut g = case();
        for l in 0..2 {
            g.kg[l] = dense(g.kg[l].data_ptr, DType::Float32, &[3, 2, 4, 9]);
            g.kg[l].strides[0] += 64;
        }
        let gdn = CommitConfig { kind: GateKind::Gdn, ..cfg() };
        let m = build(&g, &gdn).unwrap();
        assert_eq!((m[0].kind, m[0].kg_width, m[0].kg_dtype, m[0].kg_row_stride), (RC_GDN, 9, DT_F32, 2 * 4 * 9 * 4 + 64));
    }

    #[test]
    fn rejects_what_the_kernel_cannot_take() {
        type Mutation = fn(&mut Case);
        let cases: [(Mutation, &str); 13] = [
            (|c| c.kg[0] = dense(c.kg[0].data_ptr, DType::BFloat16, &[3, 2, 4, 9]), "layer 0: keygate must be [max_requests=3, H=2, Q=4, 2K=16]"),
            (|c| c.rec[0].strides.swap(2, 3), "dense"),
            (
                |c| {
                    c.conv[0] = dense(c.conv[0].data_ptr, DType::BFloat16, &[5, 16, 5]);
                    c.win[0] = dense(c.win[0].data_ptr, DType::BFloat16, &[3, 16, 5]);
                },
                "conv window width 5 != conv_kernel_size - 1 + Q - 1 = 6",
            ),
            (|c| c.win[1] = dense(c.win[1].data_ptr, DType::Float32, &[3, 16, 6]), "layer 1: conv_window must be [max_requests=3, 16, 6] bfloat16"),
            (|c| c.conv[0] = dense(c.conv[0].data_ptr, DType::BFloat16, &[4, 16, 6]), "conv has 4 blocks, the recurrent pool 5"),
            (|c| c.corr[0].dtype = "bfloat16".into(), "corrections must be float32"),
            (|c| c.corr[1] = dense(c.corr[1].data_ptr, DType::Float32, &[3, 2, 4, 7]), "layer 1: corrections must be [max_requests, H=2, Q, V=8]"),
            (|c| c.rec[0].data_ptr += 2, "multiples of the 4-byte element"),
            (|c| c.rec[0].strides[0] = 8, "must not overlap"), // blocks overlap
            (|c| c.conv[1].writable = false, "layer 1: conv: the commit writes it"),
            (|c| c.kg[1].device = "cuda:0".into(), "all layers must share one device"),
            (
                |c| {
                    c.rec[0] = dense(c.rec[0].data_ptr, DType::Float32, &[5, 2, 8, 2000]);
                    c.kg[0] = dense(c.kg[0].data_ptr, DType::BFloat16, &[3, 2, 4, 4000]);
                },
                "head_k_dim 2000 exceeds",
            ),
            (|c| c.rec[1].requires_grad = true, "layer 1: recurrent: the tensor requires grad"),
        ];
        for (mutate, expected) in cases {
            let mut c = case();
            mutate(&mut c);
            let m = err(&c);
            assert!(m.contains(expected), "{expected:?} not in {m:?}");
        }

        let mut c = case();
        c.rec[1] = dense(c.rec[1].data_ptr, DType::Float16, &[5, 2, 8, 8]);
        let m = err(&c);
        assert!(m.starts_with("layer 1: the commit kernel takes (state, key+gate) dtypes") && m.ends_with("got float16/bfloat16"), "{m}");

        let c = case();
        let short =
            commit_meta(&CommitTensors { recurrent: &c.rec, corrections: &c.corr[..1], keygate: &c.kg, conv: Some((&c.conv, &c.win)) }, &cfg());
        assert!(short.unwrap_err().message.contains("one tensor per layer"));
        let bad = build(&c, &CommitConfig { conv_kernel_size: 0, ..cfg() }).unwrap_err().message;
        assert!(bad.contains("conv_kernel_size must be in 1 ..= 65536"), "{bad}");
    }
}
