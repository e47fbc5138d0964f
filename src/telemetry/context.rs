//! W3C trace context across the hop: `traceparent` read from the inbound
//! request, written on every upstream request sent.
//!
//! Only `traceparent` is written (a version, the trace's and the span's ids
//! and the sampled flag: no secret), to every origin, so a registry's own
//! traces join the request's. A client's `tracestate` is not forwarded; it
//! is kept on the request's spans (every one of them carries it) only up
//! to 512 bytes, cut as the W3C advises ([`bounded_tracestate`]).
//!
//! Both are skipped, at the cost of one atomic load, until a
//! [`Telemetry`](super::Telemetry) layer has been made in this process. A
//! request sampled out has no span to name: its `traceparent` carries its
//! trace id, a span id of its own and the unsampled flag
//! (`sampling.rs`).

use super::live::is_active;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{IdGenerator as _, RandomIdGenerator};
use std::borrow::Cow;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The bytes of `tracestate` kept: the W3C's advice is to propagate at
/// least 512 characters of it, cut past that.
pub(crate) const MAX_TRACESTATE: usize = 512;
/// A list member longer than this is the first cut, as the W3C advises.
const MAX_MEMBER: usize = 128;

/// Makes the trace context `headers` carry (`traceparent`) the parent of
/// `span`, which must not have been entered yet. An absent or malformed
/// header leaves the span a root.
pub(crate) fn adopt_parent(span: &tracing::Span, headers: &http::HeaderMap) {
    if !is_active() || span.is_none() || !headers.contains_key("traceparent") {
        return;
    }
    let parent = TraceContextPropagator::new().extract(&Inbound::new(headers));
    // Not exported (filtered out, no layer): nothing to parent.
    let _ = span.set_parent(parent);
}

/// `tracestate` as the W3C advises a vendor to cut it: as it is within
/// [`MAX_TRACESTATE`] bytes; past it, without its members longer than 128
/// bytes, then without the members at its end until it fits. `None` when
/// nothing is left.
pub(crate) fn bounded_tracestate(tracestate: &str) -> Option<Cow<'_, str>> {
    if tracestate.len() <= MAX_TRACESTATE {
        return Some(Cow::Borrowed(tracestate));
    }
    let mut kept = String::new();
    let members = tracestate
        .split(',')
        .map(|member| member.trim_matches([' ', '\t']))
        .filter(|member| !member.is_empty() && member.len() <= MAX_MEMBER);
    for member in members {
        let comma = usize::from(!kept.is_empty());
        if kept.len() + comma + member.len() > MAX_TRACESTATE {
            break;
        }
        if comma == 1 {
            kept.push(',');
        }
        kept.push_str(member);
    }
    (!kept.is_empty()).then_some(Cow::Owned(kept))
}

/// The inbound request's trace context headers, its `tracestate` (every
/// line of it, joined) bounded.
struct Inbound<'a> {
    headers: &'a http::HeaderMap,
    tracestate: Option<String>,
}

impl<'a> Inbound<'a> {
    fn new(headers: &'a http::HeaderMap) -> Self {
        let lines: Vec<&str> = headers
            .get_all("tracestate")
            .iter()
            .filter_map(|line| line.to_str().ok())
            .collect();
        let tracestate = match lines.as_slice() {
            [] => None,
            lines => bounded_tracestate(&lines.join(",")).map(Cow::into_owned),
        };
        Inbound {
            headers,
            tracestate,
        }
    }
}

impl Extractor for Inbound<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        if key.eq_ignore_ascii_case("tracestate") {
            return self.tracestate.as_deref();
        }
        self.headers.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.headers.keys().map(http::HeaderName::as_str).collect()
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tracestate_within_512_bytes_is_kept_whole() {
        let state = format!("a={},b=1", "v".repeat(200));
        assert_eq!(bounded_tracestate(&state).as_deref(), Some(state.as_str()));
    }

    #[test]
    fn a_longer_one_loses_its_long_members_then_its_last_ones() {
        let long = format!("long={}", "x".repeat(200));
        let short = |i: usize| format!("k{i:02}={}", "y".repeat(36)); // 40 bytes
        let mut members = vec![short(0), long.clone(), short(1)];
        members.extend((2..20).map(short));
        let state = members.join(" , ");
        let kept = bounded_tracestate(&state).unwrap();
        assert!(kept.len() <= MAX_TRACESTATE, "{}", kept.len());
        assert!(!kept.contains("long="));
        // 12 members of 40 bytes and their 11 commas: 491 bytes; a 13th
        // would pass 512.
        let expected: Vec<String> = (0..12).map(short).collect();
        assert_eq!(kept, expected.join(","));
        // The attacker's: 32 members of 250 bytes, all of them too long.
        let huge = (0..32)
            .map(|i| format!("v{i:02}={}", "z".repeat(246)))
            .collect::<Vec<_>>()
            .join(",");
        assert_eq!(bounded_tracestate(&huge), None);
    }

    #[test]
    fn the_inbound_tracestate_lines_are_joined_then_bounded() {
        let mut headers = http::HeaderMap::new();
        headers.append("tracestate", "a=1".parse().unwrap());
        headers.append("tracestate", "b=2".parse().unwrap());
        assert_eq!(Inbound::new(&headers).get("tracestate"), Some("a=1,b=2"));
        headers.append("tracestate", "c".repeat(600).parse().unwrap());
        assert_eq!(Inbound::new(&headers).get("tracestate"), Some("a=1,b=2"));
        assert_eq!(
            Inbound::new(&http::HeaderMap::new()).get("tracestate"),
            None
        );
    }
}
