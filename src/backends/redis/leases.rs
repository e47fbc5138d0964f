//! Per-host caps held by the whole fleet: leased slots in a sorted set per
//! host (see the module docs of [`redis`](super) for the deadline and token).

use super::{down, Failure, Lua, RedisBackend, Route};
use crate::config::{FailureMode, HostConfig};
use crate::error::{HostRefusal, Unavailable};
use crate::hosts::{HostLimiter, HostSlot, LocalHostCaps};
use futures::future::BoxFuture;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// KEYS[1] the host's set; ARGV: holder, cap, lease (ms), deadline (µs on
/// Redis's clock; 0: none). Returns {1 leased | 0 full | -1 past the deadline,
/// nothing done; Redis time in µs}. Idempotent per holder: run again (a
/// cluster client's retry after a lost reply), it finds its lease and
/// answers leased.
const ACQUIRE: &str = r#"
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local deadline = tonumber(ARGV[4])
if deadline > 0 and now_us > deadline then
  return {-1, now_us}
end
local now = math.floor(now_us / 1000)
local lease = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return {1, now_us}
end
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], lease * 2)
  return {1, now_us}
end
return {0, now_us}
"#;

/// KEYS[1] the host's set; ARGV: holder, lease (ms). Extends the holder's
/// lease if it is still there and unexpired (1), else does nothing (0): a
/// removed or expired lease is never brought back.
const RENEW: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
local held = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not held or tonumber(held) <= now then
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], lease * 2)
return 1
"#;

#[derive(Debug)]
struct Scripts {
    acquire: Lua,
    renew: Lua,
}

/// What one acquire call found.
#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    Leased,
    Full,
    /// Redis ran it after its deadline: nothing taken.
    Late,
}

/// Per-host caps held by the whole fleet: a local slot, then a cluster lease.
#[derive(Debug)]
pub struct RedisHostCaps {
    local: LocalHostCaps,
    configured: BTreeMap<String, HostConfig>,
    backend: RedisBackend,
    scripts: Arc<Scripts>,
    holder_prefix: String,
    next_holder: AtomicU64,
}

