//! Sparse rows written back: on a durable shard with a log, a sparse push's rows are made
//! durable by the log record holding their gradients, not by writing each updated row into
//! RocksDB. The rows stay *dirty* in the cache and reach the store later, once however many
//! pushes updated them in between:
//!
//! - when the log needs the room their records take (oldest first, [`Inner::write_back`]),
//!   unless they are still being updated: those are *relogged*, written into the log as
//!   images of the rows that hold every update before them, and stay dirty;
//! - when the cache evicts them (the CLOCK sweep writes a dirty victim back before it may
//!   leave memory, `paging.rs`);
//! - at a checkpoint and a clean stop (every dirty row, [`Inner::write_back_all`]).
//!
//! A stored row carries its *stamp*: the position (plus one) of the last log record whose
//! update it holds. Rows are written back one at a time and at different moments, so the
//! store holds each row as of its own stamp; a replay from the stored rows' tail (meta key
//! [`META_ROWS_LOG_POS`], written in the batch that writes back the oldest rows) applies an
//! entry only to a row whose stamp is older, which gives back exactly the acknowledged state.
//! A table that evicts rows (TTL, row cap) is written through instead: its deletions and ages
//! live in the store, where a replay could not order them against logged updates.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::keys::{META_ROWS_LOG_POS, cell_key};
use super::rows::Row;
use super::table::{Table, TableData};
use super::{EngineError, Inner, Result};
use crate::push_log::PushLog;
use crate::store::{Cf, Store, StoreBatch};

/// Most rows one step of [`Inner::write_back`] writes in a batch.
const MAX_ROWS_PER_STEP: usize = 16_384;

/// Rows a restart left pending drained between two groups.
const PENDING_PER_STEP: usize = 4_096;

/// A row that became dirty, at the position (plus one) of the record that made it so.
#[derive(Debug)]
struct Dirty {
    table: Arc<Table>,
    id: u64,
    since: u64,
}

/// The dirty rows in the order they became dirty (so, by the oldest update the store lacks).
/// An entry is stale once its row was written back another way (evicted, written through) or
/// became dirty again since; stale entries are skipped.
#[derive(Debug, Default)]
pub(super) struct WriteBack {
    queue: VecDeque<Dirty>,
}

impl<S: Store> Inner<S> {
    /// Records that `row` of `table` now holds the update of the log record at `position`
    /// (the writer, under the row's stripe lock).
    pub(super) fn logged_update(&self, table: &Arc<Table>, id: u64, row: &Row, position: u64) {
        let stamp = position + 1;
        row.stamp.store(stamp, Ordering::Relaxed);
        if row.dirty.load(Ordering::Relaxed) == 0 {
            row.dirty.store(stamp, Ordering::Relaxed);
            self.dirty_rows.fetch_add(1, Ordering::Relaxed);
            self.writeback.lock().queue.push_back(Dirty {
                table: table.clone(),
                id,
                since: stamp,
            });
        }
    }

