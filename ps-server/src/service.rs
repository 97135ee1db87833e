//! The gRPC edge: converts wire messages into domain types (validating them), calls the engine,
//! and answers every error through the one mapping in `status.rs`. Nothing past this file sees
//! prost types.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ps_core::status::ShardStats;
use ps_core::{PullDense, PullSparse, PushDense, PushSparse, TableName, TableSpec};
use ps_proto::v1 as pb;
use ps_proto::v1::parameter_server_server::ParameterServer;
use tonic::{Request, Response, Status};
use tracing::instrument;

use ps_runtime::auth::Caller;

use crate::engine::{Checked, Engine, EngineError, ExportRequest, PushOutcome, Shard};
use crate::metrics as m;
use crate::store::Store;

/// The `ps.v1.ParameterServer` service of one shard.
pub struct PsService<S: Store> {
    shard: Arc<Shard<S>>,
    max_request_bytes: usize,
    /// The bulk stream's port, advertised by `ShardInfo`; 0 when it has none.
    bulk_port: u16,
    /// Calls answered on the bulk stream.
    bulk_calls: AtomicU64,
}

impl<S: Store> std::fmt::Debug for PsService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PsService")
            .field("shard", &self.shard)
            .finish_non_exhaustive()
    }
}

impl<S: Store> PsService<S> {
    pub fn new(shard: Arc<Shard<S>>, max_request_bytes: usize) -> Self {
        Self {
            shard,
            max_request_bytes,
            bulk_port: 0,
            bulk_calls: AtomicU64::new(0),
        }
    }

    /// Advertises the bulk stream listening on `port` (of the gRPC endpoint's host).
    pub fn with_bulk_port(mut self, port: u16) -> Self {
        self.bulk_port = port;
        self
    }

    /// The ring the bulk stream receives large dense pushes' bodies into, when the shard's
    /// engine has one now (it may be replaced by a restore).
    pub fn body_ring(&self) -> Option<Arc<crate::body_ring::BodyRing>> {
        self.shard.engine().body_ring().cloned()
    }

    /// Counts a call answered on the bulk stream.
    pub(crate) fn bulk_call(&self) {
        self.bulk_calls.fetch_add(1, Ordering::Relaxed);
    }

    /// The engine serving requests now.
    fn engine(&self) -> Engine<S> {
        self.shard.engine()
    }
}

/// Counts a refused request and converts the error.
fn refuse(method: &'static str, e: impl Into<EngineError>) -> Status {
    let s: Status = e.into().into();
    m::request_error(method, s.code());
    tracing::debug!(method, code = ?s.code(), message = s.message(), "request refused");
    s
}

/// Refuses a caller who may not touch `table` (one of another job), counted as the method's
/// refusal.
fn check_table(method: &'static str, caller: &Caller, table: &str) -> Result<(), Status> {
    caller
        .may_touch_table(table)
        .inspect_err(|s| m::request_error(method, s.code()))
}

/// Refuses a caller limited to some jobs: the method spans every job's tables.
fn check_cluster_wide(method: &'static str, caller: &Caller) -> Result<(), Status> {
    caller
        .cluster_wide(&format!("{method}, which spans every job's tables,"))
        .inspect_err(|s| m::request_error(method, s.code()))
}

/// Most tables one export may name.
const MAX_EXPORT_TABLES: usize = 4096;

fn push_response(o: PushOutcome) -> Response<pb::PushResponse> {
    Response::new(pb::PushResponse {
        duplicate: o.duplicate,
        applied_values: o.applied_values,
        skipped_non_finite: o.skipped_non_finite,
    })
}

