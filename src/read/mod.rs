//! The acquisition point: the one way a resolver reaches the upstream. This
//! file is the hub; each step it takes is a spoke beside it, which knows
//! nothing of the others (ARCHITECTURE.md draws the walk).
//!
//! One read, in order ([`Upstream::read`]):
//!
//! 1. **dedup** (`dedup.rs`): an identical read of the same inbound request
//!    answers (in flight or done), and nothing below runs;
//! 2. **refusals**: the budget spent — the request's, or the share of it
//!    the read's upstream may take (`share.rs`) — or, for a host that coalesces
//!    (`coalesce.rs`), joins a flight of another request here instead;
//! 3. **request slot** (`budget.rs`), then **host slot** (`hosts.rs`), each
//!    waited for never past the deadline;
//! 4. **charge** (`budget.rs`, after the upstream's share, `share.rs`):
//!    last before the send, since waiting may have used up the time or the
//!    budget;
//! 5. **timed send** (`timeout.rs` around `transport.rs`): cut at
//!    `min(read_timeout, deadline)`; to a host marked `propagate`, the read
//!    first gets a grant of the budget left and carries it, its deadline and
//!    the hop count in `Fanout-Budget`, and its answer's `Fanout-Spent` is
//!    charged (`propagate.rs`);
//! 6. **keep**: the answer is kept for the rest of the request, its bytes
//!    bounded per request and charged to the request's memory;
//! 7. **redirect** (`redirect.rs`): a redirect answer is followed as a read
//!    of its own, from step 1.
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
use crate::metrics;
use auth::{Answer, Auth, Before, Fault, FetchError, Rejected, Sent, TokenFetch};
use budget::{bump, InFlightSlot, Pending, ReadStats, TimedOut};
use cache::AnswerCache;
use coalesce::{Coalesce, Flight, Role};
use dedup::{Dedup, Origin};
use futures::future::Either;
use hosts::{HostEntry, HostTable};
use message::ReadKey;
use permit::{Admission, Outcome};
use quota::Quotas;
use redirect::Redirects;
use share::{ShareId, ShareUse, Shares};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use timeout::Limit;
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
    /// The upstreams' credentials, their challenges, the kept tokens.
    pub(crate) auth: Auth,
    /// What each host said it has left of its own quota.
    pub(crate) quotas: Arc<Quotas>,
    /// The answers kept for every request (`upstream.cache_bytes`).
    pub(crate) cache: AnswerCache<hosts::HostLabel>,
    /// The upstreams with a share of each request's budget of their own
    /// (`[upstreams."NAME"] max_reads`).
    pub(crate) shares: Shares,
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
/// the engine's cache (`cacheHits`).
#[derive(Debug, Default)]
pub(crate) struct OperationReads {
    pub(crate) sent: AtomicU64,
    pub(crate) cache_hits: AtomicU64,
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
    /// The engine's cache is looked at first, on the future's first poll,
    /// before the rest of the read's future is built: a hit answers there.
    /// The future runs inside the read's span (`spans.rs`): a plain
    /// wrapper, no async layer of its own, so the read's arguments are held
    /// once (a batch of thousands of rows holds one such future per row).
    pub fn read(
        &self,
        read: Read,
    ) -> impl std::future::Future<Output = Result<Arc<UpstreamResponse>, ReadError>> + Send + use<'_, 'a>
    {
        let span = spans::read_span(&read);
        spans::Traced::new(span, move || match self.look_up(&read) {
            ControlFlow::Break(hit) => ControlFlow::Break(hit),
            // Boxed: only a miss the cache may keep carries this step.
            ControlFlow::Continue(Cached::Missed(lookup)) => {
                ControlFlow::Continue(Either::Left(Box::pin(self.checked(read, lookup))))
            }
            ControlFlow::Continue(Cached::Not) => {
                ControlFlow::Continue(Either::Right(self.resolve(read)))
            }
        })
    }

    /// The engine's cache, for a read it may answer (`cache.rs`) — declared
    /// immutable or fresh for a while, addressed by its digest, or to a
    /// host whose answers are kept as their headers say: its answer
    /// (`Break`), else whether and where it is to be kept (`Continue`).
    fn look_up(&self, read: &Read) -> ControlFlow<ReadResult, Cached> {
        let parts = &self.reads.parts;
        let by_headers = !read.cache_done() && parts.host_table.cache_control(&read.url);
        if !read.is_checked() && !by_headers {
            return ControlFlow::Continue(Cached::Not);
        }
        let identity = parts.auth.identity(&read.url);
        let Some(probe) = parts.cache.probe(read, identity.as_deref(), by_headers) else {
            return ControlFlow::Continue(Cached::Missed(None));
        };
        self.hit(read, &probe)?;
        ControlFlow::Continue(Cached::Missed(Some(probe.missed())))
    }

