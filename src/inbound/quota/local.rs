//! The in-process quota store: one map per class of caller, from client
//! key to the instant its bucket is full again (`rate.rs`), on tokio's
//! clock (tests pause it).
//!
//! **As a fallback** (a shared store that did not answer, `failure_mode =
//! "open"`), a reservation never finds a fresh full bucket for a client
//! the fleet may have spent: it starts from the later of what this store
//! granted the client and what the shared store last heard of it (the
//! instant its bucket is full again, as the fleet's last answer said), or,
//! for a client the shared store never heard of, from the fleet's share:
//! half its burst, a replica's share of the smallest fleet, two — it holds
//! no more than that at once while the fallback lasts. So a replica that
//! falls back hands a spent client only what refills, and a fresh one half
//! a burst, not a whole one.
//!
//! A client whose bucket is full again is indistinguishable from one never
//! seen, so it is forgotten: every `max(SWEEP_EVERY, 2 × keys left)`
//! reservations, one caller drops the full ones, as the per-IP limiter
//! does — a flood of distinct addresses holds memory only for as long as
//! their reads take to refill, and a sweep costs O(1) per reservation.

use super::rate::Rate;
use super::store::{QuotaClass, QuotaStore, Verdict};
use crate::error::Unavailable;
use crate::seed::random_state;
use dashmap::DashMap;
use foldhash::fast::SeedableRandomState;
use futures::future::BoxFuture;
use std::net::IpAddr;

/// Idle clients are swept at least this many reservations apart (more when
/// many stay live, so the sweep costs O(1) per reservation); the per-IP
/// limiter's keys on the same rule.
pub(crate) const SWEEP_EVERY: u64 = 4096;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;
use tokio::time::Instant;

/// A client the shared store never heard of holds, in a fallback, at most
/// its burst divided by this: a replica's share of the smallest fleet.
const FALLBACK_SHARES: u64 = 2;

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Where a reservation finds a client's bucket (ns on the store's clock).
enum Start {
    /// As this store holds it (a new client: full).
    Fresh,
    /// Full no sooner than this: the shared store's last word.
    Known(u64),
    /// Full at this, holding the client's share, if this store holds it
    /// full (or not at all).
    Share(u64),
}

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
        self.reserve(class, client, reads, |_, _| Start::Fresh)
    }

    /// Reserves `reads` for `client` now in place of a shared store that
    /// did not answer: from `last_known`, the time until the client's
    /// bucket is full again as the shared store last heard, or from what
    /// this store granted it, whichever is later; `None`, the shared store
    /// never heard of the client: a bucket this store does not hold (or
    /// holds full) starts with the client's share, half its burst (the
    /// module's docs say why).
    pub fn reserve_fallback(
        &self,
        class: QuotaClass,
        client: IpAddr,
        reads: u64,
        last_known: Option<Duration>,
    ) -> Verdict {
        self.reserve(class, client, reads, |rate, now| match last_known {
            Some(full_in) => Start::Known(now.saturating_add(nanos(full_in))),
            None => {
                let share = (rate.burst() / FALLBACK_SHARES).max(1);
                Start::Share(rate.spent_at(now, rate.burst() - share))
            }
        })
    }

    /// Reserves `reads` for `client` now, from where `start(rate, now)`
    /// says its bucket is.
    fn reserve(
        &self,
        class: QuotaClass,
        client: IpAddr,
        reads: u64,
        start: impl FnOnce(&Rate, u64) -> Start,
    ) -> Verdict {
        let Some(b) = &self.classes[class.index()] else {
            return Verdict::unlimited();
        };
        let now = self.now();
        let verdict = {
            let mut full_at = b.full_at.entry(client).or_insert(now);
            match start(&b.rate, now) {
                Start::Fresh => {}
                Start::Known(at) => *full_at = (*full_at).max(at),
                Start::Share(at) if *full_at <= now => *full_at = at,
                Start::Share(_) => {}
            }
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

    proptest::proptest! {
        /// A fallback never starts full: a client the shared store last
        /// heard owing `owed` reads gets at most `burst - owed` at once, one
        /// it never heard of at most its share (half its burst), however
        /// this store held it before (a bucket left full by an earlier
        /// outage included), and however the reservations are cut.
        #[test]
        fn a_fallback_never_hands_out_more_than_the_fleet_left(
            burst in 1u64..60,
            owed in 0u64..80,
            known in proptest::bool::ANY,
            earlier in proptest::bool::ANY,
            asks in proptest::collection::vec(1u64..20, 1..30),
        ) {
            // A read's share is an hour: nothing refills meanwhile.
            let rate = Rate::new(1, Duration::from_secs(3600), burst);
            let quotas = LocalQuotas::new(Some(rate), None);
            let client = ip(9);
            if earlier {
                // A bucket this store left full.
                quotas.refund_now(QuotaClass::Public, client, 0);
                let _ = quotas.reserve_now(QuotaClass::Public, client, 0);
            }
            let last_known = known.then(|| Duration::from_secs(3600) * owed as u32);
            let mut granted = 0;
            for n in asks {
                let verdict = quotas.reserve_fallback(QuotaClass::Public, client, n, last_known);
                if let Verdict::Reserved { .. } = verdict {
                    granted += n;
                }
            }
            let most = if known { burst.saturating_sub(owed) } else { (burst / 2).max(1) };
            proptest::prop_assert!(granted <= most, "granted {} of at most {}", granted, most);
        }
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
