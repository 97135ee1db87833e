//! Trace context on the way in. Every call a service answers (health checks and reflection
//! aside) runs in a server span with the rpc semantic-convention attributes, whose parent is the
//! W3C trace context the caller sent: in the gRPC metadata ([`ServerTraceLayer`]) or, on the
//! bulk stream, in the request's `trace_context` map ([`server_span`]). The handlers' own spans
//! open inside it. The caller's side is `ps_client::trace`.

use std::collections::HashMap;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use opentelemetry::propagation::Extractor;
use tower::Layer;
use tower_service::Service;
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

struct Map<'a>(&'a HashMap<String, String>);

impl Extractor for Map<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

/// Runs a call the bulk stream carries as the gRPC server runs its own: in a server span for
/// `path` (`/ps.v1.ParameterServer/PushDense`) under the caller's context (`parent`, the
/// request's `trace_context`), its outcome recorded on the span and in the RPC metrics.
pub async fn serve_bulk<T>(
    path: &str,
    parent: &HashMap<String, String>,
    call: impl Future<Output = Result<T, tonic::Status>>,
) -> Result<T, tonic::Status> {
    let span = ps_client::trace::server_span(path);
    let cx = opentelemetry::global::get_text_map_propagator(|p| p.extract(&Map(parent)));
    // Fails only when no trace layer is installed: then there is nothing to join.
    let _ = span.set_parent(cx);
    let started = Instant::now();
    let answer = call.instrument(span.clone()).await;
    let code = answer
        .as_ref()
        .map_or_else(tonic::Status::code, |_| tonic::Code::Ok);
    answered(&span, path, code, started);
    answer
}

/// Closes a call: its gRPC code on its server span, and the call in the RPC metrics.
fn answered(span: &tracing::Span, path: &str, code: tonic::Code, started: Instant) {
    ps_client::trace::record_status(span, code);
    crate::metrics::rpc_answered(path, code, started.elapsed());
}

/// Calls that get no span: load balancers' health checks and grpcurl's reflection, which would
/// drown the training traffic.
fn untraced(path: &str) -> bool {
    path.starts_with("/grpc.health.") || path.starts_with("/grpc.reflection.")
}

/// A tower layer for the gRPC server: each call in a [`server_span`] joined to the caller's.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServerTraceLayer;

impl<S> Layer<S> for ServerTraceLayer {
    type Service = ServerTrace<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ServerTrace { inner }
    }
}

#[derive(Debug, Clone)]
pub struct ServerTrace<S> {
    inner: S,
}

impl<S, B, R> Service<http::Request<B>> for ServerTrace<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let path = request.uri().path();
        if untraced(path) {
            return Box::pin(self.inner.call(request));
        }
        let path = path.to_owned();
        let span = ps_client::trace::server_span(&path);
        let cx = opentelemetry::global::get_text_map_propagator(|p| {
            p.extract(&Headers(request.headers()))
        });
        let _ = span.set_parent(cx);
        let call = {
            let _in = span.enter();
            self.inner.call(request)
        };
        let outcome = span.clone();
        let started = Instant::now();
        Box::pin(
            async move {
                let response = call.await;
                let code = match &response {
                    Ok(r) => ps_client::trace::answer_code(r.headers()),
                    Err(_) => tonic::Code::Internal,
                };
                answered(&outcome, &path, code, started);
                response
            }
            .instrument(span),
        )
    }
}
