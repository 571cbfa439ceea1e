//! The calling convention of every kernel, owned by the core: each entry point takes one parameter
//! record by value ([`super::records::params`]), so the buffer the CUDA driver takes
//! (`cuLaunchKernel`'s `CU_LAUNCH_PARAM_BUFFER_POINTER`) is that record's bytes. A launch builder
//! fills the record by field name and [`Launch::new`] takes its bytes from the same Rust
//! definition that renders the header's struct; the kernel reads the struct by field name. The
//! host emulation unpacks the buffer as the kernel's declared C++ parameter (the struct, its size
//! checked). The generated CUDA header declares every entry point from [`KERNELS`]
//! ([`super::header`]), so the compilers refuse a definition in the sources that takes another
//! record.

use super::records::{
    record_spec, CopyTilesParams, Record, RecordSpec, RecoverCommitParams, SlotScatterParams, StateCopyParams, StateCopySlotsParams,
};
use crate::error::{Error, Result};
use std::sync::OnceLock;

/// One kernel entry point: name, source file, and the name of its parameter record.
#[derive(Debug, PartialEq, Eq)]
pub struct KernelSpec {
    pub name: &'static str,
    pub file: &'static str,
    /// The record (of [`super::records::record_specs`]) the kernel takes as its one parameter.
    pub params: &'static str,
}

impl KernelSpec {
    /// The layout of the kernel's parameter record.
    pub fn params_spec(&self) -> &'static RecordSpec {
        static SPECS: OnceLock<Vec<RecordSpec>> = OnceLock::new();
        let specs = SPECS.get_or_init(|| KERNELS.iter().map(|k| record_spec(k.params).expect("KERNELS names records of the table")).collect());
        let at = KERNELS.iter().position(|k| k.name == self.name).expect("a kernel of KERNELS");
        &specs[at]
    }
}

/// A kernel parameter record: the entry point that takes it.
pub trait KernelParams: Record {
    const KERNEL: &'static KernelSpec;
}

