//! Shared fixtures: the embedded registry with known data, the gateway on it,
//! and request helpers.
#![allow(dead_code, unused_imports)] // each test uses a part

use axum::Router;
use fanout_budget::Config;
use fanout_gateway::app::{self, Gateway};
use fanout_gateway::embedded::{EmbeddedRegistry, Image, Store};
use serde_json::{json, Value};
use tower::ServiceExt;

pub use fanout_testkit::{free_port, require_binary, RedisServer};

/// `acme/app` with tags t00..t59 (images), `acme/multi` with an index tag,
/// `org/team/deep` (a namespaced name), and 30 filler repositories.
pub fn store() -> Store {
    let mut store = Store::default();
    for i in 0..60 {
        let tag = format!("t{i:02}");
        store.put_image("acme/app", Some(&tag), &Image::demo("linux", "amd64", &tag));
    }
    let images = [
        Image::demo("linux", "amd64", "m"),
        Image {
            variant: Some("v8".into()),
            ..Image::demo("linux", "arm64", "m")
        },
    ];
    store.put_index("acme/multi", "latest", &images);
    store.put_image(
        "acme/multi",
        Some("single"),
        &Image::demo("linux", "amd64", "single"),
    );
    store.put_image(
        "org/team/deep",
        Some("v1"),
        &Image::demo("linux", "arm64", "deep"),
    );
    for i in 0..30 {
        store.put_image(
            &format!("filler/r{i:02}"),
            Some("latest"),
            &Image::demo("linux", "amd64", "f"),
        );
    }
    store
}

pub struct Fixture {
    pub registry: EmbeddedRegistry,
    pub gateway: Gateway,
}

impl Fixture {
    pub async fn new(config: Config) -> Self {
        let registry = EmbeddedRegistry::start(store()).await.unwrap();
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

pub async fn post(router: &Router, body: String, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut request =
        axum::http::Request::post("/graphql").header("content-type", "application/json");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = router
        .clone()
        .oneshot(request.body(axum::body::Body::from(body)).unwrap())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// POSTs from a TCP peer (as `ConnectInfo`), with headers; status, headers, JSON.
pub async fn post_from(
    router: &Router,
    body: &str,
    peer: &str,
    headers: &[(&str, &str)],
) -> (u16, axum::http::HeaderMap, Value) {
    let mut request =
        axum::http::Request::post("/graphql").header("content-type", "application/json");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let mut request = request
        .body(axum::body::Body::from(body.to_string()))
        .unwrap();
    let addr: std::net::SocketAddr = peer.parse().unwrap();
    request
        .extensions_mut()
        .insert(axum::extract::ConnectInfo(addr));
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (
        status,
        headers,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// Queries with their exact worst-case reads under the gateway's cost table
/// (query, variables, requested): the cost preview's reference cases.
pub fn cost_cases() -> Vec<(&'static str, Value, u64)> {
    vec![
        // A single field: one tag list.
        (r#"{ repository(name: "acme/app") { name } }"#, json!({}), 1),
        // Nothing that reads.
        ("{ fanoutBudget { limit } }", json!({}), 0),
        // A nested list, first: 20 (manifest + config per tag).
        (
            r#"{ repository(name: "acme/app") { tags(first: 20) { nodes { manifest { config { os } } } } } }"#,
            json!({}),
            1 + 1 + 20 * 2,
        ),
        // The default first (20) counts when first is absent.
        (
            r#"{ repository(name: "acme/app") { tags { nodes { manifest { digest } } } } }"#,
            json!({}),
            1 + 1 + 20,
        ),
        // Aliases count separately (the worst case ignores de-duplication).
        (
            r#"{ a: repository(name: "acme/app") { name } b: repository(name: "acme/app") { name } }"#,
            json!({}),
            2,
        ),
        // Fragments and inline fragments.
        (
            r#"query { repository(name: "acme/app") { ...T } } fragment T on Repository { tag(name: "t01") { ... on Tag { manifest { digest } } } }"#,
            json!({}),
            1 + 1 + 1,
        ),
        // Catalog pages multiply through repositories' own tag lists.
        (
            r#"{ repositories(first: 3) { nodes { tags(first: 2) { nodes { manifest { digest } } } } } }"#,
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
