//! A table held by this shard: its cells (the dense chunks it owns, or the sparse rows it has
//! seen), each its parameters followed by its optimizer state, and its counters.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::RwLock;
use ps_core::status::TableStats;
use ps_core::{TableKind, TableSpec};

use super::cell::Cell;
use super::rows::Rows;
use crate::optim;
use crate::store::{Cf, StoreBatch};

#[derive(Debug)]
pub(super) enum TableData {
    /// The chunks this shard owns.
    Dense(HashMap<u64, RwLock<Cell>>),
    Sparse(Rows),
}

/// Bytes a cell takes besides its values (map entry, lock, allocation, and the allocation's
/// shared count: `cell::Values`).
const CELL_OVERHEAD: u64 = 80;

/// Most chunks a dense table may have: its cells are held one per chunk, so the count bounds
/// the work and memory of creating it whatever the chunks' size.
pub(super) const MAX_TABLE_CHUNKS: u64 = 1 << 24;

/// Bytes one cell of `n` values of `spec` takes in memory.
pub(super) fn cell_bytes(spec: &TableSpec, n: u64) -> u64 {
    n * 4 * (1 + spec.optimizer.state_slots() as u64) + CELL_OVERHEAD
}

/// Bytes the dense chunks `owned` picks of `spec` take in memory; sparse tables start empty.
/// A table of more than [`MAX_TABLE_CHUNKS`] chunks is refused before any is counted.
pub(super) fn footprint(spec: &TableSpec, owned: impl Fn(u64) -> bool) -> Result<u64, String> {
    let TableKind::Dense(shape) = &spec.kind else {
        return Ok(0);
    };
    let chunks = shape.num_chunks();
    if chunks > MAX_TABLE_CHUNKS {
        return Err(format!(
            "{chunks} chunks of {} values; a table may have at most {MAX_TABLE_CHUNKS} (use a \
             larger chunk_elems)",
            shape.chunk_elems
        ));
    }
    Ok((0..chunks)
        .filter(|&c| owned(c))
        .filter_map(|c| shape.chunk_len(c))
        .map(|n| cell_bytes(spec, n as u64))
        .sum())
}

#[derive(Debug, Default)]
pub(super) struct TableCounters {
    pub(super) pushes: AtomicU64,
    pub(super) pulls: AtomicU64,
    pub(super) values_pushed: AtomicU64,
    pub(super) values_pulled: AtomicU64,
    /// CPU time this shard spent on the table: decoding pushes, applying them, answering
    /// pulls (what a job's cost counts).
    pub(super) cpu_ns: AtomicU64,
    pub(super) bytes_received: AtomicU64,
    pub(super) bytes_sent: AtomicU64,
    /// Sparse rows stored, and pushes of an id held back by admission.
    pub(super) rows_admitted: AtomicU64,
    pub(super) rows_held_back: AtomicU64,
    /// Sparse rows evicted by age and by the row cap.
    pub(super) rows_expired: AtomicU64,
    pub(super) rows_capped: AtomicU64,
}

/// The calling thread's CPU time at one moment: [`Table::charge`] adds what the thread spent
/// since to a table. Thread time, not process time: other tables' work on other threads does
/// not count.
#[derive(Debug, Clone, Copy)]
pub(super) struct ThreadCpu(u64);

impl ThreadCpu {
    pub(super) fn now() -> Self {
        use nix::time::{ClockId, clock_gettime};
        Self(
            clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).map_or(0, |t| {
                (t.tv_sec() as u64).saturating_mul(1_000_000_000) + t.tv_nsec() as u64
            }),
        )
    }
}

/// A table held by this shard.
#[derive(Debug)]
pub struct Table {
    pub(super) id: u32,
    pub(super) spec: TableSpec,
    /// The hash of the table's name (its initial values are seeded by it).
    pub(super) hash: u64,
    /// The hash its sparse ids are placed by ([`TableSpec::placement_hash`]).
    pub(super) placement: u64,
    pub(super) data: TableData,
    pub(super) dropped: AtomicBool,
    pub(super) counters: TableCounters,
    /// Admission by frequency (sparse tables with `admit_after` > 1).
    pub(super) admission: Option<super::admission::Admission>,
    /// Eviction by age and past a row cap (sparse tables with `ttl_seconds` or `max_rows`, on
    /// a durable shard); set by the engine, which knows the shard count.
    pub(super) eviction: Option<super::eviction::Eviction>,
    /// Bytes of the dense cells this shard holds (fixed at creation).
    dense_bytes: u64,
}

