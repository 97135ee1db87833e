//! A push is checked against its table and this shard, and every payload decoded to f32,
//! before it is queued for the writer: a push refused here changes nothing, and the writer
//! only ever applies plain f32 it can trust.

use std::collections::HashSet;

use ps_core::request::DenseSlice;
use ps_core::{NonFinitePolicy, Payload, PushDense, PushSparse, TableKind, ValidationError};

use super::table::{Table, TableData, ThreadCpu};
use super::{Engine, EngineError, Job, PushOutcome, Result};
use crate::metrics as m;
use crate::store::Store;

/// Counts a received payload's bytes and decodes it to f32, checking every length, index,
/// scale and lz4 frame: a payload that does not decode exactly is refused, nothing applied.
fn decode_received(table: &Table, field: &str, p: &Payload) -> Result<Payload> {
    m::wire_bytes(
        "push",
        table.spec.name.as_str(),
        p.encoding(),
        p.data().len(),
    );
    table.moved(true, p.data().len());
    p.decoded().map_err(|e| EngineError::Decode {
        field: field.to_owned(),
        encoding: p.encoding(),
        reason: e.to_string(),
    })
}

/// The refusal of a call made on a table of the other kind.
pub(super) fn wrong_kind(table: &Table) -> EngineError {
    let (kind, use_instead) = match table.spec.kind {
        TableKind::Dense(_) => ("dense", "PushDense / PullDense"),
        TableKind::Sparse { .. } => ("sparse", "PushSparse / PullSparse"),
    };
    EngineError::WrongKind {
        table: table.spec.name.clone(),
        kind,
        use_instead,
    }
}

/// What the edge that received a push has already checked of its values, so that the engine
/// need not pass over them again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Checked {
    /// Nothing: the engine checks everything.
    #[default]
    Nothing,
    /// Every value of the push is plain f32 and none is a NaN or an infinity: the bulk
    /// listener looked at each as it was read (`bulk::read_body`).
    Finite,
}

impl<S: Store> Engine<S> {
    /// Validates a dense push against its table and this shard, then has the writer apply it.
    pub async fn push_dense(&self, mut req: PushDense, checked: Checked) -> Result<PushOutcome> {
        let table = self.table(&req.table)?;
        self.check_epoch(req.map_epoch)?;
        // What the payloads claim is checked against the table's chunks before any is
        // decoded, and their decoded size against the queue's budget before it is allocated.
        let values = (req.slices.iter()).fold(0u64, |n, s| n.saturating_add(s.values.len() as u64));
        let reserved = self.reserve("the push", values.saturating_mul(4)).await?;
        let cpu = ThreadCpu::now();
        self.check_dense_slices(&table, &req.slices)?;
        let decoded = decode_dense_slices(&table, &mut req.slices, checked);
        table.charge(cpu);
        decoded?;
        self.push(Job::Dense(table, req), reserved).await
    }

    /// Validates a sparse push against its table and this shard, then has the writer apply it.
    pub async fn push_sparse(&self, mut req: PushSparse, checked: Checked) -> Result<PushOutcome> {
        let table = self.table(&req.table)?;
        self.check_epoch(req.map_epoch)?;
        let TableKind::Sparse { dim } = table.spec.kind else {
            return Err(wrong_kind(&table));
        };
        let dim = dim as usize;
        if req.ids.is_empty() {
            return Err(ValidationError::new("ids", "the push holds no ids").into());
        }
        req.check_dim(dim)?;
        self.check_ids(&table, &req.ids)?;
        self.check_new_rows(&table, &req.ids)?;
        let reserved = self
            .reserve("the push", (req.values.len() as u64).saturating_mul(4))
            .await?;
        let cpu = ThreadCpu::now();
        let finite = finite_already(checked, &req.values);
        let decoded = decode_received(&table, "values", &req.values);
        table.charge(cpu);
        req.values = decoded?;
        if table.spec.non_finite == NonFinitePolicy::Reject
            && !finite
            && let Some(i) = req.values.first_non_finite()
        {
            return Err(EngineError::NonFinite {
                table: req.table,
                at: format!(
                    "row {} (id {}) at value {}",
                    i / dim,
                    req.ids[i / dim],
                    i % dim
                ),
                unit: "rows",
            });
        }
        self.push(Job::Sparse(table, req), reserved).await
    }

