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
//! Between groups the writer reads the oldest entries of each such table and deletes, in one
//! batch, the rows older than the TTL (at most [`MAX_EVICT_PER_STEP`] per step, checked once a
//! clock second, and on an idle shard by a tick each second), and, when the shard holds more
//! rows than its share of the cap (`ceil(max_rows / num_shards)`), the least recently pushed
//! ones down to a low-water mark below the cap, so that the next groups need not evict again.
//! A row is deleted from the store first, then from memory (after the cache's epoch bump: a
//! reader never puts it back). The deletions are what an incremental export lists as deleted
//! rows; a later push of the id starts it again from the initializer (through admission).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ps_core::TableSpec;

use super::keys::{age_key, read_age_key, rows_key};
use super::rows::Row;
use super::table::{Table, TableData};
use super::{Cmd, Inner};
use crate::store::{Cf, Store, StoreBatch};

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
    ttl: u32,
    /// Rows are stamped with the job clock their pushes carry (plus one: 0 means no stamp),
    /// not with the engine clock's seconds.
    by_clocks: bool,
    /// Tables aged by clocks: the newest stamp pushed since the shard started.
    newest_clock: AtomicU32,
    /// Most rows on this shard (its share of `max_rows`); 0: no cap.
    cap: u64,
    /// Rows a cap eviction leaves: 95% of the cap, at most `MAX_EVICT_PER_STEP` below it.
    low_water: u64,
    /// The clock second of the last TTL pass that finished (every expired row deleted).
    ttl_done_at: AtomicU32,
    /// No row of the table is older than this (seconds): the eviction scans start here, past
    /// the deleted entries that RocksDB has not compacted away yet.
    floor: AtomicU32,
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
    fn now(&self, secs: u32) -> u32 {
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

/// Rows one step chose, oldest first, and how many of them (the first) were past the TTL.
struct Victims {
    rows: Vec<(u32, u64)>,
    expired: usize,
}

impl<S: Store> Inner<S> {
    /// Evicts what is due in every table that evicts rows. The writer calls it between
    /// groups; a failed write turns the engine read-only, as for pushes.
    pub(super) fn evict_rows(&self) {
        if !self.store.durable() || self.failed.lock().is_some() {
            return;
        }
        let tables: Vec<Arc<Table>> = self
            .tables
            .read()
            .values()
            .filter(|t| t.eviction.is_some())
            .cloned()
            .collect();
        let now = self.cfg.clock.now();
        for table in tables {
            if let Err(cause) = self.evict_table_rows(&table, now) {
                self.fail(cause);
                return;
            }
        }
    }

    fn evict_table_rows(&self, table: &Table, secs: u32) -> Result<(), String> {
        let (Some(ev), TableData::Sparse(rows)) = (&table.eviction, &table.data) else {
            return Ok(());
        };
        let now = ev.now(secs);
        // Rows pushed before `cutoff` are past the TTL.
        let cutoff = if ev.ttl > 0 {
            now.saturating_sub(ev.ttl).saturating_add(1)
        } else {
            0
        };
        let mut ttl_due = cutoff > 1 && ev.ttl_done_at.load(Ordering::Relaxed) != now;
        loop {
            let stored = rows.stored();
            let over_cap = ev.cap > 0 && stored > ev.cap;
            if !over_cap && !ttl_due {
                return Ok(());
            }
            let want = if over_cap { stored - ev.low_water } else { 0 };
            let victims = self
                .oldest_rows(table, ev, if ttl_due { cutoff } else { 0 }, want)
                .map_err(|e| e.to_string())?;
            if ttl_due && victims.rows.len() < MAX_EVICT_PER_STEP {
                // Every row past the TTL is in this step: none is due again this second.
                ev.ttl_done_at.store(now, Ordering::Relaxed);
            }
            if victims.rows.is_empty() {
                // A cap with nothing to evict cannot happen (every row has its entry), but
                // must not loop.
                return Ok(());
            }
            self.delete_rows(table, rows, &victims)?;
            // The rest of a long TTL pass waits for the next step; a cap is restored now.
            ttl_due = false;
        }
    }

    /// The oldest rows of `table`: every one pushed before `cutoff`, then more until `want`,
    /// at most [`MAX_EVICT_PER_STEP`].
    fn oldest_rows(
        &self,
        table: &Table,
        ev: &Eviction,
        cutoff: u32,
        want: u64,
    ) -> Result<Victims, crate::store::StoreError> {
        let mut v = Victims {
            rows: Vec::new(),
            expired: 0,
        };
        let from = age_key(table.id, ev.floor.load(Ordering::Relaxed), 0);
        let to = (table.id + 1).to_be_bytes();
        let mut last = None;
        self.store.scan_range(Cf::ByAge, &from, &to, &mut |k, _| {
            let (time, id) = read_age_key(k)?;
            last = Some(time);
            if time < cutoff {
                v.expired += 1;
            } else if v.rows.len() as u64 >= want {
                return Ok(false);
            }
            v.rows.push((time, id));
            Ok(v.rows.len() < MAX_EVICT_PER_STEP)
        })?;
        // Every row before the last one seen is among the victims (deleted next, in one batch).
        if let Some(time) = last {
            ev.floor.store(time, Ordering::Relaxed);
        }
        Ok(v)
    }

    /// Deletes `victims` from the store in one batch, then from memory, and counts them.
    fn delete_rows(
        &self,
        table: &Table,
        rows: &super::rows::Rows,
        victims: &Victims,
    ) -> Result<(), String> {
        let with_state = table.spec.optimizer.state_slots() > 0;
        let mut batch = self.store.batch();
        for &(time, id) in &victims.rows {
            let key = table.key(id);
            batch.delete(Cf::Params, &key);
            if with_state {
                batch.delete(Cf::Optim, &key);
            }
            batch.delete(Cf::Touched, &key);
            batch.delete(Cf::ByAge, &age_key(table.id, time, id));
        }
        let n = victims.rows.len() as u64;
        let left = rows.stored().saturating_sub(n);
        batch.put(Cf::Meta, &rows_key(table.id), &left.to_le_bytes());
        self.write(batch)?;
        rows.sub_stored(n);
        // Gone from the store: readers that read it before now must not put it back.
        self.cache.epoch.fetch_add(1, Ordering::SeqCst);
        for &(_, id) in &victims.rows {
            rows.remove(id);
        }
        let expired = victims.expired as u64;
        table
            .counters
            .rows_expired
            .fetch_add(expired, Ordering::Relaxed);
        table
            .counters
            .rows_capped
            .fetch_add(n - expired, Ordering::Relaxed);
        crate::metrics::rows_evicted(table.spec.name.as_str(), expired, n - expired);
        tracing::debug!(table = %table.spec.name, expired, capped = n - expired, "rows evicted");
        Ok(())
    }
}

/// Asks the writer to evict what is due once a second, so that rows expire on a shard no one
/// pushes to; stops when the engine does.
pub(super) fn start_ticker(tx: &tokio::sync::mpsc::Sender<Cmd>) -> std::io::Result<()> {
    let weak = tx.downgrade();
    std::thread::Builder::new()
        .name("ps-evict-tick".into())
        .spawn(move || {
            loop {
                std::thread::sleep(Duration::from_secs(1));
                let Some(tx) = weak.upgrade() else {
                    return;
                };
                // A full queue means the writer is busy and evicts between its groups anyway.
                if let Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) =
                    tx.try_send(Cmd::EvictRows)
                {
                    return;
                }
            }
        })
        .map(|_| ())
}
