//! The gateway's config blobs through the engine's cache of immutable
//! answers: read once by digest, checked against it, then answered to
//! every later request without a read (`cacheHits`); a registry that serves
//! other bytes under a digest plants nothing.
mod common;

use common::*;
use serde_json::Value;

const ONE_TAG: &str = r#"{ repository(name: "acme/app") { tag(name: "t01") { manifest { digest config { os architecture } } } } }"#;

fn fanout(answer: &Value) -> (u64, u64) {
    let f = &answer["extensions"]["fanout"];
    (
        f["operationReads"].as_u64().unwrap(),
        f["cacheHits"].as_u64().unwrap(),
    )
}

#[tokio::test]
async fn a_config_blob_is_read_once_then_answered_from_the_cache() {
    let f = Fixture::default().await;
    let cold = f.query(ONE_TAG).await;
    assert!(cold.get("errors").is_none(), "{cold}");
    assert_eq!(fanout(&cold), (3, 0), "tag list, manifest, config blob");
    for _ in 0..3 {
        f.registry.counters().reset();
        let warm = f.query(ONE_TAG).await;
        assert_eq!(warm["data"], cold["data"]);
        // The tag list and the manifest by tag are read again (a tag may
        // move); the config blob, addressed by its digest, is not.
        assert_eq!(fanout(&warm), (2, 1));
        assert_eq!(f.registry.counters().matching("/blobs/"), 0);
        assert_eq!(warm["extensions"]["fanout"]["used"], 2);
    }
}

#[tokio::test]
async fn a_blob_that_is_not_its_digest_is_refused_and_never_kept() {
    let f = Fixture::default().await;
    // The registry serves other bytes under t02's config digest.
    let digest = f.registry.with_store(|store| {
        let repo = store.repos.get_mut("acme/app").unwrap();
        let manifest = &repo.manifests[&repo.tags["t02"]];
        let body: Value = serde_json::from_slice(&manifest.body).unwrap();
        let digest = body["config"]["digest"].as_str().unwrap().to_string();
        repo.blobs.insert(
            digest.clone(),
            br#"{"os":"planted","architecture":"x"}"#.to_vec(),
        );
        digest
    });
    let query = ONE_TAG.replace("t01", "t02");
    for _ in 0..2 {
        let answer = f.query(&query).await;
        let manifest = &answer["data"]["repository"]["tag"]["manifest"];
        assert!(manifest["config"].is_null(), "{answer}");
        assert!(
            manifest["digest"].is_string(),
            "the rest answered: {answer}"
        );
        assert_eq!(answer["errors"][0]["extensions"]["code"], "UPSTREAM_ERROR");
        assert_eq!(fanout(&answer), (3, 0), "read again: never kept");
    }
    assert_eq!(
        f.registry
            .counters()
            .path(&format!("/v2/acme/app/blobs/{digest}")),
        2
    );
}

/// With `tag_ttl_ms`, what a tag says — the tag list, the manifest by tag —
/// is reused across requests for that long: a warm lookup reads nothing.
#[tokio::test]
async fn with_a_tag_ttl_a_warm_lookup_reads_nothing_until_it_expires() {
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let table = fanout_budget::config::UpstreamTable::default()
        .url(registry.url())
        .tag_ttl_ms(1500);
    let config = fanout_budget::Config::default().upstream_named("registry", table);
    let gateway = fanout_gateway::app::build(config, registry.url().parse().unwrap(), None);
    let ask = || async {
        let (status, body) = post(
            &gateway.router,
            serde_json::json!({ "query": ONE_TAG }).to_string(),
            &[],
        )
        .await;
        assert_eq!(status, 200, "{body}");
        body
    };
    let cold = ask().await;
    assert_eq!(fanout(&cold), (3, 0));
    let started = std::time::Instant::now();
    let warm = ask().await;
    // (Well inside the TTL unless the machine stalls for a second.)
    if started.elapsed() < std::time::Duration::from_millis(1200) {
        assert_eq!(warm["data"], cold["data"]);
        assert_eq!(
            fanout(&warm),
            (0, 3),
            "tag list, manifest and config from the cache"
        );
    }
    // Past the TTL the tag is read again; the blob, by digest, is not.
    tokio::time::sleep(std::time::Duration::from_millis(1600)).await;
    assert_eq!(fanout(&ask().await), (2, 1));
}

/// A request whose budget runs out in the middle of a tag list's pages
/// leaves nothing behind: the first page it kept (`tag_ttl_ms`) still
/// serves the next request, which walks the rest itself.
#[tokio::test]
async fn a_walk_cut_by_one_request_s_budget_does_not_poison_the_kept_page() {
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    registry.set_tag_page_size(Some(10));
    let table = fanout_budget::config::UpstreamTable::default()
        .url(registry.url())
        .tag_ttl_ms(60_000);
    let mut config = fanout_budget::Config::default().upstream_named("registry", table);
    config.budget.max_reads = 3;
    config.rate_limit.internal_token = "inside".into();
    let gateway = fanout_gateway::app::build(config, registry.url().parse().unwrap(), None);
    let query = serde_json::json!({ "query": r#"{ repository(name: "acme/app") { tags(first: 100) { totalCount } } }"# }).to_string();
    let (_, cut) = post(&gateway.router, query.clone(), &[]).await;
    assert_eq!(
        cut["errors"][0]["extensions"]["code"], "FANOUT_BUDGET_EXHAUSTED",
        "{cut}"
    );
    let (_, whole) = post(&gateway.router, query, &[("x-internal-token", "inside")]).await;
    assert!(whole.get("errors").is_none(), "{whole}");
    assert_eq!(whole["data"]["repository"]["tags"]["totalCount"], 60);
}

/// Under `tag_ttl_ms`, an answer the gateway could not use — a `200` whose
/// body is an HTML page, not a manifest — is `UPSTREAM_ERROR` for the
/// request that read it and is never served from the cache: the next
/// request reads the manifest again, and once the registry answers it
/// properly, the tag resolves at once.
#[tokio::test]
async fn an_answer_that_is_not_a_manifest_is_never_served_from_the_cache() {
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let table = fanout_budget::config::UpstreamTable::default()
        .url(registry.url())
        .tag_ttl_ms(600_000);
    let config = fanout_budget::Config::default().upstream_named("registry", table);
    let gateway = fanout_gateway::app::build(config, registry.url().parse().unwrap(), None);
    let query = r#"{ repository(name: "acme/app") { tag(name: "t01") { manifest { digest } } } }"#;
    let ask = || async {
        let body = serde_json::json!({ "query": query }).to_string();
        post(&gateway.router, body, &[]).await.1
    };
    let manifest = "/v2/acme/app/manifests/t01";
    registry.set_tag_fault(
        "acme/app",
        "t01",
        Some(fanout_gateway::embedded::Fault::Garbage),
    );
    for _ in 0..2 {
        let before = registry.counters().path(manifest);
        let answer = ask().await;
        assert_eq!(
            answer["errors"][0]["extensions"]["code"], "UPSTREAM_ERROR",
            "{answer}"
        );
        assert!(
            registry.counters().path(manifest) > before,
            "read again: {answer}"
        );
    }
    registry.set_tag_fault("acme/app", "t01", None);
    let before = registry.counters().path(manifest);
    let answer = ask().await;
    assert!(answer.get("errors").is_none(), "{answer}");
    assert!(answer["data"]["repository"]["tag"]["manifest"]["digest"].is_string());
    assert!(registry.counters().path(manifest) > before);
}
