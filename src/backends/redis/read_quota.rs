//! The clients' read quotas (`[quota]`) shared by the fleet on Redis: a
//! [`QuotaStore`] for
//! [`EngineBuilder::quota_store`](crate::EngineBuilder::quota_store), made by
//! [`SharedLimits::quota_store`](super::SharedLimits::quota_store) on the
//! process's one backend.
//!
//! # How it works
//!
//! Each client of each class has one key on Redis,
//! `<prefix>:quota:<class>:<client>` (`reads` or `internal-reads`, then the
//! client's key as the per-IP limit makes it), holding one number: the
//! instant its bucket is full again, in µs on the clock of the node that
//! owns the key (GCRA's arithmetic, as [`Rate`] does it in process). It
//! expires when the bucket is full, since a full bucket is a fresh one. One
//! Lua script (`lua/quota.lua`) reads and writes it, with the time from
//! Redis's `TIME`: one key per script, so on a Redis Cluster it runs whole
//! on the master owning that key.
//!
//! A replica does not ask Redis for every reservation. It keeps, per
//! client, a **stock**: reads charged on Redis and not handed out yet.
//!
//! - **Reserving** `n` reads takes them from the stock while it lasts and is
//!   fresh (charged less than [`HOLD`], a second, ago): no call. Otherwise
//!   one call takes what the stock lacks **plus reads ahead** for that
//!   client's next requests on this replica: as many as it reserved here in
//!   a recent window of 250 ms (or as the reservations waiting for this
//!   call ask, if more), three times over (about 750 ms of its demand), and
//!   never more than half of what the client has left after the
//!   reservation — so near the limit the takes shrink to the need, and a
//!   client seen once takes nothing ahead. The same call gives back the
//!   stale stock (older than [`HOLD`]). Reserving nothing never calls.
//! - **Refunding** what a request did not spend costs no call: the reads
//!   wait here and the client's next call gives them back on Redis (where
//!   the script caps them at a full bucket). They are never handed out
//!   again from here: charged long ago, they could otherwise come back
//!   fresh on top of a bucket that has refilled meanwhile.
//! - **A margin**: every call takes at least two reads ahead (within half
//!   of what is left), so a read past its request's estimate — a redirect
//!   hop, a token fetch and its retry — finds one here at once.
//! - **A refusal** is kept here: the reply says when the client's bucket is
//!   full again, and a reservation that cannot fit by that instant is
//!   refused here, with its retry time, until it can (so a client over its
//!   quota costs one call per refill, not one per request). What another
//!   replica gave back meanwhile is not seen until then: the fleet is that
//!   much stricter for a moment, never more lenient.
//! - **One call at a time per client**: a client's reservations wait, on a
//!   `tokio::sync::Mutex` of its own, for the call in flight for it, and
//!   then find its answer in the stock.
//!
//! What the fleet can spend: every read a request sends was charged on
//! Redis at most a [`HOLD`] before it was handed out, so the reads of one
//! client over any window stay within its burst plus what its rate refills
//! over the window and one [`HOLD`] more — and since a take ahead is at
//! most half of what is left, the extra shrinks to nothing when the client
//! is at its limit, which is when it matters.
//!
//! **Cancellation.** The call runs in a task of its own: a reservation
//! whose future is dropped while its call is in flight does not lose what
//! Redis charged. The task's answer carries the reads it took, and handing
//! them over is the waiting reservation's job; dropped unclaimed, they
//! wait to be given back with the client's next call (`Held`). A reservation served from the stock
//! finishes without awaiting anything.
//!
//! **Failures.** A call that fails or times out is `Err`: the engine
//! applies `failure_mode` (the in-process store, or 503). The stale stock
//! it was giving back is counted as given back (whether the script ran is
//! unknown; the client is the stricter for it, never the more lenient); a
//! script Redis ran past its deadline did nothing, and the stock keeps it.
//!
//! **Memory.** Each replica keeps an entry per client it saw lately. Every
//! `max(4096, 2 × entries)` reservations of a class, one of them sweeps
//! the entries with no fresh stock, no recent demand and no pending
//! refusal, as the per-IP limit does: a flood of distinct addresses holds
//! memory for as long as they are active, and a sweep costs a reservation
//! O(1). A swept entry's stock and refunds go back on Redis through a
//! bounded queue ([`GIVE_BACK_QUEUE`] entries; past it they are dropped,
//! the client then finds the fleet stricter until its bucket refills),
//! sent by one task, a few calls at a time.

