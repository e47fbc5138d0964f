//! The acquisition point: the one way a resolver reaches the upstream.
//!
//! [`Upstream::read`] runs a read through the steps below it, each in its
//! own module: de-duplication (`dedup.rs`), cheap refusals, the request slot
//! and the charge (`budget.rs`), the host slot (`hosts.rs`), the timed send
//! (`transport.rs`); then it keeps the answer (bounded in bytes per request)
//! and follows a redirect as a read of its own. The slots are guards owned by
//! the read's future, released on every outcome, cancellation included. The
//! whole walk is ARCHITECTURE.md (the crate's docs).
//!
//! For a host with `coalesce = true`, a safe read (a `GET` or `HEAD` without
//! a body) that another request has in flight is joined instead (after the
//! cheap refusals, before any slot): the joiner holds no slot, is not
//! charged, and waits for the shared answer under its own
//! `min(read_timeout, time left)`. A read already waiting for its slots when
//! an identical read starts joins it too: the wait for the slots is raced
//! against the flight's start and dropped when the flight wins, so the
//! joiner leaves the request's and the host's queues (a slot granted to it
//! meanwhile goes back) and a host's cap is used only by reads being sent.
//! A read that leads holds its request slot while it waits, like any read,
//! but its host slot and the send move into a task of their own
//! (`dedup.rs`), bounded by the read timeout alone, so the leader's
//! cancellation or deadline never cuts the read for the others.

pub(crate) mod budget;
pub(crate) mod dedup;
pub(crate) mod hosts;
pub(crate) mod transport;

pub use budget::{BudgetSnapshot, ReadCounts, RequestBudget};
pub use hosts::{host_name, HostLimiter, HostSlot, LocalHostCaps, OTHER_HOSTS};
pub use transport::{HttpTransport, Read, Transport, UpstreamResponse};

use crate::error::ReadError;
use crate::memory::{MemoryPool, RequestMemory};
use crate::metrics::{self, HostMetrics};
use budget::{bump, InFlightSlot, ReadStats};
use dedup::{Coalesce, Dedup, Flight, Origin, Role};
use hosts::{HostEntry, HostTable};
use http::{header, HeaderName, HeaderValue};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::Instrument;

/// What every read of an engine needs; the engine hands it to each request
/// once, when the request opens.
pub(crate) struct ReadParts {
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) hosts: Arc<dyn HostLimiter>,
    /// The hosts with an entry of their own (a `[hosts]` table, a known
    /// host) and the entry every other host shares: fixed at start.
    pub(crate) host_table: HostTable,
    pub(crate) read_timeout: Duration,
    pub(crate) max_redirects: u32,
    pub(crate) max_request_bytes: u64,
    /// The shared reads in flight across this engine's requests (for the
    /// hosts with `coalesce = true`).
    pub(crate) coalesce: Arc<Coalesce<ReadKey, ReadResult>>,
    /// What all requests in flight may hold (`http.max_inflight_bytes`).
    pub(crate) memory: Arc<MemoryPool>,
    /// What one request's answer may hold (`http.max_answer_bytes`).
    pub(crate) max_answer_bytes: usize,
}

/// The reads of one inbound HTTP request: its budget, its de-duplication
/// cache, and the body bytes it keeps.
pub(crate) struct RequestReads {
    parts: Arc<ReadParts>,
    budget: RequestBudget,
    dedup: Dedup<ReadKey, ReadResult>,
    /// Body bytes of every response this request keeps.
    kept_bytes: AtomicU64,
    /// What the request holds, its answer and kept bodies (`memory.rs`).
    memory: RequestMemory,
}

pub(crate) type ReadResult = Result<Arc<UpstreamResponse>, ReadError>;

impl RequestReads {
    pub(crate) fn new(parts: Arc<ReadParts>, budget: RequestBudget) -> Self {
        let memory = RequestMemory::new(parts.memory.clone(), parts.max_answer_bytes);
        Self {
            parts,
            budget,
            dedup: Dedup::new(),
            kept_bytes: AtomicU64::new(0),
            memory,
        }
    }

