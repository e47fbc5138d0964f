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
//!   fresh (charged less than [`HOLD`](stock::HOLD), a second, ago): no call. Otherwise
//!   one call takes what the stock lacks **plus reads ahead** for that
//!   client's next requests on this replica: as many as it reserved here in
//!   a recent window of 250 ms (or as the reservations waiting for this
//!   call ask, if more), three times over (about 750 ms of its demand), and
//!   never more than half of what the client has left after the
//!   reservation — so near the limit the takes shrink to the need, and a
//!   client seen once takes nothing ahead. The same call gives back the
//!   stale stock (older than [`HOLD`](stock::HOLD)).
//! - **Reserving nothing** (a request that reads nothing: `fanoutQuota`)
//!   shows the client's quota as the fleet has it: from Redis's answer for
//!   that client if this replica had one within a [`HOLD`](stock::HOLD),
//!   else from one call that takes nothing (and gives back the stale
//!   stock) — so at most a call per client per second on a replica, not
//!   one per request, and a replica that never saw the client does not
//!   show it full while the fleet has it spent.
//! - **Refunding** what a request did not spend costs no call: the reads
//!   wait here and the client's next call gives them back on Redis (where
//!   the script caps them at a full bucket) — or, if no call for that
//!   client comes while its stock is fresh (it went to another replica),
//!   a task that runs every [`HOLD`](stock::HOLD) gives them back with the
//!   stale stock, so the other replicas see them within about two
//!   seconds. It looks only at the clients that owe reads (listed once
//!   each as they come to), a chunk at a time: a replica holding a
//!   million idle clients pays nothing for them. They are never handed out again from here: charged long
//!   ago, they could otherwise come back fresh on top of a bucket that has
//!   refilled meanwhile.
//! - **A margin**: every call takes at least two reads ahead (within half
//!   of what is left), so a read past its request's estimate — a redirect
//!   hop, a token fetch and its retry — finds one here at once.
//! - **A refusal** is kept here for up to a [`HOLD`](stock::HOLD): the
//!   reply says when the client's bucket is full again, and for a second
//!   a reservation that cannot fit by what it said is refused here, with
//!   its retry time (so a client over its quota costs a replica at most a
//!   call a second, not one per request); then the next one asks Redis
//!   again. What another replica gave back meanwhile is not seen for that
//!   second: the fleet is that much stricter for a moment, never more
//!   lenient.
//! - **One call at a time per client**: a client's reservations wait, on a
//!   `tokio::sync::Mutex` of its own, for the call in flight for it, and
//!   then find its answer in the stock.
//!
//! What the fleet can spend: every read a request sends was charged on
//! Redis at most a [`HOLD`](stock::HOLD) before it was handed out, so the reads of one
//! client over any window stay within its burst plus what its rate refills
//! over the window and one [`HOLD`](stock::HOLD) more — and since a take ahead is at
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
//! applies `failure_mode` (the in-process store, or 503). The in-process
//! store then starts from what this replica last heard of the client
//! ([`QuotaStore::last_known`]: when its bucket is full again, as Redis's
//! last answer for it said), or, for a client it never heard of (or
//! forgot), from half its burst — never from a fresh full bucket
//! (`inbound/quota/local.rs`). The stale stock
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
use crate::config::QuotaConfig;
use crate::error::Unavailable;
use crate::inbound::quota::{QuotaClass, QuotaStore, Rate, Verdict};
use futures::future::BoxFuture;
use futures::StreamExt;
use std::net::IpAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Swept clients' reads waiting to go back on Redis, at most.
const GIVE_BACK_QUEUE: usize = 65_536;
/// Give-back calls in flight at once.
const GIVE_BACK_CALLS: usize = 8;
/// Owing clients the flusher looks at between two yields.
const FLUSH_CHUNK: usize = 1024;

/// `<prefix>:quota:<class>:<client>`.
fn quota_key(backend: &RedisBackend, class: QuotaClass, client: IpAddr) -> String {
    backend.key("quota", &format!("{}:{client}", class.name()))
}

/// Reads to give back on Redis for a client forgotten here, or whose stock
/// went stale.
#[derive(Debug)]
struct GiveBack {
    class: QuotaClass,
    client: IpAddr,
    reads: u64,
}

impl GiveBack {
    /// Queues it for the give-back task; past [`GIVE_BACK_QUEUE`] waiting,
    /// dropped (the client finds the fleet stricter until its bucket
    /// refills).
    fn queue_on(self, queue: &mpsc::Sender<GiveBack>) {
        if queue.try_send(self).is_err() {
            tracing::debug!("the read quota's give-back queue is full; reads dropped");
        }
    }
}

