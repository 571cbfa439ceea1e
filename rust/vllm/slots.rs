//! The rows of vLLM's `mamba_state_idx`: one slot per live request, given out when a request is
//! first scheduled and taken back when it finishes, is preempted or resumes. The table checks what
//! an engine's bookkeeping could get wrong before any state moves: the capacity, a request id
//! listed twice in one batch, and slots outside the table or shared by two requests.

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The largest `max_num_reqs` a step takes (the kernels index slots with 32-bit integers; a table
/// this size is 128 MiB of columns).
pub const MAX_SLOTS: i64 = 1 << 24;

/// Checks a slot table's capacity (`max_num_reqs`).
pub fn check_capacity(max_num_reqs: i64) -> Result<usize> {
    if !(1..=MAX_SLOTS).contains(&max_num_reqs) {
        return Err(Error::plan(format!("max_num_reqs must be in 1 ..= 2**24, got {max_num_reqs}")));
    }
    Ok(max_num_reqs as usize)
}

/// Checks one step's slots: each in `0..capacity`, no two requests on one slot. `name(i)` names
/// request `i` in an error.
pub fn check_slots(slots: &[i64], capacity: usize, name: &dyn Fn(usize) -> String) -> Result<()> {
    let mut owner: HashMap<i64, usize> = HashMap::with_capacity(slots.len());
    for (i, &s) in slots.iter().enumerate() {
        if s < 0 || s as u64 >= capacity as u64 {
            return Err(Error::plan(format!("{}: request index {s} is outside the mamba_state_idx table (0 ..= {})", name(i), capacity - 1)));
        }
        if let Some(j) = owner.insert(s, i) {
            return Err(Error::plan(format!("{} and {} share request index {s}; each request needs its own", name(j), name(i))));
        }
    }
    Ok(())
}

/// FNV-1a: request ids are short strings hashed once per step each; no need for SipHash's
/// resistance to chosen keys (a caller choosing ids only slows its own lookups).
#[derive(Clone, Copy, Debug)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

type FnvMap<K, V> = HashMap<K, V, BuildHasherDefault<Fnv>>;

/// Request ids -> slots, with the free slots.
#[derive(Clone, Debug)]
pub struct SlotTable {
    capacity: usize,
    slot: FnvMap<String, usize>,
    /// Released slots, the next one to give out last.
    free: Vec<usize>,
    /// Slots `next..capacity` were never given out.
    next: usize,
    /// Per given-out slot, the last `assign` call that listed it (finds an id listed twice).
    seen: Vec<u32>,
    call: u32,
}

impl SlotTable {
    /// An empty table of `max_num_reqs` slots (slot 0 is given out first).
    pub fn new(max_num_reqs: i64) -> Result<SlotTable> {
        let capacity = check_capacity(max_num_reqs)?;
        Ok(SlotTable { capacity, slot: FnvMap::default(), free: Vec::new(), next: 0, seen: Vec::new(), call: 0 })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Live requests.
    pub fn live(&self) -> usize {
        self.slot.len()
    }

    /// Each request's slot, in batch order; requests seen for the first time get a free slot.
    /// Returns the slots and the ids given a slot by this call. Nothing changes on an error: an id
    /// listed twice, or more live requests than slots.
    pub fn assign<S: AsRef<str>>(&mut self, req_ids: &[S]) -> Result<(Vec<i64>, Vec<String>)> {
        let twice = |r: &str, i: usize| {
            let j = req_ids.iter().position(|x| x.as_ref() == r).unwrap_or(i);
            Error::plan(format!("request {r} is listed twice in the batch (rows {j} and {i}); request ids must be unique"))
        };
        self.call = self.call.wrapping_add(1);
        if self.call == 0 {
            self.seen.iter_mut().for_each(|x| *x = 0);
            self.call = 1;
        }
        let mut found: Vec<i64> = Vec::with_capacity(req_ids.len());
        let mut new: FnvMap<&str, usize> = FnvMap::default();
        for (i, r) in req_ids.iter().enumerate() {
            let r = r.as_ref();
            match self.slot.get(r) {
                Some(&s) => {
                    if self.seen[s] == self.call {
                        return Err(twice(r, i));
                    }
                    self.seen[s] = self.call;
                    found.push(s as i64);
                }
                None => {
                    if new.insert(r, i).is_some() {
                        return Err(twice(r, i));
                    }
                    if new.len() > self.free.len() + (self.capacity - self.next) {
                        return Err(Error::plan(format!("request {r} (row {i}): more live requests than max_num_reqs = {}", self.capacity)));
                    }
                    found.push(-1);
                }
            }
        }
        let mut added = Vec::with_capacity(new.len());
        if !new.is_empty() {
            for (r, s) in req_ids.iter().zip(found.iter_mut()) {
                if *s < 0 {
                    let slot = self.free.pop().unwrap_or_else(|| {
                        self.next += 1;
                        self.seen.push(0);
                        self.next - 1
                    });
                    self.slot.insert(r.as_ref().to_string(), slot);
                    added.push(r.as_ref().to_string());
                    *s = slot as i64;
                }
            }
        }
        Ok((found, added))
    }

    /// Frees the slots of `req_ids` (ids without a slot are skipped); returns the freed slots.
    pub fn release<S: AsRef<str>>(&mut self, req_ids: &[S]) -> Vec<i64> {
        let mut freed = Vec::new();
        for r in req_ids {
            if let Some(s) = self.slot.remove(r.as_ref()) {
                self.free.push(s);
                freed.push(s as i64);
            }
        }
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn capacity_is_checked() {
        assert_eq!(check_capacity(8), Ok(8));
        for bad in [0, -1, 1 << 40] {
            assert!(SlotTable::new(bad).unwrap_err().message.starts_with("max_num_reqs must be in 1 ..= 2**24"), "{bad}");
        }
    }

    #[test]
    fn slots_are_given_kept_and_released() {
        let mut t = SlotTable::new(2).unwrap();
        assert_eq!(t.assign(&ids(&["a", "b"])).unwrap(), (vec![0, 1], ids(&["a", "b"])));
        assert_eq!(t.assign(&ids(&["b", "a"])).unwrap(), (vec![1, 0], vec![]));
        let full = t.assign(&ids(&["a", "c"])).unwrap_err().message;
        assert_eq!(full, "request c (row 1): more live requests than max_num_reqs = 2");
        assert_eq!(t.release(&["a", "zzz"]), vec![0]);
        assert_eq!(t.assign(&ids(&["c"])).unwrap(), (vec![0], ids(&["c"])));
        assert_eq!(t.live(), 2);
        // A large table gives out its slots lazily.
        let mut big = SlotTable::new(MAX_SLOTS).unwrap();
        assert_eq!(big.assign(&ids(&["x"])).unwrap().0, vec![0]);
    }

    #[test]
    fn a_duplicate_id_changes_nothing() {
        let mut t = SlotTable::new(4).unwrap();
        let e = t.assign(&ids(&["a", "b", "a"])).unwrap_err().message;
        assert_eq!(e, "request a is listed twice in the batch (rows 0 and 2); request ids must be unique");
        assert_eq!(t.live(), 0);
        t.assign(&ids(&["a", "b"])).unwrap();
        let e = t.assign(&ids(&["b", "c", "b"])).unwrap_err().message;
        assert_eq!(e, "request b is listed twice in the batch (rows 0 and 2); request ids must be unique");
        assert_eq!((t.live(), t.assign(&ids(&["b", "a"])).unwrap().0), (2, vec![1, 0]));
    }

    #[test]
    fn foreign_and_shared_slots_are_refused() {
        let name = |i: usize| format!("request {i}");
        assert!(check_slots(&[0, 3], 4, &name).is_ok());
        assert_eq!(
            check_slots(&[0, -1], 4, &name).unwrap_err().message,
            "request 1: request index -1 is outside the mamba_state_idx table (0 ..= 3)"
        );
        assert!(check_slots(&[4], 4, &name).unwrap_err().message.contains("request index 4 is outside"));
        assert_eq!(check_slots(&[2, 2], 4, &name).unwrap_err().message, "request 0 and request 1 share request index 2; each request needs its own");
    }
}
