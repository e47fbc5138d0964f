//! Memory: what the requests in flight hold, bounded per request and for
//! the whole process, counted while it is built.
//!
//! The budget bounds how many reads one request makes; this bounds what it
//! holds. A small query can ask for an answer far larger than itself
//! (aliases × lists × long upstream strings), and an answer tree is built
//! whole before any writer sees it, so a bound on the bytes written comes
//! too late. Here the answer is counted as resolvers produce it.
//!
//! **How it works.**
//! - Each request has a [`RequestMemory`]. The extension's `resolve` hook
//!   charges it every value a field or list item resolves to
//!   ([`weigh`]: a fixed cost per value for the tree's own structure, plus
//!   its string bytes) and, while a resolve runs, what its future and its
//!   resolver's objects hold ([`PENDING_WEIGHT`]); the read path charges it
//!   every upstream body the request keeps.
//! - The answer's part is bounded by `http.max_answer_bytes`. Everything the
//!   request holds is also taken from the engine's [`MemoryPool`]
//!   (`http.max_inflight_bytes`), in blocks of [`BLOCK`] bytes so that the
//!   shared counter is touched once per block, not once per field; the
//!   request gives its blocks back when its scope is dropped.
//! - Past either bound the request **trips**: from then on every resolve
//!   parks instead of running (nothing more is read, built or allocated), the
//!   runner that raced each operation against the trip drops the operations
//!   — and with them everything built so far — and the whole request answers
//!   `RESPONSE_TOO_LARGE` (its own bound) or `OVERLOADED` (the process's).
//!   A trip is final for the request; other requests are untouched.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use tokio::sync::Notify;

/// What a request takes from the pool at a time.
pub(crate) const BLOCK: usize = 64 << 10;

/// The cost of one value of an answer tree beyond its string bytes
/// (async-graphql's `Value` is 72 bytes, plus allocator slack), wherever it
/// sits: in an object or in a list.
pub(crate) const VALUE_WEIGHT: usize = 80;

/// The cost of one entry of an object beyond its value: the key, the hash,
/// the map's index and its growth slack (maps grow by doubling). Counted
/// when the object is resolved, for every entry — `__typename` included,
/// which async-graphql inserts without a resolve of its own.
pub(crate) const ENTRY_WEIGHT: usize = 112;

/// What a resolve holds while it runs, beyond the value it will produce:
/// its future (async-graphql boxes one per field, with its context and
/// `ResolveInfo`, plus the resolver's own state) and the objects its
/// resolver returned, until their fields are resolved. Counted from the
/// resolve's start to its end, so an operation with thousands of fields
/// waiting on reads is counted as it waits. Measured against peak RSS in
/// `gateway/tests/memory.rs`.
pub(crate) const PENDING_WEIGHT: usize = 4096;

/// The memory every request in flight may hold at once (answers being built
/// and upstream bodies kept): one per engine.
#[derive(Debug)]
pub(crate) struct MemoryPool {
    max: usize,
    used: AtomicUsize,
}

impl MemoryPool {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            max,
            used: AtomicUsize::new(0),
        }
    }

    /// Takes `bytes`, or nothing when that would pass the bound.
    fn take(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Relaxed, Relaxed, |used| {
                let after = used.checked_add(bytes)?;
                (after <= self.max).then_some(after)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Relaxed);
    }

    /// Bytes taken by the requests in flight.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used.load(Relaxed)
    }
}

/// Why a request's memory bound stopped it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Trip {
    /// Its answer passed `http.max_answer_bytes`.
    AnswerTooLarge { max: usize },
    /// The process's requests in flight hold `http.max_inflight_bytes`.
    ProcessFull { max: usize },
}

impl Trip {
    /// The whole HTTP answer for a request stopped by this trip.
    pub(crate) fn rejection(self) -> crate::error::Rejection {
        match self {
            Self::AnswerTooLarge { max } => crate::error::Rejection::ResponseTooLarge { max },
            Self::ProcessFull { max } => crate::error::Rejection::Overloaded { max },
        }
    }
}

const NOT_TRIPPED: u8 = 0;
const ANSWER: u8 = 1;
const PROCESS: u8 = 2;

/// What one inbound request holds: its answer being built and the upstream
/// bodies it keeps (see the module docs).
#[derive(Debug)]
pub(crate) struct RequestMemory {
    pool: Arc<MemoryPool>,
    max_answer: usize,
    /// The answer's counted bytes.
    answer: AtomicUsize,
    /// Everything counted: the answer and the kept bodies.
    held: AtomicUsize,
    /// Taken from the pool (whole blocks, at least `held`).
    reserved: AtomicUsize,
    trip: AtomicU8,
    tripped: Notify,
}

impl RequestMemory {
    pub(crate) fn new(pool: Arc<MemoryPool>, max_answer: usize) -> Self {
        Self {
            pool,
            max_answer,
            answer: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
            reserved: AtomicUsize::new(0),
            trip: AtomicU8::new(NOT_TRIPPED),
            tripped: Notify::new(),
        }
    }

    /// Counts `bytes` more of the answer. `false`: the request has tripped
    /// (now or before) and must stop building.
    pub(crate) fn answer(&self, bytes: usize) -> bool {
        let answer = self.answer.fetch_add(bytes, Relaxed).saturating_add(bytes);
        if answer > self.max_answer {
            self.stop(ANSWER);
            return false;
        }
        self.hold(bytes)
    }