use super::backend::{down, RedisBackend};
use super::lua::{ints, unexpected, Lua, Timed};
use crate::config::QuotaConfig;
use crate::error::Unavailable;
use crate::inbound::limiter::SWEEP_EVERY;
use crate::inbound::quota::{QuotaClass, QuotaStore, Rate, Verdict};
use crate::seed::random_state;
use dashmap::DashMap;
use foldhash::fast::SeedableRandomState;
use futures::future::BoxFuture;
use futures::StreamExt;
use redis::{FromRedisValue, RedisResult, Value};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// `lua/quota.lua`.
static QUOTA: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("lua/quota.lua")));

/// How long reads charged on Redis may be handed out here; older, they are
/// given back with the client's next call.
const HOLD: Duration = Duration::from_secs(1);
/// The window over which a client's reservations on this replica are
/// counted, to size what the next call takes ahead.
const WINDOW: Duration = Duration::from_millis(250);
/// Reads taken ahead: this many windows of the client's demand.
const AHEAD_WINDOWS: u64 = 3;
/// Reads any call takes ahead at least (within half of what is left), so a
/// read past its request's estimate — a redirect hop, a token fetch and
/// its retry — finds one at once (`QuotaStore::reserve_at_once`).
const MARGIN: u64 = 2;
/// Swept clients' reads waiting to go back on Redis, at most.
const GIVE_BACK_QUEUE: usize = 65_536;
/// Give-back calls in flight at once.
const GIVE_BACK_CALLS: usize = 8;

/// What the script did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// `granted` reads taken: the reservation's and those ahead.
    Granted { granted: u64 },
    /// Refused, nothing taken; what was asked fits in `wait`.
    Refused { wait: Duration },
    /// It ran past its deadline and did nothing.
    Late,
}

/// The script's reply: `{status, granted, wait_us, full_in_us, now_us}`
/// (`lua/quota.lua`).
#[derive(Debug)]
struct QuotaReply {
    outcome: Outcome,
    /// Until the client's bucket is full again, after the call.
    full_in: Duration,
    now_us: i64,
}

impl FromRedisValue for QuotaReply {
    fn from_redis_value(v: &Value) -> RedisResult<Self> {
        let [status, granted, wait_us, full_in_us, now_us] = ints("QUOTA", v)?;
        let us = |n: i64| Duration::from_micros(n.max(0) as u64);
        let outcome = match status {
            -1 => Outcome::Late,
            0 => Outcome::Refused { wait: us(wait_us) },
            1 if granted >= 0 => Outcome::Granted {
                granted: granted as u64,
            },
            _ => return Err(unexpected("QUOTA", v)),
        };
        Ok(Self {
            outcome,
            full_in: us(full_in_us),
            now_us,
        })
    }
}

impl Timed for QuotaReply {
    fn late(&self) -> bool {
        self.outcome == Outcome::Late
    }
    fn redis_now_us(&self) -> i64 {
        self.now_us
    }
}

/// One client as this replica knows it.
#[derive(Debug)]
struct Client {
    /// Reads requests gave back, or a dropped reservation's call took, not
    /// yet in the stock (`refund` does not wait for the stock's lock).
    refunded: AtomicU64,
    /// Reads of the reservations waiting for the stock's lock: demand too.
    queued: AtomicU64,
    stock: tokio::sync::Mutex<Stock>,
}

impl Client {
    fn new(now: Instant) -> Self {
        Self {
            refunded: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            stock: tokio::sync::Mutex::new(Stock::new(now)),
        }
    }
}

/// A reservation's reads counted in [`Client::queued`] while it waits for
/// the stock's lock (dropped waiting, too).
struct Queued<'a> {
    client: &'a Client,
    reads: u64,
}

