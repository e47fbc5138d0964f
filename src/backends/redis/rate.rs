//! The per-IP limit on Redis: GCRA in one Lua script per check, time from
//! Redis `TIME` (see the module docs of [`redis`](super)).

use super::{down, Lua, RedisBackend};
use crate::error::Unavailable;
use crate::limiter::{Decision, InboundLimiter};
use futures::future::BoxFuture;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::Duration;

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
    script: Lua,
    interval_us: i64,
    burst: i64,
}

impl RedisRateLimiter {
    /// `requests_per_minute` per key, shared by every replica on `backend`.
    pub fn new(backend: RedisBackend, requests_per_minute: NonZeroU32) -> Self {
        Self {
            backend,
            script: Lua::new(GCRA),
            interval_us: 60_000_000 / i64::from(requests_per_minute.get()),
            burst: i64::from(requests_per_minute.get()),
        }
    }
}

impl InboundLimiter for RedisRateLimiter {
    fn check(&self, key: IpAddr) -> BoxFuture<'_, Result<Decision, Unavailable>> {
        Box::pin(async move {
            let key = self.backend.key("ip", &key.to_string());
            let args = [self.interval_us, self.burst];
            let (allowed, remaining, wait_us, _now_us): (i64, i64, i64, i64) = self
                .backend
                .timed_script(&self.script, &key, None, &args)
                .await?;
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
