//! Each read's span in an exported trace (`telemetry`, the `otel` feature),
//! received by an OTLP/HTTP collector on loopback inside the test: what
//! answered it (`fanout.dedup`, `fanout.cache_hit`, `fanout.charged`), why
//! it was refused (`fanout.refused`), and the requests it sent — a
//! redirect's hop, a `401` and the request sent again, its token fetch
//! (`upstream.token`) — as its children; an operation's document only when
//! `telemetry.record_document` asks for it; each event of a subscription a
//! trace of its own.
//!
//! Each test installs its subscriber for its own thread (a current-thread
//! runtime), so the tests of this binary do not see each other's spans.
#![cfg(feature = "otel")]

use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema, Subscription};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use fanout_budget::config::TelemetryConfig;
use fanout_budget::telemetry::Telemetry;
use fanout_budget::{Config, Engine, FanoutContext, FanoutExtension, FanoutGraphQL, Read};
use fanout_testkit::otlp::{attribute, Collector, Received, SpanKind};
use serde_json::json;
use std::time::Duration;
use tracing_subscriber::layer::SubscriberExt as _;

/// An upstream with items, a redirect to one, and a resource behind a
/// Bearer challenge whose realm is on the same origin.
async fn start_upstream() -> (String, tokio::task::JoinHandle<()>) {
    let (base, task, _heard) = start_hearing_upstream().await;
    (base, task)
}

/// Each request's path and the `traceparent` it came with, in order.
type Heard = std::sync::Arc<std::sync::Mutex<Vec<(String, Option<String>)>>>;

/// [`start_upstream`], with what it heard.
async fn start_hearing_upstream() -> (String, tokio::task::JoinHandle<()>, Heard) {
    async fn item() -> Json<serde_json::Value> {
        Json(json!({ "value": "v" }))
    }
    async fn moved() -> Response {
        (StatusCode::TEMPORARY_REDIRECT, [("location", "/item/2")]).into_response()
    }
    async fn private(headers: HeaderMap) -> Response {
        let host = headers["host"].to_str().unwrap().to_owned();
        match headers.get("authorization") {
            Some(value) if value == "Bearer tok-s3cret" => {
                Json(json!({ "ok": true })).into_response()
            }
            _ => (
                StatusCode::UNAUTHORIZED,
                [(
                    "www-authenticate",
                    format!("Bearer realm=\"http://{host}/token\",service=\"test\""),
                )],
            )
                .into_response(),
        }
    }
    async fn token() -> Json<serde_json::Value> {
        Json(json!({ "token": "tok-s3cret", "expires_in": 300 }))
    }
    let app = Router::new()
        .route("/item/{id}", get(item))
        .route("/moved", get(moved))
        .route("/private", get(private))
        .route("/token", get(token))
        .route("/hang", get(std::future::pending::<()>));
    let heard = Heard::default();
    let hearing = heard.clone();
    let app = app.layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let traceparent = request.headers().get("traceparent");
            let traceparent = traceparent.map(|v| v.to_str().unwrap().to_owned());
            let path = request.uri().path().to_owned();
            hearing.lock().unwrap().push((path, traceparent));
            next.run(request)
        },
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, task, heard)
}

struct Base(String);

struct Query;

#[Object]
impl Query {
    /// One read of `path`, kept by the engine's cache when `immutable`:
    /// the status it ended with.
    async fn get(
        &self,
        ctx: &Context<'_>,
        path: String,
        immutable: Option<bool>,
    ) -> async_graphql::Result<u16> {
        let url = format!("{}{path}", ctx.data::<Base>()?.0).parse()?;
        let mut read = Read::get(url);
        if immutable == Some(true) {
            read = read.immutable();
        }
        Ok(ctx.upstream()?.read(read).await?.status.as_u16())
    }

    /// Whether the resolver runs inside a span the OpenTelemetry layer
    /// made (it has a valid span context).
    async fn traced(&self) -> bool {
        use opentelemetry::trace::TraceContextExt as _;
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        let context = tracing::Span::current().context();
        context.span().span_context().is_valid()
    }
}

fn app(config: Config, upstream: &str) -> Router {
    let engine = Engine::new(config);
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .data(Base(upstream.to_owned()))
        .finish();
    Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine))
}

/// Runs `requests` against `app` (each a JSON body) with a telemetry
/// exporting to a collector of its own; every span received once the last
/// request's SERVER span arrived.
async fn traced(app: &Router, requests: &[&str]) -> Vec<Received> {
    traced_with(app, requests, &[]).await
}

/// [`traced`], each request sent with `headers`.
async fn traced_with(app: &Router, requests: &[&str], headers: &[(&str, &str)]) -> Vec<Received> {
    exported(requests.len(), async {
        for body in requests {
            let answer = fanout_testkit::post(app, body.to_string(), headers).await;
            assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.json());
        }
    })
    .await
}

/// Runs `requests` with a telemetry exporting to a collector of its own;
/// every span received once `servers` SERVER spans arrived.
async fn exported(
    servers: usize,
    requests: impl std::future::Future<Output = ()>,
) -> Vec<Received> {
    let servers_received = move |spans: &[Received]| {
        spans
            .iter()
            .filter(|r| r.span.kind == SpanKind::Server as i32)
            .count()
            == servers
    };
    exported_until(
        1.0,
        "every request's SERVER span",
        servers_received,
        requests,
    )
    .await
}

/// Runs `requests` with a telemetry sampling at `sample_ratio` and
/// exporting to a collector of its own; every span received once they
/// satisfy `until` (`what` names it), after the telemetry was flushed.
async fn exported_until(
    sample_ratio: f64,
    what: &str,
    until: impl Fn(&[Received]) -> bool,
    requests: impl std::future::Future<Output = ()>,
) -> Vec<Received> {
    exported_filtered(sample_ratio, None, what, until, requests).await
}

