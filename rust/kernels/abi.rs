//! The calling convention of every kernel, owned by the core: each entry point's parameters (name
//! and C type, in order), and the packing of argument values into the buffer the CUDA driver takes
//! (`cuLaunchKernel`'s `CU_LAUNCH_PARAM_BUFFER_POINTER`: each parameter at the next offset aligned
//! to its own size). The launch layer in Python only hands a [`Launch`]'s buffer to the driver; the
//! host emulation unpacks the same buffer by the kernel's declared C++ parameter types. The generated
//! CUDA header declares every entry point from [`KERNELS`] ([`super::header`]), so the compilers
//! refuse a definition in the sources whose parameters differ.

use crate::error::{Error, Result};

/// A parameter's type as the driver sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamType {
    /// Any pointer (a device address, 8 bytes).
    Ptr,
    U32,
    I32,
    I64,
}

impl ParamType {
    /// The type of a C parameter declaration's type (`"const int32_t*"`, `"uint32_t"`, ...).
    pub fn of_c(c_type: &str) -> Option<ParamType> {
        let t = c_type.trim();
        if t.ends_with('*') {
            return Some(ParamType::Ptr);
        }
        match t {
            "uint32_t" => Some(ParamType::U32),
            "int32_t" => Some(ParamType::I32),
            "int64_t" => Some(ParamType::I64),
            _ => None,
        }
    }
    /// Bytes (and alignment) of the parameter in the argument buffer.
    pub fn size(self) -> usize {
        match self {
            ParamType::U32 | ParamType::I32 => 4,
            ParamType::Ptr | ParamType::I64 => 8,
        }
    }
}

/// One kernel entry point: name, source file, parameters `(name, C type)` in declaration order.
#[derive(Debug, PartialEq, Eq)]
pub struct KernelSpec {
    pub name: &'static str,
    pub file: &'static str,
    pub params: &'static [(&'static str, &'static str)],
}

impl KernelSpec {
    pub fn param_types(&self) -> impl Iterator<Item = ParamType> + '_ {
        self.params.iter().map(|(_, c)| ParamType::of_c(c).expect("KERNELS holds known C types"))
    }
}

pub const COPY_TILES: KernelSpec = KernelSpec {
    name: "rs_copy_tiles",
    file: "copy_tiles.cu",
    params: &[("segments", "const Segment*"), ("tiles", "const Tile*"), ("first_tile", "uint32_t"), ("num_tiles", "uint32_t")],
};

pub const STATE_COPY: KernelSpec = KernelSpec {
    name: "rs_state_copy",
    file: "state_copy.cu",
    params: &[
        ("metas", "const StateMeta*"),
        ("num_meta", "uint32_t"),
        ("block_table", "const int32_t*"),
        ("bt_row_stride", "int64_t"),
        ("bt_cols", "int32_t"),
        ("bt_group_stride", "int64_t"),
        ("src_col", "const int32_t*"),
        ("dst_or_running", "const int32_t*"),
        ("num_accepted", "const int32_t*"),
        ("num_accepted_out", "int32_t*"),
        ("block_size", "int32_t"),
        ("num_requests", "int32_t"),
        ("max_accepted", "int32_t"),
        ("num_blocks", "int64_t"),
        ("flags", "uint32_t"),
        ("err", "int32_t*"),
    ],
};

pub const STATE_COPY_SLOTS: KernelSpec = KernelSpec {
    name: "rs_state_copy_slots",
    file: "state_copy_slots.cu",
    params: &[
        ("metas", "const StateMeta*"),
        ("num_meta", "uint32_t"),
        ("tables", "const TableRef*"),
        ("num_tables", "uint32_t"),
        ("bt_cols", "int32_t"),
        ("idx_mapping", "const int32_t*"),
        ("num_rows", "int32_t"),
        ("num_computed", "const int32_t*"),
        ("query_start_loc", "const int32_t*"),
        ("num_sampled", "const int32_t*"),
        ("sampled_fill", "int32_t"),
        ("commit_computed", "const int32_t*"),
        ("commit_cols", "int32_t"),
        ("commit_stage", "const int32_t*"),
        ("commit_rows", "const CommitRow*"),
        ("commit_cap", "uint32_t"),
        ("commit_metas", "const CommitMeta*"),
        ("commit_layers", "uint32_t"),
        ("commit_blocks", "int64_t"),
        ("commit_workspace", "uint32_t"),
        ("rec_ctas", "uint32_t"),
        ("conv_ctas", "uint32_t"),
        ("state_idx", "int32_t*"),
        ("num_accepted", "int32_t*"),
        ("scratch", "int32_t*"),
        ("ctl", "int32_t*"),
        ("num_slots", "int32_t"),
        ("block_size", "int32_t"),
        ("max_accepted", "int32_t"),
        ("num_blocks", "int64_t"),
        ("flags", "uint32_t"),
        ("err", "int32_t*"),
    ],
};

