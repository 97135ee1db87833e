//! Export for serving: reads one of this shard's checkpoints (opened read-only, verified against
//! its manifest first) and hands out its tables' parameters in parts: a table's spec, then a
//! dense table's owned chunks (stored, or at their initial value when never written) or a sparse
//! table's rows in ascending key order. An incremental export compares with an earlier
//! checkpoint: only the sparse rows whose parameters differ, then the keys that are gone.
//!
//! Runs on a blocking thread; memory stays bounded by one dense piece or one batch of rows,
//! whatever the table's size.

use std::path::Path;

use ps_core::{ExportPart, TableKind, TableName};

use super::Engine;
use super::error::{EngineError, Result};
use super::keys::{StoredTable, be_u64, read_f32s, table_key};
use crate::checkpoint;
use crate::store::{Cf, RocksOptions, RocksStore, Store, StoreError};

/// Values per part: 1 MiB of f32, well inside a gRPC message.
const PART_VALUES: usize = 1 << 18;
/// Rows of the earlier checkpoint read at a time by an incremental export.
const DIFF_BATCH: usize = 16_384;

/// What to export.
#[derive(Debug, Clone)]
pub struct ExportRequest {
    pub checkpoint: String,
    /// The earlier checkpoint of an incremental export.
    pub since: Option<String>,
    pub tables: Vec<TableName>,
}

/// Receives each part; `false` when the receiver is gone (the export stops).
pub type Emit<'a> = dyn FnMut(ExportPart) -> bool + 'a;

/// A checkpoint opened for reading, and its tables.
struct Opened {
    store: RocksStore,
    name: String,
}

impl Opened {
    fn open(dir: &Path, name: &str) -> Result<Self> {
        if name.is_empty() {
            return Err(
                ps_core::ValidationError::new("checkpoint", "empty; name the checkpoint").into(),
            );
        }
        let path = dir.join(super::shard::checkpoint_name(name.to_owned())?);
        if !path.is_dir() {
            return Err(EngineError::NoSuchCheckpoint {
                name: name.to_owned(),
            });
        }
        checkpoint::verify(&path).map_err(|e| EngineError::CheckpointDamaged {
            name: name.to_owned(),
            cause: format!("{e:#}"),
        })?;
        // A small block cache: the export reads each block once.
        let opts = RocksOptions {
            block_cache_mib: 8,
            ..RocksOptions::default()
        };
        Ok(Self {
            store: RocksStore::open_read_only(&checkpoint::db_of(&path), &opts)?,
            name: name.to_owned(),
        })
    }

    /// The table's record in this checkpoint, when it has the table.
    fn table(&self, name: &TableName) -> Result<Option<StoredTable>> {
        let key = table_key(name);
        let mut found = None;
        self.store.multi_get(&[(Cf::Meta, &key)], &mut |_, v| {
            found = Some(StoredTable::read(&key, v)?);
            Ok(())
        })?;
        Ok(found)
    }
}

/// Where parts go; remembers when the receiver left, so that a scan stopped for that is told
/// from a failed one.
struct Sink<'a, 'b> {
    emit: &'a mut Emit<'b>,
    gone: bool,
}

impl Sink<'_, '_> {
    fn send(&mut self, part: ExportPart) -> std::result::Result<(), StoreError> {
        if (self.emit)(part) {
            Ok(())
        } else {
            self.gone = true;
            Err(StoreError::Corrupt("the export's receiver is gone".into()))
        }
    }

    /// `Ok(true)` when everything was sent, `Ok(false)` when the receiver left.
    fn finish(&self, r: std::result::Result<(), StoreError>) -> Result<bool> {
        match r {
            _ if self.gone => Ok(false),
            Ok(()) => Ok(true),
            Err(e) => Err(e.into()),
        }
    }
}

