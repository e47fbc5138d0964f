//! Per-host concurrency caps: a process-wide bouncer at the one outbound choke point.
//!
//! Every upstream read holds a [`HostSlot`] for its host (`host:port`) while
//! it is in flight. The slots come from a [`HostLimiter`], owned by the
//! long-lived [`Engine`](crate::Engine), never by a request, so the cap bounds
//! the whole process's demand on a host.
//!
//! The in-process limiter, [`LocalHostCaps`], gives each configured host a
//! `tokio::sync::Semaphore` of `max_concurrent` permits:
//!
//! - a host with no `[hosts]` table is unlimited (its slot only counts);
//! - `max_concurrent = 0` refuses every read at once;
//! - at the cap a read waits up to `acquire_wait_ms`, never past the
//!   request's deadline, then fails with `HOST_SATURATED`.
//!
//! A slot is released when it is dropped — on success, error, timeout, or when
//! the inbound request is cancelled and its futures are dropped — so a slot
//! cannot leak. The trait is the seam a shared backend (Redis) plugs into.

use crate::config::HostConfig;
use crate::error::FanoutError;
use dashmap::DashMap;
use futures::future::BoxFuture;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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
}

/// Permission for one read to be in flight to one host; dropping it releases it.
#[must_use = "the slot is released as soon as it is dropped"]
pub struct HostSlot {
    _held: Vec<Box<dyn Send + Sync>>,
}

impl HostSlot {
    /// A slot that releases `held` (a permit, a lease, a guard) when dropped.
    pub fn new(held: impl Send + Sync + 'static) -> Self {
        Self {
            _held: vec![Box::new(held)],
        }
    }

    /// One slot holding both parts (e.g. a local permit and a cluster lease).
    pub fn join(mut self, other: HostSlot) -> Self {
        self._held.extend(other._held);
        self
    }
}

impl std::fmt::Debug for HostSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostSlot")
    }
}

/// The in-process, per-host caps.
pub struct LocalHostCaps {
    configured: BTreeMap<String, HostConfig>,
    hosts: DashMap<String, Arc<HostState>>,
}

struct HostState {
    cap: Option<(Arc<Semaphore>, HostConfig)>,
    in_flight: Arc<AtomicI64>,
}

/// Decrements a host's in-flight count when dropped.
struct InFlight(Arc<AtomicI64>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

impl LocalHostCaps {
    /// Caps for the `[hosts]` tables; every other host is unlimited.
    pub fn new(hosts: BTreeMap<String, HostConfig>) -> Self {
        Self {
            configured: hosts,
            hosts: DashMap::new(),
        }
    }

    fn state(&self, host: &str) -> Arc<HostState> {
        if let Some(state) = self.hosts.get(host) {
            return state.clone();
        }
        self.hosts
            .entry(host.to_string())
            .or_insert_with(|| {
                let cap = self.configured.get(host).map(|config| {
                    let permits = (config.max_concurrent as usize).min(Semaphore::MAX_PERMITS);
                    (Arc::new(Semaphore::new(permits)), config.clone())
                });
                Arc::new(HostState {
                    cap,
                    in_flight: Arc::default(),
                })
            })
            .clone()
    }
}

impl HostLimiter for LocalHostCaps {
    fn acquire<'a>(
        &'a self,
        host: &'a str,
        time_left: Duration,
    ) -> BoxFuture<'a, Result<HostSlot, FanoutError>> {
        Box::pin(async move {
            let state = self.state(host);
            let permit: Option<OwnedSemaphorePermit> = match &state.cap {
                None => None,
                Some((semaphore, config)) => {
                    let saturated = || FanoutError::HostSaturated {
                        host: host.to_string(),
                        max_concurrent: config.max_concurrent,
                    };
                    if config.max_concurrent == 0 {
                        return Err(saturated());
                    }
                    match semaphore.clone().try_acquire_owned() {
                        Ok(permit) => Some(permit),
                        Err(_) => {
                            let wait = config.acquire_wait().min(time_left);
                            match tokio::time::timeout(wait, semaphore.clone().acquire_owned())
                                .await
                            {
                                Ok(Ok(permit)) => Some(permit),
                                _ => return Err(saturated()),
                            }
                        }
                    }
                }
            };
            state.in_flight.fetch_add(1, Relaxed);
            Ok(HostSlot::new((permit, InFlight(state.in_flight.clone()))))
        })
    }

    fn in_flight(&self, host: &str) -> u64 {
        self.hosts
            .get(host)
            .map_or(0, |s| s.in_flight.load(Relaxed).max(0) as u64)
    }
}
