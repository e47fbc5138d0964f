//! Shared limits on Redis: the per-IP limit and the per-host caps, for the
//! whole fleet of replicas.
//!
//! - **Connection.** One [`RedisBackend`] holds a `redis::aio::ConnectionManager`
//!   (multiplexed, reconnecting), connected lazily: a Redis that is down at
//!   start-up does not stop start-up. Every call is bounded by `timeout_ms`.
//! - **Breaker** (`src/backends/breaker.rs`). A failed or timed-out call
//!   opens it: for at least `backoff_ms`, calls skip Redis and `failure_mode`
//!   applies at once — no `timeout_ms` paid, connection refused included. One
//!   background probe (`TIME`) per `backoff_ms` closes it again; each change is
//!   logged once. A probe still timing out `lease_ms` after the breaker opened
//!   drops the connection, so a silently dead one is replaced (by then no lease
//!   it carried is live).
//! - **Redis time, not wall clocks.** Each reply carries Redis `TIME`; that
//!   time minus the local (monotonic, tokio) instant the reply arrived is a
//!   lower bound of the offset between the two clocks, since the script ran
//!   before its reply arrived. A call's local deadline plus that offset is a
//!   deadline on Redis's clock never later than the real one, so clock skew
//!   between replicas and Redis does not matter; only drift between two replies
//!   does (microseconds), and a step of Redis's clock is corrected by the next
//!   reply (the token below covers the gap).
//! - **Per-IP limit** ([`RedisRateLimiter`]): GCRA in one Lua script per check
//!   (`EVALSHA`), time from `TIME`, keys that expire when indistinguishable
//!   from fresh. A check Redis runs after its deadline (queued while Redis
//!   hung) is not charged. One it runs just in time but whose answer arrives
//!   too late costs that client one token: accepted, it cannot be undone.
//! - **Per-host cap** ([`RedisHostCaps`], in `leases`): a read takes its
//!   process's own slot first (no network; it bounds a replica even with Redis
//!   down), then a cluster lease: one sorted-set member per read in flight,
//!   scored by lease expiry, renewed every `lease_ms / 3`. A timed-out or
//!   cancelled acquire does not keep a slot: the script refuses to run past its
//!   deadline, and the member id (the token) is chosen before the call, so a
//!   caller that gives up sends a bounded, fire-and-forget `ZREM` of it, which
//!   Redis runs right after an acquire it ran just in time (same connection).
//!   Renewal extends only a lease still present and unexpired; release is
//!   `ZREM`: neither resurrects one.
//!
//! **Outage.** A failed, slow or skipped call applies `failure_mode`: `"open"`
//! answers from the in-process limiter (counting
//! `fanout_shared_state_fallback_total`), `"closed"` refuses with
//! `UNAVAILABLE`.

mod leases;

pub use leases::RedisHostCaps;

use super::breaker::Breaker;
use crate::config::{FailureMode, RedisConfig};
use crate::error::Unavailable;
use crate::limiter::{Decision, InboundLimiter};
use futures::future::BoxFuture;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisResult, Script};
use std::future::Future;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// A shared Redis connection with a call timeout, a key prefix and a
/// circuit breaker.
///
/// ```
/// use fanout_budget::backends::redis::{RedisBackend, RedisHostCaps, RedisRateLimiter};
/// use fanout_budget::{Config, Engine, RateLimitLayer};
/// use std::num::NonZeroU32;
/// use std::sync::Arc;
///
/// let mut config = Config::default();
/// config.redis.url = "redis://127.0.0.1:6379".into();
/// // Nothing connects until the first check.
/// let redis = RedisBackend::new(&config.redis).unwrap();
/// let caps = RedisHostCaps::new(config.hosts.clone(), redis.clone());
/// let engine = Engine::builder(config.clone()).host_limiter(Arc::new(caps)).build();
/// let rpm = NonZeroU32::new(config.rate_limit.requests_per_minute).unwrap();
/// let mode = redis.failure_mode();
/// let limiter = RateLimitLayer::new(&config.rate_limit).shared(Arc::new(RedisRateLimiter::new(redis, rpm)), mode);
/// # drop((engine, limiter));
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    client: redis::Client,
    prefix: String,
    timeout: Duration,
    lease: Duration,
    mode: FailureMode,
    conn: tokio::sync::Mutex<Option<ConnectionManager>>,
    breaker: Arc<Breaker>,
    /// Local instants are measured from here.
    base: Instant,
    /// Redis `TIME` (µs) minus local µs since `base`, a lower bound; `UNKNOWN` before the first reply.
    offset_us: AtomicI64,
}

const UNKNOWN: i64 = i64::MIN;

/// How a call reaches Redis.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// A new check: skipped while the breaker is open; connects if needed.
    Call,
    /// The breaker's probe (and `PING`): always sent; connects if needed.
    Probe,
    /// For something already sent (renew, release, undo): always sent, on
    /// the current connection only.
    FollowUp,
}

/// A call that gave no answer.
pub(crate) struct Failure {
    /// Whether Redis may have received it (and may still run it).
    pub(crate) sent: bool,
    pub(crate) error: Unavailable,
}

