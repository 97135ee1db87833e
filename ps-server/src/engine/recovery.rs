//! Start-up: the shard's identity, its tables and their cells, the applied push ids, and then
//! the push-log records the store does not cover: dense ones replayed through the same
//! optimizer code in the same order as the pushes that wrote them, sparse ones indexed as
//! pending rows (`pending.rs`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::cell::Cell;
use super::keys::{
    META_DEDUP, META_FLOOR, META_IDENTITY, META_LOG_POS, META_NEXT_ID, META_ROWS_LOG_POS,
    META_TABLE, StoredIdentity, StoredTable, be_u64, le_u64, read_f32s, rows_key,
};
use super::table::{Table, TableData, footprint};
use super::{EngineError, Inner, Result, Unloaded};
use crate::push_log::Logged;
use crate::store::{Cf, Store, StoreBatch, StoreError};

impl<S: Store> Inner<S> {
    /// Loads the identity, tables, cells and applied push ids from the store, then replays the
    /// push log.
    pub(super) fn load(&self) -> Result<()> {
        self.check_identity()?;
        self.store.scan(Cf::Meta, META_NEXT_ID, &mut |_, v| {
            let bytes: [u8; 4] = v
                .try_into()
                .map_err(|_| StoreError::Corrupt("next table id".into()))?;
            *self.next_table_id.lock() = u32::from_le_bytes(bytes);
            Ok(())
        })?;

        let mut stored = Vec::new();
        self.store.scan(Cf::Meta, &[META_TABLE], &mut |k, v| {
            stored.push(StoredTable::read(k, v)?);
            Ok(())
        })?;
        // Tables load in the order they were created, each within what is left of the memory
        // budget; one that does not fit stays in the store, unloaded, and the shard serves
        // the rest (instead of failing to start, or dying of it, on every restart).
        stored.sort_by_key(|t| t.id);
        for t in stored {
            let needed = footprint(&t.spec, |chunk| self.owns_chunk(&t.spec, chunk));
            let fits = needed.and_then(|n| {
                self.check_memory(|| format!("table `{}` on this shard", t.spec.name), n)
                    .map_err(|e| e.to_string())
            });
            if let Err(cause) = fits {
                self.not_loaded(Table::new(t.id, t.spec, |_, _| false), cause);
                continue;
            }
            let table = self.new_table(t.id, t.spec);
            if let Err(cause) = self.load_cells(&table)? {
                self.not_loaded(
                    Table::new(table.id, table.spec.clone(), |_, _| false),
                    cause,
                );
                continue;
            }
            self.memory_used
                .fetch_add(table.memory_bytes(), Ordering::Relaxed);
            crate::metrics::table_loaded(&table.spec);
            self.tables
                .write()
                .insert(table.spec.name.clone(), Arc::new(table));
        }

        let mut dedup = self.dedup.lock();
        self.store.scan(Cf::Meta, &[META_FLOOR], &mut |k, v| {
            dedup.clients.entry(be_u64(&k[1..])?).or_default().floor = le_u64(v)?;
            Ok(())
        })?;
        self.store.scan(Cf::Meta, &[META_DEDUP], &mut |k, _| {
            if k.len() != 17 {
                return Err(StoreError::Corrupt("push id record".into()));
            }
            dedup
                .clients
                .entry(be_u64(&k[1..9])?)
                .or_default()
                .applied
                .insert(be_u64(&k[9..])?);
            Ok(())
        })?;
        drop(dedup);
        let t0 = std::time::Instant::now();
        let replayed = self.replay_log()?;
        tracing::info!(
            tables = self.tables.read().len(),
            clients = self.dedup.lock().clients.len(),
            replayed,
            pending_rows = self.pending.len(),
            replay_ms = t0.elapsed().as_millis() as u64,
            "shard state loaded"
        );
        self.dense_cells_changed();
        crate::metrics::rows_state(0, self.pending.len());
        Ok(())
    }

