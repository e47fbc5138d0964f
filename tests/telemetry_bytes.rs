//! What a client writes costs the export queue bounded bytes (`telemetry`,
//! the `otel` feature): 1,500 requests, each with a 60 KB `operationName`
//! that names no operation of its document and an 8 KB `tracestate`, sent
//! while the collector takes connections and never answers, hold no more
//! than the same requests with telemetry off, give or take 16 MiB. The
//! same with the attribute value length limit raised to 64 KiB and the
//! document recorded, each request's document a 60 KB named operation:
//! the queue's bytes, not its spans, are then what refuses. And the same
//! of a sampled request's reads, whose spans are built straight as span
//! data (`upstream.read`, a CLIENT span per upstream request): each request
//! asks for hundreds of reads of a path its client chose, 32 KB long, each
//! redirected as far as `upstream.max_redirects` lets a read go, under the
//! 64 KiB limit — its spans, not its operation's, are what the queue
//! refuses.
//!
//! Each case runs in a child process under an address-space limit
//! (`fanout_testkit::child`), so a queue without bound ends the child, not
//! the suite; the resident memory gained is read from the kernel after the
//! allocator has given its free pages back.
//!
//! `cargo test --features otel --test telemetry_bytes -- --nocapture`
//! prints the figures.
#![cfg(feature = "otel")]

use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema};
use axum::response::{IntoResponse, Response};
use axum::Router;
use fanout_budget::config::TelemetryConfig;
use fanout_budget::telemetry::Telemetry;
use fanout_budget::{Config, Engine, FanoutContext, FanoutExtension, FanoutGraphQL, Read};
use fanout_testkit::child;
use fanout_testkit::hung::{Hangs, Hung};
use futures::StreamExt as _;
use http::StatusCode;
use metrics_exporter_prometheus::PrometheusBuilder;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tracing_subscriber::layer::SubscriberExt as _;

/// Requests sent.
const REQUESTS: usize = 1_500;
/// The `operationName` each sends, in bytes.
const NAME_BYTES: usize = 60_000;
/// Requests in flight at once.
const CONCURRENCY: usize = 16;

/// Reads (`Shape::Reads`) each request asks for, fields of its document:
/// half again its budget, so some are refused (each still has its span).
const READS: usize = 150;
/// The path each read names, in bytes (a body may have 64 KiB).
const PATH_BYTES: usize = 32_000;
/// Requests of `Shape::Reads` sent: each makes ~250 spans of ~32 KB.
const READ_REQUESTS: usize = 60;
/// Those sent before measuring.
const READ_WARM: usize = 2;
/// Those in flight at once: each holds its reads' URLs and spans.
const READ_CONCURRENCY: usize = 4;

struct Query;

/// The upstream's base URL, for the resolvers.
struct Base(String);

#[Object]
impl Query {
    async fn ping(&self) -> u32 {
        1
    }

    /// Page `page` of the upstream's `path`, as an API that lets its
    /// client name what it reads would: the status it answered.
    async fn get(&self, ctx: &Context<'_>, path: String, page: u32) -> async_graphql::Result<u16> {
        let url = format!("{}{path}?page={page}", ctx.data::<Base>()?.0).parse()?;
        Ok(ctx.upstream()?.read(Read::get(url)).await?.status.as_u16())
    }
}

fn app(record_document: bool, upstream: &str) -> Router {
    let mut config = Config::default();
    config.telemetry.record_document = record_document;
    let engine = Engine::new(config);
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .data(Base(upstream.to_owned()))
        .finish();
    Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine))
}

/// What the upstream heard: every request, and those at a chain's end.
#[derive(Default)]
struct Heard {
    requests: AtomicU64,
    ends: AtomicU64,
}

