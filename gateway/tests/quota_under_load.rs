//! The fleet's read quota on a loaded machine: two gateway replicas on one
//! `redis-server` (answering in well under a millisecond), their runtime
//! saturated by legal batches that read nothing but cost milliseconds of CPU
//! each, sent from many addresses (127.0.0.x, each within its per-IP limit),
//! while threads spin on every core. A replica that took its own slowness for
//! Redis being down would open its breaker and serve the measured client
//! from a fresh local bucket on each replica; the reads sent upstream for
//! that client, counted at the registry, must stay within its burst, what
//! its rate refills over the window, and one refresh interval (a second) more.
//!
//! Without `redis-server` this prints `SKIPPED` and passes, unless
//! `FANOUT_REQUIRE_EXTERNAL=1`.
mod common;

use common::*;
use fanout_budget::config::{FailureMode, QuotaConfig};
use fanout_budget::Config;
use fanout_gateway::app::{self, Gateway};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// 60 reads a minute: one a second, 20 at most at once.
const RATE: f64 = 1.0;
const BURST: f64 = 20.0;
/// The measured window.
const WINDOW: Duration = Duration::from_secs(8);
/// The measured client's concurrent requests.
const CLIENT_LOOPS: usize = 12;
/// Addresses sending the load.
const LOADERS: u8 = 16;

/// Tag list, manifest and config blob: 3 reads reserved.
const QUERY: &str =
    r#"{ repository(name: "acme/app") { tag(name: "t01") { manifest { config { os } } } } }"#;

/// A batch that reads nothing (the budget's own fields) but costs the
/// gateway milliseconds of CPU to parse, validate and price.
fn heavy_batch() -> String {
    let aliases: String = (0..45)
        .map(|i| format!("a{i}:fanoutBudget{{limit}} "))
        .collect();
    let op = json!({ "query": format!("{{ {aliases} }}") });
    Value::Array(vec![op; 20]).to_string()
}

/// Threads spinning until `stop`: the machine's cores taken.
fn hogs(stop: &Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<()>> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (0..cores)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(SeqCst) {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                }
            })
        })
        .collect()
}

/// The load: each address sends [`heavy_batch`] to the replicas, turn
/// about, until `stop`; the batches answered.
fn load(
    replicas: &[Gateway],
    stop: &Arc<AtomicBool>,
) -> (Arc<AtomicU64>, Vec<tokio::task::JoinHandle<()>>) {
    let answered = Arc::new(AtomicU64::new(0));
    let body = heavy_batch();
    let tasks = (0..LOADERS)
        .map(|n| {
            let routers: Vec<_> = replicas.iter().map(|r| r.router.clone()).collect();
            let (stop, answered, body) = (stop.clone(), answered.clone(), body.clone());
            let peer = format!("127.0.0.{}:1", n + 2);
            tokio::spawn(async move {
                let mut i = n as usize;
                while !stop.load(SeqCst) {
                    let (status, _, body) =
                        post_from(&routers[i % routers.len()], &body, &peer, &[]).await;
                    assert_eq!(status, 200, "{body}");
                    i += 1;
                    answered.fetch_add(1, SeqCst);
                    // As a connection's next read would: the worker serves
                    // other tasks between two batches.
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    (answered, tasks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_read_quota_holds_while_the_replicas_are_overloaded() {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let mut config = Config::default();
    config.redis.url = redis.url();
    config.redis.failure_mode = FailureMode::Open;
    // Each loading address stays within its per-IP limit.
    config.rate_limit.requests_per_minute = 100_000;
    config.quota = QuotaConfig::default().reads(60).period_secs(60).burst(20);
    config.budget.deadline_ms = 30_000;
    let fleet: Vec<Gateway> = (0..2)
        .map(|_| app::build(config.clone(), registry.url().parse().unwrap(), None))
        .collect();

    // One batch alone: what it costs.
    let started = Instant::now();
    let (status, _, body) = post_from(&fleet[0].router, &heavy_batch(), "127.0.0.1:1", &[]).await;
    assert_eq!(status, 200, "{body}");
    eprintln!("one heavy batch alone: {:?}", started.elapsed());

    let stop = Arc::new(AtomicBool::new(false));
    let hogs = hogs(&stop);
    let (batches, loaders) = load(&fleet, &stop);

    // The measured client: a request every 5 ms from each of its loops, turn about
    // to each replica.
    let before = registry.counters().requests();
    let (answered, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let body = json!({ "query": QUERY }).to_string();
    let client_stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let client: Vec<_> = (0..CLIENT_LOOPS)
        .map(|l| {
            let routers: Vec<_> = fleet.iter().map(|r| r.router.clone()).collect();
            let (answered, refused, body, stop) = (
                answered.clone(),
                refused.clone(),
                body.clone(),
                client_stop.clone(),
            );
            tokio::spawn(async move {
                let mut i = l;
                while !stop.load(SeqCst) {
                    let router = &routers[i % routers.len()];
                    i += 1;
                    let (status, _, body) = post_from(router, &body, "198.18.0.30:1", &[]).await;
                    match status {
                        200 => answered.fetch_add(1, SeqCst),
                        429 => refused.fetch_add(1, SeqCst),
                        other => panic!("status {other}: {body}"),
                    };
                    // Pacing, not synchronisation.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(WINDOW).await; // the measured window itself, not a wait for an event
    client_stop.store(true, SeqCst);
    for task in client {
        task.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let reads = registry.counters().requests() - before;
    stop.store(true, SeqCst);
    for task in loaders {
        task.await.unwrap();
    }
    for hog in hogs {
        hog.join().unwrap();
    }
    let failed: u64 = fleet
        .iter()
        .map(|r| r.shared.as_ref().unwrap().backend().failed_calls())
        .sum();
    // Burst, what the rate refills over the window, and one refresh
    // interval (a second) more.
    let bound = BURST + RATE * (elapsed + 1.0);
    eprintln!(
        "one client under load: {reads} reads sent upstream in {elapsed:.2} s (bound {bound:.1}; \
         {} answered, {} refused); {} heavy batches answered; {failed} Redis calls failed",
        answered.load(SeqCst),
        refused.load(SeqCst),
        batches.load(SeqCst),
    );
    assert!(
        batches.load(SeqCst) >= 50,
        "the load ran: {} batches",
        batches.load(SeqCst)
    );
    assert!(
        reads as f64 <= bound,
        "{reads} reads of one client in {elapsed:.2} s, past burst + rate + a second ({bound:.1}); \
         {failed} Redis calls failed"
    );
    assert!(refused.load(SeqCst) > 0, "the client was never refused");
}
