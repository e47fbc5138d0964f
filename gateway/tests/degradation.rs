//! A bad row is `null` + a coded error at its own path; the page is answered.
mod common;

use common::*;
use fanout_budget::Config;
use fanout_gateway::embedded::Fault;
use std::time::{Duration, Instant};

#[tokio::test]
async fn a_tags_page_mixing_hung_failing_garbage_and_healthy_rows() {
    let mut config = Config::default();
    config.budget.read_timeout_ms = 400;
    let f = Fixture::new(config).await;
    f.registry
        .set_tag_fault("acme/app", "t01", Some(Fault::Hang));
    f.registry
        .set_tag_fault("acme/app", "t03", Some(Fault::Status(500)));
    f.registry
        .set_tag_fault("acme/app", "t05", Some(Fault::Garbage));
    f.registry
        .set_tag_fault("acme/app", "t06", Some(Fault::Status(403)));
    let started = Instant::now();
    let body = f
        .query(r#"{ repository(name: "acme/app") { tags(first: 8) { nodes { name manifest { digest } } } } }"#)
        .await;
    let took = started.elapsed();
    assert!(took < Duration::from_millis(400 + 2_000), "took {took:?}");
    let nodes = body["data"]["repository"]["tags"]["nodes"]
        .as_array()
        .unwrap();
    assert_eq!(nodes.len(), 8);
    for (i, node) in nodes.iter().enumerate() {
        assert_eq!(node["name"], format!("t{i:02}"));
        let bad = [1, 3, 5, 6].contains(&i);
        assert!(
            node.as_object().unwrap().contains_key("manifest"),
            "row {i} lost its key"
        );
        assert_eq!(node["manifest"].is_null(), bad, "row {i}: {node}");
    }
    let errors = body["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 4);
    let find = |i: u64| {
        errors
            .iter()
            .find(|e| {
                e["path"] == serde_json::json!(["repository", "tags", "nodes", i, "manifest"])
            })
            .unwrap_or_else(|| panic!("no error at row {i}: {errors:?}"))
    };
    let host = f.registry.host();
    assert_eq!(find(1)["extensions"]["code"], "UPSTREAM_TIMEOUT");
    assert_eq!(find(1)["extensions"]["timeoutMs"], 400);
    assert_eq!(find(1)["extensions"]["host"], host);
    assert_eq!(find(3)["extensions"]["code"], "UPSTREAM_ERROR");
    assert_eq!(find(3)["extensions"]["status"], 500);
    assert_eq!(find(5)["extensions"]["code"], "UPSTREAM_ERROR");
    assert_eq!(find(5)["extensions"]["status"], 200);
    assert_eq!(find(6)["extensions"]["code"], "UPSTREAM_ERROR");
    assert_eq!(find(6)["extensions"]["status"], 403);
    assert_eq!(find(6)["extensions"]["host"], host);
}

#[tokio::test]
async fn a_failing_tag_list_nulls_only_its_repository() {
    let f = Fixture::default().await;
    f.registry
        .set_repo_fault("acme/multi", Some(Fault::Status(503)));
    let body = f
        .query(r#"{ a: repository(name: "acme/app") { name } b: repository(name: "acme/multi") { name } }"#)
        .await;
    assert_eq!(body["data"]["a"]["name"], "acme/app");
    assert!(body["data"]["b"].is_null());
    assert_eq!(body["errors"][0]["path"], serde_json::json!(["b"]));
    assert_eq!(body["errors"][0]["extensions"]["code"], "UPSTREAM_ERROR");
    assert_eq!(body["errors"][0]["extensions"]["status"], 503);
}

#[tokio::test]
async fn an_unreachable_registry_is_an_upstream_error_without_status() {
    let port = free_port();
    let gateway = fanout_gateway::app::build(
        Config::default(),
        format!("http://127.0.0.1:{port}").parse().unwrap(),
        None,
    );
    let (status, body) = post(
        &gateway.router,
        r#"{"query":"{ repository(name: \"x\") { name } }"}"#.into(),
        &[],
    )
    .await;
    assert_eq!(status, 200);
    assert!(body["data"]["repository"].is_null());
    assert_eq!(body["errors"][0]["extensions"]["code"], "UPSTREAM_ERROR");
    assert_eq!(
        body["errors"][0]["extensions"]["host"],
        format!("127.0.0.1:{port}")
    );
    assert!(body["errors"][0]["extensions"].get("status").is_none());
}

#[tokio::test]
async fn budget_exhaustion_nulls_the_rows_past_the_budget() {
    let mut config = Config::default();
    config.budget.max_reads = 5;
    let f = Fixture::new(config).await;
    let body = f
        .query(r#"{ repository(name: "acme/app") { tags(first: 10) { nodes { name manifest { digest } } } } }"#)
        .await;
    assert_eq!(f.reads(), 5);
    let nodes = body["data"]["repository"]["tags"]["nodes"]
        .as_array()
        .unwrap();
    assert_eq!(nodes.iter().filter(|n| n["manifest"].is_null()).count(), 6);
    let errors = body["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 6);
    assert!(errors
        .iter()
        .all(|e| e["extensions"]["code"] == "FANOUT_BUDGET_EXHAUSTED"
            && e["extensions"]["limit"] == 5));
    assert_eq!(body["extensions"]["fanout"]["used"], 5);
    assert_eq!(body["extensions"]["fanout"]["remaining"], 0);
}

/// A failed non-null field nulls its nearest nullable ancestor (the spec's
/// rule; async-graphql 7.2 alone would drop the key and answer a shape the
/// schema does not allow).
#[tokio::test]
async fn a_failed_non_null_field_propagates_null_to_its_nearest_nullable_ancestor() {
    let f = Fixture::default().await;
    // `tags` is non-null; `repository` is nullable: the repository is null.
    let body = f.query(r#"{ ok: repository(name: "acme/multi") { name } repository(name: "acme/app") { name tags(first: 0) { totalCount } } }"#).await;
    assert_eq!(body["data"]["ok"]["name"], "acme/multi");
    assert!(body["data"]["repository"].is_null(), "{body}");
    assert_eq!(
        body["errors"][0]["path"],
        serde_json::json!(["repository", "tags"])
    );
    assert_eq!(body["errors"][0]["extensions"]["code"], "BAD_USER_INPUT");

    // Through an alias and a fragment.
    let body = f
        .query(r#"{ r: repository(name: "acme/app") { ...F } } fragment F on Repository { t: tags(first: 0) { totalCount } }"#)
        .await;
    assert!(body["data"]["r"].is_null(), "{body}");

    // Everything up to the root is non-null: `data` itself is null.
    f.registry
        .set_repo_fault("acme/multi", Some(Fault::Status(500)));
    let body = f.query("{ fanoutBudget { used } repositories(first: 3) { nodes { name tags { totalCount } } } }").await;
    assert!(body["data"].is_null(), "{body}");
    assert_eq!(
        body["errors"][0]["path"],
        serde_json::json!(["repositories", "nodes", 1, "tags"])
    );
    assert_eq!(body["errors"][0]["extensions"]["code"], "UPSTREAM_ERROR");
}
