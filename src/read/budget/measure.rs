//! Measure mode on the request budget: a read past a limit that only
//! measures (`[budget] mode`, `[quota] mode`) is charged anyway and counted
//! — in the request (`extensions.fanout.wouldRefuse`), in
//! `fanout_would_refuse_total{limit}` and in a log line naming the client —
//! and the limit's own accounting is what enforce mode keeps: a read the
//! quota would refuse takes nothing from it.

use super::{Exhausted, RequestBudget};
use std::sync::atomic::Ordering::Relaxed;

impl RequestBudget {
    /// A read found no read left within `limit`: refused — or, in measure
    /// mode and when the limit is the request's own (a read quota's
    /// reservation and a connection's budget have modes of their own),
    /// charged past it and counted.
    #[cold]
    pub(super) fn past_the_limit(&self, limit: u64) -> Result<(), Exhausted> {
        let limit = match limit < self.ceiling {
            true if self.quota_measure => "quota",
            false if self.measure => "budget",
            _ => return Err(Exhausted),
        };
        // Saturating: a service's report may have charged it to the top.
        let _ = (self.used).fetch_update(Relaxed, Relaxed, |used| Some(used.saturating_add(1)));
        self.measured(limit);
        self.paid()
    }

    /// Counts a read that `limit` in measure mode let through.
    #[cold]
    pub(super) fn measured(&self, limit: &'static str) {
        self.measured_many(limit, 1);
    }

    /// Counts `n` reads that `limit` in measure mode let through.
    #[cold]
    pub(super) fn measured_many(&self, limit: &'static str, n: u64) {
        let _ = (self.would_refuse).fetch_update(Relaxed, Relaxed, |w| Some(w.saturating_add(n)));
        match self.client {
            Some(client) => crate::metrics::would_refuse(limit, &client, n),
            None => crate::metrics::would_refuse(limit, &"(no peer address)", n),
        }
    }

    /// Makes this budget measure rather than refuse (`budget.mode`), and
    /// the read quota's limits on it (`quota.mode`).
    pub(crate) fn measuring(mut self, measure: bool, quota: bool) -> Self {
        self.measure = measure;
        self.quota_measure = quota;
        self
    }

    /// Names `client` (the request's peer address) in measure mode's log.
    pub(crate) fn of_client(mut self, client: Option<std::net::IpAddr>) -> Self {
        self.client = client;
        self
    }

    /// Whether the read quota only measures (`quota.mode`).
    pub(crate) fn quota_measures(&self) -> bool {
        self.quota_measure
    }

    /// The read quota would have refused the whole request; in measure mode
    /// it runs on its own limit, taking nothing from the quota, and every
    /// read it sends is counted.
    pub(crate) fn unreserved(&self) {
        self.unreserved.store(true, Relaxed);
        self.limit.store(self.ceiling, Relaxed);
    }

    /// Whether it measures rather than refuses (`budget.mode`).
    pub(crate) fn measures(&self) -> bool {
        self.measure
    }

    /// Reads sent past the limit that enforce mode would have refused
    /// (measure mode; `extensions.fanout.wouldRefuse`).
    pub fn would_refuse(&self) -> u64 {
        self.would_refuse.load(Relaxed)
    }
}
