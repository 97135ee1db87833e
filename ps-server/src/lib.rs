//! A parameter-server shard: owns part of the key space, keeps it durable in RocksDB, applies
//! pushes with server-side optimizers exactly once, and serves pulls from memory.
//!
//! The binary only parses flags and calls [`run`]; tests, the benchmark and the local-cluster
//! launcher call the same function.

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

pub mod body_ring;
pub mod bulk;
pub mod checkpoint;
pub mod config;
pub mod engine;
pub mod metrics;
mod page_warmer;
pub mod push_log;
pub use ps_core::optim;
pub mod registration;
pub mod service;
mod status;
pub mod store;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ps_proto::v1::parameter_server_server::ParameterServerServer;
use ps_runtime::grpc::GrpcOptions;
use ps_runtime::ready::Ready;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use config::{Args, ServerConfig};
use engine::{Engine, EngineConfig, MapEpoch, Reopen, Shard};
use service::PsService;
use store::{MemoryStore, RocksStore, Store};

/// Runs a shard on `listener` (and `/metrics` on `metrics_listener`) until `shutdown` is
/// cancelled; then health turns NOT_SERVING, in-flight calls finish, the writer drains and the
/// store is closed.
pub async fn run(
    cfg: ServerConfig,
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    cfg.check()?;
    let ready = Ready::of(&listener, metrics_listener.as_ref())?;
    let readiness = ps_runtime::readiness::Readiness::default();
    // The metrics port outlives the drain (probes see /readyz turn 503, scrapes see the end):
    // it stops when this function returns.
    let metrics_stop = CancellationToken::new();
    let _stop_metrics = metrics_stop.clone().drop_guard();
    let security = cfg.service.security.clone();
    ps_runtime::metrics::start(
        "ps-server",
        metrics_listener,
        security.metrics_tls(),
        &readiness,
        &metrics_stop,
    )?;
    metrics::describe();
    if let Some(dir) = &cfg.service.data_dir {
        ps_runtime::metrics::watch_disk(dir);
    }
    let map_epoch = Arc::new(MapEpoch::new(cfg.scheduler.is_some()));
    if let Some(url) = cfg.scheduler.clone() {
        let advertise = advertised(&cfg, &listener)?;
        let reg = registration::Registration {
            scheduler: url,
            shard: ps_client::scheduler::ShardRegistration {
                shard_index: cfg.shard_index,
                num_shards: cfg.num_shards,
                virtual_nodes: cfg.virtual_nodes,
                endpoint: advertise,
            },
            map_epoch: map_epoch.clone(),
            credentials: security.credentials.clone(),
        };
        tokio::spawn(reg.run(shutdown.clone()));
    }
    match cfg.service.data_dir.clone() {
        Some(dir) => {
            let c = cfg.clone();
            let store = tokio::task::spawn_blocking(move || open_durable(&c, &dir)).await??;
            let rocks = cfg.rocksdb.clone();
            let reopen: Reopen<RocksStore> =
                Arc::new(move |db: &Path| RocksStore::open(db, &rocks));
            let restore = cfg.service.data_dir.clone().map(|d| (d, reopen));
            let io = Io {
                listener,
                ready,
                readiness,
            };
            serve(cfg, store, restore, map_epoch, io, shutdown).await
        }
        None => {
            let io = Io {
                listener,
                ready,
                readiness,
            };
            serve(cfg, MemoryStore::default(), None, map_epoch, io, shutdown).await
        }
    }
}

/// The URL the scheduler publishes for this shard: `--advertise`, or the bound address.
fn advertised(cfg: &ServerConfig, listener: &TcpListener) -> anyhow::Result<String> {
    if let Some(a) = &cfg.advertise {
        return Ok(a.clone());
    }
    let local = listener.local_addr()?;
    if local.ip().is_unspecified() {
        anyhow::bail!(
            "listening on {local}: pass --advertise (PS_ADVERTISE) with the URL workers reach this shard at"
        );
    }
    let scheme = if cfg.service.security.tls.is_some() {
        "https"
    } else {
        "http"
    };
    Ok(format!("{scheme}://{local}"))
}

fn open_durable(cfg: &ServerConfig, dir: &Path) -> anyhow::Result<RocksStore> {
    if let Some(from) = &cfg.restore_from {
        let m = checkpoint::restore(from, dir)?;
        tracing::info!(checkpoint = %from.display(), files = m.files.len(), sequence = m.sequence, "checkpoint restored");
    }
    std::fs::create_dir_all(dir)?;
    checkpoint::remove_stale_generations(dir)?;
    let t0 = std::time::Instant::now();
    let store = RocksStore::open(&checkpoint::current_db(dir)?, &cfg.rocksdb)?;
    // Mostly RocksDB replaying its WAL's unflushed tail.
    tracing::info!(open_ms = t0.elapsed().as_millis() as u64, "store opened");
    Ok(store)
}

