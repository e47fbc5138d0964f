//! Upstream faults: each degrades only its own field, never panics, and
//! never holds a slot past its timeout.
mod common;

use common::*;
use fanout_budget::config::HostConfig;
use fanout_budget::Config;
use fanout_gateway::embedded::{EmbeddedRegistry, Fault};
use std::time::{Duration, Instant};

#[tokio::test]
async fn every_kind_of_bad_upstream_answer_degrades_only_its_row() {
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let mut config = Config::default();
    config.budget.read_timeout_ms = 600;
    config.upstream.max_response_bytes = 256 * 1024;
    // A cap makes the slot accounting observable.
    config.hosts.insert(
        registry.host(),
        HostConfig::default()
            .max_concurrent(16)
            .acquire_wait_ms(1000),
    );
    let gateway = fanout_gateway::app::build(config, registry.url().parse().unwrap(), None);
    let faults = [
        (1, Fault::ResetMidBody, "UPSTREAM_ERROR"),
        (2, Fault::Slowloris, "UPSTREAM_TIMEOUT"),
        (3, Fault::Oversized(1 << 20), "UPSTREAM_ERROR"),
        (4, Fault::WrongContentType, "UPSTREAM_ERROR"),
        (5, Fault::RedirectLoop, "UPSTREAM_ERROR"),
        (6, Fault::InvalidUtf8, "UPSTREAM_ERROR"),
        (7, Fault::Garbage, "UPSTREAM_ERROR"),
        (8, Fault::Status(502), "UPSTREAM_ERROR"),
    ];
    for (i, fault, _) in &faults {
        registry.set_tag_fault("acme/app", &format!("t{i:02}"), Some(*fault));
    }
    let started = Instant::now();
    let (status, body) = post(
        &gateway.router,
        serde_json::json!({ "query": r#"{ repository(name: "acme/app") { tags(first: 10) { nodes { name manifest { digest } } } } }"# }).to_string(),
        &[],
    )
    .await;
    let took = started.elapsed();
    assert_eq!(status, 200);
    assert!(took < Duration::from_millis(600 + 2_000), "took {took:?}");
    let nodes = body["data"]["repository"]["tags"]["nodes"]
        .as_array()
        .unwrap();
    assert_eq!(nodes.len(), 10);
    assert!(nodes[0]["manifest"]["digest"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
    assert!(nodes[9]["manifest"]["digest"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
    let errors = body["errors"].as_array().unwrap();
    assert_eq!(errors.len(), faults.len(), "{errors:?}");
    for (i, fault, code) in &faults {
        assert!(nodes[*i]["manifest"].is_null(), "row {i} ({fault:?})");
        let error = errors
            .iter()
            .find(|e| {
                e["path"] == serde_json::json!(["repository", "tags", "nodes", i, "manifest"])
            })
            .unwrap_or_else(|| panic!("no error for {fault:?}"));
        assert_eq!(error["extensions"]["code"], *code, "{fault:?}: {error}");
        assert_eq!(error["extensions"]["host"], registry.host(), "{fault:?}");
    }
    assert_eq!(
        gateway.engine.hosts().in_flight(&registry.host()),
        0,
        "a slot outlived its read"
    );
}

#[tokio::test]
async fn an_oversized_body_is_refused_with_its_status() {
    let registry = EmbeddedRegistry::fixture().await.unwrap();
    let mut config = Config::default();
    config.upstream.max_response_bytes = 1024;
    let gateway = fanout_gateway::app::build(config, registry.url().parse().unwrap(), None);
    registry.set_tag_fault("acme/app", "t00", Some(Fault::Oversized(4096)));
    let (_, body) = post(
        &gateway.router,
        r#"{"query":"{ repository(name: \"acme/app\") { tag(name: \"t00\") { manifest { digest } } } }"}"#.into(),
        &[],
    )
    .await;
    let error = &body["errors"][0];
    assert_eq!(error["extensions"]["code"], "UPSTREAM_ERROR");
    assert_eq!(error["extensions"]["status"], 200);
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("larger than 1024 bytes"),
        "{error}"
    );
}
