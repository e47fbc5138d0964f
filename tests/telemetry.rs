//! Traces over OTLP (`telemetry`, the `otel` feature), received by an
//! OTLP/HTTP protobuf collector on loopback inside the test: a request
//! through `FanoutGraphQL` is one trace whose SERVER span has the caller's
//! `traceparent` for parent, and the upstream sees the trace's id; a
//! collector that is down costs the request nothing, its spans dropped and
//! counted.
//!
//! Each test installs its subscriber for its own thread (a current-thread
//! runtime), so the tests of this binary do not see each other's spans. The
//! dropped-span counter is read from the process's Prometheus recorder.
#![cfg(feature = "otel")]
mod common;

use async_graphql::{EmptyMutation, EmptySubscription, Schema};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::{Json, Router};
use fanout_budget::config::TelemetryConfig;
use fanout_budget::telemetry::Telemetry;
use fanout_budget::{Config, Engine, FanoutExtension, FanoutGraphQL};
use fanout_testkit::otlp::{attribute, hex, is_int, Collector, Span, SpanKind};
use fanout_testkit::prometheus::value;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::json;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tracing_subscriber::layer::SubscriberExt as _;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";
/// A caller's sampled `traceparent` of that trace.
const PARENT_HEADER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// The process's Prometheus recorder (installed once).
fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| PrometheusBuilder::new().install_recorder().unwrap())
}

/// An upstream that answers the test schema's `/list` and `/item/{id}` and
/// keeps the `traceparent` of every request.
async fn start_upstream() -> (String, Arc<Mutex<Vec<String>>>, tokio::task::JoinHandle<()>) {
    type Seen = State<Arc<Mutex<Vec<String>>>>;
    fn keep(seen: &Seen, headers: &HeaderMap) {
        let parent = headers
            .get("traceparent")
            .map(|v| v.to_str().unwrap().to_owned());
        seen.lock().unwrap().push(parent.unwrap_or_default());
        assert!(
            headers.get("tracestate").is_none(),
            "only traceparent is sent"
        );
    }
    async fn list(seen: Seen, headers: HeaderMap) -> Json<serde_json::Value> {
        keep(&seen, &headers);
        Json(json!({ "ids": [1, 2] }))
    }
    async fn item(seen: Seen, headers: HeaderMap) -> Json<serde_json::Value> {
        keep(&seen, &headers);
        Json(json!({ "value": "v" }))
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let app = Router::new()
        .route("/list", get(list))
        .route("/item/{id}", get(item))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, seen, task)
}

fn app(upstream: &str) -> Router {
    let engine = Engine::new(Config::default());
    let schema = Schema::build(common::Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .data(common::Base(upstream.to_owned()))
        .finish();
    Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine))
}

const QUERY: &str = r#"{"query":"{ items(first: 2) { id detail { value } } }"}"#;

