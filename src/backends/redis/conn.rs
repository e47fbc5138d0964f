//! The connection to the shared state: one server or a Redis Cluster.
//!
//! An enum of the two connection kinds — a `redis::aio::ConnectionManager`
//! (multiplexed, reconnecting) or a `redis::cluster_async::ClusterConnection`
//! (a multiplexed connection per node; it follows `MOVED`/`ASK`, refreshes
//! its slot map and reconnects) — implements `ConnectionLike` by
//! delegation, so the scripts, the breaker, the timeouts and
//! `failure_mode` are one code path for both. Nothing connects until the
//! first call: a Redis (or a whole cluster) that is down at start-up does
//! not stop start-up.
//!
//! A cluster connection is seeded not with `cluster_nodes` but with the
//! nodes the first of them to answer lists in `CLUSTER SLOTS` (the client
//! waits for every seed, and a hung one takes all of `timeout_ms` to fail);
//! the cluster client's own retries (a redirect, a reconnect, `TRYAGAIN`,
//! `CLUSTERDOWN`) fit inside one call's `timeout_ms`. A new connection
//! learns the clocks of the nodes it reaches ([`Clocks`]): a server's
//! `TIME`; on a cluster, every master serving slots, each asked by a key of
//! its slots, so it is routed — redirects included — as the checks are.

use super::clocks::Clocks;
use super::lua::{RedisTime, NODE_TIME};
use super::slots::{key_in, ranges_by_master};
use crate::config::RedisConfig;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo,
    Pipeline, RedisFuture, RedisResult, Value,
};
use std::time::Duration;

/// Where the shared state lives.
pub(super) enum Target {
    /// One server, and the call timeout (for connecting).
    Server {
        client: redis::Client,
        timeout: Duration,
    },
    Cluster(Cluster),
}

impl Target {
    /// `[redis]`'s `url`, or its `cluster_nodes` when set (nothing connects).
    pub(super) fn new(config: &RedisConfig) -> RedisResult<Self> {
        Ok(if config.cluster_nodes.is_empty() {
            Self::Server {
                client: redis::Client::open(config.url.as_str())?,
                timeout: Duration::from_millis(config.timeout_ms),
            }
        } else {
            Self::Cluster(Cluster::new(config)?)
        })
    }

    /// A new connection, with the clocks of the nodes it reaches learned
    /// (`probe_key(n)`: the keys to route a master's `TIME` by).
    pub(super) async fn connect(
        &self,
        clocks: &Clocks,
        probe_key: impl Fn(u32) -> String,
    ) -> RedisResult<Conn> {
        match self {
            Self::Server { client, timeout } => {
                // No retries inside: the breaker paces reconnection.
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(*timeout)
                    .set_number_of_retries(0);
                let mut manager = client.get_connection_manager_with_config(config).await?;
                let RedisTime(now_us) = redis::cmd("TIME").query_async(&mut manager).await?;
                clocks.observe(None, now_us);
                Ok(Conn::Server(manager))
            }
            Self::Cluster(cluster) => {
                // A live node's slot map, then connections to its nodes.
                let mut conn = Conn::Cluster(cluster.connect().await?);
                learn_masters_clocks(&mut conn, clocks, probe_key).await?;
                Ok(conn)
            }
        }
    }
}

/// Asks every master serving slots for its time: `CLUSTER SLOTS` from any
/// node, then to each master `NODE_TIME`, sent with a key of one of its
/// slots (so the client's routing, redirects included, takes it there, as
/// it takes the checks). Each answer sets the clock offset of every slot
/// that master serves. `Ok` only when every master answered: a master down
/// or not yet replaced fails it.
async fn learn_masters_clocks(
    conn: &mut Conn,
    clocks: &Clocks,
    probe_key: impl Fn(u32) -> String,
) -> RedisResult<()> {
    let slots: Value = redis::cmd("CLUSTER").arg("SLOTS").query_async(conn).await?;
    let masters = ranges_by_master(&slots)?;
    if masters.is_empty() {
        return Err((ErrorKind::ClusterDown, "no master serves slots").into());
    }
    let asks = masters.iter().filter_map(|ranges| {
        // None: a hash tag in key_prefix keeps every key off this master.
        let key = key_in(ranges, &probe_key)?;
        let mut conn = conn.clone();
        Some(async move {
            let RedisTime(now_us) = redis::cmd("EVAL")
                .arg(NODE_TIME)
                .arg(1)
                .arg(&key)
                .query_async(&mut conn)
                .await?;
            clocks.observe_master(ranges, now_us);
            RedisResult::Ok(())
        })
    });
    futures::future::try_join_all(asks).await?;
    Ok(())
}

/// A connection of either kind; every call goes through its
/// [`ConnectionLike`], which delegates.
#[derive(Clone)]
pub(super) enum Conn {
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
    use super::slot_nodes;
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
}
