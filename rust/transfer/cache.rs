//! The rules of the host offload tier: bytes per request from the fingerprint, capacity
//! accounting, least-recently-used eviction, and what an evicted entry becomes (spilled to disk
//! when the tier has a directory, else dropped). Entries are named by caller-chosen ids; the
//! bytes themselves live with the caller.

use super::fingerprint::{add_bytes, mul_bytes, Fingerprint};
use super::saved::Sealer;
use crate::error::{Error, Result};
use std::collections::{BTreeSet, VecDeque};

/// Where the tier holds an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    Memory,
    Disk,
}

impl Location {
    pub fn name(self) -> &'static str {
        match self {
            Location::Memory => "memory",
            Location::Disk => "disk",
        }
    }
}

/// One entry pushed out of host memory by [`CacheIndex::put`]: written to disk (`spill`) or
/// dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Eviction {
    pub id: u64,
    pub spill: bool,
}

/// Bytes one request's saved states take in a pool of `num_layers` layers with fingerprint `fp`:
/// every persistent state of every layer (workspace is never saved); a layout error on overflow.
pub fn request_bytes(fp: &Fingerprint, num_layers: u64) -> Result<u64> {
    let mut per_layer = 0u64;
    for s in &fp.states {
        per_layer = add_bytes(per_layer, s.nbytes()?).ok_or_else(|| Error::layout("one layer's persistent states overflow in bytes"))?;
    }
    mul_bytes(per_layer, num_layers).ok_or_else(|| Error::layout(format!("{num_layers} layers of {per_layer} bytes of states overflow in bytes")))
}

/// The bookkeeping of a host tier of one pool.
#[derive(Clone, Debug)]
pub struct CacheIndex {
    capacity: u64,
    bytes_per_request: u64,
    spill: bool,
    /// In-memory entries `(id, bytes)`, least recently used first.
    memory: VecDeque<(u64, u64)>,
    disk: BTreeSet<u64>,
    used: u64,
    evictions: u64,
    hits: u64,
    misses: u64,
    /// The keys binding each spill file to its entry of this tier.
    sealer: Sealer,
}

