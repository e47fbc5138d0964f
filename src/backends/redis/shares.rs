//! Per-host caps held by the whole fleet ([`RedisHostCaps`]), without a
//! round trip per read.
//!
//! A read takes its process's own slot first (the in-process
//! [`LocalHostCaps`]: no network; it bounds a replica even with Redis
//! down), then a slot of its replica's share of the host's cap. Each
//! replica holds a share of every capped host's slots on Redis (`claim`:
//! one hash per host, one field per replica, one script the only writer)
//! and hands it to its reads locally (`pool`: one per `[hosts]` table, and
//! its claimer): a claim per period or when a read finds no room, not a
//! round trip per read. A host without a `[hosts]` table is never on Redis:
//! its reads are counted in-process only.
//!
//! **Outage.** A read that cannot get a shared slot because Redis is down
//! (the breaker open, a claim unanswered) applies `failure_mode`: `"open"`
//! takes, beside its local slot, a slot of this replica's fallback share of
//! the host: half its cap (at least one) — a replica's share of the
//! smallest fleet, two — not the whole cap on every replica (counting
//! `fanout_shared_state_fallback_total`); `"closed"` refuses the read with
//! `UNAVAILABLE`. The fallback share is taken from the host's pool, not
//! beside it: the slots a claim granted before the outage that are still in
//! use count against it, and the fallback slots still in use when Redis is
//! back are reported by the next claim, so Redis holds them. Dropped, the
//! caps give back what they held at once rather than after `lease_ms`.

mod claim;
mod pool;

use super::backend::RedisBackend;
use crate::config::{FailureMode, HostConfig};
use crate::error::HostRefusal;
use crate::read::hosts::{HostLimiter, HostSlot, LocalHostCaps};
use futures::future::BoxFuture;
use pool::Pool;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Per-host caps held by the whole fleet: a local slot, then a slot of this
/// replica's share on Redis.
#[derive(Debug)]
pub struct RedisHostCaps {
    local: LocalHostCaps,
    backend: RedisBackend,
    /// One per `[hosts]` table.
    pools: HashMap<String, Arc<Pool>>,
}

impl RedisHostCaps {
    /// Caps for the `[hosts]` tables, shared on `backend` (a process's
    /// [`SharedLimits`](crate::backends::redis::SharedLimits) makes them on
    /// its backend, beside its other limits).
    pub fn new(hosts: BTreeMap<String, HostConfig>, backend: RedisBackend) -> Self {
        // Unique per replica and restart: no clock involved.
        let nonce =
            std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), std::process::id());
        let holder = format!("{}-{nonce:x}", std::process::id());
        let pools = hosts
            .iter()
            .map(|(host, config)| {
                let pool = Pool::new(host, config, &backend, &holder);
                (host.clone(), Arc::new(pool))
            })
            .collect();
        Self {
            local: LocalHostCaps::new(hosts),
            backend,
            pools,
        }
    }

    /// Slots this replica may use of `host`'s cap by the last claim that
    /// succeeded (cut to what was in use by a claim that failed), and slots
    /// in use by its reads — fallback slots too (for tests).
    #[doc(hidden)]
    pub fn held(&self, host: &str) -> (u32, u32) {
        self.pools.get(host).map_or((0, 0), |pool| pool.held())
    }
}

impl Drop for RedisHostCaps {
    fn drop(&mut self) {
        for pool in self.pools.values() {
            pool.stop();
        }
    }
}

impl HostLimiter for RedisHostCaps {
    fn acquire<'a>(
        &'a self,
        host: &'a str,
        time_left: Duration,
    ) -> BoxFuture<'a, Result<HostSlot, HostRefusal>> {
        Box::pin(async move {
            let started = Instant::now();
            let local = self.local.acquire(host, time_left).await?;
            let Some(pool) = self.pools.get(host) else {
                return Ok(local);
            };
            let (wait, last) = (pool.wait().min(time_left), started + time_left);
            match pool.slot(started + wait, last).await {
                Ok(Some(slot)) => Ok(local.join(HostSlot::new(slot))),
                Ok(None) => Err(HostRefusal::Saturated {
                    max_concurrent: pool.cap(),
                }),
                Err(err) => match self.backend.failure_mode() {
                    FailureMode::Open => {
                        crate::metrics::shared_state_fallback("host_caps");
                        // The breaker logs the outage once; this is per read.
                        tracing::debug!(error = %err, host, "shared host caps down; capping in-process");
                        match pool.fallback(started + wait).await {
                            Some(slot) => Ok(local.join(HostSlot::new(slot))),
                            None => Err(HostRefusal::Saturated {
                                max_concurrent: pool.fallback_share(),
                            }),
                        }
                    }
                    FailureMode::Closed => Err(HostRefusal::Unavailable {
                        message: err.message,
                    }),
                },
            }
        })
    }

    fn in_flight(&self, host: &str) -> u64 {
        self.local.in_flight(host)
    }
}

#[cfg(test)]
mod tests;
