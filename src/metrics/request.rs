//! The handles of the metrics recorded per inbound request and per
//! operation, kept by the engine.
//!
//! A `counter!` (`histogram!`, `gauge!`) registers its key with the recorder
//! on every call: it hashes the key, sorts its labels and looks it up in the
//! recorder's map — about 0.5 % of a request's CPU when each request did it
//! for each of its metrics. The engine registers each of these once, the
//! first time it records it (so after the application installed its
//! recorder, whatever the order in which it built the engine), keeps the
//! handle, and records through it. A label with a bounded set of values
//! (`caller`, `type`) has a handle for each value.
//!
//! A recorder installed after the engine first recorded a metric does not
//! receive it from that engine (as with the per-host handles: the book's
//! telemetry chapter says so).

use metrics::{counter, histogram, Counter, Histogram};
use std::sync::OnceLock;

/// The engine's handles for what each inbound request and each operation
/// records, each registered on first use.
#[derive(Default)]
pub(crate) struct RequestMetrics {
    /// `fanout_requests_total{caller="public"}`.
    public: OnceLock<Counter>,
    /// `fanout_requests_total{caller="internal"}`.
    internal: OnceLock<Counter>,
    /// `fanout_request_reads`.
    reads: OnceLock<Histogram>,
    /// `fanout_request_seconds`.
    seconds: OnceLock<Histogram>,
    query: OperationMetrics,
    mutation: OperationMetrics,
    subscription: OperationMetrics,
    /// `fanout_dedup_hits_total`.
    dedup_hits: OnceLock<Counter>,
    /// `fanout_budget_exhausted_total`.
    budget_exhausted: OnceLock<Counter>,
}

/// The handles for one operation type (`type` label).
#[derive(Default)]
struct OperationMetrics {
    /// `fanout_operation_reads{type}`.
    reads: OnceLock<Histogram>,
    /// `fanout_operation_delta{type}`.
    delta: OnceLock<Histogram>,
}

impl RequestMetrics {
    /// An inbound HTTP request (or WebSocket connection) that ran, from an
    /// internal caller or not.
    pub(crate) fn request(&self, internal: bool) {
        let (cell, caller) = match internal {
            true => (&self.internal, "internal"),
            false => (&self.public, "public"),
        };
        (cell.get_or_init(|| counter!("fanout_requests_total", "caller" => caller))).increment(1);
    }

    /// The reads one inbound request (or WebSocket event) was charged, when
    /// its scope ends.
    pub(crate) fn request_reads(&self, reads: u64) {
        (self
            .reads
            .get_or_init(|| histogram!("fanout_request_reads")))
        .record(reads as f64);
    }

    /// How long an inbound GraphQL request over HTTP took to answer.
    pub(crate) fn request_seconds(&self, took: std::time::Duration) {
        (self
            .seconds
            .get_or_init(|| histogram!("fanout_request_seconds")))
        .record(took.as_secs_f64());
    }

    /// What one operation (`kind`: `query`, `mutation`, `subscription`)
    /// sent, and, when it was priced, `requested − reads` (`delta`).
    pub(crate) fn operation(&self, kind: &'static str, reads: u64, delta: Option<f64>) {
        let (handles, kind) = match kind {
            "mutation" => (&self.mutation, "mutation"),
            "subscription" => (&self.subscription, "subscription"),
            _ => {
                debug_assert_eq!(kind, "query", "an operation type");
                (&self.query, "query")
            }
        };
        (handles.reads)
            .get_or_init(|| histogram!("fanout_operation_reads", "type" => kind))
            .record(reads as f64);
        if let Some(delta) = delta {
            (handles.delta)
                .get_or_init(|| histogram!("fanout_operation_delta", "type" => kind))
                .record(delta);
        }
    }

    /// A read answered by the request's de-duplication.
    pub(crate) fn dedup_hit(&self) {
        super::kept::count(&self.dedup_hits, "fanout_dedup_hits_total");
    }

    /// A read refused `FANOUT_BUDGET_EXHAUSTED`.
    pub(crate) fn budget_exhausted(&self) {
        super::kept::count(&self.budget_exhausted, "fanout_budget_exhausted_total");
    }
}
