//! Shared test fixtures: a counting loopback upstream and a small schema
//! whose resolvers read it through the engine, as a user's would.
#![allow(dead_code)]

use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema, SimpleObject};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use fanout_budget::{Engine, FanoutContext, ReadError, FanoutGraphQL, OrNull, Read};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::ServiceExt;

/// How the upstream answers one item.
#[derive(Clone, Copy, Debug)]
pub enum Behaviour {
    Ok,
    Delay(Duration),
    Hang,
    Status(u16),
    Garbage,
}

/// What the upstream saw.
#[derive(Default)]
pub struct Seen {
    pub requests: AtomicU64,
    pub in_flight: AtomicU64,
    pub peak: AtomicU64,
    pub paths: Mutex<HashMap<String, u64>>,
    pub behaviour: Mutex<HashMap<u64, Behaviour>>,
    pub default_delay: Mutex<Option<Duration>>,
}

impl Seen {
    pub fn requests(&self) -> u64 {
        self.requests.load(SeqCst)
    }
    pub fn peak(&self) -> u64 {
        self.peak.load(SeqCst)
    }
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(SeqCst)
    }
    pub fn count(&self, path: &str) -> u64 {
        *self.paths.lock().unwrap().get(path).unwrap_or(&0)
    }
    pub fn set(&self, id: u64, b: Behaviour) {
        self.behaviour.lock().unwrap().insert(id, b);
    }
}

struct InFlight(Arc<Seen>);
impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, SeqCst);
    }
}

fn enter(seen: &Arc<Seen>, path: String) -> InFlight {
    seen.requests.fetch_add(1, SeqCst);
    *seen.paths.lock().unwrap().entry(path).or_default() += 1;
    let now = seen.in_flight.fetch_add(1, SeqCst) + 1;
    seen.peak.fetch_max(now, SeqCst);
    InFlight(seen.clone())
}

/// A running loopback upstream; stops when dropped.
pub struct Upstream {
    pub addr: SocketAddr,
    pub seen: Arc<Seen>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    pub async fn start() -> Self {
        let seen = Arc::new(Seen::default());
        let app = Router::new()
            .route("/list", get(list))
            .route("/item/{id}", get(item))
            .with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { addr, seen, task }
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn host(&self) -> String {
        self.addr.to_string()
    }
}

async fn list(State(seen): State<Arc<Seen>>) -> impl IntoResponse {
    let _g = enter(&seen, "/list".into());
    axum::Json(json!({ "ids": (0..1000).collect::<Vec<u64>>() }))
}

async fn item(State(seen): State<Arc<Seen>>, Path(id): Path<u64>) -> axum::response::Response {
    let _g = enter(&seen, format!("/item/{id}"));
    let behaviour = seen.behaviour.lock().unwrap().get(&id).copied();
    let default_delay = *seen.default_delay.lock().unwrap();
    match behaviour.unwrap_or(Behaviour::Ok) {
        Behaviour::Hang => std::future::pending::<()>().await,
        Behaviour::Delay(d) => tokio::time::sleep(d).await,
        Behaviour::Status(s) => return (StatusCode::from_u16(s).unwrap(), "boom").into_response(),
        Behaviour::Garbage => return "<html>not json".into_response(),
        Behaviour::Ok => {
            if let Some(d) = default_delay {
                tokio::time::sleep(d).await
            }
        }
    }
    axum::Json(json!({ "id": id, "value": format!("item-{id}") })).into_response()
}

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
    let _ = engine;
    Schema::build(Query, EmptyMutation, EmptySubscription)
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
    let mut request =
        axum::http::Request::post("/graphql").header("content-type", "application/json");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = app
        .clone()
        .oneshot(request.body(axum::body::Body::from(body.into())).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, value)
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