    /// A data directory records which shard it belongs to and refuses to be opened as another.
    fn check_identity(&self) -> Result<()> {
        let me = StoredIdentity {
            shard_index: self.cfg.shard_index,
            num_shards: self.cfg.num_shards,
            virtual_nodes: self.cfg.virtual_nodes,
        };
        let mut stored = None;
        self.store.scan(Cf::Meta, META_IDENTITY, &mut |_, v| {
            stored = Some(
                serde_json::from_slice::<StoredIdentity>(v)
                    .map_err(|e| StoreError::Corrupt(format!("shard identity: {e}")))?,
            );
            Ok(())
        })?;
        match stored {
            Some(id) if id != me => Err(EngineError::WrongIdentity {
                stored: id.to_string(),
                me: me.to_string(),
            }),
            Some(_) => Ok(()),
            None if self.store.durable() => {
                let mut b = self.store.batch();
                let v = serde_json::to_vec(&me).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                b.put(Cf::Meta, META_IDENTITY, &v);
                Ok(self.store.write(b)?)
            }
            None => Ok(()),
        }
    }

    /// A table with every owned dense chunk at its initial value (sparse tables start empty).
    pub(super) fn new_table(&self, id: u32, spec: ps_core::TableSpec) -> Table {
        let mut table = Table::new(id, spec, |hash, chunk| {
            self.partitioner.shard_for_chunk(hash, chunk) == self.cfg.shard_index
        });
        if self.store.durable() {
            table.eviction = super::eviction::Eviction::new(&table.spec, self.cfg.num_shards);
        }
        table
    }

    /// Whether this shard holds chunk `chunk` of the dense table `spec`.
    pub(super) fn owns_chunk(&self, spec: &ps_core::TableSpec, chunk: u64) -> bool {
        self.partitioner.shard_for_chunk(spec.name.hash64(), chunk) == self.cfg.shard_index
    }

    fn not_loaded(&self, table: Table, cause: String) {
        tracing::error!(table = %table.spec.name, %cause, "table not loaded; the shard serves the others");
        self.unloaded
            .write()
            .insert(table.spec.name.clone(), Unloaded { table, cause });
    }

    /// Loads a dense table's stored cells; a sparse table's rows stay in the store (read on
    /// first use), only their count is read. `Ok(Err(cause))`: the table cannot be loaded.
    fn load_cells(&self, table: &Table) -> Result<Result<(), String>> {
        let chunks = match &table.data {
            TableData::Dense(chunks) => chunks,
            TableData::Sparse(rows) => {
                rows.set_stored(self.stored_rows(table)?);
                rows.set_paged_out();
                return Ok(Ok(()));
            }
        };
        let prefix = table.id.to_be_bytes();
        let cell_len = |index: u64| -> Result<usize, StoreError> {
            table
                .spec
                .dense_shape()
                .and_then(|s| s.chunk_len(index))
                .ok_or_else(|| {
                    StoreError::Corrupt(format!("chunk {index} of `{}`", table.spec.name))
                })
        };
        let cell = |index: u64| {
            chunks.get(&index).ok_or_else(|| {
                StoreError::Corrupt(format!(
                    "chunk {index} of `{}` is not this shard's",
                    table.spec.name
                ))
            })
        };
        self.store.scan(Cf::Params, &prefix, &mut |k, v| {
            let index = be_u64(k.get(4..).unwrap_or_default())?;
            let n = cell_len(index)?;
            read_f32s(v, &mut cell(index)?.write().data[..n])
        })?;
        self.store.scan(Cf::Optim, &prefix, &mut |k, v| {
            let index = be_u64(k.get(4..).unwrap_or_default())?;
            let n = cell_len(index)?;
            cell(index)?.write().load_state(n, v)
        })?;
        Ok(Ok(()))
    }

    /// The rows sparse table `table` has in the store: its recorded count, or, in a data
    /// directory written before rows were counted, its rows counted once and recorded.
    fn stored_rows(&self, table: &Table) -> Result<u64> {
        let key = rows_key(table.id);
        if let Some(n) = self.meta_u64(&key)? {
            return Ok(n);
        }
        let mut n = 0u64;
        self.store
            .scan(Cf::Params, &table.id.to_be_bytes(), &mut |_, _| {
                n += 1;
                Ok(())
            })?;
        if self.store.durable() {
            let mut batch = self.store.batch();
            batch.put(Cf::Meta, &key, &n.to_le_bytes());
            self.store.write(batch)?;
        }
        Ok(n)
    }