impl<S: Store> Engine<S> {
    /// Exports `req` through `emit` (blocking: call it off the runtime).
    pub fn export(&self, req: &ExportRequest, emit: &mut Emit<'_>) -> Result<()> {
        let dir = self
            .inner
            .cfg
            .checkpoint_dir
            .as_ref()
            .ok_or(EngineError::NotDurable)?;
        let target = Opened::open(dir, &req.checkpoint)?;
        let since = req
            .since
            .as_deref()
            .map(|s| Opened::open(dir, s))
            .transpose()?;
        // Every table is checked before anything is sent.
        let mut tables = Vec::with_capacity(req.tables.len());
        for name in &req.tables {
            let t = target.table(name)?.ok_or_else(|| {
                EngineError::Invalid(ps_core::ValidationError::new(
                    "tables",
                    format!("checkpoint `{}` has no table `{name}`", target.name),
                ))
            })?;
            let before = match &since {
                Some(s) => s.table(name)?.filter(|b| b.spec.kind == t.spec.kind),
                None => None,
            };
            tables.push((t, before));
        }
        let mut sink = Sink { emit, gone: false };
        for (t, before) in tables {
            let r =
                sink.send(ExportPart::Table(t.spec.clone()))
                    .and_then(|()| match &t.spec.kind {
                        TableKind::Dense(_) => self.export_dense(&target, &t, &mut sink),
                        TableKind::Sparse { dim } => match (&since, before) {
                            (Some(s), Some(b)) => {
                                export_changed(&target, &t, s, &b, *dim as usize, &mut sink)
                            }
                            _ => export_rows(&target, &t, *dim as usize, &mut sink),
                        },
                    });
            if !sink.finish(r)? {
                break;
            }
        }
        Ok(())
    }

    /// The dense chunks this shard owns: stored, or at their initial value.
    fn export_dense(
        &self,
        ck: &Opened,
        t: &StoredTable,
        sink: &mut Sink<'_, '_>,
    ) -> std::result::Result<(), StoreError> {
        let Some(shape) = t.spec.dense_shape() else {
            return Ok(());
        };
        let hash = t.spec.name.hash64();
        let mut buf = Vec::new();
        for chunk in 0..shape.num_chunks() {
            if !self.inner.owns_chunk(&t.spec, chunk) {
                continue;
            }
            let (Some(range), Some(n)) = (shape.chunk_range(chunk), shape.chunk_len(chunk)) else {
                continue;
            };
            buf.clear();
            buf.resize(n, 0.0);
            let key = super::keys::cell_key(t.id, chunk);
            let mut stored = false;
            ck.store.multi_get(&[(Cf::Params, &key)], &mut |_, v| {
                stored = true;
                read_f32s(v, &mut buf)
            })?;
            if !stored {
                t.spec.initializer.fill(hash, chunk, &mut buf);
            }
            for (i, piece) in buf.chunks(PART_VALUES).enumerate() {
                sink.send(ExportPart::Dense {
                    offset: range.start + (i * PART_VALUES) as u64,
                    values: piece.to_vec(),
                })?;
            }
        }
        Ok(())
    }
}

/// Rows collected into parts of about [`PART_VALUES`] values.
struct RowBatch {
    dim: usize,
    keys: Vec<u64>,
    values: Vec<f32>,
}

impl RowBatch {
    fn new(dim: usize) -> Self {
        Self {
            dim,
            keys: Vec::new(),
            values: Vec::new(),
        }
    }

    /// Adds a stored row (its parameters, and the step and state a row stored as one entry
    /// carries after them).
    fn push(
        &mut self,
        key: u64,
        row: &[u8],
        sink: &mut Sink<'_, '_>,
    ) -> std::result::Result<(), StoreError> {
        let start = self.values.len();
        self.values.resize(start + self.dim, 0.0);
        read_f32s(params_of(row, self.dim), &mut self.values[start..])?;
        self.keys.push(key);
        if self.values.len() >= PART_VALUES {
            self.flush(sink)?;
        }
        Ok(())
    }

    fn flush(&mut self, sink: &mut Sink<'_, '_>) -> std::result::Result<(), StoreError> {
        if self.keys.is_empty() {
            return Ok(());
        }
        sink.send(ExportPart::Rows {
            keys: std::mem::take(&mut self.keys),
            values: std::mem::take(&mut self.values),
        })
    }
}

/// The parameters of a stored sparse row of `dim` values.
fn params_of(stored: &[u8], dim: usize) -> &[u8] {
    super::cell::split_row(stored, dim).0
}

