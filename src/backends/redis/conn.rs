//! The connection to the shared state: one server or a Redis Cluster, and
//! the cluster's slots (which master serves a key, and so whose clock a
//! reply carries).

use crate::config::RedisConfig;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo,
    Pipeline, RedisFuture, RedisResult, Value,
};
use std::time::Duration;

/// Slots of a Redis Cluster.
pub(super) const SLOTS: usize = 16_384;

/// Where the shared state lives.
pub(super) enum Target {
    Server(redis::Client),
    Cluster(Cluster),
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

/// A Redis Cluster, by `[redis] cluster_nodes` (nothing connected).
pub(super) struct Cluster {
    seeds: Vec<ConnectionInfo>,
    timeout: Duration,
}

impl Cluster {
    /// Checks the nodes' form (and that they agree on credentials and TLS)
    /// once, at start-up.
    pub(super) fn new(config: &RedisConfig) -> RedisResult<Self> {
        let seeds = config
            .cluster_nodes
            .iter()
            .map(|node| node.as_str().into_connection_info())
            .collect::<RedisResult<Vec<_>>>()?;
        let cluster = Self {
            seeds,
            timeout: Duration::from_millis(config.timeout_ms),
        };
        cluster.client(cluster.seeds.clone())?;
        Ok(cluster)
    }

    /// A cluster client seeded with `nodes`: its retries and their pauses
    /// fit inside one call's `timeout_ms`.
    fn client(&self, nodes: Vec<ConnectionInfo>) -> RedisResult<ClusterClient> {
        let timeout_ms = self.timeout.as_millis() as u64;
        ClusterClientBuilder::new(nodes)
            .connection_timeout(self.timeout)
            .response_timeout(self.timeout)
            // A redirect or a reconnect is a retry: a few, paused 1 ms up to
            // 10 ms × 2^n, never past a quarter of the call timeout.
            .retries(3)
            .min_retry_wait(1)
            .max_retry_wait((timeout_ms / 4).max(2))
            .retry_wait_formula(10, 2)
            .build()
    }

    /// Connects to the nodes that the first seed to answer lists in
    /// `CLUSTER SLOTS`, not to the configured seeds.
    ///
    /// The client connects to every seed it is given and waits for all of
    /// them (and a hung node — accepting TCP, answering nothing — takes its
    /// whole connection timeout, `timeout_ms`, to fail), so seeded with a
    /// hung master it never connects within one call's `timeout_ms`. A live
    /// node's `CLUSTER SLOTS` lists no failed node: once the hung master's
    /// replica is promoted, this connects to live nodes only, in
    /// milliseconds. Before that it lists the hung master, and connecting
    /// times out, as it should: its slots are served by no one.
    pub(super) async fn connect(&self) -> RedisResult<ClusterConnection> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(self.timeout)
            .set_response_timeout(self.timeout);
        let asks = self.seeds.iter().map(|seed| {
            let config = &config;
            Box::pin(async move {
                let client = redis::Client::open(seed.clone())?;
                let mut conn = client
                    .get_multiplexed_async_connection_with_config(config)
                    .await?;
                let slots: Value = redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async(&mut conn)
                    .await?;
                RedisResult::Ok((seed, slots))
            })
        });
        let ((seed, slots), _) = futures::future::select_ok(asks).await?;
        self.client(slot_nodes(&slots, seed)?)?
            .get_async_connection()
            .await
    }
}

/// Every node `CLUSTER SLOTS` lists (masters and replicas, once each), with
/// the credentials and TLS of `seed`, the node that answered (whose host
/// stands for an empty one, as the cluster client reads it; `?`, an
/// unknown node, is left out).
fn slot_nodes(reply: &Value, seed: &ConnectionInfo) -> RedisResult<Vec<ConnectionInfo>> {
    let rows: Vec<Vec<Value>> = redis::from_redis_value(reply)?;
    let seed_host = match &seed.addr {
        ConnectionAddr::Tcp(host, _) | ConnectionAddr::TcpTls { host, .. } => host.as_str(),
        ConnectionAddr::Unix(_) => "",
    };
    let mut nodes: Vec<(String, u16)> = Vec::new();
    for row in rows {
        for node in row.iter().skip(2) {
            let node: Vec<Value> = redis::from_redis_value(node)?;
            let [host, port, ..] = node.as_slice() else {
                return Err((ErrorKind::TypeError, "a CLUSTER SLOTS node").into());
            };
            let host: Option<String> = redis::from_redis_value(host)?;
            let host = match host.as_deref() {
                None | Some("") => seed_host.to_string(),
                Some("?") => continue,
                Some(host) => host.to_string(),
            };
            let node = (host, redis::from_redis_value(port)?);
            if !nodes.contains(&node) {
                nodes.push(node);
            }
        }
    }
    if nodes.is_empty() {
        return Err((ErrorKind::ClusterDown, "CLUSTER SLOTS lists no node").into());
    }
    let at = |(host, port): (String, u16)| ConnectionInfo {
        addr: match &seed.addr {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host,
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host, port),
        },
        redis: seed.redis.clone(),
    };
    Ok(nodes.into_iter().map(at).collect())
}

#[cfg(test)]
mod tests {
    use super::{slot, slot_nodes};
    use redis::{IntoConnectionInfo, Value};

    #[test]
    fn a_cluster_is_seeded_with_the_nodes_cluster_slots_lists() {
        let node = |host: Value, port: i64| Value::Array(vec![host, Value::Int(port)]);
        let ip = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(8191),
                node(ip("10.0.0.1"), 7000),
                node(ip(""), 7003),
            ]),
            Value::Array(vec![
                Value::Int(8192),
                Value::Int(16383),
                node(Value::Nil, 7001),
                node(ip("?"), 7004),
            ]),
            // Another range of the first master: listed once.
            Value::Array(vec![
                Value::Int(100),
                Value::Int(200),
                node(ip("10.0.0.1"), 7000),
            ]),
        ]);
        let seed = "redis://:secret@10.0.0.9:7009"
            .into_connection_info()
            .unwrap();
        let nodes = slot_nodes(&reply, &seed).unwrap();
        let addrs: Vec<String> = nodes.iter().map(|n| n.addr.to_string()).collect();
        // An empty or null host is the answering node's; `?` is unknown.
        assert_eq!(addrs, ["10.0.0.1:7000", "10.0.0.9:7003", "10.0.0.9:7001"]);
        assert!(nodes
            .iter()
            .all(|n| n.redis.password.as_deref() == Some("secret")));
        assert!(slot_nodes(&Value::Array(vec![]), &seed).is_err());
    }

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
