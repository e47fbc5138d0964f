//! Step 5, for a host marked `propagate` (`[hosts."HOST:PORT"]` or an
//! `[upstreams."NAME"]` of it): the read carries what its upstream — itself
//! a service on the engine — may spend for it, and the request is charged
//! what the upstream says it spent. Never for any other host: the header
//! tells a third party nothing.
//!
//! 1. **grant**: once admitted (the read itself charged as always), the
//!    read asks for a grant. It yields once first, so that the reads a
//!    resolver starts together — a list's rows, sibling fields, polled in
//!    the same round — all ask before any is given. Each then takes the
//!    reads left divided by the reads still asking, itself included,
//!    rounded down (`RequestBudget::reserve_grant`, charged at once): 16
//!    left and 4 asking give 4, 4, 4, 4; 7 left and 3 asking give 2, 2, 3
//!    (the remainder goes to the last). A read alone gets all that is
//!    left; a read that asks later — one that waited for a request slot —
//!    gets what the earlier grants left. Grants are charged, so together
//!    they never pass what was left. A request whose reads another payer
//!    also pays (a WebSocket connection's budget) has the grant paid there
//!    too, up front, and cut to what that payer pays.
//! 2. **header**: `Fanout-Budget: reads=G, deadline-ms=D, hops=H` — the
//!    grant; the time until this read is cut (`min(read_timeout, the
//!    request's deadline)`) less the 100 ms a callee may take to answer
//!    past its own deadline, so it answers before the read is cut; the hop
//!    count, one more than the request received. In `budget.mode =
//!    "measure"` nothing is reserved and `reads` is left out: the upstream
//!    keeps its own limit, and what it reports is charged in full.
//! 3. **settle**: the answer's `Fanout-Spent: reads=N` keeps `min(N, G)`
//!    of the grant charged (more is not believed, and counted:
//!    `fanout_spent_beyond_grant_reads_total`) and gives the rest back; an
//!    answer without it gives all of it back. A read with no answer —
//!    timed out, failed, cancelled — keeps the whole grant charged: the
//!    upstream may have spent it.

use crate::chain::header;
use http::{HeaderMap, HeaderName, HeaderValue};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use tokio::time::Instant;

/// The reads of one request asking for a grant right now.
#[derive(Debug, Default)]
pub(crate) struct Claimants(AtomicUsize);

/// One read asking for a grant, counted among the claimants until it has
/// it (or is dropped, its request cancelled).
pub(crate) struct Asking<'a>(&'a AtomicUsize);

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

impl Claimants {
    /// One more read asks; the reads started in the same round (polled
    /// before this returns: it yields once) ask before any is given.
    pub(crate) async fn ask(&self) -> Asking<'_> {
        self.0.fetch_add(1, Relaxed);
        let asking = Asking(&self.0);
        YieldOnce(false).await;
        asking
    }
}

impl Asking<'_> {
    /// The reads asking now, this one included: what the reads left are
    /// divided by.
    pub(crate) fn count(&self) -> usize {
        self.0.load(Relaxed)
    }
}

/// One read's grant: reserved on the request's budget until settled.
#[derive(Debug)]
pub(crate) struct Grant {
    /// The reads reserved for the upstream.
    reads: u64,
    /// `budget.mode = "measure"`: nothing reserved, the upstream not
    /// limited by this request.
    unlimited: bool,
}

/// What an answer said its upstream spent of a [`Grant`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Spent {
    /// Nothing (no `Fanout-Spent`): the whole grant goes back.
    Unreported { granted: u64 },
    /// `reads` spent, as far as the grant covers them (more is not
    /// believed, and counted).
    OfGrant { granted: u64, spent: u64 },
    /// `reads` spent by an upstream this request did not limit (measure
    /// mode).
    Unlimited(u64),
}

impl Grant {
    /// `reads` reserved (`unlimited`: none, in measure mode).
    pub(crate) fn new(reads: u64, unlimited: bool) -> Self {
        Self { reads, unlimited }
    }

    /// The `Fanout-Budget` header of a read cut at `until`, sent with the
    /// hop count `hops`.
    pub(crate) fn header(&self, until: Instant, hops: u64) -> (HeaderName, HeaderValue) {
        let left = until.saturating_duration_since(Instant::now());
        let deadline_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
        let reads = (!self.unlimited).then_some(self.reads);
        (header::BUDGET, header::budget(reads, deadline_ms, hops))
    }

    /// What the answer's headers (`answer`) say the upstream spent.
    pub(crate) fn spent(self, answer: &HeaderMap) -> Spent {
        let spent = header::read(answer, &header::SPENT).and_then(|members| members.reads);
        match spent {
            None => Spent::Unreported {
                granted: self.reads,
            },
            Some(spent) if self.unlimited => Spent::Unlimited(spent),
            Some(spent) => {
                if spent > self.reads {
                    crate::metrics::spent_beyond_grant(spent - self.reads);
                }
                Spent::OfGrant {
                    granted: self.reads,
                    spent,
                }
            }
        }
    }
}

/// Pending once, waking itself at once: the futures polled in the same
/// round (a join's) are polled before this one goes on. Not tokio's
/// `yield_now`, which defers the wake past the I/O driver's next turn
/// (an `epoll_wait` a read on a current-thread runtime: 285 ns against 45).
struct YieldOnce(bool);

impl std::future::Future for YieldOnce {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if std::mem::replace(&mut self.0, true) {
            return std::task::Poll::Ready(());
        }
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}
