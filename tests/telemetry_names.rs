//! What a span says of the operation, whatever the client wrote
//! (`telemetry`, the `otel` feature), as an OTLP/HTTP collector on loopback
//! receives it: `graphql.operation.name` is the name of the operation the
//! document runs, sent in `operationName` or not, and absent when
//! `operationName` names no operation of the document; every text past
//! `attribute_value_length_limit` is cut at a character boundary; an
//! inbound `tracestate` past 512 bytes is cut as the W3C advises.
//!
//! Each test installs its subscriber for its own thread (a current-thread
//! runtime), so the tests of this binary do not see each other's spans.
#![cfg(feature = "otel")]

use async_graphql::{EmptyMutation, EmptySubscription, Object, Schema};
use axum::Router;
use fanout_budget::config::TelemetryConfig;
use fanout_budget::telemetry::Telemetry;
use fanout_budget::{Config, Engine, FanoutExtension, FanoutGraphQL};
use fanout_testkit::otlp::{attribute, hex, Collector, Received, Span};
use serde_json::json;
use std::time::Duration;
use tracing_subscriber::layer::SubscriberExt as _;

struct Query;

#[Object]
impl Query {
    async fn ping(&self) -> u32 {
        1
    }
    async fn echo(&self, text: String) -> String {
        text
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

/// A telemetry exporting to `collector` with `limit` as the attribute value
/// length limit.
fn telemetry(collector: &Collector, limit: usize) -> Telemetry {
    let config = TelemetryConfig::default()
        .otlp_endpoint(collector.base.clone())
        .attribute_value_length_limit(limit);
    Telemetry::builder(config)
        .export_interval(Duration::from_millis(50))
        .build()
        .unwrap()
        .expect("an endpoint turns export on")
}

/// The trace id of request `i`, in its `traceparent`.
fn trace_id(i: usize) -> String {
    format!(
        "{:032x}",
        0x4bf9_0000_0000_0000_0000_0000_0000_0000_u128 + i as u128
    )
}

/// POSTs `body` as request `i` of its own trace, with `tracestate` when
/// given.
async fn send(app: &Router, i: usize, body: serde_json::Value, tracestate: Option<&str>) {
    let traceparent = format!("00-{}-00f067aa0ba902b7-01", trace_id(i));
    let mut headers = vec![("traceparent", traceparent.as_str())];
    headers.extend(tracestate.map(|state| ("tracestate", state)));
    let answer = fanout_testkit::post(app, body.to_string(), &headers).await;
    assert_eq!(answer.status, 200, "{:?}", answer.json());
}

/// Flushes, then the operation span of each of the first `requests`
/// requests' traces, in order.
async fn operation_spans(
    collector: &Collector,
    telemetry: Telemetry,
    requests: usize,
) -> Vec<Span> {
    let telemetry = tokio::task::spawn_blocking(move || {
        let _ = telemetry.flush();
        telemetry
    })
    .await
    .unwrap();
    let is_operation = |r: &Received| {
        attribute(&r.span, "fanout.requested").is_some()
            || r.span.name == "query"
            || r.span.name == "GraphQL Operation"
    };
    let spans = collector
        .wait_for(Duration::from_secs(20), "every operation's span", |spans| {
            (0..requests).all(|i| {
                spans
                    .iter()
                    .any(|r| is_operation(r) && hex(&r.span.trace_id) == trace_id(i))
            })
        })
        .await;
    // Its shutdown waits for an export this thread's runtime would run.
    tokio::task::spawn_blocking(move || drop(telemetry))
        .await
        .unwrap();
    (0..requests)
        .map(|i| {
            let mut ops = spans
                .iter()
                .filter(|r| is_operation(r) && hex(&r.span.trace_id) == trace_id(i));
            let op = ops.next().unwrap().span.clone();
            assert!(ops.next().is_none(), "one operation span in request {i}");
            op
        })
        .collect()
}

#[tokio::test(flavor = "current_thread")]
async fn the_span_names_the_operation_the_document_runs() {
    let collector = Collector::start().await;
    let telemetry = telemetry(&collector, 1024);
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(telemetry.layer()));
    let app = app(false);
    let cases: [(serde_json::Value, Option<&str>); 5] = [
        // A named operation, `operationName` not sent: its name.
        (json!({ "query": "query Named { ping }" }), Some("Named")),
        // Sent and naming it: the same.
        (
            json!({ "query": "query Named { ping }", "operationName": "Named" }),
            Some("Named"),
        ),
        // One of several, chosen.
        (
            json!({ "query": "query A { ping } query B { ping }", "operationName": "B" }),
            Some("B"),
        ),
        // Naming no operation of the document: no name (and the request
        // fails as async-graphql says).
        (
            json!({ "query": "{ ping }", "operationName": "Ghost" }),
            None,
        ),
        // An anonymous operation: no name.
        (json!({ "query": "{ ping }" }), None),
    ];
    for (i, (body, _)) in cases.iter().enumerate() {
        send(&app, i, body.clone(), None).await;
    }
    let spans = operation_spans(&collector, telemetry, cases.len()).await;
    for (i, ((body, expected), span)) in cases.iter().zip(&spans).enumerate() {
        assert_eq!(
            attribute(span, "graphql.operation.name").as_deref(),
            *expected,
            "request {i}: {body}"
        );
    }
    assert_eq!(
        attribute(&spans[0], "graphql.operation.type").as_deref(),
        Some("query")
    );
}

#[tokio::test(flavor = "current_thread")]
async fn texts_past_the_limit_are_cut_at_a_character_boundary_and_tracestate_at_512_bytes() {
    let collector = Collector::start().await;
    let telemetry = telemetry(&collector, 1001);
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(telemetry.layer()));
    let app = app(true);
    // A 3,000-byte name, and a document of 2-byte characters: 1,001 falls
    // inside one of them.
    let name = "N".repeat(3_000);
    let named = format!("query {name} {{ ping }}");
    let text = "é".repeat(2_000);
    let document = format!("{{ echo(text: \"{text}\") }}");
    let small = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";
    let huge = (0..32)
        .map(|i| format!("vendor{i:02}={}", "x".repeat(240)))
        .collect::<Vec<_>>()
        .join(",");
    send(&app, 0, json!({ "query": named }), Some(small)).await;
    send(&app, 1, json!({ "query": document }), Some(&huge)).await;
    let spans = operation_spans(&collector, telemetry, 2).await;

    assert_eq!(
        attribute(&spans[0], "graphql.operation.name").as_deref(),
        Some(&name[..1001])
    );
    let recorded = attribute(&spans[1], "graphql.document").unwrap();
    assert_eq!(recorded.len(), 1000, "cut before the character 1,001 is in");
    assert!(document.starts_with(&recorded));
    // A tracestate within 512 bytes is kept as sent; the 8 KB one is
    // dropped, each of its members being longer than 128 bytes.
    assert_eq!(spans[0].trace_state, small);
    assert_eq!(spans[1].trace_state, "");
}
