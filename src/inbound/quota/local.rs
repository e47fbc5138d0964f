//! The in-process quota store: one map per class of caller, from client
//! key to the instant its bucket is full again (`rate.rs`), on tokio's
//! clock (tests pause it).
//!
//! A client whose bucket is full again is indistinguishable from one never
//! seen, so it is forgotten: every `max(SWEEP_EVERY, 2 × keys left)`
//! reservations, one caller drops the full ones, as the per-IP limiter
//! does — a flood of distinct addresses holds memory only for as long as
//! their reads take to refill, and a sweep costs O(1) per reservation.

use super::rate::Rate;
use super::store::{QuotaClass, QuotaStore, Verdict};
use crate::error::Unavailable;
use crate::inbound::limiter::SWEEP_EVERY;
use crate::seed::random_state;
use dashmap::DashMap;
use foldhash::fast::SeedableRandomState;
use futures::future::BoxFuture;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;
use tokio::time::Instant;

/// One class's buckets.
struct Buckets {
    rate: Rate,
    full_at: DashMap<IpAddr, u64, SeedableRandomState>,
    until_sweep: AtomicU64,
}

/// The quotas of one process, kept in memory.
pub struct LocalQuotas {
    origin: Instant,
    classes: [Option<Buckets>; 2],
}

impl std::fmt::Debug for LocalQuotas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalQuotas")
            .field("clients", &self.len())
            .finish_non_exhaustive()
    }
}

impl LocalQuotas {
    /// Buckets at `public` and `internal` rates (`None`: that class has no
    /// quota, and reserving for it is always granted).
    pub fn new(public: Option<Rate>, internal: Option<Rate>) -> Self {
        let buckets = |rate: Option<Rate>| {
            rate.map(|rate| Buckets {
                rate,
                full_at: DashMap::with_hasher(random_state()),
                until_sweep: AtomicU64::new(SWEEP_EVERY),
            })
        };
        Self {
            origin: Instant::now(),
            classes: [buckets(public), buckets(internal)],
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Reserves `reads` for `client` now.
    pub fn reserve_now(&self, class: QuotaClass, client: IpAddr, reads: u64) -> Verdict {
        let Some(b) = &self.classes[class.index()] else {
            return Verdict::unlimited();
        };
        let now = self.now();
        let verdict = {
            let mut full_at = b.full_at.entry(client).or_insert(now);
            match b.rate.take(*full_at, now, reads) {
                Ok(after) => {
                    *full_at = after;
                    Verdict::Reserved {
                        remaining: b.rate.left(after, now),
                        full_in: Duration::from_nanos(after - now),
                    }
                }
                Err(wait) => Verdict::Refused {
                    remaining: b.rate.left(*full_at, now),
                    retry_after: Duration::from_nanos(wait),
                },
            }
        };
        if b.until_sweep.fetch_sub(1, Relaxed) == 1 {
            b.full_at.retain(|_, full_at| *full_at > now);
            b.full_at.shrink_to_fit();
            let gap = SWEEP_EVERY.max(2 * b.full_at.len() as u64);
            b.until_sweep.store(gap, Relaxed);
        }
        verdict
    }

    /// Gives `reads` reserved and not spent back to `client`.
    pub fn refund_now(&self, class: QuotaClass, client: IpAddr, reads: u64) {
        let Some(b) = &self.classes[class.index()] else {
            return;
        };
        let now = self.now();
        if let Some(mut full_at) = b.full_at.get_mut(&client) {
            *full_at = b.rate.give_back(*full_at, now, reads);
        }
    }

    /// Clients held, every class (for tests).
    #[doc(hidden)]
    pub fn len(&self) -> usize {
        self.classes.iter().flatten().map(|b| b.full_at.len()).sum()
    }

    /// Whether no client is held (for tests).
    #[doc(hidden)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl QuotaStore for LocalQuotas {
    fn reserve(
        &self,
        class: QuotaClass,
        client: IpAddr,
        reads: u64,
    ) -> BoxFuture<'_, Result<Verdict, Unavailable>> {
        let verdict = self.reserve_now(class, client, reads);
        Box::pin(std::future::ready(Ok(verdict)))
    }

    fn refund(&self, class: QuotaClass, client: IpAddr, reads: u64) {
        self.refund_now(class, client, reads);
    }

    fn reserve_at_once(&self, class: QuotaClass, client: IpAddr, reads: u64) -> Option<Verdict> {
        Some(self.reserve_now(class, client, reads))
    }
}

#[cfg(test)]
mod tests {
    use super::{LocalQuotas, QuotaClass, Rate, Verdict};
    use std::net::{IpAddr, Ipv4Addr};
    use std::time::Duration;

    fn ip(n: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(n))
    }

    #[tokio::test(start_paused = true)]
    async fn a_million_distinct_clients_do_not_grow_memory_without_bound() {
        // 3,600 reads an hour: one read's share is a second.
        let rate = Rate::new(3600, Duration::from_secs(3600), 0);
        let quotas = LocalQuotas::new(Some(rate), None);
        let mut peak = 0;
        // 1,000,000 distinct clients at 10,000 a second, each reserving 10
        // reads and spending 2 of them.
        for n in 0..1_000_000u32 {
            let verdict = quotas.reserve_now(QuotaClass::Public, ip(n), 10);
            assert!(matches!(verdict, Verdict::Reserved { .. }), "{verdict:?}");
            quotas.refund_now(QuotaClass::Public, ip(n), 8);
            if n % 100 == 99 {
                tokio::time::advance(Duration::from_millis(10)).await;
            }
            peak = peak.max(quotas.len());
        }
        // A client is full again 2 s after it spent 2 reads: ~20,000 are
        // live at 10,000 a second; sweeps every max(4096, 2 × kept)
        // reservations hold at most ~3 × live + 4096.
        assert!(peak < 70_000, "peak {peak} clients held for 1,000,000");
        println!("1,000,000 distinct clients: peak {peak} held");
        tokio::time::advance(Duration::from_secs(3)).await;
        for n in 0..200_000u32 {
            quotas.reserve_now(QuotaClass::Public, ip(n % 7), 0);
        }
        assert!(
            quotas.len() <= 7,
            "{} clients held once full again",
            quotas.len()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_classes_are_apart_and_a_class_without_a_quota_is_unlimited() {
        let rate = Rate::new(60, Duration::from_secs(60), 5);
        let quotas = LocalQuotas::new(Some(rate), None);
        let client = ip(7);
        assert!(matches!(
            quotas.reserve_now(QuotaClass::Public, client, 5),
            Verdict::Reserved { remaining: 0, .. }
        ));
        assert_eq!(
            quotas.reserve_now(QuotaClass::Public, client, 1),
            Verdict::Refused {
                remaining: 0,
                retry_after: Duration::from_secs(1)
            }
        );
        for _ in 0..100 {
            assert_eq!(
                quotas.reserve_now(QuotaClass::Internal, client, 1_000),
                Verdict::unlimited()
            );
        }
        quotas.refund_now(QuotaClass::Public, client, 2);
        assert!(matches!(
            quotas.reserve_now(QuotaClass::Public, client, 2),
            Verdict::Reserved { remaining: 0, .. }
        ));
    }
}