impl<'a> Queued<'a> {
    fn new(client: &'a Client, reads: u64) -> Self {
        client.queued.fetch_add(reads, Relaxed);
        Self { client, reads }
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.client.queued.fetch_sub(self.reads, Relaxed);
    }
}

/// Reads a call took for a client, to be put in its stock: by the
/// reservation waiting for the call, or, if it was dropped meanwhile, by
/// this on drop.
struct Held {
    client: Arc<Client>,
    reads: u64,
}

impl Held {
    fn claim(&mut self) -> u64 {
        std::mem::take(&mut self.reads)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.reads > 0 {
            self.client.refunded.fetch_add(self.reads, Relaxed);
        }
    }
}

/// A client's stock and what this replica knows of its bucket.
#[derive(Debug)]
struct Stock {
    /// Reads charged on Redis and not handed out — taken ahead, or given
    /// back by requests — usable until `until`.
    left: u64,
    until: Instant,
    /// Reads requests gave back, to be given back on Redis with the next
    /// call: never handed out again here, so a read charged long ago cannot
    /// come back fresh on top of a refilled bucket.
    given: u64,
    /// When the client's bucket is full again, as the last answer said (ns
    /// on the store's clock; what this replica took then included).
    full_at: u64,
    /// Refused until then (kept through sweeps until then).
    refused_until: Instant,
    /// Reads reserved in the current window, and in the one before.
    window_start: Instant,
    seen: u64,
    seen_before: u64,
}

/// What a reservation does, decided from what this replica holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// Answered here.
    Done(Verdict),
    /// Ask Redis for `take` reads and up to `ahead` more, giving back `back`.
    Call { take: u64, ahead: u64, back: u64 },
}

/// The instant a reservation is decided at: tokio's, and the same in ns on
/// the store's clock.
#[derive(Clone, Copy, Debug)]
struct Now {
    at: Instant,
    ns: u64,
}

impl Stock {
    fn new(now: Instant) -> Self {
        Self {
            left: 0,
            until: now,
            given: 0,
            full_at: 0,
            refused_until: now,
            window_start: now,
            seen: 0,
            seen_before: 0,
        }
    }

    /// Counts `need` reads reserved; what the client reserved here in a
    /// window lately, this reservation not counted.
    fn count(&mut self, now: Instant, need: u64) -> u64 {
        if now >= self.window_start + WINDOW {
            let whole = now < self.window_start + 2 * WINDOW;
            self.seen_before = if whole { self.seen } else { 0 };
            self.seen = 0;
            self.window_start = now;
        }
        let before = self.seen;
        self.seen = self.seen.saturating_add(need);
        before.max(self.seen_before)
    }

    /// Decides a reservation of `need` reads, with `queued` reads of other
    /// reservations of the client waiting behind it.
    fn plan(&mut self, rate: &Rate, now: Now, need: u64, queued: u64) -> Plan {
        let demand = self.count(now.at, need).max(queued);
        let usable = if now.at < self.until { self.left } else { 0 };
        if usable >= need {
            self.left -= need;
            return Plan::Done(self.reserved(rate, now));
        }
        let back = (self.left - usable) + self.given;
        let take = need - usable;
        // As far as this replica knows, once the stale stock is given back.
        let full_at = rate.give_back(self.full_at, now.ns, back);
        if let Err(wait) = rate.take(full_at, now.ns, take) {
            let retry_after = Duration::from_nanos(wait);
            self.refused_until = self.refused_until.max(now.at + retry_after);
            return Plan::Done(Verdict::Refused {
                remaining: rate.left(full_at, now.ns).saturating_add(usable),
                retry_after,
            });
        }
        self.left = usable;
        self.given = 0;
        Plan::Call {
            take,
            ahead: (demand.saturating_mul(AHEAD_WINDOWS).max(MARGIN)).min(rate.burst()),
            back,
        }
    }

    /// Redis granted the call of a reservation of `need` reads (the reads
    /// it took are in `left` already); the bucket is full in `full_in`.
    fn granted(&mut self, rate: &Rate, now: Now, full_in: Duration, need: u64) -> Verdict {
        self.until = now.at + HOLD;
        self.full_at = now.ns.saturating_add(nanos(full_in));
        self.left = self.left.saturating_sub(need);
        self.reserved(rate, now)
    }

