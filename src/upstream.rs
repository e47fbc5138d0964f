//! The acquisition point: the one way a resolver reaches the upstream.
//!
//! A resolver calls [`ctx.upstream()?`](FanoutContext::upstream) and gets an
//! [`Upstream`] handle bound to the current inbound HTTP request and
//! operation. Every read through it walks the same steps, in this order:
//!
//! 1. **de-duplication** — an identical read (same URL and `Accept`) already
//!    made or in flight anywhere in this HTTP request answers instead
//!    ([`crate::dedup`]); nothing below runs and nothing is charged;
//! 2. **cheap refusals** — an exhausted budget or a passed deadline refuses
//!    the read before it waits for anything;
//! 3. **request slot** — one of the request's `max_concurrent_reads`
//!    in-flight slots ([`RequestBudget`]), waited for up to the deadline;
//! 4. **host slot** — a process-wide slot for the host ([`crate::hosts`]);
//! 5. **charge** — one read from the budget, right before sending: a refused
//!    read is never charged, a sent read always is;
//! 6. **timed send** — the GET, body included, under
//!    `min(read_timeout, time left before the deadline)`; whichever of the two
//!    cut it names the error (`UPSTREAM_TIMEOUT` or `DEADLINE_EXCEEDED`).
//!
//! The slots are guards held by the read's future, so they are released on
//! every outcome, including the inbound request being cancelled.

use crate::budget::{bump, RequestBudget};
use crate::dedup::{Dedup, Origin};
use crate::engine::Engine;
use crate::error::FanoutError;
use crate::hosts::{HeldSlot, HostEntry};
use crate::identity::Caller;
use crate::metrics::{self, HostMetrics};
use async_graphql::Context;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

/// The fan-out scope of one inbound HTTP request: its budget and its
/// de-duplication cache, shared (`Arc`) by every operation of a batch.
#[derive(Clone)]
pub struct FanoutRequest {
    inner: Arc<RequestScope>,
}

struct RequestScope {
    engine: Engine,
    budget: RequestBudget,
    dedup: Dedup<ReadKey, ReadResult>,
    caller: Caller,
    /// Operations of the batch not yet priced (only with `refuse_over_estimate`).
    unpriced: OnceLock<watch::Sender<usize>>,
}

type ReadResult = Result<Arc<UpstreamResponse>, FanoutError>;

/// What makes two reads the same read: the URL and the `Accept` header.
#[derive(Clone, PartialEq, Eq)]
struct ReadKey {
    url: Box<str>,
    accept: Option<HeaderValue>,
}

/// Hashes the URL's bytes alone, in one write: reads that differ only in
/// `Accept` are rare, and equality still tells them apart.
impl std::hash::Hash for ReadKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write(self.url.as_bytes());
    }
}

impl FanoutRequest {
    pub(crate) fn new(engine: Engine, budget: RequestBudget, caller: Caller) -> Self {
        Self {
            inner: Arc::new(RequestScope {
                engine,
                budget,
                dedup: Dedup::new(),
                caller,
                unpriced: OnceLock::new(),
            }),
        }
    }

    /// Announces that a batch of `operations` will run in this request, so
    /// that with `refuse_over_estimate` no operation starts before all are
    /// priced. The HTTP integration calls it; without it nothing is refused.
    pub fn expect_operations(&self, operations: usize) {
        let engine = &self.inner.engine;
        if engine.config().budget.refuse_over_estimate && engine.costs().is_some() {
            let _ = self.inner.unpriced.set(watch::Sender::new(operations));
        }
    }

    /// One operation has been priced.
    pub(crate) fn estimate_arrived(&self) {
        if let Some(unpriced) = self.inner.unpriced.get() {
            unpriced.send_modify(|n| *n = n.saturating_sub(1));
        }
    }

