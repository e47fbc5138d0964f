//! Step 5 to a host marked `propagate` (a service on the engine): the
//! read's grant of the budget left, and what its answer says it spent
//! settled — on the request's budget (`budget.rs`) and on its upstream's
//! share (`share.rs`); `propagate.rs` tells the whole of it.

use crate::error::ReadError;
use crate::read::budget;
use crate::read::hosts::HostEntry;
use crate::read::propagate;
use crate::read::share::ShareId;
use crate::read::spans;
use crate::read::{Read, ReadResult, Upstream};
use tokio::time::Instant;

impl Upstream<'_> {
    /// Steps 2–6 to a host marked `propagate`: refused first if it would
    /// leave the callee no time, then admitted, granted its share of the
    /// reads left (which may wait for the reads asking at the same moment),
    /// and sent carrying the grant, its deadline and the hop count.
    pub(in crate::read) async fn propagated(
        &self,
        mut read: Read,
        host: &HostEntry,
        share: Option<ShareId>,
    ) -> ReadResult {
        if self.no_time_to_give() {
            return Err(self.refused(host, ReadError::DeadlineExceeded));
        }
        // Held to the end: the read's slots.
        let admitted = self.admit(host, share).await?;
        let limit = self.limit(admitted.now);
        let grant = self.grant(share).await;
        // The callee may answer this much past the deadline it is given:
        // given less, it answers before this read is cut.
        let until = limit.until.checked_sub(budget::FINISH_GRACE);
        let (name, value) = grant.header(until.unwrap_or(limit.until), self.reads.hops);
        read.headers.retain(|(n, _)| *n != name);
        read.headers.push((name, value));
        self.sent(read, host, limit, share, Some(grant)).await
    }

    /// Step 5, to a host marked `propagate`: the read's grant of the
    /// reads left, split with the reads asking at the same moment
    /// (`propagate.rs`), charged now.
    /// An upstream with a share of its own (`share`) is granted no more
    /// than is left of it, taken from it too.
    pub(in crate::read) async fn grant(&self, share: Option<ShareId>) -> propagate::Grant {
        let asking = self.reads.claimants.ask().await;
        let (budget, shares) = (&self.reads.budget, &self.reads.parts.shares);
        let cap = share.map_or(u64::MAX, |id| shares.left(&self.reads.shares, id));
        let mut reads = budget.reserve_grant(asking.count(), cap);
        if let Some(id) = share {
            // Another read of the share may have taken some meanwhile.
            let took = shares.take_up_to(&self.reads.shares, id, reads);
            budget.settle_grant(reads, took);
            reads = took;
        }
        spans::note("fanout.granted", reads);
        propagate::Grant::new(reads, budget.grants_unlimited() && share.is_none())
    }

    /// What the upstream said it spent of its grant, charged: up to the
    /// grant, the rest given back (`propagate.rs`), to the upstream's
    /// `share` too.
    pub(in crate::read) fn settle(&self, spent: propagate::Spent, share: Option<ShareId>) {
        let budget = &self.reads.budget;
        let (granted, charged) = match spent {
            propagate::Spent::Unreported { granted } => (granted, budget.settle_grant(granted, 0)),
            propagate::Spent::OfGrant { granted, spent } => {
                spans::note("fanout.spent", spent);
                (granted, budget.settle_grant(granted, spent))
            }
            propagate::Spent::Unlimited(spent) => {
                spans::note("fanout.spent", spent);
                budget.charge_spent(spent);
                return;
            }
        };
        if let Some(id) = share {
            (self.reads.parts.shares).give_back_n(&self.reads.shares, id, granted - charged);
        }
    }

    /// Whether the read, sent now, would leave a service on the engine no
    /// time: it is given the read's time less the 100 ms it may take to
    /// answer past its deadline (refused before it is charged).
    pub(in crate::read) fn no_time_to_give(&self) -> bool {
        let now = Instant::now();
        self.limit(now).until.saturating_duration_since(now) <= budget::FINISH_GRACE
    }
}
