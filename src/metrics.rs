//! The engine's metrics, through the `metrics` facade.
//!
//! The engine records; the application installs a recorder (the gateway
//! exports Prometheus text at `/metrics`). Without a recorder every call is a
//! no-op. Per-host handles are registered once per `host` label and engine
//! (on the first read that needs them, so after the application installed
//! its recorder) and kept in the engine's host table, so the read path
//! registers nothing. The engine keeps the handles of what each request and
//! operation records too ([`RequestMetrics`], `request.rs`), each registered
//! the first time it records it, each memory pool its gauge, and the
//! inbound limits theirs (`inbound.rs`).
//!
//! **The `host` label is bounded by the configuration.** A host with a
//! `[hosts."HOST:PORT"]` table, or known to the engine
//! ([`EngineBuilder::known_host`](crate::EngineBuilder::known_host): the
//! gateway's `--upstream`), is labelled with its own `HOST:PORT`; every other
//! host (a redirect's target, a `permit` name, an upstream without a table)
//! is counted under `host="other"` ([`OTHER_HOSTS`](crate::read::OTHER_HOSTS)).
//! Reads reach whatever hosts their upstreams redirect to, so a label per
//! host would let them add series without end. Errors and trace spans still
//! name the real host.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `fanout_upstream_in_flight` | gauge | `host` | reads in flight to the host |
//! | `fanout_upstream_reads_total` | counter | `host`, `outcome` | reads sent, by outcome (`ok`, `error`, `timeout`, `deadline`, `cancelled`) |
//! | `fanout_upstream_read_seconds` | histogram | `host` | duration of sent reads |
//! | `fanout_upstream_timeouts_total` | counter | `host` | reads cut by the read timeout or the deadline |
//! | `fanout_host_rejections_total` | counter | `host` | reads refused `HOST_SATURATED` |
//! | `fanout_budget_exhausted_total` | counter | — | reads refused `FANOUT_BUDGET_EXHAUSTED` |
//! | `fanout_dedup_hits_total` | counter | — | reads answered by the request's de-duplication |
//! | `fanout_coalesced_reads_total` | counter | `host` | reads answered by an identical read another request had in flight (`[hosts] coalesce`): not sent, not charged |
//! | `fanout_cache_total` | counter | `host`, `outcome` | reads the engine's cache may answer (declared immutable or fresh, or to a host with `cache_control`): answered from it (`hit`: not sent, not charged) or not (`miss`), and answers it kept (`stored`: once per entry) |
//! | `fanout_requests_total` | counter | `caller` | inbound HTTP requests that ran |
//! | `fanout_request_reads` | histogram | — | reads charged to each inbound request (and WebSocket event) |
//! | `fanout_request_seconds` | histogram | — | how long each inbound GraphQL request over HTTP took to answer |
//! | `fanout_operation_reads` | histogram | `type` | reads each operation sent (`query`, `mutation`, `subscription`) |
//! | `fanout_operation_delta` | histogram | `type` | requested − reads, for each operation priced (negative: the estimate was low) |
//! | `fanout_rate_limited_total` | counter | — | inbound requests answered 429 |
//! | `fanout_quota_reads_total` | counter | `class`, `outcome` | reads of the clients' read quotas (`[quota]`), by class (`reads`, `internal-reads`): `reserved` before requests ran, `refunded` after (reserved, not spent), `refused` (asked by requests answered 429 `QUOTA_EXHAUSTED`) |
//! | `fanout_would_refuse_total` | counter | `limit` | what a limit in `mode = "measure"` would have refused and let through: requests for `rate_limit` and `estimate` (a batch priced past its budget), reads for `budget`, `quota` and `subscriptions` |
//! | `fanout_budget_header_ignored_total` | counter | `member` | members of an inbound `Fanout-Budget` ignored (`reads`, `deadline-ms`, `hops`: not a non-negative integer; `unparsable`), and of an upstream's `Fanout-Spent` (`spent`) |
//! | `fanout_spent_beyond_grant_reads_total` | counter | — | reads an upstream reported spent (`Fanout-Spent`) past the reads it was granted: not believed, not charged |
//! | `fanout_rate_limit_exempt_total` | counter | — | inbound requests exempted as internal |
//! | `fanout_wrong_internal_token_total` | counter | — | inbound requests with a wrong internal token |
//! | `fanout_shared_state_fallback_total` | counter | `backend` | checks answered in-process because Redis was down |
//! | `fanout_redis_calls_total` | counter | — | calls sent to Redis (per-IP checks, host share claims, give-backs, probes) |
//! | `fanout_host_share_slots` | gauge | `host` | slots of the host's cap this replica may use, as its last claim on Redis answered (`[redis]`; 0 when it holds none) |
//! | `fanout_host_share_busy` | gauge | `host` | 1 when the last claim found the replicas' demand for the host not met (the cap is shared out), else 0 |
//! | `fanout_connections_refused_total` | counter | — | inbound connections reset as soon as accepted, their client having its share open (`http.max_connections_per_client`; `serve`), or the table and the 128 waiting for a slot full |
//! | `fanout_parsed_documents_total` | counter | `source` | operations' documents, `cache` (kept from an earlier request) or `parser` |
//! | `fanout_document_cache_bytes` | gauge | — | the kept documents' estimated weight (all engines of the process) |
//! | `fanout_memory_held_bytes` | gauge | — | memory the requests in flight hold in the engine's pool (`http.max_inflight_bytes`): answers being built and written, upstream bodies kept; taken in 64 KiB blocks |
//! | `fanout_socket_memory_held_bytes` | gauge | — | memory the open WebSocket connections hold in the sockets' pool (`subscriptions.max_bytes`): their subscriptions, their events being resolved and waiting to be written |
//! | `fanout_memory_trips_total` | counter | `bound` | requests stopped by a memory bound: `answer` (`http.max_answer_bytes`: `RESPONSE_TOO_LARGE`) or `process` (`http.max_inflight_bytes`: `OVERLOADED`) |
//! | `fanout_telemetry_spans_dropped_total` | counter | `reason` | trace spans never delivered to the OTLP collector (`otel` feature, `[telemetry]`): `queue_full` (the export queue held its most spans, the collector slow or down), `queue_bytes` (the queue held its most bytes), `export_failed` (the collector refused them or was not reached in time), `shutdown` (ended after the telemetry shut down) |

