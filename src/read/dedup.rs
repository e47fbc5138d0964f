//! De-duplication: identical reads are one read — anywhere in one inbound
//! HTTP request ([`Dedup`]), and, for the hosts that opt in, while in flight
//! at the same moment in different requests ([`Coalesce`]).
//!
//! # Within a request
//!
//! Each distinct key owns one single-flight cell in a map (one
//! `std::sync::Mutex<HashMap>`: a request's reads are few and the lock is
//! held for one lookup, so one table beats a sharded map's many small ones). The first
//! caller for a key creates the cell already *running* and runs the read;
//! concurrent callers for the same key wait on the same cell and get the same
//! result (single-flight), and later callers find it completed (a cache for
//! the rest of the request). The outcome — success or error — is the read's
//! outcome for the whole request: a second identical selection costs nothing
//! and sees the same answer.
//!
//! A cell is a `std::sync::Mutex` around its state (idle, running, done) and a
//! `tokio::sync::Notify` for its waiters. The caller that runs the read takes
//! the lock once more, to store the value; the `Notify` is only touched when
//! someone actually waited.
//!
//! Cancellation never poisons a key: if the caller running the read is dropped
//! (its operation was cancelled) or panics, the cell goes back to idle and its
//! waiters are woken; the first of them runs the read itself, the others wait
//! for it. The map lives exactly as long as the request.
//!
//! # Across requests: coalescing
//!
//! One table per engine holds the shared reads *in flight*, by key (seeded
//! hash, like the request's table), each a [`Flight`]: a
//! `tokio::sync::watch` receiver that will hold the read's outcome. A caller
//! that finds its key there joins: it clones the receiver and waits for the
//! outcome under its own time limit. A caller that finds nothing and is
//! admitted leads ([`Coalesce::join_or_lead`]): under the table's lock it
//! checks once more (someone may have started the read while it waited for
//! its slots), runs its `lead` step (the caller's charge; it must not wait)
//! and registers the flight, then *spawns* the read. The read runs in its own
//! task, so no caller's cancellation cancels it; it must bound itself (the
//! acquisition point gives it the read timeout). When it ends, the task takes
//! its entry out of the table first and then publishes the outcome, so a
//! caller that arrives after the read ended finds nothing and reads afresh:
//! nothing is cached across requests. The entry is taken out by a guard the
//! task owns, on every path (an answer, an error, a panic, the runtime
//! shutting down); a flight whose task ended without an outcome answers
//! `None`. Entries are as many as the shared reads in flight, each of which
//! holds a host slot, so the hosts' caps bound the table.
//!
//! A caller that has to wait for its slots before it could lead waits for
//! a flight of its key to start, too: each start wakes the callers waiting
//! on one of [`STARTED_SHARDS`] `Notify`s (chosen by the key's hash), which
//! look again. One that finds the flight drops its wait for the slots
//! before it joins (the acquisition point races the two), so a joiner keeps
//! no place in a host's queue and no slot: the flights hold the only host
//! slots the coalesced reads use.

use crate::seed::random_state;
use foldhash::fast::SeedableRandomState;
use std::collections::hash_map::{Entry, HashMap};
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::futures::Notified;
use tokio::sync::{watch, Notify};

/// Distinct reads the table holds before it first grows (one allocation).
const FIRST_CAPACITY: usize = 7;

/// A single-flight cache for one request.
pub(crate) struct Dedup<K, V> {
    cells: Mutex<Cells<K, V>>,
}

/// Keys are URLs a client can steer, so the hash is seeded per table
/// (`seed.rs`).
type Cells<K, V> = HashMap<K, Arc<Cell<V>>, SeedableRandomState>;

/// Whether a value came from a read this caller ran or from one it shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// This caller ran the read.
    Ran,
    /// Another caller's read (in flight or completed) answered.
    Shared,
}

/// One key's single-flight cell.
struct Cell<V> {
    state: Mutex<State<V>>,
    /// Wakes the waiters when the read finishes or its runner goes away.
    done: Notify,
}

