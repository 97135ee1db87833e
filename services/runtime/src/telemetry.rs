//! Logs and traces, set up once per process.
//!
//! Logs go to stderr as text (coloured only on a terminal without `NO_COLOR`) or, with
//! `--log-format json`, as one JSON object per line carrying the trace and span ids of the span
//! it was written in, so a log line finds its trace and the lines of one training step join up
//! across services. Traces are exported over OTLP/gRPC when `OTEL_EXPORTER_OTLP_ENDPOINT` is set;
//! the sampler comes from `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` as the
//! OpenTelemetry SDK defines them. Trace context crosses services in W3C `traceparent` headers
//! ([`crate::trace`], `ps_client::trace`).

use std::fmt;
use std::io::IsTerminal as _;
use std::sync::OnceLock;

use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::dispatcher::WeakDispatch;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime as _, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, with `trace_id` and `span_id` inside a span.
    Json,
}

/// The logging flags every binary has.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LogArgs {
    /// How log lines are written: text, or json (one object per line, with trace and span ids).
    #[arg(long, env = "PS_LOG_FORMAT", value_enum, default_value_t)]
    pub log_format: LogFormat,
}

/// Flushes and stops the trace exporter when dropped.
#[derive(Debug, Default)]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take()
            && let Err(e) = p.shutdown()
        {
            eprintln!("flushing traces failed: {e}");
        }
    }
}

/// The process's subscriber, for the JSON lines to find their span's trace id.
static DISPATCH: OnceLock<WeakDispatch> = OnceLock::new();

/// Sets up logging (`RUST_LOG`, default `info`) in `args`' format and, when
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is set, an OTLP/gRPC trace exporter (the other `OTEL_*`
/// variables apply as the SDK defines them). JSON logs without an exporter still get trace ids:
/// spans are then traced and not exported. Call it inside the tokio runtime: the exporter's batch
/// task runs there. A second call in the same process (tests start many services) keeps the
/// first set-up.
pub fn init(service_name: &'static str, args: &LogArgs) -> TelemetryGuard {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours for a person at a terminal only: a log file or a collector gets plain text.
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let json = args.log_format == LogFormat::Json;
    let text = (!json).then(|| {
        tracing_subscriber::fmt::layer()
            .with_target(true)
            .with_ansi(ansi)
            .with_writer(std::io::stderr)
    });
    let json_lines = json.then(|| {
        tracing_subscriber::fmt::layer()
            .event_format(JsonLines)
            .with_writer(std::io::stderr)
    });
    let exporter = std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT").and_then(|_| {
        opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()
            .inspect_err(|e| eprintln!("OTLP exporter not started: {e}; continuing without"))
            .ok()
    });
    let provider = (exporter.is_some() || json).then(|| {
        let mut b = SdkTracerProvider::builder()
            .with_resource(Resource::builder().with_service_name(service_name).build());
        if let Some(e) = exporter {
            b = b.with_batch_exporter(e);
        }
        b.build()
    });
    let otel = provider
        .as_ref()
        .map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer(service_name)));
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(text)
        .with(json_lines)
        .with(otel)
        .try_init()
        .is_ok();
    if !installed {
        return TelemetryGuard::default();
    }
    let _ = DISPATCH.set(tracing::dispatcher::get_default(
        tracing::Dispatch::downgrade,
    ));
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    if let Some(p) = &provider {
        opentelemetry::global::set_tracer_provider(p.clone());
    }
    TelemetryGuard { provider }
}

/// One JSON object per event: `timestamp`, `level`, `target`, `message`, the event's other
/// fields under `fields`, the names of the spans it is in (`spans`, outermost first) and, in a
/// traced span, `trace_id` and `span_id`.
struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        let mut fields = Fields::default();
        event.record(&mut fields);
        let mut line = serde_json::Map::new();
        line.insert("timestamp".into(), timestamp.into());
        line.insert("level".into(), meta.level().as_str().into());
        line.insert("target".into(), meta.target().into());
        line.insert(
            "message".into(),
            fields.message.take().unwrap_or_default().into(),
        );
        if !fields.map.is_empty() {
            line.insert("fields".into(), fields.map.into());
        }
        if let Some(scope) = ctx.event_scope() {
            let spans: Vec<serde_json::Value> =
                scope.from_root().map(|s| s.name().into()).collect();
            line.insert("spans".into(), spans.into());
        }
        if let Some(span) = ctx.lookup_current()
            && let Some(dispatch) = DISPATCH.get().and_then(WeakDispatch::upgrade)
            && let Some(cx) = tracing_opentelemetry::get_otel_context(&span.id(), &dispatch)
        {
            let sc = cx.span().span_context().clone();
            if sc.is_valid() {
                line.insert("trace_id".into(), sc.trace_id().to_string().into());
                line.insert("span_id".into(), sc.span_id().to_string().into());
            }
        }
        let text = serde_json::Value::Object(line).to_string();
        writeln!(writer, "{text}")
    }
}

/// An event's fields as JSON values, its message apart.
#[derive(Default)]
struct Fields {
    message: Option<String>,
    map: serde_json::Map<String, serde_json::Value>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: serde_json::Value) {
        self.map.insert(field.name().to_owned(), value);
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = Some(value.to_owned());
        } else {
            self.put(field, value.into());
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = Some(text);
        } else {
            self.put(field, text.into());
        }
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into());
    }
}