/// Where a shard serves: its gRPC listener, the ready file it announces once serving, and
/// the readiness its metrics endpoint answers `/readyz` from.
struct Io {
    listener: TcpListener,
    ready: Ready,
    readiness: ps_runtime::readiness::Readiness,
}

async fn serve<S: Store>(
    cfg: ServerConfig,
    store: S,
    restore: Option<(PathBuf, Reopen<S>)>,
    map_epoch: Arc<MapEpoch>,
    io: Io,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let Io {
        listener,
        mut ready,
        readiness,
    } = io;
    let engine_cfg = EngineConfig {
        shard_index: cfg.shard_index,
        num_shards: cfg.num_shards,
        virtual_nodes: cfg.virtual_nodes,
        checkpoint_dir: cfg.service.data_dir.as_ref().map(|d| d.join("checkpoints")),
        group_commit_bytes: cfg.group_commit_bytes,
        writer_spin: cfg.writer_spin,
        inline_push_bytes: cfg.inline_push_bytes,
        max_queued_bytes: cfg.max_queued_bytes,
        pull_replica_bytes: cfg.pull_replica_bytes,
        dense_log_bytes: cfg.rocksdb.dense_log_mib << 20,
        dense_body_bytes: cfg
            .rocksdb
            .dense_body_mib
            .unwrap_or(cfg.rocksdb.dense_log_mib)
            << 20,
        relog_rows: cfg.rocksdb.relog_rows,
        sync: cfg.rocksdb.sync,
        map_epoch,
        memory_budget: cfg.memory_budget_bytes,
        cache_bytes: cfg.cache_bytes,
        job_quota: cfg.job_quota,
        max_answer_bytes: cfg.max_answer_bytes,
        clock: cfg.clock.clone(),
    };
    let engine = tokio::task::spawn_blocking(move || Engine::open(store, engine_cfg)).await??;
    tracing::info!(
        shard = cfg.shard_index,
        shards = cfg.num_shards,
        durable = engine.durable(),
        sync = cfg.rocksdb.sync,
        cache_mib = engine.cache_budget() >> 20,
        "shard ready"
    );
    let shard = Arc::new(Shard::new(engine, restore));
    let bulk_listener = match cfg.bulk_listen {
        Some(addr) => Some(TcpListener::bind(addr).await.map_err(|e| {
            anyhow::anyhow!("cannot listen for the bulk stream on {addr}: {e} (--bulk-listen)")
        })?),
        None => None,
    };
    let mut svc = PsService::new(shard.clone(), cfg.max_request_bytes);
    if let Some(l) = &bulk_listener {
        svc = svc.with_bulk_port(l.local_addr()?.port());
    }
    let svc = Arc::new(svc);
    ready.bulk = bulk_listener
        .as_ref()
        .map(TcpListener::local_addr)
        .transpose()?;
    ps_runtime::metrics::rpc_methods(
        <ParameterServerServer<PsService<S>> as tonic::server::NamedService>::NAME,
        &[ps_proto::FILE_DESCRIPTOR_SET],
    );
    ready.announce(cfg.service.ready_file.as_deref())?;
    let bulk_stop = shutdown.child_token();
    let bulk_served = bulk_listener.map(|l| {
        let opts = bulk::BulkOptions {
            max_request_bytes: cfg.max_request_bytes,
            budget_bytes: cfg.bulk_budget_bytes,
            frame_timeout: cfg.bulk_frame_timeout,
            idle_timeout: cfg.bulk_idle_timeout,
            drain: cfg.service.drain,
            grace: cfg.service.grace,
        };
        let security = bulk::BulkSecurity {
            tls: cfg.service.security.tls.clone(),
            auth: cfg.service.security.auth.clone(),
            connection_rate: cfg.service.limits.per_connection_rate,
        };
        tokio::spawn(bulk::serve(
            l,
            svc.clone(),
            opts,
            security,
            bulk_stop.clone(),
        ))
    });
    let grpc = ParameterServerServer::from_arc(svc)
        .max_decoding_message_size(cfg.max_request_bytes)
        .max_encoding_message_size(usize::MAX);
    let opts = GrpcOptions {
        descriptor_sets: vec![ps_proto::FILE_DESCRIPTOR_SET],
        drain: cfg.service.drain,
        grace: cfg.service.grace,
        readiness,
        tls: cfg.service.security.tls.clone(),
        auth: cfg.service.security.auth.clone(),
        limits: cfg.service.limits,
    };
    let served = ps_runtime::grpc::serve(listener, grpc, opts, shutdown).await;
    // The engine closes once neither listener can reach it.
    bulk_stop.cancel();
    if let Some(b) = bulk_served {
        b.await?;
    }
    tokio::task::spawn_blocking(move || shard.close()).await?;
    served
}
