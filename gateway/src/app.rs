//! The gateway application: engine + schema + routes, from a [`Config`].

use crate::oci::RegistryUrl;
use crate::schema::{self, RegistrySchema};
use axum::routing::get;
use axum::Router;
use fanout_budget::{Config, Engine, FanoutGraphQL, RateLimitLayer};

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
pub fn build(config: Config, upstream: reqwest::Url, metrics: Option<MetricsRender>) -> Gateway {
    let engine = Engine::builder(config).costs(schema::costs()).build();
    build_with(engine, upstream, metrics)
}

/// The gateway on an engine built by the caller (a custom host limiter or clock).
pub fn build_with(
    engine: Engine,
    upstream: reqwest::Url,
    metrics: Option<MetricsRender>,
) -> Gateway {
    let schema = schema::builder()
        .extension(engine.extension())
        .data(RegistryUrl(upstream))
        .finish();
    let render = metrics.unwrap_or_else(|| std::sync::Arc::new(String::new));
    // The inbound limiter guards /graphql only; /metrics and /healthz are never limited.
    let limiter = RateLimitLayer::new(&engine.config().rate_limit);
    let router = Router::new()
        .route_service(
            "/graphql",
            FanoutGraphQL::new(schema.clone(), engine.clone()),
        )
        .route_layer(limiter)
        .route("/metrics", get(move || async move { render() }))
        .route("/healthz", get(|| async { "ok" }));
    Gateway {
        router,
        engine,
        schema,
    }
}
