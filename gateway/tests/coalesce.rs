//! Coalescing across requests: 1,000 concurrent inbound
//! requests, each for one repository's first 10 tags and their manifests,
//! against the embedded registry. With `[hosts."…"] coalesce = true` the
//! registry sees one tag list and 10 manifest reads; without it, every
//! request reads its own.
//!
//! The registry holds the tag list (gate 0), then the manifests (gate 1),
//! until the reads it has received and the reads the gateway coalesced
//! (`fanout_coalesced_reads_total`, from `/metrics`) account for every one
//! of the 1,000 requests: the gates open on what was counted, never on a
//! clock. Without coalescing the counts could never add up, and the wait
//! fails after a generous bound.
mod common;

use common::*;
use fanout_budget::config::HostConfig;
use fanout_budget::Config;
use fanout_gateway::embedded::{EmbeddedRegistry, Fault};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::json;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

const REQUESTS: u64 = 1_000;
const TAGS: u64 = 10;
const QUERY: &str = r#"{ repository(name: "acme/app") { tags(first: 10) { nodes { name manifest { digest } } } } }"#;

/// The process's Prometheus recorder (installed once: the tests of this
/// binary tell their hosts apart by the registry's port).
fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .install_recorder()
            .expect("the only recorder of this test binary")
    })
}

/// `fanout_coalesced_reads_total{host}` in a Prometheus text page.
fn coalesced(page: &str, host: &str) -> u64 {
    let series = format!("fanout_coalesced_reads_total{{host=\"{host}\"}} ");
    page.lines()
        .find_map(|line| line.strip_prefix(&series))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// Yields until `done()`; a wait that does not end within a generous bound
/// fails with what it saw.
async fn until(what: &str, mut done: impl FnMut() -> Result<(), String>) {
    let started = std::time::Instant::now();
    loop {
        let Err(saw) = done() else { return };
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "still waiting for {what}: {saw}"
        );
        tokio::task::yield_now().await;
    }
}

/// What the registry saw: tag-list reads and manifest reads.
struct Seen {
    tag_lists: u64,
    manifests: u64,
}

/// 1,000 concurrent requests for the first 10 tags of `acme/app` and their
/// manifests; every answer checked.
async fn thousand_requests(coalesce: bool) -> Seen {
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let host = registry.host();
    let mut config = Config::default();
    // In-process requests share one peer address; the limiter is not under test.
    config.rate_limit.requests_per_minute = 1_000_000;
    // The held reads wait for every request to join (and, without
    // coalescing, 11,000 reads queue for the host's slots): generous bounds.
    config.budget.read_timeout_ms = 120_000;
    config.budget.deadline_ms = 240_000;
    // Without coalescing 11,000 reads queue for the host's 256 slots.
    let table = HostConfig::default()
        .coalesce(coalesce)
        .acquire_wait_ms(30_000);
    config.hosts.insert(host.clone(), table);
    let tags: Vec<String> = (0..TAGS).map(|i| format!("t{i:02}")).collect();
    if coalesce {
        registry.set_repo_fault("acme/app", Some(Fault::Held(0)));
        for tag in &tags {
            registry.set_tag_fault("acme/app", tag, Some(Fault::Held(1)));
        }
    }
    let handle = recorder();
    let render = Arc::new(move || handle.render());
    let gateway = fanout_gateway::app::build(config, registry.url().parse().unwrap(), Some(render));

    let body = json!({ "query": QUERY }).to_string();
    let tasks: Vec<_> = (0..REQUESTS)
        .map(|_| {
            let (router, body) = (gateway.router.clone(), body.clone());
            tokio::spawn(async move { post(&router, body, &[]).await })
        })
        .collect();

    let counters = registry.counters();
    let started = std::time::Instant::now();
    let tag_list = "/v2/acme/app/tags/list";
    if coalesce {
        // One request reads the tag list; the 999 others join it.
        until("one tag list read, 999 joined", || {
            let (sent, joined) = (counters.path(tag_list), coalesced(&handle.render(), &host));
            (sent == 1 && joined == REQUESTS - 1)
                .then_some(())
                .ok_or(format!("{sent} sent, {joined} joined"))
        })
        .await;
        registry.release(0);
        println!("tag list joined after {:?}", started.elapsed());
        // Ten manifest reads; every other request's ten join them.
        let joins = REQUESTS - 1 + (REQUESTS - 1) * TAGS;
        until("ten manifest reads, the rest joined", || {
            let sent = counters.matching("/manifests/");
            let joined = coalesced(&handle.render(), &host);
            (sent == TAGS && joined == joins)
                .then_some(())
                .ok_or(format!("{sent} sent, {joined} joined"))
        })
        .await;
        registry.release(1);
        println!("manifests joined after {:?}", started.elapsed());
    }

    let digests: Vec<String> = registry.with_store(|store| {
        let repo = &store.repos["acme/app"];
        tags.iter().map(|t| repo.tags[t].clone()).collect()
    });
    let (mut used, mut operation_reads) = (0, 0);
    for task in tasks {
        let (status, body) = tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .expect("every request is answered in time")
            .expect("no panic");
        assert_eq!(status, 200, "{body}");
        assert!(body.get("errors").is_none(), "{body}");
        let nodes = body["data"]["repository"]["tags"]["nodes"]
            .as_array()
            .unwrap_or_else(|| panic!("{body}"));
        let answered: Vec<(&str, &str)> = nodes
            .iter()
            .map(|n| {
                let name = n["name"].as_str().unwrap();
                (name, n["manifest"]["digest"].as_str().unwrap())
            })
            .collect();
        let expected: Vec<(&str, &str)> = tags
            .iter()
            .map(String::as_str)
            .zip(digests.iter().map(String::as_str))
            .collect();
        assert_eq!(answered, expected);
        let fanout = &body["extensions"]["fanout"];
        used += fanout["used"].as_u64().unwrap();
        operation_reads += fanout["operationReads"].as_u64().unwrap();
    }
    println!("answered after {:?}", started.elapsed());
    let seen = Seen {
        tag_lists: counters.path(tag_list),
        manifests: counters.matching("/manifests/"),
    };
    // Only the reads sent were charged, each to the request that sent it.
    assert_eq!(used, seen.tag_lists + seen.manifests);
    assert_eq!(operation_reads, used);
    assert_eq!(gateway.engine.hosts().in_flight(&host), 0);
    let page = fanout_testkit::metrics_page(&gateway.router).await;
    let joined = REQUESTS * (1 + TAGS) - used;
    assert_eq!(coalesced(&page, &host), joined, "/metrics counts the joins");
    println!(
        "{REQUESTS} concurrent requests × {TAGS} manifests, coalesce = {coalesce}: {} tag-list and {} manifest reads upstream, {joined} coalesced",
        seen.tag_lists, seen.manifests
    );
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_requests_for_the_same_ten_manifests_make_ten_manifest_reads() {
    let seen = thousand_requests(true).await;
    assert_eq!(seen.tag_lists, 1);
    assert!(seen.manifests <= TAGS, "{} manifest reads", seen.manifests);
}

/// The same load without coalescing: every request reads its own — the
/// figure the test above would see if coalescing did nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_coalescing_every_request_reads_its_own_manifests() {
    let seen = thousand_requests(false).await;
    assert_eq!(seen.tag_lists, REQUESTS);
    assert_eq!(seen.manifests, REQUESTS * TAGS);
    assert!(seen.manifests > TAGS);
}
