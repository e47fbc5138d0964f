//! What a client writes costs the export queue bounded bytes (`telemetry`,
//! the `otel` feature): 1,500 requests, each with a 60 KB `operationName`
//! that names no operation of its document and an 8 KB `tracestate`, sent
//! while the collector takes connections and never answers, hold no more
//! than the same requests with telemetry off, give or take 16 MiB. The
//! same with the attribute value length limit raised to 64 KiB and the
//! document recorded, each request's document a 60 KB named operation:
//! the queue's bytes, not its spans, are then what refuses.
//!
//! Each case runs in a child process under an address-space limit
//! (`fanout_testkit::child`), so a queue without bound ends the child, not
//! the suite; the resident memory gained is read from the kernel after the
//! allocator has given its free pages back.
//!
//! `cargo test --features otel --test telemetry_bytes -- --nocapture`
//! prints the figures.
#![cfg(feature = "otel")]

use async_graphql::{EmptyMutation, EmptySubscription, Object, Schema};
use axum::Router;
use fanout_budget::config::TelemetryConfig;
use fanout_budget::telemetry::Telemetry;
use fanout_budget::{Config, Engine, FanoutExtension, FanoutGraphQL};
use fanout_testkit::child;
use futures::StreamExt as _;
use http::StatusCode;
use metrics_exporter_prometheus::PrometheusBuilder;
use std::time::Duration;
use tracing_subscriber::layer::SubscriberExt as _;

/// Requests sent.
const REQUESTS: usize = 1_500;
/// The `operationName` each sends, in bytes.
const NAME_BYTES: usize = 60_000;
/// Requests in flight at once.
const CONCURRENCY: usize = 16;

struct Query;

#[Object]
impl Query {
    async fn ping(&self) -> u32 {
        1
    }
}

fn app(record_document: bool) -> Router {
    let mut config = Config::default();
    config.telemetry.record_document = record_document;
    let engine = Engine::new(config);
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .finish();
    Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine))
}

/// A `tracestate` of the 32 members the W3C allows, 250 bytes each: 8 KB
/// the OpenTelemetry parser accepts whole.
fn tracestate() -> String {
    (0..32)
        .map(|i| format!("vendor{i:02}={}", "x".repeat(240)))
        .collect::<Vec<_>>()
        .join(",")
}

/// Gives the allocator's free pages back to the kernel, so the resident
/// memory read is what the process holds.
fn trim() {
    unsafe extern "C" {
        fn malloc_trim(pad: usize) -> std::ffi::c_int;
    }
    // SAFETY: glibc's `malloc_trim` takes no pointer and only releases
    // free memory.
    unsafe {
        malloc_trim(0);
    }
}

/// What each request carries.
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    /// A 60 KB `operationName` naming no operation of `{ ping }`.
    OperationName,
    /// A document of one operation with a 60 KB name, no `operationName`,
    /// recorded on the span (`record_document`), and the attribute value
    /// length limit at 64 KiB.
    Document,
}

/// In the child: the requests, exporting to a collector that never answers
/// when `on`; reports the resident MiB gained and the spans dropped.
fn run_requests(shape: Shape, on: bool) {
    let recorder = PrometheusBuilder::new().install_recorder().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        // The collector: takes every connection, reads nothing, answers
        // nothing; stopped at the end.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dead = format!("http://{}", listener.local_addr().unwrap());
        let collector = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        // The defaults the gateway runs with: only the endpoint is set.
        let limit = match shape {
            Shape::OperationName => 1024,
            Shape::Document => 65_536,
        };
        let config = TelemetryConfig::default()
            .otlp_endpoint(dead)
            .attribute_value_length_limit(limit);
        let telemetry = on.then(|| {
            Telemetry::builder(config)
                .build()
                .unwrap()
                .expect("an endpoint turns export on")
        });
        let subscriber = tracing_subscriber::registry().with(telemetry.as_ref().map(|t| t.layer()));
        tracing::subscriber::set_global_default(subscriber).unwrap();

        let app = app(shape == Shape::Document);
        let name = "N".repeat(NAME_BYTES);
        let body = match shape {
            Shape::OperationName => {
                serde_json::json!({ "query": "{ ping }", "operationName": name })
            }
            Shape::Document => serde_json::json!({ "query": format!("query {name} {{ ping }}") }),
        }
        .to_string();
        let state = tracestate();
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let send = |_| {
            let (app, body, state) = (&app, body.clone(), &state);
            async move {
                let headers = [("traceparent", traceparent), ("tracestate", state.as_str())];
                fanout_testkit::post(app, body, &headers).await.status
            }
        };
        // The same requests before measuring: what is built once is built.
        let warm: Vec<StatusCode> = futures::stream::iter(0..50)
            .map(send)
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        assert!(warm.iter().all(|s| *s == StatusCode::OK), "{warm:?}");
        trim();
        let before = child::rss_mib();
        let statuses: Vec<StatusCode> = futures::stream::iter(0..REQUESTS)
            .map(send)
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        assert!(statuses.iter().all(|s| *s == StatusCode::OK));
        trim();
        let gained = child::rss_mib() - before;
        let page = recorder.render();
        let dropped = |reason: &str| {
            let line = format!("fanout_telemetry_spans_dropped_total{{reason=\"{reason}\"}} ");
            page.lines()
                .find_map(|l| l.strip_prefix(&line))
                .map_or(0, |v| v.trim().parse::<u64>().unwrap())
        };
        child::report(format!(
            "{gained:.1} {} {}",
            dropped("queue_full"),
            dropped("queue_bytes")
        ));
        collector.abort();
        // Its shutdown would wait on the collector.
        std::mem::forget(telemetry);
    });
}

