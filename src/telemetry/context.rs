//! W3C trace context across the hop: `traceparent` read from the inbound
//! request, written on every upstream request sent.
//!
//! Only `traceparent` is written (a version, the trace's and the span's ids
//! and the sampled flag: no secret), to every origin, so a registry's own
//! traces join the request's. A client's `tracestate` is not forwarded.
//!
//! Both are skipped, at the cost of one atomic load, until a
//! [`Telemetry`](super::Telemetry) layer has been made in this process. A
//! request sampled out has no span to name: its `traceparent` carries its
//! trace id, a span id of its own and the unsampled flag
//! (`sampling.rs`).

use super::live::is_active;
use opentelemetry::propagation::{Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry_http::HeaderExtractor;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{IdGenerator as _, RandomIdGenerator};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Makes the trace context `headers` carry (`traceparent`) the parent of
/// `span`, which must not have been entered yet. An absent or malformed
/// header leaves the span a root.
pub(crate) fn adopt_parent(span: &tracing::Span, headers: &http::HeaderMap) {
    if !is_active() || span.is_none() || !headers.contains_key("traceparent") {
        return;
    }
    let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    // Not exported (filtered out, no layer): nothing to parent.
    let _ = span.set_parent(parent);
}

/// Adds `traceparent` naming the current span to `headers`, when spans are
/// exported and there is one.
pub(crate) fn inject_current(headers: &mut http::HeaderMap) {
    if !is_active() {
        return;
    }
    let cx = tracing::Span::current().context();
    if cx.span().span_context().is_valid() {
        TraceContextPropagator::new().inject_context(&cx, &mut TraceparentOnly(headers));
        return;
    }
    // A request sampled out has no span: its trace id, unsampled.
    if let Some(decision) = super::sampling::current() {
        let span_id = RandomIdGenerator::default().new_span_id();
        let value = format!("00-{}-{span_id}-00", decision.trace_id);
        if let Ok(value) = http::HeaderValue::from_str(&value) {
            headers.insert(http::header::HeaderName::from_static("traceparent"), value);
        }
    }
}

/// Writes `traceparent` and nothing else (no `tracestate`).
struct TraceparentOnly<'a>(&'a mut http::HeaderMap);

impl Injector for TraceparentOnly<'_> {
    fn set(&mut self, key: &str, value: String) {
        if key == "traceparent" {
            if let Ok(value) = http::HeaderValue::from_str(&value) {
                self.0
                    .insert(http::header::HeaderName::from_static("traceparent"), value);
            }
        }
    }
}