/// The clients' read quotas on Redis, shared by every replica on the same
/// keys: a [`QuotaStore`] for
/// [`EngineBuilder::quota_store`](crate::EngineBuilder::quota_store).
///
/// One key per client and class, one Lua script per call (time from
/// `TIME`); each replica takes a reservation's reads plus some ahead for
/// the client's next requests (at most half of what it has left), hands
/// them out for up to a second, gives back what requests did not spend
/// with its next call for that client or within about two seconds, and
/// keeps a refusal for up to a second. How it works in full:
/// `src/backends/redis/read_quota.rs`.
pub struct RedisReadQuota {
    backend: RedisBackend,
    origin: Instant,
    classes: Arc<[Option<Class>; 2]>,
    /// The queue of the task that gives swept clients' reads back, started
    /// by the first sweep or refund.
    give_back: OnceLock<mpsc::Sender<GiveBack>>,
    /// The task that gives stale clients' reads back every [`HOLD`](stock::HOLD),
    /// started by the first refund.
    flusher: OnceLock<()>,
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
            classes: Arc::new([public.map(Class::new), internal.map(Class::new)]),
            give_back: OnceLock::new(),
            flusher: OnceLock::new(),
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
        Now::since(self.origin)
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

    /// Queues a client's reads to go back on Redis.
    fn give_back_later(&self, give: GiveBack) {
        give.queue_on(self.give_back_queue());
    }

    /// Every [`HOLD`](stock::HOLD), until the store is dropped: the reads
    /// of owing clients whose stock went stale go back on Redis
    /// (`Class::stale`; its work is the clients listed in [`Owing`](clients::Owing), not
    /// every client kept). Started by the first refund or stock, in a
    /// runtime (outside one, they wait for the client's next call here, or
    /// the sweep).
    fn start_flusher(&self) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        self.flusher.get_or_init(|| {
            let (classes, queue) = (
                Arc::downgrade(&self.classes),
                self.give_back_queue().clone(),
            );
            let origin = self.origin;
            tokio::spawn(async move {
                let mut every = tokio::time::interval(HOLD);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    every.tick().await;
                    let Some(classes) = classes.upgrade() else {
                        return;
                    };
                    let now = Now::since(origin);
                    for class in [QuotaClass::Public, QuotaClass::Internal] {
                        let Some(c) = &classes[class.index()] else {
                            continue;
                        };
                        let due = std::mem::take(&mut *c.owing.list());
                        // A chunk at a time, yielding between: a flood's
                        // refunds do not hold a worker.
                        for due in due.chunks(FLUSH_CHUNK) {
                            for (client, reads) in c.stale(now, due) {
                                let give = GiveBack {
                                    class,
                                    client,
                                    reads,
                                };
                                give.queue_on(&queue);
                            }
                            tokio::task::yield_now().await;
                        }
                    }
                }
            });
        });
    }

    /// The give-back task's queue, the task started on first use.
    fn give_back_queue(&self) -> &mpsc::Sender<GiveBack> {
        self.give_back.get_or_init(|| {
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
                                tracing::debug!(%error, reads, "a client's reads not given back");
                            }
                        }
                    })
                    .await;
            });
            tx
        })
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
                ip: client,
                owing: c.owing.clone(),
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
            if stock.left > 0 || stock.given > 0 {
                // If no call for it comes here, the flusher gives them back.
                c.owing.add(client, &entry);
                self.start_flusher();
            }
            let reply = reply?;
            let now = self.now();
            let verdict = match reply.outcome {
                Outcome::Granted { .. } => stock.granted(&c.rate, now, reply.full_in, reads),
                // Nothing asked is never refused (a bucket owed past its
                // burst, by a replica's stale share).
                Outcome::Refused { .. } if reads == 0 => Verdict::Reserved {
                    remaining: 0,
                    full_in: reply.full_in,
                },
                Outcome::Refused { wait } => stock.refused(&c.rate, now, reply.full_in, wait),
                Outcome::Late => return Err(down("the reservation ran after its deadline")),
            };
            entry.fleet_full_at.store(stock.full_at.max(1), Relaxed);
            Ok(verdict)
        })
    }

    fn refund(&self, class: QuotaClass, client: IpAddr, reads: u64) {
        let Some(c) = &self.classes[class.index()] else {
            return;
        };
        if reads == 0 {
            return;
        }
        // A client swept meanwhile comes back: its next call, the flusher
        // once its stock is stale, or the next sweep gives the reads back.
        self.start_flusher();
        let entry = (c.clients.entry(client))
            .or_insert_with(|| Arc::new(Client::new(Instant::now())))
            .clone();
        entry.refunded.fetch_add(reads, Relaxed);
        c.owing.add(client, &entry);
    }

    fn last_known(&self, class: QuotaClass, client: IpAddr) -> Option<Duration> {
        let c = self.classes[class.index()].as_ref()?;
        let full_at = c.clients.get(&client)?.fleet_full_at.load(Relaxed);
        (full_at > 0).then(|| Duration::from_nanos(full_at.saturating_sub(self.now().ns)))
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

mod clients;
mod reply;
mod stock;
#[cfg(test)]
mod tests;

use clients::{Class, Client, Held, Queued};
use reply::{Outcome, QuotaReply, QUOTA};
use stock::{Now, Plan, HOLD};