macro_rules! kernels {
    ($($(#[doc = $doc:literal])* $spec:ident = $name:literal in $file:literal takes $params:ident;)+) => {
        $(
            $(#[doc = $doc])*
            pub const $spec: KernelSpec = KernelSpec { name: $name, file: $file, params: stringify!($params) };
            impl KernelParams for $params {
                const KERNEL: &'static KernelSpec = &$spec;
            }
        )+
        /// Every kernel entry point, in module order.
        pub const KERNELS: [&KernelSpec; [$($name),+].len()] = [$(&$spec),+];
    };
}

kernels! {
    /// One wave of a planned batched copy.
    COPY_TILES = "rs_copy_tiles" in "copy_tiles.cu" takes CopyTilesParams;
    /// The fused align-mode state copy.
    STATE_COPY = "rs_state_copy" in "state_copy.cu" takes StateCopyParams;
    /// The RecoverSSM commit.
    RECOVER_COMMIT = "rs_recover_commit" in "recover_commit.cu" takes RecoverCommitParams;
    /// SGLang's pool slots: clear, or commit accepted verify states.
    SLOT_SCATTER = "rs_slot_scatter" in "slot_scatter.cu" takes SlotScatterParams;
    /// One half-step of vLLM's GPU-resident runner.
    STATE_COPY_SLOTS = "rs_state_copy_slots" in "state_copy_slots.cu" takes StateCopySlotsParams;
}

/// The kernel source files, in module order (one module holds them all).
pub const KERNEL_FILES: [&str; 5] = ["copy_tiles.cu", "state_copy.cu", "recover_commit.cu", "slot_scatter.cu", "state_copy_slots.cu"];

/// The kernel named `name`.
pub fn kernel(name: &str) -> Result<&'static KernelSpec> {
    KERNELS.iter().copied().find(|k| k.name == name).ok_or_else(|| {
        let names: Vec<&str> = KERNELS.iter().map(|k| k.name).collect();
        Error::plan(format!("unknown kernel {name:?}; known: {}", names.join(", ")))
    })
}

/// A launch of `kernel` whose parameter record is given field by field (every field once, each
/// value range-checked against its type): for tools and tests that launch a kernel with arguments
/// of their own; the launch builders are the product's path.
pub fn pack(kernel: &'static KernelSpec, grid: [u32; 3], block: [u32; 3], fields: &[(&str, i128)]) -> Result<Launch> {
    let bytes = kernel.params_spec().encode(fields).map_err(|e| Error::plan(format!("{}: {}", kernel.name, e.message)))?;
    Ok(Launch::from_bytes(kernel, grid, block, &bytes))
}

/// Everything a launch needs: the kernel, the grid, the block and the argument buffer (the
/// kernel's parameter record).
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
    /// The launch of the kernel that takes `params`, the buffer its bytes.
    pub fn new<P: KernelParams>(params: &P, grid: [u32; 3], block: [u32; 3]) -> Launch {
        Launch::from_bytes(P::KERNEL, grid, block, &params.bytes())
    }

    fn from_bytes(kernel: &'static KernelSpec, grid: [u32; 3], block: [u32; 3], bytes: &[u8]) -> Launch {
        debug_assert_eq!(bytes.len(), kernel.params_spec().size);
        let words = bytes.chunks(8).map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(w)
        });
        Launch { kernel, grid, block, words: words.collect(), len: bytes.len() }
    }

    /// The argument buffer (`len()` bytes at an 8-byte aligned address).
    pub fn args(&self) -> &[u8] {
        // SAFETY: `words` holds `ceil(len / 8)` initialised u64s; viewing their first `len` bytes
        // as u8 is in bounds (len <= 8 * words.len()) and u8 has no alignment requirement.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }

    /// `(field, value)` of the parameter record, in declaration order (for tests and debugging).
    pub fn values(&self) -> Vec<(&'static str, i128)> {
        self.kernel.params_spec().decode(self.args())
    }

    /// The value of the parameter record's field `name`.
    pub fn value(&self, name: &str) -> Option<i128> {
        self.values().into_iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// The values of the fields `names`, in that order (a test helper: panics on a name the record
    /// does not have).
    #[cfg(test)]
    pub fn named(&self, names: &[&str]) -> Vec<i128> {
        names.iter().map(|n| self.value(n).unwrap_or_else(|| panic!("{} has no field {n}", self.kernel.params))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::records::{MutPtr, Ptr};

    #[test]
    fn the_buffer_is_the_record_filled_by_name() {
        let p = StateCopyParams {
            metas: Ptr::at(1),
            block_table: Ptr::at(2),
            src_col: Ptr::at(3),
            dst_or_running: Ptr::at(4),
            num_accepted: Ptr::at(5),
            num_accepted_out: MutPtr::at(6),
            err: MutPtr::at(7),
            bt_row_stride: -8,
            bt_group_stride: 9,
            num_blocks: 10,
            num_meta: 11,
            bt_cols: 12,
            block_size: -13,
            num_requests: 14,
            max_accepted: 15,
            flags: 16,
        };
        let l = Launch::new(&p, [1, 1, 1], [256, 1, 1]);
        assert_eq!((l.kernel.name, l.args().len(), l.args().as_ptr() as usize % 8), ("rs_state_copy", 104, 0));
        // Each field at its offset_of!, as the header's static_asserts pin them.
        assert_eq!(&l.args()[16..24], &3u64.to_le_bytes());
        assert_eq!(&l.args()[56..64], &(-8i64).to_le_bytes());
        assert_eq!(&l.args()[84..88], &12i32.to_le_bytes());
        assert_eq!(&l.args()[88..92], &(-13i32).to_le_bytes());
        let names: Vec<&str> = l.values().iter().map(|v| v.0).collect();
        assert_eq!(names[..4], ["metas", "block_table", "src_col", "dst_or_running"]);
        assert_eq!((l.value("src_col"), l.value("block_size"), l.value("nope")), (Some(3), Some(-13), None));
        // The raw packer fills the same record by name, whatever the order given.
        let mut fields: Vec<(&str, i128)> = l.values();
        fields.reverse();
        assert_eq!(pack(&STATE_COPY, [1, 1, 1], [256, 1, 1], &fields).unwrap(), l);
    }

    #[test]
    fn raw_fields_are_named_once_and_range_checked() {
        let ok = [("segments", 1), ("tiles", 2), ("first_tile", 3), ("num_tiles", 4)];
        let l = pack(kernel("rs_copy_tiles").unwrap(), [2, 1, 1], [64, 1, 1], &ok).unwrap();
        assert_eq!(l.values(), ok);
        let e = pack(&COPY_TILES, [1, 1, 1], [1, 1, 1], &[("segments", 1), ("tiles", 2), ("first_tile", -3), ("num_tiles", 4)]).unwrap_err();
        assert_eq!(e.message, "rs_copy_tiles: CopyTilesParams.first_tile = -3 does not fit uint32_t");
        let e = pack(&COPY_TILES, [1, 1, 1], [1, 1, 1], &ok[..3]).unwrap_err();
        assert_eq!(e.message, "rs_copy_tiles: CopyTilesParams.num_tiles: give every field exactly once");
        let e = pack(&COPY_TILES, [1, 1, 1], [1, 1, 1], &[ok[0], ok[1], ok[2], ok[3], ("first_tile", 5)]).unwrap_err();
        assert!(e.message.contains("first_tile: give every field exactly once"), "{}", e.message);
        let e = pack(&COPY_TILES, [1, 1, 1], [1, 1, 1], &[ok[0], ok[1], ok[2], ("num_tile", 4)]).unwrap_err();
        assert!(e.message.starts_with("rs_copy_tiles: CopyTilesParams has no field \"num_tile\"; its fields: segments,"), "{}", e.message);
        assert!(kernel("nope").unwrap_err().message.contains("known: rs_copy_tiles, rs_state_copy, rs_recover_commit"));
    }

    #[test]
    fn every_kernel_takes_a_record_of_the_table() {
        for k in KERNELS {
            assert!(KERNEL_FILES.contains(&k.file));
            assert_eq!(k.params_spec().name, k.params);
        }
        assert_eq!(<StateCopySlotsParams as KernelParams>::KERNEL.name, "rs_state_copy_slots");
        assert_eq!(<SlotScatterParams as KernelParams>::KERNEL.params, "SlotScatterParams");
    }
}
