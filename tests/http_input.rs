//! Bad inbound input is refused before anything runs or reads.
mod common;

use common::*;
use fanout_budget::config::Config;
use fanout_budget::Engine;

async fn setup() -> (Upstream, axum::Router) {
    let upstream = Upstream::start().await;
    let mut config = Config::default();
    config.http.max_batch_operations = 20;
    config.http.max_body_bytes = 4096;
    let app = app(&Engine::new(config), &upstream);
    (upstream, app)
}

#[tokio::test]
async fn a_batch_over_the_cap_is_rejected_whole() {
    let (upstream, app) = setup().await;
    let ops = (0..21).map(|i| format!("{{ item(id: {i}) {{ detail {{ value }} }} }}"));
    let (status, body) = post(&app, batch(ops)).await;
    assert_eq!(status, 400);
    assert_eq!(codes(&body), vec!["BATCH_TOO_LARGE"]);
    assert_eq!(body["errors"][0]["extensions"]["max"], 20);
    assert_eq!(upstream.seen.requests(), 0);
    // At the cap it runs.
    let ops = (0..20).map(|i| format!("{{ item(id: {i}) {{ detail {{ value }} }} }}"));
    let (status, _) = post(&app, batch(ops)).await;
    assert_eq!(status, 200);
    assert_eq!(upstream.seen.requests(), 20);
}

#[tokio::test]
async fn malformed_and_empty_requests_are_bad_requests() {
    let (upstream, app) = setup().await;
    for body in [
        "{not json",
        "[]",
        "42",
        "",
        r#"{"no_query": 1}"#,
        r#"[{"query": "{ items { id } }"}, 3]"#,
    ] {
        let (status, answer) = post(&app, body).await;
        assert_eq!(status, 400, "body {body:?}");
        assert_eq!(codes(&answer), vec!["BAD_REQUEST"], "body {body:?}");
    }
    assert_eq!(upstream.seen.requests(), 0);
}

#[tokio::test]
async fn an_oversize_body_is_413() {
    let (upstream, app) = setup().await;
    let query = format!("{{ items(first: 1) {{ id }} }} #{}", "x".repeat(5000));
    let (status, body) = post(&app, serde_json::json!({ "query": query }).to_string()).await;
    assert_eq!(status, 413);
    assert_eq!(codes(&body), vec!["PAYLOAD_TOO_LARGE"]);
    assert_eq!(body["errors"][0]["extensions"]["max"], 4096);
    assert_eq!(upstream.seen.requests(), 0);
}

#[tokio::test]
async fn get_serves_graphiql() {
    let (_upstream, app) = setup().await;
    use tower::ServiceExt;
    let response = app
        .oneshot(
            axum::http::Request::get("/graphql")
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let html = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&html)
        .to_lowercase()
        .contains("graphiql"));
}