/// An upstream on loopback, stopped at the end: `/r/{k}/{rest}` redirects
/// to `/r/{k-1}/{rest}` (its query kept) while `k > 0`, and answers `{}`
/// at `/r/0/…`.
async fn start_upstream() -> (String, Arc<Heard>, tokio::task::JoinHandle<()>) {
    let heard = Arc::new(Heard::default());
    let hearing = heard.clone();
    let app = Router::new().fallback(move |uri: http::Uri| {
        let heard = hearing.clone();
        async move {
            heard.requests.fetch_add(1, Ordering::Relaxed);
            let rest = uri.path().strip_prefix("/r/").expect("a chain's path");
            let (k, rest) = rest.split_once('/').expect("/r/{k}/{rest}");
            match k.parse::<u32>().expect("a hop count") {
                0 => {
                    heard.ends.fetch_add(1, Ordering::Relaxed);
                    "{}".into_response()
                }
                k => {
                    let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
                    let location = format!("/r/{}/{rest}{query}", k - 1);
                    let response: Response =
                        (StatusCode::FOUND, [(http::header::LOCATION, location)]).into_response();
                    response
                }
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, heard, task)
}

/// A document of [`READS`] reads of `$p`, each a page of its own (no two
/// the same read, so none is de-duplicated), and its variables: `$p` the
/// longest chain of redirects `max_redirects` lets a read follow, its path
/// [`PATH_BYTES`] long.
fn reads_body(max_redirects: u32) -> String {
    let fields: String = (0..READS)
        .map(|i| format!("r{i}:get(path:$p,page:{i}) "))
        .collect();
    let path = format!("/r/{max_redirects}/{}", "p".repeat(PATH_BYTES));
    serde_json::json!({
        "query": format!("query($p:String!){{ {fields}}}"),
        "variables": { "p": path },
    })
    .to_string()
}

/// A `tracestate` of the 32 members the W3C allows, 250 bytes each: 8 KB
/// the OpenTelemetry parser accepts whole.
fn tracestate() -> String {
    (0..32)
        .map(|i| format!("vendor{i:02}={}", "x".repeat(240)))
        .collect::<Vec<_>>()
        .join(",")
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
    /// [`READS`] reads of a [`PATH_BYTES`] path (`reads_body`), the
    /// attribute value length limit at 64 KiB.
    Reads,
}

/// In the child: the requests, exporting to a collector that never answers
/// when `on`; reports the resident MiB gained, the spans dropped, and the
/// requests the upstream heard (in all, and at a redirect chain's end).
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
        let collector = Hung::start(Hangs::Holds).await;
        let dead = collector.base.clone();
        // The defaults the gateway runs with: only the endpoint is set.
        let limit = match shape {
            Shape::OperationName => 1024,
            Shape::Document | Shape::Reads => 65_536,
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

        let (upstream, heard, upstream_task) = start_upstream().await;
        let app = app(shape == Shape::Document, &upstream);
        let name = "N".repeat(NAME_BYTES);
        let body = match shape {
            Shape::OperationName => {
                serde_json::json!({ "query": "{ ping }", "operationName": name }).to_string()
            }
            Shape::Document => {
                serde_json::json!({ "query": format!("query {name} {{ ping }}") }).to_string()
            }
            Shape::Reads => reads_body(Config::default().upstream.max_redirects),
        };
        let (requests, warm, concurrency) = match shape {
            Shape::Reads => (READ_REQUESTS, READ_WARM, READ_CONCURRENCY),
            _ => (REQUESTS, 50, CONCURRENCY),
        };
        let state = tracestate();
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let send = |traceparent| {
            let (app, body, state) = (&app, body.clone(), &state);
            async move {
                let headers = [("traceparent", traceparent), ("tracestate", state.as_str())];
                fanout_testkit::post(app, body, &headers).await.status
            }
        };
        // The same requests before measuring: what is built once is built.
        // Those of reads sampled out (their trace's flag `-00`): their
        // hundreds of spans would fill the queue before the measure.
        let flag = if shape == Shape::Reads { "00" } else { "01" };
        let unmeasured = traceparent.replace("-01", &format!("-{flag}"));
        let warm: Vec<StatusCode> = futures::stream::iter(0..warm)
            .map(|_| send(unmeasured.as_str()))
            .buffer_unordered(concurrency)
            .collect()
            .await;
        assert!(warm.iter().all(|s| *s == StatusCode::OK), "{warm:?}");
        child::trim_heap();
        let before = child::rss_mib();
        let statuses: Vec<StatusCode> = futures::stream::iter(0..requests)
            .map(|_| send(traceparent))
            .buffer_unordered(concurrency)
            .collect()
            .await;
        assert!(statuses.iter().all(|s| *s == StatusCode::OK));
        child::trim_heap();
        let gained = child::rss_mib() - before;
        let page = recorder.render();
        let dropped = |reason: &str| {
            let line = format!("fanout_telemetry_spans_dropped_total{{reason=\"{reason}\"}} ");
            page.lines()
                .find_map(|l| l.strip_prefix(&line))
                .map_or(0, |v| v.trim().parse::<u64>().unwrap())
        };
        child::report(format!(
            "{gained:.1} {} {} {} {} {}",
            dropped("queue_full"),
            dropped("queue_bytes"),
            dropped("export_failed"),
            heard.requests.load(Ordering::Relaxed),
            heard.ends.load(Ordering::Relaxed),
        ));
        drop(collector);
        upstream_task.abort();
        // Its shutdown would wait on the collector.
        std::mem::forget(telemetry);
    });
}

/// What a child reports.
struct Measured {
    /// Resident MiB gained by the requests.
    gained: f64,
    /// Spans dropped as the queue was full.
    queue_full: u64,
    /// Spans dropped as its bytes were.
    queue_bytes: u64,
    /// Spans of batches whose export failed (the collector's time out).
    export_failed: u64,
    /// Requests the upstream heard, warm-up included.
    heard: u64,
    /// Those that ended a redirect chain.
    ends: u64,
}

/// Runs `case` of `test` in a child: what it reports.
fn measure(test: &str, case: &str) -> Measured {
    let run = child::run(test, case, 2048, Duration::from_secs(300));
    assert!(
        run.success,
        "the child ({case}) ended {}:\n{}",
        run.ended, run.output
    );
    let report = run.reports.last().expect("a report").clone();
    let mut fields = report.split(' ');
    let mut next = || fields.next().expect("six figures");
    Measured {
        gained: next().parse().unwrap(),
        queue_full: next().parse().unwrap(),
        queue_bytes: next().parse().unwrap(),
        export_failed: next().parse().unwrap(),
        heard: next().parse().unwrap(),
        ends: next().parse().unwrap(),
    }
}

/// [`measure`] with telemetry off, then on.
fn off_and_on(test: &str) -> (Measured, Measured) {
    (measure(test, "off"), measure(test, "on"))
}

#[test]
fn a_collector_that_never_answers_holds_bounded_bytes_whatever_clients_send() {
    if let Some(case) = child::case() {
        return run_requests(Shape::OperationName, case == "on");
    }
    let test = "a_collector_that_never_answers_holds_bounded_bytes_whatever_clients_send";
    let (off, on) = off_and_on(test);
    let (off, on, queue_full, queue_bytes) = (off.gained, on.gained, on.queue_full, on.queue_bytes);
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
    let (off, on) = off_and_on(test);
    let (off, on, queue_full, queue_bytes) = (off.gained, on.gained, on.queue_full, on.queue_bytes);
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

#[test]
fn a_request_s_reads_cost_the_queue_bounded_bytes_however_many_and_long() {
    if let Some(case) = child::case() {
        return run_requests(Shape::Reads, case == "on");
    }
    let test = "a_request_s_reads_cost_the_queue_bounded_bytes_however_many_and_long";
    let (off, on) = off_and_on(test);
    let dropped = on.queue_full + on.queue_bytes;
    println!(
        "resident MiB gained by {READ_REQUESTS} requests of {READS} reads of a \
         {PATH_BYTES}-byte path, each redirected {} times: telemetry off {:.1}, on {:.1} \
         (spans dropped: {} queue_full, {} queue_bytes, {} export_failed; \
         upstream requests {}, chains ended {})",
        Config::default().upstream.max_redirects,
        off.gained,
        on.gained,
        on.queue_full,
        on.queue_bytes,
        on.export_failed,
        on.heard,
        on.ends
    );
    // Each request is charged its budget: that many upstream requests (a
    // read the deadline cut sends less), the longest chains of redirects
    // among them.
    let max_reads = Config::default().budget.max_reads;
    let requests = (READ_REQUESTS + READ_WARM) as u64;
    for run in [&off, &on] {
        assert!(
            run.heard * 10 >= requests * max_reads * 9,
            "the budget sent: {} upstream requests",
            run.heard
        );
        assert!(run.ends >= requests, "chains followed to their end");
    }
    // A span per read, and a CLIENT span per upstream request, each
    // carrying the 32 KB path (`url.path`, `url.full`): ~250 direct spans
    // of ~32 KB a request, where the queue holds 2,048 spans and 8 MiB.
    // Without the bytes bound the queue would hold ~64 MiB of them.
    // Every span is still queued (2,048 at most) or was dropped and
    // counted: by the queue, or with its batch when the export timed out.
    // At least a span per read and per upstream request measured (the
    // warm-up's, sampled out, had none).
    let direct =
        (READ_REQUESTS * READS) as u64 + on.heard.saturating_sub(READ_WARM as u64 * max_reads);
    let counted = dropped + on.export_failed;
    assert!(
        counted + 2_048 >= direct,
        "the reads' spans are queued, or dropped and counted: {counted} of {direct} counted"
    );
    assert!(
        on.queue_bytes > on.queue_full,
        "the queue's bytes, not its spans, refuse most: {} queue_bytes, {} queue_full",
        on.queue_bytes,
        on.queue_full
    );
    // As for documents: twice the queue, and as much again for margin.
    assert!(
        on.gained - off.gained < 32.0,
        "telemetry costs {:.1} MiB more (on {:.1}, off {:.1})",
        on.gained - off.gained,
        on.gained,
        off.gained
    );
}
