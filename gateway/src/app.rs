//! The gateway application: engine + schema + routes, from a [`Config`].

use crate::host_check::HostCheckLayer;
use crate::oci::{DigestlessHeads, RegistryUrl};
use crate::registries::Registries;
use crate::schema::{self, RegistrySchema};
use crate::subscription::TagPolls;
use axum::routing::get;
use axum::Router;
use fanout_budget::backends::redis::SharedLimits;
use fanout_budget::config::CsrfGet;
use fanout_budget::{
    inbound::{cors_layer, RateLimitLayer},
    Config, Engine, FanoutExtension, FanoutGraphQL,
};

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
    /// The limits shared on Redis (`[redis]`), all on one backend: the
    /// engine's host caps, quota gates and read quotas, and the per-IP
    /// limit; `None`: in-process.
    pub shared: Option<SharedLimits>,
    /// The shared polls of `tagChanges` (how many tags are polled now).
    pub tag_polls: TagPolls,
}

/// Renders `/metrics`; the binary installs a Prometheus recorder and passes
/// its handle's `render`.
pub type MetricsRender = std::sync::Arc<dyn Fn() -> String + Send + Sync>;

/// What GraphiQL's editor opens on: the embedded registry's images, a tag
/// list and manifests per repository, and what the request spent.
pub const GRAPHIQL_QUERY: &str =
    "# Three repositories of the registry, two tags each, and what this request
# read of its fan-out budget. Run it (▶), then again: the budget is per request.
{
  repositories(first: 3) {
    nodes {
      name
      tags(first: 2) {
        nodes {
          name
          manifest {
            digest
          }
        }
      }
    }
  }
  fanoutBudget {
    limit
    used
    remaining
  }
}
";

