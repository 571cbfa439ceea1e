//! The one description of a tensor the core checks without reading it: the state tensors a planner
//! binds and the device arguments a launch reads are described the same way (the bindings make the
//! description from the tensor itself; tests and benchmarks write it out).

use crate::dtype::DType;
use crate::error::{Error, Result};

/// What the core knows about one tensor or array: its data pointer, dtype as the framework spells
/// it (`"torch.float32"`, `"float32"`, `"int32"`, ...), shape, strides **in bytes**, device as a
/// string (`"cpu"`, `"cuda:0"`), whether its memory may be written, and whether autograd tracks it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorDesc {
    pub data_ptr: u64,
    pub dtype: String,
    pub shape: Vec<i64>,
    pub strides: Vec<i64>,
    pub device: String,
    /// False for read-only memory (a non-writeable numpy array, a read-only mapping): copies could
    /// not land there.
    pub writable: bool,
    /// Autograd tracks the tensor (torch's `requires_grad`).
    pub requires_grad: bool,
}

/// Bytes per element of `dtype` (a state dtype or an integer type, with or without the `torch.`
/// prefix; 1 for one the core does not know).
fn itemsize(dtype: &str) -> u64 {
    match dtype.trim().strip_prefix("torch.").unwrap_or(dtype.trim()) {
        "int64" | "uint64" => 8,
        "uint32" => 4,
        "int16" | "uint16" => 2,
        "bool" => 1,
        other => DType::parse(other).map_or(1, |d| d.itemsize()),
    }
}

impl TensorDesc {
    /// A writable, untracked tensor (what tests and benchmarks describe by hand).
    pub fn new(data_ptr: u64, dtype: &str, shape: Vec<i64>, strides: Vec<i64>, device: &str) -> TensorDesc {
        TensorDesc { data_ptr, dtype: dtype.to_string(), shape, strides, device: device.to_string(), writable: true, requires_grad: false }
    }

    /// A dense C-ordered tensor of `dtype` (a state dtype or an integer type such as `"int64"`)
    /// with `shape` at `data_ptr` on `device`.
    pub fn dense(data_ptr: u64, dtype: &str, shape: &[i64], device: &str) -> TensorDesc {
        let itemsize = itemsize(dtype) as i64;
        let mut strides = vec![0; shape.len()];
        let mut acc = itemsize;
        for i in (0..shape.len()).rev() {
            strides[i] = acc;
            acc *= shape[i].max(1);
        }
        TensorDesc::new(data_ptr, dtype, shape.to_vec(), strides, device)
    }

    /// Bytes per element of the tensor's dtype (1 for a dtype the core does not know).
    pub fn itemsize(&self) -> u64 {
        itemsize(&self.dtype)
    }

    /// The dtype without a framework prefix (`"torch.int32"` -> `"int32"`).
    pub fn dtype_name(&self) -> &str {
        let d = self.dtype.trim();
        d.strip_prefix("torch.").unwrap_or(d)
    }

    /// The dtype as a state element type.
    pub fn state_dtype(&self) -> Result<DType> {
        DType::parse(self.dtype_name())
    }

    /// Where the tensor lives.
    pub fn device(&self) -> Result<Device> {
        Device::parse(&self.device)
    }

    /// Refuses a tensor that autograd tracks: plans and kernels write states in place, outside
    /// autograd, which would leave a graph computed from values that no longer exist. `what` names
    /// the tensor.
    pub fn check_not_tracked(&self, what: &str) -> Result<()> {
        if self.requires_grad {
            return Err(Error::binding(format!(
                "{what}: the tensor requires grad; plans write state tensors in place, outside autograd: bind tensors that do \
                 not require grad (for example t.detach(), or allocate them under torch.no_grad())"
            )));
        }
        Ok(())
    }
}

/// Whether a tensor lives in host memory or on a CUDA device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(u32),
}

impl std::fmt::Display for Device {
    /// The torch spelling: `cpu`, `cuda:0`, ...
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl Device {
    pub fn parse(s: &str) -> Result<Device> {
        let t = s.trim();
        if t == "cpu" {
            return Ok(Device::Cpu);
        }
        if t == "cuda" {
            return Ok(Device::Cuda(0));
        }
        if let Some(i) = t.strip_prefix("cuda:") {
            if let Ok(i) = i.parse() {
                return Ok(Device::Cuda(i));
            }
        }
        Err(Error::binding(format!("unsupported device '{s}'; state tensors must be on 'cpu' or 'cuda'")))
    }
    pub fn is_cuda(&self) -> bool {
        matches!(self, Device::Cuda(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_tensors_are_c_ordered() {
        let t = TensorDesc::dense(64, "bfloat16", &[4, 3, 2], "cpu");
        assert_eq!((t.strides.as_slice(), t.dtype_name(), t.device().unwrap()), (&[12, 4, 2][..], "bfloat16", Device::Cpu));
        assert_eq!(TensorDesc::dense(0, "torch.int64", &[5, 3], "cuda:0").strides, vec![24, 8]);
        assert_eq!(TensorDesc { dtype: "torch.float32".into(), ..t.clone() }.state_dtype().unwrap(), DType::Float32);
        let tracked = TensorDesc { requires_grad: true, ..t };
        assert!(tracked.check_not_tracked("layer 0").unwrap_err().message.starts_with("layer 0: the tensor requires grad"));
    }

    #[test]
    fn devices_parse_as_torch_spells_them() {
        assert_eq!(Device::parse("cuda").unwrap(), Device::Cuda(0));
        assert_eq!(Device::parse("cuda:3").unwrap().to_string(), "cuda:3");
        assert!(Device::parse("tpu").unwrap_err().message.contains("unsupported device 'tpu'"));
    }
}
