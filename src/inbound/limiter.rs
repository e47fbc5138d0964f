//! The inbound limiter: requests per minute per client IP, with identity.
//!
//! [`RateLimitLayer`] is a config-only `tower::Layer`; its [`RateLimitService`]
//! does, per inbound request:
//!
//! 1. **Identity first.** A caller presenting the exact internal token
//!    ([`crate::inbound::identity`]) is exempt: it is not counted, and it is marked
//!    [`Caller::Internal`] in the request's extensions (the HTTP integration
//!    then gives it `internal_max_reads`). A *wrong* token makes an ordinary
//!    caller — counted and limited exactly like one without a token.
//! 2. **The key** is the client IP: the TCP peer (axum's `ConnectInfo`), or,
//!    behind a trusted proxy, the rightmost untrusted `X-Forwarded-For` entry
//!    — masked to `ipv4_prefix` / `ipv6_prefix` bits ([`ClientPrefix`]), so a
//!    client rotating addresses inside its IPv6 /64 is one key. A decisive
//!    forwarded entry that is not an address is 400 `BAD_REQUEST`, charged to
//!    no one ([`crate::inbound::identity`]).
//! 3. **The check** is GCRA (the `governor` crate, its keyed `DashMap`
//!    store as it is, hashed by foldhash under random seeds (`seed.rs`) —
//!    client addresses are chosen by clients) with a burst of `requests_per_minute`,
//!    refilled evenly over the minute. Idle keys are evicted
//!    (`retain_recent`) every `max(SWEEP_EVERY, 2 × keys left)` checks, so a
//!    flood of distinct addresses cannot grow memory without bound and the
//!    sweep's cost stays constant per check however many keys are held.
//! 4. **The answer**: over the limit, 429 `RATE_LIMITED` with `Retry-After`
//!    (whole seconds, at least 1) and the IETF `RateLimit-Policy` /
//!    `RateLimit` fields; otherwise the inner service's answer, with
//!    `RateLimit` added. Every refusal here (429, 400, 503) leaves the body
//!    unread, so it carries `Connection: close`
//!    ([`Rejection::unread`]).
//!
//! A shared backend (Redis) plugs in through [`InboundLimiter`]; while it is
//! down, `failure_mode` decides between an in-process limit ("open") and
//! 503 `UNAVAILABLE` ("closed"). The in-process limit never starts a
//! client afresh: it starts from what the shared limiter last heard of it
//! ([`InboundLimiter::last_known`]: when its quota is whole again), or, for
//! a client the shared limiter never heard of, from half its limit — so a
//! fleet that falls back does not hand each client a whole minute's
//! requests again on every replica.

use crate::config::{FailureMode, LimitMode, RateLimitConfig};
use crate::error::{Rejection, Unavailable};
use crate::inbound::identity::{Caller, ClientPrefix, InternalToken, TokenCheck, TrustedProxies};
use crate::inbound::quota::{LocalQuotas, QuotaClass, Rate, Verdict};
use crate::metrics;
use crate::seed::random_state;
use axum::extract::ConnectInfo;
use clock::TokioNanos;
use foldhash::fast::SeedableRandomState;
use futures::future::BoxFuture;
use governor::clock::Clock as GovernorClock;
use governor::middleware::StateInformationMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};
use http::{HeaderName, HeaderValue, Request, Response};
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

mod clock;
#[cfg(test)]
mod tests;

/// Idle keys are swept at least this many checks apart (more when many keys
/// stay live, so the sweep costs O(1) per check) — the read quota's store
/// sweeps on the same rule.
pub(crate) use crate::inbound::quota::SWEEP_EVERY;

/// A limiter's verdict on one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Admitted; `remaining` more would be admitted now, and the quota is
    /// whole again after `reset`.
    Allow {
        /// Requests that would still be admitted right now.
        remaining: u32,
        /// Time until the full quota is available again.
        reset: Duration,
    },
    /// Refused; the next request would be admitted after `retry_after`.
    Deny {
        /// Time until a request would be admitted.
        retry_after: Duration,
    },
}

/// A shared (cross-replica) per-key limiter.
///
/// ```
/// use fanout_budget::{error::Unavailable, inbound::{Decision, InboundLimiter}};
/// use futures::future::BoxFuture;
/// use std::net::IpAddr;
///
/// /// Admits everyone (a stand-in for a shared store).
/// #[derive(Debug)]
/// struct Open;
///
/// impl InboundLimiter for Open {
///     fn check(&self, _key: IpAddr) -> BoxFuture<'_, Result<Decision, Unavailable>> {
///         let allow = Decision::Allow { remaining: 1, reset: std::time::Duration::ZERO };
///         Box::pin(async move { Ok(allow) })
///     }
/// }
/// ```
pub trait InboundLimiter: Send + Sync + 'static {
    /// Checks and counts one request for `key` (a client address masked to
    /// its `ipv4_prefix` / `ipv6_prefix`). `Err` means the backend is
    /// unreachable (the caller applies `failure_mode`).
    fn check(&self, key: IpAddr) -> BoxFuture<'_, Result<Decision, Unavailable>>;

    /// What this limiter last heard of `key`: the time from now until its
    /// quota is whole again, as the last answer said (zero: whole by now);
    /// `None`: never heard of it. The fallback starts from it.
    fn last_known(&self, key: IpAddr) -> Option<Duration> {
        let _ = key;
        None
    }
}