impl From<Failure> for Unavailable {
    fn from(failure: Failure) -> Self {
        failure.error
    }
}

fn down(err: impl std::fmt::Display) -> Unavailable {
    Unavailable {
        message: format!("redis: {err}"),
    }
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("prefix", &self.inner.prefix)
            .field("open", &self.is_open())
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// A backend for `[redis]`; nothing is connected yet.
    pub fn new(config: &RedisConfig) -> Result<Self, Unavailable> {
        let client = redis::Client::open(config.url.as_str()).map_err(down)?;
        Ok(Self {
            inner: Arc::new(Inner {
                client,
                prefix: config.key_prefix.clone(),
                timeout: Duration::from_millis(config.timeout_ms),
                lease: Duration::from_millis(config.lease_ms),
                mode: config.failure_mode,
                conn: tokio::sync::Mutex::new(None),
                breaker: Arc::new(Breaker::new(Duration::from_millis(config.backoff_ms))),
                base: Instant::now(),
                offset_us: AtomicI64::new(UNKNOWN),
            }),
        })
    }

    /// The configured failure mode.
    pub fn failure_mode(&self) -> FailureMode {
        self.inner.mode
    }

    /// `<prefix>:<kind>:<name>`
    pub(crate) fn key(&self, kind: &str, name: &str) -> String {
        format!("{}:{kind}:{name}", self.inner.prefix)
    }

    /// Whether the breaker is open: checks skip Redis (and `failure_mode`
    /// applies) until a background probe succeeds.
    pub fn is_open(&self) -> bool {
        self.inner.breaker.is_open()
    }

    /// Redis calls that failed or timed out since this backend was made.
    pub fn failed_calls(&self) -> u64 {
        self.inner.breaker.failures()
    }

    /// A local deadline `timeout_ms` from now, and the same instant on
    /// Redis's clock (µs; 0, "none", before Redis has answered once).
    pub(crate) fn deadline(&self) -> (Instant, i64) {
        let local = Instant::now() + self.inner.timeout;
        let offset = self.inner.offset_us.load(Relaxed);
        let redis = if offset == UNKNOWN {
            0
        } else {
            self.micros(local) + offset
        };
        (local, redis)
    }

    fn micros(&self, at: Instant) -> i64 {
        at.saturating_duration_since(self.inner.base).as_micros() as i64
    }

    /// Learns the clock offset from a reply's Redis time (µs), received now.
    pub(crate) fn observe(&self, redis_us: i64) {
        let offset = redis_us - self.micros(Instant::now());
        self.inner.offset_us.store(offset, Relaxed);
    }

    /// The connection, made if `route` may make one. `Err(None)`: skipped.
    async fn connection(&self, route: Route) -> Result<ConnectionManager, Option<Unavailable>> {
        let mut conn = self.inner.conn.lock().await;
        if let Some(c) = conn.as_ref() {
            return Ok(c.clone());
        }
        match route {
            Route::FollowUp => return Err(Some(down("not connected"))),
            // Another caller's attempt just failed while this one waited.
            Route::Call if self.is_open() => return Err(None),
            _ => {}
        }
        // No retries inside: the breaker paces reconnection.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(self.inner.timeout)
            .set_number_of_retries(0);
        let mut manager = self
            .inner
            .client
            .get_connection_manager_with_config(config)
            .await
            .map_err(|e| Some(down(e)))?;
        let (secs, micros): (i64, i64) = redis::cmd("TIME")
            .query_async(&mut manager)
            .await
            .map_err(|e| Some(down(e)))?;
        self.observe(secs * 1_000_000 + micros);
        *conn = Some(manager.clone());
        Ok(manager)
    }

    /// Runs `f` on the connection by `route`, bounded by `deadline`; a
    /// failure or timeout opens the breaker.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        route: Route,
        deadline: Instant,
        f: F,
    ) -> Result<T, Failure>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let skipped = || Failure {
            sent: false,
            error: down("skipped after a failed call (backoff)"),
        };
        if route == Route::Call && self.is_open() {
            return Err(skipped());
        }
        let attempt = async {
            let conn = self.connection(route).await.map_err(|e| (false, e))?;
            f(conn).await.map_err(|e| (true, Some(down(e))))
        };
        let (sent, error) = match tokio::time::timeout_at(deadline, attempt).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err((_, None))) => return Err(skipped()),
            Ok(Err((sent, Some(error)))) => (sent, error),
            Err(_) => (true, down("call timed out")),
        };
        self.trip(&error);
        Err(Failure { sent, error })
    }

    fn trip(&self, error: &Unavailable) {
        let backend = Arc::downgrade(&self.inner);
        let opened = Instant::now();
        self.inner.breaker.trip(error, move || {
            let backend = backend.upgrade().map(|inner| RedisBackend { inner });
            async move {
                match backend {
                    Some(backend) => backend.probe(opened).await,
                    None => Err(down("backend dropped")),
                }
            }
        });
    }

    /// One probe: `TIME`. Still timing out `lease_ms` after the breaker
    /// opened, the connection is dropped and the next probe makes a new one.
    async fn probe(&self, opened: Instant) -> Result<(), Unavailable> {
        let (deadline, _) = self.deadline();
        let time = self.call(Route::Probe, deadline, |mut conn| async move {
            redis::cmd("TIME")
                .query_async::<(i64, i64)>(&mut conn)
                .await
        });
        match time.await {
            Ok((secs, micros)) => {
                self.observe(secs * 1_000_000 + micros);
                Ok(())
            }
            Err(failure) => {
                if opened.elapsed() >= self.inner.lease {
                    *self.inner.conn.lock().await = None;
                }
                Err(failure.error)
            }
        }
    }

    /// Runs `script` on `key` with an optional string argument first, then
    /// `ints`, by `route`, bounded by `deadline`.
    pub(crate) async fn script<T: redis::FromRedisValue>(
        &self,
        route: Route,
        deadline: Instant,
        script: &Script,
        key: &str,
        holder: Option<&str>,
        ints: &[i64],
    ) -> Result<T, Failure> {
        self.call(route, deadline, |mut conn| async move {
            let mut invocation = script.prepare_invoke();
            invocation.key(key);
            if let Some(holder) = holder {
                invocation.arg(holder);
            }
            for arg in ints {
                invocation.arg(*arg);
            }
            invocation.invoke_async(&mut conn).await
        })
        .await
    }

    /// `PING`, bounded by the call timeout (a health check and the benchmark
    /// floor). Sent even while the breaker is open; a failure opens it.
    pub async fn ping(&self) -> Result<(), Unavailable> {
        let (deadline, _) = self.deadline();
        self.call(Route::Probe, deadline, |mut conn| async move {
            redis::cmd("PING").query_async::<String>(&mut conn).await
        })
        .await?;
        Ok(())
    }

    /// Removes `member` from the sorted set `key`, in the background, bounded
    /// by `lease_ms` (after which a lease has expired anyway).
    pub(crate) fn forget(&self, key: String, member: String) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let backend = self.clone();
        runtime.spawn(async move {
            let deadline = Instant::now() + backend.inner.lease;
            let removed = backend.call(Route::FollowUp, deadline, |mut conn| async move {
                redis::cmd("ZREM")
                    .arg(&key)
                    .arg(&member)
                    .query_async::<i64>(&mut conn)
                    .await
            });
            if let Err(failure) = removed.await {
                tracing::debug!(error = %failure.error, "could not remove a host lease");
            }
        });
    }
}

