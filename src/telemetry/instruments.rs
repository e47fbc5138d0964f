//! The OpenTelemetry metrics the engine records while OTLP export is on,
//! beside (not instead of) its Prometheus metrics (`src/metrics.rs`).
//!
//! | name | kind | unit | attributes |
//! |---|---|---|---|
//! | `http.client.request.duration` | histogram | `s` | `http.request.method`, `server.address`, `server.port`, `http.response.status_code` or `error.type` |
//! | `http.server.request.duration` | histogram | `s` | `http.request.method`, `http.route`, `http.response.status_code` |
//! | `fanout.request.reads` | histogram | `{read}` | — |
//! | `fanout.operation.reads` | histogram | `{read}` | `graphql.operation.type` |
//! | `fanout.operation.delta` | histogram | `{read}` | `graphql.operation.type` (requested − reads; negative: the estimate was low) |
//!
//! The instruments are built once, when a [`Telemetry`](super::Telemetry)
//! is, and published process-wide: the read path takes them with one
//! atomic load when no telemetry lives (nothing recorded). Else each
//! thread keeps the instruments it last took, with the generation they
//! were published in ([`with`]): a record reads the generation (a shared
//! line only written when a telemetry starts or ends) and borrows the
//! thread's own handle, instead of taking the process's read lock and an
//! `Arc` (three atomic writes on one line every core shares, at every read
//! and request). A thread lets the instruments of a telemetry that
//! ended go at its next record (none are published then: `let_go`). With
//! them it keeps the histograms it bound to each attribute set it recorded
//! (`instruments/bound.rs`): a read's duration is recorded on its series
//! without the SDK hashing its attributes to find it.
//!
//! `server.address` (and `server.port`) is the host a read was sent
//! to when it has a `[hosts]` table or is known to the engine, else
//! `other` (no port): the series stay bounded by the configuration, as the
//! Prometheus `host` label does (`src/metrics.rs`).

mod bound;

pub(crate) use bound::{ClientError, ClientKey};

use bound::Bound;
use opentelemetry::metrics::{Histogram, Meter};
use opentelemetry::KeyValue;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// The instruments of the live telemetry.
#[derive(Debug)]
pub(crate) struct Instruments {
    client_duration: Histogram<f64>,
    server_duration: Histogram<f64>,
    request_reads: Histogram<u64>,
    operation_reads: Histogram<u64>,
    operation_delta: Histogram<f64>,
}

/// Boundaries for counts of reads.
const READ_BOUNDS: [f64; 11] = [
    0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0,
];

/// Boundaries for `requested − reads`.
const DELTA_BOUNDS: [f64; 13] = [
    -100.0, -10.0, -5.0, -1.0, 0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 1000.0,
];

/// The semantic conventions' advised boundaries for HTTP durations, in
/// seconds.
const DURATION_BOUNDS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];

static CURRENT: RwLock<Option<Arc<Instruments>>> = RwLock::new(None);
/// Whether `CURRENT` holds instruments: the read path's one atomic load.
static PUBLISHED: AtomicBool = AtomicBool::new(false);
/// Bumped each time `CURRENT` changes: a thread's kept handle is good while
/// its generation is this one.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// What one thread keeps of the instruments.
struct Kept {
    /// The generation they were published in (0: none taken yet; the
    /// first publication is generation 1).
    generation: u64,
    instruments: Option<Arc<Instruments>>,
    /// Their histograms this thread bound (`instruments/bound.rs`).
    bound: Bound,
}

impl Kept {
    /// Nothing taken yet.
    const NONE: Kept = Kept {
        generation: 0,
        instruments: None,
        bound: Bound::new(),
    };
}

thread_local! {
    /// The instruments this thread last took, and what it bound of them.
    static KEPT: RefCell<Kept> = const { RefCell::new(Kept::NONE) };
    /// Whether `KEPT` holds instruments: a record made while none are
    /// published lets them go (a plain thread-local read otherwise).
    static HOLDS: Cell<bool> = const { Cell::new(false) };
}

