//! A throwaway Redis Cluster: three masters with one replica each — six
//! `redis-server` processes on free loopback ports, each in its own
//! temporary directory, joined by `redis-cli --cluster create` — killed (and
//! their directories removed) on drop.

use crate::{require_binary, RedisServer};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Six `redis-server` processes in cluster mode, three masters and three
/// replicas, with no persistence.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    dirs: Vec<PathBuf>,
    /// Ports of nodes stopped with [`RedisCluster::hang`]: running, silent.
    hung: Vec<u16>,
}

/// One line of `CLUSTER NODES`, as one node sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterNode {
    /// Its node id.
    pub id: String,
    /// Its loopback port.
    pub port: u16,
    /// A replica's master (its id).
    pub replica_of: Option<String>,
    /// A master (else a replica).
    pub master: bool,
    /// Marked failing (`fail` or `fail?`).
    pub failing: bool,
    /// The slot ranges it serves (a master's), inclusive.
    pub slots: Vec<(u16, u16)>,
}

impl RedisCluster {
    /// `cluster-node-timeout` (ms): how long a node may not answer before it
    /// is marked failing; short, so a failover takes a couple of seconds.
    pub const NODE_TIMEOUT_MS: u64 = 1_000;

    /// Starts one and waits until it is ready: `cluster_state:ok` on every
    /// node and every replica in sync (`None`, with a `SKIPPED:` line,
    /// without the binaries).
    pub async fn start() -> Option<Self> {
        let server = require_binary("redis-server", "redis-server")?;
        let cli = require_binary("redis-cli", "redis-tools")?;
        let mut cluster = Self {
            nodes: Vec::new(),
            dirs: Vec::new(),
            hung: Vec::new(),
        };
        while cluster.nodes.len() < 6 {
            let port = cluster_port();
            let dir = std::env::temp_dir().join(format!(
                "fanout-redis-cluster-{}-{port}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("a temporary directory");
            cluster.dirs.push(dir.clone());
            let child = std::process::Command::new(&server)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .args(["--cluster-enabled", "yes"])
                .args(["--cluster-config-file", "nodes.conf"])
                .args(["--cluster-node-timeout", &Self::NODE_TIMEOUT_MS.to_string()])
                // A replica may take over however long it was cut off, and
                // its first sync starts at once.
                .args(["--cluster-replica-validity-factor", "0"])
                .args(["--repl-diskless-sync-delay", "0"])
                .arg("--dir")
                .arg(&dir)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("redis-server starts");
            let mut node = RedisServer {
                binary: server.clone(),
                port,
                child: Some(child),
            };
            // A port taken meanwhile (the server exits): another one.
            if node.wait_answering(Duration::from_secs(5)).await {
                cluster.nodes.push(node);
            } else {
                node.kill();
            }
        }
        let mut create = tokio::process::Command::new(&cli);
        create.args(["--cluster", "create"]);
        for node in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        let created = tokio::time::timeout(Duration::from_secs(30), create.output())
            .await
            .expect("redis-cli --cluster create within 30 s")
            .expect("redis-cli runs");
        assert!(
            created.status.success(),
            "redis-cli --cluster create: {}{}",
            String::from_utf8_lossy(&created.stdout),
            String::from_utf8_lossy(&created.stderr)
        );
        cluster.wait_ready(Duration::from_secs(30)).await;
        Some(cluster)
    }

    /// `redis://127.0.0.1:<port>` of every node: a `[redis] cluster_nodes`.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The ports of the nodes still running and answering.
    pub fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some() && !self.hung.contains(&n.port))
            .map(|n| n.port)
            .collect()
    }

    /// The node on `port`.
    pub fn node(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .expect("a node of this cluster")
    }

    /// Kills the node on `port` hard (SIGKILL), as a crash would.
    pub fn kill(&mut self, port: u16) {
        let node = self.nodes.iter_mut().find(|n| n.port == port);
        node.expect("a node of this cluster").kill();
    }

    /// Stops the node on `port` (SIGSTOP): its connections stay open and it
    /// answers nothing, as a hung (not dead) server; killed on drop.
    pub fn hang(&mut self, port: u16) {
        self.node(port).signal("STOP");
        self.hung.push(port);
    }

    /// Runs one command on the node on `port`; `None` when unreachable.
    pub async fn command(&self, port: u16, args: &[&str]) -> Option<redis::Value> {
        self.node(port).command(args).await
    }

