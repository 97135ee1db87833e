//! Rows paged between the store and the cache: misses read from the store in one consistent
//! read per request, and the CLOCK sweep that keeps the cache within its budget (the policy and
//! the cache's rules: `rows.rs`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::Inner;
use super::cell::Cell;
use super::rows::{Row, Rows, STRIPES};
use super::table::{Table, TableData};
use crate::store::{Cf, Store, StoreError};

impl<S: Store> Inner<S> {
    /// Reads rows `ids` of `table` from the store, one consistent read for all of them (with
    /// their last push times when the table evicts rows); rows it does not hold are absent
    /// from the answer. The callers ask for rows missing from memory: while none of the
    /// table's rows has left memory ([`Rows::paged_out`]), those are new and the store is not
    /// read.
    pub(super) fn fetch_rows(
        &self,
        table: &Table,
        ids: &[u64],
    ) -> Result<HashMap<u64, Row, foldhash::fast::RandomState>, StoreError> {
        let paged_out = match &table.data {
            TableData::Sparse(rows) => rows.paged_out(),
            TableData::Dense(_) => true,
        };
        if ids.is_empty() || !self.store.durable() || !paged_out {
            return Ok(HashMap::default());
        }
        crate::metrics::store_row_reads(ids.len() as u64);
        let mut found = HashMap::with_capacity_and_hasher(ids.len(), Default::default());
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
                let (cell, stamp) = Cell::stored(&table.spec, dim, &p, state)?;
                let at = touched.get(i).copied().unwrap_or(0);
                found.insert(ids[i], Row::new(cell, at, stamp));
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
    ) -> super::Result<()> {
        let dim = table.spec.row_dim();
        let mut want: Vec<u64> = missing.iter().map(|&i| ids[i]).collect();
        want.sort_unstable();
        want.dedup();
        // Rows a restart left pending: their updates are taken before the store is read (see
        // `pending.rs`), and the rows brought up to date are answered, never cached.
        let pending = self.pending.get(table.id, &want);
        let pending: HashMap<u64, Row, foldhash::fast::RandomState> = if pending.is_empty() {
            HashMap::default()
        } else {
            let rows: HashMap<u64, Row, foldhash::fast::RandomState> =
                self.pending_rows(table, pending)?.into_iter().collect();
            want.retain(|id| !rows.contains_key(id));
            rows
        };
        let epoch = self.cache.epoch.load(Ordering::SeqCst);
        let mut fetched = self.fetch_rows(table, &want)?;
        for &i in missing {
            let out = &mut buf[i * dim..(i + 1) * dim];
            match fetched.get(&ids[i]).or_else(|| pending.get(&ids[i])) {
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
    /// calls it after a group is written, so every clean row it evicts is in the store; a
    /// dirty row the hand would evict is written back first and evicted by the next turn.
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
        let mut dirty: Vec<(Arc<Table>, u64)> = Vec::new();
        // Two turns of the hand clear every bit and evict every clean row; the dirty ones met
        // are written back and a third turn evicts them.
        for turn in 0..3 * positions {
            if used <= low {
                break;
            }
            if (turn == 2 * positions || dirty.len() >= 65_536)
                && let Err(e) = self.write_back_victims(&mut dirty)
            {
                tracing::warn!(error = %e, "dirty rows not written back; none evicted");
                return;
            }
            *hand = (*hand + 1) % positions;
            let table = &tables[(*hand / STRIPES as u64) as usize];
            let TableData::Sparse(rows) = &table.data else {
                continue;
            };
            self.cache.epoch.fetch_add(1, Ordering::SeqCst);
            let evicted = rows.sweep((*hand % STRIPES as u64) as usize, &mut |id, _| {
                dirty.push((table.clone(), id));
            });
            used = used.saturating_sub(evicted * table.row_bytes());
            self.cache.evictions.fetch_add(evicted, Ordering::Relaxed);
        }
        if let Err(e) = self.write_back_victims(&mut dirty) {
            tracing::warn!(error = %e, "dirty rows not written back");
        }
    }
}
