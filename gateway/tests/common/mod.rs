//! Shared fixtures: the embedded registry with known data, the gateway on it,
//! and request helpers.
#![allow(dead_code, unused_imports)] // each test uses a part

pub mod loopback;
pub mod push;

use axum::Router;
use fanout_budget::Config;
use fanout_gateway::app::{self, Gateway};
pub use fanout_gateway::embedded::{EmbeddedRegistry, Image, Store};
use serde_json::{json, Value};
use std::time::Duration;

pub use fanout_testkit::{free_port, require_binary, require_path, RedisServer};

pub struct Fixture {
    pub registry: EmbeddedRegistry,
    pub gateway: Gateway,
}

impl Fixture {
    pub async fn new(config: Config) -> Self {
        let registry = EmbeddedRegistry::fixture().await.unwrap();
        let gateway = app::build(config, registry.url().parse().unwrap(), None);
        Self { registry, gateway }
    }

    pub async fn default() -> Self {
        Self::new(Config::default()).await
    }

    pub fn reads(&self) -> u64 {
        self.registry.counters().requests()
    }

    pub async fn post(&self, body: impl Into<String>) -> (u16, Value) {
        post(&self.gateway.router, body.into(), &[]).await
    }

    pub async fn query(&self, query: &str) -> Value {
        let (status, body) = self.post(json!({ "query": query }).to_string()).await;
        assert_eq!(status, 200, "{body}");
        body
    }

    pub async fn batch(&self, queries: &[String]) -> Vec<Value> {
        let body = Value::Array(queries.iter().map(|q| json!({ "query": q })).collect());
        let (status, body) = self.post(body.to_string()).await;
        assert_eq!(status, 200, "{body}");
        body.as_array().unwrap().clone()
    }
}

/// POSTs `body` with `headers` in process; status and JSON.
pub async fn post(router: &Router, body: String, headers: &[(&str, &str)]) -> (u16, Value) {
    let answer = fanout_testkit::post(router, body, headers).await;
    (answer.status.as_u16(), answer.json())
}

/// POSTs from a TCP peer (as `ConnectInfo`), with headers; status, headers, JSON.
pub async fn post_from(
    router: &Router,
    body: &str,
    peer: &str,
    headers: &[(&str, &str)],
) -> (u16, axum::http::HeaderMap, Value) {
    let request = fanout_testkit::graphql_request(body, headers, Some(peer.parse().unwrap()));
    let answer = fanout_testkit::call(router, request).await;
    (
        answer.status.as_u16(),
        answer.headers.clone(),
        answer.json(),
    )
}

/// A query that reads nothing.
pub const CHEAP: &str = r#"{"query":"{ fanoutBudget { limit } }"}"#;

/// Sends `n` cheap requests from `peer`, turn about to each of `routers`;
/// how many were admitted (200). Every other one must be a 429 with a
/// `Retry-After` of at least a second.
pub async fn admitted_across(routers: &[&Router], peer: &str, n: usize) -> usize {
    let mut admitted = 0;
    for i in 0..n {
        let (status, headers, _) = post_from(routers[i % routers.len()], CHEAP, peer, &[]).await;
        match status {
            200 => admitted += 1,
            429 => {
                let retry_after = headers["retry-after"].to_str().unwrap();
                assert!(retry_after.parse::<u64>().unwrap() >= 1, "{retry_after}");
            }
            other => panic!("status {other}"),
        }
    }
    admitted
}

/// Three concurrent requests per replica of ten manifests each (after their
/// tag list), turn about through `replicas`, which cap `registry`'s host at
/// four reads in flight and wait for a slot as long as it takes, while each
/// read takes 40 ms: all are answered without error, and the registry saw
/// at most four in flight at once (and at least two: the cap was pressed).
pub async fn a_cap_of_four_holds_across(replicas: &[&Gateway], registry: &EmbeddedRegistry) {
    registry.set_latency(Some(Duration::from_millis(40)));
    let query = json!({ "query": r#"{ repository(name: "acme/app") { tags(first: 10) { nodes { manifest { digest } } } } }"# }).to_string();
    let mut tasks = Vec::new();
    for i in 0..3 * replicas.len() {
        let router = replicas[i % replicas.len()].router.clone();
        let query = query.clone();
        tasks.push(tokio::spawn(async move {
            post_from(&router, &query, &format!("192.0.2.{i}:1"), &[]).await
        }));
    }
    for t in tasks {
        let (status, _, body) = t.await.unwrap();
        assert_eq!(status, 200);
        assert!(body.get("errors").is_none(), "{body}");
    }
    let peak = registry.counters().peak();
    assert!(
        (2..=4).contains(&peak),
        "upstream saw {peak} in flight across {} replicas with a shared cap of 4",
        replicas.len()
    );
}

/// Queries with their exact worst-case reads under the gateway's cost table
/// (query, variables, requested): the cost preview's reference cases.
pub fn cost_cases() -> Vec<(&'static str, Value, u64)> {
    vec![
        // A single field: one tag list.
        (r#"{ repository(name: "acme/app") { name } }"#, json!({}), 1),
        // Nothing that reads.
        ("{ fanoutBudget { limit } }", json!({}), 0),
        // A nested list, first: 20 (manifest + config per tag); the tag
        // list is the repository's one read, not a second.
        (
            r#"{ repository(name: "acme/app") { tags(first: 20) { nodes { manifest { config { os } } } } } }"#,
            json!({}),
            1 + 20 * 2,
        ),
        // The default first (20) counts when first is absent.
        (
            r#"{ repository(name: "acme/app") { tags { nodes { manifest { digest } } } } }"#,
            json!({}),
            1 + 20,
        ),
        // CONTRACT §5's worst case: tag list, manifest, config.
        (
            r#"{ repository(name: "acme/app") { tag(name: "t01") { manifest { config { os } } } } }"#,
            json!({}),
            3,
        ),
        // Two fields of one repository share its tag list.
        (
            r#"{ repository(name: "acme/app") { tag(name: "t01") { name } tags(first: 2) { nodes { name } } } }"#,
            json!({}),
            1,
        ),
        // Aliases count separately (the worst case ignores de-duplication).
        (
            r#"{ a: repository(name: "acme/app") { name } b: repository(name: "acme/app") { name } }"#,
            json!({}),
            2,
        ),
        // Fragments and inline fragments (a fragment is priced on its own,
        // so its `tag` counts the tag list again: still an upper bound).
        (
            r#"query { repository(name: "acme/app") { ...T } } fragment T on Repository { tag(name: "t01") { ... on Tag { manifest { digest } } } }"#,
            json!({}),
            1 + 1 + 1,
        ),
        // Catalog pages multiply through repositories' own tag lists; a
        // repository's `tags` and `tag` share its one.
        (
            r#"{ repositories(first: 3) { nodes { tags(first: 2) { nodes { manifest { digest } } } tag(name: "x") { name } } } }"#,
            json!({}),
            1 + 3 * (1 + 2),
        ),
        // Variables, given and defaulted.
        (
            r#"query($n: Int!) { repositories(first: $n) { nodes { tag(name: "x") { name } } } }"#,
            json!({"n": 4}),
            1 + 4,
        ),
        (
            r#"query($n: Int! = 6) { repositories(first: $n) { nodes { tag(name: "x") { name } } } }"#,
            json!({}),
            1 + 6,
        ),
    ]
}