use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};

mod inbound;
mod kept;
mod request;

pub(crate) use inbound::{LimiterMetrics, QuotaMetrics, QuotaReads};
pub(crate) use request::RequestMetrics;

/// Cached metric handles for one `host` label: a host of its own, or `other`.
pub(crate) struct HostMetrics {
    pub(crate) in_flight: Gauge,
    pub(crate) ok: Counter,
    pub(crate) error: Counter,
    pub(crate) timeout: Counter,
    pub(crate) deadline: Counter,
    pub(crate) cancelled: Counter,
    pub(crate) timeouts: Counter,
    pub(crate) rejections: Counter,
    pub(crate) coalesced: Counter,
    pub(crate) cache_hits: Counter,
    pub(crate) cache_misses: Counter,
    pub(crate) cache_stored: Counter,
    pub(crate) latency: Histogram,
    /// `server.address` and `server.port` of OpenTelemetry's
    /// `http.client.request.duration` for the label: `other` alone for the
    /// hosts without an entry of their own (`telemetry`).
    #[cfg(feature = "otel")]
    pub(crate) server: Vec<opentelemetry::KeyValue>,
    /// The label's number, the same in every engine of the process for
    /// its life: what names `server` in a thread's bound histograms
    /// (`telemetry`), one key per attribute set.
    #[cfg(feature = "otel")]
    pub(crate) id: u64,
}

/// The number of the host label `host`, given the first time it is asked
/// for (once per label and engine).
#[cfg(feature = "otel")]
fn label_id(host: &str) -> u64 {
    use std::collections::HashMap;
    use std::sync::{LazyLock, Mutex};
    static IDS: LazyLock<Mutex<HashMap<String, u64>>> = LazyLock::new(Mutex::default);
    let mut ids = IDS.lock().unwrap_or_else(|e| e.into_inner());
    let next = ids.len() as u64;
    *ids.entry(host.to_owned()).or_insert(next)
}

/// `server.address` (and `server.port`) for the label `host` (`host:port`,
/// or `other`).
#[cfg(feature = "otel")]
fn server_attributes(host: &str) -> Vec<opentelemetry::KeyValue> {
    use opentelemetry::{KeyValue, StringValue};
    let (address, port) = match host.rsplit_once(':') {
        // An IPv6 literal is bracketed: its colons are inside.
        Some((address, port)) if !port.contains(']') => (address, port.parse::<u16>().ok()),
        _ => (host, None),
    };
    let address = address.trim_start_matches('[').trim_end_matches(']');
    let mut server = vec![KeyValue::new(
        "server.address",
        StringValue::from(std::sync::Arc::<str>::from(address)),
    )];
    if let Some(port) = port {
        server.push(KeyValue::new("server.port", i64::from(port)));
    }
    server
}

impl HostMetrics {
    /// Registers the handles for the label `host`.
    pub(crate) fn new(host: &str) -> Self {
        let h = host.to_string();
        let reads = |outcome: &'static str| counter!("fanout_upstream_reads_total", "host" => h.clone(), "outcome" => outcome);
        Self {
            in_flight: gauge!("fanout_upstream_in_flight", "host" => h.clone()),
            ok: reads("ok"),
            error: reads("error"),
            timeout: reads("timeout"),
            deadline: reads("deadline"),
            cancelled: reads("cancelled"),
            timeouts: counter!("fanout_upstream_timeouts_total", "host" => h.clone()),
            rejections: counter!("fanout_host_rejections_total", "host" => h.clone()),
            coalesced: counter!("fanout_coalesced_reads_total", "host" => h.clone()),
            cache_hits: counter!("fanout_cache_total", "host" => h.clone(), "outcome" => "hit"),
            cache_misses: counter!("fanout_cache_total", "host" => h.clone(), "outcome" => "miss"),
            cache_stored: counter!("fanout_cache_total", "host" => h.clone(), "outcome" => "stored"),
            latency: histogram!("fanout_upstream_read_seconds", "host" => h),
            #[cfg(feature = "otel")]
            server: server_attributes(host),
            #[cfg(feature = "otel")]
            id: label_id(host),
        }
    }
}

