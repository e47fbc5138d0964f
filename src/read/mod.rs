//! The acquisition point: the one way a resolver reaches the upstream. This
//! file is the hub, and walks a read; each step it takes is a spoke beside
//! it, which knows nothing of the others (ARCHITECTURE.md draws the walk).
//! The steps that bring several spokes together are the hub's too, each a
//! file of `hub/` (`hub.rs`): this file names none of them, they name its types.
//!
//! One read, in order ([`Upstream::read`]):
//!
//! 0. **the cache** (`cache.rs`; `hub/lookup.rs`): a read the engine's cache
//!    may answer is looked up first, and a miss kept once read;
//! 1. **dedup** (`dedup.rs`): an identical read of the same inbound request
//!    answers (in flight or done), and nothing below runs;
//! 2. **refusals**: the budget spent — the request's, or the share of it
//!    the read's upstream may take (`share.rs`) — or, for a host that coalesces
//!    (`coalesce.rs`; `hub/coalesced.rs`), joins a flight of another request
//!    here instead;
//! 3. **request slot** (`budget.rs`), then **host slot** (`hosts.rs`), each
//!    waited for never past the deadline;
//! 4. **charge** (`budget.rs`, after the upstream's share, `share.rs`):
//!    last before the send, since waiting may have used up the time or the
//!    budget (steps 2–4: `hub/admit.rs`);
//! 5. **timed send** (`timeout.rs` around `transport.rs`): cut at
//!    `min(read_timeout, deadline)`; to a host marked `propagate`, the read
//!    first gets a grant of the budget left and carries it, its deadline and
//!    the hop count in `Fanout-Budget`, and its answer's `Fanout-Spent` is
//!    charged (`propagate.rs`; `hub/propagated.rs`);
//! 6. **keep**: the answer is kept for the rest of the request, its bytes
//!    bounded per request and charged to the request's memory;
//! 7. **redirect** (`redirect.rs`): a redirect answer is followed as a read
//!    of its own, from step 1;
//! 8. **a challenge** (`auth.rs`): a read to an origin that authenticates is
//!    walked by `auth/walk.rs`, which sends every request it asks for
//!    through the hub (`hub/authenticated.rs`), from step 1.
//!
//! The slots are guards owned by the read's future, released on every
//! outcome, cancellation included; the counting guards (`Pending` in
//! `budget.rs`, the host's `Wire` in `timeout.rs`) count every read sent
//! to exactly one end. A [`Permit`] (`permit.rs`) is steps 2–4 for a call
//! that is not an HTTP read. `message.rs` holds the vocabulary every step
//! names: the [`Read`] and its [`UpstreamResponse`].

pub(crate) mod auth;
pub(crate) mod budget;
pub(crate) mod cache;
pub(crate) mod coalesce;
pub(crate) mod dedup;
pub(crate) mod hosts;
mod hub;
pub(crate) mod message;
pub(crate) mod permit;
pub(crate) mod propagate;
pub(crate) mod quota;
pub(crate) mod redirect;
pub(crate) mod share;
mod spans;
pub(crate) mod timeout;
pub(crate) mod transport;

pub use budget::{BudgetSnapshot, ReadCounts, RequestBudget};
pub use hosts::{host_name, HostLimiter, HostSlot, LocalHostCaps, OTHER_HOSTS};
pub use message::{Read, UpstreamResponse};
pub use permit::Permit;
pub use quota::{Learn, QuotaBoard};
pub use transport::{HttpTransport, Transport};

