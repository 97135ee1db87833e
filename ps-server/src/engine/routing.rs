//! Whether a request reached the right shard: its shard-map epoch against the one this shard
//! learnt from the scheduler, and every key it names against the partitioner.

use std::sync::atomic::{AtomicU64, Ordering};

use ps_core::DenseShape;
use tokio::sync::Notify;

use super::table::Table;
use super::{Engine, EngineError, Result};
use crate::store::Store;

/// The shard-map epoch a shard learnt from the scheduler (0: none yet), shared by the
/// registration task, which sets it, and the engine, which checks requests against it.
#[derive(Debug, Default)]
pub struct MapEpoch {
    /// Whether a scheduler manages this shard (else the map is static, epoch 0 for ever).
    managed: bool,
    epoch: AtomicU64,
    /// Woken when a request brings a newer epoch than `epoch`.
    behind: Notify,
}

impl MapEpoch {
    /// The epoch of a shard that registers with a scheduler (`managed`) or has a static map.
    pub fn new(managed: bool) -> Self {
        Self {
            managed,
            ..Self::default()
        }
    }

    pub fn get(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    pub fn set(&self, epoch: u64) {
        self.epoch.store(epoch, Ordering::Release);
    }

    /// A request was routed with a newer epoch than this shard knows: the registration task
    /// heartbeats now instead of at its next tick. Wakes at most one pending heartbeat however
    /// many requests call it.
    pub fn behind(&self) {
        self.behind.notify_one();
    }

    /// Resolves when a request showed this shard is behind.
    pub async fn fell_behind(&self) {
        self.behind.notified().await;
    }
}

impl<S: Store> Engine<S> {
    /// The shard-map epoch this shard is on (0 when no scheduler manages it).
    pub fn map_epoch(&self) -> u64 {
        self.inner.cfg.map_epoch.get()
    }

    /// A request routed with an older map than this shard's is refused (the client must fetch
    /// the map again); one from a newer map is `unavailable` until this shard's next heartbeat
    /// brings the epoch. Epoch 0 is a client that routes without a scheduler (tools, tests):
    /// the shard still checks that it owns every key.
    pub(super) fn check_epoch(&self, request: u64) -> Result<()> {
        let current = self.map_epoch();
        if request == 0 || request == current {
            return Ok(());
        }
        if current == 0 {
            return Err(if self.inner.cfg.map_epoch.managed {
                EngineError::NotRegistered { request }
            } else {
                EngineError::NoScheduler { request }
            });
        }
        if request < current {
            return Err(EngineError::StaleMap { request, current });
        }
        self.inner.cfg.map_epoch.behind();
        Err(EngineError::MapAhead { request, current })
    }

    fn check_owner(&self, owner: u32, key: impl FnOnce() -> String) -> Result<()> {
        let cfg = &self.inner.cfg;
        if owner != cfg.shard_index {
            return Err(EngineError::NotOwner {
                key: key(),
                owner,
                shard: cfg.shard_index,
                shards: cfg.num_shards,
            });
        }
        Ok(())
    }

    /// Checks that this shard owns every id of a sparse request.
    pub(super) fn check_ids(&self, table: &Table, ids: &[u64]) -> Result<()> {
        for &id in ids {
            self.check_owner(
                self.inner.partitioner.shard_for_id(table.placement, id),
                || format!("id {id}"),
            )?;
        }
        Ok(())
    }

    /// Checks that `chunk` exists and is owned here; returns its length.
    pub(super) fn check_chunk(
        &self,
        table: &Table,
        shape: &DenseShape,
        chunk: u64,
    ) -> Result<usize> {
        let len = shape
            .chunk_len(chunk)
            .ok_or_else(|| EngineError::ChunkOutOfRange {
                table: table.spec.name.clone(),
                chunk,
                chunks: shape.num_chunks(),
            })?;
        self.check_owner(
            self.inner.partitioner.shard_for_chunk(table.hash, chunk),
            || format!("chunk {chunk} of `{}`", table.spec.name),
        )?;
        Ok(len)
    }
}