    /// [`read`](Self::read) past the engine's cache, inside the read's span.
    /// An `async` block, not an `async fn`: the read is held once in the
    /// future, not once as an argument and again as a local.
    fn resolve(&self, mut read: Read) -> impl std::future::Future<Output = ReadResult> + Send + '_ {
        async move {
            let auth = &self.reads.parts.auth;
            if auth.knows(&read) {
                // Boxed, as every step of authentication: the common path's
                // future stays small (a read waiting on an identical one
                // holds it).
                return Box::pin(self.with_credentials(read)).await;
            }
            let response = self.follow(&mut read).await?;
            if response.status != http::StatusCode::UNAUTHORIZED || auth::has_authorization(&read) {
                return Ok(response);
            }
            Box::pin(self.challenged(read, response, None)).await
        }
    }

    /// A read the engine's cache may answer (`cache.rs`) — declared
    /// immutable or fresh for a while, addressed by its digest, or to a
    /// host whose answers are kept as their headers say — that it did not:
    /// read (the cache not looked at again), checked against its digest,
    /// and kept.
    async fn checked(&self, mut read: Read, lookup: Option<cache::Lookup>) -> ReadResult {
        let parts = &self.reads.parts;
        let expected = read.take_check();
        let host = lookup.as_ref().map(|_| parts.host_table.resolve(&read.url));
        let answer = cache::verified(self.resolve(read).await?, expected.as_deref())?;
        if let (Some(lookup), Some(host)) = (lookup, host) {
            if let Some(kept) = parts.cache.keep(lookup, &answer, expected, host.label()) {
                host.metrics().cache_stored.increment(1);
                // The request's later hits on it are this answer.
                self.reads.hits.filled(kept, answer.clone());
            }
        }
        Ok(answer)
    }

    /// The answer the engine's cache keeps for `probe`, counted as a hit
    /// (`Break`); else the miss counted (`Continue`).
    fn hit(&self, read: &Read, probe: &cache::Probe<'_>) -> ControlFlow<ReadResult> {
        let parts = &self.reads.parts;
        let Some((kept, host)) = parts.cache.get(probe, read.sha256_named()) else {
            let host = parts.host_table.resolve(&read.url);
            host.metrics().cache_misses.increment(1);
            return ControlFlow::Continue(());
        };
        self.op.cache_hits.fetch_add(1, Relaxed);
        bump(&self.reads.budget.stats().cache_hits);
        spans::note("fanout.cache_hit", true);
        host.metrics().cache_hits.increment(1);
        let kept = match kept {
            Ok(kept) => kept,
            // Not the digest this read names: its own error.
            Err(err) => return ControlFlow::Break(Err(err)),
        };
        // A response of the request's own, shared by its hits on the entry:
        // what they derive of it lives with the request, not in the cache;
        // held by the request, its bytes count as a read's answer's do.
        let own = |kept: &UpstreamResponse| self.keep(Arc::new(kept.copy()));
        ControlFlow::Break(self.reads.hits.answer(kept, own))
    }

    /// A read to an origin whose challenge is known: its credentials up
    /// front (a kept token, fetched first if need be, or Basic), then any
    /// `401` answered.
    async fn with_credentials(&self, read: Read) -> ReadResult {
        let auth = &self.reads.parts.auth;
        let sent = match auth.before(&read, &self.reads.rejected).await {
            Before::Send => None,
            Before::With(sent) => Some(sent),
            Before::Fetch(fetch) => Some(self.token(&read, fetch).await?),
        };
        let mut carried = match &sent {
            Some(sent) => auth::with_authorization(&read, sent.value.clone()),
            None => read,
        };
        let response = self.follow(&mut carried).await?;
        if response.status != http::StatusCode::UNAUTHORIZED {
            return Ok(response);
        }
        self.challenged(carried, response, sent).await
    }

    /// The answers to a `401` to `read` (`auth.rs`): at most two rounds —
    /// a token the upstream rejects is dropped and fetched once more, once;
    /// rejected again, its realm is forgotten.
    async fn challenged(
        &self,
        read: Read,
        mut response: Arc<UpstreamResponse>,
        mut sent: Option<Sent>,
    ) -> ReadResult {
        let auth = &self.reads.parts.auth;
        let rejected = &self.reads.rejected;
        for _round in 0..2 {
            let next = match auth.answer(&read, &response, sent.as_ref(), rejected).await {
                Answer::With(value) => Sent {
                    value,
                    source: None,
                },
                Answer::Fetch(fetch) => self.token(&read, fetch).await?,
                Answer::Refuse(err) => return Err(err),
            };
            let mut retry = auth::with_authorization(&read, next.value.clone());
            response = self.follow(&mut retry).await?;
            if response.status != http::StatusCode::UNAUTHORIZED {
                return Ok(response);
            }
            sent = Some(next);
        }
        Err(auth
            .refused(&read, &response, sent.as_ref(), rejected)
            .await)
    }

    /// A bearer token for `read`: kept, or fetched as a read of this
    /// request — once for every read of any request that needs it
    /// meanwhile; a read waiting for another's fetch waits no longer than
    /// its deadline, and fetches again itself (at most
    /// [`REFETCHES`](auth::REFETCHES) times) when that fetch was stopped by
    /// its own request's bounds. A token this request saw rejected is an
    /// error, and is not kept; a realm that fails is forgotten
    /// (`auth/fault.rs`).
    async fn token(&self, read: &Read, fetch: TokenFetch) -> Result<Sent, ReadError> {
        let TokenFetch { source, read: ask } = fetch;
        let auth = &self.reads.parts.auth;
        let rejected = &self.reads.rejected;
        let (tokens, deadline) = (auth.tokens(), self.reads.budget.deadline());
        let mut refetches = 0;
        let outcome = loop {
            // Set if this read's own fetch runs (not another's it waits on).
            let ran = AtomicBool::new(false);
            let fetched = tokens.try_get_with(source.key.clone(), self.fetch_token(&ask, &ran));
            match tokio::time::timeout_at(deadline, fetched).await {
                // Kept by another request that did not see it rejected: dropped.
                Ok(Ok(token)) if rejected.has(&token.header) => {
                    auth.drop_token(&source.key, &token.header).await;
                    let host = hosts::host_name(&ask.url);
                    break Err(FetchError::realm(auth::rejected_again(host)));
                }
                Ok(Ok(token)) => break Ok(token.header),
                // Another request's fetch, stopped by that request's own
                // bounds: nothing to do with this one, which fetches again.
                Ok(Err(shared))
                    if shared.fault == Fault::Fetcher
                        && !ran.load(Relaxed)
                        && refetches < auth::REFETCHES =>
                {
                    refetches += 1;
                }
                Ok(Err(shared)) => break Err((*shared).clone()),
                Err(_elapsed) => return Err(ReadError::DeadlineExceeded),
            }
        };
        match outcome {
            Ok(value) => Ok(Sent {
                value,
                source: Some(source),
            }),
            Err(err) => {
                auth.fetch_failed(read, &source, &err);
                Err(err.error)
            }
        }
    }

    /// A token fetched by `ask`, a read of this request (`ran` set as it
    /// starts), and whose doing its failure is (`auth/fault.rs`).
    async fn fetch_token(&self, ask: &Read, ran: &AtomicBool) -> Result<auth::Token, FetchError> {
        ran.store(true, Relaxed);
        let mut ask = ask.clone();
        let span = spans::token_span(&ask);
        let response = self.follow(&mut ask).instrument(span).await;
        let response = response.map_err(FetchError::read)?;
        let token = auth::token(&response)?;
        if self.reads.rejected.has(&token.header) {
            // The request's de-duplicated answer: the token rejected.
            let host = response.host.clone();
            return Err(FetchError::realm(auth::rejected_again(host)));
        }
        Ok(token)
    }

    /// `sent` and the redirects it answers with, each a read of its own;
    /// `sent` becomes the last request sent (the one the answer is to).
    async fn follow(&self, sent: &mut Read) -> ReadResult {
        let mut redirects = Redirects::new(self.reads.parts.max_redirects);
        let mut response = self.read_once(sent).await?;
        loop {
            // The next hop taken before the await: not held across it.
            *sent = match redirects.next(sent, &response) {
                Ok(Some(hop)) => hop,
                Ok(None) => return Ok(response),
                Err(why) => return Err(response.error(why)),
            };
            response = self.read_once(sent).await?;
        }
    }

    /// Step 1, then steps 2–6 unless an identical read answers.
    async fn read_once(&self, read: &Read) -> ReadResult {
        let (result, origin) = match read.identity() {
            Some(key) => {
                self.reads
                    .dedup
                    .get_or_run(key, || Box::pin(self.send(read.clone())))
                    .await
            }
            // Not safe to share: sent every time.
            None => (Box::pin(self.send(read.clone())).await, Origin::Ran),
        };
        if origin == Origin::Shared {
            bump(&self.reads.budget.stats().dedup_hits);
            metrics::dedup_hit();
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
    async fn send(&self, mut read: Read) -> ReadResult {
        let host = self.reads.parts.host_table.resolve(&read.url);
        // A read that carries its request's budget is its own: its answer
        // and what it spent are this request's (`propagate.rs`).
        if host.coalesce() && !host.propagates() && read.is_safe() && read.body.is_empty() {
            // Boxed: the common path's future stays small (it is moved at
            // each level of the walk).
            return Box::pin(self.coalesced(read, &host)).await;
        }
        let share = self.reads.parts.shares.of(&read.url);
        if host.propagates() && self.no_time_to_give() {
            return Err(self.refused(&host, ReadError::DeadlineExceeded));
        }
        let admitted = self.admit(&host, share).await?;
        let limit = self.limit(admitted.now);
        let grant = match host.propagates() {
            true => Some(self.grant(share).await),
            false => None,
        };
        if let Some(grant) = &grant {
            // The callee may answer this much past the deadline it is
            // given: given less, it answers before this read is cut.
            let until = limit.until.checked_sub(budget::FINISH_GRACE);
            let (name, value) = grant.header(until.unwrap_or(limit.until), self.reads.hops);
            read.headers.retain(|(n, _)| *n != name);
            read.headers.push((name, value));
        }
        // Owned by this future: if the inbound request is cancelled mid-read,
        // dropping it still balances the counters.
        let mut pending = Pending::new(self.reads.budget.stats());
        let span = spans::client_span(&read);
        let fetch = span.around(self.reads.parts.transport.fetch(read, &host.name));
        let quotas = &self.reads.parts.quotas;
        let outcome = timeout::send(fetch, host.metrics(), &host.name, limit, |r| {
            if let Some(grant) = grant {
                self.settle(grant.spent(&r.headers), share);
            }
            // What the answer says of the host's quota (`quota.rs`).
            match quotas.observe(&host.name, r.status, &r.headers, admitted.now) {
                Some(spent) => Err(spent),
                None => self.keep(Arc::new(r)),
            }
        })
        .await;
        span.finish(&outcome, host.metrics());
        pending.finish(&outcome);
        outcome
    }

    /// Step 5, to a host marked `propagate`: the read's grant of the
    /// reads left, split with the reads asking at the same moment
    /// (`propagate.rs`), charged now.
    /// An upstream with a share of its own (`share`) is granted no more
    /// than is left of it, taken from it too.
    async fn grant(&self, share: Option<ShareId>) -> propagate::Grant {
        let asking = self.reads.claimants.ask().await;
        let (budget, shares) = (&self.reads.budget, &self.reads.parts.shares);
        let cap = share.map_or(u64::MAX, |id| shares.left(&self.reads.shares, id));
        let mut reads = budget.reserve_grant(asking.count(), cap);
        if let Some(id) = share {
            // Another read of the share may have taken some meanwhile.
            let took = shares.take_up_to(&self.reads.shares, id, reads);
            budget.settle_grant(reads, took);
            reads = took;
        }
        spans::note("fanout.granted", reads);
        propagate::Grant::new(reads, budget.grants_unlimited() && share.is_none())
    }

    /// What the upstream said it spent of its grant, charged: up to the
    /// grant, the rest given back (`propagate.rs`), to the upstream's
    /// `share` too.
    fn settle(&self, spent: propagate::Spent, share: Option<ShareId>) {
        let budget = &self.reads.budget;
        let (granted, charged) = match spent {
            propagate::Spent::Unreported { granted } => (granted, budget.settle_grant(granted, 0)),
            propagate::Spent::OfGrant { granted, spent } => {
                spans::note("fanout.spent", spent);
                (granted, budget.settle_grant(granted, spent))
            }
            propagate::Spent::Unlimited(spent) => {
                spans::note("fanout.spent", spent);
                budget.charge_spent(spent);
                return;
            }
        };
        if let Some(id) = share {
            (self.reads.parts.shares).give_back_n(&self.reads.shares, id, granted - charged);
        }
    }

    /// Whether the read, sent now, would leave a service on the engine no
    /// time: it is given the read's time less the 100 ms it may take to
    /// answer past its deadline (refused before it is charged).
    fn no_time_to_give(&self) -> bool {
        let now = Instant::now();
        self.limit(now).until.saturating_duration_since(now) <= budget::FINISH_GRACE
    }

    /// Steps 2–4: the refusals, the request slot, the host slot and the
    /// charge, for one read to `host` (counted against the upstream's
    /// `share`, if its origin has one: `share.rs`). The clock is read
    /// once, and again only after a slot was waited for: when both are
    /// free the steps take nanoseconds, and each read of the clock costs
    /// about 25 ns here.
    async fn admit(
        &self,
        host: &HostEntry,
        share: Option<ShareId>,
    ) -> Result<Admitted<'a>, ReadError> {
        let now = Instant::now();
        self.refuse_early(host, share, now)?;
        let (slots, now) = self.slots(host, now).await?;
        let now = self.charge(host, share, now)?;
        Ok(Admitted { _slots: slots, now })
    }

    /// Step 2: the host said its quota is spent (`quota.rs`), or no read
    /// is left — of the request's, or of its upstream's share — or no time.
    fn refuse_early(
        &self,
        host: &HostEntry,
        share: Option<ShareId>,
        now: Instant,
    ) -> Result<(), ReadError> {
        if let Some((hops, max)) = self.reads.past_max_hops {
            return Err(self.refused(host, ReadError::TooManyHops { hops, max }));
        }
        if let Err(spent) = self.reads.parts.quotas.check(&host.name, now) {
            return Err(self.refused(host, spent));
        }
        let budget = &self.reads.budget;
        if budget.is_exhausted() {
            return Err(self.refused(host, self.exhausted()));
        }
        let shares = &self.reads.parts.shares;
        if let Some(id) = share.filter(|id| shares.is_spent(&self.reads.shares, *id)) {
            return Err(self.refused(host, shares.spent(id)));
        }
        if budget.time_left_at(now).is_none() {
            return Err(self.refused(host, ReadError::DeadlineExceeded));
        }
        Ok(())
    }

    /// Step 3: the request slot, then the host slot, each waited for never
    /// past the deadline; with the time after them (`now`, unless one was
    /// waited for).
    async fn slots(
        &self,
        host: &HostEntry,
        now: Instant,
    ) -> Result<(Slots<'a>, Instant), ReadError> {
        let budget: &'a RequestBudget = &self.reads.budget;
        let (request_slot, now) = match budget.try_in_flight_slot() {
            Some(slot) => (slot, now),
            None => match budget.in_flight_slot().await {
                Ok(slot) => (slot, Instant::now()),
                Err(TimedOut) => return Err(self.refused(host, ReadError::DeadlineExceeded)),
            },
        };
        let Some(left) = budget.time_left_at(now) else {
            return Err(self.refused(host, ReadError::DeadlineExceeded));
        };
        let hosts = &*self.reads.parts.hosts;
        let (host_slot, now) = match hosts.try_acquire(&host.name) {
            Some(slot) => (slot, now),
            None => (hosts.acquire(&host.name, left).await, Instant::now()),
        };
        match host_slot {
            Ok(host_slot) => Ok(((request_slot, host_slot), now)),
            Err(refusal) => Err(self.refused(host, refusal.for_host(&host.name))),
        }
    }

    /// Step 4: the charge, last before the send: when the read is admitted
    /// (`now`, the time after its slots), or its refusal. A read to an
    /// upstream with a share takes a read of it first (`share.rs`), given
    /// back if the request's budget refuses the read.
    fn charge(
        &self,
        host: &HostEntry,
        share: Option<ShareId>,
        now: Instant,
    ) -> Result<Instant, ReadError> {
        let budget = &self.reads.budget;
        if budget.time_left_at(now).is_none() {
            return Err(self.refused(host, ReadError::DeadlineExceeded));
        }
        let shares = &self.reads.parts.shares;
        if let Some(id) = share {
            if let Err(spent) = shares.try_take(&self.reads.shares, id) {
                return Err(self.refused(host, spent));
            }
        }
        if budget.try_charge().is_err() {
            if let Some(id) = share {
                shares.give_back(&self.reads.shares, id);
            }
            return Err(self.refused(host, self.exhausted()));
        }
        self.op.sent.fetch_add(1, Relaxed);
        bump(&budget.stats().issued);
        spans::note("fanout.charged", true);
        Ok(now)
    }

    /// `err`, counted as the refusal of a read to `host` (`budget.rs`
    /// names why; a host's cap refusing is the host's to count too).
    fn refused(&self, host: &HostEntry, err: ReadError) -> ReadError {
        let why = self.reads.budget.count_refusal(&err);
        if matches!(err, ReadError::HostSaturated { .. }) {
            host.metrics().rejections.increment(1);
        }
        spans::note("fanout.refused", why);
        err
    }

    fn exhausted(&self) -> ReadError {
        ReadError::BudgetExhausted {
            limit: self.reads.budget.refusing_limit(),
        }
    }

    /// Steps 2–6 to a host that coalesces (`coalesce.rs`): the read joins
    /// the identical read another request has in flight, or is admitted
    /// and leads one, whose send runs in a task of its own.
    async fn coalesced(&self, read: Read, host: &HostEntry) -> ReadResult {
        let now = Instant::now();
        let share = self.reads.parts.shares.of(&read.url);
        self.refuse_early(host, share, now)?;
        let table = &self.reads.parts.coalesce;
        let key = read.identity().expect("a safe read has a key");
        let slots = table.unless_started(&key, self.slots(host, now)).await;
        let ((request_slot, host_slot), now) = match slots {
            Err(flight) => return self.join(flight, host).await,
            Ok(slots) => slots?,
        };
        let mut charged = None;
        let lead = || {
            let now = self.charge(host, share, now)?;
            charged = Some(now);
            let parts = self.reads.parts.clone();
            let transport = parts.transport.clone();
            let (host, read_timeout) = (host.clone(), self.reads.parts.read_timeout);
            let span = spans::client_span(&read);
            Ok(async move {
                let _host_slot = host_slot;
                let limit = Limit::read_timeout(now, read_timeout);
                let fetch = span.around(transport.fetch(read, &host.name));
                let outcome = timeout::send(fetch, host.metrics(), &host.name, limit, |r| {
                    match parts.quotas.observe(&host.name, r.status, &r.headers, now) {
                        Some(spent) => Err(spent),
                        None => Ok(Arc::new(r)),
                    }
                })
                .await;
                span.finish(&outcome, host.metrics());
                outcome
            })
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

    /// A read another request has in flight, joined: not charged, no slot,
    /// its own copy of the answer, kept under this request's bounds.
    async fn join(&self, flight: Flight<ReadResult>, host: &HostEntry) -> ReadResult {
        bump(&self.reads.budget.stats().coalesced);
        host.metrics().coalesced.increment(1);
        spans::note("fanout.coalesced", true);
        let answer = self.wait(flight, host, Instant::now()).await?;
        // Its own response (what it derives is its own), found unusable
        // whenever the leader's is.
        self.keep(Arc::new(answer.copy()))
    }

    /// The shared read's outcome, unless this request's own
    /// `min(since + read_timeout, deadline)` comes first.
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
        let host = self.reads.parts.host_table.entry(host.to_ascii_lowercase());
        // Not a request sent to an origin: no upstream's share.
        let admitted = self.admit(&host, None).await?;
        Ok(Permit::new(Box::new(Call {
            limit: self.limit(admitted.now),
            _admitted: admitted,
            stats: self.reads.budget.stats(),
            host,
        })))
    }
}

/// A request slot and a host slot, held together.
type Slots<'a> = (InFlightSlot<'a>, HostSlot);

