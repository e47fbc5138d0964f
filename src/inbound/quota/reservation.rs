//! A request's reservation on its client's quota, and what it shows.

use super::rate::Rate;
use super::store::{QuotaClass, QuotaStore};
use crate::metrics::{QuotaMetrics, QuotaReads};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

/// Reads a request reserved on its client's quota. [`settle`](Self::settle)
/// gives back what was not spent; dropped unsettled, it gives back nothing
/// (the request scope settles it when it ends, answered or cancelled).
pub(crate) struct Reservation {
    /// The store it was taken from, which takes back what is not spent.
    store: Arc<dyn QuotaStore>,
    /// `fanout_quota_reads_total`'s handles.
    metrics: Arc<QuotaMetrics>,
    class: QuotaClass,
    client: IpAddr,
    rate: Rate,
    reserved: u64,
    /// Reads taken one at a time after the reservation ([`extend`](Self::extend)).
    extra: Arc<AtomicU64>,
    /// When the quota is full again if nothing is given back (on tokio's
    /// clock, as the stores keep time).
    full_at: Instant,
}

/// A client's read quota, as `extensions.fanout.quota` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaStatus {
    /// The most reads the quota holds (its burst).
    pub limit: u64,
    /// Reads left, counting what the request reserved and has not spent
    /// as given back.
    pub remaining: u64,
    /// When the quota is full again.
    pub reset_at: SystemTime,
}

impl QuotaStatus {
    /// `reset_at` in RFC 3339, to the second.
    pub fn reset_at_rfc3339(&self) -> String {
        humantime::format_rfc3339_seconds(self.reset_at).to_string()
    }
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("class", &self.class)
            .field("reserved", &self.reserved)
            .finish_non_exhaustive()
    }
}

impl Reservation {
    /// Reads `reserved` for `client` from `store`, which answered that the
    /// quota is full again at `full_at` (counted on `metrics`).
    pub(crate) fn new(
        store: Arc<dyn QuotaStore>,
        metrics: Arc<QuotaMetrics>,
        class: QuotaClass,
        client: IpAddr,
        rate: Rate,
        reserved: u64,
        full_at: Instant,
    ) -> Self {
        Self {
            store,
            metrics,
            class,
            client,
            rate,
            reserved,
            extra: Arc::default(),
            full_at,
        }
    }

    /// Reads reserved before the request's first read: its budget.
    pub(crate) fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Takes one read more from the store at once, if it has one without
    /// waiting: what the request's budget asks when a read finds none left
    /// (`read/budget.rs`).
    ///
    /// Never past the burst in all: a request spends at most what a full
    /// quota holds, however long it runs.
    pub(crate) fn extend(&self) -> impl Fn() -> bool + Send + Sync + 'static {
        let (store, class, client) = (self.store.clone(), self.class, self.client);
        let metrics = self.metrics.clone();
        let extra = self.extra.clone();
        let room = self.rate.burst().saturating_sub(self.reserved);
        move || match (extra.load(Relaxed) < room)
            .then(|| store.reserve_at_once(class, client, 1))
            .flatten()
        {
            Some(super::store::Verdict::Reserved { .. }) => {
                extra.fetch_add(1, Relaxed);
                metrics.reads(class.name(), QuotaReads::Reserved, 1);
                true
            }
            _ => false,
        }
    }

    fn total(&self) -> u64 {
        self.reserved + self.extra.load(Relaxed)
    }

    /// The quota as it will stand once the request settles having spent
    /// `used` reads, now: what refilled since the reservation counted.
    pub(crate) fn status(&self, used: u64) -> QuotaStatus {
        let extra = self.extra.load(Relaxed);
        let unspent = (self.reserved + extra).saturating_sub(used);
        let span = |reads: u64| Duration::from_nanos(reads.saturating_mul(self.rate.interval_ns()));
        let now = Instant::now();
        let full_at = (self.full_at + span(extra))
            .checked_sub(span(unspent))
            .map_or(now, |at| at.max(now));
        let owed = full_at - now;
        QuotaStatus {
            limit: self.rate.burst(),
            remaining: (self.rate).left(u64::try_from(owed.as_nanos()).unwrap_or(u64::MAX), 0),
            reset_at: SystemTime::now() + owed,
        }
    }

    /// The request spent `used` reads: the rest goes back.
    pub(crate) fn settle(self, used: u64) {
        let unspent = self.total().saturating_sub(used);
        if unspent > 0 {
            (self.metrics).reads(self.class.name(), QuotaReads::Refunded, unspent);
            self.store.refund(self.class, self.client, unspent);
        }
    }
}
