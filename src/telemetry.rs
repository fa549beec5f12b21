//! OTLP traces, when the standard variables ask for them: with `OTEL_EXPORTER_OTLP_ENDPOINT`
//! (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) set, spans go over OTLP/HTTP (protobuf) to it;
//! unset, or with `OTEL_SDK_DISABLED=true`, nothing is installed and the worker's spans are never
//! built (see worker/src/trace.rs). The exporter reads the other standard variables itself
//! (headers, timeout, protocol, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`), as every
//! OpenTelemetry SDK does.

use anyhow::Context as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;

/// The installed provider; dropping it flushes the spans still queued.
pub struct Traces(Option<SdkTracerProvider>);

pub fn init(env: &queue::Environment) -> anyhow::Result<Traces> {
    let set = |k: &str| env.var(k).is_some_and(|v| !v.trim().is_empty());
    let disabled = env.var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim() == "true");
    if disabled
        || !(set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
    {
        return Ok(Traces(None));
    }
    worker::install_tls();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .context("setting up the OTLP exporter (check OTEL_EXPORTER_OTLP_ENDPOINT)")?;
    let mut resource = Resource::builder();
    if !set("OTEL_SERVICE_NAME") {
        resource = resource.with_service_name("taskbridge");
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    worker::enable_traces();
    tracing::info!("exporting traces over OTLP/HTTP");
    Ok(Traces(Some(provider)))
}

impl Drop for Traces {
    fn drop(&mut self) {
        if let Some(p) = self.0.take()
            && let Err(e) = p.shutdown()
        {
            tracing::warn!(error = %e, "flushing the traces failed");
        }
    }
}
