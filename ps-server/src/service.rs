//! The gRPC edge: converts wire messages into domain types (validating them), calls the engine,
//! and maps every error to one status code. Nothing past this file sees prost types.

use std::time::{SystemTime, UNIX_EPOCH};

use ps_core::{PullDense, PullSparse, PushDense, PushSparse, TableName, TableSpec};
use ps_proto::v1 as pb;
use ps_proto::v1::parameter_server_server::ParameterServer;
use tonic::{Request, Response, Status};
use tracing::instrument;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use crate::checkpoint::{self, Manifest};
use crate::engine::{Engine, EngineError, PushOutcome};
use crate::metrics as m;
use crate::store::{Store, StoreError};

impl From<EngineError> for Status {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::InvalidArgument(m) => Status::invalid_argument(m),
            EngineError::NotFound(m) => Status::not_found(m),
            EngineError::AlreadyExists(m) => Status::already_exists(m),
            EngineError::OutOfRange(m) => Status::out_of_range(m),
            EngineError::FailedPrecondition(m) => Status::failed_precondition(m),
            EngineError::Unavailable(m) => Status::unavailable(m),
            EngineError::Store(e) => Status::internal(format!("storage error: {e}")),
        }
    }
}

/// The shard's engine; a restore replaces it while the service runs.
pub type EngineSlot<S> = Arc<RwLock<Engine<S>>>;

/// Opens a store at a RocksDB directory (after a restore).
pub type Reopen<S> = Arc<dyn Fn(&Path) -> Result<S, StoreError> + Send + Sync>;

/// The `ps.v1.ParameterServer` service of one shard.
pub struct PsService<S: Store> {
    slot: EngineSlot<S>,
    max_request_bytes: usize,
    /// The bulk stream's port, advertised by `ShardInfo`; 0 when it has none.
    bulk_port: u16,
    /// Calls answered on the bulk stream.
    bulk_calls: AtomicU64,
    /// The data directory and how to open a store in it; `None` in the in-memory mode.
    restore: Option<(PathBuf, Reopen<S>)>,
    restoring: Arc<tokio::sync::Mutex<()>>,
}

impl<S: Store> std::fmt::Debug for PsService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PsService")
            .field("engine", &*self.slot.read())
            .finish_non_exhaustive()
    }
}

