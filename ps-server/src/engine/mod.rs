//! The shard engine: the hot in-memory layer, the single writer with group commit, and
//! exactly-once application of pushes.
//!
//! Every mutation (push, create, drop, checkpoint) is committed by whoever holds the *turn*:
//! the writer thread, or, for a dense push while the writer is idle, the handler that received
//! it (`writer.rs`, [`Inner::commit_inline`]), which commits every such push waiting as one
//! group, exactly as the writer would. The writer takes all
//! queued pushes at once, applies them to the hot layer, appends the gradients it applied
//! (dense chunks, and the rows of sparse tables written back) to the push log
//! ([`crate::push_log`]) as one record, puts the pushes' (client id, seq) (and the rows of
//! sparse tables written through) into one batch, writes the record and then the batch (WAL
//! on), and only then answers the callers: a push is durable before it is acknowledged, and one
//! write serves many concurrent pushes. Reads are served from the hot layer, concurrently with
//! the writer.
//!
//! A write that fails leaves memory ahead of disk, so the engine turns itself read-only
//! (`unavailable` for every later write) until a restart reloads the durable state.
//!
//! Where each part lives:
//! - [`table`]: a table's cells (dense chunks, sparse rows) and counters;
//! - [`routing`]: the shard-map epoch and key ownership checks;
//! - [`validate`]: a push checked and decoded before it is queued;
//! - [`read`]: pulls, and the replicas delta pulls diff against;
//! - [`writer`]: the writer thread, the turn and the combining queue, group commit, applying
//!   pushes;
//! - [`dense`]: room in the push log: images of the dense cells, snapshots into the store;
//! - [`writeback`]: dirty sparse rows written back into the store, oldest first;
//! - [`pending`]: the sparse rows a restart found in the log, brought up to date on demand;
//! - [`recovery`]: loading the store and replaying the push log at start-up;
//! - [`admin`]: create, drop, checkpoint, statistics;
//! - [`admission`], [`eviction`]: a sparse row's life: stored from its N-th push, deleted when
//!   idle past its table's TTL or past its row cap;
//! - [`shard`]: the engine serving now, checkpoints with manifests and restores that swap it;
//! - [`dedup`], [`keys`]: applied push ids and the stored keys.

mod admin;
mod admission;
mod cell;
mod dedup;
mod dense;
mod error;
mod eviction;
mod expiry;
mod export;
mod keys;
mod paging;
mod pending;
mod read;
mod recovery;
mod routing;
mod rows;
mod shard;
mod table;
mod validate;
mod writeback;
mod writer;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use dashmap::DashMap;
use parking_lot::{Mutex, RwLock};
use ps_core::{Partitioner, PushDense, PushSparse, TableName, TableSpec};
use tokio::sync::{Semaphore, SemaphorePermit, mpsc, oneshot};

pub use admin::CheckpointDone;
pub use error::{EngineError, Result};
pub use eviction::Clock;
pub use export::ExportRequest;
pub use read::PulledDense;
pub use routing::MapEpoch;
pub use shard::{Checkpointed, Reopen, Restored, Shard};
pub use table::Table;
pub use validate::Checked;

use crate::body_ring::BodyRing;
use crate::push_log::{PushLog, PushLogOptions};
use crate::store::{Store, StoreError};
use dedup::Dedup;
use read::Replica;

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
    /// How long the writer polls for the next push after a group of at most 64 KiB before it
    /// sleeps (`writer.rs`); zero: it sleeps at once.
    pub writer_spin: std::time::Duration,
    /// Dense pushes of at most this many bytes (and more than 64 KiB while `writer_spin` is
    /// on) are committed by the task that received them when the writer is idle (`writer.rs`,
    /// [`Inner::commit_inline`]); 0: every push goes through the writer thread.
    pub inline_push_bytes: usize,
    /// Most bytes of pushes queued for the writer; callers wait beyond it.
    pub max_queued_bytes: usize,
    /// Most bytes of replicas kept for delta pulls; beyond it chunks are answered whole.
    pub pull_replica_bytes: usize,
    /// Size of the dense-gradient log beside a durable store's database; 0 writes dense
    /// updates into the store instead.
    pub dense_log_bytes: u64,
    /// Size of the ring large dense pushes' bodies are received into, beside the push log
    /// (`body_ring.rs`); 0: none.
    pub dense_body_bytes: u64,
    /// Hot sparse rows are relogged rather than written back when the log needs their room
    /// (`writeback.rs`).
    pub relog_rows: bool,
    /// fdatasync the push log after every record (with the store's own sync).
    pub sync: bool,
    /// The shard-map epoch learnt from the scheduler (0: no scheduler). Shared with the
    /// registration task, and kept across a restore.
    pub map_epoch: Arc<MapEpoch>,
    /// Most bytes the tables' cells may take on this shard: a create or a push that would
    /// pass it is refused, and a stored table that would pass it is not loaded.
    pub memory_budget: u64,
    /// Most bytes of values one pull answers.
    pub max_answer_bytes: u64,
    /// What one job's tables may take on this shard.
    pub job_quota: JobQuota,
    /// Most bytes of sparse rows a durable shard keeps in memory (its cache), out of
    /// `memory_budget`; the store holds every row.
    pub cache_bytes: u64,
    /// The time sparse rows are stamped with and aged by (TTL and row caps).
    pub clock: Clock,
}

