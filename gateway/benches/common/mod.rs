//! What the gateway benches share: the registry (the tests' known data,
//! `Store::fixture`), the gateway served over loopback, and the "engine off"
//! baseline — the same queries answered by a minimal schema that reads the
//! registry with plain reqwest (no budget, no caps, no de-duplication, no
//! per-read timeout, no rate limit; the request deadline is its only bound) —
//! and "stock protections": the same schema behind the stock parts a team
//! without fanout-budget would assemble (`stock_router`).
#![allow(dead_code, unused_imports)] // each bench uses a part

use async_graphql::{Context, EmptyMutation, EmptySubscription, Object, Schema, SimpleObject};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Router;
use bytes::Bytes;
use fanout_budget::{inbound::Caller, Config, Engine, FanoutExtension, FanoutGraphQL};
use fanout_gateway::embedded::{EmbeddedRegistry, Image, Store};
use fanout_gateway::oci::{RegistryUrl, MANIFEST_ACCEPT};
use fanout_gateway::schema::{self, RegistrySchema};
use serde::Deserialize;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Semaphore, SemaphorePermit};

/// The repository every bench query reads: 60 tags, t00..t59, single images.
pub const REPO: &str = "acme/app";

/// The embedded registry on a free loopback port, with a fixed latency.
pub async fn registry(latency: Option<Duration>) -> EmbeddedRegistry {
    let registry = EmbeddedRegistry::fixture()
        .await
        .expect("the embedded registry starts");
    registry.set_latency(latency);
    registry
}

/// Serves `router` on a free loopback port (with the TCP peer as
/// `ConnectInfo`, as the gateway binary does); its `/graphql` URL.
pub async fn serve(router: Router) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let addr = listener.local_addr().expect("an address");
    let task = tokio::spawn(async move {
        let service = router.into_make_service_with_connect_info::<SocketAddr>();
        let _ = axum::serve(listener, service).await;
    });
    (format!("http://{addr}/graphql"), task)
}

/// POSTs `body`; status, body, and how long it took.
pub async fn post(client: &reqwest::Client, url: &str, body: &str) -> (u16, String, Duration) {
    let started = std::time::Instant::now();
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("the gateway answers");
    let status = response.status().as_u16();
    let text = response.text().await.expect("a body");
    (status, text, started.elapsed())
}

/// A GraphQL request body for `query`.
pub fn single(query: &str) -> String {
    serde_json::json!({ "query": query }).to_string()
}

/// A batch body, one operation per query.
pub fn batch(queries: &[String]) -> String {
    serde_json::Value::Array(
        queries
            .iter()
            .map(|q| serde_json::json!({ "query": q }))
            .collect(),
    )
    .to_string()
}

pub use fanout_testkit::median;

/// The `q` quantile (0..=1) of sorted `values`, nearest rank.
pub fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// `rustc -V`, `nproc` and the CPU model, for the report.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cores} cores, {cpu}")
}

// ---------------------------------------------------------------------------
// The baseline: engine off.

/// How the baseline reaches the registry (one per registry host). Engine
/// off: plain reqwest. Stock protections: a slot of the host's semaphore
/// held for each read, and a timeout on each read.
struct Registry {
    client: reqwest::Client,
    base: reqwest::Url,
    /// The host's in-flight cap (stock protections only).
    slots: Option<HostSlots>,
    /// One read's timeout, body included (stock protections only).
    read_timeout: Option<Duration>,
}

/// A registry's answer, read whole.
struct Answer {
    headers: reqwest::header::HeaderMap,
    body: Bytes,
}

impl Registry {
    fn plain(base: reqwest::Url) -> Self {
        Registry {
            client: reqwest::Client::new(),
            base,
            slots: None,
            read_timeout: None,
        }
    }

    async fn get(&self, path: &str, accept: Option<&str>) -> async_graphql::Result<Answer> {
        // Held until the body is read (stock protections).
        let _slot = match &self.slots {
            Some(slots) => Some(slots.acquire().await?),
            None => None,
        };
        let mut request = self.client.get(self.base.join(path)?);
        if let Some(accept) = accept {
            request = request.header("accept", accept);
        }
        if let Some(timeout) = self.read_timeout {
            request = request.timeout(timeout);
        }
        let mut response = request.send().await?;
        if !response.status().is_success() {
            return Err(format!("registry answered {}", response.status()).into());
        }
        let headers = std::mem::take(response.headers_mut());
        let body = response.bytes().await?;
        Ok(Answer { headers, body })
    }
}

