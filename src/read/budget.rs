//! The request budget: how many upstream reads one inbound HTTP request may make.
//!
//! One [`RequestBudget`] is created per inbound HTTP request — not per
//! operation — and shared (`Arc`) by every operation of a batch. It holds:
//!
//! - the **limit** and the reads **used**. A read is charged with one
//!   compare-and-swap loop ([`try_charge`](RequestBudget::try_charge)) that only
//!   ever moves `used` from `n` to `n + 1` while `n < limit`, so no interleaving
//!   of concurrent reads can push `used` past the limit, and a refused read
//!   changes nothing;
//! - the **deadline** of the whole request, on tokio's clock (the one clock
//!   of every deadline and timer: tests pause and advance it);
//! - the **concurrency** bound: `max_concurrent_reads` slots that every read
//!   of the request holds while it is in flight — a counter moved by
//!   compare-and-swap, and a `tokio::sync::Notify` for the reads waiting for
//!   a slot. A release is one atomic subtraction, plus a wake-up only when a
//!   read is waiting; waiting reads are not served in FIFO order (they are
//!   the same request's reads), and a waiter that gives up (its deadline)
//!   passes a wake-up it received on to the next;
//! - per-request counters ([`ReadCounts`]).
//!
//! The budget never sends anything; the acquisition point (`read/mod.rs`)
//! charges it right before a read is sent, and counts each read sent to its
//! end (`Pending`). Its refusals are unit errors
//! ([`Exhausted`], [`TimedOut`]); the acquisition point names them.

use crate::error::ReadError;
#[cfg(loom)]
use ::loom::sync::atomic::AtomicU64 as ChargeCounter;
#[cfg(not(loom))]
use std::sync::atomic::AtomicU64 as ChargeCounter;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

mod grant;
#[cfg(all(test, loom))]
mod loom_model;
mod measure;
mod pending;
mod slots;
#[cfg(all(test, not(loom)))]
mod tests;

pub(crate) use pending::{bump, Pending, ReadStats};
pub(crate) use slots::InFlightSlot;
use slots::Slots;

/// How long an operation may run past its request's deadline: its reads
/// stop at the deadline with `DEADLINE_EXCEEDED`, and this leaves the
/// resolvers time to answer the rest of the page with those field errors
/// before the whole operation is cut.
pub(crate) const FINISH_GRACE: Duration = Duration::from_millis(100);

/// The read budget, deadline and counters of one inbound HTTP request.
///
/// Every operation of a batch sees the same budget:
///
/// ```
/// # use fanout_budget::{Config, Engine, inbound::Caller};
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let mut config = Config::default();
/// config.budget.max_reads = 3;
/// let request = Engine::new(config).begin_request(Caller::Public);
/// let budget = request.budget();
/// assert_eq!((budget.limit(), budget.used(), budget.remaining()), (3, 0, 3));
/// assert!(budget.time_left().is_some(), "the deadline started with the request");
/// # }
/// ```
pub struct RequestBudget {
    /// Lowered once, before any read, to what the client's read quota
    /// reserved (`inbound/quota.rs`); raised a read at a time, never past
    /// `ceiling`, when the quota gives one more at once (`extend`).
    limit: AtomicU64,
    /// The limit the request opened with (`max_reads`).
    ceiling: u64,
    /// Takes one more read from the client's quota at once, if it has one;
    /// one read at a time asks (the limit is raised under the lock).
    extend: OnceLock<std::sync::Mutex<Extend>>,
    /// Who else pays each read, if anyone — a WebSocket connection's budget
    /// over time, for the scope of one of its events
    /// ([`paid_by`](Self::paid_by)) — and its limit.
    pay: OnceLock<(Pay, u64)>,
    /// The payer refused a read: its limit is the one a refusal names.
    payer_refused: std::sync::atomic::AtomicBool,
    used: ChargeCounter,
    /// `budget.mode = "measure"`: a read past the request's own limit is
    /// charged anyway (and counted in `would_refuse`).
    measure: bool,
    /// `quota.mode = "measure"`: a read past the read quota's reservation
    /// is charged anyway (and counted).
    quota_measure: bool,
    /// The read quota would have refused the whole request (measure mode):
    /// every read it sends is counted.
    unreserved: std::sync::atomic::AtomicBool,
    /// Reads charged past a limit in measure mode.
    would_refuse: AtomicU64,
    /// The request's client (its peer address), named when measure mode
    /// counts a read.
    client: Option<std::net::IpAddr>,
    requested: AtomicU64,
    deadline: Instant,
    slots: Slots,
    stats: ReadStats,
}