impl<S: Store> PsService<S> {
    pub fn new(slot: EngineSlot<S>, max_request_bytes: usize) -> Self {
        Self {
            slot,
            max_request_bytes,
            bulk_port: 0,
            bulk_calls: AtomicU64::new(0),
            restore: None,
            restoring: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// Advertises the bulk stream listening on `port` (of the gRPC endpoint's host).
    pub fn with_bulk_port(mut self, port: u16) -> Self {
        self.bulk_port = port;
        self
    }

    /// Counts a call answered on the bulk stream.
    pub(crate) fn bulk_call(&self) {
        self.bulk_calls.fetch_add(1, Ordering::Relaxed);
    }

    /// Enables `RestoreCheckpoint`: checkpoints are installed as new generations of `data_dir`
    /// and opened with `reopen`.
    pub fn with_restore(mut self, data_dir: PathBuf, reopen: Reopen<S>) -> Self {
        self.restore = Some((data_dir, reopen));
        self
    }

    /// The engine serving requests now.
    fn engine(&self) -> Engine<S> {
        self.slot.read().clone()
    }
}

/// Counts a refused request and converts the error.
fn refuse(method: &'static str, e: impl Into<Status>) -> Status {
    let s: Status = e.into();
    m::request_error(method, s.code());
    tracing::debug!(method, code = ?s.code(), message = s.message(), "request refused");
    s
}

fn push_response(o: PushOutcome) -> Response<pb::PushResponse> {
    Response::new(pb::PushResponse {
        duplicate: o.duplicate,
        applied_values: o.applied_values,
        skipped_non_finite: o.skipped_non_finite,
    })
}

fn checkpoint_name(requested: String) -> Result<String, Status> {
    if requested.is_empty() {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        return Ok(format!("ckpt-{ms}"));
    }
    if requested.len() > 64
        || !requested
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        || requested.starts_with('.')
    {
        return Err(Status::invalid_argument(format!(
            "checkpoint name `{requested}` must be 1 to 64 characters of [A-Za-z0-9_.-], not starting with `.`"
        )));
    }
    Ok(requested)
}

#[tonic::async_trait]
impl<S: Store> ParameterServer for PsService<S> {
    async fn shard_info(
        &self,
        _: Request<pb::ShardInfoRequest>,
    ) -> Result<Response<pb::ShardInfoResponse>, Status> {
        let engine = self.engine();
        let cfg = engine.config();
        Ok(Response::new(pb::ShardInfoResponse {
            shard_index: cfg.shard_index,
            num_shards: cfg.num_shards,
            virtual_nodes: cfg.virtual_nodes,
            map_epoch: engine.map_epoch(),
            server_version: env!("CARGO_PKG_VERSION").to_owned(),
            max_request_bytes: self.max_request_bytes as u64,
            durable: engine.durable(),
            bulk_port: u32::from(self.bulk_port),
        }))
    }

    #[instrument(skip_all, fields(table))]
    async fn create_table(
        &self,
        req: Request<pb::CreateTableRequest>,
    ) -> Result<Response<pb::CreateTableResponse>, Status> {
        const M: &str = "CreateTable";
        let spec = req
            .into_inner()
            .spec
            .ok_or_else(|| refuse(M, Status::invalid_argument("`spec` is required")))?;
        let spec = TableSpec::try_from(spec).map_err(|e| refuse(M, e))?;
        tracing::Span::current().record("table", spec.name.as_str());
        let (spec, created) = self
            .engine()
            .create_table(spec)
            .await
            .map_err(|e| refuse(M, e))?;
        Ok(Response::new(pb::CreateTableResponse {
            spec: Some((&spec).into()),
            created,
        }))
    }

    async fn describe_table(
        &self,
        req: Request<pb::DescribeTableRequest>,
    ) -> Result<Response<pb::DescribeTableResponse>, Status> {
        const M: &str = "DescribeTable";
        let name = TableName::try_from(req.into_inner().name).map_err(|e| refuse(M, e))?;
        let table = self.engine().table(&name).map_err(|e| refuse(M, e))?;
        Ok(Response::new(pb::DescribeTableResponse {
            spec: Some(table.spec().into()),
            stats: Some(table_stats(table.stats())),
        }))
    }

    async fn list_tables(
        &self,
        _: Request<pb::ListTablesRequest>,
    ) -> Result<Response<pb::ListTablesResponse>, Status> {
        Ok(Response::new(pb::ListTablesResponse {
            tables: self.engine().list_tables().iter().map(Into::into).collect(),
        }))
    }

    #[instrument(skip_all, fields(table))]
    async fn drop_table(
        &self,
        req: Request<pb::DropTableRequest>,
    ) -> Result<Response<pb::DropTableResponse>, Status> {
        const M: &str = "DropTable";
        let name = TableName::try_from(req.into_inner().name).map_err(|e| refuse(M, e))?;
        tracing::Span::current().record("table", name.as_str());
        self.engine()
            .drop_table(name)
            .await
            .map_err(|e| refuse(M, e))?;
        Ok(Response::new(pb::DropTableResponse {}))
    }

    #[instrument(skip_all, fields(table, client, seq))]
    async fn push_dense(
        &self,
        req: Request<pb::PushDenseRequest>,
    ) -> Result<Response<pb::PushResponse>, Status> {
        const M: &str = "PushDense";
        let req = PushDense::try_from(req.into_inner()).map_err(|e| refuse(M, e))?;
        let span = tracing::Span::current();
        span.record("table", req.table.as_str());
        span.record("client", req.push_id.client_id);
        span.record("seq", req.push_id.seq);
        let outcome = self
            .engine()
            .push_dense(req)
            .await
            .map_err(|e| refuse(M, e))?;
        Ok(push_response(outcome))
    }

    async fn pull_dense(
        &self,
        req: Request<pb::PullDenseRequest>,
    ) -> Result<Response<pb::PullDenseResponse>, Status> {
        const M: &str = "PullDense";
        let req = PullDense::try_from(req.into_inner()).map_err(|e| refuse(M, e))?;
        let pulled = self.engine().pull_dense(&req).map_err(|e| refuse(M, e))?;
        Ok(Response::new(pb::PullDenseResponse {
            slices: pulled.slices.into_iter().map(Into::into).collect(),
            is_delta: pulled.delta.iter().map(|d| d.0).collect(),
            versions: pulled.delta.iter().map(|d| d.1).collect(),
        }))
    }

    #[instrument(skip_all, fields(table, client, seq, ids))]
    async fn push_sparse(
        &self,
        req: Request<pb::PushSparseRequest>,
    ) -> Result<Response<pb::PushResponse>, Status> {
        const M: &str = "PushSparse";
        let req = PushSparse::try_from(req.into_inner()).map_err(|e| refuse(M, e))?;
        let span = tracing::Span::current();
        span.record("table", req.table.as_str());
        span.record("client", req.push_id.client_id);
        span.record("seq", req.push_id.seq);
        span.record("ids", req.ids.len());
        let outcome = self
            .engine()
            .push_sparse(req)
            .await
            .map_err(|e| refuse(M, e))?;
        Ok(push_response(outcome))
    }

    async fn pull_sparse(
        &self,
        req: Request<pb::PullSparseRequest>,
    ) -> Result<Response<pb::PullSparseResponse>, Status> {
        const M: &str = "PullSparse";
        let req = PullSparse::try_from(req.into_inner()).map_err(|e| refuse(M, e))?;
        let values = self.engine().pull_sparse(&req).map_err(|e| refuse(M, e))?;
        Ok(Response::new(pb::PullSparseResponse {
            values: Some(values.into()),
        }))
    }

    #[instrument(skip_all, fields(name))]
    async fn checkpoint(
        &self,
        req: Request<pb::CheckpointRequest>,
    ) -> Result<Response<pb::CheckpointResponse>, Status> {
        const M: &str = "Checkpoint";
        let name = checkpoint_name(req.into_inner().name).map_err(|e| refuse(M, e))?;
        tracing::Span::current().record("name", name.as_str());
        let done = self
            .engine()
            .checkpoint(name)
            .await
            .map_err(|e| refuse(M, e))?;
        let engine = self.engine();
        let cfg = engine.config();
        let manifest = Manifest {
            format: 1,
            name: done.name.clone(),
            shard_index: cfg.shard_index,
            num_shards: cfg.num_shards,
            sequence: done.sequence,
            created_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            tables: self
                .engine()
                .list_tables()
                .into_iter()
                .map(|t| t.name.to_string())
                .collect(),
            files: Vec::new(),
        };
        // Checksumming reads every file: off the runtime, and off the writer thread.
        let dir = done.path.clone();
        let manifest =
            tokio::task::spawn_blocking(move || checkpoint::write_manifest(&dir, manifest))
                .await
                .map_err(|e| refuse(M, Status::internal(format!("manifest task: {e}"))))?
                .map_err(|e| refuse(M, Status::internal(format!("writing the manifest: {e}"))))?;
        tracing::info!(name = %done.name, files = manifest.files.len(), bytes = manifest.total_bytes(), "checkpoint written");
        Ok(Response::new(pb::CheckpointResponse {
            name: done.name,
            path: done.path.display().to_string(),
            files: manifest.files.len() as u64,
            bytes: manifest.total_bytes(),
            sequence: done.sequence,
        }))
    }

    #[instrument(skip_all, fields(name))]
    async fn restore_checkpoint(
        &self,
        req: Request<pb::RestoreCheckpointRequest>,
    ) -> Result<Response<pb::RestoreCheckpointResponse>, Status> {
        const M: &str = "RestoreCheckpoint";
        let name = req.into_inner().name;
        if name.is_empty() {
            return Err(refuse(
                M,
                Status::invalid_argument("`name` is empty; name the checkpoint"),
            ));
        }
        let name = checkpoint_name(name).map_err(|e| refuse(M, e))?;
        tracing::Span::current().record("name", name.as_str());
        let Some((data_dir, reopen)) = self.restore.clone() else {
            return Err(refuse(
                M,
                Status::failed_precondition("this shard runs in memory and has no checkpoints"),
            ));
        };
        let engine = self.engine();
        let Some(ckpt_root) = engine.config().checkpoint_dir.clone() else {
            return Err(refuse(
                M,
                Status::failed_precondition("this shard keeps no checkpoints"),
            ));
        };
        let ckpt = ckpt_root.join(&name);
        if !ckpt.is_dir() {
            return Err(refuse(
                M,
                Status::not_found(format!("this shard has no checkpoint named `{name}`")),
            ));
        }
        // One restore at a time; requests keep being served by the old engine until the swap.
        let _one = self.restoring.lock().await;
        let cfg = engine.config().clone();
        drop(engine);
        let opened = tokio::task::spawn_blocking(move || {
            let (db, manifest) = checkpoint::install_generation(&ckpt, &data_dir)?;
            let store = reopen(&db)?;
            let engine = Engine::open(store, cfg)?;
            anyhow::Ok((engine, manifest))
        })
        .await
        .map_err(|e| refuse(M, Status::internal(format!("restore task: {e}"))))?
        .map_err(|e| refuse(M, Status::internal(format!("restoring `{name}`: {e:#}"))))?;
        let (fresh, manifest) = opened;
        let old = std::mem::replace(&mut *self.slot.write(), fresh);
        // Drains the old writer; its store closes when the last in-flight request drops it.
        tokio::task::spawn_blocking(move || old.close())
            .await
            .map_err(|e| refuse(M, Status::internal(format!("closing the old engine: {e}"))))?;
        tracing::warn!(
            name,
            sequence = manifest.sequence,
            "shard state replaced by a checkpoint"
        );
        Ok(Response::new(pb::RestoreCheckpointResponse {
            files: manifest.files.len() as u64,
            bytes: manifest.total_bytes(),
            sequence: manifest.sequence,
        }))
    }

    async fn get_stats(
        &self,
        _: Request<pb::GetStatsRequest>,
    ) -> Result<Response<pb::GetStatsResponse>, Status> {
        let engine = self.engine();
        let cfg = engine.config();
        let s = engine.stats();
        Ok(Response::new(pb::GetStatsResponse {
            shard_index: cfg.shard_index,
            num_shards: cfg.num_shards,
            uptime_ms: s.uptime_ms,
            pushes_applied: s.pushes_applied,
            pushes_duplicate: s.pushes_duplicate,
            write_batches: s.write_batches,
            bytes_written: s.bytes_written,
            live_data_bytes: s.live_data_bytes,
            tables: s.tables.into_iter().map(table_stats).collect(),
            bulk_calls: self.bulk_calls.load(Ordering::Relaxed),
        }))
    }
}

fn table_stats(t: crate::engine::TableStatsView) -> pb::TableStats {
    pb::TableStats {
        name: t.name,
        rows: t.rows,
        pushes: t.pushes,
        pulls: t.pulls,
        values_pushed: t.values_pushed,
        values_pulled: t.values_pulled,
    }
}
