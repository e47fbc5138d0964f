//! A request's reservation on its client's quota, and what it shows.

use super::{ClientQuota, QuotaClass, Rate};
use crate::metrics;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Reads a request reserved on its client's quota. [`settle`](Self::settle)
/// gives back what was not spent; dropped unsettled, it gives back nothing
/// (the request scope settles it when it ends, answered or cancelled).
#[derive(Debug)]
pub struct Reservation {
    quota: Arc<ClientQuota>,
    class: QuotaClass,
    client: IpAddr,
    rate: Rate,
    reserved: u64,
    /// Taken from the shared store (else the in-process one).
    shared: bool,
    /// Reads that fit after the reservation was taken.
    remaining: u64,
    /// When the quota is full again if nothing is given back.
    full_at: SystemTime,
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

impl Reservation {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        quota: Arc<ClientQuota>,
        class: QuotaClass,
        client: IpAddr,
        rate: Rate,
        reserved: u64,
        shared: bool,
        remaining: u64,
        full_at: SystemTime,
    ) -> Self {
        Self {
            quota,
            class,
            client,
            rate,
            reserved,
            shared,
            remaining,
            full_at,
        }
    }

    /// Reads reserved: the request's budget.
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// The quota as it will stand once the request settles having spent
    /// `used` reads.
    pub fn status(&self, used: u64) -> QuotaStatus {
        let unspent = self.reserved.saturating_sub(used);
        let back = Duration::from_nanos(unspent.saturating_mul(self.rate.interval_ns()));
        let now = SystemTime::now();
        QuotaStatus {
            limit: self.rate.burst(),
            remaining: (self.remaining + unspent).min(self.rate.burst()),
            reset_at: (self.full_at.checked_sub(back).unwrap_or(now)).max(now),
        }
    }

    /// The request spent `used` reads: the rest goes back.
    pub fn settle(self, used: u64) {
        let unspent = self.reserved.saturating_sub(used);
        if unspent > 0 {
            metrics::quota_reads(self.class.name(), "refunded", unspent);
            (self.quota).refund(self.class, self.client, unspent, self.shared);
        }
    }
}
