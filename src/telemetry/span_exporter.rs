//! The span exporter: each batch written as OTLP protobuf in one pass
//! (`encode.rs`) and posted to the collector's `/v1/traces` with the
//! telemetry's client (`export_client.rs`: its timeout, no retry). A
//! failed post fails the batch, which the processor counts as dropped.

use super::encode;
use super::export_client::ExportClient;
use opentelemetry_http::{Bytes, HttpClient as _};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;

/// Posts batches of spans to one OTLP/HTTP endpoint, as protobuf.
#[derive(Debug)]
pub(crate) struct OtlpSpans {
    client: ExportClient,
    endpoint: String,
    resource: Resource,
}

impl OtlpSpans {
    /// An exporter to `endpoint` (the whole URL, `…/v1/traces`).
    pub(crate) fn new(client: ExportClient, endpoint: String) -> Self {
        Self {
            client,
            endpoint,
            resource: Resource::builder_empty().build(),
        }
    }
}

impl SpanExporter for OtlpSpans {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let body = encode::request(&self.resource, &batch);
        drop(batch);
        let request = http::Request::post(&self.endpoint)
            .header(http::header::CONTENT_TYPE, "application/x-protobuf")
            .body(Bytes::from(body))
            .map_err(|e| OTelSdkError::InternalFailure(e.to_string()))?;
        let answer = self
            .client
            .send_bytes(request)
            .await
            .map_err(|e| OTelSdkError::InternalFailure(e.to_string()))?;
        if answer.status().is_success() {
            Ok(())
        } else {
            Err(OTelSdkError::InternalFailure(format!(
                "the collector answered {}",
                answer.status()
            )))
        }
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.resource = resource.clone();
    }
}
