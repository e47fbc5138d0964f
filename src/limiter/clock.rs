//! The in-process limiter's real clock.

use governor::clock::Clock as GovernorClock;
use governor::nanos::Nanos;

/// [`LocalLimiter`](super::LocalLimiter)'s real clock: `std`'s monotonic
/// clock (what governor's `DefaultClock` reads), as governor's `Nanos` since
/// this clock was made. A check then subtracts two integers where governor's
/// own clock compares and subtracts two `Instant`s, out of line.
#[derive(Clone, Copy, Debug)]
pub struct MonotonicNanos {
    origin: std::time::Instant,
}

impl MonotonicNanos {
    /// A clock whose zero is now.
    pub fn new() -> Self {
        Self {
            origin: std::time::Instant::now(),
        }
    }
}

impl Default for MonotonicNanos {
    fn default() -> Self {
        Self::new()
    }
}

impl GovernorClock for MonotonicNanos {
    type Instant = Nanos;

    #[inline]
    fn now(&self) -> Nanos {
        let elapsed = self.origin.elapsed();
        // Integer ns (governor's `From<Duration>` goes through `u128`).
        Nanos::from(elapsed.as_secs() * 1_000_000_000 + u64::from(elapsed.subsec_nanos()))
    }
}
