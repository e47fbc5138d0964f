//! The request's counters, and a read sent, counted to exactly one end.

use crate::error::ReadError;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The request's counters, bumped by the acquisition point.
#[derive(Debug, Default)]
pub(crate) struct ReadStats {
    pub(crate) issued: AtomicU64,
    pub(crate) succeeded: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) timed_out: AtomicU64,
    pub(crate) cancelled: AtomicU64,
    pub(crate) dedup_hits: AtomicU64,
    pub(crate) coalesced: AtomicU64,
    pub(crate) refused_budget: AtomicU64,
    pub(crate) refused_host: AtomicU64,
    pub(crate) refused_deadline: AtomicU64,
    pub(crate) cache_hits: AtomicU64,
}

/// Adds one to a counter of [`ReadStats`].
pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Relaxed);
}

/// One read a request sent (or leads), as its counters see it: it ends in
/// exactly one of `succeeded`, `failed` and `timed_out` — or, dropped
/// unfinished (its request was cancelled), `cancelled` — so
/// `issued = succeeded + failed + timed_out + cancelled`.
pub(crate) struct Pending<'a> {
    stats: &'a ReadStats,
    finished: bool,
}

impl<'a> Pending<'a> {
    /// A read sent now, counted in `stats` when it ends.
    pub(crate) fn new(stats: &'a ReadStats) -> Self {
        Self {
            stats,
            finished: false,
        }
    }

    /// The read ended with `outcome`.
    pub(crate) fn finish<T>(&mut self, outcome: &Result<T, ReadError>) {
        self.finished = true;
        bump(match outcome {
            Ok(_) => &self.stats.succeeded,
            Err(ReadError::UpstreamTimeout { .. } | ReadError::DeadlineExceeded) => {
                &self.stats.timed_out
            }
            Err(_) => &self.stats.failed,
        });
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.finished {
            bump(&self.stats.cancelled);
        }
    }
}
