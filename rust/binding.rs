//! Binding a layout to real state tensors: each persistent state of each layer is a tensor
//! `[num_blocks, *state_shape]` (possibly a strided view into a shared buffer). The binding checks
//! every tensor against the layout and records only what the planner needs.

use crate::error::{Error, Result};
use crate::layout::{ConvGeometry, Layout};
use crate::tensor::{Device, TensorDesc};

/// Geometry of one bound (layer, persistent state) tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateTensor {
    /// Address of block 0.
    pub base: u64,
    pub num_blocks: u64,
    /// Bytes between consecutive blocks (>= `state_bytes`).
    pub block_stride: u64,
    /// Bytes of one block's state (dense).
    pub state_bytes: u64,
    pub elem_bytes: u32,
    /// Conv window geometry for conv-copied states.
    pub conv: Option<ConvGeometry>,
    pub layer: u32,
    pub state: u32,
}

impl StateTensor {
    /// One past the last byte any block of this tensor may touch.
    pub fn end(&self) -> u64 {
        // Checked at bind time not to overflow.
        self.base + (self.num_blocks - 1) * self.block_stride + self.state_bytes
    }
    /// Address of block `b`'s state (`b < num_blocks`).
    #[inline]
    pub fn block_addr(&self, b: u64) -> u64 {
        self.base + b * self.block_stride
    }
}

/// A layout bound to the persistent state tensors of `num_layers` layers.
#[derive(Clone, Debug)]
pub struct Binding {
    layout: Layout,
    num_layers: usize,
    num_blocks: u64,
    device: Device,
    /// Layer-major: `tensors[layer * num_persistent + state]`.
    tensors: Vec<StateTensor>,
    /// Sorted disjoint address spans covered by the tensors: checked before a plan runs.
    spans: Vec<(u64, u64)>,
}

