//! The engine serving a shard now, and the database generations behind it: a checkpoint is
//! the store's checkpoint plus a manifest of its files with their checksums; a restore installs
//! a checkpoint as a new generation of the data directory, opens an engine on it and swaps it
//! in, while requests keep being served by the old engine until the swap.

use std::collections::HashMap;
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

/// What a deletion did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deleted {
    /// False when there was no checkpoint of that name.
    pub deleted: bool,
    /// Bytes of the files no longer linked anywhere.
    pub freed_bytes: u64,
}

/// A checkpoint directory being deleted is first renamed to this prefix and a name no
/// checkpoint can have (names never start with `.`), so the name is gone at once and a crash
/// in the middle leaves nothing that reads as a checkpoint.
const DELETING: &str = ".deleting-";

/// The checkpoints something reads (an export, a restore) or writes, by name, with what holds
/// each: a deletion is refused while one is held.
#[derive(Debug, Default)]
struct Holds(parking_lot::Mutex<HashMap<String, (usize, &'static str)>>);

/// Holds checkpoints until dropped ([`Shard::hold`]).
#[derive(Debug)]
pub struct Hold {
    holds: Arc<Holds>,
    names: Vec<String>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut held = self.holds.0.lock();
        for n in &self.names {
            if let Some((count, _)) = held.get_mut(n) {
                *count -= 1;
                if *count == 0 {
                    held.remove(n);
                }
            }
        }
    }
}

/// The shard's engine, replaced by a restore while the service runs.
pub struct Shard<S: Store> {
    slot: RwLock<Engine<S>>,
    /// The data directory and how to open a store in it; `None` in the in-memory mode.
    restore: Option<(PathBuf, Reopen<S>)>,
    /// One restore at a time.
    restoring: tokio::sync::Mutex<()>,
    holds: Arc<Holds>,
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
            holds: Arc::default(),
        }
    }

    /// Holds checkpoints `names` against deletion until the hold is dropped; `what` says why,
    /// for the refusal.
    pub fn hold(&self, names: &[&str], what: &'static str) -> Hold {
        let mut held = self.holds.0.lock();
        for n in names {
            held.entry((*n).to_owned()).or_insert((0, what)).0 += 1;
        }
        Hold {
            holds: self.holds.clone(),
            names: names.iter().map(|n| (*n).to_owned()).collect(),
        }
    }

    /// Deletes checkpoint `name`: renamed away at once (refused while held), then its files
    /// removed off the runtime, with those a crash left behind in an earlier deletion.
    pub async fn delete_checkpoint(&self, name: String) -> Result<Deleted> {
        if name.is_empty() {
            return Err(ValidationError::new("name", "empty; name the checkpoint").into());
        }
        let name = checkpoint_name(name)?;
        let dir = self
            .engine()
            .config()
            .checkpoint_dir
            .clone()
            .ok_or(EngineError::NotDurable)?;
        let failed = |cause: String| EngineError::Checkpoint {
            name: name.clone(),
            cause,
        };
        let holds = self.holds.clone();
        let away = {
            let name = name.clone();
            move || -> Result<Option<u64>, EngineError> {
                let path = dir.join(&name);
                let failed = |cause: String| EngineError::Checkpoint {
                    name: name.clone(),
                    cause,
                };
                {
                    // Renamed under the lock: a hold taken after it finds no checkpoint of
                    // that name.
                    let held = holds.0.lock();
                    if let Some((_, what)) = held.get(&name) {
                        return Err(EngineError::CheckpointInUse {
                            name: name.clone(),
                            what,
                        });
                    }
                    if !path.is_dir() {
                        return Ok(None);
                    }
                    let away = dir.join(format!("{DELETING}{name}-{}", unix_ms()));
                    std::fs::rename(&path, &away)
                        .map_err(|e| failed(format!("renaming it away: {e}")))?;
                }
                ps_runtime::config::sync_dir(&dir)
                    .map_err(|e| failed(format!("syncing the rename: {e}")))?;
                remove_deleted(&dir)
                    .map(Some)
                    .map_err(|e| failed(format!("removing its files: {e}")))
            }
        };
        // Renames, syncs and removes files: off the runtime.
        let Some(freed_bytes) = tokio::task::spawn_blocking(away)
            .await
            .map_err(|e| failed(format!("the delete task failed: {e}")))??
        else {
            return Ok(Deleted {
                deleted: false,
                freed_bytes: 0,
            });
        };
        tracing::info!(name, freed_bytes, "checkpoint deleted");
        Ok(Deleted {
            deleted: true,
            freed_bytes,
        })
    }

    /// The engine serving requests now.
    pub fn engine(&self) -> Engine<S> {
        self.slot.read().clone()
    }

    /// Checkpoints the store as `name` (a time-based name when empty) and writes its manifest.
    pub async fn checkpoint(&self, name: String) -> Result<Checkpointed> {
        let name = checkpoint_name(name)?;
        let _hold = self.hold(&[&name], "it is being written");
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
        let _hold = self.hold(&[&name], "a restore reads it");
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

/// Removes every directory under `dir` that a deletion renamed away; the bytes of the files
/// that were linked nowhere else.
fn remove_deleted(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut freed = 0;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if !e.file_name().to_string_lossy().starts_with(DELETING) {
            continue;
        }
        let mut stack = vec![e.path()];
        while let Some(d) = stack.pop() {
            for f in std::fs::read_dir(&d)? {
                let f = f?;
                let meta = f.metadata()?;
                if meta.is_dir() {
                    stack.push(f.path());
                } else if meta.nlink() == 1 {
                    freed += meta.len();
                }
            }
        }
        std::fs::remove_dir_all(e.path())?;
    }
    Ok(freed)
}
