//! One Redis backend for the whole process: the gateway's per-IP limit and
//! per-host caps share one connection to a `redis-server` (to each node of
//! a Redis Cluster) and one breaker, so an outage and the recovery are each
//! reported once.
mod common;

use common::*;
use fanout_budget::config::{FailureMode, HostConfig};
use fanout_budget::Config;
use fanout_gateway::app::{self, Gateway};
use fanout_testkit::{until, RedisCluster};
use serde_json::json;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A gateway on `redis` with the registry's host capped (a read claims a
/// share of it on Redis) and a per-IP limit of 60 a minute (its keys last a
/// second, past the checks below).
fn gateway(redis: &RedisServer, registry: &EmbeddedRegistry, mode: FailureMode) -> Gateway {
    let mut config = Config::default();
    config.redis.url = redis.url();
    gateway_on(config, registry, mode)
}

/// The same on the `[redis]` of `config`.
fn gateway_on(mut config: Config, registry: &EmbeddedRegistry, mode: FailureMode) -> Gateway {
    config.redis.failure_mode = mode;
    config.redis.backoff_ms = 100;
    config.rate_limit.requests_per_minute = 60;
    let cap = HostConfig::default().max_concurrent(8);
    config.hosts.insert(registry.host(), cap);
    app::build(config, registry.url().parse().unwrap(), None)
}

/// One request from `peer` with one read (the tag list): a per-IP check,
/// then a slot of the registry's host; its status.
async fn one_read(gateway: &Gateway, peer: &str) -> u16 {
    let query = json!({ "query": r#"{ repository(name: "acme/app") { name } }"# }).to_string();
    let (status, _, body) = post_from(&gateway.router, &query, peer, &[]).await;
    if status == 200 {
        assert!(body.get("errors").is_none(), "{body}");
        assert_eq!(body["extensions"]["fanout"]["used"], 1, "{body}");
    }
    status
}

/// Clients connected to `redis` (`CLIENT LIST`): normal ones (not a
/// replication link), but for the one asking.
async fn connections(redis: &RedisServer) -> usize {
    let Some(redis::Value::BulkString(list)) = redis.command(&["CLIENT", "LIST"]).await else {
        panic!("CLIENT LIST");
    };
    String::from_utf8(list)
        .unwrap()
        .lines()
        .filter(|client| client.contains(" flags=N ") && !client.contains("cmd=client|list"))
        .count()
}

#[tokio::test]
async fn both_limits_of_a_gateway_share_one_connection() {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    // Closed: a 200 with its read done means the per-IP check and the
    // host's claim were both answered by Redis.
    let gateway = gateway(&redis, &registry, FailureMode::Closed);
    assert_eq!(one_read(&gateway, "192.0.2.50:1").await, 200);
    assert_eq!(redis.keys("fanout:ip:*").await, ["fanout:ip:192.0.2.50"]);
    // (The test's own earlier connections may take a moment to close.)
    until("one connection", Duration::from_secs(5), async || {
        connections(&redis).await == 1
    })
    .await;
    for i in 0..10 {
        assert_eq!(
            one_read(&gateway, &format!("192.0.2.{}:1", 60 + i)).await,
            200
        );
    }
    assert_eq!(
        connections(&redis).await,
        1,
        "one connection for both limits"
    );
}

/// The same on a Redis Cluster (three masters, one replica each): one
/// connection to each master (the cluster client sends nothing to a
/// replica), for both limits.
#[tokio::test]
async fn both_limits_of_a_gateway_share_one_connection_per_cluster_master() {
    let Some(cluster) = RedisCluster::start().await else {
        return;
    };
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let mut config = Config::default();
    config.redis.cluster_nodes = cluster.urls();
    // Six servers and a test binary on a shared 2-core machine.
    config.redis.timeout_ms = 250;
    let gateway = gateway_on(config, &registry, FailureMode::Closed);
    // Clients whose per-IP keys fall on every master.
    for i in 0..30 {
        assert_eq!(
            one_read(&gateway, &format!("192.0.2.{}:1", 100 + i)).await,
            200
        );
    }
    let masters = cluster.masters().await;
    assert_eq!(masters.len(), 3);
    let ports = cluster.live_ports();
    let want: Vec<usize> = ports
        .iter()
        .map(|p| usize::from(masters.contains(p)))
        .collect();
    let per_node = async || {
        let mut counts = Vec::new();
        for port in &ports {
            counts.push(connections(cluster.node(*port)).await);
        }
        counts
    };
    // (The seeds asked for the slot map close their connections meanwhile.)
    until(
        "one connection per master",
        Duration::from_secs(5),
        async || per_node().await == want,
    )
    .await;
    assert_eq!(one_read(&gateway, "192.0.2.99:1").await, 200);
    assert_eq!(per_node().await, want, "one connection per master");
}

/// The log lines at `INFO` and above written while it is the default
/// subscriber (of this thread: the test's runtime and every task on it).
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Write for Log {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync {
        let log = self.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || log.clone())
            .finish()
    }

    /// The lines that contain `text`.
    fn count(&self, text: &str) -> usize {
        let bytes = self.0.lock().unwrap();
        String::from_utf8_lossy(&bytes)
            .lines()
            .filter(|line| line.contains(text))
            .count()
    }
}

#[tokio::test]
async fn an_outage_is_reported_once_and_so_is_the_recovery() {
    let Some(mut redis) = RedisServer::start().await else {
        return;
    };
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let log = Log::default();
    let _default = tracing::subscriber::set_default(log.subscriber());
    let gateway = gateway(&redis, &registry, FailureMode::Open);
    assert_eq!(one_read(&gateway, "192.0.2.70:1").await, 200);
    let shares = format!("fanout:shares:{}", registry.host());
    assert!(
        redis.slots_held(&shares).await > 0,
        "the read's share on Redis"
    );

    redis.kill();
    // Served throughout on the in-process limits. The per-IP check meets the
    // dead connection first; the host's share comes up at its next claim (a
    // refresh every 50 ms): a second of requests gives both limits many
    // chances to call Redis, and no breaker of theirs to trip but the one.
    let started = Instant::now();
    let mut n = 0;
    while started.elapsed() < Duration::from_secs(1) {
        n += 1;
        assert_eq!(
            one_read(&gateway, &format!("198.51.100.{}:1", n % 200)).await,
            200
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(log.count("redis unreachable"), 1, "one breaker opened");

    redis.restart().await;
    // Both limits back on Redis: the per-IP limit's key and a share.
    until(
        "both limits on Redis",
        Duration::from_secs(10),
        async || {
            n += 1;
            one_read(&gateway, &format!("198.51.100.{}:1", n % 200)).await;
            !redis.keys("fanout:ip:*").await.is_empty() && redis.slots_held(&shares).await > 0
        },
    )
    .await;
    assert_eq!(log.count("redis reachable again"), 1, "one breaker closed");
    assert_eq!(log.count("redis unreachable"), 1);
}
