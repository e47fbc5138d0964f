//! The operation's span as a collector on loopback receives it, and the
//! `tracing` span a resolver runs in, whichever way the span is built
//! (`telemetry`, the `otel` feature): straight as OpenTelemetry span data
//! when the telemetry exports the engine's spans alone and no other layer
//! takes it (no `tracing` span opened: the resolver runs in the request's);
//! as a `tracing` span when the application exports spans of its own (a
//! target added: a span a resolver opens is the operation's child) or a
//! layer of another kind takes it (a log's at `DEBUG`). The exported span
//! is the same in every case: INTERNAL, named after the operation's type,
//! the request's SERVER span its parent, the reads its children (one made
//! from a task the resolver spawns too), what it sent its attributes.
//!
//! One test, its cases in turn: whether another layer takes a span is a
//! callsite's interest, which is the process's (tests on other threads
//! with subscribers of their own would change it).
#![cfg(feature = "otel")]

use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema};
use axum::routing::get;
use axum::{Json, Router};
use fanout_budget::config::TelemetryConfig;
use fanout_budget::cost::{CostTable, FieldCost};
use fanout_budget::telemetry::Telemetry;
use fanout_budget::{Config, Engine, FanoutContext, FanoutExtension, FanoutGraphQL, Read};
use fanout_testkit::otlp::{attribute, is_int, Collector, Received, SpanKind};
use serde_json::json;
use std::time::Duration;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::Layer as _;

struct Base(String);

struct Query;

#[Object]
impl Query {
    /// Opens a span of the application's (`my_app`), takes a permit, reads
    /// `/item/1`, then `/item/2` from a task it spawns; the name of the
    /// `tracing` span the resolver runs in.
    async fn item(&self, ctx: &Context<'_>) -> async_graphql::Result<String> {
        let current = tracing::Span::current()
            .metadata()
            .map_or("none", |meta| meta.name());
        let url = format!("{}/item/1", ctx.data::<Base>()?.0).parse()?;
        tracing::debug_span!(target: "my_app", "mine").in_scope(|| ());
        // A permit charges the budget and notes nothing on the operation.
        drop(ctx.upstream()?.permit("db:5432").await?);
        ctx.upstream()?.read(Read::get(url)).await?;
        // One through the operation's handle, in a task of its own.
        let url = format!("{}/item/2", ctx.data::<Base>()?.0).parse()?;
        let operation = ctx.fanout_operation()?;
        let read = async move { operation.upstream().read(Read::get(url)).await };
        tokio::spawn(read).await??;
        Ok(current.to_owned())
    }
}

async fn start_upstream() -> (String, tokio::task::JoinHandle<()>) {
    async fn item() -> Json<serde_json::Value> {
        Json(json!({ "value": "v" }))
    }
    let app = Router::new().route("/item/{id}", get(item));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, task)
}

fn app(upstream: &str) -> Router {
    let mut config = Config::default();
    config.telemetry.record_document = true;
    // Priced: `fanout.requested` and `fanout.delta` on the span.
    let costs = CostTable::new().field("Query", "item", FieldCost::reads(3));
    let engine = Engine::builder(config).costs(costs).build();
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .data(Base(upstream.to_owned()))
        .finish();
    Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine))
}

/// The operation the cases run: named, priced, its document recorded.
const QUERY: &str = r#"{"query":"query Named { item }"}"#;

/// How the application's subscriber is built in a case.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Case {
    /// The telemetry's layer, and a log's at `INFO`.
    TelemetryAlone,
    /// The telemetry exports the application's spans too (`my_app`).
    WithTarget,
    /// A log's layer at `DEBUG` beside the telemetry's.
    DebugLog,
    /// Another telemetry made a layer (not in this subscriber): neither
    /// could tell whether the other takes the operation's span.
    SecondTelemetry,
}

/// A telemetry exporting to a collector of its own, `my_app`'s spans too
/// when `target`.
async fn exporting(target: bool) -> (Collector, Telemetry) {
    let collector = Collector::start().await;
    let config = TelemetryConfig::default().otlp_endpoint(collector.base.clone());
    let mut builder = Telemetry::builder(config).export_interval(Duration::from_millis(50));
    if target {
        builder = builder.target("my_app");
    }
    (collector, builder.build().unwrap().unwrap())
}