/// What one job's tables (named `<job>/...`) may take on a shard; `None`: no limit. Tables
/// without a job are not counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JobQuota {
    pub max_tables: Option<u32>,
    pub max_bytes: Option<u64>,
}

/// What a push did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PushOutcome {
    pub duplicate: bool,
    pub applied_values: u64,
    pub skipped_non_finite: u64,
}

/// A validated push waiting for the writer.
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

    fn table(&self) -> &Arc<Table> {
        match self {
            Job::Dense(t, _) | Job::Sparse(t, _) => t,
        }
    }
}

/// What the writer thread is asked to do.
enum Cmd {
    Push(Job, oneshot::Sender<Result<PushOutcome>>),
    Create(TableSpec, oneshot::Sender<Result<(TableSpec, bool)>>),
    Drop(TableName, oneshot::Sender<Result<()>>),
    Checkpoint(String, oneshot::Sender<Result<CheckpointDone>>),
    /// Evict the sparse rows due (sent by a ticker so that an idle shard evicts too).
    EvictRows,
    /// Finish what came before, then stop the writer.
    Stop,
}

/// Counters for `GetStats`.
#[derive(Debug, Default)]
struct Counters {
    pushes_applied: AtomicU64,
    pushes_duplicate: AtomicU64,
    write_batches: AtomicU64,
    bytes_written: AtomicU64,
}

/// The state shared by the request handlers and the writer thread.
struct Inner<S: Store> {
    store: S,
    cfg: EngineConfig,
    partitioner: Partitioner,
    tables: RwLock<HashMap<TableName, Arc<Table>>>,
    next_table_id: Mutex<u32>,
    dedup: Mutex<Dedup>,
    counters: Counters,
    /// Set when a write failed (the cause): memory may be ahead of disk.
    failed: Mutex<Option<String>>,
    started: Instant,
    /// What each client was sent of each chunk by delta pulls: (client, table id, chunk).
    replicas: DashMap<(u64, u32, u64), Replica, foldhash::fast::RandomState>,
    replica_bytes: AtomicU64,
    /// The dense-gradient log (durable stores only); used by the writer alone.
    log: Mutex<Option<PushLog>>,
    /// The ring the bulk stream receives large dense pushes' bodies into (the log's too).
    bodies: Option<Arc<BodyRing>>,
    /// Bytes of a push-log image of every dense cell ([`PushLog::image_len`]).
    image_len: AtomicU64,
    /// Bytes the loaded tables' cells take ([`Table::memory_bytes`] summed), within
    /// `cfg.memory_budget`.
    memory_used: AtomicU64,
    /// Tables found in the store that could not be loaded, and why.
    unloaded: RwLock<HashMap<TableName, Unloaded>>,
    /// The sparse-row cache's budget and counters.
    cache: rows::Cache,
    /// The dirty sparse rows, oldest first (`writeback.rs`); used by the writer alone.
    writeback: Mutex<writeback::WriteBack>,
    /// Sparse rows in memory whose latest updates the store lacks.
    dirty_rows: AtomicU64,
    /// The sparse rows a restart found updates of in the log, not yet applied (`pending.rs`).
    pending: pending::Pending,
    /// Held by whoever commits pushes: the writer thread, or a connection committing the
    /// combining queue's pushes ([`Inner::commit_inline`]).
    turn: Mutex<writer::Turn>,
    /// Dense pushes waiting for whoever holds the turn, or takes it next, to commit them.
    combining: Mutex<Vec<writer::Queued>>,
}