use crate::error::ReadError;
use crate::memory::{MemoryPool, RequestMemory};
use crate::metrics::RequestMetrics;
use auth::{Auth, Rejected};
use budget::{bump, Pending};
use cache::AnswerCache;
use coalesce::Coalesce;
use dedup::{Dedup, Origin};
use futures::future::{BoxFuture, Either};
use hosts::{HostEntry, HostTable};
use message::ReadKey;
use quota::Quotas;
use redirect::Redirects;
use share::{ShareUse, Shares};
use std::future::Future;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use timeout::Limit;
use tokio::time::Instant;

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
    /// The upstreams' credentials, their challenges, the kept tokens.
    pub(crate) auth: Auth,
    /// What each host said it has left of its own quota.
    pub(crate) quotas: Arc<Quotas>,
    /// The answers kept for every request (`upstream.cache_bytes`).
    pub(crate) cache: AnswerCache<hosts::HostLabel>,
    /// The upstreams with a share of each request's budget of their own
    /// (`[upstreams."NAME"] max_reads`).
    pub(crate) shares: Shares,
    /// The handles of what each request and operation records
    /// (`fanout_requests_total`, `fanout_request_reads`, …).
    pub(crate) metrics: RequestMetrics,
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
    /// The tokens an upstream rejected in this request (`auth/rejected.rs`).
    rejected: Rejected,
    /// Its own responses for the cache's entries (`cache.rs`).
    hits: cache::RequestHits,
    /// Its reads against each upstream's share (`share.rs`).
    shares: ShareUse,
    /// Its reads asking for a grant now (`propagate.rs`).
    claimants: propagate::Claimants,
    /// The hop count its reads to a `propagate` host send (`chain/`).
    hops: u64,
    /// `(hops, max_hops)` when its caller's header says it passed through
    /// more services than `budget.max_hops`: every read refused.
    past_max_hops: Option<(u64, u32)>,
}

pub(crate) type ReadResult = Result<Arc<UpstreamResponse>, ReadError>;

impl RequestReads {
    /// The reads of a request whose budget is `budget`, what it holds taken
    /// from `pool` (else the requests' pool).
    pub(crate) fn new(
        parts: Arc<ReadParts>,
        budget: RequestBudget,
        pool: Option<Arc<MemoryPool>>,
        hops: u64,
    ) -> Self {
        let pool = pool.unwrap_or_else(|| parts.memory.clone());
        let memory = RequestMemory::new(pool, parts.max_answer_bytes);
        Self {
            shares: parts.shares.open(),
            parts,
            budget,
            dedup: Dedup::new(),
            kept_bytes: AtomicU64::new(0),
            memory,
            rejected: Rejected::default(),
            hits: cache::RequestHits::new(),
            claimants: propagate::Claimants::default(),
            hops,
            past_max_hops: None,
        }
    }

    /// Refuses every read when the request passed through more services
    /// than `budget.max_hops` (`Some((hops, max_hops))`), whichever way a
    /// read is asked for — an operation is refused before it runs, and a
    /// handler holding the scope is refused here.
    pub(crate) fn past_max_hops(mut self, past: Option<(u64, u32)>) -> Self {
        self.past_max_hops = past;
        self
    }

    pub(crate) fn budget(&self) -> &RequestBudget {
        &self.budget
    }

    pub(crate) fn memory(&self) -> &RequestMemory {
        &self.memory
    }

    /// The engine's handles of what each request and operation records.
    pub(crate) fn metrics(&self) -> &RequestMetrics {
        &self.parts.metrics
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
    /// The operation's own counts (`operationReads`, `cacheHits`).
    op: &'a OperationReads,
}

/// What one operation's reads did: sent (`operationReads`), answered from
/// the engine's cache (`cacheHits`); and the trace they belong to.
#[derive(Debug, Default)]
pub(crate) struct OperationReads {
    pub(crate) sent: AtomicU64,
    pub(crate) cache_hits: AtomicU64,
    /// The request's trace, for a read made outside its task
    /// (`telemetry/carried.rs`).
    #[cfg(feature = "otel")]
    pub(crate) trace: crate::telemetry::CarriedTrace,
}

impl OperationReads {
    /// An operation's, made in its request's task (the trace it is in
    /// kept, while a telemetry exports).
    pub(crate) fn here() -> Self {
        OperationReads {
            #[cfg(feature = "otel")]
            trace: crate::telemetry::CarriedTrace::here(),
            ..Default::default()
        }
    }

