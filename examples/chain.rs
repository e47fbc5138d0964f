//! One service of a chain: its resolvers call the next GraphQL service over
//! HTTP — another copy of itself, the gateway, any service on the engine —
//! and the whole chain spends one budget, the edge's.
//!
//! The next service is `[upstreams.next]` with `propagate = true`. Each read
//! to it is charged here as any read is (a hop costs a read), and carries
//! `Fanout-Budget: reads=G, deadline-ms=D, hops=H`: G the reads it may send
//! for this one (the reads left, split between the reads asking at the same
//! moment, reserved here at once), D the time until this read is cut less
//! the 100 ms the next service may take to answer past it, H one more hop. The next service lowers its own `max_reads` and deadline to
//! those, refuses the request past its `[budget] max_hops`
//! (`FANOUT_TOO_MANY_HOPS`), and answers `Fanout-Spent: reads=N`: N of the
//! grant stay charged here, the rest come back. So the edge's
//! `extensions.fanout.used` counts every request the chain sent for it.
//!
//! Run the gateway (`cargo run -p fanout-gateway`: 127.0.0.1:8080, on its
//! embedded registry), then this in front of it:
//! `cargo run --example chain -- http://127.0.0.1:8080/graphql`, and
//! `curl -s localhost:3000/graphql -H 'content-type: application/json'
//! -d '{"query":"{ fan(width: 3, query: \"{ fanoutBudget { limit used } }\") { answer } }"}'`
//! — three requests to the gateway, told they may send 32, 32 and 33 reads
//! (the 97 left once the three are charged, split as they ask in turn);
//! they spend none, and all 97 come back. Point a second copy at the
//! first (`-- http://127.0.0.1:3000/graphql 127.0.0.1:3001`) for a longer
//! chain (`gateway/tests/chain.rs` runs three hops over loopback).
use async_graphql::{Context, EmptyMutation, EmptySubscription, Json, Object, Schema};
use axum::Router;
use fanout_budget::{Config, Engine, FanoutContext, FanoutExtension, FanoutGraphQL, OrNull, Read};
use http::{header, HeaderValue, Method};
use serde_json::Value;
use std::sync::Arc;

/// The next service's GraphQL endpoint.
struct Next(reqwest::Url);
struct Query;

#[Object]
impl Query {
    /// `width` requests to the next service, sent together, each asking
    /// `query` (at most 100: the budget bounds the reads, this the rows).
    async fn fan(
        &self,
        #[graphql(validator(maximum = 100))] width: u32,
        query: String,
    ) -> Vec<Call> {
        vec![Call(query.into()); width as usize]
    }
}

/// One request to the next service.
#[derive(Clone)]
struct Call(Arc<str>);

#[Object]
impl Call {
    /// The next service's answer (`data`, `errors`, `extensions`, as it sent
    /// them); null, with a coded error at this row, if the read failed —
    /// refused by the budget, cut by the deadline, or no GraphQL answer.
    async fn answer(&self, ctx: &Context<'_>) -> Option<Json<Value>> {
        ask(ctx, &self.0).await.map(Json).or_null(ctx)
    }
}

/// One POST of `query` to the next service, through the acquisition point.
/// Without a `dedup_key` a POST is never shared: each row is its own read.
async fn ask(ctx: &Context<'_>, query: &str) -> async_graphql::Result<Value> {
    let url = ctx.data::<Next>()?.0.clone();
    let body = serde_json::json!({ "query": query }).to_string();
    let json = HeaderValue::from_static("application/json");
    let read = Read::new(Method::POST, url)
        .header(header::CONTENT_TYPE, json)
        .body(body);
    let answer = ctx.upstream()?.read(read).await?; // charged, timed, and carrying the budget
    Ok(answer.error_for_status()?.json()?)
}

/// The configuration: the next service at `next`, its reads carrying the
/// budget. Everything else is the defaults (`max_reads = 100`, …).
pub fn config(next: &reqwest::Url) -> Config {
    let toml = format!("[upstreams.next]\nurl = \"{next}\"\npropagate = true\n");
    Config::from_toml(&toml).expect("a URL is a TOML string")
}

/// The app on `engine` (built from [`config`]), calling the service at `next`.
pub fn app(engine: Engine, next: reqwest::Url) -> Router {
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine)) // counts reads, codes errors
        .data(Next(next))
        .finish();
    // One budget per inbound request, lowered by its caller's `Fanout-Budget`.
    Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine))
}

#[allow(dead_code)] // the tests use `app` and `config`
#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let next = args.next();
    let next = next.as_deref().unwrap_or("http://127.0.0.1:8080/graphql");
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:3000".into());
    let next: reqwest::Url = next.parse().expect("the next service's URL");
    let config = config(&next);
    let engine = Engine::new(config.clone()); // one per process
    let listener = tokio::net::TcpListener::bind(&listen).await.unwrap();
    println!("listening on http://{listen}/graphql (next: {next})");
    fanout_budget::inbound::serve(listener, app(engine, next), &config)
        .await
        .unwrap();
}
