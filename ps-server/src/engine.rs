//! The shard engine: the hot in-memory layer, the single writer with group commit, and
//! exactly-once application of pushes.
//!
//! Every mutation (push, create, drop, checkpoint) goes through one writer thread. It takes all
//! queued pushes at once, applies them to the hot layer, puts the updated sparse rows, their
//! optimizer state and the pushes' (client id, seq) into one batch, appends the dense pushes'
//! gradients to the dense log ([`crate::dense_log`]) as one record, writes the record and then
//! the batch (WAL on), and only then answers the callers: a push is durable before it is
//! acknowledged, and one write serves many concurrent pushes. Reads are served from the hot
//! layer, concurrently with the writer.
//!
//! A write that fails leaves memory ahead of disk, so the engine turns itself read-only
//! (`unavailable` for every later write) until a restart reloads the durable state.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use dashmap::DashMap;
use parking_lot::{Mutex, RwLock};
use ps_core::request::DenseSlice;
use ps_core::{
    NonFinitePolicy, Partitioner, Payload, PullDense, PullSparse, PushDense, PushId, PushSparse,
    TableKind, TableName, TableSpec,
};
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::dense_log::{DenseLog, Logged};
use crate::metrics as m;
use crate::optim;
use crate::registration::MapEpoch;
use crate::store::{Cf, Store, StoreBatch, StoreError};

/// The engine's errors; `service.rs` maps each to one gRPC status code.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    OutOfRange(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("storage: {0}")]
    Store(#[from] StoreError),
}

impl From<ps_core::ValidationError> for EngineError {
    fn from(e: ps_core::ValidationError) -> Self {
        Self::InvalidArgument(e.to_string())
    }
}

type Result<T, E = EngineError> = std::result::Result<T, E>;

/// How the engine is set up.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub shard_index: u32,
    pub num_shards: u32,
    pub virtual_nodes: u32,
    /// Where checkpoints are written (`<dir>/<name>`); `None` in the in-memory mode.
    pub checkpoint_dir: Option<PathBuf>,
    /// Most bytes of pushes applied in one group commit.
    pub group_commit_bytes: usize,
    /// Most bytes of pushes queued for the writer; callers wait beyond it.
    pub max_queued_bytes: usize,
    /// Most bytes of replicas kept for delta pulls; beyond it chunks are answered whole.
    pub pull_replica_bytes: usize,
    /// The shard-map epoch learnt from the scheduler (0: no scheduler). Shared with the
    /// registration task, and kept across a restore.
    pub map_epoch: Arc<MapEpoch>,
}

/// One chunk of a dense table or one row of a sparse table: parameters, then optimizer state.
#[derive(Debug)]
struct Cell {
    step: u64,
    /// `n` parameters followed by `n * state_slots` optimizer values.
    data: Box<[f32]>,
}

impl Cell {
    fn fresh(spec: &TableSpec, table_hash: u64, key: u64, n: usize) -> Self {
        let mut data = vec![0.0; n * (1 + spec.optimizer.state_slots())];
        spec.initializer.fill(table_hash, key, &mut data[..n]);
        data[n..].copy_from_slice(&optim::initial_state(&spec.optimizer, n));
        Self {
            step: 0,
            data: data.into_boxed_slice(),
        }
    }

    /// The stored form of the optimizer state: step count, then the state values.
    fn encode_state<'a>(&self, n: usize, buf: &'a mut Vec<u8>) -> &'a [u8] {
        buf.clear();
        buf.extend_from_slice(&self.step.to_le_bytes());
        buf.extend_from_slice(bytemuck::cast_slice(&self.data[n..]));
        buf
    }
}

#[derive(Debug)]
enum TableData {
    /// The chunks this shard owns.
    Dense(HashMap<u64, RwLock<Cell>>),
    Sparse(DashMap<u64, Cell, foldhash::fast::RandomState>),
}

#[derive(Debug, Default)]
struct TableCounters {
    pushes: AtomicU64,
    pulls: AtomicU64,
    values_pushed: AtomicU64,
    values_pulled: AtomicU64,
}

/// A table held by this shard.
#[derive(Debug)]
pub struct Table {
    id: u32,
    spec: TableSpec,
    hash: u64,
    data: TableData,
    dropped: AtomicBool,
    counters: TableCounters,
}

impl Table {
    pub fn spec(&self) -> &TableSpec {
        &self.spec
    }

    fn key(&self, index: u64) -> [u8; 12] {
        let mut k = [0u8; 12];
        k[..4].copy_from_slice(&self.id.to_be_bytes());
        k[4..].copy_from_slice(&index.to_be_bytes());
        k
    }

    /// This table's counters on this shard.
    pub fn stats(&self) -> TableStatsView {
        TableStatsView {
            name: self.spec.name.to_string(),
            rows: self.rows(),
            pushes: self.counters.pushes.load(Ordering::Relaxed),
            pulls: self.counters.pulls.load(Ordering::Relaxed),
            values_pushed: self.counters.values_pushed.load(Ordering::Relaxed),
            values_pulled: self.counters.values_pulled.load(Ordering::Relaxed),
        }
    }

    /// Rows (sparse) or chunks (dense) stored on this shard.
    pub fn rows(&self) -> u64 {
        match &self.data {
            TableData::Dense(c) => c.len() as u64,
            TableData::Sparse(r) => r.len() as u64,
        }
    }
}

/// Applied push ids of one client: everything below `floor`, plus the set above it.
#[derive(Debug, Default)]
struct ClientWindow {
    floor: u64,
    applied: BTreeSet<u64>,
}

#[derive(Debug, Default)]
struct Dedup {
    clients: HashMap<u64, ClientWindow>,
}

impl Dedup {
    fn seen(&self, id: &PushId) -> bool {
        self.clients
            .get(&id.client_id)
            .is_some_and(|w| id.seq < w.floor || w.applied.contains(&id.seq))
    }

    /// Records `id` as applied, in memory and in `batch`, and forgets what the client's floor
    /// says it will never retry.
    fn record(&mut self, id: &PushId, batch: &mut impl StoreBatch) {
        let w = self.clients.entry(id.client_id).or_default();
        w.applied.insert(id.seq);
        batch.put(Cf::Meta, &dedup_key(id.client_id, id.seq), &[]);
        if id.min_unacked_seq > w.floor {
            w.floor = id.min_unacked_seq;
            w.applied = w.applied.split_off(&w.floor);
            batch.delete_range(
                Cf::Meta,
                &dedup_key(id.client_id, 0),
                &dedup_key(id.client_id, w.floor),
            );
            batch.put(Cf::Meta, &floor_key(id.client_id), &w.floor.to_le_bytes());
        }
    }
}

// Metadata keys.
const META_TABLE: u8 = b't';
const META_NEXT_ID: &[u8] = b"n";
const META_IDENTITY: &[u8] = b"s";
const META_DEDUP: u8 = b'd';
const META_FLOOR: u8 = b'f';
/// The dense-log position the dense cells in the store cover (little-endian u64).
const META_LOG_POS: &[u8] = b"l";

fn dedup_key(client: u64, seq: u64) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[0] = META_DEDUP;
    k[1..9].copy_from_slice(&client.to_be_bytes());
    k[9..].copy_from_slice(&seq.to_be_bytes());
    k
}