pub const RECOVER_COMMIT: KernelSpec = KernelSpec {
    name: "rs_recover_commit",
    file: "recover_commit.cu",
    params: &[
        ("metas", "const CommitMeta*"),
        ("num_layers", "uint32_t"),
        ("rows", "const CommitRow*"),
        ("num_rows", "uint32_t"),
        ("num_accepted", "const int32_t*"),
        ("num_counts", "uint32_t"),
        ("num_blocks", "int64_t"),
        ("max_requests", "uint32_t"),
        ("rec_ctas", "uint32_t"),
        ("err", "int32_t*"),
    ],
};

pub const SLOT_SCATTER: KernelSpec = KernelSpec {
    name: "rs_slot_scatter",
    file: "slot_scatter.cu",
    params: &[
        ("metas", "const SlotCopy*"),
        ("num_meta", "uint32_t"),
        ("slots", "const int64_t*"),
        ("steps", "const int64_t*"),
        ("rows", "const int64_t*"),
        ("track_slots", "const int64_t*"),
        ("track_steps", "const int64_t*"),
        ("num_requests", "int32_t"),
        ("num_slots", "int64_t"),
        ("num_rows", "int64_t"),
        ("draft", "int64_t"),
        ("err", "int32_t*"),
    ],
};

/// Every kernel entry point, in module order.
pub const KERNELS: [&KernelSpec; 5] = [&COPY_TILES, &STATE_COPY, &RECOVER_COMMIT, &SLOT_SCATTER, &STATE_COPY_SLOTS];

/// The kernel source files, in module order (one module holds them all).
pub const KERNEL_FILES: [&str; 5] = ["copy_tiles.cu", "state_copy.cu", "recover_commit.cu", "slot_scatter.cu", "state_copy_slots.cu"];

/// The kernel named `name`.
pub fn kernel(name: &str) -> Result<&'static KernelSpec> {
    KERNELS.iter().copied().find(|k| k.name == name).ok_or_else(|| {
        let names: Vec<&str> = KERNELS.iter().map(|k| k.name).collect();
        Error::plan(format!("unknown kernel {name:?}; known: {}", names.join(", ")))
    })
}

/// Packs raw integer values for `kernel`, each checked against its parameter's type range (for
/// tools and tests that launch a kernel with arguments of their own; the launch builders are the
/// product's path).
pub fn pack(kernel: &'static KernelSpec, grid: [u32; 3], block: [u32; 3], values: &[i128]) -> Result<Launch> {
    if values.len() != kernel.params.len() {
        return Err(Error::plan(format!("{}: {} values for {} parameters", kernel.name, values.len(), kernel.params.len())));
    }
    let mut args = Vec::with_capacity(values.len());
    for ((&v, (name, c_type)), ty) in values.iter().zip(kernel.params).zip(kernel.param_types()) {
        let bad = || Error::plan(format!("{}: {name} = {v} does not fit {c_type}", kernel.name));
        args.push(match ty {
            ParamType::Ptr => Arg::Ptr(u64::try_from(v).map_err(|_| bad())?),
            ParamType::U32 => Arg::U32(u32::try_from(v).map_err(|_| bad())?),
            ParamType::I32 => Arg::I32(i32::try_from(v).map_err(|_| bad())?),
            ParamType::I64 => Arg::I64(i64::try_from(v).map_err(|_| bad())?),
        });
    }
    Launch::new(kernel, grid, block, &args)
}

/// One argument value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    Ptr(u64),
    U32(u32),
    I32(i32),
    I64(i64),
}

impl Arg {
    fn ty(self) -> ParamType {
        match self {
            Arg::Ptr(_) => ParamType::Ptr,
            Arg::U32(_) => ParamType::U32,
            Arg::I32(_) => ParamType::I32,
            Arg::I64(_) => ParamType::I64,
        }
    }
    fn write(self, out: &mut [u8]) {
        match self {
            Arg::Ptr(v) => out.copy_from_slice(&v.to_le_bytes()),
            Arg::U32(v) => out.copy_from_slice(&v.to_le_bytes()),
            Arg::I32(v) => out.copy_from_slice(&v.to_le_bytes()),
            Arg::I64(v) => out.copy_from_slice(&v.to_le_bytes()),
        }
    }
}

/// Everything a launch needs: the kernel, the grid, the block and the packed argument buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    pub kernel: &'static KernelSpec,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// The argument buffer, in 8-byte words so that it is 8-byte aligned.
    words: Vec<u64>,
    len: usize,
}