/// A process-wide cap on reads in flight to one registry host: a semaphore,
/// a read waiting at most `wait` for a slot and refused past it.
struct HostSlots {
    host: String,
    permits: Semaphore,
    wait: Duration,
}

impl HostSlots {
    async fn acquire(&self) -> async_graphql::Result<SemaphorePermit<'_>> {
        match tokio::time::timeout(self.wait, self.permits.acquire()).await {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_closed)) => Err(format!("{}: no reads taken", self.host).into()),
            Err(_elapsed) => Err(format!(
                "{}: too many reads in flight (no slot within {:?})",
                self.host, self.wait
            )
            .into()),
        }
    }
}

/// The baseline's schema: the load and fan-out queries' fields, each read
/// done where it is needed, every time it is needed.
pub type BaselineSchema = Schema<Query, EmptyMutation, EmptySubscription>;

/// The baseline root.
pub struct Query;

#[Object]
impl Query {
    async fn repository(
        &self,
        ctx: &Context<'_>,
        name: String,
    ) -> async_graphql::Result<Option<Repository>> {
        #[derive(Deserialize)]
        struct TagList {
            tags: Option<Vec<String>>,
        }
        let registry = ctx.data::<Registry>()?;
        let answer = registry.get(&format!("/v2/{name}/tags/list"), None).await?;
        let list: TagList = serde_json::from_slice(&answer.body)?;
        Ok(Some(Repository {
            name,
            tags: list.tags.unwrap_or_default(),
        }))
    }
}

/// A repository and its tags.
pub struct Repository {
    name: String,
    tags: Vec<String>,
}

#[Object]
impl Repository {
    async fn name(&self) -> &str {
        &self.name
    }

    // Its cost `first` times its selection's: what `limit_complexity` weighs
    // on the stock-protections side (no limit on engine off).
    #[graphql(complexity = "(first.max(0) as usize).saturating_mul(child_complexity)")]
    async fn tags(&self, #[graphql(default = 20)] first: i32) -> TagConnection {
        TagConnection {
            nodes: self
                .tags
                .iter()
                .take(first.max(0) as usize)
                .map(|t| Tag {
                    repository: self.name.clone(),
                    name: t.clone(),
                })
                .collect(),
        }
    }

    async fn tag(&self, name: String) -> Option<Tag> {
        self.tags.contains(&name).then(|| Tag {
            repository: self.name.clone(),
            name,
        })
    }
}

/// A page of tags.
#[derive(SimpleObject)]
pub struct TagConnection {
    nodes: Vec<Tag>,
}

/// A tag.
pub struct Tag {
    repository: String,
    name: String,
}

#[Object]
impl Tag {
    async fn name(&self) -> &str {
        &self.name
    }

    async fn manifest(&self, ctx: &Context<'_>) -> async_graphql::Result<Option<Manifest>> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        #[allow(dead_code)]
        struct Body {
            media_type: Option<String>,
            config: Option<serde_json::Value>,
            #[serde(default)]
            layers: Vec<serde_json::Value>,
            manifests: Option<Vec<serde_json::Value>>,
        }
        let registry = ctx.data::<Registry>()?;
        let path = format!("/v2/{}/manifests/{}", self.repository, self.name);
        let answer = registry.get(&path, Some(MANIFEST_ACCEPT)).await?;
        let digest = answer
            .headers
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let _body: Body = serde_json::from_slice(&answer.body)?;
        Ok(Some(Manifest { digest }))
    }
}

/// A manifest.
pub struct Manifest {
    digest: String,
}

#[Object]
impl Manifest {
    async fn digest(&self) -> &str {
        &self.digest
    }
}

struct Baseline<E> {
    schema: E,
    deadline: Duration,
}

