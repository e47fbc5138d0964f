//! The telemetry's connections to its collector are bounded (`telemetry`,
//! the `otel` feature): exports that time out, one after another, leave no
//! socket open behind them. A collector that takes connections and never
//! answers — holding each socket unread, or reading and never answering —
//! is sent a hundred exports (a traced request, then a flush, each export
//! given up after 50 ms); the sockets this process holds open to it,
//! counted from the kernel after each flush, never exceed
//! [`MAX_CONNECTIONS`] (one for the spans' export thread, one for the
//! metrics'), and none is left once the exports have ended. Exports of
//! batches of several MiB, more than the socket buffers of a collector
//! that never reads take, are given up writing: hyper would keep each such
//! connection for as long as the collector holds it (20 open after 20
//! exports, before `TCP_USER_TIMEOUT`); the kernel now aborts each, at
//! most [`MAX_WRITING`] open at once, none after. A collector that answers
//! is sent the same exports over one connection kept and reused.
//!
//! `cargo test --features otel --test telemetry_connections -- --nocapture`
//! prints the figures.
#![cfg(all(feature = "otel", target_os = "linux"))]

use async_graphql::{EmptyMutation, EmptySubscription, Object, Schema};
use axum::Router;
use fanout_budget::config::TelemetryConfig;
use fanout_budget::telemetry::Telemetry;
use fanout_budget::{Config, Engine, FanoutExtension, FanoutGraphQL};
use fanout_testkit::hung::{sockets_open_to, Hangs, Hung};
use fanout_testkit::otlp::Collector;
use http::StatusCode;
use std::time::Duration;
use tracing_subscriber::layer::SubscriberExt as _;

/// The sockets open to the collector at most while exports time out
/// waiting for their answers: one export at a time on the spans' thread,
/// one on the metrics' reader.
const MAX_CONNECTIONS: usize = 2;
/// The most while exports are given up writing: hyper flushes before it
/// closes, so each such connection lasts until the kernel aborts it
/// (`TCP_USER_TIMEOUT`, the export timeout), at a zero-window probe: the
/// probes back off from the retransmission timeout (200 ms at least),
/// doubling, so that comes within about twice the timeout and two probe
/// intervals — while at most three more exports of the spans' thread
/// start, each taking the timeout.
const MAX_WRITING: usize = 5;
/// A sampled request's `traceparent`.
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

struct Query;

#[Object]
impl Query {
    async fn ping(&self) -> u32 {
        1
    }
}

/// The engine's endpoint; the operation recorded on its span.
fn app() -> Router {
    let mut config = Config::default();
    config.telemetry.record_document = true;
    let engine = Engine::new(config);
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .finish();
    Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine))
}

/// What each export carries.
#[derive(Clone, Copy)]
struct Exports {
    /// How many.
    count: usize,
    /// Traced requests before each: their spans are its batch.
    requests: usize,
    /// The bytes of each request's operation name, recorded with its
    /// document (the attribute value length limit is 64 KiB).
    name_bytes: usize,
    /// How long each may take.
    timeout: Duration,
    /// The sockets open at most.
    most: usize,
}

/// One small batch each: a request's spans, less than a socket buffer.
const SMALL: Exports = Exports {
    count: 100,
    requests: 1,
    name_bytes: 8,
    timeout: Duration::from_millis(50),
    most: MAX_CONNECTIONS,
};

/// Batches of ~4.8 MB (40 requests whose operation's span carries a 60 KB
/// name twice), more than a collector that never reads takes before the
/// sender's writes stall; each export given up after 250 ms, more than
/// the least retransmission timeout, as the default 5 s is.
const LARGE: Exports = Exports {
    count: 24,
    requests: 40,
    name_bytes: 60_000,
    timeout: Duration::from_millis(250),
    most: MAX_WRITING,
};

