//! A batch of spans as OTLP's `ExportTraceServiceRequest`, written straight
//! from the SDK's span data into one buffer of protobuf.
//!
//! The OTLP exporter first copies each span into `opentelemetry-proto`'s
//! generated structs — a `String` for every attribute's key and text, a
//! `Vec` for each id, list and attribute set, about twenty allocations a
//! span — then encodes those. This module writes the same bytes without the
//! copy: each message is written into one buffer, in one pass, its length
//! put before it once it is written. The schema is OTLP's
//! trace v1 (`opentelemetry/proto/trace/v1/trace.proto`), field for field
//! as the exporter fills it; the tests decode what it writes with the
//! generated structs (`fanout-testkit`'s collector).

use opentelemetry::trace::{SpanKind, Status};
use opentelemetry::{Array, InstrumentationScope, Key, KeyValue, StringValue, Value};
use opentelemetry_sdk::trace::SpanData;
use opentelemetry_sdk::Resource;
use std::time::{SystemTime, UNIX_EPOCH};

pub(super) mod room;

/// The protobuf wire types used here.
const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LEN: u32 = 2;
const FIXED32: u32 = 5;

/// One pass over one request. A nested message's length goes before it,
/// as a varint, and is known only once the message is written: one byte is
/// held for it (most messages — an attribute, a value — are under 128
/// bytes), and a longer message is moved up by the bytes its length needs,
/// a copy within the buffer: each byte moved once for each message of 128
/// bytes or more around it (a span, its scope's spans, the resource's —
/// and an attribute's value, an event, an array within it: at most eight),
/// against counting every field first. The buffer is made once, at least
/// as large as the request, from a walk of the texts' lengths alone
/// (`encode/room.rs`).
struct Encoder {
    buf: Vec<u8>,
}

impl Encoder {
    fn put(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Pushed byte by byte (no copy called per byte).
    fn varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.buf.push(value as u8 | 0x80);
            value >>= 7;
        }
        self.buf.push(value as u8);
    }

    fn key(&mut self, field: u32, wire: u32) {
        self.varint(u64::from(field << 3 | wire));
    }

    fn bytes(&mut self, field: u32, value: &[u8]) {
        self.key(field, LEN);
        self.varint(value.len() as u64);
        self.put(value);
    }

    /// A string field, left out when empty (proto3's default).
    fn text(&mut self, field: u32, value: &str) {
        if !value.is_empty() {
            self.bytes(field, value.as_bytes());
        }
    }

    fn uint(&mut self, field: u32, value: u64) {
        if value != 0 {
            self.key(field, VARINT);
            self.varint(value);
        }
    }

    fn fixed64(&mut self, field: u32, value: u64) {
        if value != 0 {
            self.key(field, FIXED64);
            self.put(&value.to_le_bytes());
        }
    }

    /// A time as nanoseconds since the epoch, left out at or before it
    /// (the exporter's 0).
    fn time(&mut self, field: u32, time: SystemTime) {
        self.fixed64(field, nanos(time));
    }

    fn fixed32(&mut self, field: u32, value: u32) {
        if value != 0 {
            self.key(field, FIXED32);
            self.put(&value.to_le_bytes());
        }
    }

    /// A nested message, `write` its fields.
    fn message(&mut self, field: u32, write: impl FnOnce(&mut Self)) {
        self.key(field, LEN);
        let at = self.buf.len();
        self.buf.push(0);
        write(self);
        let end = self.buf.len();
        let len = end - at - 1;
        if len < 0x80 {
            self.buf[at] = len as u8;
            return;
        }
        let size = varint_len(len as u64);
        self.buf.resize(end + size - 1, 0);
        self.buf.copy_within(at + 1..end, at + size);
        let mut value = len as u64;
        for (i, byte) in self.buf[at..at + size].iter_mut().enumerate() {
            let more = if i + 1 < size { 0x80 } else { 0 };
            *byte = (value & 0x7f) as u8 | more;
            value >>= 7;
        }
    }
}

/// The bytes `value` takes as a varint: 7 bits a byte, at least one.
fn varint_len(value: u64) -> usize {
    (64 - (value | 1).leading_zeros() as usize).div_ceil(7)
}

fn nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// `AnyValue`'s fields for `value`.
fn any_value(out: &mut Encoder, value: &Value) {
    match value {
        Value::Bool(b) => {
            out.key(2, VARINT);
            out.varint(u64::from(*b));
        }
        Value::I64(i) => {
            out.key(3, VARINT);
            out.varint(*i as u64);
        }
        Value::F64(f) => {
            out.key(4, FIXED64);
            out.put(&f.to_bits().to_le_bytes());
        }
        Value::String(s) => out.bytes(1, s.as_str().as_bytes()),
        Value::Array(array) => out.message(5, |o| array_values(o, array)),
        other => out.bytes(1, other.to_string().as_bytes()),
    }
}

/// `ArrayValue`'s `values`.
fn array_values(out: &mut Encoder, array: &Array) {
    fn each<T>(out: &mut Encoder, items: &[T], value: impl Fn(&T) -> Value) {
        for item in items {
            let value = value(item);
            out.message(1, |o| any_value(o, &value));
        }
    }
    match array {
        Array::Bool(items) => each(out, items, |b| Value::Bool(*b)),
        Array::I64(items) => each(out, items, |i| Value::I64(*i)),
        Array::F64(items) => each(out, items, |f| Value::F64(*f)),
        Array::String(items) => each(out, items, |s: &StringValue| Value::String(s.clone())),
        _ => {}
    }
}