type Gcra<C> = RateLimiter<
    IpAddr,
    DashMapStateStore<IpAddr, SeedableRandomState>,
    C,
    StateInformationMiddleware,
>;

/// The in-process GCRA limiter (governor), keyed by client IP.
pub(crate) struct LocalLimiter<C: GovernorClock = TokioNanos> {
    gcra: Gcra<C>,
    clock: C,
    limit: u32,
    /// The replenish interval in ns (`limit` of them make at most a minute).
    interval_ns: u64,
    /// Checks left before the next idle-key sweep.
    until_sweep: AtomicU64,
}

impl LocalLimiter<TokioNanos> {
    /// `requests_per_minute` per key, on tokio's clock.
    pub(crate) fn per_minute(requests_per_minute: NonZeroU32) -> Self {
        Self::with_clock(requests_per_minute, TokioNanos::new())
    }
}

impl<C: GovernorClock + Clone> LocalLimiter<C> {
    /// `requests_per_minute` per key, on `clock` (tests use governor's
    /// `FakeRelativeClock`).
    pub(crate) fn with_clock(requests_per_minute: NonZeroU32, clock: C) -> Self {
        let quota = Quota::per_minute(requests_per_minute);
        let store = DashMapStateStore::with_hasher(random_state());
        Self {
            gcra: RateLimiter::new(quota, store, clock.clone()),
            clock,
            limit: requests_per_minute.get(),
            interval_ns: quota.replenish_interval().as_nanos() as u64,
            until_sweep: AtomicU64::new(SWEEP_EVERY),
        }
    }

    /// Checks and counts one request for `key`.
    pub(crate) fn check(&self, key: IpAddr) -> Decision {
        let outcome = self.gcra.check_key(&key);
        let due = self.until_sweep.fetch_sub(1, Relaxed) == 1;
        if due {
            // One caller sweeps; the next sweep is paced by the keys left.
            self.sweep();
            let gap = SWEEP_EVERY.max(2 * self.len() as u64);
            self.until_sweep.store(gap, Relaxed);
        }
        match outcome {
            Ok(state) => {
                let remaining = state.remaining_burst_capacity();
                Decision::Allow {
                    remaining,
                    // At most `limit` intervals: a minute, no overflow.
                    reset: Duration::from_nanos(
                        self.interval_ns * u64::from(self.limit - remaining.min(self.limit)),
                    ),
                }
            }
            Err(not_until) => Decision::Deny {
                retry_after: not_until.wait_time_from(self.clock.now()),
            },
        }
    }

    /// Forgets every key whose state is indistinguishable from a fresh one.
    pub(crate) fn sweep(&self) {
        self.gcra.retain_recent();
        self.gcra.shrink_to_fit();
    }

    /// Keys currently held.
    pub(crate) fn len(&self) -> usize {
        self.gcra.len()
    }
}

impl<C: GovernorClock> std::fmt::Debug for LocalLimiter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalLimiter")
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

/// Which limiter checks public callers.
#[derive(Clone)]
enum Backend {
    Local(Arc<LocalLimiter>),
    Shared {
        shared: Arc<dyn InboundLimiter>,
        fallback: Arc<Fallback>,
        mode: FailureMode,
    },
}

/// The in-process limit a shared limiter falls back to ("open"): the same
/// GCRA as a bucket of `requests_per_minute` per client, kept by the read
/// quota's in-process store, whose fallback never starts a client afresh —
/// from what the shared limiter last heard of it, or half its limit for a
/// client it never heard of (`inbound/quota/local.rs`).
#[derive(Debug)]
struct Fallback(LocalQuotas);

impl Fallback {
    fn per_minute(requests_per_minute: u32) -> Self {
        let rate = Rate::new(u64::from(requests_per_minute), Duration::from_secs(60), 0);
        Self(LocalQuotas::new(Some(rate), None))
    }

    /// Checks and counts one request for `key`, from `last_known` (see
    /// [`InboundLimiter::last_known`]).
    fn check(&self, key: IpAddr, last_known: Option<Duration>) -> Decision {
        let public = QuotaClass::Public;
        match self.0.reserve_fallback(public, key, 1, last_known) {
            Verdict::Reserved { remaining, full_in } => Decision::Allow {
                remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
                reset: full_in,
            },
            Verdict::Refused { retry_after, .. } => Decision::Deny { retry_after },
        }
    }
}

