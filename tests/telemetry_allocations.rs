//! What a request sampled out allocates for the telemetry: its sampling,
//! and for each upstream request the `traceparent` value (one allocation,
//! shared by the HTTP client's copies of the request's headers) and the
//! upstream's parse of that header's name — nothing per span, nothing per
//! metric record. Counted by this binary's global allocator on the one
//! thread that serves the request, the upstream and the client (a
//! current-thread runtime), against the same requests with no telemetry.
#![cfg(feature = "otel")]

use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema};
use axum::routing::get;
use axum::Router;
use fanout_budget::{Config, Engine, FanoutContext, FanoutExtension, FanoutGraphQL, Read};
use fanout_testkit::otlp::Collector;
use tracing_subscriber::layer::SubscriberExt as _;

#[path = "common/counting.rs"]
mod counting;

use counting::{allocations, Counting};

#[global_allocator]
static COUNTING: Counting = Counting;

struct Base(String);

struct Query;

#[Object]
impl Query {
    /// One read of `/item/{id}`: its status.
    async fn item(&self, ctx: &Context<'_>, id: u32) -> async_graphql::Result<u16> {
        let url = format!("{}/item/{id}", ctx.data::<Base>()?.0).parse()?;
        Ok(ctx.upstream()?.read(Read::get(url)).await?.status.as_u16())
    }
}

/// Three reads a request.
const READS: u64 = 3;
const QUERY: &str = r#"{"query":"{ a: item(id: 1) b: item(id: 2) c: item(id: 3) }"}"#;
const REQUESTS: u64 = 200;

/// Allocations per request on this thread, after a warm-up.
async fn per_request(app: &Router) -> f64 {
    for _ in 0..50 {
        fanout_testkit::post(app, QUERY.to_owned(), &[]).await;
    }
    let before = allocations();
    for _ in 0..REQUESTS {
        let answer = fanout_testkit::post(app, QUERY.to_owned(), &[]).await;
        assert_eq!(answer.json()["data"]["c"], 200, "{:?}", answer.json());
    }
    (allocations() - before) as f64 / REQUESTS as f64
}

#[tokio::test(flavor = "current_thread")]
async fn a_request_sampled_out_allocates_little_beyond_its_traceparents() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let upstream = Router::new().route("/item/{id}", get(|| async { "v" }));
    let _upstream = tokio::spawn(async move { axum::serve(listener, upstream).await.unwrap() });
    let engine = Engine::new(Config::default());
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .data(Base(base))
        .finish();
    let app = Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine));

    // No telemetry in the process yet.
    let without = per_request(&app).await;
    let (_collector, telemetry) = Collector::sampling_nothing().await;
    let subscriber = tracing_subscriber::registry().with(telemetry.layer());
    let default = tracing::subscriber::set_default(subscriber);
    let sampled_out = per_request(&app).await;
    drop(default);
    tokio::task::spawn_blocking(move || drop(telemetry))
        .await
        .unwrap();

    let more = sampled_out - without;
    println!("allocations per request: {without:.1} without telemetry, {sampled_out:.1} sampled out (+{more:.1})");
    // Two a read (its `traceparent`, the upstream's header name) and the
    // sampling, with a margin of two for the maps' growth; it was +12.6
    // when a `traceparent` copied on its first clone and the duration
    // metric built its attributes on the heap.
    let bound = (2 * READS + 3) as f64;
    assert!(
        more <= bound,
        "a request sampled out made {more:.1} more allocations than one without telemetry (at most {bound})"
    );
}
