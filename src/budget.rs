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
//! - the **deadline** of the whole request, read from an injectable
//!   [`Clock`];
//! - the **concurrency** bound: `max_concurrent_reads` slots that every read
//!   of the request holds while it is in flight — a counter moved by
//!   compare-and-swap, and a `tokio::sync::Notify` for the reads waiting for
//!   a slot. A release is one atomic subtraction, plus a wake-up only when a
//!   read is waiting; waiting reads are not served in FIFO order (they are
//!   the same request's reads), and a waiter that gives up (its deadline)
//!   passes a wake-up it received on to the next;
//! - per-request [`ReadStats`] counters.
//!
//! The budget never sends anything; the acquisition point
//! ([`crate::upstream`]) charges it right before a read is sent.

use crate::clock::Clock;
use crate::error::FanoutError;
#[cfg(feature = "loom")]
use loom::sync::atomic::AtomicU64 as ChargeCounter;
#[cfg(not(feature = "loom"))]
use std::sync::atomic::AtomicU64 as ChargeCounter;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// The read budget, deadline and counters of one inbound HTTP request.
pub struct RequestBudget {
    limit: u64,
    used: ChargeCounter,
    requested: AtomicU64,
    deadline: Instant,
    clock: Arc<dyn Clock>,
    slots: Slots,
    stats: ReadStats,
}

/// What one request's reads did. Every read that was sent ends in exactly one
/// of `succeeded`, `failed`, `timed_out` or `cancelled`, so `issued` balances them.
#[derive(Debug, Default)]
pub struct ReadStats {
    /// Reads sent upstream (each one charged).
    pub issued: AtomicU64,
    /// Sent reads that got a response (any status).
    pub succeeded: AtomicU64,
    /// Sent reads that failed in transport.
    pub failed: AtomicU64,
    /// Sent reads cut by the read timeout or the deadline.
    pub timed_out: AtomicU64,
    /// Sent reads dropped unfinished because their inbound request was cancelled.
    pub cancelled: AtomicU64,
    /// Reads answered from the request's de-duplication cache.
    pub dedup_hits: AtomicU64,
    /// Reads refused because the budget was exhausted.
    pub refused_budget: AtomicU64,
    /// Reads refused because their host was saturated.
    pub refused_host: AtomicU64,
    /// Reads refused because the deadline passed before they could be sent.
    pub refused_deadline: AtomicU64,
}

impl ReadStats {
    /// `issued == succeeded + failed + timed_out + cancelled` (holds once no
    /// read of the request is in flight).
    pub fn balanced(&self) -> bool {
        let get = |c: &AtomicU64| c.load(Relaxed);
        get(&self.issued)
            == get(&self.succeeded)
                + get(&self.failed)
                + get(&self.timed_out)
                + get(&self.cancelled)
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
    pub fn new(
        limit: u64,
        max_concurrent: usize,
        deadline: Instant,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            limit,
            used: ChargeCounter::new(0),
            requested: AtomicU64::new(0),
            deadline,
            clock,
            slots: Slots {
                max: max_concurrent.max(1),
                held: AtomicUsize::new(0),
                waiting: AtomicUsize::new(0),
                freed: Notify::new(),
            },
            stats: ReadStats::default(),
        }
    }

    /// Charges one read, or refuses it (and changes nothing) when none is left.
    pub fn try_charge(&self) -> Result<(), FanoutError> {
        let limit = self.limit;
        match self
            .used
            .fetch_update(Relaxed, Relaxed, |used| (used < limit).then_some(used + 1))
        {
            Ok(_) => Ok(()),
            Err(_) => Err(FanoutError::BudgetExhausted { limit }),
        }
    }

    /// Whether no read is left (a cheap check before waiting for anything).
    pub fn is_exhausted(&self) -> bool {
        self.used.load(Relaxed) >= self.limit
    }

    /// The read limit.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Reads charged so far.
    pub fn used(&self) -> u64 {
        self.used.load(Relaxed)
    }

