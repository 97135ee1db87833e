//! The writer thread, and the turn it shares: every mutation is committed by whoever holds the
//! turn, the writer or (for a dense push while the writer is idle) the handler that received
//! it ([`Inner::commit_inline`]). A commit takes every queued push at once (up to
//! `group_commit_bytes`), applies them to the hot layer, writes the gradients it applied
//! (dense chunks, rows written back) to the push log and what else it changed (rows written
//! through, the push ids the log does not hold: `dedup.rs`) to one store batch, and answers
//! the callers only after both writes: one durable write serves many pushes.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ps_core::{NonFinitePolicy, PushDense, PushSparse, TableKind};
use tokio::sync::{mpsc, oneshot};

use super::cell::Cell;
use super::dedup::Dedup;
use super::keys::rows_key;
use super::rows::{self, Row};
use super::table::{Table, TableData, ThreadCpu};
use super::{Cmd, EngineError, Inner, Job, PushOutcome, Result};
use crate::metrics as m;
use crate::push_log::PushLog;
use crate::store::{Cf, Store, StoreBatch};

/// Where a push's answer goes.
pub(super) type Reply = oneshot::Sender<Result<PushOutcome>>;

/// A queued push and where its answer goes.
pub(super) type Queued = (Job, Reply);

/// Buffers the writer keeps between groups: a sparse push's gradients are megabytes, which
/// freshly allocated would be fresh pages to fault in and zero on every push.
#[derive(Default)]
pub(super) struct Scratch {
    /// A sparse push's gradients, summed per distinct id.
    combined: Vec<f32>,
    /// The distinct ids, in first-seen order.
    order: Vec<u64>,
    /// Id → its slot in `order`.
    slots: HashMap<u64, usize, foldhash::fast::RandomState>,
    /// The ids not in memory.
    missing: Vec<u64>,
    /// One row's gradient, decoded.
    row: Vec<f32>,
    /// The slots of `order` to update, grouped by lock stripe.
    by_stripe: rows::ByStripe,
    /// A row's stored form, built for the batch.
    bytes: Vec<u8>,
}

/// What the thread committing pushes holds: the writer, or a connection committing the
/// combining queue's pushes ([`Inner::commit_inline`]).
#[derive(Default)]
pub(super) struct Turn {
    pub(super) scratch: Scratch,
    /// The writer has stopped: every push must go to it now, to be refused.
    pub(super) stopped: bool,
}

/// Groups of at most this many bytes are latency-bound: after one, the writer waits for the
/// next command awake (`EngineConfig::writer_spin`) before it sleeps.
pub(super) const SMALL_GROUP_BYTES: usize = 64 << 10;

