//! The buffer a request is written into, made once: at least the bytes
//! `request` writes, so it never grows (a growing buffer holds its old and
//! new allocations at once, and ends with up to twice its bytes). Each
//! text's length, and for every field the most its key and length can
//! take: a few bytes a field more than it uses, and less than the spans
//! weigh in the export queue (`weight.rs`: a span's structure alone is
//! larger than its fixed fields' room), so a batch being exported holds at
//! most about twice its queued bytes.

use opentelemetry::trace::{SpanContext, Status};
use opentelemetry::{Array, InstrumentationScope, KeyValue, Value};
use opentelemetry_sdk::trace::SpanData;
use opentelemetry_sdk::Resource;

/// A field's key (field numbers here are at most 16: two bytes) and the
/// longest length a message under 32 GiB can have (five bytes).
const FRAME: usize = 2 + 5;

/// The same for the request's outer messages (a length of up to ten).
const OUTER: usize = 2 + 10;

/// A span's fields that are not texts nor lists: its ids, kind, times,
/// counts, status code and flags, with their keys (and its own frame).
const SPAN_FIXED: usize = 160;

/// An event's time and count, a link's ids, count and flags.
const EVENT_FIXED: usize = 32;
const LINK_FIXED: usize = 64;

/// A number, a flag, a float as a value: a varint of at most ten bytes.
const NUMBER: usize = 2 + 10;

/// An array's element as written: its `AnyValue`'s key and length (two
/// bytes), the value's key, and the value — a flag's byte, an integer's
/// varint of at most ten bytes, a float's eight.
pub(crate) const BOOL_ELEMENT: usize = 2 + 1 + 1;
pub(crate) const I64_ELEMENT: usize = 2 + 1 + 10;
pub(crate) const F64_ELEMENT: usize = 2 + 1 + 8;

/// At least the bytes of the request `batch` is written as, under
/// `resource`, with `scopes` its spans' scopes.
pub(super) fn of(
    resource: &Resource,
    scopes: &[&InstrumentationScope],
    batch: &[SpanData],
) -> usize {
    let mut room = 3 * OUTER + OUTER + resource.schema_url().map_or(0, str::len);
    room += resource
        .iter()
        .map(|(key, value)| attribute(key.as_str(), value))
        .sum::<usize>();
    for scope in scopes {
        room += 2 * OUTER + 2 * FRAME + scope.name().len();
        room += scope.version().map_or(0, str::len) + FRAME;
        room += scope.schema_url().map_or(0, str::len) + FRAME;
        room += scope
            .attributes()
            .map(|kv| attribute(kv.key.as_str(), &kv.value))
            .sum::<usize>();
    }
    batch.iter().map(span).sum::<usize>() + room
}

fn span(span: &SpanData) -> usize {
    let mut room = SPAN_FIXED + FRAME + span.name.len() + state(&span.span_context);
    room += attributes(&span.attributes);
    for event in span.events.iter() {
        room += EVENT_FIXED + FRAME + event.name.len() + attributes(&event.attributes);
    }
    for link in span.links.iter() {
        room += LINK_FIXED + state(&link.span_context) + attributes(&link.attributes);
    }
    if let Status::Error { description } = &span.status {
        room += FRAME + description.len();
    }
    room
}

/// A trace state's header: each member's key and value, `=` and `,`.
fn state(context: &SpanContext) -> usize {
    FRAME
        + context
            .trace_state()
            .into_iter()
            .map(|(key, value)| key.len() + value.len() + 2)
            .sum::<usize>()
}

fn attributes(list: &[KeyValue]) -> usize {
    list.iter()
        .map(|kv| attribute(kv.key.as_str(), &kv.value))
        .sum()
}

/// A `KeyValue`: its frame, its key's, its `AnyValue`'s, and the value.
fn attribute(key: &str, value: &Value) -> usize {
    3 * FRAME + key.len() + self::value(value)
}

fn value(value: &Value) -> usize {
    match value {
        Value::Bool(_) | Value::I64(_) | Value::F64(_) => NUMBER,
        Value::String(s) => FRAME + s.as_str().len(),
        Value::Array(array) => FRAME + elements(array),
        other => FRAME + other.to_string().len(),
    }
}

/// Each element an `AnyValue` message of its own (a number's: under 128
/// bytes, its key and length two bytes), counted as written — a list of
/// numbers weighs no more than that in the queue (`weight.rs`).
fn elements(array: &Array) -> usize {
    match array {
        Array::Bool(items) => items.len() * BOOL_ELEMENT,
        Array::I64(items) => items.len() * I64_ELEMENT,
        Array::F64(items) => items.len() * F64_ELEMENT,
        Array::String(items) => items.iter().map(|s| 2 * FRAME + s.as_str().len()).sum(),
        _ => 0,
    }
}