/// The baseline's `/graphql` — the benches' "engine off": one operation or
/// a batch, bounded only by the request `deadline` (past it the whole answer
/// is a 504 with no data).
pub fn baseline_router(registry: reqwest::Url, deadline: Duration) -> Router {
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .data(Registry::plain(registry))
        .finish();
    deadline_router(schema, deadline)
}

/// `/graphql` for `schema`: one operation or a batch, bounded only by the
/// request `deadline` (past it the whole answer is a 504 with no data).
fn deadline_router<E: async_graphql::Executor>(schema: E, deadline: Duration) -> Router {
    Router::new()
        .route("/graphql", axum::routing::post(baseline_graphql::<E>))
        .with_state(Arc::new(Baseline { schema, deadline }))
}

async fn baseline_graphql<E: async_graphql::Executor>(
    State(state): State<Arc<Baseline<E>>>,
    body: axum::body::Bytes,
) -> Response {
    let batch: async_graphql::BatchRequest = match serde_json::from_slice(&body) {
        Ok(batch) => batch,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    match tokio::time::timeout(state.deadline, state.schema.execute_batch(batch)).await {
        Ok(response) => axum::Json(response).into_response(),
        Err(_) => (
            StatusCode::GATEWAY_TIMEOUT,
            axum::Json(
                serde_json::json!({ "errors": [{ "message": "request deadline exceeded" }] }),
            ),
        )
            .into_response(),
    }
}

// ---------------------------------------------------------------------------
// Stock protections: what a team that does not adopt fanout-budget assembles.

/// The stock side's depth limit: the bench query is 5 fields deep; the
/// reference schema's deepest meaningful path (`repositories > nodes > tags
/// > nodes > manifest > config > os`) is 7.
pub const STOCK_MAX_DEPTH: usize = 10;

/// The stock side's complexity limit (a field costs 1 plus its selection;
/// `tags` costs `first` times its selection): the bench query weighs 17;
/// `tags(first: 100)` with every manifest, about what the engine's default
/// budget of 100 reads lets through, weighs 401.
pub const STOCK_MAX_COMPLEXITY: usize = 500;

/// `/graphql` for the baseline's schema (same fields, same reads) as a
/// competent team without fanout-budget would serve it, every limit taken
/// from `config` where the engine reads the same one:
///
/// - `async_graphql_axum::GraphQL`, the stock service (one operation or a
///   batch), on a schema with `limit_depth` and `limit_complexity`;
/// - `tower_governor`: per-IP rate limiting at `rate_limit.requests_per_minute`
///   (GCRA, a burst of a minute's worth — the engine's own quota shape);
/// - tower-http's `RequestBodyLimitLayer` at `http.max_body_bytes` and
///   `TimeoutLayer` at `budget.deadline_ms` (past it the whole answer is a
///   504, where the engine cuts fields and keeps what was read);
/// - a `tokio::sync::Semaphore` for the registry's host with its
///   `[hosts]` table's `max_concurrent` permits, each read waiting at most
///   its `acquire_wait_ms` for one (refused past it) and holding it until
///   the body is read; a host with no table has no semaphore, as the
///   engine's is unlimited;
/// - reqwest's per-request timeout at `budget.read_timeout_ms`.
///
/// No read budget and no de-duplication: stock parts have none.
pub fn stock_router(registry: reqwest::Url, config: &Config) -> Router {
    stock_router_with(registry, config, false)
}

/// [`stock_router`], its schema with a [`NoopExtension`] when
/// `noop_extension`: what any async-graphql extension costs a team's stock
/// service (every field and list item then goes through the extension
/// chain), the floor under an engine that must be one.
pub fn stock_router_with(registry: reqwest::Url, config: &Config, noop_extension: bool) -> Router {
    use async_graphql_axum::GraphQL;
    use tower_governor::governor::GovernorConfigBuilder;
    use tower_governor::GovernorLayer;
    use tower_http::limit::RequestBodyLimitLayer;
    use tower_http::timeout::TimeoutLayer;

    let host = format!(
        "{}:{}",
        registry.host_str().unwrap_or_default(),
        registry.port_or_known_default().unwrap_or_default()
    );
    let slots = config.hosts.get(&host).map(|cap| HostSlots {
        permits: Semaphore::new(cap.max_concurrent as usize),
        wait: cap.acquire_wait(),
        host: host.clone(),
    });
    let mut schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .data(Registry {
            slots,
            read_timeout: Some(config.budget.read_timeout()),
            ..Registry::plain(registry)
        })
        .limit_depth(STOCK_MAX_DEPTH)
        .limit_complexity(STOCK_MAX_COMPLEXITY);
    if noop_extension {
        schema = schema.extension(NoopExtension);
    }
    let schema = schema.finish();

    // `requests_per_minute` per peer IP, refilled evenly over the minute
    // with a burst of the whole minute: governor's `Quota::per_minute`, as
    // the engine's limiter builds it. The load bench raises it to u32::MAX
    // (every client is 127.0.0.1): one request per 13 ns, a burst of
    // u32::MAX — a quota no load here reaches, yet every request is still
    // checked against its key's state, as on the engine-on side.
    let per_minute = config.rate_limit.requests_per_minute.max(1);
    let per_ip = GovernorConfigBuilder::default()
        .period(Duration::from_secs(60) / per_minute)
        .burst_size(per_minute)
        .finish()
        .expect("a non-zero period and burst");
    // Idle clients' state dropped now and then (tower_governor's advice).
    let limiter = Arc::downgrade(per_ip.limiter());
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(60));
        every.tick().await;
        loop {
            every.tick().await;
            match limiter.upgrade() {
                Some(limiter) => limiter.retain_recent(),
                None => break,
            }
        }
    });

    // Outermost last: the rate limit first, then the body limit, then the
    // deadline around the service.
    Router::new()
        .route(
            "/graphql",
            axum::routing::post_service(GraphQL::new(schema)),
        )
        .layer(TimeoutLayer::with_status_code(
            StatusCode::GATEWAY_TIMEOUT,
            config.budget.deadline(),
        ))
        .layer(RequestBodyLimitLayer::new(config.http.max_body_bytes))
        .layer(GovernorLayer::new(per_ip))
}

