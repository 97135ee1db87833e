//! Keeping the push log from filling: records leave room for an *image* (one record holding
//! every dense cell) that frees the log behind it; when the cells are too many for one, or a
//! group is larger than the log takes, a *snapshot* writes every cell into the store with the
//! log position it covers. A checkpoint and a clean stop snapshot too. When the rows written
//! back hold the log's tail, the oldest are written back first (`writeback.rs`).

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::keys::META_LOG_POS;
use super::table::TableData;
use super::writer::Queued;
use super::{EngineError, Inner, Job, Result};
use crate::metrics as m;
use crate::push_log::{PushLog, PushLogError};
use crate::store::{Cf, Store, StoreBatch};

impl<S: Store> Inner<S> {
    /// Writes every dense cell into the store with the log position they now cover, so the
    /// log's records before it may be overwritten. Refused once a write has failed: memory may
    /// then hold updates whose push ids never reached the store.
    pub(super) fn snapshot(&self, log: &mut PushLog) -> Result<()> {
        self.snapshot_onto(log, self.store.batch())
    }

    /// A snapshot written in one batch with what `batch` already holds.
    pub(super) fn snapshot_onto(&self, log: &mut PushLog, mut batch: S::Batch) -> Result<()> {
        self.check_writable()?;
        let t0 = Instant::now();
        let mut scratch = Vec::new();
        for table in self.tables.read().values() {
            if let TableData::Dense(chunks) = &table.data {
                for (&index, cell) in chunks {
                    table.put_chunk(index, &cell.read(), &mut batch, &mut scratch);
                }
            }
        }
        let head = log.head();
        batch.put(Cf::Meta, META_LOG_POS, &head.to_le_bytes());
        self.dedup.lock().store_waiting(&mut batch);
        let bytes = batch.size_bytes();
        self.write(batch)
            .map_err(|cause| EngineError::ReadOnly { cause })?;
        log.set_dense_tail(head);
        m::dense_snapshot(bytes, t0.elapsed());
        Ok(())
    }

    /// Writes an image of every dense cell into the log and makes it the stored position
    /// replay starts from, freeing the records before it.
    fn write_image(&self, log: &mut PushLog, len: u64) -> Result<()> {
        self.check_writable()?;
        let t0 = Instant::now();
        let failed = |e: PushLogError| EngineError::ReadOnly {
            cause: self.fail(e.to_string()),
        };
        // Each cell goes into the log's file from where it is, under its read guard.
        log.begin_image(len);
        for table in self.tables.read().values() {
            if let TableData::Dense(chunks) = &table.data {
                for (&index, cell) in chunks {
                    let cell = cell.read();
                    log.image_cell(table.id, index, cell.step, &cell.data)
                        .map_err(failed)?;
                }
            }
        }
        let written = log.commit().map_err(failed)?;
        let at = log.head() - written;
        let mut batch = self.store.batch();
        batch.put(Cf::Meta, META_LOG_POS, &at.to_le_bytes());
        self.dedup.lock().store_waiting(&mut batch);
        self.write(batch)
            .map_err(|cause| EngineError::ReadOnly { cause })?;
        log.set_dense_tail(at);
        self.counters
            .bytes_written
            .fetch_add(written, Ordering::Relaxed);
        m::dense_image(written, t0.elapsed());
        Ok(())
    }

    /// Recomputes what follows from the set of dense cells (after the load, a create or a
    /// drop): the store's working-set hint and the length of a push-log image.
    pub(super) fn dense_cells_changed(&self) {
        let (mut cells, mut floats) = (0, 0);
        for table in self.tables.read().values() {
            if let TableData::Dense(chunks) = &table.data {
                cells += chunks.len();
                floats += chunks.values().map(|c| c.read().data.len()).sum::<usize>();
            }
        }
        self.store.working_set_hint(floats as u64 * 4);
        self.image_len
            .store(PushLog::image_len(cells, floats), Ordering::Relaxed);
    }

