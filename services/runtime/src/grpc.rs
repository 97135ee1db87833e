//! The gRPC server scaffold every service runs: its own service plus `grpc.health.v1.Health`
//! and reflection (v1 and v1alpha, so grpcurl 1.8 works), generous HTTP/2 windows for large
//! tensors, and one shutdown sequence.
//!
//! Shutdown, when the token is cancelled: health turns NOT_SERVING; after `drain` (time for load
//! balancers to notice) the listener closes; in-flight calls get up to `grace` to finish.

use std::convert::Infallible;
use std::time::Duration;

use tokio_stream::StreamExt as _;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic_health::ServingStatus;

use crate::auth::{Auth, AuthLayer};
use crate::readiness::Readiness;
use crate::tls::ServerTls;

/// How a service's gRPC server behaves.
#[derive(Debug, Clone)]
pub struct GrpcOptions {
    /// Encoded `FileDescriptorSet`s served by reflection (health's is added).
    pub descriptor_sets: Vec<&'static [u8]>,
    /// Time between NOT_SERVING and closing the listener.
    pub drain: Duration,
    /// Longest wait for in-flight calls once the listener is closed.
    pub grace: Duration,
    /// Set when the server serves and cleared when shutdown begins, with gRPC health.
    pub readiness: Readiness,
    /// TLS on the port (mutual when it has a client CA); plaintext when `None`.
    pub tls: Option<ServerTls>,
    /// Credentials every call of ours must carry (health and reflection aside); none checked
    /// when `None`.
    pub auth: Option<Auth>,
    pub limits: CallLimits,
}

/// What one call and one connection may take of a server, whoever the caller.
#[derive(Debug, Clone, Copy)]
pub struct CallLimits {
    /// The longest any call runs: it is answered `deadline_exceeded` then (a client's own
    /// shorter deadline, its `grpc-timeout`, is kept as well).
    pub max_call: Duration,
    /// Calls served at once per connection; more wait for a place (one connection's flood
    /// queues behind itself). `None`: no limit.
    pub per_connection: Option<usize>,
    /// Calls per second per connection (a token bucket with a second of burst); more are
    /// answered `resource_exhausted` (CALLER_LIMIT) at once. `None`: no limit.
    pub per_connection_rate: Option<f64>,
}

impl Default for CallLimits {
    fn default() -> Self {
        Self {
            // Above the longest wait a call makes by design (a coordinated checkpoint waits up
            // to 300 s for the workers).
            max_call: Duration::from_secs(600),
            per_connection: None,
            per_connection_rate: None,
        }
    }
}

impl Default for GrpcOptions {
    fn default() -> Self {
        Self {
            descriptor_sets: Vec::new(),
            drain: Duration::ZERO,
            grace: Duration::from_secs(30),
            readiness: Readiness::default(),
            tls: None,
            auth: None,
            limits: CallLimits::default(),
        }
    }
}

use ps_core::wire::{CONNECTION_WINDOW, STREAM_WINDOW};

/// Serves `svc` with health and reflection on `listener` until `shutdown` is cancelled, then
/// drains as described in the module docs. Returns once the server has stopped.
pub async fn serve<S>(
    listener: TcpListener,
    svc: S,
    opts: GrpcOptions,
    shutdown: CancellationToken,
) -> anyhow::Result<()>
where
    S: tower_service::Service<
            http::Request<Body>,
            Response = http::Response<Body>,
            Error = Infallible,
        > + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    crate::metrics::rpc_methods(S::NAME, &opts.descriptor_sets);
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", ServingStatus::Serving)
        .await;
    reporter
        .set_service_status(S::NAME, ServingStatus::Serving)
        .await;

    let mut reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET);
    let mut reflection_alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET);
    for fds in &opts.descriptor_sets {
        reflection = reflection.register_encoded_file_descriptor_set(fds);
        reflection_alpha = reflection_alpha.register_encoded_file_descriptor_set(fds);
    }
    let reflection = reflection.build_v1()?;
    let reflection_alpha = reflection_alpha.build_v1alpha()?;

    let local = listener.local_addr()?;
    // Stops accepting after NOT_SERVING and the drain delay.
    let stop = CancellationToken::new();
    let incoming = tokio_stream::wrappers::ReceiverStream::new(crate::tls::accept_loop(
        listener,
        opts.tls.clone(),
        opts.limits.per_connection_rate,
        stop.clone(),
        "grpc",
    ))
    .map(Ok::<_, std::io::Error>);
    let stop_accepting = stop.clone();
    let drain = opts.drain;
    let readiness = opts.readiness.clone();
    readiness.set(true);
    let watcher = tokio::spawn(async move {
        shutdown.cancelled().await;
        readiness.set(false);
        reporter
            .set_service_status("", ServingStatus::NotServing)
            .await;
        reporter
            .set_service_status(S::NAME, ServingStatus::NotServing)
            .await;
        tracing::info!(
            drain_ms = drain.as_millis() as u64,
            "health is NOT_SERVING; draining"
        );
        tokio::time::sleep(drain).await;
        stop_accepting.cancel();
    });

    tracing::info!(
        %local,
        service = S::NAME,
        tls = opts.tls.as_ref().map_or("off", |t| if t.mutual() { "mutual" } else { "on" }),
        auth = opts.auth.is_some(),
        "gRPC server listening"
    );
    let server = tonic::transport::Server::builder()
        .layer(tower::util::MapResponseLayer::new(
            oversize_is_resource_exhausted,
        ))
        .layer(crate::trace::ServerTraceLayer)
        .layer(AuthLayer(opts.auth.clone()))
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(Some(1 << 20))
        .timeout(opts.limits.max_call)
        .concurrency_limit_per_connection(opts.limits.per_connection.unwrap_or(usize::MAX >> 3))
        .add_service(health)
        .add_service(reflection)
        .add_service(reflection_alpha)
        .add_service(svc)
        .serve_with_incoming_shutdown(incoming, {
            let stop = stop.clone();
            async move { stop.cancelled().await }
        });
    tokio::pin!(server);
    let result = tokio::select! {
        r = &mut server => r,
        () = async {
            stop.cancelled().await;
            tokio::time::sleep(opts.grace).await;
        } => {
            tracing::warn!(grace_s = opts.grace.as_secs(), "in-flight calls did not finish within the grace period");
            Ok(())
        }
    };
    watcher.abort();
    result?;
    tracing::info!(service = S::NAME, "gRPC server stopped");
    Ok(())
}

/// tonic answers a request over the decoding limit with OUT_OF_RANGE; gRPC's convention (and what
/// clients retry on) is RESOURCE_EXHAUSTED, with a message that says what to change.
fn oversize_is_resource_exhausted(mut resp: http::Response<Body>) -> http::Response<Body> {
    if let Some(status) = tonic::Status::from_header_map(resp.headers())
        && status.code() == tonic::Code::OutOfRange
        && status
            .message()
            .starts_with("Error, decoded message length too large")
    {
        let better = tonic::Status::resource_exhausted(format!(
            "request too large: {}; send smaller requests or raise the server's --max-request-bytes",
            status
                .message()
                .trim_start_matches("Error, decoded message length too large: ")
        ));
        // Only fails for a message that cannot be a header value; ours always can.
        let _ = better.add_header(resp.headers_mut());
    }
    resp
}