/// Takes one more read from the client's read quota at once (no wait):
/// `true` when it did.
pub(crate) type Extend = Box<dyn Fn() -> bool + Send + Sync>;

/// Who else pays each read: `Paid::Refused` refuses it.
pub(crate) type Pay = Box<dyn Fn() -> Paid + Send + Sync>;

/// What the other payer (a connection's budget) said of a read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Paid {
    /// Paid.
    Yes,
    /// Not paid, but its budget only measures: the read goes on, counted
    /// as one enforce would have refused.
    Measured,
    /// Refused.
    Refused,
}

/// The charge was refused: no read is left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Exhausted;

/// The deadline passed while waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TimedOut;

/// What one request's reads did, at one moment. Every read that was sent
/// ends in exactly one of `succeeded`, `failed`, `timed_out` or
/// `cancelled`, so `issued` balances them once none is in flight.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadCounts {
    /// Reads sent upstream (each one charged).
    pub issued: u64,
    /// Sent reads that got a response (any status).
    pub succeeded: u64,
    /// Sent reads that failed in transport.
    pub failed: u64,
    /// Sent reads cut by the read timeout or the deadline.
    pub timed_out: u64,
    /// Sent reads dropped unfinished because their inbound request was cancelled.
    pub cancelled: u64,
    /// Reads answered from the request's de-duplication cache.
    pub dedup_hits: u64,
    /// Reads answered by an identical read another request had in flight
    /// (`[hosts] coalesce`): neither sent nor charged by this request, so
    /// never in `issued`.
    pub coalesced: u64,
    /// Reads refused because the budget was exhausted.
    pub refused_budget: u64,
    /// Reads refused a host slot: the host saturated, or the shared host
    /// caps unreachable with `failure_mode = "closed"`.
    pub refused_host: u64,
    /// Reads refused because the deadline passed before they could be sent.
    pub refused_deadline: u64,
    /// Reads answered from the engine's cache of immutable answers: neither
    /// sent nor charged, so never in `issued`.
    pub cache_hits: u64,
}

impl ReadCounts {
    /// `issued == succeeded + failed + timed_out + cancelled`.
    pub fn balanced(&self) -> bool {
        self.issued == self.succeeded + self.failed + self.timed_out + self.cancelled
    }
}

/// The budget as it stands at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetSnapshot {
    /// The request's read limit.
    pub limit: u64,
    /// Reads charged so far.
    pub used: u64,
    /// `limit - used`.
    pub remaining: u64,
    /// The request's worst-case reads, when an estimate was made.
    pub requested: u64,
}

impl RequestBudget {
    /// A budget of `limit` reads, `max_concurrent` reads in flight, ending at `deadline`.
    pub(crate) fn new(limit: u64, max_concurrent: usize, deadline: Instant) -> Self {
        Self {
            limit: AtomicU64::new(limit),
            ceiling: limit,
            extend: OnceLock::new(),
            pay: OnceLock::new(),
            payer_refused: std::sync::atomic::AtomicBool::new(false),
            used: ChargeCounter::new(0),
            measure: false,
            quota_measure: false,
            unreserved: std::sync::atomic::AtomicBool::new(false),
            would_refuse: AtomicU64::new(0),
            client: None,
            requested: AtomicU64::new(0),
            deadline,
            slots: Slots {
                max: max_concurrent.max(1),
                held: AtomicUsize::new(0),
                waiting: AtomicUsize::new(0),
                freed: Notify::new(),
            },
            stats: ReadStats::default(),
        }
    }

