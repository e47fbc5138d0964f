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

mod lease;
mod pool;
mod shares;

pub(crate) use pool::{MemoryPool, PoolBytes};
pub(crate) use shares::{ClientKey, SocketMemory};

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
/// the map's index and its growth slack (maps grow by doubling, and a small
/// one starts with room for several). Counted when the object is resolved,
/// for every entry — `__typename` included, which async-graphql inserts
/// without a resolve of its own (its name allocated once per entry).
/// Measured with small objects of `__typename` aliases
/// (`gateway/tests/memory_attacks.rs`): at 112 bytes they held 1.9× what
/// was counted.
pub(crate) const ENTRY_WEIGHT: usize = 176;

/// What a resolve holds while it runs, beyond the value it will produce:
/// its future (async-graphql boxes one per field, with its context and
/// `ResolveInfo`, plus the resolver's own state) and the objects its
/// resolver returned, until their fields are resolved. Counted from the
/// resolve's start to its end, so an operation with thousands of fields
/// waiting on reads is counted as it waits. Measured against peak RSS in
/// `gateway/tests/memory.rs` (a batch of 20 operations, 16,000 rows waiting
/// on 40 shared reads, about 26,000 resolves pending at once): 2.5 KiB each
/// once a read waiting on another holds a small future (1.3 KiB; it held
/// 3.4 KiB with the send's state inline, and the batch +139 MiB, now +100).
pub(crate) const PENDING_WEIGHT: usize = 3072;

/// What one field error holds beyond its message and its path: the
/// `ServerError` and its slot in the operation's list of errors (grown by
/// doubling), its location and its source, and its extensions' map (one
/// B-tree node holds 11 entries: about 1 KiB, however few it has).
/// Measured against peak RSS in `gateway/tests/memory_attacks.rs`
/// (198,000 errors of `tags(first: 0)`, 940,000 of `manifest` on tags
/// outside the grammar): an error held 1.8 to 2.6 KiB where it was counted
/// as a null (320 bytes).
pub(crate) const ERROR_WEIGHT: usize = 1536;

/// One segment of an error's path beyond its name's bytes: its slot, and
/// the `String` a field name is copied into.
pub(crate) const PATH_SEGMENT_WEIGHT: usize = 64;

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

    /// Counts a resolve that ended: its `pending` weight given back and
    /// the `bytes` of the value it produced counted, in one step (the
    /// answer never dips below what it holds between the two). `false`:
    /// the request has tripped (now or before) and must stop building.
    pub(crate) fn settle_answer(&self, pending: usize, bytes: usize) -> bool {
        if bytes >= pending {
            return self.answer(bytes - pending);
        }
        self.release_answer(pending - bytes);
        self.trip.load(Relaxed) == NOT_TRIPPED
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
            _ => Some(Trip::ProcessFull {
                max: self.pool.max(),
            }),
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
            Value::String(s) => s.capacity(),
            Value::Binary(b) => b.len(),
            // A list holds its capacity: one parsed from JSON grew by
            // doubling, so one just past a power of two holds nearly twice
            // its items' places.
            Value::List(items) => {
                let slack = (items.capacity() - items.len()) * VALUE_WEIGHT;
                slack
                    + if deep {
                        items.iter().map(|v| weigh(v, true)).sum()
                    } else {
                        0
                    }
            }
            Value::Object(map) if deep => map
                .iter()
                .map(|(k, v)| ENTRY_WEIGHT + k.len() + weigh(v, true))
                .sum(),
            Value::Object(map) => map.len() * ENTRY_WEIGHT,
            _ => 0,
        }
}

/// What a field error adds to the answer ([`ERROR_WEIGHT`], its message,
/// its extensions and its path). `depth`: how deep its field is, when its
/// path is not set yet.
pub(crate) fn weigh_error(error: &async_graphql::ServerError, depth: usize) -> usize {
    use async_graphql::PathSegment;
    let path: usize = error
        .path
        .iter()
        .map(|segment| match segment {
            PathSegment::Field(name) => PATH_SEGMENT_WEIGHT + name.len(),
            PathSegment::Index(_) => PATH_SEGMENT_WEIGHT,
        })
        .sum();
    let unset = depth.saturating_sub(error.path.len()) * PATH_SEGMENT_WEIGHT;
    let extensions = error.extensions.as_ref().map_or(0, |ext| {
        let mut size = Counted(0);
        let _ = serde_json::to_writer(&mut size, ext);
        size.0
    });
    ERROR_WEIGHT + error.message.len() + extensions + path + unset
}

/// A writer that only counts.
struct Counted(usize);

impl std::io::Write for Counted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
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
    fn a_settled_resolve_counts_its_value_in_place_of_its_pending_weight() {
        let memory = RequestMemory::new(Arc::new(MemoryPool::new(1 << 20)), 10_000);
        assert!(memory.answer(3_000), "pending");
        assert!(memory.settle_answer(3_000, 200), "a small value");
        assert_eq!(memory.answer.load(Relaxed), 200);
        assert_eq!(memory.held.load(Relaxed), 200);
        assert!(memory.answer(3_000), "pending");
        assert!(memory.settle_answer(3_000, 5_000), "a large value");
        assert_eq!(memory.answer.load(Relaxed), 5_200);
        assert!(memory.answer(3_000), "pending");
        assert!(!memory.settle_answer(3_000, 6_000), "past the bound");
        assert_eq!(memory.trip(), Some(Trip::AnswerTooLarge { max: 10_000 }));
        assert!(
            !memory.settle_answer(3_000, 0),
            "a tripped request stops, whatever it gives back"
        );
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
    fn an_error_weighs_its_message_extensions_and_path() {
        use async_graphql::{ErrorExtensionValues, PathSegment, ServerError};
        let mut error = ServerError::new("x".repeat(100), None);
        assert_eq!(weigh_error(&error, 0), ERROR_WEIGHT + 100);
        assert_eq!(
            weigh_error(&error, 3),
            ERROR_WEIGHT + 100 + 3 * PATH_SEGMENT_WEIGHT,
            "a path not set yet counts by the field's depth"
        );
        error.path = vec![PathSegment::Field("abc".into()), PathSegment::Index(7)];
        let mut ext = ErrorExtensionValues::default();
        ext.set("code", "X");
        error.extensions = Some(ext);
        assert_eq!(
            weigh_error(&error, 2),
            ERROR_WEIGHT + 100 + r#"{"code":"X"}"#.len() + 2 * PATH_SEGMENT_WEIGHT + 3
        );
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

    #[test]
    fn a_list_is_weighed_by_the_places_it_holds_not_its_items() {
        // As a client's variables arrive: parsed from JSON, the list grown
        // by doubling as its items came.
        let items = (1 << 12) + 1;
        let json = format!("[{}]", vec!["0"; items].join(","));
        let value: async_graphql::Value = serde_json::from_str(&json).unwrap();
        let async_graphql::Value::List(list) = &value else {
            panic!("a list");
        };
        assert_eq!(list.len(), items);
        let held = list.capacity() * std::mem::size_of::<async_graphql::Value>();
        assert!(list.capacity() > items, "grown past its items");
        assert!(
            weigh(&value, true) >= held,
            "{} weighed for {held} bytes held",
            weigh(&value, true)
        );
    }
}