    /// Waits until every operation is priced, then refuses the batch if its
    /// worst case exceeds the budget. `None`: run.
    pub(crate) async fn refusal(&self) -> Option<FanoutError> {
        let unpriced = self.inner.unpriced.get()?;
        let budget = &self.inner.budget;
        let mut rx = unpriced.subscribe();
        let left = budget.time_left()?;
        if tokio::time::timeout(left, rx.wait_for(|n| *n == 0))
            .await
            .is_err()
        {
            return Some(FanoutError::DeadlineExceeded);
        }
        let requested = budget.requested();
        (requested > budget.limit()).then(|| FanoutError::EstimateExceedsBudget {
            requested,
            limit: budget.limit(),
        })
    }

    /// The request's budget.
    pub fn budget(&self) -> &RequestBudget {
        &self.inner.budget
    }

    /// Who is calling.
    pub fn caller(&self) -> Caller {
        self.inner.caller
    }

    /// The engine the request runs on.
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// A handle for one operation of this request; its reads are counted
    /// for the operation as well as for the request.
    pub fn operation(&self) -> Arc<Operation> {
        Arc::new(Operation {
            request: self.clone(),
            reads: AtomicU64::new(0),
        })
    }
}

impl std::fmt::Debug for FanoutRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FanoutRequest")
            .field("budget", &self.inner.budget)
            .field("caller", &self.inner.caller)
            .finish()
    }
}

/// One operation of an inbound request (the extension attaches it).
pub struct Operation {
    request: FanoutRequest,
    reads: AtomicU64,
}

impl Operation {
    /// The request this operation belongs to.
    pub fn request(&self) -> &FanoutRequest {
        &self.request
    }

    /// Reads this operation itself sent (not those it shared).
    pub fn reads(&self) -> u64 {
        self.reads.load(Relaxed)
    }

    /// The upstream handle for this operation.
    pub fn upstream(&self) -> Upstream<'_> {
        Upstream { op: self }
    }
}

/// How resolvers reach the engine from an async-graphql [`Context`].
pub trait FanoutContext {
    /// The upstream handle for the current request and operation.
    ///
    /// Fails only when the [`FanoutExtension`](crate::FanoutExtension) is not
    /// mounted on the schema.
    fn upstream(&self) -> async_graphql::Result<Upstream<'_>>;

    /// The current inbound HTTP request's fan-out scope.
    fn fanout_request(&self) -> async_graphql::Result<&FanoutRequest>;
}

impl FanoutContext for Context<'_> {
    fn upstream(&self) -> async_graphql::Result<Upstream<'_>> {
        Ok(operation(self)?.upstream())
    }

    fn fanout_request(&self) -> async_graphql::Result<&FanoutRequest> {
        Ok(operation(self)?.request())
    }
}

fn operation<'a>(ctx: &Context<'a>) -> async_graphql::Result<&'a Operation> {
    ctx.data_opt::<Arc<Operation>>()
        .map(|op| &**op)
        .ok_or_else(|| "the fanout-budget extension is not mounted on this schema".into())
}

/// One upstream GET: a URL and, optionally, an `Accept` header.
#[derive(Clone, Debug)]
pub struct Read {
    url: reqwest::Url,
    accept: Option<HeaderValue>,
}

impl Read {
    /// A GET of `url`.
    pub fn get(url: reqwest::Url) -> Self {
        Self { url, accept: None }
    }

    /// Sends `Accept: accept` (part of the read's identity for de-duplication).
    pub fn accept(mut self, accept: &'static str) -> Self {
        self.accept = Some(HeaderValue::from_static(accept));
        self
    }

    /// The URL.
    pub fn url(&self) -> &reqwest::Url {
        &self.url
    }

    /// The `Accept` header, if any.
    pub fn accept_header(&self) -> Option<&HeaderValue> {
        self.accept.as_ref()
    }
}

/// A URL's `host:port`, written out only if it is displayed (a span field).
struct HostName<'a>(&'a reqwest::Url);

impl std::fmt::Display for HostName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.host_str().unwrap_or(""))?;
        match self.0.port_or_known_default() {
            Some(port) => write!(f, ":{port}"),
            None => Ok(()),
        }
    }
}

