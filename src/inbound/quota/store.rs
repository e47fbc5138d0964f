//! The seam of the quota's stores: which quota a caller draws on, what a
//! store answers, and the trait a store shared by the fleet implements.

use crate::error::Unavailable;
use crate::inbound::identity::Caller;
use futures::future::BoxFuture;
use std::net::IpAddr;
use std::time::Duration;

/// Which quota a caller draws on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuotaClass {
    /// Callers without the internal token (`quota.reads`).
    Public,
    /// Callers with the internal token (`quota.internal_reads`).
    Internal,
}

impl QuotaClass {
    /// The class's name: its metrics label and its `RateLimit` policy name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Public => "reads",
            Self::Internal => "internal-reads",
        }
    }

    pub(crate) fn index(self) -> usize {
        match self {
            Self::Public => 0,
            Self::Internal => 1,
        }
    }

    pub(crate) fn of(caller: Caller) -> Self {
        match caller {
            Caller::Public => Self::Public,
            Caller::Internal => Self::Internal,
        }
    }
}

/// A store's answer to a reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Reserved; `remaining` reads would still fit now, and the quota is
    /// full again in `full_in` (if nothing is given back).
    Reserved {
        /// Reads that would still fit now.
        remaining: u64,
        /// Time until the quota is full again.
        full_in: Duration,
    },
    /// Refused, nothing taken; the reservation fits in `retry_after`.
    Refused {
        /// Reads that fit now (fewer than asked).
        remaining: u64,
        /// Time until the reservation would fit.
        retry_after: Duration,
    },
}

impl Verdict {
    /// Granted by a class without a quota.
    pub(crate) fn unlimited() -> Self {
        Self::Reserved {
            remaining: u64::MAX,
            full_in: Duration::ZERO,
        }
    }
}

/// Where the clients' quotas are kept: in process ([`LocalQuotas`](super::LocalQuotas)) or
/// shared by the fleet (Redis).
///
/// `reserve` must be cancel-safe: a reservation whose future is dropped
/// takes nothing from the client (or gives what it took back).
pub trait QuotaStore: Send + Sync + 'static {
    /// Reserves `reads` (at most the class's burst) for `client` of `class`.
    /// `Err`: the store is unreachable (the caller applies `failure_mode`).
    fn reserve(
        &self,
        class: QuotaClass,
        client: IpAddr,
        reads: u64,
    ) -> BoxFuture<'_, Result<Verdict, Unavailable>>;

    /// Gives back `reads` that `client` reserved and did not spend.
    fn refund(&self, class: QuotaClass, client: IpAddr, reads: u64);

    /// Reserves `reads` more for `client` at once, without waiting (what a
    /// request asks when it needs one read more than it reserved: a
    /// redirect hop, a token fetch its estimate did not count); `None`: not
    /// possible now (a shared store serves it from what it took ahead, if
    /// anything).
    fn reserve_at_once(&self, class: QuotaClass, client: IpAddr, reads: u64) -> Option<Verdict> {
        let _ = (class, client, reads);
        None
    }

    /// What this store last heard of `client`'s bucket: the time from now
    /// until it is full again, as the last answer said (zero: full by now);
    /// `None`: never heard of it. A fallback starts from it, never from a
    /// full bucket for a client known as spent.
    fn last_known(&self, class: QuotaClass, client: IpAddr) -> Option<Duration> {
        let _ = (class, client);
        None
    }
}