enum State<V> {
    /// Nobody runs the read (its runner was cancelled): the next caller runs it.
    Idle,
    /// A caller runs the read; `waited`: someone waits on `done`.
    Running { waited: bool },
    /// The read's outcome, for everyone from now on.
    Done(V),
}

impl<V> Cell<V> {
    fn lock(&self) -> MutexGuard<'_, State<V>> {
        // A panic never leaves the state half-written (each section is one
        // assignment), so a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Held by the caller running a read: if it is dropped before the read
/// finished (cancelled, or a panic), the cell goes back to idle and the
/// waiters are woken, so one of them runs the read instead.
struct Runner<'a, V> {
    cell: &'a Cell<V>,
    finished: bool,
}

impl<V> Drop for Runner<'_, V> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let waited = {
            let mut state = self.cell.lock();
            let waited = matches!(*state, State::Running { waited: true });
            *state = State::Idle;
            waited
        };
        if waited {
            self.cell.done.notify_waiters();
        }
    }
}

impl<K: Eq + Hash, V: Clone> Dedup<K, V> {
    /// An empty cache.
    pub(crate) fn new() -> Self {
        Self {
            cells: Mutex::new(HashMap::with_hasher(random_state())),
        }
    }

    fn cells(&self) -> MutexGuard<'_, Cells<K, V>> {
        // Each section is one map operation: a poisoned map is still whole.
        self.cells.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The value for `key`: shared when a read for it exists, else `read()`'s.
    ///
    /// Cancellation-safe: dropping the returned future while it runs the read
    /// hands the read over to a waiting caller (or the next one).
    pub(crate) async fn get_or_run<F, Fut>(&self, key: K, read: F) -> (V, Origin)
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = V>,
    {
        let cell = match self.find_or_create(key) {
            Ok(cell) => cell,
            Err(created) => return (run(&created, read).await, Origin::Ran),
        };
        loop {
            let done = {
                let mut state = cell.lock();
                match &mut *state {
                    State::Done(value) => return (value.clone(), Origin::Shared),
                    State::Idle => {
                        *state = State::Running { waited: false };
                        break;
                    }
                    State::Running { waited } => {
                        *waited = true;
                        // Registered before the lock is released: the runner
                        // can only finish (and notify) after this.
                        cell.done.notified()
                    }
                }
            };
            done.await;
        }
        (run(&cell, read).await, Origin::Ran)
    }

    /// The cell for `key`: `Ok` if one exists, `Err` with a new one (already
    /// running, for this caller to run) if not.
    fn find_or_create(&self, key: K) -> Result<Arc<Cell<V>>, Arc<Cell<V>>> {
        let mut cells = self.cells();
        if cells.capacity() == 0 {
            // The first read of the request sizes the table once for a
            // typical request's reads, instead of growing it (and moving
            // every cell) at the 1st, 4th and 8th distinct read.
            cells.reserve(FIRST_CAPACITY);
        }
        match cells.entry(key) {
            Entry::Occupied(cell) => Ok(cell.get().clone()),
            Entry::Vacant(vacant) => {
                let cell = Arc::new(Cell {
                    state: Mutex::new(State::Running { waited: false }),
                    done: Notify::new(),
                });
                vacant.insert(cell.clone());
                Err(cell)
            }
        }
    }
}

/// Runs the read for `cell`, which the caller has marked running.
async fn run<V: Clone, F, Fut>(cell: &Cell<V>, read: F) -> V
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = V>,
{
    let mut runner = Runner {
        cell,
        finished: false,
    };
    let value = read().await;
    let waited = {
        let mut state = cell.lock();
        let waited = matches!(*state, State::Running { waited: true });
        *state = State::Done(value.clone());
        waited
    };
    runner.finished = true;
    if waited {
        cell.done.notify_waiters();
    }
    value
}

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
    pub(crate) fn find(&self, key: &K) -> Option<Flight<V>> {
        self.flights().get(key).cloned()
    }

    /// Completes when a flight starts for a key of `key`'s shard (enable it
    /// before [`find`](Self::find), then look again when it completes).
    pub(crate) fn started(&self, key: &K) -> Notified<'_> {
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

impl<K, V> std::fmt::Debug for Dedup<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dedup").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
