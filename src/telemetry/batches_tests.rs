//! The export queue: when batches leave, how big, what a flush and the
//! shutdown wait for, and what is given back to the queue's bound.

use super::*;
use crate::telemetry::truncate::tests::data;
use std::sync::mpsc;

/// Hands each batch's span names to the test, and fails the exports
/// while `fail` says so.
#[derive(Debug)]
struct Batched {
    sent: Mutex<mpsc::Sender<Vec<String>>>,
    fail: Arc<std::sync::atomic::AtomicBool>,
}

impl SpanExporter for Batched {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let names = batch.iter().map(|span| span.name.to_string()).collect();
        let _ = self.sent.lock().unwrap().send(names);
        if self.fail.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(OTelSdkError::InternalFailure("refused".to_owned()));
        }
        Ok(())
    }
}

struct Fixture {
    queue: Batches,
    in_flight: Arc<InFlight>,
    batches: mpsc::Receiver<Vec<String>>,
    fail: Arc<std::sync::atomic::AtomicBool>,
}

/// A queue of batches of `max_batch`, exported hourly unless full.
fn queue(max_batch: usize) -> Fixture {
    let (sent, batches) = mpsc::channel();
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let exporter = Batched {
        sent: Mutex::new(sent),
        fail: fail.clone(),
    };
    let in_flight = InFlight::new(1000, 1 << 30);
    let queue = Batches::new(
        exporter,
        in_flight.clone(),
        max_batch,
        Duration::from_secs(3600),
    )
    .unwrap();
    Fixture {
        queue,
        in_flight,
        batches,
        fail,
    }
}

impl Fixture {
    /// Admits and queues a span named `name` weighing `weight`.
    fn push(&self, name: &str, weight: u64) {
        self.in_flight.admit(weight).unwrap();
        self.queue.push(data(name, Vec::new()), weight);
    }

    /// Every batch exported so far, without waiting.
    fn exported(&self) -> Vec<Vec<String>> {
        self.batches.try_iter().collect()
    }
}

const WAIT: Duration = Duration::from_secs(10);

#[test]
fn a_full_batch_leaves_at_once_and_the_rest_waits() {
    let q = queue(3);
    for name in ["a", "b", "c", "d"] {
        q.push(name, 10);
    }
    // Hourly exports: only a full batch can have left.
    let first = q.batches.recv_timeout(WAIT).expect("the full batch left");
    assert_eq!(first, ["a", "b", "c"]);
    q.queue.flush().unwrap();
    assert_eq!(q.exported(), [vec!["d".to_owned()]]);
    assert_eq!(q.in_flight.held(), (0, 0), "every weight given back");
}

#[test]
fn a_flush_exports_what_was_queued_in_batches_and_gives_it_back() {
    let q = queue(4);
    // Held back: the first three leave with the flush, not before.
    for i in 0..3 {
        q.push(&format!("s{i}"), 100 + i);
    }
    assert_eq!(q.in_flight.held(), (3, 303));
    assert!(
        q.exported().is_empty(),
        "nothing leaves before a batch is full"
    );
    q.queue.flush().unwrap();
    assert_eq!(q.exported(), [vec!["s0", "s1", "s2"]]);
    assert_eq!(q.in_flight.held(), (0, 0));
    // A flush with nothing queued returns at once.
    q.queue.flush().unwrap();
    assert!(q.exported().is_empty());
}

#[test]
fn a_failed_export_is_given_back_and_fails_its_flush() {
    let q = queue(8);
    q.fail.store(true, std::sync::atomic::Ordering::Relaxed);
    q.push("lost", 50);
    assert!(q.queue.flush().is_err(), "the flush says its export failed");
    assert_eq!(q.in_flight.held(), (0, 0), "a failed batch is given back");
    q.fail.store(false, std::sync::atomic::Ordering::Relaxed);
    q.push("kept", 50);
    q.queue.flush().unwrap();
    assert_eq!(q.exported(), [vec!["lost"], vec!["kept"]]);
}

#[test]
fn the_shutdown_exports_what_is_queued_then_lets_spans_go() {
    let q = queue(8);
    q.push("last", 70);
    q.queue.shutdown(WAIT).unwrap();
    assert_eq!(q.exported(), [vec!["last"]]);
    q.push("late", 30);
    assert_eq!(q.in_flight.held(), (0, 0), "a span after it is let go");
    assert!(q.exported().is_empty());
    assert!(q.queue.shutdown(WAIT).is_err(), "shut down once");
    assert!(q.queue.flush().is_ok(), "nothing is queued to flush");
}

#[test]
fn a_queue_dropped_exports_what_it_held() {
    let q = queue(8);
    q.push("held", 10);
    let Fixture { queue, batches, .. } = q;
    drop(queue);
    assert_eq!(batches.recv_timeout(WAIT).unwrap(), ["held"]);
}

#[test]
fn more_than_a_batch_queued_leaves_as_batches() {
    // Six spans, batches of two: however the thread keeps up, no batch
    // holds more than two, and every span leaves once, in order.
    let q = queue(2);
    for i in 0..6 {
        q.push(&i.to_string(), 1);
    }
    q.queue.flush().unwrap();
    let all = q.exported();
    assert!(all.iter().all(|b| (1..=2).contains(&b.len())), "{all:?}");
    let names: Vec<String> = all.concat();
    assert_eq!(names, ["0", "1", "2", "3", "4", "5"], "in order, each once");
    assert_eq!(q.in_flight.held(), (0, 0));
}
