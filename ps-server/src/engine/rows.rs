//! A sparse table's rows. On a durable shard the store holds every row and memory holds a
//! bounded cache of the hot ones; without a store (the in-memory mode) memory holds them all.
//!
//! The cache is write-through: the writer puts every row it updates into the group commit's
//! batch, so a cached row is never newer than the store once its group is written, and
//! evicting it loses nothing. Only the writer evicts, and only after its group is written.
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

use super::cell::Cell;

/// Lock stripes per table: a sweep holds one stripe's write lock, readers of the others go on.
pub(super) const STRIPES: usize = 128;

type Stripe = HashMap<u64, Row, foldhash::fast::RandomState>;

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
}

impl Default for Rows {
    fn default() -> Self {
        Self {
            stripes: (0..STRIPES).map(|_| RwLock::default()).collect(),
            stored: AtomicU64::new(0),
            cached: AtomicU64::new(0),
        }
    }
}

impl Rows {
    /// The stripe holding `id` (ids are often dense ranges: mix them first).
    pub(super) fn stripe(&self, id: u64) -> &RwLock<Stripe> {
        let mixed = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 57;
        &self.stripes[mixed as usize % STRIPES]
    }

    /// Copies row `id`'s parameters into `out` and marks the hit; false on a miss.
    pub(super) fn read_into(&self, id: u64, out: &mut [f32]) -> bool {
        let stripe = self.stripe(id).read();
        match stripe.get(&id) {
            Some(row) => {
                out.copy_from_slice(&row.cell.data[..out.len()]);
                row.touch();
                true
            }
            None => false,
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
