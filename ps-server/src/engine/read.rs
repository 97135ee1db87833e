//! Pulls, served from the hot layer by the request handlers, concurrently with the writer: a
//! read lock per dense chunk, a `DashMap` of sparse rows. A delta pull answers the top-k of
//! each chunk's change since what the client was last sent, kept as a replica per (client,
//! table, chunk) within a memory budget.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use ps_core::hash::row_digest;
use ps_core::request::DenseSlice;
use ps_core::{Encoding, Held, Payload, PullDense, PullSparse, TableKind, ValidationError};

use super::table::{Table, TableData, ThreadCpu};
use super::validate::wrong_kind;
use super::{Engine, EngineError, Inner, Result};
use crate::metrics as m;
use crate::store::Store;

/// A client's copy of one chunk, as delta pulls have built it.
#[derive(Debug)]
pub(super) struct Replica {
    version: u64,
    values: Vec<f32>,
}

/// What a dense pull answers: a slice per chunk and, for a delta pull, per slice whether it is
/// a change (or whole values) and the replica version it brings the client to.
#[derive(Debug)]
pub struct PulledDense {
    pub slices: Vec<DenseSlice>,
    pub delta: Vec<(bool, u64)>,
}

/// Counts an answered payload's bytes.
fn count_sent(table: &Table, payload: &Payload) {
    table.moved(false, payload.data().len());
    m::wire_bytes(
        "pull",
        table.spec.name.as_str(),
        payload.encoding(),
        payload.data().len(),
    );
}

impl<S: Store> Engine<S> {
    /// Reads chunks of a dense table, one slice per chunk in request order: their values in
    /// the accepted encoding, or with a delta pull the top-k of each chunk's change since the
    /// client's replica.
    pub fn pull_dense(&self, req: &PullDense) -> Result<PulledDense> {
        let table = self.table(&req.table)?;
        let cpu = ThreadCpu::now();
        let answer = self.pull_dense_from(&table, req);
        table.charge(cpu);
        answer
    }

    fn pull_dense_from(&self, table: &Arc<Table>, req: &PullDense) -> Result<PulledDense> {
        self.check_epoch(req.map_epoch)?;
        let (TableKind::Dense(shape), TableData::Dense(chunks)) = (&table.spec.kind, &table.data)
        else {
            return Err(wrong_kind(table));
        };
        // The answer's size is known before any of it is allocated.
        let answer = req.chunks.iter().fold(0u64, |n, &c| {
            let len = shape.chunk_len(c).unwrap_or(0) as u64;
            n.saturating_add(len * 4 + SLICE_OVERHEAD)
        });
        self.check_answer(table, answer, "pull fewer chunks per call")?;
        let mut out = PulledDense {
            slices: Vec::with_capacity(req.chunks.len()),
            delta: Vec::new(),
        };
        let mut values = 0u64;
        for (i, &c) in req.chunks.iter().enumerate() {
            let len = self.check_chunk(table, shape, c)?;
            // Every owned chunk is loaded with its table; check_chunk found this one owned.
            let cell = chunks
                .get(&c)
                .ok_or_else(|| EngineError::ChunkNotLoaded {
                    table: table.spec.name.clone(),
                    chunk: c,
                })?
                .read();
            let current = &cell.data[..len];
            let payload = match &req.delta {
                // Plain f32 holds the cell's values themselves until the socket has taken
                // them: no copy, and no lock held meanwhile (`cell::Values`).
                None => {
                    Payload::encode_plain_shared(current, || cell.data.params(len), req.accept, 0)
                }
                Some(d) => {
                    let (payload, is_delta, version) = self.inner.delta_chunk(
                        table,
                        c,
                        current,
                        d.client_id,
                        d.ratio,
                        d.versions[i],
                    );
                    out.delta.push((is_delta, version));
                    payload
                }
            };
            count_sent(table, &payload);
            out.slices.push(DenseSlice {
                chunk: c,
                values: payload,
            });
            values += len as u64;
        }
        table.pulled(values);
        m::pulled(table.spec.name.as_str(), "dense", values);
        Ok(out)
    }