/// Flushes off the runtime's thread (the export runs on it) and gives the
/// telemetry back. (The SDK's flush reports no export failure.)
async fn flush(telemetry: Telemetry) -> Telemetry {
    tokio::task::spawn_blocking(move || {
        let _ = telemetry.flush();
        telemetry
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn a_request_is_one_trace_under_the_callers_traceparent() {
    let collector = Collector::start().await;
    let (upstream_url, upstream_saw, _upstream) = start_upstream().await;
    let config = TelemetryConfig::default()
        .otlp_endpoint(collector.base.clone())
        .service_name("telemetry-test");
    let telemetry = Telemetry::builder(config)
        .export_interval(Duration::from_millis(50))
        .build()
        .unwrap()
        .expect("an endpoint turns export on");
    let subscriber = tracing_subscriber::registry().with(telemetry.layer());
    let _default = tracing::subscriber::set_default(subscriber);

    // A batch of the same operation twice: the second's reads are the
    // first's, de-duplicated (sent once).
    let traceparent = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    let batch = format!("[{QUERY},{QUERY}]");
    let answer =
        fanout_testkit::post(&app(&upstream_url), batch, &[("traceparent", &traceparent)]).await;
    assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.json());
    assert_eq!(answer.json()[1]["data"]["items"][1]["detail"]["value"], "v");

    let telemetry = flush(telemetry).await;
    let spans = collector
        .wait_for(
            Duration::from_secs(10),
            "the request's SERVER span",
            |spans| spans.iter().any(|r| r.span.kind == SpanKind::Server as i32),
        )
        .await;
    let server = spans
        .iter()
        .position(|r| r.span.kind == SpanKind::Server as i32)
        .unwrap();
    let servers: Vec<_> = spans
        .iter()
        .filter(|r| r.span.kind == SpanKind::Server as i32)
        .collect();
    assert_eq!(servers.len(), 1, "one SERVER span per request");
    let root = &spans[server];
    assert_eq!(
        root.service, "telemetry-test",
        "the resource reaches the collector"
    );
    assert_eq!(root.span.name, "POST /graphql");
    assert_eq!(hex(&root.span.trace_id), TRACE_ID, "the caller's trace");
    assert_eq!(
        hex(&root.span.parent_span_id),
        PARENT_ID,
        "the caller's span is the parent"
    );
    assert_eq!(
        attribute(&root.span, "http.request.method").as_deref(),
        Some("POST")
    );
    assert_eq!(
        attribute(&root.span, "http.route").as_deref(),
        Some("/graphql")
    );
    assert_eq!(
        attribute(&root.span, "http.response.status_code").as_deref(),
        Some("200")
    );
    assert_eq!(
        attribute(&root.span, "client.address").as_deref(),
        Some("127.0.0.1")
    );
    assert_eq!(
        attribute(&root.span, "fanout.caller").as_deref(),
        Some("public")
    );
    assert_eq!(
        attribute(&root.span, "fanout.operations").as_deref(),
        Some("2")
    );
    assert_eq!(attribute(&root.span, "fanout.reads").as_deref(), Some("3"));
    // Integers, as the conventions have them (an unsigned field the
    // OpenTelemetry layer would have formatted into text).
    for key in [
        "http.response.status_code",
        "fanout.operations",
        "fanout.reads",
    ] {
        assert!(is_int(&root.span, key), "{key} is an integer");
    }
    assert!(
        spans.iter().all(|r| hex(&r.span.trace_id) == TRACE_ID),
        "every span is of the one trace"
    );
    assert!(
        spans.len() > 1,
        "the request's inner spans are exported too"
    );

    // Two operation spans under the server span, named by their type.
    let by_id = |id: &[u8]| spans.iter().find(|r| r.span.span_id == id);
    let under_server = |span: &Span| {
        let mut at = span;
        for _ in 0..16 {
            if at.span_id == root.span.span_id {
                return true;
            }
            match by_id(&at.parent_span_id) {
                Some(parent) => at = &parent.span,
                None => return false,
            }
        }
        false
    };
    let operations: Vec<_> = spans
        .iter()
        .filter(|r| attribute(&r.span, "graphql.operation.type").is_some())
        .collect();
    assert_eq!(operations.len(), 2, "one span per operation");
    let mut reads = 0;
    for op in &operations {
        assert_eq!(op.span.name, "query");
        assert_eq!(op.span.kind, SpanKind::Internal as i32);
        assert_eq!(
            op.span.parent_span_id, root.span.span_id,
            "under the server span"
        );
        assert!(is_int(&op.span, "fanout.reads"), "an integer");
        reads += attribute(&op.span, "fanout.reads")
            .unwrap()
            .parse::<u64>()
            .unwrap();
    }
    assert_eq!(reads, 3, "the operations sent three reads between them");

    // One CLIENT span per request sent (the list, two items), none for the
    // de-duplicated reads, each under the server span.
    let clients: Vec<_> = spans
        .iter()
        .filter(|r| r.span.kind == SpanKind::Client as i32)
        .collect();
    assert_eq!(clients.len(), 3, "one CLIENT span per read sent");
    let upstream = upstream_url.trim_start_matches("http://");
    for client in &clients {
        let span = &client.span;
        assert_eq!(span.name, "GET");
        assert!(
            under_server(span),
            "a CLIENT span outside the request's tree"
        );
        assert_eq!(
            attribute(span, "http.request.method").as_deref(),
            Some("GET")
        );
        assert_eq!(
            attribute(span, "http.response.status_code").as_deref(),
            Some("200")
        );
        let address = attribute(span, "server.address").unwrap();
        let port = attribute(span, "server.port").unwrap();
        assert_eq!(format!("{address}:{port}"), upstream);
        let url = attribute(span, "url.full").unwrap();
        assert!(url.starts_with(&upstream_url), "{url}");
    }

    // Every read has its span; the de-duplicated ones say so, and send
    // nothing (no CLIENT span under them).
    let reads: Vec<_> = spans
        .iter()
        .filter(|r| r.span.name == "upstream.read")
        .collect();
    assert_eq!(reads.len(), 6, "three reads per operation");
    let shared: Vec<_> = reads
        .iter()
        .filter(|r| attribute(&r.span, "fanout.dedup").as_deref() == Some("true"))
        .collect();
    assert_eq!(
        shared.len(),
        3,
        "the second operation's reads are the first's"
    );
    for read in &shared {
        assert!(
            clients
                .iter()
                .all(|c| c.span.parent_span_id != read.span.span_id),
            "a de-duplicated read sent nothing"
        );
        assert_eq!(
            attribute(&read.span, "fanout.outcome").as_deref(),
            Some("ok")
        );
    }

    // Each request sent carries the trace's id and its CLIENT span's.
    let sent = upstream_saw.lock().unwrap().clone();
    assert_eq!(sent.len(), 3, "{sent:?}");
    for parent in &sent {
        let fields: Vec<_> = parent.split('-').collect();
        assert_eq!(fields.len(), 4, "a traceparent on every read: {sent:?}");
        assert_eq!(fields[1], TRACE_ID, "{sent:?}");
        assert!(
            clients.iter().any(|c| hex(&c.span.span_id) == fields[2]),
            "the request's parent is its CLIENT span: {parent}"
        );
    }
    tokio::task::spawn_blocking(move || drop(telemetry))
        .await
        .unwrap();
}

/// The request runs with `telemetry` exporting (its layer the thread's
/// subscriber); how long it took.
async fn request_with(telemetry: &Telemetry, upstream_url: &str) -> Duration {
    let subscriber = tracing_subscriber::registry().with(telemetry.layer());
    let _default = tracing::subscriber::set_default(subscriber);
    let started = Instant::now();
    let answer = fanout_testkit::post(&app(upstream_url), QUERY, &[]).await;
    let took = started.elapsed();
    assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.json());
    assert_eq!(answer.json()["data"]["items"][0]["detail"]["value"], "v");
    took
}

/// One test, so that no other test of this binary moves the counter while
/// it reads it.
#[tokio::test(flavor = "current_thread")]
async fn a_collector_down_hanging_or_failing_costs_the_request_nothing() {
    let page = recorder();
    let dropped = |reason: &str| {
        value(
            &page.render(),
            "fanout_telemetry_spans_dropped_total",
            &[&format!("reason=\"{reason}\"")],
        )
        .unwrap_or(0.0)
    };
    let (upstream_url, _upstream_saw, _upstream) = start_upstream().await;

    // Down: a port nothing listens on, each export refused at once. One
    // span queued at most and none exported before the flush: the
    // request's other spans find the queue full.
    let (queue_full, failed) = (dropped("queue_full"), dropped("export_failed"));
    let down = format!("http://127.0.0.1:{}", fanout_testkit::free_port());
    let telemetry = Telemetry::builder(TelemetryConfig::default().otlp_endpoint(down))
        .max_queued_spans(1)
        .export_interval(Duration::from_secs(3600))
        .build()
        .unwrap()
        .unwrap();
    let took = request_with(&telemetry, &upstream_url).await;
    assert!(
        took < Duration::from_secs(5),
        "the request waited on the collector: {took:?}"
    );
    let telemetry = flush(telemetry).await;
    assert!(
        dropped("queue_full") > queue_full,
        "spans past the queue are counted dropped"
    );
    assert!(
        dropped("export_failed") > failed,
        "the queued span whose export failed is counted dropped"
    );
    tokio::task::spawn_blocking(move || drop(telemetry))
        .await
        .unwrap();

    // Hanging: a collector that takes connections and never answers, an
    // export every 10 ms, each given up after 300 ms. The request does not
    // wait for the export under way; its spans are dropped and counted.
    let hung = fanout_testkit::hung::Hung::start(fanout_testkit::hung::Hangs::Holds).await;
    let hanging = hung.base.clone();
    let failed = dropped("export_failed");
    let telemetry = Telemetry::builder(TelemetryConfig::default().otlp_endpoint(hanging))
        .max_queued_spans(2)
        .export_interval(Duration::from_millis(10))
        .export_timeout(Duration::from_millis(300))
        .build()
        .unwrap()
        .unwrap();
    let took = request_with(&telemetry, &upstream_url).await;
    assert!(
        took < Duration::from_secs(5),
        "the request waited on the collector: {took:?}"
    );
    let telemetry = flush(telemetry).await;
    assert!(
        dropped("export_failed") > failed,
        "the spans of the export given up are counted dropped"
    );
    tokio::task::spawn_blocking(move || drop(telemetry))
        .await
        .unwrap();

    // Failing: a collector that answers every export 500. Its spans are
    // dropped and counted, never retried.
    let exports = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = exports.clone();
    let failing = Router::new().route(
        "/v1/traces",
        axum::routing::post(move || {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { StatusCode::INTERNAL_SERVER_ERROR }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let failing_url = format!("http://{}", listener.local_addr().unwrap());
    let _failing = tokio::spawn(async move { axum::serve(listener, failing).await.unwrap() });
    let failed = dropped("export_failed");
    let telemetry = Telemetry::builder(TelemetryConfig::default().otlp_endpoint(failing_url))
        .export_interval(Duration::from_secs(3600))
        .build()
        .unwrap()
        .unwrap();
    let took = request_with(&telemetry, &upstream_url).await;
    assert!(
        took < Duration::from_secs(5),
        "the request waited on the collector: {took:?}"
    );
    let telemetry = flush(telemetry).await;
    let lost = dropped("export_failed") - failed;
    assert!(
        lost >= 4.0,
        "every span of the request (server, operation, reads) is counted dropped: {lost}"
    );
    assert_eq!(
        exports.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one export for the one batch, not retried"
    );
    tokio::task::spawn_blocking(move || drop(telemetry))
        .await
        .unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_request_refused_before_it_runs_has_its_server_span() {
    let collector = Collector::start().await;
    let (upstream_url, _upstream_saw, _upstream) = start_upstream().await;
    let telemetry =
        Telemetry::builder(TelemetryConfig::default().otlp_endpoint(collector.base.clone()))
            .build()
            .unwrap()
            .unwrap();
    let subscriber = tracing_subscriber::registry().with(telemetry.layer());
    let _default = tracing::subscriber::set_default(subscriber);
    let answer = fanout_testkit::post(&app(&upstream_url), r#"{"query":"#, &[]).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);

    let telemetry = flush(telemetry).await;
    let spans = collector
        .wait_for(Duration::from_secs(10), "the SERVER span", |spans| {
            spans.iter().any(|r| r.span.kind == SpanKind::Server as i32)
        })
        .await;
    let root = &spans[0].span;
    assert_eq!(spans.len(), 1, "nothing ran");
    assert_eq!(root.name, "POST /graphql");
    assert_eq!(
        attribute(root, "http.response.status_code").as_deref(),
        Some("400")
    );
    assert_eq!(attribute(root, "fanout.caller").as_deref(), Some("public"));
    tokio::task::spawn_blocking(move || drop(telemetry))
        .await
        .unwrap();
}

/// A registry-like upstream that answers `/private` only to Basic
/// credentials (401 with a Basic challenge else).
async fn start_private() -> (String, tokio::task::JoinHandle<()>) {
    async fn private(headers: HeaderMap) -> axum::response::Response {
        use axum::response::IntoResponse;
        match headers.get("authorization") {
            Some(_) => Json(json!({ "ok": true })).into_response(),
            None => (
                StatusCode::UNAUTHORIZED,
                [("www-authenticate", "Basic realm=\"private\"")],
            )
                .into_response(),
        }
    }
    let app = Router::new().route("/private", get(private));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, task)
}

struct Private;

#[async_graphql::Object]
impl Private {
    /// One read of `/private`, a secret in its query string.
    async fn private(&self, ctx: &async_graphql::Context<'_>) -> async_graphql::Result<u16> {
        use fanout_budget::FanoutContext as _;
        let base = &ctx.data::<common::Base>()?.0;
        let url = format!("{base}/private?token=query-s3cret").parse()?;
        let response = ctx.upstream()?.read(fanout_budget::Read::get(url)).await?;
        Ok(response.status.as_u16())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn no_credential_reaches_a_span() {
    const PASSWORD: &str = "pw-s3cret";
    let collector = Collector::start().await;
    let (private_url, _private) = start_private().await;
    let config = Config::default().upstream_named(
        "private",
        fanout_budget::config::UpstreamTable::default()
            .url(private_url.clone())
            .username("ci")
            .password(PASSWORD),
    );
    let engine = Engine::new(config);
    let schema = Schema::build(Private, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .data(common::Base(private_url))
        .finish();
    let app = Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine));
    let telemetry =
        Telemetry::builder(TelemetryConfig::default().otlp_endpoint(collector.base.clone()))
            .build()
            .unwrap()
            .unwrap();
    let subscriber = tracing_subscriber::registry().with(telemetry.layer());
    let _default = tracing::subscriber::set_default(subscriber);
    let answer = fanout_testkit::post(
        &app,
        r#"{"query":"{ private }"}"#,
        &[("authorization", "Bearer inbound-s3cret")],
    )
    .await;
    assert_eq!(answer.json()["data"]["private"], 200, "{:?}", answer.json());

    let telemetry = flush(telemetry).await;
    let spans = collector
        .wait_for(Duration::from_secs(10), "the request's spans", |spans| {
            spans.iter().any(|r| r.span.kind == SpanKind::Server as i32)
        })
        .await;
    let clients = spans
        .iter()
        .filter(|r| r.span.kind == SpanKind::Client as i32)
        .count();
    assert_eq!(clients, 2, "the challenged request and the one sent again");
    let challenged = spans
        .iter()
        .find(|r| attribute(&r.span, "http.response.status_code").as_deref() == Some("401"))
        .expect("the challenged request's span");
    assert_eq!(
        attribute(&challenged.span, "error.type").as_deref(),
        Some("401")
    );
    let basic = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(format!("ci:{PASSWORD}"))
    };
    for received in &spans {
        let text = fanout_testkit::otlp::all_text(&received.span);
        for secret in [
            PASSWORD,
            "query-s3cret",
            "inbound-s3cret",
            &basic,
            "Basic ",
            "Bearer ",
        ] {
            assert!(!text.contains(secret), "{secret:?} in a span: {text}");
        }
    }
    tokio::task::spawn_blocking(move || drop(telemetry))
        .await
        .unwrap();
}

/// A transport of one's own writes `traceparent` with the public call, and
/// only while a layer exports spans.
#[tokio::test(flavor = "current_thread")]
async fn a_transport_of_ones_own_can_carry_traceparent() {
    use fanout_budget::telemetry::inject_traceparent;
    let mut headers = HeaderMap::new();
    inject_traceparent(&mut headers);
    assert!(headers.is_empty(), "no layer, no traceparent");

    let collector = Collector::start().await;
    let telemetry =
        Telemetry::builder(TelemetryConfig::default().otlp_endpoint(collector.base.clone()))
            .target("telemetry")
            .build()
            .unwrap()
            .unwrap();
    let subscriber = tracing_subscriber::registry().with(telemetry.layer());
    let _default = tracing::subscriber::set_default(subscriber);
    // A context the headers held already (the application's own) is
    // replaced whole: a `tracestate` of another trace does not stay.
    headers.insert("traceparent", PARENT_HEADER.parse().unwrap());
    headers.insert("tracestate", "app=1".parse().unwrap());
    let span = tracing::info_span!("custom.transport");
    {
        let _entered = span.enter();
        inject_traceparent(&mut headers);
    }
    drop(span);
    let sent = headers["traceparent"].to_str().unwrap().to_owned();
    assert_eq!(headers.len(), 1, "traceparent only: {headers:?}");

    // Behind `FanoutLayer` (no request the engine opened), a span whose
    // parent the application adopted from its caller: the caller's
    // `tracestate` goes on with it.
    let caller = {
        use opentelemetry::propagation::TextMapPropagator as _;
        let mut carrier = std::collections::HashMap::new();
        carrier.insert("traceparent".to_owned(), PARENT_HEADER.to_owned());
        carrier.insert("tracestate".to_owned(), "congo=t61rcWkgMzE".to_owned());
        opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&carrier)
    };
    let adopted = tracing::info_span!("adopted");
    {
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        let _ = adopted.set_parent(caller);
    }
    let mut adopted_headers = HeaderMap::new();
    adopted.in_scope(|| inject_traceparent(&mut adopted_headers));
    assert!(
        adopted_headers["traceparent"]
            .to_str()
            .unwrap()
            .contains(TRACE_ID),
        "{adopted_headers:?}"
    );
    assert_eq!(adopted_headers["tracestate"], "congo=t61rcWkgMzE");
    drop(adopted);

    let telemetry = flush(telemetry).await;
    let spans = collector
        .wait_for(Duration::from_secs(10), "the transport's span", |spans| {
            spans.iter().any(|r| r.span.name == "custom.transport")
        })
        .await;
    let span = &spans
        .iter()
        .find(|r| r.span.name == "custom.transport")
        .unwrap()
        .span;
    assert_eq!(
        sent,
        format!("00-{}-{}-01", hex(&span.trace_id), hex(&span.span_id))
    );
    tokio::task::spawn_blocking(move || drop(telemetry))
        .await
        .unwrap();
}

/// `sample_ratio = 0`: a trace that starts here is not exported, yet the
/// upstream still learns its ids (unsampled, `-00`); a caller's sampled
/// `traceparent` is followed.
#[tokio::test(flavor = "current_thread")]
async fn sample_ratio_zero_exports_only_what_a_caller_sampled() {
    let (collector, telemetry) = Collector::sampling_nothing().await;
    let (upstream_url, upstream_saw, _upstream) = start_upstream().await;
    let subscriber = tracing_subscriber::registry().with(telemetry.layer());
    let _default = tracing::subscriber::set_default(subscriber);
    let app = app(&upstream_url);

    let answer = fanout_testkit::post(&app, QUERY, &[]).await;
    assert_eq!(answer.status, StatusCode::OK);
    let unsampled = upstream_saw.lock().unwrap().clone();
    assert_eq!(unsampled.len(), 3);
    assert!(
        unsampled.iter().all(|p| p.ends_with("-00")),
        "{unsampled:?}"
    );
    let trace_of = |parent: &String| parent.split('-').nth(1).unwrap().to_owned();
    let traces: std::collections::BTreeSet<_> = unsampled.iter().map(trace_of).collect();
    assert_eq!(traces.len(), 1, "one trace id per request: {unsampled:?}");
    // A caller's unsampled trace: its id goes on, unsampled.
    upstream_saw.lock().unwrap().clear();
    let traceparent = format!("00-{TRACE_ID}-{PARENT_ID}-00");
    let answer = fanout_testkit::post(&app, QUERY, &[("traceparent", &traceparent)]).await;
    assert_eq!(answer.status, StatusCode::OK);
    let sent = upstream_saw.lock().unwrap().clone();
    assert_eq!(sent.len(), 3);
    for parent in &sent {
        assert_eq!(trace_of(parent), TRACE_ID, "{sent:?}");
        assert!(parent.ends_with("-00"), "{sent:?}");
    }
    let telemetry = flush(telemetry).await;
    assert!(
        collector.spans().is_empty(),
        "an unsampled trace is not exported"
    );

    let traceparent = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    let answer = fanout_testkit::post(&app, QUERY, &[("traceparent", &traceparent)]).await;
    assert_eq!(answer.status, StatusCode::OK);
    let telemetry = flush(telemetry).await;
    let spans = collector
        .wait_for(Duration::from_secs(10), "the sampled trace", |spans| {
            spans.iter().any(|r| r.span.kind == SpanKind::Server as i32)
        })
        .await;
    assert!(spans.iter().all(|r| hex(&r.span.trace_id) == TRACE_ID));
    tokio::task::spawn_blocking(move || drop(telemetry))
        .await
        .unwrap();
}