    pub(crate) fn budget(&self) -> &RequestBudget {
        &self.budget
    }

    pub(crate) fn memory(&self) -> &RequestMemory {
        &self.memory
    }
}

/// What makes two reads the same read: the method, the URL, the headers,
/// the body, and the caller's key (a read that is not a `GET` or `HEAD` has
/// one, or is never shared).
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct ReadKey {
    method: http::Method,
    url: Box<str>,
    headers: Vec<(HeaderName, HeaderValue)>,
    /// A `GET` with a body (a search API's) answers by its body too.
    body: bytes::Bytes,
    key: Option<Box<str>>,
}

impl ReadKey {
    fn of(read: &Read) -> Option<Self> {
        (read.is_safe() || read.key.is_some()).then(|| Self {
            method: read.method.clone(),
            url: read.url.as_str().into(),
            headers: read.headers.clone(),
            body: read.body.clone(),
            key: read.key.clone(),
        })
    }
}

/// The upstream, as seen by one operation of one inbound HTTP request.
///
/// ```
/// use async_graphql::{Context, Object};
/// use fanout_budget::{FanoutContext, OrNull, Read};
///
/// struct Query;
///
/// #[Object]
/// impl Query {
///     /// A page of the upstream, or `null` and a coded error.
///     async fn page(&self, ctx: &Context<'_>) -> Option<String> {
///         let url = "http://registry.local/v2/_catalog".parse().unwrap();
///         let read = async { ctx.upstream()?.read(Read::get(url)).await.map_err(Into::into) };
///         let page: async_graphql::Result<_> = read.await;
///         page.map(|r| String::from_utf8_lossy(&r.body).into_owned()).or_null(ctx)
///     }
/// }
/// ```
#[derive(Clone, Copy)]
pub struct Upstream<'a> {
    reads: &'a RequestReads,
    /// The operation's own reads (`operationReads`).
    sent: &'a AtomicU64,
}

impl<'a> Upstream<'a> {
    pub(crate) fn new(reads: &'a RequestReads, sent: &'a AtomicU64) -> Self {
        Self { reads, sent }
    }