    /// Reads rows of a sparse table in request order, and of each table of `req.also` for the
    /// same ids; unseen rows read as their initializer. Returns, per table (the request's own
    /// first), the values of the rows not marked unchanged and the mark (see [`held_answer`]).
    /// Every table must be sparse and placed as the first (`SparseSpec.placed_with`), so that
    /// this shard owns the ids in each; otherwise nothing is read.
    pub fn pull_sparse(&self, req: &PullSparse) -> Result<Vec<(Payload, Held)>> {
        self.check_epoch(req.map_epoch)?;
        let first = self.table(&req.table)?;
        if !matches!(first.spec.kind, TableKind::Sparse { .. }) {
            return Err(wrong_kind(&first));
        }
        let mut tables = Vec::with_capacity(1 + req.also.len());
        tables.push((Arc::clone(&first), req.accept, &req.held));
        for (i, a) in req.also.iter().enumerate() {
            let t = self.table(&a.table)?;
            if !matches!(t.spec.kind, TableKind::Sparse { .. }) {
                return Err(wrong_kind(&t));
            }
            if t.placement != first.placement {
                return Err(ValidationError::new(
                    format!("also[{i}].table"),
                    format!(
                        "`{}` is not placed as `{}` is (their sparse specs' placed_with differ), \
                         so its rows of these ids are on other shards: pull it on its own",
                        a.table, req.table
                    ),
                )
                .into());
            }
            tables.push((t, a.accept, &a.held));
        }
        // One placement: owning the ids in the first table is owning them in every one.
        self.check_ids(&first, &req.ids)?;
        let dims: u64 = tables.iter().map(|(t, ..)| t.spec.row_dim() as u64).sum();
        let answer = (req.ids.len() as u64).saturating_mul(dims * 4);
        self.check_answer(&first, answer, "pull fewer ids per call")?;
        tables
            .iter()
            .map(|(table, accept, held)| {
                let cpu = ThreadCpu::now();
                let answer = self.pull_sparse_from(table, &req.ids, *accept, held);
                table.charge(cpu);
                answer
            })
            .collect()
    }

    /// Reads rows `ids` of sparse `table`, whose ownership [`Engine::pull_sparse`] checked.
    fn pull_sparse_from(
        &self,
        table: &Arc<Table>,
        ids: &[u64],
        accept: Encoding,
        held: &Held,
    ) -> Result<(Payload, Held)> {
        let (TableKind::Sparse { dim }, TableData::Sparse(rows)) = (&table.spec.kind, &table.data)
        else {
            return Err(wrong_kind(table));
        };
        let dim = *dim as usize;
        let mut buf = vec![0.0f32; ids.len() * dim];
        let mut missing = Vec::new();
        rows.read_many(ids, dim, &mut buf, &mut missing);
        self.inner
            .cache
            .counted((ids.len() - missing.len()) as u64, missing.len() as u64);
        if !missing.is_empty() {
            self.inner
                .read_missing(table, rows, ids, &missing, &mut buf)?;
        }
        table.pulled(buf.len() as u64);
        m::pulled(table.spec.name.as_str(), "sparse", buf.len() as u64);
        let (payload, unchanged) = held_answer(accept, held, dim, &buf);
        if !unchanged.is_empty() {
            m::pull_rows_unchanged(table.spec.name.as_str(), unchanged.count() as u64);
        }
        count_sent(table, &payload);
        Ok((payload, unchanged))
    }
}

/// The answer to a sparse pull of rows `buf` (`dim` values each, in request order): every row
/// under the encoding asked for, less the rows the client holds whose values under that
/// encoding still have the digest it sent, which are marked instead. Rows rounded together
/// (int8 and int4 rows shorter than a block) are all sent: a row's values then depend on its
/// neighbours in the answer, so the client's copy cannot be vouched for.
fn held_answer(accept: Encoding, held: &Held, dim: usize, buf: &[f32]) -> (Payload, Held) {
    let full = Payload::encode_plain(buf, accept, dim);
    if held.digests.is_empty() || !ps_codec::PullCodec::rows_stand_alone(accept, dim) {
        return (full, Held::default());
    }
    // The values as the client will decode them; the encoding was just made, so it decodes.
    let Ok(sent) = full.to_vec() else {
        return (full, Held::default());
    };
    let mut unchanged = Held::clear(buf.len() / dim.max(1));
    let mut digests = held.digests.iter();
    for (i, row) in sent.chunks_exact(dim).enumerate() {
        if held.has(i) && digests.next() == Some(&row_digest(row)) {
            unchanged.mark(i);
        }
    }
    if unchanged.is_empty() {
        return (full, Held::default());
    }
    let mut rest = Vec::with_capacity(buf.len() - unchanged.count() * dim);
    for (i, row) in buf.chunks_exact(dim).enumerate() {
        if !unchanged.has(i) {
            rest.extend_from_slice(row);
        }
    }
    (Payload::encode_plain(&rest, accept, dim), unchanged)
}