/// A `KeyValue` message as field `field`.
fn attribute(out: &mut Encoder, field: u32, name: &Key, value: &Value) {
    out.message(field, |o| {
        o.text(1, name.as_str());
        o.message(2, |o| any_value(o, value));
    });
}

fn attributes(out: &mut Encoder, field: u32, list: &[KeyValue]) {
    for kv in list {
        attribute(out, field, &kv.key, &kv.value);
    }
}

/// `Span.flags`: the trace flags, and whether the parent is remote, as the
/// OTLP exporter sets them.
fn flags(trace_flags: u8, parent_is_remote: bool) -> u32 {
    const HAS_IS_REMOTE: u32 = 0x100;
    const IS_REMOTE: u32 = 0x200;
    u32::from(trace_flags) | HAS_IS_REMOTE | if parent_is_remote { IS_REMOTE } else { 0 }
}

fn kind(kind: &SpanKind) -> u64 {
    match kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    }
}

/// `Span`'s fields for `span`.
fn span(out: &mut Encoder, span: &SpanData) {
    let context = &span.span_context;
    out.bytes(1, &context.trace_id().to_bytes());
    out.bytes(2, &context.span_id().to_bytes());
    out.text(3, &context.trace_state().header());
    if span.parent_span_id != opentelemetry::trace::SpanId::INVALID {
        out.bytes(4, &span.parent_span_id.to_bytes());
    }
    out.text(5, &span.name);
    out.uint(6, kind(&span.span_kind));
    out.time(7, span.start_time);
    out.time(8, span.end_time);
    attributes(out, 9, &span.attributes);
    out.uint(10, u64::from(span.dropped_attributes_count));
    for event in span.events.iter() {
        out.message(11, |o| {
            o.time(1, event.timestamp);
            o.text(2, &event.name);
            attributes(o, 3, &event.attributes);
            o.uint(4, u64::from(event.dropped_attributes_count));
        });
    }
    out.uint(12, u64::from(span.events.dropped_count));
    for link in span.links.iter() {
        out.message(13, |o| {
            let linked = &link.span_context;
            o.bytes(1, &linked.trace_id().to_bytes());
            o.bytes(2, &linked.span_id().to_bytes());
            o.text(3, &linked.trace_state().header());
            attributes(o, 4, &link.attributes);
            o.uint(5, u64::from(link.dropped_attributes_count));
            o.fixed32(6, flags(linked.trace_flags().to_u8(), linked.is_remote()));
        });
    }
    out.uint(14, u64::from(span.links.dropped_count));
    // Always present, as the exporter writes it: an unset status is an
    // empty message.
    match &span.status {
        Status::Unset => out.message(15, |_| {}),
        Status::Ok => out.message(15, |o| o.uint(3, 1)),
        Status::Error { description } => out.message(15, |o| {
            o.text(2, description);
            o.uint(3, 2);
        }),
    }
    out.fixed32(
        16,
        flags(context.trace_flags().to_u8(), span.parent_span_is_remote),
    );
}

fn scope(out: &mut Encoder, scope: &InstrumentationScope) {
    out.text(1, scope.name());
    out.text(2, scope.version().unwrap_or(""));
    attributes(out, 3, &scope.attributes().cloned().collect::<Vec<_>>());
}

/// `batch` under `resource`, as the body of an OTLP/HTTP protobuf export:
/// one `ResourceSpans`, one `ScopeSpans` per instrumentation scope (in the
/// order the batch first names them).
pub(crate) fn request(resource: &Resource, batch: &[SpanData]) -> Vec<u8> {
    // Each span's scope found once: scopes compare by name, version,
    // schema and attributes.
    let mut scopes: Vec<&InstrumentationScope> = Vec::new();
    let mut of_span = Vec::with_capacity(batch.len());
    for span in batch {
        let scope = &span.instrumentation_scope;
        let at = match scopes.last() {
            Some(last) if *last == scope => scopes.len() - 1,
            _ => match scopes.iter().position(|known| *known == scope) {
                Some(at) => at,
                None => {
                    scopes.push(scope);
                    scopes.len() - 1
                }
            },
        };
        of_span.push(at);
    }
    // Made once, never grown (`encode/room.rs`).
    let room = room::of(resource, &scopes, batch);
    let mut encoder = Encoder {
        buf: Vec::with_capacity(room),
    };
    let o = &mut encoder;
    o.message(1, |o| {
        o.message(1, |o| {
            for (name, value) in resource.iter() {
                attribute(o, 1, name, value);
            }
        });
        for (at, each) in scopes.iter().enumerate() {
            o.message(2, |o| {
                o.message(1, |o| scope(o, each));
                let spans = batch.iter().zip(&of_span);
                for (s, _) in spans.filter(|(_, scope)| **scope == at) {
                    o.message(2, |o| span(o, s));
                }
                o.text(3, each.schema_url().unwrap_or(""));
            });
        }
        o.text(3, resource.schema_url().unwrap_or(""));
    });
    debug_assert!(encoder.buf.len() <= room, "{} > {room}", encoder.buf.len());
    encoder.buf
}

#[cfg(test)]
#[path = "encode_tests.rs"]
mod tests;
