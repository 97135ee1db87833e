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
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use parking_lot::RwLock;

use super::Inner;
use super::table::{Cell, Table, TableData};
use crate::store::{Cf, Store, StoreError};

/// Lock stripes per table: a sweep holds one stripe's write lock, readers of the others go on.
pub(super) const STRIPES: usize = 128;

type Stripe = HashMap<u64, Row, foldhash::fast::RandomState>;

/// A cached row, its reference bit, and (tables that evict rows) when it was last pushed.
#[derive(Debug)]
pub(super) struct Row {
    pub(super) cell: Cell,
    referenced: AtomicBool,
    /// Seconds since the Unix epoch of the row's last push as stored in `Cf::Touched`; 0: none
    /// stored (a new row, or a table that does not evict rows). Only the writer changes it.
    pub(super) touched: AtomicU32,
}

impl Row {
    pub(super) fn new(cell: Cell, touched: u32) -> Self {
        Self {
            cell,
            referenced: AtomicBool::new(true),
            touched: AtomicU32::new(touched),
        }
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
    /// memory. Returns the rows evicted.
    pub(super) fn sweep(&self, index: usize) -> u64 {
        let mut stripe = self.stripes[index % STRIPES].write();
        let before = stripe.len();
        stripe.retain(|_, row| row.referenced.swap(false, Ordering::Relaxed));
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

impl<S: Store> Inner<S> {
    /// Reads rows `ids` of `table` from the store, one consistent read for all of them (with
    /// their last push times when the table evicts rows); rows it does not hold are absent
    /// from the answer.
    pub(super) fn fetch_rows(
        &self,
        table: &Table,
        ids: &[u64],
    ) -> Result<HashMap<u64, Row, foldhash::fast::RandomState>, StoreError> {
        let mut found = HashMap::with_capacity_and_hasher(ids.len(), Default::default());
        if ids.is_empty() || !self.store.durable() {
            return Ok(found);
        }
        let keys: Vec<[u8; 12]> = ids.iter().map(|&id| table.key(id)).collect();
        let with_state = table.spec.optimizer.state_slots() > 0;
        let with_touch = table.eviction.is_some();
        let mut reads: Vec<(Cf, &[u8])> = keys.iter().map(|k| (Cf::Params, &k[..])).collect();
        if with_state {
            reads.extend(keys.iter().map(|k| (Cf::Optim, &k[..])));
        }
        if with_touch {
            reads.extend(keys.iter().map(|k| (Cf::Touched, &k[..])));
        }
        let n = ids.len();
        let mut params: Vec<Option<Vec<u8>>> = vec![None; n];
        let mut states: Vec<Option<Vec<u8>>> = vec![None; if with_state { n } else { 0 }];
        let mut touched = vec![0u32; if with_touch { n } else { 0 }];
        let touch_from = if with_state { 2 * n } else { n };
        self.store.multi_get(&reads, &mut |i, v| {
            if i < n {
                params[i] = Some(v.to_vec());
            } else if i < touch_from {
                states[i - n] = Some(v.to_vec());
            } else {
                touched[i - touch_from] = super::keys::read_touched(v)?;
            }
            Ok(())
        })?;
        let dim = table.spec.row_dim();
        for (i, p) in params.into_iter().enumerate() {
            if let Some(p) = p {
                let state = states.get(i).and_then(|s| s.as_deref());
                let cell = Cell::stored(&table.spec, dim, &p, state)?;
                let at = touched.get(i).copied().unwrap_or(0);
                found.insert(ids[i], Row::new(cell, at));
            }
        }
        Ok(found)
    }

    /// Fills the rows at positions `missing` of a pull of `ids` (not in memory) into `buf`:
    /// from the store, or the initializer for rows never pushed. Rows read from the store
    /// are put in memory while the cache has room and no eviction began since the read.
    pub(super) fn read_missing(
        &self,
        table: &Table,
        rows: &Rows,
        ids: &[u64],
        missing: &[usize],
        buf: &mut [f32],
    ) -> Result<(), StoreError> {
        let dim = table.spec.row_dim();
        let mut want: Vec<u64> = missing.iter().map(|&i| ids[i]).collect();
        want.sort_unstable();
        want.dedup();
        let epoch = self.cache.epoch.load(Ordering::SeqCst);
        let mut fetched = self.fetch_rows(table, &want)?;
        for &i in missing {
            let out = &mut buf[i * dim..(i + 1) * dim];
            match fetched.get(&ids[i]) {
                Some(row) => out.copy_from_slice(&row.cell.data[..dim]),
                None => table.spec.initializer.fill(table.hash, ids[i], out),
            }
        }
        if fetched.is_empty() || !self.cache_has_room(fetched.len() as u64 * table.row_bytes()) {
            return Ok(());
        }
        for (id, row) in fetched.drain() {
            let mut stripe = rows.stripe(id).write();
            // Checked under the stripe's lock: a sweep bumps the epoch before taking one.
            if self.cache.epoch.load(Ordering::SeqCst) != epoch {
                break;
            }
            rows.insert_absent(&mut stripe, id, row);
        }
        Ok(())
    }

    /// Bytes of sparse rows in memory, over every table.
    pub(super) fn cache_used(&self) -> u64 {
        self.tables
            .read()
            .values()
            .filter(|t| matches!(t.data, TableData::Sparse(_)))
            .map(|t| t.memory_bytes())
            .sum()
    }

    /// Whether a reader may put `bytes` more of rows in memory.
    pub(super) fn cache_has_room(&self, bytes: u64) -> bool {
        self.cache
            .budget
            .is_some_and(|budget| self.cache_used() + bytes <= budget)
    }

    /// Evicts rows, by CLOCK, until the cache is back under 15/16 of its budget. The writer
    /// calls it after a group is written, so every row it evicts is in the store.
    pub(super) fn evict(&self) {
        let Some(budget) = self.cache.budget else {
            return;
        };
        let mut used = self.cache_used();
        if used <= budget || self.failed.lock().is_some() {
            return;
        }
        let low = budget - budget / 16;
        let tables: Vec<Arc<Table>> = self
            .tables
            .read()
            .values()
            .filter(|t| matches!(t.data, TableData::Sparse(_)))
            .cloned()
            .collect();
        let mut hand = self.cache.hand.lock();
        let positions = tables.len() as u64 * STRIPES as u64;
        // Two turns of the hand clear every bit and evict every row: enough in every case.
        for _ in 0..2 * positions {
            if used <= low {
                break;
            }
            *hand = (*hand + 1) % positions;
            let table = &tables[(*hand / STRIPES as u64) as usize];
            let TableData::Sparse(rows) = &table.data else {
                continue;
            };
            self.cache.epoch.fetch_add(1, Ordering::SeqCst);
            let evicted = rows.sweep((*hand % STRIPES as u64) as usize);
            used = used.saturating_sub(evicted * table.row_bytes());
            self.cache.evictions.fetch_add(evicted, Ordering::Relaxed);
        }
    }
}