/// Bytes a dense answer's slice takes besides its values.
const SLICE_OVERHEAD: u64 = 96;

impl<S: Store> Engine<S> {
    /// Refuses a pull whose answer would pass the answer limit.
    fn check_answer(&self, table: &Table, bytes: u64, hint: &'static str) -> Result<()> {
        let limit = self.inner.cfg.max_answer_bytes;
        if bytes > limit {
            return Err(EngineError::OverLimit {
                what: format!("the answer to this pull of `{}`", table.spec.name),
                limit_name: "answer limit",
                needed: bytes,
                limit,
                hint,
            });
        }
        Ok(())
    }
}

/// A delta pull sends the whole change of a chunk this small (its fp16 form at most this many
/// bytes) instead of its top-k: top-k of a small chunk (a bias, a small layer) saves 4 KB a
/// pull at most (a third of a millisecond at 100 Mbit/s) and leaves the client's copy of that
/// chunk behind for many pulls. The change's fp16 rounding is owed like top-k's rest.
const DELTA_WHOLE_BYTES: usize = 4096;

impl<S: Store> Inner<S> {
    /// One chunk of a delta pull: the top `ratio` of `current - replica` (all of it in fp16 in
    /// a chunk of at most `DELTA_WHOLE_BYTES / 2` values) when the client holds the replica's
    /// version (the replica then takes exactly what the client will add), else the whole
    /// chunk in f32 and a new version. Returns (payload, is_delta, version).
    fn delta_chunk(
        &self,
        table: &Table,
        chunk: u64,
        current: &[f32],
        client: u64,
        ratio: f64,
        held: u64,
    ) -> (Payload, bool, u64) {
        let key = (client, table.id, chunk);
        if let Some(mut r) = self.replicas.get_mut(&key)
            && r.version == held
            && r.values.len() == current.len()
        {
            let change: Vec<f32> = current.iter().zip(&r.values).map(|(w, v)| w - v).collect();
            let codec = if current.len() * 2 <= DELTA_WHOLE_BYTES {
                ps_codec::Codec::F16
            } else {
                ps_codec::Codec::TopK {
                    ratio,
                    values: ps_codec::SparseValues::F16,
                }
            };
            let mut enc = ps_codec::Encoder::new(
                ps_codec::CompressOptions {
                    error_feedback: true,
                    codec,
                    min_values: 0,
                    lz4: ps_codec::Lz4Policy::default(),
                },
                0,
            );
            let e = enc.encode(&change);
            // The replica moves by exactly what the client decodes and adds.
            if e.decode_add(&mut r.values, 1.0).is_ok() {
                r.version += 1;
                return (Payload::from(e), true, r.version);
            }
        }
        // Whole values, and a new replica if memory allows (else none: the next pull is whole).
        // Random, so that a version from before a restart is never mistaken for a new one.
        let version = rand::random::<u64>().max(1);
        let bytes = (current.len() * 4) as u64;
        let old = self.replicas.remove(&key);
        if let Some((_, r)) = &old {
            self.replica_bytes
                .fetch_sub((r.values.len() * 4) as u64, Ordering::Relaxed);
        }
        let used = self.replica_bytes.load(Ordering::Relaxed);
        if used + bytes <= self.cfg.pull_replica_bytes as u64 {
            self.replica_bytes.fetch_add(bytes, Ordering::Relaxed);
            self.replicas.insert(
                key,
                Replica {
                    version,
                    values: current.to_vec(),
                },
            );
            (Payload::from_f32(current), false, version)
        } else {
            (Payload::from_f32(current), false, 0)
        }
    }

    /// Forgets the delta-pull replicas of a dropped table.
    pub(super) fn drop_replicas(&self, table_id: u32) {
        self.replicas.retain(|k, r| {
            let keep = k.1 != table_id;
            if !keep {
                self.replica_bytes
                    .fetch_sub((r.values.len() * 4) as u64, Ordering::Relaxed);
            }
            keep
        });
    }
}