/// The next command. After a small group the writer first polls for up to `spin`, yielding
/// its core to any thread that wants it: a request-answer client sends its next push within
/// a few hundred microseconds, and a thread woken from sleep costs tens of microseconds per
/// push (on a virtual machine, a processor woken from halt). On ps-bench's 1 K-float pairs,
/// with small bulk frames sent in one write, the pair's median fell by about 40%.
fn next_cmd(rx: &mut mpsc::Receiver<Cmd>, spin: Duration) -> Option<Cmd> {
    if !spin.is_zero() {
        let until = Instant::now() + spin;
        loop {
            match rx.try_recv() {
                Ok(cmd) => return Some(cmd),
                Err(mpsc::error::TryRecvError::Disconnected) => return None,
                Err(mpsc::error::TryRecvError::Empty) if Instant::now() < until => {
                    std::thread::yield_now();
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
            }
        }
    }
    rx.blocking_recv()
}

impl<S: Store> Inner<S> {
    pub(super) fn run_writer(&self, mut rx: mpsc::Receiver<Cmd>) {
        let mut spin = Duration::ZERO;
        while let Some(first) = next_cmd(&mut rx, spin) {
            // The turn is the writer's while it works; between commands a connection may take
            // it to commit a push of its own ([`Inner::commit_inline`]).
            let mut turn = self.turn.lock();
            let scratch = &mut turn.scratch;
            let mut pushes = Vec::new();
            let mut bytes = 0;
            let mut next = Some(first);
            // Group every push already queued (up to the byte cap) into one commit; an admin
            // command ends the group and runs on its own after it.
            while let Some(cmd) = next.take() {
                match cmd {
                    Cmd::Push(job, reply) => {
                        bytes += job.bytes();
                        pushes.push((job, reply));
                        if bytes < self.cfg.group_commit_bytes {
                            next = rx.try_recv().ok();
                        }
                    }
                    Cmd::Stop => {
                        pushes.append(&mut self.combining.lock());
                        self.commit_group(std::mem::take(&mut pushes), scratch);
                        // A clean stop leaves nothing to replay at the next start.
                        if let Some(log) = self.log.lock().as_mut()
                            && let Err(e) =
                                self.write_back_all(log).and_then(|()| self.snapshot(log))
                        {
                            tracing::warn!(error = %e, "the log is not empty at stop; the next start replays it");
                        }
                        turn.stopped = true;
                        tracing::info!("writer stopped");
                        return;
                    }
                    // Ends the group: the commit and the evictions after the loop do the rest.
                    Cmd::EvictRows => {}
                    admin => {
                        self.commit_group(std::mem::take(&mut pushes), scratch);
                        self.after_group();
                        self.run_admin(admin);
                    }
                }
            }
            spin = if bytes <= SMALL_GROUP_BYTES {
                self.cfg.writer_spin
            } else {
                Duration::ZERO
            };
            self.commit_group(pushes, scratch);
            self.after_group();
            drop(turn);
            // Pushes that found the turn held while the writer worked.
            let left = self.combine();
            if !left.is_empty() {
                let mut turn = self.turn.lock();
                self.commit_group(left, &mut turn.scratch);
            }
        }
        self.turn.lock().stopped = true;
        tracing::info!("writer stopped");
    }

    /// Commits a dense push on the calling thread when the writer is idle, instead of handing
    /// it to the writer thread: a hand-off costs two wake-ups (the writer's, then the
    /// connection's), which on a loaded 2-core host cost more than the apply of a 1 MiB push.
    /// The push joins the queue of pushes being combined; whoever holds the turn commits every
    /// push in it as one group before giving the turn up, so a push that finds the turn held
    /// is committed by its holder (one wake-up: its answer) and pushes arriving together are
    /// still grouped. Only a dense push within `inline_push_bytes` comes here, and only while
    /// nothing is queued for the writer (which keeps the order of a caller's commands) and
    /// without `sync` (an fsync is not to be waited for on a connection's thread). The
    /// answer comes by `reply`; pushes whose record needs room freed first (an image, a
    /// write-back or a snapshot) are given back, for the writer.
    pub(super) fn commit_inline(&self, job: Job, reply: Reply) -> Vec<Queued> {
        self.combining.lock().push((job, reply));
        self.combine()
    }

    /// Takes the turn, if free, and commits the combining queue's pushes until it is empty;
    /// gives back those the writer must commit. After giving the turn up it looks again: a
    /// push queued while the turn was held, by a caller that found it held, is never left
    /// behind.
    pub(super) fn combine(&self) -> Vec<Queued> {
        let mut for_writer = Vec::new();
        loop {
            let Some(mut turn) = self.turn.try_lock() else {
                return for_writer;
            };
            loop {
                let group = std::mem::take(&mut *self.combining.lock());
                if group.is_empty() {
                    break;
                }
                if turn.stopped {
                    for (_, reply) in group {
                        let _ = reply.send(Err(EngineError::ShuttingDown));
                    }
                    continue;
                }
                let takes = self
                    .log
                    .lock()
                    .as_ref()
                    .is_none_or(|log| self.log_takes_as_is(log, &group));
                if takes {
                    m::pushes_inline(group.len());
                    self.commit_group(group, &mut turn.scratch);
                } else {
                    for_writer.extend(group);
                }
            }
            drop(turn);
            if self.combining.lock().is_empty() {
                return for_writer;
            }
        }
    }

    /// What the writer does between groups: rows evicted by their tables' TTL and caps, the
    /// cache kept within its budget, and the oldest dirty rows written back.
    fn after_group(&self) {
        self.evict_rows();
        self.evict();
        if let Some(log) = self.log.lock().as_mut() {
            if let Err(e) = self.trickle_write_back(log) {
                tracing::warn!(error = %e, "dirty rows not written back");
            }
            m::rows_state(self.dirty_rows.load(Ordering::Relaxed), self.pending.len());
        }
    }

    fn commit_group(&self, pushes: Vec<Queued>, scratch: &mut Scratch) {
        if pushes.is_empty() {
            return;
        }
        let t0 = Instant::now();
        let mut batch = self.store.batch();
        let mut log_guard = self.log.lock();
        // The group's dense gradients go to the log, unless they are more than it takes.
        let mut log = match log_guard.as_mut() {
            Some(log) => match self.prepare_log(log, &pushes) {
                Ok(Some(len)) => {
                    log.begin(len);
                    Some(log)
                }
                Ok(None) => None,
                Err(e) => {
                    let cause = match e {
                        EngineError::ReadOnly { cause } => cause,
                        other => other.to_string(),
                    };
                    for (_, reply) in pushes {
                        let _ = reply.send(Err(EngineError::ReadOnly {
                            cause: cause.clone(),
                        }));
                    }
                    return;
                }
            },
            None => None,
        };
        let (results, applied) = {
            let mut dedup = self.dedup.lock();
            let results: Vec<Result<PushOutcome>> = pushes
                .iter()
                .map(|(job, _)| {
                    let cpu = ThreadCpu::now();
                    let r = self.apply(job, &mut dedup, &mut batch, log.as_deref_mut(), scratch);
                    job.table().charge(cpu);
                    r
                })
                .collect();
            let applied = results
                .iter()
                .filter(|r| matches!(r, Ok(o) if !o.duplicate))
                .count();
            // A write that happens anyway takes the ids waiting for one.
            if applied > 0 && !batch.is_empty() {
                dedup.store_waiting(&mut batch);
            }
            (results, applied)
        };
        let t1 = Instant::now();
        let mut size = batch.size_bytes();
        // The log record first: the push ids in the batch claim what it holds.
        let logged = match log {
            Some(log) if log.pending() > PushLog::record_len(0, 0, 0) => {
                log.commit().map_err(|e| self.fail(e.to_string()))
            }
            _ => Ok(0),
        };
        drop(log_guard);
        size += logged.as_ref().map_or(0, |&n| n as usize);
        let written = match logged {
            Err(e) => Err(e),
            Ok(n) => {
                self.counters.bytes_written.fetch_add(n, Ordering::Relaxed);
                // A group of dense pushes through the log writes nothing else.
                if applied > 0 && !batch.is_empty() {
                    self.write(batch)
                } else {
                    Ok(())
                }
            }
        };
        m::group_commit(pushes.len(), size, t1 - t0, t1.elapsed());
        for ((job, reply), result) in pushes.into_iter().zip(results) {
            let result = match (&written, result) {
                // Nothing of this group is durable, duplicates of its own pushes included.
                (Err(cause), Ok(_)) => Err(EngineError::ReadOnly {
                    cause: cause.clone(),
                }),
                (_, r) => r,
            };
            let kind = match &job {
                Job::Dense(..) => "dense",
                Job::Sparse(..) => "sparse",
            };
            let name = job.table().spec.name.as_str();
            match &result {
                Ok(o) => m::push_done(
                    name,
                    kind,
                    o.duplicate,
                    o.applied_values,
                    o.skipped_non_finite,
                ),
                Err(_) => m::push_failed(name, kind),
            }
            // The caller may have gone away (its deadline passed); the push is applied anyway
            // and a retry will be recognised as a duplicate.
            let _ = reply.send(result);
        }
    }

    /// Writes `batch`. A failure turns the engine read-only; its cause is returned (the
    /// answer of every push the batch held is [`EngineError::ReadOnly`] with it).
    pub(super) fn write(&self, batch: S::Batch) -> Result<(), String> {
        let size = batch.size_bytes() as u64;
        match self.store.write(batch) {
            Ok(()) => {
                self.counters.write_batches.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .bytes_written
                    .fetch_add(size, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => Err(self.fail(e.to_string())),
        }
    }

    /// Turns the engine read-only after a failed write; returns the cause.
    pub(super) fn fail(&self, cause: String) -> String {
        tracing::error!(%cause, "a write to the store failed; the shard is read-only until restarted");
        *self.failed.lock() = Some(cause.clone());
        cause
    }

    fn apply(
        &self,
        job: &Job,
        dedup: &mut Dedup,
        batch: &mut S::Batch,
        log: Option<&mut PushLog>,
        scratch: &mut Scratch,
    ) -> Result<PushOutcome> {
        let (table, push_id) = match job {
            Job::Dense(t, p) => (t, &p.push_id),
            Job::Sparse(t, p) => (t, &p.push_id),
        };
        if dedup.seen(push_id) {
            self.counters
                .pushes_duplicate
                .fetch_add(1, Ordering::Relaxed);
            return Ok(PushOutcome {
                duplicate: true,
                ..PushOutcome::default()
            });
        }
        self.check_writable()?;
        if table.dropped.load(Ordering::Acquire) {
            return Err(EngineError::TableDropped {
                table: table.spec.name.clone(),
            });
        }
        // A dense push's id is in the log's record: it reaches the store with the next write
        // that moves the log's tail (`dedup.rs`). A sparse push's goes with its batch even
        // when its rows are logged: replay counts the rows a push stored only when its id is
        // not in the store.
        let logged = matches!(job, Job::Dense(..)) && log.is_some();
        let outcome = match job {
            Job::Dense(t, p) => self.apply_dense(t, p, batch, log),
            Job::Sparse(t, p) => {
                let log = log.filter(|_| t.writes_back());
                self.apply_sparse(t, p, batch, log, scratch)?
            }
        };
        if logged {
            dedup.record_logged(push_id);
        } else {
            dedup.record(push_id, batch);
        }
        self.counters.pushes_applied.fetch_add(1, Ordering::Relaxed);
        table.counters.pushes.fetch_add(1, Ordering::Relaxed);
        table
            .counters
            .values_pushed
            .fetch_add(outcome.applied_values, Ordering::Relaxed);
        Ok(outcome)
    }

    /// Applies a dense push; the updated cells go into `batch`, or, with `log`, the applied
    /// gradients go into the log's record.
    fn apply_dense(
        &self,
        table: &Table,
        push: &PushDense,
        batch: &mut S::Batch,
        mut log: Option<&mut PushLog>,
    ) -> PushOutcome {
        let mut out = PushOutcome::default();
        let (TableKind::Dense(shape), TableData::Dense(chunks)) = (&table.spec.kind, &table.data)
        else {
            return out; // checked before queueing
        };
        if let Some(log) = log.as_deref_mut() {
            log.push(table.id, &push.push_id);
        }
        let mut grad = Vec::new();
        let mut scratch = Vec::new();
        for slice in &push.slices {
            let mut offset = 0;
            let mut chunk = slice.chunk;
            while offset < slice.values.len() {
                let (Some(n), Some(cell)) = (shape.chunk_len(chunk), chunks.get(&chunk)) else {
                    break; // checked before queueing
                };
                let Some(part) = slice.values.slice(offset, offset + n) else {
                    break; // decoded to f32 and checked before queueing
                };
                offset += n;
                chunk += 1;
                // Under REJECT the push was checked whole before it was queued.
                if table.spec.non_finite == NonFinitePolicy::Skip
                    && part.first_non_finite().is_some()
                {
                    out.skipped_non_finite += 1;
                    continue;
                }
                let mut cell = cell.write();
                // The gradient is applied from the received bytes; a log's record holds
                // those same bytes, written from where they are at commit, and their CRC-32,
                // taken in the optimizer's pass. Without a log the updated cell goes into the
                // batch.
                if let Some(log) = log.as_deref_mut() {
                    let crc = table.apply_le_summed(&mut cell, part.data(), &mut grad);
                    log.chunk_shared(chunk - 1, part.data(), crc);
                } else {
                    table.apply_le(&mut cell, part.data(), &mut grad);
                    table.put_chunk(chunk - 1, &cell, batch, &mut scratch);
                }
                out.applied_values += n as u64;
            }
        }
        out
    }

    /// Applies a sparse push to its rows. With `log` (a table written back), each updated
    /// row's gradient goes into the log's record and the row stays dirty in memory
    /// (`writeback.rs`); without, the updated rows go into `batch`.
    fn apply_sparse(
        &self,
        table: &Arc<Table>,
        push: &PushSparse,
        batch: &mut S::Batch,
        mut log: Option<&mut PushLog>,
        scratch: &mut Scratch,
    ) -> Result<PushOutcome> {
        let mut out = PushOutcome::default();
        let TableData::Sparse(rows) = &table.data else {
            return Ok(out); // checked before queueing
        };
        let dim = table.spec.row_dim();
        // Combine duplicate ids: each row is updated once with the sum of its gradients (the
        // payload was decoded to f32 and checked before queueing).
        let Scratch {
            combined,
            order,
            slots,
            missing,
            row,
            by_stripe,
            bytes: scratch,
        } = scratch;
        combined.clear();
        order.clear();
        slots.clear();
        row.resize(dim, 0.0);
        for (&id, g) in push
            .ids
            .iter()
            .zip(push.values.data().chunks_exact(dim * 4))
        {
            match slots.get(&id) {
                Some(&slot) => {
                    ps_core::payload::read_f32_le(g, row);
                    for (s, v) in combined[slot * dim..(slot + 1) * dim].iter_mut().zip(&*row) {
                        *s += v;
                    }
                }
                None => {
                    slots.insert(id, order.len());
                    order.push(id);
                    let at = combined.len();
                    combined.resize(at + dim, 0.0);
                    ps_core::payload::read_f32_le(g, &mut combined[at..]);
                }
            }
        }
        // When the rows are pushed, for a table that evicts them by age or count.
        let stamp = table
            .eviction
            .as_ref()
            .map(|e| e.stamp(self.cfg.clock.now(), push.clock));
        let mut new_rows = 0u64;
        let mut held_back = 0u64;
        if let Some(log) = log.as_deref_mut() {
            log.push(table.id, &push.push_id);
        }
        let skip = table.spec.non_finite == NonFinitePolicy::Skip;
        let mut update = |row: &mut Row, id: u64, g: &[f32], new: bool, out: &mut PushOutcome| {
            table.apply_grad(&mut row.cell, g);
            match log.as_deref_mut() {
                Some(log) => {
                    log.row_f32(id, g, new);
                    self.logged_update(table, id, row, log.position());
                }
                None => {
                    let stamp = row.stamp.load(Ordering::Relaxed);
                    table.put_row(id, &row.cell, stamp, batch, scratch);
                    self.written_back(row);
                }
            }
            if let (Some(eviction), Some(stamp)) = (&table.eviction, stamp) {
                eviction.touch(table.id, id, row, stamp, batch);
            }
            out.applied_values += dim as u64;
        };
        // The rows in memory first, each found once (only this thread evicts, so they stay in
        // memory until the group is written), by lock stripe (`rows::ByStripe`): found and
        // prefetched in one pass, updated in a second from the processor's cache.
        by_stripe.group(
            order
                .iter()
                .zip(combined.chunks_exact(dim))
                .map(|(&id, g)| {
                    if skip && g.iter().any(|v| !v.is_finite()) {
                        out.skipped_non_finite += 1;
                        return None;
                    }
                    Some(id)
                }),
        );
        missing.clear();
        let mut misses = Vec::new();
        for (s, group) in by_stripe.groups() {
            let mut stripe = rows.stripe_at(s).write();
            rows::warm(
                &stripe,
                group.iter().map(|&k| order[k as usize]),
                usize::MAX,
            );
            for &k in group {
                let k = k as usize;
                let (id, g) = (order[k], &combined[k * dim..(k + 1) * dim]);
                match stripe.get_mut(&id) {
                    Some(row) => update(row, id, g, false, &mut out),
                    None => {
                        missing.push(id);
                        misses.push(k);
                    }
                }
            }
        }
        self.cache
            .counted((order.len() - missing.len()) as u64, missing.len() as u64);
        if !missing.is_empty() {
            // The rest read from the store in one batch (a restart's pending rows brought up
            // to date and written back first). The rows in memory are updated already: a
            // failed read leaves memory ahead of the store, so the engine turns read-only.
            let fetched = self.recover(table, missing).and_then(|recovered| {
                let ids: std::collections::HashSet<u64> = recovered.iter().map(|r| r.0).collect();
                missing.retain(|id| !ids.contains(id));
                let mut fetched = self.fetch_rows(table, missing)?;
                fetched.extend(recovered);
                Ok(fetched)
            });
            let mut fetched = fetched.map_err(|e| EngineError::ReadOnly {
                cause: self.fail(e.to_string()),
            })?;
            for k in misses {
                let (id, g) = (order[k], &combined[k * dim..(k + 1) * dim]);
                let mut stripe = rows.stripe(id).write();
                let mut new = false;
                if !stripe.contains_key(&id) {
                    let row = match fetched.remove(&id) {
                        Some(row) => row,
                        None => {
                            // A new id: stored only once admission lets it in.
                            if table.admission.as_ref().is_some_and(|a| !a.admit(id)) {
                                held_back += 1;
                                continue;
                            }
                            new_rows += 1;
                            new = true;
                            Row::new(Cell::fresh(&table.spec, table.hash, id, dim), 0, 0)
                        }
                    };
                    rows.insert_absent(&mut stripe, id, row);
                }
                if let Some(row) = stripe.get_mut(&id) {
                    update(row, id, g, new, &mut out);
                }
            }
        }
        if held_back + new_rows > 0 {
            crate::metrics::rows_admission(table.spec.name.as_str(), new_rows, held_back);
        }
        if held_back > 0 {
            table
                .counters
                .rows_held_back
                .fetch_add(held_back, Ordering::Relaxed);
        }
        if new_rows > 0 {
            table
                .counters
                .rows_admitted
                .fetch_add(new_rows, Ordering::Relaxed);
            let total = rows.add_stored(new_rows);
            if self.cache.budget.is_none() {
                self.memory_used
                    .fetch_add(new_rows * table.row_bytes(), Ordering::Relaxed);
            }
            batch.put(Cf::Meta, &rows_key(table.id), &total.to_le_bytes());
        }
        Ok(out)
    }
}
