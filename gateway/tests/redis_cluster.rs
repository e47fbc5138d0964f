//! Shared limits on a real Redis Cluster (three masters, one replica each,
//! six `redis-server` processes): two replicas share the per-IP limit and
//! the host caps with their keys spread over the masters; a master killed
//! (SIGKILL) or hung (SIGSTOP) under load fails over, the policy holds
//! meanwhile, and everything runs through Redis again once the replica is
//! promoted.
mod common;

use common::*;
use fanout_budget::backends::redis::{RedisBackend, RedisHostCaps};
use fanout_budget::config::{FailureMode, HostConfig};
use fanout_budget::{read::HostLimiter, Config};
use fanout_gateway::app::{self, Gateway};
use fanout_testkit::{until, RedisCluster};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn config(cluster: &RedisCluster, mode: FailureMode, rpm: u32) -> Config {
    let mut config = Config::default();
    config.redis.cluster_nodes = cluster.urls();
    config.redis.failure_mode = mode;
    // Six servers (twelve, two tests at once) and a test binary on a shared
    // 2-core machine: a call past 250 ms was seen now and then.
    config.redis.timeout_ms = 500;
    config.redis.backoff_ms = 200;
    config.rate_limit.requests_per_minute = rpm;
    config
}

/// A gateway replica whose shared limits' backend the test can watch.
struct Replica {
    gateway: Gateway,
    caps: Arc<RedisHostCaps>,
    backend: RedisBackend,
}

impl Replica {
    fn new(config: &Config, registry: &EmbeddedRegistry) -> Self {
        let gateway = app::build(config.clone(), registry.url().parse().unwrap(), None);
        let shared = gateway.shared.clone().expect("[redis] cluster_nodes");
        assert!(shared.backend().is_cluster());
        Self {
            caps: shared.host_limiter(),
            backend: shared.backend().clone(),
            gateway,
        }
    }
}

