//! The end of a sparse row's life: eviction by age (`TableSpec::ttl_seconds`) and past a hard
//! row cap (`TableSpec::max_rows`), on durable shards.
//!
//! For a table with either, the group commit that pushes a row also records when: the row's
//! time under its key in `Cf::Touched`, and an empty entry keyed (table, time, id) in
//! `Cf::ByAge`, so that the table's rows sort oldest first there. Times are whole seconds of
//! the engine's [`Clock`] or, for tables with `ttl_clocks`, the job clock the push carried
//! (the table's now being the newest clock pushed); a row pushed again within the same second
//! (clock) writes nothing more, so a hot row costs these two puts (and one delete) at most once
//! a second. Pulls do not count: a row lives as long as it is trained.
//!
//! Between groups the writer (`expiry.rs`) reads the oldest entries of each such table and deletes,
//! in one batch, the rows older than the TTL (at most [`MAX_EVICT_PER_STEP`] per step, checked once
//! a clock second, and on an idle shard by a tick each second), and, when the shard holds more rows
//! than its share of the cap (`ceil(max_rows / num_shards)`), the least recently pushed ones down
//! to a low-water mark below the cap, so that the next groups need not evict again. A row is
//! deleted from the store first, then from memory (after the cache's epoch bump: a reader never
//! puts it back). The deletions are what an incremental export lists as deleted rows; a later push
//! of the id starts it again from the initializer (through admission).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use ps_core::TableSpec;

use super::keys::age_key;
use super::rows::Row;
use crate::store::{Cf, StoreBatch};

/// Most rows one eviction step deletes (one batch); a cap is still restored in one call.
pub(super) const MAX_EVICT_PER_STEP: usize = 1 << 16;

/// Where the engine reads the time rows are stamped and aged with: the system's, or one a
/// test sets (paused time).
#[derive(Debug, Clone, Default)]
pub struct Clock(Option<Arc<AtomicU64>>);

impl Clock {
    /// The system's wall clock.
    pub fn system() -> Self {
        Self(None)
    }

    /// A clock that stands at `secs` (since the Unix epoch) until [`Clock::advance`]d.
    pub fn manual(secs: u64) -> Self {
        Self(Some(Arc::new(AtomicU64::new(secs))))
    }

    /// Moves a manual clock on by `secs`; a system clock ignores it.
    pub fn advance(&self, secs: u64) {
        if let Some(t) = &self.0 {
            t.fetch_add(secs, Ordering::SeqCst);
        }
    }

    /// Whole seconds since the Unix epoch (saturating at `u32::MAX`, in 2106).
    pub fn now(&self) -> u32 {
        let secs = match &self.0 {
            Some(t) => t.load(Ordering::SeqCst),
            None => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        };
        u32::try_from(secs).unwrap_or(u32::MAX)
    }
}

/// A table's eviction settings on this shard.
#[derive(Debug)]
pub(super) struct Eviction {
    /// Seconds (or job clocks) a row lives after its last push; 0: forever.
    pub(super) ttl: u32,
    /// Rows are stamped with the job clock their pushes carry (plus one: 0 means no stamp),
    /// not with the engine clock's seconds.
    by_clocks: bool,
    /// Tables aged by clocks: the newest stamp pushed since the shard started.
    newest_clock: AtomicU32,
    /// Most rows on this shard (its share of `max_rows`); 0: no cap.
    pub(super) cap: u64,
    /// Rows a cap eviction leaves: 95% of the cap, at most `MAX_EVICT_PER_STEP` below it.
    pub(super) low_water: u64,
    /// The clock second of the last TTL pass that finished (every expired row deleted).
    pub(super) ttl_done_at: AtomicU32,
    /// No row of the table is older than this (seconds): the eviction scans start here, past
    /// the deleted entries that RocksDB has not compacted away yet.
    pub(super) floor: AtomicU32,
}

impl Eviction {
    /// The settings for `spec` on one of `num_shards` shards; `None` when it evicts nothing.
    pub(super) fn new(spec: &TableSpec, num_shards: u32) -> Option<Self> {
        if !spec.evicts_rows() {
            return None;
        }
        let cap = spec.max_rows.div_ceil(u64::from(num_shards.max(1)));
        Some(Self {
            ttl: u32::try_from(spec.ttl_seconds.max(spec.ttl_clocks)).unwrap_or(u32::MAX),
            by_clocks: spec.ttl_clocks > 0,
            newest_clock: AtomicU32::new(0),
            cap,
            low_water: cap - (cap / 20).min(MAX_EVICT_PER_STEP as u64),
            ttl_done_at: AtomicU32::new(0),
            floor: AtomicU32::new(0),
        })
    }

    /// The stamp of a push made at second `secs` of the engine's clock carrying job clock
    /// `clock`: the seconds, or for tables aged by clocks the job clock plus one (a push without
    /// one counts as the newest clock seen).
    pub(super) fn stamp(&self, secs: u32, clock: Option<u64>) -> u32 {
        if !self.by_clocks {
            return secs;
        }
        match clock {
            Some(c) => {
                let stamp = u32::try_from(c).unwrap_or(u32::MAX - 1).min(u32::MAX - 1) + 1;
                self.newest_clock.fetch_max(stamp, Ordering::Relaxed);
                stamp
            }
            None => self.newest_clock.load(Ordering::Relaxed).max(1),
        }
    }

    /// What rows are aged against now: the engine clock's second, or the newest job clock.
    pub(super) fn now(&self, secs: u32) -> u32 {
        if self.by_clocks {
            self.newest_clock.load(Ordering::Relaxed)
        } else {
            secs
        }
    }

    /// Records that row `id` of table `table_id` was pushed at `now`: its time in `Touched`
    /// and its place in `ByAge` move, unless it was already pushed this second.
    pub(super) fn touch(
        &self,
        table_id: u32,
        id: u64,
        row: &Row,
        now: u32,
        batch: &mut impl StoreBatch,
    ) {
        let before = row.touched.load(Ordering::Relaxed);
        if before == now {
            return;
        }
        // A clock set back: the scans must start early enough to see this row.
        self.floor.fetch_min(now, Ordering::Relaxed);
        if before != 0 {
            batch.delete(Cf::ByAge, &age_key(table_id, before, id));
        }
        batch.put(Cf::ByAge, &age_key(table_id, now, id), &[]);
        batch.put(
            Cf::Touched,
            &super::keys::cell_key(table_id, id),
            &now.to_le_bytes(),
        );
        row.touched.store(now, Ordering::Relaxed);
    }
}
