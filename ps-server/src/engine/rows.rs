//! A sparse table's rows. On a durable shard the store holds every row and memory holds a
//! bounded cache of the hot ones; without a store (the in-memory mode) memory holds them all.
//!
//! A cached row is never newer than what is durable once its group is written: a table that
//! evicts rows (TTL, cap) is written through (the writer puts every row it updates into the
//! group commit's batch); the others are written back (`writeback.rs`: the log holds their
//! updates, and a dirty row is written before it may leave memory), so evicting a row loses
//! nothing. Only the writer evicts, and only after its group is written.
//! Readers fill the cache on a miss only while it has room, and only when no eviction started
//! since they read the store (the eviction epoch): a row evicted after the writer updated it
//! is never put back from an older read. Rows deleted from the store (evicted by age or a row
//! cap, `eviction.rs`) leave memory the same way: deleted first, then the epoch bumped and
//! the row removed.
//!
//! The policy is CLOCK, swept one lock stripe at a time: a hit sets the row's reference bit,
//! the sweep clears set bits and evicts rows whose bit was already clear, until the cache is
//! back under its low-water mark. Why CLOCK: see ARCHITECTURE.md ("The sparse-row cache").

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use parking_lot::RwLock;
use ps_codec::prefetch;

use super::cell::Cell;

/// Lock stripes per table: a sweep holds one stripe's write lock, readers of the others go on.
pub(super) const STRIPES: usize = 128;

type Stripe = HashMap<u64, Row, foldhash::fast::RandomState>;

/// The index of the stripe holding `id`, below `STRIPES`.
pub(super) fn stripe_index(id: u64) -> usize {
    (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 57) as usize % STRIPES
}

/// Finds rows `ids` in `stripe` and asks for each cache line of the first `values` of their
/// cells, before any of them is used: the lookups do not depend on each other, so the
/// processor waits for their cache misses (the table's probe, the row, its values) side by
/// side instead of one after another.
pub(super) fn warm(stripe: &Stripe, ids: impl Iterator<Item = u64>, values: usize) {
    for row in ids.filter_map(|id| stripe.get(&id)) {
        let data = &row.cell.data[..values.min(row.cell.data.len())];
        for line in data.iter().step_by(16) {
            prefetch(line);
        }
    }
}

/// Marks a slot that `ByStripe::group` leaves out (stripes fit a byte).
const LEFT_OUT: u8 = u8::MAX;
const _: () = assert!(STRIPES <= LEFT_OUT as usize);

/// A request's slots grouped by lock stripe (a counting sort): each stripe is then locked once
/// and its rows found in one pass (`warm`) before they are used. On ps-bench's hot set, finding
/// rows one at a time, each lookup waiting for its cache misses, took a fifth of the shard's
/// CPU.
#[derive(Debug, Default)]
pub(super) struct ByStripe {
    stripe_of: Vec<u8>,
    /// Where each stripe's slots start in `slots`, and, last, where they end.
    starts: Vec<u32>,
    slots: Vec<u32>,
}

impl ByStripe {
    /// Groups the slots of `ids` (`None`: left out).
    pub(super) fn group(&mut self, ids: impl Iterator<Item = Option<u64>>) {
        self.stripe_of.clear();
        self.starts.clear();
        self.starts.resize(STRIPES + 1, 0);
        for id in ids {
            match id {
                Some(id) => {
                    let s = stripe_index(id);
                    self.stripe_of.push(s as u8);
                    self.starts[s + 1] += 1;
                }
                None => self.stripe_of.push(LEFT_OUT),
            }
        }
        for s in 1..self.starts.len() {
            self.starts[s] += self.starts[s - 1];
        }
        self.slots.clear();
        self.slots.resize(self.starts[STRIPES] as usize, 0);
        let mut next = [0u32; STRIPES];
        next.copy_from_slice(&self.starts[..STRIPES]);
        for (k, &s) in self.stripe_of.iter().enumerate() {
            if s != LEFT_OUT {
                let at = &mut next[usize::from(s)];
                self.slots[*at as usize] = k as u32;
                *at += 1;
            }
        }
    }

    /// Each stripe that has slots, with them (in request order).
    pub(super) fn groups(&self) -> impl Iterator<Item = (usize, &[u32])> {
        (0..STRIPES).filter_map(|s| {
            let slots = &self.slots[self.starts[s] as usize..self.starts[s + 1] as usize];
            (!slots.is_empty()).then_some((s, slots))
        })
    }
}

