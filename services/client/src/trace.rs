//! Trace context on the way out. Every call to a shard or to the scheduler runs in a client
//! span with the rpc semantic-convention attributes, and carries that span's W3C trace context
//! (`traceparent`, `tracestate`): in the gRPC metadata ([`Traced`]), or on the bulk stream in the
//! request's `trace_context` map ([`context_map`]). The services read it back
//! (`ps_runtime::trace`), so a worker's training step and the shards' work for it are one trace.
//!
//! With no trace exporter set up the spans are plain `tracing` spans and nothing is injected.
//! The span conventions (names, attributes, status) are here for both sides.

use std::collections::HashMap;
use std::pin::Pin;
use std::task::{Context, Poll};

use opentelemetry::propagation::Injector;
use tower_service::Service;
use tracing::Instrument as _;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// A method's path (`/ps.v1.ParameterServer/PushDense`) as its service and method names.
pub fn rpc_name(path: &str) -> (&str, &str) {
    let name = path.trim_start_matches('/');
    name.rsplit_once('/').unwrap_or((name, ""))
}

/// The client span of one call to `path` (`/ps.v1.ParameterServer/PushDense`) at `peer`.
pub fn client_span(path: &str, peer: &str) -> tracing::Span {
    rpc_span("client", path, Some(peer))
}

/// The server span of a call to `path`, as the services open it (`ps_runtime::trace`): the
/// same attributes as the caller's span, seen from the other side.
pub fn server_span(path: &str) -> tracing::Span {
    rpc_span("server", path, None)
}

fn rpc_span(kind: &'static str, path: &str, peer: Option<&str>) -> tracing::Span {
    let (service, method) = rpc_name(path);
    tracing::info_span!(
        "rpc",
        otel.name = path.trim_start_matches('/'),
        otel.kind = kind,
        otel.status_code = Empty,
        rpc.system = "grpc",
        rpc.service = service,
        rpc.method = method,
        rpc.grpc.status_code = Empty,
        server.address = peer,
    )
}

/// The gRPC code of an answer, from its headers: a refusal carries grpc-status there; an answer
/// without it reports its code in the trailers, OK unless the body says otherwise (which the
/// caller sees).
pub fn answer_code(headers: &http::HeaderMap) -> tonic::Code {
    tonic::Status::from_header_map(headers).map_or(tonic::Code::Ok, |s| s.code())
}

/// Records a call's outcome on its span, client's or server's.
pub fn record_status(span: &tracing::Span, code: tonic::Code) {
    span.record("rpc.grpc.status_code", code as i32);
    if code != tonic::Code::Ok {
        span.record("otel.status_code", "error");
    }
}

struct Headers<'a>(&'a mut http::HeaderMap);

impl Injector for Headers<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            http::HeaderName::from_bytes(key.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(k, v);
        }
    }
}

struct Map<'a>(&'a mut HashMap<String, String>);

impl Injector for Map<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_owned(), value);
    }
}

/// `span`'s trace context as the bulk stream's `trace_context` map (empty when not traced).
pub fn context_map(span: &tracing::Span) -> HashMap<String, String> {
    let mut map = HashMap::new();
    let cx = span.context();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut Map(&mut map)));
    map
}

/// A gRPC channel whose every call runs in a [`client_span`] and carries its trace context in
/// the request's metadata.
#[derive(Debug, Clone)]
pub struct Traced<S> {
    inner: S,
    peer: std::sync::Arc<str>,
}

impl<S> Traced<S> {
    pub fn new(inner: S, peer: &str) -> Self {
        Self {
            inner,
            peer: peer.into(),
        }
    }
}

impl<S, B, R> Service<http::Request<B>> for Traced<S>
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

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let span = client_span(request.uri().path(), &self.peer);
        let cx = span.context();
        opentelemetry::global::get_text_map_propagator(|p| {
            p.inject_context(&cx, &mut Headers(request.headers_mut()));
        });
        let call = self.inner.call(request);
        let outcome = span.clone();
        Box::pin(
            async move {
                let response = call.await;
                match &response {
                    Ok(r) => record_status(&outcome, answer_code(r.headers())),
                    Err(_) => record_status(&outcome, tonic::Code::Unavailable),
                }
                response
            }
            .instrument(span),
        )
    }
}
