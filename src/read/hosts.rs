//! Per-host concurrency caps: a process-wide bouncer at the one outbound choke point.
//!
//! Every upstream read holds a [`HostSlot`] for its host (`host:port`) while
//! it is in flight. The slots come from a [`HostLimiter`], owned by the
//! long-lived [`Engine`](crate::Engine), never by a request, so the cap bounds
//! the whole process's demand on a host.
//!
//! The in-process limiter, [`LocalHostCaps`], gives each configured host a
//! `tokio::sync::Semaphore` of `max_concurrent` permits (its reads in flight
//! are the permits taken) and counts the reads in flight of every other host:
//!
//! - a host with no `[hosts]` table is unlimited (its slot only counts);
//! - `max_concurrent = 0` refuses every read at once;
//! - at the cap a read waits up to `acquire_wait_ms`, never past the
//!   request's deadline, then fails with `HOST_SATURATED`.
//!
//! A slot is released when it is dropped — on success, error, timeout, or when
//! the inbound request is cancelled and its futures are dropped — so a slot
//! cannot leak; a wait for one that is dropped (a read that joined another
//! request's read instead, a cancelled request) leaves the semaphore's queue,
//! and a permit granted to it meanwhile goes back. The trait is the seam a
//! shared backend (Redis) plugs into.
//!
//! **Bounded by configuration, not by traffic.** The hosts a process reads
//! from are chosen by its upstreams (a redirect may name any host) and by its
//! resolvers (`permit` names), so nothing is kept per host merely because it
//! was read. The semaphores are made at start, one per `[hosts]` table; an
//! unlimited host is counted under its name only while it has a read in
//! flight. The engine's [`HostTable`] — what the read path needs besides the
//! slot: the host's metric handles and whether its table turns coalescing on
//! (`coalesce`) — is fixed when the engine is built: one entry per `[hosts]`
//! table and per known host
//! ([`EngineBuilder::known_host`](crate::EngineBuilder::known_host); the
//! gateway names its `--upstream`), each with its own `host` label, and one
//! entry every other host shares, labelled [`OTHER_HOSTS`] (`host="other"`).
//! Only the stored state and the labels are shared: a read still carries its
//! host's real name to the limiter, the transport and its errors
//! (`UPSTREAM_TIMEOUT {host}`).

use crate::config::HostConfig;
use crate::error::HostRefusal;
use crate::seed::random_state;
use dashmap::{DashMap, Entry};
use foldhash::fast::SeedableRandomState;
use futures::future::BoxFuture;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Hands out per-host slots. Implementations must release a slot when the
/// returned [`HostSlot`] is dropped, and when the future [`acquire`]
/// returned is dropped before it is ready, give up the caller's place in
/// any queue and any slot already set aside for it: a read that stops
/// waiting (it joined an identical read another request sent, or its
/// request was cancelled) drops that future, and a slot kept for it would
/// sit idle while other reads are refused.
///
/// [`acquire`]: HostLimiter::acquire
///
/// ```
/// use fanout_budget::{error::HostRefusal, read::{HostLimiter, HostSlot, LocalHostCaps}};
/// use futures::future::BoxFuture;
/// use std::time::Duration;
///
/// /// The local caps, and a log line per slot.
/// #[derive(Debug)]
/// struct Logged(LocalHostCaps);
///
/// impl HostLimiter for Logged {
///     fn acquire<'a>(&'a self, host: &'a str, time_left: Duration) -> BoxFuture<'a, Result<HostSlot, HostRefusal>> {
///         Box::pin(async move {
///             let slot = self.0.acquire(host, time_left).await?;
///             tracing::debug!(host, "slot taken");
///             Ok(slot)
///         })
///     }
///
///     fn in_flight(&self, host: &str) -> u64 {
///         self.0.in_flight(host)
///     }
/// }
/// ```
pub trait HostLimiter: Send + Sync + 'static {
    /// A slot for one read to `host`, waiting at most `time_left` (the
    /// request's remaining time) and at most the host's own wait.
    fn acquire<'a>(
        &'a self,
        host: &'a str,
        time_left: Duration,
    ) -> BoxFuture<'a, Result<HostSlot, HostRefusal>>;

    /// Reads in flight to `host` through this limiter, right now.
    fn in_flight(&self, host: &str) -> u64;

    /// The answer to [`acquire`](Self::acquire) when it needs no wait: a
    /// slot free now, or a refusal now; `None` when the caller must wait in
    /// `acquire` (the default: always). The read path asks this first, so a
    /// read that gets its slot at once does not box a future for it.
    fn try_acquire(&self, host: &str) -> Option<Result<HostSlot, HostRefusal>> {
        let _ = host;
        None
    }
}