/// A cached row, its reference bit, (tables that evict rows) when it was last pushed, and
/// (rows written back, `writeback.rs`) the logged updates it holds.
#[derive(Debug)]
pub(super) struct Row {
    pub(super) cell: Cell,
    referenced: AtomicBool,
    /// Seconds since the Unix epoch of the row's last push as stored in `Cf::Touched`; 0: none
    /// stored (a new row, or a table that does not evict rows). Only the writer changes it.
    pub(super) touched: AtomicU32,
    /// The log position (plus one) of the last logged update the row holds; 0: none. Stored
    /// with the row, so that a replay skips the updates a stored row already holds.
    pub(super) stamp: AtomicU64,
    /// The log position (plus one) of the oldest logged update the store lacks; 0: the store
    /// holds the row as it is here (clean). Only the writer changes it.
    pub(super) dirty: AtomicU64,
}

impl Row {
    pub(super) fn new(cell: Cell, touched: u32, stamp: u64) -> Self {
        Self {
            cell,
            referenced: AtomicBool::new(true),
            touched: AtomicU32::new(touched),
            stamp: AtomicU64::new(stamp),
            dirty: AtomicU64::new(0),
        }
    }

    /// Whether the store lacks some of the row's updates.
    pub(super) fn is_dirty(&self) -> bool {
        self.dirty.load(Ordering::Relaxed) != 0
    }

    /// Marks a hit.
    pub(super) fn touch(&self) {
        if !self.referenced.load(Ordering::Relaxed) {
            self.referenced.store(true, Ordering::Relaxed);
        }
    }
}

/// A sparse table's rows in memory, and how many it has in all.
#[derive(Debug)]
pub(super) struct Rows {
    stripes: Box<[RwLock<Stripe>]>,
    /// Rows the table has on this shard: in the store (durable), or in memory (in-memory mode).
    stored: AtomicU64,
    /// Rows in memory.
    cached: AtomicU64,
    /// Whether the store may hold a row of the table that memory does not: set when the table
    /// is loaded from the store (its rows stay there until first used) and by the first sweep
    /// of its rows. Until then every stored row is in memory too (rows reach the store only
    /// from memory), so a row missing from memory is new and a miss need not read the store.
    paged_out: AtomicBool,
}

impl Default for Rows {
    fn default() -> Self {
        Self {
            stripes: (0..STRIPES).map(|_| RwLock::default()).collect(),
            stored: AtomicU64::new(0),
            cached: AtomicU64::new(0),
            paged_out: AtomicBool::new(false),
        }
    }
}

impl Rows {
    /// The stripe holding `id` (ids are often dense ranges: mix them first).
    pub(super) fn stripe(&self, id: u64) -> &RwLock<Stripe> {
        &self.stripes[stripe_index(id)]
    }

    /// Stripe `index` (below `STRIPES`, from `stripe_index`).
    pub(super) fn stripe_at(&self, index: usize) -> &RwLock<Stripe> {
        &self.stripes[index % STRIPES]
    }

    /// Copies the parameters of rows `ids` into `out` (`dim` values each, in order) and marks
    /// the hits; the slots of the misses go to `missing`.
    pub(super) fn read_many(
        &self,
        ids: &[u64],
        dim: usize,
        out: &mut [f32],
        missing: &mut Vec<usize>,
    ) {
        let mut by_stripe = ByStripe::default();
        by_stripe.group(ids.iter().map(|&id| Some(id)));
        for (s, slots) in by_stripe.groups() {
            let stripe = self.stripe_at(s).read();
            warm(&stripe, slots.iter().map(|&k| ids[k as usize]), dim);
            for &k in slots {
                let k = k as usize;
                match stripe.get(&ids[k]) {
                    Some(row) => {
                        out[k * dim..(k + 1) * dim].copy_from_slice(&row.cell.data[..dim]);
                        row.touch();
                    }
                    None => missing.push(k),
                }
            }
        }
    }

    pub(super) fn contains(&self, id: u64) -> bool {
        self.stripe(id).read().contains_key(&id)
    }

