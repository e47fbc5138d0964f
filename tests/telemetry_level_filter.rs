//! An application whose subscriber keeps every span out — a global level
//! filter stricter than the engine's request span (`WARN`) — still has its
//! upstream requests carry the request's trace: no layer saw the request,
//! so no telemetry sampled it, and its `traceparent` is decided when the
//! first upstream request is written. A caller's `traceparent` goes on as
//! it came (this service records nothing of the trace: the caller's span
//! stays the parent); a trace that starts here gets a trace id of its own,
//! the same for every read of the request, flagged unsampled (`-00`),
//! since nothing of it is exported.
//!
//! A binary of its own: which spans a global level filter lets through is
//! the process's (`LevelFilter::current()`, over every subscriber alive),
//! and other tests' subscribers would raise it.
#![cfg(feature = "otel")]

use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema};
use axum::routing::get;
use axum::Router;
use fanout_budget::config::TelemetryConfig;
use fanout_budget::telemetry::Telemetry;
use fanout_budget::{Config, Engine, FanoutContext, FanoutExtension, FanoutGraphQL, Read};
use fanout_testkit::otlp::Collector;
use std::sync::{Arc, Mutex};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt as _;

/// The `traceparent` of every request the upstream heard, in order.
type Heard = Arc<Mutex<Vec<Option<String>>>>;

/// An upstream answering any item, hearing each request's `traceparent`.
async fn start_upstream() -> (String, tokio::task::JoinHandle<()>, Heard) {
    let heard = Heard::default();
    let hearing = heard.clone();
    let app = Router::new()
        .route("/item/{id}", get(|| async { "v" }))
        .layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| {
                let traceparent = request.headers().get("traceparent");
                let traceparent = traceparent.map(|v| v.to_str().unwrap().to_owned());
                hearing.lock().unwrap().push(traceparent);
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
    /// One read of `/item/{id}`: its status.
    async fn item(&self, ctx: &Context<'_>, id: u32) -> async_graphql::Result<u16> {
        let url = format!("{}/item/{id}", ctx.data::<Base>()?.0).parse()?;
        Ok(ctx.upstream()?.read(Read::get(url)).await?.status.as_u16())
    }

    /// [`item`](Self::item), read through the operation's handle from a
    /// task of its own (as a `DataLoader`'s spawned load does).
    async fn spawned(&self, ctx: &Context<'_>, id: u32) -> async_graphql::Result<u16> {
        let url = format!("{}/item/{id}", ctx.data::<Base>()?.0).parse()?;
        let operation = ctx.fanout_operation()?;
        let read = async move { operation.upstream().read(Read::get(url)).await };
        Ok(tokio::spawn(read).await??.status.as_u16())
    }
}

/// Three reads in one request, one of them away from its task.
const READS: &str = r#"{"query":"{ a: item(id: 1) b: item(id: 2) c: spawned(id: 3) }"}"#;

/// `(trace id, parent id, flags)` of a `traceparent`.
fn parts(traceparent: &str) -> (String, String, String) {
    let parts: Vec<_> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(parts[0], "00", "{traceparent}");
    (parts[1].into(), parts[2].into(), parts[3].into())
}

#[tokio::test(flavor = "current_thread")]
async fn upstream_requests_carry_the_trace_under_a_level_filter_that_keeps_every_span_out() {
    let (upstream, _task, heard) = start_upstream().await;
    let engine = Engine::new(Config::default());
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .data(Base(upstream))
        .finish();
    let app = Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine));
    let collector = Collector::start().await;
    let config = TelemetryConfig::default()
        .otlp_endpoint(collector.base.clone())
        .sample_ratio(1.0);
    let telemetry = Telemetry::builder(config).build().unwrap().unwrap();
    let subscriber = tracing_subscriber::registry()
        .with(telemetry.layer())
        .with(LevelFilter::WARN);
    let _default = tracing::subscriber::set_default(subscriber);
    let heard_now = || std::mem::take(&mut *heard.lock().unwrap());
    let answered = |answer: fanout_testkit::Answer| {
        let json = answer.json();
        assert_eq!(json["data"]["a"], 200, "{json:?}");
        assert_eq!(json["data"]["b"], 200, "{json:?}");
        assert_eq!(json["data"]["c"], 200, "{json:?}");
    };

    // A caller's trace, sampled or not: passed on as it came.
    for inbound in [
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
    ] {
        let headers = [("traceparent", inbound)];
        answered(fanout_testkit::post(&app, READS.to_owned(), &headers).await);
        let heard = heard_now();
        assert_eq!(heard.len(), 3, "{heard:?}");
        for traceparent in &heard {
            let traceparent = traceparent.as_deref().expect("a traceparent upstream");
            assert_eq!(traceparent, inbound, "the caller's, as it came");
        }
    }

    // A trace that starts here: one trace id for the request's reads,
    // unsampled (nothing of it is exported), a new one per request.
    let mut traces = Vec::new();
    for _ in 0..2 {
        answered(fanout_testkit::post(&app, READS.to_owned(), &[]).await);
        let heard = heard_now();
        assert_eq!(heard.len(), 3, "{heard:?}");
        let each: Vec<_> = heard
            .iter()
            .map(|t| parts(t.as_deref().expect("a traceparent upstream")))
            .collect();
        let one_trace = each.iter().all(|(trace, _, _)| *trace == each[0].0);
        assert!(one_trace, "one trace for the request: {heard:?}");
        assert_ne!(each[0].0, "0".repeat(32), "a valid trace id: {heard:?}");
        assert!(each.iter().all(|(_, _, flags)| flags == "00"), "{heard:?}");
        traces.push(each[0].0.clone());
    }
    assert_ne!(traces[0], traces[1], "a trace per request");

    drop(_default);
    tokio::task::spawn_blocking(move || drop(telemetry))
        .await
        .unwrap();
}
