//! Table administration and statistics: creating and dropping tables and taking a checkpoint
//! of the store go through the writer (in order with the pushes around them); statistics are
//! read from counters.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use ps_core::{TableName, TableSpec, ValidationError};

use super::keys::{META_NEXT_ID, StoredTable, rows_key, table_key};
use super::table::{TableData, footprint};
use super::{Cmd, Engine, EngineError, Inner, Result};
use crate::store::{Cf, Store, StoreBatch, StoreError};
use ps_core::status::{ShardStats, TableStats};

/// Where a checkpoint of the store was written.
#[derive(Debug, Clone)]
pub struct CheckpointDone {
    pub name: String,
    pub path: PathBuf,
    pub sequence: u64,
}

impl<S: Store> Engine<S> {
    /// Creates `spec`, or checks that an existing table of that name has exactly that spec.
    pub async fn create_table(&self, spec: TableSpec) -> Result<(TableSpec, bool)> {
        self.submit(|r| Cmd::Create(spec, r)).await
    }

    pub async fn drop_table(&self, name: TableName) -> Result<()> {
        let id = self.table(&name).map(|t| t.id).ok();
        self.submit(|r| Cmd::Drop(name, r)).await?;
        if let Some(id) = id {
            self.inner.drop_replicas(id);
        }
        Ok(())
    }

    /// Takes a checkpoint of the store named `name` under the configured checkpoint directory
    /// (the dense cells are snapshotted into the store first). Its manifest is the caller's
    /// ([`super::Shard::checkpoint`]).
    pub async fn checkpoint_store(&self, name: String) -> Result<CheckpointDone> {
        self.submit(|r| Cmd::Checkpoint(name, r)).await
    }

    /// Most bytes of sparse rows kept in memory; 0 without a store (every row stays).
    pub fn cache_budget(&self) -> u64 {
        self.inner.cache.budget.unwrap_or(0)
    }

    /// The shard's counters now (the bulk stream's calls are the service's to fill in).
    pub fn stats(&self) -> ShardStats {
        let c = &self.inner.counters;
        let mut tables: Vec<TableStats> = self
            .inner
            .tables
            .read()
            .values()
            .map(|t| t.stats())
            .collect();
        tables.extend(self.inner.unloaded.read().values().map(|u| {
            let mut t = u.table.stats();
            t.load_error = u.cause.clone();
            t
        }));
        tables.sort_by(|a, b| a.name.cmp(&b.name));
        let cache = &self.inner.cache;
        // In the in-memory mode the rows are in `memory_used` already.
        let cache_bytes = if cache.budget.is_some() {
            self.inner.cache_used()
        } else {
            0
        };
        ShardStats {
            shard_index: self.inner.cfg.shard_index,
            num_shards: self.inner.cfg.num_shards,
            uptime_ms: self.inner.started.elapsed().as_millis() as u64,
            pushes_applied: c.pushes_applied.load(Ordering::Relaxed),
            pushes_duplicate: c.pushes_duplicate.load(Ordering::Relaxed),
            write_batches: c.write_batches.load(Ordering::Relaxed),
            bytes_written: c.bytes_written.load(Ordering::Relaxed),
            live_data_bytes: self.inner.store.live_bytes(),
            tables,
            bulk_calls: 0,
            memory_bytes: self.inner.memory_used.load(Ordering::Relaxed) + cache_bytes,
            memory_budget_bytes: self.inner.cfg.memory_budget,
            cache_bytes,
            cache_budget_bytes: cache.budget.unwrap_or(0),
            cache_hits: cache.hits.load(Ordering::Relaxed),
            cache_misses: cache.misses.load(Ordering::Relaxed),
            cache_evictions: cache.evictions.load(Ordering::Relaxed),
        }
    }
}

impl<S: Store> Inner<S> {
    /// Runs an administrative command on the writer thread.
    pub(super) fn run_admin(&self, cmd: Cmd) {
        match cmd {
            Cmd::Create(spec, reply) => {
                let _ = reply.send(self.create(spec));
            }
            Cmd::Drop(name, reply) => {
                let _ = reply.send(self.drop_table(&name));
            }
            Cmd::Checkpoint(name, reply) => {
                let _ = reply.send(self.checkpoint(name));
            }
            Cmd::Push(..) | Cmd::EvictRows | Cmd::Stop => {}
        }
    }