    /// The request's budget.
    pub fn budget(&self) -> &'a RequestBudget {
        &self.reads.budget
    }

    /// Reads `read` through the acquisition point (see the module docs).
    ///
    /// A redirect (301, 302, 303, 307, 308 with a `Location`) is followed
    /// here, up to `upstream.max_redirects` hops, each hop a read of its own
    /// through every step (de-duplicated, capped per host and charged); a
    /// hop back to a URL of the same chain, past the last hop, or to
    /// something that is not `http(s)` ends the read with `UPSTREAM_ERROR`.
    /// A 303 — and a 301 or 302 answering a `POST` — is followed with a
    /// `GET` without the body; a 307 or 308 with the same method and body,
    /// but never to another origin (`UPSTREAM_ERROR`). A hop to another
    /// origin carries only `Accept` and `Content-Type` of the read's headers
    /// (any other may be a credential).
    ///
    /// **Coalescing** (`[hosts."HOST:PORT"] coalesce = true`, off by
    /// default): a `GET` or `HEAD` without a body — same URL, same headers
    /// (`Authorization` included) — that another inbound request of the
    /// engine has in flight at that moment is *joined*, not sent:
    ///
    /// - the joiner is not charged (`used`, `operationReads` and `issued`
    ///   do not count it; `ReadCounts::coalesced` and
    ///   `fanout_coalesced_reads_total` do), holds no request slot and no
    ///   host slot, and waits under its own `min(read_timeout, time left)`
    ///   (`UPSTREAM_TIMEOUT` / `DEADLINE_EXCEEDED` when that cuts it);
    /// - the budget's refusals come first: a request whose budget is spent
    ///   (or whose deadline has passed) is refused even a read it could
    ///   have joined — what a request may ask for does not depend on
    ///   whether another client happens to be asking the same at that
    ///   moment;
    /// - the leader — the request that sent it — is charged as for any
    ///   read and holds its request slot until the answer (or its own
    ///   timeout, deadline or cancellation); the send itself, with its host
    ///   slot, runs in a task of its own, bounded by the read timeout from
    ///   when it was sent, so neither the leader's cancellation nor its
    ///   deadline cuts it for the others;
    /// - the answer, or an error the upstream or the transport gave, is
    ///   everyone's answer; a timeout or a deadline is each request's own;
    ///   each request gets its own copy of the response (what it
    ///   [`derived`](UpstreamResponse::derived) stays its own), kept under
    ///   its own `upstream.max_request_bytes`;
    /// - only reads in flight are shared: once the read ends it leaves the
    ///   engine's table before its answer is handed out, and a read that
    ///   starts later is sent afresh (no cache across requests). A read
    ///   waiting for its own slots joins an identical read that starts
    ///   meanwhile, and leaves the queues it waited in: it keeps no place
    ///   in them and no slot given to it meanwhile, so the host's cap
    ///   counts only reads being sent.
    pub async fn read(&self, read: Read) -> Result<Arc<UpstreamResponse>, ReadError> {
        let max_redirects = self.reads.parts.max_redirects;
        let mut sent = read.clone();
        let mut response = self.read_once(read).await?;
        // The requests of the chain so far, as (method, URL): a POST
        // redirected (303) to a GET of its own URL is no loop.
        let mut chain: Vec<(http::Method, reqwest::Url)> = Vec::new();
        while let Some(location) = redirect(&response).filter(|_| max_redirects > 0) {
            let fail = |message: String| Err(response.error(message));
            let next = match sent.url.join(location) {
                Ok(next) if matches!(next.scheme(), "http" | "https") => next,
                _ => return fail(format!("redirect to {location:?}, not an http(s) URL")),
            };
            if chain.len() as u32 >= max_redirects {
                return fail(format!("more than {max_redirects} redirects"));
            }
            let Some(hop) = hop(&sent, response.status.as_u16(), next) else {
                return fail("a redirect to another origin would carry the request's body".into());
            };
            chain.push((sent.method.clone(), sent.url.clone()));
            if chain.contains(&(hop.method.clone(), hop.url.clone())) {
                return fail(format!("redirect loop at {}", hop.url));
            }
            sent = hop.clone();
            response = self.read_once(hop).await?;
        }
        Ok(response)
    }

    /// Step 1, then steps 2–7 unless an identical read answers.
    async fn read_once(&self, read: Read) -> ReadResult {
        // Host and path only: a query string or userinfo may carry secrets.
        let span = tracing::debug_span!(
            "upstream.read",
            host = read.url.host_str(),
            path = read.url.path(),
            dedup = tracing::field::Empty,
            coalesced = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let (result, origin) = match ReadKey::of(&read) {
            Some(key) => {
                self.reads
                    .dedup
                    .get_or_run(key, || self.send(read))
                    .instrument(span.clone())
                    .await
            }
            // Not safe to share: sent every time.
            None => (self.send(read).instrument(span.clone()).await, Origin::Ran),
        };
        span.record("dedup", origin == Origin::Shared);
        span.record(
            "outcome",
            result.as_ref().map_or_else(|e| e.code(), |_| "ok"),
        );
        if origin == Origin::Shared {
            bump(&self.reads.budget.stats().dedup_hits);
            metrics::dedup_hit();
        }
        // A read answered at once (de-duplicated, refused) never waits, and
        // the many fields woken together when one shared read lands all go on
        // in the same poll; each read's end spends a unit of tokio's
        // cooperative budget, so such an operation still yields — to other
        // requests, and to its deadline.
        tokio::task::consume_budget().await;
        result
    }

    /// Steps 2–5 for a read no other caller of the request answers, then
    /// the send — or, to a host that coalesces, another request's read.
    async fn send(&self, read: Read) -> ReadResult {
        let host = self.reads.parts.host_table.resolve(&read.url);
        if host.coalesce() && read.is_safe() && read.body.is_empty() {
            return self.coalesced(read, &host).await;
        }
        let admitted = self.admit(&host).await?;
        self.timed_send(read, &host, admitted).await
    }

    /// Steps 2–5: the cheap refusals, the request slot, the host slot and
    /// the charge, for one read to `host` (counted and named as refused when
    /// one of them refuses).
    async fn admit(&self, host: &HostEntry) -> Result<Admitted<'a>, ReadError> {
        self.refuse_early(host)?;
        let (request_slot, host_slot) = self.slots(host).await?;
        let now = self.charge(host)?;
        Ok(Admitted {
            _request_slot: request_slot,
            _host_slot: host_slot,
            now,
        })
    }

    /// `err`, counted as the refusal of a read to `host`.
    fn refused(&self, host: &HostEntry, err: ReadError) -> ReadError {
        let stats = self.reads.budget.stats();
        match &err {
            ReadError::BudgetExhausted { .. } => {
                bump(&stats.refused_budget);
                metrics::budget_exhausted();
            }
            ReadError::DeadlineExceeded => bump(&stats.refused_deadline),
            // Refused a host slot: saturated, or the shared caps down.
            ReadError::HostSaturated { .. } => {
                bump(&stats.refused_host);
                host.metrics().rejections.increment(1);
            }
            _ => bump(&stats.refused_host),
        }
        err
    }

    fn exhausted(&self) -> ReadError {
        ReadError::BudgetExhausted {
            limit: self.reads.budget.limit(),
        }
    }

    /// The cheap refusal before anything waits: no read is left.
    fn refuse_early(&self, host: &HostEntry) -> Result<(), ReadError> {
        if self.reads.budget.is_exhausted() {
            return Err(self.refused(host, self.exhausted()));
        }
        Ok(())
    }

    /// The request slot, then the host slot, each waited for never past
    /// the deadline.
    async fn slots(&self, host: &HostEntry) -> Result<(InFlightSlot<'a>, HostSlot), ReadError> {
        let budget: &'a RequestBudget = &self.reads.budget;
        let Ok(request_slot) = budget.in_flight_slot().await else {
            return Err(self.refused(host, ReadError::DeadlineExceeded));
        };
        let Some(left) = budget.time_left() else {
            return Err(self.refused(host, ReadError::DeadlineExceeded));
        };
        match self.reads.parts.hosts.acquire(&host.name, left).await {
            Ok(host_slot) => Ok((request_slot, host_slot)),
            Err(refusal) => Err(self.refused(host, refusal.for_host(&host.name))),
        }
    }

    /// The charge, last before the send (waiting may have used up the time
    /// and the budget): when the read is admitted, or its refusal.
    fn charge(&self, host: &HostEntry) -> Result<Instant, ReadError> {
        let budget = &self.reads.budget;
        let now = Instant::now();
        if budget.time_left_at(now).is_none() {
            return Err(self.refused(host, ReadError::DeadlineExceeded));
        }
        if budget.try_charge().is_err() {
            return Err(self.refused(host, self.exhausted()));
        }
        self.sent.fetch_add(1, Relaxed);
        bump(&budget.stats().issued);
        Ok(now)
    }

    /// A safe read to a host that coalesces: it joins the identical read
    /// another request has in flight, or is admitted and leads one.
    ///
    /// Refusals come first: a request whose budget is spent or whose
    /// deadline has passed is refused, whether or not it could have joined.
    /// While it waits for its slots it joins a flight of its key that starts
    /// meanwhile, and the wait is dropped before it waits on the flight (its
    /// places in the queues, and a slot granted meanwhile, go back);
    /// admitted, it looks once more, under the table's lock, and joins (its
    /// slots go back, nothing is charged) or is charged and leads.
    async fn coalesced(&self, read: Read, host: &HostEntry) -> ReadResult {
        self.refuse_early(host)?;
        if self.reads.budget.time_left().is_none() {
            return Err(self.refused(host, ReadError::DeadlineExceeded));
        }
        let table = &self.reads.parts.coalesce;
        let key = ReadKey::of(&read).expect("a safe read has a key");
        let waited = {
            let slots = self.slots(host);
            tokio::pin!(slots);
            loop {
                // Enabled before the look, so a start after it wakes this read.
                let started = table.started(&key);
                tokio::pin!(started);
                started.as_mut().enable();
                if let Some(flight) = table.find(&key) {
                    break Err(flight);
                }
                tokio::select! {
                    biased;
                    () = &mut started => {}
                    slots = &mut slots => break Ok(slots),
                }
            }
        };
        // The wait for the slots ended above: a read that joins has left
        // the request's and the host's queues (a slot granted meanwhile
        // went back to them), so the host's cap is used by reads sent only.
        let (request_slot, host_slot) = match waited {
            Err(flight) => return self.join(flight, host).await,
            Ok(slots) => slots?,
        };
        let mut charged = None;
        let lead = || {
            let now = self.charge(host)?;
            charged = Some(now);
            Ok(self.shared_send(read, host, host_slot, now))
        };
        match table.join_or_lead(key, lead)? {
            Role::Joined(flight) => {
                drop(request_slot);
                self.join(flight, host).await
            }
            Role::Led(flight) => {
                let now = charged.expect("a leader was charged");
                // The leader's own read, for the request: it holds the
                // request slot until the answer, and counts as sent.
                let _request_slot = request_slot;
                let mut pending = Pending::new(self.reads.budget.stats());
                let outcome = self.wait(flight, host, now).await;
                let outcome = outcome.and_then(|answer| self.keep(answer));
                pending.finish(&outcome);
                outcome
            }
        }
    }

    /// The shared part of a coalesced read, for its own task: the host slot
    /// and the send, bounded by the read timeout alone (not the leader's
    /// deadline: the others wait for it too).
    fn shared_send(
        &self,
        read: Read,
        host: &HostEntry,
        host_slot: HostSlot,
        now: Instant,
    ) -> impl std::future::Future<Output = ReadResult> + Send + 'static {
        let transport = self.reads.parts.transport.clone();
        let host = host.clone();
        let read_timeout = self.reads.parts.read_timeout;
        async move {
            let _host_slot = host_slot;
            let limit = Limit {
                started: now,
                until: now + read_timeout,
                by_deadline: false,
                read_timeout,
            };
            wire(&*transport, &host, read, limit, |r| Ok(Arc::new(r))).await
        }
    }

    /// A read another request has in flight, joined: not charged, no slot,
    /// its own copy of the answer (what this request derives from it is its
    /// own), kept under this request's byte bound.
    async fn join(&self, flight: Flight<ReadResult>, host: &HostEntry) -> ReadResult {
        bump(&self.reads.budget.stats().coalesced);
        host.metrics().coalesced.increment(1);
        tracing::Span::current().record("coalesced", true);
        let answer = self.wait(flight, host, Instant::now()).await?;
        let own = UpstreamResponse::new(
            answer.host.clone(),
            answer.status,
            answer.headers.clone(),
            answer.body.clone(),
        );
        self.keep(Arc::new(own))
    }

    /// The shared read's outcome — its answer or its error — unless this
    /// request's own `min(since + read_timeout, deadline)` comes first.
    async fn wait(
        &self,
        flight: Flight<ReadResult>,
        host: &HostEntry,
        since: Instant,
    ) -> ReadResult {
        let limit = self.limit(since);
        match tokio::time::timeout_at(limit.until, flight.outcome()).await {
            Ok(Some(outcome)) => outcome,
            Ok(None) => Err(ReadError::Upstream {
                host: host.name.to_string(),
                status: None,
                message: "the shared read ended without an answer (it panicked)".into(),
            }),
            Err(_elapsed) => Err(limit.error(&host.name)),
        }
    }

    /// A permit for one call that is not an HTTP read (a SQL query, a gRPC
    /// call, a cache) to `host` (the name its `[hosts]` table uses): charged
    /// as one read, holding a request slot and a host slot while it lives —
    /// every refusal a read can meet, with the same codes. Run the call
    /// inside [`Permit::timeout`] to bound it like a read. A name without a
    /// `[hosts]` table (or [`known_host`](crate::EngineBuilder::known_host))
    /// is unlimited and counted under `host="other"` on the metrics; its
    /// errors still name it.
    ///
    /// ```
    /// use async_graphql::{Context, Object};
    /// use fanout_budget::FanoutContext;
    ///
    /// struct Query;
    ///
    /// #[Object]
    /// impl Query {
    ///     async fn count(&self, ctx: &Context<'_>) -> async_graphql::Result<u64> {
    ///         let upstream = ctx.upstream()?;
    ///         let permit = upstream.permit("postgres:5432").await?;
    ///         // A stand-in for `sqlx::query("…").fetch_one(&pool)`.
    ///         let rows = permit.timeout(async { 42 }).await?;
    ///         Ok(rows)
    ///     }
    /// }
    /// ```
    pub async fn permit(&self, host: &str) -> Result<Permit<'a>, ReadError> {
        // Named as the `[hosts]` tables name it, whatever the case.
        let entry = self.reads.parts.host_table.entry(host.to_ascii_lowercase());
        let admitted = self.admit(&entry).await?;
        Ok(Permit {
            limit: self.limit(admitted.now),
            admitted,
            stats: self.reads.budget.stats(),
            host: entry,
            outcome: Outcome::Succeeded,
        })
    }

    /// When a read sent (or joined) at `now` is cut:
    /// `min(now + read_timeout, deadline)`.
    fn limit(&self, now: Instant) -> Limit {
        let read_timeout = self.reads.parts.read_timeout;
        let by_read_timeout = now + read_timeout;
        let deadline = self.reads.budget.deadline();
        Limit {
            started: now,
            until: by_read_timeout.min(deadline),
            by_deadline: deadline < by_read_timeout,
            read_timeout,
        }
    }

    /// Steps 6–7: sends the read under its time limit and keeps the answer.
    async fn timed_send(&self, read: Read, host: &HostEntry, admitted: Admitted<'_>) -> ReadResult {
        let limit = self.limit(admitted.now);
        // Owned by this future: if the inbound request is cancelled mid-read,
        // dropping it still balances the counters.
        let mut pending = Pending::new(self.reads.budget.stats());
        let transport = &*self.reads.parts.transport;
        let outcome = wire(transport, host, read, limit, |r| self.keep(Arc::new(r))).await;
        pending.finish(&outcome);
        outcome
    }

    /// Every answer is kept for the rest of the request (it may answer an
    /// identical read): their bytes together are bounded, not only each one's.
    fn keep(&self, response: Arc<UpstreamResponse>) -> ReadResult {
        let max = self.reads.parts.max_request_bytes;
        let len = response.body.len() as u64;
        let kept = &self.reads.kept_bytes;
        if kept.fetch_add(len, Relaxed).saturating_add(len) > max {
            kept.fetch_sub(len, Relaxed);
            return Err(response.error(format!(
                "this request's upstream answers would pass {max} bytes"
            )));
        }
        if !self.reads.memory.hold(response.body.len()) {
            // The process's bound (or the request's answer) stopped the
            // request; its operations are being dropped.
            return Err(response.error("this request was stopped by a memory bound"));
        }
        Ok(response)
    }
}

