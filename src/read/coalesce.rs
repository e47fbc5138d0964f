//! Coalescing: identical reads in flight at the same moment in different
//! inbound requests are one read, for the hosts that opt in
//! (`[hosts."HOST:PORT"] coalesce = true`, off by default). This is the one
//! place coalescing is explained; the hub (`read/mod.rs`) runs the steps.
//!
//! # What is shared, and who pays
//!
//! A `GET` or `HEAD` without a body — same URL, same headers
//! (`Authorization` included) — that another inbound request of the engine
//! has in flight is *joined*, not sent:
//!
//! - the joiner is not charged (`used`, `operationReads` and `issued` do not
//!   count it; `ReadCounts::coalesced` and `fanout_coalesced_reads_total`
//!   do), holds no request slot and no host slot, and waits under its own
//!   `min(read_timeout, time left)` (`UPSTREAM_TIMEOUT` /
//!   `DEADLINE_EXCEEDED` when that cuts it);
//! - the budget's refusals come first: a request whose budget is spent (or
//!   whose deadline has passed) is refused even a read it could have
//!   joined — what a request may ask for does not depend on whether another
//!   client happens to be asking the same at that moment;
//! - the leader — the request that sent it — is charged as for any read and
//!   holds its request slot until the answer (or its own timeout, deadline
//!   or cancellation); the send itself, with its host slot, runs in a task
//!   of its own, bounded by the read timeout from when it was sent, so
//!   neither the leader's cancellation nor its deadline cuts it for the
//!   others;
//! - the answer, or an error the upstream or the transport gave, is
//!   everyone's answer; a timeout or a deadline is each request's own; each
//!   request gets its own copy of the response (what it
//!   [`derived`](crate::UpstreamResponse::derived) stays its own), kept
//!   under its own `upstream.max_request_bytes`;
//! - only reads in flight are shared: a read that starts after the shared
//!   one ended is sent afresh (no cache across requests).
//!
//! # How
//!
//! One table per engine ([`Coalesce`]) holds the shared reads *in flight*,
//! by key (seeded hash), each a [`Flight`]: a `tokio::sync::watch` receiver
//! that will hold the read's outcome. A read to a host that coalesces:
//!
//! 1. is refused as any read would be (budget spent, deadline passed);
//! 2. waits for its request slot and host slot *unless a flight of its key
//!    starts first* ([`Coalesce::unless_started`]): each start wakes the
//!    reads waiting on one of [`STARTED_SHARDS`] `Notify`s (chosen by the
//!    key's hash), which look again. A read that finds the flight drops its
//!    wait for the slots before it joins, so a joiner keeps no place in a
//!    host's queue and no slot (one granted meanwhile goes back): the
//!    flights hold the only host slots coalesced reads use;
//! 3. admitted, joins or leads ([`Coalesce::join_or_lead`]): under the
//!    table's lock it looks once more, and either joins (its slots go back,
//!    nothing is charged) or runs its `lead` step (the charge; it must not
//!    wait), registers the flight and *spawns* the send with its host slot.
//!
//! The send runs in its own task, so no caller's cancellation cancels it;
//! it bounds itself by the read timeout. When it ends, the task takes its
//! entry out of the table first and then publishes the outcome, so a read
//! that arrives after it ended finds nothing and is sent afresh. The entry
//! is taken out by a guard the task owns, on every path (an answer, an
//! error, a panic, the runtime shutting down); a flight whose task ended
//! without an outcome answers `None`. Entries are as many as the shared
//! reads in flight, each of which holds a host slot, so the hosts' caps
//! bound the table.

use crate::seed::random_state;
use foldhash::fast::SeedableRandomState;
use std::collections::hash_map::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::futures::Notified;
use tokio::sync::{watch, Notify};

/// How many `Notify`s the callers waiting for a flight to start are spread
/// over (by their key's hash): a start wakes the waiters of one shard only.
const STARTED_SHARDS: usize = 64;

/// The shared reads in flight across the requests of one engine.
pub(crate) struct Coalesce<K, V> {
    flights: Mutex<Flights<K, V>>,
    /// Woken when a flight starts, one per shard of keys.
    started: [Notify; STARTED_SHARDS],
    /// Picks a key's shard (seeded, as the table's keys are steerable).
    shards: SeedableRandomState,
    /// Tells a flight from a later one of the same key.
    next_id: AtomicU64,
}

/// The flights by key, seeded (`seed.rs`).
type Flights<K, V> = HashMap<K, Flight<V>, SeedableRandomState>;

/// A shared read in flight: a handle on its outcome.
#[derive(Clone)]
pub(crate) struct Flight<V> {
    id: u64,
    outcome: watch::Receiver<Option<V>>,
}

