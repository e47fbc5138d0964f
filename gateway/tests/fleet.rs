//! The fleet: four gateway replicas on one Redis Cluster (three masters,
//! one replica each), clients spread across them, the registry counting.
//!
//! - The per-IP limit holds for the whole fleet within ±5 % of the
//!   configured rate: the burst, then the steady rate.
//! - The host cap holds for the whole fleet: never more reads in flight at
//!   the registry than the cap.
//! - A master killed under load (the one holding a hammered client's key)
//!   fails over: every request is answered meanwhile (`failure_mode =
//!   "open"`), and afterwards the fleet-wide limit and cap hold again.
mod common;

use common::*;
use fanout_budget::config::{FailureMode, HostConfig};
use fanout_budget::Config;
use fanout_gateway::app::{self, Gateway};
use fanout_testkit::RedisCluster;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

const REPLICAS: usize = 4;
/// A burst of 1,200, then 20 a second.
const RPM: u32 = 1_200;
const DEADLINE: Duration = Duration::from_secs(5);

fn fleet(cluster: &RedisCluster, registry: &EmbeddedRegistry) -> Vec<Gateway> {
    let mut config = Config::default();
    config.redis.cluster_nodes = cluster.urls();
    config.redis.failure_mode = FailureMode::Open;
    // Six servers, four replicas and the test on a shared 2-core machine.
    config.redis.timeout_ms = 250;
    config.redis.backoff_ms = 200;
    config.rate_limit.requests_per_minute = RPM;
    config.budget.deadline_ms = DEADLINE.as_millis() as u64;
    let host = HostConfig::default()
        .max_concurrent(4)
        .acquire_wait_ms(2_000);
    config.hosts.insert(registry.host(), host);
    (0..REPLICAS)
        .map(|_| app::build(config.clone(), registry.url().parse().unwrap(), None))
        .collect()
}

/// One client (`peer`) sending cheap requests on every replica at once,
/// one loop per replica, until [`Hammer::stop`].
struct Hammer {
    admitted: Arc<AtomicU64>,
    denied: Arc<AtomicU64>,
    slowest: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    started: Instant,
    loops: Vec<tokio::task::JoinHandle<()>>,
}

impl Hammer {
    fn start(replicas: &[Gateway], peer: &str) -> Self {
        let (admitted, denied, slowest) = Default::default();
        let stop = Arc::new(AtomicBool::new(false));
        let mut hammer = Self {
            admitted,
            denied,
            slowest,
            stop,
            started: Instant::now(),
            loops: Vec::new(),
        };
        for replica in replicas {
            let router = replica.router.clone();
            let peer = peer.to_string();
            let (admitted, denied, slowest, stop): (
                Arc<AtomicU64>,
                Arc<AtomicU64>,
                Arc<AtomicU64>,
                _,
            ) = (
                hammer.admitted.clone(),
                hammer.denied.clone(),
                hammer.slowest.clone(),
                hammer.stop.clone(),
            );
            hammer.loops.push(tokio::spawn(async move {
                while !stop.load(SeqCst) {
                    let sent = Instant::now();
                    let (status, _, body) = post_from(&router, CHEAP, &peer, &[]).await;
                    slowest.fetch_max(sent.elapsed().as_millis() as u64, SeqCst);
                    match status {
                        200 => admitted.fetch_add(1, SeqCst),
                        429 => denied.fetch_add(1, SeqCst),
                        other => panic!("status {other}: {body}"),
                    };
                    // In process nothing need wait (the breaker open, the
                    // answer local): without a yield four loops would hold
                    // every worker thread.
                    tokio::task::yield_now().await;
                }
            }));
        }
        hammer
    }

    /// Stops every loop; what was admitted, in how long.
    async fn stop(self) -> (u64, Duration, Duration) {
        self.stop.store(true, SeqCst);
        let elapsed = self.started.elapsed();
        for handle in self.loops {
            handle.await.unwrap();
        }
        let slowest = Duration::from_millis(self.slowest.load(SeqCst));
        (self.admitted.load(SeqCst), elapsed, slowest)
    }
}

/// `peer` spends its burst across the fleet (until 40 requests were
/// denied): admitted is the burst plus the rate over that time, ±5 %.
async fn the_burst_holds(replicas: &[Gateway], peer: &str) {
    let hammer = Hammer::start(replicas, peer);
    let denied = hammer.denied.clone();
    fanout_testkit::until("the burst spent", Duration::from_secs(60), async || {
        denied.load(SeqCst) >= 40
    })
    .await;
    let (admitted, elapsed, _) = hammer.stop().await;
    let expected = f64::from(RPM) + f64::from(RPM) / 60.0 * elapsed.as_secs_f64();
    within_five_percent(
        admitted,
        expected,
        &format!("{peer}: the burst over {elapsed:?}"),
    );
}

