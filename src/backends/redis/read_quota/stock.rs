//! A client's stock on one replica: reads charged on Redis and not handed
//! out yet, what it gave back, its recent demand, and the plan a
//! reservation makes from them — here without a call, or one call that
//! takes what is missing and some ahead (the policy is in the constants
//! below; [the module](super) says how it works).

use crate::inbound::quota::{Rate, Verdict};
use std::time::Duration;
use tokio::time::Instant;

/// How long reads charged on Redis may be handed out here; older, they are
/// given back with the client's next call.
pub(super) const HOLD: Duration = Duration::from_secs(1);
/// The window over which a client's reservations on this replica are
/// counted, to size what the next call takes ahead.
pub(super) const WINDOW: Duration = Duration::from_millis(250);
/// Reads taken ahead: this many windows of the client's demand.
pub(super) const AHEAD_WINDOWS: u64 = 3;
/// Reads any call takes ahead at least (within half of what is left), so a
/// read past its request's estimate — a redirect hop, a token fetch and
/// its retry — finds one at once (`QuotaStore::reserve_at_once`).
pub(super) const MARGIN: u64 = 2;

/// A client's stock and what this replica knows of its bucket.
#[derive(Debug)]
pub(super) struct Stock {
    /// Reads charged on Redis and not handed out — taken ahead, or given
    /// back by requests — usable until `until`.
    pub(super) left: u64,
    pub(super) until: Instant,
    /// Reads requests gave back, to be given back on Redis with the next
    /// call: never handed out again here, so a read charged long ago cannot
    /// come back fresh on top of a refilled bucket.
    pub(super) given: u64,
    /// When the client's bucket is full again, as the last answer said (ns
    /// on the store's clock; what this replica took then included).
    pub(super) full_at: u64,
    /// `full_at` is trusted to refuse here until then, a [`HOLD`] after
    /// Redis said it; past it, a reservation it would refuse asks Redis
    /// (another replica may have given reads back meanwhile).
    pub(super) known_until: Instant,
    /// Refused until then (kept through sweeps until then).
    pub(super) refused_until: Instant,
    /// Reads reserved in the current window, and in the one before.
    pub(super) window_start: Instant,
    pub(super) seen: u64,
    pub(super) seen_before: u64,
}

/// What a reservation does, decided from what this replica holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Plan {
    /// Answered here.
    Done(Verdict),
    /// Ask Redis for `take` reads and up to `ahead` more, giving back `back`.
    Call { take: u64, ahead: u64, back: u64 },
}

/// The instant a reservation is decided at: tokio's, and the same in ns on
/// the store's clock.
#[derive(Clone, Copy, Debug)]
pub(super) struct Now {
    pub(super) at: Instant,
    pub(super) ns: u64,
}

impl Now {
    /// Now, on the clock of a store made at `origin`.
    pub(super) fn since(origin: Instant) -> Self {
        let at = Instant::now();
        let ns = u64::try_from((at - origin).as_nanos()).unwrap_or(u64::MAX);
        Self { at, ns }
    }
}

impl Stock {
    pub(super) fn new(now: Instant) -> Self {
        Self {
            left: 0,
            until: now,
            given: 0,
            full_at: 0,
            known_until: now,
            refused_until: now,
            window_start: now,
            seen: 0,
            seen_before: 0,
        }
    }

    /// Counts `need` reads reserved; what the client reserved here in a
    /// window lately, this reservation not counted.
    fn count(&mut self, now: Instant, need: u64) -> u64 {
        if now >= self.window_start + WINDOW {
            let whole = now < self.window_start + 2 * WINDOW;
            self.seen_before = if whole { self.seen } else { 0 };
            self.seen = 0;
            self.window_start = now;
        }
        let before = self.seen;
        self.seen = self.seen.saturating_add(need);
        before.max(self.seen_before)
    }

    /// Decides a reservation of `need` reads, with `queued` reads of other
    /// reservations of the client waiting behind it.
    pub(super) fn plan(&mut self, rate: &Rate, now: Now, need: u64, queued: u64) -> Plan {
        let demand = self.count(now.at, need).max(queued);
        let usable = if now.at < self.until { self.left } else { 0 };
        let known = now.at < self.known_until;
        // A reservation of nothing only shows the quota: from what Redis
        // said within a `HOLD`, else from Redis (taking nothing).
        if usable >= need && (need > 0 || known) {
            self.left -= need;
            return Plan::Done(self.reserved(rate, now));
        }
        let back = (self.left - usable) + self.given;
        let take = need.saturating_sub(usable);
        // As far as this replica knows, once the stale stock is given back.
        let full_at = rate.give_back(self.full_at, now.ns, back);
        if let (true, Err(wait)) = (known, rate.take(full_at, now.ns, take)) {
            let retry_after = Duration::from_nanos(wait);
            self.refused_until = self.refused_until.max(now.at + retry_after);
            return Plan::Done(Verdict::Refused {
                remaining: rate.left(full_at, now.ns).saturating_add(usable),
                retry_after,
            });
        }
        self.left = usable;
        self.given = 0;
        let ahead = match need {
            0 => 0,
            _ => (demand.saturating_mul(AHEAD_WINDOWS).max(MARGIN)).min(rate.burst()),
        };
        Plan::Call { take, ahead, back }
    }

    /// Redis granted the call of a reservation of `need` reads (the reads
    /// it took are in `left` already); the bucket is full in `full_in`.
    pub(super) fn granted(
        &mut self,
        rate: &Rate,
        now: Now,
        full_in: Duration,
        need: u64,
    ) -> Verdict {
        self.until = now.at + HOLD;
        self.known_until = now.at + HOLD;
        self.full_at = now.ns.saturating_add(nanos(full_in));
        self.left = self.left.saturating_sub(need);
        self.reserved(rate, now)
    }

    /// Redis refused the call: what it asked fits in `wait`.
    pub(super) fn refused(
        &mut self,
        rate: &Rate,
        now: Now,
        full_in: Duration,
        wait: Duration,
    ) -> Verdict {
        self.full_at = now.ns.saturating_add(nanos(full_in));
        self.known_until = now.at + HOLD;
        self.refused_until = self.refused_until.max(now.at + wait);
        let usable = if now.at < self.until { self.left } else { 0 };
        Verdict::Refused {
            remaining: rate.left(self.full_at, now.ns).saturating_add(usable),
            retry_after: wait.max(Duration::from_millis(1)),
        }
    }

    /// The verdict of a reservation just handed out: the stock counts as
    /// the client's, as if given back.
    pub(super) fn reserved(&self, rate: &Rate, now: Now) -> Verdict {
        let full_at = rate.give_back(self.full_at, now.ns, self.left + self.given);
        Verdict::Reserved {
            remaining: rate.left(full_at, now.ns),
            full_in: Duration::from_nanos(full_at - now.ns),
        }
    }

    /// Whether a sweep may forget it: nothing fresh in stock, no recent
    /// demand, no refusal pending.
    pub(super) fn idle(&self, now: Instant) -> bool {
        (self.left == 0 || now >= self.until)
            && now >= self.refused_until
            && now >= self.window_start + 2 * WINDOW
    }
}

pub(super) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
