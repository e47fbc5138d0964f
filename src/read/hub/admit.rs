//! Steps 2–4 of the walk, the admission: the refusals, the request slot
//! and the host slot, the charge — each a spoke's decision (`quota.rs`,
//! `budget.rs`, `share.rs`, `hosts.rs`), taken in order here — and a
//! permit, the same admission for a call that is not HTTP (`permit.rs`).

use crate::error::HostRefusal;
use crate::error::ReadError;
use crate::read::budget::{bump, InFlightSlot, ReadStats};
use crate::read::hosts::{HostEntry, HostSlot};
use crate::read::permit::{Admission, Outcome, Permit};
use crate::read::share::ShareId;
use crate::read::spans;
use crate::read::timeout::Limit;
use crate::read::{RequestBudget, Upstream};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio::time::Instant;

impl<'a> Upstream<'a> {
    /// Steps 2–4: the refusals, the request slot, the host slot and the
    /// charge, for one read to `host` (counted against the upstream's
    /// `share`, if its origin has one: `share.rs`). The clock is read
    /// once, and again only after a slot was waited for: when both are
    /// free the steps take nanoseconds, and each read of the clock costs
    /// about 25 ns here.
    pub(in crate::read) async fn admit(
        &self,
        host: &HostEntry,
        share: Option<ShareId>,
    ) -> Result<Admitted<'a>, ReadError> {
        let now = Instant::now();
        self.refuse_early(host, share, now)?;
        let (slots, now) = match self.free_slots(host, now)? {
            Ok(free) => free,
            // Boxed: a read whose slots are free at once (the common case)
            // holds no wait in its future (moved at each level of the walk).
            Err(waiting) => {
                // Boxed in a statement of its own: the unboxed future, a
                // temporary, is not kept in this one's state across the wait.
                let wait = Box::pin(self.wait_for_slots(host, waiting));
                wait.await?
            }
        };
        let now = self.charge(host, share, now)?;
        Ok(Admitted { _slots: slots, now })
    }

    /// Step 2: the host said its quota is spent (`quota.rs`), or no read
    /// is left — of the request's, or of its upstream's share — or no time.
    pub(in crate::read) fn refuse_early(
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
    pub(in crate::read) async fn slots(
        &self,
        host: &HostEntry,
        now: Instant,
    ) -> Result<(Slots<'a>, Instant), ReadError> {
        match self.free_slots(host, now)? {
            Ok(free) => Ok(free),
            Err(waiting) => {
                let wait = Box::pin(self.wait_for_slots(host, waiting));
                wait.await
            }
        }
    }

    /// Step 3 without waiting: both slots, when they are free now; else
    /// what is left to wait for.
    fn free_slots(
        &self,
        host: &HostEntry,
        now: Instant,
    ) -> Result<Result<(Slots<'a>, Instant), Waiting<'a>>, ReadError> {
        let budget: &'a RequestBudget = &self.reads.budget;
        let Some(request_slot) = budget.try_in_flight_slot() else {
            return Ok(Err(Waiting::Request));
        };
        let left = self.time_left(host, now)?;
        match self.reads.parts.hosts.try_acquire(&host.name) {
            Some(host_slot) => self.held(host, request_slot, host_slot, now).map(Ok),
            None => Ok(Err(Waiting::Host(request_slot, left))),
        }
    }

    /// Step 3 from where [`free_slots`](Self::free_slots) stopped: the
    /// request slot waited for (then the host slot taken if free), the host
    /// slot waited for; with the time after the wait.
    async fn wait_for_slots(
        &self,
        host: &HostEntry,
        waiting: Waiting<'a>,
    ) -> Result<(Slots<'a>, Instant), ReadError> {
        let hosts = &*self.reads.parts.hosts;
        let (request_slot, left) = match waiting {
            Waiting::Host(request_slot, left) => (request_slot, left),
            Waiting::Request => {
                let Ok(request_slot) = self.reads.budget.in_flight_slot().await else {
                    return Err(self.refused(host, ReadError::DeadlineExceeded));
                };
                let now = Instant::now();
                let left = self.time_left(host, now)?;
                match hosts.try_acquire(&host.name) {
                    Some(host_slot) => return self.held(host, request_slot, host_slot, now),
                    None => (request_slot, left),
                }
            }
        };
        let host_slot = hosts.acquire(&host.name, left).await;
        self.held(host, request_slot, host_slot, Instant::now())
    }

    /// The request's time left at `now`, or the refusal of a read to `host`
    /// that has none.
    fn time_left(&self, host: &HostEntry, now: Instant) -> Result<Duration, ReadError> {
        (self.reads.budget.time_left_at(now))
            .ok_or_else(|| self.refused(host, ReadError::DeadlineExceeded))
    }

    /// Both slots held at `now`, or the host's refusal.
    fn held(
        &self,
        host: &HostEntry,
        request_slot: InFlightSlot<'a>,
        host_slot: Result<HostSlot, HostRefusal>,
        now: Instant,
    ) -> Result<(Slots<'a>, Instant), ReadError> {
        match host_slot {
            Ok(host_slot) => Ok(((request_slot, host_slot), now)),
            Err(refusal) => Err(self.refused(host, refusal.for_host(&host.name))),
        }
    }

    /// Step 4: the charge, last before the send: when the read is admitted
    /// (`now`, the time after its slots), or its refusal. A read to an
    /// upstream with a share takes a read of it first (`share.rs`), given
    /// back if the request's budget refuses the read.
    pub(in crate::read) fn charge(
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
    /// names why; a host's cap refusing is the host's to count too, a
    /// budget's is `fanout_budget_exhausted_total`'s).
    pub(in crate::read) fn refused(&self, host: &HostEntry, err: ReadError) -> ReadError {
        let why = self.reads.budget.count_refusal(&err);
        match err {
            ReadError::HostSaturated { .. } => host.metrics().rejections.increment(1),
            ReadError::BudgetExhausted { .. } | ReadError::UpstreamBudgetExhausted { .. } => {
                self.reads.parts.metrics.budget_exhausted()
            }
            _ => {}
        }
        spans::note("fanout.refused", why);
        err
    }

    fn exhausted(&self) -> ReadError {
        ReadError::BudgetExhausted {
            limit: self.reads.budget.refusing_limit(),
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

/// What a read still waits for when its slots were not both free at once:
/// the request slot (then the host slot), or the host slot (the request
/// slot held, with the time left).
enum Waiting<'a> {
    Request,
    Host(InFlightSlot<'a>, Duration),
}

/// A request slot and a host slot, held together.
pub(in crate::read) type Slots<'a> = (InFlightSlot<'a>, HostSlot);

/// What a read admitted holds until it ends: its slots, and when it was
/// admitted.
pub(in crate::read) struct Admitted<'a> {
    _slots: Slots<'a>,
    pub(in crate::read) now: Instant,
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