/// What a read admitted holds until it ends: its slots, and when it was
/// admitted.
struct Admitted<'a> {
    _slots: Slots<'a>,
    now: Instant,
}

/// A permit's admission: its slots, its limit, the counters its end goes to.
struct Call<'a> {
    _admitted: Admitted<'a>,
    limit: Limit,
    stats: &'a ReadStats,
    host: HostEntry,
}

impl Admission for Call<'_> {
    fn until(&self) -> Instant {
        self.limit.until
    }

    fn elapsed(&self) -> ReadError {
        self.limit.elapsed(self.host.metrics(), &self.host.name)
    }

    fn end(&self, outcome: Outcome) {
        let m = self.host.metrics();
        m.latency.record(self.limit.started.elapsed().as_secs_f64());
        match outcome {
            Outcome::Succeeded => {
                bump(&self.stats.succeeded);
                m.ok.increment(1);
            }
            Outcome::TimedOut => bump(&self.stats.timed_out),
            Outcome::Cancelled => {
                bump(&self.stats.cancelled);
                m.cancelled.increment(1);
            }
        }
    }

    fn host(&self) -> &str {
        &self.host.name
    }
}

impl std::fmt::Debug for Upstream<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("budget", &self.reads.budget)
            .finish_non_exhaustive()
    }
}
