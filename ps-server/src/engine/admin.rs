//! Table administration and statistics: creating and dropping tables and taking a checkpoint
//! of the store go through the writer (in order with the pushes around them); statistics are
//! read from counters.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use ps_core::{TableName, TableSpec};

use super::keys::{META_NEXT_ID, StoredTable, table_key};
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
        tables.sort_by(|a, b| a.name.cmp(&b.name));
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
            Cmd::Push(..) | Cmd::Stop => {}
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
        self.check_writable()?;
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
        self.tables
            .write()
            .insert(spec.name.clone(), Arc::new(table));
        self.dense_cells_changed();
        tracing::info!(table = %spec.name, id, "table created");
        Ok((spec, true))
    }

    fn drop_table(&self, name: &TableName) -> Result<()> {
        let table =
            self.tables
                .read()
                .get(name)
                .cloned()
                .ok_or_else(|| EngineError::NoSuchTable {
                    table: name.clone(),
                })?;
        let mut batch = self.store.batch();
        let (from, to) = (table.id.to_be_bytes(), (table.id + 1).to_be_bytes());
        batch.delete_range(Cf::Params, &from, &to);
        batch.delete_range(Cf::Optim, &from, &to);
        batch.delete(Cf::Meta, &table_key(name));
        self.write(batch)
            .map_err(|cause| EngineError::ReadOnly { cause })?;
        table.dropped.store(true, Ordering::Release);
        self.tables.write().remove(name);
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
        // The checkpoint holds the store alone: the dense cells go into it first.
        if let Some(log) = self.log.lock().as_mut() {
            self.snapshot(log)?;
        }
        std::fs::create_dir_all(&path).map_err(StoreError::Io)?;
        let sequence = self.store.checkpoint(&path.join("db"))?;
        Ok(CheckpointDone {
            name,
            path,
            sequence,
        })
    }
}