fn floor_key(client: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = META_FLOOR;
    k[1..].copy_from_slice(&client.to_be_bytes());
    k
}

fn table_key(name: &TableName) -> Vec<u8> {
    let mut k = vec![META_TABLE];
    k.extend_from_slice(name.as_str().as_bytes());
    k
}

fn be_u64(b: &[u8]) -> Result<u64, StoreError> {
    b.try_into()
        .map(u64::from_be_bytes)
        .map_err(|_| StoreError::Corrupt(format!("expected 8 bytes, found {}", b.len())))
}

fn le_u64(b: &[u8]) -> Result<u64, StoreError> {
    b.try_into()
        .map(u64::from_le_bytes)
        .map_err(|_| StoreError::Corrupt(format!("expected 8 bytes, found {}", b.len())))
}

/// Counts a received payload's bytes and decodes it to f32, checking every length, index,
/// scale and lz4 frame: a payload that does not decode exactly is refused, nothing applied.
fn decode_received(table: &Table, field: &str, p: &Payload) -> Result<Payload> {
    m::wire_bytes(
        "push",
        table.spec.name.as_str(),
        p.encoding(),
        p.data().len(),
    );
    p.decoded().map_err(|e| {
        EngineError::InvalidArgument(format!(
            "{field}: the {} payload does not decode: {e}",
            p.encoding()
        ))
    })
}

fn read_f32s(bytes: &[u8], out: &mut [f32]) -> Result<(), StoreError> {
    if bytes.len() != out.len() * 4 {
        return Err(StoreError::Corrupt(format!(
            "a stored cell holds {} bytes; its table needs {}",
            bytes.len(),
            out.len() * 4
        )));
    }
    ps_core::payload::read_f32_le(bytes, out);
    Ok(())
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct StoredTable {
    id: u32,
    spec: TableSpec,
}

#[derive(Debug, serde::Serialize, serde::Deserialize, PartialEq)]
struct StoredIdentity {
    shard_index: u32,
    num_shards: u32,
    virtual_nodes: u32,
}

/// What a push did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PushOutcome {
    pub duplicate: bool,
    pub applied_values: u64,
    pub skipped_non_finite: u64,
}

/// Where a checkpoint was written.
#[derive(Debug, Clone)]
pub struct CheckpointDone {
    pub name: String,
    pub path: PathBuf,
    pub sequence: u64,
}

/// Counters for `GetStats`.
#[derive(Debug, Default)]
struct Counters {
    pushes_applied: AtomicU64,
    pushes_duplicate: AtomicU64,
    write_batches: AtomicU64,
    bytes_written: AtomicU64,
}

/// A point-in-time view of the shard for `GetStats`.
#[derive(Debug, Clone)]
pub struct ShardStats {
    pub uptime_ms: u64,
    pub pushes_applied: u64,
    pub pushes_duplicate: u64,
    pub write_batches: u64,
    pub bytes_written: u64,
    pub live_data_bytes: u64,
    pub tables: Vec<TableStatsView>,
}

#[derive(Debug, Clone)]
pub struct TableStatsView {
    pub name: String,
    pub rows: u64,
    pub pushes: u64,
    pub pulls: u64,
    pub values_pushed: u64,
    pub values_pulled: u64,
}

enum Job {
    Dense(Arc<Table>, PushDense),
    Sparse(Arc<Table>, PushSparse),
}

impl Job {
    fn bytes(&self) -> usize {
        match self {
            Job::Dense(_, p) => p.slices.iter().map(|s| s.values.data().len()).sum(),
            Job::Sparse(_, p) => p.values.data().len() + p.ids.len() * 8,
        }
    }
}

enum Cmd {
    Push(Job, oneshot::Sender<Result<PushOutcome>>),
    Create(TableSpec, oneshot::Sender<Result<(TableSpec, bool)>>),
    Drop(TableName, oneshot::Sender<Result<()>>),
    Checkpoint(String, oneshot::Sender<Result<CheckpointDone>>),
    /// Finish what came before, then stop the writer.
    Stop,
}

struct Inner<S: Store> {
    store: S,
    cfg: EngineConfig,
    partitioner: Partitioner,
    tables: RwLock<HashMap<TableName, Arc<Table>>>,
    next_table_id: Mutex<u32>,
    dedup: Mutex<Dedup>,
    counters: Counters,
    /// Set when a write failed: memory may be ahead of disk.
    failed: Mutex<Option<String>>,
    started: Instant,
    /// What each client was sent of each chunk by delta pulls: (client, table id, chunk).
    replicas: DashMap<(u64, u32, u64), Replica, foldhash::fast::RandomState>,
    replica_bytes: AtomicU64,
    /// The dense-gradient log (durable stores only); used by the writer alone.
    log: Mutex<Option<DenseLog>>,
    /// Bytes of a dense-log image of every dense cell ([`DenseLog::image_len`]).
    image_len: AtomicU64,
}

/// A client's copy of one chunk, as delta pulls have built it.
#[derive(Debug)]
struct Replica {
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

/// A shard's engine. Cloning is cheap; the writer stops when the last clone is dropped.
pub struct Engine<S: Store> {
    inner: Arc<Inner<S>>,
    tx: mpsc::Sender<Cmd>,
    queue_budget: Arc<Semaphore>,
    writer: Arc<Mutex<Option<std::thread::JoinHandle<()>>>>,
}

impl<S: Store> Clone for Engine<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            tx: self.tx.clone(),
            queue_budget: self.queue_budget.clone(),
            writer: self.writer.clone(),
        }
    }
}

impl<S: Store> std::fmt::Debug for Engine<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("cfg", &self.inner.cfg)
            .finish_non_exhaustive()
    }
}

/// Queue budget is counted in KiB so that 1 GiB fits a semaphore's permits comfortably.
const BUDGET_UNIT: usize = 1024;

impl<S: Store> Engine<S> {
    /// Loads the shard's state from `store` into the hot layer and starts the writer thread.
    pub fn open(store: S, cfg: EngineConfig) -> Result<Self> {
        let partitioner = Partitioner::new(cfg.num_shards, cfg.virtual_nodes);
        let inner = Arc::new(Inner {
            partitioner,
            tables: RwLock::new(HashMap::new()),
            next_table_id: Mutex::new(1),
            dedup: Mutex::new(Dedup::default()),
            counters: Counters::default(),
            failed: Mutex::new(None),
            started: Instant::now(),
            replicas: DashMap::default(),
            replica_bytes: AtomicU64::new(0),
            log: Mutex::new(store.dense_log().map(|o| DenseLog::open(&o)).transpose()?),
            image_len: AtomicU64::new(0),
            store,
            cfg,
        });
        inner.load()?;
        let (tx, rx) = mpsc::channel(1024);
        let writer = inner.clone();
        let writer = std::thread::Builder::new()
            .name(format!("ps-writer-{}", writer.cfg.shard_index))
            .spawn(move || writer.run_writer(rx))
            .map_err(StoreError::Io)?;
        let units = (inner.cfg.max_queued_bytes / BUDGET_UNIT).clamp(1, Semaphore::MAX_PERMITS);
        Ok(Self {
            inner,
            tx,
            queue_budget: Arc::new(Semaphore::new(units)),
            writer: Arc::new(Mutex::new(Some(writer))),
        })
    }