/// When a read is cut, and by what.
#[derive(Clone, Copy)]
struct Limit {
    /// When it was sent (or joined).
    started: Instant,
    /// `min(started + read_timeout, deadline)` (for a shared read's own
    /// task, `started + read_timeout`).
    until: Instant,
    /// Whether `until` is the deadline.
    by_deadline: bool,
    read_timeout: Duration,
}

impl Limit {
    /// `UPSTREAM_TIMEOUT`, or `DEADLINE_EXCEEDED` when the deadline cut it.
    fn error(&self, host: &str) -> ReadError {
        if self.by_deadline {
            ReadError::DeadlineExceeded
        } else {
            ReadError::UpstreamTimeout {
                host: host.to_string(),
                timeout_ms: self.read_timeout.as_millis() as u64,
            }
        }
    }

    /// [`error`](Self::error) for a call to `host` cut at `until`, counted
    /// in the host's metrics.
    fn elapsed(&self, host: &HostEntry) -> ReadError {
        let m = host.metrics();
        m.timeouts.increment(1);
        let counter = if self.by_deadline {
            &m.deadline
        } else {
            &m.timeout
        };
        counter.increment(1);
        self.error(&host.name)
    }
}

/// Steps 6–7 on the wire: `read` sent to `host` until `limit.until`, its
/// response made a result by `answer`; the host's gauge, latency and
/// outcome counters count it (a read dropped unfinished as `cancelled`).
async fn wire(
    transport: &dyn Transport,
    host: &HostEntry,
    read: Read,
    limit: Limit,
    answer: impl FnOnce(UpstreamResponse) -> ReadResult,
) -> ReadResult {
    let m = host.metrics();
    let fetch = transport.fetch(read, &host.name);
    let mut wire = Wire::start(m, limit.started);
    let sent = tokio::time::timeout_at(limit.until, fetch).await;
    wire.finished = true;
    let outcome = match sent {
        Ok(Ok(response)) => answer(response),
        Ok(Err(err)) => Err(err),
        Err(_elapsed) => return Err(limit.elapsed(host)),
    };
    let counter = if outcome.is_ok() { &m.ok } else { &m.error };
    counter.increment(1);
    outcome
}