/// A stored table the shard did not load at start-up: calls on it are refused until it is
/// dropped (its cells stay in the store, complete).
#[derive(Debug)]
struct Unloaded {
    /// The table without its cells, for its id and spec.
    table: Table,
    cause: String,
}

impl<S: Store> Inner<S> {
    /// Refuses a write once a write has failed.
    fn check_writable(&self) -> Result<()> {
        match self.failed.lock().clone() {
            Some(cause) => Err(EngineError::ReadOnly { cause }),
            None => Ok(()),
        }
    }
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
        let mut log = match store.location() {
            Some(db) if cfg.dense_log_bytes > 0 => Some(PushLog::open(&PushLogOptions {
                path: crate::push_log::path_for(db),
                capacity: cfg.dense_log_bytes,
                sync: cfg.sync,
            })?),
            _ => None,
        };
        let bodies = match (&mut log, store.location()) {
            (Some(log), Some(db)) if cfg.dense_body_bytes > 0 => {
                let ring = BodyRing::open(&crate::push_log::path_for(db), cfg.dense_body_bytes)
                    .map_err(StoreError::Io)?;
                log.set_bodies(ring.clone());
                ring
            }
            _ => None,
        };
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
            log: Mutex::new(log),
            bodies,
            image_len: AtomicU64::new(0),
            memory_used: AtomicU64::new(0),
            unloaded: RwLock::new(HashMap::new()),
            cache: rows::Cache::new(store.durable().then_some(cfg.cache_bytes)),
            writeback: Mutex::new(writeback::WriteBack::default()),
            dirty_rows: AtomicU64::new(0),
            pending: pending::Pending::default(),
            turn: Mutex::new(writer::Turn::default()),
            combining: Mutex::new(Vec::new()),
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
        if inner.store.durable() {
            expiry::start_ticker(&tx).map_err(StoreError::Io)?;
        }
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

    /// The ring a dense push's body of at least [`crate::body_ring::MIN_BODY`] bytes is
    /// received into, when the shard has one (durable, with a push log).
    pub fn body_ring(&self) -> Option<&Arc<BodyRing>> {
        self.inner.bodies.as_ref()
    }

    /// The table named `name`; `not_found`, or the reason it was not loaded.
    pub fn table(&self, name: &TableName) -> Result<Arc<Table>> {
        if let Some(t) = self.inner.tables.read().get(name) {
            return Ok(t.clone());
        }
        Err(self.inner.missing(name))
    }

    /// Every table stored on this shard, loaded or not.
    pub fn list_tables(&self) -> Vec<TableSpec> {
        let mut v: Vec<TableSpec> = self
            .inner
            .tables
            .read()
            .values()
            .map(|t| t.spec.clone())
            .chain(
                self.inner
                    .unloaded
                    .read()
                    .values()
                    .map(|u| u.table.spec.clone()),
            )
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// Hands a command to the writer and waits for its answer.
    async fn submit<T>(&self, make: impl FnOnce(oneshot::Sender<Result<T>>) -> Cmd) -> Result<T> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(make(reply))
            .await
            .map_err(|_| EngineError::ShuttingDown)?;
        rx.await.map_err(|_| EngineError::ShuttingDown)?
    }