    /// The operation's span opened (`span`): the parent of the reads made
    /// away from the request's task.
    pub(crate) fn under(&self, span: &tracing::Span) {
        #[cfg(feature = "otel")]
        self.trace.under(span);
        #[cfg(not(feature = "otel"))]
        let _ = span;
    }

    /// The operation ended: later reads are not in its trace.
    pub(crate) fn ended(&self) {
        #[cfg(feature = "otel")]
        self.trace.end();
    }
}

/// A read made under its request's trace away from the request's task:
/// boxed, so that the common read's future, moved at each level of its
/// caller, is not as large as the two task-locals it would otherwise
/// carry (~100 bytes).
#[cfg(feature = "otel")]
type Carried<F> = std::pin::Pin<Box<crate::telemetry::Carried<F>>>;
/// Without the `otel` feature, never built.
#[cfg(not(feature = "otel"))]
type Carried<F> = F;

/// A read run as it is, in the task that asks for it.
fn in_task<F>(read: F) -> Either<Carried<F>, F> {
    Either::Right(read)
}

/// What the engine's cache said of a read before its future was built.
enum Cached {
    /// Not a read the cache may answer, nor one to check.
    Not,
    /// A read to check, and to keep where the lookup says (`None`: not to
    /// keep — the cache is off, or the read is not one it keeps, such as a
    /// digest-checked read that is not a `GET`).
    Missed(Option<cache::Lookup>),
}

impl<'a> Upstream<'a> {
    pub(crate) fn new(reads: &'a RequestReads, op: &'a OperationReads) -> Self {
        Self { reads, op }
    }

    /// The request's budget.
    pub fn budget(&self) -> &'a RequestBudget {
        &self.reads.budget
    }

    /// Reads `read` through the acquisition point (see the module docs):
    /// each redirect followed is a read of its own (`redirect.rs`); to a
    /// host with `coalesce = true`, a read another request has in flight is
    /// joined (`coalesce.rs`); a `401` with a challenge is answered
    /// (`auth.rs`) — the token fetch and the retry each a read of its own.
    ///
    /// The engine's cache is looked at first, on the future's first poll:
    /// a hit answers there. The future runs inside the read's span
    /// (`spans.rs`): a plain wrapper, no async layer of its own, so the
    /// read's arguments are held once (a batch of thousands of rows holds
    /// one such future per row).
    ///
    /// Made outside the request's task (a `DataLoader`'s spawned load), it
    /// runs under the request's trace all the same (`telemetry`).
    pub fn read(
        &self,
        read: Read,
    ) -> impl std::future::Future<Output = Result<Arc<UpstreamResponse>, ReadError>> + Send + use<'_, 'a>
    {
        #[cfg(feature = "otel")]
        if let Some(away) = self.op.trace.away() {
            let traced = move || self.traced(read);
            return Either::Left(Box::pin(crate::telemetry::carry(away, traced)));
        }
        in_task(self.traced(read))
    }

    /// [`read`](Self::read), in the task that asks for it.
    fn traced(&self, read: Read) -> impl Future<Output = ReadResult> + Send + use<'_, 'a> {
        let span = spans::read_span(&read);
        spans::Traced::new(span, self.resolve(read))
    }

