//! Permits: the acquisition point for a call that is not an HTTP read — a
//! SQL query, a gRPC call, a cache — charged as one read.
//!
//! [`Upstream::permit`](crate::read::Upstream::permit) admits the call as
//! it would a read: every refusal a read can meet, with the same codes; a
//! request slot and a host slot held while the [`Permit`] lives; one read
//! charged. The permit owns what the acquisition point admitted (its
//! slots, its time limit, the counters its end goes to) behind the narrow
//! [`Admission`] trait, and counts the call's end exactly once: a success,
//! a timeout, or — dropped in the middle of [`Permit::timeout`]'s call — a
//! cancellation.

use crate::error::ReadError;
use tokio::time::Instant;

/// How a permit's call ended, as the read counters count it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Succeeded,
    TimedOut,
    /// Dropped in the middle of its call.
    Cancelled,
}

/// What a permit holds until it is dropped — its slots and its limit — and
/// how its end is counted; made by the acquisition point.
pub(crate) trait Admission: Send + Sync {
    /// When the call must be done.
    fn until(&self) -> Instant;
    /// The error for a call cut at [`until`](Self::until), counted.
    fn elapsed(&self) -> ReadError;
    /// Counts the call's end (once).
    fn end(&self, outcome: Outcome);
    /// The host the call goes to.
    fn host(&self) -> &str;
}

/// Permission for one call that is not an HTTP read, charged as one read
/// ([`Upstream::permit`](crate::read::Upstream::permit)): its request and
/// host slots are held until it is dropped, or until the call given to
/// [`timeout`](Self::timeout) ends. It counts as a read that succeeded —
/// or, in `timeout`, that timed out, or was cancelled when its future was
/// dropped mid-call.
#[must_use = "the slots are released as soon as the permit is dropped"]
pub struct Permit<'a> {
    admitted: Box<dyn Admission + 'a>,
    outcome: Outcome,
}

impl<'a> Permit<'a> {
    pub(crate) fn new(admitted: Box<dyn Admission + 'a>) -> Self {
        Self {
            admitted,
            outcome: Outcome::Succeeded,
        }
    }

    /// When the call must be done: `min(admitted + read_timeout, deadline)`.
    pub fn deadline(&self) -> Instant {
        self.admitted.until()
    }

    /// Runs `call` holding the permit, until [`deadline`](Self::deadline):
    /// its output, or `UPSTREAM_TIMEOUT` (the read timeout cut it) /
    /// `DEADLINE_EXCEEDED` (the request's deadline did). The slots are
    /// released when it returns.
    pub async fn timeout<F: std::future::Future>(
        mut self,
        call: F,
    ) -> Result<F::Output, ReadError> {
        // A drop from here until the call ends is a cancellation.
        self.outcome = Outcome::Cancelled;
        if let Ok(output) = tokio::time::timeout_at(self.admitted.until(), call).await {
            self.outcome = Outcome::Succeeded;
            return Ok(output);
        }
        self.outcome = Outcome::TimedOut;
        Err(self.admitted.elapsed())
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.admitted.end(self.outcome);
    }
}

impl std::fmt::Debug for Permit<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("host", &self.admitted.host())
            .field("deadline", &self.admitted.until())
            .finish_non_exhaustive()
    }
}
