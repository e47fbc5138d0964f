//! Grants: reads of the request's budget given to an upstream that is
//! itself a service on the engine (`read/propagate.rs`), to spend for one
//! read.
//!
//! A grant is charged when it is given, as reads sent — so the grants of
//! reads in flight together can never add up past what is left: each is
//! one compare-and-swap on `used`, which stays within the limit as a read's
//! charge does. When the upstream's answer says what it spent
//! (`Fanout-Spent`), that much of the grant stays charged (never more: an
//! upstream is believed up to what it was given) and the rest is given
//! back. Without an answer — the read timed out, failed or was cancelled —
//! the upstream may have spent all of it, and all of it stays charged.

use super::{Paid, RequestBudget};
use std::sync::atomic::Ordering::Relaxed;

impl RequestBudget {
    /// Reserves, for one read's upstream, the reads left within the limit
    /// that holds (see [`grant_limit`](Self::grant_limit); a read quota's
    /// reservation is not extended for it) divided by `claimants` (the
    /// reads asking for a grant at the same moment, this one included),
    /// rounded down, and at most `cap` (what is left of the upstream's own
    /// share): charged at once, and paid up front by whoever else pays the
    /// request's reads. The reads reserved; 0 when none is left — or when
    /// no limit holds and no cap ([`grants_unlimited`](Self::grants_unlimited)):
    /// the upstream is then not limited by this request, and what it spends
    /// is charged when its answer says ([`charge_spent`](Self::charge_spent)).
    pub(crate) fn reserve_grant(&self, claimants: usize, cap: u64) -> u64 {
        let limit = match self.grant_limit() {
            Some(limit) => limit,
            None if cap == u64::MAX => return 0,
            None => u64::MAX,
        };
        let n = claimants.max(1) as u64;
        let mut granted = 0;
        let _ = self.used.fetch_update(Relaxed, Relaxed, |used| {
            granted = (limit.saturating_sub(used) / n).min(cap);
            (granted > 0).then_some(used + granted)
        });
        let paid = self.pay_grant(granted);
        if paid < granted {
            self.used.fetch_sub(granted - paid, Relaxed);
        }
        paid
    }

    /// The limit a grant is cut to: a read quota's reservation that
    /// enforces; else the request's own limit, unless it only measures
    /// (`budget.mode = "measure"`) — then the request's own limit only when
    /// another payer (a WebSocket connection's budget) enforces, sizing
    /// the grant that payer then pays; else none.
    fn grant_limit(&self) -> Option<u64> {
        let limit = self.limit();
        if limit < self.ceiling && !self.quota_measure {
            return Some(limit);
        }
        (!self.measure || self.pay.get().is_some()).then_some(self.ceiling)
    }

    /// Whether no limit holds a grant: the request's budget only measures,
    /// and neither an enforcing read quota nor another payer is there.
    pub(crate) fn grants_unlimited(&self) -> bool {
        self.grant_limit().is_none()
    }

    /// The `granted` reads paid by whoever else pays the request's reads (a
    /// WebSocket connection's budget), up front, one at a time until it
    /// refuses one: the reads it paid, which the grant is cut to (all of
    /// them without another payer). What the upstream does not spend of
    /// them is given back to the request's budget, not to the payer's: its
    /// bucket has no give-back, and the reads were held.
    fn pay_grant(&self, granted: u64) -> u64 {
        let Some((pay, _)) = self.pay.get() else {
            return granted;
        };
        let mut paid = 0;
        while paid < granted {
            match pay() {
                Paid::Yes => {}
                Paid::Measured => {
                    self.would_refuse.fetch_add(1, Relaxed);
                }
                Paid::Refused => break,
            }
            paid += 1;
        }
        paid
    }

    /// The upstream granted `granted` reads said it spent `spent`: that
    /// much stays charged, up to the grant, and the rest is given back;
    /// the reads charged (another payer paid the grant when it was given).
    pub(crate) fn settle_grant(&self, granted: u64, spent: u64) -> u64 {
        let charged = spent.min(granted);
        if granted > charged {
            self.used.fetch_sub(granted - charged, Relaxed);
        }
        charged
    }

    /// No limit held the grant (measure mode): the upstream, given no
    /// limit by this request, said it spent `spent` — charged, all of it
    /// (they were sent; saturating, whatever an answer says), and what
    /// passes the limit counted as reads enforce would have refused. The
    /// reads charged.
    pub(crate) fn charge_spent(&self, spent: u64) -> u64 {
        let before = self
            .used
            .fetch_update(Relaxed, Relaxed, |used| Some(used.saturating_add(spent)))
            .unwrap_or_else(|used| used);
        let limit = self.limit();
        let past = before
            .saturating_add(spent)
            .saturating_sub(limit.max(before));
        if past > 0 {
            self.measured_many("budget", past);
        }
        self.pay_spent(spent);
        spent
    }

    /// `spent` reads paid by the other payer, if any: spent already, so
    /// paid whatever it says (a measured refusal counted).
    fn pay_spent(&self, spent: u64) {
        let Some((pay, _)) = self.pay.get() else {
            return;
        };
        // Bounded: what one answer reports can be any number.
        for _ in 0..spent.min(self.ceiling) {
            if pay() == Paid::Measured {
                self.would_refuse.fetch_add(1, Relaxed);
            }
        }
    }
}
