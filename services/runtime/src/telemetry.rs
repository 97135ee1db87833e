//! Logs and traces, set up once per process.

use std::io::IsTerminal as _;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

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

/// Sets up logging (`RUST_LOG`, default `info`; coloured only on a terminal without `NO_COLOR`)
/// and, when `OTEL_EXPORTER_OTLP_ENDPOINT` is set,
/// an OTLP/gRPC trace exporter (the other `OTEL_*` variables apply as the SDK defines them).
/// Call it inside the tokio runtime: the exporter's batch task runs there. A second call in the
/// same process (tests start many services) keeps the first set-up.
pub fn init(service_name: &'static str) -> TelemetryGuard {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours for a person at a terminal only: a log file or a collector gets plain text.
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let fmt = tracing_subscriber::fmt::layer()
        .with_target(true)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let provider = std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT").and_then(|_| {
        match opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()
        {
            Ok(exporter) => Some(
                SdkTracerProvider::builder()
                    .with_batch_exporter(exporter)
                    .with_resource(Resource::builder().with_service_name(service_name).build())
                    .build(),
            ),
            Err(e) => {
                eprintln!("OTLP exporter not started: {e}; continuing with logs only");
                None
            }
        }
    });
    let otel = provider
        .as_ref()
        .map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer(service_name)));
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .try_init()
        .is_ok();
    if installed {
        if let Some(p) = &provider {
            opentelemetry::global::set_tracer_provider(p.clone());
        }
        TelemetryGuard { provider }
    } else {
        TelemetryGuard::default()
    }
}