impl Table {
    /// A table with every dense chunk `owned` says is this shard's at its initial value
    /// (sparse tables start empty).
    pub(super) fn new(id: u32, spec: TableSpec, owned: impl Fn(u64, u64) -> bool) -> Self {
        let hash = spec.name.hash64();
        let placement = spec.placement_hash();
        let data = match &spec.kind {
            TableKind::Dense(shape) => TableData::Dense(
                (0..shape.num_chunks())
                    .filter(|&c| owned(hash, c))
                    .filter_map(|c| {
                        let n = shape.chunk_len(c)?;
                        Some((c, RwLock::new(Cell::fresh(&spec, hash, c, n))))
                    })
                    .collect(),
            ),
            TableKind::Sparse { .. } => TableData::Sparse(Rows::default()),
        };
        let dense_bytes = match &data {
            TableData::Dense(chunks) => chunks
                .values()
                .map(|c| {
                    let values = c.read().data.len() / (1 + spec.optimizer.state_slots());
                    cell_bytes(&spec, values as u64)
                })
                .sum(),
            TableData::Sparse(_) => 0,
        };
        let admission = match &spec.kind {
            TableKind::Sparse { .. } => super::admission::Admission::new(spec.admit_after),
            TableKind::Dense(_) => None,
        };
        Self {
            id,
            spec,
            hash,
            placement,
            data,
            dense_bytes,
            dropped: AtomicBool::new(false),
            counters: TableCounters::default(),
            admission,
            eviction: None,
        }
    }

    pub fn spec(&self) -> &TableSpec {
        &self.spec
    }

    /// Whether the table's updated rows are written back (`writeback.rs`) when the shard
    /// has a log: a sparse table that does not evict rows.
    pub(super) fn writes_back(&self) -> bool {
        matches!(self.data, TableData::Sparse(_)) && self.eviction.is_none()
    }

    /// The store key of cell `index` ([`super::keys::cell_key`]).
    pub(super) fn key(&self, index: u64) -> [u8; 12] {
        super::keys::cell_key(self.id, index)
    }

    /// This table's counters on this shard.
    pub fn stats(&self) -> TableStats {
        TableStats {
            name: self.spec.name.to_string(),
            rows: self.rows(),
            pushes: self.counters.pushes.load(Ordering::Relaxed),
            pulls: self.counters.pulls.load(Ordering::Relaxed),
            values_pushed: self.counters.values_pushed.load(Ordering::Relaxed),
            values_pulled: self.counters.values_pulled.load(Ordering::Relaxed),
            load_error: String::new(),
            memory_bytes: self.memory_bytes(),
            cpu_seconds: self.counters.cpu_ns.load(Ordering::Relaxed) as f64 / 1e9,
            bytes_received: self.counters.bytes_received.load(Ordering::Relaxed),
            bytes_sent: self.counters.bytes_sent.load(Ordering::Relaxed),
            cached_rows: match &self.data {
                TableData::Dense(_) => 0,
                TableData::Sparse(rows) => rows.cached(),
            },
            rows_admitted: self.counters.rows_admitted.load(Ordering::Relaxed),
            rows_held_back: self.counters.rows_held_back.load(Ordering::Relaxed),
            rows_expired: self.counters.rows_expired.load(Ordering::Relaxed),
            rows_capped: self.counters.rows_capped.load(Ordering::Relaxed),
        }
    }

    /// Adds the CPU time this thread spent since `since` to the table's.
    pub(super) fn charge(&self, since: ThreadCpu) {
        let spent = ThreadCpu::now().0.saturating_sub(since.0);
        self.counters.cpu_ns.fetch_add(spent, Ordering::Relaxed);
    }

