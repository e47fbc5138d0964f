//! REPRODUCTION (old API): a hung Redis leaves timed-out acquires behind;
//! a dead Redis costs a timeout per call.
use fanout_budget::backends::redis::{RedisBackend, RedisHostCaps};
use fanout_budget::config::{FailureMode, HostConfig, RedisConfig};
use fanout_budget::HostLimiter;
use fanout_testkit::RedisServer;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

const HOST: &str = "upstream.test:443";
const CAP: u32 = 4;

fn configs(
    redis: &RedisServer,
    mode: FailureMode,
    timeout_ms: u64,
) -> (RedisConfig, BTreeMap<String, HostConfig>) {
    let redis = RedisConfig {
        url: redis.url(),
        failure_mode: mode,
        timeout_ms,
        lease_ms: 30_000,
        ..RedisConfig::default()
    };
    let mut hosts = BTreeMap::new();
    hosts.insert(
        HOST.to_string(),
        HostConfig {
            max_concurrent: CAP,
            acquire_wait_ms: 1000,
        },
    );
    (redis, hosts)
}

#[derive(Default)]
struct Stats {
    ok: AtomicU64,
    saturated: AtomicU64,
    unavailable: AtomicU64,
    slow: AtomicU64,
}

struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    stats: Arc<Stats>,
}

fn load(replicas: &[Arc<RedisHostCaps>], workers: usize, slow: Duration) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(Stats::default());
    let mut tasks = Vec::new();
    for caps in replicas {
        for _ in 0..workers {
            let (caps, stop, stats) = (caps.clone(), stop.clone(), stats.clone());
            tasks.push(tokio::spawn(async move {
                while !stop.load(SeqCst) {
                    let started = Instant::now();
                    let got = caps.acquire(HOST, Duration::from_secs(30)).await;
                    if started.elapsed() >= slow {
                        stats.slow.fetch_add(1, SeqCst);
                    }
                    match got {
                        Ok(slot) => {
                            stats.ok.fetch_add(1, SeqCst);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            drop(slot);
                        }
                        Err(e) => {
                            match e.code() {
                                "HOST_SATURATED" => stats.saturated.fetch_add(1, SeqCst),
                                _ => stats.unavailable.fetch_add(1, SeqCst),
                            };
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    }
                }
            }));
        }
    }
    Load { stop, tasks, stats }
}

async fn zcard(redis: &RedisServer) -> i64 {
    match redis
        .command(&["ZCARD", &format!("fanout:host:{HOST}")])
        .await
    {
        Some(redis::Value::Int(n)) => n,
        other => panic!("ZCARD: {other:?}"),
    }
}

async fn until(what: &str, limit: Duration, mut f: impl AsyncFnMut() -> bool) -> Duration {
    let started = Instant::now();
    while started.elapsed() < limit {
        if f().await {
            return started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not within {limit:?}");
}

async fn hang(mode: FailureMode) {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let (config, hosts) = configs(&redis, mode, 200);
    let replicas: Vec<_> = (0..2)
        .map(|_| {
            Arc::new(RedisHostCaps::new(
                hosts.clone(),
                RedisBackend::new(&config).unwrap(),
            ))
        })
        .collect();
    let l = load(&replicas, 8, Duration::from_millis(200));
    let s = l.stats.clone();
    until("warm-up", Duration::from_secs(10), async || {
        s.ok.load(SeqCst) >= 40
    })
    .await;
    redis.signal("STOP");
    until("calls timed out", Duration::from_secs(10), async || {
        s.slow.load(SeqCst) >= 2 * CAP as u64
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis.signal("CONT");
    let cont = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (ok, sat) = (s.ok.load(SeqCst), s.saturated.load(SeqCst));
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!(
        "{mode:?}: 2.3 s after CONT: ZCARD {} ; in the 2 s window ok +{} saturated +{}",
        zcard(&redis).await,
        s.ok.load(SeqCst) - ok,
        s.saturated.load(SeqCst) - sat
    );
    l.stop.store(true, SeqCst);
    for t in l.tasks {
        t.await.unwrap();
    }
    let z = zcard(&redis).await;
    println!(
        "{mode:?}: load stopped {:?} after CONT: ZCARD {z}",
        cont.elapsed()
    );
    assert_eq!(z, 0, "leases left with nothing in flight");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repro_hang_open() {
    hang(FailureMode::Open).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repro_hang_closed() {
    hang(FailureMode::Closed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repro_dead_latency() {
    let Some(mut redis) = RedisServer::start().await else {
        return;
    };
    let (config, hosts) = configs(&redis, FailureMode::Open, 2000);
    let caps = RedisHostCaps::new(hosts.clone(), RedisBackend::new(&config).unwrap());
    drop(caps.acquire(HOST, Duration::from_secs(5)).await.unwrap());
    redis.kill();
    let mut took = Vec::new();
    for _ in 0..10 {
        let started = Instant::now();
        let got = caps.acquire(HOST, Duration::from_secs(5)).await;
        took.push((started.elapsed().as_millis(), got.is_ok()));
    }
    println!("dead redis, timeout 2000 ms: calls {took:?}");
}
