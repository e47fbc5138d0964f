//! The export queue: when batches leave, how big, what a flush and the
//! shutdown wait for, and what is given back to the queue's bound.
//!
//! Each fixture holds one admission of its own ([`HELD`]) through the
//! test: the bound stops at zero, so a span given back twice would pass
//! unseen against an empty queue, not against this one.

use super::*;
use crate::telemetry::truncate::tests::data;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc;

/// The fixture's own admission, never given back.
const HELD: u64 = 1_000_000;

/// Hands each batch's span names to the test; fails the exports while
/// `fail` says so, and panics while `panic` does.
#[derive(Debug)]
struct Batched {
    sent: Mutex<mpsc::Sender<Vec<String>>>,
    fail: Arc<AtomicBool>,
    panic: Arc<AtomicBool>,
}

impl SpanExporter for Batched {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let names = batch.iter().map(|span| span.name.to_string()).collect();
        let _ = self.sent.lock().unwrap().send(names);
        assert!(!self.panic.load(Relaxed), "the exporter panics");
        if self.fail.load(Relaxed) {
            return Err(OTelSdkError::InternalFailure("refused".to_owned()));
        }
        Ok(())
    }
}

struct Fixture {
    queue: Batches,
    in_flight: Arc<InFlight>,
    batches: mpsc::Receiver<Vec<String>>,
    fail: Arc<AtomicBool>,
    panic: Arc<AtomicBool>,
}

/// A queue of batches of `max_batch`, exported every `interval` unless
/// full.
fn queue_every(max_batch: usize, interval: Duration) -> Fixture {
    let (sent, batches) = mpsc::channel();
    let (fail, panic) = (Arc::default(), Arc::default());
    let exporter = Batched {
        sent: Mutex::new(sent),
        fail: Arc::clone(&fail),
        panic: Arc::clone(&panic),
    };
    let in_flight = InFlight::new(100_000, 1 << 30);
    in_flight.admit(HELD).unwrap();
    let queue = Batches::new(exporter, in_flight.clone(), max_batch, interval).unwrap();
    Fixture {
        queue,
        in_flight,
        batches,
        fail,
        panic,
    }
}

