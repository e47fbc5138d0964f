//! The export queue's bounds, in spans and in bytes, and what the exporter
//! gives back.

use super::*;
use crate::telemetry::truncate::tests::data;
use opentelemetry::KeyValue;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::SpanExporter;
use std::sync::Mutex;

/// Keeps the batches it is handed.
#[derive(Debug, Default, Clone)]
struct Keeps(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Keeps {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.0.lock().unwrap().extend(batch);
        Ok(())
    }
}

/// A counting processor of 100 spans and `max_bytes`, texts cut to 5,000
/// bytes, over the export queue and an exporter that keeps what it is
/// handed; nothing leaves before a flush.
fn counting(max_bytes: u64) -> (CountingProcessor, Arc<InFlight>, Keeps) {
    let kept = Keeps::default();
    let in_flight = InFlight::new(100, max_bytes);
    let queue = Batches::new(
        kept.clone(),
        in_flight.clone(),
        100,
        Duration::from_secs(3600),
    )
    .unwrap();
    let processor = CountingProcessor::new(queue, in_flight.clone(), 5_000);
    (processor, in_flight, kept)
}

#[test]
fn the_processor_cuts_admits_by_bytes_and_the_exporter_gives_them_back() {
    let (processor, in_flight, kept) = counting(20_000);
    let span = || {
        data(
            "query",
            vec![KeyValue::new("graphql.operation.name", "n".repeat(60_000))],
        )
    };
    // Each span is cut to 5,000 bytes of name: three fit in 20,000 bytes
    // (with their structure), a fourth does not.
    let one = {
        let mut cut = span();
        truncate::span(&mut cut, 5_000);
        weight::of(&cut)
    };
    assert!((5_000..6_000).contains(&one), "{one}");
    for _ in 0..4 {
        processor.on_end(span());
    }
    assert_eq!(in_flight.held(), (3, 3 * one));
    processor.force_flush().unwrap();
    assert_eq!(
        in_flight.held(),
        (0, 0),
        "the export gave back what it took"
    );
    let exported = kept.0.lock().unwrap();
    assert_eq!(exported.len(), 3);
    assert!(exported
        .iter()
        .all(|s| s.attributes[0].value.as_str().len() == 5_000));
    drop(exported);
    processor
        .shutdown_with_timeout(Duration::from_secs(5))
        .unwrap();
}

/// A batch's places and bytes are given back as each span was admitted:
/// a span whose lists hold room to spare (a direct span's) weighs more
/// than its clone would, and the queue must neither clone it nor weigh it
/// again, or it would keep the difference for ever.
#[test]
fn spans_with_room_to_spare_are_given_back_whole() {
    let (processor, in_flight, kept) = counting(1 << 20);
    let spare = || {
        let mut attributes = Vec::with_capacity(7);
        attributes.push(KeyValue::new("url.path", "/v2/x/manifests/1"));
        let mut span = data("GET", attributes);
        span.events.events.reserve_exact(3);
        span
    };
    let one = weight::of(&spare());
    assert!(
        one > weight::of(&spare().clone()),
        "a clone would weigh less"
    );
    for _ in 0..5 {
        processor.on_end(spare());
    }
    assert_eq!(in_flight.held(), (5, 5 * one));
    processor.force_flush().unwrap();
    assert_eq!(in_flight.held(), (0, 0), "given back as admitted");
    assert_eq!(kept.0.lock().unwrap().len(), 5);
    processor
        .shutdown_with_timeout(Duration::from_secs(5))
        .unwrap();
}
