//! A span's estimated weight in memory, in bytes, as the export queue
//! counts it (`processor.rs`): its structure, and every text and value it
//! holds — name, attributes, events, links, status, trace state.
//!
//! An estimate, not an allocator's count: what a span holds grows with it,
//! so a queue bounded in these bytes is bounded in memory. A list is
//! weighed by what it holds, its capacity, not by the entries it uses: a
//! direct span's attributes (`direct.rs`) are reserved for those it may
//! note later, and the SDK's grow by doubling. The same span always weighs
//! the same (the queue gives back what it took: nothing between them
//! touches a span's lists).

use super::encode::room::{BOOL_ELEMENT, F64_ELEMENT, I64_ELEMENT};
use opentelemetry::trace::{SpanContext, Status};
use opentelemetry::{Array, KeyValue, StringValue, Value};
use opentelemetry_sdk::trace::SpanData;
use std::mem::size_of;

/// `span`'s estimated bytes.
pub(crate) fn of(span: &SpanData) -> u64 {
    let mut bytes = size_of::<SpanData>() + span.name.len() + context(&span.span_context);
    bytes += attributes(&span.attributes);
    bytes += held(&span.events.events);
    for event in span.events.iter() {
        bytes += event.name.len() + attributes(&event.attributes);
    }
    bytes += held(&span.links.links);
    for link in span.links.iter() {
        bytes += context(&link.span_context) + attributes(&link.attributes);
    }
    if let Status::Error { description } = &span.status {
        bytes += description.len();
    }
    bytes as u64
}

/// A context's trace state (its ids are in the structure).
fn context(context: &SpanContext) -> usize {
    context
        .trace_state()
        .into_iter()
        .map(|(key, value)| size_of::<(String, String)>() + key.len() + value.len())
        .sum()
}

/// What `list`'s buffer holds: every place it reserved, used or not.
fn held<T>(list: &Vec<T>) -> usize {
    list.capacity() * size_of::<T>()
}

fn attributes(attributes: &Vec<KeyValue>) -> usize {
    held(attributes)
        + attributes
            .iter()
            .map(|kv| kv.key.as_str().len() + value(&kv.value))
            .sum::<usize>()
}

fn value(value: &Value) -> usize {
    match value {
        Value::String(s) => s.as_str().len(),
        Value::Array(Array::String(values)) => values
            .iter()
            .map(|s| size_of::<StringValue>() + s.as_str().len())
            .sum(),
        // A list of numbers at the bytes it takes in the export's protobuf
        // (more than in memory), so the export's buffer for a batch is
        // never larger than the batch's weight (`encode/room.rs`).
        Value::Array(Array::Bool(values)) => values.len() * BOOL_ELEMENT,
        Value::Array(Array::I64(values)) => values.len() * I64_ELEMENT,
        Value::Array(Array::F64(values)) => values.len() * F64_ELEMENT,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::super::truncate::tests::data;
    use super::*;
    use opentelemetry::trace::{TraceFlags, TraceId, TraceState};
    use std::str::FromStr as _;

    #[test]
    fn a_span_weighs_its_texts_and_its_trace_state() {
        let bare = of(&data("query", vec![]));
        assert!(bare >= size_of::<SpanData>() as u64);
        let named = of(&data(
            "query",
            vec![KeyValue::new("graphql.operation.name", "x".repeat(10_000))],
        ));
        assert!(named >= bare + 10_000, "{named} against {bare}");
        let mut stated = data("query", vec![]);
        let state =
            TraceState::from_str(&format!("a={},b={}", "v".repeat(200), "w".repeat(200))).unwrap();
        stated.span_context = SpanContext::new(
            TraceId::from_bytes([1; 16]),
            opentelemetry::trace::SpanId::from_bytes([1; 8]),
            TraceFlags::SAMPLED,
            true,
            state,
        );
        assert!(of(&stated) >= bare + 402);
        // The same span, the same weight.
        assert_eq!(of(&stated), of(&stated.clone()));
    }

    #[test]
    fn a_span_weighs_the_places_its_lists_reserved_not_only_those_used() {
        // A direct span's attributes are reserved for those it may note
        // later (`direct.rs`): seven places, two used.
        let mut reserved = Vec::with_capacity(7);
        reserved.push(KeyValue::new("server.address", "registry.test"));
        reserved.push(KeyValue::new("url.path", "/v2/x/manifests/1"));
        let exact = reserved.clone();
        assert_eq!(exact.capacity(), 2);
        let (spare, tight) = (of(&data("GET", reserved)), of(&data("GET", exact)));
        assert_eq!(
            spare,
            tight + 5 * size_of::<KeyValue>() as u64,
            "the five unused places are held too"
        );
        // Events and links: the same.
        let mut with_events = data("GET", vec![]);
        with_events.events.events.reserve_exact(4);
        assert_eq!(
            of(&with_events),
            of(&data("GET", vec![])) + 4 * size_of::<opentelemetry::trace::Event>() as u64
        );
    }
}
