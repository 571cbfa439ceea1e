//! The plan's output records, shared bit for bit with the CUDA kernels: defined with the kernels'
//! other records (`crate::kernels::records::plan`), named here where the planner builds them.

pub use crate::kernels::records::plan::{Mode, MoveRow, Segment, StateMeta, Tile};