    /// Stops the writer once every command queued before this call is done, and waits for it
    /// (blocking: call it off the runtime). Later commands are answered `unavailable`.
    pub fn close(self) {
        let writer = self.writer.lock().take();
        let _ = self.tx.blocking_send(Cmd::Stop);
        if let Some(w) = writer
            && w.join().is_err()
        {
            tracing::error!("the writer thread panicked");
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.cfg
    }

    pub fn partitioner(&self) -> &Partitioner {
        &self.inner.partitioner
    }

    pub fn durable(&self) -> bool {
        self.inner.store.durable()
    }

    /// The table named `name`, or `not_found`.
    pub fn table(&self, name: &TableName) -> Result<Arc<Table>> {
        self.inner.tables.read().get(name).cloned().ok_or_else(|| {
            EngineError::NotFound(format!(
                "table `{name}` does not exist on this shard; create it first"
            ))
        })
    }

    pub fn list_tables(&self) -> Vec<TableSpec> {
        let mut v: Vec<TableSpec> = self
            .inner
            .tables
            .read()
            .values()
            .map(|t| t.spec.clone())
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    async fn submit<T>(&self, make: impl FnOnce(oneshot::Sender<Result<T>>) -> Cmd) -> Result<T> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(make(reply))
            .await
            .map_err(|_| EngineError::Unavailable("the shard is shutting down".into()))?;
        rx.await
            .map_err(|_| EngineError::Unavailable("the shard's writer stopped".into()))?
    }

    /// Creates `spec`, or checks that an existing table of that name has exactly that spec.
    pub async fn create_table(&self, spec: TableSpec) -> Result<(TableSpec, bool)> {
        self.submit(|r| Cmd::Create(spec, r)).await
    }

    pub async fn drop_table(&self, name: TableName) -> Result<()> {
        let id = self.table(&name).map(|t| t.id).ok();
        self.submit(|r| Cmd::Drop(name, r)).await?;
        if let Some(id) = id {
            self.drop_replicas(id);
        }
        Ok(())
    }

    /// Takes a checkpoint named `name` under the configured checkpoint directory.
    pub async fn checkpoint(&self, name: String) -> Result<CheckpointDone> {
        self.submit(|r| Cmd::Checkpoint(name, r)).await
    }

    /// Validates a dense push against its table and this shard, then has the writer apply it.
    pub async fn push_dense(&self, mut req: PushDense) -> Result<PushOutcome> {
        let table = self.table(&req.table)?;
        self.check_epoch(req.map_epoch)?;
        self.check_dense_slices(&table, &mut req.slices)?;
        self.push(Job::Dense(table, req)).await
    }

    /// Validates a sparse push against its table and this shard, then has the writer apply it.
    pub async fn push_sparse(&self, mut req: PushSparse) -> Result<PushOutcome> {
        let table = self.table(&req.table)?;
        self.check_epoch(req.map_epoch)?;
        let TableKind::Sparse { dim } = table.spec.kind else {
            return Err(EngineError::FailedPrecondition(format!(
                "table `{}` is dense; use PushDense",
                req.table
            )));
        };
        req.check_dim(dim as usize)?;
        self.check_ids(&table, &req.ids)?;
        req.values = decode_received(&table, "values", &req.values)?;
        if table.spec.non_finite == NonFinitePolicy::Reject
            && let Some(i) = req.values.first_non_finite()
        {
            return Err(EngineError::InvalidArgument(format!(
                "row {} (id {}) holds a NaN or infinity at value {}; table `{}` rejects non-finite \
                     gradients (create it with non_finite = SKIP to drop such rows instead)",
                i / dim as usize,
                req.ids[i / dim as usize],
                i % dim as usize,
                req.table
            )));
        }
        self.push(Job::Sparse(table, req)).await
    }

    async fn push(&self, job: Job) -> Result<PushOutcome> {
        if let Some(why) = self.inner.failed.lock().clone() {
            return Err(EngineError::Unavailable(why));
        }
        let units =
            (job.bytes() / BUDGET_UNIT).clamp(1, self.inner.cfg.max_queued_bytes / BUDGET_UNIT);
        let _permit = self
            .queue_budget
            .acquire_many(u32::try_from(units).unwrap_or(u32::MAX))
            .await
            .map_err(|_| EngineError::Unavailable("the shard is shutting down".into()))?;
        self.submit(|r| Cmd::Push(job, r)).await
    }

    /// The shard-map epoch this shard is on (0 when no scheduler manages it).
    pub fn map_epoch(&self) -> u64 {
        self.inner.cfg.map_epoch.get()
    }

    /// A request routed with an older map than this shard's is refused (the client must fetch
    /// the map again); one from a newer map is `unavailable` until this shard's next heartbeat
    /// brings the epoch. Epoch 0 is a client that routes without a scheduler (tools, tests):
    /// the shard still checks that it owns every key.
    fn check_epoch(&self, epoch: u64) -> Result<()> {
        let current = self.map_epoch();
        if epoch == 0 || epoch == current {
            return Ok(());
        }
        if current == 0 {
            return Err(EngineError::Unavailable(format!(
                "this shard has not registered with a scheduler yet (request map epoch {epoch}); retry"
            )));
        }
        if epoch < current {
            return Err(EngineError::FailedPrecondition(format!(
                "{}: the request was routed with epoch {epoch}, this shard is at epoch {current}; fetch the shard map from the scheduler and retry",
                ps_core::wire::STALE_MAP
            )));
        }
        self.inner.cfg.map_epoch.behind();
        Err(EngineError::Unavailable(format!(
            "this shard is at map epoch {current} and has not seen epoch {epoch} yet; retry"
        )))
    }

    fn check_owner(&self, owner: u32, what: impl FnOnce() -> String) -> Result<()> {
        if owner != self.inner.cfg.shard_index {
            return Err(EngineError::FailedPrecondition(format!(
                "{} belongs to shard {owner}, but this is shard {} of {}: the client's shard list \
                 does not match the cluster",
                what(),
                self.inner.cfg.shard_index,
                self.inner.cfg.num_shards
            )));
        }
        Ok(())
    }

    fn check_ids(&self, table: &Table, ids: &[u64]) -> Result<()> {
        for &id in ids {
            self.check_owner(self.inner.partitioner.shard_for_id(table.hash, id), || {
                format!("id {id}")
            })?;
        }
        Ok(())
    }

    /// Checks every slice against the table's chunks and this shard, and decodes it (a slice
    /// that does not decode exactly refuses the whole push).
    fn check_dense_slices(&self, table: &Table, slices: &mut [DenseSlice]) -> Result<()> {
        let TableKind::Dense(shape) = &table.spec.kind else {
            return Err(EngineError::FailedPrecondition(format!(
                "table `{}` is sparse; use PushSparse",
                table.spec.name
            )));
        };
        if slices.is_empty() {
            return Err(EngineError::InvalidArgument(
                "the push holds no slices".into(),
            ));
        }
        let mut seen = HashSet::new();
        for (i, s) in slices.iter_mut().enumerate() {
            let mut chunk = s.chunk;
            let mut covered = 0usize;
            while covered < s.values.len() {
                let len = self.check_chunk(table, shape, chunk)?;
                if !seen.insert(chunk) {
                    return Err(EngineError::InvalidArgument(format!(
                        "chunk {chunk} appears twice in one push; send it once"
                    )));
                }
                covered += len;
                chunk += 1;
            }
            if covered != s.values.len() || s.values.is_empty() {
                return Err(EngineError::InvalidArgument(format!(
                    "slices[{i}] starts at chunk {} and holds {} values, which does not end on a \
                     chunk boundary (chunks hold {} values; the tensor has {})",
                    s.chunk,
                    s.values.len(),
                    shape.chunk_elems,
                    shape.len()
                )));
            }
            s.values = decode_received(table, &format!("slices[{i}].values"), &s.values)?;
            if table.spec.non_finite == NonFinitePolicy::Reject
                && let Some(j) = s.values.first_non_finite()
            {
                return Err(EngineError::InvalidArgument(format!(
                    "slices[{i}] holds a NaN or infinity at element {} of the tensor; table `{}` \
                         rejects non-finite gradients (create it with non_finite = SKIP to drop \
                         such chunks instead)",
                    s.chunk * shape.chunk_elems + j as u64,
                    table.spec.name
                )));
            }
        }
        Ok(())
    }

    /// Checks that `chunk` exists and is owned here; returns its length.
    fn check_chunk(&self, table: &Table, shape: &ps_core::DenseShape, chunk: u64) -> Result<usize> {
        let len = shape.chunk_len(chunk).ok_or_else(|| {
            EngineError::OutOfRange(format!(
                "chunk {chunk} is out of range: table `{}` has {} chunks (0..{})",
                table.spec.name,
                shape.num_chunks(),
                shape.num_chunks()
            ))
        })?;
        self.check_owner(
            self.inner.partitioner.shard_for_chunk(table.hash, chunk),
            || format!("chunk {chunk} of `{}`", table.spec.name),
        )?;
        Ok(len)
    }

    /// Reads chunks of a dense table, one slice per chunk in request order: their values in
    /// the accepted encoding, or with a delta pull the top-k of each chunk's change since the
    /// client's replica.
    pub fn pull_dense(&self, req: &PullDense) -> Result<PulledDense> {
        let table = self.table(&req.table)?;
        self.check_epoch(req.map_epoch)?;
        let (TableKind::Dense(shape), TableData::Dense(chunks)) = (&table.spec.kind, &table.data)
        else {
            return Err(EngineError::FailedPrecondition(format!(
                "table `{}` is sparse; use PullSparse",
                req.table
            )));
        };
        let mut out = PulledDense {
            slices: Vec::with_capacity(req.chunks.len()),
            delta: Vec::new(),
        };
        let mut values = 0u64;
        for (i, &c) in req.chunks.iter().enumerate() {
            let len = self.check_chunk(&table, shape, c)?;
            let cell = chunks
                .get(&c)
                .ok_or_else(|| EngineError::Unavailable(format!("chunk {c} is not loaded")))?
                .read();
            let current = &cell.data[..len];
            let payload = match &req.delta {
                None => Payload::encode_plain(current, req.accept),
                Some(d) => {
                    let (payload, is_delta, version) =
                        self.delta_chunk(&table, c, current, d.client_id, d.ratio, d.versions[i]);
                    out.delta.push((is_delta, version));
                    payload
                }
            };
            m::wire_bytes(
                "pull",
                table.spec.name.as_str(),
                payload.encoding(),
                payload.data().len(),
            );
            out.slices.push(DenseSlice {
                chunk: c,
                values: payload,
            });
            values += len as u64;
        }
        table.counters.pulls.fetch_add(1, Ordering::Relaxed);
        table
            .counters
            .values_pulled
            .fetch_add(values, Ordering::Relaxed);
        m::pulled(table.spec.name.as_str(), "dense", values);
        Ok(out)
    }

    /// One chunk of a delta pull: the top `ratio` of `current - replica` when the client holds
    /// the replica's version (the replica then takes exactly what the client will add), else
    /// the whole chunk in f32 and a new version. Returns (payload, is_delta, version).
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
        if let Some(mut r) = self.inner.replicas.get_mut(&key)
            && r.version == held
            && r.values.len() == current.len()
        {
            let change: Vec<f32> = current.iter().zip(&r.values).map(|(w, v)| w - v).collect();
            let mut enc = ps_codec::Encoder::new(
                ps_codec::CompressOptions {
                    error_feedback: true,
                    codec: ps_codec::Codec::TopK {
                        ratio,
                        values: ps_codec::SparseValues::F16,
                    },
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
        let old = self.inner.replicas.remove(&key);
        if let Some((_, r)) = &old {
            self.inner
                .replica_bytes
                .fetch_sub((r.values.len() * 4) as u64, Ordering::Relaxed);
        }
        let used = self.inner.replica_bytes.load(Ordering::Relaxed);
        if used + bytes <= self.inner.cfg.pull_replica_bytes as u64 {
            self.inner.replica_bytes.fetch_add(bytes, Ordering::Relaxed);
            self.inner.replicas.insert(
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
    fn drop_replicas(&self, table_id: u32) {
        self.inner.replicas.retain(|k, r| {
            let keep = k.1 != table_id;
            if !keep {
                self.inner
                    .replica_bytes
                    .fetch_sub((r.values.len() * 4) as u64, Ordering::Relaxed);
            }
            keep
        });
    }

    /// Reads rows of a sparse table in request order; unseen rows read as their initializer.
    pub fn pull_sparse(&self, req: &PullSparse) -> Result<Payload> {
        let table = self.table(&req.table)?;
        self.check_epoch(req.map_epoch)?;
        let (TableKind::Sparse { dim }, TableData::Sparse(rows)) = (&table.spec.kind, &table.data)
        else {
            return Err(EngineError::FailedPrecondition(format!(
                "table `{}` is dense; use PullDense",
                req.table
            )));
        };
        self.check_ids(&table, &req.ids)?;
        let dim = *dim as usize;
        let mut buf = vec![0.0f32; req.ids.len() * dim];
        for (&id, out) in req.ids.iter().zip(buf.chunks_exact_mut(dim)) {
            match rows.get(&id) {
                Some(cell) => out.copy_from_slice(&cell.data[..dim]),
                None => table.spec.initializer.fill(table.hash, id, out),
            }
        }
        table.counters.pulls.fetch_add(1, Ordering::Relaxed);
        table
            .counters
            .values_pulled
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        m::pulled(table.spec.name.as_str(), "sparse", buf.len() as u64);
        let payload = Payload::encode_plain(&buf, req.accept);
        m::wire_bytes(
            "pull",
            table.spec.name.as_str(),
            payload.encoding(),
            payload.data().len(),
        );
        Ok(payload)
    }

    pub fn stats(&self) -> ShardStats {
        let c = &self.inner.counters;
        let mut tables: Vec<TableStatsView> = self
            .inner
            .tables
            .read()
            .values()
            .map(|t| t.stats())
            .collect();
        tables.sort_by(|a, b| a.name.cmp(&b.name));
        ShardStats {
            uptime_ms: self.inner.started.elapsed().as_millis() as u64,
            pushes_applied: c.pushes_applied.load(Ordering::Relaxed),
            pushes_duplicate: c.pushes_duplicate.load(Ordering::Relaxed),
            write_batches: c.write_batches.load(Ordering::Relaxed),
            bytes_written: c.bytes_written.load(Ordering::Relaxed),
            live_data_bytes: self.inner.store.live_bytes(),
            tables,
        }
    }
}

/// Applies `grad` to one cell's parameters and optimizer state, in memory.
fn apply_grad(table: &Table, cell: &mut Cell, grad: &[f32]) {
    let (w, state) = cell.data.split_at_mut(grad.len());
    optim::apply(&table.spec.optimizer, w, state, &mut cell.step, grad);
}

/// Applies a gradient given as little-endian f32 bytes, through `grad`.
fn apply_le(table: &Table, cell: &mut Cell, bytes: &[u8], grad: &mut Vec<f32>) {
    grad.resize(bytes.len() / 4, 0.0);
    ps_core::payload::read_f32_le(bytes, grad);
    apply_grad(table, cell, grad);
}

/// Puts one cell's parameters and optimizer state into `batch`.
fn put_cell(
    table: &Table,
    index: u64,
    cell: &Cell,
    batch: &mut impl StoreBatch,
    scratch: &mut Vec<u8>,
) {
    let n = cell.data.len() / (1 + table.spec.optimizer.state_slots());
    let key = table.key(index);
    batch.put(Cf::Params, &key, bytemuck::cast_slice(&cell.data[..n]));
    // SGD keeps no state: one put per cell instead of two.
    if table.spec.optimizer.state_slots() > 0 {
        batch.put(Cf::Optim, &key, cell.encode_state(n, scratch));
    }
}

impl<S: Store> Inner<S> {
    /// Loads the identity, tables, cells and applied push ids from the store.
    fn load(&self) -> Result<()> {
        let me = StoredIdentity {
            shard_index: self.cfg.shard_index,
            num_shards: self.cfg.num_shards,
            virtual_nodes: self.cfg.virtual_nodes,
        };
        let mut stored_identity = None;
        self.store.scan(Cf::Meta, META_IDENTITY, &mut |_, v| {
            stored_identity = Some(
                serde_json::from_slice::<StoredIdentity>(v)
                    .map_err(|e| StoreError::Corrupt(format!("shard identity: {e}")))?,
            );
            Ok(())
        })?;
        match stored_identity {
            Some(id) if id != me => {
                return Err(EngineError::FailedPrecondition(format!(
                    "this data directory belongs to shard {} of {} (virtual nodes {}), not shard {} of {} \
                     (virtual nodes {}); start with the matching flags or another --data-dir",
                    id.shard_index,
                    id.num_shards,
                    id.virtual_nodes,
                    me.shard_index,
                    me.num_shards,
                    me.virtual_nodes
                )));
            }
            Some(_) => {}
            None if self.store.durable() => {
                let mut b = self.store.batch();
                let v = serde_json::to_vec(&me).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                b.put(Cf::Meta, META_IDENTITY, &v);
                self.store.write(b)?;
            }
            None => {}
        }

        self.store.scan(Cf::Meta, META_NEXT_ID, &mut |_, v| {
            let bytes: [u8; 4] = v
                .try_into()
                .map_err(|_| StoreError::Corrupt("next table id".into()))?;
            *self.next_table_id.lock() = u32::from_le_bytes(bytes);
            Ok(())
        })?;

        let mut stored = Vec::new();
        self.store.scan(Cf::Meta, &[META_TABLE], &mut |k, v| {
            let t: StoredTable = serde_json::from_slice(v).map_err(|e| {
                StoreError::Corrupt(format!(
                    "table record {:?}: {e}",
                    String::from_utf8_lossy(k)
                ))
            })?;
            stored.push(t);
            Ok(())
        })?;
        for t in stored {
            let table = self.new_table(t.id, t.spec);
            self.load_cells(&table)?;
            self.tables
                .write()
                .insert(table.spec.name.clone(), Arc::new(table));
        }

        let mut dedup = self.dedup.lock();
        self.store.scan(Cf::Meta, &[META_FLOOR], &mut |k, v| {
            dedup.clients.entry(be_u64(&k[1..])?).or_default().floor = le_u64(v)?;
            Ok(())
        })?;
        self.store.scan(Cf::Meta, &[META_DEDUP], &mut |k, _| {
            if k.len() != 17 {
                return Err(StoreError::Corrupt("push id record".into()));
            }
            dedup
                .clients
                .entry(be_u64(&k[1..9])?)
                .or_default()
                .applied
                .insert(be_u64(&k[9..])?);
            Ok(())
        })?;
        drop(dedup);
        let replayed = self.replay_log()?;
        tracing::info!(
            tables = self.tables.read().len(),
            clients = self.dedup.lock().clients.len(),
            replayed,
            "shard state loaded"
        );
        self.dense_cells_changed();
        Ok(())
    }

    /// Applies the dense-log records the stored cells do not cover, in order, through the
    /// same optimizer code as the pushes that wrote them; their push ids join the dedup set
    /// (and the store, for those whose group commit died between the log and the store).
    /// Returns the number of records replayed.
    fn replay_log(&self) -> Result<u64> {
        let mut guard = self.log.lock();
        let Some(log) = guard.as_mut() else {
            return Ok(0);
        };
        let mut from = None;
        self.store.scan(Cf::Meta, META_LOG_POS, &mut |k, v| {
            if k == META_LOG_POS {
                from = Some(le_u64(v)?);
            }
            Ok(())
        })?;
        let Some(from) = from else {
            // A new database: whatever a log file beside it holds is not its own.
            log.reset()?;
            let mut batch = self.store.batch();
            batch.put(Cf::Meta, META_LOG_POS, &0u64.to_le_bytes());
            self.store.write(batch)?;
            return Ok(0);
        };
        let by_id: HashMap<u32, Arc<Table>> = self
            .tables
            .read()
            .values()
            .map(|t| (t.id, t.clone()))
            .collect();
        let mut dedup = self.dedup.lock();
        let mut batch = self.store.batch();
        let mut grad = Vec::new();
        let records = log.replay(from, &mut |logged| {
            let pushes = match logged {
                Logged::Pushes(pushes) => pushes,
                Logged::Image(cells) => {
                    for c in cells {
                        // Cells of a table dropped since are skipped.
                        let Some(table) = by_id.get(&c.table_id) else {
                            continue;
                        };
                        let cell = match &table.data {
                            TableData::Dense(chunks) => chunks.get(&c.index),
                            TableData::Sparse(_) => None,
                        };
                        let mut cell = cell
                            .ok_or_else(|| {
                                StoreError::Corrupt(format!(
                                    "the dense log's image names chunk {} of `{}`, which this \
                                     shard does not hold",
                                    c.index, table.spec.name
                                ))
                            })?
                            .write();
                        read_f32s(c.data, &mut cell.data)?;
                        cell.step = c.step;
                    }
                    return Ok(());
                }
            };
            for p in pushes {
                // Records of a table dropped since are skipped; its cells are gone.
                if let Some(table) = by_id.get(&p.table_id) {
                    let TableData::Dense(chunks) = &table.data else {
                        return Err(StoreError::Corrupt(format!(
                            "the dense log names sparse table `{}`",
                            table.spec.name
                        )));
                    };
                    for &(index, data) in &p.chunks {
                        let cell = chunks.get(&index).ok_or_else(|| {
                            StoreError::Corrupt(format!(
                                "the dense log names chunk {index} of `{}`, not this shard's",
                                table.spec.name
                            ))
                        })?;
                        let mut cell = cell.write();
                        let n = cell.data.len() / (1 + table.spec.optimizer.state_slots());
                        grad.resize(n, 0.0);
                        read_f32s(data, &mut grad)?;
                        apply_grad(table, &mut cell, &grad);
                    }
                }
                if !dedup.seen(&p.push_id) {
                    dedup.record(&p.push_id, &mut batch);
                }
            }
            Ok(())
        })?;
        drop(dedup);
        if batch.size_bytes() > 0 {
            self.store.write(batch)?;
        }
        Ok(records)
    }

    /// Writes every dense cell into the store with the log position they now cover, so the
    /// log's records before it may be overwritten. Refused once a write has failed: memory may
    /// then hold updates whose push ids never reached the store.
    fn snapshot(&self, log: &mut DenseLog) -> Result<()> {
        if let Some(why) = self.failed.lock().clone() {
            return Err(EngineError::Unavailable(why));
        }
        let t0 = Instant::now();
        let mut batch = self.store.batch();
        let mut scratch = Vec::new();
        for table in self.tables.read().values() {
            if let TableData::Dense(chunks) = &table.data {
                for (&index, cell) in chunks {
                    put_cell(table, index, &cell.read(), &mut batch, &mut scratch);
                }
            }
        }
        let head = log.head();
        batch.put(Cf::Meta, META_LOG_POS, &head.to_le_bytes());
        let bytes = batch.size_bytes();
        self.write(batch).map_err(EngineError::Unavailable)?;
        log.snapshot_taken(head);
        m::dense_snapshot(bytes, t0.elapsed());
        Ok(())
    }

    /// Writes an image of every dense cell into the log and makes it the stored position
    /// replay starts from, freeing the records before it.
    fn write_image(&self, log: &mut DenseLog, len: u64) -> Result<()> {
        if let Some(why) = self.failed.lock().clone() {
            return Err(EngineError::Unavailable(why));
        }
        let t0 = Instant::now();
        log.begin_image(len);
        for table in self.tables.read().values() {
            if let TableData::Dense(chunks) = &table.data {
                for (&index, cell) in chunks {
                    let cell = cell.read();
                    log.image_cell(table.id, index, cell.step, &cell.data);
                }
            }
        }
        let written = log
            .commit()
            .map_err(|e| EngineError::Unavailable(self.fail(&e)))?;
        let at = log.head() - written;
        let mut batch = self.store.batch();
        batch.put(Cf::Meta, META_LOG_POS, &at.to_le_bytes());
        self.write(batch).map_err(EngineError::Unavailable)?;
        log.snapshot_taken(at);
        m::dense_image(written, t0.elapsed());
        Ok(())
    }

    /// Recomputes what follows from the set of dense cells (after the load, a create or a
    /// drop): the store's working-set hint and the length of a dense-log image.
    fn dense_cells_changed(&self) {
        let (mut cells, mut floats) = (0, 0);
        for table in self.tables.read().values() {
            if let TableData::Dense(chunks) = &table.data {
                cells += chunks.len();
                floats += chunks.values().map(|c| c.read().data.len()).sum::<usize>();
            }
        }
        self.store.working_set_hint(floats as u64 * 4);
        self.image_len
            .store(DenseLog::image_len(cells, floats), Ordering::Relaxed);
    }

    /// A table with every owned dense chunk at its initial value (sparse tables start empty).
    fn new_table(&self, id: u32, spec: TableSpec) -> Table {
        let hash = spec.name.hash64();
        let data = match &spec.kind {
            TableKind::Dense(shape) => TableData::Dense(
                (0..shape.num_chunks())
                    .filter(|&c| self.partitioner.shard_for_chunk(hash, c) == self.cfg.shard_index)
                    .filter_map(|c| {
                        let n = shape.chunk_len(c)?;
                        Some((c, RwLock::new(Cell::fresh(&spec, hash, c, n))))
                    })
                    .collect(),
            ),
            TableKind::Sparse { .. } => {
                TableData::Sparse(DashMap::with_hasher(foldhash::fast::RandomState::default()))
            }
        };
        Table {
            id,
            spec,
            hash,
            data,
            dropped: AtomicBool::new(false),
            counters: TableCounters::default(),
        }
    }

    fn load_cells(&self, table: &Table) -> Result<()> {
        let prefix = table.id.to_be_bytes();
        let dim = table.spec.row_dim();
        let shape = table.spec.dense_shape();
        let cell_len = |index: u64| -> Result<usize, StoreError> {
            match shape {
                Some(s) => s.chunk_len(index).ok_or_else(|| {
                    StoreError::Corrupt(format!("chunk {index} of `{}`", table.spec.name))
                }),
                None => Ok(dim),
            }
        };
        self.store.scan(Cf::Params, &prefix, &mut |k, v| {
            let index = be_u64(&k[4..])?;
            let n = cell_len(index)?;
            match &table.data {
                TableData::Dense(chunks) => {
                    let mut cell = chunks
                        .get(&index)
                        .ok_or_else(|| {
                            StoreError::Corrupt(format!("chunk {index} is not this shard's"))
                        })?
                        .write();
                    read_f32s(v, &mut cell.data[..n])
                }
                TableData::Sparse(rows) => {
                    let mut cell = Cell::fresh(&table.spec, table.hash, index, n);
                    read_f32s(v, &mut cell.data[..n])?;
                    rows.insert(index, cell);
                    Ok(())
                }
            }
        })?;
        self.store.scan(Cf::Optim, &prefix, &mut |k, v| {
            let index = be_u64(&k[4..])?;
            let n = cell_len(index)?;
            let load = |cell: &mut Cell| -> Result<(), StoreError> {
                if v.len() < 8 {
                    return Err(StoreError::Corrupt("optimizer state".into()));
                }
                cell.step = le_u64(&v[..8])?;
                read_f32s(&v[8..], &mut cell.data[n..])
            };
            match &table.data {
                TableData::Dense(chunks) => match chunks.get(&index) {
                    Some(c) => load(&mut c.write()),
                    None => Err(StoreError::Corrupt(format!("state of chunk {index}"))),
                },
                TableData::Sparse(rows) => match rows.get_mut(&index) {
                    Some(mut c) => load(&mut c),
                    None => Err(StoreError::Corrupt(format!(
                        "state of row {index} without its row"
                    ))),
                },
            }
        })?;
        Ok(())
    }

    fn run_writer(&self, mut rx: mpsc::Receiver<Cmd>) {
        while let Some(first) = rx.blocking_recv() {
            let mut pushes = Vec::new();
            let mut bytes = 0;
            let mut next = Some(first);
            // Group every push already queued (up to the byte cap) into one commit; an admin
            // command ends the group and runs on its own after it.
            while let Some(cmd) = next.take() {
                match cmd {
                    Cmd::Push(job, reply) => {
                        bytes += job.bytes();
                        pushes.push((job, reply));
                        if bytes < self.cfg.group_commit_bytes {
                            next = rx.try_recv().ok();
                        }
                    }
                    Cmd::Stop => {
                        self.commit_group(std::mem::take(&mut pushes));
                        // A clean stop leaves nothing to replay at the next start.
                        if let Some(log) = self.log.lock().as_mut()
                            && let Err(e) = self.snapshot(log)
                        {
                            tracing::warn!(error = %e, "no dense snapshot at stop; the next start replays the log");
                        }
                        tracing::info!("writer stopped");
                        return;
                    }
                    admin => {
                        self.commit_group(std::mem::take(&mut pushes));
                        self.run_admin(admin);
                    }
                }
            }
            self.commit_group(pushes);
        }
        tracing::info!("writer stopped");
    }

    fn commit_group(&self, pushes: Vec<(Job, oneshot::Sender<Result<PushOutcome>>)>) {
        if pushes.is_empty() {
            return;
        }
        let t0 = Instant::now();
        let mut batch = self.store.batch();
        let mut log_guard = self.log.lock();
        // The group's dense gradients go to the log, unless they are more than it takes.
        let mut log = match log_guard.as_mut() {
            Some(log) => match self.prepare_log(log, &pushes) {
                Ok(Some(len)) => {
                    log.begin(len);
                    Some(log)
                }
                Ok(None) => None,
                Err(e) => {
                    let e = e.to_string();
                    for (_, reply) in pushes {
                        let _ = reply.send(Err(EngineError::Unavailable(e.clone())));
                    }
                    return;
                }
            },
            None => None,
        };
        let results: Vec<Result<PushOutcome>> = {
            let mut dedup = self.dedup.lock();
            pushes
                .iter()
                .map(|(job, _)| self.apply(job, &mut dedup, &mut batch, log.as_deref_mut()))
                .collect()
        };
        let applied = results
            .iter()
            .filter(|r| matches!(r, Ok(o) if !o.duplicate))
            .count();
        let t1 = Instant::now();
        let mut size = batch.size_bytes();
        // The log record first: the push ids in the batch claim what it holds.
        let logged = match log {
            Some(log) if log.pending() > DenseLog::record_len(0, 0, 0) => {
                log.commit().map_err(|e| self.fail(&e))
            }
            _ => Ok(0),
        };
        drop(log_guard);
        size += logged.as_ref().map_or(0, |&n| n as usize);
        let written = match logged {
            Err(e) => Err(e),
            Ok(n) => {
                self.counters.bytes_written.fetch_add(n, Ordering::Relaxed);
                if applied > 0 {
                    self.write(batch)
                } else {
                    Ok(())
                }
            }
        };
        m::group_commit(pushes.len(), size, t1 - t0, t1.elapsed());
        for ((job, reply), result) in pushes.into_iter().zip(results) {
            let result = match (&written, result) {
                // Nothing of this group is durable, duplicates of its own pushes included.
                (Err(e), Ok(_)) => Err(EngineError::Unavailable(e.clone())),
                (_, r) => r,
            };
            let (table, kind) = match &job {
                Job::Dense(t, _) => (t, "dense"),
                Job::Sparse(t, _) => (t, "sparse"),
            };
            m::push_outcome(table.spec.name.as_str(), kind, &result);
            // The caller may have gone away (its deadline passed); the push is applied anyway
            // and a retry will be recognised as a duplicate.
            let _ = reply.send(result);
        }
    }

    fn write(&self, batch: S::Batch) -> Result<(), String> {
        let size = batch.size_bytes() as u64;
        match self.store.write(batch) {
            Ok(()) => {
                self.counters.write_batches.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .bytes_written
                    .fetch_add(size, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => Err(self.fail(&e)),
        }
    }

    /// Turns the engine read-only after a failed write; returns the reason callers get.
    fn fail(&self, e: &StoreError) -> String {
        let why = format!(
            "a write to the shard's store failed ({e}); the shard is read-only until restarted"
        );
        tracing::error!("{why}");
        *self.failed.lock() = Some(why.clone());
        why
    }

    /// Decides where a group's dense gradients go: the log (with the record's length; after an
    /// image or a snapshot when the record would overwrite live ones), or the store (`None`).
    /// A group larger than the log takes goes to the store after a snapshot, so that the
    /// store's cells never lag the log's records behind a newer direct write.
    fn prepare_log(
        &self,
        log: &mut DenseLog,
        pushes: &[(Job, oneshot::Sender<Result<PushOutcome>>)],
    ) -> Result<Option<u64>> {
        let (mut dense, mut chunks, mut bytes) = (0, 0, 0);
        for (job, _) in pushes {
            if let Job::Dense(table, push) = job {
                let Some(shape) = table.spec.dense_shape() else {
                    continue;
                };
                dense += 1;
                for slice in &push.slices {
                    let (mut offset, mut chunk) = (0, slice.chunk);
                    while offset < slice.values.len() {
                        let Some(n) = shape.chunk_len(chunk) else {
                            break;
                        };
                        offset += n;
                        chunk += 1;
                        chunks += 1;
                    }
                    bytes += slice.values.len() * 4;
                }
            }
        }
        if dense == 0 {
            return Ok(None);
        }
        let len = DenseLog::record_len(dense, chunks, bytes);
        if len > log.max_record() {
            self.snapshot(log)?;
            return Ok(None);
        }
        // Records leave room for the image that frees the log behind them; when there is no
        // more, the image is written (or, when the cells are too many for one, a snapshot).
        let image = self.image_len.load(Ordering::Relaxed);
        let room = if image <= log.max_image() { image } else { 0 };
        if !log.fits(len + room) {
            if room > 0 && log.fits(room) {
                self.write_image(log, image)?;
            }
            if !log.fits(len) {
                self.snapshot(log)?;
            }
        }
        Ok(Some(len))
    }

    fn apply(
        &self,
        job: &Job,
        dedup: &mut Dedup,
        batch: &mut S::Batch,
        log: Option<&mut DenseLog>,
    ) -> Result<PushOutcome> {
        let (table, push_id) = match job {
            Job::Dense(t, p) => (t, &p.push_id),
            Job::Sparse(t, p) => (t, &p.push_id),
        };
        if dedup.seen(push_id) {
            self.counters
                .pushes_duplicate
                .fetch_add(1, Ordering::Relaxed);
            return Ok(PushOutcome {
                duplicate: true,
                ..PushOutcome::default()
            });
        }
        if let Some(why) = self.failed.lock().clone() {
            return Err(EngineError::Unavailable(why));
        }
        if table.dropped.load(Ordering::Acquire) {
            return Err(EngineError::NotFound(format!(
                "table `{}` was dropped while the push was queued",
                table.spec.name
            )));
        }
        let outcome = match job {
            Job::Dense(t, p) => self.apply_dense(t, p, batch, log),
            Job::Sparse(t, p) => self.apply_sparse(t, p, batch),
        };
        dedup.record(push_id, batch);
        self.counters.pushes_applied.fetch_add(1, Ordering::Relaxed);
        table.counters.pushes.fetch_add(1, Ordering::Relaxed);
        table
            .counters
            .values_pushed
            .fetch_add(outcome.applied_values, Ordering::Relaxed);
        Ok(outcome)
    }

    /// Applies a dense push; the updated cells go into `batch`, or, with `log`, the applied
    /// gradients go into the log's record.
    fn apply_dense(
        &self,
        table: &Table,
        push: &PushDense,
        batch: &mut S::Batch,
        mut log: Option<&mut DenseLog>,
    ) -> PushOutcome {
        let mut out = PushOutcome::default();
        let (TableKind::Dense(shape), TableData::Dense(chunks)) = (&table.spec.kind, &table.data)
        else {
            return out; // checked before queueing
        };
        if let Some(log) = log.as_deref_mut() {
            log.push(table.id, &push.push_id);
        }
        let mut grad = Vec::new();
        let mut scratch = Vec::new();
        for slice in &push.slices {
            let mut offset = 0;
            let mut chunk = slice.chunk;
            while offset < slice.values.len() {
                let (Some(n), Some(cell)) = (shape.chunk_len(chunk), chunks.get(&chunk)) else {
                    break; // checked before queueing
                };
                let Some(part) = slice.values.slice(offset, offset + n) else {
                    break; // decoded to f32 and checked before queueing
                };
                offset += n;
                chunk += 1;
                // Under REJECT the push was checked whole before it was queued.
                if table.spec.non_finite == NonFinitePolicy::Skip
                    && part.first_non_finite().is_some()
                {
                    out.skipped_non_finite += 1;
                    continue;
                }
                let mut cell = cell.write();
                match log.as_deref_mut() {
                    // The gradient is applied from the log's copy of it, which is aligned.
                    Some(log) => {
                        let held = log.chunk(chunk - 1, part.data());
                        match bytemuck::try_cast_slice::<u8, f32>(held) {
                            Ok(g) if cfg!(target_endian = "little") => {
                                apply_grad(table, &mut cell, g)
                            }
                            _ => apply_le(table, &mut cell, held, &mut grad),
                        }
                    }
                    None => {
                        grad.resize(n, 0.0);
                        ps_core::payload::read_f32_le(part.data(), &mut grad);
                        self.update_cell(table, chunk - 1, &mut cell, &grad, batch, &mut scratch)
                    }
                }
                out.applied_values += n as u64;
            }
        }
        out
    }

    fn apply_sparse(&self, table: &Table, push: &PushSparse, batch: &mut S::Batch) -> PushOutcome {
        let mut out = PushOutcome::default();
        let TableData::Sparse(rows) = &table.data else {
            return out; // checked before queueing
        };
        let dim = table.spec.row_dim();
        // Decoded to f32 and checked before queueing.
        let mut values = vec![0.0f32; push.values.len()];
        ps_core::payload::read_f32_le(push.values.data(), &mut values);
        // Combine duplicate ids: each row is updated once with the sum of its gradients.
        let mut order: Vec<u64> = Vec::with_capacity(push.ids.len());
        let mut sums: HashMap<u64, usize, foldhash::fast::RandomState> =
            HashMap::with_capacity_and_hasher(
                push.ids.len(),
                foldhash::fast::RandomState::default(),
            );
        let mut combined: Vec<f32> = Vec::with_capacity(values.len());
        for (&id, g) in push.ids.iter().zip(values.chunks_exact(dim)) {
            match sums.get(&id) {
                Some(&slot) => {
                    for (s, v) in combined[slot * dim..(slot + 1) * dim].iter_mut().zip(g) {
                        *s += v;
                    }
                }
                None => {
                    sums.insert(id, order.len());
                    order.push(id);
                    combined.extend_from_slice(g);
                }
            }
        }
        let mut scratch = Vec::new();
        for (&id, g) in order.iter().zip(combined.chunks_exact(dim)) {
            if table.spec.non_finite == NonFinitePolicy::Skip && g.iter().any(|v| !v.is_finite()) {
                out.skipped_non_finite += 1;
                continue;
            }
            let mut cell = rows
                .entry(id)
                .or_insert_with(|| Cell::fresh(&table.spec, table.hash, id, dim));
            self.update_cell(table, id, &mut cell, g, batch, &mut scratch);
            out.applied_values += dim as u64;
        }
        out
    }

    /// Applies `grad` to one cell and puts its parameters and optimizer state in the batch.
    fn update_cell(
        &self,
        table: &Table,
        index: u64,
        cell: &mut Cell,
        grad: &[f32],
        batch: &mut S::Batch,
        scratch: &mut Vec<u8>,
    ) {
        apply_grad(table, cell, grad);
        put_cell(table, index, cell, batch, scratch);
    }

    fn run_admin(&self, cmd: Cmd) {
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
                Some(diff) => Err(EngineError::AlreadyExists(format!(
                    "table `{}` already exists with a different spec ({diff}); drop it first or use \
                     another name",
                    spec.name
                ))),
            };
        }
        if let Some(why) = self.failed.lock().clone() {
            return Err(EngineError::Unavailable(why));
        }
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
        self.write(batch).map_err(EngineError::Unavailable)?;
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
        let table = self.tables.read().get(name).cloned().ok_or_else(|| {
            EngineError::NotFound(format!("table `{name}` does not exist on this shard"))
        })?;
        let mut batch = self.store.batch();
        let (from, to) = (table.id.to_be_bytes(), (table.id + 1).to_be_bytes());
        batch.delete_range(Cf::Params, &from, &to);
        batch.delete_range(Cf::Optim, &from, &to);
        batch.delete(Cf::Meta, &table_key(name));
        self.write(batch).map_err(EngineError::Unavailable)?;
        table.dropped.store(true, Ordering::Release);
        self.tables.write().remove(name);
        self.dense_cells_changed();
        tracing::info!(table = %name, "table dropped");
        Ok(())
    }

    fn checkpoint(&self, name: String) -> Result<CheckpointDone> {
        let dir = self.cfg.checkpoint_dir.as_ref().ok_or_else(|| {
            EngineError::FailedPrecondition(
                "an in-memory shard has no durable state to checkpoint".into(),
            )
        })?;
        let path = dir.join(&name);
        if path.exists() {
            return Err(EngineError::AlreadyExists(format!(
                "checkpoint `{name}` already exists at {}",
                path.display()
            )));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryBatch;

    fn id(client: u64, seq: u64, floor: u64) -> PushId {
        PushId {
            client_id: client,
            seq,
            min_unacked_seq: floor,
        }
    }

    #[test]
    fn dedup_remembers_what_a_client_may_retry_and_forgets_below_its_floor() {
        let mut d = Dedup::default();
        let mut b = MemoryBatch::default();
        d.record(&id(1, 5, 3), &mut b);
        d.record(&id(1, 7, 3), &mut b);
        assert!(d.seen(&id(1, 5, 3)) && d.seen(&id(1, 7, 3)));
        assert!(!d.seen(&id(1, 6, 3)) && !d.seen(&id(2, 5, 3)));
        // Below the floor counts as seen: the client promised never to retry it.
        assert!(d.seen(&id(1, 2, 3)));
        // Raising the floor to 7 drops the record of 5 but keeps 7.
        d.record(&id(1, 8, 7), &mut b);
        let w = &d.clients[&1];
        assert_eq!(w.floor, 7);
        assert_eq!(w.applied.iter().copied().collect::<Vec<_>>(), [7, 8]);
        assert!(d.seen(&id(1, 5, 7)) && d.seen(&id(1, 7, 7)) && !d.seen(&id(1, 9, 7)));
        // A floor that goes backwards (a delayed request) does not lower it.
        d.record(&id(1, 9, 4), &mut b);
        assert_eq!(d.clients[&1].floor, 7);
    }

    #[test]
    fn dedup_keys_sort_by_client_then_seq() {
        assert!(dedup_key(1, u64::MAX) < dedup_key(2, 0));
        assert!(dedup_key(1, 255) < dedup_key(1, 256));
    }
}
