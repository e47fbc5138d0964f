//! Per-host caps: process-wide, counted at the upstream.
mod common;

use common::*;
use fanout_budget::config::HostConfig;
use fanout_budget::{Config, Engine};
use fanout_gateway::app;
use fanout_gateway::embedded::{EmbeddedRegistry, Fault};
use serde_json::{json, Value};
use std::time::Duration;

fn capped(host: &str, max_concurrent: u32, acquire_wait_ms: u64) -> Config {
    let mut config = Config::default();
    // In-process requests carry no peer address (one key); the inbound
    // limiter is not under test here.
    config.rate_limit.requests_per_minute = 1_000_000;
    config.hosts.insert(
        host.to_string(),
        HostConfig::default()
            .max_concurrent(max_concurrent)
            .acquire_wait_ms(acquire_wait_ms),
    );
    config
}

const TEN_ROWS: &str = r#"{ repository(name: "acme/app") { tags(first: 10) { nodes { name manifest { digest } } } } }"#;

async fn concurrent(router: &axum::Router, n: usize, query: &str) -> Vec<(u16, Value)> {
    let body = json!({ "query": query }).to_string();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (router, body) = (router.clone(), body.clone());
            tokio::spawn(async move { post(&router, body, &[]).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

fn codes(body: &Value) -> Vec<String> {
    body["errors"].as_array().map_or(vec![], |e| {
        e.iter()
            .map(|e| e["extensions"]["code"].as_str().unwrap_or("").to_string())
            .collect()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cap_of_four_holds_at_the_upstream_and_a_generous_wait_serves_every_row() {
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    registry.set_latency(Some(Duration::from_millis(50)));
    let gateway = app::build(
        capped(&registry.host(), 4, 30_000),
        registry.url().parse().unwrap(),
        None,
    );
    let answers = concurrent(&gateway.router, 6, TEN_ROWS).await;
    for (status, body) in &answers {
        assert_eq!(*status, 200);
        assert!(body.get("errors").is_none(), "{body}");
        assert_eq!(
            body["data"]["repository"]["tags"]["nodes"]
                .as_array()
                .unwrap()
                .len(),
            10
        );
    }
    let peak = registry.counters().peak();
    assert!(peak <= 4, "upstream saw {peak} in flight with a cap of 4");
    assert!(
        peak >= 2,
        "peak {peak}: the cap, not serial execution, should bound it"
    );
    assert_eq!(registry.counters().requests(), 6 * 11);
    assert_eq!(gateway.engine.hosts().in_flight(&registry.host()), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_saturated_host_nulls_rows_with_host_saturated_and_used_matches_the_upstream() {
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let gateway = app::build(
        capped(&registry.host(), 2, 20),
        registry.url().parse().unwrap(),
        None,
    );
    // The tag list is fast; the manifests are slow, so the cap fills up.
    for i in 0..10 {
        registry.set_tag_fault(
            "acme/app",
            &format!("t{i:02}"),
            Some(Fault::Delay(Duration::from_millis(300))),
        );
    }
    let answers = concurrent(&gateway.router, 3, TEN_ROWS).await;
    let mut saturated_rows = 0;
    let mut partial_pages = 0;
    let mut used = 0;
    for (status, body) in &answers {
        assert_eq!(*status, 200);
        used += body["extensions"]["fanout"]["used"].as_u64().unwrap();
        for error in body["errors"].as_array().into_iter().flatten() {
            let ext = &error["extensions"];
            assert_eq!(ext["code"], "HOST_SATURATED", "{error}");
            assert_eq!(ext["host"], registry.host());
            assert_eq!(ext["maxConcurrent"], 2);
            // Either a row's manifest, or (another request holding the slots)
            // the repository's own tag list.
            let path = error["path"].as_array().unwrap();
            match path.len() {
                1 => assert_eq!(error["path"], json!(["repository"])),
                _ => {
                    assert_eq!(
                        path[..3],
                        [json!("repository"), json!("tags"), json!("nodes")]
                    );
                    assert!(path[3].is_u64() && path[4] == "manifest", "{error}");
                    saturated_rows += 1;
                }
            }
        }
        // Partial data: rows with their manifest next to refused ones.
        if let Some(nodes) = body["data"]["repository"]["tags"]["nodes"].as_array() {
            assert_eq!(nodes.len(), 10);
            let served = nodes.iter().filter(|n| !n["manifest"].is_null()).count();
            if served > 0 && served < 10 {
                partial_pages += 1;
            }
        }
    }
    assert!(saturated_rows > 0, "no row was refused with a cap of 2");
    assert!(partial_pages > 0, "no page mixed served and refused rows");
    assert!(registry.counters().peak() <= 2);
    assert_eq!(
        used,
        registry.counters().requests(),
        "reported used = reads the upstream saw"
    );
}

#[tokio::test]
async fn a_cap_of_zero_sends_nothing() {
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let gateway = app::build(
        capped(&registry.host(), 0, 50),
        registry.url().parse().unwrap(),
        None,
    );
    let (status, body) = post(
        &gateway.router,
        json!({ "query": TEN_ROWS }).to_string(),
        &[],
    )
    .await;
    assert_eq!(status, 200);
    assert!(body["data"]["repository"].is_null());
    assert_eq!(codes(&body), vec!["HOST_SATURATED"]);
    assert_eq!(body["errors"][0]["extensions"]["maxConcurrent"], 0);
    assert_eq!(registry.counters().requests(), 0);
    assert_eq!(
        body["extensions"]["fanout"]["used"], 0,
        "a refused read is not charged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unlisted_host_is_not_capped() {
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    registry.set_latency(Some(Duration::from_millis(100)));
    // A cap of 0 on another host does not touch this one.
    let gateway = app::build(
        capped("127.0.0.1:1", 0, 50),
        registry.url().parse().unwrap(),
        None,
    );
    let answers = concurrent(&gateway.router, 2, TEN_ROWS).await;
    assert!(answers.iter().all(|(_, b)| b.get("errors").is_none()));
    assert!(
        registry.counters().peak() > 4,
        "peak {}",
        registry.counters().peak()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hosts_with_different_caps_are_enforced_independently() {
    let a = EmbeddedRegistry::fixture().await.unwrap();
    let b = EmbeddedRegistry::fixture().await.unwrap();
    a.set_latency(Some(Duration::from_millis(40)));
    b.set_latency(Some(Duration::from_millis(40)));
    let mut config = capped(&a.host(), 1, 30_000);
    config.hosts.insert(
        b.host(),
        HostConfig::default()
            .max_concurrent(3)
            .acquire_wait_ms(30_000),
    );
    // One engine (one process), two schemas over two registries.
    let engine = Engine::builder(config)
        .costs(fanout_gateway::schema::costs())
        .build();
    let ga = app::build_with(engine.clone(), a.url().parse().unwrap(), None);
    let gb = app::build_with(engine.clone(), b.url().parse().unwrap(), None);
    let (ra, rb) = tokio::join!(
        concurrent(&ga.router, 3, TEN_ROWS),
        concurrent(&gb.router, 3, TEN_ROWS)
    );
    assert!(ra
        .iter()
        .chain(&rb)
        .all(|(_, body)| body.get("errors").is_none()));
    assert_eq!(a.counters().peak(), 1);
    let peak_b = b.counters().peak();
    assert!((2..=3).contains(&peak_b), "host b peak {peak_b}, cap 3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_cancelled_requests_leak_no_slot() {
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let host = registry.host();
    let cap = 64;
    let mut config = capped(&host, cap, 60_000);
    config.budget.deadline_ms = 120_000;
    config.budget.read_timeout_ms = 120_000;
    let gateway = app::build(config, registry.url().parse().unwrap(), None);
    registry.set_tag_fault("acme/app", "t00", Some(Fault::Hang));
    // Each request reads one hung manifest (after its tag list).
    let query = json!({ "query": r#"{ repository(name: "acme/app") { tag(name: "t00") { manifest { digest } } } }"# }).to_string();
    let tasks: Vec<_> = (0..10_000)
        .map(|_| {
            let (router, body) = (gateway.router.clone(), query.clone());
            tokio::spawn(async move { post(&router, body, &[]).await })
        })
        .collect();
    // Wait (bounded) until the cap is full of hung reads, then cancel everything.
    let mut full = false;
    for _ in 0..600 {
        if gateway.engine.hosts().in_flight(&host) == cap as u64 {
            full = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        full,
        "the cap never filled: {} in flight",
        gateway.engine.hosts().in_flight(&host)
    );
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        assert!(t.await.unwrap_err().is_cancelled());
    }
    assert_eq!(gateway.engine.hosts().in_flight(&host), 0, "slots leaked");
    // The upstream sees the connections close.
    for _ in 0..200 {
        if registry.counters().in_flight() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(registry.counters().in_flight(), 0);

    // A full-cap burst still gets every slot at once.
    registry.counters().reset();
    let burst: Vec<_> = (0..cap)
        .map(|i| {
            let router = gateway.router.clone();
            let body = json!({ "query": format!(r#"{{ repository(name: "filler/r{:02}") {{ name }} }}"#, i % 30) }).to_string();
            registry.set_repo_fault(&format!("filler/r{:02}", i % 30), Some(Fault::Delay(Duration::from_millis(300))));
            tokio::spawn(async move { post(&router, body, &[]).await })
        })
        .collect();
    for t in burst {
        let (_, body) = t.await.unwrap();
        assert!(body.get("errors").is_none(), "{body}");
    }
    assert_eq!(gateway.engine.hosts().in_flight(&host), 0);
}
