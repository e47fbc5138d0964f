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

#[test]
fn the_processor_cuts_admits_by_bytes_and_the_exporter_gives_them_back() {
    let kept = Keeps::default();
    let in_flight = InFlight::new(100, 20_000);
    let config = BatchConfigBuilder::default()
        .with_max_queue_size(100)
        .with_max_export_batch_size(100)
        // Nothing leaves before the flush below.
        .with_scheduled_delay(Duration::from_secs(3600))
        .build();
    let batch = BatchSpanProcessor::builder(CountingExporter::new(kept.clone(), in_flight.clone()))
        .with_batch_config(config)
        .build();
    let processor = CountingProcessor::new(batch, in_flight.clone(), 5_000);
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
