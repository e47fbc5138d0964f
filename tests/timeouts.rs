//! Per-read timeouts inside the request deadline, and bounded parallel rows.
mod common;

use common::*;
use fanout_budget::config::Config;
use fanout_budget::Engine;
use std::time::{Duration, Instant};

fn engine(read_timeout_ms: u64, deadline_ms: u64, max_concurrent_reads: usize) -> Engine {
    let mut config = Config::default();
    config.budget.read_timeout_ms = read_timeout_ms;
    config.budget.deadline_ms = deadline_ms;
    config.budget.max_concurrent_reads = max_concurrent_reads;
    Engine::new(config)
}

#[tokio::test]
async fn a_hung_row_times_out_alone() {
    let upstream = Upstream::start().await;
    upstream.seen.set(3, Behaviour::Hang);
    let app = app(&engine(300, 30_000, 8), &upstream);
    let started = Instant::now();
    let (status, body) = post(
        &app,
        r#"{"query":"{ items(first: 8) { id detail { value } } }"}"#,
    )
    .await;
    let took = started.elapsed();
    assert_eq!(status, 200);
    assert!(
        took >= Duration::from_millis(300),
        "cut before the read timeout: {took:?}"
    );
    assert!(
        took < Duration::from_millis(300 + 2000),
        "not cut by the read timeout: {took:?}"
    );
    let items = body["data"]["items"].as_array().unwrap();
    for (i, item) in items.iter().enumerate() {
        if i == 3 {
            assert!(item["detail"].is_null());
        } else {
            assert_eq!(item["detail"]["value"], format!("item-{i}"));
        }
    }
    let error = &body["errors"][0];
    assert_eq!(body["errors"].as_array().unwrap().len(), 1);
    assert_eq!(error["extensions"]["code"], "UPSTREAM_TIMEOUT");
    assert_eq!(error["extensions"]["timeoutMs"], 300);
    assert_eq!(error["extensions"]["host"], upstream.host());
    assert_eq!(error["path"], serde_json::json!(["items", 3, "detail"]));
    // The timed-out read was sent, so it was charged.
    assert_eq!(body["extensions"]["fanout"]["used"], 9);
}

#[tokio::test]
async fn the_deadline_cuts_a_read_and_the_page_is_still_answered() {
    let upstream = Upstream::start().await;
    upstream.seen.set(1, Behaviour::Hang);
    let app = app(&engine(5_000, 400, 8), &upstream);
    let started = Instant::now();
    let (status, body) = post(
        &app,
        r#"{"query":"{ items(first: 4) { id detail { value } } }"}"#,
    )
    .await;
    assert!(started.elapsed() < Duration::from_millis(400 + 2000));
    assert_eq!(status, 200);
    assert_eq!(body["data"]["items"][0]["detail"]["value"], "item-0");
    assert_eq!(body["data"]["items"][2]["detail"]["value"], "item-2");
    assert!(body["data"]["items"][1]["detail"].is_null());
    assert_eq!(codes(&body), vec!["DEADLINE_EXCEEDED"]);
    assert_eq!(
        body["errors"][0]["path"],
        serde_json::json!(["items", 1, "detail"])
    );
}

#[tokio::test]
async fn rows_resolve_in_parallel_within_the_per_request_bound() {
    let upstream = Upstream::start().await;
    *upstream.seen.default_delay.lock().unwrap() = Some(Duration::from_millis(200));
    let app = app(&engine(5_000, 30_000, 8), &upstream);
    let started = Instant::now();
    let (_, body) = post(
        &app,
        r#"{"query":"{ items(first: 20) { detail { value } } }"}"#,
    )
    .await;
    let took = started.elapsed();
    assert!(body.get("errors").is_none(), "{body}");
    assert_eq!(upstream.seen.requests(), 21);
    let peak = upstream.seen.peak();
    assert!(peak <= 8, "{peak} reads in flight for one request, bound 8");
    assert!(peak >= 2, "rows did not run in parallel (peak {peak})");
    // Serial would be 20 × 200 ms = 4 s; three waves of 8 are ~0.6 s.
    assert!(took < Duration::from_millis(2_500), "took {took:?}");
}

#[tokio::test]
async fn a_passed_deadline_refuses_reads_without_sending_them() {
    let upstream = Upstream::start().await;
    // Tokio's clock is the engine's one clock: paused, it moves only when told.
    tokio::time::pause();
    let mut config = Config::default();
    config.budget.deadline_ms = 1_000;
    let engine = Engine::new(config);
    let request = engine.begin_request(fanout_budget::inbound::Caller::Public);
    assert!(request.budget().time_left().is_some());
    tokio::time::advance(Duration::from_millis(999)).await;
    assert_eq!(request.budget().time_left(), Some(Duration::from_millis(1)));
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(request.budget().time_left(), None);

    let op = request.operation();
    let url = format!("{}/item/1", upstream.base()).parse().unwrap();
    let err = op
        .upstream()
        .read(fanout_budget::Read::get(url))
        .await
        .unwrap_err();
    assert_eq!(err, fanout_budget::ReadError::DeadlineExceeded);
    assert_eq!(upstream.seen.requests(), 0);
    assert_eq!(request.budget().used(), 0, "a refused read is not charged");
}