/// One request in `case`: the `tracing` span its resolver ran in, and
/// every span exported.
async fn request(case: Case, upstream: &str) -> (String, Vec<Received>) {
    let (collector, telemetry) = exporting(case == Case::WithTarget).await;
    let log = tracing_subscriber::filter::LevelFilter::from_level(match case {
        Case::DebugLog => tracing::Level::DEBUG,
        _ => tracing::Level::INFO,
    });
    // A log's layer that formats nothing; not an `Option` of a layer (one
    // that is `None` takes every callsite).
    let subscriber = tracing_subscriber::registry()
        .with(telemetry.layer())
        .with(tracing_subscriber::layer::Identity::new().with_filter(log));
    let default = tracing::subscriber::set_default(subscriber);
    let other = match case {
        Case::SecondTelemetry => {
            let (collector, other) = exporting(false).await;
            drop(other.layer::<tracing_subscriber::Registry>());
            Some((collector, other))
        }
        _ => None,
    };
    let answer = fanout_testkit::post(&app(upstream), QUERY, &[]).await;
    drop(default);
    if let Some((_collector, other)) = other {
        tokio::task::spawn_blocking(move || drop(other))
            .await
            .unwrap();
    }
    assert_eq!(answer.status, 200, "{:?}", answer.json());
    let current = answer.json()["data"]["item"]
        .as_str()
        .expect("the resolver's span")
        .to_owned();
    let telemetry = tokio::task::spawn_blocking(move || {
        let _ = telemetry.flush();
        telemetry
    })
    .await
    .unwrap();
    let spans = collector
        .wait_for(Duration::from_secs(10), "the request's spans", |spans| {
            spans.iter().any(|r| r.span.kind == SpanKind::Server as i32)
                && (spans.iter())
                    .filter(|r| r.span.kind == SpanKind::Client as i32)
                    .count()
                    == 2
        })
        .await;
    tokio::task::spawn_blocking(move || drop(telemetry))
        .await
        .unwrap();
    (current, spans)
}

fn named<'a>(spans: &'a [Received], name: &str) -> &'a Received {
    let mut found = spans.iter().filter(|r| r.span.name == name);
    let span = found.next().unwrap_or_else(|| panic!("no span {name}"));
    assert!(found.next().is_none(), "one span {name}");
    span
}

/// A span's attributes, each key with its typed value, by key.
fn attributes(span: &Received) -> Vec<(String, String)> {
    let mut attributes: Vec<_> = (span.span.attributes.iter())
        .map(|kv| (kv.key.clone(), format!("{:?}", kv.value)))
        .collect();
    attributes.sort();
    attributes
}

/// What an exported operation span says, whichever way it was built: its
/// attributes, status, events and links.
fn said(operation: &Received) -> String {
    format!(
        "{:?} status {:?} events {} links {} flags {} scope {}",
        attributes(operation),
        operation.span.status,
        operation.span.events.len(),
        operation.span.links.len(),
        operation.span.flags,
        operation.service,
    )
}

#[tokio::test(flavor = "current_thread")]
async fn the_operation_s_span_is_exported_alike_however_it_is_built() {
    let (upstream, _task) = start_upstream().await;
    let mut first: Option<String> = None;
    for (case, runs_in) in [
        (Case::TelemetryAlone, "graphql.request"),
        (Case::WithTarget, "graphql.operation"),
        (Case::DebugLog, "graphql.operation"),
        (Case::SecondTelemetry, "graphql.operation"),
        // Back to a direct span once the log's layer is gone.
        (Case::TelemetryAlone, "graphql.request"),
    ] {
        let (current, spans) = request(case, &upstream).await;
        assert_eq!(current, runs_in, "{case:?}: the resolver's span");
        let server = spans
            .iter()
            .find(|r| r.span.kind == SpanKind::Server as i32)
            .expect("the SERVER span");
        let operation = named(&spans, "query");
        assert_eq!(operation.span.kind, SpanKind::Internal as i32, "{case:?}");
        assert_eq!(operation.span.trace_id, server.span.trace_id, "{case:?}");
        assert_eq!(
            operation.span.parent_span_id, server.span.span_id,
            "{case:?}: the request's child"
        );
        assert!(operation.span.start_time_unix_nano >= server.span.start_time_unix_nano);
        assert!(operation.span.end_time_unix_nano <= server.span.end_time_unix_nano);
        assert!(operation.span.end_time_unix_nano >= operation.span.start_time_unix_nano);
        let text = |key: &str| attribute(&operation.span, key);
        assert_eq!(text("graphql.operation.type").as_deref(), Some("query"));
        assert_eq!(text("graphql.operation.name").as_deref(), Some("Named"));
        assert_eq!(
            text("graphql.document").as_deref(),
            Some("query Named { item }")
        );
        for (key, value) in [
            ("fanout.requested", "3"),
            ("fanout.reads", "3"),
            ("fanout.cache_hits", "0"),
            ("fanout.delta", "0"),
        ] {
            assert_eq!(text(key).as_deref(), Some(value), "{case:?}: {key}");
            assert!(is_int(&operation.span, key), "{case:?}: {key}");
        }
        // The same span, attribute for attribute, however it was built.
        let said = said(operation);
        match &first {
            None => first = Some(said),
            Some(first) => assert_eq!(&said, first, "{case:?}"),
        }
        // Both reads, the spawned task's too, are the operation's children.
        let reads: Vec<_> = spans
            .iter()
            .filter(|r| r.span.name == "upstream.read")
            .collect();
        assert_eq!(reads.len(), 2, "{case:?}");
        for read in reads {
            assert_eq!(
                read.span.parent_span_id, operation.span.span_id,
                "{case:?}: the read is the operation's child"
            );
        }
        // The application's span: exported by a telemetry told its
        // target, under the operation whose resolver opened it.
        let mine = spans.iter().find(|r| r.span.name == "mine");
        match case == Case::WithTarget {
            true => assert_eq!(
                mine.expect("the application's span").span.parent_span_id,
                operation.span.span_id,
                "{case:?}: a resolver's span is the operation's child"
            ),
            false => assert!(mine.is_none(), "{case:?}: not exported"),
        }
    }
}
