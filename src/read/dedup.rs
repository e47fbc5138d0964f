//! De-duplication: identical reads are one read anywhere in one inbound
//! HTTP request. (Across requests, for the hosts that opt in, reads in
//! flight at the same moment are coalesced: `coalesce.rs`.)
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

use crate::seed::random_state;
use foldhash::fast::SeedableRandomState;
use std::collections::hash_map::{Entry, HashMap};
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::Notify;

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
/// finished (cancelled — polled or not —, or a panic), the cell goes back to
/// idle and the waiters are woken, so one of them runs the read instead.
struct Runner<V> {
    cell: Arc<Cell<V>>,
    finished: bool,
}

impl<V> Drop for Runner<V> {
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
    /// The key is looked up (its cell made, when it has none) as this is
    /// called, not when the future is first polled: the future holds the
    /// cell, not the key (a read's future is moved at each level of the
    /// walk, and the key is most of a read's size).
    ///
    /// Cancellation-safe: dropping the returned future while it holds the
    /// read (polled or not) hands the read over to a waiting caller (or the
    /// next one).
    pub(crate) fn get_or_run<F, Fut>(
        &self,
        key: K,
        read: F,
    ) -> impl std::future::Future<Output = (V, Origin)>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = V>,
    {
        let found = self.find_or_create(key);
        async move {
            let runner = match found {
                Ok(cell) => match wait(cell).await {
                    Ok(shared) => return (shared, Origin::Shared),
                    Err(runner) => runner,
                },
                Err(runner) => runner,
            };
            (run(runner, read).await, Origin::Ran)
        }
    }

    /// The cell for `key`: `Ok` if one exists, `Err` with a new one
    /// (already running, for this caller to run) if not.
    fn find_or_create(&self, key: K) -> Result<Arc<Cell<V>>, Runner<V>> {
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
                Err(Runner {
                    cell,
                    finished: false,
                })
            }
        }
    }
}

/// The value of `cell`, once another caller's read stored it (`Ok`); or
/// the read to run, when its runner went away (`Err`).
async fn wait<V: Clone>(cell: Arc<Cell<V>>) -> Result<V, Runner<V>> {
    loop {
        let done = {
            let mut state = cell.lock();
            match &mut *state {
                State::Done(value) => return Ok(value.clone()),
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
    Err(Runner {
        cell,
        finished: false,
    })
}

/// Runs the read for `runner`'s cell, which is marked running.
async fn run<V: Clone, F, Fut>(runner: Runner<V>, read: F) -> V
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = V>,
{
    let value = read().await;
    runner.finish(value.clone());
    value
}

impl<V> Runner<V> {
    /// Stores the read's `value` for everyone, and wakes the waiters.
    fn finish(mut self, value: V) {
        let waited = {
            let mut state = self.cell.lock();
            let waited = matches!(*state, State::Running { waited: true });
            *state = State::Done(value);
            waited
        };
        self.finished = true;
        if waited {
            self.cell.done.notify_waiters();
        }
    }
}

impl<K, V> std::fmt::Debug for Dedup<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dedup").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