impl<V: Clone> Flight<V> {
    /// The read's outcome, once it ends; `None` when its task ended without
    /// one (it panicked, or the runtime shut down).
    pub(crate) async fn outcome(mut self) -> Option<V> {
        let outcome = self.outcome.wait_for(Option::is_some).await;
        outcome.ok().and_then(|value| value.clone())
    }
}

/// What [`Coalesce::join_or_lead`] made of a caller.
pub(crate) enum Role<V> {
    /// The read was in flight already: this caller waits for it.
    Joined(Flight<V>),
    /// This caller's `lead` started the read.
    Led(Flight<V>),
}

/// Owned by a flight's task: takes the flight's entry out of the table when
/// the task ends, whichever way.
struct Leaving<K: Eq + Hash, V> {
    table: Arc<Coalesce<K, V>>,
    key: K,
    id: u64,
}

impl<K: Eq + Hash, V> Drop for Leaving<K, V> {
    fn drop(&mut self) {
        let mut flights = self.table.flights();
        // Only this flight's own entry (a later one is another read).
        if flights.get(&self.key).is_some_and(|f| f.id == self.id) {
            flights.remove(&self.key);
        }
    }
}

impl<K, V> Coalesce<K, V> {
    fn flights(&self) -> MutexGuard<'_, Flights<K, V>> {
        // Each section changes the map at most once: a poisoned map is whole.
        self.flights.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<K, V> Coalesce<K, V>
where
    K: Eq + Hash + Clone + Send + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// An empty table.
    pub(crate) fn new() -> Self {
        Self {
            flights: Mutex::new(HashMap::with_hasher(random_state())),
            started: std::array::from_fn(|_| Notify::new()),
            shards: random_state(),
            next_id: AtomicU64::new(0),
        }
    }

    /// The read in flight for `key`, if there is one.
    fn find(&self, key: &K) -> Option<Flight<V>> {
        self.flights().get(key).cloned()
    }

    /// Completes when a flight starts for a key of `key`'s shard (enable it
    /// before [`find`](Self::find), then look again when it completes).
    fn started(&self, key: &K) -> Notified<'_> {
        self.shard(key).notified()
    }

    /// Joins the read in flight for `key`; or, when there is none, runs
    /// `lead` (under the table's lock: it must not wait) and, if it agrees,
    /// spawns the read it returns as the flight of `key`.
    pub(crate) fn join_or_lead<E, F>(
        self: &Arc<Self>,
        key: K,
        lead: impl FnOnce() -> Result<F, E>,
    ) -> Result<Role<V>, E>
    where
        F: Future<Output = V> + Send + 'static,
    {
        let (flight, task) = {
            let mut flights = self.flights();
            if let Some(flight) = flights.get(&key) {
                return Ok(Role::Joined(flight.clone()));
            }
            let read = lead()?;
            let id = self.next_id.fetch_add(1, Relaxed);
            let (publish, outcome) = watch::channel(None);
            let flight = Flight { id, outcome };
            flights.insert(key.clone(), flight.clone());
            let leaving = Leaving {
                table: self.clone(),
                key: key.clone(),
                id,
            };
            let task = async move {
                let value = read.await;
                // Out of the table before the outcome is public: whoever
                // arrives from now on reads afresh.
                drop(leaving);
                publish.send_replace(Some(value));
            };
            (flight, task)
        };
        // Spawned once the lock is released: a task dropped at once (as by
        // a runtime shutting down) takes its entry out under the lock.
        tokio::spawn(task);
        self.shard(&key).notify_waiters();
        Ok(Role::Led(flight))
    }

    /// The `Notify` of `key`'s shard.
    fn shard(&self, key: &K) -> &Notify {
        &self.started[self.shards.hash_one(key) as usize % STARTED_SHARDS]
    }

    /// Waits for `wait` (a read's slots) unless a flight of `key` starts
    /// first: then `wait` is dropped — its places in the queues, and what
    /// it was granted meanwhile, go back — and the flight is the answer.
    pub(crate) async fn unless_started<T>(
        &self,
        key: &K,
        wait: impl Future<Output = T>,
    ) -> Result<T, Flight<V>> {
        tokio::pin!(wait);
        loop {
            // Enabled before the look, so a start after it wakes this read.
            let started = self.started(key);
            tokio::pin!(started);
            started.as_mut().enable();
            if let Some(flight) = self.find(key) {
                return Err(flight);
            }
            tokio::select! {
                biased;
                () = &mut started => {}
                done = &mut wait => return Ok(done),
            }
        }
    }

    /// Shared reads in flight.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.flights().len()
    }
}

impl<K, V> std::fmt::Debug for Coalesce<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coalesce").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