    /// Reads left.
    pub fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.used())
    }

    /// Records the request's worst-case reads (the cost preview).
    pub fn add_requested(&self, reads: u64) {
        self.requested.fetch_add(reads, Relaxed);
    }

    /// The request's worst-case reads recorded so far.
    pub fn requested(&self) -> u64 {
        self.requested.load(Relaxed)
    }

    /// The budget now.
    pub fn snapshot(&self) -> BudgetSnapshot {
        let used = self.used();
        BudgetSnapshot {
            limit: self.limit,
            used,
            remaining: self.limit.saturating_sub(used),
            requested: self.requested(),
        }
    }

    /// The instant the whole request must be answered by.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Time left before the deadline; `None` once it has passed.
    pub fn time_left(&self) -> Option<Duration> {
        self.time_left_at(self.clock.now())
    }

    /// Time left before the deadline at `now` (read from [`now`](Self::now)).
    pub(crate) fn time_left_at(&self, now: Instant) -> Option<Duration> {
        self.deadline
            .checked_duration_since(now)
            .filter(|left| !left.is_zero())
    }

    /// "Now" on the request's clock.
    pub(crate) fn now(&self) -> Instant {
        self.clock.now()
    }

    /// Whether the request's clock is tokio's (see [`Clock::is_tokio_clock`]).
    pub(crate) fn on_tokio_clock(&self) -> bool {
        self.clock.is_tokio_clock()
    }

    /// The request's counters.
    pub fn stats(&self) -> &ReadStats {
        &self.stats
    }

    /// Reads of this request holding an in-flight slot right now.
    pub fn in_flight(&self) -> usize {
        self.slots.held.load(Relaxed)
    }

    /// One of the request's in-flight slots if one is free now.
    pub fn try_in_flight_slot(&self) -> Option<InFlightSlot<'_>> {
        self.slots.try_acquire()
    }

    /// Waits for one of the request's in-flight slots, never past the
    /// deadline (`DEADLINE_EXCEEDED`).
    pub async fn in_flight_slot(&self) -> Result<InFlightSlot<'_>, FanoutError> {
        if let Some(slot) = self.try_in_flight_slot() {
            return Ok(slot);
        }
        let left = self.time_left().ok_or(FanoutError::DeadlineExceeded)?;
        tokio::time::timeout(left, self.slots.acquire())
            .await
            .map_err(|_| FanoutError::DeadlineExceeded)
    }
}

/// The request's in-flight slots (see the module docs).
struct Slots {
    max: usize,
    held: AtomicUsize,
    /// Reads registered on `freed`: a release wakes one only if this is not 0.
    waiting: AtomicUsize,
    freed: Notify,
}

/// One of a request's in-flight slots, released when dropped.
#[must_use = "the slot is released as soon as it is dropped"]
pub struct InFlightSlot<'a> {
    slots: &'a Slots,
}

impl Drop for InFlightSlot<'_> {
    fn drop(&mut self) {
        // SeqCst on both sides (here and in `acquire`): either the waiter's
        // retry sees this slot free, or this load sees the waiter.
        self.slots.held.fetch_sub(1, SeqCst);
        if self.slots.waiting.load(SeqCst) > 0 {
            self.slots.freed.notify_one();
        }
    }
}

/// A read registered as waiting, until it stops waiting (slot or cancelled).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

impl Slots {
    fn try_acquire(&self) -> Option<InFlightSlot<'_>> {
        let mut held = self.held.load(SeqCst);
        while held < self.max {
            match self
                .held
                .compare_exchange_weak(held, held + 1, SeqCst, SeqCst)
            {
                Ok(_) => return Some(InFlightSlot { slots: self }),
                Err(now) => held = now,
            }
        }
        None
    }

    async fn acquire(&self) -> InFlightSlot<'_> {
        loop {
            // Registered before the retry, so a release after the retry's
            // check wakes this read (or leaves the wake-up for it).
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let _waiting = {
                self.waiting.fetch_add(1, SeqCst);
                Waiting(&self.waiting)
            };
            if let Some(slot) = self.try_acquire() {
                return slot;
            }
            freed.await;
        }
    }
}

impl std::fmt::Debug for RequestBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestBudget")
            .field("limit", &self.limit)
            .field("used", &self.used())
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Relaxed);
}