/// After its burst, `peer` hammers the fleet for `window`: admitted is the
/// configured rate over that time, ±5 %.
///
/// A replica takes admissions ahead and hands them out locally for up to a
/// second (`src/backends/redis/rate.rs`): those it took as the burst ended
/// were charged then and are handed out now, on top of the rate. So the
/// count starts a second (plus a margin) into the hammering, when every one
/// of them is used or lapsed; at the rate, with nothing left to the client,
/// a replica takes one at a time and uses it at once.
async fn the_rate_holds(replicas: &[Gateway], peer: &str, window: Duration) {
    const TAKEN_AHEAD_LAPSE: Duration = Duration::from_millis(1_250);
    let hammer = Hammer::start(replicas, peer);
    tokio::time::sleep(TAKEN_AHEAD_LAPSE).await; // a measured span, not a wait for an event
    let (before, from) = (hammer.admitted.load(SeqCst), Instant::now());
    tokio::time::sleep(window).await; // the measured window itself
    let elapsed = from.elapsed();
    let (admitted, _, _) = hammer.stop().await;
    let expected = f64::from(RPM) / 60.0 * elapsed.as_secs_f64();
    // One admission may come due at the window's very start.
    within_five_percent(
        admitted - before,
        expected + 0.5,
        &format!("{peer}: steady over {elapsed:?}"),
    );
}

fn within_five_percent(admitted: u64, expected: f64, what: &str) {
    let error = (admitted as f64 - expected).abs() / expected;
    eprintln!(
        "{what}: {admitted} admitted, {expected:.1} expected ({:+.2} %)",
        (admitted as f64 - expected) / expected * 100.0
    );
    assert!(
        error <= 0.05,
        "{what}: {admitted} admitted, {expected:.1} expected ({:.1} % off)",
        error * 100.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_replicas_on_one_cluster_hold_the_limit_and_the_cap_through_a_failover() {
    let Some(mut cluster) = RedisCluster::start().await else {
        return;
    };
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let replicas = fleet(&cluster, &registry);
    let all: Vec<&Gateway> = replicas.iter().collect();

    // The per-IP limit, for the fleet: the burst, then the rate.
    let client = "198.18.0.10:1";
    the_burst_holds(&replicas, client).await;
    the_rate_holds(&replicas, client, Duration::from_secs(10)).await;
    // The host cap, for the fleet.
    a_cap_of_four_holds_across(&all, &registry).await;

    // Kill the master holding the hammered client's key, under load.
    let key = "fanout:ip:198.18.0.10";
    let victim = cluster.master_of(key).await;
    let hammer = Hammer::start(&replicas, client);
    let load = {
        let routers: Vec<_> = replicas.iter().map(|r| r.router.clone()).collect();
        tokio::spawn(async move {
            // Reads through every replica while the master dies.
            let query = serde_json::json!({ "query": r#"{ repository(name: "acme/app") { tags(first: 10) { nodes { manifest { digest } } } } }"# }).to_string();
            let mut answers = Vec::new();
            for round in 0..20 {
                let router = &routers[round % routers.len()];
                let sent = Instant::now();
                let (status, _, body) = post_from(router, &query, "198.18.0.99:1", &[]).await;
                answers.push((status, body, sent.elapsed()));
            }
            answers
        })
    };
    cluster.kill(victim);
    let promoted = cluster.wait_ready(Duration::from_secs(30)).await;
    assert_ne!(cluster.master_of(key).await, victim, "a replica took over");
    let (_, _, slowest) = hammer.stop().await;
    assert!(
        slowest < DEADLINE,
        "a request took {slowest:?} during the failover"
    );
    for (status, body, took) in load.await.unwrap() {
        assert_eq!(status, 200, "{body}");
        assert!(took < DEADLINE + Duration::from_secs(1), "{took:?}");
    }

    // After the failover: the fleet-wide limit and cap hold again. A fresh
    // client whose key lives on the promoted master spends its burst.
    let mut fresh = None;
    for i in 0..255 {
        let key = format!("fanout:ip:198.51.100.{i}");
        if cluster.master_of(&key).await == cluster.master_of("fanout:ip:198.18.0.10").await {
            fresh = Some(format!("198.51.100.{i}:1"));
            break;
        }
    }
    let fresh = fresh.expect("an address whose key is on the promoted master");
    // The breakers close within a few backoffs of the promotion: every
    // replica checks on Redis again (a replica still open would admit the
    // fresh client on its own local limit).
    for (i, replica) in replicas.iter().enumerate() {
        let peer = format!("203.0.113.{i}:1");
        let key = format!("fanout:ip:203.0.113.{i}");
        fanout_testkit::until("Redis used again", Duration::from_secs(10), async || {
            let (status, _, _) = post_from(&replica.router, CHEAP, &peer, &[]).await;
            status == 200
                && cluster
                    .keys_by_master(&key)
                    .await
                    .values()
                    .any(|k| !k.is_empty())
        })
        .await;
    }
    the_burst_holds(&replicas, &fresh).await;
    a_cap_of_four_holds_across(&all, &registry).await;
    eprintln!("failover: ready {promoted:?} after the kill");
}