impl Instruments {
    /// Builds them from `meter` and publishes them; the result is the
    /// handle to [`withdraw`](Self::withdraw) them with.
    pub(crate) fn publish(meter: &Meter) -> Arc<Instruments> {
        let instruments = Arc::new(Instruments {
            client_duration: meter
                .f64_histogram("http.client.request.duration")
                .with_unit("s")
                .with_description("Duration of the upstream HTTP requests sent")
                .with_boundaries(DURATION_BOUNDS.to_vec())
                .build(),
            server_duration: meter
                .f64_histogram("http.server.request.duration")
                .with_unit("s")
                .with_description("Duration of the inbound GraphQL requests over HTTP")
                .with_boundaries(DURATION_BOUNDS.to_vec())
                .build(),
            request_reads: meter
                .u64_histogram("fanout.request.reads")
                .with_unit("{read}")
                .with_description("Upstream reads charged to one inbound request")
                .with_boundaries(READ_BOUNDS.to_vec())
                .build(),
            operation_reads: meter
                .u64_histogram("fanout.operation.reads")
                .with_unit("{read}")
                .with_description("Upstream reads one GraphQL operation sent")
                .with_boundaries(READ_BOUNDS.to_vec())
                .build(),
            operation_delta: meter
                .f64_histogram("fanout.operation.delta")
                .with_unit("{read}")
                .with_description("Reads an operation was priced at less the reads it sent")
                .with_boundaries(DELTA_BOUNDS.to_vec())
                .build(),
        });
        let mut current = CURRENT.write().unwrap_or_else(|e| e.into_inner());
        *current = Some(instruments.clone());
        GENERATION.fetch_add(1, Ordering::Release);
        PUBLISHED.store(true, Ordering::Release);
        drop(current);
        instruments
    }

    /// Stops publishing `mine`, unless another telemetry replaced them.
    pub(crate) fn withdraw(mine: &Arc<Instruments>) {
        let mut current = CURRENT.write().unwrap_or_else(|e| e.into_inner());
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, mine)) {
            *current = None;
            GENERATION.fetch_add(1, Ordering::Release);
            PUBLISHED.store(false, Ordering::Release);
        }
    }
}

/// The instruments a record is made with, and this thread's histograms
/// bound to their attributes (none when the thread's values are being
/// destroyed or recording reentered: the record is then unbound).
pub(crate) struct Recorder<'a> {
    instruments: &'a Instruments,
    bound: Option<&'a mut Bound>,
}

impl std::ops::Deref for Recorder<'_> {
    type Target = Instruments;

    fn deref(&self) -> &Instruments {
        self.instruments
    }
}

impl Recorder<'_> {
    /// The attribute sets this thread has bound for these instruments.
    #[cfg(test)]
    fn bound_len(&self) -> Option<usize> {
        self.bound.as_ref().map(|bound| bound.len())
    }

    /// One inbound request: how long it took to answer, and its attributes.
    pub(crate) fn server_request(&mut self, took: Duration, attributes: &[KeyValue]) {
        let histogram = &self.instruments.server_duration;
        let seconds = took.as_secs_f64();
        match self.bound.as_deref_mut() {
            Some(bound) => bound.server.record(histogram, seconds, attributes),
            None => histogram.record(seconds, attributes),
        }
    }

    /// The reads one inbound request was charged.
    pub(crate) fn request_reads(&mut self, reads: u64) {
        let histogram = &self.instruments.request_reads;
        match self.bound.as_deref_mut() {
            Some(bound) => bound.request_reads.record(histogram, reads, &[]),
            None => histogram.record(reads, &[]),
        }
    }

    /// What one operation of type `kind` sent, and `requested − reads`
    /// when it was priced.
    pub(crate) fn operation(&mut self, kind: &'static str, reads: u64, delta: Option<f64>) {
        let attributes = [KeyValue::new("graphql.operation.type", kind)];
        let instruments = self.instruments;
        match self.bound.as_deref_mut() {
            Some(bound) => {
                let histogram = &instruments.operation_reads;
                bound.operation_reads.record(histogram, reads, &attributes);
                if let Some(delta) = delta {
                    let histogram = &instruments.operation_delta;
                    bound.operation_delta.record(histogram, delta, &attributes);
                }
            }
            None => {
                instruments.operation_reads.record(reads, &attributes);
                if let Some(delta) = delta {
                    instruments.operation_delta.record(delta, &attributes);
                }
            }
        }
    }

    /// One upstream request: how long it took, on the series of the
    /// attributes `key` names (`attributes` writes them, when this thread
    /// has not bound them yet: that record is made unbound, then bound).
    pub(crate) fn client_request(
        &mut self,
        key: &ClientKey,
        took: Duration,
        attributes: impl FnOnce() -> ([KeyValue; 5], usize),
    ) {
        let seconds = took.as_secs_f64();
        if let Some(bound) = self.bound.as_deref().and_then(|bound| bound.client(key)) {
            bound.record(seconds);
            return;
        }
        let histogram = &self.instruments.client_duration;
        let (attributes, len) = attributes();
        histogram.record(seconds, &attributes[..len]);
        if let Some(bound) = self.bound.as_deref_mut() {
            bound.bind_client(*key, || histogram.bind(&attributes[..len]));
        }
    }
}

