//! The connection to the shared state: one server or a Redis Cluster, and
//! the cluster's slots (which master serves a key, and so whose clock a
//! reply carries).

use crate::config::RedisConfig;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, Pipeline, RedisFuture, RedisResult, Value};
use std::time::Duration;

/// Slots of a Redis Cluster.
pub(super) const SLOTS: usize = 16_384;

/// Where the shared state lives.
pub(super) enum Target {
    Server(redis::Client),
    Cluster(ClusterClient),
}

/// A connection of either kind; every call goes through its
/// [`ConnectionLike`], which delegates.
#[derive(Clone)]
pub(crate) enum Conn {
    Server(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Server(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Server(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Server(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// The cluster slot of `key`, as Redis computes it: CRC16 (XMODEM) of the
/// key's hash tag — what is between its first `{` and the next `}`, if not
/// empty — or of the whole key, modulo 16,384.
pub(super) fn slot(key: &[u8]) -> usize {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let len = rest.iter().position(|&b| b == b'}')?;
            (len > 0).then(|| &rest[..len])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in hashed {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    usize::from(crc) % SLOTS
}

/// Answers the `TIME` of the node that runs it (sent to a chosen master by
/// a key of its slots; the key itself is never read).
pub(super) const NODE_TIME: &str = "return redis.call('TIME')";

/// `CLUSTER SLOTS`' ranges (first, last slot), grouped by the master serving
/// them.
pub(super) fn slot_ranges_by_master(reply: &Value) -> RedisResult<Vec<Vec<(u16, u16)>>> {
    let rows: Vec<Vec<Value>> = redis::from_redis_value(reply)?;
    let mut masters: std::collections::BTreeMap<(String, i64), Vec<(u16, u16)>> =
        Default::default();
    for row in rows {
        let [first, last, master, ..] = row.as_slice() else {
            return Err((ErrorKind::TypeError, "a CLUSTER SLOTS row").into());
        };
        let node: Vec<Value> = redis::from_redis_value(master)?;
        let [host, port, ..] = node.as_slice() else {
            return Err((ErrorKind::TypeError, "a CLUSTER SLOTS node").into());
        };
        let address = (
            redis::from_redis_value(host)?,
            redis::from_redis_value(port)?,
        );
        let range: (u16, u16) = (
            redis::from_redis_value(first)?,
            redis::from_redis_value(last)?,
        );
        if range.0 > range.1 || usize::from(range.1) >= SLOTS {
            return Err((ErrorKind::TypeError, "a CLUSTER SLOTS range").into());
        }
        masters.entry(address).or_default().push(range);
    }
    Ok(masters.into_values().collect())
}

/// The cluster client for `[redis] cluster_nodes` (nothing connected): its
/// retries and their pauses fit inside one call's `timeout_ms`.
pub(super) fn cluster_client(config: &RedisConfig) -> RedisResult<ClusterClient> {
    let timeout = Duration::from_millis(config.timeout_ms);
    ClusterClientBuilder::new(config.cluster_nodes.iter().map(String::as_str))
        .connection_timeout(timeout)
        .response_timeout(timeout)
        // A redirect or a reconnect is a retry: a few, paused 1 ms up to
        // 10 ms × 2^n, never past a quarter of the call timeout.
        .retries(3)
        .min_retry_wait(1)
        .max_retry_wait((config.timeout_ms / 4).max(2))
        .retry_wait_formula(10, 2)
        .build()
}

#[cfg(test)]
mod tests {
    use super::slot;

    #[test]
    fn slots_are_redis_cluster_slots() {
        // What CLUSTER KEYSLOT answers on redis-server 7.0.
        for (key, want) in [
            (&b"123456789"[..], 12_739),
            (b"foo", 12_182),
            (b"bar", 5_061),
            // A hash tag: only what is between the first `{` and the next `}`.
            (b"{user1000}.following", 3_443),
            (b"user1000", 3_443),
            (b"a{user1000}b{x}", 3_443),
            // An empty or unclosed tag: the whole key.
            (b"foo{}{bar}", 8_363),
            (b"foo{bar", 15_278),
        ] {
            assert_eq!(slot(key), want, "{}", String::from_utf8_lossy(key));
        }
    }
}
