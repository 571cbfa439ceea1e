//! How a family's persistent states are split across tensor-parallel ranks: the sub-projections
//! of the conv channels and the head axis of the temporal states. The family calculators attach a
//! [`Sharding`] to the layouts they build; layouts built by hand carry none (and cannot be
//! re-sharded by a transfer).

use crate::error::{Error, Result};

/// One sub-projection of the conv channels: `units` groups or heads of `unit_dim` channels each,
/// across all ranks. Each rank holds a contiguous run of units of every segment, the segments
/// back to back in the order listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvSegment {
    pub name: &'static str,
    pub units: u64,
    pub unit_dim: u64,
}

/// How one persistent state is split across ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateShard {
    /// A conv window whose channels are the listed sub-projections.
    Conv { segments: Vec<ConvSegment>, kernel_size: u64 },
    /// A state sliced along its outermost axis, which has `units` entries (heads) across ranks.
    Heads { units: u64 },
}

/// The tensor-parallel split of one layout: family, the model dims it was computed from, the TP
/// size, and one [`StateShard`] per persistent state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sharding {
    pub family: &'static str,
    pub tp_size: u64,
    pub model_dims: Vec<(&'static str, u64)>,
    pub states: Vec<StateShard>,
}

/// The units `(first, count)` that `rank` of `tp_size` holds out of `units`: a contiguous run
/// when `tp_size` divides `units`; one unit shared by `tp_size / units` consecutive ranks when
/// `units` divides `tp_size` (replicated groups); an error otherwise.
pub fn owned_units(units: u64, tp_size: u64, rank: u64) -> Result<(u64, u64)> {
    if tp_size == 0 || rank >= tp_size {
        return Err(Error::layout(format!("TP rank {rank} is out of range for tp_size {tp_size}")));
    }
    if units % tp_size == 0 {
        let per = units / tp_size;
        Ok((rank * per, per))
    } else if tp_size % units == 0 {
        Ok((rank / (tp_size / units), 1))
    } else {
        Err(Error::layout(format!("{units} units cannot be split over tp_size {tp_size}: neither divides the other")))
    }
}

/// The ranks of `tp_size` that hold unit `unit` of `units` (one rank, or the replicas).
pub fn unit_owners(units: u64, tp_size: u64, unit: u64) -> std::ops::Range<u64> {
    if units % tp_size == 0 {
        let r = unit / (units / tp_size);
        r..r + 1
    } else {
        let rep = tp_size / units;
        unit * rep..(unit + 1) * rep
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sliced_and_replicated_units() {
        assert_eq!(owned_units(8, 4, 3).unwrap(), (6, 2));
        assert_eq!(owned_units(1, 4, 3).unwrap(), (0, 1));
        assert_eq!(owned_units(2, 4, 3).unwrap(), (1, 1));
        assert!(owned_units(3, 4, 0).unwrap_err().message.contains("neither divides"));
        assert!(owned_units(8, 4, 4).is_err());
        assert_eq!(unit_owners(8, 4, 5), 2..3);
        assert_eq!(unit_owners(2, 4, 1), 2..4);
    }
}