/// What the upstream answered (any status): status, headers, and the body.
#[derive(Debug)]
pub struct UpstreamResponse {
    /// `host:port` that answered.
    pub host: String,
    /// The HTTP status.
    pub status: StatusCode,
    /// The response headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl UpstreamResponse {
    /// An `UPSTREAM_ERROR` for this response, with its status.
    pub fn error(&self, message: impl Into<String>) -> FanoutError {
        FanoutError::Upstream {
            host: self.host.clone(),
            status: Some(self.status.as_u16()),
            message: message.into(),
        }
    }

    /// The body as JSON, or `UPSTREAM_ERROR` if it is not the expected JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, FanoutError> {
        serde_json::from_slice(&self.body)
            .map_err(|e| self.error(format!("unexpected response body: {e}")))
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// The upstream, as seen by one operation of one inbound HTTP request.
#[derive(Clone, Copy)]
pub struct Upstream<'a> {
    op: &'a Operation,
}

impl Upstream<'_> {
    /// The request's budget.
    pub fn budget(&self) -> &RequestBudget {
        self.op.request.budget()
    }

    /// Reads `read` through the acquisition point (see the module docs).
    pub async fn read(&self, read: Read) -> Result<Arc<UpstreamResponse>, FanoutError> {
        let scope = &*self.op.request.inner;
        let span = tracing::debug_span!(
            "upstream.read",
            host = %HostName(&read.url),
            path = %read.url.path(),
            dedup = tracing::field::Empty,
            outcome = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
        );
        let key = ReadKey {
            url: read.url.as_str().into(),
            accept: read.accept.clone(),
        };
        let send = || self.send(read);
        // A disabled span (no subscriber wants it) is neither entered nor
        // timed. (The read's future is built in place in each branch.)
        let (result, origin) = if span.is_disabled() {
            scope.dedup.get_or_run(key, send).await
        } else {
            let started = std::time::Instant::now();
            let (result, origin) = scope
                .dedup
                .get_or_run(key, send)
                .instrument(span.clone())
                .await;
            let outcome = match &result {
                Ok(_) => "ok",
                Err(err) => err.code(),
            };
            span.record("dedup", origin == Origin::Shared);
            span.record("outcome", outcome);
            span.record("duration_ms", started.elapsed().as_secs_f64() * 1e3);
            (result, origin)
        };
        if origin == Origin::Shared {
            bump(&scope.budget.stats().dedup_hits);
            metrics::dedup_hit();
        }
        result
    }

    /// Steps 2–6 for a read no other caller answers. The request's clock is
    /// read once here (and again only after waiting for a host slot).
    async fn send(&self, read: Read) -> ReadResult {
        let scope = &*self.op.request.inner;
        let engine = &*scope.engine.inner;
        let budget = &scope.budget;
        let stats = budget.stats();
        let host = engine.host_table.resolve(&read.url, &*engine.hosts);
        let refused = |err: FanoutError| {
            match &err {
                FanoutError::BudgetExhausted { .. } => {
                    bump(&stats.refused_budget);
                    metrics::budget_exhausted();
                }
                FanoutError::HostSaturated { .. } => {
                    bump(&stats.refused_host);
                    host.metrics.rejections.increment(1);
                }
                _ => bump(&stats.refused_deadline),
            }
            Err(err)
        };
        if budget.is_exhausted() {
            return refused(FanoutError::BudgetExhausted {
                limit: budget.limit(),
            });
        }
        let _request_slot = match budget.try_in_flight_slot() {
            Some(slot) => slot,
            None => match budget.in_flight_slot().await {
                Ok(slot) => slot,
                Err(err) => return refused(err),
            },
        };
        let now = budget.now();
        let Some(left) = budget.time_left_at(now) else {
            return refused(FanoutError::DeadlineExceeded);
        };
        let free = match &host.cap {
            Some(cap) => cap.try_borrow(),
            None => Ok(None),
        };
        let (_host_slot, now, left) = match free {
            Ok(Some(permit)) => (HeldSlot::Borrowed { _permit: permit }, now, left),
            Err(err) => return refused(err),
            Ok(None) => {
                let slot = match &host.cap {
                    Some(cap) => cap.acquire(left).await,
                    None => engine.hosts.acquire(&host.name, left).await,
                };
                let slot = match slot {
                    Ok(slot) => slot,
                    Err(err) => return refused(err),
                };
                // Waiting may have used up the time; check it again.
                let now = budget.now();
                let Some(left) = budget.time_left_at(now) else {
                    return refused(FanoutError::DeadlineExceeded);
                };
                (HeldSlot::Owned { _slot: slot }, now, left)
            }
        };
        // Waiting may have used up the budget; charge last.
        if let Err(err) = budget.try_charge() {
            return refused(err);
        }
        self.op.reads.fetch_add(1, Relaxed);
        bump(&stats.issued);
        self.timed_send(read, &host, now, left).await
    }

    /// Sends the read under its time limit (the acquisition point's last
    /// step); `now` is the request clock's, `left` the time left at `now`.
    async fn timed_send(
        &self,
        read: Read,
        host: &HostEntry,
        now: Instant,
        left: Duration,
    ) -> ReadResult {
        let engine = &self.op.request.inner.engine.inner;
        let budget = self.op.request.budget();
        let stats = budget.stats();
        let read_timeout = engine.config.budget.read_timeout();
        let by_deadline = read_timeout > left;
        let limit = read_timeout.min(left);
        let m = &host.metrics;
        let fetch = engine.transport.fetch(&read, &host.name);
        // The timer runs on tokio's clock: when the request's clock is tokio's,
        // `now + limit` is `min(now + read_timeout, deadline)`, no new reading.
        let (started, sent) = if budget.on_tokio_clock() {
            (now, tokio::time::timeout_at(now + limit, fetch))
        } else {
            (Instant::now(), tokio::time::timeout(limit, fetch))
        };
        // Owned by this future: if the inbound request is cancelled mid-read,
        // dropping it still balances the gauge and the counters.
        let mut sending = Sending::start(m, stats, started);
        let sent = sent.await;
        sending.finish();
        match sent {
            Ok(Ok(response)) => {
                bump(&stats.succeeded);
                m.ok.increment(1);
                Ok(Arc::new(response))
            }
            Ok(Err(err)) => {
                bump(&stats.failed);
                m.error.increment(1);
                Err(err)
            }
            Err(_elapsed) => {
                bump(&stats.timed_out);
                m.timeouts.increment(1);
                if by_deadline {
                    m.deadline.increment(1);
                    Err(FanoutError::DeadlineExceeded)
                } else {
                    m.timeout.increment(1);
                    let timeout_ms = read_timeout.as_millis() as u64;
                    Err(FanoutError::UpstreamTimeout {
                        host: host.name.to_string(),
                        timeout_ms,
                    })
                }
            }
        }
    }
}

/// One read on the wire: the in-flight gauge is held while it exists, and a
/// read dropped before it finished (its request was cancelled) counts as
/// `cancelled`, so `issued = succeeded + failed + timed_out + cancelled`.
struct Sending<'a> {
    metrics: &'a HostMetrics,
    stats: &'a crate::budget::ReadStats,
    started: Instant,
    finished: bool,
}

impl<'a> Sending<'a> {
    /// A read sent at `started` (tokio's clock).
    fn start(
        metrics: &'a HostMetrics,
        stats: &'a crate::budget::ReadStats,
        started: Instant,
    ) -> Self {
        metrics.in_flight.increment(1.0);
        Self {
            metrics,
            stats,
            started,
            finished: false,
        }
    }

    fn finish(&mut self) {
        self.finished = true;
    }
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        self.metrics.in_flight.decrement(1.0);
        self.metrics
            .latency
            .record(self.started.elapsed().as_secs_f64());
        if !self.finished {
            bump(&self.stats.cancelled);
            self.metrics.cancelled.increment(1);
        }
    }
}