/// Permission for one read to be in flight to one host; dropping it releases it.
///
/// ```
/// use fanout_budget::read::HostSlot;
/// use std::sync::Arc;
///
/// let semaphore = Arc::new(tokio::sync::Semaphore::new(1));
/// let slot = HostSlot::new(semaphore.clone().try_acquire_owned().unwrap());
/// assert_eq!(semaphore.available_permits(), 0);
/// drop(slot);
/// assert_eq!(semaphore.available_permits(), 1);
/// ```
#[must_use = "the slot is released as soon as it is dropped"]
pub struct HostSlot {
    _held: Held,
}

/// What a slot releases when dropped. The in-process caps' own slots are
/// kept as they are; anything else is boxed.
#[allow(dead_code)] // Each is held only to be dropped.
enum Held {
    Permit(OwnedSemaphorePermit),
    Counted(Counted),
    Other(Box<dyn Send + Sync>),
}

impl HostSlot {
    /// A slot that releases `held` (a permit, a lease, a guard) when dropped.
    pub fn new(held: impl Send + Sync + 'static) -> Self {
        Self {
            _held: Held::Other(Box::new(held)),
        }
    }

    fn permit(permit: OwnedSemaphorePermit) -> Self {
        Self {
            _held: Held::Permit(permit),
        }
    }

    /// One slot holding both (e.g. a local permit and a cluster lease),
    /// released together, first this one.
    pub fn join(self, other: HostSlot) -> Self {
        Self::new((self, other))
    }
}

impl std::fmt::Debug for HostSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostSlot")
    }
}

/// One configured host's in-process cap: `max_concurrent` permits.
#[derive(Debug)]
struct HostCap {
    permits: Arc<Semaphore>,
    config: HostConfig,
}

impl HostCap {
    fn new(config: &HostConfig) -> Self {
        let permits = (config.max_concurrent as usize).min(Semaphore::MAX_PERMITS);
        Self {
            permits: Arc::new(Semaphore::new(permits)),
            config: config.clone(),
        }
    }

    fn in_flight(&self) -> u64 {
        u64::from(self.config.max_concurrent)
            .saturating_sub(self.permits.available_permits() as u64)
    }

    fn saturated(&self) -> HostRefusal {
        HostRefusal::Saturated {
            max_concurrent: self.config.max_concurrent,
        }
    }

    /// A slot free now, or the refusal of a zero cap; `None`: at the cap.
    fn try_acquire(&self) -> Option<Result<HostSlot, HostRefusal>> {
        if self.config.max_concurrent == 0 {
            return Some(Err(self.saturated()));
        }
        let permit = self.permits.clone().try_acquire_owned().ok()?;
        Some(Ok(HostSlot::permit(permit)))
    }

    /// A slot, waiting at most the host's `acquire_wait` and at most
    /// `time_left`.
    async fn acquire(&self, time_left: Duration) -> Result<HostSlot, HostRefusal> {
        if let Some(now) = self.try_acquire() {
            return now;
        }
        let wait = self.config.acquire_wait().min(time_left);
        match tokio::time::timeout(wait, self.permits.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(HostSlot::permit(permit)),
            _ => Err(self.saturated()),
        }
    }
}