/// The gateway for `config`, reading the registry at `upstream`.
///
/// The registry's host is a known host of the engine
/// ([`EngineBuilder::known_host`](fanout_budget::EngineBuilder::known_host)):
/// it keeps its own `host` label on the metrics without a `[hosts]` table.
/// Every other host without a table — a redirect's target, a CDN — is
/// counted under `host="other"`.
///
/// With `[redis] url` (one server) or `cluster_nodes` (a Redis Cluster) set,
/// the per-host caps, the per-IP limit, the upstreams' quota gates and the
/// clients' read quotas (`[quota]`) are shared on Redis, all on one
/// backend: one connection per node, one breaker (nothing connects until
/// the first request, so a Redis that is down does not stop start-up). The
/// gateway's [`defaults`] fill in what `config` leaves unset.
pub fn build(config: Config, upstream: reqwest::Url, metrics: Option<MetricsRender>) -> Gateway {
    let config = defaults(config);
    let shared = shared_limits(&config);
    let mut engine = Engine::builder(config.clone())
        .costs(schema::costs())
        .known_host(fanout_budget::read::host_name(&upstream));
    if let Some(shared) = &shared {
        engine = engine
            .host_limiter(shared.host_limiter())
            .quota_board(shared.quota_board());
        // With `[quota]`, the clients' read quotas are the fleet's too.
        if let Some(store) = shared.quota_store() {
            engine = engine.quota_store(store);
        }
    }
    assemble(engine.build(), shared, upstream, metrics)
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
///   that adds credentials from a browser's cookies. A WebSocket, which a
///   page could hold open and read, is refused to another site's page
///   whatever this says (its `Origin` must be the gateway's own or one of
///   `http.cors_allowed_origins`).
pub fn defaults(mut config: Config) -> Config {
    config.http.csrf_get.get_or_insert(CsrfGet::Allow);
    config
}

/// The names a gateway listening on a loopback address answers to when
/// `http.allowed_hosts` is left empty ([`for_listener`]).
pub const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// `config` for a gateway listening on `listen`: on a loopback address,
/// `http.allowed_hosts` left empty becomes [`LOOPBACK_HOSTS`] (any port).
/// Only this machine reaches such a gateway, by those names — and a page in
/// its browser whose own name an attacker points at `127.0.0.1` (DNS
/// rebinding) names its own host, which is refused: otherwise that page is
/// same-origin to the gateway and reads whatever the registry behind it
/// (with its configured credentials) shows. Behind a proxy on the same
/// machine that passes its own `Host`, list that name (or `["*"]`). On any
/// other address the names are not known here: empty stays any host.
pub fn for_listener(mut config: Config, listen: std::net::SocketAddr) -> Config {
    if listen.ip().is_loopback() && config.http.allowed_hosts.is_empty() {
        config.http.allowed_hosts = LOOPBACK_HOSTS.map(String::from).to_vec();
    }
    config
}

/// The limits shared on Redis for `config`; `None` without `[redis]`.
fn shared_limits(config: &Config) -> Option<SharedLimits> {
    // The URL or the nodes were validated with the configuration.
    SharedLimits::open(config).ok().flatten()
}

/// The inbound limiter: on `shared` (Redis), or in-process for `config`.
pub fn rate_limit_layer(config: &Config, shared: Option<&SharedLimits>) -> RateLimitLayer {
    match shared {
        Some(shared) => shared.rate_limit_layer(),
        None => RateLimitLayer::new(&config.rate_limit),
    }
}

/// The gateway on an engine built by the caller (a custom host limiter or
/// clock), whose configuration is taken as it is (pass it through
/// [`defaults`] first for the gateway's). With `[redis]`, the per-IP limit
/// is shared on Redis on limits of its own: an engine whose host caps are
/// on Redis comes from [`build`], which puts both on one backend.
pub fn build_with(
    engine: Engine,
    upstream: reqwest::Url,
    metrics: Option<MetricsRender>,
) -> Gateway {
    let shared = shared_limits(engine.config());
    assemble(engine, shared, upstream, metrics)
}

/// The gateway on `engine`, its per-IP limit on `shared` if any.
fn assemble(
    engine: Engine,
    shared: Option<SharedLimits>,
    upstream: reqwest::Url,
    metrics: Option<MetricsRender>,
) -> Gateway {
    let tag_polls = TagPolls::new(engine.config().subscriptions.poll_interval());
    let schema = schema::builder()
        // Counts each answer as it is built (`http.max_answer_bytes`).
        .extension(FanoutExtension::new(&engine))
        // Protect the process itself: depth, size and parser recursion.
        .limit_depth(MAX_DEPTH)
        .limit_complexity(MAX_COMPLEXITY)
        .limit_recursive_depth(MAX_RECURSIVE_DEPTH)
        .data(Registries::from_config(engine.config(), &upstream))
        .data(RegistryUrl(upstream))
        .data(DigestlessHeads::default())
        .data(tag_polls.clone())
        .finish();
    let render = metrics.unwrap_or_else(|| std::sync::Arc::new(String::new));
    // The inbound limiter guards /graphql only; /metrics and /healthz are never limited.
    let limiter = rate_limit_layer(engine.config(), shared.as_ref());
    let graphql = FanoutGraphQL::new(schema.clone(), engine.clone()).graphiql_query(GRAPHIQL_QUERY);
    let router = Router::new()
        .route_service("/graphql", graphql.clone())
        .route_layer(limiter)
        // GraphiQL's own scripts and styles: never rate limited.
        .route_service("/graphql/graphiql/{file}", graphql)
        .route("/metrics", get(move || async move { render() }))
        .route("/healthz", get(|| async { "ok" }))
        // A CORS preflight is answered before the rate limiter.
        .layer(tower::util::option_layer(cors_layer(&engine.config().http)))
        // Outermost: a request naming another host is answered by nothing else.
        .layer(HostCheckLayer::new(engine.clone()));
    Gateway {
        router,
        engine,
        schema,
        shared,
        tag_polls,
    }
}
