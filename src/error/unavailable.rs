//! A shared-state backend (Redis) did not answer.

use std::fmt;

/// A shared-state backend (Redis) did not answer: unreachable, too slow,
/// or skipped while its breaker is open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unavailable {
    /// What went wrong, for humans.
    pub message: String,
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unavailable: {}", self.message)
    }
}

impl std::error::Error for Unavailable {}
