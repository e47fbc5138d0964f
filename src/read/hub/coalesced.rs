//! Steps 2–6 to a host that coalesces: the read joins the identical read
//! another request has in flight, or is admitted and leads one, whose send
//! runs in a task of its own (`coalesce.rs` tells the whole of
//! coalescing; the refusals, slots and charge are `admit.rs`'s).

use crate::error::ReadError;
use crate::read::budget::{bump, Pending};
use crate::read::coalesce::{Flight, Role};
use crate::read::hosts::HostEntry;
use crate::read::spans;
use crate::read::timeout::Limit;
use crate::read::{on_the_wire, Read, ReadResult, Upstream};
use std::sync::Arc;
use tokio::time::Instant;

impl Upstream<'_> {
    /// Steps 2–6 to a host that coalesces (`coalesce.rs`): the read joins
    /// the identical read another request has in flight, or is admitted
    /// and leads one, whose send runs in a task of its own.
    pub(in crate::read) async fn coalesced(&self, read: Read, host: &HostEntry) -> ReadResult {
        let now = Instant::now();
        let share = self.reads.parts.shares.of(&read.url);
        self.refuse_early(host, share, now)?;
        let table = &self.reads.parts.coalesce;
        let key = read.identity().expect("a safe read has a key");
        let slots = table.unless_started(&key, self.slots(host, now)).await;
        let ((request_slot, host_slot), now) = match slots {
            Err(flight) => return self.join(flight, host).await,
            Ok(slots) => slots?,
        };
        let mut charged = None;
        let lead = || {
            let now = self.charge(host, share, now)?;
            charged = Some(now);
            let (parts, host) = (self.reads.parts.clone(), host.clone());
            let limit = Limit::read_timeout(now, parts.read_timeout);
            let span = spans::client_span(&read);
            let send = async move {
                let _host_slot = host_slot;
                let shared = |r| Ok(Arc::new(r));
                on_the_wire(&parts, span, read, &host, limit, (|_| {}, shared, |_| {})).await
            };
            // Sent from a task of its own, under the leader's trace: its
            // sampling, and the span the leader reads under, so its
            // `traceparent` names the leader's trace, sampled or not, even
            // when no span of its own is built.
            #[cfg(feature = "otel")]
            let send = crate::telemetry::hand_over(send);
            Ok(send)
        };
        match table.join_or_lead(key, lead)? {
            Role::Joined(flight) => {
                drop(request_slot);
                self.join(flight, host).await
            }
            Role::Led(flight) => {
                let now = charged.expect("a leader was charged");
                // The leader's own read, for the request: it holds the
                // request slot until the answer, and counts as sent.
                let _request_slot = request_slot;
                let mut pending = Pending::new(self.reads.budget.stats());
                let outcome = self.wait(flight, host, now).await;
                let outcome = outcome.and_then(|answer| self.keep(answer));
                pending.finish(&outcome);
                outcome
            }
        }
    }

    /// A read another request has in flight, joined: not charged, no slot,
    /// its own copy of the answer, kept under this request's bounds.
    async fn join(&self, flight: Flight<ReadResult>, host: &HostEntry) -> ReadResult {
        bump(&self.reads.budget.stats().coalesced);
        host.metrics().coalesced.increment(1);
        spans::note("fanout.coalesced", true);
        let answer = self.wait(flight, host, Instant::now()).await?;
        // Its own response (what it derives is its own), found unusable
        // whenever the leader's is.
        self.keep(Arc::new(answer.copy()))
    }

    /// The shared read's outcome, unless this request's own
    /// `min(since + read_timeout, deadline)` comes first.
    async fn wait(
        &self,
        flight: Flight<ReadResult>,
        host: &HostEntry,
        since: Instant,
    ) -> ReadResult {
        let limit = self.limit(since);
        match tokio::time::timeout_at(limit.until, flight.outcome()).await {
            Ok(Some(outcome)) => outcome,
            Ok(None) => Err(ReadError::Upstream {
                host: host.name.to_string(),
                status: None,
                message: "the shared read ended without an answer (it panicked)".into(),
            }),
            Err(_elapsed) => Err(limit.error(&host.name)),
        }
    }
}
