//! The encoder's bytes against the OTLP exporter's own conversion: decoded
//! with the generated structs, they must be the structs the exporter would
//! have encoded.

use super::request;
use opentelemetry::trace::{
    Event, Link, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{Array, InstrumentationScope, KeyValue, StringValue, Value};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use opentelemetry_sdk::Resource;
use prost::Message as _;
use std::time::{Duration, SystemTime};

fn context(trace: u128, span: u64, sampled: bool, remote: bool) -> SpanContext {
    let flags = if sampled {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    let state = TraceState::from_key_value([("vendor", "v1")]).unwrap();
    SpanContext::new(
        TraceId::from(trace),
        SpanId::from(span),
        flags,
        remote,
        state,
    )
}

fn span(i: u64, scope: &InstrumentationScope) -> SpanData {
    let start = SystemTime::UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789 + i);
    let kinds = [
        SpanKind::Internal,
        SpanKind::Server,
        SpanKind::Client,
        SpanKind::Producer,
        SpanKind::Consumer,
    ];
    let statuses = [
        Status::Unset,
        Status::Ok,
        Status::error("it failed"),
        Status::error(""),
    ];
    SpanData {
        span_context: context(0xabc + u128::from(i), 0x10 + i, i.is_multiple_of(2), false),
        parent_span_id: if i.is_multiple_of(3) {
            SpanId::INVALID
        } else {
            SpanId::from(0x99 + i)
        },
        parent_span_is_remote: i % 4 == 1,
        span_kind: kinds[i as usize % kinds.len()].clone(),
        name: format!("span {i} ✓").into(),
        start_time: start,
        end_time: start + Duration::from_micros(250 + i),
        attributes: vec![
            KeyValue::new("s", "text"),
            KeyValue::new("empty", ""),
            KeyValue::new("b", i.is_multiple_of(2)),
            KeyValue::new("i", -7_i64 * i as i64),
            KeyValue::new("big", i64::MAX),
            KeyValue::new("f", 2.5_f64),
            KeyValue::new("owned", format!("v{i}")),
            KeyValue::new("bools", Value::Array(Array::Bool(vec![true, false]))),
            KeyValue::new("ints", Value::Array(Array::I64(vec![1, -2, 300]))),
            KeyValue::new("floats", Value::Array(Array::F64(vec![0.5]))),
            KeyValue::new(
                "strings",
                Value::Array(Array::String(vec![StringValue::from("a"), "b".into()])),
            ),
        ],
        dropped_attributes_count: (i % 2) as u32,
        events: {
            let mut events = SpanEvents::default();
            events.events.push(Event::new(
                "an event",
                start + Duration::from_micros(5),
                vec![KeyValue::new("e", 1_i64)],
                3,
            ));
            events.dropped_count = 1;
            events
        },
        links: {
            let mut links = SpanLinks::default();
            links.links.push(Link::new(
                context(0xfeed, 0xbeef, true, true),
                vec![KeyValue::new("l", "x")],
                2,
            ));
            links.dropped_count = 4;
            links
        },
        status: statuses[i as usize % statuses.len()].clone(),
        instrumentation_scope: scope.clone(),
    }
}

/// The request's bytes, checked against the room made for them: never
/// more (the buffer never grows), nor more than about twice as much (a
/// few bytes a field, a span's fixed fields).
fn encoded(resource: &Resource, batch: &[SpanData]) -> Vec<u8> {
    let mut scopes: Vec<&InstrumentationScope> = Vec::new();
    for span in batch {
        if !scopes.contains(&&span.instrumentation_scope) {
            scopes.push(&span.instrumentation_scope);
        }
    }
    let room = super::room::of(resource, &scopes, batch);
    let body = request(resource, batch);
    assert!(
        body.len() <= room,
        "{} bytes in a room of {room}",
        body.len()
    );
    let weight: u64 = batch.iter().map(crate::telemetry::weight::of).sum();
    assert!(
        room as u64 <= weight + 1024,
        "a room of {room} for spans weighing {weight}"
    );
    body
}

/// `batch` encoded (within its room: [`encoded`]), checked to decode to
/// what the OTLP exporter's own conversion builds; its bytes.
fn as_the_exporter(resource: &Resource, batch: Vec<SpanData>, what: &str) -> Vec<u8> {
    let body = encoded(resource, &batch);
    let ours = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
    let theirs = ExportTraceServiceRequest {
        resource_spans: group_spans_by_resource_and_scope(
            batch,
            &ResourceAttributesWithSchema::from(resource),
        ),
    };
    assert!(ours == theirs, "the encoder differs {what}");
    body
}

#[test]
fn the_bytes_decode_to_what_the_otlp_exporter_would_send() {
    let resource = Resource::builder()
        .with_service_name("encoded")
        .with_attribute(KeyValue::new("deployment", "test"))
        .build();
    let scope = InstrumentationScope::builder("fanout-budget").build();
    let batch: Vec<SpanData> = (0..12).map(|i| span(i, &scope)).collect();

    as_the_exporter(&resource, batch, "from the exporter's conversion");
}

/// Times at the edges of what the encoder writes: at the epoch and before
/// it (left out, as the exporter's 0 is), a nanosecond after it, and one
/// event at each.
#[test]
fn times_at_and_before_the_epoch_encode_as_the_exporter_sends_them() {
    let resource = Resource::builder().with_service_name("edges").build();
    let scope = InstrumentationScope::builder("fanout-budget").build();
    let epoch = SystemTime::UNIX_EPOCH;
    let times = [
        (epoch, epoch - Duration::from_secs(1)),
        (epoch - Duration::from_secs(5), epoch),
        (
            epoch + Duration::from_nanos(1),
            epoch + Duration::from_nanos(2),
        ),
    ];
    let batch: Vec<SpanData> = (times.iter().enumerate())
        .map(|(i, (start, end))| {
            let mut span = span(i as u64, &scope);
            span.start_time = *start;
            span.end_time = *end;
            span.events.events[0].timestamp = *start;
            span
        })
        .collect();
    as_the_exporter(&resource, batch, "at the epoch's edges");
}

#[test]
fn spans_of_two_scopes_are_grouped_by_scope() {
    let resource = Resource::builder().with_service_name("two").build();
    let a = InstrumentationScope::builder("a")
        .with_version("1.0")
        .build();
    let b = InstrumentationScope::builder("b").build();
    let batch = vec![span(0, &a), span(1, &b), span(2, &a)];
    let ours = ExportTraceServiceRequest::decode(encoded(&resource, &batch).as_slice()).unwrap();
    let scopes = &ours.resource_spans[0].scope_spans;
    assert_eq!(scopes.len(), 2);
    let names: Vec<(&str, &str, usize)> = scopes
        .iter()
        .map(|s| {
            let scope = s.scope.as_ref().unwrap();
            (scope.name.as_str(), scope.version.as_str(), s.spans.len())
        })
        .collect();
    assert_eq!(names, [("a", "1.0", 2), ("b", "", 1)]);
}

/// Reads a varint at `at`: its value and the bytes it took.
fn read_varint(buf: &[u8], at: usize) -> (u64, usize) {
    let mut value = 0u64;
    for (i, byte) in buf[at..].iter().enumerate() {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return (value, i + 1);
        }
    }
    panic!("a varint runs past the buffer");
}

