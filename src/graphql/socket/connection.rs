//! The scope of one WebSocket connection: a long-lived inbound request.
//!
//! A [`FanoutConnection`] is opened when the client's `connection_init`
//! arrives, and its caller is fixed then: internal only for the exact token
//! (the upgrade request's `x-internal-token` header, or the payload's
//! `"x-internal-token"` key), else a public caller keyed like the limiter
//! keys the upgrade request's client.
//!
//! **Its budget refills.** An HTTP request's budget is spent once; a
//! connection lives for hours, so its budget is a bucket of
//! `subscriptions.burst` reads refilled at `subscriptions.reads_per_minute`
//! (the `internal_` pair for an internal caller), one number kept as the
//! read quota keeps its buckets (`inbound/quota/rate.rs`: the instant it is
//! full again). A new connection starts full.
//!
//! **Each event is a request.** Every event of every subscription on the
//! connection — and every query sent over it — runs in a scope of its own
//! ([`open_event`](FanoutConnection::open_event)): its own de-duplication,
//! deadline and answer memory, at most `budget.max_reads` reads, and each
//! read it sends paid by the connection's bucket too (the budget's `paid_by`:
//! a read the bucket cannot pay for is `FANOUT_BUDGET_EXHAUSTED` at its
//! field, at once, never a wait). With `[quota]` on for the caller's class,
//! the event also reserves on its client's read quota as an HTTP request
//! does, so the same client shares one quota over HTTP and over WebSocket.
//! With `budget.refuse_over_estimate` and a cost table, an operation whose
//! worst case one event cannot read is refused before it runs
//! ([`over_estimate`](FanoutConnection::over_estimate)).

use crate::engine::Engine;
use crate::error::OperationError;
use crate::inbound::identity::Caller;
use crate::inbound::quota::{Rate, Ticket};
use crate::memory::{ClientKey, MemoryPool, PoolBytes};
use crate::read::budget::Paid;
use crate::request::{FanoutRequest, Pricing};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// The scope of one WebSocket connection (see the module docs). A cheap
/// clone, in the session data of every operation on the connection:
/// a subscription's resolver takes it with `ctx.data::<FanoutConnection>()`.
#[derive(Clone)]
pub struct FanoutConnection {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    caller: Caller,
    /// The upgrade request's typed extensions (what a middleware put there).
    extensions: http::Extensions,
    /// The client's read quota, when its class has one.
    ticket: Option<Ticket>,
    rate: Rate,
    /// When the bucket is full again, in nanoseconds after `origin`.
    full_at: Mutex<u64>,
    origin: Instant,
    /// Reads paid since the connection opened.
    used: AtomicU64,
    /// Its client's share of the sockets' pool (`subscriptions.max_bytes`):
    /// what its subscriptions and events hold.
    memory: Arc<MemoryPool>,
    /// `subscriptions.mode`: a read the bucket cannot pay for is sent and
    /// counted rather than refused.
    measure: bool,
    /// Its client, as the limiter keys it (named when measure mode counts).
    client: ClientKey,
}

impl std::fmt::Debug for FanoutConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FanoutConnection")
            .field("caller", &self.inner.caller)
            .field("used", &self.used())
            .field("remaining", &self.remaining())
            .finish_non_exhaustive()
    }
}

impl FanoutConnection {
    /// The scope of a connection from `caller`, upgraded by the request
    /// whose parts are `parts`: its bucket full, what it holds taken from
    /// `memory` (its client's share of the sockets' pool).
    pub(crate) fn open(
        engine: &Engine,
        caller: Caller,
        parts: &http::request::Parts,
        memory: Arc<MemoryPool>,
    ) -> Self {
        let s = &engine.config().subscriptions;
        let (per_minute, burst) = match caller {
            Caller::Internal => (s.internal_reads_per_minute, s.internal_burst),
            Caller::Public => (s.reads_per_minute, s.burst),
        };
        engine.metrics().request(caller == Caller::Internal);
        FanoutConnection {
            inner: Arc::new(Inner {
                engine: engine.clone(),
                caller,
                extensions: parts.extensions.clone(),
                ticket: engine.ticket(caller, Some(parts)),
                rate: Rate::new(per_minute, Duration::from_secs(60), burst),
                full_at: Mutex::new(0),
                origin: Instant::now(),
                used: AtomicU64::new(0),
                memory,
                measure: s.mode.measures(),
                client: engine.socket_client(parts),
            }),
        }
    }

    /// Who is calling, fixed at `connection_init`.
    pub fn caller(&self) -> Caller {
        self.inner.caller
    }

    /// The most reads the connection holds at once (`extensions.fanout.limit`).
    pub fn limit(&self) -> u64 {
        self.inner.rate.burst()
    }

    /// Reads paid since the connection opened (`extensions.fanout.used`).
    pub fn used(&self) -> u64 {
        self.inner.used.load(Relaxed)
    }