/// Every row of sparse table `t`, ascending.
fn export_rows(
    ck: &Opened,
    t: &StoredTable,
    dim: usize,
    sink: &mut Sink<'_, '_>,
) -> std::result::Result<(), StoreError> {
    let mut batch = RowBatch::new(dim);
    ck.store
        .scan(Cf::Params, &t.id.to_be_bytes(), &mut |k, v| {
            batch.push(be_u64(k.get(4..).unwrap_or_default())?, v, sink)
        })?;
    batch.flush(sink)
}

/// The rows of `t` whose parameters differ from (or are missing in) `before` of checkpoint
/// `old`, ascending, and the keys `before` has that `t` does not, ascending: one pass over both
/// tables in key order, merged.
fn export_changed(
    ck: &Opened,
    t: &StoredTable,
    old: &Opened,
    before: &StoredTable,
    dim: usize,
    sink: &mut Sink<'_, '_>,
) -> std::result::Result<(), StoreError> {
    let mut batch = RowBatch::new(dim);
    let mut olds = Chunks::new(&old.store, before.id, dim);
    let mut gone: Vec<u64> = Vec::new();
    let send_gone = |gone: &mut Vec<u64>, sink: &mut Sink<'_, '_>, all: bool| {
        if gone.len() >= PART_VALUES || (all && !gone.is_empty()) {
            sink.send(ExportPart::Deleted {
                keys: std::mem::take(gone),
            })?;
        }
        Ok::<(), StoreError>(())
    };
    ck.store
        .scan(Cf::Params, &t.id.to_be_bytes(), &mut |k, v| {
            let key = be_u64(k.get(4..).unwrap_or_default())?;
            // Older keys below this one are gone.
            while let Some(old_key) = olds.peek()?.filter(|&o| o < key) {
                gone.push(old_key);
                olds.pop();
                send_gone(&mut gone, sink, false)?;
            }
            let same = olds.peek()? == Some(key)
                && olds.pop().is_some_and(|(_, o)| o == params_of(v, dim));
            if !same {
                batch.push(key, v, sink)?;
            }
            Ok(())
        })?;
    batch.flush(sink)?;
    while let Some(old_key) = olds.peek()? {
        gone.push(old_key);
        olds.pop();
        send_gone(&mut gone, sink, false)?;
    }
    send_gone(&mut gone, sink, true)
}

/// One sparse table's rows of a checkpoint in key order (their parameters), read
/// [`DIFF_BATCH`] at a time: the older side of [`export_changed`]'s merge.
struct Chunks<'a> {
    store: &'a RocksStore,
    table_id: u32,
    dim: usize,
    /// The key the next read starts at; `None` once the table is read to its end.
    next: Option<u64>,
    rows: std::collections::VecDeque<(u64, Vec<u8>)>,
}

impl<'a> Chunks<'a> {
    fn new(store: &'a RocksStore, table_id: u32, dim: usize) -> Self {
        Self {
            store,
            table_id,
            dim,
            next: Some(0),
            rows: std::collections::VecDeque::with_capacity(DIFF_BATCH),
        }
    }

    /// The next row's key, reading more when none is buffered.
    fn peek(&mut self) -> std::result::Result<Option<u64>, StoreError> {
        if self.rows.is_empty()
            && let Some(from) = self.next
        {
            let to = self.table_id.saturating_add(1).to_be_bytes();
            let (rows, dim) = (&mut self.rows, self.dim);
            self.store.scan_range(
                Cf::Params,
                &super::keys::cell_key(self.table_id, from),
                &to,
                &mut |k, v| {
                    let key = be_u64(k.get(4..).unwrap_or_default())?;
                    rows.push_back((key, params_of(v, dim).to_vec()));
                    Ok(rows.len() < DIFF_BATCH)
                },
            )?;
            self.next = match self.rows.back() {
                Some(&(last, _)) if self.rows.len() == DIFF_BATCH => last.checked_add(1),
                _ => None,
            };
        }
        Ok(self.rows.front().map(|(k, _)| *k))
    }

    fn pop(&mut self) -> Option<(u64, Vec<u8>)> {
        self.rows.pop_front()
    }
}
