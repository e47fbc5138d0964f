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
//! atomic load when no telemetry lives (nothing recorded), else a read
//! lock. `server.address` (and `server.port`) is the host a read was sent
//! to when it has a `[hosts]` table or is known to the engine, else
//! `other` (no port): the series stay bounded by the configuration, as the
//! Prometheus `host` label does (`src/metrics.rs`).

use opentelemetry::metrics::{Histogram, Meter};
use opentelemetry::KeyValue;
use std::sync::atomic::{AtomicBool, Ordering};
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
        *CURRENT.write().unwrap_or_else(|e| e.into_inner()) = Some(instruments.clone());
        PUBLISHED.store(true, Ordering::Release);
        instruments
    }

    /// Stops publishing `mine`, unless another telemetry replaced them.
    pub(crate) fn withdraw(mine: &Arc<Instruments>) {
        let mut current = CURRENT.write().unwrap_or_else(|e| e.into_inner());
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, mine)) {
            *current = None;
            PUBLISHED.store(false, Ordering::Release);
        }
    }

    /// One upstream request: how long it took, and its attributes.
    pub(crate) fn client_request(&self, took: Duration, attributes: &[KeyValue]) {
        self.client_duration.record(took.as_secs_f64(), attributes);
    }

    /// One inbound request: how long it took to answer, and its attributes.
    pub(crate) fn server_request(&self, took: Duration, attributes: &[KeyValue]) {
        self.server_duration.record(took.as_secs_f64(), attributes);
    }

    /// The reads one inbound request was charged.
    pub(crate) fn request_reads(&self, reads: u64) {
        self.request_reads.record(reads, &[]);
    }

    /// What one operation of type `kind` sent, and `requested − reads`
    /// when it was priced.
    pub(crate) fn operation(&self, kind: &'static str, reads: u64, delta: Option<f64>) {
        let attributes = [KeyValue::new("graphql.operation.type", kind)];
        self.operation_reads.record(reads, &attributes);
        if let Some(delta) = delta {
            self.operation_delta.record(delta, &attributes);
        }
    }
}

/// Whether instruments are published (a telemetry lives): one atomic load.
pub(crate) fn is_recording() -> bool {
    PUBLISHED.load(Ordering::Acquire)
}

/// The published instruments, when a telemetry lives.
pub(crate) fn current() -> Option<Arc<Instruments>> {
    if !PUBLISHED.load(Ordering::Acquire) {
        return None;
    }
    CURRENT.read().unwrap_or_else(|e| e.into_inner()).clone()
}