    /// Counts payload bytes received (pushes) or sent (pulls) for the table.
    pub(super) fn moved(&self, received: bool, bytes: usize) {
        let c = if received {
            &self.counters.bytes_received
        } else {
            &self.counters.bytes_sent
        };
        c.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Bytes this table's cells take in memory on this shard (a durable shard's sparse rows:
    /// those in its cache).
    pub fn memory_bytes(&self) -> u64 {
        match &self.data {
            TableData::Dense(_) => self.dense_bytes,
            TableData::Sparse(rows) => rows.cached() * self.row_bytes(),
        }
    }

    /// Bytes this table's cells take on this shard, in memory or in the store: what a job's
    /// byte quota counts.
    pub fn held_bytes(&self) -> u64 {
        match &self.data {
            TableData::Dense(_) => self.dense_bytes,
            TableData::Sparse(rows) => rows.stored() * self.row_bytes(),
        }
    }

    /// Bytes one sparse row takes in memory.
    pub(super) fn row_bytes(&self) -> u64 {
        cell_bytes(&self.spec, self.spec.row_dim() as u64)
    }

    /// Rows (sparse) or chunks (dense) stored on this shard.
    pub fn rows(&self) -> u64 {
        match &self.data {
            TableData::Dense(c) => c.len() as u64,
            TableData::Sparse(r) => r.stored(),
        }
    }

    /// Counts a pull of `values` values.
    pub(super) fn pulled(&self, values: u64) {
        self.counters.pulls.fetch_add(1, Ordering::Relaxed);
        self.counters
            .values_pulled
            .fetch_add(values, Ordering::Relaxed);
    }

    /// Applies `grad` to one cell's parameters and optimizer state, in memory.
    pub(super) fn apply_grad(&self, cell: &mut Cell, grad: &[f32]) {
        let (w, state) = cell.data.split_at_mut(grad.len());
        optim::apply(&self.spec.optimizer, w, state, &mut cell.step, grad);
    }

    /// Applies a gradient given as little-endian f32 bytes: in place where they are aligned,
    /// else decoded into `grad` first.
    pub(super) fn apply_le(&self, cell: &mut Cell, bytes: &[u8], grad: &mut Vec<f32>) {
        match bytemuck::try_cast_slice::<u8, f32>(bytes) {
            // In place where the bytes are aligned (a bulk stream's body is).
            Ok(g) if cfg!(target_endian = "little") => self.apply_grad(cell, g),
            _ => {
                grad.resize(bytes.len() / 4, 0.0);
                ps_core::payload::read_f32_le(bytes, grad);
                self.apply_grad(cell, grad);
            }
        }
    }

    /// [`Table::apply_le`], returning the CRC-32 of `bytes` (what a push log's record holds
    /// of the gradient), computed in the same pass a block at a time, each block checksummed
    /// just before it is applied, while it is in the core's nearest cache: one read of the
    /// gradient from memory instead of two. The checksum takes the cell's lock a little
    /// longer; the pass it saves is over the same bytes.
    pub(super) fn apply_le_summed(
        &self,
        cell: &mut Cell,
        bytes: &[u8],
        grad: &mut Vec<f32>,
    ) -> u32 {
        match bytemuck::try_cast_slice::<u8, f32>(bytes) {
            Ok(g) if cfg!(target_endian = "little") => {
                let (w, state) = cell.data.split_at_mut(g.len());
                optim::apply_checksummed(&self.spec.optimizer, w, state, &mut cell.step, g)
            }
            _ => {
                let crc = crc32fast::hash(bytes);
                self.apply_le(cell, bytes, grad);
                crc
            }
        }
    }

    /// Puts one dense chunk's parameters and optimizer state into `batch`: two entries, since
    /// its parameters alone are what an export reads.
    pub(super) fn put_chunk(
        &self,
        index: u64,
        cell: &Cell,
        batch: &mut impl StoreBatch,
        scratch: &mut Vec<u8>,
    ) {
        let n = cell.data.len() / (1 + self.spec.optimizer.state_slots());
        let key = self.key(index);
        batch.put(Cf::Params, &key, bytemuck::cast_slice(&cell.data[..n]));
        if self.spec.optimizer.state_slots() > 0 {
            batch.put(Cf::Optim, &key, cell.encode_state(n, scratch));
        }
    }

    /// Puts one sparse row into `batch` as one entry: its parameters, its step and state, and
    /// `stamp`, the log position (plus one) of the last logged update it holds (0: none).
    /// RocksDB's costs are per entry as well as per byte; one entry per row raised the durable
    /// rate with a tenth of the table cached by about a third (README). Rows stored before
    /// were two entries, or had no stamp; [`Cell::stored`] reads every form.
    pub(super) fn put_row(
        &self,
        id: u64,
        cell: &Cell,
        stamp: u64,
        batch: &mut impl StoreBatch,
        scratch: &mut Vec<u8>,
    ) {
        scratch.clear();
        self.append_row(cell, stamp, scratch);
        batch.put(Cf::Params, &self.key(id), scratch);
    }

    /// Bytes of a sparse row's stored form ([`Table::append_row`]): its parameters and
    /// optimizer state, then its step and stamp.
    pub(super) fn stored_row_bytes(&self) -> usize {
        let n = self.spec.row_dim();
        n * 4 * (1 + self.spec.optimizer.state_slots()) + 16
    }

    /// Appends a sparse row's stored form ([`Table::put_row`]) to `out`.
    pub(super) fn append_row(&self, cell: &Cell, stamp: u64, out: &mut Vec<u8>) {
        let n = cell.data.len() / (1 + self.spec.optimizer.state_slots());
        out.extend_from_slice(bytemuck::cast_slice(&cell.data[..n]));
        cell.append_state(n, out);
        out.extend_from_slice(&stamp.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ps_core::Optimizer;

    /// A batch that keeps what is put in it.
    #[derive(Default)]
    struct Recorded(Vec<(Cf, Vec<u8>, Vec<u8>)>);

    impl StoreBatch for Recorded {
        fn put(&mut self, cf: Cf, key: &[u8], value: &[u8]) {
            self.0.push((cf, key.to_vec(), value.to_vec()));
        }
        fn delete(&mut self, _: Cf, _: &[u8]) {}
        fn delete_range(&mut self, _: Cf, _: &[u8], _: &[u8]) {}
        fn size_bytes(&self) -> usize {
            0
        }
        fn is_empty(&self) -> bool {
            self.0.is_empty()
        }
    }

    fn trained(table: &Table, key: u64, n: usize) -> Cell {
        let mut cell = Cell::fresh(&table.spec, table.hash, key, n);
        table.apply_grad(&mut cell, &vec![0.5; n]);
        table.apply_grad(&mut cell, &vec![-0.25; n]);
        cell
    }

    #[test]
    fn a_sparse_row_is_one_entry_and_both_stored_forms_read_back() {
        let spec = TableSpec::sparse("t", 3)
            .unwrap()
            .with_optimizer(Optimizer::adam(0.1))
            .unwrap();
        let table = Table::new(1, spec.clone(), |_, _| true);
        let cell = trained(&table, 42, 3);
        let mut batch = Recorded::default();
        table.put_row(42, &cell, 77, &mut batch, &mut Vec::new());
        assert_eq!(batch.0.len(), 1, "one entry per row");
        let (cf, key, value) = &batch.0[0];
        assert_eq!((*cf, key.as_slice()), (Cf::Params, &table.key(42)[..]));
        let (back, stamp) = Cell::stored(&spec, 3, value, None).unwrap();
        assert_eq!((back.step, &back.data, stamp), (cell.step, &cell.data, 77));
        // The forms rows were stored in before, without a stamp: one entry, and parameters
        // and state as two entries.
        let params: &[u8] = bytemuck::cast_slice(&cell.data[..3]);
        let mut scratch = Vec::new();
        let state = cell.encode_state(3, &mut scratch).to_vec();
        let one = [params, &state[..]].concat();
        let (back, stamp) = Cell::stored(&spec, 3, &one, None).unwrap();
        assert_eq!((back.step, &back.data, stamp), (cell.step, &cell.data, 0));
        let (back, stamp) = Cell::stored(&spec, 3, params, Some(&state)).unwrap();
        assert_eq!((back.step, &back.data, stamp), (cell.step, &cell.data, 0));
        assert!(Cell::stored(&spec, 3, params, None).is_err());
        // An SGD row keeps its step and stamp beside its parameters.
        let sgd = TableSpec::sparse("s", 3).unwrap();
        let table = Table::new(2, sgd.clone(), |_, _| true);
        let cell = trained(&table, 5, 3);
        let mut batch = Recorded::default();
        table.put_row(5, &cell, 9, &mut batch, &mut Vec::new());
        let (back, stamp) = Cell::stored(&sgd, 3, &batch.0[0].2, None).unwrap();
        assert_eq!((back.step, &back.data, stamp), (cell.step, &cell.data, 9));
        // Its form before stamps: the parameters alone.
        let params: &[u8] = bytemuck::cast_slice(&cell.data);
        let (back, stamp) = Cell::stored(&sgd, 3, params, None).unwrap();
        assert_eq!((back.step, &back.data, stamp), (0, &cell.data, 0));
    }

    #[test]
    fn a_dense_chunk_keeps_its_parameters_and_state_apart() {
        let spec = TableSpec::dense("d", &[4])
            .unwrap()
            .with_optimizer(Optimizer::adagrad(0.1))
            .unwrap();
        let table = Table::new(1, spec, |_, _| true);
        let cell = trained(&table, 0, 4);
        let mut batch = Recorded::default();
        table.put_chunk(0, &cell, &mut batch, &mut Vec::new());
        let cfs: Vec<Cf> = batch.0.iter().map(|(cf, _, _)| *cf).collect();
        assert_eq!(cfs, [Cf::Params, Cf::Optim]);
        assert_eq!(batch.0[0].2.len(), 16, "the parameters alone");
    }
}
