//! The tracer provider: the OTLP/HTTP protobuf exporter on our client, the
//! bounded batch processor, the resource (`service.name`) and the sampler.

use super::export_client::ExportClient;
use super::processor::{CountingExporter, CountingProcessor};
use super::{Limits, TelemetryError};
use crate::config::TelemetryConfig;
use opentelemetry_otlp::{Protocol, RetryPolicy, SpanExporter, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider,
};
use opentelemetry_sdk::Resource;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use tokio::runtime::Handle;

/// Builds the provider exporting to `config.otlp_endpoint` (already
/// resolved against the environment), `service_name` when the
/// configuration names none.
///
/// The sampler keeps `sample_ratio` of the traces that start here and
/// follows the caller's decision for a request that carries a sampled (or
/// unsampled) `traceparent`, so a trace is kept or dropped whole.
pub(crate) fn build(
    config: &TelemetryConfig,
    service_name: &str,
    limits: &Limits,
    runtime: Handle,
) -> Result<SdkTracerProvider, TelemetryError> {
    let client = ExportClient::new(runtime, limits.export_timeout)
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let exporter = SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(config.signal_endpoint("/v1/traces"))
        .with_timeout(limits.export_timeout)
        // A failed batch is dropped (and counted): retrying would hold the
        // export thread while the queue fills anyway.
        .with_retry_policy(RetryPolicy::disabled())
        .build()
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let in_flight = Arc::new(AtomicUsize::new(0));
    let batches = BatchConfigBuilder::default()
        .with_max_queue_size(limits.max_queued_spans)
        .with_max_export_batch_size(limits.max_batch_spans.min(limits.max_queued_spans))
        .with_scheduled_delay(limits.export_interval)
        .build();
    let batch = BatchSpanProcessor::builder(CountingExporter::new(exporter, in_flight.clone()))
        .with_batch_config(batches)
        .build();
    let processor = CountingProcessor::new(batch, in_flight, limits.max_queued_spans);
    let name = if config.service_name.is_empty() {
        service_name
    } else {
        &config.service_name
    };
    let resource = Resource::builder()
        .with_service_name(name.to_owned())
        .build();
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            config.sample_ratio,
        ))))
        .build())
}
