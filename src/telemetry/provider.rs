//! The tracer and meter providers: the OTLP/HTTP protobuf exporters on our
//! client, the bounded export queue (`processor.rs`, `batches.rs`), the
//! periodic metric reader, the resource (`service.name`) and the sampler.

use super::batches::Batches;
use super::error::TelemetryError;
use super::export_client::ExportClient;
use super::in_flight::InFlight;
use super::limits::Limits;
use super::processor::{CountingProcessor, SharedProcessor};
use super::sampling::RequestSampler;
use super::sink::Sink;
use super::span_exporter::OtlpSpans;
use crate::config::TelemetryConfig;
use opentelemetry_otlp::{MetricExporter, Protocol, RetryPolicy, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanExporter as _};
use opentelemetry_sdk::Resource;
use std::sync::Arc;
use tokio::runtime::Handle;

/// Builds the providers exporting to `config.otlp_endpoint` (already
/// resolved against the environment), `service_name` when the
/// configuration names none; both send with one client.
pub(crate) fn build(
    config: &TelemetryConfig,
    service_name: &str,
    limits: &Limits,
    runtime: Handle,
    operations_direct: bool,
) -> Result<(SdkTracerProvider, Arc<Sink>, SdkMeterProvider), TelemetryError> {
    let client = ExportClient::new(runtime, limits.export_timeout)
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let name = if config.service_name.is_empty() {
        service_name
    } else {
        &config.service_name
    };
    let resource = Resource::builder()
        .with_service_name(name.to_owned())
        .build();
    let meters = meters(config, limits, client.clone(), resource.clone())?;
    let (traces, sink) = traces(config, limits, client, resource, operations_direct)?;
    Ok((traces, sink, meters))
}

/// The tracer provider: spans through the counting export queue; and the
/// sink of the direct spans (`direct.rs`), into the same queue (the
/// operations' too when `operations_direct`).
///
/// The sampler keeps a request's root when the request's decision did
/// (`sampling.rs`), follows the parent otherwise, so a trace is kept or
/// dropped whole.
fn traces(
    config: &TelemetryConfig,
    limits: &Limits,
    client: ExportClient,
    resource: Resource,
    operations_direct: bool,
) -> Result<(SdkTracerProvider, Arc<Sink>), TelemetryError> {
    // Written straight into protobuf (`encode.rs`): the OTLP exporter's
    // copy into generated structs cost about twenty allocations a span.
    let mut exporter = OtlpSpans::new(client, config.signal_endpoint("/v1/traces"));
    exporter.set_resource(&resource);
    let in_flight = InFlight::new(limits.max_queued_spans, limits.max_queued_bytes);
    let queue = Batches::new(
        exporter,
        in_flight.clone(),
        limits.max_batch_spans.min(limits.max_queued_spans),
        limits.export_interval,
    )
    .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let processor = CountingProcessor::new(queue, in_flight, config.attribute_value_length_limit);
    let processor = Arc::new(processor);
    let provider = SdkTracerProvider::builder()
        .with_span_processor(SharedProcessor(processor.clone()))
        .with_resource(resource)
        .with_sampler(RequestSampler::new(config.sample_ratio))
        .build();
    let sink = Sink::new(processor, env!("CARGO_PKG_NAME"), operations_direct);
    Ok((provider, sink))
}

/// The meter provider: a reader that exports every `metric_interval` (and
/// at a flush), cumulative, a failed export dropped.
fn meters(
    config: &TelemetryConfig,
    limits: &Limits,
    client: ExportClient,
    resource: Resource,
) -> Result<SdkMeterProvider, TelemetryError> {
    let exporter = MetricExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(config.signal_endpoint("/v1/metrics"))
        .with_timeout(limits.export_timeout)
        .with_retry_policy(RetryPolicy::disabled())
        .build()
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let reader = PeriodicReader::builder(exporter)
        .with_interval(limits.metric_interval)
        .build();
    Ok(SdkMeterProvider::builder()
        .with_reader(reader)
        .with_resource(resource)
        .build())
}