// ---------------------------------------------------------------------------
// Ablations: the engine with parts taken away (to see what costs).

/// The gateway's schema and `FanoutGraphQL` on `engine`, without the
/// rate-limit layer (`app::build_with` minus `route_layer`).
pub fn engine_router(engine: Engine, upstream: &reqwest::Url) -> Router {
    let schema = schema::builder()
        .extension(FanoutExtension::new(&engine))
        .data(RegistryUrl(upstream.clone()))
        .finish();
    Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine))
}

/// An async-graphql extension that overrides nothing: what merely having an
/// extension costs (async-graphql then routes every field through its
/// extension chain).
pub struct NoopExtension;

impl async_graphql::extensions::ExtensionFactory for NoopExtension {
    fn create(&self) -> Arc<dyn async_graphql::extensions::Extension> {
        Arc::new(NoopExtension)
    }
}

impl async_graphql::extensions::Extension for NoopExtension {}

struct ReadPathOnly {
    engine: Engine,
    schema: RegistrySchema,
}

/// The gateway's schema with no fan-out extension: a plain handler opens the
/// request's scope and hands its `Operation` to the resolvers, so every read
/// still walks the engine's acquisition point, and nothing else of the
/// engine runs (no `FanoutGraphQL`, no per-field extension hooks, no cost
/// preview, no `extensions.fanout`, no rate limit). Single operations only.
pub fn read_path_router(engine: Engine, upstream: &reqwest::Url, noop_extension: bool) -> Router {
    let mut schema = schema::builder().data(RegistryUrl(upstream.clone()));
    if noop_extension {
        schema = schema.extension(NoopExtension);
    }
    let schema = schema.finish();
    Router::new()
        .route("/graphql", axum::routing::post(read_path_graphql))
        .with_state(Arc::new(ReadPathOnly { engine, schema }))
}

async fn read_path_graphql(
    State(state): State<Arc<ReadPathOnly>>,
    body: axum::body::Bytes,
) -> Response {
    let request: async_graphql::Request = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    let operation = state.engine.begin_request(Caller::Public).operation();
    let response = state.schema.execute(request.data(operation)).await;
    axum::Json(response).into_response()
}
