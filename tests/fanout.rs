//! One budget of actual reads per inbound HTTP request, shared by the batch.
mod common;

use common::*;
use fanout_budget::config::Config;
use fanout_budget::Engine;
use serde_json::Value;

fn engine(max_reads: u64) -> Engine {
    let mut config = Config::default();
    config.budget.max_reads = max_reads;
    config.http.max_batch_operations = 100;
    Engine::new(config)
}

#[tokio::test]
async fn n_artifacts_in_one_operation_cost_one_plus_n() {
    for n in [1u64, 10, 50] {
        let upstream = Upstream::start().await;
        let app = app(&engine(1000), &upstream);
        let query = format!("{{ items(first: {n}) {{ id detail {{ value }} format }} }}");
        let (status, body) = post(&app, serde_json::json!({ "query": query }).to_string()).await;
        assert_eq!(status, 200);
        assert_eq!(body["data"]["items"].as_array().unwrap().len() as u64, n);
        assert_eq!(body["data"]["items"][0]["detail"]["value"], "item-0");
        assert_eq!(
            upstream.seen.requests(),
            1 + n,
            "upstream reads for {n} artifacts"
        );
        assert_eq!(body["extensions"]["fanout"]["used"], 1 + n);
        assert_eq!(body["extensions"]["fanout"]["operationReads"], 1 + n);
    }
}

#[tokio::test]
async fn n_artifacts_spread_over_a_batch_cost_one_plus_n() {
    let n = 12u64;
    let upstream = Upstream::start().await;
    let app = app(&engine(1000), &upstream);
    let ops = (0..n).map(|i| {
        format!("{{ items(first: {n}) {{ id }} item(id: {i}) {{ detail {{ value }} }} }}")
    });
    let (status, body) = post(&app, batch(ops)).await;
    assert_eq!(status, 200);
    let responses = body.as_array().unwrap();
    assert_eq!(responses.len() as u64, n);
    assert_eq!(upstream.seen.requests(), 1 + n);
    assert_eq!(upstream.seen.count("/list"), 1);
    // Every operation reports the one shared budget; the reads each operation
    // itself sent add up to what the upstream saw.
    let op_reads: u64 = fanout_testkit::operation_reads(responses);
    assert_eq!(op_reads, 1 + n);
    for (i, r) in responses.iter().enumerate() {
        assert_eq!(r["data"]["item"]["detail"]["value"], format!("item-{i}"));
        assert_eq!(r["extensions"]["fanout"]["limit"], 1000);
    }
}

#[tokio::test]
async fn identical_operations_in_a_batch_are_one_read() {
    let upstream = Upstream::start().await;
    let app = app(&engine(1000), &upstream);
    let op =
        "{ item(id: 3) { detail { value } } again: item(id: 3) { detail { value } } }".to_string();
    let (_, body) = post(&app, batch(std::iter::repeat_n(op, 5))).await;
    assert_eq!(upstream.seen.requests(), 1);
    for r in body.as_array().unwrap() {
        assert_eq!(r["data"]["again"]["detail"]["value"], "item-3");
    }
}

#[tokio::test]
async fn a_64_operation_batch_is_held_to_one_budget() {
    let upstream = Upstream::start().await;
    let app = app(&engine(50), &upstream);
    let ops = (0..64).map(|i| format!("{{ item(id: {i}) {{ id detail {{ value }} }} }}"));
    let (status, body) = post(&app, batch(ops)).await;
    assert_eq!(status, 200);
    let seen = upstream.seen.requests();
    assert!(seen <= 50, "upstream saw {seen} reads for a budget of 50");
    assert_eq!(seen, 50, "with 64 distinct reads the whole budget is used");
    let responses = body.as_array().unwrap();
    let exhausted: Vec<&Value> = responses
        .iter()
        .filter(|r| r["errors"][0]["extensions"]["code"] == "FANOUT_BUDGET_EXHAUSTED")
        .collect();
    assert_eq!(exhausted.len(), 14);
    for r in &exhausted {
        // The row is there; only its own nullable field is null.
        assert!(r["data"]["item"]["id"].is_u64());
        assert!(r["data"]["item"]["detail"].is_null());
        assert!(r["data"]["item"]
            .as_object()
            .unwrap()
            .contains_key("detail"));
        assert_eq!(
            r["errors"][0]["path"],
            serde_json::json!(["item", "detail"])
        );
        assert_eq!(r["errors"][0]["extensions"]["limit"], 50);
    }
    let used = responses
        .iter()
        .map(|r| r["extensions"]["fanout"]["used"].as_u64().unwrap())
        .max()
        .unwrap();
    assert_eq!(
        used, seen,
        "reported used equals the reads the upstream saw"
    );
    let op_reads: u64 = fanout_testkit::operation_reads(responses);
    assert_eq!(op_reads, seen);
}

#[tokio::test]
async fn a_selection_that_reads_nothing_costs_nothing() {
    let upstream = Upstream::start().await;
    let app = app(&engine(10), &upstream);
    let (_, body) = post(&app, r#"{"query":"{ item(id: 1) { id format } budget }"}"#).await;
    assert_eq!(upstream.seen.requests(), 0);
    assert_eq!(body["data"]["item"]["format"], Value::Null);
    assert!(body.get("errors").is_none());
    assert_eq!(body["data"]["budget"], serde_json::json!([10, 0, 10]));
    assert_eq!(body["extensions"]["fanout"]["used"], 0);
}

#[tokio::test]
async fn field_errors_in_a_list_carry_integer_indices() {
    let upstream = Upstream::start().await;
    upstream.seen.set(2, Behaviour::Status(500));
    upstream.seen.set(4, Behaviour::Garbage);
    let app = app(&engine(100), &upstream);
    let (status, body) = post(
        &app,
        r#"{"query":"{ items(first: 6) { id detail { value } } }"}"#,
    )
    .await;
    assert_eq!(status, 200);
    let items = body["data"]["items"].as_array().unwrap();
    assert_eq!(items.len(), 6);
    for (i, item) in items.iter().enumerate() {
        if i == 2 || i == 4 {
            assert!(item["detail"].is_null() && item.as_object().unwrap().contains_key("detail"));
        } else {
            assert_eq!(item["detail"]["value"], format!("item-{i}"));
        }
    }
    let mut errors = body["errors"].as_array().unwrap().clone();
    errors.sort_by_key(|e| e["path"][1].as_u64());
    assert_eq!(errors.len(), 2);
    assert_eq!(errors[0]["path"], serde_json::json!(["items", 2, "detail"]));
    assert_eq!(errors[0]["extensions"]["code"], "UPSTREAM_ERROR");
    assert_eq!(errors[0]["extensions"]["status"], 500);
    assert_eq!(errors[0]["extensions"]["host"], upstream.host());
    assert_eq!(errors[1]["path"], serde_json::json!(["items", 4, "detail"]));
    assert_eq!(errors[1]["extensions"]["code"], "UPSTREAM_ERROR");
    assert_eq!(errors[1]["extensions"]["status"], 200);
}

#[tokio::test]
async fn a_fanout_error_returned_with_question_mark_keeps_its_code() {
    let upstream = Upstream::start().await;
    let app = app(&engine(10), &upstream);
    let (_, body) = post(&app, r#"{"query":"{ exhausted }"}"#).await;
    assert_eq!(
        body["errors"][0]["extensions"]["code"],
        "FANOUT_BUDGET_EXHAUSTED"
    );
    assert_eq!(body["errors"][0]["extensions"]["limit"], 7);
    // `exhausted` is non-null at the root: `data` is null, not `{}`.
    assert!(body["data"].is_null(), "{body}");
}