/// Reads in flight to the hosts without a `[hosts]` table, by host: an entry
/// exists only while its host has a read in flight.
type Counts = DashMap<Arc<str>, u64, SeedableRandomState>;

/// A slot of a host without a table: counted while held; the host's entry
/// leaves the counts with its last slot.
struct Counted {
    counts: Arc<Counts>,
    host: Arc<str>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        if let Entry::Occupied(mut count) = self.counts.entry(self.host.clone()) {
            *count.get_mut() -= 1;
            if *count.get() == 0 {
                count.remove();
            }
        }
    }
}

/// The in-process, per-host caps.
///
/// A host with a `[hosts]` table has its semaphore, made once at start.
/// Every other host is unlimited: its reads in flight are counted under its
/// name while it has any, and nothing of it is kept after its last one ends,
/// so a stream of distinct hosts (redirect targets, permit names) keeps no
/// state beyond the reads in flight.
///
/// ```
/// use fanout_budget::config::HostConfig;
/// use fanout_budget::read::{HostLimiter, LocalHostCaps};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let one = HostConfig::default().max_concurrent(1).acquire_wait_ms(10);
/// let caps = LocalHostCaps::new([("registry:5000".to_string(), one)].into());
/// let slot = caps.acquire("registry:5000", Duration::from_secs(1)).await.unwrap();
/// assert!(caps.acquire("registry:5000", Duration::from_secs(1)).await.is_err(), "at the cap");
/// drop(slot);
/// assert_eq!(caps.in_flight("registry:5000"), 0);
/// # }
/// ```
#[derive(Debug)]
pub struct LocalHostCaps {
    /// One per `[hosts]` table, fixed at start.
    capped: HashMap<String, HostCap, SeedableRandomState>,
    /// The other hosts' reads in flight.
    counts: Arc<Counts>,
}

impl LocalHostCaps {
    /// Caps for the `[hosts]` tables; every other host is unlimited.
    pub fn new(hosts: BTreeMap<String, HostConfig>) -> Self {
        let mut capped = HashMap::with_capacity_and_hasher(hosts.len(), random_state());
        capped.extend(
            hosts
                .iter()
                .map(|(host, config)| (host.clone(), HostCap::new(config))),
        );
        Self {
            capped,
            counts: Arc::new(DashMap::with_hasher(random_state())),
        }
    }

    /// A counted slot of `host`, which has no table.
    fn count(&self, host: &str) -> HostSlot {
        let host = match self.counts.get_mut(host) {
            Some(mut count) => {
                *count += 1;
                count.key().clone()
            }
            None => {
                let mut count = self.counts.entry(host.into()).or_insert(0);
                *count += 1;
                count.key().clone()
            }
        };
        HostSlot {
            _held: Held::Counted(Counted {
                counts: self.counts.clone(),
                host,
            }),
        }
    }
}

impl HostLimiter for LocalHostCaps {
    fn acquire<'a>(
        &'a self,
        host: &'a str,
        time_left: Duration,
    ) -> BoxFuture<'a, Result<HostSlot, HostRefusal>> {
        Box::pin(async move {
            match self.capped.get(host) {
                Some(cap) => cap.acquire(time_left).await,
                None => Ok(self.count(host)),
            }
        })
    }

    fn in_flight(&self, host: &str) -> u64 {
        match self.capped.get(host) {
            Some(cap) => cap.in_flight(),
            None => self.counts.get(host).map_or(0, |count| *count),
        }
    }

    /// Every answer but a wait at a host's cap comes at once.
    fn try_acquire(&self, host: &str) -> Option<Result<HostSlot, HostRefusal>> {
        match self.capped.get(host) {
            Some(cap) => cap.try_acquire(),
            None => Some(Ok(self.count(host))),
        }
    }
}

mod table;
#[cfg(test)]
mod tests;

pub use table::{host_name, OTHER_HOSTS};
pub(crate) use table::{HostEntry, HostLabel, HostTable};