    /// Charges one read, or refuses it (and changes nothing) when none is
    /// left — after asking the client's read quota for one more, when the
    /// limit is a reservation below the request's own.
    pub(crate) fn try_charge(&self) -> Result<(), Exhausted> {
        loop {
            let limit = self.limit();
            let charged = self
                .used
                .fetch_update(Relaxed, Relaxed, |used| (used < limit).then(|| used + 1));
            if charged.is_ok() {
                if self.unreserved.load(Relaxed) {
                    self.measured("quota");
                }
                return self.paid();
            }
            if !self.extended(limit) {
                return self.past_the_limit(limit);
            }
        }
    }

    /// The read just charged, paid by whoever else pays (a connection's
    /// budget); refused there, the charge is taken back.
    fn paid(&self) -> Result<(), Exhausted> {
        let Some((pay, _)) = self.pay.get() else {
            return Ok(());
        };
        match pay() {
            Paid::Yes => Ok(()),
            Paid::Measured => {
                self.would_refuse.fetch_add(1, Relaxed);
                Ok(())
            }
            Paid::Refused => {
                self.used.fetch_sub(1, Relaxed);
                self.payer_refused.store(true, Relaxed);
                Err(Exhausted)
            }
        }
    }

    /// Makes `pay` pay each read as well, before the first read: a read it
    /// refuses is refused (`FANOUT_BUDGET_EXHAUSTED` naming `limit`, the
    /// payer's), and uncharged.
    pub(crate) fn paid_by(&self, pay: Pay, limit: u64) {
        let _ = self.pay.set((pay, limit));
    }

    /// The limit a refused read names: the payer's once it refused one,
    /// else the request's.
    pub(crate) fn refusing_limit(&self) -> u64 {
        match self.pay.get() {
            Some((_, limit)) if self.payer_refused.load(Relaxed) => *limit,
            _ => self.limit(),
        }
    }

