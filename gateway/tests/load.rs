//! Load: 1,000 concurrent inbound requests — mixed batches, hung and failing
//! tags — for a bounded time against the embedded registry. No panics,
//! every answer well-formed, the host cap holds at the upstream, memory
//! stays bounded (peak RSS is printed).
mod common;

use common::*;
use fanout_budget::config::HostConfig;
use fanout_budget::Config;
use fanout_gateway::embedded::{EmbeddedRegistry, Fault};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn rss_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_requests() {
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    registry.set_latency(Some(Duration::from_millis(5)));
    registry.set_tag_fault("acme/app", "t03", Some(Fault::Hang));
    registry.set_tag_fault("acme/app", "t05", Some(Fault::Status(500)));
    registry.set_tag_fault("acme/app", "t07", Some(Fault::Garbage));
    let cap = 32;
    let mut config = Config::default();
    config.budget.read_timeout_ms = 300;
    config.budget.deadline_ms = 5_000;
    // In-process requests carry no peer address; the limiter is not under test here.
    config.rate_limit.requests_per_minute = 1_000_000;
    config.hosts.insert(
        registry.host(),
        HostConfig::default()
            .max_concurrent(cap)
            .acquire_wait_ms(2_000),
    );
    let gateway = fanout_gateway::app::build(config, registry.url().parse().unwrap(), None);

    // Samples the engine's own in-flight count while the load runs.
    let sampled_peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sampler = {
        let (engine, host, peak) = (
            gateway.engine.clone(),
            registry.host(),
            sampled_peak.clone(),
        );
        tokio::spawn(async move {
            loop {
                peak.fetch_max(
                    engine.hosts().in_flight(&host),
                    std::sync::atomic::Ordering::SeqCst,
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let rss_before = rss_kib("VmRSS:");
    let started = Instant::now();
    let tasks: Vec<_> = (0..1_000)
        .map(|i| {
            let router = gateway.router.clone();
            let first = 2 + i % 9;
            let ops = match i % 3 {
                0 => json!({ "query": format!(r#"{{ repository(name: "acme/app") {{ tags(first: {first}) {{ nodes {{ name manifest {{ digest }} }} }} }} }}"#) }),
                1 => json!([
                    { "query": format!(r#"{{ repository(name: "acme/app") {{ tag(name: "t{:02}") {{ manifest {{ config {{ os }} }} }} }} }}"#, i % 10) },
                    { "query": r#"{ repositories(first: 5) { nodes { name } } fanoutBudget { used } }"# }
                ]),
                _ => json!([
                    { "query": r#"{ repository(name: "acme/multi") { tag(name: "latest") { manifest { manifests { digest } config { os } } } } }"# },
                    { "query": r#"{ repository(name: "no/such") { name } }"# },
                    { "query": "{ this is not graphql" }
                ]),
            };
            tokio::spawn(async move { (i, post(&router, ops.to_string(), &[]).await) })
        })
        .collect();
    let mut answered = 0;
    for task in tasks {
        let (i, (status, body)) = tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("bounded")
            .expect("no panic");
        assert_eq!(status, 200, "request {i}: {body}");
        let responses = match &body {
            Value::Array(items) => items.clone(),
            other => vec![other.clone()],
        };
        for r in &responses {
            assert!(
                r.get("data").is_some() || r.get("errors").is_some(),
                "request {i}: {r}"
            );
            assert!(
                r["extensions"]["fanout"]["used"].as_u64().is_some() || r["errors"].is_array(),
                "request {i}: {r}"
            );
            for e in r["errors"].as_array().into_iter().flatten() {
                assert!(e["message"].is_string(), "request {i}: {e}");
            }
        }
        answered += 1;
    }
    let took = started.elapsed();
    sampler.abort();
    assert_eq!(answered, 1_000);
    // Reads the upstream is working on never exceed the cap. (Hung reads we
    // abandoned at their timeout stay "in flight" at the upstream until it
    // notices the closed connection, so its raw peak can briefly pass the
    // cap by those; the engine's own count never does.)
    let working = registry.counters().working_peak();
    assert!(
        working <= cap as u64,
        "upstream worked on {working} reads at once, cap {cap}"
    );
    let engine_peak = sampled_peak.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        engine_peak <= cap as u64,
        "engine held {engine_peak} slots, cap {cap}"
    );
    let peak = registry.counters().peak();
    assert_eq!(gateway.engine.hosts().in_flight(&registry.host()), 0);
    println!(
        "1,000 concurrent requests: {took:?}, {} upstream reads, upstream working peak {working}/{cap} (raw {peak}), engine peak {engine_peak}, RSS {rss_before} KiB before, peak {} KiB",
        registry.counters().requests(),
        rss_kib("VmHWM:")
    );
    assert!(rss_kib("VmHWM:") < 1024 * 1024, "peak RSS over 1 GiB");
}
