//! Per-host concurrency caps: a process-wide bouncer at the one outbound choke point.
//!
//! Every upstream read holds a [`HostSlot`] for its host (`host:port`) while
//! it is in flight. The slots come from a [`HostLimiter`], owned by the
//! long-lived [`Engine`](crate::Engine), never by a request, so the cap bounds
//! the whole process's demand on a host.
//!
//! The in-process limiter, [`LocalHostCaps`], gives each host one [`HostCap`]:
//! for a configured host a `tokio::sync::Semaphore` of `max_concurrent`
//! permits (its reads in flight are the permits taken), for any other host a
//! count of its reads in flight:
//!
//! - a host with no `[hosts]` table is unlimited (its slot only counts);
//! - `max_concurrent = 0` refuses every read at once;
//! - at the cap a read waits up to `acquire_wait_ms`, never past the
//!   request's deadline, then fails with `HOST_SATURATED`.
//!
//! The engine resolves each host once ([`HostLimiter::local_cap`]), keeps
//! the answer in its host table, and then takes the host's slots from the
//! [`HostCap`] directly: synchronously when a permit is free, with no boxed
//! future, no lookup by name and no allocation per read.
//!
//! A slot is released when it is dropped — on success, error, timeout, or when
//! the inbound request is cancelled and its futures are dropped — so a slot
//! cannot leak. The trait is the seam a shared backend (Redis) plugs into.

mod table;

pub(crate) use table::{HostEntry, HostTable};

use crate::config::HostConfig;
use crate::error::FanoutError;
use dashmap::DashMap;
use futures::future::BoxFuture;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// The host slot a read holds: borrowed from the host's cap when one was
/// free at once, else whatever the limiter handed out.
pub(crate) enum HeldSlot<'a> {
    /// Taken synchronously from the cap the engine resolved.
    Borrowed { _permit: CapPermit<'a> },
    /// From [`HostCap::acquire`] or [`HostLimiter::acquire`].
    Owned { _slot: HostSlot },
}

/// Hands out per-host slots. Implementations must release a slot when the
/// returned [`HostSlot`] is dropped.
pub trait HostLimiter: Send + Sync + 'static {
    /// A slot for one read to `host`, waiting at most `time_left` (the
    /// request's remaining time) and at most the host's own wait.
    fn acquire<'a>(
        &'a self,
        host: &'a str,
        time_left: Duration,
    ) -> BoxFuture<'a, Result<HostSlot, FanoutError>>;

    /// Reads in flight to `host` through this limiter, right now.
    fn in_flight(&self, host: &str) -> u64;

    /// The in-process cap that alone decides `host`'s slots, if there is one.
    ///
    /// The engine asks once per host and keeps the answer. With `Some(cap)`
    /// it takes that host's slots from `cap` ([`HostCap::try_acquire`], then
    /// [`HostCap::acquire`] if it must wait) and never calls
    /// [`acquire`](Self::acquire) for it; a limiter must return `Some` only
    /// when that gives the same slots `acquire` would. With `None` (the
    /// default) every slot comes from `acquire`.
    fn local_cap(&self, host: &str) -> Option<Arc<HostCap>> {
        let _ = host;
        None
    }
}

/// Permission for one read to be in flight to one host; dropping it releases it.
#[must_use = "the slot is released as soon as it is dropped"]
pub struct HostSlot {
    held: Held,
}

enum Held {
    /// A slot of a [`HostCap`] (no allocation).
    Cap(CapSlot),
    /// Whatever another limiter holds (a permit, a lease, a guard).
    Other { _held: Box<dyn Send + Sync> },
    /// Two slots released together, first the first.
    Both { _held: Box<(HostSlot, HostSlot)> },
}

impl HostSlot {
    /// A slot that releases `held` (a permit, a lease, a guard) when dropped.
    pub fn new(held: impl Send + Sync + 'static) -> Self {
        Self {
            held: Held::Other {
                _held: Box::new(held),
            },
        }
    }

    /// One slot holding both parts (e.g. a local permit and a cluster lease).
    pub fn join(self, other: HostSlot) -> Self {
        Self {
            held: Held::Both {
                _held: Box::new((self, other)),
            },
        }
    }
}

impl std::fmt::Debug for HostSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.held {
            Held::Cap(slot) => write!(f, "HostSlot({})", slot.cap.host),
            _ => f.write_str("HostSlot"),
        }
    }
}

/// One host's in-process cap: `max_concurrent` permits, or none for a host
/// without a `[hosts]` table (unlimited: its slots are only counted).
pub struct HostCap {
    host: Box<str>,
    limit: Option<Limit>,
    /// Slots held, for an unlimited host (a capped one counts its permits).
    unlimited_in_flight: AtomicU64,
}

struct Limit {
    permits: Semaphore,
    config: HostConfig,
}

/// A held slot of a [`HostCap`] inside a [`HostSlot`] (owns the cap).
struct CapSlot {
    cap: Arc<HostCap>,
}

impl Drop for CapSlot {
    fn drop(&mut self) {
        self.cap.release();
    }
}

/// A held slot of a [`HostCap`], borrowing it: what the engine holds when a
/// slot was free at once (no reference count to touch).
#[must_use = "the slot is released as soon as it is dropped"]
pub(crate) struct CapPermit<'a> {
    cap: &'a HostCap,
}

impl Drop for CapPermit<'_> {
    fn drop(&mut self) {
        self.cap.release();
    }
}

impl HostCap {
    /// The cap for `host`: `config`'s, or unlimited without one.
    pub fn new(host: &str, config: Option<&HostConfig>) -> Self {
        let limit = config.map(|config| Limit {
            permits: Semaphore::new(Self::permits(config)),
            config: config.clone(),
        });
        Self {
            host: host.into(),
            limit,
            unlimited_in_flight: AtomicU64::new(0),
        }
    }