    /// Applies the push-log records the stored cells do not cover, in order, through the
    /// same optimizer code as the pushes that wrote them; their push ids join the dedup set
    /// (and the store, for those whose group commit died between the log and the store).
    /// Returns the number of records replayed.
    fn replay_log(&self) -> Result<u64> {
        let mut guard = self.log.lock();
        let Some(log) = guard.as_mut() else {
            return Ok(0);
        };
        let rows_from = self.meta_u64(META_ROWS_LOG_POS)?;
        let Some(dense_from) = self.meta_u64(META_LOG_POS)? else {
            // A new database: whatever a log file beside it holds is not its own.
            log.reset()?;
            let mut batch = self.store.batch();
            batch.put(Cf::Meta, META_LOG_POS, &0u64.to_le_bytes());
            self.store.write(batch)?;
            return Ok(0);
        };
        let by_id: HashMap<u32, Arc<Table>> = self
            .tables
            .read()
            .values()
            .map(|t| (t.id, t.clone()))
            .collect();
        // The records of a table left unloaded are folded into its stored cells, read as
        // records name them, so that nothing acknowledged is lost while it is not in memory.
        let unloaded = self.unloaded.read();
        let unloaded: HashMap<u32, &Table> =
            unloaded.values().map(|u| (u.table.id, &u.table)).collect();
        let mut folded: HashMap<(u32, u64), Cell> = HashMap::new();
        let mut dedup = self.dedup.lock();
        let mut batch = self.store.batch();
        let mut grad = Vec::new();
        // Rows the replayed pushes stored whose group's store write was lost: not counted yet.
        let mut new_rows: HashMap<u32, u64> = HashMap::new();
        let rows_from = rows_from.unwrap_or(dense_from);
        let from = dense_from.min(rows_from);
        // Sparse updates are indexed, not applied: the rows they touch are read on first use.
        self.pending.set_file(log.reader()?);
        let records = log.replay_from(from, dense_from, &mut |pos, logged| -> Result<()> {
            let pushes = match logged {
                Logged::Pushes(pushes) => pushes,
                Logged::Rows(_) if pos < rows_from => return Ok(()),
                Logged::Rows(rows) => {
                    // Rows of a table dropped since are skipped.
                    let images = rows
                        .iter()
                        .filter(|r| {
                            by_id
                                .get(&r.table_id)
                                .is_some_and(|t| matches!(t.data, TableData::Sparse(_)))
                        })
                        .map(|r| (r.table_id, r.id, r.offset, r.data.len() as u32));
                    self.pending.add_images(pos, images);
                    return Ok(());
                }
                Logged::Image(_) if pos < dense_from => return Ok(()),
                Logged::Image(cells) => {
                    for c in cells {
                        if let Some(table) = unloaded.get(&c.table_id) {
                            let cell = self.folded_cell(&mut folded, table, c.index)?;
                            read_f32s(c.data, &mut cell.data)?;
                            cell.step = c.step;
                            continue;
                        }
                        // Cells of a table dropped since are skipped.
                        let Some(table) = by_id.get(&c.table_id) else {
                            continue;
                        };
                        let cell = match &table.data {
                            TableData::Dense(chunks) => chunks.get(&c.index),
                            TableData::Sparse(_) => None,
                        };
                        let mut cell = cell
                            .ok_or_else(|| {
                                StoreError::Corrupt(format!(
                                    "the push log's image names chunk {} of `{}`, which this \
                                     shard does not hold",
                                    c.index, table.spec.name
                                ))
                            })?
                            .write();
                        read_f32s(c.data, &mut cell.data)?;
                        cell.step = c.step;
                    }
                    return Ok(());
                }
            };
            for p in pushes {
                let unlanded = !dedup.seen(&p.push_id);
                if let Some(table) = unloaded.get(&p.table_id)
                    && pos >= dense_from
                {
                    for c in &p.chunks {
                        let cell = self.folded_cell(&mut folded, table, c.index)?;
                        let n = cell.data.len() / (1 + table.spec.optimizer.state_slots());
                        grad.resize(n, 0.0);
                        read_f32s(c.data, &mut grad)?;
                        table.apply_grad(cell, &grad);
                    }
                }
                // Records of a table dropped since are skipped; its cells are gone.
                if let Some(table) = by_id.get(&p.table_id) {
                    let TableData::Dense(chunks) = &table.data else {
                        if pos >= rows_from {
                            let rows = p.chunks.iter().map(|c| (c.index, c.offset, c.new));
                            self.pending.add(table.id, pos, rows);
                            let stored = p.chunks.iter().filter(|c| c.new).count() as u64;
                            if unlanded && stored > 0 {
                                *new_rows.entry(table.id).or_default() += stored;
                            }
                        }
                        if unlanded {
                            dedup.record(&p.push_id, &mut batch);
                        }
                        continue;
                    };
                    if pos < dense_from {
                        continue;
                    }
                    for c in &p.chunks {
                        let (index, data) = (c.index, c.data);
                        let cell = chunks.get(&index).ok_or_else(|| {
                            StoreError::Corrupt(format!(
                                "the push log names chunk {index} of `{}`, not this shard's",
                                table.spec.name
                            ))
                        })?;
                        let mut cell = cell.write();
                        let n = cell.data.len() / (1 + table.spec.optimizer.state_slots());
                        grad.resize(n, 0.0);
                        read_f32s(data, &mut grad)?;
                        table.apply_grad(&mut cell, &grad);
                    }
                }
                if unlanded {
                    dedup.record(&p.push_id, &mut batch);
                }
            }
            Ok(())
        })?;
        drop(dedup);
        // The tails as stored.
        log.set_dense_tail(dense_from);
        log.set_rows_tail(rows_from);
        for (id, n) in new_rows {
            if let Some(TableData::Sparse(rows)) = by_id.get(&id).map(|t| &t.data) {
                batch.put(Cf::Meta, &rows_key(id), &rows.add_stored(n).to_le_bytes());
            }
        }
        if !folded.is_empty() {
            // The folded cells, every loaded dense cell and the log position they all cover,
            // in one write: a restart never replays a folded record twice.
            let mut scratch = Vec::new();
            for ((id, index), cell) in &folded {
                unloaded[id].put_chunk(*index, cell, &mut batch, &mut scratch);
            }
            tracing::warn!(
                cells = folded.len(),
                "push-log records of unloaded tables folded into the store"
            );
            return self.snapshot_onto(log, batch).map(|()| records);
        }
        if batch.size_bytes() > 0 {
            self.store.write(batch)?;
        }
        Ok(records)
    }