/// What a read admitted holds until it ends: its slots, and when it was
/// admitted.
struct Admitted<'a> {
    _request_slot: InFlightSlot<'a>,
    _host_slot: HostSlot,
    now: Instant,
}

/// Permission for one call that is not an HTTP read, charged as one read
/// ([`Upstream::permit`]): its request and host slots are held until it is
/// dropped, or until the call given to [`timeout`](Self::timeout) ends. It
/// counts as a read that succeeded — or, in `timeout`, that timed out, or
/// was cancelled when its future was dropped mid-call.
#[must_use = "the slots are released as soon as the permit is dropped"]
pub struct Permit<'a> {
    admitted: Admitted<'a>,
    limit: Limit,
    stats: &'a ReadStats,
    host: HostEntry,
    outcome: Outcome,
}

/// How a permit's call ended, as the read counters count it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Succeeded,
    TimedOut,
    /// In `timeout`'s call: a drop now is a cancellation.
    Calling,
}

impl Permit<'_> {
    /// When the call must be done: `min(admitted + read_timeout, deadline)`.
    pub fn deadline(&self) -> Instant {
        self.limit.until
    }

    /// Runs `call` holding the permit, until [`deadline`](Self::deadline):
    /// its output, or `UPSTREAM_TIMEOUT` (the read timeout cut it) /
    /// `DEADLINE_EXCEEDED` (the request's deadline did). The slots are
    /// released when it returns.
    pub async fn timeout<F: std::future::Future>(
        mut self,
        call: F,
    ) -> Result<F::Output, ReadError> {
        self.outcome = Outcome::Calling;
        if let Ok(output) = tokio::time::timeout_at(self.limit.until, call).await {
            self.outcome = Outcome::Succeeded;
            return Ok(output);
        }
        self.outcome = Outcome::TimedOut;
        Err(self.limit.elapsed(&self.host))
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        let m = self.host.metrics();
        m.latency.record(self.admitted.now.elapsed().as_secs_f64());
        match self.outcome {
            Outcome::Succeeded => {
                bump(&self.stats.succeeded);
                m.ok.increment(1);
            }
            Outcome::TimedOut => bump(&self.stats.timed_out),
            Outcome::Calling => {
                bump(&self.stats.cancelled);
                m.cancelled.increment(1);
            }
        }
    }
}

