//! What an inbound request's `Fanout-Budget` says, and what it does to the
//! request: it lowers `max_reads` and the deadline, never raises them (so
//! it is believed from anyone, with or without the internal token), and
//! past `budget.max_hops` it refuses the request before any read.

use super::header::{self, Members};
use crate::error::OperationError;
use std::time::Duration;

/// An inbound request's `Fanout-Budget`, as far as it was well-formed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Received {
    members: Members,
    /// `budget.max_hops` of the engine that received it.
    max_hops: u32,
}

impl Received {
    /// The header of an inbound request with these `headers`, received by
    /// an engine whose `budget.max_hops` is `max_hops`; `None` without one.
    pub(crate) fn from_headers(headers: &http::HeaderMap, max_hops: u32) -> Option<Self> {
        let members = header::read(headers, &header::BUDGET)?;
        Some(Self { members, max_hops })
    }

    /// The request's refusal, before any read, when it has passed through
    /// more services than `budget.max_hops` allows.
    pub(crate) fn too_many_hops(&self) -> Option<OperationError> {
        let (hops, max) = self.past_max_hops()?;
        Some(OperationError::TooManyHops { hops, max })
    }

    /// `(hops, max_hops)` when the request has passed through more
    /// services than `budget.max_hops` allows: every read of it is refused
    /// too, whichever way it is asked for.
    pub(crate) fn past_max_hops(&self) -> Option<(u64, u32)> {
        let (hops, max) = (self.hops(), self.max_hops);
        (hops > u64::from(max)).then_some((hops, max))
    }

    /// `max_reads` (`limit`) as the header lowers it.
    pub(crate) fn limit(&self, limit: u64) -> u64 {
        self.members.reads.map_or(limit, |reads| reads.min(limit))
    }

    /// The deadline (`deadline` from now) as the header lowers it.
    pub(crate) fn deadline(&self, deadline: Duration) -> Duration {
        let given = self.members.deadline_ms.map(Duration::from_millis);
        given.map_or(deadline, |given| given.min(deadline))
    }

    /// The services the request passed through on its way here.
    pub(crate) fn hops(&self) -> u64 {
        self.members.hops.unwrap_or(0)
    }

    /// The members as received (a span records them).
    pub(crate) fn members(&self) -> Members {
        self.members
    }
}

/// The hop count a read of a request that received `received` sends on:
/// one more than it received (1 from the edge, which received none).
pub(crate) fn hops_on(received: Option<&Received>) -> u64 {
    received.map_or(0, Received::hops).saturating_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(value: &str) -> Received {
        let mut headers = http::HeaderMap::new();
        headers.insert(header::BUDGET, value.parse().unwrap());
        Received::from_headers(&headers, 2).unwrap()
    }

    #[test]
    fn it_lowers_and_never_raises() {
        let r = received("reads=5, deadline-ms=100, hops=2");
        assert_eq!((r.limit(100), r.limit(3)), (5, 3));
        let long = Duration::from_secs(30);
        assert_eq!(r.deadline(long), Duration::from_millis(100));
        assert_eq!(
            r.deadline(Duration::from_millis(7)),
            Duration::from_millis(7)
        );
        assert_eq!((r.hops(), hops_on(Some(&r)), hops_on(None)), (2, 3, 1));
        assert_eq!(r.too_many_hops(), None, "2 hops of 2 allowed");
        let past = received("hops=3");
        let refusal = Some(OperationError::TooManyHops { hops: 3, max: 2 });
        assert_eq!(past.too_many_hops(), refusal);
        let none = received("colour=blue");
        assert_eq!(
            (none.limit(100), none.deadline(long), none.hops()),
            (100, long, 0)
        );
    }
}
