//! The bounded export queue, and the count of the spans it drops.
//!
//! The SDK's `BatchSpanProcessor` never blocks the request that ends a span:
//! it `try_send`s the span into a channel of `max_queue_size` and a thread of
//! its own exports batches. But the spans it drops when that channel is full
//! are counted privately, with no getter, and the channel is bounded in
//! spans, not bytes. So the processor is wrapped: [`CountingProcessor`] cuts
//! the span's texts to the attribute value length limit (`truncate.rs`),
//! then admits it only while the spans queued or being exported stay within
//! `max_spans` (the channel's size, so the channel is never what refuses a
//! span) and their estimated bytes (`weight.rs`) within `max_bytes` — one
//! atomic add on one word holding both ([`InFlight`]) — and
//! [`CountingExporter`] gives the places and the bytes back when a batch's
//! export returns. Every span refused, and every span of a batch whose
//! export failed, is counted in `fanout_telemetry_spans_dropped_total` (by
//! `reason`: `queue_full`, `queue_bytes`, `export_failed`).
//!
//! Memory is bounded by `max_bytes` of spans, whatever the collector does
//! and whatever the clients send (and, while a batch is sent, its protobuf
//! copy: the exporter's): a collector down fails each batch at once; one
//! that hangs holds the export thread up to the export timeout while the
//! queue fills and then drops.

use super::{truncate, weight};
use crate::metrics;
use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{BatchSpanProcessor, Span, SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// One span in [`InFlight`]'s word: the spans count above bit 44, the
/// bytes below.
const SPAN: u64 = 1 << 44;
/// The bytes' part of the word.
const BYTES: u64 = SPAN - 1;
/// The most spans a queue may hold: the word's span part (20 bits) never
/// overflows, however many threads add at once.
pub(crate) const MAX_SPANS: usize = 1 << 19;
/// The most bytes a queue may hold (64 GiB): one span weighs at most
/// that, so 255 threads adding at once cannot carry the bytes' part into
/// the spans'.
pub(crate) const MAX_BYTES: u64 = 1 << 36;

/// The spans queued or being exported and their estimated bytes, in one
/// word, shared by the processor that admits them and the exporter that
/// lets them go.
#[derive(Debug)]
pub(crate) struct InFlight {
    word: AtomicU64,
    max_spans: u64,
    max_bytes: u64,
}

impl InFlight {
    /// An empty queue of at most `max_spans` spans (up to [`MAX_SPANS`])
    /// and `max_bytes` (up to [`MAX_BYTES`]).
    pub(crate) fn new(max_spans: usize, max_bytes: u64) -> Arc<Self> {
        Arc::new(InFlight {
            word: AtomicU64::new(0),
            max_spans: max_spans.clamp(1, MAX_SPANS) as u64,
            max_bytes: max_bytes.min(MAX_BYTES),
        })
    }

    /// Takes a place and `bytes` for one span, or says why not
    /// (`queue_full`, `queue_bytes`): one atomic add, and a [`release`]
    /// to give back a refusal (saturating: an over-release meanwhile must
    /// not make the give-back wrap).
    ///
    /// [`release`]: InFlight::release
    pub(crate) fn admit(&self, bytes: u64) -> Result<(), &'static str> {
        if bytes > self.max_bytes {
            return Err("queue_bytes");
        }
        let add = SPAN + bytes;
        let before = self.word.fetch_add(add, Ordering::Relaxed);
        let refusal = if before / SPAN >= self.max_spans {
            "queue_full"
        } else if (before & BYTES) + bytes > self.max_bytes {
            "queue_bytes"
        } else {
            return Ok(());
        };
        self.release(1, bytes);
        Err(refusal)
    }

    /// Gives back the places and bytes of `spans` spans weighing `bytes`,
    /// each part stopping at zero: a release that does not match what was
    /// admitted (a batch weighed again after a clone shrank its lists)
    /// never wraps the word nor borrows from the spans' part. Too much given
    /// back only loosens the bounds until the queue drains; it never makes
    /// them refuse for ever. One compare-and-swap, retried while others
    /// change the word.
    pub(crate) fn release(&self, spans: usize, bytes: u64) {
        let spans = u64::try_from(spans).unwrap_or(u64::MAX);
        let less = |word: u64| {
            let held_spans = (word / SPAN).saturating_sub(spans);
            Some(held_spans * SPAN + (word & BYTES).saturating_sub(bytes))
        };
        // `less` always answers: the update cannot fail.
        let _ = self
            .word
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, less);
    }

    /// The spans and bytes held now.
    #[cfg(test)]
    pub(crate) fn held(&self) -> (u64, u64) {
        let word = self.word.load(Ordering::Relaxed);
        (word / SPAN, word & BYTES)
    }
}

/// A batch processor that cuts each span's texts, admits at most
/// `max_spans` spans and `max_bytes` at once, and counts the others.
#[derive(Debug)]
pub(crate) struct CountingProcessor {
    inner: BatchSpanProcessor,
    in_flight: Arc<InFlight>,
    /// The attribute value length limit, in bytes.
    value_limit: usize,
}

impl CountingProcessor {
    /// Wraps `inner`, whose queue holds at least `in_flight`'s spans and
    /// whose exporter is a [`CountingExporter`] sharing `in_flight`; texts
    /// past `value_limit` bytes are cut.
    pub(crate) fn new(
        inner: BatchSpanProcessor,
        in_flight: Arc<InFlight>,
        value_limit: usize,
    ) -> Self {
        Self {
            inner,
            in_flight,
            value_limit,
        }
    }
}

impl SpanProcessor for CountingProcessor {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, mut span: SpanData) {
        truncate::span(&mut span, self.value_limit);
        if let Err(reason) = self.in_flight.admit(weight::of(&span)) {
            metrics::spans_dropped(reason, 1);
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

/// A [`CountingProcessor`] shared by the tracer provider and the direct
/// spans (`direct.rs`). Its resource is set before it is shared: the
/// provider's own `set_resource` call reaches nothing.
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

/// An exporter that gives back the places and bytes of each batch it was
/// handed, and counts a failed batch's spans.
#[derive(Debug)]
pub(crate) struct CountingExporter<E> {
    inner: E,
    in_flight: Arc<InFlight>,
}

impl<E> CountingExporter<E> {
    /// Wraps `inner`, sharing `in_flight` with the [`CountingProcessor`].
    pub(crate) fn new(inner: E, in_flight: Arc<InFlight>) -> Self {
        Self { inner, in_flight }
    }
}

impl<E: SpanExporter> SpanExporter for CountingExporter<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        // The weights the processor took: the spans are as it queued them.
        let bytes = batch.iter().map(weight::of).sum();
        let result = self.inner.export(batch).await;
        self.in_flight.release(spans, bytes);
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

#[cfg(test)]
#[path = "processor_tests.rs"]
mod tests;