    /// Refuses a sparse push whose new rows would pass the memory budget (in-memory mode) or
    /// the job's byte quota. Rows are counted only when all of the push's ids being new would
    /// not fit.
    fn check_new_rows(&self, table: &Table, ids: &[u64]) -> Result<()> {
        let TableData::Sparse(rows) = &table.data else {
            return Ok(());
        };
        let inner = &self.inner;
        // A durable shard's rows live in the store: only the quota limits them.
        let in_memory = inner.cache.budget.is_none();
        let fits = |n: u64| -> Result<()> {
            let bytes = n * table.row_bytes();
            if in_memory {
                inner.check_memory(
                    || format!("{n} new rows of table `{}`", table.spec.name),
                    bytes,
                )?;
            }
            inner.check_job_quota(&table.spec.name, false, bytes)
        };
        if fits(ids.len() as u64).is_ok() {
            return Ok(());
        }
        let mut fresh: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|&id| !rows.contains(id))
            .collect();
        fresh.sort_unstable();
        fresh.dedup();
        let stored = inner.fetch_rows(table, &fresh)?;
        fits(fresh.iter().filter(|id| !stored.contains_key(id)).count() as u64)
    }

    /// Checks every slice against the table's chunks and this shard.
    fn check_dense_slices(&self, table: &Table, slices: &[DenseSlice]) -> Result<()> {
        let TableKind::Dense(shape) = &table.spec.kind else {
            return Err(wrong_kind(table));
        };
        if slices.is_empty() {
            return Err(ValidationError::new("slices", "the push holds no slices").into());
        }
        let mut seen = HashSet::new();
        for (i, s) in slices.iter().enumerate() {
            let field = format!("slices[{i}]");
            let mut chunk = s.chunk;
            let mut covered = 0usize;
            while covered < s.values.len() {
                let len = self.check_chunk(table, shape, chunk)?;
                if !seen.insert(chunk) {
                    return Err(ValidationError::new(
                        &field,
                        format!("chunk {chunk} appears twice in one push; send it once"),
                    )
                    .into());
                }
                covered += len;
                chunk += 1;
            }
            if covered != s.values.len() || s.values.is_empty() {
                return Err(ValidationError::new(
                    &field,
                    format!(
                        "starts at chunk {} and holds {} values, which does not end on a chunk \
                         boundary (chunks hold {} values; the tensor has {})",
                        s.chunk,
                        s.values.len(),
                        shape.chunk_elems,
                        shape.len()
                    ),
                )
                .into());
            }
        }
        Ok(())
    }
}

/// Whether `values`, as received (before decoding), are known to hold no NaN or infinity
/// without looking at them again.
fn finite_already(checked: Checked, values: &Payload) -> bool {
    checked == Checked::Finite && values.is_plain_f32()
}

/// Decodes every slice of a checked push to f32 (a slice that does not decode exactly refuses
/// the whole push) and applies the table's rule for NaN and infinity.
fn decode_dense_slices(table: &Table, slices: &mut [DenseSlice], checked: Checked) -> Result<()> {
    let chunk_elems = table.spec.dense_shape().map_or(1, |s| s.chunk_elems);
    for (i, s) in slices.iter_mut().enumerate() {
        let field = format!("slices[{i}]");
        let finite = finite_already(checked, &s.values);
        s.values = decode_received(table, &format!("{field}.values"), &s.values)?;
        if table.spec.non_finite == NonFinitePolicy::Reject
            && !finite
            && let Some(j) = s.values.first_non_finite()
        {
            return Err(EngineError::NonFinite {
                table: table.spec.name.clone(),
                at: format!(
                    "{field} at element {} of the tensor",
                    s.chunk * chunk_elems + j as u64
                ),
                unit: "chunks",
            });
        }
    }
    Ok(())
}
