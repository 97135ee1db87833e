//! Eviction run by the writer between groups: the rows of each evicting table past its TTL or
//! its share of the row cap, found oldest first in `Cf::ByAge` and deleted in one batch (the
//! rules: `eviction.rs`), and the tick that runs it on an idle shard.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::eviction::{Eviction, MAX_EVICT_PER_STEP};
use super::keys::{age_key, read_age_key, rows_key};
use super::table::{Table, TableData};
use super::{Cmd, Inner};
use crate::store::{Cf, Store, StoreBatch};

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
