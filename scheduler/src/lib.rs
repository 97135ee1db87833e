//! The scheduler: makes a set of shards and workers one training job.
//!
//! - [`policy`]: which worker may start which clock (BSP / SSP / ASP, one rule), pure.
//! - [`assign`]: data shards and batch sizes, pure.
//! - [`state`]: jobs, members, leases, the shard map; plain data behind one lock.
//! - [`core`]: the behaviour: long-polled clock grants, leases, checkpoints, resume, the
//!   durable state file.
//! - [`service`]: the `ps.v1.Scheduler` gRPC edge.
//!
//! The binary only parses flags and calls [`run`]; tests and the bench call the same function.

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

pub mod assign;
pub mod config;
pub mod core;
pub mod cost;
pub mod error;
pub mod metrics;
pub mod policy;
pub mod service;
pub mod state;

use ps_proto::v1::scheduler_server::SchedulerServer;
use ps_runtime::grpc::GrpcOptions;
use ps_runtime::ready::Ready;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use crate::core::{Scheduler, SchedulerConfig};
pub use config::{Args, Config};

/// Runs the scheduler on `listener` (and `/metrics` on `metrics_listener`) until `shutdown`
/// is cancelled; the state file is written before it returns.
pub async fn run(
    cfg: Config,
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let ready = Ready::of(&listener, metrics_listener.as_ref())?;
    let readiness = ps_runtime::readiness::Readiness::default();
    // The metrics port outlives the drain (probes see /readyz turn 503, scrapes see the end):
    // it stops when this function returns.
    let metrics_stop = CancellationToken::new();
    let _stop_metrics = metrics_stop.clone().drop_guard();
    ps_runtime::metrics::start(
        "scheduler",
        metrics_listener,
        cfg.service.security.metrics_tls(),
        &readiness,
        &metrics_stop,
    )?;
    metrics::describe();
    if let Some(dir) = &cfg.service.data_dir {
        ps_runtime::metrics::watch_disk(dir);
    }
    let sched = {
        let c = cfg.scheduler.clone();
        let token = shutdown.clone();
        tokio::task::spawn_blocking(move || Scheduler::open(c, token))
    }
    .await??;
    tracing::info!(data_dir = ?cfg.scheduler.data_dir, lease_ms = cfg.scheduler.lease.as_millis() as u64, "scheduler ready");
    let svc = SchedulerServer::new(service::SchedulerService::new(sched.clone()));
    ps_runtime::metrics::rpc_methods(
        <SchedulerServer<service::SchedulerService> as tonic::server::NamedService>::NAME,
        &[ps_proto::FILE_DESCRIPTOR_SET],
    );
    ready.announce(cfg.service.ready_file.as_deref())?;
    let opts = GrpcOptions {
        descriptor_sets: vec![ps_proto::FILE_DESCRIPTOR_SET],
        drain: cfg.service.drain,
        grace: cfg.service.grace,
        readiness,
        tls: cfg.service.security.tls.clone(),
        auth: cfg.service.security.auth.clone(),
        limits: cfg.service.limits,
    };
    let served = ps_runtime::grpc::serve(listener, svc, opts, shutdown).await;
    // After the server has drained, so that the last write sees every call.
    sched.close().await;
    served
}