    /// [`read`](Self::read) inside the read's span: step 0, the engine's
    /// cache, on the future's first poll (a hit answers there), then the
    /// rest of the walk. One future from the start, polled in place: no
    /// step is built and moved into it as the read goes on.
    /// An `async` block, not an `async fn`: the read is held once in the
    /// future, not once as an argument and again as a local.
    fn resolve(&self, mut read: Read) -> impl Future<Output = ReadResult> + Send + '_ {
        async move {
            {
                // In a block of its own: what the cache said is not held
                // across the awaits after it.
                let missed = match self.look_up(&read) {
                    ControlFlow::Break(hit) => return hit,
                    ControlFlow::Continue(Cached::Missed(lookup)) => Some(lookup),
                    ControlFlow::Continue(Cached::Not) => None,
                };
                if let Some(lookup) = missed {
                    // Boxed: only a miss the cache may keep carries this
                    // step; erased, as it walks again from here (the cache
                    // not looked at again: `hub/lookup.rs`).
                    let checked: BoxFuture<'_, ReadResult> = Box::pin(self.checked(read, lookup));
                    return checked.await;
                }
            }
            let auth = &self.reads.parts.auth;
            if auth.knows(&read) {
                // Boxed, as every step of authentication: the common path's
                // future stays small (a read waiting on an identical one
                // holds it).
                let with_credentials = Box::pin(auth.with_credentials(self, read));
                return with_credentials.await;
            }
            let response = self.follow(&mut read).await?;
            if !auth::walk::challenges(&read, &response) {
                return Ok(response);
            }
            let challenged = Box::pin(auth.challenged(self, read, response, None));
            challenged.await
        }
    }

    /// `sent` and the redirects it answers with, each a read of its own;
    /// `sent` becomes the last request sent (the one the answer is to).
    async fn follow(&self, sent: &mut Read) -> ReadResult {
        let response = self.read_once(sent).await?;
        // Made after the first answer: not held across its await.
        let mut redirects = Redirects::new(self.reads.parts.max_redirects);
        *sent = match redirects.next(sent, &response) {
            Ok(Some(hop)) => hop,
            Ok(None) => return Ok(response),
            Err(why) => return Err(response.error(why)),
        };
        // Boxed: only a redirect carries the loop of hops.
        let hops = Box::pin(self.hops(sent, redirects));
        hops.await
    }

    /// The hops of a redirect chain after the first answer, `sent` the
    /// next to send.
    async fn hops(&self, sent: &mut Read, mut redirects: Redirects) -> ReadResult {
        loop {
            let response = self.read_once(sent).await?;
            // The next hop taken before the await: not held across it.
            *sent = match redirects.next(sent, &response) {
                Ok(Some(hop)) => hop,
                Ok(None) => return Ok(response),
                Err(why) => return Err(response.error(why)),
            };
        }
    }

    /// Step 1, then steps 2–6 unless an identical read answers.
    async fn read_once(&self, read: &Read) -> ReadResult {
        let send = || Box::pin(self.send(read.clone()));
        // In a statement of its own: the read's key, claimed in the
        // request's table, is not held across the await (`dedup.rs`).
        let once = match read.identity() {
            Some(key) => Either::Left(self.reads.dedup.get_or_run(key, send)),
            // Not safe to share: sent every time.
            None => Either::Right(async move { (send().await, Origin::Ran) }),
        };
        let (result, origin) = once.await;
        if origin == Origin::Shared {
            bump(&self.reads.budget.stats().dedup_hits);
            self.reads.parts.metrics.dedup_hit();
            spans::note("fanout.dedup", true);
        }
        // A read answered at once (de-duplicated, refused) never waits, and
        // the many fields woken together when one shared read lands all go on
        // in the same poll; each read's end spends a unit of tokio's
        // cooperative budget, so such an operation still yields — to other
        // requests, and to its deadline.
        tokio::task::consume_budget().await;
        result
    }

    /// Steps 2–6 for a read no other read of the request answers.
    /// An `async` block, not an `async fn`: the read is held once.
    fn send(&self, read: Read) -> impl Future<Output = ReadResult> + Send + '_ {
        async move {
            let host = self.reads.parts.host_table.resolve(&read.url);
            // A read that carries its request's budget is its own: its answer
            // and what it spent are this request's (`propagate.rs`).
            if host.coalesce() && !host.propagates() && read.is_safe() && read.body.is_empty() {
                // Boxed: the common path's future stays small (it is moved at
                // each level of the walk).
                let coalesced = Box::pin(self.coalesced(read, &host));
                return coalesced.await;
            }
            let share = self.reads.parts.shares.of(&read.url);
            if host.propagates() {
                // Boxed, as the coalesced step: its grant's wait is not in the
                // common path's future.
                let propagated = Box::pin(self.propagated(read, &host, share));
                return propagated.await;
            }
            // Held to the end: the read's slots.
            let admitted = self.admit(&host, share).await?;
            self.sent(read, &host, self.limit(admitted.now), share, None)
                .await
        }
    }

    /// Steps 5–6 for a read admitted: sent until `limit`, carrying `grant`
    /// (to a host marked `propagate`), counted to exactly one end. A
    /// future made of the arguments, each held once.
    pub(in crate::read) fn sent<'s>(
        &'s self,
        read: Read,
        host: &'s HostEntry,
        limit: Limit,
        share: Option<share::ShareId>,
        grant: Option<propagate::Grant>,
    ) -> impl Future<Output = ReadResult> + 's {
        // Owned by this future: if the inbound request is cancelled mid-read,
        // dropping it still balances the counters.
        let mut pending = Pending::new(self.reads.budget.stats());
        let span = spans::client_span(&read);
        let settle = move |answer: &http::HeaderMap| {
            if let Some(grant) = grant {
                self.settle(grant.spent(answer), share);
            }
        };
        let keep = |r| self.keep(Arc::new(r));
        let finish = move |outcome: &ReadResult| pending.finish(outcome);
        let parts = &self.reads.parts;
        on_the_wire(parts, span, read, host, limit, (settle, keep, finish))
    }

    /// When a read sent (or joined) at `now` is cut.
    fn limit(&self, now: Instant) -> Limit {
        let parts = &self.reads.parts;
        Limit::new(now, parts.read_timeout, self.reads.budget.deadline())
    }

    /// Step 6: every answer is kept for the rest of the request (it may
    /// answer an identical read): their bytes together are bounded, not
    /// only each one's, and held in the request's memory.
    fn keep(&self, response: Arc<UpstreamResponse>) -> ReadResult {
        let max = self.reads.parts.max_request_bytes;
        let len = response.body.len() as u64;
        let kept = &self.reads.kept_bytes;
        if kept.fetch_add(len, Relaxed).saturating_add(len) > max {
            kept.fetch_sub(len, Relaxed);
            return Err(response.bound(format!(
                "this request's upstream answers would pass {max} bytes"
            )));
        }
        if !self.reads.memory.hold(response.body.len()) {
            // The process's bound (or the request's answer) stopped the
            // request; its operations are being dropped.
            return Err(response.bound("this request was stopped by a memory bound"));
        }
        Ok(response)
    }
}