    /// `CLUSTER NODES` as the node on `port` sees it.
    pub async fn topology(&self, port: u16) -> Vec<ClusterNode> {
        let Some(text) = self.text(port, &["CLUSTER", "NODES"]).await else {
            return Vec::new();
        };
        text.lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let address = fields.get(1)?.split('@').next()?;
                let port = address.rsplit_once(':')?.1.parse().ok()?;
                let flags = fields.get(2)?;
                let replica_of = fields.get(3).filter(|m| **m != "-").map(|m| m.to_string());
                let slots = fields
                    .iter()
                    .skip(8)
                    .filter(|s| !s.starts_with('['))
                    .filter_map(|range| match range.split_once('-') {
                        Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                        None => range.parse().ok().map(|s| (s, s)),
                    })
                    .collect();
                Some(ClusterNode {
                    id: fields[0].to_string(),
                    port,
                    replica_of,
                    master: flags.contains("master"),
                    failing: flags.contains("fail"),
                    slots,
                })
            })
            .collect()
    }

    /// The ports of the masters serving slots, as a live node sees them.
    pub async fn masters(&self) -> Vec<u16> {
        let mut masters: Vec<u16> = self
            .topology(self.live_ports()[0])
            .await
            .into_iter()
            .filter(|n| n.master && !n.failing && !n.slots.is_empty())
            .map(|n| n.port)
            .collect();
        masters.sort_unstable();
        masters
    }

    /// `CLUSTER KEYSLOT key`, asked of a live node.
    pub async fn slot(&self, key: &str) -> u16 {
        match self
            .command(self.live_ports()[0], &["CLUSTER", "KEYSLOT", key])
            .await
        {
            Some(redis::Value::Int(slot)) => slot as u16,
            other => panic!("CLUSTER KEYSLOT {key}: {other:?}"),
        }
    }

    /// The port of the master serving `key`'s slot, as a live node sees it.
    pub async fn master_of(&self, key: &str) -> u16 {
        let slot = self.slot(key).await;
        self.topology(self.live_ports()[0])
            .await
            .into_iter()
            .find(|n| {
                n.master && !n.failing && n.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
            })
            .map(|n| n.port)
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
    }

    /// The keys matching `pattern` on each master (`KEYS` on a cluster node
    /// lists that node's own keys), masters with none included.
    pub async fn keys_by_master(&self, pattern: &str) -> BTreeMap<u16, Vec<String>> {
        let mut out = BTreeMap::new();
        for port in self.masters().await {
            let mut keys = self.node(port).keys(pattern).await;
            keys.sort();
            out.insert(port, keys);
        }
        out
    }

    /// Waits until every live node says `cluster_state:ok`, knows no master
    /// but live ones serving all 16,384 slots, and every replica of a live
    /// master is in sync with it. How long that took; panics after `limit`.
    pub async fn wait_ready(&self, limit: Duration) -> Duration {
        let started = Instant::now();
        loop {
            if self.ready().await {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < limit,
                "the cluster was not ready within {limit:?}: {:?}",
                self.topology(self.live_ports()[0]).await
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn ready(&self) -> bool {
        let live = self.live_ports();
        for &port in &live {
            let ok = self.text(port, &["CLUSTER", "INFO"]).await;
            if !ok.is_some_and(|info| info.lines().any(|l| l.trim() == "cluster_state:ok")) {
                return false;
            }
            let topology = self.topology(port).await;
            let serving: Vec<&ClusterNode> = topology
                .iter()
                .filter(|n| n.master && !n.slots.is_empty())
                .collect();
            let covered: u32 = serving
                .iter()
                .flat_map(|n| &n.slots)
                .map(|&(a, b)| u32::from(b - a) + 1)
                .sum();
            if covered != 16_384 || serving.iter().any(|n| n.failing || !live.contains(&n.port)) {
                return false;
            }
            // Every live node serves slots or follows a master (a new node
            // shows as a master without slots until it is made a replica).
            let placed = |p: &u16| {
                topology
                    .iter()
                    .any(|n| n.port == *p && (!n.slots.is_empty() || n.replica_of.is_some()))
            };
            if !live.iter().all(placed) {
                return false;
            }
            // A replica of a live master is in sync with it (one of a
            // killed master was promoted, or waits in vain).
            let me = topology.iter().find(|n| n.port == port);
            let master = me
                .and_then(|me| me.replica_of.as_ref())
                .and_then(|id| topology.iter().find(|n| &n.id == id));
            if master.is_some_and(|m| live.contains(&m.port)) {
                let info = self.text(port, &["INFO", "replication"]).await;
                let synced = info.is_some_and(|i| {
                    i.lines().any(|l| l.trim() == "master_link_status:up")
                        && !i.lines().any(|l| l.trim() == "master_sync_in_progress:1")
                });
                if !synced {
                    return false;
                }
            }
        }
        true
    }

    async fn text(&self, port: u16, args: &[&str]) -> Option<String> {
        match self.command(port, args).await? {
            redis::Value::BulkString(b) => String::from_utf8(b).ok(),
            redis::Value::VerbatimString { text, .. } => Some(text),
            _ => None,
        }
    }
}

impl RedisServer {
    /// Polls `PING` until it answers (`true`) or the process exits or
    /// `limit` passes (`false`).
    async fn wait_answering(&mut self, limit: Duration) -> bool {
        let started = Instant::now();
        while started.elapsed() < limit {
            if self.command(&["PING"]).await.is_some() {
                return true;
            }
            let exited = self.child.as_mut().map(|c| c.try_wait());
            if matches!(exited, Some(Ok(Some(_)))) {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        // Each node is killed as it is dropped.
        self.nodes.clear();
        for dir in &self.dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A loopback port whose cluster bus port (+10,000) is free too, both below
/// the ephemeral range (32,768 and up) that `free_port` and other processes'
/// connections draw from.
fn cluster_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let seed = std::process::id().wrapping_mul(7_919);
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 10_000 + (seed.wrapping_add(n.wrapping_mul(101)) % 12_000) as u16;
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
}
