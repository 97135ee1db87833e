//! `psctl export JOB DIR`: one of a job's checkpoints written for serving, in files any
//! language reads (docs/EXPORT.md says how, with a Python reader that needs nothing of ours):
//!
//! ```text
//! DIR/manifest.json               what is here: the checkpoint, every file, its size and CRC-32
//! DIR/dense.safetensors           every dense table, one f32 tensor each, named as the table
//! DIR/sparse/T.shard-S.rows       sparse table T's rows held by shard S, ascending keys:
//!                                 u64 key, then dim f32 (all little-endian), per row
//! DIR/sparse/T.shard-S.deleted    (incremental) u64 keys, ascending, gone since `--since`
//! ```
//!
//! A full export holds every stored row; an incremental one (`--since CHECKPOINT`) the sparse
//! rows that changed since that checkpoint and the keys that are gone, and dense tables whole.
//! Applied to the full export of `--since` it gives the full export of the checkpoint. Rows never
//! pushed are in neither: a serving system gives them the table's initializer, which the
//! manifest records. `manifest.json` is written last: a directory without it is incomplete.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::Path;

use anyhow::{Context, bail, ensure};
use ps_client::PsClient;
use ps_client::scheduler::SchedulerClient;
use ps_core::status::JobCheckpoint;
use ps_core::{ExportPart, TableKind, TableSpec};
use serde::Serialize;

/// The manifest's format.
pub const FORMAT: u32 = 1;
pub const MANIFEST: &str = "manifest.json";

/// What `psctl export` writes into `manifest.json`.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct Manifest {
    pub format: u32,
    pub job: String,
    pub checkpoint: CheckpointRef,
    /// The checkpoint an incremental export is relative to; `None` for a full one.
    pub since: Option<CheckpointRef>,
    pub created_unix_ms: u64,
    /// Of every number in every file.
    pub byte_order: String,
    /// `None` when the job has no dense table.
    pub dense: Option<DenseFile>,
    pub sparse: Vec<SparseTable>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct CheckpointRef {
    pub name: String,
    pub clock: u64,
}

/// One file: its path under the export's directory, size and CRC-32 (zlib's, as an integer).
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct FileRef {
    pub file: String,
    pub bytes: u64,
    pub crc32: u32,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct DenseFile {
    #[serde(flatten)]
    pub file: FileRef,
    /// The tensors in it: each dense table's name and shape.
    pub tables: Vec<DenseTable>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct DenseTable {
    pub name: String,
    pub shape: Vec<u64>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct SparseTable {
    pub name: String,
    pub dim: u32,
    /// The table's spec as the shards hold it (its initializer is what rows not here hold).
    pub spec: TableSpec,
    pub files: Vec<SparseFiles>,
}

/// One shard's files of a sparse table.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct SparseFiles {
    pub shard: u32,
    pub rows: u64,
    pub rows_file: FileRef,
    /// Keys gone since `since` (incremental exports only).
    pub deleted: u64,
    pub deleted_file: Option<FileRef>,
}

/// What to export.
#[derive(Debug, Clone)]
pub struct ExportArgs<'a> {
    pub job: &'a str,
    pub dir: &'a Path,
    /// The job's latest checkpoint when `None`.
    pub checkpoint: Option<&'a str>,
    pub since: Option<&'a str>,
}

/// A checkpoint the job does not have (psctl exits 4 on it).
#[derive(Debug)]
pub struct NoSuchCheckpoint(pub String);

impl std::fmt::Display for NoSuchCheckpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NoSuchCheckpoint {}

fn find<'a>(cks: &'a [JobCheckpoint], job: &str, name: &str) -> anyhow::Result<&'a JobCheckpoint> {
    cks.iter().find(|c| c.name == name).ok_or_else(|| {
        anyhow::Error::new(NoSuchCheckpoint(format!(
            "job `{job}` has no checkpoint `{name}` (it has: {})",
            cks.iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )))
    })
}

/// A file being written, with its CRC-32 and size kept as it grows.
struct Counted {
    out: std::io::BufWriter<std::fs::File>,
    rel: String,
    crc: crc32fast::Hasher,
    bytes: u64,
}

