//! Persisted queries do not lift the text bound: the query texts one
//! request runs — sent, or looked up by hash — are bounded together by
//! `http.max_body_bytes`, as its body is. `FanoutGraphQL` refuses such a
//! batch with 413 before any text is parsed; under `FanoutLayer` a lookup
//! extension rewrites texts inside the schema, so the operation whose text
//! passes the bound is refused (`PAYLOAD_TOO_LARGE`) and does not run.

use async_graphql::{EmptyMutation, EmptySubscription, Object, Schema};
use axum::Router;
use fanout_budget::{Config, Engine, FanoutExtension, FanoutGraphQL, FanoutLayer};
use fanout_testkit::sha256_hex;
use serde_json::{json, Value};

struct Query;

#[Object]
impl Query {
    async fn ping(&self) -> &str {
        "pong"
    }
}

/// A valid query of about 24 KB: 2,000 aliases of one field.
fn long_query() -> String {
    let aliases: String = (0..1990).map(|i| format!("p{i:04}: ping ")).collect();
    format!("{{ {aliases}}}")
}

#[tokio::test]
async fn hash_only_operations_count_the_texts_they_run() {
    let engine = Engine::new(Config::default());
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .finish();
    let app = Router::new().route_service("/graphql", FanoutGraphQL::new(schema, engine));
    let query = long_query();
    let ext = json!({ "persistedQuery": { "version": 1, "sha256Hash": sha256_hex(&query) } });
    let register = json!({ "query": query, "extensions": ext }).to_string();
    let answer = fanout_testkit::post(&app, register, &[]).await;
    assert_eq!(
        answer.json()["data"]["p0000"],
        "pong",
        "{:?}",
        answer.json()
    );
    // Two texts of 24 KB fit in 64 KiB; three do not, though the body is
    // a few hundred bytes.
    let batch = |n| Value::Array(vec![json!({ "extensions": ext }); n]).to_string();
    let two = fanout_testkit::post(&app, batch(2), &[]).await;
    assert_eq!(two.status, 200);
    assert_eq!(two.json()[1]["data"]["p1989"], "pong");
    let body = batch(3);
    assert!(body.len() < 1024);
    let three = fanout_testkit::post(&app, body, &[]).await;
    assert_eq!(three.status, 413, "{:?}", three.json());
    assert_eq!(
        three.json()["errors"][0]["extensions"]["code"],
        "PAYLOAD_TOO_LARGE"
    );
    assert_eq!(three.json()["errors"][0]["extensions"]["max"], 65536);
}

#[tokio::test]
async fn under_the_layer_a_rewritten_text_counts_as_it_runs() {
    let engine = Engine::new(Config::default());
    let schema = Schema::build(Query, EmptyMutation, EmptySubscription)
        .extension(FanoutExtension::new(&engine))
        .extension(fanout_testkit::Rewrite {
            from: "#long",
            to: long_query(),
        })
        .finish();
    let app = Router::new()
        .route_service("/graphql", async_graphql_axum::GraphQL::new(schema))
        .layer(FanoutLayer::new(engine));
    let batch = Value::Array(vec![json!({ "query": "#long" }); 3]).to_string();
    let answer = fanout_testkit::post(&app, batch, &[]).await;
    let answers = answer.json();
    let codes: Vec<_> = answers
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            a["errors"][0]["extensions"]["code"]
                .as_str()
                .unwrap_or("ran")
        })
        .collect();
    assert_eq!(
        codes.iter().filter(|c| **c == "ran").count(),
        2,
        "two texts fit: {codes:?}"
    );
    assert_eq!(
        codes.iter().filter(|c| **c == "PAYLOAD_TOO_LARGE").count(),
        1,
        "the third is refused: {codes:?}"
    );
}