    /// Reads the connection may spend now, refill counted
    /// (`extensions.fanout.remaining`).
    pub fn remaining(&self) -> u64 {
        let full_at = *lock(&self.inner.full_at);
        self.inner.rate.left(full_at, self.now())
    }

    fn now(&self) -> u64 {
        u64::try_from(self.inner.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Pays one read from the bucket, at once: refused when it is empty
    /// (in measure mode the read goes on, counted; the bucket is left as
    /// enforce would leave it).
    fn pay(&self) -> Paid {
        let mut full_at = lock(&self.inner.full_at);
        match self.inner.rate.take(*full_at, self.now(), 1) {
            Ok(after) => {
                *full_at = after;
                self.inner.used.fetch_add(1, Relaxed);
                Paid::Yes
            }
            Err(_) if self.inner.measure => {
                self.inner.used.fetch_add(1, Relaxed);
                let client = ClientName(self.inner.client);
                crate::metrics::would_refuse("subscriptions", &client, 1);
                Paid::Measured
            }
            Err(_) => Paid::Refused,
        }
    }

    /// A scope for one event (or one query) of this connection: its own
    /// de-duplication, deadline and answer memory, at most
    /// `budget.max_reads` reads, each paid by the connection's bucket too
    /// — and, when the client has a read quota, reserved on it before the
    /// scope is returned, as an HTTP request reserves (its budget; a refused
    /// reservation leaves the scope no read, and
    /// [`FanoutRequest::stopped`] says why).
    ///
    /// A subscription's own stream (its resolver, not the fields of its
    /// events) reads through one of these, or through a
    /// [`SharedPoll`](crate::graphql::SharedPoll).
    pub async fn open_event(&self) -> FanoutRequest {
        let event = self.open_unreserved();
        // With a quota the budget is closed until this reservation.
        let _refused = event.reserve().await;
        event
    }

    /// [`open_event`](Self::open_event) before the reservation (the
    /// extension's event path takes it itself, to answer a refusal).
    pub(crate) fn open_unreserved(&self) -> FanoutRequest {
        self.open_priced(None)
    }

    /// [`open_unreserved`](Self::open_unreserved) for an event of an
    /// operation priced at `requested` reads (its worst case, when a cost
    /// table priced it): with a read quota the event reserves that, as an
    /// HTTP request priced so does, not its whole budget — what it holds
    /// while it resolves is not taken from the client's other requests.
    pub(crate) fn open_priced(&self, requested: Option<u64>) -> FanoutRequest {
        let inner = &self.inner;
        let event = inner.engine.open_with(
            inner.caller,
            inner.extensions.clone(),
            false,
            inner.ticket.clone(),
            Pricing {
                costs: requested.is_some(),
                refuse_over: false,
                event: true,
            },
            Some(inner.memory.clone()),
        );
        if let Some(requested) = requested {
            event.priced(requested);
        }
        let connection = self.clone();
        let limit = self.limit();
        event
            .budget()
            .paid_by(Box::new(move || connection.pay()), limit);
        event
    }

    /// Why an operation of this connection priced at `requested` reads is
    /// refused before it runs, if it is: with `budget.refuse_over_estimate`,
    /// a worst case past what one event can read — its `max_reads` (the
    /// caller's), the connection's burst, the client's read-quota burst —
    /// as an HTTP request priced past its budget is.
    pub(crate) fn over_estimate(&self, requested: Option<u64>) -> Option<OperationError> {
        let inner = &self.inner;
        let b = &inner.engine.config().budget;
        let requested = requested.filter(|_| b.refuse_over_estimate)?;
        let max_reads = match inner.caller {
            Caller::Internal => b.internal_max_reads,
            Caller::Public => b.max_reads,
        };
        let quota = inner.ticket.as_ref().map_or(u64::MAX, Ticket::burst);
        let limit = max_reads.min(self.limit()).min(quota);
        if requested <= limit {
            return None;
        }
        if b.mode.measures() {
            // Measure mode: it runs, counted as the subscribe enforce refuses.
            let client = ClientName(inner.client);
            crate::metrics::would_refuse("estimate", &client, 1);
            return None;
        }
        Some(OperationError::EstimateExceedsBudget { requested, limit })
    }

    /// Takes `bytes` of the connection's share of the sockets' pool for as
    /// long as the returned lease lives (what a subscription keeps), or
    /// `None` when its client's share or the pool is full.
    pub(crate) fn hold(&self, bytes: usize) -> Option<PoolBytes> {
        self.inner.memory.lease(bytes)
    }

    /// The bound [`hold`](Self::hold) refused at: the client's share.
    pub(crate) fn max_bytes(&self) -> usize {
        self.inner.memory.max()
    }

    /// Whether the two handles are the same connection.
    pub fn same(&self, other: &FanoutConnection) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

/// A client key as a log line names it.
struct ClientName(ClientKey);

impl std::fmt::Display for ClientName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(ip) => ip.fmt(f),
            None => f.write_str("(no peer address)"),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