    /// The little-endian u64 stored under meta key `key`, if any.
    fn meta_u64(&self, key: &[u8]) -> Result<Option<u64>> {
        let mut found = None;
        self.store.scan(Cf::Meta, key, &mut |k, v| {
            if k == key {
                found = Some(le_u64(v)?);
            }
            Ok(())
        })?;
        Ok(found)
    }

    /// The stored cell `index` of an unloaded dense table, read once into `folded`.
    fn folded_cell<'a>(
        &self,
        folded: &'a mut HashMap<(u32, u64), Cell>,
        table: &Table,
        index: u64,
    ) -> Result<&'a mut Cell> {
        let n = table
            .spec
            .dense_shape()
            .and_then(|s| s.chunk_len(index))
            .ok_or_else(|| {
                StoreError::Corrupt(format!(
                    "the push log names chunk {index} of `{}`, which it does not have",
                    table.spec.name
                ))
            })?;
        let slot = match folded.entry((table.id, index)) {
            std::collections::hash_map::Entry::Occupied(e) => return Ok(e.into_mut()),
            std::collections::hash_map::Entry::Vacant(e) => e,
        };
        let mut cell = Cell::fresh(&table.spec, table.hash, index, n);
        let k = table.key(index);
        self.store.scan(Cf::Params, &k, &mut |_, v| {
            read_f32s(v, &mut cell.data[..n])
        })?;
        self.store
            .scan(Cf::Optim, &k, &mut |_, v| cell.load_state(n, v))?;
        Ok(slot.insert(cell))
    }
}