/// Step 5 on the wire, for the walk and for a coalesced read's own send
/// alike: `read` handed to the transport now, inside `span` (its CLIENT
/// span, made where the read's span is current), and sent until `limit`;
/// `settle` sees the answer's headers, then what they say of the host's
/// quota is learned (`quota.rs`) — a quota spent is the read's error — and
/// `answer` makes the result, which the span, then `finish`, see as the
/// read ends. The future holds the transport's, not the read, and is
/// polled in place (`timeout::send`).
fn on_the_wire<'w, S, A, E>(
    parts: &'w ReadParts,
    span: spans::ClientSpan,
    read: Read,
    host: &'w HostEntry,
    limit: Limit,
    (settle, answer, finish): (S, A, E),
) -> impl Future<Output = ReadResult> + 'w
where
    S: FnOnce(&http::HeaderMap) + 'w,
    A: FnOnce(UpstreamResponse) -> ReadResult + 'w,
    E: FnOnce(&ReadResult) + 'w,
{
    let fetch = span.around(parts.transport.fetch(read, &host.name));
    let answer = move |r: UpstreamResponse| {
        settle(&r.headers);
        // What the answer says of the host's quota (`quota.rs`).
        match (parts.quotas).observe(&host.name, r.status, &r.headers, limit.started) {
            Some(spent) => Err(spent),
            None => answer(r),
        }
    };
    let finish = move |outcome: &ReadResult| {
        span.finish(outcome, host.metrics());
        finish(outcome);
    };
    timeout::send(fetch, host.metrics(), &host.name, limit, answer, finish)
}

impl std::fmt::Debug for Upstream<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("budget", &self.reads.budget)
            .finish_non_exhaustive()
    }
}
