//! Trace context on the way in. Every call a service answers (health checks and reflection
//! aside) runs in a server span with the rpc semantic-convention attributes, whose parent is the
//! W3C trace context the caller sent: in the gRPC metadata ([`ServerTraceLayer`]) or, on the
//! bulk stream, in the request's `trace_context` map ([`server_span`]). The handlers' own spans
//! open inside it. The caller's side is `ps_client::trace`.

use std::collections::HashMap;
use std::pin::Pin;
use std::task::{Context, Poll};

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

/// The server span of a call to `path` (`/ps.v1.ParameterServer/PushDense`), a child of the
/// caller's span when `parent` (a bulk request's `trace_context`) names one.
pub fn server_span(path: &str, parent: &HashMap<String, String>) -> tracing::Span {
    let span = ps_client::trace::server_span(path);
    let cx = opentelemetry::global::get_text_map_propagator(|p| p.extract(&Map(parent)));
    // Fails only when no trace layer is installed: then there is nothing to join.
    let _ = span.set_parent(cx);
    span
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
        let started = std::time::Instant::now();
        Box::pin(
            async move {
                let response = call.await;
                // Refusals carry grpc-status in the headers; an answer's OK is in its trailers.
                let code = match &response {
                    Ok(r) => tonic::Status::from_header_map(r.headers())
                        .map_or(tonic::Code::Ok, |s| s.code()),
                    Err(_) => tonic::Code::Internal,
                };
                ps_client::trace::record_status(&outcome, code);
                crate::metrics::rpc_answered(&path, code, started.elapsed());
                response
            }
            .instrument(span),
        )
    }
}
