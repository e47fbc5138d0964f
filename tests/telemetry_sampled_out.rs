//! A request sampled out, with nothing but the telemetry listening, opens
//! no span at all — not even its own `graphql.request`: tracing-subscriber's
//! registry would open it for the telemetry's layer alone (whose filter
//! refuses it: the registry opens a span unless all 64 of its filter slots
//! refuse), then enter and leave it at every poll of the request. A log's
//! layer still gets it (`tests/telemetry_reads.rs`,
//! `no_read_opens_a_span_in_the_subscriber_while_a_telemetry_exports`).
//!
//! A binary of its own: a callsite's interest is the process's, over every
//! subscriber alive, and other tests' subscribers would want the span.
#![cfg(feature = "otel")]

use async_graphql::{EmptyMutation, EmptySubscription, Object, Schema};
use axum::Router;
use fanout_budget::{Config, Engine, FanoutExtension, FanoutGraphQL};
use fanout_testkit::otlp::Collector;
use tracing_subscriber::layer::SubscriberExt as _;

struct Query;

#[Object]
impl Query {
    /// Whether the resolver runs inside any span of the subscriber's.
    async fn spanned(&self) -> bool {
        !tracing::Span::current().is_none()
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_request_sampled_out_opens_no_span_when_only_the_telemetry_listens() {
    let engine = Engine::new(Config::default());
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .finish();
    let app = Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine));
    let (_collector, telemetry) = Collector::sampling_nothing().await;
    let subscriber = tracing_subscriber::registry().with(telemetry.layer());
    let _default = tracing::subscriber::set_default(subscriber);
    let query = r#"{"query":"{ spanned }"}"#;

    let answer = fanout_testkit::post(&app, query.to_owned(), &[]).await;
    assert_eq!(answer.json()["data"]["spanned"], false, "sampled out");
    let sampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let answer = fanout_testkit::post(&app, query.to_owned(), &[("traceparent", sampled)]).await;
    assert_eq!(answer.json()["data"]["spanned"], true, "sampled");
    tokio::task::spawn_blocking(move || drop(telemetry))
        .await
        .unwrap();
}
