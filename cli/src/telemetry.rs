//! The binary's logging and, when the operator names a collector, the
//! export of turn spans over OTLP/HTTP (docs/SERVE.md, "Traces").
//!
//! Logs go to stderr, filtered by `SHAREDOS_LOG` (default `warn`). Traces
//! are exported only when `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set (the OpenTelemetry variables; the
//! exporter reads its headers and timeout from their usual variables too):
//! the `sharedos.turn` span of every turn (host/src/telemetry.rs), batched
//! on a thread of the exporter's own and flushed when the command ends.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The variables that name a collector, the more specific first.
const ENDPOINT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// What must be flushed before the process exits.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Exports what is still batched (bounded by the exporter's timeout).
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(e) = provider.shutdown()
        {
            eprintln!("sharedos: exporting the last traces failed: {e}");
        }
    }
}

/// Installs the logger and, when a collector is named, the trace exporter.
/// An exporter that cannot be built is an error: the operator asked for
/// traces.
pub fn init() -> Result<Telemetry, String> {
    let filter = EnvFilter::try_from_env("SHAREDOS_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    // Colour codes only for a terminal: a log file or a pipe gets plain
    // text, so that any escape byte in it is a finding, never ours.
    let logs = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .with_filter(filter);
    let Some(endpoint) = collector() else {
        let _ = tracing_subscriber::registry().with(logs).try_init();
        return Ok(Telemetry { provider: None });
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .build()
        .map_err(|e| format!("cannot export traces to {endpoint}: {e}"))?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            Resource::builder()
                .with_service_name("sharedos")
                .with_attribute(opentelemetry::KeyValue::new(
                    "service.version",
                    env!("CARGO_PKG_VERSION"),
                ))
                .build(),
        )
        .build();
    let spans = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("sharedos"))
        .with_filter(Targets::new().with_target("sharedos_host::telemetry", tracing::Level::INFO));
    let _ = tracing_subscriber::registry()
        .with(logs)
        .with(spans)
        .try_init();
    Ok(Telemetry {
        provider: Some(provider),
    })
}

/// The collector the environment names, if any.
fn collector() -> Option<String> {
    ENDPOINT_VARS
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.trim().is_empty()))
}