impl std::fmt::Debug for Permit<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("host", &self.host.name)
            .field("deadline", &self.limit.until)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Upstream<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("budget", &self.reads.budget)
            .finish_non_exhaustive()
    }
}

/// The read a redirect `status` to `next` makes of `sent` (see
/// [`Upstream::read`]); `None` when it would carry a body to another origin.
fn hop(sent: &Read, status: u16, next: reqwest::Url) -> Option<Read> {
    let same_origin = sent.url.origin() == next.origin();
    let to_get = status == 303 && sent.method != http::Method::HEAD
        || matches!(status, 301 | 302) && sent.method == http::Method::POST;
    if !same_origin && !to_get && !sent.body.is_empty() {
        return None;
    }
    // To another origin only what describes the content goes: a header
    // the caller added may be a credential (`x-api-key`), whatever its name.
    let kept =
        |name: &HeaderName| same_origin || matches!(*name, header::ACCEPT | header::CONTENT_TYPE);
    let headers = sent
        .headers
        .iter()
        .filter(|(name, _)| kept(name))
        .filter(|(name, _)| {
            !to_get || !matches!(*name, header::CONTENT_TYPE | header::CONTENT_LENGTH)
        })
        .cloned()
        .collect();
    Some(Read {
        method: if to_get {
            http::Method::GET
        } else {
            sent.method.clone()
        },
        url: next,
        headers,
        body: if to_get {
            bytes::Bytes::new()
        } else {
            sent.body.clone()
        },
        key: if to_get { None } else { sent.key.clone() },
    })
}