/// Whether instruments are published (a telemetry lives): one atomic load.
pub(crate) fn is_recording() -> bool {
    PUBLISHED.load(Ordering::Acquire)
}

/// `record` run with the published instruments, when a telemetry lives.
pub(crate) fn with<R>(record: impl FnOnce(&mut Recorder<'_>) -> R) -> Option<R> {
    if !PUBLISHED.load(Ordering::Acquire) {
        let_go();
        return None;
    }
    let generation = GENERATION.load(Ordering::Acquire);
    let mut record = Some(record);
    let kept = KEPT.try_with(|kept| {
        let mut kept = kept.try_borrow_mut().ok()?;
        if kept.generation != generation {
            *kept = Kept {
                generation,
                instruments: current(),
                bound: Bound::new(),
            };
            let _ = HOLDS.try_with(|holds| holds.set(kept.instruments.is_some()));
        }
        let record = record.take().expect("taken once");
        let Kept {
            instruments, bound, ..
        } = &mut *kept;
        Some(instruments.as_deref().map(|instruments| {
            record(&mut Recorder {
                instruments,
                bound: Some(bound),
            })
        }))
    });
    if let Ok(Some(recorded)) = kept {
        return recorded;
    }
    // The thread's values are being destroyed, or recording reentered:
    // the process's own, unbound.
    let record = record.take()?;
    current().map(|instruments| {
        record(&mut Recorder {
            instruments: &instruments,
            bound: None,
        })
    })
}

/// Drops the instruments this thread kept, once none are published: a
/// telemetry that ended leaves nothing of its own held by the threads
/// that recorded with it (its meter's series), from their next record on.
fn let_go() {
    if !HOLDS.try_with(Cell::get).unwrap_or(false) {
        return;
    }
    let kept = KEPT.try_with(|kept| {
        let mut kept = kept.try_borrow_mut().ok()?;
        // Cleared only with the handle taken (a record reentered keeps both).
        let _ = HOLDS.try_with(|holds| holds.set(false));
        Some(std::mem::replace(&mut *kept, Kept::NONE))
    });
    // Dropped outside the borrow.
    drop(kept);
}

/// The published instruments, when a telemetry lives.
fn current() -> Option<Arc<Instruments>> {
    CURRENT.read().unwrap_or_else(|e| e.into_inner()).clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry_sdk::metrics::SdkMeterProvider;

    /// The instruments are the process's: one test at a time publishes.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// The instruments a record on this thread would use.
    fn taken() -> Option<usize> {
        with(|recorder| recorder.instruments as *const Instruments as usize)
    }

    fn address(instruments: &Arc<Instruments>) -> Option<usize> {
        Some(Arc::as_ptr(instruments) as usize)
    }

    #[test]
    fn a_thread_records_with_the_instruments_published_last() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let provider = SdkMeterProvider::builder().build();
        let meter = provider.meter("test");
        assert_eq!(taken(), None, "none published");
        let first = Instruments::publish(&meter);
        assert_eq!(taken(), address(&first));
        let second = Instruments::publish(&meter);
        assert_eq!(
            taken(),
            address(&second),
            "the thread's kept handle replaced"
        );
        Instruments::withdraw(&first);
        assert_eq!(
            taken(),
            address(&second),
            "withdrawing others' changes nothing"
        );
        let elsewhere = std::thread::spawn(taken).join().expect("a thread");
        assert_eq!(elsewhere, address(&second), "another thread takes them too");
        Instruments::withdraw(&second);
        assert_eq!(taken(), None, "withdrawn");
        let third = Instruments::publish(&meter);
        assert_eq!(taken(), address(&third));
        Instruments::withdraw(&third);
        assert_eq!(taken(), None);
    }

    fn get(status: u16) -> ClientKey {
        ClientKey {
            host: u64::MAX,
            method: "GET",
            status: Some(status),
            error: None,
        }
    }

    fn attributes(key: &ClientKey) -> ([KeyValue; 5], usize) {
        let mut attributes: [KeyValue; 5] = std::array::from_fn(|_| KeyValue::new("", false));
        attributes[0] = KeyValue::new("http.request.method", key.method);
        attributes[1] = KeyValue::new("http.response.status_code", i64::from(key.status.unwrap()));
        (attributes, 2)
    }

    fn record(key: &ClientKey) -> Option<usize> {
        with(|recorder| {
            let took = Duration::from_millis(1);
            recorder.client_request(key, took, || attributes(key));
            recorder.bound_len()
        })
        .flatten()
    }

    #[test]
    fn a_thread_binds_each_attribute_set_once_and_anew_for_new_instruments() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let provider = SdkMeterProvider::builder().build();
        let meter = provider.meter("test");
        let first = Instruments::publish(&meter);
        assert_eq!(record(&get(200)), Some(1));
        assert_eq!(record(&get(200)), Some(1), "the same set: bound once");
        assert_eq!(record(&get(404)), Some(2));
        let second = Instruments::publish(&meter);
        assert_eq!(
            record(&get(200)),
            Some(1),
            "bound anew for the instruments published since"
        );
        // Past the most a thread binds, records are made unbound.
        for status in 0..bound::MAX_BOUND as u16 + 10 {
            let bound = record(&get(1000 + status));
            assert!(bound.is_some_and(|n| n <= bound::MAX_BOUND), "{bound:?}");
        }
        assert_eq!(record(&get(5000)), Some(bound::MAX_BOUND));
        Instruments::withdraw(&second);
        Instruments::withdraw(&first);
        assert_eq!(record(&get(200)), None, "none published");
    }

    /// The sets `record` left this thread's server and operation
    /// histograms bound to.
    fn few(record: impl FnOnce(&mut Recorder<'_>)) -> Option<(usize, usize, usize, usize)> {
        with(|recorder| {
            record(recorder);
            let bound = recorder.bound.as_ref()?;
            Some((
                bound.server.len(),
                bound.request_reads.len(),
                bound.operation_reads.len(),
                bound.operation_delta.len(),
            ))
        })
        .flatten()
    }

    #[test]
    fn a_thread_binds_the_request_s_histograms_to_each_set_it_recorded() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let provider = SdkMeterProvider::builder().build();
        let mine = Instruments::publish(&provider.meter("test"));
        let status = |code: i64| [KeyValue::new("http.response.status_code", code)];
        let took = Duration::from_millis(3);
        assert_eq!(
            few(|r| r.server_request(took, &status(200))),
            Some((1, 0, 0, 0))
        );
        assert_eq!(
            few(|r| r.server_request(took, &status(200))),
            Some((1, 0, 0, 0)),
            "the same set: bound once"
        );
        assert_eq!(
            few(|r| r.server_request(took, &status(429))),
            Some((2, 0, 0, 0))
        );
        assert_eq!(few(|r| r.request_reads(3)), Some((2, 1, 0, 0)));
        // Not priced: no delta recorded, so none bound; nor after a value
        // the SDK drops (no series made).
        assert_eq!(few(|r| r.operation("query", 3, None)), Some((2, 1, 1, 0)));
        assert_eq!(
            few(|r| r.operation("query", 3, Some(f64::NAN))),
            Some((2, 1, 1, 0))
        );
        assert_eq!(
            few(|r| r.operation("query", 3, Some(1.0))),
            Some((2, 1, 1, 1))
        );
        assert_eq!(
            few(|r| r.operation("mutation", 1, None)),
            Some((2, 1, 2, 1))
        );
        // Past the most a thread binds, records are made unbound.
        for code in 0..bound::MAX_FEW as i64 + 5 {
            few(|r| r.server_request(took, &status(1000 + code)));
        }
        assert_eq!(
            few(|r| r.server_request(took, &status(5000))).map(|n| n.0),
            Some(bound::MAX_FEW)
        );
        Instruments::withdraw(&mine);
    }

    #[test]
    fn a_thread_lets_withdrawn_instruments_go_at_its_next_record() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let provider = SdkMeterProvider::builder().build();
        let meter = provider.meter("test");
        let mine = Instruments::publish(&meter);
        assert_eq!(taken(), address(&mine));
        assert_eq!(Arc::strong_count(&mine), 3, "published, kept, mine");
        Instruments::withdraw(&mine);
        assert_eq!(Arc::strong_count(&mine), 2, "kept by this thread, mine");
        assert_eq!(taken(), None, "a record with none published");
        assert_eq!(
            Arc::strong_count(&mine),
            1,
            "the thread let the withdrawn instruments go"
        );
        let next = Instruments::publish(&meter);
        assert_eq!(taken(), address(&next), "and takes the next ones");
        Instruments::withdraw(&next);
    }
}
