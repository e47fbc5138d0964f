//! The per-IP limit on Redis: GCRA in one Lua script, time from Redis
//! `TIME` (see the module docs of [`redis`](super)), with admissions taken
//! a few at a time.
//!
//! A replica that sees a client often takes several of its admissions in one
//! call — as many as that client sent it in the last 100 ms, at most
//! `lease_block`, and at most half of what the client has left — and hands
//! them to the next requests locally for up to a second. They are charged on
//! Redis when taken, so over time the fleet admits no more than the limit;
//! an admission taken ahead is used up to a second after it was charged, so
//! over a short window the fleet may admit what replicas took ahead on top
//! of the quota. Taking at most half of what is left keeps that small where
//! it matters, near the limit: as a client's quota runs out, the takes
//! shrink to one. What a replica took and did not use goes back with its
//! next call for that client (the script moves the client's TAT back);
//! until then the client finds the fleet that much stricter. A refusal is
//! kept until the time Redis said the next admission comes, so a client
//! over its limit costs one call per admission, not one per request.
//! Requests from one client wait for the one call in flight for it.

use super::backend::{down, RedisBackend};
use super::lua::{ints, unexpected, Lua, Timed};
use crate::error::Unavailable;
use crate::inbound::limiter::{Decision, InboundLimiter};
use dashmap::DashMap;
use futures::future::BoxFuture;
use redis::{FromRedisValue, RedisResult, Value};
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, LazyLock};
use std::time::Duration;
use tokio::time::Instant;

/// `lua/gcra.lua`.
static GCRA: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("lua/gcra.lua")));

/// What GCRA answered a check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Admission {
    /// `granted` admissions charged; `remaining` would still be granted,
    /// and the client's quota is whole again in `whole_in`.
    Granted {
        granted: u32,
        remaining: u32,
        whole_in: Duration,
    },
    /// Refused; the next admission comes in `retry_in`.
    Refused { retry_in: Duration },
    /// It ran past its deadline and did nothing.
    Late,
}

/// GCRA's reply: `{granted, remaining, wait_us, now_us}` (`lua/gcra.lua`).
#[derive(Debug)]
struct GcraReply {
    admission: Admission,
    now_us: i64,
}

impl FromRedisValue for GcraReply {
    fn from_redis_value(v: &Value) -> RedisResult<Self> {
        let [granted, remaining, wait_us, now_us] = ints("GCRA", v)?;
        let wait = Duration::from_micros(wait_us.max(0) as u64);
        let admission = match granted {
            -1 => Admission::Late,
            0 => Admission::Refused { retry_in: wait },
            1.. => Admission::Granted {
                granted: u32::try_from(granted).map_err(|_| unexpected("GCRA", v))?,
                remaining: u32::try_from(remaining.max(0)).unwrap_or(u32::MAX),
                whole_in: wait,
            },
            _ => return Err(unexpected("GCRA", v)),
        };
        Ok(Self { admission, now_us })
    }
}

impl Timed for GcraReply {
    fn late(&self) -> bool {
        self.admission == Admission::Late
    }
    fn redis_now_us(&self) -> i64 {
        self.now_us
    }
}

/// How long admissions taken ahead stay usable.
const HOLD: Duration = Duration::from_secs(1);
/// The window over which a client's requests to this replica are counted,
/// to size the next take.
const WINDOW: Duration = Duration::from_millis(100);
/// Checks between two sweeps of clients not seen for a while: at least
/// this, and twice the clients kept, so a sweep costs a check O(1).
const SWEEP_EVERY: u64 = 4096;

/// One client as this replica knows it.
#[derive(Debug)]
struct Stock {
    /// Admissions charged on Redis and not used yet, usable until `until`.
    left: u32,
    until: Instant,
    /// From the last answer: admissions remaining then, and when the quota
    /// is whole again.
    remaining: u32,
    whole_at: Instant,
    /// Refused on Redis until then.
    refused_until: Instant,
    /// When the client's quota is whole again, as Redis last answered
    /// (`None`: no answer yet): where a fallback starts.
    full_at: Option<Instant>,
    /// Requests in the current window, and in the one before.
    window_start: Instant,
    seen: u32,
    seen_before: u32,
}

impl Stock {
    fn new(now: Instant) -> Self {
        Self {
            left: 0,
            until: now,
            remaining: 0,
            whole_at: now,
            refused_until: now,
            full_at: None,
            window_start: now,
            seen: 0,
            seen_before: 0,
        }
    }

    /// Counts a request; the admissions to take next: as many as came in a
    /// window lately, at least 1, at most `block`.
    fn count(&mut self, now: Instant, block: u32) -> u32 {
        if now >= self.window_start + WINDOW {
            let whole = now < self.window_start + 2 * WINDOW;
            self.seen_before = if whole { self.seen } else { 0 };
            self.seen = 0;
            self.window_start = now;
        }
        self.seen += 1;
        self.seen.max(self.seen_before).clamp(1, block.max(1))
    }
}

