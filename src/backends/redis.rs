//! Shared limits on Redis: the per-IP limit and the per-host caps, for the
//! whole fleet of replicas.
//!
//! - **Connection.** One [`RedisBackend`] holds a `redis::aio::ConnectionManager`
//!   (multiplexed, reconnecting). It connects lazily: a Redis that is down at
//!   start-up does not stop start-up; while it stays down, a connection attempt
//!   is made at most once per `RECONNECT_EVERY`, and every call fails fast. Every
//!   call is bounded by `timeout_ms`.
//! - **Per-IP limit** ([`RedisRateLimiter`]): GCRA in one Lua script per check
//!   (`EVALSHA`, falling back to `EVAL` once per script load), with time from
//!   Redis `TIME` so replicas' clocks do not matter; the key expires when its
//!   state is indistinguishable from fresh. One round trip per check.
//! - **Per-host cap** ([`RedisHostCaps`]): leased slots. A sorted set per host
//!   holds one member per read in flight, scored by its lease expiry. Acquire
//!   (Lua): purge expired leases, check the count, add. The lease is renewed
//!   while the read is in flight and removed when the slot is dropped, so a
//!   crashed replica's slots free up when their leases expire.
//!
//! **Local and cluster caps combine** local-first: a read first takes the
//! process's own slot (no network), then a cluster lease. The local cap bounds
//! a replica even when Redis is down; the cluster cap bounds the fleet. Both
//! use the host's `max_concurrent`.
//!
//! **Outage.** A failed or slow call applies `failure_mode`: `"open"` answers
//! from the in-process limiter (and counts `fanout_shared_state_fallback_total`,
//! and logs), `"closed"` refuses with `UNAVAILABLE`.

use crate::config::{FailureMode, HostConfig, RedisConfig};
use crate::error::FanoutError;
use crate::hosts::{HostCap, HostLimiter, HostSlot, LocalHostCaps};
use crate::limiter::{Decision, InboundLimiter};
use futures::future::BoxFuture;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// While Redis is down, a new connection is tried at most this often.
pub const RECONNECT_EVERY: Duration = Duration::from_millis(500);

/// A shared Redis connection with a call timeout and a key prefix.
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
    last_attempt: Mutex<Option<Instant>>,
}

fn down(err: impl std::fmt::Display) -> FanoutError {
    FanoutError::Unavailable {
        message: format!("redis: {err}"),
    }
}

impl RedisBackend {
    /// A backend for `[redis]`; nothing is connected yet.
    pub fn new(config: &RedisConfig) -> Result<Self, FanoutError> {
        let client = redis::Client::open(config.url.as_str()).map_err(down)?;
        Ok(Self {
            inner: Arc::new(Inner {
                client,
                prefix: config.key_prefix.clone(),
                timeout: Duration::from_millis(config.timeout_ms),
                lease: Duration::from_millis(config.lease_ms),
                mode: config.failure_mode,
                conn: tokio::sync::Mutex::new(None),
                last_attempt: Mutex::new(None),
            }),
        })
    }

    /// The configured failure mode.
    pub fn failure_mode(&self) -> FailureMode {
        self.inner.mode
    }

    /// `<prefix>:<kind>:<name>`
    pub fn key(&self, kind: &str, name: &str) -> String {
        format!("{}:{kind}:{name}", self.inner.prefix)
    }

    async fn connection(&self) -> Result<ConnectionManager, FanoutError> {
        let mut conn = self.inner.conn.lock().await;
        if let Some(c) = conn.as_ref() {
            return Ok(c.clone());
        }
        {
            let mut last = self
                .inner
                .last_attempt
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|at| at.elapsed() < RECONNECT_EVERY) {
                return Err(down("not connected"));
            }
            *last = Some(Instant::now());
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(self.inner.timeout)
            .set_response_timeout(self.inner.timeout)
            .set_number_of_retries(1)
            .set_max_delay(RECONNECT_EVERY.as_millis() as u64);
        let manager = tokio::time::timeout(
            self.inner.timeout * 2,
            self.inner.client.get_connection_manager_with_config(config),
        )
        .await
        .map_err(|_| down("connect timed out"))?
        .map_err(down)?;
        *conn = Some(manager.clone());
        Ok(manager)
    }