/// [`exported_until`], with `level` a global level filter of the
/// application's subscriber, above the telemetry's layer.
async fn exported_filtered(
    sample_ratio: f64,
    level: Option<tracing_subscriber::filter::LevelFilter>,
    what: &str,
    until: impl Fn(&[Received]) -> bool,
    requests: impl std::future::Future<Output = ()>,
) -> Vec<Received> {
    let collector = Collector::start().await;
    let config = TelemetryConfig::default()
        .otlp_endpoint(collector.base.clone())
        .sample_ratio(sample_ratio);
    // The application's own spans are exported too (the operations' spans
    // are then `tracing` spans: `tests/telemetry_operation_span.rs`).
    let telemetry = Telemetry::builder(config)
        .target(module_path!())
        .export_interval(Duration::from_millis(50))
        .build()
        .unwrap()
        .unwrap();
    let subscriber = tracing_subscriber::registry()
        .with(telemetry.layer())
        .with(level);
    let _default = tracing::subscriber::set_default(subscriber);
    requests.await;
    let telemetry = tokio::task::spawn_blocking(move || {
        let _ = telemetry.flush();
        telemetry
    })
    .await
    .unwrap();
    let spans = collector
        .wait_for(Duration::from_secs(10), what, until)
        .await;
    tokio::task::spawn_blocking(move || drop(telemetry))
        .await
        .unwrap();
    spans
}

/// The default configuration, `coalesce = true` for `upstream`'s host
/// when `coalesce`.
fn coalescing(upstream: &str, coalesce: bool) -> Config {
    let mut config = Config::default();
    if coalesce {
        let host = upstream.trim_start_matches("http://").to_owned();
        let table = fanout_budget::config::HostConfig::default().coalesce(true);
        config.hosts.insert(host, table);
    }
    config
}

/// The spans whose parent is `parent`, in the order they started.
fn children<'a>(spans: &'a [Received], parent: &Received) -> Vec<&'a Received> {
    let mut under: Vec<_> = spans
        .iter()
        .filter(|r| r.span.parent_span_id == parent.span.span_id)
        .collect();
    under.sort_by_key(|r| r.span.start_time_unix_nano);
    under
}

/// The `upstream.read` span of the read of `path`.
/// The request's SERVER span.
fn server_of(spans: &[Received]) -> &Received {
    spans
        .iter()
        .find(|r| r.span.kind == SpanKind::Server as i32)
        .expect("the request's SERVER span")
}

/// The one read of `path`, asserted in `server`'s trace under `parent`.
fn assert_read_under(spans: &[Received], path: &str, server: &Received, parent: &Received) {
    let read = read_of(spans, path);
    assert_eq!(read.len(), 1, "{path}: its read's span, once");
    assert_eq!(
        read[0].span.trace_id, server.span.trace_id,
        "{path}: in the request's trace"
    );
    assert_eq!(
        read[0].span.parent_span_id, parent.span.span_id,
        "{path}: under {}",
        parent.span.name
    );
}

fn read_of<'a>(spans: &'a [Received], path: &str) -> Vec<&'a Received> {
    spans
        .iter()
        .filter(|r| r.span.name == "upstream.read")
        .filter(|r| attribute(&r.span, "url.path").as_deref() == Some(path))
        .collect()
}

fn statuses(spans: &[&Received]) -> Vec<String> {
    spans
        .iter()
        .map(|r| match r.span.kind == SpanKind::Client as i32 {
            true => format!(
                "GET {}",
                attribute(&r.span, "http.response.status_code").unwrap_or_default()
            ),
            false => r.span.name.clone(),
        })
        .collect()
}

#[tokio::test(flavor = "current_thread")]
async fn each_read_says_what_answered_it_and_its_requests_are_its_children() {
    let (upstream, _task) = start_upstream().await;
    let app = app(Config::default(), &upstream);
    let query = r#"{"query":"{ a: get(path: \"/item/1\") b: get(path: \"/item/1\") moved: get(path: \"/moved\") private: get(path: \"/private\") }"}"#;
    let spans = traced(&app, &[query]).await;

    // De-duplicated: one of the two reads of /item/1 sent it, the other
    // nothing.
    let item = read_of(&spans, "/item/1");
    assert_eq!(item.len(), 2, "a span per read a resolver asked for");
    let (mut sent, mut shared) = (0, 0);
    for read in &item {
        match attribute(&read.span, "fanout.dedup").as_deref() {
            Some("true") => {
                shared += 1;
                assert_eq!(
                    children(&spans, read).len(),
                    0,
                    "a de-duplicated read sends nothing"
                );
                assert_eq!(attribute(&read.span, "fanout.charged"), None);
            }
            _ => {
                sent += 1;
                assert_eq!(statuses(&children(&spans, read)), ["GET 200"]);
                assert_eq!(
                    attribute(&read.span, "fanout.charged").as_deref(),
                    Some("true")
                );
            }
        }
        assert_eq!(
            attribute(&read.span, "fanout.outcome").as_deref(),
            Some("ok")
        );
    }
    assert_eq!((sent, shared), (1, 1));

    // A redirect: its hop is the read's second request.
    let moved = read_of(&spans, "/moved");
    assert_eq!(moved.len(), 1, "the hop is no read of its own");
    assert_eq!(
        statuses(&children(&spans, moved[0])),
        ["GET 307", "GET 200"]
    );

    // A challenge: the 401, the token fetch under its own span (its
    // request under it), then the request sent again with the token.
    let private = read_of(&spans, "/private");
    assert_eq!(private.len(), 1);
    let under = children(&spans, private[0]);
    assert_eq!(
        statuses(&under),
        ["GET 401", "upstream.token", "GET 200"],
        "the read's requests, in order"
    );
    let fetch = under[1];
    assert_eq!(
        attribute(&fetch.span, "url.path").as_deref(),
        Some("/token")
    );
    assert_eq!(statuses(&children(&spans, fetch)), ["GET 200"]);
    assert_eq!(
        attribute(&fetch.span, "fanout.charged").as_deref(),
        Some("true")
    );

    // Every request sent is under a read; none carries the token.
    let clients = spans
        .iter()
        .filter(|r| r.span.kind == SpanKind::Client as i32);
    for client in clients {
        let parent = spans
            .iter()
            .find(|r| r.span.span_id == client.span.parent_span_id)
            .expect("a CLIENT span's parent is exported");
        assert!(
            ["upstream.read", "upstream.token"].contains(&parent.span.name.as_str()),
            "a request outside a read: under {}",
            parent.span.name
        );
    }
    for received in &spans {
        let text = fanout_testkit::otlp::all_text(&received.span);
        assert!(!text.contains("tok-s3cret"), "the token in a span: {text}");
    }
    // The document is not recorded unless asked for.
    let operation = spans
        .iter()
        .find(|r| attribute(&r.span, "graphql.operation.type").is_some())
        .unwrap();
    assert_eq!(attribute(&operation.span, "graphql.document"), None);
}

