//! Checkpoint manifests: every file of a RocksDB checkpoint with its size and CRC-32, written
//! atomically (temporary file, fsync, rename) once the checkpoint is complete, and checked
//! before a checkpoint is restored.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub const MANIFEST: &str = "MANIFEST.json";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FileEntry {
    /// Path relative to the checkpoint's `db/` directory.
    pub name: String,
    pub bytes: u64,
    pub crc32: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub format: u32,
    pub name: String,
    pub shard_index: u32,
    pub num_shards: u32,
    pub sequence: u64,
    pub created_unix_ms: u64,
    pub tables: Vec<String>,
    pub files: Vec<FileEntry>,
}

impl Manifest {
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }
}

fn crc_of(path: &Path) -> std::io::Result<(u64, u32)> {
    let mut f = fs::File::open(path)?;
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        total += n as u64;
    }
    Ok((total, h.finalize()))
}

fn list_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d)? {
            let e = e?;
            if e.file_type()?.is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The database inside checkpoint directory `dir`.
pub fn db_of(dir: &Path) -> PathBuf {
    dir.join("db")
}

/// Checksums the checkpoint under `dir/db` and writes `dir/MANIFEST.json` atomically.
pub fn write_manifest(dir: &Path, mut manifest: Manifest) -> std::io::Result<Manifest> {
    let db = db_of(dir);
    manifest.files = list_files(&db)?
        .into_iter()
        .map(|p| {
            let (bytes, crc32) = crc_of(&p)?;
            let name = p
                .strip_prefix(&db)
                .unwrap_or(&p)
                .to_string_lossy()
                .into_owned();
            Ok(FileEntry { name, bytes, crc32 })
        })
        .collect::<std::io::Result<_>>()?;
    let bytes = serde_json::to_vec_pretty(&manifest).map_err(std::io::Error::other)?;
    ps_runtime::config::write_atomic(&dir.join(MANIFEST), &bytes)?;
    Ok(manifest)
}

/// Reads a checkpoint's manifest and checks every file against it.
pub fn verify(dir: &Path) -> anyhow::Result<Manifest> {
    let path = dir.join(MANIFEST);
    let text = fs::read(&path).map_err(|e| {
        anyhow::anyhow!(
            "reading {}: {e} (is this a complete checkpoint?)",
            path.display()
        )
    })?;
    let manifest: Manifest = serde_json::from_slice(&text)
        .map_err(|e| anyhow::anyhow!("{} is not a valid manifest: {e}", path.display()))?;
    for f in &manifest.files {
        let p = db_of(dir).join(&f.name);
        let (bytes, crc) = crc_of(&p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
        if bytes != f.bytes || crc != f.crc32 {
            anyhow::bail!(
                "{} does not match the manifest ({} bytes, crc {:08x}; expected {} bytes, crc {:08x})",
                p.display(),
                bytes,
                crc,
                f.bytes,
                f.crc32
            );
        }
    }
    Ok(manifest)
}

/// Copies a verified checkpoint into an empty (or missing) data directory.
pub fn restore(checkpoint: &Path, data_dir: &Path) -> anyhow::Result<Manifest> {
    let manifest = verify(checkpoint)?;
    copy_verified(checkpoint, manifest, data_dir)
}

/// Copies checkpoint `checkpoint`, whose files `manifest` has verified, into an empty (or
/// missing) data directory.
fn copy_verified(
    checkpoint: &Path,
    manifest: Manifest,
    data_dir: &Path,
) -> anyhow::Result<Manifest> {
    if data_dir.exists() && fs::read_dir(data_dir)?.next().is_some() {
        anyhow::bail!(
            "refusing to restore into {}: it is not empty (move it away first)",
            data_dir.display()
        );
    }
    let target = data_dir.join("db");
    fs::create_dir_all(&target)?;
    for f in &manifest.files {
        let to = target.join(&f.name);
        if let Some(parent) = to.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::copy(db_of(checkpoint).join(&f.name), &to)?;
    }
    Ok(manifest)
}

/// Names the live RocksDB directory of a data directory, relative to it. Absent: `db`.
const CURRENT_DB: &str = "CURRENT_DB";

/// The live RocksDB directory of `data_dir`: `db`, or the generation a restore installed.
pub fn current_db(data_dir: &Path) -> anyhow::Result<PathBuf> {
    match fs::read_to_string(data_dir.join(CURRENT_DB)) {
        Ok(rel) => {
            let rel = rel.trim();
            if rel.is_empty() || rel.contains("..") || rel.starts_with('/') {
                anyhow::bail!(
                    "{} names `{rel}`, which is not a directory inside the data directory",
                    data_dir.join(CURRENT_DB).display()
                );
            }
            Ok(data_dir.join(rel))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(data_dir.join("db")),
        Err(e) => Err(anyhow::anyhow!(
            "reading {}: {e}",
            data_dir.join(CURRENT_DB).display()
        )),
    }
}

/// Copies checkpoint `checkpoint`, whose files `manifest` has verified ([`verify`]), into a
/// fresh generation directory of `data_dir` and makes it the live one (an atomic rename of
/// `CURRENT_DB`). The previous generation stays on disk until [`remove_stale_generations`]
/// runs at the next start. Returns the new RocksDB directory and the checkpoint's manifest.
pub fn install_generation(
    checkpoint: &Path,
    manifest: Manifest,
    data_dir: &Path,
) -> anyhow::Result<(PathBuf, Manifest)> {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let gen_name = format!("gen-{ms}");
    let gen_dir = data_dir.join(&gen_name);
    let manifest = copy_verified(checkpoint, manifest, &gen_dir)?;
    for f in &manifest.files {
        fs::File::open(gen_dir.join("db").join(&f.name))?.sync_all()?;
    }
    ps_runtime::config::write_atomic(
        &data_dir.join(CURRENT_DB),
        format!("{gen_name}/db\n").as_bytes(),
    )?;
    Ok((gen_dir.join("db"), manifest))
}

/// Deletes the RocksDB directories (and push logs) of `data_dir` that are not the live one
/// (left behind by a restore while the old database was still open). Call before opening the
/// store.
pub fn remove_stale_generations(data_dir: &Path) -> anyhow::Result<()> {
    let live = current_db(data_dir)?;
    let Ok(entries) = fs::read_dir(data_dir) else {
        return Ok(());
    };
    for e in entries {
        let p = e?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        // The first generation is `db`, with its push log and body ring beside it.
        let is_gen = name.starts_with("gen-")
            || name == "db"
            || name == "db.dense-log"
            || name == "db.dense-bodies";
        let live_log = crate::push_log::path_for(&live);
        let live_ring = crate::body_ring::path_for(&live_log);
        if is_gen && !live.starts_with(&p) && p != live_log && p != live_ring {
            tracing::info!(path = %p.display(), "removing a replaced database generation");
            if p.is_dir() {
                fs::remove_dir_all(&p)?;
            } else {
                fs::remove_file(&p)?;
            }
        }
    }
    Ok(())
}
