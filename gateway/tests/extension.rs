//! The extension path: the gateway's schema served without `FanoutGraphQL`
//! (the extension mounted, the schema executed directly) behaves as the
//! HTTP integration does — same `requested`, reads, codes, nulls and
//! `extensions.fanout` — and mounting both counts nothing twice.
mod common;

use async_graphql::{BatchRequest, Request, Variables};
use axum::Router;
use common::*;
use fanout_budget::{inbound::Caller, Config, Engine, FanoutExtension, FanoutGraphQL};
use fanout_gateway::embedded::Fault;
use fanout_gateway::oci::RegistryUrl;
use fanout_gateway::schema::{self, RegistrySchema};
use serde_json::{json, Value};

/// The gateway's schema with the extension mounted, on `f`'s engine.
fn with_extension(f: &Fixture) -> RegistrySchema {
    let engine = f.gateway.engine.clone();
    schema::builder()
        .extension(FanoutExtension::new(&engine))
        .data(RegistryUrl(f.registry.url().parse().unwrap()))
        .finish()
}

fn json_of(response: &async_graphql::Response) -> Value {
    serde_json::to_value(response).unwrap()
}

const PAGE: &str =
    r#"{ repository(name: "acme/app") { tags(first: 3) { nodes { name manifest { digest } } } } }"#;

#[tokio::test]
async fn the_extension_prices_like_the_service() {
    let f = Fixture::default().await;
    let schema = with_extension(&f);
    // The second pass runs the parsed documents kept from the first.
    for pass in 0..2 {
        for (query, variables, expected) in cost_cases() {
            let request = Request::new(query).variables(Variables::from_json(variables));
            let response = json_of(&schema.execute(request).await);
            assert_eq!(
                response["extensions"]["fanout"]["requested"], expected,
                "pass {pass}, {query}: {response}"
            );
        }
    }
}

#[tokio::test]
async fn a_kept_document_answers_under_the_extension_as_a_fresh_parse() {
    let f = Fixture::default().await;
    let schema = with_extension(&f);
    // The same extension on an engine that keeps no documents.
    let mut config = f.gateway.engine.config().clone();
    config.http.document_cache_bytes = 0;
    let parsing = fanout_budget::Engine::builder(config)
        .costs(schema::costs())
        .build();
    let plain = schema::builder()
        .extension(FanoutExtension::new(&parsing))
        .data(RegistryUrl(f.registry.url().parse().unwrap()))
        .finish();
    for query in [
        PAGE,
        "{ repository(name: \"acme/app\") { nope } }",
        "{ repository(name: \"acme/app\") { tags(first: 1) { ",
    ] {
        let fresh = json_of(&plain.execute(query).await);
        for send in 0..3 {
            let response = json_of(&schema.execute(query).await);
            assert_eq!(response["data"], fresh["data"], "send {send}: {query}");
            assert_eq!(
                response["extensions"]["fanout"]["requested"],
                fresh["extensions"]["fanout"]["requested"],
                "send {send}: {query}"
            );
            assert_eq!(
                response["errors"].as_array().map(Vec::len),
                fresh["errors"].as_array().map(Vec::len),
                "send {send}: {query}"
            );
            for (a, b) in response["errors"]
                .as_array()
                .into_iter()
                .flatten()
                .zip(fresh["errors"].as_array().into_iter().flatten())
            {
                assert_eq!(a["message"], b["message"], "send {send}: {query}");
                assert_eq!(a["locations"], b["locations"], "send {send}: {query}");
            }
        }
    }
}

#[tokio::test]
async fn the_extension_alone_reads_reports_and_codes() {
    let f = Fixture::default().await;
    f.registry
        .set_tag_fault("acme/app", "t01", Some(Fault::Status(500)));
    let schema = with_extension(&f);
    let response = json_of(&schema.execute(PAGE).await);
    let reads = f.reads();
    // 1 tag list + 3 manifests, the failed one included.
    assert_eq!(reads, 4, "{response}");
    let fanout = &response["extensions"]["fanout"];
    assert_eq!(fanout["used"], reads);
    assert_eq!(fanout["operationReads"], reads);
    // CONTRACT §5: one tag list, three manifests.
    assert_eq!(fanout["requested"], 1 + 3);
    assert_eq!(
        response["errors"][0]["extensions"]["code"],
        "UPSTREAM_ERROR"
    );
    // The service answers the same query with the same data and errors.
    let (status, served) = f.post(json!({ "query": PAGE }).to_string()).await;
    assert_eq!(status, 200);
    assert_eq!(served["data"], response["data"]);
    assert_eq!(served["errors"], response["errors"]);
    assert_eq!(served["extensions"], response["extensions"]);
}