/// The number of masters holding at least one of `keys`' entries.
fn masters_holding(keys: &BTreeMap<u16, Vec<String>>) -> usize {
    keys.values().filter(|k| !k.is_empty()).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_share_the_per_ip_limit_and_host_caps_on_a_cluster() {
    let Some(cluster) = RedisCluster::start().await else {
        return;
    };
    let started = Instant::now();
    let registry = EmbeddedRegistry::fixture().await.unwrap();

    // The per-IP limit: eight clients, ten requests each, alternating
    // between the two replicas: exactly five each.
    let config = config(&cluster, FailureMode::Closed, 5);
    let (a, b) = (
        app::build(config.clone(), registry.url().parse().unwrap(), None),
        app::build(config.clone(), registry.url().parse().unwrap(), None),
    );
    for client in 0..8 {
        let peer = format!("192.0.2.{}:1", 10 + client);
        let admitted = admitted_across(&[&a.router, &b.router], &peer, 10).await;
        assert_eq!(admitted, 5, "{peer}: 5/min across both replicas");
    }
    let ip_keys = cluster.keys_by_master("fanout:ip:*").await;
    assert_eq!(
        ip_keys.values().map(Vec::len).sum::<usize>(),
        8,
        "{ip_keys:?}"
    );
    assert!(
        masters_holding(&ip_keys) >= 2,
        "one master holds them all: {ip_keys:?}"
    );
    // Each key is on the master of its slot (what CLUSTER KEYSLOT says).
    for (port, keys) in &ip_keys {
        for key in keys {
            assert_eq!(cluster.master_of(key).await, *port, "{key}");
        }
    }

    // One capped upstream host through the two gateways (as on one server).
    let mut config = self::config(&cluster, FailureMode::Closed, 10_000);
    let host = HostConfig::default()
        .max_concurrent(4)
        .acquire_wait_ms(30_000);
    config.hosts.insert(registry.host(), host);
    let (a, b) = (
        app::build(config.clone(), registry.url().parse().unwrap(), None),
        app::build(config.clone(), registry.url().parse().unwrap(), None),
    );
    a_cap_of_four_holds_across(&[&a, &b], &registry).await;

    // Several hosts, so several slots and masters: two replicas' workers,
    // each holding a slot 15 ms at a time; in flight per host, counted
    // across both replicas, never above its cap.
    let hosts: Vec<String> = (0..6).map(|i| format!("h{i}.test:443")).collect();
    let mut config = self::config(&cluster, FailureMode::Closed, 10_000);
    for (i, h) in hosts.iter().enumerate() {
        let cap = HostConfig::default()
            .max_concurrent(2 + i as u32 % 2)
            .acquire_wait_ms(5_000);
        config.hosts.insert(h.clone(), cap);
    }
    let replicas: Vec<Arc<RedisHostCaps>> = (0..2)
        .map(|_| {
            let backend = RedisBackend::new(&config.redis).unwrap();
            Arc::new(RedisHostCaps::new(config.hosts.clone(), backend))
        })
        .collect();
    let in_flight: Arc<Vec<AtomicU64>> =
        Arc::new(hosts.iter().map(|_| AtomicU64::new(0)).collect());
    let peaks: Arc<Vec<AtomicU64>> = Arc::new(hosts.iter().map(|_| AtomicU64::new(0)).collect());
    let mut workers = Vec::new();
    for (r, caps) in replicas.iter().enumerate() {
        for (h, host) in hosts.iter().enumerate() {
            for w in 0..3 {
                let (caps, host) = (caps.clone(), host.clone());
                let (in_flight, peaks) = (in_flight.clone(), peaks.clone());
                workers.push(tokio::spawn(async move {
                    for _ in 0..8 {
                        let slot = caps.acquire(&host, Duration::from_secs(10)).await.unwrap();
                        let now = in_flight[h].fetch_add(1, SeqCst) + 1;
                        peaks[h].fetch_max(now, SeqCst);
                        tokio::time::sleep(Duration::from_millis(15)).await;
                        in_flight[h].fetch_sub(1, SeqCst);
                        drop(slot);
                    }
                    (r, h, w)
                }));
            }
        }
    }
    // Meanwhile, where the host keys are.
    let mut held = BTreeMap::new();
    for _ in 0..50 {
        held = cluster.keys_by_master("fanout:shares:*").await;
        if masters_holding(&held) >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for w in workers {
        w.await.unwrap();
    }
    for (h, host) in hosts.iter().enumerate() {
        let cap = u64::from(config.hosts[host].max_concurrent);
        let peak = peaks[h].load(SeqCst);
        assert!(peak <= cap, "{host}: {peak} in flight, cap {cap}");
        assert_eq!(peak, cap, "{host}: six workers reach the cap");
    }
    assert!(
        masters_holding(&held) >= 2,
        "host keys on one master: {held:?}"
    );
    // Idle, every slot given back: the hashes are gone.
    let mut released = false;
    for _ in 0..100 {
        let keys = cluster.keys_by_master("fanout:shares:*").await;
        if keys.values().all(Vec::is_empty) {
            released = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(released, "slots left held");
    println!(
        "shared limits on a cluster: ip keys {ip_keys:?}, host keys while held {held:?}; {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_cluster_down_at_start_up_does_not_stop_start_up() {
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    // Nothing listens on these ports.
    let nodes: Vec<String> = (0..3)
        .map(|_| format!("redis://127.0.0.1:{}", free_port()))
        .collect();
    let text = format!("[redis]\ncluster_nodes = {nodes:?}\nfailure_mode = \"open\"\n");
    let mut config = Config::from_toml(&text).unwrap();
    let open = app::build(config.clone(), registry.url().parse().unwrap(), None);
    assert_eq!(
        post_from(&open.router, CHEAP, "192.0.2.1:1", &[]).await.0,
        200
    );
    config.redis.failure_mode = FailureMode::Closed;
    let closed = app::build(config, registry.url().parse().unwrap(), None);
    let (status, _, body) = post_from(&closed.router, CHEAP, "192.0.2.1:1", &[]).await;
    assert_eq!(status, 503);
    assert_eq!(body["errors"][0]["extensions"]["code"], "UNAVAILABLE");
}

/// A request's outcome, by phase.
#[derive(Default)]
struct Outcomes {
    /// 200 without errors.
    ok: AtomicU64,
    /// 503 `UNAVAILABLE`.
    refused: AtomicU64,
    /// 200 with `UNAVAILABLE` field errors.
    field_unavailable: AtomicU64,
    /// The slowest request (µs).
    slowest_us: AtomicU64,
}

struct Load {
    stop: Arc<AtomicBool>,
    phase: Arc<AtomicU8>,
    outcomes: Arc<[Outcomes; 3]>,
    /// 200s without errors by replica, whatever the phase.
    served: Arc<[AtomicU64; 2]>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

const WARM_UP: u8 = 0;
const OUTAGE: u8 = 1;
const RECOVERED: u8 = 2;

/// Six clients per replica, each sending one-read requests back to back,
/// every request from a new IP (so the per-IP keys spread over every master
/// and none reaches the limit).
fn load(replicas: &[Replica], mode: FailureMode) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let phase = Arc::new(AtomicU8::new(WARM_UP));
    let outcomes: Arc<[Outcomes; 3]> = Arc::new(Default::default());
    let served: Arc<[AtomicU64; 2]> = Arc::new(Default::default());
    let next_ip = Arc::new(AtomicU32::new(1));
    let query = json!({ "query": r#"{ repository(name: "acme/app") { name } }"# }).to_string();
    let mut tasks = Vec::new();
    for (r, replica) in replicas.iter().enumerate() {
        for _ in 0..6 {
            let router = replica.gateway.router.clone();
            let (stop, phase, outcomes) = (stop.clone(), phase.clone(), outcomes.clone());
            let served = served.clone();
            let (next_ip, query) = (next_ip.clone(), query.clone());
            tasks.push(tokio::spawn(async move {
                while !stop.load(SeqCst) {
                    let n = next_ip.fetch_add(1, SeqCst);
                    let peer = format!("10.{}.{}.{}:1", n >> 16 & 255, n >> 8 & 255, n & 255);
                    let at = phase.load(SeqCst) as usize;
                    let started = Instant::now();
                    let (status, _, body) = post_from(&router, &query, &peer, &[]).await;
                    let took = started.elapsed().as_micros() as u64;
                    let counted = &outcomes[at];
                    counted.slowest_us.fetch_max(took, SeqCst);
                    let codes = codes(&body);
                    match (status, mode) {
                        (200, _) if codes.is_empty() => {
                            served[r].fetch_add(1, SeqCst);
                            &counted.ok
                        }
                        (200, FailureMode::Closed) if codes.iter().all(|c| c == "UNAVAILABLE") => {
                            &counted.field_unavailable
                        }
                        (503, FailureMode::Closed) if codes == ["UNAVAILABLE"] => &counted.refused,
                        _ => panic!("{mode:?}, phase {at}: status {status}, {body}"),
                    }
                    .fetch_add(1, SeqCst);
                    if status != 200 {
                        // Pacing: a refusal is immediate.
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                }
            }));
        }
    }
    Load {
        stop,
        phase,
        outcomes,
        served,
        tasks,
    }
}

fn codes(body: &Value) -> Vec<String> {
    body["errors"]
        .as_array()
        .map(|errors| {
            errors
                .iter()
                .map(|e| e["extensions"]["code"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

impl Load {
    fn get(&self, phase: u8, counter: impl Fn(&Outcomes) -> &AtomicU64) -> u64 {
        counter(&self.outcomes[phase as usize]).load(SeqCst)
    }

    async fn stop(self) {
        self.stop.store(true, SeqCst);
        for task in self.tasks {
            tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("a client stops")
                .unwrap();
        }
    }
}

const CAP: u32 = 4;
const DEADLINE_MS: u64 = 3_000;

/// How the master dies: SIGKILL (connections reset at once), or SIGSTOP
/// (connections open, nothing answered: every call waits out its timeout).
#[derive(Clone, Copy, Debug)]
enum Fault {
    Crash,
    Hang,
}

async fn failover(mode: FailureMode, fault: Fault) {
    let Some(mut cluster) = RedisCluster::start().await else {
        return;
    };
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    registry.set_latency(Some(Duration::from_millis(20)));
    let mut config = config(&cluster, mode, 5);
    config.budget.deadline_ms = DEADLINE_MS;
    let host = HostConfig::default()
        .max_concurrent(CAP)
        .acquire_wait_ms(1_000);
    config.hosts.insert(registry.host(), host);
    let replicas = [
        Replica::new(&config, &registry),
        Replica::new(&config, &registry),
    ];
    let load = load(&replicas, mode);
    let host_key = format!("fanout:shares:{}", registry.host());

    until("warm-up", Duration::from_secs(10), async || {
        load.get(WARM_UP, |o| &o.ok) >= 40
    })
    .await;
    let warm_peak = registry.counters().peak();
    assert!(
        warm_peak <= u64::from(CAP),
        "warm-up: {warm_peak} in flight, cap {CAP}"
    );

    // Kill (or hang) the master holding the host's lease set, under load.
    let victim = cluster.master_of(&host_key).await;
    let masters = cluster.masters().await;
    registry.counters().reset();
    load.phase.store(OUTAGE, SeqCst);
    match fault {
        Fault::Crash => cluster.kill(victim),
        Fault::Hang => cluster.hang(victim),
    }
    let killed = Instant::now();
    let failed_before: u64 = replicas.iter().map(|r| r.backend.failed_calls()).sum();
    let promoted = cluster.wait_ready(Duration::from_secs(20)).await;
    let new_master = cluster.master_of(&host_key).await;
    assert_ne!(new_master, victim);
    assert!(!masters.contains(&new_master), "a replica took over");
    // The breakers close (one per replica): both replicas' host caps and
    // per-IP limits run on Redis again.
    let closed = until("breakers closed", Duration::from_secs(10), async || {
        replicas.iter().all(|r| !r.backend.is_open())
    })
    .await;
    // Each replica serves again on Redis, and the reads the open mode let
    // through on the local caps alone have ended.
    let served = |r: usize| load.served[r].load(SeqCst);
    let base = [served(0), served(1)];
    until(
        "both replicas serve again",
        Duration::from_secs(10),
        async || served(0) >= base[0] + 10 && served(1) >= base[1] + 10,
    )
    .await;
    let outage_peak = registry.counters().peak();
    let outage_failures = replicas
        .iter()
        .map(|r| r.backend.failed_calls())
        .sum::<u64>()
        - failed_before;
    let fleet_bound = match mode {
        // Each replica on its own cap while Redis is skipped.
        FailureMode::Open => 2 * u64::from(CAP),
        FailureMode::Closed => u64::from(CAP),
        other => unreachable!("no failover test for {other:?}"),
    };
    assert!(
        outage_peak <= fleet_bound,
        "{mode:?} failover: {outage_peak} in flight, bound {fleet_bound}"
    );

    // After the failover: shared caps again, and no more failed calls.
    registry.counters().reset();
    load.phase.store(RECOVERED, SeqCst);
    let failed: Vec<u64> = replicas.iter().map(|r| r.backend.failed_calls()).collect();
    let ok = load.get(RECOVERED, |o| &o.ok);
    let mut leased = false;
    until(
        "more served after the failover",
        Duration::from_secs(10),
        async || {
            let n = cluster.command(new_master, &["HGETALL", &host_key]).await;
            leased |= n.is_some() && fanout_testkit::slots_held(n) > 0;
            load.get(RECOVERED, |o| &o.ok) >= ok + 40
        },
    )
    .await;
    assert!(leased, "reads take slots on the promoted master");
    let failed_after: Vec<u64> = replicas.iter().map(|r| r.backend.failed_calls()).collect();
    assert_eq!(
        failed_after, failed,
        "failed calls still growing after the failover"
    );
    let recovered_peak = registry.counters().peak();
    assert!(
        (1..=u64::from(CAP)).contains(&recovered_peak),
        "after the failover: {recovered_peak} in flight, cap {CAP}"
    );
    if mode == FailureMode::Closed {
        assert_eq!(load.get(RECOVERED, |o| &o.refused), 0);
        assert_eq!(load.get(RECOVERED, |o| &o.field_unavailable), 0);
    }
    for r in &replicas {
        assert!(r.caps.in_flight(&registry.host()) <= u64::from(CAP));
    }
    // The outage was seen and answered by the policy, within the deadline.
    let refused = load.get(OUTAGE, |o| &o.refused) + load.get(OUTAGE, |o| &o.field_unavailable);
    let served = load.get(OUTAGE, |o| &o.ok);
    match mode {
        FailureMode::Open => assert!(served >= 10, "open: served {served} during the failover"),
        FailureMode::Closed => assert!(
            refused >= 10,
            "closed: refused {refused} during the failover"
        ),
        other => unreachable!("no failover test for {other:?}"),
    }
    let slowest: Vec<Duration> = [WARM_UP, OUTAGE, RECOVERED]
        .map(|phase| Duration::from_micros(load.get(phase, |o| &o.slowest_us)))
        .to_vec();
    load.stop().await;
    for took in &slowest {
        assert!(
            *took < Duration::from_millis(DEADLINE_MS),
            "{mode:?}: a request took {took:?} (deadline {DEADLINE_MS} ms)"
        );
    }

    // The shared per-IP limit holds across both replicas again, on a key
    // the promoted master serves.
    let mut ip = None;
    for i in 1..=250 {
        let key = format!("fanout:ip:192.0.2.{i}");
        if cluster.master_of(&key).await == new_master {
            ip = Some(format!("192.0.2.{i}:1"));
            break;
        }
    }
    let peer = ip.expect("an address whose key the promoted master serves");
    let routers = [&replicas[0].gateway.router, &replicas[1].gateway.router];
    let admitted = admitted_across(&routers, &peer, 10).await;
    assert_eq!(
        admitted, 5,
        "{peer}: 5/min across both replicas after the failover"
    );
    let ip_keys = cluster.keys_by_master("fanout:ip:10.*").await;
    assert!(masters_holding(&ip_keys) >= 2, "{ip_keys:?}");
    println!(
        "{mode:?}, {fault:?}: master {victim}; cluster ready again {promoted:?} after, breakers \
         closed {closed:?} later; during the failover {served} served, {refused} refused, \
         {outage_failures} failed Redis calls, \
         upstream peak {outage_peak} (cap {CAP}); after it peak {recovered_peak}; slowest \
         request by phase {slowest:?}; {:?} in all",
        killed.elapsed(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_under_load_fails_over_open() {
    failover(FailureMode::Open, Fault::Crash).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_hung_under_load_fails_over_open() {
    failover(FailureMode::Open, Fault::Hang).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_under_load_fails_over_closed() {
    failover(FailureMode::Closed, Fault::Crash).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_hung_under_load_fails_over_closed() {
    failover(FailureMode::Closed, Fault::Hang).await;
}