    fn permits(config: &HostConfig) -> usize {
        (config.max_concurrent as usize).min(Semaphore::MAX_PERMITS)
    }

    /// The host (`host:port`) this cap is for.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Reads holding a slot of this cap, right now.
    pub fn in_flight(&self) -> u64 {
        match &self.limit {
            Some(limit) => {
                let free = limit.permits.available_permits();
                Self::permits(&limit.config).saturating_sub(free) as u64
            }
            None => self.unlimited_in_flight.load(Relaxed),
        }
    }

    fn saturated(&self, config: &HostConfig) -> FanoutError {
        FanoutError::HostSaturated {
            host: self.host.to_string(),
            max_concurrent: config.max_concurrent,
        }
    }

    /// Takes a slot if one is free: `Ok(true)` taken, `Ok(false)` at the cap.
    fn take(&self) -> Result<bool, FanoutError> {
        let Some(limit) = &self.limit else {
            self.unlimited_in_flight.fetch_add(1, Relaxed);
            return Ok(true);
        };
        if limit.config.max_concurrent == 0 {
            return Err(self.saturated(&limit.config));
        }
        match limit.permits.try_acquire() {
            Ok(permit) => {
                permit.forget(); // given back by `release`
                Ok(true)
            }
            Err(_) => Ok(false),
        }
    }

    /// Gives back a slot taken by `take` or `acquire`.
    fn release(&self) {
        match &self.limit {
            Some(limit) => limit.permits.add_permits(1),
            None => {
                self.unlimited_in_flight.fetch_sub(1, Relaxed);
            }
        }
    }

    fn slot(self: &Arc<Self>) -> HostSlot {
        HostSlot {
            held: Held::Cap(CapSlot { cap: self.clone() }),
        }
    }

    /// A slot without waiting: `Ok(Some(slot))` when one is free (always, for
    /// an unlimited host), `Ok(None)` when the host is at its cap (then wait
    /// with [`acquire`](Self::acquire)), `HOST_SATURATED` when the cap is 0.
    pub fn try_acquire(self: &Arc<Self>) -> Result<Option<HostSlot>, FanoutError> {
        Ok(self.take()?.then(|| self.slot()))
    }

    /// [`try_acquire`](Self::try_acquire), for a caller that holds the cap
    /// for longer than the slot.
    pub(crate) fn try_borrow(&self) -> Result<Option<CapPermit<'_>>, FanoutError> {
        // Lazily: a `CapPermit` gives a slot back when dropped.
        Ok(self.take()?.then(|| CapPermit { cap: self }))
    }

    /// A slot, waiting at most the host's `acquire_wait` and at most
    /// `time_left`; `HOST_SATURATED` when none came in time.
    pub async fn acquire(self: &Arc<Self>, time_left: Duration) -> Result<HostSlot, FanoutError> {
        if let Some(slot) = self.try_acquire()? {
            return Ok(slot);
        }
        let Some(limit) = &self.limit else {
            // Not reached (an unlimited host is never full); kept balanced.
            self.unlimited_in_flight.fetch_add(1, Relaxed);
            return Ok(self.slot());
        };
        let wait = limit.config.acquire_wait().min(time_left);
        match tokio::time::timeout(wait, limit.permits.acquire()).await {
            Ok(Ok(permit)) => {
                permit.forget(); // given back by `release`
                Ok(self.slot())
            }
            _ => Err(self.saturated(&limit.config)),
        }
    }
}

/// The in-process, per-host caps.
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
    pub fn cap(&self, host: &str) -> Arc<HostCap> {
        if let Some(cap) = self.hosts.get(host) {
            return cap.clone();
        }
        self.hosts
            .entry(host.to_string())
            .or_insert_with(|| Arc::new(HostCap::new(host, self.configured.get(host))))
            .clone()
    }
}

impl HostLimiter for LocalHostCaps {
    fn acquire<'a>(
        &'a self,
        host: &'a str,
        time_left: Duration,
    ) -> BoxFuture<'a, Result<HostSlot, FanoutError>> {
        Box::pin(async move { self.cap(host).acquire(time_left).await })
    }

    fn in_flight(&self, host: &str) -> u64 {
        self.hosts.get(host).map_or(0, |cap| cap.in_flight())
    }

    fn local_cap(&self, host: &str) -> Option<Arc<HostCap>> {
        Some(self.cap(host))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_borrowed_permit_is_a_slot_like_any_other() {
        let config = HostConfig {
            max_concurrent: 1,
            acquire_wait_ms: 10,
        };
        let cap = Arc::new(HostCap::new("h:1", Some(&config)));
        let permit = cap.try_borrow().unwrap().expect("a free slot");
        assert!(cap.try_borrow().unwrap().is_none(), "at the cap");
        assert!(cap.try_acquire().unwrap().is_none(), "at the cap");
        assert_eq!(cap.in_flight(), 1, "a refusal gives nothing back");
        drop(permit);
        assert_eq!(cap.in_flight(), 0);
        let slot = cap.try_acquire().unwrap().expect("the slot came back");
        assert!(cap.try_borrow().unwrap().is_none(), "and only one");
        drop(slot);

        let unlimited = HostCap::new("u:1", None);
        let permits: Vec<_> = (0..3)
            .map(|_| unlimited.try_borrow().unwrap().expect("unlimited"))
            .collect();
        assert_eq!(unlimited.in_flight(), 3);
        drop(permits);
        assert_eq!(unlimited.in_flight(), 0);
    }
}
