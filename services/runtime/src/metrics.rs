//! The Prometheus recorder and its `/metrics` endpoint, beside `/healthz` and `/readyz`
//! ([`crate::readiness`]).

use std::sync::OnceLock;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::readiness::Readiness;
use crate::tls::{Accepted, ServerTls};

mod process;
pub use process::{cpu_seconds, watch_disk};

/// Buckets for latencies in seconds: 50 µs to 10 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 10.0,
];
/// Buckets for sizes and counts: 1 to 16 Mi.
const SIZE_BUCKETS: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0,
];

static HANDLE: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();

/// Installs the process-wide recorder (once; later calls return the same handle) and records
/// `ps_build_info{service,version}`. Histograms whose names end in `_seconds` get latency
/// buckets, those ending in `_bytes` or `_size` get size buckets.
pub fn install(service: &'static str) -> anyhow::Result<PrometheusHandle> {
    let handle = HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
            .and_then(|b| b.set_buckets_for_metric(Matcher::Suffix("_bytes".into()), SIZE_BUCKETS))
            .and_then(|b| b.set_buckets_for_metric(Matcher::Suffix("_size".into()), SIZE_BUCKETS))
            .and_then(|b| b.install_recorder())
            .map_err(|e| e.to_string())
    });
    let handle = handle
        .clone()
        .map_err(|e| anyhow::anyhow!("installing the metrics recorder: {e}"))?;
    metrics::describe_gauge!(
        "ps_build_info",
        "Build of the running service (value is always 1)."
    );
    metrics::gauge!("ps_build_info", "service" => service, "version" => env!("CARGO_PKG_VERSION"))
        .set(1.0);
    process::describe();
    process::record();
    metrics::describe_counter!(
        "ps_tls_handshake_failures_total",
        "Connections whose TLS handshake failed (plaintext on a TLS port, an untrusted or missing client certificate), by port."
    );
    metrics::describe_counter!(
        "ps_auth_refusals_total",
        "Calls refused for their caller: no or an unknown token (unauthenticated), outside its role or jobs (permission_denied), over its limits (resource_exhausted)."
    );
    for code in [
        tonic::Code::Unauthenticated,
        tonic::Code::PermissionDenied,
        tonic::Code::ResourceExhausted,
    ] {
        auth_refused_by(code, 0);
    }
    Ok(handle)
}

/// Serves `GET /metrics` (Prometheus text format), `GET /healthz` (200 while the process
/// answers) and `GET /readyz` (200 when `readiness` says so, else 503) until `shutdown` is
/// cancelled; over TLS when `tls` is given.
pub async fn serve(
    listener: TcpListener,
    tls: Option<ServerTls>,
    handle: PrometheusHandle,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let h = handle.clone();
                async move {
                    process::record();
                    h.render()
                }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let ready = readiness.is_ready();
                async move {
                    if ready {
                        (StatusCode::OK, "ready\n")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                    }
                }
            }),
        );
    let local = listener.local_addr()?;
    let rx = crate::tls::accept_loop(listener, tls, None, shutdown.clone(), "metrics");
    axum::serve(Accepted { rx, local }, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

/// A connection whose TLS handshake failed (a plaintext client on a TLS port, a certificate
/// the server does not trust), by port (`grpc`, `bulk`, `metrics`).
pub(crate) fn tls_handshake_failed(port: &'static str) {
    metrics::counter!("ps_tls_handshake_failures_total", "port" => port).increment(1);
}

/// Registers the port's handshake failures at zero, so the family exists from start-up.
pub(crate) fn tls_handshake_failed_zero(port: &'static str) {
    metrics::counter!("ps_tls_handshake_failures_total", "port" => port).increment(0);
}

/// A call refused by the auth layer, by code (`unauthenticated`, `permission_denied`).
pub fn auth_refused(code: tonic::Code) {
    auth_refused_by(code, 1);
}

fn auth_refused_by(code: tonic::Code, n: u64) {
    let code = match code {
        tonic::Code::Unauthenticated => "unauthenticated",
        tonic::Code::PermissionDenied => "permission_denied",
        tonic::Code::ResourceExhausted => "resource_exhausted",
        _ => "other",
    };
    metrics::counter!("ps_auth_refusals_total", "code" => code).increment(n);
}

/// Installs the recorder for `service` and, when a listener is given, serves `/metrics`,
/// `/healthz` and `/readyz` on it in the background until `shutdown` (over `tls` when given):
/// the start of every service's `run`.
pub fn start(
    service: &'static str,
    listener: Option<TcpListener>,
    tls: Option<ServerTls>,
    readiness: &Readiness,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let handle = install(service)?;
    if let Some(l) = listener {
        let token = shutdown.clone();
        let readiness = readiness.clone();
        tokio::spawn(async move {
            if let Err(e) = serve(l, tls, handle, readiness, token).await {
                tracing::error!(error = %e, "metrics endpoint failed");
            }
        });
    }
    Ok(())
}

/// Binds a service's gRPC listener and its optional metrics listener, with messages that name
/// the address.
pub async fn bind(
    listen: std::net::SocketAddr,
    metrics: Option<std::net::SocketAddr>,
) -> anyhow::Result<(TcpListener, Option<TcpListener>)> {
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {e}"))?;
    let metrics = match metrics {
        Some(a) => Some(
            TcpListener::bind(a)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {a} for metrics: {e}"))?,
        ),
        None => None,
    };
    Ok((listener, metrics))
}

/// Counts an answered call by service, method and gRPC code, and times it: the RED figures of
/// every service, kept by the server's trace layer ([`crate::trace::ServerTraceLayer`]) and by
/// the shard's bulk stream for the calls it carries.
pub(crate) fn rpc_answered(path: &str, code: tonic::Code, took: std::time::Duration) {
    let (service, method) = ps_client::trace::rpc_name(path);
    let service = ("rpc_service", service.to_owned());
    let method = ("rpc_method", method.to_owned());
    metrics::histogram!(
        "ps_rpc_duration_seconds",
        &[service.clone(), method.clone()]
    )
    .record(took.as_secs_f64());
    metrics::counter!(
        "ps_rpc_requests_total",
        &[service, method, ("code", format!("{code:?}"))]
    )
    .increment(1);
}

/// Describes the RPC families and registers each method of the service `name` finds in
/// `descriptor_sets` with zeros, so that rates and error ratios exist before the first call.
/// [`crate::grpc::serve`] calls it; a service calls it too before it announces itself ready,
/// so that its first scrape has them. Calling it again changes no count.
pub fn rpc_methods(name: &str, descriptor_sets: &[&[u8]]) {
    metrics::describe_counter!(
        "ps_rpc_requests_total",
        "Calls answered, by rpc_service, rpc_method and gRPC code."
    );
    metrics::describe_histogram!(
        "ps_rpc_duration_seconds",
        "Time to answer a call, by rpc_service and rpc_method."
    );
    for fds in descriptor_sets {
        let Ok(set) = <prost_types::FileDescriptorSet as prost::Message>::decode(*fds) else {
            continue;
        };
        for file in &set.file {
            for svc in &file.service {
                let full = format!("{}.{}", file.package(), svc.name());
                if full != name {
                    continue;
                }
                for m in &svc.method {
                    let service = ("rpc_service", full.clone());
                    let method = ("rpc_method", m.name().to_owned());
                    let _ = metrics::histogram!(
                        "ps_rpc_duration_seconds",
                        &[service.clone(), method.clone()]
                    );
                    metrics::counter!(
                        "ps_rpc_requests_total",
                        &[service, method, ("code", "Ok".to_owned())]
                    )
                    .increment(0);
                }
            }
        }
    }
}
