//! The bounded export queue, and the count of the spans it drops.
//!
//! The SDK's `BatchSpanProcessor` never blocks the request that ends a span:
//! it `try_send`s the span into a channel of `max_queue_size` and a thread of
//! its own exports batches. But the spans it drops when that channel is full
//! are counted privately, with no getter. So the processor is wrapped:
//! [`CountingProcessor`] admits a span only while fewer than `cap` spans are
//! queued or being exported (one atomic add; `cap` is the channel's size, so
//! the channel is never what refuses a span), and [`CountingExporter`] gives
//! the places back when a batch's export returns. Every span refused, and
//! every span of a batch whose export failed, is counted in
//! `fanout_telemetry_spans_dropped_total` (by `reason`).
//!
//! Memory is bounded by `cap` spans' data, whatever the collector does: a
//! collector down fails each batch at once; one that hangs holds the export
//! thread up to the export timeout while the queue fills and then drops.

use crate::metrics;
use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{BatchSpanProcessor, Span, SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The spans queued or being exported, shared by the processor that admits
/// them and the exporter that lets them go.
pub(crate) type InFlight = Arc<AtomicUsize>;

/// A batch processor that admits at most `cap` spans at once and counts
/// the others.
#[derive(Debug)]
pub(crate) struct CountingProcessor {
    inner: BatchSpanProcessor,
    in_flight: InFlight,
    cap: usize,
}

impl CountingProcessor {
    /// Wraps `inner`, whose queue holds at least `cap` spans and whose
    /// exporter is a [`CountingExporter`] sharing `in_flight`.
    pub(crate) fn new(inner: BatchSpanProcessor, in_flight: InFlight, cap: usize) -> Self {
        Self {
            inner,
            in_flight,
            cap,
        }
    }
}

impl SpanProcessor for CountingProcessor {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.in_flight.fetch_add(1, Ordering::Relaxed) >= self.cap {
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
            metrics::spans_dropped("queue_full", 1);
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        // Not forwarded, the spans would leave without `service.name`.
        self.inner.set_resource(resource);
    }
}

/// An exporter that gives back the places of each batch it was handed, and
/// counts a failed batch's spans.
#[derive(Debug)]
pub(crate) struct CountingExporter<E> {
    inner: E,
    in_flight: InFlight,
}

impl<E> CountingExporter<E> {
    /// Wraps `inner`, sharing `in_flight` with the [`CountingProcessor`].
    pub(crate) fn new(inner: E, in_flight: InFlight) -> Self {
        Self { inner, in_flight }
    }
}

impl<E: SpanExporter> SpanExporter for CountingExporter<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let result = self.inner.export(batch).await;
        self.in_flight.fetch_sub(spans, Ordering::Relaxed);
        if result.is_err() {
            metrics::spans_dropped("export_failed", spans as u64);
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}
