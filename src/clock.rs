//! The engine's clock: where it reads "now" to compute deadlines.
//!
//! Production uses [`TokioClock`] (`tokio::time::Instant::now()`, which also
//! honours `tokio::time::pause()`); tests inject a [`ManualClock`] and move
//! time by hand, so deadline behaviour is deterministic without sleeping.
//! The read path reads the clock once per read sent (see
//! [`crate::upstream`]).

use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// A source of "now" for deadlines.
pub trait Clock: Send + Sync + 'static {
    /// The current instant.
    fn now(&self) -> Instant;

    /// Whether [`now`](Self::now) is tokio's own clock
    /// (`tokio::time::Instant::now()`). Then the engine arms a read's timer at
    /// an instant it read from this clock instead of reading tokio's clock
    /// again. The default, `false`, is always correct.
    fn is_tokio_clock(&self) -> bool {
        false
    }
}

/// The real clock (tokio's, so a paused tokio runtime pauses it too).
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioClock;

impl Clock for TokioClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn is_tokio_clock(&self) -> bool {
        true
    }
}

/// A clock that moves only when told to.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<Instant>,
}

impl ManualClock {
    /// A clock standing at the real current instant.
    pub fn new() -> Self {
        Self {
            now: Mutex::new(Instant::now()),
        }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        *self.now.lock().unwrap_or_else(|e| e.into_inner()) += by;
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        *self.now.lock().unwrap_or_else(|e| e.into_inner())
    }
}
