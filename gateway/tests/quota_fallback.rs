//! The fallbacks (`failure_mode = "open"`) never hand a client a fresh full
//! bucket: two gateway replicas on one `redis-server`; a client spends its
//! read quota (or its per-IP limit) on one; Redis is killed. The replica
//! that knew the client spent refuses it (its fallback starts from the
//! fleet's last answer); the replica that never heard of it grants at most
//! the client's share, half its burst — where each used to grant a whole
//! one.
//!
//! Without `redis-server` this prints `SKIPPED` and passes, unless
//! `FANOUT_REQUIRE_EXTERNAL=1`.
mod common;

use axum::Router;
use common::*;
use fanout_budget::config::{FailureMode, QuotaConfig};
use fanout_budget::Config;
use fanout_gateway::app::{self, Gateway};
use serde_json::json;

/// Tag list, manifest and config blob: 3 reads reserved.
const QUERY: &str =
    r#"{ repository(name: "acme/app") { tag(name: "t01") { manifest { config { os } } } } }"#;

/// 60 reads an hour, 20 at most at once: nothing refills while the test runs.
fn config(redis: &RedisServer) -> Config {
    let mut config = Config::default();
    config.redis.url = redis.url();
    config.redis.failure_mode = FailureMode::Open;
    config.rate_limit.requests_per_minute = 100_000;
    config.quota = QuotaConfig::default().reads(60).period_secs(3600).burst(20);
    config
}

/// Sends [`QUERY`] from `peer` to `router` `n` times: the requests answered
/// (200); every other one is a 429 `QUOTA_EXHAUSTED`.
async fn answered(router: &Router, peer: &str, n: usize) -> usize {
    let body = json!({ "query": QUERY }).to_string();
    let mut answered = 0;
    for _ in 0..n {
        let (status, _, body) = post_from(router, &body, peer, &[]).await;
        match status {
            200 => answered += 1,
            429 => assert_eq!(
                body["errors"][0]["extensions"]["code"], "QUOTA_EXHAUSTED",
                "{body}"
            ),
            other => panic!("status {other}: {body}"),
        }
    }
    answered
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_starts_from_what_the_fleet_last_said_never_from_a_full_bucket() {
    let Some(mut redis) = RedisServer::start().await else {
        return;
    };
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let config = config(&redis);
    let fleet: Vec<Gateway> = (0..2)
        .map(|_| app::build(config.clone(), registry.url().parse().unwrap(), None))
        .collect();
    let (a, b) = (&fleet[0].router, &fleet[1].router);
    let spent = "198.18.0.40:1";
    // The client spends its burst on A, with Redis up.
    let before = registry.counters().requests();
    let first = answered(a, spent, 12).await;
    let reads = registry.counters().requests() - before;
    assert!(
        first < 12,
        "refused once its burst is spent ({first} answered)"
    );
    assert!(reads <= 20, "{reads} reads of a burst of 20");

    redis.kill();
    // A knew the client spent: its fallback refuses it. A keeps Redis's
    // last refusal for a second and answers from it: the requests go on
    // for a second and a half, so the later ones find Redis down and fall
    // back.
    let before = registry.counters().requests();
    let mut again = 0;
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_millis(1500) {
        again += answered(a, spent, 1).await;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await; // pacing
    }
    let reads_a = registry.counters().requests() - before;
    eprintln!("Redis down: the spent client got {again} answers ({reads_a} reads) on A");
    assert_eq!(
        (again, reads_a),
        (0, 0),
        "the replica that knew the client spent handed it a fresh bucket"
    );
    // B never heard of it: at most half its burst, 10 reads.
    let before = registry.counters().requests();
    let on_b = answered(b, spent, 8).await;
    let reads_b = registry.counters().requests() - before;
    eprintln!("Redis down: the spent client got {on_b} answers ({reads_b} reads) on B");
    assert!(
        reads_b <= 10,
        "{on_b} answers, {reads_b} reads on a replica that never heard of the client: \
         more than its share (10 of a burst of 20)"
    );
    assert!(on_b >= 1, "its share is served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_per_ip_fallback_starts_from_what_the_fleet_last_said() {
    let Some(mut redis) = RedisServer::start().await else {
        return;
    };
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let mut config = config(&redis);
    config.quota = QuotaConfig::default();
    // A request a second, 60 at once.
    config.rate_limit.requests_per_minute = 60;
    let fleet: Vec<Gateway> = (0..2)
        .map(|_| app::build(config.clone(), registry.url().parse().unwrap(), None))
        .collect();
    let (a, b) = (&fleet[0].router, &fleet[1].router);
    let peer = "198.18.0.41:1";
    let sent = std::time::Instant::now();
    let first = admitted_across(&[a], peer, 70).await;
    // A request a second refills while the 70 are sent (slow on a loaded
    // machine); a fallback that starts afresh admits about 60 more below.
    let refilled = sent.elapsed().as_secs() as usize + 1;
    assert!(
        (60..=60 + refilled).contains(&first),
        "{first} admitted of 60 (and what refilled in {:?})",
        sent.elapsed()
    );

    let spent_at = std::time::Instant::now();
    redis.kill();
    // A keeps Redis's refusal until the next admission (a second), then
    // finds Redis down and falls back: from the fleet's last answer, about
    // one request refills meanwhile.
    let mut again = 0;
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_millis(2000) {
        again += admitted_across(&[a], peer, 1).await;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await; // pacing
    }
    // A request a second since the fleet's last answer: 3 in the 2 s (more
    // if the loop overruns on a loaded machine); a fresh bucket is about 60.
    let refilled = (spent_at.elapsed().as_secs() as usize + 1).min(8);
    eprintln!("Redis down: the spent client admitted {again} times on A in 2 s");
    assert!(
        again <= refilled,
        "{again} admitted since the fleet's last answer ({refilled} refilled at most): \
         a fresh bucket"
    );
    // B never heard of it: half its limit.
    let on_b = admitted_across(&[b], peer, 60).await;
    eprintln!("Redis down: the spent client admitted {on_b} times on B");
    assert!(on_b <= 31, "{on_b} admitted on B: more than half the limit");
}