/// A varint of every bit length, 1 to 10 bytes, is written as protobuf
/// reads it (7 bits a byte, least significant first, every byte but the
/// last flagged), as long as `varint_len` says.
#[test]
fn a_varint_of_every_length_reads_back() {
    let mut values = vec![0, 1, u64::MAX];
    for bits in 1..64 {
        values.extend([(1u64 << bits) - 1, 1u64 << bits, (1u64 << bits) + 1]);
    }
    for value in values {
        let mut out = super::Encoder { buf: Vec::new() };
        out.varint(value);
        assert_eq!(
            read_varint(&out.buf, 0),
            (value, out.buf.len()),
            "{value:#x}"
        );
        assert_eq!(super::varint_len(value), out.buf.len(), "{value:#x}");
    }
}

/// A nested message's length, written once the message is, at every size
/// its varint changes length (the one byte held for it, then the message
/// moved up by one, two, three bytes), and nested: an inner message moved
/// inside an outer one moved again. Each decodes as its key, its length
/// and its bytes, untouched by the move.
#[test]
fn a_message_of_every_length_is_prefixed_by_its_length() {
    let sizes = [
        0, 1, 127, 128, 129, 16_383, 16_384, 16_385, 2_097_151, 2_097_152,
    ];
    for &inner in &sizes {
        let content: Vec<u8> = (0..inner).map(|i| (i % 251) as u8).collect();
        let mut out = super::Encoder { buf: Vec::new() };
        out.put(b"head");
        out.message(7, |o| {
            o.put(b"pre");
            o.message(3, |o| o.put(&content));
            o.put(b"post");
        });
        let buf = &out.buf;
        assert_eq!(&buf[..4], b"head");
        assert_eq!(read_varint(buf, 4), (7 << 3 | 2, 1));
        let (outer, taken) = read_varint(buf, 5);
        let body = 5 + taken;
        assert_eq!(
            body + outer as usize,
            buf.len(),
            "outer length, inner {inner}"
        );
        assert_eq!(&buf[body..body + 3], b"pre");
        assert_eq!(read_varint(buf, body + 3), (3 << 3 | 2, 1));
        let (len, taken) = read_varint(buf, body + 4);
        assert_eq!(len as usize, inner);
        assert_eq!(taken, super::varint_len(inner as u64));
        let at = body + 4 + taken;
        assert!(buf[at..at + inner] == content[..], "inner bytes, {inner}");
        assert_eq!(&buf[at + inner..], b"post");
    }
}

/// Spans long enough that the scope's message needs a three-byte length
/// and each span a two-byte one (attributes of a few hundred bytes): the
/// request decodes to what the exporter would send.
#[test]
fn long_spans_encode_as_the_exporter_sends_them() {
    let resource = Resource::builder().with_service_name("long").build();
    let scope = InstrumentationScope::builder("fanout-budget").build();
    let batch: Vec<SpanData> = (0..80)
        .map(|i| {
            let mut span = span(i, &scope);
            span.attributes
                .push(KeyValue::new("long", "x".repeat(200 + i as usize * 3)));
            span
        })
        .collect();
    let body = as_the_exporter(&resource, batch, "on long spans");
    // The scope's spans take a three-byte length: moved up by two.
    assert!(body.len() > 1 << 14, "{} bytes", body.len());
}

/// Lists of numbers, long: each element a message of its own, more bytes
/// written than the numbers hold in memory — within the room made for them
/// and within the spans' weight (`encoded`), as the exporter sends them.
#[test]
fn long_lists_of_numbers_encode_within_their_weight() {
    let resource = Resource::builder().with_service_name("numbers").build();
    let scope = InstrumentationScope::builder("fanout-budget").build();
    let mut numbers = span(0, &scope);
    numbers.attributes = vec![
        KeyValue::new("bools", Value::Array(Array::Bool(vec![true; 10_000]))),
        KeyValue::new("ints", Value::Array(Array::I64(vec![-1; 10_000]))),
        KeyValue::new("floats", Value::Array(Array::F64(vec![0.5; 10_000]))),
    ];
    let batch = vec![numbers];
    as_the_exporter(&resource, batch, "on lists of numbers");
}
