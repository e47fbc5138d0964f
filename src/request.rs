//! The request scope: what one inbound HTTP request owns, shared by every
//! operation of its batch.
//!
//! [`Engine::begin_request`](crate::Engine::begin_request) opens a
//! [`FanoutRequest`] — the budget, the deadline (it starts now), the
//! de-duplication cache, and what its reads need from the engine, handed
//! over once. Each operation of the batch gets an [`Operation`] handle on it
//! (the integrations put it into the operation's data), and a resolver
//! reaches the acquisition point with
//! [`FanoutContext::upstream`](crate::FanoutContext::upstream).
//!
//! The scope also holds the batch's **pricing barrier**: with a cost table
//! and `refuse_over_estimate` or a read quota, no operation runs before
//! every operation of the batch is priced; then all are refused together
//! when their worst case exceeds the budget (`refuse_over_estimate`), and
//! the batch's **reservation** on its client's read quota is taken, once,
//! before any read (`inbound/quota.rs`): the budget becomes what it
//! reserved, and when the scope is dropped — the request answered or
//! cancelled — what it did not spend goes back. Both integrations use it.

use crate::chain::Received;
use crate::config::HttpConfig;
use crate::document::memo::Kept;
use crate::error::{refused, stopped, OperationError, Rejection};
use crate::inbound::identity::Caller;
use crate::inbound::quota::{QuotaStatus, Reservation, Ticket};
use crate::memory::{RequestMemory, Trip};
use crate::read::budget::RequestBudget;
use crate::read::{OperationReads, RequestReads, Upstream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::watch;

/// The fan-out scope of one inbound HTTP request: its budget and its
/// de-duplication cache, shared (`Arc`) by every operation of a batch.
///
/// ```
/// use fanout_budget::{Config, Engine, inbound::Caller};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let engine = Engine::new(Config::default());
/// let request = engine.begin_request(Caller::Public);
/// // Two operations of one batch: one budget.
/// let (a, b) = (request.operation(), request.operation());
/// assert!(std::ptr::eq(a.request().budget(), b.request().budget()));
/// assert_eq!(request.budget().limit(), Config::default().budget.max_reads);
/// # }
/// ```
#[derive(Clone)]
pub struct FanoutRequest {
    inner: Arc<Scope>,
}

struct Scope {
    reads: RequestReads,
    caller: Caller,
    /// The HTTP request's typed extensions, carried into the scope (what a
    /// middleware put there: an authenticated user, a tenant).
    extensions: http::Extensions,
    /// Whether the batch is priced before it runs (a cost table, with
    /// `refuse_over_estimate` or a read quota).
    price_first: bool,
    /// Whether a batch priced over its budget is refused
    /// (`refuse_over_estimate` with a cost table).
    refuse_over: bool,
    /// In measure mode, the batch priced past its budget has been counted.
    estimate_measured: AtomicBool,
    /// The client's read quota, when its class has one.
    quota: Option<Ticket>,
    /// An event of a WebSocket connection ([`Pricing::event`]).
    event: bool,
    /// The batch's reservation on it, taken once before any read.
    reservation: tokio::sync::OnceCell<Result<Reservation, Rejection>>,
    /// Operations of the batch not yet priced, once announced.
    unpriced: OnceLock<watch::Sender<usize>>,
    /// Opened for a `GET`: only queries may run (a page on another site
    /// can make a browser send a `GET` without asking first).
    queries_only: bool,
    /// Bytes of query text the batch's operations run, persisted ones
    /// included (bounded by `http.max_body_bytes`, as the body is).
    text_bytes: AtomicU64,
    /// `http.max_body_bytes`.
    max_text_bytes: u64,
    /// Not a client's request (the service's check that its schema mounts
    /// the extension): its reads are not recorded.
    probe: std::sync::atomic::AtomicBool,
}

impl FanoutRequest {
    /// Marks the scope as no client's request (a check the service runs
    /// on its schema): its reads are not recorded in the metrics.
    pub(crate) fn probe(&self) {
        self.inner
            .probe
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The scope of one inbound HTTP request, its reads handed `reads`
    /// (what [`Engine`](crate::Engine) opens for each request).
    pub(crate) fn new(
        reads: RequestReads,
        caller: Caller,
        extensions: http::Extensions,
        priced: Pricing,
        quota: Option<Ticket>,
        queries_only: bool,
        max_text_bytes: usize,
    ) -> Self {
        FanoutRequest {
            inner: Arc::new(Scope {
                reads,
                caller,
                extensions,
                price_first: priced.costs && (priced.refuse_over || quota.is_some()),
                refuse_over: priced.costs && priced.refuse_over,
                estimate_measured: AtomicBool::new(false),
                quota,
                event: priced.event,
                reservation: tokio::sync::OnceCell::new(),
                unpriced: OnceLock::new(),
                queries_only,
                text_bytes: AtomicU64::new(0),
                max_text_bytes: max_text_bytes as u64,
                probe: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }
}

/// How a request's operations are priced.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pricing {
    /// A cost table prices them.
    pub(crate) costs: bool,
    /// `refuse_over_estimate`.
    pub(crate) refuse_over: bool,
    /// An event of a WebSocket connection: when the client's read quota
    /// has less than the reservation asks, the event reserves what it has
    /// (none: its reads are refused at their fields) and still runs.
    pub(crate) event: bool,
}

impl Drop for Scope {
    /// Settles the reservation: what was reserved and not charged goes
    /// back (a read charged is spent, answered or not).
    /// Records the reads the scope was charged (`fanout_request_reads`).
    fn drop(&mut self) {
        let used = self.reads.budget().used();
        if let Some(Ok(reservation)) = self.reservation.take() {
            reservation.settle(used);
        }
        if self.probe.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        self.reads.metrics().request_reads(used);
        #[cfg(feature = "otel")]
        crate::telemetry::instruments(|i| i.request_reads(used));
    }
}

tokio::task_local! {
    /// The scope of the HTTP request the current task serves, set by
    /// `FanoutLayer` around the service that runs the schema: async-graphql's
    /// executor runs a batch's operations inside that task (it joins them, it
    /// does not spawn), so the extension finds the scope without the service
    /// passing anything along.
    static CURRENT: FanoutRequest;
}

pub(crate) use crate::read::budget::FINISH_GRACE;

impl FanoutRequest {
    /// Announces that a batch of `operations` will run in this request, so
    /// that with `refuse_over_estimate` no operation starts before all are
    /// priced. Both integrations call it; an app running the extension
    /// under its own executor calls it before the batch runs (without it,
    /// nothing is refused).
    pub fn expect_operations(&self, operations: usize) {
        if self.inner.price_first {
            let _ = self.inner.unpriced.set(watch::Sender::new(operations));
        }
    }

    /// One operation has been priced at `requested` reads.
    pub(crate) fn priced(&self, requested: u64) {
        self.budget().add_requested(requested);
        if let Some(unpriced) = self.inner.unpriced.get() {
            unpriced.send_modify(|n| *n = n.saturating_sub(1));
        }
    }

    /// Waits until every announced operation is priced, then refuses the
    /// batch if its worst case exceeds the budget. `None`: run.
    pub(crate) async fn refusal(&self) -> Option<OperationError> {
        // Past `budget.max_hops`: refused whatever it costs (`chain/`).
        if let Some(refusal) = self.received().and_then(Received::too_many_hops) {
            return Some(refusal);
        }
        let unpriced = self.inner.unpriced.get()?;
        let budget = self.budget();
        let mut rx = unpriced.subscribe();
        if tokio::time::timeout_at(budget.deadline(), rx.wait_for(|n| *n == 0))
            .await
            .is_err()
        {
            return Some(OperationError::DeadlineExceeded);
        }
        let requested = budget.requested();
        // With a read quota the request can never spend more than its burst.
        let burst = self.inner.quota.as_ref().map_or(u64::MAX, Ticket::burst);
        let limit = budget.ceiling().min(burst);
        if !(self.inner.refuse_over && requested > limit) {
            return None;
        }
        if budget.measures() {
            // Once per request, whichever of its operations asks first.
            if !self.inner.estimate_measured.swap(true, Relaxed) {
                let whole = &"a batch priced past its budget";
                crate::metrics::would_refuse("estimate", whole, 1);
            }
            return None;
        }
        Some(OperationError::EstimateExceedsBudget { requested, limit })
    }

    /// Takes the batch's reservation on its client's read quota, once,
    /// after [`refusal`](Self::refusal) and before any read: its
    /// `requested` when a cost table priced it, else its budget; the budget
    /// is lowered to what was reserved. `Some`: the whole request is refused
    /// (429 `QUOTA_EXHAUSTED`, or 503 with the shared store down and
    /// `failure_mode = "closed"`).
    pub(crate) async fn reserve(&self) -> Option<Rejection> {
        let ticket = self.inner.quota.as_ref()?;
        let _ = self
            .inner
            .reservation
            .get_or_init(|| async {
                let budget = self.budget();
                let reads = if self.inner.price_first {
                    budget.requested().min(budget.ceiling())
                } else {
                    budget.ceiling()
                };
                let reservation = match ticket.reserve(reads).await {
                    // An event runs on what the quota has.
                    Err(Rejection::QuotaExhausted { remaining, .. }) if self.inner.event => {
                        ticket.reserve(remaining).await?
                    }
                    // Measured: it runs, taking nothing from the quota, as
                    // enforce would take nothing; its reads are counted.
                    Err(refused @ Rejection::QuotaExhausted { .. }) if budget.quota_measures() => {
                        budget.unreserved();
                        return Err(refused);
                    }
                    reserved => reserved?,
                };
                budget.reserved(reservation.reserved(), Box::new(reservation.extend()));
                Ok(reservation)
            })
            .await;
        self.refused_reservation()
    }

    /// Why the reservation refused the request, if it did (in measure mode
    /// a spent quota refuses nothing: the request ran).
    fn refused_reservation(&self) -> Option<Rejection> {
        match self.inner.reservation.get()? {
            Err(Rejection::QuotaExhausted { .. }) if self.budget().quota_measures() => None,
            reserved => reserved.as_ref().err().cloned(),
        }
    }

    /// The client's read quota as it will stand once this request settles
    /// (`extensions.fanout.quota`); `None` without a quota or before the
    /// reservation.
    pub fn quota(&self) -> Option<QuotaStatus> {
        let reservation = self.inner.reservation.get()?.as_ref().ok()?;
        Some(reservation.status(self.budget().used()))
    }

    /// Runs one operation within the request's bounds in time and memory:
    /// no longer than the deadline plus [`FINISH_GRACE`] (past it the
    /// operation is dropped, whatever it was doing, and answers
    /// `DEADLINE_EXCEEDED`), and not past the request's trip (`memory.rs`:
    /// the operation is dropped with what it built, and answers the trip's
    /// code; the integrations then answer the whole request with it).
    pub(crate) async fn within_bounds(
        &self,
        operation: impl std::future::Future<Output = async_graphql::Response>,
    ) -> async_graphql::Response {
        let until = self.budget().deadline() + FINISH_GRACE;
        let memory = self.inner.reads.memory();
        tokio::select! {
            biased;
            trip = memory.tripped() => stopped(&trip.rejection()),
            () = tokio::time::sleep_until(until) => refused(&OperationError::DeadlineExceeded),
            response = operation => response,
        }
    }

    /// Counts `len` bytes more of query text run by the batch; `Err`: the
    /// texts pass `http.max_body_bytes` together.
    pub(crate) fn run_text(&self, len: usize) -> Result<(), usize> {
        let len = len as u64;
        let total = self.inner.text_bytes.fetch_add(len, Relaxed) + len;
        let max = self.inner.max_text_bytes;
        if total > max {
            return Err(max as usize);
        }
        Ok(())
    }

    /// What the request holds: its answer and kept bodies.
    pub(crate) fn memory(&self) -> &RequestMemory {
        self.inner.reads.memory()
    }

    /// The whole answer for a request a memory bound or the read quota
    /// stopped, if one did.
    pub fn stopped(&self) -> Option<Rejection> {
        (self.memory().trip().map(Trip::rejection)).or_else(|| self.refused_reservation())
    }

    /// What the request's `Fanout-Budget` header said, if it carried one
    /// (`chain/`).
    pub(crate) fn received(&self) -> Option<&Received> {
        self.inner.extensions.get::<Received>()
    }

    /// The request's budget.
    pub fn budget(&self) -> &RequestBudget {
        self.inner.reads.budget()
    }

    /// The engine's handles of what each request and operation records.
    pub(crate) fn metrics(&self) -> &crate::metrics::RequestMetrics {
        self.inner.reads.metrics()
    }

    /// The request's body: at most `http.max_body_bytes` (else
    /// `PAYLOAD_TOO_LARGE`, checked against `Content-Length` first, then
    /// while reading), all of it within `min(http.body_read_timeout_ms, time
    /// left before the deadline)` (else `REQUEST_TIMEOUT`: one bound for the
    /// whole body, so a trickle cannot stretch it; an `Expect: 100-continue`
    /// client is sent its `100 Continue` when the reading starts, inside the
    /// same bound).
    pub(crate) async fn read_body(
        &self,
        body: axum::body::Body,
        http: &HttpConfig,
    ) -> Result<bytes::Bytes, Rejection> {
        let within = self
            .budget()
            .time_left()
            .map_or(Duration::ZERO, |left| left.min(http.body_read_timeout()));
        let max = http.max_body_bytes;
        let timeout = || Rejection::RequestTimeout {
            timeout_ms: within.as_millis().try_into().unwrap_or(u64::MAX),
        };
        if within.is_zero() {
            return Err(timeout());
        }
        let read = tokio::time::timeout(within, axum::body::to_bytes(body, max)).await;
        match read.map_err(|_elapsed| timeout())? {
            Ok(bytes) => Ok(bytes),
            Err(err) => {
                let too_large = std::error::Error::source(&err)
                    .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
                Err(if too_large {
                    Rejection::PayloadTooLarge { max }
                } else {
                    Rejection::BadRequest {
                        message: format!("could not read the request body: {err}"),
                    }
                })
            }
        }
    }

    /// Runs `work` — a service handling the HTTP request — with this scope
    /// as the request's current one (what [`FanoutLayer`](crate::FanoutLayer)
    /// does, so the extension finds it).
    ///
    /// Not an `async fn`, which would hold `work` twice.
    pub(crate) fn scope<F: std::future::Future>(
        self,
        work: F,
    ) -> impl std::future::Future<Output = F::Output> {
        CURRENT.scope(self, work)
    }

    /// The scope a [`FanoutLayer`](crate::FanoutLayer) opened for the HTTP
    /// request this task serves, if any.
    pub(crate) fn current() -> Option<FanoutRequest> {
        CURRENT.try_with(FanoutRequest::clone).ok()
    }

    /// Who is calling.
    pub fn caller(&self) -> Caller {
        self.inner.caller
    }

    /// Whether only queries may run: the HTTP request was a `GET`.
    pub(crate) fn queries_only(&self) -> bool {
        self.inner.queries_only
    }

    /// The HTTP request's typed extensions, as they were when its scope
    /// opened (both integrations carry them over): what a middleware put
    /// there — an authenticated user, a tenant — for resolvers to read.
    ///
    /// ```
    /// use async_graphql::{Context, Object};
    /// use fanout_budget::FanoutContext;
    ///
    /// /// Put into the HTTP request's extensions by the app's auth middleware.
    /// #[derive(Clone)]
    /// struct User(String);
    ///
    /// struct Query;
    ///
    /// #[Object]
    /// impl Query {
    ///     async fn me(&self, ctx: &Context<'_>) -> async_graphql::Result<Option<String>> {
    ///         let user = ctx.fanout_request()?.extensions().get::<User>();
    ///         Ok(user.map(|u| u.0.clone()))
    ///     }
    /// }
    /// ```
    pub fn extensions(&self) -> &http::Extensions {
        &self.inner.extensions
    }

    /// A handle for one operation of this request; its reads are counted
    /// for the operation as well as for the request.
    pub fn operation(&self) -> Arc<Operation> {
        Arc::new(Operation {
            request: self.clone(),
            reads: OperationReads::here(),
            metered: AtomicBool::new(false),
            document: Mutex::new(None),
        })
    }
}

impl std::fmt::Debug for FanoutRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FanoutRequest")
            .field("budget", self.budget())
            .field("caller", &self.inner.caller)
            .finish()
    }
}

/// What an app adds to each operation's data, given the operation's handle
/// (both integrations take one: `FanoutGraphQL::operation_data`,
/// `FanoutExtension::operation_data`).
pub(crate) type OperationData =
    Arc<dyn Fn(&Arc<Operation>, &mut async_graphql::Data) + Send + Sync>;

/// The operation's data: its handle, then what the app adds.
pub(crate) fn operation_data(
    operation: &Arc<Operation>,
    data: &mut async_graphql::Data,
    app: Option<&OperationData>,
) {
    data.insert(operation.clone());
    if let Some(app) = app {
        app(operation, data);
    }
}

/// One operation of an inbound request (the integrations attach it to the
/// operation's data).
#[derive(Debug)]
pub struct Operation {
    request: FanoutRequest,
    reads: OperationReads,
    /// The extension counts this operation's answer (`memory.rs`).
    metered: AtomicBool,
    /// The document kept for its text, when it was admitted from one (its
    /// validation is kept with it: `document/memo.rs`), until the extension
    /// takes it.
    document: Mutex<Option<Arc<Kept>>>,
}

impl Operation {
    /// The request this operation belongs to.
    pub fn request(&self) -> &FanoutRequest {
        &self.request
    }

    /// Reads this operation itself sent (not those it shared).
    pub fn reads(&self) -> u64 {
        self.reads.sent.load(Relaxed)
    }

    /// Reads of this operation answered from the engine's cache of
    /// immutable answers (`cacheHits`): free, never in `used`.
    pub fn cache_hits(&self) -> u64 {
        self.reads.cache_hits.load(Relaxed)
    }

    /// Admitted from `document`, the document kept for its text.
    pub(crate) fn set_document(&self, document: Arc<Kept>) {
        *self.document.lock().unwrap_or_else(|e| e.into_inner()) = Some(document);
    }

    /// The document kept for its text, if it was admitted from one, taken
    /// (an operation that lasts, a subscription, does not hold it).
    pub(crate) fn take_document(&self) -> Option<Arc<Kept>> {
        self.document
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// The operation's span opened: the reads made through this handle
    /// outside the request's task are its children (`telemetry`).
    pub(crate) fn traced_under(&self, span: &tracing::Span) {
        self.reads.under(span);
    }

    /// The operation's span is a direct one (`telemetry/direct.rs`),
    /// `context`: the reads made through this handle outside the request's
    /// task are its children.
    #[cfg(feature = "otel")]
    pub(crate) fn traced_under_direct(&self, context: &opentelemetry::trace::SpanContext) {
        self.reads.trace.under_direct(context);
    }

    /// The operation ended, answered, refused or cancelled: a read through
    /// this handle later (one the application kept) is not in its
    /// request's trace, and keeps nothing of it.
    pub(crate) fn trace_ended(&self) {
        self.reads.ended();
    }

    /// A guard that ends the trace ([`trace_ended`](Self::trace_ended)) as
    /// it drops: held by the future that runs the operation, however that
    /// future ends.
    pub(crate) fn trace_ends(&self) -> TracedUntil<'_> {
        TracedUntil(self)
    }

    /// The extension saw this operation and counts its answer.
    pub(crate) fn mark_metered(&self) {
        self.metered.store(true, Relaxed);
    }

    /// Whether the extension counts this operation's answer.
    pub(crate) fn is_metered(&self) -> bool {
        self.metered.load(Relaxed)
    }

    /// The upstream handle for this operation.
    pub fn upstream(&self) -> Upstream<'_> {
        Upstream::new(&self.request.inner.reads, &self.reads)
    }
}

/// An operation's reads are in its request's trace while this lives
/// ([`Operation::trace_ends`]); dropped with the operation's future,
/// however it ends.
pub(crate) struct TracedUntil<'a>(&'a Operation);

impl Drop for TracedUntil<'_> {
    fn drop(&mut self) {
        self.0.trace_ended();
    }
}