    /// Puts `row` in memory unless row `id` is there already; true when it was put.
    pub(super) fn insert_absent(&self, stripe: &mut Stripe, id: u64, row: Row) -> bool {
        if stripe.contains_key(&id) {
            return false;
        }
        stripe.insert(id, row);
        self.cached.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Takes row `id` out of memory (the writer, once the store no longer holds it: bump the
    /// cache's epoch first, see the module's comment).
    pub(super) fn remove(&self, id: u64) {
        if self.stripe(id).write().remove(&id).is_some() {
            self.cached.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Whether the store may hold rows that memory does not (see the field).
    pub(super) fn paged_out(&self) -> bool {
        self.paged_out.load(Ordering::SeqCst)
    }

    /// Marks the table's rows as possibly in the store alone (loaded from it, or swept).
    pub(super) fn set_paged_out(&self) {
        self.paged_out.store(true, Ordering::SeqCst);
    }

    /// Rows in memory.
    pub(super) fn cached(&self) -> u64 {
        self.cached.load(Ordering::Relaxed)
    }

    /// Rows the table has on this shard.
    pub(super) fn stored(&self) -> u64 {
        self.stored.load(Ordering::Relaxed)
    }

    pub(super) fn set_stored(&self, n: u64) {
        self.stored.store(n, Ordering::Relaxed);
    }

    /// Counts `n` rows new to the table; returns the new total.
    pub(super) fn add_stored(&self, n: u64) -> u64 {
        self.stored.fetch_add(n, Ordering::Relaxed) + n
    }

    /// Counts `n` rows deleted from the table (only the writer changes the count).
    pub(super) fn sub_stored(&self, n: u64) {
        self.stored.fetch_sub(n, Ordering::Relaxed);
    }

    /// One CLOCK pass over stripe `index`: rows whose bit is set lose it, the others leave
    /// memory, but for dirty ones, which stay and are handed to `dirty` to be written back
    /// (clean, a later pass evicts them). Returns the rows evicted.
    pub(super) fn sweep(&self, index: usize, dirty: &mut dyn FnMut(u64, &Row)) -> u64 {
        // Before any row leaves: a reader that finds a row gone (after this stripe's lock)
        // then knows to look in the store.
        self.set_paged_out();
        let mut stripe = self.stripes[index % STRIPES].write();
        let before = stripe.len();
        stripe.retain(|&id, row| {
            if row.referenced.swap(false, Ordering::Relaxed) {
                return true;
            }
            if row.is_dirty() {
                dirty(id, row);
                return true;
            }
            false
        });
        let evicted = (before - stripe.len()) as u64;
        self.cached.fetch_sub(evicted, Ordering::Relaxed);
        evicted
    }
}

/// The sparse-row cache of a durable shard: its budget and counters, shared by every table.
#[derive(Debug)]
pub(super) struct Cache {
    /// Most bytes of sparse rows held in memory; `None`: every row stays (no store to evict
    /// to).
    pub(super) budget: Option<u64>,
    /// Bumped before each sweep takes a stripe's lock (see the module's comment).
    pub(super) epoch: AtomicU64,
    pub(super) hits: AtomicU64,
    pub(super) misses: AtomicU64,
    pub(super) evictions: AtomicU64,
    /// Where the next sweep starts: (table position, stripe) flattened.
    pub(super) hand: parking_lot::Mutex<u64>,
}

impl Cache {
    pub(super) fn new(budget: Option<u64>) -> Self {
        Self {
            budget,
            epoch: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            hand: parking_lot::Mutex::new(0),
        }
    }

    pub(super) fn counted(&self, hits: u64, misses: u64) {
        if hits > 0 {
            self.hits.fetch_add(hits, Ordering::Relaxed);
        }
        if misses > 0 {
            self.misses.fetch_add(misses, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_stripe_groups_every_slot_once_in_request_order() {
        let ids: Vec<Option<u64>> = (0..5000u64)
            .map(|i| (i % 7 != 3).then_some(i.wrapping_mul(0x2545_F491_4F6C_DD1D) % 10_000))
            .collect();
        let mut by_stripe = ByStripe::default();
        // Twice: the second grouping starts from the first one's buffers.
        for _ in 0..2 {
            by_stripe.group(ids.iter().copied());
            let mut seen = vec![false; ids.len()];
            let mut stripes = Vec::new();
            for (s, slots) in by_stripe.groups() {
                stripes.push(s);
                assert!(slots.windows(2).all(|w| w[0] < w[1]), "request order");
                for &k in slots {
                    let id = ids[k as usize].expect("a left-out slot was grouped");
                    assert_eq!(stripe_index(id), s);
                    assert!(!std::mem::replace(&mut seen[k as usize], true));
                }
            }
            assert!(stripes.windows(2).all(|w| w[0] < w[1]));
            for (k, id) in ids.iter().enumerate() {
                assert_eq!(seen[k], id.is_some(), "slot {k}");
            }
        }
    }
}
