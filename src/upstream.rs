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
//!
//! What a read costs the engine: a de-duplicated read stops at step 1 (one
//! map lookup). A read that is sent resolves its host in the engine's host
//! table (one lookup, no string built), takes its host slot synchronously
//! when one is free, reads the request's clock once (again only after
//! waiting for a slot) and arms one timer at
//! `min(now + read_timeout, deadline)`.

mod read;
mod send;

pub use read::{Read, UpstreamResponse, MAX_MESSAGE};

use crate::budget::RequestBudget;
use crate::dedup::Dedup;
use crate::engine::Engine;
use crate::error::FanoutError;
use crate::identity::Caller;
use async_graphql::Context;
use send::ReadKey;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use tokio::sync::watch;

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
    /// Body bytes of every response this request has kept
    /// (`upstream.max_request_bytes`).
    kept_bytes: AtomicU64,
}

type ReadResult = Result<Arc<UpstreamResponse>, FanoutError>;

/// How long an operation may run past its request's deadline: its reads
/// stop at the deadline with `DEADLINE_EXCEEDED`, and this leaves the
/// resolvers time to answer the rest of the page with those field errors
/// before the whole operation is cut.
pub const FINISH_GRACE: std::time::Duration = std::time::Duration::from_millis(100);

impl FanoutRequest {
    pub(crate) fn new(engine: Engine, budget: RequestBudget, caller: Caller) -> Self {
        let dedup = Dedup::with_hasher(engine.inner.dedup_hasher.clone());
        Self {
            inner: Arc::new(RequestScope {
                engine,
                budget,
                dedup,
                caller,
                unpriced: OnceLock::new(),
                kept_bytes: AtomicU64::new(0),
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

    /// Runs one operation, but no longer than the request's deadline plus
    /// [`FINISH_GRACE`]: past it the operation is dropped — whatever it was
    /// doing, reads or not — and answers `DEADLINE_EXCEEDED`.
    pub(crate) async fn within_deadline(
        &self,
        operation: impl std::future::Future<Output = async_graphql::Response>,
    ) -> async_graphql::Response {
        let left = self.inner.budget.time_left().unwrap_or_default() + FINISH_GRACE;
        match tokio::time::timeout(left, operation).await {
            Ok(response) => response,
            Err(_elapsed) => crate::extension::refused(&FanoutError::DeadlineExceeded),
        }
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
    /// Fails only when the operation runs outside the engine: served neither
    /// by [`FanoutGraphQL`](crate::FanoutGraphQL) nor with the
    /// [`FanoutExtension`](crate::FanoutExtension) mounted.
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
        .ok_or_else(|| "no fanout-budget scope: serve the schema with FanoutGraphQL or mount engine.extension()".into())
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
}
