//! `[redis]`: shared state across replicas, its keys and their rules.

use super::error::{at_least_one, ConfigError};
use serde::Deserialize;
use std::time::Duration;

section! {
    /// `[redis]`
    #[derive(Clone, Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    pub struct RedisConfig {
        /// `redis://host:port` of one server; empty: in-process limits only
        /// (unless `cluster_nodes` is set).
        pub url: String = String::new() => into,
        /// A Redis Cluster instead of one server: some of its nodes
        /// (`redis://host:port` each, as `redis::cluster::ClusterClient` takes
        /// them), from which the client learns the rest; empty: no cluster.
        /// Exclusive with `url`.
        pub cluster_nodes: Vec<String> = Vec::new() => list,
        /// What to do while Redis is unreachable.
        pub failure_mode: FailureMode = FailureMode::Open,
        /// Prefix of every key, so several deployments can share one Redis.
        pub key_prefix: String = "fanout".into() => into,
        /// Timeout of one Redis call, in milliseconds (then `failure_mode` applies).
        pub timeout_ms: u64 = 100,
        /// How long Redis keeps what a replica holds of a host's cap (and its
        /// demand) after the replica last reported, in milliseconds: a crashed
        /// replica's slots free up after it.
        pub lease_ms: u64 = 5000,
        /// Slots of a host's cap a replica may hold beyond its reads in flight,
        /// so the next reads start without a round trip; also the most
        /// admissions of one client a replica takes from the shared per-IP limit
        /// at once. 0: no spare slots, one admission a call.
        pub lease_block: u32 = 8,
        /// While a replica uses a host, it reports its demand to Redis this
        /// often, in milliseconds, and gives back what it no longer needs: how
        /// long another replica may wait for slots this one holds idle. Less
        /// than a third of `lease_ms`.
        pub refresh_ms: u64 = 50,
        /// After a failed Redis call, calls skip Redis (and `failure_mode`
        /// applies at once) for this long, in milliseconds, while recovery is
        /// probed in the background.
        pub backoff_ms: u64 = 1000,
    }
}

impl RedisConfig {
    /// Whether shared state is on Redis: `url` or `cluster_nodes` is set.
    pub fn is_enabled(&self) -> bool {
        !self.url.is_empty() || !self.cluster_nodes.is_empty()
    }

    /// Durations of at least 1, then [`check_redis`]'s rules.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        // 0 would time out every call, renew and probe in a busy loop.
        at_least_one(
            "redis",
            [
                ("timeout_ms", self.timeout_ms),
                ("lease_ms", self.lease_ms),
                ("refresh_ms", self.refresh_ms),
                ("backoff_ms", self.backoff_ms),
            ],
        )?;
        check_redis(self).map_err(ConfigError::keyed)
    }
}

/// `[redis] failure_mode`
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum FailureMode {
    /// Fall back to the in-process limits.
    #[default]
    Open,
    /// Answer 503 `UNAVAILABLE`.
    Closed,
}

/// How long a share of a host's cap on Redis may be used after the claim
/// that granted it was sent: two thirds of `lease_ms`, so Redis still holds
/// it then. `timeout_ms` is less ([`check_redis`]): a claim answered later
/// would arrive void.
pub(crate) fn share_use(redis: &RedisConfig) -> Duration {
    Duration::from_millis(redis.lease_ms) / 3 * 2
}

/// Checks `[redis]`: its durations' rules, `url` and `cluster_nodes` (the
/// message names the key).
fn check_redis(redis: &RedisConfig) -> Result<(), String> {
    let scheme = |key: &str, url: &str| {
        if url.starts_with("redis://") || url.starts_with("rediss://") {
            Ok(())
        } else {
            Err(format!(
                "{key}: \"{url}\" must start with redis:// or rediss://"
            ))
        }
    };
    let url = &redis.url;
    let nodes = &redis.cluster_nodes;
    // A claim's answer slower than its share's use would arrive void.
    if Duration::from_millis(redis.timeout_ms) >= share_use(redis) {
        return Err(format!(
            "redis.timeout_ms must be less than two thirds of redis.lease_ms ({} ms)",
            redis.lease_ms
        ));
    }
    if redis.refresh_ms.saturating_mul(3) >= redis.lease_ms {
        return Err(format!(
            "redis.refresh_ms must be less than a third of redis.lease_ms ({} ms)",
            redis.lease_ms
        ));
    }
    if !url.is_empty() && !nodes.is_empty() {
        return Err(
            "redis.cluster_nodes: set redis.url (one server) or redis.cluster_nodes \
                    (a cluster's nodes), not both"
                .into(),
        );
    }
    if !url.is_empty() {
        scheme("redis.url", url)?;
        #[cfg(feature = "redis")]
        if let Err(e) = redis::Client::open(url.as_str()) {
            return Err(format!("redis.url: \"{url}\": {e}"));
        }
    }
    for node in nodes {
        scheme("redis.cluster_nodes", node)?;
        #[cfg(feature = "redis")]
        match redis::IntoConnectionInfo::into_connection_info(node.as_str()) {
            Err(e) => return Err(format!("redis.cluster_nodes: \"{node}\": {e}")),
            Ok(info) if info.redis.db != 0 => {
                return Err(format!(
                    "redis.cluster_nodes: \"{node}\": a cluster has database 0 only"
                ))
            }
            Ok(_) => {}
        }
    }
    #[cfg(feature = "redis")]
    if !nodes.is_empty() {
        // Same credentials, protocol and TLS on every node (nothing connects).
        if let Err(e) = redis::cluster::ClusterClient::new(nodes.iter().map(String::as_str)) {
            return Err(format!("redis.cluster_nodes: {e}"));
        }
    }
    Ok(())
}
