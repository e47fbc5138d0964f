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
//! The engine also keeps, per host, what the read path needs besides the
//! slot: the `host:port` name the `[hosts]` tables use, whether its table
//! turns coalescing on (`coalesce`), and the host's metric handles
//! ([`HostTable`], built on a host's first read).

use crate::config::HostConfig;
use crate::error::HostRefusal;
use crate::metrics::HostMetrics;
use dashmap::DashMap;
use futures::future::BoxFuture;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

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
/// use fanout_budget::{HostLimiter, HostRefusal, HostSlot, LocalHostCaps};
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
}

/// Permission for one read to be in flight to one host; dropping it releases it.
///
/// ```
/// use fanout_budget::HostSlot;
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
    _held: Box<dyn Send + Sync>,
}

impl HostSlot {
    /// A slot that releases `held` (a permit, a lease, a guard) when dropped.
    pub fn new(held: impl Send + Sync + 'static) -> Self {
        Self {
            _held: Box::new(held),
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

/// One host's in-process cap: `max_concurrent` permits, or none for a host
/// without a `[hosts]` table (unlimited: its slots are only counted).
#[derive(Debug)]
struct HostCap {
    limit: Option<(Arc<Semaphore>, HostConfig)>,
    /// Slots held, for an unlimited host (a capped one counts its permits).
    unlimited_in_flight: Arc<AtomicU64>,
}

/// A slot of an unlimited host: counted while held.
struct Counted(Arc<AtomicU64>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

impl HostCap {
    fn new(config: Option<&HostConfig>) -> Self {
        let limit = config.map(|config| {
            let permits = (config.max_concurrent as usize).min(Semaphore::MAX_PERMITS);
            (Arc::new(Semaphore::new(permits)), config.clone())
        });
        Self {
            limit,
            unlimited_in_flight: Arc::default(),
        }
    }

    fn in_flight(&self) -> u64 {
        match &self.limit {
            Some((permits, config)) => {
                u64::from(config.max_concurrent).saturating_sub(permits.available_permits() as u64)
            }
            None => self.unlimited_in_flight.load(Relaxed),
        }
    }

    /// A slot, waiting at most the host's `acquire_wait` and at most
    /// `time_left`.
    async fn acquire(&self, time_left: Duration) -> Result<HostSlot, HostRefusal> {
        let Some((permits, config)) = &self.limit else {
            self.unlimited_in_flight.fetch_add(1, Relaxed);
            return Ok(HostSlot::new(Counted(self.unlimited_in_flight.clone())));
        };
        let saturated = || HostRefusal::Saturated {
            max_concurrent: config.max_concurrent,
        };
        if config.max_concurrent == 0 {
            return Err(saturated());
        }
        if let Ok(permit) = permits.clone().try_acquire_owned() {
            return Ok(HostSlot::new(permit));
        }
        let wait = config.acquire_wait().min(time_left);
        match tokio::time::timeout(wait, permits.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(HostSlot::new(permit)),
            _ => Err(saturated()),
        }
    }
}

/// The in-process, per-host caps.
///
/// ```
/// use fanout_budget::config::HostConfig;
/// use fanout_budget::{HostLimiter, LocalHostCaps};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let one = HostConfig { max_concurrent: 1, acquire_wait_ms: 10, ..Default::default() };
/// let caps = LocalHostCaps::new([("registry:5000".to_string(), one)].into());
/// let slot = caps.acquire("registry:5000", Duration::from_secs(1)).await.unwrap();
/// assert!(caps.acquire("registry:5000", Duration::from_secs(1)).await.is_err(), "at the cap");
/// drop(slot);
/// assert_eq!(caps.in_flight("registry:5000"), 0);
/// # }
/// ```
#[derive(Debug)]
pub struct LocalHostCaps {
    configured: BTreeMap<String, HostConfig>,
    hosts: DashMap<String, Arc<HostCap>>,
}

impl LocalHostCaps {
    /// Caps for the `[hosts]` tables; every other host is unlimited.
    pub fn new(hosts: BTreeMap<String, HostConfig>) -> Self {
        Self {
            configured: hosts,
            hosts: DashMap::new(),
        }
    }

    /// The cap for `host` (created on first use).
    fn cap(&self, host: &str) -> Arc<HostCap> {
        if let Some(cap) = self.hosts.get(host) {
            return cap.clone();
        }
        self.hosts
            .entry(host.to_string())
            .or_insert_with(|| Arc::new(HostCap::new(self.configured.get(host))))
            .clone()
    }
}

impl HostLimiter for LocalHostCaps {
    fn acquire<'a>(
        &'a self,
        host: &'a str,
        time_left: Duration,
    ) -> BoxFuture<'a, Result<HostSlot, HostRefusal>> {
        Box::pin(async move { self.cap(host).acquire(time_left).await })
    }

    fn in_flight(&self, host: &str) -> u64 {
        self.hosts.get(host).map_or(0, |cap| cap.in_flight())
    }
}

/// What the read path keeps about one host, built on its first read.
pub(crate) struct HostEntry {
    /// `host:port` (as the URL names it; just `host` without a known port).
    pub(crate) name: Box<str>,
    /// The host's metric handles.
    pub(crate) metrics: HostMetrics,
    /// Its `[hosts]` table says `coalesce = true`.
    pub(crate) coalesce: bool,
}

/// The hosts one engine has read from, by `host:port`.
#[derive(Default)]
pub(crate) struct HostTable {
    entries: DashMap<Box<str>, Arc<HostEntry>>,
    /// The hosts whose `[hosts]` table turns coalescing on.
    coalescing: BTreeSet<Box<str>>,
}

impl HostTable {
    /// The table for the `[hosts]` tables `hosts`.
    pub(crate) fn new(hosts: &BTreeMap<String, HostConfig>) -> Self {
        let coalescing = hosts.iter().filter(|(_, config)| config.coalesce);
        Self {
            entries: DashMap::new(),
            coalescing: coalescing.map(|(name, _)| name.as_str().into()).collect(),
        }
    }

    /// The entry for `url`'s host, built on first use.
    pub(crate) fn resolve(&self, url: &reqwest::Url) -> Arc<HostEntry> {
        self.resolve_name(&host_name(url))
    }

    /// The entry for host `name` (`host:port`), built on first use.
    pub(crate) fn resolve_name(&self, name: &str) -> Arc<HostEntry> {
        if let Some(entry) = self.entries.get(name) {
            return entry.clone();
        }
        let name: Box<str> = name.into();
        self.entries
            .entry(name.clone())
            .or_insert_with(|| {
                Arc::new(HostEntry {
                    metrics: HostMetrics::new(&name),
                    coalesce: self.coalescing.contains(&name),
                    name,
                })
            })
            .clone()
    }
}

/// `host:port`, or `host` without a known port (what error messages and the
/// `[hosts]` tables call a host).
pub(crate) fn host_name(url: &reqwest::Url) -> String {
    let host = url.host_str().unwrap_or("");
    match url.port_or_known_default() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_entry_per_host_and_port_named_as_the_hosts_tables_name_it() {
        let table = HostTable::default();
        let url = |s: &str| reqwest::Url::parse(s).unwrap();
        let a = table.resolve(&url("http://reg.example:5000/v2/a"));
        let b = table.resolve(&url("http://reg.example:5000/v2/b?x=1"));
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(&*a.name, "reg.example:5000");
        // The scheme's default port is the port; an explicit default is the same host.
        let c = table.resolve(&url("https://reg.example/v2/"));
        let d = table.resolve(&url("http://reg.example:443/v2/"));
        assert_eq!(&*c.name, "reg.example:443");
        assert!(Arc::ptr_eq(&c, &d));
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(
            &*table.resolve(&url("http://[::1]:8080/")).name,
            "[::1]:8080"
        );
    }

    #[tokio::test]
    async fn a_slot_comes_back_on_drop_and_a_zero_cap_refuses_at_once() {
        let one = HostConfig {
            max_concurrent: 1,
            acquire_wait_ms: 10,
            ..Default::default()
        };
        let zero = HostConfig {
            max_concurrent: 0,
            acquire_wait_ms: 10_000,
            ..Default::default()
        };
        let caps = LocalHostCaps::new([("a:1".to_string(), one), ("z:1".to_string(), zero)].into());
        let left = Duration::from_secs(5);
        let slot = caps.acquire("a:1", left).await.unwrap();
        assert_eq!(caps.in_flight("a:1"), 1);
        let refused = caps.acquire("a:1", left).await.unwrap_err();
        assert_eq!(refused, HostRefusal::Saturated { max_concurrent: 1 });
        assert_eq!(caps.in_flight("a:1"), 1, "a refusal gives nothing back");
        drop(slot);
        assert_eq!(caps.in_flight("a:1"), 0);
        let started = tokio::time::Instant::now();
        assert!(caps.acquire("z:1", left).await.is_err());
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no wait at cap 0"
        );
        let unlimited: Vec<_> =
            futures::future::join_all((0..3).map(|_| caps.acquire("u:1", left))).await;
        assert_eq!(caps.in_flight("u:1"), 3);
        drop(unlimited);
        assert_eq!(caps.in_flight("u:1"), 0);
    }
}