impl Counted {
    fn create(dir: &Path, rel: String) -> anyhow::Result<Self> {
        let path = dir.join(&rel);
        let f =
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self {
            out: std::io::BufWriter::with_capacity(1 << 20, f),
            rel,
            crc: crc32fast::Hasher::new(),
            bytes: 0,
        })
    }

    fn write(&mut self, b: &[u8]) -> anyhow::Result<()> {
        self.crc.update(b);
        self.bytes += b.len() as u64;
        self.out
            .write_all(b)
            .with_context(|| format!("writing {}", self.rel))
    }

    fn finish(mut self) -> anyhow::Result<FileRef> {
        self.out
            .flush()
            .with_context(|| format!("writing {}", self.rel))?;
        self.out
            .get_ref()
            .sync_all()
            .with_context(|| format!("syncing {}", self.rel))?;
        Ok(FileRef {
            file: self.rel,
            bytes: self.bytes,
            crc32: self.crc.finalize(),
        })
    }
}

/// A dense table being assembled from the shards' pieces.
struct DenseBuf {
    values: Vec<f32>,
    /// (offset, len) of every piece, to check they cover the tensor exactly once.
    pieces: Vec<(u64, u64)>,
}

/// A sparse table's files from the shard being read.
struct SparseOut {
    dim: usize,
    rows: Counted,
    count: u64,
    last: Option<u64>,
    deleted: Option<Counted>,
    deleted_count: u64,
    last_deleted: Option<u64>,
}

/// A table name as a file name: characters other than letters, digits, `-`, `_` and `.` become
/// `_`, with the table's position in front so that two names cannot meet.
fn file_stem(i: usize, name: &str) -> String {
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{i:03}-{clean}")
}