impl Binding {
    /// Checks `tensors[layer][state]` against `layout` and binds them. Each layer must give either
    /// its persistent states or all of its states (workspace tensors are then ignored: they are
    /// never copied).
    pub fn new(layout: &Layout, tensors: &[Vec<TensorDesc>]) -> Result<Binding> {
        let backend = layout.backend();
        if tensors.is_empty() {
            return Err(Error::binding(format!("{backend}: no layers given; pass one list of state tensors per layer")));
        }
        let np = layout.copyable_prefix_len();
        let mut out = Vec::with_capacity(tensors.len() * np);
        let mut device: Option<(Device, String)> = None;
        let mut num_blocks: Option<(u64, usize, usize)> = None;
        for (layer, per_layer) in tensors.iter().enumerate() {
            if per_layer.len() != np && per_layer.len() != layout.states().len() {
                return Err(Error::binding(format!(
                    "{backend}: layer {layer}: got {} state tensors; expected the {np} persistent states ({}) or all {} states",
                    per_layer.len(),
                    layout.persistent().iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", "),
                    layout.states().len()
                )));
            }
            for (si, (spec, t)) in layout.persistent().iter().zip(per_layer).enumerate() {
                let at = |m: String| Error::binding(format!("{backend}: layer {layer}, state {si} ('{}'): {m}", spec.name));
                t.check_not_tracked(&format!("{backend}: layer {layer}, state {si} ('{}')", spec.name))?;
                let dev = t.device().map_err(|e| at(e.message))?;
                match &device {
                    None => device = Some((dev.clone(), t.device.clone())),
                    Some((d, name)) if *d != dev => {
                        return Err(at(format!(
                            "the tensor is on '{}' but earlier state tensors are on '{name}'; all state tensors must share one device",
                            t.device
                        )))
                    }
                    _ => {}
                }
                let dtype = t.state_dtype().map_err(|e| at(e.message))?;
                if dtype != spec.dtype {
                    return Err(at(format!("dtype is {dtype} but the layout declares {}", spec.dtype)));
                }
                let ndim = spec.shape.len() + 1;
                if t.shape.len() != ndim || t.strides.len() != ndim {
                    return Err(at(format!(
                        "expected a {ndim}-D tensor [num_blocks, {}], got shape {:?}",
                        spec.shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "),
                        t.shape
                    )));
                }
                if t.shape[1..].iter().zip(&spec.shape).any(|(&a, &b)| a < 0 || a as u64 != b) {
                    return Err(at(format!("per-block shape {:?} does not match the layout's {:?}", &t.shape[1..], spec.shape)));
                }
                if t.shape[0] < 2 {
                    return Err(at(format!("the tensor has {} blocks; a block pool needs the null block 0 and at least one more", t.shape[0])));
                }
                // Inner dimensions must be dense and C-ordered: the state of one block is one
                // contiguous byte range.
                let elem = dtype.itemsize();
                let mut expect: i64 = elem as i64;
                for axis in (1..ndim).rev() {
                    if t.shape[axis] > 1 && t.strides[axis] != expect {
                        return Err(at(format!(
                            "inner dimensions must be dense (C-contiguous per block): stride of dim {axis} is {} bytes, expected {expect} (byte strides {:?})",
                            t.strides[axis], t.strides
                        )));
                    }
                    expect = expect.saturating_mul(t.shape[axis]);
                }
                let state_bytes = spec.nbytes().expect("layout checked the byte size");
                if state_bytes > u32::MAX as u64 {
                    return Err(at(format!("one block's state is {state_bytes} bytes; states above 4 GiB - 1 per block are not supported")));
                }
                if t.strides[0] <= 0 || t.strides[0] as u64 % elem != 0 {
                    return Err(at(format!("the block stride is {} bytes; it must be a positive multiple of the element size {elem}", t.strides[0])));
                }
                let block_stride = t.strides[0] as u64;
                if block_stride < state_bytes {
                    return Err(at(format!(
                        "the block stride ({block_stride} bytes) is smaller than one block's state ({state_bytes} bytes): blocks would overlap"
                    )));
                }
                if !t.writable {
                    return Err(at("the tensor is read-only; state tensors must be writable".into()));
                }
                if t.data_ptr == 0 {
                    return Err(at("the data pointer is null".into()));
                }
                if t.data_ptr % elem != 0 {
                    return Err(at(format!("the data pointer {:#x} is not aligned to the element size {elem}", t.data_ptr)));
                }
                let nb = t.shape[0] as u64;
                let end = (nb - 1)
                    .checked_mul(block_stride)
                    .and_then(|x| x.checked_add(state_bytes))
                    .and_then(|x| x.checked_add(t.data_ptr))
                    .ok_or_else(|| at("the tensor's address range overflows 64 bits".into()))?;
                let _ = end;
                match num_blocks {
                    None => num_blocks = Some((nb, layer, si)),
                    Some((n, l0, s0)) if n != nb => {
                        return Err(at(format!(
                            "has {nb} blocks but layer {l0}, state {s0} has {n}; all state tensors are indexed by one block table and must have the same number of blocks"
                        )))
                    }
                    _ => {}
                }
                out.push(StateTensor {
                    base: t.data_ptr,
                    num_blocks: nb,
                    block_stride,
                    state_bytes,
                    elem_bytes: elem as u32,
                    conv: spec.conv_geometry(),
                    layer: layer as u32,
                    state: si as u32,
                });
            }
        }
        let spans = merged_spans(&out);
        let b = Binding {
            layout: layout.clone(),
            num_layers: tensors.len(),
            num_blocks: num_blocks.map(|n| n.0).unwrap_or(0),
            device: device.map(|d| d.0).unwrap_or(Device::Cpu),
            tensors: out,
            spans,
        };
        b.check_disjoint()?;
        Ok(b)
    }

    /// No byte of any block of one (layer, state) may alias a byte of another block, of the same
    /// tensor or of any other bound tensor: copies into one would silently change the other.
    fn check_disjoint(&self) -> Result<()> {
        let n = self.tensors.len();
        for i in 0..n {
            for j in (i + 1)..n {
                let (a, b) = (&self.tensors[i], &self.tensors[j]);
                if overlap(a, b) {
                    return Err(Error::binding(format!(
                        "{}: {} and {} share memory: some block of one overlaps a block of the other; give each layer and state its \
                         own region (views into one buffer must interleave without overlap)",
                        self.layout.backend(),
                        self.name(a),
                        self.name(b)
                    )));
                }
            }
        }
        Ok(())
    }

    /// `layer L, state S ('name')` of a bound tensor.
    fn name(&self, t: &StateTensor) -> String {
        format!("layer {}, state {} ('{}')", t.layer, t.state, self.layout.states()[t.state as usize].name)
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    pub fn num_layers(&self) -> usize {
        self.num_layers
    }
    pub fn num_blocks(&self) -> u64 {
        self.num_blocks
    }
    /// Number of persistent states per layer.
    pub fn num_states(&self) -> usize {
        self.layout.copyable_prefix_len()
    }
    pub fn device(&self) -> &Device {
        &self.device
    }
    /// Layer-major bound tensors.
    pub fn tensors(&self) -> &[StateTensor] {
        &self.tensors
    }
    pub fn tensor(&self, layer: usize, state: usize) -> &StateTensor {
        &self.tensors[layer * self.num_states() + state]
    }

    /// Whether `[addr, addr + len)` lies inside the memory spanned by the bound tensors: the
    /// check that makes executing a plan memory-safe.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        let Some(end) = addr.checked_add(len) else { return false };
        let pos = self.spans.partition_point(|&(base, _)| base <= addr);
        pos > 0 && self.spans[pos - 1].1 >= end
    }
}

/// The union of the tensors' address ranges, as sorted disjoint `(start, end)` spans.
fn merged_spans(tensors: &[StateTensor]) -> Vec<(u64, u64)> {
    let mut r: Vec<(u64, u64)> = tensors.iter().map(|t| (t.base, t.end())).collect();
    r.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(r.len());
    for (s, e) in r {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Whether some block of `a` overlaps some block of `b`.
fn overlap(a: &StateTensor, b: &StateTensor) -> bool {
    !(a.end() <= b.base || b.end() <= a.base || interleaved_disjoint(a, b))
}

/// Two strided tensors whose address ranges overlap: their blocks must still be disjoint. Exact
/// and O(1) when the strides are equal (the usual case: views into one buffer of pages);
/// otherwise the blocks inside the overlapping window are sorted and checked.
fn interleaved_disjoint(a: &StateTensor, b: &StateTensor) -> bool {
    if a.block_stride == b.block_stride {
        let s = a.block_stride as i128;
        // b's blocks start at offset d within a's period; a occupies [0, a.state_bytes).
        let d = (b.base as i128 - a.base as i128).rem_euclid(s) as u64;
        return d >= a.state_bytes && d + b.state_bytes <= a.block_stride;
    }
    let lo = a.base.max(b.base);
    let hi = a.end().min(b.end());
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for t in [a, b] {
        let first = lo.saturating_sub(t.base) / t.block_stride;
        let first = first.saturating_sub(1);
        let mut i = first;
        while i < t.num_blocks && t.block_addr(i) < hi {
            spans.push((t.block_addr(i), t.block_addr(i) + t.state_bytes));
            i += 1;
        }
    }
    spans.sort_unstable();
    spans.windows(2).all(|w| w[0].1 <= w[1].0)
}