    /// Redis refused the call: what it asked fits in `wait`.
    fn refused(&mut self, rate: &Rate, now: Now, full_in: Duration, wait: Duration) -> Verdict {
        self.full_at = now.ns.saturating_add(nanos(full_in));
        self.refused_until = self.refused_until.max(now.at + wait);
        let usable = if now.at < self.until { self.left } else { 0 };
        Verdict::Refused {
            remaining: rate.left(self.full_at, now.ns).saturating_add(usable),
            retry_after: wait.max(Duration::from_millis(1)),
        }
    }

    /// The verdict of a reservation just handed out: the stock counts as
    /// the client's, as if given back.
    fn reserved(&self, rate: &Rate, now: Now) -> Verdict {
        let full_at = rate.give_back(self.full_at, now.ns, self.left + self.given);
        Verdict::Reserved {
            remaining: rate.left(full_at, now.ns),
            full_in: Duration::from_nanos(full_at - now.ns),
        }
    }

    /// Whether a sweep may forget it: nothing fresh in stock, no recent
    /// demand, no refusal pending.
    fn idle(&self, now: Instant) -> bool {
        (self.left == 0 || now >= self.until)
            && now >= self.refused_until
            && now >= self.window_start + 2 * WINDOW
    }
}

/// `<prefix>:quota:<class>:<client>`.
fn quota_key(backend: &RedisBackend, class: QuotaClass, client: IpAddr) -> String {
    backend.key("quota", &format!("{}:{client}", class.name()))
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// One class's quota and the clients this replica knows.
struct Class {
    rate: Rate,
    clients: DashMap<IpAddr, Arc<Client>, SeedableRandomState>,
    reserves: AtomicU64,
    /// The reservation count at which the next sweep runs.
    next_sweep: AtomicU64,
}

impl Class {
    fn new(rate: Rate) -> Self {
        Self {
            rate,
            clients: DashMap::with_hasher(random_state()),
            reserves: AtomicU64::new(0),
            next_sweep: AtomicU64::new(SWEEP_EVERY),
        }
    }

    /// Counts a reservation; every `max(SWEEP_EVERY, 2 × clients kept)`,
    /// sweeps, and returns the swept clients' reads to give back.
    fn count(&self, now: Instant) -> Vec<(IpAddr, u64)> {
        let n = self.reserves.fetch_add(1, Relaxed);
        let mark = self.next_sweep.load(Relaxed);
        // The one reservation that takes the mark (to the end, meanwhile) sweeps.
        if n < mark
            || (self.next_sweep)
                .compare_exchange(mark, u64::MAX, Relaxed, Relaxed)
                .is_err()
        {
            return Vec::new();
        }
        let back = self.sweep(now);
        let kept = 2 * self.clients.len() as u64;
        self.next_sweep.store(n + SWEEP_EVERY.max(kept), Relaxed);
        back
    }

    /// Forgets the idle clients no one holds; their reads to give back.
    fn sweep(&self, now: Instant) -> Vec<(IpAddr, u64)> {
        let mut back = Vec::new();
        self.clients.retain(|ip, client| {
            // A reservation or a call holds it (a refund holds the map's
            // shard, which `retain` holds too).
            if Arc::strong_count(client) > 1 {
                return true;
            }
            let Ok(stock) = client.stock.try_lock() else {
                return true;
            };
            if !stock.idle(now) {
                return true;
            }
            let reads = stock.left + stock.given + client.refunded.load(Relaxed);
            if reads > 0 {
                back.push((*ip, reads));
            }
            false
        });
        self.clients.shrink_to_fit();
        back
    }
}

/// Reads to give back on Redis for a client forgotten here.
#[derive(Debug)]
struct GiveBack {
    class: QuotaClass,
    client: IpAddr,
    reads: u64,
}

/// The clients' read quotas on Redis, shared by every replica on the same
/// keys: a [`QuotaStore`] for
/// [`EngineBuilder::quota_store`](crate::EngineBuilder::quota_store).
///
/// One key per client and class, one Lua script per call (time from
/// `TIME`); each replica takes a reservation's reads plus some ahead for
/// the client's next requests (at most half of what it has left), hands
/// them out for up to a second, keeps what requests give back until its
/// next call for that client, and keeps a refusal until the reads fit. How
/// it works in full: `src/backends/redis/read_quota.rs`.
pub struct RedisReadQuota {
    backend: RedisBackend,
    origin: Instant,
    classes: [Option<Class>; 2],
    /// The queue of the task that gives swept clients' reads back, started
    /// by the first sweep that has any.
    give_back: OnceLock<mpsc::Sender<GiveBack>>,
}

impl std::fmt::Debug for RedisReadQuota {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisReadQuota")
            .field("backend", &self.backend)
            .field("clients", &self.clients())
            .finish_non_exhaustive()
    }
}

