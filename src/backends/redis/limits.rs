//! [`SharedLimits`]: every limit a process keeps on Redis, on its one
//! [`RedisBackend`] — one connection per node, one breaker, one set of
//! clocks, an outage noticed and logged once.
//!
//! The limits are made once, when the process starts, and each is handed to
//! the seam that takes it: the per-host caps to the engine
//! ([`EngineBuilder::host_limiter`](crate::EngineBuilder::host_limiter)),
//! the per-IP limit to the inbound layer
//! ([`RateLimitLayer::shared`](crate::inbound::RateLimitLayer::shared)),
//! the upstreams' quota gates and the clients' read quotas to the engine
//! ([`EngineBuilder::quota_board`](crate::EngineBuilder::quota_board),
//! [`EngineBuilder::quota_store`](crate::EngineBuilder::quota_store)).
//! A limit added later is one more field made here on the same backend and
//! one more method.

use super::backend::RedisBackend;
use super::quotas::{RedisQuotaBoard, SharedQuotaBoard};
use super::rate::RedisRateLimiter;
use super::read_quota::RedisReadQuota;
use super::shares::RedisHostCaps;
use crate::config::Config;
use crate::error::Unavailable;
use crate::inbound::quota::QuotaStore;
use crate::inbound::{InboundLimiter, RateLimitLayer};
use std::num::NonZeroU32;
use std::sync::Arc;

/// The limits of one process shared with its fleet on Redis, all on one
/// backend.
///
/// ```
/// use fanout_budget::backends::redis::SharedLimits;
/// use fanout_budget::{Config, Engine};
///
/// let mut config = Config::default();
/// config.redis.url = "redis://127.0.0.1:6379".into();
/// // Or a cluster, by its seed nodes:
/// // config.redis.cluster_nodes = vec!["redis://10.0.0.1:6379".into(), "redis://10.0.0.2:6379".into()];
/// // Nothing connects until the first check; `None` without `[redis]`.
/// let shared = SharedLimits::open(&config).unwrap().expect("[redis] is set");
/// let mut engine = Engine::builder(config.clone())
///     .host_limiter(shared.host_limiter())
///     .quota_board(shared.quota_board());
/// // With `[quota]`, the clients' read quotas too.
/// if let Some(store) = shared.quota_store() {
///     engine = engine.quota_store(store);
/// }
/// let engine = engine.build();
/// let app: axum::Router = axum::Router::new()
///     .route("/graphql", axum::routing::post(|| async { "ok" }))
///     .route_layer(shared.rate_limit_layer());
/// # drop((engine, app));
/// ```
#[derive(Clone, Debug)]
pub struct SharedLimits {
    backend: RedisBackend,
    host_caps: Arc<RedisHostCaps>,
    /// The per-IP limit on Redis, its in-process fallback inside.
    per_ip: RateLimitLayer,
    /// The upstreams' quota gates.
    quotas: SharedQuotaBoard,
    /// The clients' read quotas; `None` without `[quota]`.
    read_quota: Option<Arc<RedisReadQuota>>,
}

impl SharedLimits {
    /// The shared limits for `config` on a new backend for its `[redis]`
    /// (`url`, or `cluster_nodes`); `Ok(None)` when `[redis]` sets neither:
    /// the limits stay in-process. Nothing connects until the first check,
    /// so a Redis that is down does not stop start-up.
    pub fn open(config: &Config) -> Result<Option<Self>, Unavailable> {
        if !config.redis.is_enabled() {
            return Ok(None);
        }
        Ok(Some(Self::on(RedisBackend::new(&config.redis)?, config)))
    }

    /// The shared limits for `config` (`[hosts]`, `[rate_limit]`,
    /// `[quota]`) on `backend`.
    pub fn on(backend: RedisBackend, config: &Config) -> Self {
        let rpm = NonZeroU32::new(config.rate_limit.requests_per_minute).unwrap_or(NonZeroU32::MIN);
        let per_ip: Arc<dyn InboundLimiter> = Arc::new(RedisRateLimiter::new(backend.clone(), rpm));
        Self {
            host_caps: Arc::new(RedisHostCaps::new(config.hosts.clone(), backend.clone())),
            per_ip: RateLimitLayer::new(&config.rate_limit).shared(per_ip, backend.failure_mode()),
            quotas: SharedQuotaBoard(Arc::new(RedisQuotaBoard::new(backend.clone()))),
            read_quota: RedisReadQuota::from_config(backend.clone(), &config.quota).map(Arc::new),
            backend,
        }
    }

    /// The backend every limit here is on: its breaker, its counts.
    pub fn backend(&self) -> &RedisBackend {
        &self.backend
    }

    /// The per-host caps, for
    /// [`EngineBuilder::host_limiter`](crate::EngineBuilder::host_limiter).
    pub fn host_limiter(&self) -> Arc<RedisHostCaps> {
        self.host_caps.clone()
    }

    /// The upstreams' quota gates, for
    /// [`EngineBuilder::quota_board`](crate::EngineBuilder::quota_board): a
    /// host that says its quota is spent to one replica is refused on all.
    pub fn quota_board(&self) -> Arc<dyn crate::read::QuotaBoard> {
        Arc::new(self.quotas.clone())
    }

    /// The clients' read quotas (`[quota]`), for
    /// [`EngineBuilder::quota_store`](crate::EngineBuilder::quota_store):
    /// a client's reads are bounded across the fleet; `None` when no class
    /// of caller has a quota.
    pub fn quota_store(&self) -> Option<Arc<dyn QuotaStore>> {
        self.read_quota
            .clone()
            .map(|store| store as Arc<dyn QuotaStore>)
    }

    /// The read quotas as their own type (for tests: how many clients this
    /// replica keeps, what it holds for one).
    #[doc(hidden)]
    pub fn read_quota(&self) -> Option<Arc<RedisReadQuota>> {
        self.read_quota.clone()
    }

    /// The per-IP limit, as the inbound layer: checked on Redis, and while
    /// Redis is down, `failure_mode` (the in-process limiter or a 503).
    pub fn rate_limit_layer(&self) -> RateLimitLayer {
        self.per_ip.clone()
    }
}