    /// Runs `script` on `key` with an optional string argument first, then
    /// `ints`, bounded by the call timeout.
    pub async fn invoke<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        key: &str,
        holder: Option<&str>,
        ints: &[i64],
    ) -> Result<T, FanoutError> {
        let mut conn = self.connection().await?;
        let mut invocation = script.prepare_invoke();
        invocation.key(key);
        if let Some(holder) = holder {
            invocation.arg(holder);
        }
        for arg in ints {
            invocation.arg(*arg);
        }
        match tokio::time::timeout(self.inner.timeout, invocation.invoke_async(&mut conn)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(down(err)),
            Err(_) => Err(down("call timed out")),
        }
    }

    /// `PING`, bounded by the call timeout (a health check and the benchmark floor).
    pub async fn ping(&self) -> Result<(), FanoutError> {
        let mut conn = self.connection().await?;
        let cmd = redis::cmd("PING");
        let ping = cmd.query_async::<String>(&mut conn);
        match tokio::time::timeout(self.inner.timeout, ping).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(err)) => Err(down(err)),
            Err(_) => Err(down("call timed out")),
        }
    }
}

/// GCRA: KEYS[1] the key; ARGV[1] emission interval (µs), ARGV[2] burst.
/// Returns {allowed, remaining, wait_us}: for an admitted request, the time
/// until the quota is whole again; for a refused one, until the next admission.
const GCRA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local tolerance = interval * (burst - 1)
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
if now < tat - tolerance then
  return {0, 0, tat - tolerance - now}
end
local new_tat = tat + interval
redis.call('SET', KEYS[1], new_tat, 'PX', math.ceil((new_tat - now) / 1000) + 1)
local remaining = math.floor((now + tolerance - (new_tat - interval)) / interval)
return {1, remaining, new_tat - now}
"#;

/// The per-IP limit on Redis.
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
    fn check(&self, key: IpAddr) -> BoxFuture<'_, Result<Decision, FanoutError>> {
        Box::pin(async move {
            let key = self.backend.key("ip", &key.to_string());
            let (allowed, remaining, wait_us): (i64, i64, i64) = self
                .backend
                .invoke(&self.script, &key, None, &[self.interval_us, self.burst])
                .await?;
            let wait = Duration::from_micros(wait_us.max(0) as u64);
            Ok(if allowed == 1 {
                Decision::Allow {
                    remaining: remaining.max(0) as u32,
                    reset: wait,
                }
            } else {
                Decision::Deny { retry_after: wait }
            })
        })
    }
}

/// KEYS[1] the host's set; ARGV: holder, cap, lease (ms). 1 if leased.
const ACQUIRE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], lease * 2)
  return 1
end
return 0
"#;

/// KEYS[1] the host's set; ARGV: holder, lease (ms). Extends a held lease.
const RENEW: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
redis.call('PEXPIRE', KEYS[1], lease * 2)
return redis.call('ZADD', KEYS[1], 'XX', 'CH', now + lease, ARGV[1])
"#;

/// KEYS[1] the host's set; ARGV[1] holder. Frees a lease.
const RELEASE: &str = "return redis.call('ZREM', KEYS[1], ARGV[1])";

/// Per-host caps held by the whole fleet: a local slot, then a cluster lease.
pub struct RedisHostCaps {
    local: LocalHostCaps,
    configured: BTreeMap<String, HostConfig>,
    backend: RedisBackend,
    scripts: Arc<[Script; 3]>,
    holder_prefix: String,
    next_holder: AtomicU64,
}