    /// Waits for `bytes` of the queue's budget for a push that decodes to `bytes` of f32,
    /// before it is decoded: the pushes being decoded and queued never hold more than
    /// `max_queued_bytes` between them, and one that alone would is refused.
    async fn reserve(&self, what: &str, bytes: u64) -> Result<SemaphorePermit<'_>> {
        self.inner.check_writable()?;
        let max = self.inner.cfg.max_queued_bytes as u64;
        if bytes > max {
            return Err(EngineError::OverLimit {
                what: format!("{what}, decoded to f32,"),
                limit_name: "push queue's budget",
                needed: bytes,
                limit: max,
                hint: "push fewer values per call",
            });
        }
        let units = (bytes as usize / BUDGET_UNIT).clamp(1, (max as usize / BUDGET_UNIT).max(1));
        self.queue_budget
            .acquire_many(u32::try_from(units).unwrap_or(u32::MAX))
            .await
            .map_err(|_| EngineError::ShuttingDown)
    }

    /// Commits a validated push, holding its share of the queue's budget: on this thread when
    /// the writer is idle and the push qualifies ([`Inner::commit_inline`]), else by the
    /// writer.
    async fn push(&self, job: Job, _reserved: SemaphorePermit<'_>) -> Result<PushOutcome> {
        self.inner.check_writable()?;
        let cfg = &self.inner.cfg;
        let bytes = job.bytes();
        // A small push is quicker through a writer kept awake by `writer_spin`: on a virtual
        // machine the spinning thread also keeps a core from halting, which the push's own
        // wake-ups would otherwise pay for (the 1 K-float pair's median doubled without it).
        let small = bytes <= writer::SMALL_GROUP_BYTES && !cfg.writer_spin.is_zero();
        let inline = matches!(job, Job::Dense(..))
            && !small
            && bytes <= cfg.inline_push_bytes
            && !cfg.sync
            && self.tx.capacity() == self.tx.max_capacity();
        if !inline {
            return self.submit(|r| Cmd::Push(job, r)).await;
        }
        let (reply, answer) = oneshot::channel();
        let for_writer = self.inner.commit_inline(job, reply);
        if !for_writer.is_empty() {
            // Their record needs room freed first: the writer's work. They may be other
            // callers' pushes, so they are sent from a task of their own, which this call's
            // cancellation does not drop. If the writer has stopped, a reply is dropped and its
            // answer is `ShuttingDown`.
            let tx = self.tx.clone();
            tokio::spawn(async move {
                for (job, reply) in for_writer {
                    let _ = tx.send(Cmd::Push(job, reply)).await;
                }
            });
        }
        answer.await.map_err(|_| EngineError::ShuttingDown)?
    }
}

impl<S: Store> Inner<S> {
    /// Why `name` is not among the loaded tables.
    fn missing(&self, name: &TableName) -> EngineError {
        match self.unloaded.read().get(name) {
            Some(u) => EngineError::TableNotLoaded {
                table: name.clone(),
                cause: u.cause.clone(),
            },
            None => EngineError::NoSuchTable {
                table: name.clone(),
            },
        }
    }

    /// Refuses a new table (`new_table`) or `needed` more bytes for `table`'s job when its quota
    /// has no room.
    fn check_job_quota(&self, table: &TableName, new_table: bool, needed: u64) -> Result<()> {
        let quota = self.cfg.job_quota;
        if quota == JobQuota::default() {
            return Ok(());
        }
        let Some((job, _)) = table.as_str().split_once('/') else {
            return Ok(());
        };
        let prefix = format!("{job}/");
        let (count, bytes) = self
            .tables
            .read()
            .values()
            .filter(|t| t.spec.name.as_str().starts_with(&prefix))
            .fold((0u64, 0u64), |(n, b), t| (n + 1, b + t.held_bytes()));
        let over = |limit_name, needed, limit| EngineError::OverLimit {
            what: format!("job `{job}` on this shard (table `{table}`)"),
            limit_name,
            needed,
            limit,
            hint: "drop the job's tables, or raise --job-max-tables / --job-max-bytes",
        };
        if new_table
            && let Some(max) = quota.max_tables
            && count + 1 > u64::from(max)
        {
            return Err(over("job's table quota", count + 1, u64::from(max)));
        }
        if let Some(max) = quota.max_bytes
            && bytes + needed > max
        {
            return Err(over("job's byte quota", bytes + needed, max));
        }
        Ok(())
    }

    /// Refuses `needed` more bytes of cells for `what` when the memory budget (less the
    /// sparse-row cache's share) has no room.
    fn check_memory(&self, what: impl FnOnce() -> String, needed: u64) -> Result<()> {
        let used = self.memory_used.load(std::sync::atomic::Ordering::Relaxed);
        let budget = self
            .cfg
            .memory_budget
            .saturating_sub(self.cache.budget.unwrap_or(0));
        let left = budget.saturating_sub(used);
        if needed > left {
            return Err(EngineError::OverLimit {
                what: what(),
                limit_name: "shard's memory budget left",
                needed,
                limit: left,
                hint: "drop tables, add shards, or raise --memory-budget-bytes",
            });
        }
        Ok(())
    }
}
