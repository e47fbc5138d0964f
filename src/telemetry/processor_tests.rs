//! The export queue's bounds, in spans and in bytes, and what the exporter
//! gives back.

use super::*;
use crate::telemetry::truncate::tests::data;
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::BatchConfigBuilder;
use std::sync::Mutex;

#[test]
fn a_span_is_refused_past_the_spans_or_the_bytes() {
    let queue = InFlight::new(3, 1000);
    assert_eq!(queue.admit(400), Ok(()));
    assert_eq!(queue.admit(400), Ok(()));
    assert_eq!(queue.admit(400), Err("queue_bytes"));
    assert_eq!(queue.held(), (2, 800), "a refusal takes nothing");
    assert_eq!(queue.admit(200), Ok(()));
    assert_eq!(queue.admit(0), Err("queue_full"));
    assert_eq!(queue.held(), (3, 1000));
    queue.release(2, 800);
    assert_eq!(queue.held(), (1, 200));
    // One span heavier than the whole queue is never admitted.
    assert_eq!(queue.admit(1001), Err("queue_bytes"));
    assert_eq!(queue.admit(800), Ok(()));
    queue.release(2, 1000);
    assert_eq!(queue.held(), (0, 0));
}

/// The exporter weighs a batch again to give it back: were a span's lists
/// to grow between admission and release, more would be given back than
/// was taken. Each part of the word stops at zero — no wrap, no borrow
/// from the spans' part — and the queue admits to its bounds after.
#[test]
fn a_release_of_more_than_was_admitted_stops_at_zero() {
    let queue = InFlight::new(3, 1000);
    assert_eq!(queue.admit(100), Ok(()));
    queue.release(0, 500);
    assert_eq!(
        queue.held(),
        (1, 0),
        "the bytes stop at zero, the span stays"
    );
    queue.release(4, 0);
    assert_eq!(queue.held(), (0, 0), "the spans stop at zero");
    queue.release(usize::MAX, u64::MAX);
    assert_eq!(queue.held(), (0, 0), "however much is given back");
    for _ in 0..3 {
        assert_eq!(queue.admit(300), Ok(()));
    }
    assert_eq!(queue.admit(0), Err("queue_full"));
    assert_eq!(queue.admit(101), Err("queue_full"));
    assert_eq!(queue.held(), (3, 900), "a refusal gives back what it took");
    queue.release(1, 300);
    assert_eq!(queue.admit(401), Err("queue_bytes"));
    assert_eq!(queue.admit(400), Ok(()));
    assert_eq!(queue.held(), (3, 1000));
}

#[test]
fn the_bounds_are_clamped_to_what_the_word_holds() {
    let queue = InFlight::new(usize::MAX, u64::MAX);
    assert_eq!(queue.max_spans, MAX_SPANS as u64);
    assert_eq!(queue.max_bytes, MAX_BYTES);
    assert_eq!(queue.admit(MAX_BYTES), Ok(()));
    assert_eq!(queue.admit(1), Err("queue_bytes"));
    assert_eq!(queue.held(), (1, MAX_BYTES));
    assert_eq!(InFlight::new(0, 10).max_spans, 1);
}

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
/// bytes, over the SDK's batch processor and an exporter that keeps what
/// it is handed; nothing leaves before a flush.
fn counting(max_bytes: u64) -> (CountingProcessor, Arc<InFlight>, Keeps) {
    let kept = Keeps::default();
    let in_flight = InFlight::new(100, max_bytes);
    let config = BatchConfigBuilder::default()
        .with_max_queue_size(100)
        .with_max_export_batch_size(100)
        .with_scheduled_delay(Duration::from_secs(3600))
        .build();
    let batch = BatchSpanProcessor::builder(CountingExporter::new(kept.clone(), in_flight.clone()))
        .with_batch_config(config)
        .build();
    let processor = CountingProcessor::new(batch, in_flight.clone(), 5_000);
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

/// The exporter weighs each batch again to give it back: that holds only
/// while nothing between the two touches a span's lists — the SDK's batch
/// processor moves spans, never clones them (a clone would shrink a list
/// reserved with room to spare, a direct span's, and the queue would keep
/// the difference for ever).
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