/// Sends `exports` to the collector at `base` (port `port`): the most
/// sockets open to it after any export, and those open once all ended
/// (waited for up to 5 s: a connection given up is closed by its own task,
/// or aborted by the kernel).
async fn export(base: &str, port: u16, exports: Exports) -> (usize, usize) {
    let config = TelemetryConfig::default()
        .otlp_endpoint(base)
        .attribute_value_length_limit(65_536);
    let telemetry = Telemetry::builder(config)
        .max_queued_bytes(64 << 20)
        .export_interval(Duration::from_secs(3600))
        .metric_interval(Duration::from_secs(3600))
        .export_timeout(exports.timeout)
        .build()
        .unwrap()
        .expect("an endpoint turns export on");
    let subscriber = tracing_subscriber::registry().with(telemetry.layer());
    let _default = tracing::subscriber::set_default(subscriber);
    let (app, name) = (app(), "N".repeat(exports.name_bytes));
    let body = serde_json::json!({ "query": format!("query {name} {{ ping }}") }).to_string();
    let mut telemetry = Some(telemetry);
    let mut most = 0;
    for _ in 0..exports.count {
        for _ in 0..exports.requests {
            let headers = [("traceparent", TRACEPARENT)];
            let answer = fanout_testkit::post(&app, body.clone(), &headers).await;
            assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.json());
        }
        // Off the runtime's thread: the export runs on it. (The SDK's
        // flush reports no export failure.)
        let flushing = telemetry.take().unwrap();
        telemetry = Some(
            tokio::task::spawn_blocking(move || {
                let _ = flushing.flush();
                flushing
            })
            .await
            .unwrap(),
        );
        most = most.max(sockets_open_to(port));
    }
    // Off the runtime's thread too: its shutdown exports once more.
    tokio::task::spawn_blocking(move || drop(telemetry))
        .await
        .unwrap();
    let mut left = usize::MAX;
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            left = sockets_open_to(port);
            if left == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    (most, left)
}

/// [`export`] to a [`Hung`] collector: what it found, and the connections
/// the collector took.
async fn hung(hangs: Hangs, exports: Exports) -> (usize, usize, usize) {
    let collector = Hung::start(hangs).await;
    let (most, left) = export(&collector.base, collector.port, exports).await;
    println!(
        "{} exports of {} requests' spans to a collector that {hangs:?}: \
         sockets open at most {most}, {left} after; {} connections taken",
        exports.count,
        exports.requests,
        collector.accepted()
    );
    (most, left, collector.accepted())
}

/// The bounds: at most `exports.most` at once, none after, and every
/// export reached the collector (each on a connection of its own: none
/// that timed out can be used again).
fn assert_bounded((most, left, accepted): (usize, usize, usize), exports: Exports) {
    assert!(
        most <= exports.most,
        "{most} sockets open to the collector after {} exports timed out",
        exports.count
    );
    assert_eq!(left, 0, "sockets still open once the exports ended");
    assert!(
        accepted >= exports.count,
        "each export reached the collector: {accepted} connections taken"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn exports_that_time_out_unread_leave_no_socket_open() {
    assert_bounded(hung(Hangs::Holds, SMALL).await, SMALL);
}

#[tokio::test(flavor = "current_thread")]
async fn exports_that_time_out_unanswered_leave_no_socket_open() {
    assert_bounded(hung(Hangs::Reads, SMALL).await, SMALL);
}

#[tokio::test(flavor = "current_thread")]
async fn exports_given_up_while_writing_leave_no_socket_open() {
    assert_bounded(hung(Hangs::Holds, LARGE).await, LARGE);
}

#[tokio::test(flavor = "current_thread")]
async fn a_collector_that_answers_is_sent_over_connections_kept() {
    let collector = Collector::start().await;
    let port: u16 = collector.base.rsplit(':').next().unwrap().parse().unwrap();
    // Each export given the default's time, not the hung collectors'
    // 50 ms: one that answers late on a loaded machine would otherwise be
    // given up, and its connection with it.
    let exports = Exports {
        timeout: Duration::from_secs(5),
        ..SMALL
    };
    let (most, _) = export(&collector.base, port, exports).await;
    println!(
        "{} exports to a collector that answers: sockets open at most {most}",
        SMALL.count
    );
    assert!(
        (1..=MAX_CONNECTIONS).contains(&most),
        "{most} sockets open to the collector"
    );
    assert!(
        !collector.spans().is_empty(),
        "the spans reached the collector"
    );
}