impl CacheIndex {
    /// A tier of `capacity` host bytes for a pool of `num_layers` layers with fingerprint `fp`
    /// (every persistent state of every layer per request; workspace is never saved).
    pub fn new(fp: &Fingerprint, num_layers: u64, capacity: u64, spill: bool) -> Result<CacheIndex> {
        if capacity == 0 {
            return Err(Error::plan("HostCache: capacity_bytes must be > 0, got 0"));
        }
        let bytes_per_request = request_bytes(fp, num_layers)?;
        Ok(CacheIndex {
            capacity,
            bytes_per_request,
            spill,
            memory: VecDeque::new(),
            disk: BTreeSet::new(),
            used: 0,
            evictions: 0,
            hits: 0,
            misses: 0,
            sealer: Sealer::default(),
        })
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    pub fn bytes_per_request(&self) -> u64 {
        self.bytes_per_request
    }
    pub fn used(&self) -> u64 {
        self.used
    }
    pub fn spills(&self) -> bool {
        self.spill
    }
    pub fn in_memory(&self) -> usize {
        self.memory.len()
    }
    pub fn on_disk(&self) -> usize {
        self.disk.len()
    }
    /// `(evictions, hits, misses)` so far (counted by the index only).
    pub fn counts(&self) -> (u64, u64, u64) {
        (self.evictions, self.hits, self.misses)
    }
    pub fn sealer(&self) -> &Sealer {
        &self.sealer
    }

    /// Host bytes `num_requests` requests take; a plan error when more than the whole capacity.
    pub fn need(&self, num_requests: u64) -> Result<u64> {
        match mul_bytes(num_requests, self.bytes_per_request) {
            Some(n) if n <= self.capacity => Ok(n),
            n => Err(Error::plan(format!(
                "HostCache: {num_requests} requests need {} bytes, more than the capacity of {}",
                n.map(|n| n.to_string()).unwrap_or_else(|| "overflowing".into()),
                self.capacity
            ))),
        }
    }

    /// Where `id` is held, without marking it used.
    pub fn location(&self, id: u64) -> Option<Location> {
        if self.memory.iter().any(|&(i, _)| i == id) {
            Some(Location::Memory)
        } else if self.disk.contains(&id) {
            Some(Location::Disk)
        } else {
            None
        }
    }

    /// The entries [`CacheIndex::put`] of `id` would evict, changing nothing (the caller spills
    /// them first, then puts: a put refused -- too large -- or a spill that fails leaves the tier
    /// as it was).
    pub fn plan_put(&self, id: u64, num_requests: u64, replaces: Option<u64>) -> Result<Vec<Eviction>> {
        self.clone().put_replacing(id, num_requests, replaces)
    }

    /// Checks that a prefetch handle made for entry `handle_entry` may finish the restore of `id`
    /// (named `key` in errors): the same entry, which the tier still holds.
    pub fn check_prefetched(&self, id: Option<u64>, handle_entry: Option<u64>, key: &str) -> Result<()> {
        match (id, handle_entry) {
            (Some(i), Some(h)) if i == h => Ok(()),
            (None, _) => Err(Error::plan(format!("restore: the tier holds no key {key}; the handle cannot restore it"))),
            (Some(_), None) => Err(Error::plan(format!("restore: the handle was not prefetched by this tier, so it cannot restore key {key}"))),
            (Some(_), Some(_)) => Err(Error::plan(format!(
                "restore: the handle was prefetched for another key, not key {key}; nothing was written: pass the handle prefetch({key}, ...) returned"
            ))),
        }
    }

    /// Records `id` as a new in-memory entry of `num_requests` requests, replacing an entry of
    /// that id (the caller forgets its bytes: [`CacheIndex::drop`]'s answer is not returned here,
    /// so drop first when the old entry's file must be removed). Returns the entries evicted,
    /// least recently used first, to make room. Nothing changes on error.
    pub fn put(&mut self, id: u64, num_requests: u64) -> Result<Vec<Eviction>> {
        self.put_replacing(id, num_requests, None)
    }

    /// [`put`](Self::put) of a new version of an entry: `replaces` (the entry's previous id,
    /// which the caller retires) is forgotten first, as one step, so its bytes make room and it is
    /// never evicted. A key put again gets a fresh id this way, and a prefetch handle made for the
    /// old version no longer matches ([`check_prefetched`](Self::check_prefetched)).
    pub fn put_replacing(&mut self, id: u64, num_requests: u64, replaces: Option<u64>) -> Result<Vec<Eviction>> {
        let need = self.need(num_requests)?;
        if let Some(old) = replaces {
            self.drop(old);
        }
        self.drop(id);
        let mut out = Vec::new();
        while self.used + need > self.capacity {
            // need <= capacity, so memory is non-empty while the loop runs.
            let Some((old, bytes)) = self.memory.pop_front() else { break };
            self.used -= bytes;
            self.evictions += 1;
            if self.spill {
                self.disk.insert(old);
            }
            out.push(Eviction { id: old, spill: self.spill });
        }
        self.memory.push_back((id, need));
        self.used += need;
        Ok(out)
    }

    /// Looks `id` up for a restore: an in-memory entry becomes the most recently used; counts a
    /// hit, or a miss when the tier does not hold it.
    pub fn lookup(&mut self, id: u64) -> Option<Location> {
        let found = if let Some(pos) = self.memory.iter().position(|&(i, _)| i == id) {
            let e = self.memory.remove(pos).expect("position is in range");
            self.memory.push_back(e);
            Some(Location::Memory)
        } else if self.disk.contains(&id) {
            Some(Location::Disk)
        } else {
            None
        };
        if found.is_some() {
            self.hits += 1;
        } else {
            self.misses += 1;
        }
        found
    }

    /// Marks an in-memory `id` most recently used (no hit counted); false when not in memory.
    pub fn touch(&mut self, id: u64) -> bool {
        match self.memory.iter().position(|&(i, _)| i == id) {
            Some(pos) => {
                let e = self.memory.remove(pos).expect("position is in range");
                self.memory.push_back(e);
                true
            }
            None => false,
        }
    }

    /// Forgets `id`; returns where it was held (the caller removes its bytes or file).
    pub fn drop(&mut self, id: u64) -> Option<Location> {
        if let Some(pos) = self.memory.iter().position(|&(i, _)| i == id) {
            let (_, bytes) = self.memory.remove(pos).expect("position is in range");
            self.used -= bytes;
            // An id may also have a spilled copy from before it was put again.
            self.disk.remove(&id);
            return Some(Location::Memory);
        }
        self.disk.remove(&id).then_some(Location::Disk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::families::{self, Common};
    use crate::layout::{ConvLayout, Layout};

    fn gdn_layout() -> Layout {
        let p = families::Gdn { num_k_heads: 4, num_v_heads: 8, head_k_dim: 16, head_v_dim: 32, conv_kernel_size: 4, recover_ssm: true };
        families::gdn(&p, &Common { tp_size: 1, num_spec: 0, conv_layout: ConvLayout::SD, dtype: DType::BFloat16, ssm_dtype: DType::Float32 })
            .unwrap()
    }

    fn index(capacity_requests: u64, spill: bool) -> CacheIndex {
        let fp = Fingerprint::new(&gdn_layout(), 0, 0).unwrap();
        let probe = CacheIndex::new(&fp, 2, u64::MAX / 4, spill).unwrap();
        CacheIndex::new(&fp, 2, capacity_requests * probe.bytes_per_request(), spill).unwrap()
    }

    #[test]
    fn bytes_per_request_counts_every_layer_and_state() {
        let fp = Fingerprint::new(&gdn_layout(), 0, 0).unwrap();
        let per_layer: u64 = fp.states.iter().map(|s| s.nbytes().unwrap()).sum();
        assert_eq!(CacheIndex::new(&fp, 3, 1, false).unwrap().bytes_per_request(), 3 * per_layer);
        assert!(CacheIndex::new(&fp, 3, 0, false).is_err());
        assert!(CacheIndex::new(&fp, u64::MAX, 1, false).is_err());
    }

    #[test]
    fn lru_eviction_order_and_spill() {
        for spill in [false, true] {
            let mut c = index(4, spill);
            let per = c.bytes_per_request();
            assert!(c.put(1, 2).unwrap().is_empty());
            assert!(c.put(2, 1).unwrap().is_empty());
            assert_eq!(c.lookup(1), Some(Location::Memory));
            assert_eq!(c.put(3, 2).unwrap(), vec![Eviction { id: 2, spill }]);
            assert_eq!(c.used(), 4 * per);
            assert_eq!(c.location(2), spill.then_some(Location::Disk));
            assert_eq!(c.lookup(9), None);
            assert_eq!(c.counts(), (1, 1, 1));
            // Replacing an entry frees its bytes first.
            assert!(c.put(3, 2).unwrap().is_empty());
            assert_eq!(c.put(4, 3).unwrap(), vec![Eviction { id: 1, spill }, Eviction { id: 3, spill }]);
            assert_eq!(c.in_memory(), 1);
        }
    }

    #[test]
    fn too_large_changes_nothing() {
        let mut c = index(2, true);
        c.put(1, 1).unwrap();
        let err = c.put(2, 3).unwrap_err();
        assert!(err.message.contains("more than the capacity"), "{}", err.message);
        assert!(c.put(2, u64::MAX).is_err());
        assert_eq!((c.in_memory(), c.counts().0, c.used()), (1, 0, c.bytes_per_request()));
        // A planned put changes nothing; the put itself evicts what the plan said.
        let before = (c.in_memory(), c.on_disk(), c.used(), c.counts());
        let planned = c.plan_put(2, 2, None).unwrap();
        assert_eq!((c.in_memory(), c.on_disk(), c.used(), c.counts()), before);
        assert_eq!(c.clone().put(2, 2).unwrap(), planned);
        assert!(c.check_prefetched(Some(1), Some(1), "'a'").is_ok());
        assert!(c.check_prefetched(Some(1), Some(2), "'a'").unwrap_err().message.contains("prefetched for another key, not key 'a'"));
        // A new version of entry 1 under id 5: entry 1's bytes make room, nothing is evicted.
        let mut r = c.clone();
        assert!(r.plan_put(5, 2, Some(1)).unwrap().is_empty());
        assert!(r.put_replacing(5, 2, Some(1)).unwrap().is_empty());
        assert_eq!((r.location(1), r.location(5), r.in_memory()), (None, Some(Location::Memory), 1));
        assert_eq!(c.drop(1), Some(Location::Memory));
        assert_eq!((c.drop(1), c.used()), (None, 0));
    }
}
