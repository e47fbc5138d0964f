//! A span's estimated weight in memory, in bytes, as the export queue
//! counts it (`processor.rs`): its structure, and every text and value it
//! holds — name, attributes, events, links, status, trace state.
//!
//! An estimate, not an allocator's count: what a span holds grows with it,
//! so a queue bounded in these bytes is bounded in memory. The same span
//! always weighs the same (the queue gives back what it took).

use opentelemetry::trace::{SpanContext, Status};
use opentelemetry::{Array, KeyValue, StringValue, Value};
use opentelemetry_sdk::trace::SpanData;
use std::mem::size_of;

/// `span`'s estimated bytes.
pub(crate) fn of(span: &SpanData) -> u64 {
    let mut bytes = size_of::<SpanData>() + span.name.len() + context(&span.span_context);
    bytes += attributes(&span.attributes);
    for event in span.events.iter() {
        bytes += size_of::<opentelemetry::trace::Event>() + event.name.len();
        bytes += attributes(&event.attributes);
    }
    for link in span.links.iter() {
        bytes += size_of::<opentelemetry::trace::Link>() + context(&link.span_context);
        bytes += attributes(&link.attributes);
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

fn attributes(attributes: &[KeyValue]) -> usize {
    attributes
        .iter()
        .map(|kv| size_of::<KeyValue>() + kv.key.as_str().len() + value(&kv.value))
        .sum()
}

fn value(value: &Value) -> usize {
    match value {
        Value::String(s) => s.as_str().len(),
        Value::Array(Array::String(values)) => values
            .iter()
            .map(|s| size_of::<StringValue>() + s.as_str().len())
            .sum(),
        Value::Array(Array::Bool(values)) => values.len(),
        Value::Array(Array::I64(values)) => values.len() * size_of::<i64>(),
        Value::Array(Array::F64(values)) => values.len() * size_of::<f64>(),
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
}
