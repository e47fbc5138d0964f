//! The in-process limiter's real clock.

use governor::clock::Clock as GovernorClock;
use governor::nanos::Nanos;
use tokio::time::Instant;

/// [`LocalLimiter`](super::LocalLimiter)'s real clock: tokio's — the one
/// clock of every deadline and timer, so a test that pauses tokio's time
/// pauses the limiter too — as governor's `Nanos` since this clock was made.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TokioNanos {
    origin: Instant,
}

impl TokioNanos {
    /// A clock whose zero is now.
    pub(crate) fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl GovernorClock for TokioNanos {
    type Instant = Nanos;

    fn now(&self) -> Nanos {
        Nanos::from(self.origin.elapsed())
    }
}
