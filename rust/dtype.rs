//! Element types a recurrent state may hold.

use crate::error::{Error, Result};
use std::fmt;

/// A state's element type. Names follow torch (`float32`, `bfloat16`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    Float64,
    Float32,
    Float16,
    BFloat16,
    Float8E4M3Fn,
    Float8E5M2,
    Int32,
    Int8,
    UInt8,
}

impl DType {
    pub const ALL: [DType; 9] = [
        DType::Float64,
        DType::Float32,
        DType::Float16,
        DType::BFloat16,
        DType::Float8E4M3Fn,
        DType::Float8E5M2,
        DType::Int32,
        DType::Int8,
        DType::UInt8,
    ];

    /// Bytes per element.
    pub fn itemsize(self) -> u64 {
        match self {
            DType::Float64 => 8,
            DType::Float32 | DType::Int32 => 4,
            DType::Float16 | DType::BFloat16 => 2,
            DType::Float8E4M3Fn | DType::Float8E5M2 | DType::Int8 | DType::UInt8 => 1,
        }
    }

    /// The canonical (torch) name.
    pub fn name(self) -> &'static str {
        match self {
            DType::Float64 => "float64",
            DType::Float32 => "float32",
            DType::Float16 => "float16",
            DType::BFloat16 => "bfloat16",
            DType::Float8E4M3Fn => "float8_e4m3fn",
            DType::Float8E5M2 => "float8_e5m2",
            DType::Int32 => "int32",
            DType::Int8 => "int8",
            DType::UInt8 => "uint8",
        }
    }

    /// Parses a dtype name. Accepts the torch names, with or without a `torch.` prefix, and the
    /// usual short aliases (`fp32`, `bf16`, `half`, `fp8`, ...).
    pub fn parse(name: &str) -> Result<DType> {
        let n = name.trim();
        let n = n.strip_prefix("torch.").unwrap_or(n);
        let n = n.to_ascii_lowercase();
        let d = match n.as_str() {
            "float64" | "double" | "fp64" | "f64" => DType::Float64,
            "float32" | "float" | "fp32" | "f32" => DType::Float32,
            "float16" | "half" | "fp16" | "f16" => DType::Float16,
            "bfloat16" | "bf16" => DType::BFloat16,
            "float8_e4m3fn" | "fp8" | "fp8_e4m3" | "float8_e4m3" => DType::Float8E4M3Fn,
            "float8_e5m2" | "fp8_e5m2" => DType::Float8E5M2,
            "int32" | "i32" => DType::Int32,
            "int8" | "i8" => DType::Int8,
            "uint8" | "u8" => DType::UInt8,
            _ => {
                let known: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
                return Err(Error::layout(format!("unknown dtype '{name}'; expected one of: {}", known.join(", "))));
            }
        };
        Ok(d)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_torch_names_and_aliases() {
        assert_eq!(DType::parse("torch.bfloat16").unwrap(), DType::BFloat16);
        assert_eq!(DType::parse("fp32").unwrap(), DType::Float32);
        assert_eq!(DType::parse("float8_e4m3fn").unwrap(), DType::Float8E4M3Fn);
        assert_eq!(DType::parse("uint8").unwrap().itemsize(), 1);
        for d in DType::ALL {
            assert_eq!(DType::parse(d.name()).unwrap(), d);
        }
    }

    #[test]
    fn rejects_unknown_names() {
        let e = DType::parse("complex64").unwrap_err();
        assert!(e.message.contains("unknown dtype 'complex64'"), "{}", e.message);
        assert!(e.message.contains("bfloat16"));
    }
}