    fn create(&self, spec: TableSpec) -> Result<(TableSpec, bool)> {
        if let Some(t) = self.tables.read().get(&spec.name) {
            return match t.spec.difference(&spec) {
                None => Ok((t.spec.clone(), false)),
                Some(difference) => Err(EngineError::TableExists {
                    table: spec.name,
                    difference,
                }),
            };
        }
        if self.unloaded.read().contains_key(&spec.name) {
            return Err(self.missing(&spec.name));
        }
        self.check_writable()?;
        if spec.evicts_rows() && !self.store.durable() {
            return Err(ValidationError::new(
                "spec.sparse",
                format!(
                    "table `{}` evicts rows (ttl_seconds {}, max_rows {}), which needs a durable \
                     shard: this one runs in memory (start it with --data-dir)",
                    spec.name, spec.ttl_seconds, spec.max_rows
                ),
            )
            .into());
        }
        // A table that cannot be held is refused before its record is written or a cell
        // allocated.
        let needed = footprint(&spec, |chunk| self.owns_chunk(&spec, chunk)).map_err(|why| {
            ValidationError::new("spec.kind", format!("`{}` has {why}", spec.name))
        })?;
        self.check_memory(|| format!("table `{}` on this shard", spec.name), needed)?;
        self.check_job_quota(&spec.name, true, needed)?;
        let mut next = self.next_table_id.lock();
        let id = *next;
        let record = serde_json::to_vec(&StoredTable {
            id,
            spec: spec.clone(),
        })
        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let mut batch = self.store.batch();
        batch.put(Cf::Meta, &table_key(&spec.name), &record);
        batch.put(Cf::Meta, META_NEXT_ID, &(id + 1).to_le_bytes());
        self.write(batch)
            .map_err(|cause| EngineError::ReadOnly { cause })?;
        *next = id + 1;
        let table = self.new_table(id, spec.clone());
        self.memory_used
            .fetch_add(table.memory_bytes(), Ordering::Relaxed);
        self.tables
            .write()
            .insert(spec.name.clone(), Arc::new(table));
        crate::metrics::table_loaded(&spec);
        self.dense_cells_changed();
        tracing::info!(table = %spec.name, id, "table created");
        Ok((spec, true))
    }

    /// Drops a table, loaded or not: its cells and its record leave the store in one write.
    fn drop_table(&self, name: &TableName) -> Result<()> {
        let loaded = self.tables.read().get(name).cloned();
        let id = match &loaded {
            Some(t) => t.id,
            None => match self.unloaded.read().get(name) {
                Some(u) => u.table.id,
                None => {
                    return Err(EngineError::NoSuchTable {
                        table: name.clone(),
                    });
                }
            },
        };
        let mut batch = self.store.batch();
        let (from, to) = (id.to_be_bytes(), (id + 1).to_be_bytes());
        batch.delete_range(Cf::Params, &from, &to);
        batch.delete_range(Cf::Optim, &from, &to);
        batch.delete_range(Cf::Touched, &from, &to);
        batch.delete_range(Cf::ByAge, &from, &to);
        batch.delete(Cf::Meta, &table_key(name));
        batch.delete(Cf::Meta, &rows_key(id));
        self.write(batch)
            .map_err(|cause| EngineError::ReadOnly { cause })?;
        self.unloaded.write().remove(name);
        let Some(table) = loaded else {
            tracing::info!(table = %name, "unloaded table dropped");
            return Ok(());
        };
        table.dropped.store(true, Ordering::Release);
        self.tables.write().remove(name);
        self.forget_dirty(table.id);
        // Rows a queued push adds after this are never counted: the table is gone. A durable
        // shard's cached rows were never counted in `memory_used` (the cache has its own
        // budget), and leave the cache with the table.
        if !(self.cache.budget.is_some() && matches!(table.data, TableData::Sparse(_))) {
            self.memory_used
                .fetch_sub(table.memory_bytes(), Ordering::Relaxed);
        }
        self.dense_cells_changed();
        tracing::info!(table = %name, "table dropped");
        Ok(())
    }

    fn checkpoint(&self, name: String) -> Result<CheckpointDone> {
        let dir = self
            .cfg
            .checkpoint_dir
            .as_ref()
            .ok_or(EngineError::NotDurable)?;
        let path = dir.join(&name);
        if path.exists() {
            return Err(EngineError::CheckpointExists {
                name,
                path: path.display().to_string(),
            });
        }
        // The checkpoint holds the store alone: the dirty rows and the dense cells go into it
        // first.
        if let Some(log) = self.log.lock().as_mut() {
            self.write_back_all(log)?;
            self.snapshot(log)?;
        }
        std::fs::create_dir_all(&path).map_err(StoreError::Io)?;
        let sequence = self.store.checkpoint(&crate::checkpoint::db_of(&path))?;
        Ok(CheckpointDone {
            name,
            path,
            sequence,
        })
    }
}