    /// Counts `bytes` of the answer as given back (a resolve that ended:
    /// its pending weight). What the request took from the pool stays
    /// taken until the request ends: the pool holds each request's peak.
    pub(crate) fn release_answer(&self, bytes: usize) {
        self.answer.fetch_sub(bytes, Relaxed);
        self.held.fetch_sub(bytes, Relaxed);
    }

    /// Counts `bytes` more held by the request (a kept upstream body, or
    /// the answer through [`answer`](Self::answer)). `false`: the process
    /// bound is reached (the request has tripped) or the request had tripped.
    pub(crate) fn hold(&self, bytes: usize) -> bool {
        let held = self.held.fetch_add(bytes, Relaxed).saturating_add(bytes);
        let reserved = self.reserved.load(Relaxed);
        if held > reserved {
            // Whole blocks; two racing callers may both take some, which
            // only reserves a little early (given back with the rest).
            let need = (held - reserved).div_ceil(BLOCK) * BLOCK;
            if !self.pool.take(need) {
                self.stop(PROCESS);
                return false;
            }
            self.reserved.fetch_add(need, Relaxed);
        }
        self.trip.load(Relaxed) == NOT_TRIPPED
    }

    fn stop(&self, why: u8) {
        if self
            .trip
            .compare_exchange(NOT_TRIPPED, why, Relaxed, Relaxed)
            .is_ok()
        {
            crate::metrics::memory_trip(why == PROCESS);
        }
        self.tripped.notify_waiters();
    }

    /// Whether (and why) the request has tripped.
    pub(crate) fn trip(&self) -> Option<Trip> {
        match self.trip.load(Relaxed) {
            NOT_TRIPPED => None,
            ANSWER => Some(Trip::AnswerTooLarge {
                max: self.max_answer,
            }),
            _ => Some(Trip::ProcessFull { max: self.pool.max }),
        }
    }

    /// Resolves when the request trips.
    pub(crate) async fn tripped(&self) -> Trip {
        loop {
            let notified = self.tripped.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(trip) = self.trip() {
                return trip;
            }
            notified.await;
        }
    }
}

impl Drop for RequestMemory {
    fn drop(&mut self) {
        self.pool.give_back(*self.reserved.get_mut());
    }
}

/// What one resolved value adds to the answer: [`VALUE_WEIGHT`] plus its
/// own bytes, and an object's entries ([`ENTRY_WEIGHT`] each; their values
/// were counted by their own resolves). `deep`: the value's children were
/// not resolved (and counted) one by one — a custom scalar's object or list
/// — so they count here.
pub(crate) fn weigh(value: &async_graphql::Value, deep: bool) -> usize {
    use async_graphql::Value;
    VALUE_WEIGHT
        + match value {
            Value::String(s) => s.len(),
            Value::Binary(b) => b.len(),
            Value::List(items) if deep => items.iter().map(|v| weigh(v, true)).sum(),
            Value::Object(map) if deep => map
                .iter()
                .map(|(k, v)| ENTRY_WEIGHT + k.len() + weigh(v, true))
                .sum(),
            Value::Object(map) => map.len() * ENTRY_WEIGHT,
            _ => 0,
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_trips_past_its_bound_and_gives_its_blocks_back() {
        let pool = Arc::new(MemoryPool::new(1 << 20));
        let memory = RequestMemory::new(pool.clone(), 100_000);
        assert!(memory.answer(60_000));
        assert_eq!(pool.used(), BLOCK);
        assert!(!memory.answer(60_000));
        assert_eq!(memory.trip(), Some(Trip::AnswerTooLarge { max: 100_000 }));
        assert!(!memory.hold(1), "a tripped request stays stopped");
        drop(memory);
        assert_eq!(pool.used(), 0);
    }

    #[test]
    fn the_pool_trips_the_request_that_would_pass_it() {
        let pool = Arc::new(MemoryPool::new(2 * BLOCK));
        let a = RequestMemory::new(pool.clone(), usize::MAX);
        let b = RequestMemory::new(pool.clone(), usize::MAX);
        assert!(a.hold(BLOCK + 1));
        assert!(!b.hold(1));
        assert_eq!(b.trip(), Some(Trip::ProcessFull { max: 2 * BLOCK }));
        assert_eq!(a.trip(), None, "the request that holds it goes on");
        drop(a);
        let c = RequestMemory::new(pool.clone(), usize::MAX);
        assert!(c.hold(BLOCK), "what a request held is given back");
    }

    #[tokio::test]
    async fn a_waiter_hears_the_trip() {
        let memory = Arc::new(RequestMemory::new(
            Arc::new(MemoryPool::new(usize::MAX)),
            10,
        ));
        let waiter = tokio::spawn({
            let memory = memory.clone();
            async move { memory.tripped().await }
        });
        tokio::task::yield_now().await;
        assert!(!memory.answer(11));
        assert_eq!(waiter.await.unwrap(), Trip::AnswerTooLarge { max: 10 });
    }

    #[test]
    fn a_string_weighs_its_bytes() {
        let s = async_graphql::Value::String("x".repeat(1000));
        assert_eq!(weigh(&s, false), VALUE_WEIGHT + 1000);
        let list = async_graphql::Value::List(vec![s.clone(), s]);
        assert_eq!(
            weigh(&list, false),
            VALUE_WEIGHT,
            "items count on their own"
        );
        assert_eq!(weigh(&list, true), VALUE_WEIGHT * 3 + 2000);
    }
}