/// The inbound limiter as a `tower::Layer` (configuration only).
///
/// Serve the app with connect info (as [`serve`](crate::inbound::serve) does), so
/// the limiter keys by the TCP peer:
///
/// ```
/// use fanout_budget::{Config, inbound::RateLimitLayer};
///
/// let config = Config::default();
/// let app: axum::Router = axum::Router::new()
///     .route("/graphql", axum::routing::post(|| async { "ok" }))
///     .route_layer(RateLimitLayer::new(&config.rate_limit));
/// # drop(app);
/// ```
#[derive(Clone)]
pub struct RateLimitLayer {
    backend: Backend,
    token: InternalToken,
    proxies: Arc<TrustedProxies>,
    prefix: ClientPrefix,
    limit: u32,
    policy_header: HeaderValue,
    /// `rate_limit.mode`: refuse, or only count.
    mode: LimitMode,
    /// Its decisions' metrics, shared by its clones.
    metrics: Arc<metrics::LimiterMetrics>,
}

impl RateLimitLayer {
    /// The in-process limiter for `[rate_limit]`.
    pub fn new(config: &RateLimitConfig) -> Self {
        let rpm = NonZeroU32::new(config.requests_per_minute).unwrap_or(NonZeroU32::MIN);
        Self {
            backend: Backend::Local(Arc::new(LocalLimiter::per_minute(rpm))),
            token: InternalToken::new(&config.internal_token),
            proxies: Arc::new(TrustedProxies::new(&config.trusted_proxies)),
            prefix: ClientPrefix::new(config.ipv4_prefix, config.ipv6_prefix),
            limit: rpm.get(),
            policy_header: HeaderValue::from_str(&policy(rpm.get())).expect("the policy is ASCII"),
            mode: config.mode,
            metrics: Arc::default(),
        }
    }

    /// Refuses past the rate (`LimitMode::Enforce`, the default), or lets
    /// every request through and counts those it would have refused
    /// (`LimitMode::Measure`: `fanout_would_refuse_total{limit="rate_limit"}`
    /// and a log line, at most one a second, naming the client).
    pub fn mode(mut self, mode: LimitMode) -> Self {
        self.mode = mode;
        self
    }

    /// Checks public callers on `shared` (e.g. Redis); while it is down,
    /// `mode` falls back to the in-process limiter or answers 503.
    pub fn shared(mut self, shared: Arc<dyn InboundLimiter>, mode: FailureMode) -> Self {
        let fallback = match self.backend {
            Backend::Local(_) => Arc::new(Fallback::per_minute(self.limit)),
            Backend::Shared { fallback, .. } => fallback,
        };
        self.backend = Backend::Shared {
            shared,
            fallback,
            mode,
        };
        self
    }

    /// The IETF `RateLimit-Policy` value for this limit.
    pub fn policy(&self) -> String {
        policy(self.limit)
    }
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Local(_) => f.write_str("Local"),
            Self::Shared { mode, .. } => write!(f, "Shared({mode:?})"),
        }
    }
}

impl std::fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("backend", &self.backend)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimitService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService {
            inner,
            layer: Arc::new(self.clone()),
        }
    }
}

/// The inbound limiter in front of a service.
#[derive(Clone, Debug)]
pub struct RateLimitService<S> {
    inner: S,
    // Shared: each request's future holds it, for one reference count.
    layer: Arc<RateLimitLayer>,
}