/// The `Location` of a redirect answer, if `response` is one.
fn redirect(response: &UpstreamResponse) -> Option<&str> {
    match response.status.as_u16() {
        301 | 302 | 303 | 307 | 308 => response.header("location"),
        _ => None,
    }
}

/// One read on the wire, as the host's metrics see it: the in-flight gauge
/// is held while it exists, and a read dropped before it finished counts as
/// `cancelled`.
struct Wire<'a> {
    metrics: &'a HostMetrics,
    started: Instant,
    finished: bool,
}

impl<'a> Wire<'a> {
    fn start(metrics: &'a HostMetrics, started: Instant) -> Self {
        metrics.in_flight.increment(1.0);
        Self {
            metrics,
            started,
            finished: false,
        }
    }
}

impl Drop for Wire<'_> {
    fn drop(&mut self) {
        self.metrics.in_flight.decrement(1.0);
        self.metrics
            .latency
            .record(self.started.elapsed().as_secs_f64());
        if !self.finished {
            self.metrics.cancelled.increment(1);
        }
    }
}

/// One read this request sent (or leads), as its counters see it: it ends
/// in exactly one of `succeeded`, `failed` and `timed_out` — or, dropped
/// unfinished (its request was cancelled), `cancelled` — so
/// `issued = succeeded + failed + timed_out + cancelled`.
struct Pending<'a> {
    stats: &'a ReadStats,
    finished: bool,
}

impl<'a> Pending<'a> {
    fn new(stats: &'a ReadStats) -> Self {
        Self {
            stats,
            finished: false,
        }
    }

    fn finish(&mut self, outcome: &ReadResult) {
        self.finished = true;
        bump(match outcome {
            Ok(_) => &self.stats.succeeded,
            Err(ReadError::UpstreamTimeout { .. } | ReadError::DeadlineExceeded) => {
                &self.stats.timed_out
            }
            Err(_) => &self.stats.failed,
        });
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.finished {
            bump(&self.stats.cancelled);
        }
    }
}
