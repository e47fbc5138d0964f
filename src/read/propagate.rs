//! Step 5, for a host marked `propagate` (`[hosts."HOST:PORT"]` or an
//! `[upstreams."NAME"]` of it): the read carries what its upstream — itself
//! a service on the engine — may spend for it, and the request is charged
//! what the upstream says it spent. Never for any other host: the header
//! tells a third party nothing.
//!
//! 1. **grant**: once admitted (the read itself charged as always), the
//!    read asks for a grant. It yields once first, so that the reads a
//!    resolver starts together — a list's rows, sibling fields, polled in
//!    the same round — all ask before any is given: the reads left are
//!    split evenly between the reads asking at that moment
//!    ([`RequestBudget::reserve_grant`]: `left / asking`, rounded down,
//!    charged at once). A read alone gets all that is left; a read that
//!    asks later gets what the earlier grants left. Grants are charged, so
//!    together they never pass what was left.
//! 2. **header**: `Fanout-Budget: reads=G, deadline-ms=D, hops=H` — the
//!    grant; the time until this read is cut (`min(read_timeout, the
//!    request's deadline)`); the hop count, one more than the request
//!    received. In `budget.mode = "measure"` nothing is reserved and
//!    `reads` is left out: the upstream keeps its own limit.
//! 3. **settle**: the answer's `Fanout-Spent: reads=N` keeps `min(N, G)`
//!    of the grant charged (more is not believed, and counted:
//!    `fanout_spent_beyond_grant_reads_total`) and gives the rest back; an
//!    answer without it gives all of it back. A read with no answer —
//!    timed out, failed, cancelled — keeps the whole grant charged: the
//!    upstream may have spent it.

use super::budget::RequestBudget;
use crate::chain::header;
use http::{HeaderMap, HeaderName, HeaderValue};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use tokio::time::Instant;

/// The reads of one request asking for a grant right now.
#[derive(Debug, Default)]
pub(crate) struct Claimants(AtomicUsize);

/// One read's grant: reserved on the request's budget until settled.
#[derive(Debug)]
pub(crate) struct Grant {
    /// The reads reserved for the upstream.
    reads: u64,
    /// `budget.mode = "measure"`: nothing reserved, the upstream not
    /// limited by this request.
    unlimited: bool,
}

/// One read asking, counted among the claimants until it has its grant
/// (or is dropped, its request cancelled).
struct Asking<'a>(&'a AtomicUsize);

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

impl Claimants {
    /// The grant of one read of the request whose budget is `budget`
    /// (see the module docs).
    pub(crate) async fn grant(&self, budget: &RequestBudget) -> Grant {
        self.0.fetch_add(1, Relaxed);
        let _asking = Asking(&self.0);
        // The reads started in the same round ask before any is given.
        tokio::task::yield_now().await;
        let reads = budget.reserve_grant(self.0.load(Relaxed));
        let unlimited = budget.grants_unlimited();
        super::spans::note("fanout.granted", reads);
        Grant { reads, unlimited }
    }
}

impl Grant {
    /// The `Fanout-Budget` header of a read cut at `until`, sent with the
    /// hop count `hops`.
    pub(crate) fn header(&self, until: Instant, hops: u64) -> (HeaderName, HeaderValue) {
        let left = until.saturating_duration_since(Instant::now());
        let deadline_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
        let reads = (!self.unlimited).then_some(self.reads);
        (header::BUDGET, header::budget(reads, deadline_ms, hops))
    }

    /// The answer's headers say what the upstream spent: charged to
    /// `budget` (see the module docs); the reads charged.
    pub(crate) fn settle(self, budget: &RequestBudget, answer: &HeaderMap) -> u64 {
        let spent = header::read(answer, &header::SPENT).and_then(|members| members.reads);
        let Some(spent) = spent else {
            return budget.settle_grant(self.reads, 0);
        };
        super::spans::note("fanout.spent", spent);
        if self.unlimited {
            return budget.charge_spent(spent);
        }
        if spent > self.reads {
            crate::metrics::spent_beyond_grant(spent - self.reads);
        }
        budget.settle_grant(self.reads, spent)
    }
}