impl<S, B> tower::Service<Request<B>> for RateLimitService<S>
where
    S: tower::Service<Request<B>, Response = axum::response::Response> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = axum::response::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        // The clone is ready (`poll_ready` ran on `self.inner`); keep it.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        Box::pin(async move {
            match layer.token.check(request.headers()) {
                TokenCheck::Valid => {
                    layer.metrics.exempt();
                    request.extensions_mut().insert(Caller::Internal);
                    return inner.call(request).await;
                }
                TokenCheck::Wrong => layer.metrics.wrong_internal_token(),
                TokenCheck::Absent => {}
            }
            request.extensions_mut().insert(Caller::Public);
            // Without the TCP peer every client would share one bucket:
            // refuse loudly instead (the app is served without connect info).
            let Some(peer) = request
                .extensions()
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0.ip())
            else {
                static LOGGED: std::sync::Once = std::sync::Once::new();
                LOGGED.call_once(|| tracing::error!("{NO_PEER}"));
                let refused = Rejection::Misconfigured {
                    message: NO_PEER.into(),
                };
                return Ok(refused.unread());
            };
            let client = match layer.proxies.client_ip(peer, request.headers()) {
                Ok(ip) => layer.prefix.key(ip),
                Err(unparsable) => {
                    let refused = Rejection::BadRequest {
                        message: unparsable.to_string(),
                    };
                    return Ok(refused.unread());
                }
            };
            let decision = match layer.decide(client).await {
                Ok(decision) => decision,
                Err(unavailable) => return Ok(unavailable.unread()),
            };
            let decision = match decision {
                Decision::Deny { retry_after } if layer.mode.measures() => {
                    metrics::would_refuse("rate_limit", &client, 1);
                    Decision::Allow {
                        remaining: 0,
                        reset: retry_after,
                    }
                }
                decision => decision,
            };
            match decision {
                Decision::Deny { retry_after } => {
                    layer.metrics.rate_limited();
                    let secs = whole_seconds(retry_after);
                    let refused = Rejection::RateLimited {
                        retry_after_secs: secs,
                    };
                    let mut response = refused.unread();
                    layer.headers(&mut response, 0, secs);
                    Ok(response)
                }
                Decision::Allow { remaining, reset } => {
                    // A WebSocket: each operation it starts is a request of
                    // this client's too (`graphql/socket/driver.rs`).
                    if request.headers().contains_key(http::header::UPGRADE) {
                        let limit = SocketLimit {
                            layer: layer.clone(),
                            client,
                        };
                        request.extensions_mut().insert(limit);
                    }
                    let mut response = inner.call(request).await?;
                    layer.headers(&mut response, remaining, ceil_seconds(reset));
                    Ok(response)
                }
            }
        })
    }
}

impl RateLimitLayer {
    async fn decide(&self, client: IpAddr) -> Result<Decision, Rejection> {
        match &self.backend {
            Backend::Local(local) => Ok(local.check(client)),
            Backend::Shared {
                shared,
                fallback,
                mode,
            } => match shared.check(client).await {
                Ok(decision) => Ok(decision),
                Err(err) => match mode {
                    FailureMode::Open => {
                        metrics::shared_state_fallback("rate_limit");
                        // The backend's breaker logs the outage once; this is per check.
                        tracing::debug!(error = %err, "shared rate limiter down; limiting in-process");
                        Ok(fallback.check(client, shared.last_known(client)))
                    }
                    FailureMode::Closed => Err(Rejection::Unavailable {
                        message: "the shared rate limiter is unreachable".into(),
                    }),
                },
            },
        }
    }

    /// `RateLimit: "per-ip";r=<remaining>;t=<seconds>` and the policy.
    fn headers<B>(&self, response: &mut Response<B>, remaining: u32, reset_secs: u64) {
        let headers = response.headers_mut();
        let value = format!("\"per-ip\";r={remaining};t={reset_secs}");
        // Appended: the answer may carry the read quota's fields already
        // (`inbound/quota.rs`), one list item per policy.
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.append(RATELIMIT, v);
        }
        headers.append(RATELIMIT_POLICY, self.policy_header.clone());
    }
}

/// Why a request without its TCP peer is refused.
const NO_PEER: &str = "RateLimitLayer needs each request's TCP peer: serve the app with \
    fanout_budget::inbound::serve, or axum's into_make_service_with_connect_info::<SocketAddr>()";

/// The IETF `RateLimit` field.
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// The IETF `RateLimit-Policy` field.
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

fn policy(limit: u32) -> String {
    format!("\"per-ip\";q={limit};w=60")
}

fn ceil_seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The per-IP limit of a public client's WebSocket, left in the upgrade
/// request's extensions: every operation the socket starts (a subscribe)
/// is checked and counted as one request of the client, so a socket is no
/// way around the limit.
#[derive(Clone)]
pub(crate) struct SocketLimit {
    layer: Arc<RateLimitLayer>,
    client: IpAddr,
}

impl std::fmt::Debug for SocketLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketLimit")
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

impl SocketLimit {
    /// Counts one operation; `Err`: refused (`RATE_LIMITED`, or the shared
    /// limiter down with `failure_mode = "closed"`).
    pub(crate) async fn check(&self) -> Result<(), Rejection> {
        match self.layer.decide(self.client).await? {
            Decision::Allow { .. } => Ok(()),
            Decision::Deny { .. } if self.layer.mode.measures() => {
                metrics::would_refuse("rate_limit", &self.client, 1);
                Ok(())
            }
            Decision::Deny { retry_after } => {
                self.layer.metrics.rate_limited();
                Err(Rejection::RateLimited {
                    retry_after_secs: whole_seconds(retry_after),
                })
            }
        }
    }
}

/// `Retry-After` is whole seconds, at least 1.
fn whole_seconds(d: Duration) -> u64 {
    ceil_seconds(d).max(1)
}
