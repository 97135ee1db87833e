//! Row ids to slots, for the per-row stores a client keeps (the residuals of
//! [`crate::RowErrorFeedback`], the client's held rows): an open-addressing table (linear
//! probing, backward-shift deletion) of 12-byte buckets, whose lookups for a whole push or pull
//! go through [`IdMap::get_many`], which asks for the buckets of the ids a few places ahead
//! before it looks up the current one. Those stores grow far past the processor's caches (a
//! bucket for every row a worker has pushed), so one lookup after another waits for a cache
//! miss each; asked for ahead, the misses of a request's lookups overlap.

use std::hash::BuildHasher;

/// A bucket: an id, split in two halves so that the bucket takes 12 bytes, and its slot;
/// `EMPTY` marks a free bucket.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    lo: u32,
    hi: u32,
    slot: u32,
}

const EMPTY: u32 = u32::MAX;

const FREE: Bucket = Bucket {
    lo: 0,
    hi: 0,
    slot: EMPTY,
};

impl Bucket {
    fn id(&self) -> u64 {
        u64::from(self.lo) | (u64::from(self.hi) << 32)
    }
}

/// A map from u64 ids to u32 slots (any slot but `u32::MAX`).
#[derive(Debug, Clone)]
pub struct IdMap {
    buckets: Vec<Bucket>,
    len: usize,
    hasher: foldhash::fast::RandomState,
}

impl Default for IdMap {
    fn default() -> Self {
        Self::new()
    }
}

impl IdMap {
    pub fn new() -> Self {
        Self {
            buckets: Vec::new(),
            len: 0,
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    /// How many ids ahead [`IdMap::get_many`] asks for buckets: enough to cover a miss's
    /// latency with the lookups between, few enough that the lines stay in the cache until
    /// used.
    pub const AHEAD: usize = 16;

    /// Bytes the map takes per id at its fullest (3/4) and emptiest (3/8, after it grows).
    pub const BYTES_PER_ID: (usize, usize) = (16, 32);

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn home(&self, id: u64) -> usize {
        // The table's length is a power of two.
        (self.hasher.hash_one(id) as usize) & (self.buckets.len() - 1)
    }

    fn find(&self, id: u64) -> Option<usize> {
        if self.buckets.is_empty() {
            return None;
        }
        let mask = self.buckets.len() - 1;
        let mut i = self.home(id);
        loop {
            let b = &self.buckets[i];
            if b.slot == EMPTY {
                return None;
            }
            if b.id() == id {
                return Some(i);
            }
            i = (i + 1) & mask;
        }
    }

    /// The slot of `id`.
    pub fn get(&self, id: u64) -> Option<u32> {
        self.find(id).map(|i| self.buckets[i].slot)
    }

    /// Asks for the cache line of `id`'s home bucket, without waiting for it.
    pub fn prefetch(&self, id: u64) {
        if !self.buckets.is_empty() {
            prefetch(&self.buckets[self.home(id)]);
        }
    }

    /// The slots of `ids`, in order, into `out` (cleared first), each lookup's bucket asked
    /// for a few ids ahead; `seen` is called with each slot found, in order (to ask for what
    /// the slot holds, in its turn).
    pub fn get_many(&self, ids: &[u64], out: &mut Vec<Option<u32>>, mut seen: impl FnMut(u32)) {
        out.clear();
        out.reserve(ids.len());
        for &id in ids.iter().take(Self::AHEAD) {
            self.prefetch(id);
        }
        for (i, &id) in ids.iter().enumerate() {
            if let Some(&next) = ids.get(i + Self::AHEAD) {
                self.prefetch(next);
            }
            let slot = self.get(id);
            if let Some(s) = slot {
                seen(s);
            }
            out.push(slot);
        }
    }

    /// Sets `id`'s slot to `slot` (not `u32::MAX`); returns the slot it had.
    pub fn insert(&mut self, id: u64, slot: u32) -> Option<u32> {
        debug_assert_ne!(slot, EMPTY, "u32::MAX marks a free bucket");
        if let Some(i) = self.find(id) {
            return Some(std::mem::replace(&mut self.buckets[i].slot, slot));
        }
        if (self.len + 1) * 4 > self.buckets.len() * 3 {
            self.grow();
        }
        let mask = self.buckets.len() - 1;
        let mut i = self.home(id);
        while self.buckets[i].slot != EMPTY {
            i = (i + 1) & mask;
        }
        self.buckets[i] = Bucket {
            lo: id as u32,
            hi: (id >> 32) as u32,
            slot,
        };
        self.len += 1;
        None
    }

    /// Doubles the table (16 buckets at first) and puts every id back.
    fn grow(&mut self) {
        let n = (self.buckets.len() * 2).max(16);
        let old = std::mem::replace(&mut self.buckets, vec![FREE; n]);
        let mask = n - 1;
        for b in old.into_iter().filter(|b| b.slot != EMPTY) {
            let mut i = self.home(b.id());
            while self.buckets[i].slot != EMPTY {
                i = (i + 1) & mask;
            }
            self.buckets[i] = b;
        }
    }

    /// Takes `id` out; returns its slot.
    pub fn remove(&mut self, id: u64) -> Option<u32> {
        let mut hole = self.find(id)?;
        let slot = self.buckets[hole].slot;
        let mask = self.buckets.len() - 1;
        // Backward shift: every id after the hole in its run that may sit at the hole (its
        // home is not between the hole and where it sits) moves into it, leaving a new hole.
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let b = self.buckets[j];
            if b.slot == EMPTY {
                break;
            }
            let home = self.home(b.id());
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.buckets[hole] = b;
                hole = j;
            }
        }
        self.buckets[hole] = FREE;
        self.len -= 1;
        Some(slot)
    }
}