impl Launch {
    /// Packs `args` for `kernel`: one value per parameter, in order, of the parameter's type.
    pub fn new(kernel: &'static KernelSpec, grid: [u32; 3], block: [u32; 3], args: &[Arg]) -> Result<Launch> {
        if args.len() != kernel.params.len() {
            return Err(Error::plan(format!(
                "{}: {} arguments for {} parameters (a bug in the core's launch builder)",
                kernel.name,
                args.len(),
                kernel.params.len()
            )));
        }
        let mut bytes = vec![0u8; 0];
        for ((arg, (name, c_type)), ty) in args.iter().zip(kernel.params).zip(kernel.param_types()) {
            if arg.ty() != ty {
                return Err(Error::plan(format!(
                    "{}: parameter {name} is {c_type}, got a {:?} argument (a bug in the core's launch builder)",
                    kernel.name,
                    arg.ty()
                )));
            }
            let at = bytes.len().next_multiple_of(ty.size());
            bytes.resize(at + ty.size(), 0);
            arg.write(&mut bytes[at..]);
        }
        let len = bytes.len();
        let words = bytes.chunks(8).map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(w)
        });
        Ok(Launch { kernel, grid, block, words: words.collect(), len })
    }

    /// The packed arguments (`len()` bytes at an 8-byte aligned address).
    pub fn args(&self) -> &[u8] {
        // SAFETY: `words` holds `ceil(len / 8)` initialised u64s; viewing their first `len` bytes
        // as u8 is in bounds (len <= 8 * words.len()) and u8 has no alignment requirement.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }

    /// The argument values unpacked from the buffer (for tests and debugging).
    pub fn values(&self) -> Vec<(&'static str, i128)> {
        let b = self.args();
        let mut at: usize = 0;
        let mut out = Vec::with_capacity(self.kernel.params.len());
        for ((name, _), ty) in self.kernel.params.iter().zip(self.kernel.param_types()) {
            at = at.next_multiple_of(ty.size());
            let s = &b[at..at + ty.size()];
            let v: i128 = match ty {
                ParamType::Ptr => u64::from_le_bytes(s.try_into().expect("8 bytes")) as i128,
                ParamType::U32 => u32::from_le_bytes(s.try_into().expect("4 bytes")) as i128,
                ParamType::I32 => i32::from_le_bytes(s.try_into().expect("4 bytes")) as i128,
                ParamType::I64 => i64::from_le_bytes(s.try_into().expect("8 bytes")) as i128,
            };
            out.push((*name, v));
            at += ty.size();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_follows_natural_alignment() {
        // metas(8) num_meta(4) pad(4) block_table(8) bt_row_stride(8) bt_cols(4) pad(4) bt_group_stride(8)
        // src(8) dst(8) acc(8) acc_out(8) block_size(4) num_requests(4) max_accepted(4) pad(4) num_blocks(8)
        // flags(4) pad(4) err(8)
        // One value per parameter, each packed as its parameter's type (pack -> Launch::new).
        let values = [1, 2, 3, -4, 5, 55, 6, 7, 8, 88, 9, 10, 11, 12, 13, 14];
        let l = pack(&STATE_COPY, [1, 1, 1], [256, 1, 1], &values).unwrap();
        assert_eq!(l.args().len(), 120);
        assert_eq!(l.args().as_ptr() as usize % 8, 0);
        assert_eq!(&l.args()[16..24], &3u64.to_le_bytes());
        assert_eq!(&l.args()[24..32], &(-4i64).to_le_bytes());
        assert_eq!(&l.args()[40..48], &55i64.to_le_bytes());
        assert_eq!(&l.args()[72..80], &88u64.to_le_bytes());
        assert_eq!(&l.args()[80..84], &9i32.to_le_bytes());
        assert_eq!(&l.args()[96..104], &12i64.to_le_bytes());
        assert_eq!(&l.args()[112..120], &14u64.to_le_bytes());
        let v: Vec<i128> = l.values().into_iter().map(|(_, v)| v).collect();
        assert_eq!(v, values);
    }

    #[test]
    fn wrong_arity_or_type_is_refused() {
        let e = Launch::new(&COPY_TILES, [1, 1, 1], [256, 1, 1], &[Arg::Ptr(1)]).unwrap_err();
        assert!(e.message.contains("1 arguments for 4 parameters"), "{}", e.message);
        let e = Launch::new(&COPY_TILES, [1, 1, 1], [256, 1, 1], &[Arg::Ptr(1), Arg::Ptr(2), Arg::I32(3), Arg::U32(4)]).unwrap_err();
        assert!(e.message.contains("first_tile is uint32_t"), "{}", e.message);
    }

    #[test]
    fn raw_values_are_range_checked() {
        let l = pack(kernel("rs_copy_tiles").unwrap(), [2, 1, 1], [64, 1, 1], &[1, 2, 3, 4]).unwrap();
        assert_eq!(l.values().iter().map(|x| x.1).collect::<Vec<_>>(), vec![1, 2, 3, 4]);
        let e = pack(&COPY_TILES, [1, 1, 1], [1, 1, 1], &[1, 2, -3, 4]).unwrap_err();
        assert_eq!(e.message, "rs_copy_tiles: first_tile = -3 does not fit uint32_t");
        assert!(kernel("nope").unwrap_err().message.contains("known: rs_copy_tiles, rs_state_copy, rs_recover_commit"));
    }

    #[test]
    fn every_parameter_type_is_known() {
        for k in KERNELS {
            assert!(KERNEL_FILES.contains(&k.file));
            for (name, c) in k.params {
                assert!(ParamType::of_c(c).is_some(), "{}.{name}: {c}", k.name);
            }
        }
    }
}
