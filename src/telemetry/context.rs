//! W3C trace context across the hop: `traceparent` read from the inbound
//! request, written on every upstream request sent.
//!
//! `traceparent` is written (a version, the trace's and the span's ids and
//! the sampled flag: no secret), to every origin, so a registry's own
//! traces join the request's. A client's `tracestate` is kept on the
//! request's spans (every one of them carries it) only up to 512 bytes,
//! cut as the W3C advises (`inbound.rs`), and forwarded, as parsed, with
//! every upstream request in the client's trace (the W3C asks every
//! participant to pass it on).
//!
//! Both are skipped, at the cost of one atomic load, until a
//! [`Telemetry`](super::Telemetry) layer has been made in this process. A
//! request sampled out has no span to name: its `traceparent` carries its
//! trace id, a span id of its own and the unsampled flag — or, when the
//! caller decided so, the caller's `traceparent` as it came, with its
//! `tracestate` (`sampling.rs`).

use super::live::is_active;
use opentelemetry::trace::{SpanContext, SpanId, TraceId};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Makes the trace context `headers` carry (`traceparent`) the parent of
/// `span`, which must not have been entered yet. An absent or malformed
/// header leaves the span a root.
pub(crate) fn adopt_parent(span: &tracing::Span, headers: &http::HeaderMap) {
    if !is_active() || span.is_none() || !headers.contains_key("traceparent") {
        return;
    }
    let parent = super::inbound::extract(headers);
    // Not exported (filtered out, no layer): nothing to parent.
    let _ = span.set_parent(parent);
}

/// Adds `traceparent` naming the current span to `headers`, when spans are
/// exported and there is one (and the caller's `tracestate`, in the
/// caller's trace).
pub(crate) fn inject_current(headers: &mut http::HeaderMap) {
    if let Some((traceparent, tracestate)) = current_context() {
        headers.insert(
            http::header::HeaderName::from_static("traceparent"),
            traceparent,
        );
        // Any `tracestate` the headers held was of another context.
        match tracestate {
            Some(tracestate) => {
                headers.insert(
                    http::header::HeaderName::from_static("tracestate"),
                    tracestate,
                );
            }
            None => {
                headers.remove("tracestate");
            }
        }
    }
}

/// `traceparent` naming the current span, when spans are exported and there
/// is one; else, while the caller's decision stands, the caller's as it
/// came; for a request the engine sampled out, its
/// trace id, a span id of its own and the unsampled flag
/// (`sampling::passed_on`); in the caller's trace, with the caller's
/// `tracestate`. Written into a buffer on the
/// stack: the header's value is the one allocation (the propagator formats
/// a `String`, and a `tracestate` nobody sends, for each upstream request),
/// shared by its clones.
pub(crate) fn current_context() -> Option<(http::HeaderValue, Option<http::HeaderValue>)> {
    if !is_active() {
        return None;
    }
    // A direct span entered (`direct.rs`): the CLIENT span the transport
    // runs in.
    if let Some(value) = super::direct::with_current(|span| {
        let context = span.context();
        in_trace(context, true)
    }) {
        return Some(value);
    }
    // A read made away from its request's task (`carried.rs`): the span it
    // is under, kept from the request's task — the only one it has when
    // no direct span was built (a level filter that keeps DEBUG out).
    let carried = super::carried::parent();
    if let super::carried::Parent::Kept(parent) = &carried {
        if parent.is_valid() {
            return Some(in_trace(parent, parent.is_sampled()));
        }
    }
    let decision = super::sampling::current();
    // A request sampled out has no span to look for; nor has a read carried
    // where the current span is not the request's (another request's task
    // with none kept, a span not opened in the request's task).
    if decision.is_none_or(|decision| decision.sampled) && carried.takes_current() {
        // The nearest span the telemetry exports, past any only another
        // layer takes (a log's, async-graphql's field spans).
        if let Some(context) = super::opened::exported_current() {
            return Some(in_trace(&context, context.is_sampled()));
        }
    }
    // No span to name: sampled out, or no layer saw the request (a level
    // filter of the application's kept its span out).
    let passed = super::sampling::passed_on()?;
    let value = traceparent(passed.trace_id, passed.span_id, passed.sampled);
    Some((value, passed.tracestate))
}

/// `traceparent` naming `span` (of the request's), and the caller's
/// `tracestate` when the span is in the caller's trace (the W3C asks every
/// participant to pass a `tracestate` on; the engine adds no member). Away
/// from any request the engine opened (behind `FanoutLayer`, where the
/// application adopts the caller's context), the span's own.
fn in_trace(span: &SpanContext, sampled: bool) -> (http::HeaderValue, Option<http::HeaderValue>) {
    let (trace_id, span_id) = (span.trace_id(), span.span_id());
    let tracestate = match super::sampling::caller_tracestate(trace_id) {
        Some(of_request) => of_request,
        None => Some(span.trace_state().header())
            .filter(|state| !state.is_empty())
            .and_then(|state| http::HeaderValue::from_str(&state).ok()),
    };
    (traceparent(trace_id, span_id, sampled), tracestate)
}

/// Every byte's two lowercase hex digits.
const HEX_PAIRS: [[u8; 2]; 256] = {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut pairs = [[0; 2]; 256];
    let mut byte = 0;
    while byte < 256 {
        pairs[byte] = [HEX[byte >> 4], HEX[byte & 0xf]];
        byte += 1;
    }
    pairs
};

/// `00-{trace id}-{span id}-{flags}`, as `TraceContextPropagator` writes
/// it (lowercase hex; the sampled flag alone).
fn traceparent(trace_id: TraceId, span_id: SpanId, sampled: bool) -> http::HeaderValue {
    let mut value = *b"00-00000000000000000000000000000000-0000000000000000-00";
    // Each byte's two digits looked up at once.
    let digits = |out: &mut [u8], bytes: &[u8]| {
        for (pair, byte) in out.chunks_exact_mut(2).zip(bytes) {
            pair.copy_from_slice(&HEX_PAIRS[usize::from(*byte)]);
        }
    };
    digits(&mut value[3..35], &trace_id.to_bytes());
    digits(&mut value[36..52], &span_id.to_bytes());
    if sampled {
        value[54] = b'1';
    }
    // Owned by the value's own `Bytes`: one allocation, and a clone of it
    // (the HTTP client keeps a copy of a request's headers for its retries
    // and redirects) only counts a reference; a value copied from a slice
    // allocates again at its first clone.
    http::HeaderValue::from_maybe_shared(bytes::Bytes::from_owner(value))
        .expect("hex digits and dashes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use opentelemetry_sdk::trace::{IdGenerator as _, RandomIdGenerator};

    #[test]
    fn traceparent_is_written_as_the_propagator_writes_it() {
        use opentelemetry::propagation::TextMapPropagator as _;
        use opentelemetry::trace::TraceContextExt as _;
        use opentelemetry::trace::{SpanContext, TraceFlags, TraceState};
        let ids = RandomIdGenerator::default();
        for sampled in [true, false] {
            let (trace_id, span_id) = (ids.new_trace_id(), ids.new_span_id());
            let flags = if sampled {
                TraceFlags::SAMPLED
            } else {
                TraceFlags::default()
            };
            let context = SpanContext::new(trace_id, span_id, flags, false, TraceState::NONE);
            let cx = opentelemetry::Context::new().with_remote_span_context(context);
            let mut expected = std::collections::HashMap::new();
            TraceContextPropagator::new().inject_context(&cx, &mut expected);
            assert_eq!(
                traceparent(trace_id, span_id, sampled).to_str().unwrap(),
                expected["traceparent"],
            );
        }
    }
}
