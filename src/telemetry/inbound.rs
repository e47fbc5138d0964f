//! What an inbound request says of its trace: its `traceparent` and
//! `tracestate`, read as OpenTelemetry's propagator reads them, the
//! `tracestate` bounded as the W3C advises; and whether its `traceparent`
//! is written as the engine would write one (so it can go on as it came).
//! Both `context.rs` (a request's span adopts the caller's context) and
//! `sampling.rs` (the caller decides) read it here, so neither names the
//! other for it.

use opentelemetry::propagation::{Extractor, TextMapPropagator as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use std::borrow::Cow;

/// The bytes of `tracestate` kept: the W3C's advice is to propagate at
/// least 512 characters of it, cut past that.
pub(crate) const MAX_TRACESTATE: usize = 512;
/// A list member longer than this is the first cut, as the W3C advises.
const MAX_MEMBER: usize = 128;

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

/// The trace context `headers` carry, as OpenTelemetry's propagator reads
/// it, its `tracestate` (every line of it joined) bounded.
pub(crate) fn extract(headers: &http::HeaderMap) -> opentelemetry::Context {
    TraceContextPropagator::new().extract(&Inbound::new(headers))
}

/// Whether `headers` carry one `traceparent`, written as the engine writes
/// one: version `00`, lowercase hex ids, the 55 bytes and no more (the
/// W3C's form; OpenTelemetry's parse takes more — other versions, ids of
/// any length, other flags — which the engine would not pass on as they
/// came).
pub(crate) fn canonical_traceparent(headers: &http::HeaderMap) -> bool {
    let mut lines = headers.get_all("traceparent").iter();
    let (Some(value), None) = (lines.next(), lines.next()) else {
        return false;
    };
    let bytes = value.as_bytes();
    let hex = |range: std::ops::Range<usize>| {
        bytes[range]
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
    };
    bytes.len() == 55
        && bytes.starts_with(b"00-")
        && bytes[35] == b'-'
        && bytes[52] == b'-'
        && hex(3..35)
        && hex(36..52)
        && hex(53..55)
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