/// GCRA: KEYS[1] the key; ARGV[1] emission interval (µs), ARGV[2] burst,
/// ARGV[3] deadline (µs on Redis's clock; 0: none).
/// Returns {allowed, remaining, wait_us, now_us}: for an admitted request, the
/// time until the quota is whole again; for a refused one, until the next
/// admission; allowed = -1, nothing charged, past the deadline.
const GCRA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local deadline = tonumber(ARGV[3])
if deadline > 0 and now > deadline then
  return {-1, 0, 0, now}
end
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local tolerance = interval * (burst - 1)
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
if now < tat - tolerance then
  return {0, 0, tat - tolerance - now, now}
end
local new_tat = tat + interval
redis.call('SET', KEYS[1], new_tat, 'PX', math.ceil((new_tat - now) / 1000) + 1)
local remaining = math.floor((now + tolerance - (new_tat - interval)) / interval)
return {1, remaining, new_tat - now, now}
"#;

/// The per-IP limit on Redis.
#[derive(Debug)]
pub struct RedisRateLimiter {
    backend: RedisBackend,
    script: Script,
    interval_us: i64,
    burst: i64,
}

impl RedisRateLimiter {
    /// `requests_per_minute` per key, shared by every replica on `backend`.
    pub fn new(backend: RedisBackend, requests_per_minute: NonZeroU32) -> Self {
        Self {
            backend,
            script: Script::new(GCRA),
            interval_us: 60_000_000 / i64::from(requests_per_minute.get()),
            burst: i64::from(requests_per_minute.get()),
        }
    }
}

impl InboundLimiter for RedisRateLimiter {
    fn check(&self, key: IpAddr) -> BoxFuture<'_, Result<Decision, Unavailable>> {
        Box::pin(async move {
            let key = self.backend.key("ip", &key.to_string());
            let (deadline, redis_deadline) = self.backend.deadline();
            let args = [self.interval_us, self.burst, redis_deadline];
            let (allowed, remaining, wait_us, now_us): (i64, i64, i64, i64) = self
                .backend
                .script(Route::Call, deadline, &self.script, &key, None, &args)
                .await?;
            self.backend.observe(now_us);
            let wait = Duration::from_micros(wait_us.max(0) as u64);
            Ok(match allowed {
                1 => Decision::Allow {
                    remaining: remaining.max(0) as u32,
                    reset: wait,
                },
                0 => Decision::Deny { retry_after: wait },
                _ => return Err(down("the check ran after its deadline")),
            })
        })
    }
}