/// Cached handles for an engine's parsed-document cache (registered on its
/// first use).
pub(crate) struct DocumentMetrics {
    pub(crate) from_cache: Counter,
    pub(crate) parsed: Counter,
    pub(crate) kept_bytes: Gauge,
}

impl DocumentMetrics {
    pub(crate) fn new() -> Self {
        Self {
            from_cache: counter!("fanout_parsed_documents_total", "source" => "cache"),
            parsed: counter!("fanout_parsed_documents_total", "source" => "parser"),
            kept_bytes: gauge!("fanout_document_cache_bytes"),
        }
    }
}

/// A subscribe refused past `subscriptions.max_per_connection`.
pub(crate) fn subscription_refused() {
    counter!("fanout_subscriptions_refused_total").increment(1);
}

/// An event dropped before it was written: its subscription had
/// `subscriptions.max_pending_events` waiting, or the memory pool was full.
pub(crate) fn subscription_event_dropped() {
    counter!("fanout_subscription_events_dropped_total").increment(1);
}

/// A shared poll's read, by who paid: `paid` (one subscriber's connection)
/// or `unpaid` (none of its subscribers could pay; no read sent).
pub(crate) fn shared_poll(outcome: &'static str) {
    counter!("fanout_shared_polls_total", "outcome" => outcome).increment(1);
}

/// Counts one call sent to Redis.
#[cfg(feature = "redis")]
pub(crate) fn redis_call() {
    counter!("fanout_redis_calls_total").increment(1);
}

/// The gauges of this replica's share of `host`'s cap on Redis: slots
/// allowed, and whether the cap is shared out (busy).
#[cfg(feature = "redis")]
pub(crate) fn host_share(host: &str) -> (Gauge, Gauge) {
    let host = host.to_string();
    (
        gauge!("fanout_host_share_slots", "host" => host.clone()),
        gauge!("fanout_host_share_busy", "host" => host),
    )
}

/// Counts a check answered in-process because the shared backend was down.
pub(crate) fn shared_state_fallback(backend: &'static str) {
    counter!("fanout_shared_state_fallback_total", "backend" => backend).increment(1);
}

/// The gauge of what the requests in flight hold in their pool (set once
/// per 64 KiB block taken or given back, not per value).
pub(crate) fn memory_held() -> Gauge {
    gauge!("fanout_memory_held_bytes")
}

/// `n` (requests or reads) a limit in measure mode would have refused,
/// from `client`: counted, and logged naming the client — at most one line
/// a second for all limits, so a client far over a limit cannot flood the
/// log.
pub(crate) fn would_refuse(limit: &'static str, client: &dyn std::fmt::Display, n: u64) {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    counter!("fanout_would_refuse_total", "limit" => limit).increment(n);
    static LOGGED: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if LOGGED.swap(now, Relaxed) != now {
        tracing::info!(
            limit,
            %client,
            n,
            "a limit in measure mode let through what enforce would have refused"
        );
    }
}

/// A member of an inbound `Fanout-Budget` (or of an upstream's
/// `Fanout-Spent`) ignored: not a non-negative integer (`member` names it),
/// or not parsable at all (`unparsable`).
pub(crate) fn budget_header_ignored(member: &'static str) {
    counter!("fanout_budget_header_ignored_total", "member" => member).increment(1);
}

/// An upstream reported more reads spent (`Fanout-Spent`) than it was
/// granted: `over` reads not believed.
pub(crate) fn spent_beyond_grant(over: u64) {
    counter!("fanout_spent_beyond_grant_reads_total").increment(over);
}

/// The gauge of what the open sockets hold in their pool.
pub(crate) fn socket_memory_held() -> Gauge {
    gauge!("fanout_socket_memory_held_bytes")
}

/// Counts a request stopped by a memory bound (its own answer's, or the
/// process's).
pub(crate) fn memory_trip(process: bool) {
    let bound = if process { "process" } else { "answer" };
    counter!("fanout_memory_trips_total", "bound" => bound).increment(1);
}

/// The counter of inbound connections refused past their client's share.
pub(crate) fn connections_refused() -> Counter {
    counter!("fanout_connections_refused_total")
}

/// Trace spans never delivered to the collector, `n` of them, and why
/// (`queue_full`, `queue_bytes`, `export_failed`, `shutdown`).
#[cfg(feature = "otel")]
pub(crate) fn spans_dropped(reason: &'static str, n: u64) {
    counter!("fanout_telemetry_spans_dropped_total", "reason" => reason).increment(n);
}