/// Runs the export; returns the manifest written.
pub async fn run(
    s: &SchedulerClient,
    ps: &PsClient,
    args: &ExportArgs<'_>,
) -> anyhow::Result<Manifest> {
    let job = s.job(args.job).await?;
    let cks = s.checkpoints(args.job).await?;
    let target = match args.checkpoint {
        Some(name) => find(&cks, args.job, name)?,
        None => cks.last().with_context(|| {
            format!(
                "job `{}` has no checkpoint yet; take one with `psctl checkpoint`",
                args.job
            )
        })?,
    };
    let since = args.since.map(|n| find(&cks, args.job, n)).transpose()?;
    if let Some(b) = since {
        ensure!(
            b.clock <= target.clock,
            "--since {} is at clock {}, after {} (clock {})",
            b.name,
            b.clock,
            target.name,
            target.clock
        );
    }
    let n = ps.shards().len();
    for c in std::iter::once(target).chain(since) {
        ensure!(
            c.shards.len() == n,
            "checkpoint {} has {} shards; the cluster has {n}",
            c.name,
            c.shards.len()
        );
    }
    let tables: Vec<TableSpec> = job.spec.tables.iter().map(|t| t.spec.clone()).collect();
    ensure!(!tables.is_empty(), "job `{}` has no tables", args.job);
    let names: Vec<String> = tables.iter().map(|t| t.name.to_string()).collect();

    let dir = args.dir;
    if dir.exists() {
        let mut entries =
            std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
        ensure!(
            entries.next().is_none(),
            "{} is not empty; export into a new directory",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir.join("sparse"))
        .with_context(|| format!("creating {}", dir.display()))?;

    let mut dense: HashMap<String, DenseBuf> = HashMap::new();
    let mut sparse: HashMap<String, Vec<SparseFiles>> = HashMap::new();
    for shard in 0..n {
        let mut parts = ps
            .export_checkpoint(
                shard,
                &target.shards[shard].name,
                since.map(|b| b.shards[shard].name.as_str()),
                &names,
            )
            .await?;
        let mut current: Option<(usize, TableSpec)> = None;
        let mut out: Option<SparseOut> = None;
        let close = |out: Option<SparseOut>,
                     name: Option<&str>,
                     sparse: &mut HashMap<String, Vec<SparseFiles>>|
         -> anyhow::Result<()> {
            if let (Some(o), Some(name)) = (out, name) {
                sparse
                    .entry(name.to_owned())
                    .or_default()
                    .push(SparseFiles {
                        shard: shard as u32,
                        rows: o.count,
                        rows_file: o.rows.finish()?,
                        deleted: o.deleted_count,
                        deleted_file: o.deleted.map(Counted::finish).transpose()?,
                    });
            }
            Ok(())
        };
        while let Some(part) = parts.next().await? {
            match part {
                ExportPart::Table(spec) => {
                    close(
                        out.take(),
                        current.as_ref().map(|(_, s)| s.name.as_str()),
                        &mut sparse,
                    )?;
                    let i = names
                        .iter()
                        .position(|n| n == spec.name.as_str())
                        .with_context(|| {
                            format!("shard {shard} sent table `{}`, not asked for", spec.name)
                        })?;
                    let expected = &tables[i];
                    ensure!(
                        spec.kind == expected.kind,
                        "shard {shard} holds `{}` as {:?}; the job says {:?}",
                        spec.name,
                        spec.kind,
                        expected.kind
                    );
                    match &spec.kind {
                        TableKind::Dense(shape) => {
                            let len =
                                usize::try_from(shape.len()).context("dense table too large")?;
                            dense
                                .entry(spec.name.to_string())
                                .or_insert_with(|| DenseBuf {
                                    values: vec![0.0; len],
                                    pieces: Vec::new(),
                                });
                        }
                        TableKind::Sparse { dim } => {
                            let stem = file_stem(i, spec.name.as_str());
                            out = Some(SparseOut {
                                dim: *dim as usize,
                                rows: Counted::create(
                                    dir,
                                    format!("sparse/{stem}.shard-{shard}.rows"),
                                )?,
                                count: 0,
                                last: None,
                                deleted: since
                                    .map(|_| {
                                        Counted::create(
                                            dir,
                                            format!("sparse/{stem}.shard-{shard}.deleted"),
                                        )
                                    })
                                    .transpose()?,
                                deleted_count: 0,
                                last_deleted: None,
                            });
                        }
                    }
                    current = Some((i, spec));
                }
                ExportPart::Dense { offset, values } => {
                    let Some((_, spec)) = &current else {
                        bail!("shard {shard} sent values before a table");
                    };
                    let buf = dense.get_mut(spec.name.as_str()).with_context(|| {
                        format!("shard {shard} sent dense values for sparse `{}`", spec.name)
                    })?;
                    let end = offset
                        .checked_add(values.len() as u64)
                        .filter(|&e| e <= buf.values.len() as u64)
                        .with_context(|| {
                            format!("shard {shard} sent values past the end of `{}`", spec.name)
                        })?;
                    buf.values[offset as usize..end as usize].copy_from_slice(&values);
                    buf.pieces.push((offset, values.len() as u64));
                }
                ExportPart::Rows { keys, values } => {
                    let o = out.as_mut().with_context(|| {
                        format!("shard {shard} sent rows outside a sparse table")
                    })?;
                    ensure!(
                        values.len() == keys.len() * o.dim,
                        "shard {shard} sent {} values for {} rows of dim {}",
                        values.len(),
                        keys.len(),
                        o.dim
                    );
                    for (k, row) in keys.iter().zip(values.chunks_exact(o.dim.max(1))) {
                        ensure!(
                            o.last.is_none_or(|l| l < *k),
                            "shard {shard} sent rows out of order"
                        );
                        o.last = Some(*k);
                        o.rows.write(&k.to_le_bytes())?;
                        o.rows.write(bytemuck_f32(row))?;
                    }
                    o.count += keys.len() as u64;
                }
                ExportPart::Deleted { keys } => {
                    let o = out.as_mut().with_context(|| {
                        format!("shard {shard} sent deletions outside a sparse table")
                    })?;
                    let d = o.deleted.as_mut().with_context(|| {
                        format!("shard {shard} sent deletions in a full export")
                    })?;
                    for k in &keys {
                        ensure!(
                            o.last_deleted.is_none_or(|l| l < *k),
                            "shard {shard} sent deletions out of order"
                        );
                        o.last_deleted = Some(*k);
                        d.write(&k.to_le_bytes())?;
                    }
                    o.deleted_count += keys.len() as u64;
                }
            }
        }
        close(
            out.take(),
            current.as_ref().map(|(_, s)| s.name.as_str()),
            &mut sparse,
        )?;
    }

    // Every dense element came from exactly one shard.
    for (name, buf) in &mut dense {
        buf.pieces.sort_unstable();
        let mut at = 0;
        for &(offset, len) in &buf.pieces {
            ensure!(
                offset == at,
                "dense table `{name}`: values {at}..{offset} missing or sent twice"
            );
            at += len;
        }
        ensure!(
            at == buf.values.len() as u64,
            "dense table `{name}`: {at} of {} values sent",
            buf.values.len()
        );
    }
    let dense_file = write_dense(dir, &tables, &dense, args.job, &target.name)?;
    let mut sparse_tables = Vec::new();
    for t in &tables {
        if let TableKind::Sparse { dim } = t.kind {
            let mut files = sparse.remove(t.name.as_str()).unwrap_or_default();
            files.sort_by_key(|f| f.shard);
            ensure!(
                files.len() == n,
                "sparse table `{}`: {} of {n} shards sent it",
                t.name,
                files.len()
            );
            sparse_tables.push(SparseTable {
                name: t.name.to_string(),
                dim,
                spec: t.clone(),
                files,
            });
        }
    }
    let manifest = Manifest {
        format: FORMAT,
        job: args.job.to_owned(),
        checkpoint: CheckpointRef {
            name: target.name.clone(),
            clock: target.clock,
        },
        since: since.map(|b| CheckpointRef {
            name: b.name.clone(),
            clock: b.clock,
        }),
        created_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        byte_order: "little".into(),
        dense: dense_file,
        sparse: sparse_tables,
    };
    let bytes = serde_json::to_vec_pretty(&manifest)?;
    ps_runtime::config::write_atomic(&dir.join(MANIFEST), &bytes)
        .with_context(|| format!("writing {}", dir.join(MANIFEST).display()))?;
    Ok(manifest)
}

/// Values as little-endian bytes (ps-core builds for little-endian hosts only).
fn bytemuck_f32(v: &[f32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

/// Writes every dense table into `dense.safetensors`, in the job's order.
fn write_dense(
    dir: &Path,
    tables: &[TableSpec],
    dense: &HashMap<String, DenseBuf>,
    job: &str,
    checkpoint: &str,
) -> anyhow::Result<Option<DenseFile>> {
    let mut listed = Vec::new();
    let mut views = Vec::new();
    for t in tables {
        let (TableKind::Dense(shape), Some(buf)) = (&t.kind, dense.get(t.name.as_str())) else {
            continue;
        };
        let dims: Vec<usize> = shape.shape.iter().map(|&d| d as usize).collect();
        views.push((
            t.name.to_string(),
            safetensors::tensor::TensorView::new(
                safetensors::Dtype::F32,
                dims,
                bytemuck_f32(&buf.values),
            )
            .map_err(|e| anyhow::anyhow!("tensor `{}`: {e}", t.name))?,
        ));
        listed.push(DenseTable {
            name: t.name.to_string(),
            shape: shape.shape.clone(),
        });
    }
    if views.is_empty() {
        return Ok(None);
    }
    let meta = HashMap::from([
        ("job".to_owned(), job.to_owned()),
        ("checkpoint".to_owned(), checkpoint.to_owned()),
    ]);
    let bytes = safetensors::tensor::serialize(views, Some(meta))
        .map_err(|e| anyhow::anyhow!("encoding the dense tables: {e}"))?;
    let mut f = Counted::create(dir, "dense.safetensors".into())?;
    f.write(&bytes)?;
    Ok(Some(DenseFile {
        file: f.finish()?,
        tables: listed,
    }))
}

/// The directory an export went to, for messages.
pub fn describe(m: &Manifest, dir: &Path) -> String {
    let rows: u64 = m.sparse.iter().flat_map(|t| &t.files).map(|f| f.rows).sum();
    let deleted: u64 = m
        .sparse
        .iter()
        .flat_map(|t| &t.files)
        .map(|f| f.deleted)
        .sum();
    let dense = m.dense.as_ref().map_or(0, |d| d.tables.len());
    let kind = match &m.since {
        Some(b) => format!("incremental since `{}` (clock {})", b.name, b.clock),
        None => "full".to_owned(),
    };
    format!(
        "{kind} export of `{}` at checkpoint `{}` (clock {}) in {}: {dense} dense tables, {} sparse tables, {rows} rows, {deleted} deleted keys",
        m.job,
        m.checkpoint.name,
        m.checkpoint.clock,
        dir.display(),
        m.sparse.len()
    )
}