    /// The length of the log record a group's pushes take at most; `None` when none of them
    /// goes to the log.
    fn record_len(pushes: &[Queued]) -> Option<u64> {
        let (mut entries, mut chunks, mut bytes) = (0, 0, 0);
        for (job, _) in pushes {
            match job {
                Job::Dense(table, push) => {
                    let Some(shape) = table.spec.dense_shape() else {
                        continue;
                    };
                    entries += 1;
                    for slice in &push.slices {
                        let (mut offset, mut chunk) = (0, slice.chunk);
                        while offset < slice.values.len() {
                            let Some(n) = shape.chunk_len(chunk) else {
                                break;
                            };
                            offset += n;
                            chunk += 1;
                            chunks += 1;
                        }
                        bytes += slice.values.len() * 4;
                    }
                }
                // At most: every id a row of its own (duplicates are summed into one).
                Job::Sparse(table, push) if table.writes_back() => {
                    entries += 1;
                    chunks += push.ids.len();
                    bytes += push.ids.len() * table.spec.row_dim() * 4;
                }
                Job::Sparse(..) => {}
            }
        }
        (entries > 0).then(|| PushLog::record_len(entries, chunks, bytes))
    }

    /// The length of an image of the dense cells, and the room records leave for it in the
    /// log (none when an image would not fit in one record).
    fn image_room(&self, log: &PushLog) -> (u64, u64) {
        let image = self.image_len.load(Ordering::Relaxed);
        (image, if image <= log.max_image() { image } else { 0 })
    }

    /// Whether a group's record goes into the log as it is: no image, write-back or snapshot
    /// has to free room for it first (what a push committed inline must not wait for).
    pub(super) fn log_takes_as_is(&self, log: &PushLog, pushes: &[Queued]) -> bool {
        let Some(len) = Self::record_len(pushes) else {
            return true;
        };
        let (_, room) = self.image_room(log);
        len <= log.max_record() && log.fits(len + room) && !Self::ring_needs_freeing(log)
    }

    /// The body ring is freed only as the dense cells' stored position moves past the records
    /// that point into it: once they hold three quarters of it, an image (or a snapshot) must
    /// move it.
    fn ring_needs_freeing(log: &PushLog) -> bool {
        log.bodies()
            .is_some_and(|ring| ring.held_by_records() > ring.capacity() / 4 * 3)
    }

    /// Decides where a group's dense gradients and written-back sparse rows go: the log
    /// (with the record's length at most; after freeing the log when the record would
    /// overwrite live ones), or the store (`None`). A group larger than the log takes goes to
    /// the store after a snapshot, so that the store's cells never lag the log's records
    /// behind a newer direct write (its sparse rows are written through, with their stamps).
    pub(super) fn prepare_log(&self, log: &mut PushLog, pushes: &[Queued]) -> Result<Option<u64>> {
        let Some(len) = Self::record_len(pushes) else {
            return Ok(None);
        };
        if len > log.max_record() {
            self.snapshot(log)?;
            return Ok(None);
        }
        // Records leave room for the image that frees the log behind them; when there is no
        // more, the oldest dirty rows are written back and the image is written (or, when the
        // cells are too many for one, a snapshot).
        let (image, room) = self.image_room(log);
        // What this record and the next image will be written into, read ahead while the log
        // is new to this process (`page_warmer.rs`), and as much again.
        log.warm_ahead(2 * (len + room));
        if !log.fits(len + room) {
            let needed = log.tail_needed(len + room);
            if log.rows_tail() < needed {
                // A sixteenth of the log more, so that this is not needed at every group.
                let slack = log.capacity() / 16;
                self.write_back(log, (needed + slack).min(log.head()))?;
            }
            if log.dense_tail() < needed {
                if room > 0 && log.fits(room) {
                    self.write_image(log, image)?;
                }
                if !log.fits(len) {
                    self.snapshot(log)?;
                }
            }
            if !log.fits(len) {
                self.write_back_all(log)?;
                if !log.fits(len) {
                    self.snapshot(log)?;
                }
            }
        }
        // An image moves the body ring's held part (or, when the cells are too many for one, a
        // snapshot).
        if Self::ring_needs_freeing(log) {
            if room > 0 && log.fits(len + room) {
                self.write_image(log, image)?;
            } else {
                self.snapshot(log)?;
            }
        }
        Ok(Some(len))
    }
}