/// Runs `case` of `test` in a child: MiB gained, spans dropped as the
/// queue was full, and as its bytes were.
fn measure(test: &str, case: &str) -> (f64, u64, u64) {
    let run = child::run(test, case, 2048, Duration::from_secs(300));
    assert!(
        run.success,
        "the child ({case}) ended {}:\n{}",
        run.ended, run.output
    );
    let report = run.reports.last().expect("a report").clone();
    let mut fields = report.split(' ');
    let mut next = || fields.next().expect("three figures");
    (
        next().parse().unwrap(),
        next().parse().unwrap(),
        next().parse().unwrap(),
    )
}

#[test]
fn a_collector_that_never_answers_holds_bounded_bytes_whatever_clients_send() {
    if let Some(case) = child::case() {
        return run_requests(Shape::OperationName, case == "on");
    }
    let test = "a_collector_that_never_answers_holds_bounded_bytes_whatever_clients_send";
    let (off, _, _) = measure(test, "off");
    let (on, queue_full, queue_bytes) = measure(test, "on");
    println!(
        "resident MiB gained by {REQUESTS} requests: telemetry off {off:.1}, \
         on {on:.1} (spans dropped: {queue_full} queue_full, {queue_bytes} queue_bytes)"
    );
    // 3,000 spans were made (a SERVER span and an operation's per
    // request); the queue holds 2,048 at most. Each span carrying the
    // 60 KB name and the 8 KB state, they would be ~100 MiB.
    assert!(
        on - off < 16.0,
        "telemetry costs {:.1} MiB more (on {on:.1}, off {off:.1})",
        on - off
    );
    assert!(
        queue_full + queue_bytes > 0,
        "the collector never answered: spans past the queue are dropped and counted"
    );
}

#[test]
fn the_queue_s_bytes_bound_it_when_its_spans_are_large() {
    if let Some(case) = child::case() {
        return run_requests(Shape::Document, case == "on");
    }
    let test = "the_queue_s_bytes_bound_it_when_its_spans_are_large";
    let (off, _, _) = measure(test, "off");
    let (on, queue_full, queue_bytes) = measure(test, "on");
    println!(
        "resident MiB gained by {REQUESTS} requests of 60 KB documents, recorded: \
         telemetry off {off:.1}, on {on:.1} \
         (spans dropped: {queue_full} queue_full, {queue_bytes} queue_bytes)"
    );
    // Each operation's span carries ~120 KB (its name and its document):
    // 1,024 of them in the queue's 2,048 places would be ~120 MiB. The
    // queue holds 8 MiB of them; a batch being exported is copied (its
    // protobuf) for a moment, and the allocator keeps some of what the
    // copies freed: twice the queue, and as much again for margin.
    assert!(
        on - off < 32.0,
        "telemetry costs {:.1} MiB more (on {on:.1}, off {off:.1})",
        on - off
    );
    assert!(
        queue_bytes > 1_000,
        "the queue's bytes refuse most of the 1,500 operations' spans: {queue_bytes}"
    );
}