    /// Records that the store now holds `row` as it is in memory.
    pub(super) fn written_back(&self, row: &Row) {
        if row.dirty.swap(0, Ordering::Relaxed) != 0 {
            self.dirty_rows.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Writes back the oldest dirty rows until the rows' tail is at or past `target` (the
    /// oldest dirty row left became dirty at or after it, or none is left), in batches of at
    /// most [`MAX_ROWS_PER_STEP`] rows, each with the rows' new tail; then tells the log.
    pub(super) fn write_back(&self, log: &mut PushLog, target: u64) -> Result<()> {
        while !self.write_back_step(log, target, MAX_ROWS_PER_STEP, false)? {}
        Ok(())
    }

    /// Between groups: keeps the dirty rows' share of the log within three quarters of it, one
    /// batch at a time, so that a full log seldom makes a group wait for a large write-back
    /// (the last quarter is the dense records' and their image's); drains a restart's pending
    /// rows; and moves the rows' tail past the rows written back by evictions. The larger the
    /// share, the more updates a row takes between two write-backs (measured, `ps-bench
    /// --store`: three quarters of the log against a half, 1.0 M against 0.7-0.8 M key
    /// updates per shard CPU second), and the more a restart reads. Rows still being updated
    /// are relogged rather than written back; a group that finds the log full anyway writes
    /// rows back (`dense.rs`), relogging none.
    pub(super) fn trickle_write_back(&self, log: &mut PushLog) -> Result<()> {
        let limit = log.capacity() / 4 * 3;
        if log.head() - log.rows_tail() > limit {
            let target = log.head() - limit / 4 * 3;
            self.write_back_step(log, target, MAX_ROWS_PER_STEP, self.cfg.relog_rows)?;
        } else if !self.pending.is_empty() {
            // A restart's pending rows drain in the background, a few at a time.
            let rows = PENDING_PER_STEP.min(self.pending.len() as usize);
            self.write_back_step(log, u64::MAX, rows, false)?;
        } else if log.live() > log.capacity() / 16 {
            // Rows evicted since were written back: the front may be stale (no write when
            // the tail does not move).
            self.write_back_step(log, 0, 0, false)?;
        }
        Ok(())
    }

    /// One batch of [`Inner::write_back`]: at most `max_rows` of the rows that became dirty
    /// before `target` (a restart's pending rows first: they are the oldest), oldest first;
    /// true when none is left before it.
    ///
    /// With `relog`, rows updated again since they became dirty (or since their last image)
    /// are *relogged* instead: written into the log as one record of row images and left
    /// dirty, as of that record. A row that keeps being updated would otherwise be written
    /// back once per lap of the log, each time costing RocksDB a WAL entry, a memtable insert,
    /// a flush and its compactions (about 3.5 µs of the shard's CPU at dim 64 with Adagrad);
    /// its image costs one copy into a record (measured, `ps-bench --store`,
    /// ARCHITECTURE.md). A row not updated again is written back: relogging it would only
    /// carry it around the log. The images take at most half of the log the step frees (plus
    /// a sixty-fourth of the log), so that a step frees room however hot the rows are.
    pub(super) fn write_back_step(
        &self,
        log: &mut PushLog,
        target: u64,
        max_rows: usize,
        relog: bool,
    ) -> Result<bool> {
        self.check_writable()?;
        let recovered = self.recover_oldest(target, max_rows)?;
        let max_rows = max_rows.saturating_sub(recovered);
        let t0 = Instant::now();
        let (start, slack) = (log.rows_tail(), log.capacity() / 64);
        let (mut rows, mut images) = (Encoded::default(), Encoded::default());
        let mut wb = self.writeback.lock();
        let (mut written, mut relogged): (Vec<Dirty>, Vec<Dirty>) = (Vec::new(), Vec::new());
        while written.len() + relogged.len() < max_rows {
            let Some(front) = wb.queue.front() else {
                break;
            };
            if front.since > target && live(front) {
                break;
            }
            let Some(d) = wb.queue.pop_front() else {
                break;
            };
            let TableData::Sparse(table_rows) = &d.table.data else {
                continue;
            };
            let stripe = table_rows.stripe(d.id).read();
            if let Some(row) = stripe.get(&d.id)
                && !d.table.dropped.load(Ordering::Acquire)
                && row.dirty.load(Ordering::Relaxed) == d.since
            {
                // The tail moves past the record that made this row dirty.
                let freed = (d.since - 1).saturating_sub(start);
                let len = PushLog::rows_len(images.len() + 1, images.bytes())
                    + d.table.stored_row_bytes() as u64;
                let relog_it = relog
                    && row.stamp.load(Ordering::Relaxed) > d.since
                    && len <= freed / 2 + slack
                    && log.fits(len);
                if relog_it {
                    images.add(&d.table, d.id, row);
                    drop(stripe);
                    relogged.push(d);
                } else {
                    rows.add(&d.table, d.id, row);
                    drop(stripe);
                    written.push(d);
                }
            }
        }
        if !relogged.is_empty() {
            // The images first: the tail stored below may pass the updates they hold.
            log.begin_rows(PushLog::rows_len(images.len(), images.bytes()));
            let since = log.position() + 1;
            images.relog(log);
            let len = log.commit().map_err(|e| EngineError::ReadOnly {
                cause: self.fail(e.to_string()),
            })?;
            for d in &mut relogged {
                if let TableData::Sparse(table_rows) = &d.table.data
                    && let Some(row) = table_rows.stripe(d.id).read().get(&d.id)
                {
                    row.dirty.store(since, Ordering::Relaxed);
                }
                d.since = since;
            }
            wb.queue.extend(relogged.drain(..));
            self.counters
                .bytes_written
                .fetch_add(len, Ordering::Relaxed);
            crate::metrics::rows_relogged(images.len(), len);
        }
        // The stale entries at the front cost nothing to drop now, and hold the tail back.
        while wb.queue.front().is_some_and(|d| !live(d)) {
            wb.queue.pop_front();
        }
        let dirty_tail = wb.queue.front().map_or(log.head(), |d| d.since - 1);
        let done = wb.queue.front().is_none_or(|d| d.since > target);
        drop(wb);
        let pending = self.pending.front();
        let tail = pending.map_or(dirty_tail, |p| p.min(dirty_tail));
        let done = done && pending.is_none_or(|p| p >= target);
        // A tail that moved by less than this is not worth a write on its own.
        if written.is_empty() && tail < log.rows_tail() + log.capacity() / 64 {
            return Ok(done);
        }
        let mut batch = self.store.batch();
        rows.put(&mut batch);
        batch.put(Cf::Meta, META_ROWS_LOG_POS, &tail.to_le_bytes());
        self.dedup.lock().store_waiting(&mut batch);
        let bytes = batch.size_bytes();
        self.write(batch)
            .map_err(|cause| EngineError::ReadOnly { cause })?;
        for d in &written {
            if let TableData::Sparse(table_rows) = &d.table.data
                && let Some(row) = table_rows.stripe(d.id).read().get(&d.id)
            {
                self.written_back(row);
            }
        }
        log.set_rows_tail(tail);
        if !written.is_empty() {
            crate::metrics::rows_written_back(written.len(), bytes, t0.elapsed());
        }
        Ok(done)
    }

    /// Brings up to `max_rows` of a restart's pending rows whose first update is before
    /// `target` up to date, oldest first, writes them back, and only then stops counting them
    /// pending (see `pending.rs`); they go into the cache while it has room. Returns how many.
    fn recover_oldest(&self, target: u64, max_rows: usize) -> Result<usize> {
        let oldest = self.pending.oldest(target, max_rows);
        if oldest.is_empty() {
            return Ok(0);
        }
        let t0 = Instant::now();
        let mut rows = Encoded::default();
        let mut recovered = Vec::new();
        for (table, pending) in self.by_table(oldest) {
            for (id, row) in self.pending_rows(&table, pending)? {
                rows.add(&table, id, &row);
                recovered.push((table.clone(), id, row));
            }
        }
        let mut batch = self.store.batch();
        rows.put(&mut batch);
        let bytes = batch.size_bytes();
        self.write(batch)
            .map_err(|cause| EngineError::ReadOnly { cause })?;
        for (table, id, _) in &recovered {
            self.pending.done(table.id, std::iter::once(*id));
        }
        crate::metrics::rows_written_back(recovered.len(), bytes, t0.elapsed());
        let count = recovered.len();
        self.cache_recovered(recovered);
        Ok(count)
    }

    /// Puts rows brought up to date from the log and written back into the cache, while it
    /// has room (they are clean).
    pub(super) fn cache_recovered(&self, recovered: Vec<(Arc<Table>, u64, Row)>) {
        for (table, id, row) in recovered {
            let TableData::Sparse(rows) = &table.data else {
                continue;
            };
            if !self.cache_has_room(table.row_bytes()) {
                return;
            }
            rows.insert_absent(&mut rows.stripe(id).write(), id, row);
        }
    }

    /// Brings the pending rows of `table` among `ids` up to date and writes them back (the
    /// writer, before it updates them); returns them, clean.
    pub(super) fn recover(&self, table: &Table, ids: &[u64]) -> Result<Vec<(u64, Row)>> {
        let pending = self.pending.get(table.id, ids);
        if pending.is_empty() {
            return Ok(Vec::new());
        }
        let recovered = self.pending_rows(table, pending)?;
        let mut rows = Encoded::default();
        for (id, row) in &recovered {
            rows.add(table, *id, row);
        }
        let t0 = Instant::now();
        let mut batch = self.store.batch();
        rows.put(&mut batch);
        let bytes = batch.size_bytes();
        self.write(batch)
            .map_err(|cause| EngineError::ReadOnly { cause })?;
        self.pending
            .done(table.id, recovered.iter().map(|(id, _)| *id));
        crate::metrics::rows_written_back(recovered.len(), bytes, t0.elapsed());
        Ok(recovered)
    }

    /// Forgets the dirty rows of table `table_id`, dropped (its rows left the store with it;
    /// written back, they would come back as garbage, and queued, they would keep the
    /// dropped table in memory).
    pub(super) fn forget_dirty(&self, table_id: u32) {
        let mut wb = self.writeback.lock();
        let mut forgotten = 0;
        wb.queue.retain(|d| {
            if d.table.id != table_id {
                return true;
            }
            if let TableData::Sparse(rows) = &d.table.data
                && let Some(row) = rows.stripe(d.id).read().get(&d.id)
                && row.dirty.swap(0, Ordering::Relaxed) != 0
            {
                forgotten += 1;
            }
            false
        });
        self.dirty_rows.fetch_sub(forgotten, Ordering::Relaxed);
    }

    /// Writes back every dirty row; the stored rows then cover the whole log.
    pub(super) fn write_back_all(&self, log: &mut PushLog) -> Result<()> {
        self.write_back(log, u64::MAX)
    }

    /// Writes back the dirty rows a CLOCK sweep met (`victims`: table, id; a row may be
    /// named twice), so that the next sweep may evict them.
    pub(super) fn write_back_victims(&self, victims: &mut Vec<(Arc<Table>, u64)>) -> Result<()> {
        if victims.is_empty() {
            return Ok(());
        }
        victims.sort_unstable_by_key(|(t, id)| (t.id, *id));
        victims.dedup_by_key(|(t, id)| (t.id, *id));
        let t0 = Instant::now();
        let mut rows = Encoded::default();
        for (table, id) in victims.iter() {
            if let TableData::Sparse(table_rows) = &table.data
                && let Some(row) = table_rows.stripe(*id).read().get(id)
            {
                rows.add(table, *id, row);
            }
        }
        let mut batch = self.store.batch();
        rows.put(&mut batch);
        let bytes = batch.size_bytes();
        self.write(batch)
            .map_err(|cause| EngineError::ReadOnly { cause })?;
        for (table, id) in victims.iter() {
            if let TableData::Sparse(rows) = &table.data
                && let Some(row) = rows.stripe(*id).read().get(id)
            {
                self.written_back(row);
            }
        }
        crate::metrics::rows_written_back(victims.len(), bytes, t0.elapsed());
        victims.clear();
        Ok(())
    }
}

/// Rows in their stored form (parameters, step, optimizer state, stamp), for a batch or a
/// record of row images.
#[derive(Default)]
struct Encoded {
    /// (table id, row id, end of the row's bytes in `bytes`).
    rows: Vec<(u32, u64, usize)>,
    bytes: Vec<u8>,
}

impl Encoded {
    fn add(&mut self, table: &Table, id: u64, row: &Row) {
        let stamp = row.stamp.load(Ordering::Relaxed);
        table.append_row(&row.cell, stamp, &mut self.bytes);
        self.rows.push((table.id, id, self.bytes.len()));
    }

    fn len(&self) -> usize {
        self.rows.len()
    }

    fn bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Each row with its bytes.
    fn each(&self) -> impl Iterator<Item = (u32, u64, &[u8])> {
        let mut start = 0;
        self.rows.iter().map(move |&(table, id, end)| {
            let bytes = &self.bytes[start..end];
            start = end;
            (table, id, bytes)
        })
    }

    /// Puts the rows into `batch` in key order: RocksDB's memtable takes keys in order at
    /// the cost of appending them, and its flush then has nothing to sort.
    fn put(self, batch: &mut impl StoreBatch) {
        let mut spans: Vec<([u8; 12], &[u8])> = self
            .each()
            .map(|(table, id, bytes)| (cell_key(table, id), bytes))
            .collect();
        spans.sort_unstable_by_key(|&(key, _)| key);
        for (key, bytes) in spans {
            batch.put(Cf::Params, &key, bytes);
        }
    }

    /// Adds the rows to the record of row images `log` began.
    fn relog(&self, log: &mut PushLog) {
        for (table, id, bytes) in self.each() {
            log.row_image(table, id, bytes);
        }
    }
}

/// Whether a queued entry still names a dirty row (the same dirty spell) of a live table.
fn live(d: &Dirty) -> bool {
    if d.table.dropped.load(Ordering::Acquire) {
        return false;
    }
    let TableData::Sparse(rows) = &d.table.data else {
        return false;
    };
    rows.stripe(d.id)
        .read()
        .get(&d.id)
        .is_some_and(|row| row.dirty.load(Ordering::Relaxed) == d.since)
}
