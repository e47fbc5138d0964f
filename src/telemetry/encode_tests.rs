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

#[test]
fn the_bytes_decode_to_what_the_otlp_exporter_would_send() {
    let resource = Resource::builder()
        .with_service_name("encoded")
        .with_attribute(KeyValue::new("deployment", "test"))
        .build();
    let scope = InstrumentationScope::builder("fanout-budget").build();
    let batch: Vec<SpanData> = (0..12).map(|i| span(i, &scope)).collect();

    let ours = ExportTraceServiceRequest::decode(request(&resource, &batch).as_slice()).unwrap();
    let theirs = ExportTraceServiceRequest {
        resource_spans: group_spans_by_resource_and_scope(
            batch,
            &ResourceAttributesWithSchema::from(&resource),
        ),
    };
    assert!(
        ours == theirs,
        "the encoder differs from the exporter's conversion"
    );
}

/// Times at the edges of what the encoder writes: at the epoch and before
/// it (left out, as the exporter's 0 is), a nanosecond after it, and one
/// event at each — the counting pass must count what the writing pass
/// writes, or every length after it is wrong.
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
    let ours = ExportTraceServiceRequest::decode(request(&resource, &batch).as_slice()).unwrap();
    let theirs = ExportTraceServiceRequest {
        resource_spans: group_spans_by_resource_and_scope(
            batch,
            &ResourceAttributesWithSchema::from(&resource),
        ),
    };
    assert!(ours == theirs, "the encoder differs at the epoch's edges");
}

#[test]
fn spans_of_two_scopes_are_grouped_by_scope() {
    let resource = Resource::builder().with_service_name("two").build();
    let a = InstrumentationScope::builder("a")
        .with_version("1.0")
        .build();
    let b = InstrumentationScope::builder("b").build();
    let batch = vec![span(0, &a), span(1, &b), span(2, &a)];
    let ours = ExportTraceServiceRequest::decode(request(&resource, &batch).as_slice()).unwrap();
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

/// The counting pass's length of a varint is the bytes the writing pass
/// writes, at every length from 1 to 10 bytes.
#[test]
fn a_varint_is_counted_as_long_as_it_is_written() {
    let mut values = vec![0, 1, u64::MAX];
    for bits in 1..64 {
        values.extend([(1u64 << bits) - 1, 1u64 << bits, (1u64 << bits) + 1]);
    }
    for value in values {
        let mut counting = super::Encoder {
            writing: false,
            count: 0,
            lengths: Vec::new(),
            next: 0,
            buf: Vec::new(),
        };
        counting.varint(value);
        let mut writing = super::Encoder {
            writing: true,
            ..counting
        };
        writing.varint(value);
        assert_eq!(writing.count, writing.buf.len(), "{value:#x}");
        let decoded = writing
            .buf
            .iter()
            .rev()
            .fold(0u64, |v, b| v << 7 | u64::from(b & 0x7f));
        assert_eq!(decoded, value);
        assert!(writing.buf[..writing.buf.len() - 1]
            .iter()
            .all(|b| b & 0x80 != 0));
    }
}