/// Asks the processor to bring `value`'s cache line in, without waiting for it: unlike a
/// load, a prefetch retires at once, so the misses of many independent lookups (a push's
/// rows) overlap instead of following one another.
#[inline(always)]
pub fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    // SAFETY: a prefetch reads nothing the program sees and cannot fault; the pointer comes
    // from a live reference.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(value).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = std::hint::black_box(value);
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn ids_keep_their_slots_through_growth_and_removals() {
        let mut m = IdMap::new();
        assert_eq!(m.get(7), None);
        assert_eq!(m.remove(7), None);
        for id in 0..10_000u64 {
            assert_eq!(m.insert(id * 0x9e37_79b9, id as u32), None);
        }
        assert_eq!(m.len(), 10_000);
        assert_eq!(m.insert(0, 5), Some(0), "a second insert replaces the slot");
        for id in (0..10_000u64).step_by(2) {
            assert!(m.remove(id * 0x9e37_79b9).is_some());
        }
        assert_eq!(m.len(), 5_000);
        for id in 0..10_000u64 {
            let want = (id % 2 == 1).then_some(id as u32);
            assert_eq!(m.get(id * 0x9e37_79b9), want);
        }
        let ids: Vec<u64> = (0..20u64).map(|id| id * 0x9e37_79b9).collect();
        let (mut out, mut seen) = (Vec::new(), Vec::new());
        m.get_many(&ids, &mut out, |s| seen.push(s));
        let want: Vec<Option<u32>> = ids.iter().map(|&id| m.get(id)).collect();
        assert_eq!(out, want);
        assert_eq!(seen, want.iter().flatten().copied().collect::<Vec<_>>());
        // Ids at either end of the range.
        m.insert(u64::MAX, 1);
        m.insert(u64::MAX - 1, 2);
        assert_eq!((m.get(u64::MAX), m.get(u64::MAX - 1)), (Some(1), Some(2)));
    }

    proptest! {
        /// Any sequence of inserts and removals, of few ids so that runs collide and wrap,
        /// leaves the map agreeing with a HashMap.
        #[test]
        fn agrees_with_a_hash_map(ops in proptest::collection::vec((any::<bool>(), 0u64..64, 0u32..1000), 0..400)) {
            let mut m = IdMap::new();
            let mut want: HashMap<u64, u32> = HashMap::new();
            for (insert, id, slot) in ops {
                if insert {
                    prop_assert_eq!(m.insert(id, slot), want.insert(id, slot));
                } else {
                    prop_assert_eq!(m.remove(id), want.remove(&id));
                }
                prop_assert_eq!(m.len(), want.len());
            }
            for id in 0..64 {
                prop_assert_eq!(m.get(id), want.get(&id).copied());
            }
        }
    }
}