/// Exported hourly unless full: nothing leaves on the clock in a test.
fn queue(max_batch: usize) -> Fixture {
    queue_every(max_batch, Duration::from_secs(3600))
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

    /// What the bound holds beyond the fixture's own admission.
    fn held(&self) -> (u64, u64) {
        let (spans, bytes) = self.in_flight.held();
        (spans - 1, bytes - HELD)
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
    assert_eq!(q.held(), (0, 0), "every weight given back once");
}

#[test]
fn a_batch_not_full_leaves_at_the_interval() {
    let q = queue_every(100, Duration::from_millis(50));
    q.push("timed", 5);
    assert_eq!(q.batches.recv_timeout(WAIT).unwrap(), ["timed"]);
    q.queue.flush().unwrap();
    assert_eq!(q.held(), (0, 0));
}

#[test]
fn an_interval_too_long_for_the_clock_leaves_batches_to_flushes() {
    let q = queue_every(2, Duration::MAX);
    q.push("one", 5);
    q.push("two", 5);
    assert_eq!(q.batches.recv_timeout(WAIT).unwrap(), ["one", "two"]);
    q.push("three", 5);
    q.queue.flush().unwrap();
    assert_eq!(q.exported(), [vec!["three"]], "the thread lives on");
    assert_eq!(q.held(), (0, 0));
}

#[test]
fn a_flush_exports_what_was_queued_and_gives_it_back() {
    let q = queue(4);
    for i in 0..3 {
        q.push(&format!("s{i}"), 100 + i);
    }
    assert_eq!(q.held(), (3, 303));
    q.queue.flush().unwrap();
    assert_eq!(q.exported(), [vec!["s0", "s1", "s2"]]);
    assert_eq!(q.held(), (0, 0));
    // A flush with nothing queued returns at once.
    q.queue.flush().unwrap();
    assert!(q.exported().is_empty());
}

/// An export that fails by `how` (the fixture's flag): its flush fails,
/// its batch is given back, and the next export goes on as ever.
fn a_failing_export_is_given_back(how: fn(&Fixture) -> &AtomicBool) {
    let q = queue(8);
    how(&q).store(true, Relaxed);
    q.push("lost", 50);
    assert!(q.queue.flush().is_err(), "the flush says its export failed");
    assert_eq!(q.held(), (0, 0), "a failed batch is given back");
    how(&q).store(false, Relaxed);
    q.push("kept", 50);
    q.queue.flush().unwrap();
    assert_eq!(q.exported(), [vec!["lost"], vec!["kept"]]);
    assert_eq!(q.held(), (0, 0));
}

#[test]
fn a_failed_export_is_given_back_and_fails_its_flush() {
    a_failing_export_is_given_back(|q| &q.fail);
}

#[test]
fn an_exporter_that_panics_fails_its_batch_and_the_thread_goes_on() {
    a_failing_export_is_given_back(|q| &q.panic);
}

#[test]
fn the_shutdown_exports_what_is_queued_then_lets_spans_go() {
    let q = queue(8);
    q.push("last", 70);
    q.queue.shutdown(WAIT).unwrap();
    assert_eq!(q.exported(), [vec!["last"]]);
    q.push("late", 30);
    assert_eq!(q.held(), (0, 0), "a span after it is let go, once");
    assert!(q.exported().is_empty());
    assert!(q.queue.shutdown(WAIT).is_err(), "shut down once");
    assert!(q.queue.flush().is_err(), "nothing flushes after it");
}

#[test]
fn a_queue_dropped_exports_what_it_held() {
    let q = queue(8);
    q.push("held", 10);
    let Fixture {
        queue,
        batches,
        in_flight,
        ..
    } = q;
    drop(queue);
    assert_eq!(batches.recv_timeout(WAIT).unwrap(), ["held"]);
    // Given back as the thread ends: wait for the exporter's end.
    assert!(batches.recv_timeout(WAIT).is_err(), "the thread ended");
    assert_eq!(in_flight.held(), (1, HELD));
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
    assert_eq!(q.held(), (0, 0));
}

#[test]
fn a_batch_holds_no_more_than_the_queue_s_bytes_could() {
    // Room for two spans' structures: batches of two, not of 512.
    let in_flight = InFlight::new(100, 2 * std::mem::size_of::<SpanData>() as u64 + 1);
    let (sent, batches) = mpsc::channel();
    let exporter = Batched {
        sent: Mutex::new(sent),
        fail: Arc::default(),
        panic: Arc::default(),
    };
    let queue = Batches::new(exporter, in_flight.clone(), 512, Duration::from_secs(3600)).unwrap();
    assert_eq!(queue.shared.room, 2);
    for name in ["x", "y"] {
        in_flight.admit(1).unwrap();
        queue.push(data(name, Vec::new()), 1);
    }
    assert_eq!(
        batches.recv_timeout(WAIT).unwrap(),
        ["x", "y"],
        "full at two"
    );
}

#[test]
fn spans_pushed_from_many_threads_through_a_shutdown_are_each_given_back_once() {
    let q = queue(16);
    let (queue, in_flight) = (Arc::new(q.queue), q.in_flight);
    let pushers: Vec<_> = (0..4)
        .map(|t| {
            let (queue, in_flight) = (Arc::clone(&queue), Arc::clone(&in_flight));
            std::thread::spawn(move || {
                for i in 0..500 {
                    in_flight.admit(3).unwrap();
                    queue.push(data(&format!("{t}-{i}"), Vec::new()), 3);
                }
            })
        })
        .collect();
    let _ = queue.flush();
    queue.shutdown(WAIT).unwrap();
    for pusher in pushers {
        pusher.join().unwrap();
    }
    let exported: usize = q.batches.try_iter().map(|batch| batch.len()).sum();
    assert!(exported <= 2000, "{exported}");
    assert_eq!(
        in_flight.held(),
        (1, HELD),
        "each span exported or let go, each given back once"
    );
}