#[tokio::test]
async fn a_batch_shares_the_request_the_integrator_attaches() {
    let f = Fixture::default().await;
    let schema = with_extension(&f);
    let engine: &Engine = &f.gateway.engine;
    let one = r#"{ repository(name: "acme/app") { tag(name: "t02") { manifest { digest } } } }"#;
    let fanout = engine.begin_request(Caller::Public);
    fanout.expect_operations(5);
    let batch = BatchRequest::Batch((0..5).map(|_| Request::new(one)).collect());
    let responses = json_of_batch(schema.execute_batch(batch.data(fanout.clone())).await);
    // Five identical operations: one tag list and one manifest in all.
    assert_eq!(f.reads(), 2);
    assert_eq!(fanout.budget().used(), 2);
    let own: u64 = fanout_testkit::operation_reads(&responses);
    assert_eq!(own, 2);
    for r in &responses {
        assert_eq!(r["extensions"]["fanout"]["used"], 2);
        assert!(r["data"]["repository"]["tag"]["manifest"]["digest"].is_string());
    }
}

#[tokio::test]
async fn the_extension_refuses_an_announced_batch_over_its_estimate() {
    let mut config = Config::default();
    config.budget.max_reads = 10;
    config.budget.refuse_over_estimate = true;
    let f = Fixture::new(config).await;
    let schema = with_extension(&f);
    let fanout = f.gateway.engine.begin_request(Caller::Public);
    fanout.expect_operations(2);
    let op =
        r#"{ repository(name: "acme/app") { tags(first: 5) { nodes { manifest { digest } } } } }"#;
    let batch = BatchRequest::Batch(vec![Request::new(op), Request::new(op)]);
    let responses = json_of_batch(schema.execute_batch(batch.data(fanout)).await);
    assert_eq!(f.reads(), 0);
    for r in &responses {
        assert!(r["data"].is_null(), "{r}");
        let e = &r["errors"][0]["extensions"];
        assert_eq!(e["code"], "FANOUT_ESTIMATE_EXCEEDS_BUDGET");
        assert_eq!(e["requested"], 12);
    }
}

#[tokio::test]
async fn mounted_with_the_service_it_stands_aside() {
    let f = Fixture::default().await;
    let both = Router::new().route_service(
        "/graphql",
        FanoutGraphQL::new(with_extension(&f), f.gateway.engine.clone()),
    );
    let body = json!([{ "query": PAGE }, { "query": PAGE }]).to_string();
    let (status, answer) = post(&both, body.clone(), &[]).await;
    assert_eq!(status, 200);
    let reads_both = f.reads();
    f.registry.counters().reset();
    let (_, plain) = f.post(body).await;
    assert_eq!(f.reads(), reads_both);
    assert_eq!(reads_both, 4, "one tag list, three manifests: {answer}");
    // Same data, same figures: `requested` is the sum, counted once.
    assert_eq!(answer, plain);
    assert_eq!(answer[0]["extensions"]["fanout"]["requested"], 4);
    assert_eq!(answer[1]["extensions"]["fanout"]["used"], 4);
}

fn json_of_batch(batch: async_graphql::BatchResponse) -> Vec<Value> {
    match batch {
        async_graphql::BatchResponse::Single(r) => vec![json_of(&r)],
        async_graphql::BatchResponse::Batch(rs) => rs.iter().map(json_of).collect(),
    }
}

#[tokio::test]
async fn a_query_rewritten_by_a_later_extension_is_the_one_that_runs() {
    let f = Fixture::default().await;
    let schema = schema::builder()
        .extension(FanoutExtension::new(&f.gateway.engine))
        .extension(fanout_testkit::Rewrite {
            from: "{ __typename }",
            to: PAGE.to_string(),
        })
        .data(RegistryUrl(f.registry.url().parse().unwrap()))
        .finish();
    // Parsed, then kept: both runs are the rewritten query's.
    for send in 0..2 {
        let response = json_of(&schema.execute("{ __typename }").await);
        let nodes = &response["data"]["repository"]["tags"]["nodes"];
        assert_eq!(
            nodes.as_array().map(Vec::len),
            Some(3),
            "send {send}: {response}"
        );
        assert_eq!(
            response["extensions"]["fanout"]["requested"],
            1 + 3,
            "send {send}"
        );
    }
}
