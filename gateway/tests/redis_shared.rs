//! Shared limits on a real `redis-server`: two replicas, one limit; a
//! crashed replica's slots expire; Redis killed, paused and restarted.
mod common;

use common::*;
use fanout_budget::backends::redis::{RedisBackend, RedisHostCaps};
use fanout_budget::config::{FailureMode, HostConfig};
use fanout_budget::{read::HostLimiter, Config};
use fanout_gateway::app::{self, Gateway};
use fanout_gateway::embedded::EmbeddedRegistry;
use fanout_testkit::until;
use serde_json::json;
use std::time::{Duration, Instant};

fn config(redis: &RedisServer, mode: FailureMode, rpm: u32) -> Config {
    let mut config = Config::default();
    config.redis.url = redis.url();
    config.redis.failure_mode = mode;
    config.rate_limit.requests_per_minute = rpm;
    config
}

fn replica(config: &Config, registry: &EmbeddedRegistry) -> Gateway {
    app::build(config.clone(), registry.url().parse().unwrap(), None)
}

#[tokio::test]
async fn two_replicas_share_one_per_ip_limit() {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let config = config(&redis, FailureMode::Closed, 5);
    let (a, b) = (replica(&config, &registry), replica(&config, &registry));
    let admitted = admitted_across(&[&a.router, &b.router], "192.0.2.10:1", 10).await;
    assert_eq!(admitted, 5, "5/min across both replicas");
    assert_eq!(
        redis.keys("fanout:ip:*").await,
        vec!["fanout:ip:192.0.2.10".to_string()]
    );

    // Another deployment with its own prefix on the same Redis has its own limit.
    let mut other = config.clone();
    other.redis.key_prefix = "other".into();
    let c = replica(&other, &registry);
    assert_eq!(
        post_from(&c.router, CHEAP, "192.0.2.10:1", &[]).await.0,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_cap_of_four_holds_across_two_replicas() {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let mut config = config(&redis, FailureMode::Closed, 10_000);
    config.hosts.insert(
        registry.host(),
        HostConfig::default()
            .max_concurrent(4)
            .acquire_wait_ms(30_000),
    );
    // A lease far longer than the wait below: a share never given back
    // would still be held at its end (the hash lapses two leases on).
    config.redis.lease_ms = 30_000;
    let (a, b) = (replica(&config, &registry), replica(&config, &registry));
    a_cap_of_four_holds_across(&[&a, &b], &registry).await;
    // Idle, both replicas gave every slot back (long before the lease).
    let key = format!("fanout:shares:{}", registry.host());
    until("given back", Duration::from_secs(10), async || {
        redis.slots_held(&key).await == 0
    })
    .await;
}

/// A host without a `[hosts]` table is never on Redis: reads to 1,000
/// distinct such hosts (redirect targets, `permit` names) through the
/// shared caps leave no key there, and are counted locally only while in
/// flight.
#[tokio::test]
async fn hosts_without_a_table_leave_nothing_on_redis() {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let mut config = config(&redis, FailureMode::Closed, 10_000);
    config
        .hosts
        .insert("capped.example:80".into(), HostConfig::default());
    let caps = RedisHostCaps::new(
        config.hosts.clone(),
        RedisBackend::new(&config.redis).unwrap(),
    );
    for i in 0..1_000 {
        let host = format!("h{i}.example:80");
        let slot = caps.acquire(&host, Duration::from_secs(1)).await.unwrap();
        assert_eq!(caps.in_flight(&host), 1);
        drop(slot);
        assert_eq!(caps.in_flight(&host), 0);
    }
    assert_eq!(redis.keys("*").await, Vec::<String>::new());
}

#[tokio::test]
async fn a_crashed_replicas_slots_free_up_after_the_lease() {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let mut config = config(&redis, FailureMode::Closed, 300);
    config.redis.lease_ms = 600;
    let host = "upstream.test:5000".to_string();
    config.hosts.insert(
        host.clone(),
        HostConfig::default().max_concurrent(2).acquire_wait_ms(20),
    );
    // The crashed replica held both slots and never reported again: its
    // field of the host's hash, lapsing a lease after its last claim.
    let key = format!("{}:shares:{host}", config.redis.key_prefix);
    held_without_refresh(&redis.url(), &key, "dead", 2, config.redis.lease_ms).await;
    let taken_at = Instant::now();
    let alive = RedisHostCaps::new(
        config.hosts.clone(),
        RedisBackend::new(&config.redis).unwrap(),
    );
    let err = alive
        .acquire(&host, Duration::from_secs(10))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "HOST_SATURATED");
    let mut freed = None;
    for _ in 0..200 {
        if let Ok(slot) = alive.acquire(&host, Duration::from_secs(10)).await {
            freed = Some((taken_at.elapsed(), slot));
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (after, _slot) = freed.expect("the dead replica's slots free up");
    assert!(
        after >= Duration::from_millis(500),
        "freed after {after:?}, before the 600 ms lease"
    );
    assert!(after < Duration::from_secs(3), "freed only after {after:?}");
}

#[tokio::test]
async fn a_held_slot_outlives_its_lease_while_renewed() {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let mut config = config(&redis, FailureMode::Closed, 300);
    config.redis.lease_ms = 300;
    let host = "upstream.test:5001".to_string();
    config.hosts.insert(
        host.clone(),
        HostConfig::default().max_concurrent(1).acquire_wait_ms(10),
    );
    let caps = RedisHostCaps::new(
        config.hosts.clone(),
        RedisBackend::new(&config.redis).unwrap(),
    );
    let other = RedisHostCaps::new(
        config.hosts.clone(),
        RedisBackend::new(&config.redis).unwrap(),
    );
    let slot = caps.acquire(&host, Duration::from_secs(5)).await.unwrap();
    // Three lease lengths later, the renewed lease still holds the slot.
    let until = Instant::now() + Duration::from_millis(900);
    while Instant::now() < until {
        assert!(other.acquire(&host, Duration::from_secs(5)).await.is_err());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(slot);
    let mut got = false;
    for _ in 0..100 {
        if other.acquire(&host, Duration::from_secs(5)).await.is_ok() {
            got = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(got, "a dropped slot is released");
}

/// Sends `n` requests, one after another; each one's status and duration.
async fn load(gateway: &Gateway, n: usize) -> Vec<(u16, Duration)> {
    let mut out = Vec::new();
    for i in 0..n {
        let started = Instant::now();
        let (status, _, _) = post_from(
            &gateway.router,
            CHEAP,
            &format!("198.51.100.{}:1", i % 200),
            &[],
        )
        .await;
        out.push((status, started.elapsed()));
    }
    out
}

#[tokio::test]
async fn redis_killed_with_open_keeps_serving_and_shared_limits_resume() {
    let Some(mut redis) = RedisServer::start().await else {
        return;
    };
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let gateway = replica(&config(&redis, FailureMode::Open, 10_000), &registry);
    assert!(load(&gateway, 5).await.iter().all(|(s, _)| *s == 200));
    redis.kill();
    for (status, took) in load(&gateway, 30).await {
        assert_eq!(status, 200, "open: served while Redis is down");
        assert!(
            took < Duration::from_secs(1),
            "a request took {took:?} while Redis was down"
        );
    }
    redis.restart().await;
    let mut resumed = false;
    for _ in 0..100 {
        load(&gateway, 1).await;
        if !redis.keys("fanout:ip:*").await.is_empty() {
            resumed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        resumed,
        "shared limits did not resume after Redis came back"
    );
}

#[tokio::test]
async fn redis_killed_with_closed_answers_503_and_recovers() {
    let Some(mut redis) = RedisServer::start().await else {
        return;
    };
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let gateway = replica(&config(&redis, FailureMode::Closed, 10_000), &registry);
    assert!(load(&gateway, 3).await.iter().all(|(s, _)| *s == 200));
    redis.kill();
    for (status, took) in load(&gateway, 20).await {
        assert_eq!(status, 503, "closed: refused while Redis is down");
        assert!(
            took < Duration::from_secs(1),
            "a request took {took:?} while Redis was down"
        );
    }
    let (_, _, body) = post_from(&gateway.router, CHEAP, "198.51.100.1:1", &[]).await;
    assert_eq!(body["errors"][0]["extensions"]["code"], "UNAVAILABLE");
    redis.restart().await;
    let mut recovered = false;
    for _ in 0..100 {
        if load(&gateway, 1).await[0].0 == 200 {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(recovered, "requests are served again after Redis returns");
}

#[tokio::test]
async fn a_paused_redis_is_bounded_by_the_call_timeout() {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let gateway = replica(&config(&redis, FailureMode::Open, 10_000), &registry);
    assert!(load(&gateway, 2).await.iter().all(|(s, _)| *s == 200));
    redis.signal("STOP");
    let answers = load(&gateway, 5).await;
    redis.signal("CONT");
    for (status, took) in answers {
        assert_eq!(status, 200);
        assert!(
            took < Duration::from_secs(1),
            "a request took {took:?} with Redis paused (timeout 100 ms)"
        );
    }
}

#[tokio::test]
async fn redis_down_at_start_up_does_not_stop_start_up() {
    let Some(mut redis) = RedisServer::start().await else {
        return;
    };
    redis.kill();
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let gateway = replica(&config(&redis, FailureMode::Open, 10_000), &registry);
    assert_eq!(load(&gateway, 1).await[0].0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_redis_costs_no_timeout_per_request() {
    let Some(mut redis) = RedisServer::start().await else {
        return;
    };
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let mut config = config(&redis, FailureMode::Open, 10_000);
    config.redis.timeout_ms = 2_000;
    config.redis.backoff_ms = 200;
    config.hosts.insert(
        registry.host(),
        HostConfig::default()
            .max_concurrent(8)
            .acquire_wait_ms(1_000),
    );
    let gateway = replica(&config, &registry);
    // One read (the tag list), so one host lease and one per-IP check.
    let query = json!({ "query": r#"{ repository(name: "acme/app") { name } }"# }).to_string();
    let timed = async |n: usize| {
        let mut took = Vec::new();
        for i in 0..n {
            let started = Instant::now();
            let (status, _, body) =
                post_from(&gateway.router, &query, &format!("198.51.100.{i}:1"), &[]).await;
            took.push(started.elapsed());
            assert_eq!(status, 200);
            assert!(body.get("errors").is_none(), "{body}");
            assert_eq!(body["extensions"]["fanout"]["used"], 1, "{body}");
        }
        took
    };
    let healthy = timed(5).await;
    redis.kill();
    let dead = timed(20).await;
    println!("1-read request, Redis up: {healthy:?}; Redis dead (timeout 2000 ms): {dead:?}");
    // At most the first request after the kill meets the broken connection;
    // then the breaker is open and no request waits on Redis.
    for took in &dead[1..] {
        assert!(
            *took < Duration::from_millis(500),
            "a request took {took:?} with Redis dead and its breaker open"
        );
    }
}

/// What a replica that crashed holding `slots` leaves in Redis: its field
/// of the host's hash, lapsing `lease_ms` after now on Redis's clock, never
/// refreshed or removed.
async fn held_without_refresh(url: &str, key: &str, holder: &str, slots: u32, lease_ms: u64) {
    let script = redis::Script::new(
        "local t = redis.call('TIME') \
         local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
         redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. ARGV[2] .. ' ' .. (now + tonumber(ARGV[3]))) \
         redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) * 2) \
         return 1",
    );
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let added: i64 = script
        .key(key)
        .arg(holder)
        .arg(slots)
        .arg(lease_ms)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(added, 1);
}

/// `/metrics` shows this replica's share of a capped host: the slots its
/// last claim allowed (a read's, plus spare) and that the cap is not shared
/// out; once idle, the share goes back to 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_share_of_a_host_is_on_metrics() {
    let Some(redis) = RedisServer::start().await else {
        return;
    };
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let mut config = config(&redis, FailureMode::Closed, 10_000);
    config
        .hosts
        .insert(registry.host(), HostConfig::default().max_concurrent(16));
    // The share stays as claimed until the next refresh, 2 s on: long
    // enough to be seen on a loaded machine (the default 50 ms is not).
    (config.redis.lease_ms, config.redis.refresh_ms) = (30_000, 2_000);
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder of this test binary");
    let render = std::sync::Arc::new(move || handle.render());
    let gateway = app::build(config, registry.url().parse().unwrap(), Some(render));
    let gauge = async |name: &str| -> Option<f64> {
        let page = fanout_testkit::metrics_page(&gateway.router).await;
        let series = format!("{name}{{host=\"{}\"}} ", registry.host());
        page.lines().find_map(|line| {
            line.strip_prefix(&series)
                .map(|n| n.trim().parse().unwrap())
        })
    };
    // One read: the tag list.
    let query = json!({ "query": r#"{ repository(name: "acme/app") { name } }"# }).to_string();
    let (status, _, body) = post_from(&gateway.router, &query, "192.0.2.30:1", &[]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["extensions"]["fanout"]["used"], 1, "{body}");
    // One read wanted, up to 8 spare, at most half of the 15 left: 1 + 7
    // (set by the claimer as the claim is answered).
    until("the share's gauge", Duration::from_secs(10), async || {
        gauge("fanout_host_share_slots").await == Some(8.0)
    })
    .await;
    assert_eq!(gauge("fanout_host_share_busy").await, Some(0.0));
    until("given back", Duration::from_secs(10), async || {
        gauge("fanout_host_share_slots").await == Some(0.0)
    })
    .await;
}
