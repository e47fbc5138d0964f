//! The gateway application: engine + schema + routes, from a [`Config`].

use crate::oci::RegistryUrl;
use crate::schema::{self, RegistrySchema};
use axum::routing::get;
use axum::Router;
use fanout_budget::backends::redis::{RedisBackend, RedisHostCaps, RedisRateLimiter};
use fanout_budget::config::CsrfGet;
use fanout_budget::{
    inbound::{cors_layer, RateLimitLayer},
    Config, Engine, FanoutExtension, FanoutGraphQL,
};
use std::num::NonZeroU32;
use std::sync::Arc;

/// Deepest selection accepted (the introspection query needs about 13).
pub const MAX_DEPTH: usize = 20;
/// Most fields one operation's answer may hold in the worst case: every
/// field and alias, each list page multiplied by its `first`, each
/// descriptor list by the most a manifest may list (the reference page of
/// 20 repositories × 20 tags × manifest and config is about 2,500; 100 tags
/// with every layer's digest, media type and size about 77,000). A cheap
/// refusal before anything runs; what an answer really holds is bounded as
/// it is built (`http.max_answer_bytes`).
pub const MAX_COMPLEXITY: usize = 100_000;
/// Deepest nesting the parser follows before refusing (stack protection).
pub const MAX_RECURSIVE_DEPTH: usize = 64;

/// The assembled gateway.
pub struct Gateway {
    /// `/graphql`, `/metrics`, `/healthz`.
    pub router: Router,
    /// The engine behind `/graphql` (for tests and metrics).
    pub engine: Engine,
    /// The schema.
    pub schema: RegistrySchema,
}

/// Renders `/metrics`; the binary installs a Prometheus recorder and passes
/// its handle's `render`.
pub type MetricsRender = std::sync::Arc<dyn Fn() -> String + Send + Sync>;

/// The gateway for `config`, reading the registry at `upstream`.
///
/// The registry's host is a known host of the engine
/// ([`EngineBuilder::known_host`](fanout_budget::EngineBuilder::known_host)):
/// it keeps its own `host` label on the metrics without a `[hosts]` table.
/// Every other host without a table — a redirect's target, a CDN — is
/// counted under `host="other"`.
///
/// With `[redis] url` (one server) or `cluster_nodes` (a Redis Cluster) set,
/// the per-host caps and the per-IP limit are shared on Redis (nothing
/// connects until the first request, so a Redis that is down does not stop
/// start-up). The gateway's [`defaults`] fill in what `config` leaves unset.
pub fn build(config: Config, upstream: reqwest::Url, metrics: Option<MetricsRender>) -> Gateway {
    let config = defaults(config);
    let mut engine = Engine::builder(config.clone())
        .costs(schema::costs())
        .known_host(fanout_budget::read::host_name(&upstream));
    if let Some(redis) = redis_backend(&config) {
        engine = engine.host_limiter(Arc::new(RedisHostCaps::new(config.hosts.clone(), redis)));
    }
    build_with(engine.build(), upstream, metrics)
}

/// `config` with the gateway's defaults where they differ from the
/// library's, for keys the configuration leaves unset:
///
/// - `http.csrf_get = "allow"`: a plain cross-site `GET` runs. The gateway
///   has no ambient credentials — no cookie, no session; the internal token
///   is a header, which a page cannot add without a preflight — and serves
///   what the registry shows anyone, so a page that makes a visitor's
///   browser send a `GET` gets nothing it could not fetch itself (CORS
///   keeps the answer from it anyway). Stock clients send their queries as
///   plain `GET`s (urql's default; graphql-http's audits), and would be
///   refused under the library's `require_preflight`. What a page can still
///   do is spend its visitors' per-IP rate limit and reads, one budget per
///   request; set `require_preflight` if the gateway sits behind something
///   that adds credentials from a browser's cookies.
pub fn defaults(mut config: Config) -> Config {
    config.http.csrf_get.get_or_insert(CsrfGet::Allow);
    config
}

fn redis_backend(config: &Config) -> Option<RedisBackend> {
    if !config.redis.is_enabled() {
        return None;
    }
    // The URL or the nodes were validated with the configuration.
    RedisBackend::new(&config.redis).ok()
}

/// The inbound limiter for `config`: in-process, or shared on Redis.
pub fn rate_limit_layer(config: &Config) -> RateLimitLayer {
    let layer = RateLimitLayer::new(&config.rate_limit);
    match redis_backend(config) {
        None => layer,
        Some(redis) => {
            let rpm =
                NonZeroU32::new(config.rate_limit.requests_per_minute).unwrap_or(NonZeroU32::MIN);
            let mode = redis.failure_mode();
            layer.shared(Arc::new(RedisRateLimiter::new(redis, rpm)), mode)
        }
    }
}

/// The gateway on an engine built by the caller (a custom host limiter or
/// clock), whose configuration is taken as it is (pass it through
/// [`defaults`] first for the gateway's).
pub fn build_with(
    engine: Engine,
    upstream: reqwest::Url,
    metrics: Option<MetricsRender>,
) -> Gateway {
    let schema = schema::builder()
        // Counts each answer as it is built (`http.max_answer_bytes`).
        .extension(FanoutExtension::new(&engine))
        // Protect the process itself: depth, size and parser recursion.
        .limit_depth(MAX_DEPTH)
        .limit_complexity(MAX_COMPLEXITY)
        .limit_recursive_depth(MAX_RECURSIVE_DEPTH)
        .data(RegistryUrl(upstream))
        .finish();
    let render = metrics.unwrap_or_else(|| std::sync::Arc::new(String::new));
    // The inbound limiter guards /graphql only; /metrics and /healthz are never limited.
    let limiter = rate_limit_layer(engine.config());
    let graphql = FanoutGraphQL::new(schema.clone(), engine.clone());
    let router = Router::new()
        .route_service("/graphql", graphql.clone())
        .route_layer(limiter)
        // GraphiQL's own scripts and styles: never rate limited.
        .route_service("/graphql/graphiql/{file}", graphql)
        .route("/metrics", get(move || async move { render() }))
        .route("/healthz", get(|| async { "ok" }))
        // Outermost: a CORS preflight is answered before the rate limiter.
        .layer(tower::util::option_layer(cors_layer(&engine.config().http)));
    Gateway {
        router,
        engine,
        schema,
    }
}