impl RedisHostCaps {
    /// Caps for the `[hosts]` tables, shared on `backend`.
    pub fn new(hosts: BTreeMap<String, HostConfig>, backend: RedisBackend) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Self {
            local: LocalHostCaps::new(hosts.clone()),
            configured: hosts,
            backend,
            scripts: Arc::new([
                Script::new(ACQUIRE),
                Script::new(RENEW),
                Script::new(RELEASE),
            ]),
            holder_prefix: format!("{}-{nanos:x}", std::process::id()),
            next_holder: AtomicU64::new(0),
        }
    }

    /// Takes one cluster lease for `host` without renewal (what a replica that
    /// then crashes leaves behind). Used by tests and tools.
    pub async fn lease_once(
        &self,
        host: &str,
        holder: &str,
        cap: u32,
    ) -> Result<bool, FanoutError> {
        let key = self.backend.key("host", host);
        let lease = self.backend.inner.lease.as_millis() as i64;
        let script = &self.scripts[0];
        let got: i64 = self
            .backend
            .invoke(script, &key, Some(holder), &[cap as i64, lease])
            .await?;
        Ok(got == 1)
    }

    async fn cluster_lease(
        &self,
        host: &str,
        config: &HostConfig,
        wait: Duration,
    ) -> Result<Option<Lease>, FanoutError> {
        let key = self.backend.key("host", host);
        let holder = format!(
            "{}-{}",
            self.holder_prefix,
            self.next_holder.fetch_add(1, Relaxed)
        );
        let lease_ms = self.backend.inner.lease.as_millis() as i64;
        let give_up = tokio::time::Instant::now() + wait;
        let mut pause = Duration::from_millis(2);
        loop {
            let args = [config.max_concurrent as i64, lease_ms];
            let got: i64 = self
                .backend
                .invoke(&self.scripts[0], &key, Some(&holder), &args)
                .await?;
            if got == 1 {
                return Ok(Some(Lease::start(
                    self.backend.clone(),
                    self.scripts.clone(),
                    key,
                    holder,
                )));
            }
            if tokio::time::Instant::now() + pause > give_up {
                return Ok(None);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }
}

/// A held cluster lease: renewed while held, released when dropped.
struct Lease {
    renewal: tokio::task::JoinHandle<()>,
    release: Option<(RedisBackend, Arc<[Script; 3]>, String, String)>,
}

impl Lease {
    fn start(
        backend: RedisBackend,
        scripts: Arc<[Script; 3]>,
        key: String,
        holder: String,
    ) -> Self {
        let every = backend.inner.lease / 3;
        let lease_ms = backend.inner.lease.as_millis() as i64;
        let renewal = {
            let (backend, scripts, key, holder) = (
                backend.clone(),
                scripts.clone(),
                key.clone(),
                holder.clone(),
            );
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    let renewed: Result<i64, _> = backend
                        .invoke(&scripts[1], &key, Some(&holder), &[lease_ms])
                        .await;
                    if let Err(err) = renewed {
                        tracing::warn!(error = %err, "could not renew a host lease");
                    }
                }
            })
        };
        Self {
            renewal,
            release: Some((backend, scripts, key, holder)),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.renewal.abort();
        if let Some((backend, scripts, key, holder)) = self.release.take() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _: Result<i64, _> =
                        backend.invoke(&scripts[2], &key, Some(&holder), &[]).await;
                });
            }
        }
    }
}

impl HostLimiter for RedisHostCaps {
    fn acquire<'a>(
        &'a self,
        host: &'a str,
        time_left: Duration,
    ) -> BoxFuture<'a, Result<HostSlot, FanoutError>> {
        Box::pin(async move {
            let started = tokio::time::Instant::now();
            let local = self.local.acquire(host, time_left).await?;
            let Some(config) = self.configured.get(host) else {
                return Ok(local);
            };
            let wait = config
                .acquire_wait()
                .min(time_left)
                .saturating_sub(started.elapsed());
            match self.cluster_lease(host, config, wait).await {
                Ok(Some(lease)) => Ok(local.join(HostSlot::new(lease))),
                Ok(None) => Err(FanoutError::HostSaturated {
                    host: host.to_string(),
                    max_concurrent: config.max_concurrent,
                }),
                Err(err) => match self.backend.failure_mode() {
                    FailureMode::Open => {
                        crate::metrics::shared_state_fallback("host_caps");
                        tracing::warn!(error = %err, host, "shared host caps down; capping in-process");
                        Ok(local)
                    }
                    FailureMode::Closed => Err(err),
                },
            }
        })
    }

    fn in_flight(&self, host: &str) -> u64 {
        self.local.in_flight(host)
    }

    /// A host without a `[hosts]` table has no cluster cap: its slots are the
    /// local limiter's alone. A capped host always needs a cluster lease.
    fn local_cap(&self, host: &str) -> Option<Arc<HostCap>> {
        if self.configured.contains_key(host) {
            None
        } else {
            self.local.local_cap(host)
        }
    }
}
