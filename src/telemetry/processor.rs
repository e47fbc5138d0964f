//! The bounded export queue, and the count of the spans it drops.
//!
//! A span ended never blocks the request that ends it, and is never held
//! without bound: [`CountingProcessor`] cuts the span's texts to the
//! attribute value length limit (`truncate.rs`), then admits it only while
//! the spans queued or being exported stay within `max_spans` and their
//! estimated bytes (`weight.rs`) within `max_bytes` — one atomic add on one
//! word holding both ([`InFlight`]) — and queues it (`batches.rs`), whose
//! thread gives the places and the bytes back when a batch's export
//! returns. Every span refused, and every span of a batch whose export
//! failed, is counted in `fanout_telemetry_spans_dropped_total` (by
//! `reason`: `queue_full`, `queue_bytes`, `export_failed`; and `shutdown`,
//! a span ended after the queue shut down: `batches.rs`).
//!
//! Memory is bounded by `max_bytes` of spans, whatever the collector does
//! and whatever the clients send (and, while a batch is sent, its protobuf
//! copy: the exporter's): a collector down fails each batch at once; one
//! that hangs holds the export thread up to the export timeout while the
//! queue fills and then drops.

use super::batches::Batches;
use super::in_flight::InFlight;
use super::{truncate, weight};
use crate::metrics;
use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanProcessor};
use std::sync::Arc;
use std::time::Duration;

/// A processor that cuts each span's texts, admits at most `max_spans`
/// spans and `max_bytes` at once, counts the others, and queues the rest
/// for export (`batches.rs`).
#[derive(Debug)]
pub(crate) struct CountingProcessor {
    queue: Batches,
    in_flight: Arc<InFlight>,
    /// The attribute value length limit, in bytes.
    value_limit: usize,
}

impl CountingProcessor {
    /// Queues into `queue`, which gives back to `in_flight` what each batch
    /// it exports was admitted with; texts past `value_limit` bytes are cut.
    pub(crate) fn new(queue: Batches, in_flight: Arc<InFlight>, value_limit: usize) -> Self {
        Self {
            queue,
            in_flight,
            value_limit,
        }
    }
}

impl SpanProcessor for CountingProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, mut span: SpanData) {
        truncate::span(&mut span, self.value_limit);
        let weight = weight::of(&span);
        if let Err(reason) = self.in_flight.admit(weight) {
            metrics::spans_dropped(reason, 1);
            return;
        }
        self.queue.push(span, weight);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.queue.flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.queue.shutdown(timeout)
    }
}

/// A [`CountingProcessor`] shared by the tracer provider and the direct
/// spans (`direct.rs`). The exporter's resource is set as it is built:
/// the provider's own `set_resource` call reaches nothing.
#[derive(Debug)]
pub(crate) struct SharedProcessor(pub(crate) Arc<CountingProcessor>);

impl SpanProcessor for SharedProcessor {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.0.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        self.0.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }
}

#[cfg(test)]
#[path = "processor_tests.rs"]
mod tests;
