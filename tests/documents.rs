//! A query text seen before is served from its kept parsed document
//! (`http.document_cache_bytes`), with exactly the answer a fresh parse gives:
//! the same data, errors, locations, refusals and budget report.
mod common;

use common::*;
use fanout_budget::config::Config;
use fanout_budget::Engine;
use serde_json::{json, Value};

fn app_with(document_cache_bytes: usize, upstream: &Upstream) -> axum::Router {
    let mut config = Config::default();
    config.http.document_cache_bytes = document_cache_bytes;
    app(&Engine::new(config), upstream)
}

/// Bodies that exercise parsing: data, variables, named operations, syntax
/// and validation errors, a batch, and nesting past the recursion limit.
fn bodies() -> Vec<String> {
    let deep = format!("{{ {}id{} }}", "items { ".repeat(40), " }".repeat(40));
    let named = "query A { items(first: 1) { id } } query B($id: Int!) { item(id: $id) { detail { value } } }";
    vec![
        json!({ "query": "{ items(first: 3) { id detail { value } } }" }).to_string(),
        json!({ "query": named, "operationName": "B", "variables": { "id": 7 } }).to_string(),
        json!({ "query": named, "operationName": "B", "variables": { "id": 8 } }).to_string(),
        json!({ "query": named, "operationName": "A" }).to_string(),
        json!({ "query": named }).to_string(),
        json!({ "query": "{ items(first: 1) { id " }).to_string(),
        json!({ "query": "{ items(first: 1) { nope } }" }).to_string(),
        json!({ "query": "{\n  items(first: 1) {\n    detail { nope }\n  }\n}" }).to_string(),
        json!({ "query": deep }).to_string(),
        json!([
            { "query": "{ items(first: 2) { id } }" },
            { "query": "{ items(first: 2) { id } }" },
            { "query": named, "operationName": "B", "variables": { "id": 1 } },
        ])
        .to_string(),
    ]
}

#[tokio::test]
async fn a_kept_document_answers_exactly_as_a_fresh_parse() {
    let upstream = Upstream::start().await;
    let fresh = app_with(0, &upstream);
    let kept = app_with(1 << 20, &upstream);
    for body in bodies() {
        let expected: (u16, Value) = {
            let (status, value) = post(&fresh, body.clone()).await;
            (status.as_u16(), value)
        };
        // First send parses and keeps the text; the next ones copy it.
        for send in 0..3 {
            let (status, value) = post(&kept, body.clone()).await;
            assert_eq!((status.as_u16(), value), expected, "send {send} of {body}");
        }
    }
}

#[tokio::test]
async fn a_kept_document_still_reads_once_per_request() {
    // The document is shared across requests; the budget and the
    // de-duplication cache are not.
    let upstream = Upstream::start().await;
    let kept = app_with(1 << 20, &upstream);
    let query = json!({ "query": "{ items(first: 3) { id detail { value } } }" }).to_string();
    for send in 1..=3u64 {
        let (status, body) = post(&kept, query.clone()).await;
        assert_eq!(status, 200);
        assert_eq!(body["extensions"]["fanout"]["used"], 4, "send {send}");
        assert_eq!(upstream.seen.requests(), 4 * send);
    }
}