impl RedisHostCaps {
    /// Caps for the `[hosts]` tables, shared on `backend`.
    pub fn new(hosts: BTreeMap<String, HostConfig>, backend: RedisBackend) -> Self {
        // Unique per replica and restart: no clock involved.
        let nonce =
            std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), std::process::id());
        Self {
            local: LocalHostCaps::new(hosts.clone()),
            configured: hosts,
            backend,
            scripts: Arc::new(Scripts {
                acquire: Lua::new(ACQUIRE),
                renew: Lua::new(RENEW),
            }),
            holder_prefix: format!("{}-{nonce:x}", std::process::id()),
            next_holder: AtomicU64::new(0),
        }
    }

    /// One acquire call for `holder`, with a deadline `timeout_ms` from now.
    async fn attempt(&self, key: &str, holder: &str, cap: u32) -> Result<Attempt, Failure> {
        let lease_ms = self.backend.inner.lease.as_millis() as i64;
        let args = [i64::from(cap), lease_ms];
        let (got, _now_us): (i64, i64) = self
            .backend
            .timed_script(&self.scripts.acquire, key, Some(holder), &args)
            .await?;
        Ok(match got {
            1 => Attempt::Leased,
            0 => Attempt::Full,
            _ => Attempt::Late,
        })
    }

    /// Takes one cluster lease for `host` without renewal or release (what a
    /// replica that then crashes leaves behind). Used by tests.
    #[cfg(test)]
    pub(crate) async fn lease_once(
        &self,
        host: &str,
        holder: &str,
        cap: u32,
    ) -> Result<bool, Unavailable> {
        let key = self.backend.key("host", host);
        match self.attempt(&key, holder, cap).await? {
            Attempt::Leased => Ok(true),
            Attempt::Full => Ok(false),
            Attempt::Late => Err(down("the acquire ran after its deadline")),
        }
    }

    async fn cluster_lease(
        &self,
        host: &str,
        config: &HostConfig,
        wait: Duration,
    ) -> Result<Option<Lease>, Unavailable> {
        let holder = format!(
            "{}-{}",
            self.holder_prefix,
            self.next_holder.fetch_add(1, Relaxed)
        );
        let mut token = Token {
            backend: self.backend.clone(),
            key: self.backend.key("host", host),
            holder,
            armed: false,
        };
        let give_up = Instant::now() + wait;
        let mut pause = Duration::from_millis(2);
        loop {
            // From here until an answer, Redis may run this acquire: if this
            // future is dropped (cancelled), the token undoes it.
            token.armed = true;
            let attempt = self
                .attempt(&token.key, &token.holder, config.max_concurrent)
                .await;
            token.armed = matches!(
                &attempt,
                Ok(Attempt::Leased) | Err(Failure { sent: true, .. })
            );
            match attempt {
                Ok(Attempt::Leased) => return Ok(Some(Lease::start(token, self.scripts.clone()))),
                Ok(Attempt::Full) => {}
                Ok(Attempt::Late) => return Err(down("the acquire ran after its deadline")),
                // A token still armed removes what a late run may add.
                Err(failure) => return Err(failure.error),
            }
            if Instant::now() + pause > give_up {
                return Ok(None);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }
}

/// A member of a host's set that this replica may have added: dropped while
/// armed, it is removed (`ZREM`, in the background, bounded).
struct Token {
    backend: RedisBackend,
    key: String,
    holder: String,
    armed: bool,
}

impl Drop for Token {
    fn drop(&mut self) {
        if self.armed {
            let key = std::mem::take(&mut self.key);
            let holder = std::mem::take(&mut self.holder);
            self.backend.forget(key, holder);
        }
    }
}

/// A held cluster lease: renewed while held, released (its token) when dropped.
struct Lease {
    renewal: tokio::task::JoinHandle<()>,
    _token: Token,
}

impl Lease {
    fn start(token: Token, scripts: Arc<Scripts>) -> Self {
        let backend = token.backend.clone();
        let (key, holder) = (token.key.clone(), token.holder.clone());
        let lease = backend.inner.lease;
        let renewal = tokio::spawn(async move {
            let lease_ms = lease.as_millis() as i64;
            loop {
                tokio::time::sleep(lease / 3).await;
                let deadline = backend.local_deadline();
                let renewed = backend
                    .script::<i64>(
                        Route::FollowUp,
                        deadline,
                        &scripts.renew,
                        &key,
                        Some(&holder),
                        &[lease_ms],
                    )
                    .await;
                match renewed {
                    Ok(1) => {}
                    Ok(_) => {
                        tracing::warn!(key, "a host lease expired while its read was in flight");
                        return;
                    }
                    Err(failure) => {
                        tracing::debug!(error = %failure.error, "could not renew a host lease")
                    }
                }
            }
        });
        Self {
            renewal,
            _token: token,
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Renewal stops first; the token's release follows it on the connection.
        self.renewal.abort();
    }
}

impl HostLimiter for RedisHostCaps {
    fn acquire<'a>(
        &'a self,
        host: &'a str,
        time_left: Duration,
    ) -> BoxFuture<'a, Result<HostSlot, HostRefusal>> {
        Box::pin(async move {
            let started = Instant::now();
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
                Ok(None) => Err(HostRefusal::Saturated {
                    max_concurrent: config.max_concurrent,
                }),
                Err(err) => match self.backend.failure_mode() {
                    FailureMode::Open => {
                        crate::metrics::shared_state_fallback("host_caps");
                        // The breaker logs the outage once; this is per read.
                        tracing::debug!(error = %err, host, "shared host caps down; capping in-process");
                        Ok(local)
                    }
                    FailureMode::Closed => Err(HostRefusal::Unavailable {
                        message: err.message,
                    }),
                },
            }
        })
    }

    fn in_flight(&self, host: &str) -> u64 {
        self.local.in_flight(host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RedisConfig;
    use fanout_testkit::RedisServer;

    async fn redis_time_us(redis: &RedisServer) -> i64 {
        let Some(redis::Value::Array(parts)) = redis.command(&["TIME"]).await else {
            panic!("TIME");
        };
        let parts: Vec<i64> = parts
            .into_iter()
            .map(|p| match p {
                redis::Value::BulkString(b) => String::from_utf8(b).unwrap().parse().unwrap(),
                other => panic!("TIME part {other:?}"),
            })
            .collect();
        parts[0] * 1_000_000 + parts[1]
    }

    async fn zcard(redis: &RedisServer, key: &str) -> Option<redis::Value> {
        redis.command(&["ZCARD", key]).await
    }

    /// A server, caps on it (call timeout 1 s, lease 30 s) and the key of
    /// host `h:1`; `None` without `redis-server`.
    async fn setup() -> Option<(RedisServer, RedisHostCaps, String)> {
        let redis = RedisServer::start().await?;
        let config = RedisConfig {
            url: redis.url(),
            timeout_ms: 1_000,
            lease_ms: 30_000,
            ..RedisConfig::default()
        };
        let caps = RedisHostCaps::new(BTreeMap::new(), RedisBackend::new(&config).unwrap());
        let key = caps.backend.key("host", "h:1");
        Some((redis, caps, key))
    }

    /// The deadline a call on `key` made now would carry, on Redis's clock.
    fn redis_deadline(caps: &RedisHostCaps, key: &str) -> i64 {
        let backend = &caps.backend;
        backend.redis_deadline(key, backend.local_deadline())
    }

    /// Runs ACQUIRE for `holder` (cap 4) with `deadline_us` on Redis's clock.
    async fn acquire(caps: &RedisHostCaps, key: &str, holder: &str, deadline_us: i64) -> i64 {
        let local = Instant::now() + Duration::from_secs(5);
        let args = [4, 30_000, deadline_us];
        let script = &caps.scripts.acquire;
        let call = caps
            .backend
            .script(Route::Call, local, script, key, Some(holder), &args);
        let (got, _now): (i64, i64) = call.await.ok().expect("redis answers");
        got
    }

    #[tokio::test]
    async fn an_acquire_run_after_its_deadline_takes_no_slot() {
        let Some((redis, caps, key)) = setup().await else {
            return;
        };
        // What a call queued behind a hung Redis finds when it finally runs:
        // its deadline, on Redis's own clock, is past.
        let now = redis_time_us(&redis).await;
        assert_eq!(acquire(&caps, &key, "late", now - 1).await, -1);
        assert_eq!(zcard(&redis, &key).await, Some(redis::Value::Int(0)));
        assert_eq!(acquire(&caps, &key, "in-time", now + 60_000_000).await, 1);
        assert_eq!(acquire(&caps, &key, "no-deadline", 0).await, 1);
        assert_eq!(zcard(&redis, &key).await, Some(redis::Value::Int(2)));
    }

    #[tokio::test]
    async fn the_deadline_is_on_redis_clock_and_never_later_than_the_callers() {
        let Some((redis, caps, key)) = setup().await else {
            return;
        };
        assert_eq!(
            redis_deadline(&caps, &key),
            0,
            "no deadline before Redis answered"
        );
        assert!(caps.lease_once("h:1", "first", 4).await.unwrap());
        for _ in 0..20 {
            let before = redis_time_us(&redis).await;
            let deadline = redis_deadline(&caps, &key);
            let after = redis_time_us(&redis).await;
            // At most `timeout_ms` after Redis's now; early by the error of
            // the learned offset only (generously: half the timeout).
            assert!(deadline <= after + 1_000_000, "{deadline} vs {after}");
            assert!(deadline >= before + 500_000, "{deadline} vs {before}");
        }
    }

    #[tokio::test]
    async fn an_acquire_run_twice_takes_one_slot() {
        let Some((redis, caps, key)) = setup().await else {
            return;
        };
        for holder in ["a", "b", "c", "d"] {
            assert_eq!(acquire(&caps, &key, holder, 0).await, 1);
        }
        // What a cluster client's retry after a lost reply does: the same
        // holder again, with the set full. It holds its slot, no other.
        assert_eq!(acquire(&caps, &key, "a", 0).await, 1);
        assert_eq!(zcard(&redis, &key).await, Some(redis::Value::Int(4)));
        assert_eq!(acquire(&caps, &key, "e", 0).await, 0);
    }

    #[tokio::test]
    async fn a_late_answer_from_a_wrong_offset_is_sent_again() {
        let Some((redis, caps, key)) = setup().await else {
            return;
        };
        // As if the key's slot had moved to a master whose clock is 10 s
        // ahead of the one the offset was learned from: the deadline sent is
        // long past on the new clock, so the script answers "late"; the
        // answer arrives in time, so the acquire is sent again, corrected.
        let now = redis_time_us(&redis).await;
        caps.backend.observe(Some(&key), now - 10_000_000);
        assert!(redis_deadline(&caps, &key) < now);
        assert!(caps.lease_once("h:1", "moved", 4).await.unwrap());
        assert_eq!(zcard(&redis, &key).await, Some(redis::Value::Int(1)));
        assert!(
            redis_deadline(&caps, &key) > now,
            "the offset was corrected"
        );
    }

    #[tokio::test]
    async fn renewal_never_brings_a_lease_back() {
        let Some((redis, caps, key)) = setup().await else {
            return;
        };
        let renew = async |holder: &str| {
            let local = Instant::now() + Duration::from_secs(5);
            let script = &caps.scripts.renew;
            let call = caps.backend.script::<i64>(
                Route::FollowUp,
                local,
                script,
                &key,
                Some(holder),
                &[30_000],
            );
            call.await.ok().expect("redis answers")
        };
        let score = async |holder: &str| redis.command(&["ZSCORE", &key, holder]).await;
        assert_eq!(acquire(&caps, &key, "held", 0).await, 1);
        let expired_ms = (redis_time_us(&redis).await / 1000 - 1_000).to_string();
        redis
            .command(&["ZADD", &key, &expired_ms, "expired"])
            .await
            .unwrap();
        let held = score("held").await;
        assert_eq!(renew("held").await, 1, "a held lease is renewed");
        assert_ne!(score("held").await, held, "and extended");
        assert_eq!(renew("expired").await, 0, "an expired lease is not renewed");
        assert_eq!(
            score("expired").await,
            Some(redis::Value::BulkString(expired_ms.into()))
        );
        assert_eq!(renew("released").await, 0, "nor one never taken or removed");
        assert_eq!(score("released").await, Some(redis::Value::Nil));
        redis.command(&["ZREM", &key, "held"]).await.unwrap();
        assert_eq!(renew("held").await, 0);
        assert_eq!(zcard(&redis, &key).await, Some(redis::Value::Int(1)));
    }
}