impl RedisReadQuota {
    /// Quotas at `public` and `internal` rates on `backend` (`None`: that
    /// class has no quota, and is never asked).
    pub fn new(backend: RedisBackend, public: Option<Rate>, internal: Option<Rate>) -> Self {
        Self {
            backend,
            origin: Instant::now(),
            classes: [public.map(Class::new), internal.map(Class::new)],
            give_back: OnceLock::new(),
        }
    }

    /// The quotas `[quota]` configures, at the rates the engine's quota
    /// has (the public class's `burst`, the internal class's a period's
    /// reads); `None` when no class has one.
    pub fn from_config(backend: RedisBackend, quota: &QuotaConfig) -> Option<Self> {
        if !quota.is_enabled() {
            return None;
        }
        let [public, internal] = crate::inbound::quota::rates(quota);
        Some(Self::new(backend, public, internal))
    }

    fn now(&self) -> Now {
        let at = Instant::now();
        let ns = u64::try_from((at - self.origin).as_nanos()).unwrap_or(u64::MAX);
        Now { at, ns }
    }

    /// The script's integer arguments (its deadline appended by
    /// [`RedisBackend::timed_script`]).
    fn args(rate: &Rate, take: u64, ahead: u64, back: u64) -> [i64; 5] {
        let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        [
            int(rate.interval_ns()),
            int(rate.burst()),
            int(take),
            int(ahead),
            int(back),
        ]
    }

    /// Queues a swept client's reads to go back on Redis.
    fn give_back_later(&self, give: GiveBack) {
        let queue = self.give_back.get_or_init(|| {
            let (tx, rx) = mpsc::channel(GIVE_BACK_QUEUE);
            let backend = self.backend.clone();
            let rates = self.classes.each_ref().map(|c| c.as_ref().map(|c| c.rate));
            // Ends when the store (the queue's sender) is dropped.
            tokio::spawn(async move {
                let gives = futures::stream::unfold(rx, |mut rx| async move {
                    rx.recv().await.map(|give| (give, rx))
                });
                gives
                    .for_each_concurrent(GIVE_BACK_CALLS, |give: GiveBack| {
                        let backend = backend.clone();
                        let rate = rates[give.class.index()];
                        async move {
                            let key = quota_key(&backend, give.class, give.client);
                            let Some(rate) = rate else { return };
                            let args = Self::args(&rate, 0, 0, give.reads);
                            let sent: Result<QuotaReply, _> =
                                backend.timed_script(&QUOTA, &key, None, &args).await;
                            if let Err(error) = sent {
                                let reads = give.reads;
                                tracing::debug!(%error, reads, "a swept client's reads not given back");
                            }
                        }
                    })
                    .await;
            });
            tx
        });
        if queue.try_send(give).is_err() {
            tracing::debug!("the read quota's give-back queue is full; reads dropped");
        }
    }

    /// Clients this replica keeps state for, every class (for tests).
    #[doc(hidden)]
    pub fn clients(&self) -> usize {
        self.classes.iter().flatten().map(|c| c.clients.len()).sum()
    }

    /// Reads this replica holds for `client` of `class` — its stock and
    /// what was given back to it — fresh or not (for tests).
    #[doc(hidden)]
    pub fn stocked(&self, class: QuotaClass, client: IpAddr) -> u64 {
        let Some(c) = &self.classes[class.index()] else {
            return 0;
        };
        c.clients.get(&client).map_or(0, |entry| {
            let stock = entry.stock.try_lock().map_or(0, |s| s.left + s.given);
            stock + entry.refunded.load(Relaxed)
        })
    }
}