    /// Counts `err`, a read's refusal, in the request's counters: why, as
    /// the read's span names it (`fanout.refused`).
    pub(crate) fn count_refusal(&self, err: &ReadError) -> &'static str {
        let stats = &self.stats;
        let (counter, why) = match err {
            ReadError::BudgetExhausted { .. } => (&stats.refused_budget, self.spent_on()),
            ReadError::UpstreamBudgetExhausted { .. } => (&stats.refused_budget, "upstream_share"),
            ReadError::TooManyHops { .. } => (&stats.refused_budget, "max_hops"),
            ReadError::DeadlineExceeded => (&stats.refused_deadline, "deadline"),
            ReadError::QuotaExhausted { .. } => (&stats.refused_host, "upstream_quota"),
            // Refused a host slot: saturated, or the shared caps down.
            _ => (&stats.refused_host, "host_cap"),
        };
        bump(counter);
        why
    }

    /// Which limit a read refused for want of a read met, as a trace names
    /// it: `connection` (the payer, a WebSocket connection's budget),
    /// `quota` (the client's read quota reserved less than `max_reads`),
    /// else `budget`.
    pub(crate) fn spent_on(&self) -> &'static str {
        if self.payer_refused.load(Relaxed) {
            "connection"
        } else if self.limit() < self.ceiling {
            "quota"
        } else {
            "budget"
        }
    }

    /// Raises the limit past `seen` by one read the quota gave at once;
    /// `false` when it gave none or the limit is the request's own.
    #[cold]
    fn extended(&self, seen: u64) -> bool {
        let Some(extend) = self.extend.get() else {
            return false;
        };
        let extend = extend
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.limit() != seen {
            return true; // raised meanwhile: charge again
        }
        if seen >= self.ceiling || !extend() {
            return false;
        }
        self.limit.fetch_add(1, Relaxed);
        true
    }

    /// Sets the limit to `to`, what the client's read quota reserved
    /// (never past the request's own), before the request's first read; `extend` then takes one more read
    /// from the quota at once when a read finds none left (a redirect hop,
    /// a token fetch the estimate did not count), up to the request's own
    /// limit.
    pub(crate) fn reserved(&self, to: u64, extend: Extend) {
        let _ = self.extend.set(std::sync::Mutex::new(extend));
        self.limit.store(to.min(self.ceiling), Relaxed);
    }

    /// Opens the budget at 0 reads until [`reserved`](Self::reserved)
    /// (a client with a read quota: no read before its reservation, by any
    /// path to the acquisition point).
    pub(crate) fn close_until_reserved(&self) {
        self.limit.store(0, Relaxed);
    }

    /// The request's own limit (`max_reads`), which a reservation on the
    /// client's read quota may lower but never pass.
    pub fn ceiling(&self) -> u64 {
        self.ceiling
    }

    /// Whether no read is left (a cheap check before waiting for anything):
    /// none within the limit, and none the client's read quota may add.
    pub fn is_exhausted(&self) -> bool {
        let limit = self.limit();
        let own = limit >= self.ceiling;
        self.used.load(Relaxed) >= limit
            && (self.extend.get().is_none() || own)
            && !(if own {
                self.measure
            } else {
                self.quota_measure
            })
    }

    /// The read limit.
    pub fn limit(&self) -> u64 {
        self.limit.load(Relaxed)
    }

    /// Reads charged so far.
    pub fn used(&self) -> u64 {
        self.used.load(Relaxed)
    }

    /// Reads left.
    pub fn remaining(&self) -> u64 {
        self.limit().saturating_sub(self.used())
    }

    /// Records worst-case reads of the request's operations (the cost preview).
    /// Saturates: a batch's estimates that add past `u64::MAX` stay there
    /// (wrapped, they would reserve next to nothing).
    pub(crate) fn add_requested(&self, reads: u64) {
        let _ =
            (self.requested).fetch_update(Relaxed, Relaxed, |sum| Some(sum.saturating_add(reads)));
    }

    /// The request's worst-case reads recorded so far.
    pub fn requested(&self) -> u64 {
        self.requested.load(Relaxed)
    }

    /// The budget now.
    pub fn snapshot(&self) -> BudgetSnapshot {
        let used = self.used();
        let limit = self.limit();
        BudgetSnapshot {
            limit,
            used,
            remaining: limit.saturating_sub(used),
            requested: self.requested(),
        }
    }

    /// The instant the whole request must be answered by.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Time left before the deadline; `None` once it has passed.
    pub fn time_left(&self) -> Option<Duration> {
        self.time_left_at(Instant::now())
    }

    /// Time left before the deadline at `now`.
    pub(crate) fn time_left_at(&self, now: Instant) -> Option<Duration> {
        self.deadline
            .checked_duration_since(now)
            .filter(|left| !left.is_zero())
    }

    /// The request's counters.
    pub(crate) fn stats(&self) -> &ReadStats {
        &self.stats
    }

    /// What the request's reads did so far.
    pub fn counts(&self) -> ReadCounts {
        let s = &self.stats;
        let get = |c: &AtomicU64| c.load(Relaxed);
        ReadCounts {
            issued: get(&s.issued),
            succeeded: get(&s.succeeded),
            failed: get(&s.failed),
            timed_out: get(&s.timed_out),
            cancelled: get(&s.cancelled),
            dedup_hits: get(&s.dedup_hits),
            coalesced: get(&s.coalesced),
            refused_budget: get(&s.refused_budget),
            refused_host: get(&s.refused_host),
            refused_deadline: get(&s.refused_deadline),
            cache_hits: get(&s.cache_hits),
        }
    }

    /// Reads of this request holding an in-flight slot right now.
    pub fn in_flight(&self) -> usize {
        self.slots.held.load(Relaxed)
    }

    /// One of the request's in-flight slots if one is free now.
    pub(crate) fn try_in_flight_slot(&self) -> Option<InFlightSlot<'_>> {
        self.slots.try_acquire()
    }

    /// One of the request's in-flight slots, waiting for one never past
    /// the deadline.
    pub(crate) async fn in_flight_slot(&self) -> Result<InFlightSlot<'_>, TimedOut> {
        if let Some(slot) = self.slots.try_acquire() {
            return Ok(slot);
        }
        tokio::time::timeout_at(self.deadline, self.slots.acquire())
            .await
            .map_err(|_| TimedOut)
    }
}

impl std::fmt::Debug for RequestBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestBudget")
            .field("limit", &self.limit())
            .field("used", &self.used())
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}