#[tokio::test(flavor = "current_thread")]
async fn each_request_sent_upstream_names_its_own_client_span() {
    // Plain, and to a host that coalesces (the leader's request is sent
    // from a task of its own); with a fresh trace, and under a caller's
    // sampled one.
    let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let one = r#"{"query":"{ a: get(path: \"/item/1\") b: get(path: \"/item/1\") moved: get(path: \"/moved\") private: get(path: \"/private\") }"}"#;
    let batch = r#"[{"query":"{ a: get(path: \"/item/1\") moved: get(path: \"/moved\") }"},{"query":"{ private: get(path: \"/private\") b: get(path: \"/item/3\") }"}]"#;
    for (coalesce, inbound, query) in [
        (false, None, one),
        (true, None, one),
        (false, Some(caller), one),
        (true, None, batch),
    ] {
        let (upstream, _task, heard) = start_hearing_upstream().await;
        let app = app(coalescing(&upstream, coalesce), &upstream);
        let headers: Vec<_> = inbound.map(|tp| ("traceparent", tp)).into_iter().collect();
        let spans = traced_with(&app, &[query], &headers).await;
        let heard = std::mem::take(&mut *heard.lock().unwrap());
        let clients: Vec<_> = spans
            .iter()
            .filter(|r| r.span.kind == SpanKind::Client as i32)
            .collect();
        assert_eq!(
            heard.len(),
            clients.len(),
            "a CLIENT span per request sent ({coalesce}, {inbound:?}): {heard:?}"
        );
        let server = spans
            .iter()
            .find(|r| r.span.kind == SpanKind::Server as i32)
            .unwrap();
        if inbound.is_some() {
            assert_eq!(
                fanout_testkit::otlp::hex(&server.span.trace_id),
                "4bf92f3577b34da6a3ce929d0e0e4736"
            );
        }
        for (path, traceparent) in &heard {
            let traceparent = traceparent.as_deref().unwrap_or_else(|| {
                panic!("{path} sent without traceparent ({coalesce}, {inbound:?})")
            });
            let parts: Vec<_> = traceparent.split('-').collect();
            assert_eq!(parts[3], "01", "{path}: {traceparent}");
            let client = clients
                .iter()
                .find(|r| fanout_testkit::otlp::hex(&r.span.span_id) == parts[2])
                .unwrap_or_else(|| {
                    panic!("{path}: {traceparent} names no CLIENT span ({coalesce}, {inbound:?})")
                });
            assert_eq!(fanout_testkit::otlp::hex(&client.span.trace_id), parts[1]);
            assert_eq!(client.span.trace_id, server.span.trace_id, "{path}");
            let url = attribute(&client.span, "url.full").unwrap();
            assert!(url.ends_with(path.as_str()), "{url} sent to {path}");
        }
        // One trace, each span once, each under a span of it.
        let mut ids: Vec<_> = spans.iter().map(|r| r.span.span_id.clone()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), spans.len(), "a span exported twice");
        for received in &spans {
            assert_eq!(received.span.trace_id, server.span.trace_id);
            if received.span.span_id != server.span.span_id {
                assert!(
                    ids.contains(&received.span.parent_span_id),
                    "{} under a span not exported",
                    received.span.name
                );
            }
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_read_cut_or_dropped_mid_request_ends_its_spans_once_and_leaves_nothing_entered() {
    let (upstream, _task, heard) = start_hearing_upstream().await;
    let mut config = Config::default();
    config.budget.read_timeout_ms = 100;
    let app = app(config, &upstream);
    let hang = r#"{"query":"{ h: get(path: \"/hang\") }"}"#;
    let item = r#"{"query":"{ a: get(path: \"/item/1\") }"}"#;
    let spans = exported(3, async {
        // Dropped mid-read (a client gone), then cut by the read timeout.
        let dropped = fanout_testkit::post(&app, hang.to_owned(), &[]);
        assert!(tokio::time::timeout(Duration::from_millis(50), dropped)
            .await
            .is_err());
        let cut = fanout_testkit::post(&app, hang.to_owned(), &[]).await;
        assert_eq!(cut.status, StatusCode::OK);
        assert!(cut.json()["errors"].is_array(), "{:?}", cut.json());
        let answer = fanout_testkit::post(&app, item.to_owned(), &[]).await;
        assert_eq!(answer.json()["data"]["a"], 200);
    })
    .await;
    let mut ids: Vec<_> = spans.iter().map(|r| r.span.span_id.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), spans.len(), "a span exported twice");
    let hung = read_of(&spans, "/hang");
    assert_eq!(hung.len(), 2, "each read's span, once");
    for read in &hung {
        assert_eq!(statuses(&children(&spans, read)).len(), 1, "its request");
        assert!(ids.contains(&read.span.parent_span_id));
    }
    // The next request's own spans: nothing of the dropped one was left
    // entered on the thread.
    let heard = std::mem::take(&mut *heard.lock().unwrap());
    let (_, traceparent) = heard.iter().find(|(path, _)| path == "/item/1").unwrap();
    let parts: Vec<_> = traceparent.as_deref().unwrap().split('-').collect();
    let client = spans
        .iter()
        .find(|r| fanout_testkit::otlp::hex(&r.span.span_id) == parts[2])
        .expect("the traceparent names an exported span");
    assert_eq!(client.span.kind, SpanKind::Client as i32);
    let read = read_of(&spans, "/item/1");
    assert_eq!(client.span.parent_span_id, read[0].span.span_id);
    assert_eq!(client.span.trace_id, read[0].span.trace_id);
}

#[tokio::test(flavor = "current_thread")]
async fn a_request_sampled_out_sends_its_trace_unsampled_upstream() {
    // Plain, and to a host that coalesces (the leader's request is sent
    // from a task of its own): each request carries the caller's trace id
    // and the unsampled flag.
    let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
    for coalesce in [false, true] {
        let (upstream, _task, heard) = start_hearing_upstream().await;
        let app = app(coalescing(&upstream, coalesce), &upstream);
        let collector = Collector::start().await;
        let telemetry = Telemetry::builder(
            TelemetryConfig::default()
                .otlp_endpoint(collector.base.clone())
                .sample_ratio(1.0),
        )
        .build()
        .unwrap()
        .unwrap();
        let subscriber = tracing_subscriber::registry().with(telemetry.layer());
        let _default = tracing::subscriber::set_default(subscriber);
        let query = r#"{"query":"{ a: get(path: \"/item/1\") moved: get(path: \"/moved\") private: get(path: \"/private\") }"}"#;
        let answer = fanout_testkit::post(&app, query.to_owned(), &[("traceparent", caller)]).await;
        assert_eq!(answer.json()["data"]["private"], 200, "{:?}", answer.json());
        let heard = std::mem::take(&mut *heard.lock().unwrap());
        assert_eq!(heard.len(), 6, "{heard:?}");
        for (path, traceparent) in &heard {
            let traceparent = traceparent.as_deref().unwrap_or_else(|| {
                panic!("{path} sent without traceparent (coalesce: {coalesce})")
            });
            let parts: Vec<_> = traceparent.split('-').collect();
            assert_eq!(parts[1], "4bf92f3577b34da6a3ce929d0e0e4736", "{path}");
            assert_eq!(parts[3], "00", "{path}: {traceparent}");
        }
        tokio::task::spawn_blocking(move || drop(telemetry))
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_read_answered_by_the_cache_or_refused_sends_nothing_and_says_why() {
    let (upstream, _task) = start_upstream().await;
    let mut config = Config::default();
    config.budget.max_reads = 1;
    let app = app(config, &upstream);
    let cached = r#"{"query":"{ c: get(path: \"/item/7\", immutable: true) }"}"#;
    let over_budget = r#"{"query":"{ a: get(path: \"/item/1\") b: get(path: \"/item/2\") }"}"#;
    let spans = traced(&app, &[cached, cached, over_budget]).await;

    let seven = read_of(&spans, "/item/7");
    assert_eq!(seven.len(), 2);
    let hits: Vec<_> = seven
        .iter()
        .filter(|r| attribute(&r.span, "fanout.cache_hit").as_deref() == Some("true"))
        .collect();
    assert_eq!(hits.len(), 1, "the second request's read is the cache's");
    assert_eq!(children(&spans, hits[0]).len(), 0, "a hit sends nothing");
    assert_eq!(attribute(&hits[0].span, "fanout.charged"), None);

    let mut refused: Vec<_> = ["/item/1", "/item/2"]
        .iter()
        .flat_map(|path| read_of(&spans, path))
        .filter(|r| attribute(&r.span, "fanout.refused").is_some())
        .collect();
    assert_eq!(refused.len(), 1, "one read past max_reads = 1");
    let refused = refused.pop().unwrap();
    assert_eq!(
        attribute(&refused.span, "fanout.refused").as_deref(),
        Some("budget")
    );
    assert_eq!(
        attribute(&refused.span, "fanout.outcome").as_deref(),
        Some("FANOUT_BUDGET_EXHAUSTED")
    );
    assert_eq!(
        children(&spans, refused).len(),
        0,
        "a refused read sends nothing"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn the_document_is_on_the_operation_span_only_when_asked_for() {
    let (upstream, _task) = start_upstream().await;
    let mut config = Config::default();
    config.telemetry.record_document = true;
    let app = app(config, &upstream);
    let spans = traced(&app, &[r#"{"query":"{ get(path: \"/item/1\") }"}"#]).await;
    let operation = spans
        .iter()
        .find(|r| attribute(&r.span, "graphql.operation.type").is_some())
        .unwrap();
    assert_eq!(
        attribute(&operation.span, "graphql.document").as_deref(),
        Some(r#"{ get(path: "/item/1") }"#)
    );
}

/// One event of [`Events`]: a read when asked.
struct Event;

#[Object]
impl Event {
    /// One read of `path`: the status it ended with.
    async fn get(&self, ctx: &Context<'_>, path: String) -> async_graphql::Result<u16> {
        Query.get(ctx, path, None).await
    }
}

struct Events;

#[Subscription]
impl Events {
    /// `n` events, at once.
    async fn events(&self, n: u64) -> impl futures::Stream<Item = Event> {
        futures::stream::iter((0..n).map(|_| Event))
    }
}

/// Serves `schema` over WebSocket on loopback, runs the subscription
/// `query` to its end, and gives its events.
async fn subscribed<Q, S>(
    schema: Schema<Q, EmptyMutation, S>,
    engine: Engine,
    query: &str,
) -> Vec<serde_json::Value>
where
    Q: async_graphql::ObjectType + 'static,
    S: async_graphql::SubscriptionType + 'static,
{
    use fanout_testkit::ws::{init, subscribe, until_complete};
    use std::future::IntoFuture as _;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
    let config = engine.config().clone();
    let router = Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let serving = fanout_budget::inbound::serve(listener, router, &config).into_future();
    let server = tokio::spawn(async move {
        let _ = serving.await;
    });
    let mut request = format!("ws://{address}/graphql")
        .into_client_request()
        .unwrap();
    request.headers_mut().insert(
        "sec-websocket-protocol",
        "graphql-transport-ws".parse().unwrap(),
    );
    let (mut socket, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    init(&mut socket, json!({})).await;
    subscribe(&mut socket, "1", query).await;
    let events = until_complete(&mut socket, "1").await;
    drop(socket);
    server.abort();
    events
}

#[tokio::test(flavor = "current_thread")]
async fn each_event_of_a_subscription_is_a_trace_of_its_own() {
    let (upstream, _task) = start_upstream().await;
    let both = |spans: &[Received]| {
        spans
            .iter()
            .filter(|r| r.span.kind == SpanKind::Server as i32)
            .count()
            >= 2
    };
    let spans = exported_until(1.0, "both events' spans", both, async {
        let engine = Engine::new(Config::default());
        let schema = Schema::build(Query, EmptyMutation, Events)
            .extension(FanoutExtension::new(&engine))
            .data(Base(upstream))
            .finish();
        let query = r#"subscription Watch { events(n: 2) { get(path: "/item/1") } }"#;
        let events = subscribed(schema, engine, query).await;
        assert_eq!(events.len(), 2, "{events:?}");
    })
    .await;

    let roots: Vec<_> = spans
        .iter()
        .filter(|r| r.span.kind == SpanKind::Server as i32)
        .collect();
    assert_eq!(roots.len(), 2, "one SERVER span per event");
    assert_ne!(
        roots[0].span.trace_id, roots[1].span.trace_id,
        "a trace each"
    );
    for root in &roots {
        assert_eq!(root.span.name, "subscription");
        assert_eq!(
            attribute(&root.span, "graphql.operation.type").as_deref(),
            Some("subscription")
        );
        assert_eq!(attribute(&root.span, "fanout.reads").as_deref(), Some("1"));
        assert_a_root_over_one_read(&spans, root);
    }
}

/// `root` is the root of its trace, with one read under it, which sent
/// one request, answered 200.
fn assert_a_root_over_one_read(spans: &[Received], root: &Received) {
    assert!(root.span.parent_span_id.is_empty(), "the root of its trace");
    let reads = children(spans, root);
    assert_eq!(statuses(&reads), ["upstream.read"], "its read under it");
    assert_eq!(statuses(&children(spans, reads[0])), ["GET 200"]);
}

#[tokio::test(flavor = "current_thread")]
async fn a_request_sampled_out_builds_no_opentelemetry_span() {
    let (upstream, _task) = start_upstream().await;
    let app = app(Config::default(), &upstream);
    let (_collector, telemetry) = Collector::sampling_nothing().await;
    let subscriber = tracing_subscriber::registry().with(telemetry.layer());
    let _default = tracing::subscriber::set_default(subscriber);
    let query = r#"{"query":"{ traced }"}"#;

    let answer = fanout_testkit::post(&app, query.to_owned(), &[]).await;
    assert_eq!(
        answer.json()["data"]["traced"],
        false,
        "sampled out: no span"
    );
    let sampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let answer = fanout_testkit::post(&app, query.to_owned(), &[("traceparent", sampled)]).await;
    assert_eq!(
        answer.json()["data"]["traced"],
        true,
        "a caller's sampled trace"
    );
    tokio::task::spawn_blocking(move || drop(telemetry))
        .await
        .unwrap();
}

/// The names of the spans the subscriber opens (a layer without a filter
/// of its own, as a log's: it sees every span the registry makes).
#[derive(Clone, Default)]
struct Opened(std::sync::Arc<std::sync::Mutex<Vec<&'static str>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Opened {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _id: &tracing::span::Id,
        _cx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        self.0.lock().unwrap().push(attrs.metadata().name());
    }
}

#[tokio::test(flavor = "current_thread")]
async fn no_read_opens_a_span_in_the_subscriber_while_a_telemetry_exports() {
    // Not even for another layer: a per-layer filter does not stop the
    // registry from opening a span (tracing-subscriber opens it unless all
    // 64 of its filter slots disable it), so the reads of a request sampled
    // out used to cost their spans whatever the filter said.
    let (upstream, _task) = start_upstream().await;
    let app = app(Config::default(), &upstream);
    let (_collector, telemetry) = Collector::sampling_nothing().await;
    let opened = Opened::default();
    let subscriber = tracing_subscriber::registry()
        .with(telemetry.layer())
        .with(opened.clone());
    let _default = tracing::subscriber::set_default(subscriber);
    let query = r#"{"query":"{ a: get(path: \"/item/1\") b: get(path: \"/item/2\") }"}"#;

    let answer = fanout_testkit::post(&app, query.to_owned(), &[]).await;
    assert_eq!(answer.json()["data"]["a"], 200);
    let names = std::mem::take(&mut *opened.0.lock().unwrap());
    assert_eq!(
        names,
        ["graphql.request"],
        "sampled out: the request's span alone"
    );

    let sampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let answer = fanout_testkit::post(&app, query.to_owned(), &[("traceparent", sampled)]).await;
    assert_eq!(answer.json()["data"]["b"], 200);
    // Sampled: the request's and the operation's spans; its reads' spans
    // are built straight for the exporter (the other tests receive them),
    // with no span in the subscriber.
    let names = std::mem::take(&mut *opened.0.lock().unwrap());
    assert_eq!(names, ["graphql.request", "graphql.operation"]);
    tokio::task::spawn_blocking(move || drop(telemetry))
        .await
        .unwrap();
}

/// Items read by a `DataLoader` whose loads run in a task of their own
/// (`tokio::spawn`), through the operation's handle: the status of each.
struct Items {
    operation: std::sync::Arc<fanout_budget::request::Operation>,
    base: String,
    /// Each load runs inside a span of its own trace (an application's
    /// worker span, opened outside any request).
    worker_span: bool,
}

impl async_graphql::dataloader::Loader<u64> for Items {
    type Value = u16;
    type Error = fanout_budget::ReadError;

    async fn load(
        &self,
        ids: &[u64],
    ) -> Result<std::collections::HashMap<u64, u16>, fanout_budget::ReadError> {
        let upstream = self.operation.upstream();
        let reads = ids.iter().map(|&id| {
            let url = format!("{}/item/{id}", self.base).parse().expect("a URL");
            async move { Ok((id, upstream.read(Read::get(url)).await?.status.as_u16())) }
        });
        let loaded = futures::future::try_join_all(reads);
        let loaded = if self.worker_span {
            use tracing::Instrument as _;
            loaded
                .instrument(tracing::info_span!(parent: None, "worker"))
                .await
        } else {
            loaded.await
        };
        loaded.map(std::collections::HashMap::from_iter)
    }
}

struct Loaded;

/// The handle `keep` kept past its request.
static KEPT: std::sync::Mutex<Option<std::sync::Arc<fanout_budget::request::Operation>>> =
    std::sync::Mutex::new(None);

/// The handle `hold` kept from its cancelled request, and the signal that it did.
static HELD: std::sync::Mutex<Option<std::sync::Arc<fanout_budget::request::Operation>>> =
    std::sync::Mutex::new(None);
static HELD_NOW: tokio::sync::Notify = tokio::sync::Notify::const_new();

#[Object]
impl Loaded {
    /// Keeps the operation's handle (in `KEPT`), as an application might.
    async fn keep(&self, ctx: &Context<'_>) -> async_graphql::Result<bool> {
        *KEPT.lock().unwrap() = Some(ctx.fanout_operation()?);
        Ok(true)
    }

    /// Keeps the operation's handle (in `HELD`), says so (`HELD_NOW`), and
    /// never answers: its request is cancelled while it waits.
    async fn hold(&self, ctx: &Context<'_>) -> async_graphql::Result<bool> {
        *HELD.lock().unwrap() = Some(ctx.fanout_operation()?);
        HELD_NOW.notify_one();
        std::future::pending().await
    }

    /// `/item/{id}`'s status, read through the operation's loader.
    async fn item(&self, ctx: &Context<'_>, id: u64) -> async_graphql::Result<Option<u16>> {
        let loader = ctx.data::<async_graphql::dataloader::DataLoader<Items>>()?;
        Ok(loader.load_one(id).await?)
    }
}

/// A service whose resolvers read through a `DataLoader` of each
/// operation, its loads spawned.
fn loading_app(upstream: &str) -> Router {
    loading_app_with(upstream, false)
}

/// [`loading_app`], each load inside a worker span of its own when
/// `worker_span`.
fn loading_app_with(upstream: &str, worker_span: bool) -> Router {
    let engine = Engine::new(Config::default());
    let schema = Schema::build(Loaded, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .finish();
    let base = upstream.to_owned();
    let graphql = FanoutGraphQL::new(schema, engine).operation_data(move |operation, data| {
        let items = Items {
            operation: operation.clone(),
            base: base.clone(),
            worker_span,
        };
        data.insert(async_graphql::dataloader::DataLoader::new(
            items,
            tokio::spawn,
        ));
    });
    Router::new().route_service("/graphql", graphql)
}

const LOADED: &str = r#"{"query":"{ a: item(id: 1) b: item(id: 2) }"}"#;

#[tokio::test(flavor = "current_thread")]
async fn reads_a_dataloader_makes_from_a_task_of_its_own_are_in_the_requests_trace() {
    let (upstream, _task, heard) = start_hearing_upstream().await;
    let app = loading_app(&upstream);
    let spans = traced(&app, &[LOADED]).await;
    let server = server_of(&spans);
    let operation = spans.iter().find(|r| r.span.name == "query").unwrap();
    assert_eq!(operation.span.parent_span_id, server.span.span_id);
    for path in ["/item/1", "/item/2"] {
        assert_read_under(&spans, path, server, operation);
        let read = read_of(&spans, path);
        assert_eq!(statuses(&children(&spans, read[0])), ["GET 200"]);
    }
    let heard = std::mem::take(&mut *heard.lock().unwrap());
    assert_eq!(heard.len(), 2, "{heard:?}");
    for (path, traceparent) in &heard {
        let traceparent = traceparent.as_deref().expect("a traceparent");
        let parts: Vec<_> = traceparent.split('-').collect();
        assert_eq!(
            parts[1],
            fanout_testkit::otlp::hex(&server.span.trace_id),
            "{path}: the request's trace"
        );
        assert_eq!(parts[3], "01", "{path}: {traceparent}");
        let client = spans
            .iter()
            .find(|r| fanout_testkit::otlp::hex(&r.span.span_id) == parts[2])
            .unwrap_or_else(|| panic!("{path}: {traceparent} names no exported span"));
        assert_eq!(client.span.kind, SpanKind::Client as i32);
    }
}

/// A read through a handle the application kept past its operation is
/// not in the finished request's trace (and keeps nothing of it).
#[tokio::test(flavor = "current_thread")]
async fn a_handle_kept_past_its_operation_reads_outside_its_requests_trace() {
    let (upstream, _task, _heard) = start_hearing_upstream().await;
    let app = loading_app(&upstream);
    let late: reqwest::Url = format!("{upstream}/item/9").parse().unwrap();
    let spans = exported_until(
        1.0,
        "the late read's span",
        |spans| !read_of(spans, "/item/9").is_empty(),
        async {
            let answer =
                fanout_testkit::post(&app, r#"{"query":"{ keep }"}"#.to_owned(), &[]).await;
            assert_eq!(answer.json()["data"]["keep"], true, "{:?}", answer.json());
            let operation = KEPT.lock().unwrap().take().expect("a kept handle");
            // Answered or refused: either way, a read with a span.
            let _ = tokio::spawn(async move { operation.upstream().read(Read::get(late)).await })
                .await
                .unwrap();
        },
    )
    .await;
    let server = server_of(&spans);
    let late = read_of(&spans, "/item/9");
    assert_eq!(late.len(), 1, "the late read's span");
    assert_ne!(
        late[0].span.trace_id, server.span.trace_id,
        "a read after its operation ended is not in its request's trace"
    );
}

/// A read through a handle kept from an operation whose request was
/// cancelled (the client went away while it ran) is not in that request's
/// trace either: the operation's end is its future's drop, however it ends.
#[tokio::test(flavor = "current_thread")]
async fn a_handle_kept_from_a_cancelled_operation_reads_outside_its_requests_trace() {
    let (upstream, _task, _heard) = start_hearing_upstream().await;
    let app = loading_app(&upstream);
    let late: reqwest::Url = format!("{upstream}/item/8").parse().unwrap();
    let spans = exported_until(
        1.0,
        "the late read's span",
        |spans| !read_of(spans, "/item/8").is_empty(),
        async {
            let request = fanout_testkit::post(&app, r#"{"query":"{ hold }"}"#.to_owned(), &[]);
            tokio::select! {
                _ = request => panic!("`hold` never answers"),
                _ = HELD_NOW.notified() => {} // the request's future dropped here
            }
            let operation = HELD.lock().unwrap().take().expect("a held handle");
            let _ = tokio::spawn(async move { operation.upstream().read(Read::get(late)).await })
                .await
                .unwrap();
        },
    )
    .await;
    let server = server_of(&spans);
    let late = read_of(&spans, "/item/8");
    assert_eq!(late.len(), 1, "the late read's span");
    assert_ne!(
        late[0].span.trace_id, server.span.trace_id,
        "a read after its operation was cancelled is not in its request's trace"
    );
}

/// The handle `refused_app`'s hook kept, for an operation refused before
/// it ran.
static REFUSED: std::sync::Mutex<Option<std::sync::Arc<fanout_budget::request::Operation>>> =
    std::sync::Mutex::new(None);

/// A handle the application kept from an operation refused before it ran
/// (past `max_hops`) reads outside that request's trace: the operation's
/// end is its own, whether it ran or not.
#[tokio::test(flavor = "current_thread")]
async fn a_handle_kept_from_a_refused_operation_reads_outside_its_requests_trace() {
    let (upstream, _task, _heard) = start_hearing_upstream().await;
    let engine = Engine::new(Config::default());
    let schema = Schema::build(Loaded, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .finish();
    let graphql = FanoutGraphQL::new(schema, engine).operation_data(|operation, _data| {
        *REFUSED.lock().unwrap() = Some(operation.clone());
    });
    let app = Router::new().route_service("/graphql", graphql);
    let late: reqwest::Url = format!("{upstream}/item/7").parse().unwrap();
    let inbound = "4bf92f3577b34da6a3ce929d0e0e4736";
    let traceparent = format!("00-{inbound}-00f067aa0ba902b7-01");
    let spans = exported_until(
        1.0,
        "the late read's span",
        |spans| !read_of(spans, "/item/7").is_empty(),
        async {
            let headers = [
                ("traceparent", traceparent.as_str()),
                ("fanout-budget", "hops=9"),
            ];
            let answer =
                fanout_testkit::post(&app, r#"{"query":"{ keep }"}"#.to_owned(), &headers).await;
            assert_eq!(
                answer.json()["errors"][0]["extensions"]["code"],
                "FANOUT_TOO_MANY_HOPS",
                "{:?}",
                answer.json()
            );
            let operation = REFUSED.lock().unwrap().take().expect("a handle");
            // Refused too (the request's budget): a read with a span.
            let _ = tokio::spawn(async move { operation.upstream().read(Read::get(late)).await })
                .await
                .unwrap();
        },
    )
    .await;
    let late = read_of(&spans, "/item/7");
    assert_eq!(late.len(), 1, "the late read's span");
    assert_ne!(
        fanout_testkit::otlp::hex(&late[0].span.trace_id),
        inbound,
        "a read after its operation was refused is not in its request's trace"
    );
}

/// A coalescing host's send runs in a task of its own: under an
/// application's level filter that keeps DEBUG out (no span of the read's
/// own), its `traceparent` still names the request's span, sampled.
#[tokio::test(flavor = "current_thread")]
async fn a_coalesced_send_names_the_requests_span_when_the_application_filters_out_debug_spans() {
    let (upstream, _task, heard) = start_hearing_upstream().await;
    let app = app(coalescing(&upstream, true), &upstream);
    let spans = exported_filtered(
        1.0,
        Some(tracing_subscriber::filter::LevelFilter::INFO),
        "the request's SERVER span",
        |spans| spans.iter().any(|r| r.span.kind == SpanKind::Server as i32),
        async {
            let query = r#"{"query":"{ get(path: \"/item/1\") }"}"#;
            let answer = fanout_testkit::post(&app, query.to_owned(), &[]).await;
            assert_eq!(answer.json()["data"]["get"], 200, "{:?}", answer.json());
        },
    )
    .await;
    let server = server_of(&spans);
    let heard = std::mem::take(&mut *heard.lock().unwrap());
    assert_eq!(heard.len(), 1, "{heard:?}");
    let traceparent = heard[0].1.as_deref().expect("a traceparent");
    let parts: Vec<_> = traceparent.split('-').collect();
    assert_eq!(
        parts[1],
        fanout_testkit::otlp::hex(&server.span.trace_id),
        "the request's trace: {traceparent}"
    );
    assert_eq!(parts[3], "01", "sampled: {traceparent}");
    // The request's span, or (when the process's level lets the read's own
    // spans be built: other tests' subscribers) its CLIENT span.
    assert!(
        spans
            .iter()
            .any(|r| fanout_testkit::otlp::hex(&r.span.span_id) == parts[2]
                && r.span.trace_id == server.span.trace_id),
        "{traceparent} names an exported span of the request's trace"
    );
}

/// A load that runs inside an application's span of another trace (a
/// worker span opened outside any request) still reads in the request's
/// trace: the handle's request decides, not the task's span.
#[tokio::test(flavor = "current_thread")]
async fn a_loaders_reads_stay_in_the_requests_trace_inside_a_span_of_another() {
    let (upstream, _task, _heard) = start_hearing_upstream().await;
    let app = loading_app_with(&upstream, true);
    let spans = traced(&app, &[LOADED]).await;
    let server = server_of(&spans);
    let operation = spans.iter().find(|r| r.span.name == "query").unwrap();
    for path in ["/item/1", "/item/2"] {
        assert_read_under(&spans, path, server, operation);
    }
}

/// An application whose subscriber keeps INFO and above for every layer
/// opens no operation span (DEBUG): a read a loader makes away from the
/// request's task stays under the request's span, and says upstream that
/// the request is sampled.
#[tokio::test(flavor = "current_thread")]
async fn a_loaders_reads_stay_in_the_trace_when_the_application_filters_out_debug_spans() {
    let (upstream, _task, heard) = start_hearing_upstream().await;
    let app = loading_app(&upstream);
    let server_received =
        |spans: &[Received]| spans.iter().any(|r| r.span.kind == SpanKind::Server as i32);
    let spans = exported_filtered(
        1.0,
        Some(tracing_subscriber::filter::LevelFilter::INFO),
        "the request's SERVER span",
        server_received,
        async {
            let answer = fanout_testkit::post(&app, LOADED.to_owned(), &[]).await;
            assert_eq!(answer.json()["data"]["a"], 200, "{:?}", answer.json());
        },
    )
    .await;
    let server = server_of(&spans);
    assert!(
        spans.iter().all(|r| r.span.name != "query"),
        "no operation span under the filter"
    );
    // The reads' own spans are DEBUG's: whether they are built follows
    // the process's highest level (`LevelFilter::current()`, over every
    // subscriber alive — other tests' too), so they may be absent here;
    // when present they are under the request's span.
    for path in ["/item/1", "/item/2"] {
        if !read_of(&spans, path).is_empty() {
            assert_read_under(&spans, path, server, server);
        }
    }
    let heard = std::mem::take(&mut *heard.lock().unwrap());
    assert_eq!(heard.len(), 2, "{heard:?}");
    let server_id = fanout_testkit::otlp::hex(&server.span.span_id);
    for (path, traceparent) in &heard {
        let traceparent = traceparent.as_deref().expect("a traceparent");
        let parent = traceparent.split('-').nth(2).expect("a parent id");
        assert!(
            parent == server_id
                || spans
                    .iter()
                    .any(|r| fanout_testkit::otlp::hex(&r.span.span_id) == parent
                        && r.span.trace_id == server.span.trace_id),
            "{path}: {traceparent} names the request's span or one of its trace"
        );
        assert!(
            traceparent.ends_with("-01"),
            "{path}: a sampled request says so upstream: {traceparent}"
        );
        assert!(
            traceparent.contains(&fanout_testkit::otlp::hex(&server.span.trace_id)),
            "{path}: {traceparent}"
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_sampled_out_requests_dataloader_exports_nothing_and_sends_its_trace_unsampled() {
    let (upstream, _task, heard) = start_hearing_upstream().await;
    let app = loading_app(&upstream);
    let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
    let sampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    // Sampled out, then sampled (what is exported once its SERVER span is
    // in: the first request's spans, had it any, were flushed before).
    let spans = exported(1, async {
        for caller in [unsampled, sampled] {
            let answer =
                fanout_testkit::post(&app, LOADED.to_owned(), &[("traceparent", caller)]).await;
            assert_eq!(answer.json()["data"]["a"], 200, "{:?}", answer.json());
        }
    })
    .await;
    for received in &spans {
        assert_eq!(
            fanout_testkit::otlp::hex(&received.span.trace_id),
            "0af7651916cd43dd8448eb211c80319c",
            "{} exported outside the sampled request's trace",
            received.span.name
        );
    }
    assert_eq!(read_of(&spans, "/item/1").len(), 1, "the sampled request's");
    let heard = std::mem::take(&mut *heard.lock().unwrap());
    assert_eq!(heard.len(), 4, "{heard:?}");
    for (path, traceparent) in &heard[..2] {
        let traceparent = traceparent.as_deref().expect("a traceparent");
        let parts: Vec<_> = traceparent.split('-').collect();
        assert_eq!(parts[1], "4bf92f3577b34da6a3ce929d0e0e4736", "{path}");
        assert_eq!(parts[3], "00", "{path}: {traceparent}");
    }
}

/// A subscription to a [`SharedPoll`] of `/item/{id}`.
struct Polled;

#[Subscription]
impl Polled {
    /// `n` polls of `/item/{id}`, each answer its status.
    async fn polled(
        &self,
        ctx: &Context<'_>,
        id: u64,
        n: usize,
    ) -> async_graphql::Result<impl futures::Stream<Item = u16>> {
        use fanout_budget::graphql::{FanoutConnection, SharedPoll};
        use futures::StreamExt as _;
        let connection = ctx.data::<FanoutConnection>()?.clone();
        let polls = ctx.data::<SharedPoll<u64, u16>>()?;
        let url: fanout_budget::reqwest::Url =
            format!("{}/item/{id}", ctx.data::<Base>()?.0).parse()?;
        let answers = polls.subscribe(id, &connection, move |operation| {
            let url = url.clone();
            async move {
                let read = operation.upstream().read(Read::get(url)).await;
                read.map_or(0, |r| r.status.as_u16())
            }
        });
        Ok(answers.take(n))
    }
}

/// Runs a subscription of `n` polls of `/item/1` under a telemetry
/// sampling at `ratio`: what is exported once `until`, and what the
/// upstream heard.
async fn polled(
    ratio: f64,
    until: impl Fn(&[Received]) -> bool,
) -> (Vec<Received>, Vec<(String, Option<String>)>) {
    let (upstream, _task, heard) = start_hearing_upstream().await;
    let spans = exported_until(ratio, "the polls' spans", until, async {
        let engine = Engine::new(Config::default());
        let polls = fanout_budget::graphql::SharedPoll::<u64, u16>::new(Duration::from_millis(100));
        let schema = Schema::build(Query, EmptyMutation, Polled)
            .extension(FanoutExtension::new(&engine))
            .data(Base(upstream))
            .data(polls)
            .finish();
        let query = "subscription { polled(id: 1, n: 2) }";
        let events = subscribed(schema, engine, query).await;
        assert_eq!(events.len(), 2, "{events:?}");
    })
    .await;
    let heard = std::mem::take(&mut *heard.lock().unwrap());
    (spans, heard)
}

#[tokio::test(flavor = "current_thread")]
async fn each_poll_of_a_shared_poll_is_a_trace_of_its_own() {
    let two_polls = |spans: &[Received]| {
        spans
            .iter()
            .filter(|r| r.span.name == "upstream.poll")
            .count()
            >= 2
            && read_of(spans, "/item/1").len() >= 2
    };
    let (spans, heard) = polled(1.0, two_polls).await;
    let polls: Vec<_> = spans
        .iter()
        .filter(|r| r.span.name == "upstream.poll")
        .collect();
    assert_ne!(
        polls[0].span.trace_id, polls[1].span.trace_id,
        "a trace each"
    );
    for poll in &polls {
        assert_a_root_over_one_read(&spans, poll);
    }
    // Every read of a poll is under one, and each request sent names its
    // CLIENT span, in the poll's trace.
    for read in read_of(&spans, "/item/1") {
        let under = |poll: &&Received| poll.span.span_id == read.span.parent_span_id;
        assert!(polls.iter().any(under), "a read outside a poll");
    }
    for (path, traceparent) in &heard {
        let traceparent = traceparent.as_deref().expect("a traceparent");
        let parts: Vec<_> = traceparent.split('-').collect();
        assert_eq!(parts[3], "01", "{path}: {traceparent}");
        let client = spans
            .iter()
            .find(|r| fanout_testkit::otlp::hex(&r.span.span_id) == parts[2]);
        // A poll sent after the last flush is not exported: only those.
        if let Some(client) = client {
            assert_eq!(fanout_testkit::otlp::hex(&client.span.trace_id), parts[1]);
            assert!(polls
                .iter()
                .any(|p| p.span.trace_id == client.span.trace_id));
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_poll_sampled_out_exports_nothing_and_sends_its_own_trace_unsampled() {
    // The events' SERVER spans are sampled out too: wait for nothing.
    let (spans, heard) = polled(0.0, |_| true).await;
    assert!(
        spans.is_empty(),
        "{:?}",
        statuses(&spans.iter().collect::<Vec<_>>())
    );
    assert!(heard.len() >= 2, "{heard:?}");
    let mut traces: Vec<_> = heard
        .iter()
        .map(|(path, traceparent)| {
            let traceparent = traceparent.as_deref().expect("a traceparent");
            let parts: Vec<_> = traceparent.split('-').collect();
            assert_eq!(parts[3], "00", "{path}: {traceparent}");
            parts[1].to_owned()
        })
        .collect();
    traces.dedup();
    assert_eq!(traces.len(), heard.len(), "a trace per poll: {heard:?}");
}