impl QuotaStore for RedisReadQuota {
    fn reserve(
        &self,
        class: QuotaClass,
        client: IpAddr,
        reads: u64,
    ) -> BoxFuture<'_, Result<Verdict, Unavailable>> {
        Box::pin(async move {
            let Some(c) = &self.classes[class.index()] else {
                return Ok(Verdict::unlimited());
            };
            let now = Instant::now();
            for (client, reads) in c.count(now) {
                self.give_back_later(GiveBack {
                    class,
                    client,
                    reads,
                });
            }
            // A shard's read lock for a client already known.
            let known = c.clients.get(&client).map(|entry| entry.clone());
            let entry = known.unwrap_or_else(|| {
                (c.clients.entry(client))
                    .or_insert_with(|| Arc::new(Client::new(now)))
                    .clone()
            });
            // Reservations of one client wait here for the call in flight
            // for it, counted: what waits is demand the call may take for.
            let queued = Queued::new(&entry, reads);
            let mut stock = entry.stock.lock().await;
            drop(queued);
            let behind = entry.queued.load(Relaxed);
            stock.given += entry.refunded.swap(0, Relaxed);
            let now = self.now();
            let (take, ahead, back) = match stock.plan(&c.rate, now, reads, behind) {
                Plan::Done(verdict) => return Ok(verdict),
                Plan::Call { take, ahead, back } => (take, ahead, back),
            };
            let key = quota_key(&self.backend, class, client);
            let args = Self::args(&c.rate, take, ahead, back);
            let backend = self.backend.clone();
            let mut held = Held {
                client: entry.clone(),
                reads: 0,
            };
            // In a task of its own: dropped, this reservation does not drop
            // what Redis charged (`held` gives it to the stock).
            let call = tokio::spawn(async move {
                let reply: Result<QuotaReply, _> =
                    backend.timed_script(&QUOTA, &key, None, &args).await;
                held.reads = match &reply {
                    Ok(QuotaReply {
                        outcome: Outcome::Granted { granted },
                        ..
                    }) => *granted,
                    // The script did nothing: the stale stock was not given back.
                    Ok(QuotaReply {
                        outcome: Outcome::Late,
                        ..
                    }) => back,
                    _ => 0,
                };
                (reply, held)
            });
            let (reply, mut held) = call.await.map_err(down)?;
            let late = matches!(&reply, Ok(r) if r.outcome == Outcome::Late);
            if late {
                stock.given += held.claim(); // not given back: next call
            } else {
                stock.left += held.claim();
            }
            let reply = reply?;
            let now = self.now();
            match reply.outcome {
                Outcome::Granted { .. } => Ok(stock.granted(&c.rate, now, reply.full_in, reads)),
                Outcome::Refused { wait } => Ok(stock.refused(&c.rate, now, reply.full_in, wait)),
                Outcome::Late => Err(down("the reservation ran after its deadline")),
            }
        })
    }

    fn refund(&self, class: QuotaClass, client: IpAddr, reads: u64) {
        let Some(c) = &self.classes[class.index()] else {
            return;
        };
        if reads == 0 {
            return;
        }
        // A client swept meanwhile comes back: its next call, or the next
        // sweep, gives the reads back on Redis.
        c.clients
            .entry(client)
            .or_insert_with(|| Arc::new(Client::new(Instant::now())))
            .refunded
            .fetch_add(reads, Relaxed);
    }

    fn reserve_at_once(&self, class: QuotaClass, client: IpAddr, reads: u64) -> Option<Verdict> {
        let Some(c) = &self.classes[class.index()] else {
            return Some(Verdict::unlimited());
        };
        let entry = c.clients.get(&client)?;
        let mut stock = entry.stock.try_lock().ok()?;
        stock.given += entry.refunded.swap(0, Relaxed);
        let now = self.now();
        if now.at < stock.until && stock.left >= reads {
            stock.left -= reads;
            Some(stock.reserved(&c.rate, now))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests;