#[tonic::async_trait]
impl<S: Store> ParameterServer for PsService<S> {
    type ExportCheckpointStream =
        tokio_stream::wrappers::ReceiverStream<Result<pb::ExportPart, Status>>;

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
            cache_budget_bytes: engine.cache_budget(),
        }))
    }

    #[instrument(skip_all, fields(table))]
    async fn create_table(
        &self,
        req: Request<pb::CreateTableRequest>,
    ) -> Result<Response<pb::CreateTableResponse>, Status> {
        const M: &str = "CreateTable";
        let caller = Caller::of(&req);
        let spec = req
            .into_inner()
            .spec
            .ok_or_else(|| refuse(M, ps_core::ValidationError::new("spec", "is required")))?;
        let spec = TableSpec::try_from(spec).map_err(|e| refuse(M, e))?;
        check_table(M, &caller, spec.name.as_str())?;
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
        let caller = Caller::of(&req);
        let name = TableName::try_from(req.into_inner().name).map_err(|e| refuse(M, e))?;
        check_table(M, &caller, name.as_str())?;
        let table = self.engine().table(&name).map_err(|e| refuse(M, e))?;
        Ok(Response::new(pb::DescribeTableResponse {
            spec: Some(table.spec().into()),
            stats: Some(table.stats().into()),
        }))
    }

    async fn list_tables(
        &self,
        req: Request<pb::ListTablesRequest>,
    ) -> Result<Response<pb::ListTablesResponse>, Status> {
        // A caller limited to some jobs sees their tables only.
        let caller = Caller::of(&req);
        Ok(Response::new(pb::ListTablesResponse {
            tables: self
                .engine()
                .list_tables()
                .iter()
                .filter(|t| caller.may_touch_table(t.name.as_str()).is_ok())
                .map(Into::into)
                .collect(),
        }))
    }

    #[instrument(skip_all, fields(table))]
    async fn drop_table(
        &self,
        req: Request<pb::DropTableRequest>,
    ) -> Result<Response<pb::DropTableResponse>, Status> {
        const M: &str = "DropTable";
        let caller = Caller::of(&req);
        let name = TableName::try_from(req.into_inner().name).map_err(|e| refuse(M, e))?;
        check_table(M, &caller, name.as_str())?;
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
        let caller = Caller::of(&req);
        let checked = checked_of(&req);
        let mut req = PushDense::try_from(req.into_inner()).map_err(|e| refuse(M, e))?;
        check_table(M, &caller, req.table.as_str())?;
        req.push_id.client_id = caller.own_id(req.push_id.client_id);
        let span = tracing::Span::current();
        span.record("table", req.table.as_str());
        span.record("client", req.push_id.client_id);
        span.record("seq", req.push_id.seq);
        let outcome = self
            .engine()
            .push_dense(req, checked)
            .await
            .map_err(|e| refuse(M, e))?;
        Ok(push_response(outcome))
    }

    async fn pull_dense(
        &self,
        req: Request<pb::PullDenseRequest>,
    ) -> Result<Response<pb::PullDenseResponse>, Status> {
        const M: &str = "PullDense";
        let caller = Caller::of(&req);
        let mut req = PullDense::try_from(req.into_inner()).map_err(|e| refuse(M, e))?;
        check_table(M, &caller, req.table.as_str())?;
        if let Some(d) = &mut req.delta {
            d.client_id = caller.own_id(d.client_id);
        }
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
        let caller = Caller::of(&req);
        let checked = checked_of(&req);
        let mut req = PushSparse::try_from(req.into_inner()).map_err(|e| refuse(M, e))?;
        check_table(M, &caller, req.table.as_str())?;
        req.push_id.client_id = caller.own_id(req.push_id.client_id);
        let span = tracing::Span::current();
        span.record("table", req.table.as_str());
        span.record("client", req.push_id.client_id);
        span.record("seq", req.push_id.seq);
        span.record("ids", req.ids.len());
        let outcome = self
            .engine()
            .push_sparse(req, checked)
            .await
            .map_err(|e| refuse(M, e))?;
        Ok(push_response(outcome))
    }

    async fn pull_sparse(
        &self,
        req: Request<pb::PullSparseRequest>,
    ) -> Result<Response<pb::PullSparseResponse>, Status> {
        const M: &str = "PullSparse";
        let caller = Caller::of(&req);
        let req = PullSparse::try_from(req.into_inner()).map_err(|e| refuse(M, e))?;
        check_table(M, &caller, req.table.as_str())?;
        for a in &req.also {
            check_table(M, &caller, a.table.as_str())?;
        }
        let mut answers = self
            .engine()
            .pull_sparse(&req)
            .map_err(|e| refuse(M, e))?
            .into_iter()
            .map(|(values, unchanged)| pb::PullSparseAnswer {
                values: Some(values.into()),
                unchanged: unchanged.mask,
            });
        let first = answers.next().unwrap_or_default();
        Ok(Response::new(pb::PullSparseResponse {
            values: first.values,
            unchanged: first.unchanged,
            also: answers.collect(),
        }))
    }

    #[instrument(skip_all, fields(name))]
    async fn checkpoint(
        &self,
        req: Request<pb::CheckpointRequest>,
    ) -> Result<Response<pb::CheckpointResponse>, Status> {
        const M: &str = "Checkpoint";
        check_cluster_wide(M, &Caller::of(&req))?;
        let done = self
            .shard
            .checkpoint(req.into_inner().name)
            .await
            .map_err(|e| refuse(M, e))?;
        tracing::Span::current().record("name", done.name.as_str());
        Ok(Response::new(pb::CheckpointResponse {
            name: done.name,
            path: done.path.display().to_string(),
            files: done.files,
            bytes: done.bytes,
            sequence: done.sequence,
        }))
    }

    #[instrument(skip_all, fields(name))]
    async fn restore_checkpoint(
        &self,
        req: Request<pb::RestoreCheckpointRequest>,
    ) -> Result<Response<pb::RestoreCheckpointResponse>, Status> {
        const M: &str = "RestoreCheckpoint";
        check_cluster_wide(M, &Caller::of(&req))?;
        let name = req.into_inner().name;
        tracing::Span::current().record("name", name.as_str());
        let done = self.shard.restore(name).await.map_err(|e| refuse(M, e))?;
        Ok(Response::new(pb::RestoreCheckpointResponse {
            files: done.files,
            bytes: done.bytes,
            sequence: done.sequence,
        }))
    }

    #[instrument(skip_all, fields(name))]
    async fn export_checkpoint(
        &self,
        req: Request<pb::ExportCheckpointRequest>,
    ) -> Result<Response<Self::ExportCheckpointStream>, Status> {
        const M: &str = "ExportCheckpoint";
        let caller = Caller::of(&req);
        let r = req.into_inner();
        tracing::Span::current().record("name", r.checkpoint.as_str());
        let invalid = |message: String| {
            refuse(
                M,
                EngineError::Invalid(ps_core::ValidationError::new("tables", message)),
            )
        };
        if r.tables.is_empty() || r.tables.len() > MAX_EXPORT_TABLES {
            return Err(invalid(format!(
                "{} tables named; name 1 to {MAX_EXPORT_TABLES}",
                r.tables.len()
            )));
        }
        let mut tables = Vec::with_capacity(r.tables.len());
        for t in &r.tables {
            let name = TableName::try_from(t.as_str()).map_err(|e| refuse(M, e))?;
            check_table(M, &caller, name.as_str())?;
            if tables.contains(&name) {
                return Err(invalid(format!("table `{name}` is named twice")));
            }
            tables.push(name);
        }
        let req = ExportRequest {
            checkpoint: r.checkpoint,
            since: (!r.since.is_empty()).then_some(r.since),
            tables,
        };
        let hold = self.shard.hold(
            &[Some(req.checkpoint.as_str()), req.since.as_deref()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>(),
            "an export reads it",
        );
        let engine = self.engine();
        // A few parts in flight: the export reads as fast as the client takes them.
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::task::spawn_blocking(move || {
            // Held until the last part is sent.
            let _hold = hold;
            let done = engine.export(&req, &mut |part| {
                tx.blocking_send(Ok(pb::ExportPart::from(part))).is_ok()
            });
            if let Err(e) = done {
                let _ = tx.blocking_send(Err(refuse(M, e)));
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }

    #[instrument(skip_all, fields(name))]
    async fn delete_checkpoint(
        &self,
        req: Request<pb::DeleteCheckpointRequest>,
    ) -> Result<Response<pb::DeleteCheckpointResponse>, Status> {
        const M: &str = "DeleteCheckpoint";
        check_cluster_wide(M, &Caller::of(&req))?;
        let name = req.into_inner().name;
        tracing::Span::current().record("name", name.as_str());
        let done = self
            .shard
            .delete_checkpoint(name)
            .await
            .map_err(|e| refuse(M, e))?;
        Ok(Response::new(pb::DeleteCheckpointResponse {
            deleted: done.deleted,
            freed_bytes: done.freed_bytes,
        }))
    }

    async fn get_stats(
        &self,
        req: Request<pb::GetStatsRequest>,
    ) -> Result<Response<pb::GetStatsResponse>, Status> {
        check_cluster_wide("GetStats", &Caller::of(&req))?;
        let stats = ShardStats {
            bulk_calls: self.bulk_calls.load(Ordering::Relaxed),
            ..self.engine().stats()
        };
        Ok(Response::new(stats.into()))
    }
}

/// What the edge that received `req` has already checked of its values (the bulk listener
/// marks a body it scanned; a gRPC call carries no mark: its caller cannot set extensions).
fn checked_of<T>(req: &Request<T>) -> Checked {
    req.extensions()
        .get::<Checked>()
        .copied()
        .unwrap_or_default()
}