/// The per-IP limit on Redis, an [`InboundLimiter`] for
/// [`RateLimitLayer::shared`](crate::inbound::RateLimitLayer::shared) (a
/// process's [`SharedLimits`](crate::backends::redis::SharedLimits) makes it
/// on its backend, beside its other limits).
#[derive(Debug)]
pub struct RedisRateLimiter {
    backend: RedisBackend,
    interval_us: i64,
    burst: i64,
    clients: DashMap<IpAddr, Arc<tokio::sync::Mutex<Stock>>>,
    checks: AtomicU64,
    /// The check count at which the next sweep runs.
    next_sweep: AtomicU64,
}

impl RedisRateLimiter {
    /// `requests_per_minute` per key, shared by every replica on `backend`.
    pub fn new(backend: RedisBackend, requests_per_minute: NonZeroU32) -> Self {
        Self {
            backend,
            interval_us: 60_000_000 / i64::from(requests_per_minute.get()),
            burst: i64::from(requests_per_minute.get()),
            clients: DashMap::new(),
            checks: AtomicU64::new(0),
            next_sweep: AtomicU64::new(SWEEP_EVERY),
        }
    }

    /// Forgets clients with nothing taken ahead and no refusal pending.
    fn sweep(&self, now: Instant) {
        self.clients.retain(|_, stock| {
            stock.try_lock().map_or(true, |s| {
                now < s.until + HOLD || now < s.refused_until || now < s.window_start + WINDOW
            })
        });
    }

    /// Clients this replica keeps state for (for tests).
    #[doc(hidden)]
    pub fn clients(&self) -> usize {
        self.clients.len()
    }
}

impl InboundLimiter for RedisRateLimiter {
    fn last_known(&self, client: IpAddr) -> Option<Duration> {
        let stock = self.clients.get(&client)?.clone();
        // A check in flight for the client holds it: as if never heard of.
        let full_at = stock.try_lock().ok()?.full_at?;
        Some(full_at.saturating_duration_since(Instant::now()))
    }

    fn check(&self, client: IpAddr) -> BoxFuture<'_, Result<Decision, Unavailable>> {
        Box::pin(async move {
            let now = Instant::now();
            let n = self.checks.fetch_add(1, Relaxed);
            // The one check that takes the mark (to the end, meanwhile) sweeps.
            let mark = self.next_sweep.load(Relaxed);
            if n >= mark
                && (self.next_sweep)
                    .compare_exchange(mark, u64::MAX, Relaxed, Relaxed)
                    .is_ok()
            {
                self.sweep(now);
                let kept = 2 * self.clients.len() as u64;
                self.next_sweep.store(n + SWEEP_EVERY.max(kept), Relaxed);
            }
            let stock = self
                .clients
                .entry(client)
                .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(Stock::new(now))))
                .clone();
            // Requests of one client wait here for the call in flight for it.
            let mut s = stock.lock().await;
            let now = Instant::now();
            let want = s.count(now, self.backend.lease_block());
            if now < s.refused_until {
                return Ok(Decision::Deny {
                    retry_after: s.refused_until - now,
                });
            }
            if s.left > 0 && now < s.until {
                s.left -= 1;
                return Ok(Decision::Allow {
                    remaining: s.remaining + s.left,
                    reset: s.whole_at.saturating_duration_since(now),
                });
            }
            // Taken ahead and not used in time: given back with this call.
            let refund = std::mem::take(&mut s.left);
            let key = self.backend.key("ip", &client.to_string());
            let args = [
                self.interval_us,
                self.burst,
                i64::from(want),
                i64::from(refund),
            ];
            let reply: GcraReply = self.backend.timed_script(&GCRA, &key, None, &args).await?;
            let now = Instant::now();
            Ok(match reply.admission {
                Admission::Granted {
                    granted,
                    remaining,
                    whole_in,
                } => {
                    s.left = granted - 1;
                    s.until = now + HOLD;
                    s.remaining = remaining;
                    s.whole_at = now + whole_in;
                    s.full_at = Some(s.whole_at);
                    Decision::Allow {
                        remaining: s.remaining + s.left,
                        reset: whole_in,
                    }
                }
                Admission::Refused { retry_in } => {
                    s.refused_until = now + retry_in;
                    // The next admission comes then; the rest after it.
                    let rest = self.interval_us.saturating_mul(self.burst - 1);
                    s.full_at = Some(s.refused_until + Duration::from_micros(rest as u64));
                    Decision::Deny {
                        retry_after: retry_in,
                    }
                }
                Admission::Late => return Err(down("the check ran after its deadline")),
            })
        })
    }
}
