//! A chain of services is one trace, and each hop's spans say what budget
//! travelled (`telemetry`, the `otel` feature): the caller's read span
//! carries the grant it sent and what the service reported spent; the
//! service's SERVER span carries the budget it received and what it
//! reported back.
//!
//! Both engines run in this process under one subscriber (a current-thread
//! runtime); the service is reached over loopback HTTP.
#![cfg(feature = "otel")]
mod common;

use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema};
use axum::Router;
use common::Upstream;
use fanout_budget::config::TelemetryConfig;
use fanout_budget::telemetry::Telemetry;
use fanout_budget::{Config, Engine, FanoutContext, FanoutExtension, FanoutGraphQL, Read};
use fanout_testkit::otlp::{attribute, hex, Collector, SpanKind};
use std::time::Duration;
use tracing_subscriber::layer::SubscriberExt as _;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

struct Service(String);
struct Edge;

#[Object]
impl Edge {
    /// One call to the service: its answer's text.
    async fn hop(&self, ctx: &Context<'_>) -> async_graphql::Result<String> {
        let url = ctx.data::<Service>()?.0.parse()?;
        let body = r#"{"query":"{ items(first: 2) { detail { value } } }"}"#;
        let read = Read::new(http::Method::POST, url)
            .header(http::header::CONTENT_TYPE, "application/json".parse()?)
            .body(body);
        let answer = ctx.upstream()?.read(read).await?;
        Ok(String::from_utf8_lossy(&answer.body).into_owned())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn each_hop_says_what_budget_it_received_and_what_it_reported() {
    let collector = Collector::start().await;
    let config = TelemetryConfig::default()
        .otlp_endpoint(collector.base.clone())
        .service_name("chain");
    let telemetry = Telemetry::builder(config)
        .export_interval(Duration::from_millis(50))
        .build()
        .unwrap()
        .expect("an endpoint turns export on");
    let subscriber = tracing_subscriber::registry().with(telemetry.layer());
    let _default = tracing::subscriber::set_default(subscriber);

    // The service: the tests' app over loopback HTTP, 3 reads a query.
    let upstream = Upstream::start().await;
    let service = common::app(&Engine::new(Config::default()), &upstream);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let host = listener.local_addr().unwrap().to_string();
    let serving = tokio::spawn(async move { axum::serve(listener, service).await.unwrap() });

    // The edge: 10 reads, its reads to the service carrying the budget.
    let toml = format!("[budget]\nmax_reads = 10\n[hosts.\"{host}\"]\npropagate = true\n");
    let engine = Engine::new(Config::from_toml(&toml).unwrap());
    let schema = Schema::build(Edge, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .data(Service(format!("http://{host}/graphql")))
        .finish();
    let edge = Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine));
    let traceparent = format!("00-{TRACE_ID}-00f067aa0ba902b7-01");
    let answer = fanout_testkit::post(
        &edge,
        r#"{"query":"{ hop }"}"#,
        &[("traceparent", &traceparent)],
    )
    .await;
    let body = answer.json();
    assert!(
        body["data"]["hop"].as_str().unwrap().contains("item-"),
        "{body}"
    );
    // The read to the service, and the 3 it spent (the list, two items).
    assert_eq!(body["extensions"]["fanout"]["used"], 4, "{body}");

    let flushed = tokio::task::spawn_blocking(move || {
        let _ = telemetry.flush();
        telemetry
    });
    let _telemetry = flushed.await.unwrap();
    let servers = |spans: &[fanout_testkit::otlp::Received]| {
        (spans.iter())
            .filter(|r| r.span.kind == SpanKind::Server as i32)
            .count()
    };
    let spans = collector
        .wait_for(Duration::from_secs(10), "both SERVER spans", |spans| {
            servers(spans) == 2
        })
        .await;
    serving.abort();
    assert!(
        spans.iter().all(|r| hex(&r.span.trace_id) == TRACE_ID),
        "the chain is one trace"
    );
    let server_of = |hops: bool| {
        spans
            .iter()
            .find(|r| {
                r.span.kind == SpanKind::Server as i32
                    && attribute(&r.span, "fanout.budget.hops").is_some() == hops
            })
            .unwrap_or_else(|| panic!("no SERVER span with hops={hops}"))
    };
    // The service's SERVER span: the budget it received, what it reported.
    let far = &server_of(true).span;
    assert_eq!(attribute(far, "fanout.budget.hops").as_deref(), Some("1"));
    assert_eq!(attribute(far, "fanout.budget.reads").as_deref(), Some("9"));
    let deadline: u64 = attribute(far, "fanout.budget.deadline_ms")
        .unwrap()
        .parse()
        .unwrap();
    assert!((4000..5000).contains(&deadline), "{deadline}");
    assert_eq!(attribute(far, "fanout.spent").as_deref(), Some("3"));
    // The edge received nothing, and reported nothing.
    let near = &server_of(false).span;
    assert_eq!(attribute(near, "fanout.budget.reads"), None);
    assert_eq!(attribute(near, "fanout.spent"), None);
    // The edge's read span: the grant it sent, what it was told was spent.
    let read = spans
        .iter()
        .find(|r| attribute(&r.span, "fanout.granted").is_some())
        .expect("the edge's read span carries its grant");
    assert_eq!(
        attribute(&read.span, "fanout.granted").as_deref(),
        Some("9")
    );
    assert_eq!(attribute(&read.span, "fanout.spent").as_deref(), Some("3"));
}
