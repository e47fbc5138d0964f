//! Shared test fixtures: a small schema whose resolvers read the testkit's
//! counting loopback upstream through the engine, as a user's would.
#![allow(dead_code, unused_imports)] // each test uses a part

pub mod stand_in;

use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema, SimpleObject};
use axum::http::StatusCode;
use axum::Router;
use fanout_budget::{
    Engine, FanoutContext, FanoutExtension, FanoutGraphQL, OrNull, Read, ReadError,
};
use serde_json::{json, Value};

pub use fanout_testkit::{Behaviour, Upstream};

/// The test schema's upstream base URL.
pub struct Base(pub String);

#[derive(SimpleObject)]
pub struct Detail {
    pub value: String,
}

pub struct Item {
    pub id: u64,
}

#[Object]
impl Item {
    async fn id(&self) -> u64 {
        self.id
    }
    /// One read per distinct item.
    async fn detail(&self, ctx: &Context<'_>) -> Option<Detail> {
        read_detail(ctx, self.id).await.or_null(ctx)
    }
    /// A format-mismatched selection: answered without any read.
    async fn format(&self) -> Option<String> {
        None
    }
}

async fn read_detail(ctx: &Context<'_>, id: u64) -> async_graphql::Result<Detail> {
    let base = &ctx.data::<Base>()?.0;
    let url = format!("{base}/item/{id}").parse()?;
    let response = ctx.upstream()?.read(Read::get(url)).await?;
    if !response.status.is_success() {
        return Err(response.error("unexpected status").into());
    }
    let body: Value = response.json()?;
    Ok(Detail {
        value: body["value"].as_str().unwrap_or_default().to_string(),
    })
}

pub struct Query;

#[Object]
impl Query {
    /// The first `first` items: one read of the list.
    async fn items(
        &self,
        ctx: &Context<'_>,
        #[graphql(default = 10)] first: u64,
    ) -> async_graphql::Result<Vec<Item>> {
        let base = &ctx.data::<Base>()?.0;
        let response = ctx
            .upstream()?
            .read(Read::get(format!("{base}/list").parse()?))
            .await?;
        let body: Value = response.json()?;
        let ids = body["ids"].as_array().cloned().unwrap_or_default();
        Ok(ids
            .iter()
            .take(first as usize)
            .filter_map(|v| v.as_u64())
            .map(|id| Item { id })
            .collect())
    }
    /// One item, without any read of its own.
    async fn item(&self, id: u64) -> Item {
        Item { id }
    }
    /// The request's budget as it stands.
    async fn budget(&self, ctx: &Context<'_>) -> async_graphql::Result<Vec<u64>> {
        let b = ctx.fanout_request()?.budget().snapshot();
        Ok(vec![b.limit, b.used, b.remaining])
    }
    /// Always fails with a field error (to check codes on non-null paths).
    async fn exhausted(&self) -> Result<u64, ReadError> {
        Err(ReadError::BudgetExhausted { limit: 7 })
    }
}

pub type TestSchema = Schema<Query, EmptyMutation, EmptySubscription>;

pub fn schema(engine: &Engine, upstream: &Upstream) -> TestSchema {
    Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(engine))
        .data(Base(upstream.base()))
        .finish()
}

pub fn app(engine: &Engine, upstream: &Upstream) -> Router {
    Router::new().route_service(
        "/graphql",
        FanoutGraphQL::new(schema(engine, upstream), engine.clone()),
    )
}

/// POSTs `body` to the app in-process; the status and the JSON answer.
pub async fn post(app: &Router, body: impl Into<String>) -> (StatusCode, Value) {
    post_with(app, body, &[]).await
}

pub async fn post_with(
    app: &Router,
    body: impl Into<String>,
    headers: &[(&str, &str)],
) -> (StatusCode, Value) {
    let answer = fanout_testkit::post(app, body, headers).await;
    (answer.status, answer.json())
}

/// A JSON batch of `queries`.
pub fn batch<I: IntoIterator<Item = String>>(queries: I) -> String {
    Value::Array(queries.into_iter().map(|q| json!({ "query": q })).collect()).to_string()
}

/// Every error code in a response (single or batch).
pub fn codes(value: &Value) -> Vec<String> {
    let responses = match value {
        Value::Array(items) => items.clone(),
        other => vec![other.clone()],
    };
    responses
        .iter()
        .flat_map(|r| r["errors"].as_array().cloned().unwrap_or_default())
        .map(|e| e["extensions"]["code"].as_str().unwrap_or("").to_string())
        .collect()
}
