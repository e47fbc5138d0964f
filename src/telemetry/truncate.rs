//! The attribute value length limit (OpenTelemetry's
//! `attribute_value_length_limit`): every text a span carries past it is
//! cut, at a character boundary, before the span is queued.
//!
//! What it covers: the span's string attributes (each element of an array
//! of strings too), its events' names and attributes, its links'
//! attributes, its name and its status's description. Numbers and
//! booleans are left as they are. A value is copied only when it is cut.

use opentelemetry::{Array, KeyValue, StringValue, Value};
use opentelemetry_sdk::trace::SpanData;
use std::borrow::Cow;

/// `text`'s longest prefix of at most `limit` bytes that ends at a
/// character boundary.
pub(crate) fn prefix(text: &str, limit: usize) -> &str {
    if text.len() <= limit {
        return text;
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Cuts every text of `span` longer than `limit` bytes.
pub(crate) fn span(span: &mut SpanData, limit: usize) {
    cow(&mut span.name, limit);
    attributes(&mut span.attributes, limit);
    for event in span.events.events.iter_mut() {
        cow(&mut event.name, limit);
        attributes(&mut event.attributes, limit);
    }
    for link in span.links.links.iter_mut() {
        attributes(&mut link.attributes, limit);
    }
    if let opentelemetry::trace::Status::Error { description } = &mut span.status {
        cow(description, limit);
    }
}

fn cow(text: &mut Cow<'static, str>, limit: usize) {
    if text.len() > limit {
        *text = Cow::Owned(prefix(text, limit).to_owned());
    }
}

fn attributes(attributes: &mut [KeyValue], limit: usize) {
    for kv in attributes {
        match &mut kv.value {
            Value::String(s) => string(s, limit),
            Value::Array(Array::String(values)) => {
                for s in values {
                    string(s, limit);
                }
            }
            _ => {}
        }
    }
}

fn string(value: &mut StringValue, limit: usize) {
    if value.as_str().len() > limit {
        *value = StringValue::from(prefix(value.as_str(), limit).to_owned());
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use opentelemetry::trace::{SpanContext, SpanKind, Status};
    use opentelemetry::InstrumentationScope;
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};
    use std::time::SystemTime;

    pub(crate) fn data(name: &str, attributes: Vec<KeyValue>) -> SpanData {
        SpanData {
            span_context: SpanContext::NONE,
            parent_span_id: opentelemetry::trace::SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: Cow::Owned(name.to_owned()),
            start_time: SystemTime::UNIX_EPOCH,
            end_time: SystemTime::UNIX_EPOCH,
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            instrumentation_scope: InstrumentationScope::builder("test").build(),
        }
    }

    #[test]
    fn a_prefix_ends_at_a_character_boundary() {
        assert_eq!(prefix("abc", 3), "abc");
        assert_eq!(prefix("abcd", 3), "abc");
        // "é" is two bytes: a limit falling inside it keeps what is before.
        assert_eq!(prefix("aé", 2), "a");
        assert_eq!(prefix("aé", 3), "aé");
        // "😀" is four bytes.
        assert_eq!(prefix("😀😀", 5), "😀");
        assert_eq!(prefix("😀", 3), "");
    }

    #[test]
    fn every_text_past_the_limit_is_cut_and_numbers_are_kept() {
        let long = "é".repeat(1000); // 2,000 bytes
        let mut span = data(
            &long,
            vec![
                KeyValue::new("graphql.operation.name", long.clone()),
                KeyValue::new("short", "kept"),
                KeyValue::new("fanout.reads", 7_i64),
                KeyValue::new(
                    "list",
                    Value::Array(Array::String(vec![StringValue::from(long.clone())])),
                ),
            ],
        );
        span.events.events.push(opentelemetry::trace::Event::new(
            long.clone(),
            SystemTime::UNIX_EPOCH,
            vec![KeyValue::new("message", long.clone())],
            0,
        ));
        span.status = Status::error(long.clone());
        super::span(&mut span, 101);
        let cut = "é".repeat(50); // 100 bytes: 101 falls inside the 51st
        assert_eq!(span.name, cut);
        assert_eq!(span.attributes[0].value, Value::from(cut.clone()));
        assert_eq!(span.attributes[1].value, Value::from("kept"));
        assert_eq!(span.attributes[2].value, Value::I64(7));
        assert_eq!(
            span.attributes[3].value,
            Value::Array(Array::String(vec![StringValue::from(cut.clone())]))
        );
        assert_eq!(span.events.events[0].name, cut);
        assert_eq!(
            span.events.events[0].attributes[0].value,
            Value::from(cut.clone())
        );
        assert_eq!(span.status, Status::error(cut));
    }
}
