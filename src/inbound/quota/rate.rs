//! The quota's arithmetic, with no clock and no store: a bucket of `burst`
//! reads refilled at one read per `interval`, kept as one number per client
//! — the instant its bucket is full again (GCRA's "theoretical arrival
//! time"), in nanoseconds on the quota's clock. A fresh client is full now;
//! taking `n` reads moves the instant `n` intervals later; giving `n` back
//! moves it `n` intervals earlier, never before now (a bucket holds no more
//! than `burst`). A take fits when the bucket would not be owed more than
//! `burst` reads.

use crate::config::QuotaConfig;
use std::time::Duration;

/// The rates `[quota]` gives each class, by [`QuotaClass::index`](super::QuotaClass)
/// (public, internal): the public class's burst is `burst`, the internal
/// class's a period's reads; `None` for a class without a quota. Every
/// store keeps these.
pub(crate) fn rates(quota: &QuotaConfig) -> [Option<Rate>; 2] {
    let rate = |reads, burst| (reads > 0).then(|| Rate::new(reads, quota.period(), burst));
    [
        rate(quota.reads, quota.burst),
        rate(quota.internal_reads, 0),
    ]
}

/// A quota: `reads` per `period`, at most `burst` held at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    reads: u64,
    period: Duration,
    burst: u64,
    interval_ns: u64,
}

impl Rate {
    /// `reads` (at least 1) per `period`, refilled evenly, at most `burst`
    /// held at once (0: `reads`). A read's share of the period is kept in
    /// whole nanoseconds (at least 1).
    pub fn new(reads: u64, period: Duration, burst: u64) -> Self {
        let reads = reads.max(1);
        let interval_ns = (period.as_nanos() / u128::from(reads)).clamp(1, u128::from(u64::MAX));
        Self {
            reads,
            period,
            burst: if burst == 0 { reads } else { burst },
            interval_ns: interval_ns as u64,
        }
    }

    /// Reads per period.
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// The period, in whole seconds (at least 1).
    pub fn period_secs(&self) -> u64 {
        self.period.as_secs().max(1)
    }

    /// Seconds a whole burst takes to refill (rounded up, at least 1): the
    /// window of the IETF `RateLimit-Policy` that says `burst` reads
    /// (`q=burst;w=refill_secs`), which describes the bucket as it is.
    pub fn refill_secs(&self) -> u64 {
        let nanos = u128::from(self.burst) * u128::from(self.interval_ns);
        u64::try_from(nanos.div_ceil(1_000_000_000))
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// The most reads held at once: a full quota.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// One read's share of the period, in nanoseconds.
    pub fn interval_ns(&self) -> u64 {
        self.interval_ns
    }

    fn span(&self, reads: u64) -> u64 {
        reads.saturating_mul(self.interval_ns)
    }

    /// The instant a bucket is full again if `spent` reads of it are spent
    /// at `now`.
    pub fn spent_at(&self, now: u64, spent: u64) -> u64 {
        now.saturating_add(self.span(spent))
    }

    /// Takes `n` reads at `now` from a bucket full at `full_at`: the instant
    /// it is full again, or `Err` with the nanoseconds to wait until `n`
    /// would fit. Asking more than [`burst`](Self::burst) never fits.
    pub fn take(&self, full_at: u64, now: u64, n: u64) -> Result<u64, u64> {
        let after = full_at.max(now).saturating_add(self.span(n));
        let most = now.saturating_add(self.span(self.burst));
        if after <= most {
            Ok(after)
        } else {
            Err(after - most)
        }
    }

    /// Gives `n` reads back at `now` to a bucket full at `full_at`: the
    /// instant it is full again (never before `now`).
    pub fn give_back(&self, full_at: u64, now: u64, n: u64) -> u64 {
        full_at.saturating_sub(self.span(n)).max(now)
    }

    /// Reads that fit at `now` in a bucket full at `full_at`.
    pub fn left(&self, full_at: u64, now: u64) -> u64 {
        let owed = full_at.saturating_sub(now).div_ceil(self.interval_ns);
        self.burst.saturating_sub(owed)
    }
}

#[cfg(test)]
mod tests {
    use super::Rate;
    use proptest::prelude::*;
    use std::time::Duration;

    const MIN: Duration = Duration::from_secs(60);

    #[test]
    fn a_fresh_bucket_holds_the_burst_and_refills_one_read_per_interval() {
        let rate = Rate::new(60, MIN, 0);
        assert_eq!((rate.burst(), rate.interval_ns()), (60, 1_000_000_000));
        let full = rate.take(0, 0, 60).expect("a full bucket gives the burst");
        assert_eq!(rate.left(full, 0), 0);
        assert_eq!(rate.take(full, 0, 1), Err(1_000_000_000));
        assert_eq!(rate.left(full, 1_000_000_000), 1);
        assert_eq!(rate.left(full, 2_500_000_000), 2);
        assert_eq!(
            rate.take(0, 0, 61),
            Err(1_000_000_000),
            "more than the burst"
        );
        assert_eq!(rate.give_back(full, 0, 10), 50_000_000_000);
        assert_eq!(rate.give_back(full, 0, 100), 0, "never fuller than full");
    }

    proptest! {
        /// Whatever a client takes and gives back, over any stretch of time
        /// it is granted no more than the burst plus what the stretch refills,
        /// less what it gave back.
        #[test]
        fn grants_never_pass_burst_plus_refill(
            steps in proptest::collection::vec((0u64..3_000_000_000, 0u64..40, 0u64..40), 1..200),
            burst in 1u64..50,
        ) {
            let rate = Rate::new(30, MIN, burst);
            let (mut now, mut full_at, mut granted) = (0u64, 0u64, 0u64);
            let mut given_back = 0u64;
            for (gap, want, back) in steps {
                now += gap;
                if let Ok(after) = rate.take(full_at, now, want) {
                    full_at = after;
                    granted += want;
                    // Give back at most what this take got.
                    let back = back.min(want);
                    full_at = rate.give_back(full_at, now, back);
                    given_back += back;
                }
                prop_assert!(rate.left(full_at, now) <= rate.burst());
            }
            let refill = now / rate.interval_ns();
            prop_assert!(granted - given_back <= rate.burst() + refill,
                "granted {granted} - back {given_back} > burst {} + refill {refill}", rate.burst());
        }

        /// A refused take changes nothing and says how long to wait; after
        /// that wait it fits.
        #[test]
        fn a_refusal_says_when_it_fits(full_at in 0u64..200_000_000_000, now in 0u64..100_000_000_000, n in 1u64..30) {
            let rate = Rate::new(30, MIN, 0);
            if let Err(wait) = rate.take(full_at, now, n) {
                prop_assert!(rate.take(full_at, now + wait, n).is_ok());
                prop_assert!(rate.take(full_at, now + wait - 1, n).is_err());
            }
        }
    }
}
