//! The engine serving a shard now, and the database generations behind it: a checkpoint is
//! the store's checkpoint plus a manifest of its files with their checksums; a restore installs
//! a checkpoint as a new generation of the data directory, opens an engine on it and swaps it
//! in, while requests keep being served by the old engine until the swap.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::RwLock;
use ps_core::ValidationError;

use super::{Engine, EngineError, Result};
use crate::checkpoint::{self, Manifest};
use crate::store::{Store, StoreError};

/// Opens a store at a RocksDB directory (after a restore).
pub type Reopen<S> = Arc<dyn Fn(&Path) -> Result<S, StoreError> + Send + Sync>;

/// A checkpoint written with its manifest.
#[derive(Debug, Clone)]
pub struct Checkpointed {
    pub name: String,
    pub path: PathBuf,
    pub files: u64,
    pub bytes: u64,
    pub sequence: u64,
}

/// What a restore installed.
#[derive(Debug, Clone)]
pub struct Restored {
    pub files: u64,
    pub bytes: u64,
    pub sequence: u64,
}

/// The shard's engine, replaced by a restore while the service runs.
pub struct Shard<S: Store> {
    slot: RwLock<Engine<S>>,
    /// The data directory and how to open a store in it; `None` in the in-memory mode.
    restore: Option<(PathBuf, Reopen<S>)>,
    /// One restore at a time.
    restoring: tokio::sync::Mutex<()>,
}

impl<S: Store> std::fmt::Debug for Shard<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("engine", &*self.slot.read())
            .finish_non_exhaustive()
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A checkpoint's name: the one asked for, checked (it becomes a directory name), or a
/// time-based one when none was.
pub fn checkpoint_name(requested: String) -> Result<String> {
    if requested.is_empty() {
        return Ok(format!("ckpt-{}", unix_ms()));
    }
    if requested.len() > 64
        || !requested
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        || requested.starts_with('.')
    {
        return Err(ValidationError::new(
            "name",
            format!(
                "checkpoint name `{requested}` must be 1 to 64 characters of [A-Za-z0-9_.-], \
                 not starting with `.`"
            ),
        )
        .into());
    }
    Ok(requested)
}

impl<S: Store> Shard<S> {
    /// `engine`, restorable from checkpoints when `restore` names the data directory and how
    /// to open a store in it.
    pub fn new(engine: Engine<S>, restore: Option<(PathBuf, Reopen<S>)>) -> Self {
        Self {
            slot: RwLock::new(engine),
            restore,
            restoring: tokio::sync::Mutex::new(()),
        }
    }

    /// The engine serving requests now.
    pub fn engine(&self) -> Engine<S> {
        self.slot.read().clone()
    }

    /// Checkpoints the store as `name` (a time-based name when empty) and writes its manifest.
    pub async fn checkpoint(&self, name: String) -> Result<Checkpointed> {
        let name = checkpoint_name(name)?;
        let engine = self.engine();
        let done = engine.checkpoint_store(name).await?;
        let cfg = engine.config();
        let manifest = Manifest {
            format: 1,
            name: done.name.clone(),
            shard_index: cfg.shard_index,
            num_shards: cfg.num_shards,
            sequence: done.sequence,
            created_unix_ms: unix_ms(),
            tables: engine
                .list_tables()
                .into_iter()
                .map(|t| t.name.to_string())
                .collect(),
            files: Vec::new(),
        };
        let failed = |cause: String| EngineError::Checkpoint {
            name: done.name.clone(),
            cause,
        };
        // Checksumming reads every file: off the runtime, and off the writer thread.
        let dir = done.path.clone();
        let manifest =
            tokio::task::spawn_blocking(move || checkpoint::write_manifest(&dir, manifest))
                .await
                .map_err(|e| failed(format!("the manifest task failed: {e}")))?
                .map_err(|e| failed(format!("writing the manifest: {e}")))?;
        tracing::info!(name = %done.name, files = manifest.files.len(), bytes = manifest.total_bytes(), "checkpoint written");
        Ok(Checkpointed {
            files: manifest.files.len() as u64,
            bytes: manifest.total_bytes(),
            name: done.name,
            path: done.path,
            sequence: done.sequence,
        })
    }

    /// Replaces the shard's whole state with checkpoint `name`: pushes acknowledged after it
    /// are discarded. Requests are served by the old engine until the new one is open.
    pub async fn restore(&self, name: String) -> Result<Restored> {
        if name.is_empty() {
            return Err(ValidationError::new("name", "empty; name the checkpoint").into());
        }
        let name = checkpoint_name(name)?;
        let Some((data_dir, reopen)) = self.restore.clone() else {
            return Err(EngineError::NotDurable);
        };
        let engine = self.engine();
        let ckpt = engine
            .config()
            .checkpoint_dir
            .as_ref()
            .ok_or(EngineError::NotDurable)?
            .join(&name);
        if !ckpt.is_dir() {
            return Err(EngineError::NoSuchCheckpoint { name });
        }
        let _one = self.restoring.lock().await;
        let cfg = engine.config().clone();
        drop(engine);
        let failed = |cause: String| EngineError::Checkpoint {
            name: name.clone(),
            cause,
        };
        // A checkpoint whose files do not match its manifest is refused as damaged before
        // anything of the shard's state changes.
        let dir = ckpt.clone();
        let verified = tokio::task::spawn_blocking(move || checkpoint::verify(&dir))
            .await
            .map_err(|e| failed(format!("the verify task failed: {e}")))?
            .map_err(|e| EngineError::CheckpointDamaged {
                name: name.clone(),
                cause: format!("{e:#}"),
            })?;
        let (fresh, manifest) = tokio::task::spawn_blocking(move || {
            let (db, manifest) = checkpoint::install_generation(&ckpt, verified, &data_dir)?;
            let store = reopen(&db)?;
            let engine = Engine::open(store, cfg)?;
            anyhow::Ok((engine, manifest))
        })
        .await
        .map_err(|e| failed(format!("the restore task failed: {e}")))?
        .map_err(|e| failed(format!("restoring: {e:#}")))?;
        let old = std::mem::replace(&mut *self.slot.write(), fresh);
        // Drains the old writer; its store closes when the last in-flight request drops it.
        tokio::task::spawn_blocking(move || old.close())
            .await
            .map_err(|e| failed(format!("closing the old engine: {e}")))?;
        tracing::warn!(
            name,
            sequence = manifest.sequence,
            "shard state replaced by a checkpoint"
        );
        Ok(Restored {
            files: manifest.files.len() as u64,
            bytes: manifest.total_bytes(),
            sequence: manifest.sequence,
        })
    }

    /// Stops the engine serving now (blocking: call it off the runtime).
    pub fn close(&self) {
        self.engine().close();
    }
}
